"""A daemon thread that ends a rank whose main thread is stuck in a collective."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable

from trainer.distributed.state import PEER_GRACE_S, RankContext
from trainer.exitcodes import ExitCode
from trainer.system.console import log_error

__all__ = ["SIGNAL_GRACE_S", "WATCH_PERIOD_S", "Watchdog"]

SIGNAL_GRACE_S = 5.0
"""After SIGTERM/SIGINT, how long a rank stuck in a collective gets before the watchdog ends it (torchrun
sends SIGKILL 30 s after SIGTERM)."""
WATCH_PERIOD_S = 0.2
"""How often the watchdog looks (the store is read at most every 0.5 s)."""


class Watchdog:
    """A daemon thread that ends a rank whose main thread is stuck in a collective.

    Rank 0, while a step waits on the others: a published failure of another rank (after
    :data:`PEER_GRACE_S`), SIGTERM/SIGINT (after :data:`SIGNAL_GRACE_S`), or ``stall_s`` without progress
    → send the current networks and Complete to the game, publish the outcome, ``os._exit(PEER_GONE)``.
    Ranks ≥ 1: rank 0's published outcome, a lost store, or a signal while stuck → exit with rank 0's code.
    Signals are seen through :func:`signal.set_wakeup_fd`, because a Python handler cannot run while the
    main thread is inside a blocking C++ call.
    """

    def __init__(
        self, ctx: RankContext, stall_s: float, *, exit_process: Callable[[int], None] = os._exit
    ) -> None:
        self.ctx = ctx
        self.stall_s = stall_s
        self._exit = exit_process
        self._failure_seen_at: float | None = None
        self._stop = threading.Event()
        self._signal_at: float | None = None
        self._reader: socket.socket | None = None
        self._writer: socket.socket | None = None
        self._previous_fd: int | None = None
        self._thread = threading.Thread(
            target=self._run, name=f"la-trainer-watchdog-{ctx.env.rank}", daemon=True
        )

    def start(self) -> Watchdog:
        if threading.current_thread() is threading.main_thread():
            self._reader, self._writer = socket.socketpair()
            self._reader.setblocking(False)
            self._writer.setblocking(False)
            self._previous_fd = signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)
        if self._writer is not None and threading.current_thread() is threading.main_thread():
            signal.set_wakeup_fd(self._previous_fd if self._previous_fd is not None else -1)
        for sock in (self._reader, self._writer):
            if sock is not None:
                sock.close()

    def _signals(self) -> None:
        if self._reader is None:
            return
        with contextlib.suppress(OSError):
            ready, _, _ = select.select([self._reader], [], [], 0)
            if ready and self._reader.recv(64) and self._signal_at is None:
                self._signal_at = time.monotonic()

    def _run(self) -> None:
        next_store_poll = 0.0
        while not self._stop.wait(WATCH_PERIOD_S):
            self._signals()
            now = time.monotonic()
            poll_store = now >= next_store_poll
            if poll_store:
                next_store_poll = now + 0.5
            reason = self._leader_reason(now, poll_store) if self.ctx.env.leader else None
            if reason is not None:
                self._end_leader(reason)
            elif not self.ctx.env.leader:
                self._check_follower(now, poll_store)

    def _stuck_for(self, now: float) -> float:
        state = self.ctx.state
        return now - state.step_started if state.in_step else 0.0

    def _leader_reason(self, now: float, poll_store: bool) -> str | None:
        stuck = self._stuck_for(now)
        if stuck <= 0:
            return None
        if poll_store and stuck > PEER_GRACE_S:  # a healthy step is milliseconds: no store traffic then
            who = self.ctx.peer_failure()
            if who is None:
                self._failure_seen_at = None
            elif self._failure_seen_at is None:
                # Give the main thread the first chance: its own path also writes the snapshot and checkpoint.
                self._failure_seen_at = now
            elif now - self._failure_seen_at > PEER_GRACE_S:
                return who
        if self._signal_at is not None and now - self._signal_at > SIGNAL_GRACE_S and stuck > SIGNAL_GRACE_S:
            return "a stop signal arrived while the ranks were waiting on each other"
        if stuck > self.stall_s:
            return f"no answer from the other training processes for {self.stall_s:.0f} s"
        return None

    def _end_leader(self, reason: str) -> None:
        state = self.ctx.state
        with state.lock:
            if state.finishing or not state.in_step or state.job is None:
                return
            state.finishing = True
        done = state.iterations_done
        message = f"scale-out: {reason}; training stopped at iteration {done}"
        code = int(ExitCode.PEER_GONE)
        log_error(f"la-trainer: {message}. Sending the networks of iteration {done} and Complete.")
        try:
            if state.link is not None:
                state.link.emergency_complete(state.job)
        except BaseException as error:  # the process ends below whatever happens
            log_error(f"la-trainer: could not send the final networks: {error}")
        self.ctx.publish("outcome", code, message)
        self._flush_and_exit(code)

    def _check_follower(self, now: float, poll_store: bool) -> None:
        if poll_store:
            try:
                outcome = self.ctx.read("outcome")
            except Exception:
                outcome = (int(ExitCode.PEER_GONE), "the rendezvous store is gone (rank 0 or torchrun ended)")
            if outcome is not None:
                if self._stop.wait(PEER_GRACE_S):
                    return  # the main thread finished by itself
                code, text = outcome
                log_error(
                    f"la-trainer[rank {self.ctx.env.rank}]: rank 0 ended (exit code {code}): {text}; ending this rank."
                )
                self._flush_and_exit(code)
        if (
            self._signal_at is not None
            and now - self._signal_at > SIGNAL_GRACE_S
            and self._stuck_for(now) > SIGNAL_GRACE_S
        ):
            log_error(
                f"la-trainer[rank {self.ctx.env.rank}]: stop signal while waiting on the other ranks; exiting."
            )
            self._flush_and_exit(int(ExitCode.INTERRUPTED))

    def _flush_and_exit(self, code: int) -> None:
        self.ctx.publish(f"done/{self.ctx.env.rank}", code, "")
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        self._exit(code)
