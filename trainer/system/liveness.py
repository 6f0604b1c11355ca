"""Is the game still there? Process-liveness checks that a wait can rely on, on every platform.

A wait on a game that is provably alive needs no bound: an editor paused at a breakpoint, in a level load
or a long hitch stops ticking but keeps its process, its shared-memory regions and its socket (spec §11
item 6), and the engine's own trainers wait for it without a bound. What proves a spawning engine alive:

* **POSIX**: our parent process id is unchanged. When the engine dies we are re-parented (to init or a
  subreaper), so the id changes; comparing with the id at start also works under subreapers.
* **Windows**: a process does not learn of its parent's death from its parent id (orphans are not
  re-parented, and the id may be reused, spec §11 item 8). We open the parent once, at start, with
  ``SYNCHRONIZE`` rights, check that its creation time predates ours (else the id was already reused and
  the parent is gone), and poll the handle: it is signalled when the process has exited. The engine's
  ``Scripts\\python.exe`` is a venv launcher that runs the base interpreter as its child and waits, so
  when our parent is that launcher (its image is our ``sys.executable`` while we run
  ``sys._base_executable``) its parent, the editor, is watched too; the launcher outlives a crashed
  editor. [INF: launcher behaviour of CPython 3.7.2+ venvs on Windows; not run on Windows here.]

**One rule for a failed Windows call** (here and in the attach-mode watch of
:mod:`trainer.session.transport.mappers`): a call that fails tells nothing, so it never judges a process gone.
A process is gone only on a definite answer: ``OpenProcess`` says no process has the id
(``ERROR_INVALID_PARAMETER``), ``WaitForSingleObject`` says the handle is signalled (``WAIT_OBJECT_0``),
or a creation time that was read is later than the process we mean can have (the id was reused). A
``GetProcessTimes`` that fails gives no creation time (no reuse judgement); a ``WaitForSingleObject``
that fails (``WAIT_FAILED``) counts as "still running"; a process that refuses a handle is still there.
(Issue 22: a failed ``GetProcessTimes`` made every engine-spawned run judge its live engine dead.)

Two kinds of look: a *watch* (:func:`parent_watch`, :func:`process_watch`) opens its handles once and
keeps them for the run, for a process that started before this one (the engine); :func:`process_alive`
is one look that closes every handle it opened, for a caller that asks again and again about a process
that may be younger than itself (the pinger looking for scale-out rank 0, ``la-trainer watch``).

The Windows calls sit behind :class:`Win32Processes` (a small seam) so their logic is unit-tested on any
platform with a fake (``tests/trainer/test_liveness.py``); :class:`Win32Processes` itself makes every call
through the declared prototypes of :mod:`trainer.system.win32`, and is tested on Linux through a fake
kernel32 that converts arguments and results as ctypes does, with handles above 32 bits.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from collections.abc import Callable
from typing import Protocol

from trainer.system import win32

__all__ = [
    "ProcessApi",
    "Win32Processes",
    "parent_watch",
    "process_alive",
    "process_watch",
]

_LAUNCHER_DEPTH = 2
"""Processes watched at most: the parent and, when the parent is the venv launcher, its parent."""

_FILETIME_UNIX_EPOCH = 116_444_736_000_000_000
"""1970-01-01 in FILETIME ticks (100 ns since 1601-01-01), to compare a creation time with a file time."""
_STARTED_BY_SLACK_S = 2.0
"""Allowance when a creation time is compared with a file's modification time: FAT keeps those to 2 s."""


class ProcessApi(Protocol):
    """The Windows process calls the watch needs (handles are opaque integers)."""

    def open(self, pid: int) -> int | None:
        """A handle with SYNCHRONIZE and query rights, or None when no such process exists (any more).
        Raises OSError when the process exists but grants no such handle."""
        ...

    def creation_time(self, handle: int) -> int:
        """The process's creation time (FILETIME ticks); 0 when it cannot be read (the rule above: no
        reuse judgement then)."""
        ...

    def own_creation_time(self) -> int:
        """This process's creation time (FILETIME ticks); 0 when it cannot be read."""
        ...

    def exited(self, handle: int) -> bool:
        """True once the process has exited (its handle is signalled); False while it runs and when the
        wait fails (the rule above: a failed call never judges a process gone)."""
        ...

    def image_path(self, handle: int) -> str:
        """The full path of the process's executable ("" when it cannot be read)."""
        ...

    def parent_pid(self, pid: int) -> int | None:
        """The id of the process that created ``pid`` (None when it cannot be found)."""
        ...

    def close(self, handle: int) -> None:
        """Release a handle from :meth:`open`."""
        ...


