"""B2: closed-loop 2-D "avoid" with 6 path modes (D3IL-Avoiding in numpy, ``docs/benchmarks.md`` B2).

World: a point agent starts at (U[-0.05, 0.05], 0) and must reach y >= 1.0 within 60 steps without touching
an obstacle: disc (0, 0.35) r 0.12, discs (±0.22, 0.70) r 0.10. Observation = (x, y). Action = velocity
/ 0.05, i.e. a normalised velocity whose norm is clipped to 1 (|v| <= 0.05 per step). [INF] The benchmark
says only "|v| <= 0.05"; clipping the vector norm (not each component) keeps the speed limit isotropic.

Touching is tested on the whole step segment, not only its end point, so a fast diagonal step cannot
tunnel through the edge of a disc. A collision ends the episode as a failure.

Path modes: which side of the first obstacle the agent passes (where it crosses y = 0.35: L if x < 0,
R otherwise) × which gap of the second row it takes (where it crosses y = 0.70: left of the left disc's
centre, between the centres, right of the right disc's centre) = 6 modes.

Expert: waypoint follower at full speed with 10 % action noise (σ = 0.1 in normalised units, added before
the norm clip). Per episode it picks side and gap uniformly; its waypoints are
(∓0.22, 0.35) -> (∓0.22, 0.50) -> (gap x, 0.55) -> (gap x, 1.10) with gap x ∈ {-0.42, 0, 0.42}; they keep
every straight leg at least 0.06 from every obstacle. Only successful expert episodes become
demonstrations (a curated dataset, as D3IL's is).

Policies act on all live agents at once (batched). A policy may return an action chunk, shape
``(B, C·2)`` (step-major: [a_0, a_1, ...], the decoder's chunk layout) or ``(B, C, 2)``; the world executes
the first ``execute`` steps of each chunk before asking again (``execute <= C``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
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
    "EVAL_ROLLOUT_NUM",
    "EXPERT_NOISE",
    "GAPS",
    "GOAL_Y",
    "MAX_SPEED",
    "MAX_STEPS",
    "MODE_NAMES",
    "OBSERVATION_SCHEMA",
    "OBSTACLES",
    "OBS_DIM",
    "SIDES",
    "TASK",
    "Rollouts",
    "evaluate_expert",
    "evaluate_policy",
    "make_demonstrations",
    "rollout",
    "sample_starts",
]

OBS_DIM = 2
ACT_DIM = 2
OBSERVATION_SCHEMA = continuous_observation_schema(OBS_DIM)
ACTION_SCHEMA = continuous_action_schema(ACT_DIM)

START_HALF_WIDTH = 0.05
"""Start x ~ U[-0.05, 0.05], y = 0."""
MAX_SPEED = 0.05
"""Distance per step at action norm 1 (actions are velocities normalised by this)."""
MAX_STEPS = 60
GOAL_Y = 1.0
OBSTACLES: tuple[tuple[float, float, float], ...] = (
    (0.0, 0.35, 0.12),
    (-0.22, 0.70, 0.10),
    (0.22, 0.70, 0.10),
)
"""(centre x, centre y, radius) of each disc."""
FIRST_ROW_Y = 0.35
GAP_ROW_Y = 0.70
GAP_EDGE_X = 0.22
"""Crossing y = 0.70 at x < -0.22 is the left gap, x > 0.22 the right one, otherwise the middle."""
SIDES = ("L", "R")
GAPS = ("left", "mid", "right")
MODE_NAMES = tuple(f"{side}-{gap}" for side in SIDES for gap in GAPS)
"""Mode index = side index · 3 + gap index."""
EXPERT_NOISE = 0.1
DEMO_NUM = 200
EVAL_ROLLOUT_NUM = 200

_SIDE_X = (-0.22, 0.22)
_GAP_X = (-0.42, 0.0, 0.42)
_WAYPOINT_REACHED = MAX_SPEED
_UNSET = -1

_DEMO_STREAM = 0xB2_0001
_EVAL_START_STREAM = 0xB2_0002
_EXPERT_MODE_STREAM = 0xB2_0003

ChunkFunction = Callable[[npt.NDArray[np.intp], FloatArray], npt.ArrayLike]
"""(indices of the live agents, their observations (B, 2)) -> actions (B, C·2) or (B, C, 2)."""


@dataclass(frozen=True, slots=True, eq=False)
class Rollouts:
    """Outcome of N episodes. ``side``/``gap`` are -1 where the row was never crossed.

    ``observations``/``actions`` hold each agent's (T, 2) float32 trajectory when recorded.
    """

    success: npt.NDArray[np.bool_]
    collided: npt.NDArray[np.bool_]
    side: npt.NDArray[np.int8]
    gap: npt.NDArray[np.int8]
    steps: npt.NDArray[np.int32]
    policy_calls: int
    policy_seconds: float
    observations: tuple[FloatArray, ...] = ()
    actions: tuple[FloatArray, ...] = ()

    @property
    def modes(self) -> npt.NDArray[np.int64]:
        """Mode index (see :data:`MODE_NAMES`) of every successful episode."""
        ok = self.success & (self.side >= 0) & (self.gap >= 0)
        modes: npt.NDArray[np.int64] = self.side[ok].astype(np.int64) * len(GAPS) + self.gap[ok]
        return modes

    def metrics(self) -> dict[str, float]:
        """success, entropy (of the successful episodes' mode histogram, / log 6), ms_per_call,
        policy_calls, collision rate, mean steps and the histogram as ``mode/<name>`` counts."""
        hist = np.bincount(self.modes, minlength=len(MODE_NAMES)).astype(np.float64)
        total = hist.sum()
        entropy = 0.0
        if total > 0:
            p = hist[hist > 0] / total
            entropy = float(-(p * np.log(p)).sum() / math.log(len(MODE_NAMES)))
        out = {
            "success": float(self.success.mean()),
            "entropy": entropy,
            "collision": float(self.collided.mean()),
            "mean_steps": float(self.steps.mean()),
            "policy_calls": float(self.policy_calls),
            "ms_per_call": 1000.0 * self.policy_seconds / max(self.policy_calls, 1),
        }
        for name, count in zip(MODE_NAMES, hist, strict=True):
            out[f"mode/{name}"] = float(count)
        return out


def sample_starts(n: int, rng: np.random.Generator) -> npt.NDArray[np.float64]:
    """``n`` start positions (U[-0.05, 0.05], 0), shape ``(n, 2)``."""
    starts = np.zeros((n, 2), np.float64)
    starts[:, 0] = rng.uniform(-START_HALF_WIDTH, START_HALF_WIDTH, size=n)
    return starts


def _clip_norm(actions: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    norm = np.linalg.norm(actions, axis=-1, keepdims=True)
    scaled: npt.NDArray[np.float64] = actions / np.maximum(norm, 1.0)
    return scaled


def _touches(p0: npt.NDArray[np.float64], p1: npt.NDArray[np.float64]) -> npt.NDArray[np.bool_]:
    """Whether the segment p0 -> p1 (each ``(B, 2)``) comes within any obstacle's radius."""
    hit = np.zeros(p0.shape[0], np.bool_)
    d = p1 - p0
    dd = np.maximum(np.sum(d * d, axis=1), 1e-18)
    for cx, cy, r in OBSTACLES:
        f = np.array([cx, cy]) - p0
        t = np.clip(np.sum(f * d, axis=1) / dd, 0.0, 1.0)
        closest = p0 + t[:, None] * d
        hit |= np.linalg.norm(closest - np.array([cx, cy]), axis=1) <= r
    return hit


def _crossing_x(
    p0: npt.NDArray[np.float64], p1: npt.NDArray[np.float64], y: float
) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.float64]]:
    """Which segments cross the line ``y`` upwards, and the x where they do."""
    crosses = (p0[:, 1] < y) & (p1[:, 1] >= y)
    dy = np.where(crosses, p1[:, 1] - p0[:, 1], 1.0)
    x = p0[:, 0] + (y - p0[:, 1]) / dy * (p1[:, 0] - p0[:, 0])
    return crosses, x


