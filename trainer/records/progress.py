"""Progress output: plain lines for the engine's log, a bar for a terminal, a status file for ``watch``.

The engine copies the trainer's stdout into its log line by line (spec §1.1), so progress is one complete,
flushed line per interval. On a terminal the same information is drawn as a single updating bar.

The status file (``<task_dir>/la-trainer-status.msgpack``, msgpack, replaced atomically) is what
``la-trainer watch`` and the Docker HEALTHCHECK read (:mod:`trainer.commands.watch`). It tells the truth at every
moment of a run:

* the phase (:class:`RunPhase`), and once the run has ended, the final phase with the exit code
  (complete and stopped: 0; interrupted: 8; diverged: 9; rank lost: 5; failed: the error's code);
* the last iteration, total, smoothed loss, it/s and ETA, kept through phase changes (a finished run shows
  where it finished, not ``0/3000 loss nan``);
* the pid and host, so a watcher on the same machine can tell a killed trainer from a live one;
* ``updated``, refreshed by a heartbeat every :data:`HEARTBEAT_S` seconds while the process lives, also
  while it waits for a paused game: a file older than a minute means the process is frozen or gone.
"""

from __future__ import annotations

import dataclasses
import math
import os
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path
from typing import TextIO

import msgpack

from trainer.system.atomic import atomic_write, rewrite_in_place
from trainer.system.console import log, overwrite
from trainer.system.diskspace import describe_no_space, is_no_space, no_space_cause

__all__ = [
    "HEARTBEAT_S",
    "STATUS_FILE_NAME",
    "ProgressReporter",
    "RunPhase",
    "Status",
    "format_duration",
    "format_rate",
    "read_status",
    "write_status",
]

STATUS_FILE_NAME = "la-trainer-status.msgpack"

HEARTBEAT_S = 10.0
"""How often a live trainer rewrites its status file when nothing else does (waits, slow sync rounds)."""

SLOW_ITERATION_S = 60.0
"""An iteration still running after this long says so in the log (from the heartbeat): a network too large
for the machine otherwise shows no progress line at all before its first iteration ends."""


class RunPhase(str, Enum):
    """Where a run stands. The value is what the status file stores and ``watch`` prints."""

    STARTING = "starting"
    WAITING_FOR_CONFIG = "waiting for config"
    """Live links: the game has not posted its config yet (attach mode: the game is not started yet)."""
    READING_EXPORT = "reading export"
    """Offline: reading the exported TrainingMaterials."""
    RECEIVING_NETWORKS = "receiving networks"
    RECEIVING_EXPERIENCE = "receiving experience"
    TRAINING = "training"
    FINISHING = "finishing"
    """Final networks, snapshots and checkpoint are being written and sent."""
    COMPLETE = "complete"
    """Every iteration ran; final networks and Complete sent (exit 0)."""
    STOPPED = "stopped"
    """The game asked to stop (exit 0)."""
    INTERRUPTED = "interrupted"
    """SIGINT/SIGTERM (exit 8); the state was saved."""
    DIVERGED = "diverged"
    """The loss became NaN/Inf (exit 9); the last good weights were sent."""
    RANK_LOST = "rank lost"
    """Scale-out: another training process failed or vanished (exit 5); the last good weights were sent."""
    FAILED = "failed"
    """Any other end; ``exit_code`` and ``message`` say which and why."""
    UNKNOWN = "unknown"
    """A status file from another version with a phase this one does not know."""

    @property
    def final(self) -> bool:
        """The run has ended (its exit code is known)."""
        return self in _FINAL

    @classmethod
    def parse(cls, text: str) -> RunPhase:
        try:
            return cls(text)
        except ValueError:
            return cls.UNKNOWN


_FINAL = frozenset(
    {
        RunPhase.COMPLETE,
        RunPhase.STOPPED,
        RunPhase.INTERRUPTED,
        RunPhase.DIVERGED,
        RunPhase.RANK_LOST,
        RunPhase.FAILED,
    }
)


