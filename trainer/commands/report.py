"""``la-trainer report RUN``: a run's loss curve from its metrics log, as a PNG and a few lines of text.

With a held-out set (:mod:`trainer.training.heldout`, option ``heldout_share``) the picture has two more panels:
the held-out metrics over iterations (the selection score that picks the recipe and the best networks, with
the recipe pilot's looks marked; coverage and precision) and the demonstrated against the sampled actions
on the held-out observations at the last measurement (``heldout-actions.json``). The text names the recipe
trained and why (:mod:`trainer.training.recipes`: each candidate's selection score).

Any run leaves ``metrics.jsonl`` in its record folder (:mod:`trainer.records.runrecord`), so this works for
engine-spawned, attach, socket, offline and ``record`` runs alike, finished or not. ``RUN`` is a run
folder, a task folder, the engine's ``LearningCore`` folder or the project's ``Intermediate`` folder (the
newest run below it). The picture needs matplotlib (the ``plots`` extra); without it the text summary is
printed and a warning says how to get the picture where the command ran (:func:`plots_advice`), exit 0:
the same rule as the demo's report (a missing optional picture is a warning, never a failure).

:func:`draw_loss_panel` is the one loss panel: the demo's report (``emulator/demo/figure.py``) draws its
third panel with it too.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from trainer.commands.cli import NonEmptyPath
from trainer.errors import LaunchError
from trainer.exitcodes import ExitCode
from trainer.records.runrecord import (
    HELDOUT_ACTIONS_FILE,
    METRICS_FILE,
    RUN_FILE,
    check_output_folder,
    find_run_folders,
    read_metrics,
)

__all__ = [
    "FIGURE_SUFFIXES",
    "PHASE_STYLE",
    "PLOTS_INSTALL_HINT",
    "draw_actions_panel",
    "draw_heldout_panel",
    "draw_loss_panel",
    "heldout_series",
    "loss_series",
    "plots_advice",
    "recipe_looks",
    "report_command",
    "summarize",
]

PLOTS_INSTALL_HINT = "pip install 'la-trainer[plots]'"

FIGURE_SUFFIXES = (".png", ".svg", ".pdf")
"""What ``report --out`` may end in: the formats matplotlib writes with no package beyond the ``plots``
extra. Checked before anything is read, so a wrong name is refused at once (exit 2), not by matplotlib
after the summary."""


def plots_advice() -> str:
    """How to get a picture where matplotlib is missing, in words that can be acted on where the command
    ran: in a container (the la-trainer image leaves matplotlib out, and its user cannot install
    packages) the picture is drawn outside it, from the run folder in the mounted volume."""
    from trainer.system.container import in_container

    if in_container():
        return (
            "matplotlib is not installed in this container (the la-trainer image leaves it out); draw the "
            f"picture outside it: {PLOTS_INSTALL_HINT} on the host, then la-trainer report on the run folder "
            "in the mounted volume"
        )
    return f"matplotlib is not installed: {PLOTS_INSTALL_HINT}, then run the command again"


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


def heldout_series(points: Sequence[Mapping[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """``{metric: [(iteration, value), ...]}`` from the held-out lines of a metrics log (finite values)."""
    series: dict[str, list[tuple[int, float]]] = {}
    for point in points:
        measured = point.get("heldout")
        if not isinstance(measured, dict):
            continue
        for key, value in measured.items():
            if isinstance(value, int | float) and math.isfinite(value) and key != "seconds":
                series.setdefault(key, []).append((int(point["iteration"]), float(value)))
    return series


def recipe_looks(points: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The recipe pilot's looks (``{"iteration", "recipe"}`` lines of a metrics log), in order."""
    return [p["recipe"] for p in points if isinstance(p.get("recipe"), dict)]


