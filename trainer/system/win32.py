"""Every Win32 function la-trainer calls through ctypes, with its declared prototype: one table.

Why a table: a ctypes function without ``argtypes``/``restype`` takes and returns C ``int``. On 64-bit
Windows a ``HANDLE`` is pointer-sized, so an undeclared ``GetCurrentProcess``/``OpenProcess`` returns a
handle cut to 32 bits and an undeclared argument cannot carry a full one: ``GetProcessTimes`` then fails
and every engine-spawned run judged its engine dead half a second into its first wait (issue 22). So no
module calls a DLL function directly. :func:`kernel32` gives a :class:`Library` whose attributes are the
functions of :data:`PROTOTYPES` with their prototype applied; a name missing from the table is an
``AttributeError`` (never an undeclared call), and ``tests/trainer/test_win32_prototypes.py`` finds every
call in the source and checks each prototype against the documented signature.

The types are fixed-width ctypes types rather than ``ctypes.wintypes``: on Windows they are the same C
types (``DWORD`` is a 32-bit unsigned long there), and they keep their Windows sizes on the Linux machines
that test this table (``wintypes.DWORD`` is ``c_ulong``, 8 bytes on Linux). ``WCHAR`` arrays inside
structures are 16-bit units for the same reason (``c_wchar`` is 4 bytes on Linux); only pointers to wide
strings use ``c_wchar_p``, which is pointer-sized everywhere and UTF-16 on Windows.

Nothing here loads a DLL at import: the table is data, :meth:`Prototype.apply` puts it on a function
object, and :class:`Library` loads its DLL on the first function asked for (so Linux imports this module).
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BOOL",
    "DWORD",
    "ERROR_ACCESS_DENIED",
    "ERROR_INVALID_PARAMETER",
    "FILETIME",
    "HANDLE",
    "INVALID_HANDLE_VALUE",
    "LPCWSTR",
    "LPWSTR",
    "PROCESSENTRY32W",
    "PROTOTYPES",
    "PUBLIC_OBJECT_BASIC_INFORMATION",
    "Library",
    "Prototype",
    "error",
    "kernel32",
    "last_error",
    "ntdll",
]

HANDLE = ctypes.c_void_p
"""Pointer-sized and opaque (a ``void *``)."""
DWORD = ctypes.c_uint32
BOOL = ctypes.c_int32
"""A 32-bit ``int``: nonzero is success."""
LONG = ctypes.c_int32
ULONG = ctypes.c_uint32
NTSTATUS = ctypes.c_int32
"""A ``LONG``: 0 (STATUS_SUCCESS) and other non-negative values are success."""
OBJECT_INFORMATION_CLASS = ctypes.c_int32
"""An enum (a C ``int``); ``ObjectBasicInformation`` is 0."""
ULONG_PTR = ctypes.c_size_t
WCHAR = ctypes.c_uint16
"""One UTF-16 code unit (inside structures; see the module docstring)."""
LPCWSTR = ctypes.c_wchar_p
LPWSTR = ctypes.c_wchar_p
PDWORD = ctypes.POINTER(DWORD)

MAX_PATH = 260
INVALID_HANDLE_VALUE = HANDLE(-1).value
"""``(HANDLE)-1`` as ctypes returns it from a ``HANDLE`` restype (all bits set)."""
ERROR_FILE_NOT_FOUND = 2
ERROR_ACCESS_DENIED = 5
ERROR_INVALID_PARAMETER = 87


class FILETIME(ctypes.Structure):
    """100-ns ticks since 1601 as two 32-bit halves."""

    _fields_ = (("dwLowDateTime", DWORD), ("dwHighDateTime", DWORD))

    @property
    def ticks(self) -> int:
        return (int(self.dwHighDateTime) << 32) | int(self.dwLowDateTime)


class PROCESSENTRY32W(ctypes.Structure):
    """One process of a Toolhelp snapshot (568 bytes on 64-bit Windows)."""

    _fields_ = (
        ("dwSize", DWORD),
        ("cntUsage", DWORD),
        ("th32ProcessID", DWORD),
        ("th32DefaultHeapID", ULONG_PTR),
        ("th32ModuleID", DWORD),
        ("cntThreads", DWORD),
        ("th32ParentProcessID", DWORD),
        ("pcPriClassBase", LONG),
        ("dwFlags", DWORD),
        ("szExeFile", WCHAR * MAX_PATH),
    )


class PUBLIC_OBJECT_BASIC_INFORMATION(ctypes.Structure):
    """What ``NtQueryObject(..., ObjectBasicInformation, ...)`` fills in (winternl.h; 56 bytes):
    ``HandleCount`` is the number of open handles to the object in every process."""

    _fields_ = (
        ("Attributes", ULONG),
        ("GrantedAccess", ULONG),
        ("HandleCount", ULONG),
        ("PointerCount", ULONG),
        ("Reserved", ULONG * 10),
    )


LPFILETIME = ctypes.POINTER(FILETIME)
LPPROCESSENTRY32W = ctypes.POINTER(PROCESSENTRY32W)


@dataclass(frozen=True)
class Prototype:
    """The C signature of one DLL function, as ctypes needs it."""

    dll: str
    name: str
    restype: Any
    argtypes: tuple[Any, ...]

    def apply(self, function: Any) -> Any:
        """Declare this prototype on a ctypes function object (or anything with those attributes)."""
        function.restype = self.restype
        function.argtypes = self.argtypes
        return function


PROTOTYPES: tuple[Prototype, ...] = (
    # Process liveness (trainer/system/liveness.py).
    Prototype("kernel32", "GetCurrentProcess", HANDLE, ()),
    Prototype("kernel32", "OpenProcess", HANDLE, (DWORD, BOOL, DWORD)),
    Prototype("kernel32", "GetProcessTimes", BOOL, (HANDLE, LPFILETIME, LPFILETIME, LPFILETIME, LPFILETIME)),
    Prototype("kernel32", "WaitForSingleObject", DWORD, (HANDLE, DWORD)),
    Prototype("kernel32", "QueryFullProcessImageNameW", BOOL, (HANDLE, DWORD, LPWSTR, PDWORD)),
    Prototype("kernel32", "CreateToolhelp32Snapshot", HANDLE, (DWORD, DWORD)),
    Prototype("kernel32", "Process32FirstW", BOOL, (HANDLE, LPPROCESSENTRY32W)),
    Prototype("kernel32", "Process32NextW", BOOL, (HANDLE, LPPROCESSENTRY32W)),
    Prototype("kernel32", "CloseHandle", BOOL, (HANDLE,)),
    # Named shared memory (trainer/session/transport/shm.py).
    Prototype("kernel32", "OpenFileMappingW", HANDLE, (DWORD, BOOL, LPCWSTR)),
    # Attach mode: who holds the control block open (trainer/session/transport/mappers.py).
    Prototype(
        "ntdll",
        "NtQueryObject",
        NTSTATUS,
        (HANDLE, OBJECT_INFORMATION_CLASS, ctypes.c_void_p, ULONG, ctypes.POINTER(ULONG)),
    ),
)

_BY_NAME = {(prototype.dll, prototype.name): prototype for prototype in PROTOTYPES}


class Library:
    """The prototyped functions of one DLL, loaded on first use. ``load`` returns the ctypes library
    (a seam: tests pass a fake whose functions marshal like ctypes)."""

    def __init__(self, dll: str, load: Callable[[], Any]) -> None:
        self._dll = dll
        self._load = load
        self._library: Any = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        prototype = _BY_NAME.get((self._dll, name))
        if prototype is None:
            raise AttributeError(
                f"{self._dll}.{name} has no prototype in trainer.system.win32.PROTOTYPES; declare it there "
                "(an undeclared ctypes call passes and returns a 32-bit int)"
            )
        if self._library is None:
            self._library = self._load()
        # Item access gives a function object of our own: the prototype is never put on one that other
        # code in the process (ctypes.windll users) shares.
        function = prototype.apply(self._library[name])
        setattr(self, name, function)  # later look-ups skip __getattr__
        return function


_kernel32: Library | None = None


def kernel32() -> Library:
    """kernel32.dll, loaded with ``use_last_error`` so :func:`last_error` reads each call's error (Windows)."""
    global _kernel32
    if _kernel32 is None:
        _kernel32 = Library("kernel32", lambda: ctypes.WinDLL("kernel32", use_last_error=True))  # type: ignore[attr-defined,unused-ignore]
    return _kernel32


_ntdll: Library | None = None


def ntdll() -> Library:
    """ntdll.dll (Windows). Its functions return an NTSTATUS rather than setting the last error."""
    global _ntdll
    if _ntdll is None:
        _ntdll = Library("ntdll", lambda: ctypes.WinDLL("ntdll"))  # type: ignore[attr-defined,unused-ignore]
    return _ntdll


def last_error() -> int:
    """``GetLastError`` of this thread's latest call through a ``use_last_error`` library (Windows)."""
    if sys.platform != "win32":  # pragma: no cover - only Windows calls reach here
        raise OSError("Win32 errors exist on Windows only")
    return int(ctypes.get_last_error())  # type: ignore[attr-defined,unused-ignore]


def error(code: int, call: str) -> OSError:
    """The ``OSError`` of a failed call with Windows error ``code`` (``winerror`` set on Windows)."""
    if sys.platform == "win32":  # pragma: no cover - Windows
        return ctypes.WinError(code, f"{call} failed")  # type: ignore[attr-defined,unused-ignore]
    return OSError(code, f"{call} failed with Windows error {code}")
