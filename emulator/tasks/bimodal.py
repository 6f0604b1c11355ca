"""B1: conditional bimodal actions, open loop (``docs/benchmarks.md`` B1).

Observation o ~ U[-1, 1]²; θ = π·o₀; mode s ∈ {+1, -1} with p = ½; action a = s·(cos θ, sin θ) +
0.05·N(0, I). The conditional mean is 0, never a valid action: the classic MSE failure.

Episodes: every (o, a) pair is its own 1-step episode. The pairs are independent draws, so stringing them
into longer episodes would invent a temporal order that does not exist, and any action chunk built across
them would be meaningless; one record per pair is also what a recorder produces for one-step agent
episodes. Use ActionChunkSize 1.

Metrics over 200 held-out observations × 64 samples (fixed RNG):

* ``on_mode``: fraction of samples within 0.2 (4σ) of either mode centre ±(cos θ, sin θ);
* ``both_modes_covered``: fraction of observations whose samples hit both modes at least once;
* ``balance_err``: mean over observations of |fraction of on-mode samples in the + mode − 0.5|, over the
  observations with at least one on-mode sample (NaN when there is none: the benchmark table's "–");
* ``mmd``: RBF-MMD² between the 64 policy samples and 64 fresh demo samples per observation, averaged
  over observations. Kernel k(x, y) = Σ_h exp(−‖x − y‖² / (2h²)), h ∈ {0.05, 0.2, 1.0}; the biased
  (V-statistic) estimator with all pairs including i = j. This form reproduces the reference values the
  benchmark quotes: floor ≈ 0.05, single-mode collapse ≈ 1.05, mean predictor ≈ 2.99.
"""

from __future__ import annotations

import time

import numpy as np
import numpy.typing as npt

from emulator.tasks import (
    Demonstrations,
    FloatArray,
    Policy,
    TaskSpec,
    continuous_action_schema,
    continuous_observation_schema,
    task_rng,
)

__all__ = [
    "ACTION_SCHEMA",
    "ACT_DIM",
    "EVAL_OBS_NUM",
    "EVAL_SAMPLE_NUM",
    "MMD_BANDWIDTHS",
    "NOISE_STD",
    "OBSERVATION_SCHEMA",
    "OBS_DIM",
    "ON_MODE_RADIUS",
    "PAIR_NUM",
    "TASK",
    "evaluate_policy",
    "evaluate_samples",
    "make_demonstrations",
    "mode_centres",
    "sample_actions",
    "sample_observations",
]

OBS_DIM = 2
ACT_DIM = 2
OBSERVATION_SCHEMA = continuous_observation_schema(OBS_DIM)
ACTION_SCHEMA = continuous_action_schema(ACT_DIM)

PAIR_NUM = 20_000
"""Demonstration pairs (benchmarks.md B1)."""
NOISE_STD = 0.05
"""Action noise around the mode centre (σ)."""
ON_MODE_RADIUS = 0.2
"""A sample is on a mode within this distance of its centre (4σ)."""
MMD_BANDWIDTHS = (0.05, 0.2, 1.0)
EVAL_OBS_NUM = 200
EVAL_SAMPLE_NUM = 64

# Independent RNG streams (see task_rng).
_DEMO_STREAM = 0xB1_0001
_EVAL_OBS_STREAM = 0xB1_0002
_EVAL_REF_STREAM = 0xB1_0003


def sample_observations(n: int, rng: np.random.Generator) -> FloatArray:
    """``n`` observations ~ U[-1, 1]², shape ``(n, 2)`` float32."""
    return rng.uniform(-1.0, 1.0, size=(n, OBS_DIM)).astype(np.float32)