def draw_heldout_panel(
    ax: Any,
    series: Mapping[str, Sequence[tuple[int, float]]],
    *,
    total: int | None,
    looks: Sequence[Mapping[str, Any]] = (),
) -> None:
    """Held-out metrics over iterations: the selection score (higher is better; what picks the recipe and
    the best networks) on the left axis, coverage and precision (shares) on the right; a dotted line at
    each of the recipe pilot's ``looks`` (:func:`recipe_looks`), named after the recipe it left leading.
    With a single measurement the numbers are written out instead: one marker is no curve, and the legend
    covered it."""
    if max((len(part) for part in series.values()), default=0) < 2:
        _draw_one_measurement(ax, series)
        return
    score = series.get("selection", [])
    if score:
        its, values = zip(*score, strict=True)
        ax.plot(its, values, color="#1f77b4", marker="o", markersize=3, label="selection score")
    for look in looks:
        chosen = look.get("chosen") or look.get("leader") or "?"
        word = "chosen" if look.get("stage") == "pick" else "leads"
        ax.axvline(float(look.get("iteration", 0)), color="#7f7f7f", linestyle=":", linewidth=1)
        ax.annotate(
            f"{chosen} {word}",
            (float(look.get("iteration", 0)), 1.0),
            xycoords=("data", "axes fraction"),
            rotation=90,
            va="top",
            ha="right",
            fontsize=7,
            color="#555555",
        )
    ax.set_ylabel("held-out selection score (higher is better)")
    right = ax.twinx()
    for key, colour in (("coverage", "#2ca02c"), ("precision", "#d62728")):
        part = series.get(key, [])
        if part:
            its, values = zip(*part, strict=True)
            right.plot(its, values, color=colour, marker="s", markersize=3, linestyle="--", label=key)
    right.set_ylim(0.0, 1.02)
    right.set_ylabel("share of held-out rows / samples")
    handles = ax.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    if handles:
        ax.legend(handles=handles, loc="center right", fontsize=8)
    if total:
        ax.set_xlim(0, total)
    ax.set_xlabel("iteration")
    ax.grid(True, alpha=0.3)
    ax.set_title("held-out imitation quality", fontsize=10)


def _draw_one_measurement(ax: Any, series: Mapping[str, Sequence[tuple[int, float]]]) -> None:
    """The held-out panel for a run measured once: its numbers as text."""
    shown = (
        ("selection", "selection score", "higher is better"),
        ("energy_score", "energy score", "lower is better"),
        ("coverage", "coverage", "higher is better"),
        ("precision", "precision", "higher is better"),
        ("flow_loss", "flow loss", "lower is better"),
    )
    rows = [f"{label} {series[key][0][1]:.3f} ({better})" for key, label, better in shown if series.get(key)]
    iteration = next((part[0][0] for part in series.values() if part), None)
    head = f"one measurement, at iteration {iteration}" if iteration is not None else "no measurement"
    ax.text(0.5, 0.5, "\n".join([head, *rows]), ha="center", va="center", transform=ax.transAxes, fontsize=10)
    ax.set_axis_off()
    ax.set_title("held-out imitation quality", fontsize=10)


def draw_actions_panel(ax: Any, record: Mapping[str, Any]) -> None:
    """Demonstrated (grey) against sampled (blue) actions on the held-out observations
    (``heldout-actions.json``: two columns per row)."""
    for key, colour, label, size in (
        ("demonstrated", "#555555", "demonstrated", 16),
        ("sampled", "#1f77b4", "sampled (engine path)", 6),
    ):
        rows = record.get(key) or []
        if rows:
            xs, ys = zip(*((row[0], row[1]) for row in rows), strict=True)
            ax.scatter(xs, ys, s=size, color=colour, alpha=0.5, label=label, linewidths=0)
    ax.set_xlabel(str(record.get("x_label", "")))
    ax.set_ylabel(str(record.get("y_label", "")))
    ax.legend(loc="best", fontsize=8, markerscale=2)
    ax.grid(True, alpha=0.3)
    ax.set_title(
        f"held-out actions at iteration {record.get('iteration', '?')} ({record.get('ode_steps', '?')} Euler steps)",
        fontsize=10,
    )


