"""The report's figure: three panels drawn with matplotlib into one PNG.

Left, the expert demonstrations coloured by route; middle, the trained policy's closed-loop rollouts
coloured the same way (failures grey, collisions marked); right, the training loss.

matplotlib is optional (the ``plots`` extra): it is imported only inside :func:`render_figure`, with the
non-interactive Agg backend so the demo runs on a machine without a display.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from emulator.tasks.avoid import GAPS, GOAL_Y, MODE_NAMES, OBSTACLES
from trainer.commands.report import PLOTS_INSTALL_HINT, draw_loss_panel

if TYPE_CHECKING:
    # Annotations only: the report module imports this one to draw its figure.
    from emulator.demo.report import DemoReport, Trajectories

__all__ = ["PLOTS_INSTALL_HINT", "PlottingUnavailable", "render_figure"]

_ROUTE_COLOURS = ("#1f77b4", "#17becf", "#2ca02c", "#d62728", "#ff7f0e", "#9467bd")
"""One colour per route (mode index order of :data:`MODE_NAMES`): blues/green for the left side of the
first obstacle, reds/orange/purple for the right, so the two sides read apart at a glance."""
_FAILED_COLOUR = "#9a9a9a"
_FIGURE_SIZE_IN = (16.5, 5.4)
_FIGURE_DPI = 110
_X_LIMITS = (-0.62, 0.62)
_Y_LIMITS = (-0.06, 1.12)


class PlottingUnavailable(RuntimeError):
    """matplotlib cannot be imported; the message says how to install it."""


def _import_pyplot(file_name: str) -> Any:
    try:
        import matplotlib
    except ImportError:
        raise PlottingUnavailable(
            f"matplotlib is not installed, so {file_name} was not drawn. Install it with "
            f"`{PLOTS_INSTALL_HINT}` and run the demo again."
        ) from None
    # Agg: no display needed, and the demo never opens a window. Only switch when pyplot was not already
    # set up by the caller (a notebook keeps its own backend).
    if "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _draw_world(ax: Any) -> None:
    from matplotlib.patches import Circle

    for cx, cy, r in OBSTACLES:
        ax.add_patch(Circle((cx, cy), r, facecolor="#444444", edgecolor="black", alpha=0.85, zorder=3))
    ax.axhline(GOAL_Y, color="#2a9d2a", linestyle="--", linewidth=1.0, zorder=1)
    ax.text(_X_LIMITS[1] - 0.02, GOAL_Y + 0.015, "goal", ha="right", va="bottom", color="#2a9d2a", fontsize=8)
    ax.set_xlim(*_X_LIMITS)
    ax.set_ylim(*_Y_LIMITS)
    ax.set_aspect("equal")
    ax.set_xlabel("x")
    ax.set_ylabel("y")


def _draw_paths(ax: Any, trajectories: Trajectories, title: str) -> None:
    _draw_world(ax)
    # Failures first and underneath, so the routes stay readable on top of them.
    order = sorted(range(len(trajectories)), key=lambda i: int(trajectories.routes[i] >= 0))
    for i in order:
        path = trajectories.paths[i]
        route = int(trajectories.routes[i])
        if route >= 0:
            ax.plot(path[:, 0], path[:, 1], color=_ROUTE_COLOURS[route], linewidth=0.8, alpha=0.55, zorder=2)
        else:
            ax.plot(path[:, 0], path[:, 1], color=_FAILED_COLOUR, linewidth=0.7, alpha=0.6, zorder=2)
            if trajectories.collided[i]:
                ax.plot(path[-1, 0], path[-1, 1], marker="x", color="black", markersize=4, zorder=4)
    counts = trajectories.route_counts()
    handles = []
    from matplotlib.lines import Line2D

    # Legends fill column by column: this order puts the gaps in columns, the L side above the R side.
    for k in (
        side * len(GAPS) + gap for gap in range(len(GAPS)) for side in range(len(MODE_NAMES) // len(GAPS))
    ):
        label = f"{MODE_NAMES[k]} ({counts[k]})"
        handles.append(Line2D([0], [0], color=_ROUTE_COLOURS[k], linewidth=2, label=label))
    failed = int(np.sum(trajectories.routes < 0))
    if failed:
        handles.append(Line2D([0], [0], color=_FAILED_COLOUR, linewidth=2, label=f"failed ({failed})"))
    # Below the axes: inside, any corner covers some route.
    ax.legend(
        handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.12), fontsize=7, ncol=4, frameon=False
    )
    ax.set_title(title, fontsize=10)


def _marker(ax: Any, x: int, y: float, text: str, colour: str, style: str, valign: str) -> None:
    """A vertical line at iteration ``x`` labelled ``text`` at axes height ``y``, the label on the side
    with room (left of lines in the right third of the axis)."""
    ax.axvline(x, color=colour, linestyle=style, linewidth=1.0)
    right = x > ax.get_xlim()[0] + 0.66 * (ax.get_xlim()[1] - ax.get_xlim()[0])
    ax.text(
        x,
        y,
        f"{text} " if right else f" {text}",
        transform=ax.get_xaxis_transform(),
        color=colour,
        fontsize=8,
        ha="right" if right else "left",
        va=valign,
    )


def _draw_loss(ax: Any, curve: Sequence[tuple[int, float]], training: Mapping[str, Any]) -> None:
    points = [(i, loss) for i, loss in curve if math.isfinite(loss) and loss > 0]
    distill = training.get("distillation_from_iteration")
    done = training.get("iterations_done")
    # The trainer announces the phase when it plans it; a run stopped before it never distilled.
    reached = isinstance(distill, int) and not (isinstance(done, int) and done < distill)
    start = distill if reached and isinstance(distill, int) else None
    # From ``start`` on the trainer prints the few-step distillation loss: another objective on another
    # scale, so it is its own series (trainer.commands.report's loss panel, the one ``la-trainer report`` draws).
    series = {
        "flow_matching": [p for p in points if start is None or p[0] < start],
        "distillation": [p for p in points if start is not None and p[0] >= start],
    }
    planned = training.get("iterations_planned")
    draw_loss_panel(ax, series, total=planned if isinstance(planned, int) and planned > 0 else None)
    if start is not None:
        _marker(ax, start, 0.02, "distillation", "#7f7f7f", ":", "bottom")
    stopped = training.get("stopped_early")
    if isinstance(stopped, str) and stopped != "no" and isinstance(done, int):
        _marker(ax, done, 0.98 if start is None else 0.85, f"stopped: {stopped}", "#d62728", "--", "top")


def render_figure(report: DemoReport, path: Path) -> None:
    """Draw the three panels into ``path`` (PNG). Raises :class:`PlottingUnavailable` without matplotlib."""
    plt = _import_pyplot(path.name)
    fig, axes = plt.subplots(1, 3, figsize=_FIGURE_SIZE_IN, gridspec_kw={"width_ratios": [1, 1, 1.15]})
    try:
        _draw_paths(axes[0], report.expert, report.expert_label)
        _draw_paths(axes[1], report.policy, report.policy_label)
        _draw_loss(axes[2], report.loss_curve, report.training)
        fig.suptitle(report.title, fontsize=12)
        fig.tight_layout()
        # "tight" keeps the legends under the trajectory panels inside the image.
        fig.savefig(path, dpi=_FIGURE_DPI, bbox_inches="tight")
    finally:
        plt.close(fig)
