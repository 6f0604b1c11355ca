#!/usr/bin/env python3
"""Quality benchmark: flow-matching policies trained by the REAL trainer process, scored the engine's way.

For every task (``shared/benchmarks.md`` B1 bimodal, B2 six-path avoid, B3 pendulum swing-up), seed and
row of the plan, this script

1. builds the task's demonstrations and the three initial networks as the engine does, spawns
   ``scripts/train.py`` with the engine's argv and drives it over shared memory with the game-side
   emulator (:func:`emulator.session.run_engine_session`, mode ``shm``);
2. takes the snapshots the trainer sends back (one sync round every ``--curve-every`` iterations and the
   final one) and evaluates them through the engine's inference path (:class:`EnginePolicy`: encoder ->
   ``ODEStepsNum`` explicit Euler steps of the denoiser from N(0, I) -> decoder, numpy reference evaluator)
   at every NFE of ``--nfe`` (the final round) and at NFE 8 (every earlier round: the learning curve);
3. trains the same-network MSE regression baseline in-process (:mod:`benchmarks.mse_baseline`) and
   evaluates it through the same evaluator.

It prints one table per task (mean ± standard deviation over seeds, train steps, training wall-clock,
wall-clock per policy call), the time-distribution comparison when asked, and the target checks of the
flow-matching issue; it writes ``results.json``, ``tables.md`` and PNG plots into ``--out``.

Run ``python benchmarks/quality.py --help``; ``benchmarks/README.md`` explains every column.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import platform
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # runnable as a plain script from a checkout
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.mse_baseline import MsePolicy, MseSettings, train_mse_policy  # noqa: E402
from emulator.inference import EnginePolicy  # noqa: E402
from emulator.session import (  # noqa: E402
    EngineTask,
    SessionRecord,
    SessionSettings,
    run_engine_session,
)
from emulator.tasks import Demonstrations, avoid, bimodal, pendulum  # noqa: E402
from protocol.config import FlowMatchingTrainingSettings  # noqa: E402
from trainer.options import TrainerOptions  # noqa: E402

__all__ = [
    "DEFAULT_ITERATIONS",
    "DEFAULT_TIME_DISTRIBUTIONS",
    "TARGETS",
    "TASKS",
    "HarnessConfig",
    "RunResult",
    "Target",
    "Variant",
    "build_parser",
    "config_from_args",
    "evaluate_policy_for",
    "main",
    "plan_variants",
    "run_benchmark",
    "summarise",
]

FloatArray = npt.NDArray[np.float32]

TASKS: Mapping[str, str] = {"b1": "bimodal", "b2": "avoid", "b3": "pendulum"}
"""Benchmark key -> task module name in :mod:`emulator.tasks`."""
TASK_TITLES: Mapping[str, str] = {
    "b1": "B1 conditional bimodal (open loop)",
    "b2": "B2 six-path avoid (closed loop)",
    "b3": "B3 pendulum swing-up (closed loop)",
}
DEFAULT_ITERATIONS: Mapping[str, int] = {"b1": 12_000, "b2": 12_000, "b3": 8_000}
"""Train steps per task (benchmarks.md: 12k for B1/B2, 8k for B3)."""
DEFAULT_DEMOS: Mapping[str, int] = {"b1": bimodal.PAIR_NUM, "b2": avoid.DEMO_NUM, "b3": pendulum.DEMO_NUM}
"""B1: demonstration pairs; B2/B3: demonstration episodes."""
DEFAULT_EVAL: Mapping[str, int] = {
    "b1": bimodal.EVAL_OBS_NUM,
    "b2": avoid.EVAL_ROLLOUT_NUM,
    "b3": pendulum.EVAL_EPISODE_NUM,
}
"""B1: held-out observations (× 64 samples each); B2: rollouts; B3: episodes."""
PRIMARY: Mapping[str, str] = {"b1": "on_mode", "b2": "success", "b3": "score"}
"""The metric of each task's learning curve and NFE plot."""
TABLE_METRICS: Mapping[str, tuple[tuple[str, str], ...]] = {
    "b1": (
        ("on_mode", "on_mode"),
        ("both_modes_covered", "both covered"),
        ("balance_err", "balance_err"),
        ("mmd", "MMD"),
    ),
    "b2": (("success", "success"), ("entropy", "entropy"), ("collision", "collision")),
    "b3": (("score", "score"), ("upright", "upright"), ("return", "return")),
}
DEFAULT_TIME_DISTRIBUTIONS = ("uniform", "logit_normal:0,1", "beta:1,1.5", "power:2")
DEFAULT_T = TrainerOptions().time_distribution
"""The trainer's default t distribution: every main row trains with it."""
"""Compared training-time distributions (t = 0 noise, t = 1 data): SD3's logit-normal, a π0-like Beta
skewed towards noise (mean 0.4) and a power skew towards noise (U², mean 1/3)."""
CURVE_NFE = 8
"""The engine's default ODEStepsNum: the NFE of the learning curves and of the target checks."""
ENGINE_TIMEOUT_S = 60.0
"""Communicator timeout the emulated engine uses here (the engine default is 10 s)."""
WEIGHT_DECAY = FlowMatchingTrainingSettings().weight_decay
"""The engine default the emulator's trainer config carries; the MSE baseline uses the same."""
B1_PLOT_OBS = np.array([[-0.75, 0.0], [-0.25, 0.5], [0.2, -0.5], [0.6, 0.3]], dtype=np.float32)
"""Observations whose action samples ``b1_samples.png`` shows."""
B1_PLOT_SAMPLES = 256


@dataclass(frozen=True, slots=True)
class Target:
    """A pass/fail target of the issue: ``metric`` of the FM rows of ``task`` at NFE ``nfe`` >= ``threshold``
    (mean over seeds)."""

    task: str
    metric: str
    threshold: float
    nfe: int = CURVE_NFE


TARGETS: tuple[Target, ...] = (
    Target("b1", "on_mode", 0.95),
    Target("b1", "both_modes_covered", 0.99),
    Target("b2", "success", 0.9),
    Target("b2", "entropy", 0.9),
    Target("b3", "score", 0.98),
)


