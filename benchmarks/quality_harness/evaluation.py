"""Policies and their evaluation: every policy is scored through the task's own metrics, the flow-matching
ones the way the engine runs them (:class:`emulator.inference.EnginePolicy`), each model call timed."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from benchmarks.quality_harness.plan import HarnessConfig, Variant
from emulator.inference import EnginePolicy
from emulator.tasks import avoid, bimodal, pendulum
from protocol.engine.chunks import ChunkLayout
from protocol.schema import parse_schema

__all__ = [
    "ChunkStepper",
    "FloatArray",
    "TimedPolicy",
    "curve_config",
    "evaluate_policy_for",
    "fm_policy",
]

FloatArray = npt.NDArray[np.float32]


class TimedPolicy:
    """Wraps a batched policy and measures the wall-clock of every call (the model call only, not the
    world's simulation): ``seconds``, ``calls``, ``rows``."""

    def __init__(self, policy: Callable[[FloatArray], npt.ArrayLike]) -> None:
        self.policy = policy
        self.seconds = 0.0
        self.calls = 0
        self.rows = 0

    def __call__(self, obs: FloatArray) -> FloatArray:
        started = time.perf_counter()
        out = np.asarray(self.policy(obs), dtype=np.float32)
        self.seconds += time.perf_counter() - started
        self.calls += 1
        self.rows += int(obs.shape[0])
        return out


class ChunkStepper:
    """Runs a chunk policy in a world that asks for one action per step from all agents in lockstep (B3):
    the model is called every ``execute`` steps and its chunk ``(B, C·ActDim)`` is played step by step."""

    def __init__(self, policy: Callable[[FloatArray], FloatArray], act_dim: int, execute: int) -> None:
        if execute < 1:
            raise ValueError(f"execute must be >= 1, got {execute}")
        self.policy = policy
        self.act_dim = act_dim
        self.execute = execute
        self._chunk: FloatArray | None = None
        self._k = 0

    def __call__(self, obs: FloatArray) -> FloatArray:
        if self._chunk is None or self._k >= self.execute or self._chunk.shape[0] != obs.shape[0]:
            chunk = np.asarray(self.policy(obs), dtype=np.float32).reshape(obs.shape[0], -1, self.act_dim)
            if chunk.shape[1] < self.execute:
                raise ValueError(
                    f"the policy returned {chunk.shape[1]} steps per chunk, execute is {self.execute}"
                )
            self._chunk, self._k = chunk, 0
        action = self._chunk[:, self._k]
        self._k += 1
        return action


def evaluate_policy_for(
    task: str, policy: Callable[[FloatArray], npt.ArrayLike], variant: Variant, cfg: HarnessConfig
) -> dict[str, float]:
    """The task's metrics for ``policy`` (fixed evaluation seed ``cfg.eval_seed``), with ``ms_per_call``
    replaced by the wall-clock per model call and ``rows_per_call`` added."""
    timed = TimedPolicy(policy)
    size = cfg.eval_sizes[task]
    if task == "b1":
        metrics = bimodal.evaluate_policy(timed, cfg.eval_seed, obs_num=size, sample_num=cfg.b1_samples)
    elif task == "b2":
        metrics = avoid.evaluate_policy(timed, cfg.eval_seed, rollout_num=size, execute=variant.execute)
    elif task == "b3":
        stepper = ChunkStepper(timed, pendulum.ACT_DIM, variant.execute)
        metrics = pendulum.evaluate_policy(stepper, cfg.eval_seed, episode_num=size)
    else:
        raise KeyError(f"unknown task {task!r}")
    metrics["ms_per_call"] = 1000.0 * timed.seconds / max(timed.calls, 1)
    metrics["rows_per_call"] = timed.rows / max(timed.calls, 1)
    metrics["policy_calls"] = float(timed.calls)
    return metrics


def fm_policy(
    snapshots: Sequence[bytes], nfe: int, seed: int, cfg: HarnessConfig, variant: Variant
) -> Callable[[FloatArray], FloatArray]:
    """The engine's policy from networks in id order (0 denoiser, 1 encoder, 2 decoder) with a fixed RNG;
    a chunk comes back step-major through the engine's chunk layout of the task's action schema."""
    denoiser, encoder, decoder = snapshots[:3]
    module = {"b1": bimodal, "b2": avoid, "b3": pendulum}[variant.task]
    layout = ChunkLayout.from_schema(parse_schema(module.ACTION_SCHEMA, "action"), variant.chunk_size)
    policy = EnginePolicy.from_snapshots(encoder, denoiser, decoder, nfe, layout)
    return policy.bind(np.random.default_rng([cfg.eval_seed, seed, nfe]))


def curve_config(cfg: HarnessConfig) -> HarnessConfig:
    """The evaluation settings of learning-curve points (B1 on a quarter of the held-out observations)."""
    sizes = dict(cfg.eval_sizes)
    sizes["b1"] = max(1, sizes["b1"] // 4)
    return replace(cfg, eval_sizes=sizes)
