"""``la-trainer watch``: follow a run through its status file, and judge its health.

A user points it at whatever folder they know: a task folder (``.../LearningCore/Training3``), the
engine's ``LearningCore`` folder or the project's ``Intermediate`` folder (the newest run below is
followed), or the status file itself. It redraws one line in place on a terminal (one line per refresh
otherwise: a log or CI), ends when the run ends, and its exit code says how the run is doing, which is
what the Docker HEALTHCHECK asks (``watch --once``):

============  ==========================================================================================
exit code     the run
============  ==========================================================================================
0             running and fresh, or ended with exit code 0 (complete, or stopped by the game)
1-10, 13-14 ended with that exit code (README "Exit codes": 8 interrupted, 9 diverged, ...)
2             also: no status file found under the path
11            stale: not updated for ``--max-age`` seconds (a live trainer rewrites it every 10 s)
12            dead: the trainer process is gone without having recorded an end (killed)
============  ==========================================================================================

A pid is checked only on the machine that wrote the file (the status records the host): on another
machine (a shared folder) staleness alone tells.
"""

from __future__ import annotations

import math
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TextIO

from trainer.exitcodes import ExitCode
from trainer.records.progress import STATUS_FILE_NAME, Status, format_duration, format_rate, read_status

__all__ = ["DEFAULT_MAX_AGE_S", "Health", "Verdict", "find_status_files", "judge", "render", "watch"]

DEFAULT_MAX_AGE_S = 60.0
"""A status older than this is stale (the trainer rewrites it at least every ``HEARTBEAT_S`` = 10 s)."""


class Verdict(Enum):
    """What ``watch`` concludes about a run."""

    RUNNING = "running"
    COMPLETE = "complete"
    """Ended with exit code 0."""
    ENDED = "ended"
    """Ended with a non-zero exit code (interrupted, diverged, failed)."""
    STALE = "stale"
    DEAD = "dead"


@dataclass(frozen=True, slots=True)
class Health:
    verdict: Verdict
    exit_code: int
    """What ``watch`` exits with for this verdict (module docstring)."""
    reason: str = ""

    @property
    def final(self) -> bool:
        """Nothing will change any more: ``watch`` stops following."""
        return self.verdict is not Verdict.RUNNING


def find_status_files(path: Path) -> list[Path]:
    """Status files at ``path`` (a file, a task folder) or one or two folders below it (``LearningCore``,
    ``Intermediate``), newest first (by modification time)."""
    if path.is_file():
        return [path]
    patterns = (STATUS_FILE_NAME, f"*/{STATUS_FILE_NAME}", f"*/*/{STATUS_FILE_NAME}")
    found = {file for pattern in patterns for file in path.glob(pattern) if file.is_file()}
    return sorted(found, key=lambda f: f.stat().st_mtime, reverse=True)


def _pid_alive(pid: int) -> bool:
    """True while the process ``pid`` runs on this machine (POSIX signal 0; on Windows a process handle,
    never ``os.kill``, which would terminate it there). One look that closes its handle: ``watch`` asks
    on every refresh, and the trainer may be younger than ``watch`` (issue 30)."""
    from trainer.system.liveness import process_alive

    return process_alive(pid)


def judge(
    status: Status,
    *,
    now: float | None = None,
    max_age: float = DEFAULT_MAX_AGE_S,
    host: str | None = None,
    pid_alive: Callable[[int], bool] = _pid_alive,
) -> Health:
    """The run's health from its status (see the module docstring for the exit codes)."""
    now = time.time() if now is None else now
    if status.phase.final:
        code = (
            status.exit_code if status.exit_code is not None else (0 if status.phase.value != "failed" else 1)
        )
        if code == 0:
            return Health(Verdict.COMPLETE, 0, f"{status.phase.value}")
        return Health(Verdict.ENDED, code, f"{status.phase.value} with exit code {code}")
    same_host = status.host == (socket.gethostname() if host is None else host)
    if same_host and status.pid > 0 and not pid_alive(status.pid):
        return Health(
            Verdict.DEAD,
            int(ExitCode.RUN_DEAD),
            f"the trainer (pid {status.pid}) is gone without recording an end (killed?)",
        )
    age = now - status.updated
    if age > max_age:
        return Health(
            Verdict.STALE,
            int(ExitCode.RUN_STALE),
            f"no update for {format_duration(age)} (--max-age {max_age:g} s)",
        )
    return Health(Verdict.RUNNING, 0)