def mode_centres(obs: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """The + mode centre (cos πo₀, sin πo₀) for each observation, shape ``(B, 2)`` float64."""
    theta = np.pi * np.asarray(obs, dtype=np.float64)[..., 0]
    return np.stack([np.cos(theta), np.sin(theta)], axis=-1)


def sample_actions(obs: npt.ArrayLike, rng: np.random.Generator) -> FloatArray:
    """Draws from the true conditional p(a | o): shape ``(B, 2)`` float32 (the demonstrator)."""
    centres = mode_centres(obs)
    signs = rng.choice(np.array([-1.0, 1.0]), size=(centres.shape[0], 1))
    noise = NOISE_STD * rng.standard_normal(centres.shape)
    return (signs * centres + noise).astype(np.float32)


def make_demonstrations(seed: int = 0, pair_num: int = PAIR_NUM) -> Demonstrations:
    """``pair_num`` independent pairs, one 1-step episode each (see the module docstring)."""
    rng = task_rng(seed, _DEMO_STREAM)
    obs = sample_observations(pair_num, rng)
    act = sample_actions(obs, rng)
    return Demonstrations(tuple((obs[i : i + 1], act[i : i + 1]) for i in range(pair_num)))


def _mmd2(samples: npt.NDArray[np.float64], reference: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Biased RBF-MMD² per observation: samples ``(N, K, 2)``, reference ``(N, M, 2)`` -> ``(N,)``."""

    def kernel_mean(a: npt.NDArray[np.float64], b: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        d2 = np.sum((a[:, :, None, :] - b[:, None, :, :]) ** 2, axis=-1)
        total = np.zeros(d2.shape, np.float64)
        for h in MMD_BANDWIDTHS:
            total += np.exp(-d2 / (2.0 * h * h))
        result: npt.NDArray[np.float64] = total.mean(axis=(1, 2))
        return result

    return (
        kernel_mean(samples, samples)
        + kernel_mean(reference, reference)
        - 2.0 * kernel_mean(samples, reference)
    )


def evaluate_samples(
    obs: npt.ArrayLike, samples: npt.ArrayLike, reference: npt.ArrayLike
) -> dict[str, float]:
    """B1 metrics from policy ``samples`` ``(N, K, 2)`` and demo ``reference`` ``(N, M, 2)`` for ``obs`` ``(N, 2)``.

    Non-finite samples count as off-mode (and enter the MMD as NaN).
    """
    a = np.asarray(samples, dtype=np.float64)
    centres = mode_centres(obs)[:, None, :]
    on_plus = np.linalg.norm(a - centres, axis=-1) < ON_MODE_RADIUS
    on_minus = np.linalg.norm(a + centres, axis=-1) < ON_MODE_RADIUS
    on_any = on_plus | on_minus
    n_plus = on_plus.sum(axis=1)
    n_on = on_any.sum(axis=1)
    covered = (n_plus > 0) & (on_minus.sum(axis=1) > 0)
    has_on = n_on > 0
    balance = np.abs(n_plus[has_on] / n_on[has_on] - 0.5)
    return {
        "on_mode": float(on_any.mean()),
        "both_modes_covered": float(covered.mean()),
        "balance_err": float(balance.mean()) if balance.size else float("nan"),
        "mmd": float(_mmd2(a, np.asarray(reference, dtype=np.float64)).mean()),
    }


def evaluate_policy(
    policy: Policy,
    seed: int = 0,
    obs_num: int = EVAL_OBS_NUM,
    sample_num: int = EVAL_SAMPLE_NUM,
) -> dict[str, float]:
    """Score ``policy`` on B1. The policy is called once with all ``obs_num × sample_num`` rows (each
    held-out observation repeated ``sample_num`` times); its own RNG supplies the sampling noise.

    Returns on_mode, both_modes_covered, balance_err, mmd, ms_per_call (wall clock of that call).
    """
    obs = sample_observations(obs_num, task_rng(seed, _EVAL_OBS_STREAM))
    ref_rng = task_rng(seed, _EVAL_REF_STREAM)
    repeated = np.repeat(obs, sample_num, axis=0)
    reference = sample_actions(repeated, ref_rng).reshape(obs_num, sample_num, ACT_DIM)
    started = time.perf_counter()
    actions = np.asarray(policy(repeated), dtype=np.float32)
    elapsed = time.perf_counter() - started
    if actions.shape != (obs_num * sample_num, ACT_DIM):
        raise ValueError(
            f"the policy returned shape {actions.shape}, expected {(obs_num * sample_num, ACT_DIM)}"
        )
    metrics = evaluate_samples(obs, actions.reshape(obs_num, sample_num, ACT_DIM), reference)
    metrics["ms_per_call"] = 1000.0 * elapsed
    return metrics


TASK = TaskSpec(
    name="bimodal",
    observation_schema=OBSERVATION_SCHEMA,
    action_schema=ACTION_SCHEMA,
    make_demonstrations=make_demonstrations,
    evaluate_policy=evaluate_policy,
)