@dataclass(slots=True)
class Status:
    """What ``la-trainer watch`` shows. Written as a msgpack map with these keys."""

    phase: RunPhase
    iteration: int = 0
    total: int = 0
    loss: float = math.nan
    iterations_per_second: float = 0.0
    eta_s: float = math.nan
    """Seconds to the last iteration at the current rate (NaN: unknown)."""
    syncs: int = 0
    pid: int = 0
    host: str = ""
    """``socket.gethostname()`` of the trainer: a pid means something only on its own machine."""
    started: float = 0.0
    updated: float = 0.0
    """Unix time of the last write (heartbeat included)."""
    progress_every_s: float = 5.0
    """The writer's progress period, so a watcher can judge staleness against it."""
    exit_code: int | None = None
    """Set once the run has ended (final phases)."""
    run_dir: str = ""
    """The run's record folder (:mod:`trainer.records.runrecord`), once known."""
    message: str = ""
    threads: int = 0
    """CPU threads the training steps run with (0: not known yet)."""
    threads_note: str = ""
    """Why that count: the last measurement of :mod:`trainer.training.threads` (empty when the count is fixed)."""
    recipe: str = ""
    """The training recipe (:mod:`trainer.training.recipes`): its name, ``"… (pilot)"`` while the pilot runs,
    ``custom`` for the user's own (empty: not known yet)."""
    recipe_note: str = ""
    """Why that recipe: the pilot's last look (each candidate's selection score), or why there is none."""
    heldout_iteration: int = 0
    """Iteration of the last held-out measurement (:mod:`trainer.training.heldout`; 0: none yet)."""
    heldout_selection: float = math.nan
    """Its selection score (higher is better; what picks the recipe and the best networks)."""
    heldout_loss: float = math.nan
    """Its flow loss on the held-out rows (lower is better)."""
    heldout_energy_score: float = math.nan
    """Its energy score of sampled against demonstrated actions (lower is better)."""
    heldout_coverage: float = math.nan
    """Its coverage: the share of held-out rows whose demonstrated action the policy reaches."""