def parent_watch(
    *, platform: str | None = None, api: ProcessApi | None = None, executable: str | None = None
) -> Callable[[], bool]:
    """A liveness check for the engine that spawned us: True while it runs, False once it is gone.

    ``platform``, ``api`` and ``executable`` are seams for tests (default: ``sys.platform``, the real
    Win32 calls, ``sys.executable``).
    """
    if (platform or sys.platform) != "win32":
        initial = os.getppid()
        return lambda: os.getppid() == initial
    return _windows_watch(os.getppid(), api or Win32Processes(), executable or sys.executable)


def process_watch(
    pid: int, *, platform: str | None = None, api: ProcessApi | None = None, executable: str | None = None
) -> Callable[[], bool]:
    """A liveness check for the process ``pid`` that started before this one (e.g. the engine of a
    scale-out job, whose ranks are torchrun's children): True while it runs. On Windows it holds its
    handles for as long as it is kept; a process created after this one is taken for a reused id. For a
    process that may be younger, or a question asked again and again, use :func:`process_alive`."""
    if (platform or sys.platform) != "win32":
        return lambda: _posix_process_alive(pid)
    return _windows_watch(pid, api or Win32Processes(), executable or sys.executable)


def process_alive(
    pid: int, *, started_by: float | None = None, platform: str | None = None, api: ProcessApi | None = None
) -> bool:
    """One look at the process ``pid``: True while it runs. On Windows every handle it opens is closed
    before it returns, so a caller that polls holds none, and the process may be younger than this one.

    ``started_by``: a wall-clock time (``time.time()`` seconds) by which the process we mean had started,
    e.g. the moment it wrote the file that gave us its id; a process with that id created later is
    another one (the id was reused). None: no such check. Failed calls follow the module's rule.
    """
    if (platform or sys.platform) != "win32":
        return _posix_process_alive(pid)
    api = api or Win32Processes()
    try:
        handle = api.open(pid)
    except OSError:
        return True  # it exists but grants no handle: still there
    if handle is None:
        return False
    try:
        if api.exited(handle):
            return False
        if started_by is None:
            return True
        created = api.creation_time(handle)
        latest = _FILETIME_UNIX_EPOCH + int((started_by + _STARTED_BY_SLACK_S) * 10_000_000)
        return not (created and created > latest)
    finally:
        api.close(handle)


def _posix_process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: existence and permission check only, nothing is delivered
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, under another user
    return True


def _windows_watch(pid: int, api: ProcessApi, executable: str) -> Callable[[], bool]:
    """Handles on ``pid`` and, through a venv launcher, its parent; False at once when one is gone."""
    own_start = api.own_creation_time()
    handles: list[int] = []
    current: int | None = pid
    for _ in range(_LAUNCHER_DEPTH):
        if current is None:
            break
        try:
            handle = api.open(current)
        except OSError:
            # It exists but grants no handle (access denied): nothing to wait on. Our parent keeps being
            # asked whether its id still names a process, which is weaker (an id can be reused) but never
            # judges a live engine dead; a launcher's parent is left to the launcher's handle.
            return (
                functools.partial(_exists, api, current) if not handles else _any_exited_is_dead(api, handles)
            )
        created = api.creation_time(handle) if handle is not None else 0
        if handle is None or (created and own_start and created > own_start) or api.exited(handle):
            # Gone before we looked, or the id already belongs to a newer process: the engine is gone.
            # (A creation time that could not be read, ours or its, is 0: no judgement, the module's rule.)
            if handle is not None:
                api.close(handle)
            for held in handles:
                api.close(held)
            return lambda: False
        handles.append(handle)
        if not _is_venv_launcher(api.image_path(handle), executable):
            break
        current = api.parent_pid(current)
    return _any_exited_is_dead(api, handles)


def _any_exited_is_dead(api: ProcessApi, handles: list[int]) -> Callable[[], bool]:
    return lambda: not any(api.exited(h) for h in handles)


