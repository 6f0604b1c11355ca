"""The demo's story, in execution order: record, train, evaluate, report (the package docstring)."""

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from emulator.demo.evaluation import Evaluation, evaluate_networks
from emulator.demo.figure import Trajectories
from emulator.demo.plan import DEFAULT_TIME_LIMIT_S, EVALUATION_SEED, DemoPlan
from emulator.demo.report import DemoReport, ReportFiles, ResultRow, write_report
from emulator.demo.training import TrainingMonitor, TrainingRun, train_over_shared_memory
from emulator.session import EngineTask
from emulator.tasks import Demonstrations, avoid
from trainer.system.liveness import process_watch

__all__ = ["DemoOutcome", "record_demonstrations", "run_demo"]

_REPORT_RESERVE_S = 5.0
"""Seconds kept for drawing and writing the report when deciding whether an extra row fits."""


# ---------------------------------------------------------------------------------------------------------
# Record


def record_demonstrations(plan: DemoPlan) -> tuple[Demonstrations, EngineTask]:
    """The expert's episodes and the engine task built from them (one replay-buffer episode each)."""
    demos = avoid.make_demonstrations(plan.seed, demo_num=plan.demo_num)
    task = EngineTask.from_demonstrations("avoid", avoid.OBSERVATION_SCHEMA, avoid.ACTION_SCHEMA, demos)
    return demos, task


# ---------------------------------------------------------------------------------------------------------
# The whole run


@dataclass(frozen=True, slots=True, eq=False)
class DemoOutcome:
    """What :func:`run_demo` produced."""

    report: DemoReport
    files: ReportFiles
    training: TrainingRun
    evaluations: tuple[Evaluation, ...]
    expert_metrics: dict[str, float]


def _command_line(plan: DemoPlan, out_dir: Path) -> str:
    parts = ["la-trainer", "demo", "--seed", str(plan.seed), "--iterations", str(plan.iterations)]
    parts += ["--ode-steps", str(plan.ode_steps), "--out", str(out_dir)]
    if plan.quick:
        parts.append("--quick")
    if plan.time_limit_s != DEFAULT_TIME_LIMIT_S:
        parts += ["--time-limit", f"{plan.time_limit_s:g}"]
    return shlex.join(parts)


def _notes(run: TrainingRun, plan: DemoPlan, skipped: Sequence[int]) -> tuple[str, ...]:
    notes = []
    if run.stopped_early is not None:
        why = (
            "This machine trains more slowly than the demo assumes (two free CPU cores); under-trained "
            "flow-matching policies look blurred (lower success). Pass a smaller --iterations, or "
            "--time-limit 0 to train to the end."
            if run.stopped_early == "time limit"
            else "Run again without interrupting for the full result."
        )
        notes.append(
            f"Training was stopped early ({run.stopped_early}) at iteration {run.iterations_done} of "
            f"{run.iterations_planned}; the evaluated networks are the last round the game received "
            f"(iteration ≈ {run.iterations_at_last_round}). {why}"
        )
    if skipped:
        counts = ", ".join(str(n) for n in skipped)
        notes.append(f"The rows for {counts} ODE steps were skipped to stay within the time limit.")
    if plan.quick:
        notes.append("--quick: a smoke test with a small network and short training; expect poor numbers.")
    return tuple(notes)


def _summary(run: TrainingRun, plan: DemoPlan, headline: Evaluation, expert: dict[str, float]) -> str:
    return (
        f"The emulated game recorded {plan.demo_num} expert episodes of the six-route task, spawned the real "
        f"trainer (its engine drop-in `trainer/dropin/train.py`, shared memory, the engine's command line), which "
        f"trained "
        f"{run.iterations_done} iterations in {run.seconds:.0f} s and synced {run.rounds} rounds of networks "
        f"back. Run through the engine's inference path with {headline.ode_steps} Euler steps, the policy "
        f"succeeds in {headline.metrics['success']:.0%} of {plan.rollout_num} episodes with route entropy "
        f"{headline.metrics['entropy']:.2f} (expert: {expert['success']:.0%}, {expert['entropy']:.2f})."
    )


def _evaluate_rows(
    run: TrainingRun, plan: DemoPlan, limit_at: float | None, say: Callable[[str], None]
) -> tuple[list[Evaluation], list[int]]:
    """The headline row always; each extra step count only if the time limit leaves room for it (its cost
    estimated from the headline row: proportional to the step count) and for the report."""
    evaluations: list[Evaluation] = []
    skipped: list[int] = []
    for steps in plan.evaluated_ode_steps:
        if evaluations and limit_at is not None:
            first = evaluations[0]
            estimate = first.seconds * steps / first.ode_steps
            if time.monotonic() + estimate + _REPORT_RESERVE_S > limit_at:
                skipped.append(steps)
                continue
        evaluation = evaluate_networks(run.networks, plan, steps, record=steps == plan.ode_steps)
        evaluations.append(evaluation)
        say(
            f"Evaluated {plan.rollout_num} rollouts at {steps} ODE steps: success "
            f"{evaluation.metrics['success']:.3f}, entropy {evaluation.metrics['entropy']:.3f} "
            f"({evaluation.seconds:.1f} s)."
        )
    return evaluations, skipped


