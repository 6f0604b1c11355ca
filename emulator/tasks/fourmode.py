"""Four modes: B1 with four action modes instead of two, open loop (issue 33's unseen check, rebuilt from
its description; not one of ``docs/benchmarks.md``'s tasks).

Observation o ~ U[-1, 1]²; θ = (π/2)·o₀; mode k uniform in {0, 1, 2, 3}; action
a = (cos(θ + kπ/2), sin(θ + kπ/2)) + 0.05·N(0, I): four modes a quarter turn apart, rotating with o₀ through
two quarter turns over its range (as many periods of the mode set as B1 has). One (o, a) pair per episode,
20,000 pairs, ActionChunkSize 1, as for B1. ``turn`` = π instead of π/2 (θ = π·o₀, the description's
literal reading) gives four periods, which neither la-trainer nor a plain trainer learns at 1 x 128 in
10,000 iterations (benchmarks/results/selection/: on-mode about 0.25, a ring).

Metrics over 200 observations × 64 samples (fixed RNG): ``on_mode`` (share of samples within 0.2 of one
of the four centres), ``all_modes_covered`` (share of observations whose samples hit every mode) and
``balance_err`` (mean |share of on-mode samples per mode − ¼|; NaN when no sample is on a mode).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from emulator.tasks import (
    Demonstrations,
    FloatArray,
    Policy,
    continuous_action_schema,
    continuous_observation_schema,
    task_rng,
)

__all__ = [
    "ACTION_SCHEMA",
    "OBSERVATION_SCHEMA",
    "PAIR_NUM",
    "evaluate_policy",
    "make_demonstrations",
    "mode_centres",
]

OBSERVATION_SCHEMA = continuous_observation_schema(2)
ACTION_SCHEMA = continuous_action_schema(2)
PAIR_NUM = 20_000
NOISE_STD = 0.05
ON_MODE_RADIUS = 0.2
MODES = 4
EVAL_OBS_NUM = 200
EVAL_SAMPLE_NUM = 64
_DEMO_STREAM, _EVAL_OBS_STREAM = 0x4D_0001, 0x4D_0002


TURN = np.pi / 2
"""θ = TURN·o₀."""


def mode_centres(obs: npt.ArrayLike, turn: float = TURN) -> npt.NDArray[np.float64]:
    """(N, 4, 2): the four mode centres of each observation."""
    theta = turn * np.asarray(obs, np.float64)[:, 0:1] + np.arange(MODES)[None, :] * (np.pi / 2)
    return np.stack([np.cos(theta), np.sin(theta)], axis=-1)


def make_demonstrations(seed: int = 0, pair_num: int = PAIR_NUM, turn: float = TURN) -> Demonstrations:
    rng = task_rng(seed, _DEMO_STREAM)
    obs = rng.uniform(-1.0, 1.0, size=(pair_num, 2)).astype(np.float32)
    centres = mode_centres(obs, turn)[np.arange(pair_num), rng.integers(0, MODES, size=pair_num)]
    act: FloatArray = (centres + NOISE_STD * rng.standard_normal((pair_num, 2))).astype(np.float32)
    return Demonstrations(tuple((obs[i : i + 1], act[i : i + 1]) for i in range(pair_num)))


def evaluate_policy(policy: Policy, seed: int, turn: float = TURN) -> dict[str, float]:
    """The metrics of ``policy`` (module docstring) on the observations of evaluation seed ``seed``."""
    obs = task_rng(seed, _EVAL_OBS_STREAM).uniform(-1.0, 1.0, size=(EVAL_OBS_NUM, 2)).astype(np.float32)
    actions = np.asarray(policy(np.repeat(obs, EVAL_SAMPLE_NUM, axis=0)), np.float64)
    actions = actions.reshape(EVAL_OBS_NUM, EVAL_SAMPLE_NUM, 2)
    distance = np.linalg.norm(actions[:, :, None, :] - mode_centres(obs, turn)[:, None, :, :], axis=-1)
    on = distance < ON_MODE_RADIUS  # (N, S, 4)
    per_mode = on.sum(axis=1)
    on_num = per_mode.sum(axis=1)
    hit = on_num > 0
    balance = np.abs(per_mode[hit] / on_num[hit, None] - 1.0 / MODES).mean(axis=1)
    return {
        "on_mode": float(on.any(axis=2).mean()),
        "all_modes_covered": float((per_mode > 0).all(axis=1).mean()),
        "balance_err": float(balance.mean()) if balance.size else float("nan"),
    }
