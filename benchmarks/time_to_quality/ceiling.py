"""Ceilings beside the trained rows: what a perfect policy reaches on the task's own data and sampler.

B1 (:func:`exact_field_metrics`): the exact velocity field of B1's action distribution, integrated by the
engine's explicit Euler (t = 0 noise to t = 1 data, N steps). It answers whether B1's on-mode target is
out of reach for N steps of *any* learned field (the sampler's error) or only for the field a network learns
in the budget (the learning's error).

B2 (below): what a perfect position-only policy trained on the task's own data reaches.

A learned B2 policy sees only the agent's position (x, y) and returns a chunk of 8 actions, 4 executed. The
best such a policy can do is to sample, at each position, from the demonstrations' own chunk distribution
there. This module runs that sampler directly, with no network: at every call each agent draws one
demonstration state uniformly among those within ``resolution`` of its position (the nearest one where
none is that close) and executes the first 4 of the 8 demonstrated actions from that state, padded past
the episode's end by repeating its last action as the trainer's chunks are
(:func:`trainer.training.data.build_action_chunks`). The same 200 demonstrations of the training seed, the same
evaluation starts (:func:`emulator.tasks.avoid.evaluate_policy`) as the benchmark's B2 rows.

Why it is below the expert's route entropy (about 0.995): where demonstrated routes cross or run close, a
position says little about which route the demonstration was on, so the sampler switches routes mid-way
and some routes are under-used; a coarser resolution mixes more. This is the ceiling of the *data and the
observation*, not of flow matching: a trained policy should be compared with it, not with the expert.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from emulator.tasks import Demonstrations, FloatArray, avoid, bimodal, task_rng
from trainer.training.data import build_action_chunks

__all__ = [
    "CEILING_RESOLUTIONS",
    "EXACT_FIELD_STEPS",
    "exact_field_metrics",
    "exact_field_rows",
    "exact_velocity",
    "ideal_sampler_metrics",
    "ideal_sampler_rows",
]

CEILING_RESOLUTIONS = (0.005, 0.02)
"""Position resolutions (world units; the agent moves at most 0.05 per step) of the reported ceiling."""

_SAMPLER_STREAM = 0xB2_C311
"""Random stream of the sampler's choices (:func:`emulator.tasks.task_rng`), apart from the task's own."""
_FIELD_NOISE_STREAM = 0xB1_C311
"""Random stream of the exact field's t = 0 noise, apart from the task's own."""
EXACT_FIELD_STEPS = (1, 2, 4, 8, 16)
"""Euler step counts of the reported B1 rows (8 is the engine's default ODEStepsNum)."""

Doubles = npt.NDArray[np.float64]


def _ceiling_rng(seed: int, eval_seed: int, stream: int) -> np.random.Generator:
    """A ceiling's own random choices for training seed ``seed`` on evaluation seed ``eval_seed``: one
    stream per (seed, evaluation) pair, apart from the task's streams."""
    return task_rng(seed * 7919 + eval_seed, stream)


def exact_velocity(x: Doubles, t: float, centres: Doubles, component_std: Doubles) -> Doubles:
    """E[x1 - x0 | x_t = x] on the linear path x_t = (1 - t) x0 + t x1, x0 ~ N(0, I), for x1 an even
    mixture of N(+m, diag(c^2)) and N(-m, diag(c^2)) with m = ``centres`` (one row per sample, (B, D)) and
    c = ``component_std`` (D,).

    Per component x_t ~ N(t m, diag(s^2)) with s^2 = t^2 c^2 + (1 - t)^2; given x_t, the component's
    E[x1] = m + (t c^2 / s^2)(x - t m) and E[x0] = ((1 - t) / s^2)(x - t m). The mixture weights are the
    components' likelihoods of x (equal covariances: the normalising constants cancel).
    """
    var = (t * component_std) ** 2 + (1.0 - t) ** 2
    log_weights = []
    velocities = []
    for sign in (1.0, -1.0):
        mean = sign * centres
        d = x - t * mean
        log_weights.append(-0.5 * (d * d / var).sum(axis=1))
        velocities.append(mean + (t * component_std**2 / var - (1.0 - t) / var) * d)
    lw = np.stack(log_weights)
    w = np.exp(lw - lw.max(axis=0))
    w /= w.sum(axis=0)
    result: Doubles = w[0][:, None] * velocities[0] + w[1][:, None] * velocities[1]
    return result


def exact_field_metrics(seed: int, eval_seed: int, steps: int) -> dict[str, float]:
    """B1 metrics (:func:`emulator.tasks.bimodal.evaluate_policy` on ``eval_seed``) of ``steps`` explicit
    Euler steps (t = k / steps, as the engine integrates) of :func:`exact_velocity`.

    The path runs on the actions standardised per dimension by training seed ``seed``'s demonstrations (the
    trainer's AutoPerDimension normalisation; the denoiser's own input/output scaling is affine and folds
    exactly, so it does not change the path), as a trained network's path does; samples are mapped back
    to raw units before scoring.
    """
    actions = bimodal.make_demonstrations(seed).flatten().actions.astype(np.float64)
    mean, std = actions.mean(axis=0), actions.std(axis=0)
    rng = _ceiling_rng(seed, eval_seed, _FIELD_NOISE_STREAM)

    def policy(obs: FloatArray) -> FloatArray:
        centres = bimodal.mode_centres(obs) / std  # the mixture is symmetric about ~0: mean only shifts it
        shift = mean / std
        x = rng.standard_normal(centres.shape)
        for k in range(steps):
            # In the standardised space the data is shifted by -shift; the field of the shifted mixture at x
            # is the unshifted field at x + t * shift, plus shift.
            t = k / steps
            x = x + (exact_velocity(x + t * shift, t, centres, bimodal.NOISE_STD / std) - shift) / steps
        raw: FloatArray = (x * std + mean).astype(np.float32)
        return raw

    return bimodal.evaluate_policy(policy, eval_seed)


class _NearbyDemonstration:
    """The ideal sampler: a demonstrated chunk from a demonstration state near the query position."""

    def __init__(
        self, demonstrations: Demonstrations, chunk: int, resolution: float, rng: np.random.Generator
    ) -> None:
        flat = demonstrations.flatten()
        chunks = build_action_chunks(flat.episode_starts, flat.episode_lengths, flat.actions, chunk)
        self.positions = flat.observations[chunks.rows].astype(np.float64)  # (S, 2)
        self.chunks = chunks.actions  # (S, chunk * 2), step-major
        self.resolution = resolution
        self.rng = rng

    def __call__(self, obs: FloatArray) -> FloatArray:
        query = obs.astype(np.float64)
        # (B, S) squared distances: a few hundred agents x ~6,000 states, cheap in numpy.
        d2 = ((query[:, None, :] - self.positions[None, :, :]) ** 2).sum(axis=2)
        near = d2 <= self.resolution**2
        counts = near.sum(axis=1)
        # A uniform choice among each row's near states: the k-th True of the row, k uniform.
        k = np.floor(self.rng.random(len(query)) * np.maximum(counts, 1)).astype(np.int64)
        rank = np.cumsum(near, axis=1) - 1
        chosen = np.argmax(near & (rank == k[:, None]), axis=1)
        chosen = np.where(counts > 0, chosen, np.argmin(d2, axis=1))
        picked: FloatArray = self.chunks[chosen]
        return picked


def ideal_sampler_metrics(
    seed: int, eval_seed: int, resolution: float, *, episodes: int, chunk: int = 8, execute: int = 4
) -> dict[str, float]:
    """B2 metrics (:meth:`emulator.tasks.avoid.Rollouts.metrics`) of the ideal sampler on training seed
    ``seed``'s demonstrations, over ``episodes`` evaluation starts of ``eval_seed``."""
    demonstrations = avoid.make_demonstrations(seed, demo_num=avoid.DEMO_NUM)
    sampler = _NearbyDemonstration(
        demonstrations, chunk, resolution, _ceiling_rng(seed, eval_seed, _SAMPLER_STREAM)
    )
    return avoid.evaluate_policy(sampler, eval_seed, rollout_num=episodes, execute=execute)


def ideal_sampler_rows(
    seeds: Sequence[int], eval_seed: int, *, episodes: int, resolutions: Sequence[float] = CEILING_RESOLUTIONS
) -> list[dict[str, Any]]:
    """One raw row per (seed, resolution): the ceiling beside B2's trained rows."""
    rows: list[dict[str, Any]] = []
    for seed in seeds:
        for resolution in resolutions:
            metrics = ideal_sampler_metrics(seed, eval_seed, resolution, episodes=episodes)
            rows.append(
                {
                    "kind": "ideal-sampler",
                    "task": "b2",
                    "seed": seed,
                    "eval_seed": eval_seed,
                    "episodes": episodes,
                    "resolution": resolution,
                    "chunk": "8/4",
                    "metrics": {k: metrics[k] for k in ("success", "entropy", "collision")}
                    | {k: v for k, v in metrics.items() if k.startswith("mode/")},
                }
            )
    return rows


def exact_field_rows(
    seeds: Sequence[int], eval_seed: int, steps: Sequence[int] = EXACT_FIELD_STEPS
) -> list[dict[str, Any]]:
    """One raw row per (seed, Euler steps): B1's exact-field ceiling beside its trained rows."""
    return [
        {
            "kind": "exact-field",
            "task": "b1",
            "seed": seed,
            "eval_seed": eval_seed,
            "steps": n,
            "metrics": {
                k: v
                for k, v in exact_field_metrics(seed, eval_seed, n).items()
                if k in ("on_mode", "both_modes_covered", "balance_err", "mmd")
            },
        }
        for seed in seeds
        for n in steps
    ]
