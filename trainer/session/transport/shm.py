"""Shared-memory regions named by the engine's GUIDs (spec §2.1, §2.2, §2.5).

The engine creates every region except, in attach mode, the 40-byte control block, which the trainer
creates before the game starts. Ownership follows the engine's rule: **the creator unlinks**. So
:meth:`SharedRegion.open` maps an engine region and never unlinks it, and :meth:`SharedRegion.create`
registers its name for unlinking on :meth:`~SharedRegion.close`, at interpreter exit, and on SIGTERM /
SIGHUP, so a crashed or killed trainer does not leave a stale control block behind in ``/dev/shm``.

POSIX (Linux, macOS) uses ``posix_ipc`` + :mod:`mmap` with the OS name from
:func:`protocol.guid.os_shm_name` (``"/{GUID}"``). ``multiprocessing.shared_memory`` is not used: its
resource tracker unlinks regions it did not create when our process exits (the reason Epic ships its
own fork, spec §2.1). Windows uses :mod:`mmap` with a tag name: the engine's bare ``{GUID}``, and
``Global\\{GUID}`` as a fallback (run here only through its seams, ``tests/trainer/test_shm_windows.py``;
nothing was run on Windows).
"""

from __future__ import annotations

import atexit
import contextlib
import mmap
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType, TracebackType

from trainer.errors import LaunchError
from trainer.system import win32
from trainer.system.console import warn

__all__ = ["SharedRegion", "region_exists", "unlink_orphaned"]

_WINDOWS = sys.platform == "win32"
_GLOBAL_PREFIX = "Global\\"
"""The session-wide namespace prefix of Windows object names (the engine's fallback naming)."""

if not _WINDOWS:
    import posix_ipc

_CREATE_MODE = 0o600
"""Permissions of a region we create. The engine uses 0666 (minus umask); we restrict the control block
to our own user because anyone who can write it can drive the hand-offs. The game runs as the same user
in every supported setup. [INF: a game running as another user would need a wider mode.]"""


# --- cleanup registry -------------------------------------------------------------------------------
# Names of regions this process created and has not unlinked yet. atexit covers normal exits and
# exceptions; SIGTERM/SIGHUP with their default action kill the process without running atexit, so we
# install a handler for them (only where nobody else has: a CLI handler that raises an exception also
# ends in atexit). SIGKILL cannot be caught: the next run with the same GUID reuses the stale region.

_owned: dict[str, None] = {}
_owned_lock = threading.Lock()
_hooks_installed = False
_FATAL_SIGNALS: tuple[signal.Signals, ...] = () if _WINDOWS else (signal.SIGTERM, signal.SIGHUP)


def _unlink_name(name: str) -> None:
    if _WINDOWS:
        return  # A Windows mapping disappears with its last handle; there is nothing to unlink.
    with contextlib.suppress(posix_ipc.ExistentialError):
        posix_ipc.unlink_shared_memory(name)


def unlink_orphaned(name: str) -> None:
    """Unlink a region of the engine's whose creator died without unlinking it (SIGKILL, a crash): left
    alone it stays in /dev/shm until reboot. Only for a creator that is gone (while it lives, the
    creator unlinks). Best effort; nothing to do on Windows (a mapping goes with its last handle)."""
    with contextlib.suppress(OSError):
        _unlink_name(name)


def _unlink_all_owned() -> None:
    with _owned_lock:
        names = list(_owned)
        _owned.clear()
    for name in names:
        # Best effort at exit: one failing unlink must not keep the others from running.
        with contextlib.suppress(Exception):
            _unlink_name(name)


def _on_fatal_signal(signum: int, frame: FrameType | None) -> None:
    _unlink_all_owned()
    # Die the way the default action would, so the parent sees "killed by SIGTERM".
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_cleanup_hooks() -> None:
    global _hooks_installed
    if _hooks_installed:
        return
    _hooks_installed = True
    atexit.register(_unlink_all_owned)
    if threading.current_thread() is not threading.main_thread():
        return  # signal.signal only works in the main thread; atexit still covers normal exits.
    for sig in _FATAL_SIGNALS:
        if signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, _on_fatal_signal)


