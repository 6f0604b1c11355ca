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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from emulator.tasks import Demonstrations
from emulator.tasks.avoid import ACT_DIM, GAPS, GOAL_Y, MAX_SPEED, MODE_NAMES, OBSTACLES, Rollouts, rollout
from trainer.commands.report import PLOTS_INSTALL_HINT, draw_loss_panel, plots_advice

__all__ = ["PLOTS_INSTALL_HINT", "FigureSource", "PlottingUnavailable", "Trajectories", "render_figure"]

FloatArray = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True, eq=False)
class Trajectories:
    """Episodes to draw, in world units.

    ``paths[i]``: float32 ``(T_i + 1, 2)`` positions from the start to the final position;
    ``routes[i]``: the route (mode index into :data:`MODE_NAMES`) of a successful episode, −1 otherwise;
    ``collided[i]``: the episode ended on an obstacle.
    """

    paths: tuple[FloatArray, ...]
    routes: npt.NDArray[np.int64]
    collided: npt.NDArray[np.bool_]

    def __post_init__(self) -> None:
        n = len(self.paths)
        if self.routes.shape != (n,) or self.collided.shape != (n,):
            raise ValueError(
                f"{n} paths but routes {self.routes.shape} and collided {self.collided.shape} (expected ({n},))"
            )
        for i, path in enumerate(self.paths):
            if path.ndim != 2 or path.shape[1] != 2 or path.shape[0] < 1:
                raise ValueError(f"path {i} has shape {path.shape}, expected (T + 1, 2)")

    def __len__(self) -> int:
        return len(self.paths)

    @classmethod
    def from_rollouts(cls, result: Rollouts, limit: int | None = None) -> Trajectories:
        """Recorded rollouts (``rollout(..., record=True)``), the first ``limit`` of them: each agent's
        observed positions plus the position its last action led to."""
        n = len(result.observations)
        if n == 0:
            raise ValueError("the rollouts were not recorded (rollout(..., record=True))")
        count = n if limit is None else min(limit, n)
        paths = []
        for obs, act in zip(result.observations[:count], result.actions[:count], strict=True):
            final = obs[-1] + np.float32(MAX_SPEED) * act[-1]
            paths.append(np.vstack([obs, final[None, :]]).astype(np.float32))
        ok = result.success & (result.side >= 0) & (result.gap >= 0)
        routes = np.where(ok, result.side.astype(np.int64) * len(GAPS) + result.gap, -1).astype(np.int64)
        return cls(tuple(paths), routes[:count], result.collided[:count].copy())

    @classmethod
    def from_demonstrations(cls, demos: Demonstrations) -> Trajectories:
        """Recorded expert episodes with their routes.

        Demonstrations do not store their route, so each episode's actions are replayed open loop through
        the same world (:func:`emulator.tasks.avoid.rollout`) from its first observation: the
        task's own crossing rules classify it, rather than a second copy of them here.
        """
        longest = max(int(obs.shape[0]) for obs, _ in demos.episodes)
        actions = np.zeros((demos.episode_num, longest, ACT_DIM), np.float32)
        for i, (_, act) in enumerate(demos.episodes):
            actions[i, : act.shape[0]] = act
        starts = np.stack([obs[0] for obs, _ in demos.episodes]).astype(np.float64)
        step = 0

        def replay(idx: npt.NDArray[np.intp], obs: FloatArray) -> FloatArray:
            # Every live agent is on the same step: rollout advances them in lockstep.
            nonlocal step
            chunk: FloatArray = actions[idx, min(step, longest - 1)]
            step += 1
            return chunk

        return cls.from_rollouts(rollout(replay, starts, record=True))

    def route_counts(self) -> npt.NDArray[np.int64]:
        """How many episodes took each route, ``(len(MODE_NAMES),)``."""
        ok = self.routes[self.routes >= 0]
        counts: npt.NDArray[np.int64] = np.bincount(ok, minlength=len(MODE_NAMES)).astype(np.int64)
        return counts


class FigureSource(Protocol):
    """What the figure shows (:class:`emulator.demo.report.DemoReport` is one): the two trajectory
    panels with their titles, the loss curve with the training facts, and the title."""

    @property
    def expert(self) -> Trajectories: ...
    @property
    def expert_label(self) -> str: ...
    @property
    def policy(self) -> Trajectories: ...
    @property
    def policy_label(self) -> str: ...
    @property
    def loss_curve(self) -> Sequence[tuple[int, float]]: ...
    @property
    def training(self) -> Mapping[str, Any]: ...
    @property
    def title(self) -> str: ...


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
        raise PlottingUnavailable(f"{file_name} was not drawn: {plots_advice()}.") from None
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


def render_figure(report: FigureSource, path: Path) -> None:
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
