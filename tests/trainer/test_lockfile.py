"""trainer.system.lockfile: one trainer per control block, robust to a crashed holder; the Windows path
(byte-range lock past the pid, close-then-remove) through a stand-in for the rules Windows enforces."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from emulator.game import ShmGame
from emulator.launch import REPO_ROOT
from trainer.dropin.pinger import rank0_holds
from trainer.errors import LaunchError
from trainer.session.links import ShmTrainerLink
from trainer.system.lockfile import ControlBlockLock, WindowsLocks, lock_path

GUID = "{0A1B2C3D-4E5F-6071-8293-A4B5C6D7E8F9}"


def test_a_second_holder_is_refused_naming_the_first(tmp_path: Path) -> None:
    with ControlBlockLock(GUID, folder=tmp_path):
        with pytest.raises(LaunchError) as info:
            ControlBlockLock(GUID, folder=tmp_path)
        assert f"pid {os.getpid()}" in str(info.value) and GUID in str(info.value)
        assert "another GUID" in str(info.value)  # torchrun only under torchrun (issue 31 item 3)
    with ControlBlockLock(GUID, folder=tmp_path):  # released: free again
        pass
    assert not lock_path(GUID, tmp_path).exists()  # a clean release leaves nothing behind


def test_other_blocks_are_independent(tmp_path: Path) -> None:
    with ControlBlockLock(GUID, folder=tmp_path), ControlBlockLock("{" + "1" * 8 + GUID[9:], folder=tmp_path):
        pass


def test_a_holder_killed_with_sigkill_does_not_block_the_next(tmp_path: Path) -> None:
    code = (
        "import sys, time\n"
        f"sys.path.insert(0, {str(REPO_ROOT)!r})\n"
        "from trainer.system.lockfile import ControlBlockLock\n"
        f"lock = ControlBlockLock({GUID!r}, folder={str(tmp_path)!r})\n"
        "print('held', flush=True)\n"
        "time.sleep(60)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(LaunchError, match=f"pid {holder.pid}"):
            ControlBlockLock(GUID, folder=tmp_path)
        holder.send_signal(signal.SIGKILL)
        holder.wait(30)
        assert lock_path(GUID, tmp_path).exists()  # the crashed holder left its file ...
        started = time.monotonic()
        with ControlBlockLock(GUID, folder=tmp_path):  # ... and the kernel its lock
            assert time.monotonic() - started < 1.0
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(30)


def test_a_second_link_on_a_served_control_block_is_refused(tmp_path: Path) -> None:
    game = ShmGame.create(tmp_path / "Configs", timeout=5.0)
    try:
        with ShmTrainerLink(tmp_path / "Configs", game.controls_guid):
            with pytest.raises(LaunchError, match="already serves control block"):
                ShmTrainerLink(tmp_path / "Configs", game.controls_guid)
        with ShmTrainerLink(tmp_path / "Configs", game.controls_guid):  # after close: free again
            pass
    finally:
        game.close()


# --- the Windows path (WindowsLocks), run on Linux through a stand-in for what Windows enforces ----------


class WindowsRules:
    """``msvcrt.locking`` as the CRT and Windows do it, and Windows' refusal to remove an open file.

    A lock covers ``nbytes`` from the descriptor's current position and is mandatory: any overlapping lock
    is refused, and a read of a locked byte fails for every other descriptor (:meth:`readable`). A file
    some descriptor of this process has open cannot be removed (ERROR_SHARING_VIOLATION): the test's
    trainers are all in this process, so /proc/self/fd lists every open handle."""

    LK_UNLCK, LK_LOCK, LK_NBLCK = 0, 1, 2

    def __init__(self) -> None:
        self.held: dict[tuple[int, int], list[tuple[int, int, int]]] = {}

    @staticmethod
    def _key(fd: int) -> tuple[int, int]:
        info = os.fstat(fd)
        return info.st_dev, info.st_ino

    def locking(self, fd: int, mode: int, nbytes: int) -> None:
        start = os.lseek(fd, 0, os.SEEK_CUR)
        span = (start, start + nbytes, fd)
        ranges = self.held.setdefault(self._key(fd), [])
        if mode == self.LK_UNLCK:
            if span not in ranges:
                raise PermissionError(13, "Permission denied")
            ranges.remove(span)
        elif any(lo < start + nbytes and start < hi for lo, hi, _ in ranges):
            raise PermissionError(13, "Permission denied")
        else:
            ranges.append(span)

    def readable(self, path: Path, size: int) -> bool:
        """A reader with its own descriptor gets bytes 0..size: no lock covers any of them."""
        info = path.stat()
        return not any(lo < size for lo, _, _ in self.held.get((info.st_dev, info.st_ino), []))

    def died(self, fd: int) -> None:
        """The holder's process ended: the kernel drops its locks and closes its handle."""
        for ranges in self.held.values():
            ranges[:] = [span for span in ranges if span[2] != fd]
        os.close(fd)

    def unlink(self, path: Path) -> None:
        info = path.stat()
        for name in os.listdir("/proc/self/fd"):
            try:
                other = os.stat(f"/proc/self/fd/{name}")
            except OSError:
                continue  # the listing's own descriptor, closed by now
            if (other.st_dev, other.st_ino) == (info.st_dev, info.st_ino):
                raise PermissionError(32, "The process cannot access the file: it is being used")
        path.unlink()


