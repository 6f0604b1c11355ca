"""One trainer per control block: an exclusive OS lock held while a process serves it.

Two trainers on one control block (``torchrun scripts/train.py`` before it became the scale-out trainer,
a user starting a second attach-mode trainer with the same GUID) corrupt each other's hand-offs: both
clear ConfigSignal, both request networks, one waits forever. So the trainer that opens a control block
first takes an exclusive lock named after its GUID, and a second one is refused at once.

Why a lock file and not a marker in the control block: the block is the engine's (all ten int32 slots
have engine meanings, and on Windows the mapping is exactly 40 bytes), and a marker written by a trainer
that crashed would stay there and refuse every later trainer. An OS lock (``flock`` on POSIX,
``msvcrt.locking`` on Windows) is released by the kernel when its process ends, however it ends, so a
crashed first trainer never blocks the next. The file lives in the system temporary folder (control
blocks are machine-wide names), is named after the GUID as the engine prints it, and holds the owner's
process id for the message. A clean release removes it (while still holding the lock; a newcomer checks
after locking that it locked the file that is there), so nothing is left behind.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from pathlib import Path
from types import TracebackType

from trainer.errors import LaunchError

__all__ = ["ControlBlockLock", "lock_path"]

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_ATTEMPTS = 100


def lock_path(guid_string: str, folder: str | os.PathLike[str] | None = None) -> Path:
    """The lock file of the control block ``guid_string`` (``{...}`` or a short GUID)."""
    name = _UNSAFE.sub("", guid_string)
    return Path(folder if folder is not None else tempfile.gettempdir()) / f"la-trainer-controls-{name}.lock"


class ControlBlockLock:
    """Held from construction to :meth:`release`; raises :class:`LaunchError` when another process holds
    it. ``folder`` (default: the system temporary folder) is a seam for tests."""

    def __init__(self, guid_string: str, *, folder: str | os.PathLike[str] | None = None) -> None:
        self.path = lock_path(guid_string, folder)
        self._fd: int | None = None
        for _ in range(_ATTEMPTS):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                locked = _try_lock(fd)
            except BaseException:
                os.close(fd)
                raise
            if locked and not _same_file(fd, self.path):
                os.close(fd)  # locked a file its holder removed on release in the meantime: start again
                continue
            self._fd = fd
            break
        else:  # pragma: no cover - needs a holder releasing and a newcomer locking 100 times in a row
            raise LaunchError(f"the lock file {self.path} keeps changing under this trainer; try again")
        if not locked:
            owner = _read_owner(self._fd)
            self._close()
            raise LaunchError(
                f"another la-trainer process{f' (pid {owner})' if owner else ''} already serves control block "
                f"{guid_string}; two trainers on one block would take each other's hand-offs. Under torchrun "
                "only rank 0 talks to the game (run the drop-in itself under torchrun, not a second trainer); "
                "otherwise stop the other trainer first."
            )
        os.ftruncate(self._fd, 0)
        os.write(self._fd, str(os.getpid()).encode())

    def release(self) -> None:
        """Give the lock up and remove its file (idempotent). The file goes first, while the lock is still
        held, so a newcomer either fails on this file or creates a new one (checked after locking); a
        process that ends without releasing leaves the file, unlocked by the kernel, for the next one."""
        if self._fd is not None and sys.platform != "win32":
            with contextlib.suppress(OSError):
                if _same_file(self._fd, self.path):
                    self.path.unlink()
        self._close()

    def _close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                _unlock(fd)
            os.close(fd)

    def __enter__(self) -> ControlBlockLock:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


def _try_lock(fd: int) -> bool:
    if sys.platform == "win32":  # pragma: no cover - Windows
        import msvcrt

        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _unlock(fd: int) -> None:
    if sys.platform == "win32":  # pragma: no cover - Windows
        import msvcrt

        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
        return
    import fcntl

    fcntl.flock(fd, fcntl.LOCK_UN)


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
        text = os.read(fd, 32).decode("ascii", errors="replace").strip()
    except OSError:
        return ""
    return text if text.isdigit() else ""
