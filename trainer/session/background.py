"""Work on copies of the weights, in order, on a thread of its own: the held-out measurement and the
snapshot files, which the training loop must not wait for.

The loop takes a :class:`~trainer.training.copies.WeightsCopy` between steps (no host read) and puts it
with a job; the worker loads each copy into its :class:`~trainer.training.copies.ShadowModel` and runs the
job on the shadow, first in, first out, none dropped (unlike sync rounds, :mod:`trainer.session.sender`:
every snapshot file and every measurement is wanted). Results come back through :attr:`CopyWorker.results`
and a failure through :meth:`CopyWorker.check`, both read on the training thread.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from trainer.training.copies import ShadowModel, WeightsCopy
    from trainer.training.model import FlowModel

__all__ = ["CopyWorker"]

R = TypeVar("R")


class CopyWorker(Generic[R]):
    """A daemon thread running ``job(shadow model, copy)`` for each copy put, in order (module docstring).
    ``name``: the thread's name. Build it on the training thread (the shadow copies the model there).
    ``keep_results``: False when nobody reads :attr:`results` (the snapshot files): each result would keep
    its copy of the weights alive for the rest of the run."""

    def __init__(
        self,
        name: str,
        shadow: ShadowModel,
        job: Callable[[FlowModel, WeightsCopy], R],
        *,
        keep_results: bool = True,
    ) -> None:
        self.shadow = shadow
        self.job = job
        self.keep_results = keep_results
        self.results: deque[tuple[WeightsCopy, R]] = deque()
        """Finished jobs, in order (the training thread pops them); empty without ``keep_results``."""
        self._error: BaseException | None = None
        self._pending = 0
        self._queue: queue.Queue[WeightsCopy | None] = queue.Queue()
        self._idle = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, weights: WeightsCopy) -> None:
        """Queue a copy (the training thread; returns at once)."""
        with self._idle:
            self._pending += 1
        self._queue.put(weights)

    def check(self) -> None:
        """Raise what failed on the thread (once). Cheap; call it every iteration."""
        error = self._error
        if error is not None:
            self._error = None
            raise error

    def drain(self) -> None:
        """Wait until every queued copy is done (or the thread failed)."""
        with self._idle:
            while self._pending and self._error is None and self._thread.is_alive():
                self._idle.wait()

    def close(self) -> None:
        """End the thread after the copies already queued. Idempotent."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def _run(self) -> None:
        while True:
            weights = self._queue.get()
            if weights is None:
                return
            try:
                result = self.job(self.shadow.load(weights), weights)
                if self.keep_results:
                    self.results.append((weights, result))
            except BaseException as error:  # the training thread raises it (check)
                self._error = error
            with self._idle:
                self._pending -= 1
                self._idle.notify_all()
            if self._error is not None:
                return
