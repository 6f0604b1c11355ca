"""Metrics points whose loss is still on the device: taken every ``TRACK_EVERY`` iterations without a host
read, written together.

The training loop reads the device only when someone looks (:meth:`trainer.training.job.TrainingJob.
settle`): a progress line, or a batch of metrics points. A point is taken at its iteration (the smoothed
loss as a 0-d device tensor, :meth:`~trainer.training.job.TrainingJob.loss_probe`, with the iteration's
clock, learning rate and sync rounds), and :meth:`PendingPoints.flush` reads the losses of every pending
point in one host read and writes them to the run record and the trackers, each with its own iteration
and time: the same lines, written a little later (every :data:`FLUSH_EVERY` points, when a progress line
is due, and at the end).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from trainer.records.runrecord import RunLog

__all__ = ["FLUSH_EVERY", "PendingPoints"]

FLUSH_EVERY = 10
"""Points taken before they are read and written (with ``TRACK_EVERY`` = 100: one read per 1,000
iterations)."""


@dataclass(frozen=True, slots=True)
class _Point:
    iteration: int
    phase: str
    loss: torch.Tensor | float
    learning_rate: float
    sync_rounds: int
    when: float


class PendingPoints:
    """Points taken and not yet written (module docstring)."""

    def __init__(self, runlog: RunLog, flush_every: int = FLUSH_EVERY) -> None:
        self.runlog = runlog
        self.flush_every = flush_every
        self._points: list[_Point] = []

    def __len__(self) -> int:
        return len(self._points)

    def add(
        self, iteration: int, phase: str, loss: torch.Tensor | float, learning_rate: float, sync_rounds: int
    ) -> None:
        """Take a point now (no host read). The loop writes the batch once it is :attr:`flush_every` long,
        after it read the steps (``TrainingJob.settle``): a divergence found then drops the points of the
        steps it skipped (:meth:`flush` ``up_to``) instead of writing their non-finite losses."""
        self._points.append(_Point(iteration, phase, loss, learning_rate, sync_rounds, time.perf_counter()))

    def flush(self, up_to: int | None = None) -> None:
        """Read the pending losses (one host read) and write the points in order; ``up_to``: drop the
        points of later iterations (a run that diverged keeps those of its good iterations)."""
        points, self._points = self._points, []
        if up_to is not None:
            points = [p for p in points if p.iteration <= up_to]
        on_device = [p.loss for p in points if isinstance(p.loss, torch.Tensor)]
        values = iter(torch.stack(on_device).tolist() if on_device else [])
        for point in points:
            loss = next(values) if isinstance(point.loss, torch.Tensor) else point.loss
            self.runlog.point(
                point.iteration,
                point.phase,
                loss,
                point.learning_rate,
                point.sync_rounds,
                when=point.when,
            )
