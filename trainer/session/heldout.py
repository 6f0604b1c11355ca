"""The held-out round of the training story: measure the held-out set when due and at the end, write each
measurement to the run record, the trackers and the progress line, keep the best networks.

The measurements themselves (the split, the metrics, the evaluator) are :mod:`trainer.training.heldout`'s;
this is what the story (:mod:`trainer.session.run`) does with them.

A periodic measurement (tens of milliseconds) runs on a thread of its own so that training does not wait
for it: :meth:`HeldOutRound.request` takes a copy of the networks between steps
(:mod:`trainer.training.copies`) and queues it; the thread measures the copy (and exports it, in case it
is the best); :meth:`HeldOutRound.collect`, on the training thread, writes each finished measurement in
order. The numbers are those of the networks at the requested iteration, as when it measured in line.
The last measurement (:meth:`HeldOutRound.at_end`) is taken in line, after the queued ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from trainer.session.background import CopyWorker
from trainer.system.console import log

if TYPE_CHECKING:
    # The story imports the job (and torch with it) only once its link is open (trainer.session.app).
    from protocol.nne.layers import Layer
    from trainer.records.progress import ProgressReporter
    from trainer.records.runrecord import RunLog
    from trainer.training.copies import WeightsCopy
    from trainer.training.heldout import HeldOutMetrics
    from trainer.training.job import TrainingJob
    from trainer.training.model import FlowModel
    from trainer.training.steps import Phase

__all__ = ["HeldOutRound"]

_Result = tuple["HeldOutMetrics", "dict[int, Layer]"]
"""What the measuring thread returns: the metrics and the networks measured."""


def _constant(layers: dict[int, Layer]) -> Callable[[], dict[int, Layer]]:
    return lambda: layers


class HeldOutRound:
    """What :mod:`trainer.session.run` does with the held-out set: measure when due (``heldout_every_iterations``)
    and at the end, write each measurement to the run record and trackers (:meth:`trainer.records.runrecord.
    RunLog.heldout`) and the progress line, keep the networks of the best selection score in memory, and
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
        self._worker: CopyWorker[_Result] | None = None

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
        not the ones sent) or this process trained no step. Queued measurements are written first (after
        a divergence only those up to ``iteration``, the last good one)."""
        self.collect(wait=True, up_to=iteration)
        self.close()
        if not diverged and iteration > self.job.start_iteration:
            self.measure(iteration)
        if self.evaluator is not None and self.last is not None:
            self.runlog.heldout_actions(self.evaluator.actions_record(self.last.iteration))

    def request(self, iteration: int) -> None:
        """Measure the networks of ``iteration`` on the measuring thread (module docstring); written by a
        later :meth:`collect`. Takes a copy of the networks now, between steps: no host read."""
        evaluator = self.evaluator
        if evaluator is None:
            return
        from trainer.training.copies import ShadowModel, exported_layers, take_copy

        if self._worker is None:

            def job(model: FlowModel, weights: WeightsCopy) -> _Result:
                return evaluator.evaluate(model, weights.iteration), exported_layers(model)

            shadow = ShadowModel(self.job.model, self.job.device)
            self._worker = CopyWorker("la-trainer-heldout", shadow, job)
        self._worker.put(take_copy(self.job.model, iteration, self.job.phase))

    def collect(self, *, wait: bool = False, up_to: int | None = None) -> None:
        """Write the measurements the thread finished, in order (``wait``: after every queued one; ``up_to``:
        drop those of later iterations). Cheap when there are none; raises what failed on the thread."""
        worker = self._worker
        if worker is None:
            return
        if wait:
            worker.drain()
        worker.check()
        while worker.results:
            weights, (metrics, layers) = worker.results.popleft()
            if up_to is None or metrics.iteration <= up_to:
                self._record(metrics, weights.phase, _constant(layers))

    def close(self) -> None:
        """End the measuring thread (after :meth:`collect` with ``wait``; queued copies are dropped)."""
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.close()

    def measure(self, iteration: int) -> HeldOutMetrics | None:
        """Measure the networks of ``iteration`` now, on this thread (once per iteration); None when
        nothing is held out."""
        if self.evaluator is None:
            return None
        if self.last is not None and self.last.iteration == iteration:
            return self.last
        metrics = self.evaluator.evaluate(self.job.model, iteration)
        self._record(metrics, self.job.phase, self.job.export)  # the networks as they would be sent now
        return metrics

    def _record(
        self, metrics: HeldOutMetrics, phase: Phase | None, layers: Callable[[], dict[int, Layer]]
    ) -> None:
        """Best (per phase), run record, trackers and the progress line's note for one measurement."""
        if phase is not self.best_phase:
            # Distillation (ode_steps > 0) trains another objective for the few-step sampler: its networks
            # compete among themselves, never with the flow-matching ones before the boundary.
            self.best, self.best_layers, self.best_phase = None, None, phase
        # The selection score, not the flow loss: the flow loss of a run whose recipe changed during the
        # pilot (trainer.training.recipes) is on another scale before and after the change.
        improved = self.best is None or metrics.selection.score > self.best.selection.score
        if improved:
            self.best = metrics
            self.best_layers = layers()
        self.last = metrics
        self.runlog.heldout(metrics.iteration, metrics.record(), metrics.tracker_values(), best=improved)
        self.reporter.heldout(
            metrics.iteration,
            metrics.selection.score,
            metrics.flow_loss,
            metrics.energy_score,
            metrics.coverage,
            note=metrics.short(),
        )

    def keep_best(self, encode: Callable[[dict[int, Layer]], dict[int, bytes]]) -> None:
        """Keep the best measurement's networks in the run record (``Networks/best``) when they are not
        the ones sent: a user can take them without running again. ``encode``: layers to snapshot bytes."""
        best = self.best
        if best is None or self.best_layers is None or best is self.last or self.sent_best:
            return
        paths = self.runlog.best_networks(encode(self.best_layers))
        if paths:
            log(
                f"la-trainer: the networks of the best held-out selection score (iteration {best.iteration}, "
                f"{best.selection.score:.4f}) are in {paths[0].parent}"
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
            f"selection score {best.selection.score:.4f}; the last, iteration "
            f"{final.iteration if final else '?'}, {final.selection.score if final else math.nan:.4f})"
        )
        return self.best_layers
