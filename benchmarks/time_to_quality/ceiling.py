"""B2's ideal-sampler ceiling: what a perfect position-only policy trained on the task's own data reaches.

A learned B2 policy sees only the agent's position (x, y) and returns a chunk of 8 actions, 4 executed. The
best such a policy can do is to sample, at each position, from the demonstrations' own chunk distribution
there. This module runs that sampler directly, with no network: at every call each agent draws one
demonstration state uniformly among those within ``resolution`` of its position (the nearest one where
none is that close) and executes the first 4 of the 8 demonstrated actions from that state, padded past
the episode's end by repeating its last action as the trainer's chunks are
(:func:`trainer.data.build_action_chunks`). The same 200 demonstrations of the training seed, the same
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

from emulator.tasks import Demonstrations, FloatArray, avoid, task_rng
from trainer.data import build_action_chunks

__all__ = ["CEILING_RESOLUTIONS", "ideal_sampler_metrics", "ideal_sampler_rows"]

CEILING_RESOLUTIONS = (0.005, 0.02)
"""Position resolutions (world units; the agent moves at most 0.05 per step) of the reported ceiling."""

_SAMPLER_STREAM = 0xB2_C311
"""Random stream of the sampler's choices (:func:`emulator.tasks.task_rng`), apart from the task's own."""


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
        demonstrations, chunk, resolution, task_rng(seed * 7919 + eval_seed, _SAMPLER_STREAM)
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
