"""Step 2 of the demo: train over shared memory, as a game does (spec §1.2, §2, §7.1).

The emulated engine builds its three flow-matching networks (spec §6.3), creates the controls block and
regions, writes the config files, and spawns the real trainer (its drop-in ``trainer/dropin/train.py``) with the engine's
command line (spec §1.2). :mod:`emulator.drive` plays BeginTraining and the ticks: every round of networks
the trainer syncs back is taken as a game takes it. The trainer's stdout progress lines drive the
progress bar and the loss curve.
"""

from __future__ import annotations

import math
import os
import queue
import re
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import click

from emulator.demo.plan import DemoPlan
from emulator.drive import Ending, TickAction, TrainingStalled, begin_training, tick_until_end
from emulator.game import EngineFailure, ReceivedNetwork, ShmGame
from emulator.launch import (
    DEFAULT_TASK_NAME,
    EngineLayout,
    TrainerProcess,
    make_task_dir,
    shared_memory_command,
)
from emulator.session import EngineTask, SessionSettings, build_session_config

__all__ = [
    "DemoError",
    "ProgressLine",
    "TrainingMonitor",
    "TrainingRun",
    "parse_progress_line",
    "time_limit_stops",
    "train_over_shared_memory",
]

_TICK_S = 0.005
"""The emulated game's tick: the period of its ``HasNetworkOrCompleted`` polls (a 200 Hz game)."""
_ENGINE_TIMEOUT_S = 60.0
"""[INF] The communicator timeout. The engine default is 10 s (spec §1.6); a cold first import of torch
on a busy two-core machine can take longer than that before the trainer's first request, and a demo that
fails on a slow first start teaches nothing (benchmarks/quality.py raises it to 60 s for the same reason).
The game still fails on a trainer that really stalls."""
_EXIT_TIMEOUT_S = 20.0
"""Bound on the trainer's own exit after Complete or Stop (then it is killed)."""
_FIRST_ROUND_GRACE_S = 60.0
"""After the time limit the game still waits this long for a first round (nothing to evaluate without
one) before giving up."""

_PROGRESS_RE = re.compile(
    r"train: iteration (?P<iteration>\d+)/(?P<total>\d+) \([^)]*\) loss (?P<loss>\S+) "
    r"(?P<rate>[\d,.]+) it/s"
)
"""The trainer's plain progress line (:class:`trainer.records.progress.ProgressReporter`), e.g.
``train: iteration 1200/4000 (30.0%) loss 0.41234 1,850 it/s eta 2s syncs 3``."""
_DISTILL_RE = re.compile(r"distilling for \d+ Euler step\(s\) from iteration (?P<start>\d+)")
"""The trainer's announcement of its few-step distillation phase (trainer/training/job.py): from that
iteration on, the loss it prints is the distillation loss, on another scale."""


class DemoError(click.ClickException):
    """The demo could not finish; the message is a complete paragraph (with the trainer's last lines)."""


@dataclass(frozen=True, slots=True)
class ProgressLine:
    """One parsed trainer progress line: iteration of total, smoothed loss, iterations per second."""

    iteration: int
    total: int
    loss: float
    rate: float


def parse_progress_line(line: str) -> ProgressLine | None:
    """The progress fields of a trainer stdout line (with or without the engine's ``Subprocess:`` prefix),
    or None for any other line."""
    match = _PROGRESS_RE.search(line)
    if match is None:
        return None
    try:
        loss = float(match["loss"])
    except ValueError:
        loss = math.nan
    return ProgressLine(
        int(match["iteration"]), int(match["total"]), loss, float(match["rate"].replace(",", ""))
    )


class TrainingMonitor(Protocol):
    """Sees the training as it happens (the console's progress bar implements it)."""

    def launched(self, argv: Sequence[str]) -> None: ...
    def progress(self, line: ProgressLine) -> None: ...
    def round_received(self, count: int) -> None: ...
    def finished(self) -> None: ...


