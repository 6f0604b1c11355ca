"""One trainer per control block: an exclusive OS lock held while a process serves it.

Two trainers on one control block (``torchrun scripts/train.py`` before it became the scale-out trainer,
a user starting a second attach-mode trainer with the same GUID) corrupt each other's hand-offs: both
clear ConfigSignal, both request networks, one waits forever. So the trainer that opens a control block
first takes an exclusive lock named after its GUID, and a second one is refused at once.

Why a lock file and not a marker in the control block: the block is the engine's (all ten int32 slots
have engine meanings, and on Windows the mapping is exactly 40 bytes), and a marker written by a trainer
that crashed would stay there and refuse every later trainer. An OS lock (``flock`` on POSIX,
``msvcrt.locking`` on Windows) is released by the kernel when its process ends, however it ends, so a
crashed first trainer never blocks the next: its file is left, unlocked, and the next trainer on that
block locks and reuses it. The file lives in the system temporary folder (control blocks are machine-wide
names), is named after the GUID as the engine prints it, and holds the owner's process id (for the
refusal message and the scale-out pinger, which reads it while the lock is held).

Windows differs in two ways, both handled by :class:`WindowsLocks`:

* ``msvcrt.locking`` locks a byte range, and Windows enforces it: another process reading a locked byte
  fails. So the lock is on one byte at :data:`LOCK_OFFSET`, far past the process id (bytes
  ``0..PID_FIELD``) and past the end of the file (allowed), and the id stays readable.
* A file open in any process cannot be removed there (Python opens files without delete sharing). A clean
  release therefore unlocks and closes first, then removes the file; if a newcomer opened it in between,
  the removal fails and the file is the newcomer's. On POSIX the file is removed while still locked (a
  newcomer checks after locking that it locked the file that is there). Either way a clean release leaves
  nothing behind, so lock files do not pile up (one per engine-chosen GUID otherwise).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from trainer.errors import LaunchError

__all__ = [
    "LOCK_OFFSET",
    "OUTPUT_LOCK_NAME",
    "PID_FIELD",
    "ControlBlockLock",
    "OutputFolderLock",
    "PlatformLocks",
    "PosixLocks",
    "WindowsLocks",
    "lock_path",
]

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_ATTEMPTS = 100

PID_FIELD = 20
"""Bytes at the start of the file that hold the owner's process id, space-padded: every write covers what
an earlier owner wrote, so no truncation is needed."""
OUTPUT_LOCK_NAME = ".la-trainer-run.lock"
"""The lock file of an output folder (:class:`OutputFolderLock`), inside it."""
LOCK_OFFSET = 1 << 30
"""The byte ``msvcrt.locking`` locks on Windows: far past :data:`PID_FIELD` and past any read of this
small file (a reader's request that reached a locked byte would fail)."""


def lock_path(guid_string: str, folder: str | os.PathLike[str] | None = None) -> Path:
    """The lock file of the control block ``guid_string`` (``{...}`` or a short GUID)."""
    name = _UNSAFE.sub("", guid_string)
    return Path(folder if folder is not None else tempfile.gettempdir()) / f"la-trainer-controls-{name}.lock"


class PlatformLocks(Protocol):
    """How this OS locks a lock file and removes it."""

    remove_while_locked: bool
    """True where an open file can be removed (POSIX): then release removes it before unlocking."""

    def try_lock(self, fd: int) -> bool:
        """Take the lock without waiting; False when another holder has it."""
        ...

    def unlock(self, fd: int) -> None: ...

    def remove(self, path: Path) -> None:
        """Remove the file (OSError when it cannot be removed now)."""
        ...


class PosixLocks:
    """``flock`` on the whole file (advisory: reading the owner's id is never blocked)."""

    remove_while_locked = True

    def try_lock(self, fd: int) -> bool:
        import fcntl

        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def unlock(self, fd: int) -> None:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_UN)

    def remove(self, path: Path) -> None:
        path.unlink()


