"""Keep-alive pings while the trainer is busy and the engine may be waiting on it (spec §2.4, §3)."""

from __future__ import annotations

import threading
from types import TracebackType

from protocol.errors import ProtocolError
from trainer.errors import TrainerError
from trainer.session.links.base import TrainerLink

__all__ = ["KeepAlive"]


class KeepAlive:
    """Pings ``link`` every ``interval`` seconds from a daemon thread while the block runs.

    Use it around slow work during which the engine may be waiting on us (spec §2.4: a waiting engine
    times out after 10 s without a ping). The first ping goes out at once. A failing ping stops the
    thread quietly and is kept in :attr:`error`; the next real transfer reports the failure.
    """

    def __init__(self, link: TrainerLink, interval: float) -> None:
        if interval <= 0:
            raise ValueError(f"KeepAlive interval must be positive, got {interval}")
        self._link = link
        self._interval = interval
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.pings = 0
        """Pings sent so far (for tests and logs)."""

    def _run(self) -> None:
        while True:
            try:
                self._link.ping()
            except (TrainerError, ProtocolError, OSError) as error:
                self.error = error
                return
            self.pings += 1
            if self._done.wait(self._interval):
                return

    def __enter__(self) -> KeepAlive:
        if self._thread is not None:
            raise RuntimeError("KeepAlive is not re-entrant")
        self._done.clear()
        self._thread = threading.Thread(target=self._run, name="la-trainer-keepalive", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._done.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            # A ping stuck in a full socket buffer is bounded by the send timeout; do not wait that
            # long here: the thread is a daemon and ends with the process.
            thread.join(timeout=1.0)
