"""``la-trainer demo``: the click command and its console (stage lines, a progress bar while training)."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from emulator.demo.plan import DEFAULT_TIME_LIMIT_S, make_plan
from emulator.demo.report import results_table_text
from emulator.demo.run import run_demo
from emulator.demo.training import ProgressLine
from trainer.commands.cli import NonEmptyPath
from trainer.records.runrecord import check_output_folder

__all__ = ["DEFAULT_OUT_DIR", "Console", "demo_command"]

DEFAULT_OUT_DIR = Path("la-trainer-demo")
_PLAIN_PROGRESS_EVERY_S = 5.0
"""Period of the plain progress lines when stdout is not a terminal."""


class Console:
    """Stage lines always; during training a click progress bar on a terminal, plain lines otherwise."""

    def __init__(self, tty: bool) -> None:
        self.tty = tty
        self._bar: Any = None
        self._shown = 0
        self._last_plain = -math.inf
        self._last: ProgressLine | None = None

    def say(self, message: str) -> None:
        click.echo(message)

    # -- TrainingMonitor ---------------------------------------------------------------------------------
    def launched(self, argv: Sequence[str]) -> None:
        script = Path(argv[1]).name if len(argv) > 1 else "train.py"
        self.say(
            f"Training: the game spawned the trainer ({script} {' '.join(argv[2:4])} ... SharedMemory, "
            "as the engine does) and sends it the networks and the recording ..."
        )

    def progress(self, line: ProgressLine) -> None:
        self._last = line
        if self.tty:
            bar = self._ensure_bar(line.total)
            step = max(line.iteration - self._shown, 0)
            self._shown += step
            bar.update(step, line)
            return
        now = time.monotonic()
        if now - self._last_plain >= _PLAIN_PROGRESS_EVERY_S or line.iteration >= line.total:
            self._last_plain = now
            self.say(self._plain(line))

    def round_received(self, count: int) -> None:
        return None

    def finished(self) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
            self._bar = None
        elif self._last is not None and not self.tty and self._last.iteration < self._last.total:
            self.say(self._plain(self._last))

    # -- helpers -----------------------------------------------------------------------------------------
    @staticmethod
    def _plain(line: ProgressLine) -> str:
        pct = 100.0 * line.iteration / line.total if line.total else 100.0
        return (
            f"  training: iteration {line.iteration}/{line.total} ({pct:.0f}%) loss {line.loss:.4f} "
            f"{line.rate:,.0f} it/s"
        )

    def _ensure_bar(self, total: int) -> Any:
        if self._bar is None:

            def show(item: ProgressLine | None) -> str:
                return "" if item is None else f"loss {item.loss:.4f}  {item.rate:,.0f} it/s"

            bar = click.progressbar(
                length=max(total, 1), label="  training", show_eta=True, item_show_func=show, width=28
            )
            bar.__enter__()
            self._bar = bar
        return self._bar


@click.command("demo")
@click.option(
    "--iterations",
    type=click.IntRange(1, 10_000_000),
    default=None,
    help="IterationNum (default 8000; 600 with --quick).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the recording and of training.")
@click.option(
    "--out",
    "out_dir",
    type=NonEmptyPath(file_okay=False, path_type=Path),
    default=DEFAULT_OUT_DIR,
    show_default=True,
    help="Folder for report.md, report.png and metrics.json.",
)
@click.option(
    "--ode-steps",
    type=click.IntRange(1, 100),
    default=8,
    show_default=True,
    help="ODEStepsNum of the game's policy (the headline evaluation).",
)
@click.option(
    "--quick", is_flag=True, help="A smoke test: small network, short training, one evaluation row."
)
@click.option(
    "--time-limit",
    "time_limit_s",
    type=click.FloatRange(0, None),
    default=DEFAULT_TIME_LIMIT_S,
    show_default=True,
    help="Seconds the whole demo may take; training is stopped early (as the game's EndTraining) to fit. 0: no limit.",
)
def demo_command(
    iterations: int | None, seed: int, out_dir: Path, ode_steps: int, quick: bool, time_limit_s: float
) -> None:
    """Run the whole loop without Unreal: record, train over shared memory, evaluate, report.

    The built-in game emulator records the six-route "avoid" task (benchmark B2), spawns the real trainer
    exactly as the engine does, takes back the networks it trains, runs them through the engine's
    inference path and writes a report (table, trajectories, loss curve).

    \b
    Examples:
      la-trainer demo                      # under a minute on an idle 2-core machine
      la-trainer demo --quick              # seconds: a smoke test of the same path
      la-trainer demo --seed 3 --out runs/seed3
    """
    started = time.monotonic()
    plan = make_plan(
        iterations=iterations, seed=seed, ode_steps=ode_steps, quick=quick, time_limit_s=time_limit_s
    )
    check_output_folder(out_dir, "--out")  # before the recording: a wrong --out ends at once, exit 2
    console = Console(tty=sys.stdout.isatty())
    outcome = run_demo(plan, out_dir, monitor=console, say=console.say, started=started)
    click.echo("")
    click.echo(f'Results (B2 "avoid", {plan.rollout_num} closed-loop episodes per row):')
    click.echo(results_table_text(outcome.report.rows))
    for note in outcome.report.notes:
        click.echo(f"Note: {note}")
    if outcome.files.warning is not None:
        click.echo(f"Warning: {outcome.files.warning}", err=True)
    click.echo("")
    click.echo(f"Report: {outcome.files.markdown.resolve()}")
    if outcome.files.figure is not None:
        click.echo(f"Figure: {outcome.files.figure.resolve()}")
    click.echo(f"Metrics: {outcome.files.metrics.resolve()}")
    click.echo(f"Done in {time.monotonic() - started:.0f} s.")
