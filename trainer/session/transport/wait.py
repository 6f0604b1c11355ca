"""One polling loop for every wait on the engine: timeout, peer liveness, stop, keep-alive hooks.

The engine polls its control block every 1 ms (spec §2.4) and answers a socket within a tick, so most
of our waits end within a few milliseconds. The loop therefore spins (yielding the CPU with
``sleep(0)``) for a short while before falling back to ``poll_interval`` sleeps: hand-offs that are
already under way cost microseconds, and a long wait (the user still has to start the game) costs one
wake-up per ``poll_interval``. A transport that can block on readiness instead (a socket) passes
``idle``, which replaces both the spin and the sleep.

Each poll runs, in this order: ``on_poll`` (e.g. drain decoded messages), the predicate, ``stop``,
``check`` (conditions only the caller can see, e.g. a socket's EOF), ``interrupted``, the deadline
(asking ``peer_alive`` first: a vanished peer explains a timeout better than the timeout itself), the
periodic ``peer_alive`` check, the long-wait ``notice``, then ``idle`` or a sleep.

Bounds (:mod:`trainer.settings.timeouts`): ``timeout`` is ``math.inf`` where the caller can see that the game is
alive (``peer_alive``), so a paused editor is waited for as long as it runs; the caller's ``notice`` says
in the log that a wait is long (the game may be paused) at ``notice_after`` seconds and then at doubling
intervals.

Where the engine's liveness comes from (the parent process, on POSIX and Windows) is
:mod:`trainer.system.liveness`.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from trainer.errors import Interrupted, PeerGone, TrainerError, WaitTimeout
from trainer.exitcodes import ExitCode
from trainer.settings.timeouts import WAIT_ADVICE, Timeouts
from trainer.system.console import log

__all__ = [
    "BACKGROUND_POLL_S",
    "SPIN_SECONDS",
    "TIMEOUT_HINT",
    "StopRequested",
    "WaitRule",
    "after_grace",
    "background_waits",
    "wait_until",
]

T = TypeVar("T")

SPIN_SECONDS = 0.002
"""How long a wait yields without sleeping before it sleeps ``poll_interval`` between polls (seconds)."""

BACKGROUND_POLL_S = 0.001
"""Seconds between polls of a wait in the background (:func:`background_waits`): no spin, and a poll per
millisecond instead of per 0.5 ms, as the engine polls (spec §2.4). Training goes on beside such a wait on
the same cores, so it must not spin; and once the game took network *i* of a round it blocks in
ReceiveNetwork(*i + 1*) until the next is posted, so the poll must stay short: a slower one would stall
the game's frame by up to its period, once per network."""

_LOCAL = threading.local()


@contextmanager
def background_waits() -> Iterator[None]:
    """Within the block, this thread's waits poll at :data:`BACKGROUND_POLL_S` without spinning: for the
    thread that sends sync rounds while training runs (:mod:`trainer.session.sender`), whose spin would
    take the CPU (and the interpreter lock) from the training thread for nothing."""
    previous = getattr(_LOCAL, "background", False)
    _LOCAL.background = True
    try:
        yield
    finally:
        _LOCAL.background = previous


TIMEOUT_HINT = (
    "Check that the game is running and that it uses the same transport settings "
    "(GUID, address, port), or raise the timeout."
)
"""What a :class:`WaitTimeout` suggests by default (a wait that may be waiting on a misconfigured game)."""


class StopRequested(TrainerError):
    """The engine asked the trainer to stop (control [6] or socket byte 6) while we were waiting.

    Not a failure: the engine ends training this way (``EndTraining``, spec §2.4, §3), so it maps to
    exit code 0. The caller finishes what it is doing and returns.
    """

    exit_code = ExitCode.OK


def after_grace(interrupted: Callable[[], bool] | None, grace: float) -> Callable[[], bool] | None:
    """``interrupted`` that answers True only once it has been True for ``grace`` seconds.

    For waits that should normally finish after a signal (a send in the middle of a round: the engine
    would be left blocked in ReceiveNetwork) but must not outlive it: a game that never takes the
    network (paused, stuck) would otherwise keep a SIGTERMed trainer alive for ever.
    """
    if interrupted is None:
        return None
    seen_at: list[float] = []

    def late() -> bool:
        if not interrupted():
            return False
        now = time.monotonic()
        if not seen_at:
            seen_at.append(now)
        return now - seen_at[0] >= grace

    return late


