"""Benchmark tasks B1-B3 (``docs/benchmarks.md``) and B4 (``sensors``: B3 through an Encoding
observation): data, scripted experts, metrics, closed-loop worlds.

Each task module (``bimodal``, ``avoid``, ``pendulum``, ``sensors``) exposes:

* ``OBSERVATION_SCHEMA`` / ``ACTION_SCHEMA``: the schema JSON objects exactly as the engine writes them
  (spec §4.4, §10 item 4), ready for :func:`protocol.schema.parse_schema`;
* ``make_demonstrations(seed, ...) -> Demonstrations``: seeded expert data, one entry per recorded
  episode (the engine makes one record per agent episode, spec §5.1);
* ``evaluate_policy(policy, seed, ...) -> dict[str, float]``: the benchmark metrics for a batched policy
  ``obs (B, ObsDim) float32 -> actions (B, ActDim) float32`` over fixed evaluation seeds;
* ``TASK``: a :class:`TaskSpec` bundling the above (see :func:`get_task`).

Everything is numpy and seeded: the same seed gives the same bytes.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "TASK_NAMES",
    "Demonstrations",
    "FlatDemonstrations",
    "FloatArray",
    "Policy",
    "TaskSpec",
    "continuous_action_schema",
    "continuous_observation_schema",
    "get_task",
    "task_rng",
]

FloatArray = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int32]

Policy = Callable[[FloatArray], FloatArray]
"""A batched policy: observations ``(B, ObsDim)`` -> actions ``(B, ActDim)`` (float32)."""

TASK_NAMES = ("bimodal", "avoid", "pendulum", "sensors")


def task_rng(seed: int, stream: int) -> np.random.Generator:
    """An independent generator per (seed, purpose): demonstrations, evaluation starts, reference
    samples... never share a stream, so held-out data cannot coincide with training data."""
    return np.random.default_rng([seed & 0xFFFFFFFF, stream])


def continuous_observation_schema(num: int, normalization: str = "AutoPerDimension") -> dict[str, Any]:
    """A Continuous observation node: VectorSize = EncodedSize = Num (spec §10 item 4)."""
    return {
        "VectorSize": num,
        "EncodedSize": num,
        "Type": "Continuous",
        "Num": num,
        "Normalization": normalization,
    }


def continuous_action_schema(num: int, normalization: str = "AutoPerDimension") -> dict[str, Any]:
    """A Continuous action node: VectorSize = Num, DistributionSize = EncodedSize = 2·Num,
    ModifierSize = 1 + 2·Num (spec §10 item 4)."""
    return {
        "VectorSize": num,
        "DistributionSize": 2 * num,
        "EncodedSize": 2 * num,
        "ModifierSize": 1 + 2 * num,
        "Type": "Continuous",
        "Num": num,
        "Normalization": normalization,
    }


@dataclass(frozen=True, slots=True, eq=False)
class FlatDemonstrations:
    """Demonstrations laid out as the engine's replay buffer holds them (spec §5.3).

    ``episode_starts``/``episode_lengths``: int32 ``(E,)``, starts are the cumulative sums of the lengths;
    ``observations``: float32 ``(S, ObsDim)``; ``actions``: float32 ``(S, ActDim)``; S = total steps.
    """

    episode_starts: IntArray
    episode_lengths: IntArray
    observations: FloatArray
    actions: FloatArray


@dataclass(frozen=True, slots=True, eq=False)
class Demonstrations:
    """Expert episodes: each ``(obs (T, ObsDim) float32, act (T, ActDim) float32)`` with T >= 1."""

    episodes: tuple[tuple[FloatArray, FloatArray], ...]

    def __post_init__(self) -> None:
        if not self.episodes:
            raise ValueError("Demonstrations need at least one episode")
        obs_dim = self.episodes[0][0].shape[1]
        act_dim = self.episodes[0][1].shape[1]
        for i, (obs, act) in enumerate(self.episodes):
            if obs.dtype != np.float32 or act.dtype != np.float32:
                raise ValueError(f"episode {i}: arrays must be float32")
            if obs.ndim != 2 or act.ndim != 2 or obs.shape[1] != obs_dim or act.shape[1] != act_dim:
                raise ValueError(
                    f"episode {i}: expected (T, {obs_dim}) and (T, {act_dim}), got {obs.shape}, {act.shape}"
                )
            if obs.shape[0] != act.shape[0] or obs.shape[0] < 1:
                raise ValueError(f"episode {i}: {obs.shape[0]} observations but {act.shape[0]} actions")

    @property
    def obs_dim(self) -> int:
        return int(self.episodes[0][0].shape[1])

    @property
    def act_dim(self) -> int:
        return int(self.episodes[0][1].shape[1])

    @property
    def episode_num(self) -> int:
        return len(self.episodes)

    @property
    def step_num(self) -> int:
        return sum(int(obs.shape[0]) for obs, _ in self.episodes)

    def flatten(self) -> FlatDemonstrations:
        """Concatenate the episodes into replay-buffer arrays (one episode per record, spec §5.3)."""
        lengths = np.array([obs.shape[0] for obs, _ in self.episodes], dtype=np.int32)
        starts = np.zeros_like(lengths)
        np.cumsum(lengths[:-1], out=starts[1:])
        observations = np.concatenate([obs for obs, _ in self.episodes], axis=0)
        actions = np.concatenate([act for _, act in self.episodes], axis=0)
        return FlatDemonstrations(starts, lengths, observations, actions)


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """One benchmark task. ``make_demonstrations(seed)`` and ``evaluate_policy(policy, seed)`` use the
    task's default sizes; call the module functions directly for the other keyword arguments."""

    name: str
    observation_schema: Mapping[str, Any]
    action_schema: Mapping[str, Any]
    make_demonstrations: Callable[[int], Demonstrations]
    evaluate_policy: Callable[[Policy, int], dict[str, float]]

    @property
    def obs_dim(self) -> int:
        return int(self.observation_schema["VectorSize"])

    @property
    def act_dim(self) -> int:
        return int(self.action_schema["VectorSize"])


def get_task(name: str) -> TaskSpec:
    """The task called ``name`` (one of :data:`TASK_NAMES`); its module is imported on first use."""
    if name not in TASK_NAMES:
        raise KeyError(f"unknown task {name!r}; known: {', '.join(TASK_NAMES)}")
    spec: TaskSpec = importlib.import_module(f"{__name__}.{name}").TASK
    return spec