@dataclass(frozen=True, slots=True)
class Variant:
    """One row of the plan, run for every seed.

    ``method``: ``"fm"`` (the trainer process) or ``"mse"`` (the in-process baseline). ``chunk_size`` is
    ActionChunkSize (predicted steps), ``execute`` the steps run per policy call. ``embed`` is
    EmbedNormalizationsInWeights. ``group``: ``"main"`` rows go into the task tables, ``"time"`` rows
    into the time-distribution comparison.
    """

    key: str
    task: str
    label: str
    method: str
    iterations: int
    chunk_size: int = 1
    execute: int = 1
    embed: bool = True
    time_distribution: str = DEFAULT_T
    group: str = "main"
    priority: int = 0
    """Run order (lower first; the plan order within a priority): the rows the targets are checked on
    come first, so that an interrupted run has left the most useful results in ``partial.json``."""


@dataclass(frozen=True, slots=True)
class HarnessConfig:
    """Everything shared by the rows: seeds, NFEs, network and optimiser settings, sizes, paths."""

    tasks: tuple[str, ...]
    seeds: tuple[int, ...]
    nfe: tuple[int, ...]
    iterations: Mapping[str, int]
    batch_size: int = 256
    learning_rate: float = 1e-3
    hidden_layer_num: int = 2
    hidden_layer_size: int = 256
    activation: str = "ELU"
    ema_decay: float = 0.999
    threads: int = 0
    eval_seed: int = 1000
    curve_every: int = 2000
    demos: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_DEMOS))
    eval_sizes: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_EVAL))
    b1_samples: int = bimodal.EVAL_SAMPLE_NUM
    embed_false_row: bool = True
    b2_chunk_row: bool = True
    time_dists: tuple[str, ...] = ()
    time_dist_tasks: tuple[str, ...] = ("b1",)
    rows: str = ""
    """Regular expression: train only the rows whose key matches (``b2/fm-chunk8x4``); empty: all."""
    out: Path = Path("reports/quality")
    work_dir: Path | None = None
    plots: bool = True
    echo: bool = False
    quick: bool = False
    resume: bool = False
    """Keep the successful trainings recorded in ``<out>/partial.json`` and run only the others."""
    jobs: int = 1
    """Trainings run at the same time (each in its own process). > 1 shortens the run but makes the
    wall-clock columns (train s, ms/call) depend on the sharing; the quality numbers are unaffected."""


@dataclass
class RunResult:
    """One (variant, seed): train steps, wall-clock, metrics per NFE (``"-"`` for MSE), learning curve."""

    variant: str
    seed: int
    train_steps: int = 0
    train_s: float = math.nan
    session_s: float = math.nan
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    curve: list[tuple[int, float]] = field(default_factory=list)
    failure: str | None = None
    log_tail: str = ""


# ---------------------------------------------------------------------------------------------------------
# The plan


def plan_variants(cfg: HarnessConfig) -> list[Variant]:
    """The rows to run, in order: per task FM, its extra FM rows, MSE; then the time-distribution rows."""
    rows: list[Variant] = []
    for task in cfg.tasks:
        n = cfg.iterations[task]
        if task == "b1":
            rows.append(Variant("b1/fm", "b1", "FM", "fm", n))
            if cfg.embed_false_row:
                rows.append(
                    Variant("b1/fm-embed-false", "b1", "FM embed=false", "fm", n, embed=False, priority=2)
                )
            rows.append(Variant("b1/mse", "b1", "MSE", "mse", n, priority=1))
        elif task == "b2":
            rows.append(Variant("b2/fm", "b2", "FM", "fm", n, priority=2))
            if cfg.b2_chunk_row:
                rows.append(Variant("b2/fm-chunk8x4", "b2", "FM", "fm", n, chunk_size=8, execute=4))
            rows.append(Variant("b2/mse", "b2", "MSE", "mse", n, priority=1))
            if cfg.b2_chunk_row:
                rows.append(
                    Variant("b2/mse-chunk8x4", "b2", "MSE", "mse", n, chunk_size=8, execute=4, priority=2)
                )
        elif task == "b3":
            rows.append(Variant("b3/fm-chunk4x2", "b3", "FM", "fm", n, chunk_size=4, execute=2))
            rows.append(
                Variant("b3/mse-chunk4x2", "b3", "MSE", "mse", n, chunk_size=4, execute=2, priority=1)
            )
    for task in cfg.time_dist_tasks if cfg.time_dists else ():
        base = next((v for v in rows if v.task == task and v.method == "fm" and v.group == "main"), None)
        for dist in cfg.time_dists:
            if base is not None and dist == base.time_distribution and base.chunk_size == 1:
                continue  # the main FM row already is this one: reused, not retrained
            rows.append(
                Variant(
                    f"{task}/fm-t={dist}",
                    task,
                    f"FM t~{dist}",
                    "fm",
                    cfg.iterations[task],
                    time_distribution=dist,
                    group="time",
                    priority=3,
                )
            )
    if cfg.rows:
        rows = [v for v in rows if re.search(cfg.rows, v.key)]
    return rows


def _time_rows(cfg: HarnessConfig, variants: Sequence[Variant], task: str) -> list[tuple[str, Variant]]:
    """(time distribution, variant) pairs of the comparison for ``task`` (the uniform one may be a main row)."""
    out: list[tuple[str, Variant]] = []
    for dist in cfg.time_dists:
        match = next(
            (v for v in variants if v.task == task and v.group == "time" and v.time_distribution == dist),
            None,
        )
        if match is None and dist == DEFAULT_T:
            match = next(
                (
                    v
                    for v in variants
                    if v.task == task and v.method == "fm" and v.group == "main" and v.chunk_size == 1
                ),
                None,
            )
        if match is not None:
            out.append((dist, match))
    return out


# ---------------------------------------------------------------------------------------------------------
# Policies and evaluation


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


def _fm_policy(
    snapshots: Sequence[bytes], nfe: int, seed: int, cfg: HarnessConfig
) -> Callable[[FloatArray], FloatArray]:
    """The engine's policy from networks in id order (0 denoiser, 1 encoder, 2 decoder) with a fixed RNG."""
    denoiser, encoder, decoder = snapshots[:3]
    policy = EnginePolicy.from_snapshots(encoder, denoiser, decoder, nfe)
    return policy.bind(np.random.default_rng([cfg.eval_seed, seed, nfe]))


# ---------------------------------------------------------------------------------------------------------
# Running one row for one seed


