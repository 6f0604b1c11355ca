"""Which other processes map a shared-memory region: the liveness of a game we did not spawn.

In attach mode (``la-trainer shm --create``) the trainer creates the control block and the game maps it;
no process handle, no connection and no parent process show whether that game still runs, and the block
is ours, so its existence says nothing either. The kernel does know who maps it:

* **Linux**: a POSIX shared-memory object is the file ``/dev/shm/<name>``; every process that maps it has
  a line naming that file (and its inode) in ``/proc/<pid>/maps``, and the line disappears with the
  process, however it ends (SIGKILL included). A game is alive while a process other than this trainer
  and its descendants (which inherit our mappings across ``fork``) maps the block.
* **Windows**: a named file mapping lives while a handle to it is open, and the engine keeps the handle
  it opened the block with until it unmaps the block (``FWindowsPlatformMemory::MapNamedSharedMemoryRegion``
  stores it in the region; ``UnmapNamedSharedMemoryRegion`` closes it; a killed process's handles are
  closed by the kernel). ``NtQueryObject(ObjectBasicInformation)`` tells how many handles to the mapping
  are open in all processes: :class:`HandleCountWatch` counts ours before any game comes (the baseline)
  and sees the game while the count is above it. The call and its structure are declared in
  :mod:`trainer.system.win32` and checked against the documented signature; no Windows machine runs
  it here, so a count that cannot be read keeps the bound (never a game judged gone on a failed call).
* **Elsewhere** (macOS): not available; the caller keeps its bounded wait and says so.

``/proc/<pid>/maps`` of another user's process is unreadable without privileges, so a game run by another
user is invisible: :func:`find_mappers` then finds nobody, and the caller falls back to its bound.

Cost: a full scan reads every process's ``maps`` (done once, when the game has shown itself by raising
ConfigSignal); afterwards :class:`MapperWatch` re-reads only the maps of the processes it found, at most
every :data:`MAPS_RECHECK_S` seconds.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from trainer.system import win32

__all__ = [
    "GameWatch",
    "HandleCountWatch",
    "MapperWatch",
    "find_mappers",
    "game_watch",
    "mapper_scan_available",
]

_PROC = Path("/proc")
_DEV_SHM = "/dev/shm/"
MAPS_RECHECK_S = 2.0
"""Between two reads of the game's ``maps`` (an editor's runs to megabytes), :meth:`MapperWatch.alive`
only checks that its processes exist (a killed process's ``/proc`` entry goes once its parent reaps it;
the maps read also catches a zombie, or a process that unmapped the block)."""


def mapper_scan_available(platform: str | None = None) -> bool:
    """Whether this platform shows who maps a region (Linux with ``/proc`` and ``/dev/shm``)."""
    return (platform or sys.platform).startswith("linux") and (_PROC / "self" / "maps").exists()


def _region_path(name: str) -> str:
    """``/dev/shm/<name>`` for a POSIX shm name (with or without its leading slash)."""
    return _DEV_SHM + name.lstrip("/")


def _inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def _maps_region(pid: int | str, path: str, inode: int | None) -> bool:
    """True when process ``pid`` maps ``path`` (matched by name and, where known, inode)."""
    try:
        with open(_PROC / str(pid) / "maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                # "start-end perms offset dev inode   pathname"; the pathname may end in " (deleted)".
                if path not in line:
                    continue
                fields = line.split(maxsplit=5)
                if len(fields) < 6:
                    continue
                named = fields[5].rstrip("\n").removesuffix(" (deleted)")
                if named != path:
                    continue
                if inode is None or fields[4] == str(inode):
                    return True
    except OSError:
        pass  # ended, or not ours to read
    return False


def _parent(pid: int) -> int | None:
    try:
        stat = (_PROC / str(pid) / "stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ")".
    try:
        return int(stat[stat.rindex(")") + 2 :].split()[1])
    except (ValueError, IndexError):
        return None


def _descends_from(pid: int, ancestor: int) -> bool:
    seen = 0
    while pid > 1 and seen < 64:
        if pid == ancestor:
            return True
        parent = _parent(pid)
        if parent is None:
            return False
        pid, seen = parent, seen + 1
    return False


def find_mappers(name: str, *, exclude_pid: int | None = None) -> set[int]:
    """Processes other than ``exclude_pid`` (default: ours) and its descendants that map region ``name``.

    Empty where the platform cannot tell (:func:`mapper_scan_available`) or nobody else maps it.
    """
    if not mapper_scan_available():
        return set()
    own = os.getpid() if exclude_pid is None else exclude_pid
    path = _region_path(name)
    inode = _inode(path)
    found: set[int] = set()
    try:
        entries: Iterable[str] = os.listdir(_PROC)
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        pid = int(entry)
        if pid == own or not _maps_region(pid, path, inode):
            continue
        if not _descends_from(pid, own):
            found.add(pid)
    return found


class MapperWatch:
    """The game's liveness through the processes that map region ``name`` (Linux, attach mode).

    :meth:`attach` looks for them (a full scan; call it once the game has shown itself, e.g. when it
    raised ConfigSignal) and says whether any was found; afterwards :meth:`alive` is True while at least
    one of them still maps the region (re-reading only their maps). A watch that found nobody reports
    alive (it cannot tell; the caller's bound applies).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._path = _region_path(name)
        self._inode = _inode(self._path)
        self.pids: set[int] = set()
        """The game's processes found by :meth:`attach` that still map the region."""
        self.watching = False
        """:meth:`attach` found the game: :meth:`alive` tells."""
        self._maps_due = 0.0

    def attach(self) -> bool:
        """Find the processes that map the region now; True when at least one was found."""
        self.pids = find_mappers(self.name)
        self.watching = bool(self.pids)
        return self.watching

    def alive(self) -> bool:
        """True while a process found by :meth:`attach` still maps the region (or none was found)."""
        if not self.watching:
            return True
        self.pids = {pid for pid in self.pids if (_PROC / str(pid)).exists()}
        now = time.monotonic()
        if self.pids and now >= self._maps_due:
            self._maps_due = now + MAPS_RECHECK_S
            self.pids = {pid for pid in self.pids if _maps_region(pid, self._path, self._inode)}
        return bool(self.pids)

    def describe(self) -> str:
        """Who was found, for the log line that says which liveness check runs."""
        pids = ", ".join(str(pid) for pid in sorted(self.pids))
        return f"the game (pid {pids}) maps the control block"

    def close(self) -> None:
        """Nothing to release (the maps are read by path)."""


class GameWatch(Protocol):
    """The liveness of a game that maps our control block (:class:`MapperWatch`, :class:`HandleCountWatch`)."""

    @property
    def watching(self) -> bool:
        """:meth:`attach` found the game: :meth:`alive` tells."""

    def attach(self) -> bool:
        """Look for the game now that it has shown itself; True when it can be followed."""

    def alive(self) -> bool:
        """False once the game that :meth:`attach` found is gone (True while it cannot tell)."""

    def describe(self) -> str:
        """What :meth:`attach` found, for the log."""

    def close(self) -> None:
        """Release what the watch holds."""


FILE_MAP_READ = 0x0004
OBJECT_BASIC_INFORMATION = 0
"""``ObjectBasicInformation`` of ``OBJECT_INFORMATION_CLASS``."""


class HandleCountWatch:
    """Windows: the game's liveness through the number of open handles to our control block's mapping.

    Made when the block is created, before any game can have opened it: it opens one handle of its own
    (read access: the query needs none in particular) and takes the count then as the baseline, which
    holds every handle of this trainer. Once the game has shown itself, :meth:`attach` is True when the
    count is above the baseline, and :meth:`alive` stays True while it is. A count that cannot be read
    (the open or the query failed) makes the watch unable to tell: never a game judged gone on a failed
    call. ``kernel32``/``ntdll`` are seams for tests.
    """

    def __init__(
        self, name: str, *, kernel32: win32.Library | None = None, ntdll: win32.Library | None = None
    ) -> None:
        self.name = name
        self._kernel32 = kernel32 if kernel32 is not None else win32.kernel32()
        self._ntdll = ntdll if ntdll is not None else win32.ntdll()
        self._handle: int | None = self._kernel32.OpenFileMappingW(FILE_MAP_READ, False, name) or None
        self.baseline = self.handle_count()
        """Open handles to the mapping before any game (all of them this trainer's)."""
        self.found = 0
        """Handles above the baseline when :meth:`attach` looked (the game's)."""
        self.watching = False

    def handle_count(self) -> int | None:
        """Open handles to the mapping in all processes, or None when it cannot be read."""
        if self._handle is None:
            return None
        info = win32.PUBLIC_OBJECT_BASIC_INFORMATION()
        status = self._ntdll.NtQueryObject(
            self._handle, OBJECT_BASIC_INFORMATION, ctypes.byref(info), ctypes.sizeof(info), None
        )
        return int(info.HandleCount) if status >= 0 else None

    def attach(self) -> bool:
        count = self.handle_count()
        if self.baseline is None or count is None or count <= self.baseline:
            self.watching = False
            return False
        self.found = count - self.baseline
        self.watching = True
        return True

    def alive(self) -> bool:
        if not self.watching:
            return True
        count = self.handle_count()
        return count is None or self.baseline is None or count > self.baseline

    def describe(self) -> str:
        return f"the game holds {self.found} handle(s) to the control block's mapping"

    def close(self) -> None:
        if self._handle is not None:
            self._kernel32.CloseHandle(self._handle)
            self._handle = None


def game_watch(name: str, platform: str | None = None) -> GameWatch | None:
    """The watch this platform offers for region ``name`` (None: the game's liveness cannot be seen).

    Make it when the control block has just been created, before any game: the Windows watch takes its
    baseline then. ``platform`` is the name the link works under; a Windows watch also needs this process
    to run on Windows (tests run the link under other platform names).
    """
    platform = platform or sys.platform
    if mapper_scan_available(platform):
        return MapperWatch(name)
    if platform == "win32" and sys.platform == "win32":  # pragma: no cover - Windows
        return HandleCountWatch(name)
    return None