def rollout(
    chunk_fn: ChunkFunction, starts: npt.ArrayLike, execute: int = 1, *, record: bool = False
) -> Rollouts:
    """Run one episode per start position, all agents in lockstep, until each succeeds, collides or
    reaches :data:`MAX_STEPS`. ``chunk_fn`` is called with the live agents only."""
    pos = np.array(starts, dtype=np.float64)
    n = pos.shape[0]
    if execute < 1:
        raise ValueError(f"execute must be >= 1, got {execute}")
    alive = np.ones(n, np.bool_)
    success = np.zeros(n, np.bool_)
    collided = np.zeros(n, np.bool_)
    side = np.full(n, _UNSET, np.int8)
    gap = np.full(n, _UNSET, np.int8)
    steps = np.zeros(n, np.int32)
    obs_log: list[list[npt.NDArray[np.float32]]] = [[] for _ in range(n)] if record else []
    act_log: list[list[npt.NDArray[np.float32]]] = [[] for _ in range(n)] if record else []
    calls = 0
    seconds = 0.0
    while alive.any():
        idx = np.flatnonzero(alive)
        started = time.perf_counter()
        raw = np.asarray(chunk_fn(idx, pos[idx].astype(np.float32)), dtype=np.float64)
        seconds += time.perf_counter() - started
        calls += 1
        if raw.ndim < 2 or raw.shape[0] != idx.size or raw[0].size % ACT_DIM != 0:
            raise ValueError(f"the policy returned shape {raw.shape} for {idx.size} agents")
        chunk = raw.reshape(idx.size, -1, ACT_DIM)
        if chunk.shape[1] < execute:
            raise ValueError(
                f"the policy returned {chunk.shape[1]} steps per chunk, fewer than execute={execute}"
            )
        for j in range(execute):
            rows = np.flatnonzero(alive[idx])
            if rows.size == 0:
                break
            live = idx[rows]
            # A non-finite action (a broken policy) is treated as standing still, never as a crash here.
            action = _clip_norm(np.nan_to_num(chunk[rows, j], nan=0.0, posinf=0.0, neginf=0.0))
            p0 = pos[live]
            p1 = p0 + MAX_SPEED * action
            if record:
                for k, agent in enumerate(live):
                    obs_log[agent].append(p0[k].astype(np.float32))
                    act_log[agent].append(action[k].astype(np.float32))
            first, x_first = _crossing_x(p0, p1, FIRST_ROW_Y)
            new_side = first & (side[live] == _UNSET)
            side[live[new_side]] = (x_first[new_side] >= 0.0).astype(np.int8)
            second, x_second = _crossing_x(p0, p1, GAP_ROW_Y)
            new_gap = second & (gap[live] == _UNSET)
            gap[live[new_gap]] = np.where(
                x_second[new_gap] < -GAP_EDGE_X, 0, np.where(x_second[new_gap] > GAP_EDGE_X, 2, 1)
            ).astype(np.int8)
            hit = _touches(p0, p1)
            pos[live] = p1
            steps[live] += 1
            reached = (p1[:, 1] >= GOAL_Y) & ~hit
            collided[live[hit]] = True
            success[live[reached]] = True
            alive[live[hit | reached | (steps[live] >= MAX_STEPS)]] = False
    observations: tuple[FloatArray, ...] = ()
    actions: tuple[FloatArray, ...] = ()
    if record:
        observations = tuple(np.stack(o) for o in obs_log)
        actions = tuple(np.stack(a) for a in act_log)
    return Rollouts(success, collided, side, gap, steps, calls, seconds, observations, actions)