def _task_module(task: str) -> Any:
    return {"b1": bimodal, "b2": avoid, "b3": pendulum}[task]


def make_demos(task: str, seed: int, cfg: HarnessConfig) -> Demonstrations:
    module = _task_module(task)
    if task == "b1":
        demos: Demonstrations = module.make_demonstrations(seed, pair_num=cfg.demos[task])
    else:
        demos = module.make_demonstrations(seed, demo_num=cfg.demos[task])
    return demos


_DONE_LINE = re.compile(r"done after (\d+) iterations")


def _trainer_env(cfg: HarnessConfig, variant: Variant) -> dict[str, str]:
    env = {
        # Intermediate networks only at the curve cadence: wall-clock syncs would cost time and make
        # the curve's x axis depend on the machine's speed.
        "LA_TRAINER_SYNC_EVERY_SECONDS": "0",
        "LA_TRAINER_TIME_DISTRIBUTION": variant.time_distribution,
        "LA_TRAINER_EMA_DECAY": repr(cfg.ema_decay),
        "LA_TRAINER_PROGRESS_EVERY_SECONDS": "30",
        "LA_TRAINER_STATUS_FILE": "0",
        "LA_TRAINER_ODE_STEPS": "0",  # plain flow matching: no few-step distillation phase
    }
    if cfg.threads > 0:
        env["LA_TRAINER_THREADS"] = str(cfg.threads)
    return env


def _event_time(record: SessionRecord, text: str) -> float | None:
    return next((t for t, what in record.engine_events if what == text), None)


def run_fm(
    variant: Variant, seed: int, cfg: HarnessConfig, work_dir: Path, plot_data: dict[str, Any]
) -> RunResult:
    """Train ``variant`` with the real trainer process and evaluate the networks it returns."""
    module = _task_module(variant.task)
    demos = make_demos(variant.task, seed, cfg)
    task = EngineTask.from_demonstrations(
        module.TASK.name, module.OBSERVATION_SCHEMA, module.ACTION_SCHEMA, demos
    )
    settings = SessionSettings(
        iteration_num=variant.iterations,
        batch_size=cfg.batch_size,
        learning_rate=cfg.learning_rate,
        seed=1234 + seed,
        save_snapshots=False,
        device="CPU",
        embed_normalizations_in_weights=variant.embed,
        hidden_layer_num=cfg.hidden_layer_num,
        hidden_layer_size=cfg.hidden_layer_size,
        activation=cfg.activation,
        action_chunk_size=variant.chunk_size,
        # Only a hang should hit this bound: a loaded machine has been seen at 120+ ms per step.
        session_timeout_s=300.0 + 0.5 * variant.iterations,
        hard_timeout_s=600.0 + 0.5 * variant.iterations,  # the emulator's watchdog (default 55 s)
        exit_timeout_s=60.0,
        # The engine's 10 s communicator timeout also bounds the trainer's start-up (python + torch
        # import) before it requests network 0; on a loaded 2-core machine that alone can pass 10 s.
        # The benchmark measures quality, so it gives the start-up more room (see README).
        engine_timeout_s=ENGINE_TIMEOUT_S,
        sync_every_iterations=cfg.curve_every if cfg.curve_every > 0 else 0,
        timeout_scale=1.0,
        env=_trainer_env(cfg, variant),
        echo=cfg.echo,
    )
    run_dir = work_dir / f"{variant.key.replace('/', '_')}_s{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    record = run_engine_session("shm", task, run_dir, settings)
    result = RunResult(variant.key, seed, session_s=record.elapsed_s, log_tail=record.log_tail(15))
    if record.failure is not None or not record.completed or not record.rounds:
        result.failure = record.failure or f"no networks came back (completed={record.completed})"
        return result
    done = [int(m.group(1)) for line in record.log for m in [_DONE_LINE.search(line)] if m]
    result.train_steps = done[-1] if done else variant.iterations
    sent, completed = _event_time(record, "experience sent"), _event_time(record, "Completed")
    if sent is not None and completed is not None:
        result.train_s = completed - sent
    # Learning curve: every round at NFE 8 (round i came at iteration (i+1)·curve_every, the last one at
    # the end), on the curve's evaluation set (B1: a quarter of the held-out observations, to bound the
    # cost of the float64 reference evaluator; B2/B3: the full set).
    curve_cfg = _curve_config(cfg)
    for i, round_ in enumerate(record.rounds):
        nets = tuple(n.data for n in round_.networks)
        steps = result.train_steps if i == len(record.rounds) - 1 else (i + 1) * cfg.curve_every
        m = evaluate_policy_for(variant.task, _fm_policy(nets, CURVE_NFE, seed, cfg), variant, curve_cfg)
        result.curve.append((steps, m[PRIMARY[variant.task]]))
    final = record.final_networks
    for nfe in cfg.nfe:
        result.metrics[str(nfe)] = evaluate_policy_for(
            variant.task, _fm_policy(final, nfe, seed, cfg), variant, cfg
        )
    if seed == cfg.seeds[0] and cfg.plots:
        _collect_plot_data(variant, seed, cfg, plot_data, lambda nfe: _fm_policy(final, nfe, seed, cfg))
    return result