def _heldout_summary(points: Sequence[Mapping[str, Any]]) -> list[str]:
    measured = [p for p in points if isinstance(p.get("heldout"), dict)]
    if not measured:
        return []
    first, last = measured[0], measured[-1]
    best = next((p for p in reversed(measured) if p.get("best")), last)

    def value(point: Mapping[str, Any], key: str) -> str:
        number = point["heldout"].get(key)
        return f"{number:.4f}" if isinstance(number, int | float) else "?"

    coverage = last["heldout"].get("coverage")
    shown = f", coverage {coverage:.2f}" if isinstance(coverage, int | float) else ""
    return [
        f"held-out: selection score {value(first, 'selection')} at {first['iteration']} -> "
        f"{value(last, 'selection')} at {last['iteration']}{shown}; best {value(best, 'selection')} at "
        f"{best['iteration']}; energy score {value(first, 'energy_score')} -> {value(last, 'energy_score')}"
    ]


def _recipe_summary(points: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = []
    for look in recipe_looks(points):
        raw = look.get("scores")
        scores: Mapping[str, Any] = raw if isinstance(raw, dict) else {}
        ranked = sorted(
            ((name, s.get("score")) for name, s in scores.items() if isinstance(s, dict)),
            key=lambda item: -(item[1] if isinstance(item[1], int | float) else -math.inf),
        )
        shown = ", ".join(f"{name} {score:.3f}" for name, score in ranked if isinstance(score, int | float))
        stopped = ", ".join(look.get("stopped") or []) or "none"
        if look.get("stage") == "pick":
            lines.append(
                f"recipe: {look.get('chosen', '?')} chosen at {look.get('iteration', '?')} by the held-out "
                f"selection score ({shown})"
            )
        else:
            lines.append(
                f"recipe pilot at {look.get('iteration', '?')}: selection score {shown}; stopped {stopped}"
            )
    return lines


def summarize(points: Sequence[Mapping[str, Any]]) -> list[str]:
    """A few lines: points, iterations, last loss per phase, median it/s, training time; the held-out
    selection score's first, last and best value and the recipe pilot's looks when the run has them."""
    heldout = _recipe_summary(points) + _heldout_summary(points)
    points = [p for p in points if "loss" in p]  # not the held-out, recipe or thread lines
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
    return lines + heldout


def _read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from ``path``; None when it is missing or not one (a report never fails on it)."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


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
    type=NonEmptyPath(dir_okay=False, path_type=Path),
    default=None,
    help="Picture to write: a .png, .svg or .pdf file (default: RUN_FOLDER/loss.png).",
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
    if out is not None and out.suffix.lower() not in FIGURE_SUFFIXES:
        raise LaunchError(
            f"--out {str(out)!r} ends in {repr(out.suffix) if out.suffix else 'no suffix'}, but the picture is "
            f"written only as {', '.join(FIGURE_SUFFIXES)}: give --out a file name ending in one of these "
            "(such as loss.png)."
        )
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
    unreadable: list[int] = []
    try:
        points = read_metrics(folder, unreadable=unreadable)
    except FileNotFoundError:
        points = []
    if unreadable:
        click.echo(
            f"la-trainer: warning: {len(unreadable)} line(s) of {folder / METRICS_FILE} are not readable "
            f"(not UTF-8 JSON; first: line {unreadable[0]}): a damaged file or a torn write; the report "
            "leaves them out.",
            err=True,
        )
    click.echo(f"run {folder}")
    for line in summarize(points):
        click.echo(f"  {line}")
    try:
        plt = _import_pyplot()
    except ImportError:
        # A warning, exit 0, as the demo's report: the summary above is the report this installation can
        # give (the Docker image has no matplotlib), and nothing about the command line was wrong.
        click.echo(f"la-trainer: warning: no picture drawn: {plots_advice()}.", err=True)
        return
    measured = heldout_series(points)
    actions = _read_json(folder / HELDOUT_ACTIONS_FILE)
    panels = 1 + bool(measured) + (actions is not None)
    fig, axes = plt.subplots(1, panels, figsize=(7.0 * panels, 4.0), squeeze=False)
    try:
        total = max((int(p["iteration"]) for p in points), default=0) or None
        draw_loss_panel(axes[0][0], loss_series(points), total=total, title=folder.name)
        if measured:
            draw_heldout_panel(axes[0][1], measured, total=total, looks=recipe_looks(points))
        if actions is not None:
            draw_actions_panel(axes[0][panels - 1], actions)
        fig.tight_layout()
        fig.savefig(target, dpi=110)
    finally:
        plt.close(fig)
    click.echo(f"la-trainer: loss curve in {target}")
