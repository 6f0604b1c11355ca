"""``la-trainer report RUN``: a run's loss curve from its metrics log, as a PNG and a few lines of text.

Any run leaves ``metrics.jsonl`` in its record folder (:mod:`trainer.runrecord`), so this works for
engine-spawned, attach, socket, offline and ``record`` runs alike, finished or not. ``RUN`` is a run
folder, a task folder, the engine's ``LearningCore`` folder or the project's ``Intermediate`` folder (the
newest run below it). The picture needs matplotlib (the ``plots`` extra); without it the text summary is
printed and the command says how to get the picture.

:func:`draw_loss_panel` is the one loss panel: the demo's report (``emulator/demo/figure.py``) draws its
third panel with it too.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from trainer.exitcodes import ExitCode
from trainer.runrecord import RUN_FILE, check_output_folder, find_run_folders, read_metrics

__all__ = [
    "PHASE_STYLE",
    "PLOTS_INSTALL_HINT",
    "draw_loss_panel",
    "loss_series",
    "report_command",
    "summarize",
]

PLOTS_INSTALL_HINT = "pip install 'la-trainer[plots]'"

PHASE_STYLE: dict[str, tuple[str, str]] = {
    "flow_matching": ("flow matching", "#1f77b4"),
    "distillation": ("distillation", "#ff7f0e"),
}
"""Label and colour per phase. The two losses are different objectives on different scales: drawn as two
series, never one line that seems to drop at the phase boundary."""


def loss_series(points: Sequence[Mapping[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """``{phase: [(iteration, loss), ...]}`` from metrics points, positive finite losses only (log axis)."""
    series: dict[str, list[tuple[int, float]]] = {}
    for point in points:
        loss = point.get("loss")
        if isinstance(loss, int | float) and math.isfinite(loss) and loss > 0:
            series.setdefault(str(point.get("phase", "flow_matching")), []).append(
                (int(point["iteration"]), float(loss))
            )
    return series


def draw_loss_panel(
    ax: Any,
    series: Mapping[str, Sequence[tuple[int, float]]],
    *,
    total: int | None = None,
    title: str = "training loss",
) -> None:
    """The loss panel on a matplotlib axis: one line per phase, log scale, a legend when there are two."""
    drawn = 0
    for phase, part in series.items():
        if not part:
            continue
        label, colour = PHASE_STYLE.get(phase, (phase.replace("_", " "), "#7f7f7f"))
        its, losses = zip(*part, strict=True)
        ax.plot(its, losses, color=colour, linewidth=1.5, label=label)
        drawn += 1
    if drawn:
        ax.set_yscale("log")
        if drawn > 1:
            ax.legend(loc="upper right", fontsize=8)
    else:
        ax.text(0.5, 0.5, "no loss values reported", ha="center", va="center", transform=ax.transAxes)
    if total:
        ax.set_xlim(0, total)
    ax.set_xlabel("iteration")
    ax.set_ylabel("training loss (smoothed)")
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(title, fontsize=10)


def summarize(points: Sequence[Mapping[str, Any]]) -> list[str]:
    """A few lines: points, iterations, last loss per phase, median it/s, training time."""
    if not points:
        return ["no metrics points yet (the first one comes after 100 iterations)"]
    lines = [f"{len(points)} points, iterations {points[0]['iteration']} to {points[-1]['iteration']}"]
    for phase, part in loss_series(points).items():
        label = PHASE_STYLE.get(phase, (phase, ""))[0]
        lines.append(f"{label}: loss {part[0][1]:.5f} at {part[0][0]} -> {part[-1][1]:.5f} at {part[-1][0]}")
    rates = sorted(float(p["iterations_per_second"]) for p in points if p.get("iterations_per_second"))
    if rates:
        lines.append(f"median {rates[len(rates) // 2]:,.0f} it/s")
    elapsed = points[-1].get("elapsed_s")
    if isinstance(elapsed, int | float):
        lines.append(f"{elapsed:,.1f} s of training")
    return lines


def _import_pyplot() -> Any:
    import matplotlib

    # Agg: no display needed; keep a backend the caller already chose (a notebook).
    if "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


@click.command("report")
@click.argument("run", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="PNG to write (default: RUN_FOLDER/loss.png).",
)
def report_command(run: Path, out: Path | None) -> None:
    """Draw a run's training loss from its metrics log.

    RUN: a run folder, a task folder, the engine's LearningCore folder or the project's Intermediate
    folder (the newest run below it).

    \b
    Examples:
      la-trainer report MyProject/Intermediate/LearningCore
      la-trainer report la-trainer-runs/External0 --out loss.png
    """
    folders = find_run_folders(run)
    if not folders:
        click.echo(
            f"la-trainer: no run record ({RUN_FILE}) in {run} or below it. Runs keep one in "
            "<task folder>/runs/<run name> unless run_record is off.",
            err=True,
        )
        sys.exit(int(ExitCode.USAGE))
    folder = folders[0]
    target = out or folder / "loss.png"
    check_output_folder(target.parent, "--out")  # before matplotlib loads: a wrong --out ends at once
    try:
        points = read_metrics(folder)
    except FileNotFoundError:
        points = []
    click.echo(f"run {folder}")
    for line in summarize(points):
        click.echo(f"  {line}")
    try:
        plt = _import_pyplot()
    except ImportError:
        click.echo(
            f"la-trainer: matplotlib is not installed, so no picture was drawn: {PLOTS_INSTALL_HINT}",
            err=True,
        )
        sys.exit(int(ExitCode.USAGE))
    fig, ax = plt.subplots(figsize=(7.0, 4.0))
    try:
        total = max((int(p["iteration"]) for p in points), default=0) or None
        draw_loss_panel(ax, loss_series(points), total=total, title=folder.name)
        fig.tight_layout()
        fig.savefig(target, dpi=110)
    finally:
        plt.close(fig)
    click.echo(f"la-trainer: loss curve in {target}")