def write_status(path: Path, status: Status) -> None:
    """Atomically replaces ``path`` (temp file + rename), so readers never see half a file."""
    # RunPhase(...) also takes the phase's text (a caller that built the Status from a string).
    data = msgpack.packb({**asdict(status), "phase": RunPhase(status.phase).value}, use_bin_type=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Not durable: the file is rewritten every few seconds from the training loop, where an fsync on a
    # busy disk could stall a step, and a status lost in a power cut is rewritten by the next run.
    try:
        atomic_write(path, data, durable=False)
    except OSError as error:
        # A full disk: the temporary file gets no space, but the file's own page takes the run's end in
        # place (not atomic, so only the final status: without it watch would call the run killed).
        if not (RunPhase(status.phase).final and is_no_space(error) and path.is_file()):
            raise
        rewrite_in_place(path, data)


def read_status(path: Path) -> Status:
    """Reads a status file written by :func:`write_status` (raises ValueError on a bad file)."""
    raw = msgpack.unpackb(path.read_bytes(), raw=False, strict_map_key=True, max_bin_len=1 << 16)
    if not isinstance(raw, dict) or not isinstance(raw.get("phase"), str):
        raise ValueError(f"{path} does not hold a status map")
    known = {k: raw[k] for k in Status.__dataclass_fields__ if k in raw}
    known["phase"] = RunPhase.parse(raw["phase"])
    return Status(**known)


def format_rate(per_second: float) -> str:
    """Iterations per second as a progress line shows them: ``1,850``, ``4.2``, ``0.183`` (never ``0`` for
    a slow but running network)."""
    if not math.isfinite(per_second) or per_second <= 0:
        return "0"
    if per_second >= 10:
        return f"{per_second:,.0f}"
    return f"{per_second:.1f}" if per_second >= 1 else f"{per_second:.3f}"


def format_duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``; ``?`` for unknown."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class ProgressReporter:
    """Prints progress every ``every_s`` seconds (a bar on a TTY, plain lines otherwise) and keeps the
    status file current. Close it (or use it as a context manager) to stop the heartbeat."""

    def __init__(
        self,
        total: int,
        *,
        every_s: float = 5.0,
        stream: TextIO | None = None,
        tty: bool | None = None,
        status_path: Path | None = None,
        label: str = "train",
        heartbeat_s: float = HEARTBEAT_S,
        syncs: bool = True,
        slow_iteration_s: float = SLOW_ITERATION_S,
    ) -> None:
        self.total = total
        self.every_s = every_s
        self.stream = stream if stream is not None else sys.stdout
        self.tty = self.stream.isatty() if tty is None else tty
        self.status_path = status_path
        self.label = label
        self.started = time.perf_counter()
        self._last = self.started
        self._last_iteration = 0
        self._rate = 0.0
        self.syncs = 0
        self.show_syncs = syncs
        """The run sends networks to a game: the progress line and the status count the rounds (offline
        there is no game to send them to)."""
        self._lock = threading.Lock()
        self._status = Status(
            phase=RunPhase.STARTING,
            total=total,
            pid=os.getpid(),
            host=socket.gethostname(),
            started=time.time(),
            progress_every_s=every_s,
        )
        self._latest: tuple[int, float] | None = None
        """The newest (iteration, loss) seen by :meth:`update`, written with the next status (every call
        stores it; only a due line writes the file)."""
        self._warned = False
        self._slow_after = slow_iteration_s
        self._slow_noted = False
        self.note = ""
        """A short extra for the progress line (the latest held-out numbers, :mod:`trainer.training.heldout`)."""
        self._closed = threading.Event()
        self._heartbeat: threading.Thread | None = None
        if status_path is not None and heartbeat_s > 0:
            self._write_status()
            self._heartbeat = threading.Thread(
                target=self._beat, args=(heartbeat_s,), name="la-trainer-status", daemon=True
            )
            self._heartbeat.start()

    # -- life cycle ----------------------------------------------------------------------------------
    def __enter__(self) -> ProgressReporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the heartbeat and write the newest iteration and loss once more (a run that ends with an
        error keeps where it was; the caller records the failure after this)."""
        finished = self._closed.is_set()
        self._closed.set()
        if self._heartbeat is not None:
            self._heartbeat.join(timeout=5.0)
            self._heartbeat = None
        if not finished:
            self._write_status()

    def _beat(self, period: float) -> None:
        while not self._closed.wait(period):
            self._write_status()
            self._note_slow_iteration()

    def _note_slow_iteration(self) -> None:
        """One line when the first iteration has run for :data:`SLOW_ITERATION_S` (a network too large for
        the machine: no progress line would come before it ends). Only the first: later, a silence can
        also be a sync round waiting for the game, whose wait says so itself."""
        with self._lock:
            first = self._status.phase is RunPhase.TRAINING and self._latest is None
        waited = time.perf_counter() - self.started
        if not first or waited < self._slow_after or self._slow_noted or self.tty:
            return
        self._slow_noted = True
        log(
            f"{self.label}: the first iteration is still running after {format_duration(waited)}: this "
            "network is slow on this machine (its size is in the line above); the progress line follows "
            "when the iteration ends",
            self.stream,
        )

    # -- what the story reports ----------------------------------------------------------------------
    def start(self, total: int, first_iteration: int = 0) -> None:
        """Training begins now: rates and ETA count from here, not from process start."""
        self.total = total
        self.started = self._last = time.perf_counter()
        self._last_iteration = first_iteration
        self._set(total=total, iteration=first_iteration)

    def phase(self, phase: RunPhase, message: str = "") -> None:
        """Records a phase change (waiting for config, receiving networks...) in the status file; the last
        iteration and loss are kept."""
        if message:
            log(message, self.stream)
        self._set(phase=phase, message=message)

    def finish(self, phase: RunPhase, exit_code: int, message: str = "") -> None:
        """The run has ended in ``phase`` with ``exit_code``: the final status, written once; the
        heartbeat stops so nothing overwrites it."""
        if message:
            log(message, self.stream)
        self._closed.set()
        self._set(phase=phase, exit_code=int(exit_code), message=message, eta_s=math.nan)
        self.close()

    def threads(self, threads: int, note: str = "") -> None:
        """The thread count the steps run with, and the measurement that chose it."""
        self._set(threads=threads, threads_note=note)

    def recipe(self, recipe: str, note: str = "") -> None:
        """The recipe trained and why (:mod:`trainer.training.recipes`)."""
        self._set(recipe=recipe, recipe_note=note)

    def heldout(
        self,
        iteration: int,
        selection: float,
        loss: float,
        energy_score: float,
        coverage: float,
        *,
        note: str = "",
    ) -> None:
        """A held-out measurement: into the status file (``watch``) and, as ``note``, the progress line."""
        self.note = note
        self._set(
            heldout_iteration=iteration,
            heldout_selection=selection,
            heldout_loss=loss,
            heldout_energy_score=energy_score,
            heldout_coverage=coverage,
        )

    def run_dir(self, folder: Path) -> None:
        """The run's record folder, shown by ``watch`` and found by ``report``."""
        self._set(run_dir=str(folder))

    def line_due(self) -> bool:
        """Whether the next :meth:`update` writes a line (a caller whose loss is still on the device reads
        it then, and only then)."""
        return time.perf_counter() - self._last >= (0.2 if self.tty else self.every_s)

    def update(self, iteration: int, loss: float, *, force: bool = False) -> None:
        """Called every iteration with the latest (smoothed) loss; cheap unless a line is due."""
        self._latest = (iteration, loss)
        now = time.perf_counter()
        if not force and now - self._last < (0.2 if self.tty else self.every_s):
            return
        elapsed = now - self._last
        if elapsed > 0 and iteration != self._last_iteration:
            self._rate = (iteration - self._last_iteration) / elapsed
        self._last, self._last_iteration = now, iteration
        remaining = (self.total - iteration) / self._rate if self._rate > 0 else math.inf
        pct = 100.0 * iteration / self.total if self.total else 100.0
        if self.tty:
            width = 30
            filled = min(width, int(width * iteration / self.total)) if self.total else width
            bar = "#" * filled + "-" * (width - filled)
            line = (
                f"\r{self.label} [{bar}] {iteration}/{self.total} loss {loss:.4f} "
                f"{format_rate(self._rate)} it/s eta {format_duration(remaining)}   "
            )
            overwrite(line + "\n" if iteration >= self.total else line, self.stream)
        else:
            note = f" | {self.note}" if self.note else ""
            syncs = f" syncs {self.syncs}" if self.show_syncs else ""
            log(
                f"{self.label}: iteration {iteration}/{self.total} ({pct:.1f}%) loss {loss:.5f} "
                f"{format_rate(self._rate)} it/s eta {format_duration(remaining)}{syncs}{note}",
                self.stream,
            )
        self._set(
            iteration=iteration,
            loss=loss,
            iterations_per_second=self._rate,
            eta_s=remaining if math.isfinite(remaining) else math.nan,
        )

    @property
    def rate(self) -> float:
        """Iterations per second over the last progress interval."""
        return self._rate

    # -- the file ------------------------------------------------------------------------------------
    def _set(self, **changes: object) -> None:
        with self._lock:
            syncs = self.syncs if self.show_syncs else 0
            self._status = dataclasses.replace(self._status, syncs=syncs, **changes)  # type: ignore[arg-type]
        self._write_status()

    def _write_status(self) -> None:
        if self.status_path is None:
            return
        with self._lock:
            status = dataclasses.replace(self._status, updated=time.time())
            if self._latest is not None and not status.phase.final:
                status.iteration, status.loss = self._latest
            try:
                write_status(self.status_path, status)
            except OSError as error:
                # A status file is a convenience: never let it end a training run. The next write tries
                # again (a reader holding the file open on Windows makes a replace fail briefly).
                if not self._warned:
                    self._warned = True
                    cause = no_space_cause(error)
                    why = describe_no_space(cause, self.status_path.parent) if cause is not None else error
                    log(f"la-trainer: warning: cannot write the status file {self.status_path}: {why}")