def render(status: Status, where: str, health: Health, *, now: float | None = None) -> str:
    """One line: where, phase, progress, loss, speed, ETA, pid, age; the verdict when not running."""
    now = time.time() if now is None else now
    parts = [where, status.phase.value if health.verdict is Verdict.RUNNING else health.reason]
    if status.total:
        pct = 100.0 * status.iteration / status.total
        parts.append(f"iteration {status.iteration}/{status.total} ({pct:.1f}%)")
    if math.isfinite(status.loss):
        parts.append(f"loss {status.loss:.5f}")
    if health.verdict is Verdict.RUNNING and status.iterations_per_second > 0:
        parts.append(f"{format_rate(status.iterations_per_second)} it/s")
        parts.append(f"eta {format_duration(status.eta_s)}")
    if status.syncs:
        parts.append(f"syncs {status.syncs}")
    if status.threads and health.verdict is Verdict.RUNNING:
        parts.append(f"threads {status.threads}")
    if status.recipe:
        parts.append(f"recipe {status.recipe}")
    if status.heldout_iteration:
        parts.append(
            f"held-out at {status.heldout_iteration}: selection {status.heldout_selection:.3f} loss "
            f"{status.heldout_loss:.4f} energy score {status.heldout_energy_score:.3f} coverage "
            f"{status.heldout_coverage:.2f}"
        )
    parts.append(f"pid {status.pid}")
    parts.append(f"updated {format_duration(now - status.updated)} ago")
    line = " | ".join(parts)
    if status.message and health.verdict is not Verdict.RUNNING:
        line += f"\n  {status.message}"
    return line


def _why(path: Path, error: BaseException) -> str:
    """Why ``path`` is not a status file, in our words (msgpack's own are "Unpack failed: ...")."""
    if isinstance(error, OSError):
        return f"it cannot be read: {error.strerror or error}"
    try:
        empty = path.stat().st_size == 0
    except OSError:
        empty = False
    return "it is empty" if empty else "it does not hold la-trainer's status map"


def _describe(path: Path) -> str:
    folder = path.parent
    return f"{folder.parent.name}/{folder.name}" if folder.parent.name else folder.name


def watch(
    path: Path,
    *,
    interval: float = 1.0,
    once: bool = False,
    max_age: float = DEFAULT_MAX_AGE_S,
    stream: TextIO | None = None,
    tty: bool | None = None,
    pid_alive: Callable[[int], bool] = _pid_alive,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Follow the newest run under ``path`` until it ends (or once); returns the exit code."""
    out = stream if stream is not None else sys.stdout
    redraw = out.isatty() if tty is None else tty
    if path.is_file():
        # A file named on the command line must be a status file: anything else (an empty file, a run's
        # metrics log) is refused at once, never followed for ever or reported by the decoder's words.
        try:
            read_status(path)
        except (OSError, ValueError) as error:
            out.write(
                f"la-trainer watch: {path} is not a status file ({STATUS_FILE_NAME}) or a folder: "
                f"{_why(path, error)}. Point it at a task folder (.../Intermediate/LearningCore/Training0), "
                "the LearningCore folder or the project's Intermediate folder.\n"
            )
            out.flush()
            return int(ExitCode.USAGE)
    shown = None
    drawn = False
    while True:
        files = find_status_files(path)
        if not files:
            if once or (shown is None and not path.exists()):
                out.write(
                    f"la-trainer watch: no {STATUS_FILE_NAME} in {path} or the folders below it. Point it at "
                    "a task folder (.../Intermediate/LearningCore/Training0), the LearningCore folder or "
                    "the project's Intermediate folder.\n"
                )
                out.flush()
                return int(ExitCode.USAGE)
            if not drawn:
                out.write(f"waiting for a status file under {path} ...\n")
                out.flush()
                drawn = True
            sleep(interval)
            continue
        newest = files[0]
        if newest != shown:
            if drawn and redraw:
                out.write("\n")
            if len(files) > 1 or newest.parent != path:
                out.write(f"following {newest.parent}\n")
            shown = newest
        try:
            status = read_status(newest)
        except (OSError, ValueError) as error:
            # Between two runs' files or a torn read on a foreign file system: try again.
            if once:
                out.write(f"la-trainer watch: {newest} is unreadable: {error}\n")
                return int(ExitCode.USAGE)
            sleep(interval)
            continue
        health = judge(status, max_age=max_age, pid_alive=pid_alive)
        line = render(status, _describe(newest), health)
        if redraw and not once:
            out.write("\r\x1b[2K" + line.replace("\n", "\n\x1b[2K") + ("\n" if health.final else ""))
        else:
            out.write(line + "\n")
        out.flush()
        drawn = True
        if once or health.final:
            return health.exit_code
        sleep(interval)