def _curve_config(cfg: HarnessConfig) -> HarnessConfig:
    """The evaluation settings of learning-curve points (B1 on a quarter of the held-out observations)."""
    sizes = dict(cfg.eval_sizes)
    sizes["b1"] = max(1, sizes["b1"] // 4)
    return replace(cfg, eval_sizes=sizes)


def run_mse(variant: Variant, seed: int, cfg: HarnessConfig, plot_data: dict[str, Any]) -> RunResult:
    """Train the MSE baseline for ``variant`` in-process and evaluate it."""
    demos = make_demos(variant.task, seed, cfg)
    settings = MseSettings(
        iterations=variant.iterations,
        batch_size=cfg.batch_size,
        learning_rate=cfg.learning_rate,
        weight_decay=WEIGHT_DECAY,
        hidden_layer_num=cfg.hidden_layer_num,
        hidden_layer_size=cfg.hidden_layer_size,
        activation=cfg.activation,
        chunk_size=variant.chunk_size,
        ema_decay=cfg.ema_decay,
        seed=1234 + seed,
        threads=cfg.threads if cfg.threads > 0 else 1,
    )
    started = time.perf_counter()
    trained = train_mse_policy(demos, settings)
    result = RunResult(variant.key, seed, train_steps=trained.iterations, train_s=trained.train_s)
    policy = MsePolicy(trained.network)
    result.metrics["-"] = evaluate_policy_for(variant.task, policy, variant, cfg)
    curve_m = evaluate_policy_for(variant.task, policy, variant, _curve_config(cfg))
    result.curve.append((trained.iterations, curve_m[PRIMARY[variant.task]]))
    result.session_s = time.perf_counter() - started
    if seed == cfg.seeds[0] and cfg.plots:
        _collect_plot_data(variant, seed, cfg, plot_data, lambda nfe: policy)
    return result


def _collect_plot_data(
    variant: Variant,
    seed: int,
    cfg: HarnessConfig,
    plot_data: dict[str, Any],
    policy_for: Callable[[int], Callable[[FloatArray], npt.ArrayLike]],
) -> None:
    """Raw samples (B1) and trajectories (B2) of the first seed, for the plots only."""
    nfes = [CURVE_NFE] if variant.method == "mse" else sorted(set(cfg.nfe) | {CURVE_NFE})
    if variant.task == "b1" and variant.group == "main":
        obs = np.repeat(B1_PLOT_OBS, B1_PLOT_SAMPLES, axis=0)
        plot_data.setdefault("b1_samples", {})[variant.key] = {
            nfe: np.asarray(policy_for(nfe)(obs), dtype=np.float32).reshape(
                len(B1_PLOT_OBS), B1_PLOT_SAMPLES, -1
            )
            for nfe in nfes
        }
    if variant.task == "b2" and variant.group == "main":
        starts = avoid.sample_starts(cfg.eval_sizes["b2"], np.random.default_rng([cfg.eval_seed, 0xB2]))
        policy = policy_for(CURVE_NFE)

        def chunk_fn(idx: npt.NDArray[np.intp], obs: FloatArray) -> npt.ArrayLike:
            return policy(obs)

        rollouts = avoid.rollout(chunk_fn, starts, variant.execute, record=True)
        plot_data.setdefault("b2_paths", {})[variant.key] = (rollouts.observations, rollouts.success)


# ---------------------------------------------------------------------------------------------------------
# Summaries and tables


def _stats(values: Iterable[float]) -> dict[str, float]:
    v = np.array([x for x in values if x is not None and math.isfinite(x)], dtype=np.float64)
    if v.size == 0:
        return {"mean": math.nan, "std": math.nan, "min": math.nan, "max": math.nan, "n": 0}
    return {
        "mean": float(v.mean()),
        "std": float(v.std(ddof=1)) if v.size > 1 else 0.0,
        "min": float(v.min()),
        "max": float(v.max()),
        "n": int(v.size),
    }


def summarise(variants: Sequence[Variant], results: Sequence[RunResult]) -> list[dict[str, Any]]:
    """One entry per (variant, NFE): every metric's mean/std/min/max over the seeds that succeeded."""
    summary: list[dict[str, Any]] = []
    for v in variants:
        runs = [r for r in results if r.variant == v.key and r.failure is None]
        keys: list[str] = []
        for r in runs:
            for k in r.metrics:
                if k not in keys:
                    keys.append(k)
        for nfe in keys:
            metric_names = sorted({m for r in runs if nfe in r.metrics for m in r.metrics[nfe]})
            summary.append(
                {
                    "variant": v.key,
                    "nfe": nfe,
                    "seeds": [r.seed for r in runs if nfe in r.metrics],
                    "train_steps": _stats(r.train_steps for r in runs),
                    "train_s": _stats(r.train_s for r in runs),
                    "metrics": {
                        m: _stats(r.metrics[nfe].get(m, math.nan) for r in runs if nfe in r.metrics)
                        for m in metric_names
                    },
                }
            )
    return summary


def _fmt(stat: Mapping[str, float] | None, digits: int = 3) -> str:
    if stat is None or stat.get("n", 0) == 0 or not math.isfinite(stat["mean"]):
        return "–"
    if stat["n"] > 1:
        return f"{stat['mean']:.{digits}f} ± {stat['std']:.{digits}f}"
    return f"{stat['mean']:.{digits}f}"


def _digits(metric: str) -> int:
    return 1 if metric in ("return",) else 3


def _variant_desc(v: Variant) -> str:
    parts = [v.label]
    if v.method == "fm" and v.time_distribution != DEFAULT_T and v.group == "main":
        parts.append(f"t~{v.time_distribution}")
    return " ".join(parts)


def _failed_note(v: Variant, results: Sequence[RunResult]) -> str:
    failed = [r.seed for r in results if r.variant == v.key and r.failure is not None]
    return f" (failed seeds: {failed})" if failed else ""


def task_table(
    task: str, variants: Sequence[Variant], summary: Sequence[Mapping[str, Any]], results: Sequence[RunResult]
) -> str:
    """The markdown table of ``task``'s main rows."""
    metrics = TABLE_METRICS[task]
    chunk_col = task in ("b2", "b3")
    head = ["policy", "train steps"] + (["chunk (predict/execute)"] if chunk_col else []) + ["NFE"]
    head += [label for _, label in metrics] + ["ms/call", "rows/call", "train s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for v in variants:
        if v.task != task or v.group != "main":
            continue
        entries = [s for s in summary if s["variant"] == v.key]
        if not entries:
            cells = [_variant_desc(v) + _failed_note(v, results), str(v.iterations)]
            cells += [f"{v.chunk_size}/{v.execute}"] if chunk_col else []
            ran = any(r.variant == v.key for r in results)
            cells += ["failed" if ran else "not run"] + [""] * (len(metrics) + 3)
            lines.append("| " + " | ".join(cells) + " |")
            continue
        for s in entries:
            cells = [_variant_desc(v) + _failed_note(v, results), f"{s['train_steps']['mean']:.0f}"]
            cells += [f"{v.chunk_size}/{v.execute}"] if chunk_col else []
            cells.append(s["nfe"])
            cells += [_fmt(s["metrics"].get(m), _digits(m)) for m, _ in metrics]
            cells += [
                _fmt(s["metrics"].get("ms_per_call"), 1),
                f"{s['metrics']['rows_per_call']['mean']:.0f}" if "rows_per_call" in s["metrics"] else "–",
                _fmt(s["train_s"], 0),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def time_table(
    task: str, cfg: HarnessConfig, variants: Sequence[Variant], summary: Sequence[Mapping[str, Any]]
) -> str:
    """The time-distribution comparison for ``task``: primary metrics per distribution and NFE."""
    metrics = TABLE_METRICS[task]
    head = ["t distribution", "train steps", "NFE"] + [label for _, label in metrics] + ["train s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for dist, v in _time_rows(cfg, variants, task):
        for s in (s for s in summary if s["variant"] == v.key):
            cells = [dist, f"{s['train_steps']['mean']:.0f}", s["nfe"]]
            cells += [_fmt(s["metrics"].get(m), _digits(m)) for m, _ in metrics]
            cells.append(_fmt(s["train_s"], 0))
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def check_targets(variants: Sequence[Variant], summary: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every target against every main FM row of its task (mean over seeds at the target's NFE)."""
    checks: list[dict[str, Any]] = []
    for target in TARGETS:
        for v in variants:
            if v.task != target.task or v.method != "fm" or v.group != "main":
                continue
            s = next((s for s in summary if s["variant"] == v.key and s["nfe"] == str(target.nfe)), None)
            stat = s["metrics"].get(target.metric) if s is not None else None
            mean = stat["mean"] if stat is not None and stat["n"] > 0 else math.nan
            checks.append(
                {
                    "task": target.task,
                    "variant": v.key,
                    "metric": target.metric,
                    "nfe": target.nfe,
                    "threshold": target.threshold,
                    "mean": mean,
                    "min": stat["min"] if stat is not None and stat["n"] > 0 else math.nan,
                    "passed": bool(math.isfinite(mean) and mean >= target.threshold),
                }
            )
    return checks


def _describe_variant(v: Variant) -> str:
    extras = []
    if v.chunk_size > 1:
        extras.append(f"chunk {v.chunk_size}/{v.execute}")
    if not v.embed:
        extras.append("embed=false")
    if v.time_distribution != DEFAULT_T:
        extras.append(f"t~{v.time_distribution}")
    return v.key + (f" ({', '.join(extras)})" if extras else "")


# ---------------------------------------------------------------------------------------------------------
# Plots (matplotlib, optional)


def write_plots(
    cfg: HarnessConfig,
    variants: Sequence[Variant],
    summary: Sequence[Mapping[str, Any]],
    results: Sequence[RunResult],
    plot_data: Mapping[str, Any],
) -> list[Path]:
    """PNG plots into ``cfg.out``; returns the files written (none when matplotlib is missing)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Circle
    except ImportError:  # pragma: no cover - matplotlib is in the dev set
        print("quality: matplotlib is not installed; no plots.", flush=True)
        return []
    written: list[Path] = []

    def save(fig: Any, name: str) -> None:
        path = cfg.out / name
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    # 1. Primary metric against NFE, per task (FM rows as lines with the seed spread, MSE as a band).
    tasks = [t for t in cfg.tasks if any(v.task == t and v.group == "main" for v in variants)]
    if tasks:
        fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 3.8), squeeze=False)
        for ax, task in zip(axes[0], tasks, strict=True):
            metric = PRIMARY[task]
            for v in (v for v in variants if v.task == task and v.group == "main"):
                entries = [s for s in summary if s["variant"] == v.key]
                label = f"{v.label} {v.chunk_size}/{v.execute}" + ("" if v.embed else " embed=false")
                if v.method == "mse" and entries:
                    stat = entries[0]["metrics"][metric]
                    ax.axhline(
                        stat["mean"], ls="--", color="grey" if v.chunk_size == 1 else "black", label=label
                    )
                    continue
                xs = [int(s["nfe"]) for s in entries]
                ys = [s["metrics"][metric]["mean"] for s in entries]
                es = [s["metrics"][metric]["std"] for s in entries]
                if xs:
                    ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, label=label)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("NFE (ODEStepsNum)")
            ax.set_ylabel(metric)
            ax.set_title(TASK_TITLES[task], fontsize=9)
            ax.legend(fontsize=7)
        save(fig, "nfe.png")

    # 2. Learning curves (primary metric at NFE 8 against train steps), mean over seeds.
    curve_tasks = [
        t for t in tasks if any(len(r.curve) > 1 for r in results if r.variant.startswith(t + "/"))
    ]
    if curve_tasks:
        fig, axes = plt.subplots(1, len(curve_tasks), figsize=(5 * len(curve_tasks), 3.8), squeeze=False)
        for ax, task in zip(axes[0], curve_tasks, strict=True):
            for v in (v for v in variants if v.task == task and v.method == "fm"):
                curves = [r.curve for r in results if r.variant == v.key and r.failure is None and r.curve]
                if not curves:
                    continue
                steps = sorted({s for c in curves for s, _ in c})
                mean = [np.nanmean([dict(c).get(s, np.nan) for c in curves]) for s in steps]
                ax.plot(steps, mean, marker="o", label=_describe_variant(v))
            ax.set_xlabel("train steps")
            ax.set_ylabel(f"{PRIMARY[task]} (NFE {CURVE_NFE})")
            ax.set_title(TASK_TITLES[task], fontsize=9)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
        save(fig, "curves.png")

    # 3. B1 action samples of the first seed.
    samples = plot_data.get("b1_samples", {})
    if samples:
        panels = [(key, nfe) for key, by_nfe in samples.items() for nfe in by_nfe]
        fig, axes = plt.subplots(1, len(panels), figsize=(2.6 * len(panels), 2.9), squeeze=False)
        circle = np.linspace(0, 2 * np.pi, 200)
        for ax, (key, nfe) in zip(axes[0], panels, strict=True):
            ax.plot(np.cos(circle), np.sin(circle), color="lightgrey", lw=0.8)
            data = samples[key][nfe]
            for i, obs in enumerate(B1_PLOT_OBS):
                ax.scatter(data[i, :, 0], data[i, :, 1], s=2, alpha=0.5)
                centre = bimodal.mode_centres(obs[None])[0]
                ax.scatter([centre[0], -centre[0]], [centre[1], -centre[1]], marker="x", color="black", s=20)
            ax.set_title(f"{key} NFE {nfe}" if not key.endswith("mse") else key, fontsize=8)
            ax.set_xlim(-1.4, 1.4)
            ax.set_ylim(-1.4, 1.4)
            ax.set_aspect("equal")
            ax.tick_params(labelsize=6)
        save(fig, "b1_samples.png")

    # 4. B2 paths of the first seed at NFE 8 (green: success, red: failure), obstacles in grey.
    paths = plot_data.get("b2_paths", {})
    if paths:
        fig, axes = plt.subplots(1, len(paths), figsize=(3.2 * len(paths), 4.2), squeeze=False)
        for ax, (key, (trajectories, success)) in zip(axes[0], paths.items(), strict=True):
            for cx, cy, r in avoid.OBSTACLES:
                ax.add_patch(Circle((cx, cy), r, color="grey", alpha=0.6))
            for traj, ok in zip(trajectories, success, strict=True):
                ax.plot(traj[:, 0], traj[:, 1], lw=0.5, alpha=0.5, color="tab:green" if ok else "tab:red")
            ax.axhline(avoid.GOAL_Y, color="black", lw=0.6, ls=":")
            ax.set_xlim(-0.7, 0.7)
            ax.set_ylim(-0.05, 1.1)
            ax.set_aspect("equal")
            ax.set_title(key if "/mse" in key else f"{key} NFE {CURVE_NFE}", fontsize=8)
            ax.tick_params(labelsize=6)
        save(fig, "b2_paths.png")

    # 5. Time-distribution comparison.
    dist_tasks = [t for t in cfg.time_dist_tasks if _time_rows(cfg, variants, t)] if cfg.time_dists else []
    if dist_tasks:
        fig, axes = plt.subplots(1, len(dist_tasks), figsize=(5 * len(dist_tasks), 3.8), squeeze=False)
        for ax, task in zip(axes[0], dist_tasks, strict=True):
            metric = PRIMARY[task]
            for dist, v in _time_rows(cfg, variants, task):
                entries = [s for s in summary if s["variant"] == v.key]
                xs = [int(s["nfe"]) for s in entries]
                ys = [s["metrics"][metric]["mean"] for s in entries]
                es = [s["metrics"][metric]["std"] for s in entries]
                if xs:
                    ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, label=dist)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("NFE (ODEStepsNum)")
            ax.set_ylabel(metric)
            ax.set_title(f"{TASK_TITLES[task]}: training time distribution", fontsize=9)
            ax.legend(fontsize=7)
        save(fig, "time_distributions.png")
    return written


# ---------------------------------------------------------------------------------------------------------
# The whole benchmark


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, np.generic):
        return _jsonable(obj.item())
    return obj


def run_one(
    variant: Variant, seed: int, cfg: HarnessConfig, work_dir: Path
) -> tuple[RunResult, dict[str, Any]]:
    """One training of ``variant`` for ``seed`` and its evaluation; returns the result and its plot data."""
    plot_data: dict[str, Any] = {}
    if variant.method == "fm":
        return run_fm(variant, seed, cfg, work_dir, plot_data), plot_data
    return run_mse(variant, seed, cfg, plot_data), plot_data


def _timed_run_one(
    variant: Variant, seed: int, cfg: HarnessConfig, work_dir: Path
) -> tuple[RunResult, dict[str, Any], float]:
    started = time.perf_counter()
    result, data = run_one(variant, seed, cfg, work_dir)
    return result, data, time.perf_counter() - started


def _merge_plot_data(into: dict[str, Any], data: Mapping[str, Any]) -> None:
    for kind, by_variant in data.items():
        into.setdefault(kind, {}).update(by_variant)


def run_benchmark(cfg: HarnessConfig, command: str = "") -> dict[str, Any]:
    """Run the plan, print the tables, write results.json, tables.md and plots; return the report dict."""
    started = time.perf_counter()
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    load_start = os.getloadavg()
    cfg.out.mkdir(parents=True, exist_ok=True)
    variants = plan_variants(cfg)
    results: list[RunResult] = []
    plot_data: dict[str, Any] = {}
    own_work = cfg.work_dir is None
    work_dir = Path(tempfile.mkdtemp(prefix="la-quality-")) if own_work else Path(cfg.work_dir or ".")
    total_runs = len(variants) * len(cfg.seeds)
    print(
        f"quality: {len(variants)} rows × {len(cfg.seeds)} seeds = {total_runs} trainings; "
        f"NFE {', '.join(map(str, cfg.nfe))}; MLP HiddenLayerNum {cfg.hidden_layer_num} × {cfg.hidden_layer_size} "
        f"({cfg.hidden_layer_num + 2} Linear layers), batch {cfg.batch_size}, lr {cfg.learning_rate:g}",
        flush=True,
    )
    order = sorted(range(len(variants)), key=lambda i: (variants[i].priority, i))
    jobs = [(variants[i], seed) for i in order for seed in cfg.seeds]
    by_job: dict[tuple[str, int], RunResult] = {}
    if cfg.resume:
        # Keep the successful runs of an interrupted run with the same output folder; redo the rest.
        for run in _load_partial_runs(cfg.out / "partial.json"):
            if run.failure is None and any(v.key == run.variant and s == run.seed for v, s in jobs):
                by_job[(run.variant, run.seed)] = run
        jobs = [(v, seed) for v, seed in jobs if (v.key, seed) not in by_job]
        print(
            f"quality: resuming: {len(by_job)} trainings kept from partial.json, {len(jobs)} to run",
            flush=True,
        )

    def announce(v: Variant, seed: int, result: RunResult, seconds: float) -> None:
        primary = PRIMARY[v.task]
        shown = result.metrics.get(str(CURVE_NFE)) or result.metrics.get("-") or {}
        status = (
            f"FAILED: {result.failure}"
            if result.failure
            else f"{primary} {shown.get(primary, math.nan):.3f} (NFE {CURVE_NFE if v.method == 'fm' else '-'})"
        )
        print(
            f"quality: [{len(by_job)}/{total_runs}] {_describe_variant(v)} seed {seed}: {status}; "
            f"train {result.train_s:.1f} s, total {seconds:.1f} s (elapsed {time.perf_counter() - started:.0f} s)",
            flush=True,
        )
        if result.failure:
            print(result.log_tail, flush=True)
        # Everything finished so far, in case the run is interrupted before the tables.
        partial = {"command": command, "runs": [asdict(r) for r in by_job.values()]}
        (cfg.out / "partial.json").write_text(json.dumps(_jsonable(partial), indent=1), encoding="utf-8")

    try:
        if cfg.jobs <= 1:
            for v, seed in jobs:
                t0 = time.perf_counter()
                result, data = run_one(v, seed, cfg, work_dir)
                by_job[(v.key, seed)] = result
                _merge_plot_data(plot_data, data)
                announce(v, seed, result, time.perf_counter() - t0)
        else:
            # Separate processes (spawned: the harness has torch loaded, and forking a process with
            # torch's thread pools running is unsafe). Each worker runs one training at a time.
            context = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(max_workers=cfg.jobs, mp_context=context) as pool:
                futures = {pool.submit(_timed_run_one, v, seed, cfg, work_dir): (v, seed) for v, seed in jobs}
                for future in as_completed(futures):
                    v, seed = futures[future]
                    result, data, seconds = future.result()
                    by_job[(v.key, seed)] = result
                    _merge_plot_data(plot_data, data)
                    announce(v, seed, result, seconds)
    finally:
        if own_work:
            shutil.rmtree(work_dir, ignore_errors=True)
    results.extend(by_job[(v.key, seed)] for v in variants for seed in cfg.seeds if (v.key, seed) in by_job)

    return write_report(
        cfg,
        variants,
        results,
        plot_data,
        command=command,
        started_at=started_at,
        total_s=time.perf_counter() - started,
        load_start=load_start,
    )


def write_report(
    cfg: HarnessConfig,
    variants: Sequence[Variant],
    results: Sequence[RunResult],
    plot_data: Mapping[str, Any],
    *,
    command: str,
    started_at: str,
    total_s: float,
    load_start: Sequence[float],
    complete: bool = True,
) -> dict[str, Any]:
    """Summary, targets, tables (printed and ``tables.md``), plots and ``results.json`` for ``results``.

    ``complete`` False marks tables rebuilt from an interrupted run's ``partial.json`` (``--tables-from``).
    """
    summary = summarise(variants, results)
    targets = check_targets(variants, summary)
    sections: list[str] = []
    for task in cfg.tasks:
        sections.append(f"### {TASK_TITLES[task]}\n\n{task_table(task, variants, summary, results)}")
    if cfg.time_dists:
        for task in cfg.time_dist_tasks:
            if _time_rows(cfg, variants, task):
                sections.append(
                    f"### {TASK_TITLES[task]}: training-time distribution of t\n\n"
                    f"{time_table(task, cfg, variants, summary)}"
                )
    if targets:
        lines = [
            f"- {c['variant']} NFE {c['nfe']}: {c['metric']} {c['mean']:.3f} (min over seeds {c['min']:.3f}) "
            f">= {c['threshold']}: {'PASS' if c['passed'] else 'FAIL'}"
            if math.isfinite(c["mean"])
            else f"- {c['variant']} NFE {c['nfe']}: {c['metric']} >= {c['threshold']}: no result"
            for c in targets
        ]
        sections.append("### Targets (mean over seeds)\n\n" + "\n".join(lines))
    header = (
        f"Seeds {', '.join(map(str, cfg.seeds))} (evaluation seed {cfg.eval_seed}); "
        f"MLP HiddenLayerNum {cfg.hidden_layer_num}, HiddenLayerSize {cfg.hidden_layer_size} "
        f"({cfg.hidden_layer_num + 2} Linear layers), {cfg.activation}; batch {cfg.batch_size}; "
        f"AdamW(amsgrad) lr {cfg.learning_rate:g} wd {WEIGHT_DECAY:g}; EMA {cfg.ema_decay}; "
        f"EmbedNormalizationsInWeights true unless the row says false. "
        f"Values: mean ± std over seeds. Total wall-clock {total_s / 60:.1f} min "
        f"(1-min load average {load_start[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end, "
        f"{os.cpu_count()} CPUs)."
    )
    if not complete:
        done = len({(r.variant, r.seed) for r in results})
        header = (
            f"PARTIAL: {done} of {len(variants) * len(cfg.seeds)} trainings of an interrupted run; rows show "
            f"the seeds that finished (n in results.json). Wall-clock and load refer to the rebuild. "
            + header
        )
    tables = header + "\n\n" + "\n\n".join(sections) + "\n"
    print("\n" + tables, flush=True)

    plot_files = write_plots(cfg, variants, summary, results, plot_data) if cfg.plots else []
    report = {
        "command": command,
        "started_at": started_at,
        "complete": complete,
        "total_s": total_s,
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            # Wall-clock numbers are only comparable between runs on an equally loaded machine.
            "load_average_start": list(load_start),
            "load_average_end": list(os.getloadavg()),
        },
        "config": {
            k: (dict(v) if isinstance(v, Mapping) else v)
            for k, v in asdict(replace(cfg, out=Path(str(cfg.out)))).items()
            if k != "work_dir"
        },
        "weight_decay": WEIGHT_DECAY,
        "variants": [asdict(v) for v in variants],
        "runs": [asdict(r) for r in results],
        "summary": summary,
        "targets": targets,
        "plots": [p.name for p in plot_files],
    }
    (cfg.out / "tables.md").write_text(tables, encoding="utf-8")
    (cfg.out / "results.json").write_text(json.dumps(_jsonable(report), indent=1), encoding="utf-8")
    print(f"quality: wrote {cfg.out / 'results.json'}, tables.md and {len(plot_files)} plots", flush=True)
    return report


# ---------------------------------------------------------------------------------------------------------
# Command line


def _int_list(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def _task_list(text: str) -> tuple[str, ...]:
    tasks = tuple(t.strip().lower() for t in text.split(",") if t.strip())
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown task(s) {unknown}; known: {', '.join(TASKS)}")
    return tasks


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="benchmarks/quality.py",
        description="Quality benchmark: trains through the real trainer process, evaluates the engine's way.",
    )
    p.add_argument(
        "--tasks", type=_task_list, default=("b1", "b2", "b3"), help="comma list of b1,b2,b3 ('' for none)"
    )
    p.add_argument("--seeds", type=int, default=3, help="number of training seeds (0..N-1)")
    p.add_argument(
        "--iterations", type=int, default=0, help="train steps for every row (0: 12k B1/B2, 8k B3)"
    )
    p.add_argument("--nfe", type=_int_list, default=(1, 2, 4, 8, 16), help="ODEStepsNum values to evaluate")
    p.add_argument("--out", type=Path, default=Path("reports/quality"))
    p.add_argument(
        "--quick", action="store_true", help="tiny budget: 1 seed, 300 steps, small data (smoke run)"
    )
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument(
        "--hidden-layer-num",
        type=int,
        default=2,
        help="FlowMatchingSettings.HiddenLayerNum; the MLP has HiddenLayerNum + 2 Linear layers (2: 3 hidden layers)",
    )
    p.add_argument("--hidden-layer-size", type=int, default=256)
    p.add_argument("--ema-decay", type=float, default=0.999)
    p.add_argument("--threads", type=int, default=0, help="LA_TRAINER_THREADS (0: the trainer's choice)")
    p.add_argument(
        "--curve-every", type=int, default=2000, help="sync (and evaluate) every N steps; 0: final only"
    )
    p.add_argument(
        "--no-embed-false-row", action="store_true", help="skip the B1 EmbedNormalizationsInWeights=false row"
    )
    p.add_argument("--no-b2-chunk-row", action="store_true", help="skip the B2 chunk 8/4 rows")
    p.add_argument(
        "--time-dists",
        nargs="*",
        default=None,
        help=f"compare these t distributions (no value: {' '.join(DEFAULT_TIME_DISTRIBUTIONS)})",
    )
    p.add_argument("--time-dist-tasks", type=_task_list, default=("b1",))
    p.add_argument("--b1-demos", type=int, default=0, help="B1 demonstration pairs (0: 20000)")
    p.add_argument("--eval-seed", type=int, default=1000)
    p.add_argument(
        "--work-dir", type=Path, default=None, help="keep the engine folders here (default: a temp dir)"
    )
    p.add_argument(
        "--jobs", type=int, default=1, help="trainings at the same time (wall-clock columns then shared)"
    )
    p.add_argument("--resume", action="store_true", help="keep finished trainings from <out>/partial.json")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument(
        "--tables-from",
        type=Path,
        default=None,
        help="rebuild tables.md/results.json from an interrupted run's partial.json (trains nothing)",
    )
    p.add_argument("--echo", action="store_true", help="echo the trainer's output")
    p.add_argument("--rows", default="", help="regex: only the rows whose key matches (e.g. 'b2/fm-chunk')")
    return p


def config_from_args(args: argparse.Namespace) -> HarnessConfig:
    iterations = {t: (args.iterations or DEFAULT_ITERATIONS[t]) for t in TASKS}
    demos = dict(DEFAULT_DEMOS)
    if args.b1_demos:
        demos["b1"] = args.b1_demos
    time_dists: tuple[str, ...] = ()
    if args.time_dists is not None:
        time_dists = tuple(args.time_dists) or DEFAULT_TIME_DISTRIBUTIONS
    cfg = HarnessConfig(
        tasks=tuple(args.tasks),
        seeds=tuple(range(args.seeds)),
        nfe=tuple(args.nfe),
        iterations=iterations,
        batch_size=args.batch_size,
        learning_rate=args.lr,
        hidden_layer_num=args.hidden_layer_num,
        hidden_layer_size=args.hidden_layer_size,
        ema_decay=args.ema_decay,
        threads=args.threads,
        eval_seed=args.eval_seed,
        curve_every=args.curve_every,
        demos=demos,
        embed_false_row=not args.no_embed_false_row,
        b2_chunk_row=not args.no_b2_chunk_row,
        time_dists=time_dists,
        time_dist_tasks=tuple(args.time_dist_tasks),
        rows=args.rows,
        out=args.out,
        work_dir=args.work_dir,
        plots=not args.no_plots,
        echo=args.echo,
        jobs=max(1, args.jobs),
        resume=args.resume,
    )
    if args.quick:
        # A smoke run of the whole pipeline, not a measurement: every number it prints is under-trained.
        cfg = replace(
            cfg,
            seeds=(0,),
            nfe=(1, CURVE_NFE),
            iterations={t: (args.iterations or 300) for t in TASKS},
            batch_size=min(args.batch_size, 64),
            hidden_layer_size=min(args.hidden_layer_size, 64),
            curve_every=0,
            demos={"b1": args.b1_demos or 2000, "b2": 40, "b3": 10},
            eval_sizes={"b1": 50, "b2": 40, "b3": 10},
            b1_samples=16,
            embed_false_row=False,
            b2_chunk_row=False,
            quick=True,
        )
    for nfe in cfg.nfe:
        if not 1 <= nfe <= 100:
            raise SystemExit(f"--nfe values must be in 1..100 (the engine's clamp), got {nfe}")
    return cfg


def _load_partial_runs(path: Path) -> list[RunResult]:
    """The runs recorded in a ``partial.json`` (none when the file does not exist)."""
    if not path.is_file():
        return []
    partial = json.loads(path.read_text(encoding="utf-8"))
    return [
        RunResult(**{**r, "curve": [tuple(point) for point in r.get("curve", [])]})
        for r in partial.get("runs", [])
    ]


def tables_from_partial(path: Path, override: HarnessConfig) -> int:
    """Tables of the runs an interrupted benchmark finished: its plan comes from the command recorded in
    ``partial.json``; the output goes next to it (or to ``--out`` when given explicitly)."""
    partial = json.loads(path.read_text(encoding="utf-8"))
    recorded = str(partial.get("command", "")).split()
    argv = recorded[2:] if recorded[:2] == ["python", "benchmarks/quality.py"] else recorded
    cfg = replace(config_from_args(build_parser().parse_args(argv)), out=path.parent, plots=override.plots)
    runs = [
        RunResult(**{**r, "curve": [tuple(point) for point in r.get("curve", [])]})
        for r in partial.get("runs", [])
    ]
    write_report(
        cfg,
        plan_variants(cfg),
        runs,
        {},
        command=" ".join(recorded),
        started_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        total_s=0.0,
        load_start=os.getloadavg(),
        complete=False,
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry; returns 0 when every training ran (targets are reported, not enforced), 1 otherwise."""
    args = build_parser().parse_args(argv)
    cfg = config_from_args(args)
    command = "python benchmarks/quality.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.tables_from is not None:
        return tables_from_partial(args.tables_from, cfg)
    report = run_benchmark(cfg, command)
    failed = [r for r in report["runs"] if r["failure"]]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
