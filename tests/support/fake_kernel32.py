"""A kernel32 stand-in that passes arguments and results the way ctypes does, so prototypes matter on Linux.

A ctypes foreign function converts each argument by its ``argtypes`` (without them, a Python int must fit
a C ``int`` or the call raises) and its result by ``restype`` (``c_int`` unless declared). The fake's
functions do the same before and after the Python implementation runs, and its handles and creation times
lie above 32 bits as on 64-bit Windows: code that calls through :mod:`trainer.system.win32` works on it,
and the undeclared calls of issue 22 fail on it as they fail on Windows (a cut handle, an
``ArgumentError``). It implements only the functions la-trainer calls, with their documented results.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainer.system.win32 import PROCESSENTRY32W

PSEUDO_HANDLE = (1 << 64) - 1
"""``GetCurrentProcess()``: ``(HANDLE)-1``."""
FIRST_HANDLE = 0x7FF0_0000_0000
"""Handles this fake gives out: all above 32 bits, so a cut one names nothing."""
WAIT_OBJECT_0 = 0
WAIT_TIMEOUT = 0x102
WAIT_FAILED = 0xFFFF_FFFF
ERROR_FILE_NOT_FOUND = 2
ERROR_ACCESS_DENIED = 5
ERROR_INVALID_HANDLE = 6
ERROR_BAD_LENGTH = 24
ERROR_INVALID_PARAMETER = 87
ERROR_NO_MORE_FILES = 18


@dataclass
class Process:
    pid: int
    created: int
    """FILETIME ticks (a 2026 date is about 1.34e17: above 32 bits)."""
    image: str
    parent: int
    exited: bool = False
    protected: bool = False
    """OpenProcess is refused (ERROR_ACCESS_DENIED) though the process exists."""
    times_fail: bool = False
    """GetProcessTimes fails on it (ERROR_ACCESS_DENIED: a handle without query rights)."""
    wait_fails: bool = False
    """WaitForSingleObject fails on it (WAIT_FAILED, ERROR_ACCESS_DENIED: a handle without SYNCHRONIZE)."""


def _c_int(value: Any) -> Any:
    """What ctypes does with an argument when the function has no ``argtypes``."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        if not -(1 << 31) <= value < (1 << 31):
            raise ctypes.ArgumentError("int too long to convert")
        return value
    return value  # byref(), buffers and str pass as pointers either way


def _received(argtype: Any, value: Any) -> Any:
    """The value the C function sees for ``value`` passed as ``argtype``."""
    argtype.from_param(value)  # the type check ctypes makes (TypeError/ArgumentError on a mismatch)
    if isinstance(value, bool | int) and issubclass(argtype, ctypes._SimpleCData):
        return argtype(value).value  # cut or wrapped to the declared width, as in C
    return value


class FakeFunction:
    """One foreign function: ``argtypes``/``restype`` as ctypes has them (``restype`` defaults to c_int)."""

    def __init__(self, name: str, body: Callable[..., int]) -> None:
        self.__name__ = name
        self.body = body
        self.argtypes: tuple[Any, ...] | None = None
        self.restype: Any = ctypes.c_int

    def __call__(self, *args: Any) -> Any:
        if self.argtypes is None:
            passed = [_c_int(arg) for arg in args]
        else:
            if len(args) != len(self.argtypes):
                raise TypeError(f"{self.__name__} takes {len(self.argtypes)} arguments ({len(args)} given)")
            passed = [_received(argtype, arg) for argtype, arg in zip(self.argtypes, args, strict=True)]
        result = self.body(*passed)
        if self.restype is None:
            return None
        return self.restype(result).value