class WaitRule:
    """The bound of every wait of one link, and what the log says about it (:mod:`trainer.settings.timeouts`).

    ``visible``: the link can see whether the game is alive, so its waits have no bound. Otherwise each
    wait is bounded by ``timeouts.wait``; the first such wait announces the bound and how to change it,
    and a timeout says the same (``why_unseen`` says why liveness cannot be seen, e.g. "attach mode").
    Either way a wait that lasts ``timeouts.notice_after`` seconds says so (the game may be paused).
    ``serving``: a server's wait for its next game, which has no bound whatever ``timeouts.wait`` says
    (its long-wait line says so, instead of advising ``--wait``, which does not apply to it).
    """

    def __init__(
        self,
        timeouts: Timeouts,
        *,
        visible: bool,
        why_unseen: str = "",
        output: Callable[[str], None] = log,
        serving: bool = False,
    ) -> None:
        self.timeouts = timeouts
        self.visible = visible
        self.why_unseen = why_unseen
        self.serving = serving
        self._say = output
        self._announced = False

    @property
    def bound(self) -> float:
        """Seconds a wait may last: ``math.inf`` where the game's liveness is visible, and for a server."""
        return math.inf if self.serving else self.timeouts.bound(self.visible)

    def start(self, what: str) -> float:
        """The bound of a wait for ``what`` that starts now, announced if it is the link's first bounded one."""
        bound = self.bound
        if not self._announced and math.isfinite(bound):
            self._announced = True
            self._say(
                f"la-trainer: waiting up to {bound:g} s for {what} ({self.why_unseen}: nothing shows whether "
                f"the game is alive); {WAIT_ADVICE}."
            )
        return bound

    @property
    def hint(self) -> str:
        """The advice a timeout message ends with."""
        return f"{self.why_unseen[:1].upper()}{self.why_unseen[1:]}: nothing shows whether the game is alive; {WAIT_ADVICE}"

    def notice(self, what: str) -> Callable[[float], None]:
        """The long-wait line for ``what`` (wait_until's ``notice``)."""
        bound = self.bound

        def notice(elapsed: float) -> None:
            if self.serving:
                tail = (
                    "a server waits for its next game without a bound (SIGINT/SIGTERM stop it; --wait bounds "
                    "only a --once trainer's wait)"
                )
            elif math.isinf(bound):
                tail = (
                    "the game is alive (paused, or loading?), so the trainer waits for as long as it runs"
                    if self.visible
                    else f"no bound is set ({WAIT_ADVICE})"
                )
            else:
                tail = f"the trainer gives up after {bound:g} s; {WAIT_ADVICE}"
            self._say(f"la-trainer: still waiting for {what} after {elapsed:.0f} s; {tail}.")

        return notice


def wait_until(
    predicate: Callable[[], T | None],
    *,
    timeout: float,
    what: str,
    poll_interval: float,
    peer_alive: Callable[[], bool] | None = None,
    on_poll: Callable[[], None] | None = None,
    stop: Callable[[], bool] | None = None,
    peer_check_interval: float = 0.5,
    interrupted: Callable[[], bool] | None = None,
    check: Callable[[str], None] | None = None,
    idle: Callable[[float], object] | None = None,
    timeout_hint: str = TIMEOUT_HINT,
    notice: Callable[[float], None] | None = None,
    notice_after: float = math.inf,
) -> T:
    """Poll ``predicate`` until it returns a truthy value and return that value.

    Args:
        predicate: called once per poll; its first truthy result is returned.
        timeout: seconds before :class:`WaitTimeout` (``what`` is named in the message); ``math.inf``
            for none (the caller watches ``peer_alive``).
        what: a phrase completing "waiting for ...", e.g. ``"network 0 from the engine"``.
        poll_interval: seconds slept between polls once the initial spin is over (with ``idle``: the
            longest single ``idle`` call).
        peer_alive: checked every ``peer_check_interval`` seconds (and once before timing out); a
            ``False`` raises :class:`PeerGone`. Checked at a slower cadence because it may cost a
            system call (``shm_open``, ``getppid``).
        on_poll: called on every poll before the predicate (e.g. to drain a socket).
        stop: called on every poll; ``True`` raises :class:`StopRequested`.
        peer_check_interval: seconds between ``peer_alive`` checks.
        interrupted: called on every poll; ``True`` (SIGINT/SIGTERM arrived) raises :class:`Interrupted`.
        check: called with ``what`` on every poll after ``stop``; raises to end the wait on a condition
            only the caller can see, with its own error (the socket link: a decoded Stop, an EOF).
        idle: called with the seconds left until the next poll is due, instead of spinning and
            sleeping; it may return early once there is something to poll for (a readable socket).
        timeout_hint: the sentence appended to the timeout message (empty: none).
        notice: called with the seconds waited so far once the wait has lasted ``notice_after`` seconds,
            then again each time that doubles (a log line: the game may be paused).
        notice_after: seconds before the first ``notice``.
    """
    start = time.monotonic()
    deadline = start + timeout
    spin_until = start + SPIN_SECONDS
    if getattr(_LOCAL, "background", False):
        spin_until = start
        poll_interval = max(poll_interval, BACKGROUND_POLL_S)
    next_peer_check = start + peer_check_interval
    next_notice = start + notice_after
    while True:
        if on_poll is not None:
            on_poll()
        result = predicate()
        if result:
            return result
        if stop is not None and stop():
            raise StopRequested(f"the engine asked the trainer to stop while it was waiting for {what}")
        if check is not None:
            check(what)
        if interrupted is not None and interrupted():
            raise Interrupted(f"interrupted while waiting for {what}")
        now = time.monotonic()
        if now >= deadline:
            if peer_alive is not None:
                _check_peer(peer_alive, what)
            raise WaitTimeout(
                f"timed out after {timeout:g} s waiting for {what}"
                + (f". {timeout_hint}" if timeout_hint else "")
            )
        if peer_alive is not None and now >= next_peer_check:
            _check_peer(peer_alive, what)
            next_peer_check = now + peer_check_interval
        if notice is not None and now >= next_notice:
            notice(now - start)
            next_notice = start + 2.0 * (now - start)
        if idle is not None:
            idle(min(poll_interval, deadline - now))
        elif now < spin_until:
            time.sleep(0)
        else:
            time.sleep(min(poll_interval, max(deadline - now, 0.0)))


def _check_peer(peer_alive: Callable[[], bool], what: str) -> None:
    if not peer_alive():
        raise PeerGone(f"the engine went away while waiting for {what}")
