"""The held-out round of the training story: measure the held-out set when due and at the end, write each
measurement to the run record, the trackers and the progress line, keep the best networks.

The measurements themselves (the split, the metrics, the evaluator) are :mod:`trainer.training.heldout`'s;
this is what the story (:mod:`trainer.session.run`) does with them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from trainer.system.console import log

if TYPE_CHECKING:
    # The story imports the job (and torch with it) only once its link is open (trainer.session.app).
    from protocol.nne.layers import Layer
    from trainer.records.progress import ProgressReporter
    from trainer.records.runrecord import RunLog
    from trainer.training.heldout import HeldOutMetrics
    from trainer.training.job import TrainingJob
    from trainer.training.steps import Phase

__all__ = ["HeldOutRound"]


class HeldOutRound:
    """What :mod:`trainer.session.run` does with the held-out set: measure when due (``heldout_every_iterations``)
    and at the end, write each measurement to the run record and trackers (:meth:`trainer.records.runrecord.
    RunLog.heldout`) and the progress line, keep the networks of the best flow loss in memory, and
    hand them out at the end when ``heldout_send_best`` is on. A no-op when nothing is held out."""

    def __init__(self, job: TrainingJob, runlog: RunLog, reporter: ProgressReporter) -> None:
        self.job = job
        self.evaluator = job.heldout
        self.runlog = runlog
        self.reporter = reporter
        self.every = job.options.heldout_every_iterations
        self.send_best = job.options.heldout_send_best
        self.best: HeldOutMetrics | None = None
        self.best_phase: Phase | None = None
        self.best_layers: dict[int, Layer] | None = None
        self.last: HeldOutMetrics | None = None
        self.sent_best = False

    def due(self, iteration: int) -> bool:
        """A periodic measurement is due after ``iteration`` steps (the last one is :meth:`at_end`'s)."""
        return (
            self.evaluator is not None
            and self.every > 0
            and iteration % self.every == 0
            and iteration < self.job.total_iterations
        )

    def at_end(self, iteration: int, *, diverged: bool) -> None:
        """The last networks' numbers, whichever way the loop ended, unless it diverged (those weights are
        not the ones sent) or this process trained no step."""
        if not diverged and iteration > self.job.start_iteration:
            self.measure(iteration)
        if self.evaluator is not None and self.last is not None:
            self.runlog.heldout_actions(self.evaluator.actions_record(self.last.iteration))

    def measure(self, iteration: int) -> HeldOutMetrics | None:
        """Measure the networks of ``iteration`` (once per iteration); None when nothing is held out."""
        if self.evaluator is None:
            return None
        if self.last is not None and self.last.iteration == iteration:
            return self.last
        metrics = self.evaluator.evaluate(self.job.model, iteration)
        if self.job.phase is not self.best_phase:
            # Distillation (ode_steps > 0) trains another objective for the few-step sampler: its networks
            # compete among themselves, never with the flow-matching ones before the boundary.
            self.best, self.best_layers, self.best_phase = None, None, self.job.phase
        improved = self.best is None or metrics.flow_loss < self.best.flow_loss
        if improved:
            self.best = metrics
            self.best_layers = self.job.export()  # the networks as they would be sent now
        self.last = metrics
        self.runlog.heldout(iteration, metrics.record(), metrics.tracker_values(), best=improved)
        self.reporter.heldout(
            iteration, metrics.flow_loss, metrics.energy_score, metrics.coverage, note=metrics.short()
        )
        return metrics

    def keep_best(self, encode: Callable[[dict[int, Layer]], dict[int, bytes]]) -> None:
        """Keep the best measurement's networks in the run record (``Networks/best``) when they are not
        the ones sent: a user can take them without running again. ``encode``: layers to snapshot bytes."""
        best = self.best
        if best is None or self.best_layers is None or best is self.last or self.sent_best:
            return
        paths = self.runlog.best_networks(encode(self.best_layers))
        if paths:
            log(
                f"la-trainer: the networks of the lowest held-out flow loss (iteration {best.iteration}, "
                f"{best.flow_loss:.4f}) are in {paths[0].parent}"
            )

    def final_networks(self, last: dict[int, Layer]) -> dict[int, Layer]:
        """``last``, or with ``heldout_send_best`` the networks of the best measurement when an earlier
        one scored better than the last."""
        best, final = self.best, self.last
        if not self.send_best or best is None or self.best_layers is None or best is final:
            return last
        self.sent_best = True
        log(
            f"la-trainer: heldout_send_best: sending the networks of iteration {best.iteration} (held-out "
            f"flow loss {best.flow_loss:.4f}; the last, iteration "
            f"{final.iteration if final else '?'}, {final.flow_loss if final else math.nan:.4f})"
        )
        return self.best_layers