class WindowsLocks:
    """``msvcrt.locking`` on the byte at :data:`LOCK_OFFSET` (the CRT locks from the descriptor's current
    position). ``msvcrt`` and ``unlink`` are seams: tests pass a stand-in that enforces byte-range locks and
    refuses to remove a file some descriptor has open, as Windows does."""

    remove_while_locked = False

    def __init__(self, msvcrt: Any = None, unlink: Callable[[Path], None] | None = None) -> None:
        if msvcrt is None:  # pragma: no cover - Windows
            import msvcrt as windows_msvcrt

            msvcrt = windows_msvcrt
        self._msvcrt = msvcrt
        self._unlink = unlink if unlink is not None else Path.unlink

    def try_lock(self, fd: int) -> bool:
        os.lseek(fd, LOCK_OFFSET, os.SEEK_SET)
        try:
            self._msvcrt.locking(fd, self._msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True

    def unlock(self, fd: int) -> None:
        os.lseek(fd, LOCK_OFFSET, os.SEEK_SET)
        self._msvcrt.locking(fd, self._msvcrt.LK_UNLCK, 1)

    def remove(self, path: Path) -> None:
        self._unlink(path)


def platform_locks() -> PlatformLocks:
    return WindowsLocks() if sys.platform == "win32" else PosixLocks()


class ControlBlockLock:
    """Held from construction to :meth:`release`; raises :class:`LaunchError` when another process holds
    it. ``folder`` (default: the system temporary folder) and ``locks`` (default: this OS's) are seams for
    tests."""

    def __init__(
        self,
        guid_string: str,
        *,
        folder: str | os.PathLike[str] | None = None,
        locks: PlatformLocks | None = None,
    ) -> None:
        self.path = lock_path(guid_string, folder)
        self._locks = locks if locks is not None else platform_locks()
        self._fd: int | None = None
        self._fd, locked = _open_and_lock(self.path, self._locks)
        if not locked:
            owner = _read_owner(self._fd)
            os.close(self._fd)  # not locked: nothing to unlock
            self._fd = None
            stop = f"Ctrl+C in its terminal, or kill {owner}" if owner else "Ctrl+C in its terminal"
            # torchrun is named only where it is the cause: a rank of a torchrun that runs the trainer
            # itself instead of the drop-in's scale-out (docs/scale-out.md).
            torchrun = (
                " Under torchrun only rank 0 talks to the game: run the drop-in itself under torchrun, not "
                "a trainer per rank."
                if "LOCAL_RANK" in os.environ
                else ""
            )
            raise LaunchError(
                f"another la-trainer process{f' (pid {owner})' if owner else ''} already serves control block "
                f"{guid_string}; two trainers on one block would take each other's hand-offs. Stop that trainer "
                f"first ({stop}), or give this trainer and its game another GUID (--guid, and "
                f"-LearningAgentsControlsGuid on the game).{torchrun}"
            )
        os.lseek(self._fd, 0, os.SEEK_SET)
        os.write(self._fd, str(os.getpid()).ljust(PID_FIELD).encode("ascii"))

    def release(self) -> None:
        """Give the lock up and remove its file (idempotent). Where an open file can be removed (POSIX) it
        goes first, while the lock is still held, so a newcomer either fails on this file or creates a new
        one (checked after locking). Elsewhere (Windows) the file is closed first and then removed; a
        newcomer that opened it in between keeps it (the removal fails on its open handle). A process that
        ends without releasing leaves the file, unlocked by the kernel, for the next one to reuse."""
        fd = self._fd
        if fd is None:
            return
        ours = _same_file(fd, self.path)
        if ours and self._locks.remove_while_locked:
            with contextlib.suppress(OSError):
                self._locks.remove(self.path)
        self._close()
        if ours and not self._locks.remove_while_locked:
            with contextlib.suppress(OSError):
                self._locks.remove(self.path)

    def _close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                self._locks.unlock(fd)
            os.close(fd)

    def __enter__(self) -> ControlBlockLock:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


class OutputFolderLock(ControlBlockLock):
    """One run per output folder: ``offline --out`` and ``record --out`` hold it while they train, so a
    second run into the same folder is refused at once (exit 2) instead of overwriting the first's
    networks, status file and run record unnoticed. The same OS lock as :class:`ControlBlockLock`
    (released by the kernel however the process ends, so a killed run never blocks the next), in a
    hidden file of the folder itself (:data:`OUTPUT_LOCK_NAME`), which a clean release removes."""

    def __init__(
        self, folder: str | os.PathLike[str], *, option: str = "--out", locks: PlatformLocks | None = None
    ) -> None:
        # Not ControlBlockLock.__init__: another file and another refusal; release() and the context
        # manager are shared.
        self.path = Path(folder) / OUTPUT_LOCK_NAME
        self._locks = locks if locks is not None else platform_locks()
        self._fd: int | None = None
        self._fd, locked = _open_and_lock(self.path, self._locks)
        if not locked:
            owner = _read_owner(self._fd)
            os.close(self._fd)  # not locked: nothing to unlock
            self._fd = None
            raise LaunchError(
                f"another la-trainer run{f' (pid {owner})' if owner else ''} is training into {str(folder)!r} "
                f"({option}); two runs in one folder would overwrite each other's networks, status file and run "
                f"record. Wait for it to end (la-trainer watch {str(folder)!r}), or choose another folder "
                f"with {option}."
            )
        # The owner's pid is for the refusal message only: a full disk (the lock file itself takes none)
        # must not keep a run from its folder.
        with contextlib.suppress(OSError):
            os.lseek(self._fd, 0, os.SEEK_SET)
            os.write(self._fd, str(os.getpid()).ljust(PID_FIELD).encode("ascii"))


def _open_and_lock(path: Path, locks: PlatformLocks) -> tuple[int, bool]:
    """Open (creating) the lock file ``path`` and try its lock without waiting: the descriptor, and
    whether this process now holds the lock (False: another process does; the caller closes it)."""
    for _ in range(_ATTEMPTS):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            locked = locks.try_lock(fd)
        except BaseException:
            os.close(fd)
            raise
        if locked and not _same_file(fd, path):
            locks.unlock(fd)
            os.close(fd)  # locked a file its holder removed on release in the meantime: start again
            continue
        return fd, locked
    # Needs a holder releasing and a newcomer locking 100 times in a row.
    raise LaunchError(
        f"the lock file {path} keeps changing under this trainer; try again"
    )  # pragma: no cover


def _same_file(fd: int, path: Path) -> bool:
    """The open ``fd`` is still the file at ``path`` (not one removed and created anew since)."""
    try:
        mine, current = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (mine.st_dev, mine.st_ino) == (current.st_dev, current.st_ino)


def _read_owner(fd: int) -> str:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, PID_FIELD).decode("ascii", errors="replace").strip()
    except OSError:
        return ""
    return text if text.isdigit() else ""