@dataclass(eq=False)
class TrainingRun:
    """What the game saw of the training.

    ``networks``: the last round of snapshots it received, in network-id order (denoiser, encoder,
    decoder). ``loss_curve``: (iteration, smoothed loss) from the trainer's progress lines.
    ``iterations_at_last_round``: the trainer's latest reported iteration when that round arrived.
    """

    networks: tuple[bytes, ...]
    rounds: int
    iterations_planned: int
    iterations_done: int
    iterations_at_last_round: int
    loss_curve: list[tuple[int, float]]
    completed: bool
    stopped_early: str | None
    distill_start: int | None
    """First iteration of the trainer's few-step distillation (LA_TRAINER_ODE_STEPS), None without one."""
    exit_code: int | None
    seconds: float
    argv: list[str]
    log: list[str] = field(default_factory=list)


def _trainer_env(plan: DemoPlan) -> dict[str, str]:
    """The user's environment plus the demo's trainer knobs (trainer/settings/options.py)."""
    env = dict(os.environ)
    env.update(
        {
            # A wall-clock cadence: the game always holds networks at most this old, which is what an early
            # stop evaluates.
            "LA_TRAINER_SYNC_EVERY_ITERATIONS": "0",
            "LA_TRAINER_SYNC_EVERY_SECONDS": f"{plan.sync_every_seconds:g}",
            # Dense enough for a loss curve with a point every half second.
            "LA_TRAINER_PROGRESS_EVERY_SECONDS": f"{plan.progress_every_seconds:g}",
            # No LA_TRAINER_ODE_STEPS: few-step distillation is not part of this version (the trainer
            # refuses the option rather than ignoring it).
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def _session_settings(plan: DemoPlan) -> SessionSettings:
    return SessionSettings(
        iteration_num=plan.iterations,
        batch_size=plan.batch_size,
        learning_rate=plan.learning_rate,
        seed=plan.seed,
        # The demo keeps its report, not the trainer's snapshot files (they would land in a temp folder).
        save_snapshots=False,
        device="CPU",
        embed_normalizations_in_weights=True,
        hidden_layer_num=plan.hidden_layer_num,
        hidden_layer_size=plan.hidden_layer_size,
        activation=plan.activation,
        action_chunk_size=plan.chunk_size,
        engine_timeout_s=_ENGINE_TIMEOUT_S,
        tick_s=_TICK_S,
    )


def time_limit_stops(*, have_round: bool, iteration: int, total: int) -> bool:
    """Past the time limit: whether the game sends Stop (EndTraining) now.

    Only with a round to evaluate, and never once the trainer reported its last iteration
    (``iteration >= total``): the final round and Complete are then on their way (the trainer prints its
    last progress line before it sends them), and a Stop would race the Complete; the game takes them as
    the engine would (the trainer's exit is still watched by the tick loop).
    """
    if total > 0 and iteration >= total:
        return False
    return have_round


def _failure(message: str, proc: TrainerProcess | None) -> DemoError:
    tail = proc.log_tail(25) if proc is not None else ""
    text = message if not tail else f"{message}\nThe trainer's last output lines:\n{tail}"
    return DemoError(text)


def train_over_shared_memory(
    task: EngineTask,
    plan: DemoPlan,
    work_dir: Path,
    monitor: TrainingMonitor,
    *,
    deadline: float | None = None,
    configs_copy: Path | None = None,
) -> TrainingRun:
    """Play the engine's side of a spawned shared-memory session (spec §1.2, §2, §7.1) against the real
    drop-in ``trainer/dropin/train.py``.

    ``work_dir`` receives the fake engine tree (removed by the caller). ``deadline`` (a
    ``time.monotonic()`` value): once passed, and once at least one round arrived, the game sends Stop
    and keeps the last round. ``configs_copy``: where to copy the config files the game wrote (for
    curious readers). Raises :class:`DemoError` when the session fails; the trainer process never
    outlives this call.
    """
    layout = EngineLayout.create(work_dir / "engine")
    config, snapshots = build_session_config(task, _session_settings(plan), str(layout.intermediate_dir))
    task_dir = make_task_dir(layout.intermediate_dir, DEFAULT_TASK_NAME)
    lines: queue.SimpleQueue[str] = queue.SimpleQueue()
    started = time.monotonic()
    curve: list[tuple[int, float]] = []
    latest: tuple[bytes, ...] = ()
    rounds = 0
    last_iteration = 0
    last_total = 0
    iteration_at_round = 0
    completed = False
    stopped_early: str | None = None
    distill_start: int | None = None
    proc: TrainerProcess | None = None
    game = ShmGame.create(task_dir / "Configs", timeout=_ENGINE_TIMEOUT_S)

    def drain() -> None:
        nonlocal last_iteration, last_total, distill_start
        while True:
            try:
                line = lines.get_nowait()
            except queue.Empty:
                return
            distill = _DISTILL_RE.search(line)
            if distill is not None:
                distill_start = int(distill["start"])
            parsed = parse_progress_line(line)
            if parsed is not None:
                last_iteration, last_total = parsed.iteration, parsed.total
                curve.append((parsed.iteration, parsed.loss))
                monitor.progress(parsed)

    def copy_configs() -> None:
        if configs_copy is not None:
            shutil.rmtree(configs_copy, ignore_errors=True)
            shutil.copytree(task_dir / "Configs", configs_copy)

    def round_received(networks: tuple[ReceivedNetwork, ...]) -> None:
        nonlocal latest, rounds, iteration_at_round
        drain()
        latest = tuple(network.data for network in networks)
        rounds += 1
        iteration_at_round = last_iteration
        monitor.round_received(rounds)

    def each_tick() -> TickAction | None:
        nonlocal stopped_early
        drain()
        now = time.monotonic()
        if deadline is not None and now > deadline:
            if time_limit_stops(have_round=bool(latest), iteration=last_iteration, total=last_total):
                stopped_early = "time limit"
                return TickAction.STOP
            if not latest and now > deadline + _FIRST_ROUND_GRACE_S:
                raise _failure("The trainer sent no networks back before the time limit.", proc)
        return None

    try:
        argv = shared_memory_command(layout, DEFAULT_TASK_NAME, task_dir, game.controls_guid)
        proc = TrainerProcess(argv, cwd=layout.root, env=_trainer_env(plan), echo=lines.put)
        game.process_alive = proc.alive
        monitor.launched(argv)
        begin_training(game, config, snapshots, task.replay_buffer, after_configs=copy_configs)
        try:
            ended = tick_until_end(
                game, tick_s=_TICK_S, on_round=round_received, on_tick=each_tick, trainer=proc
            )
            completed = ended.how is Ending.COMPLETED
        except KeyboardInterrupt:
            # First Ctrl-C: stop as the game would (EndTraining) and evaluate what arrived so far.
            if not latest:
                raise
            game.stop()
            stopped_early = "interrupted (Ctrl-C)"
        drain()
        game.done()
        code = proc.wait(_EXIT_TIMEOUT_S)
        drain()
    except TrainingStalled:
        # The only stall without a time bound or a connection: the process ended without Complete.
        returncode = proc.returncode if proc is not None else None
        raise _failure(
            f"The trainer exited with code {returncode} before it completed training.", proc
        ) from None
    except EngineFailure as error:
        raise _failure(f"The emulated game failed: {error}", proc) from None
    finally:
        monitor.finished()
        if proc is not None and proc.alive():
            proc.kill()
        game.close()
    if code is None:
        raise _failure(f"The trainer did not exit within {_EXIT_TIMEOUT_S:g} s after training.", proc)
    if code != 0 and stopped_early is None:
        raise _failure(f"The trainer exited with code {code} (see README, 'Exit codes').", proc)
    if not latest:
        raise _failure("The trainer completed without sending any networks back.", proc)
    return TrainingRun(
        networks=latest,
        rounds=rounds,
        iterations_planned=plan.iterations,
        iterations_done=last_iteration,
        iterations_at_last_round=iteration_at_round,
        loss_curve=curve,
        completed=completed,
        stopped_early=stopped_early,
        distill_start=distill_start,
        exit_code=code,
        seconds=time.monotonic() - started,
        argv=list(argv),
        log=proc.log if proc is not None else [],
    )
