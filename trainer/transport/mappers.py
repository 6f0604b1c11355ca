"""Which other processes map a shared-memory region: the liveness of a game we did not spawn.

In attach mode (``la-trainer shm --create``) the trainer creates the control block and the game maps it;
no process handle, no connection and no parent process show whether that game still runs, and the block
is ours, so its existence says nothing either. The kernel does know who maps it:

* **Linux**: a POSIX shared-memory object is the file ``/dev/shm/<name>``; every process that maps it has
  a line naming that file (and its inode) in ``/proc/<pid>/maps``, and the line disappears with the
  process, however it ends (SIGKILL included). A game is alive while a process other than this trainer
  and its descendants (which inherit our mappings across ``fork``) maps the block.
* **Elsewhere** (Windows, macOS): not available here; the caller keeps its bounded wait and says so.
  [Windows would need the handle count of the file mapping object (``NtQueryObject``), undocumented
  enough that without a Windows machine to prove it on, the bound stays.]

``/proc/<pid>/maps`` of another user's process is unreadable without privileges, so a game run by another
user is invisible: :func:`find_mappers` then finds nobody, and the caller falls back to its bound.

Cost: a full scan reads every process's ``maps`` (done once, when the game has shown itself by raising
ConfigSignal); afterwards :class:`MapperWatch` re-reads only the maps of the processes it found, at most
every :data:`MAPS_RECHECK_S` seconds.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable
from pathlib import Path

__all__ = ["MapperWatch", "find_mappers", "mapper_scan_available"]

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
