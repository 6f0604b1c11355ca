"""B3: pendulum swing-up, a unimodal precision-control no-regression check (``docs/benchmarks.md`` B3).

Gymnasium Pendulum-v1 dynamics in numpy: g = 10, m = l = 1, dt = 0.05, torque clipped to ±2, speed
clipped to ±8, 200 steps; θ = 0 is upright; cost θ² + 0.1ω² + 0.001u² with θ wrapped to [-π, π), reward
= -cost, computed from the state *before* the step as Pendulum-v1 does. Start θ ~ U[-π, π], ω ~ U[-1, 1].
Semi-implicit Euler: ω' = clip(ω + (3g/(2l)·sin θ + 3/(ml²)·u)·dt, ±8); θ' = θ + ω'·dt.

Observation (cos θ, sin θ, ω/8); action = torque u (one float, clipped to ±2 by the world).

Expert: energy pumping far from upright, PD (kp 10, kd 2) within 0.6 rad. With these dynamics
d/dt(½ω² + 15·cos θ) = 3uω, so E = ½ω² + 15·cos θ is the energy and 15 is upright at rest; the pump
applies full torque in the direction that moves E towards 15 (bang-bang, the fastest swing-up).

Metrics over 100 episodes with fixed starts: mean return R, normalised score (R − R_random) / (R_expert −
R_random) with both baselines measured on the same starts, and ``upright``: the fraction of episodes whose
|θ| stays below 0.2 rad over all of the final 50 steps. [INF] the benchmark does not give the upright
tolerance; 0.2 rad (11°) is well inside the region the torque limit can hold (|sin θ| < 0.4).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

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
    "DEMO_NUM",
    "EPISODE_STEPS",
    "EVAL_EPISODE_NUM",
    "MAX_TORQUE",
    "OBSERVATION_SCHEMA",
    "OBS_DIM",
    "TASK",
    "UPRIGHT_ANGLE",
    "UPRIGHT_STEPS",
    "Episodes",
    "angle_normalize",
    "evaluate_policy",
    "expert_policy",
    "make_demonstrations",
    "observe",
    "random_policy",
    "run_episodes",
    "sample_starts",
]

OBS_DIM = 3
ACT_DIM = 1
OBSERVATION_SCHEMA = continuous_observation_schema(OBS_DIM)
ACTION_SCHEMA = continuous_action_schema(ACT_DIM)

GRAVITY = 10.0
MASS = 1.0
LENGTH = 1.0
DT = 0.05
MAX_TORQUE = 2.0
MAX_SPEED = 8.0
EPISODE_STEPS = 200
KP = 10.0
KD = 2.0
PD_ANGLE = 0.6
"""The expert switches from energy pumping to PD within this angle of upright (rad)."""
UPRIGHT_ANGLE = 0.2
UPRIGHT_STEPS = 50
DEMO_NUM = 100
EVAL_EPISODE_NUM = 100

_UPRIGHT_ENERGY = 3.0 * GRAVITY / (2.0 * LENGTH)  # ½ω² + this·cos θ is conserved without torque

_DEMO_STREAM = 0xB3_0001
_EVAL_START_STREAM = 0xB3_0002
_RANDOM_STREAM = 0xB3_0003


def angle_normalize(theta: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """Wrap angles to [-π, π)."""
    wrapped: npt.NDArray[np.float64] = (np.asarray(theta, dtype=np.float64) + np.pi) % (2.0 * np.pi) - np.pi
    return wrapped


def observe(theta: npt.NDArray[np.float64], omega: npt.NDArray[np.float64]) -> FloatArray:
    """(cos θ, sin θ, ω/8), shape ``(B, 3)`` float32."""
    return np.stack([np.cos(theta), np.sin(theta), omega / MAX_SPEED], axis=1).astype(np.float32)


def sample_starts(
    n: int, rng: np.random.Generator
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """``n`` start states: θ ~ U[-π, π], ω ~ U[-1, 1]."""
    return rng.uniform(-np.pi, np.pi, size=n), rng.uniform(-1.0, 1.0, size=n)


def expert_policy(obs: npt.ArrayLike) -> FloatArray:
    """Energy pumping + PD from observations ``(B, 3)`` -> torque ``(B, 1)`` float32 (deterministic)."""
    o = np.asarray(obs, dtype=np.float64)
    theta = np.arctan2(o[:, 1], o[:, 0])
    omega = o[:, 2] * MAX_SPEED
    energy = 0.5 * omega**2 + _UPRIGHT_ENERGY * np.cos(theta)
    # The tiny offset picks a direction when ω = 0 (hanging still): any kick starts the pumping.
    pump = MAX_TORQUE * np.sign((_UPRIGHT_ENERGY - energy) * omega + 1e-9)
    pd = -KP * theta - KD * omega
    torque = np.clip(np.where(np.abs(theta) < PD_ANGLE, pd, pump), -MAX_TORQUE, MAX_TORQUE)
    return torque[:, None].astype(np.float32)


def random_policy(rng: np.random.Generator) -> Policy:
    """Uniform random torque in [-2, 2] (the benchmark's lower anchor)."""

    def policy(obs: FloatArray) -> FloatArray:
        return rng.uniform(-MAX_TORQUE, MAX_TORQUE, size=(obs.shape[0], ACT_DIM)).astype(np.float32)

    return policy


@dataclass(frozen=True, slots=True, eq=False)
class Episodes:
    """Batched episodes: ``returns`` ``(N,)``, ``upright`` ``(N,)`` bool; ``observations``
    ``(N, T, 3)`` and ``actions`` ``(N, T, 1)`` float32 (the clipped torques applied)."""

    returns: npt.NDArray[np.float64]
    upright: npt.NDArray[np.bool_]
    observations: FloatArray
    actions: FloatArray
    policy_seconds: float


def run_episodes(
    policy: Policy, theta: npt.ArrayLike, omega: npt.ArrayLike, steps: int = EPISODE_STEPS
) -> Episodes:
    """Run all episodes in lockstep (the policy sees every agent's observation at once)."""
    th = np.array(theta, dtype=np.float64)
    om = np.array(omega, dtype=np.float64)
    n = th.shape[0]
    returns = np.zeros(n)
    max_tail_angle = np.zeros(n)
    observations = np.empty((n, steps, OBS_DIM), np.float32)
    actions = np.empty((n, steps, ACT_DIM), np.float32)
    seconds = 0.0
    for k in range(steps):
        obs = observe(th, om)
        started = time.perf_counter()
        raw = np.asarray(policy(obs), dtype=np.float64)
        seconds += time.perf_counter() - started
        if raw.shape != (n, ACT_DIM):
            raise ValueError(f"the policy returned shape {raw.shape}, expected {(n, ACT_DIM)}")
        # A non-finite torque (a broken policy) is applied as 0 so the episode still scores.
        u = np.clip(np.nan_to_num(raw[:, 0], nan=0.0, posinf=0.0, neginf=0.0), -MAX_TORQUE, MAX_TORQUE)
        observations[:, k] = obs
        actions[:, k, 0] = u
        returns -= angle_normalize(th) ** 2 + 0.1 * om**2 + 0.001 * u**2
        om = np.clip(
            om + (3.0 * GRAVITY / (2.0 * LENGTH) * np.sin(th) + 3.0 / (MASS * LENGTH**2) * u) * DT,
            -MAX_SPEED,
            MAX_SPEED,
        )
        th = th + om * DT
        if k >= steps - UPRIGHT_STEPS:
            max_tail_angle = np.maximum(max_tail_angle, np.abs(angle_normalize(th)))
    return Episodes(returns, max_tail_angle < UPRIGHT_ANGLE, observations, actions, seconds)


def make_demonstrations(seed: int = 0, demo_num: int = DEMO_NUM) -> Demonstrations:
    """``demo_num`` expert episodes of 200 steps from random starts."""
    theta, omega = sample_starts(demo_num, task_rng(seed, _DEMO_STREAM))
    episodes = run_episodes(expert_policy, theta, omega)
    return Demonstrations(tuple((episodes.observations[i], episodes.actions[i]) for i in range(demo_num)))


def evaluate_policy(policy: Policy, seed: int = 0, episode_num: int = EVAL_EPISODE_NUM) -> dict[str, float]:
    """B3 metrics of ``policy``: return, score, upright, plus the expert's and random baseline's
    return on the same starts and the wall clock per batched policy call."""
    theta, omega = sample_starts(episode_num, task_rng(seed, _EVAL_START_STREAM))
    result = run_episodes(policy, theta, omega)
    expert = run_episodes(expert_policy, theta, omega)
    baseline = run_episodes(random_policy(task_rng(seed, _RANDOM_STREAM)), theta, omega)
    r, r_expert, r_random = (float(e.returns.mean()) for e in (result, expert, baseline))
    return {
        "return": r,
        "score": (r - r_random) / (r_expert - r_random),
        "upright": float(result.upright.mean()),
        "expert_return": r_expert,
        "random_return": r_random,
        "ms_per_call": 1000.0 * result.policy_seconds / EPISODE_STEPS,
    }


TASK = TaskSpec(
    name="pendulum",
    observation_schema=OBSERVATION_SCHEMA,
    action_schema=ACTION_SCHEMA,
    make_demonstrations=make_demonstrations,
    evaluate_policy=evaluate_policy,
)