def _exists(api: ProcessApi, pid: int) -> bool:
    try:
        handle = api.open(pid)
    except OSError:
        return True  # still refused: still there
    if handle is None:
        return False
    try:
        return not api.exited(handle)
    finally:
        api.close(handle)


def _is_venv_launcher(image: str, executable: str) -> bool:
    # In a venv child, sys.executable is the launcher's path (Scripts\python.exe) while the interpreter
    # that runs is sys._base_executable; a parent whose image is sys.executable is that launcher.
    base = getattr(sys, "_base_executable", executable)
    return bool(image) and _same_path(image, executable) and not _same_path(executable, base)


def _same_path(a: str, b: str) -> bool:
    return os.path.normcase(os.path.normpath(a)) == os.path.normcase(os.path.normpath(b))


class Win32Processes:
    """:class:`ProcessApi` through ``kernel32``, every call with its declared prototype
    (:mod:`trainer.system.win32`). ``kernel32`` and ``last_error`` are seams: tests pass a fake library
    whose functions convert arguments and results as ctypes does, so a missing or wrong prototype (a
    64-bit handle cut to 32 bits) shows on Linux too."""

    SYNCHRONIZE = 0x00100000
    PROCESS_QUERY_LIMITED_INFORMATION = 0x1000
    WAIT_OBJECT_0 = 0x0
    WAIT_TIMEOUT = 0x102
    TH32CS_SNAPPROCESS = 0x2
    IMAGE_PATH_CHARS = 32768

    def __init__(
        self, kernel32: win32.Library | None = None, last_error: Callable[[], int] | None = None
    ) -> None:
        self._k32 = kernel32 if kernel32 is not None else win32.kernel32()
        self._last_error = last_error if last_error is not None else win32.last_error

    def open(self, pid: int) -> int | None:
        handle = self._k32.OpenProcess(self.SYNCHRONIZE | self.PROCESS_QUERY_LIMITED_INFORMATION, False, pid)
        if handle:
            return int(handle)
        error = self._last_error()
        if error == win32.ERROR_INVALID_PARAMETER:  # what OpenProcess says of an id no process has
            return None
        raise win32.error(error, f"OpenProcess({pid})")

    def _times(self, handle: int) -> int:
        created, exited, kernel, user = win32.FILETIME(), win32.FILETIME(), win32.FILETIME(), win32.FILETIME()
        ref = ctypes.byref
        if not self._k32.GetProcessTimes(handle, ref(created), ref(exited), ref(kernel), ref(user)):
            return 0
        return created.ticks

    def creation_time(self, handle: int) -> int:
        return self._times(handle)

    def own_creation_time(self) -> int:
        return self._times(self._k32.GetCurrentProcess())

    def exited(self, handle: int) -> bool:
        # Only WAIT_OBJECT_0 says it has exited; WAIT_FAILED (0xFFFFFFFF: a handle without SYNCHRONIZE,
        # an invalid one) tells nothing, and the module's rule counts that as running.
        return bool(self._k32.WaitForSingleObject(handle, 0) == self.WAIT_OBJECT_0)

    def image_path(self, handle: int) -> str:
        size = win32.DWORD(self.IMAGE_PATH_CHARS)
        buffer = ctypes.create_unicode_buffer(size.value)
        if not self._k32.QueryFullProcessImageNameW(handle, 0, buffer, ctypes.byref(size)):
            return ""
        return str(buffer.value)

    def parent_pid(self, pid: int) -> int | None:
        snapshot = self._k32.CreateToolhelp32Snapshot(self.TH32CS_SNAPPROCESS, 0)
        if not snapshot or snapshot == win32.INVALID_HANDLE_VALUE:
            return None
        try:
            entry = win32.PROCESSENTRY32W()
            entry.dwSize = ctypes.sizeof(win32.PROCESSENTRY32W)
            found = self._k32.Process32FirstW(snapshot, ctypes.byref(entry))
            while found:
                if entry.th32ProcessID == pid:
                    return int(entry.th32ParentProcessID)
                found = self._k32.Process32NextW(snapshot, ctypes.byref(entry))
            return None
        finally:
            self._k32.CloseHandle(snapshot)

    def close(self, handle: int) -> None:
        self._k32.CloseHandle(handle)