class FakeKernel32:
    """A process table, named mappings and the handles on them. ``last_error`` is the thread's
    GetLastError (pass ``lambda: fake.last_error`` where the code reads it)."""

    def __init__(
        self, processes: list[Process], own: Process, mappings: dict[str, bool] | None = None
    ) -> None:
        self.processes = {process.pid: process for process in [*processes, own]}
        self.own = own
        self.mappings = mappings or {}
        """Mapping name -> whether we may open it (False: it exists, access denied)."""
        self.other_handles: dict[str, int] = {}
        """Mapping name -> handles to it that other processes hold (a game that opened it)."""
        self.handles: dict[int, object] = {}
        self.last_error = 0
        self.calls: list[str] = []
        self._next = FIRST_HANDLE

    def __getitem__(self, name: str) -> FakeFunction:
        body = getattr(self, f"_{name}", None)
        if body is None:
            raise AttributeError(f"function '{name}' not found")
        return FakeFunction(name, self._recorded(name, body))

    def _recorded(self, name: str, body: Callable[..., int]) -> Callable[..., int]:
        def call(*args: Any) -> int:
            self.calls.append(name)
            return body(*args)

        return call

    def _handle(self, target: object) -> int:
        handle, self._next = self._next, self._next + 4
        self.handles[handle] = target
        return handle

    def _fail(self, error: int, result: int = 0) -> int:
        self.last_error = error
        return result

    def _process(self, handle: int | None) -> Process | None:
        if handle == PSEUDO_HANDLE:
            return self.own
        target = self.handles.get(handle or 0)
        return target if isinstance(target, Process) else None

    # --- the functions (names as exported; bodies take what the C function receives) -----------------

    def _GetCurrentProcess(self) -> int:
        return PSEUDO_HANDLE

    def _OpenProcess(self, access: int, inherit: int, pid: int) -> int:
        process = self.processes.get(pid)
        if process is None:
            return self._fail(ERROR_INVALID_PARAMETER)
        if process.protected:
            return self._fail(ERROR_ACCESS_DENIED)
        return self._handle(process)

    def _GetProcessTimes(self, handle: int, created: Any, exited: Any, kernel: Any, user: Any) -> int:
        process = self._process(handle)
        if process is None:
            return self._fail(ERROR_INVALID_HANDLE)
        if process.times_fail:
            return self._fail(ERROR_ACCESS_DENIED)
        filetime = created._obj
        filetime.dwLowDateTime = process.created & 0xFFFF_FFFF
        filetime.dwHighDateTime = process.created >> 32
        return 1

    def _WaitForSingleObject(self, handle: int, milliseconds: int) -> int:
        process = self._process(handle)
        if process is None:
            return self._fail(ERROR_INVALID_HANDLE, WAIT_FAILED)
        if process.wait_fails:
            return self._fail(ERROR_ACCESS_DENIED, WAIT_FAILED)
        return WAIT_OBJECT_0 if process.exited else WAIT_TIMEOUT

    def _QueryFullProcessImageNameW(self, handle: int, flags: int, buffer: Any, size: Any) -> int:
        process = self._process(handle)
        if process is None:
            return self._fail(ERROR_INVALID_HANDLE)
        capacity = size._obj
        if len(process.image) + 1 > capacity.value:
            return self._fail(122)  # ERROR_INSUFFICIENT_BUFFER
        buffer.value = process.image
        capacity.value = len(process.image)
        return 1

    def _CreateToolhelp32Snapshot(self, flags: int, pid: int) -> int:
        return self._handle([*self.processes.values()])

    def _process_entry(self, snapshot: int, pointer: Any, index: int) -> int:
        listing = self.handles.get(snapshot)
        if not isinstance(listing, list):
            return self._fail(ERROR_INVALID_HANDLE)
        entry = pointer._obj
        if entry.dwSize != ctypes.sizeof(PROCESSENTRY32W):
            return self._fail(ERROR_BAD_LENGTH)
        if index >= len(listing):
            return self._fail(ERROR_NO_MORE_FILES)
        entry.th32ProcessID = listing[index].pid
        entry.th32ParentProcessID = listing[index].parent
        entry.dwFlags = index  # where Next continues (the real one keeps this inside the snapshot)
        return 1

    def _Process32FirstW(self, snapshot: int, pointer: Any) -> int:
        return self._process_entry(snapshot, pointer, 0)

    def _Process32NextW(self, snapshot: int, pointer: Any) -> int:
        return self._process_entry(snapshot, pointer, pointer._obj.dwFlags + 1)

    def _CloseHandle(self, handle: int) -> int:
        if self.handles.pop(handle or 0, None) is None:
            return self._fail(ERROR_INVALID_HANDLE)
        return 1

    def _OpenFileMappingW(self, access: int, inherit: int, name: str) -> int:
        if name not in self.mappings:
            return self._fail(ERROR_FILE_NOT_FOUND)
        if not self.mappings[name]:
            return self._fail(ERROR_ACCESS_DENIED)
        return self._handle(name)

    # ntdll (the same fake serves as both libraries: Library("ntdll", lambda: fake))

    def _NtQueryObject(self, handle: int, klass: int, buffer: Any, length: int, returned: Any) -> int:
        """ObjectBasicInformation of a mapping handle: HandleCount is every open handle to the mapping,
        ours (in this fake's handle table) and other processes'."""
        status_invalid_handle, status_info_length_mismatch, status_invalid_info_class = (
            -0x3FFFFFF8,  # 0xC0000008 as a LONG
            -0x3FFFFFFC,  # 0xC0000004
            -0x3FFFFFFD,  # 0xC0000003
        )
        name = self.handles.get(handle or 0)
        if not isinstance(name, str):
            return status_invalid_handle
        if klass != 0:
            return status_invalid_info_class
        info = buffer._obj
        if length < ctypes.sizeof(info):
            return status_info_length_mismatch
        ours = sum(1 for target in self.handles.values() if target == name)
        info.HandleCount = ours + self.other_handles.get(name, 0)
        return 0