WORK_PREFIX = "la-trainer-demo-"
"""Scratch folders ``<temp>/la-trainer-demo-<pid>-<random>``: the emulated engine and project of one demo."""

_WORK_NAME = re.compile(rf"^{re.escape(WORK_PREFIX)}(\d+)-")


def sweep_stale_work_folders(
    root: Path, alive: Callable[[int], bool] = lambda pid: process_watch(pid)()
) -> list[Path]:
    """Remove the scratch folders under ``root`` of demos whose process is gone (a demo killed with SIGKILL
    cannot remove its own; the trainer it spawned unlinks the shared memory, trainer/session/links/shm.py), and
    return them. Folders of running demos, and of this process, stay."""
    removed = []
    for folder in sorted(root.glob(f"{WORK_PREFIX}*")):
        match = _WORK_NAME.match(folder.name)
        if match is None or not folder.is_dir():
            continue
        pid = int(match.group(1))
        if pid == os.getpid() or alive(pid):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def work_folder() -> tempfile.TemporaryDirectory[str]:
    """This demo's scratch folder, named after its process, after the stale ones of killed demos went."""
    root = Path(tempfile.gettempdir())
    sweep_stale_work_folders(root)
    return tempfile.TemporaryDirectory(prefix=f"{WORK_PREFIX}{os.getpid()}-", dir=root)


def run_demo(
    plan: DemoPlan,
    out_dir: Path,
    *,
    monitor: TrainingMonitor,
    say: Callable[[str], None],
    started: float | None = None,
) -> DemoOutcome:
    """Record, train, evaluate, report (module docstring). ``say`` receives one line per stage;
    ``started`` is the ``time.monotonic()`` the time limit counts from (default: now)."""
    t0 = time.monotonic() if started is None else started
    timings: dict[str, float] = {}
    out_dir.mkdir(parents=True, exist_ok=True)

    mark = time.monotonic()
    say(f"Recording {plan.demo_num} expert demonstrations of the six-route task (B2) ...")
    demos, task = record_demonstrations(plan)
    timings["record"] = time.monotonic() - mark
    say(f"  {demos.episode_num} episodes, {demos.step_num} steps.")

    deadline = t0 + plan.time_limit_s - plan.reserve_s if plan.time_limit_s > 0 else None
    mark = time.monotonic()
    with work_folder() as work:
        run = train_over_shared_memory(
            task, plan, Path(work), monitor, deadline=deadline, configs_copy=out_dir / "engine-configs"
        )
    timings["train"] = time.monotonic() - mark
    (out_dir / "trainer.log").write_text("\n".join(run.log) + "\n", encoding="utf-8")
    ended = "completed" if run.completed else f"stopped: {run.stopped_early}"
    say(f"  trainer {ended} after {run.iterations_done} iterations, {run.rounds} rounds received.")

    mark = time.monotonic()
    evaluations, skipped = _evaluate_rows(
        run, plan, t0 + plan.time_limit_s if plan.time_limit_s > 0 else None, say
    )
    expert_metrics = avoid.evaluate_expert(EVALUATION_SEED, plan.rollout_num)
    expert_paths = Trajectories.from_demonstrations(demos)
    timings["evaluate"] = time.monotonic() - mark

    headline = evaluations[0]
    assert headline.trajectories is not None  # recorded for the headline step count above
    rows = (
        ResultRow("expert (scripted)", None, expert_metrics),
        *(ResultRow("flow matching", e.ode_steps, e.metrics) for e in evaluations),
    )
    training_facts: dict[str, object] = {
        "iterations_planned": run.iterations_planned,
        "iterations_done": run.iterations_done,
        "iterations_at_evaluated_round": run.iterations_at_last_round
        if run.stopped_early
        else run.iterations_done,
        "seconds": round(run.seconds, 2),
        "rounds_received": run.rounds,
        "completed": run.completed,
        "stopped_early": run.stopped_early or "no",
        "trainer_exit_code": run.exit_code,
        "distillation_from_iteration": run.distill_start if run.distill_start is not None else "none",
        "final_loss": run.loss_curve[-1][1] if run.loss_curve else math.nan,
        "trainer_command": shlex.join(run.argv),
    }
    # The report's own drawing time is not in it: the figure is drawn from this very value.
    timings["total before the report"] = time.monotonic() - t0
    report = DemoReport(
        title='la-trainer demo: flow-matching imitation on the six-route "avoid" task',
        summary=_summary(run, plan, headline, expert_metrics),
        rows=rows,
        expert=expert_paths,
        expert_label=f"expert demonstrations ({demos.episode_num}, the training data)",
        policy=headline.trajectories,
        policy_label=(
            f"trained policy, {headline.ode_steps} ODE steps (first {len(headline.trajectories)} of "
            f"{plan.rollout_num} evaluation episodes)"
        ),
        loss_curve=tuple(run.loss_curve),
        training=training_facts,
        settings=plan.describe(),
        timings=timings,
        notes=_notes(run, plan, skipped),
        command=_command_line(plan, out_dir),
    )
    files = write_report(report, out_dir)
    return DemoOutcome(report, files, run, tuple(evaluations), expert_metrics)
