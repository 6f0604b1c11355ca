"""Sync rounds from a thread of their own: training never waits for the game to take a network.

The engine takes a round of networks 0, 1, 2 when its game ticks (spec §7.1), and over shared memory the
trainer may write network *i + 1* only once the game took network *i* (§2.4): a slow game frame, a level
load or a paused editor (§11 item 6) would stop a trainer that sent its rounds itself. So the training
loop only takes a copy of the weights (:func:`trainer.training.copies.take_copy`) and hands it to a
:class:`NetworkSender`; its thread exports the copy, encodes the snapshots and sends the round through
:class:`trainer.session.run.SyncRounds`, one whole round at a time.

Rules (the protocol's, and what keeps a round consistent):

* **A round is never broken up**: the three networks of a round come from one copy and go out in order
  0, 1, 2 with one version (a game that took network 0 expects 1 and 2 within its timeout, §7.1).
* **The newest copy wins**: at most one copy waits behind the round in flight. A newer copy replaces it
  when the game is late, i.e. when the round in flight has waited on the link for :data:`LATE_S` or more:
  the older copy was not taken in time and is dropped (counted in :attr:`NetworkSender.dropped`). While
  the sender is merely busy (exporting, encoding: milliseconds of CPU), the loop waits for it to pick the
  waiting copy up instead, so a game that keeps up gets every round, in order, as before.
* **Versions count the rounds sent** (1, 2, 3, ...; the socket's NetworksVersion, §3): a dropped copy
  takes no number, so the game sees the same sequence as from a trainer that sends every round.
* **The end is the story's**: :meth:`NetworkSender.close` lets the last copy go out as an offer would (or
  drops it for a late game) and waits for the round in flight (each of its waits bounded as every send's:
  Stop, the game's death and a signal's grace end it); then the story sends the final round and
  Complete itself, in that order (§7.1, §2.4).
* **Stop**: the loop sees it (its poll between steps, and the waits of a round in flight); no round starts
  after that. A round offered before a Stop arrived may still start before the loop saw it, as a round
  sent between a poll and a Stop did before: the engine reads nothing after its EndTraining (§2.4).
* **Failures surface on the training thread**: the game going away or a timeout during a round is kept
  and raised by :meth:`NetworkSender.check`, which the loop calls every iteration; a Stop seen while
  the round waited ends the sender quietly (the link reports it to the loop as well).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING

from trainer.session.transport.wait import StopRequested, background_waits

if TYPE_CHECKING:
    from trainer.training.copies import WeightsCopy

__all__ = ["LATE_S", "NetworkSender"]

LATE_S = 0.02
"""Seconds a round in flight must have waited on the link before a newer copy replaces the waiting one:
longer than a game that keeps up needs for a round (it polls every millisecond, §2.4; a few ticks), far
shorter than a slow frame or a pause."""


class NetworkSender:
    """Sends sync rounds from a daemon thread (module docstring).

    ``encode``: a copy of the weights → the round's snapshot bytes by network id (runs on the sender's
    thread: the export and the encoding). ``send``: one whole round (:meth:`SyncRounds.send`; it numbers
    the versions). Use as a context manager or call :meth:`close`."""

    def __init__(
        self,
        encode: Callable[[WeightsCopy], Mapping[int, bytes]],
        send: Callable[[Mapping[int, bytes]], None],
        *,
        late_s: float = LATE_S,
    ) -> None:
        self._encode = encode
        self._send = send
        self.late_s = late_s
        self._cond = threading.Condition()
        self._waiting: WeightsCopy | None = None
        self._sending_since: float | None = None
        """``time.monotonic()`` when the round in flight started waiting on the link (None: not there)."""
        self._closing = False
        self._in_flight = False
        self._error: BaseException | None = None
        self.stopped = False
        """A Stop arrived while a round waited on the game (the round was not finished)."""
        self.sent = 0
        """Copies sent as rounds."""
        self.dropped = 0
        """Copies replaced by a newer one before the game could take them."""
        self.sent_iterations: list[int] = []
        """The iteration of each copy sent, in order (for the run's log and tests)."""
        self._thread = threading.Thread(target=self._run, name="la-trainer-sender", daemon=True)
        self._thread.start()

    # -- the training thread -----------------------------------------------------------------------------

    def offer(self, weights: WeightsCopy) -> None:
        """The networks of a new iteration: sent next, after the round in flight (module docstring)."""
        with self._cond:
            self._wait_for_pickup()
            if self._finished():
                return
            if self._waiting is not None:
                self.dropped += 1
            self._waiting = weights
            self._cond.notify_all()

    def _wait_for_pickup(self) -> None:
        """(Lock held.) While a copy waits and the sender is only busy (CPU work, or a round that has
        not waited on the game for :attr:`late_s` yet), wait for the sender to take it up."""
        while self._waiting is not None and not self._finished() and not self._late():
            remaining = None
            if self._sending_since is not None:
                remaining = max(self.late_s - (time.monotonic() - self._sending_since), 0.0) + 1e-4
            self._cond.wait(remaining)

    @property
    def busy(self) -> bool:
        """A copy is waiting or a round is in flight (and the thread still runs)."""
        with self._cond:
            return not self._finished() and (self._waiting is not None or self._in_flight)

    def check(self) -> None:
        """Raise, on the calling (training) thread, what ended the sender's thread: the game gone or a
        timeout during a round. Cheap; call it every iteration."""
        error = self.take_error()
        if error is not None:
            raise error

    def take_error(self) -> BaseException | None:
        """What ended the sender's thread, if anything (once)."""
        error, self._error = self._error, None
        return error

    def close(self, *, drop: bool = False) -> None:
        """Let the sender take up the waiting copy unless the game is late or ``drop`` (a Stop, a signal:
        then it is dropped), and wait for the round in flight to end (bounded by the link's own rules);
        the thread ends. Idempotent. A failure is kept for :meth:`check`."""
        with self._cond:
            if not drop:
                self._wait_for_pickup()  # a game that keeps up gets the copy offered last, as before
            if self._waiting is not None:
                self.dropped += 1
            self._closing = True
            self._waiting = None
            self._cond.notify_all()
        self._thread.join()

    def __enter__(self) -> NetworkSender:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- the sender's thread -----------------------------------------------------------------------------

    def _finished(self) -> bool:
        return self._closing or self.stopped or self._error is not None or not self._thread.is_alive()

    def _late(self) -> bool:
        since = self._sending_since
        return since is not None and time.monotonic() - since >= self.late_s

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._waiting is None and not self._closing:
                    self._cond.wait()
                weights, self._waiting = self._waiting, None
                if self._closing or weights is None:
                    return
                self._in_flight = True
                self._cond.notify_all()  # an offer waiting for the pick-up may go on
            try:
                blobs = self._encode(weights)
                with self._cond:
                    self._sending_since = time.monotonic()
                    self._cond.notify_all()
                with background_waits():  # no spin: the training thread needs the cores
                    self._send(blobs)
            except StopRequested:
                self.stopped = True
                return
            except BaseException as error:  # PeerGone, WaitTimeout, Interrupted; a bug must not vanish
                self._error = error
                return
            else:
                self.sent += 1
                self.sent_iterations.append(weights.iteration)
            finally:
                with self._cond:
                    self._sending_since = None
                    self._in_flight = False
                    self._cond.notify_all()
