"""What one rank shares between its main thread, its links and its watchdog, and its view of the job."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from trainer.distributed.environment import DEFAULT_AGREE_EVERY, DistEnv
from trainer.distributed.errors import RankLost, first_line
from trainer.distributed.frames import RankChannel
from trainer.exitcodes import ExitCode
from trainer.settings.timeouts import Timeouts

if TYPE_CHECKING:
    from trainer.training.job import TrainingJob

__all__ = ["PEER_GRACE_S", "ConsensusInterrupt", "FinishingLink", "RankContext", "RunState"]

PEER_GRACE_S = 1.0
"""How long a published failure of another rank waits for the main thread to notice it by itself."""


class FinishingLink(Protocol):
    """What the watchdog needs from rank 0's link to end a stuck run (:class:`trainer.distributed.links.
    Rank0Link`)."""

    def emergency_complete(self, job: TrainingJob) -> None: ...


@dataclass
class RunState:
    """What the main thread, the links and the watchdog share. ``lock`` guards the step/finish hand-off."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    in_step: bool = False
    step_started: float = 0.0
    iterations_done: int = 0
    finishing: bool = False
    """The watchdog took over the ending; the main thread must not touch the link any more."""
    game_stop: bool = False
    interrupted: bool = False
    lost: str = ""
    lost_code: int = int(ExitCode.PEER_GONE)
    failure_published: bool = False
    job: TrainingJob | None = None
    """Rank 0's job (:class:`trainer.distributed.job.DistributedTrainingJob`), for the watchdog."""
    link: FinishingLink | None = None
    """Rank 0's link (:class:`trainer.distributed.links.Rank0Link`), for the watchdog."""

    @contextlib.contextmanager
    def stepping(self) -> Iterator[None]:
        with self.lock:
            self.in_step = True
            self.step_started = time.monotonic()
        try:
            yield
        finally:
            with self.lock:
                self.in_step = False
                claimed = self.finishing
            if claimed:
                threading.Event().wait()  # the watchdog is ending the process (os._exit)


class ConsensusInterrupt:
    """The loop's interrupt flag on every rank: set only when the ranks agreed (after a step)."""

    def __init__(self, state: RunState) -> None:
        self._state = state

    def is_set(self) -> bool:
        return self._state.interrupted


@dataclass
class RankContext:
    """One rank's view of the job: who it is, how it talks to the others, what it shares."""

    env: DistEnv
    channel: RankChannel
    state: RunState = field(default_factory=RunState)
    store: Any = None
    """The rendezvous store (c10d ``Store``) for published failures; None in tests without one."""
    local_interrupt: Callable[[], bool] = lambda: False
    agree_every: int = DEFAULT_AGREE_EVERY
    """Steps between agreements (stop, interrupt, rank 0's link failure, loss): a Stop or a signal is
    acted on within this many steps; one all-reduce per step would double the collectives."""
    poll_game: Callable[[], bool] | None = None
    """Rank 0: the real link's ``stop_requested`` (may raise when the game is gone)."""
    timeouts: Timeouts = field(default_factory=Timeouts)
    """The run's waits (``Timeouts.from_env()`` in :func:`trainer.distributed.rank.run_rank`): the
    keep-alive period and the wait after Complete."""

    def publish(self, name: str, code: int, message: str) -> None:
        if self.store is None:
            return
        with contextlib.suppress(Exception):
            self.store.set(self.env.key(name), f"{code}\n{message}".encode())

    def read(self, name: str) -> tuple[int, str] | None:
        """A published ``(code, message)``, or None; raises when the store itself is gone."""
        if self.store is None or not self.store.check([self.env.key(name)]):
            return None
        code, _, message = bytes(self.store.get(self.env.key(name))).decode(errors="replace").partition("\n")
        return int(code), message

    def read_or_none(self, name: str) -> tuple[int, str] | None:
        """:meth:`read`, with a gone store read as nothing published."""
        try:
            return self.read(name)
        except Exception:
            return None

    def wait_read(self, name: str, timeout: float) -> tuple[int, str] | None:
        """:meth:`read_or_none`, polled for up to ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        found = self.read_or_none(name)
        while found is None and time.monotonic() < deadline:
            time.sleep(0.05)
            found = self.read_or_none(name)
        return found

    def peer_failure(self) -> str | None:
        """``"rank r failed: ..."`` for the first rank that published a failure (None: none did)."""
        for rank in range(self.env.world_size):
            if rank == self.env.rank:
                continue
            try:
                found = self.read(f"failed/{rank}")
            except Exception:
                return None
            if found is not None:
                return f"rank {rank} of {self.env.world_size} failed (exit code {found[0]}): {found[1]}"
        return None

    def lost(self, error: BaseException, iteration: int) -> RankLost:
        """The training-time failure of a collective, with the best explanation available."""
        deadline = time.monotonic() + PEER_GRACE_S
        who = self.peer_failure()
        while who is None and time.monotonic() < deadline:
            time.sleep(0.05)  # a failing rank publishes just before it exits; give it a moment
            who = self.peer_failure()
        if who is None:
            leader_end = None if self.env.leader else self.wait_read("outcome", PEER_GRACE_S)
            if leader_end is not None:
                # Rank 0 ended first (e.g. the game stopped it during a sync): follow its exit code.
                self.state.lost_code = leader_end[0]
                who = f"rank 0 ended (exit code {leader_end[0]}): {leader_end[1]}"
            else:
                who = f"another training process stopped answering ({first_line(error)})"
        message = f"scale-out: {who}; training stopped at iteration {iteration}"
        self.state.lost = message
        return RankLost(message)
