"""Progress output: plain lines for the engine's log, a bar for a terminal, a status file for ``watch``.

The engine copies the trainer's stdout into its log line by line (spec §1.1), so progress is one complete,
flushed line per interval. On a terminal the same information is drawn as a single updating bar. The
status file (msgpack, written atomically) lets ``la-trainer watch TASK_DIR`` follow an engine-spawned run.
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TextIO

import msgpack

from trainer.transport.atomic import atomic_write

__all__ = ["STATUS_FILE_NAME", "ProgressReporter", "Status", "log", "read_status", "write_status"]

STATUS_FILE_NAME = "la-trainer-status.msgpack"


def log(message: str, stream: TextIO | None = None) -> None:
    """One flushed line (the engine reads our stdout line by line)."""
    out = stream if stream is not None else sys.stdout
    out.write(message.rstrip("\n") + "\n")
    out.flush()


@dataclass(slots=True)
class Status:
    """What ``la-trainer watch`` shows. Written as a msgpack map with these keys."""

    phase: str
    iteration: int = 0
    total: int = 0
    loss: float = math.nan
    iterations_per_second: float = 0.0
    syncs: int = 0
    pid: int = 0
    updated: float = 0.0
    message: str = ""


def write_status(path: Path, status: Status) -> None:
    """Atomically replaces ``path`` (temp file + rename), so readers never see half a file."""
    data = msgpack.packb(asdict(status), use_bin_type=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Not durable: the file is rewritten every few seconds from the training loop, where an fsync on a
    # busy disk could stall a step, and a status lost in a power cut is rewritten by the next run.
    atomic_write(path, data, durable=False)


def read_status(path: Path) -> Status:
    """Reads a status file written by :func:`write_status` (raises ValueError on a bad file)."""
    raw = msgpack.unpackb(path.read_bytes(), raw=False, strict_map_key=True, max_bin_len=1 << 16)
    if not isinstance(raw, dict):
        raise ValueError(f"{path} does not hold a status map")
    known = {k: raw[k] for k in Status.__dataclass_fields__ if k in raw}
    return Status(**known)


def _format_duration(seconds: float) -> str:
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class ProgressReporter:
    """Prints progress every ``every_s`` seconds; a bar on a TTY, plain lines otherwise."""

    def __init__(
        self,
        total: int,
        *,
        every_s: float = 5.0,
        stream: TextIO | None = None,
        tty: bool | None = None,
        status_path: Path | None = None,
        label: str = "train",
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

    def start(self, total: int, first_iteration: int = 0) -> None:
        """Training begins now: rates and ETA count from here, not from process start."""
        self.total = total
        self.started = self._last = time.perf_counter()
        self._last_iteration = first_iteration

    def phase(self, phase: str, message: str = "") -> None:
        """Records a phase change (waiting for config, receiving networks...) in the status file."""
        if message:
            log(message, self.stream)
        self._write_status(phase, 0, math.nan, message)

    def update(self, iteration: int, loss: float, *, force: bool = False) -> None:
        """Called every iteration with the latest (smoothed) loss; cheap unless a line is due."""
        now = time.perf_counter()
        if not force and now - self._last < (0.2 if self.tty else self.every_s):
            return
        elapsed = now - self._last
        if elapsed > 0:
            self._rate = (iteration - self._last_iteration) / elapsed
        self._last, self._last_iteration = now, iteration
        remaining = (self.total - iteration) / self._rate if self._rate > 0 else math.inf
        pct = 100.0 * iteration / self.total if self.total else 100.0
        if self.tty:
            width = 30
            filled = int(width * iteration / self.total) if self.total else width
            bar = "#" * filled + "-" * (width - filled)
            self.stream.write(
                f"\r{self.label} [{bar}] {iteration}/{self.total} loss {loss:.4f} "
                f"{self._rate:,.0f} it/s eta {_format_duration(remaining)}   "
            )
            if iteration >= self.total:
                self.stream.write("\n")
            self.stream.flush()
        else:
            log(
                f"{self.label}: iteration {iteration}/{self.total} ({pct:.1f}%) loss {loss:.5f} "
                f"{self._rate:,.0f} it/s eta {_format_duration(remaining)} syncs {self.syncs}",
                self.stream,
            )
        self._write_status("training", iteration, loss)

    def _write_status(self, phase: str, iteration: int, loss: float, message: str = "") -> None:
        if self.status_path is None:
            return
        try:
            write_status(
                self.status_path,
                Status(
                    phase=phase,
                    iteration=iteration,
                    total=self.total,
                    loss=loss,
                    iterations_per_second=self._rate,
                    syncs=self.syncs,
                    pid=os.getpid(),
                    updated=time.time(),
                    message=message,
                ),
            )
        except OSError:
            # A status file is a convenience: never let it end a training run.
            self.status_path = None