def _register_owned(name: str) -> None:
    with _owned_lock:
        _owned[name] = None
    _install_cleanup_hooks()


def _unregister_owned(name: str) -> bool:
    """Forget ``name``; True when it was registered (so exactly one caller unlinks it)."""
    with _owned_lock:
        if name not in _owned:
            return False
        del _owned[name]
        return True


# --- regions ----------------------------------------------------------------------------------------


class SharedRegion:
    """One mapped shared-memory region; ``buf`` is a writable memoryview of exactly ``size`` bytes.

    Build with :meth:`open` (an engine region) or :meth:`create` (our control block in attach mode).
    ``close()`` is idempotent; numpy views made from ``buf`` must be dropped first (copy data out).
    """

    def __init__(self, name: str, size: int, mapping: mmap.mmap, created: bool, label: str) -> None:
        self.name = name
        """The OS object name (``"/{GUID}"`` on POSIX, ``"{GUID}"`` on Windows)."""
        self.size = size
        """Bytes visible through ``buf`` (the engine's region may be larger: page rounding)."""
        self.created = created
        """True when this process created the region and therefore unlinks it."""
        self.label = label
        self._mmap: mmap.mmap | None = mapping
        self._buf: memoryview | None = memoryview(mapping)

    # -- construction --

    @classmethod
    def open(cls, name: str, size: int, *, label: str = "shared-memory region") -> SharedRegion:
        """Map an existing region (created by the engine) read/write; it is never unlinked by us.

        Raises:
            LaunchError: the region does not exist, is not accessible, or is smaller than ``size``.
        """
        _check_size(size, label)
        if _WINDOWS:
            return cls._open_windows(name, size, label)
        try:
            shm = posix_ipc.SharedMemory(name, 0)
        except posix_ipc.ExistentialError:
            raise LaunchError(
                f"the {label} does not exist (shared-memory name {name!r}). Check that the game is "
                "running, that it created this region (the GUID must come from the same game session), "
                "and that the GUID is written exactly as the engine printed it (names are case-sensitive)."
            ) from None
        except posix_ipc.PermissionsError:
            raise LaunchError(
                f"the {label} ({name!r}) exists but this user may not open it; run the trainer as "
                "the same user as the game."
            ) from None
        try:
            actual = os.fstat(shm.fd).st_size
            if actual < size:
                raise LaunchError(
                    f"the {label} ({name!r}) is {actual} bytes but the config says it holds "
                    f"{size} bytes; the config files and the regions come from different game sessions "
                    "or engine versions."
                )
            mapping = mmap.mmap(shm.fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            shm.close_fd()  # The mapping keeps the memory alive; the descriptor is not needed.
        return cls(name, size, mapping, created=False, label=label)

    @classmethod
    def create(cls, name: str, size: int, *, label: str = "control block") -> SharedRegion:
        """Create (or take over a stale) region, zero-filled; this process unlinks it when done.

        The engine creates with ``O_CREAT`` but without ``O_EXCL`` (spec §2.1); we do the same, but
        notice a leftover region of that name (from a trainer that was SIGKILLed) and warn before
        zeroing and reusing it.
        """
        _check_size(size, label)
        if _WINDOWS:
            return cls._create_windows(name, size, label)
        stale = False
        try:
            shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=_CREATE_MODE)
        except posix_ipc.ExistentialError:
            stale = True
            shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREAT, mode=_CREATE_MODE)
        _register_owned(name)
        try:
            # Round up to whole pages as the engine does (spec §2.1); mapping only `size` bytes.
            page = mmap.PAGESIZE
            rounded = (size + page - 1) // page * page
            if os.fstat(shm.fd).st_size < rounded:
                os.ftruncate(shm.fd, rounded)
            mapping = mmap.mmap(shm.fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            _unregister_owned(name)
            _unlink_name(name)
            raise
        finally:
            shm.close_fd()
        region = cls(name, size, mapping, created=True, label=label)
        if stale:
            region.buf[:] = bytes(size)
            warn(
                f"a stale shared-memory region {name!r} was left by an earlier run that did not exit "
                "cleanly; it has been re-initialised and reused."
            )
        return region

    @classmethod
    def _open_windows(cls, name: str, size: int, label: str) -> SharedRegion:
        """Windows: open the engine's mapping by tag name. The 5.8 engine names a braced GUID as is
        (``{GUID}``) and only other strings ``Global\\<name>`` (spec §2.1, §11 item 8); an older engine
        prefixed every name, so ``Global\\`` + the bare name is tried when the bare one does not exist.
        ``mmap`` with a tag name silently creates a missing mapping, so existence is tested first
        (``OpenFileMappingW``); the size of an existing mapping is not checked (it would need VirtualQuery).
        """
        candidates = [name] if name.startswith(_GLOBAL_PREFIX) else [name, _GLOBAL_PREFIX + name]
        found = next((candidate for candidate in candidates if _windows_mapping_exists(candidate)), None)
        if found is None:
            raise LaunchError(
                f"the {label} does not exist (mapping name {name!r}"
                + (f" or {candidates[1]!r}" if len(candidates) > 1 else "")
                + "). Check that the game is running and that the GUID is the one it printed."
            )
        mapping = _windows_map(found, size)
        return cls(found, size, mapping, created=False, label=label)

    @classmethod
    def _create_windows(cls, name: str, size: int, label: str) -> SharedRegion:
        """Windows: create (attach mode) under the name the engine opens; the mapping lives as long as a
        handle to it, so there is nothing to unlink."""
        mapping = _windows_map(name, size)
        region = cls(name, size, mapping, created=True, label=label)
        region.buf[:] = bytes(size)
        return region

    # -- use --

    @property
    def buf(self) -> memoryview:
        """Writable view of exactly ``size`` bytes."""
        if self._buf is None:
            raise ValueError(f"the {self.label} ({self.name!r}) is closed")
        return self._buf

    @property
    def closed(self) -> bool:
        return self._buf is None and self._mmap is None

    def close(self) -> None:
        """Release the view, unmap, and unlink if we created the region. Idempotent.

        The name is unlinked even when the mapping cannot be closed yet (a numpy view still points
        into it); the memory then goes away when the last view is garbage-collected.
        """
        try:
            if self._buf is not None:
                with contextlib.suppress(BufferError):
                    self._buf.release()
                    self._buf = None
            if self._mmap is not None and self._buf is None:
                with contextlib.suppress(BufferError):
                    self._mmap.close()
                    self._mmap = None
        finally:
            if self.created and _unregister_owned(self.name):
                _unlink_name(self.name)

    def __enter__(self) -> SharedRegion:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"SharedRegion({self.name!r}, size={self.size}, created={self.created}, {state})"


def region_exists(name: str) -> bool:
    """Whether a region of that OS name exists now (the engine unlinks its regions when it ends)."""
    if _WINDOWS:
        return _windows_mapping_exists(name)
    try:
        shm = posix_ipc.SharedMemory(name, 0)
    except posix_ipc.ExistentialError:
        return False
    except posix_ipc.PermissionsError:
        return True
    shm.close_fd()
    return True


def _windows_map(name: str, size: int) -> mmap.mmap:  # pragma: no cover - Windows
    """``mmap`` of the named mapping (created if missing: callers test existence first when opening)."""
    return mmap.mmap(-1, size, tagname=name)  # type: ignore[call-arg,unused-ignore]


def _windows_mapping_exists(
    name: str, kernel32: win32.Library | None = None, last_error: Callable[[], int] | None = None
) -> bool:
    """Whether a mapping of that name exists, through the declared prototypes of
    :mod:`trainer.system.win32` (``kernel32`` and ``last_error`` are seams for tests)."""
    kernel32 = kernel32 if kernel32 is not None else win32.kernel32()
    file_map_read = 0x0004
    handle = kernel32.OpenFileMappingW(file_map_read, False, name)
    if not handle:
        # A mapping that refuses us (created by another user or at a higher integrity level) still
        # exists: the engine has not unlinked it.
        return (last_error or win32.last_error)() == win32.ERROR_ACCESS_DENIED
    kernel32.CloseHandle(handle)
    return True


def _check_size(size: int, label: str) -> None:
    # mmap treats length 0 as "the whole object"; the engine never allocates empty regions (§2.2).
    if size <= 0:
        raise LaunchError(f"the {label} would be {size} bytes; regions must be at least 1 byte")
