"""Running one row for one seed: a flow-matching row through the real trainer process over shared memory
(:func:`emulator.session.run_engine_session`), an MSE row in-process (:mod:`benchmarks.mse_baseline`);
then the evaluation of what came back."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from benchmarks.mse_baseline import MsePolicy, MseSettings, train_mse_policy
from benchmarks.quality_harness.evaluation import curve_config, evaluate_policy_for, fm_policy
from benchmarks.quality_harness.plan import (
    CURVE_NFE,
    ENGINE_TIMEOUT_S,
    PRIMARY,
    WEIGHT_DECAY,
    HarnessConfig,
    RunResult,
    Variant,
)
from benchmarks.quality_harness.plots import collect_plot_data
from emulator.session import EngineTask, SessionRecord, SessionSettings, run_engine_session
from emulator.tasks import Demonstrations, avoid, bimodal, pendulum

__all__ = ["make_demos", "run_fm", "run_mse", "run_one"]


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
    curve_cfg = curve_config(cfg)
    for i, round_ in enumerate(record.rounds):
        nets = tuple(n.data for n in round_.networks)
        steps = result.train_steps if i == len(record.rounds) - 1 else (i + 1) * cfg.curve_every
        m = evaluate_policy_for(
            variant.task, fm_policy(nets, CURVE_NFE, seed, cfg, variant), variant, curve_cfg
        )
        result.curve.append((steps, m[PRIMARY[variant.task]]))
    final = record.final_networks
    for nfe in cfg.nfe:
        result.metrics[str(nfe)] = evaluate_policy_for(
            variant.task, fm_policy(final, nfe, seed, cfg, variant), variant, cfg
        )
    if seed == cfg.seeds[0] and cfg.plots:
        collect_plot_data(
            variant, seed, cfg, plot_data, lambda nfe: fm_policy(final, nfe, seed, cfg, variant)
        )
    return result


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
    curve_m = evaluate_policy_for(variant.task, policy, variant, curve_config(cfg))
    result.curve.append((trained.iterations, curve_m[PRIMARY[variant.task]]))
    result.session_s = time.perf_counter() - started
    if seed == cfg.seeds[0] and cfg.plots:
        collect_plot_data(variant, seed, cfg, plot_data, lambda nfe: policy)
    return result


def run_one(
    variant: Variant, seed: int, cfg: HarnessConfig, work_dir: Path
) -> tuple[RunResult, dict[str, Any]]:
    """One training of ``variant`` for ``seed`` and its evaluation; returns the result and its plot data."""
    plot_data: dict[str, Any] = {}
    if variant.method == "fm":
        return run_fm(variant, seed, cfg, work_dir, plot_data), plot_data
    return run_mse(variant, seed, cfg, plot_data), plot_data