@pytest.fixture
def windows() -> tuple[WindowsRules, WindowsLocks]:
    rules = WindowsRules()
    return rules, WindowsLocks(rules, unlink=rules.unlink)


def test_windows_the_owner_pid_is_readable_while_the_lock_is_held(
    tmp_path: Path, windows: tuple[WindowsRules, WindowsLocks]
) -> None:
    """Windows enforces byte-range locks: a lock on the pid's bytes would make it unreadable (the refusal
    message and the scale-out pinger read it while rank 0 holds the lock)."""
    rules, locks = windows
    with ControlBlockLock(GUID, folder=tmp_path, locks=locks):
        path = lock_path(GUID, tmp_path)
        assert rules.held and rules.readable(path, 4096)  # held, and a reader's first 4 KiB are free
        assert path.read_text(encoding="ascii").strip() == str(os.getpid())
        assert rank0_holds(path) is False  # it names this process: the pinger's own check reads it
        with pytest.raises(LaunchError, match=f"pid {os.getpid()}"):
            ControlBlockLock(GUID, folder=tmp_path, locks=locks)


def test_windows_a_clean_release_removes_the_file(
    tmp_path: Path, windows: tuple[WindowsRules, WindowsLocks]
) -> None:
    """A file cannot be removed while open on Windows: release closes, then removes (lock files of every
    GUID the engine chose piled up in the temporary folder before)."""
    rules, locks = windows
    for _ in range(2):
        with ControlBlockLock(GUID, folder=tmp_path, locks=locks):
            pass
        assert list(tmp_path.iterdir()) == []
        assert not any(rules.held.values())


def test_windows_a_dead_holders_file_is_reclaimed(
    tmp_path: Path, windows: tuple[WindowsRules, WindowsLocks]
) -> None:
    rules, locks = windows
    crashed = ControlBlockLock(GUID, folder=tmp_path, locks=locks)
    path = lock_path(GUID, tmp_path)
    path.write_bytes(b"999999999           ")  # another process's id, as a crashed trainer left it
    assert crashed._fd is not None
    rules.died(crashed._fd)
    crashed._fd = None
    with ControlBlockLock(GUID, folder=tmp_path, locks=locks):
        assert path.read_text(encoding="ascii").strip() == str(os.getpid())  # the whole old id overwritten
    assert not path.exists()


def test_windows_a_newcomer_that_opened_the_file_keeps_it(
    tmp_path: Path, windows: tuple[WindowsRules, WindowsLocks]
) -> None:
    """The release's removal fails on a newcomer's open handle, and the newcomer's lock stays valid."""
    _, locks = windows
    first = ControlBlockLock(GUID, folder=tmp_path, locks=locks)
    path = lock_path(GUID, tmp_path)
    newcomer_fd = os.open(path, os.O_RDWR)  # opened, not yet locked, when the first one releases
    try:
        first.release()
        assert path.exists()  # the newcomer's handle kept it
        assert locks.try_lock(newcomer_fd)
    finally:
        locks.unlock(newcomer_fd)
        os.close(newcomer_fd)


def test_the_old_windows_lock_covered_the_pid(tmp_path: Path) -> None:
    """The stand-in can fail: a lock on byte 0 (main before issue 22) leaves the pid unreadable."""
    rules = WindowsRules()
    path = tmp_path / "x.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        os.write(fd, b"1234")
        os.lseek(fd, 0, os.SEEK_SET)
        rules.locking(fd, rules.LK_NBLCK, 1)
        assert not rules.readable(path, 4096)
        with pytest.raises(PermissionError):
            rules.unlink(path)
    finally:
        os.close(fd)