class _Expert:
    """The scripted waypoint follower; one mode (side, gap) per agent, fixed for its episode."""

    def __init__(self, modes: npt.NDArray[np.int64], rng: np.random.Generator, noise: float) -> None:
        side_x = np.array(_SIDE_X)[modes // len(GAPS)]
        gap_x = np.array(_GAP_X)[modes % len(GAPS)]
        self.waypoints = np.stack(
            [
                np.stack([side_x, np.full_like(side_x, FIRST_ROW_Y)], axis=1),
                np.stack([side_x, np.full_like(side_x, 0.50)], axis=1),
                np.stack([gap_x, np.full_like(gap_x, 0.55)], axis=1),
                np.stack([gap_x, np.full_like(gap_x, 1.10)], axis=1),
            ],
            axis=1,
        )  # (N, 4, 2)
        self.target = np.zeros(modes.shape[0], np.intp)
        self.rng = rng
        self.noise = noise

    def __call__(self, idx: npt.NDArray[np.intp], obs: FloatArray) -> FloatArray:
        pos = obs.astype(np.float64)
        last = self.waypoints.shape[1] - 1
        for _ in range(last):
            wp = self.waypoints[idx, self.target[idx]]
            advance = (np.linalg.norm(wp - pos, axis=1) < _WAYPOINT_REACHED) & (self.target[idx] < last)
            self.target[idx[advance]] += 1
        wp = self.waypoints[idx, self.target[idx]]
        action = _clip_norm((wp - pos) / MAX_SPEED)
        action = action + self.noise * self.rng.standard_normal(action.shape)
        return action[:, None, :].astype(np.float32)


def make_demonstrations(
    seed: int = 0, demo_num: int = DEMO_NUM, noise: float = EXPERT_NOISE
) -> Demonstrations:
    """``demo_num`` successful expert episodes (≈ 30 steps each), modes drawn uniformly."""
    rng = task_rng(seed, _DEMO_STREAM)
    episodes: list[tuple[FloatArray, FloatArray]] = []
    while len(episodes) < demo_num:
        batch = demo_num - len(episodes)
        modes = rng.integers(0, len(MODE_NAMES), size=batch)
        result = rollout(_Expert(modes, rng, noise), sample_starts(batch, rng), record=True)
        for i in np.flatnonzero(result.success):
            episodes.append((result.observations[i], result.actions[i]))
    return Demonstrations(tuple(episodes[:demo_num]))


def evaluate_policy(
    policy: Policy, seed: int = 0, rollout_num: int = EVAL_ROLLOUT_NUM, execute: int = 1
) -> dict[str, float]:
    """Closed-loop B2 metrics of ``policy`` over ``rollout_num`` fixed start positions (see
    :meth:`Rollouts.metrics`). ``execute``: steps of each returned chunk run before the next call."""
    starts = sample_starts(rollout_num, task_rng(seed, _EVAL_START_STREAM))

    def chunk_fn(idx: npt.NDArray[np.intp], obs: FloatArray) -> npt.ArrayLike:
        return policy(obs)

    return rollout(chunk_fn, starts, execute).metrics()


def evaluate_expert(
    seed: int = 0, rollout_num: int = EVAL_ROLLOUT_NUM, noise: float = EXPERT_NOISE
) -> dict[str, float]:
    """The scripted expert's B2 metrics on the same start positions as :func:`evaluate_policy`."""
    starts = sample_starts(rollout_num, task_rng(seed, _EVAL_START_STREAM))
    rng = task_rng(seed, _EXPERT_MODE_STREAM)
    modes = rng.integers(0, len(MODE_NAMES), size=rollout_num)
    return rollout(_Expert(modes, rng, noise), starts).metrics()


TASK = TaskSpec(
    name="avoid",
    observation_schema=OBSERVATION_SCHEMA,
    action_schema=ACTION_SCHEMA,
    make_demonstrations=make_demonstrations,
    evaluate_policy=evaluate_policy,
)
