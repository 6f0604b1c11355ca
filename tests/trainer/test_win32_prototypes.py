"""Every foreign function la-trainer calls through ctypes has a declared prototype, and each declared
prototype agrees with the documented C signature on 64-bit Windows (issue 22: undeclared kernel32 calls
cut 64-bit handles to C ints, and every engine-spawned Windows run judged its engine dead).

Checked on Linux without loading a DLL: the prototypes are data (:data:`trainer.system.win32.PROTOTYPES`);
the calls are found by reading the source; the documented signatures below are written from Microsoft's
reference pages (and prctl(2) for the one Linux call of the test support), independently of the table.
"""

from __future__ import annotations

import ast
import ctypes
from pathlib import Path
from typing import Any

import pytest

from tests.support import faults
from trainer.system import win32

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("trainer", "protocol", "emulator", "scripts", "benchmarks", "tests/support")

# --- the documented signatures ---------------------------------------------------------------------------
# A C type as 64-bit Windows (LLP64) and 64-bit Linux (LP64) lay it out:
#   ("int", signed, bits) | ("pointer", target) with target "opaque", "wide string", a C type, or
#   ("struct", size, {field: (offset, size)}).

HANDLE = ("pointer", "opaque")  # typedef void *HANDLE
DWORD = ("int", False, 32)  # unsigned long on Windows: 32 bits
BOOL = ("int", True, 32)  # typedef int BOOL
C_INT = ("int", True, 32)
LINUX_ULONG = ("int", False, 64)  # unsigned long on LP64 Linux
LPCWSTR = ("pointer", "wide string")
LPWSTR = ("pointer", "wide string")
PDWORD = ("pointer", DWORD)
FILETIME = ("struct", 8, {"dwLowDateTime": (0, 4), "dwHighDateTime": (4, 4)})
LPFILETIME = ("pointer", FILETIME)
# PROCESSENTRY32W on x64: a ULONG_PTR (8, aligned to 8) after three DWORDs, WCHAR szExeFile[MAX_PATH].
PROCESSENTRY32W = (
    "struct",
    568,
    {
        "dwSize": (0, 4),
        "cntUsage": (4, 4),
        "th32ProcessID": (8, 4),
        "th32DefaultHeapID": (16, 8),
        "th32ModuleID": (24, 4),
        "cntThreads": (28, 4),
        "th32ParentProcessID": (32, 4),
        "pcPriClassBase": (36, 4),
        "dwFlags": (40, 4),
        "szExeFile": (44, 520),
    },
)
LPPROCESSENTRY32W = ("pointer", PROCESSENTRY32W)
NTSTATUS = ("int", True, 32)  # typedef LONG NTSTATUS
ULONG = ("int", False, 32)
OBJECT_INFORMATION_CLASS = ("int", True, 32)  # an enum: a C int
PVOID = ("pointer", "opaque")
PULONG = ("pointer", ULONG)

DOCUMENTED: dict[tuple[str, str], tuple[Any, tuple[Any, ...]]] = {
    ("kernel32", "GetCurrentProcess"): (HANDLE, ()),
    ("kernel32", "OpenProcess"): (HANDLE, (DWORD, BOOL, DWORD)),
    ("kernel32", "GetProcessTimes"): (BOOL, (HANDLE, LPFILETIME, LPFILETIME, LPFILETIME, LPFILETIME)),
    ("kernel32", "WaitForSingleObject"): (DWORD, (HANDLE, DWORD)),
    ("kernel32", "QueryFullProcessImageNameW"): (BOOL, (HANDLE, DWORD, LPWSTR, PDWORD)),
    ("kernel32", "CreateToolhelp32Snapshot"): (HANDLE, (DWORD, DWORD)),
    ("kernel32", "Process32FirstW"): (BOOL, (HANDLE, LPPROCESSENTRY32W)),
    ("kernel32", "Process32NextW"): (BOOL, (HANDLE, LPPROCESSENTRY32W)),
    ("kernel32", "CloseHandle"): (BOOL, (HANDLE,)),
    ("kernel32", "OpenFileMappingW"): (HANDLE, (DWORD, BOOL, LPCWSTR)),
    # NtQueryObject(HANDLE Handle, OBJECT_INFORMATION_CLASS ObjectInformationClass, PVOID ObjectInformation,
    #               ULONG ObjectInformationLength, PULONG ReturnLength) -> NTSTATUS
    ("ntdll", "NtQueryObject"): (NTSTATUS, (HANDLE, OBJECT_INFORMATION_CLASS, PVOID, ULONG, PULONG)),
    ("libc", "prctl"): (C_INT, (C_INT, LINUX_ULONG, LINUX_ULONG, LINUX_ULONG, LINUX_ULONG)),
}

ALL_PROTOTYPES = (*win32.PROTOTYPES, faults.PRCTL)

pytestmark = pytest.mark.skipif(
    ctypes.sizeof(ctypes.c_void_p) != 8, reason="the documented sizes are those of a 64-bit ABI"
)


def describe(ctype: Any) -> Any:
    """A ctypes type in the terms of the documented table."""
    if ctype is ctypes.c_void_p:
        return ("pointer", "opaque")
    if ctype is ctypes.c_wchar_p:
        return ("pointer", "wide string")
    if isinstance(ctype, type) and issubclass(ctype, ctypes._Pointer):
        assert ctypes.sizeof(ctype) == 8
        return ("pointer", describe(ctype._type_))
    if isinstance(ctype, type) and issubclass(ctype, ctypes.Structure):
        fields = {
            name: (getattr(ctype, name).offset, getattr(ctype, name).size) for name, *_ in ctype._fields_
        }
        return ("struct", ctypes.sizeof(ctype), fields)
    if isinstance(ctype, type) and issubclass(ctype, ctypes._SimpleCData) and ctype._type_ in "bBhHiIlLqQ":
        return ("int", ctype(-1).value < 0, 8 * ctypes.sizeof(ctype))
    return ("unknown", repr(ctype))


# --- the calls in the source --------------------------------------------------------------------------------

_LOADERS = {
    "WinDLL",
    "windll",
    "CDLL",
    "cdll",
    "OleDLL",
    "oledll",
    "PyDLL",
    "pydll",
    "LibraryLoader",
    "LoadLibrary",
}
# Where a DLL may be loaded: the library of trainer.system.win32, and libc for the test support's prctl
# (each applies a declared prototype to what it takes from the DLL).
_LOADING_ALLOWED = {
    ("trainer/system/win32.py", "kernel32"),
    ("trainer/system/win32.py", "ntdll"),
    ("tests/support/faults.py", "libc_prctl"),
}


def python_files() -> list[Path]:
    return sorted(path for folder in SOURCES for path in (ROOT / folder).rglob("*.py"))


def dll_loads(tree: ast.AST) -> list[tuple[str, int]]:
    """(enclosing function, line) of every use of a ctypes DLL loader."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            function = node.name
        name = (
            node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
        )
        if name in _LOADERS:
            found.append((function, getattr(node, "lineno", 0)))
        if isinstance(node, ast.ImportFrom) and node.module == "ctypes":
            found.extend((function, node.lineno) for alias in node.names if alias.name in _LOADERS)
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, "<module>")
    return found


def kernel32_calls(tree: ast.AST, dll: str = "kernel32") -> set[str]:
    """Names of the functions taken from a :func:`trainer.system.win32.kernel32` (or ``ntdll``) library:
    attributes of ``kernel32()`` itself and of every name or attribute it is assigned to (``self._k32``,
    ``kernel32``)."""

    def is_library(node: ast.AST) -> bool:
        return any(
            isinstance(call, ast.Call) and ast.unparse(call.func).split(".")[-1] == dll
            for call in ast.walk(node)
        )

    bound = {dll}  # parameters named after the library (the seams of shm.py)
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and is_library(node.value):
            bound.update(ast.unparse(target) for target in node.targets)
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and not node.attr.startswith("_")
        and (
            ast.unparse(node.value) in bound or (isinstance(node.value, ast.Call) and is_library(node.value))
        )
    }


def source_calls(dll: str = "kernel32") -> dict[str, set[str]]:
    calls: dict[str, set[str]] = {}
    for path in python_files():
        names = kernel32_calls(ast.parse(path.read_text(encoding="utf-8")), dll)
        if names:
            calls[path.relative_to(ROOT).as_posix()] = names
    return calls


# --- tests -------------------------------------------------------------------------------------------------


def test_dlls_are_loaded_only_where_prototypes_are_applied() -> None:
    stray = [
        f"{path.relative_to(ROOT).as_posix()}:{line} (in {function})"
        for path in python_files()
        for function, line in dll_loads(ast.parse(path.read_text(encoding="utf-8")))
        if (path.relative_to(ROOT).as_posix(), function) not in _LOADING_ALLOWED
    ]
    assert not stray, (
        "ctypes DLLs loaded outside trainer.system.win32 (calls without prototypes): " + ", ".join(stray)
    )


def test_every_kernel32_function_the_code_calls_is_declared() -> None:
    calls = source_calls()
    declared = {prototype.name for prototype in win32.PROTOTYPES if prototype.dll == "kernel32"}
    undeclared = {path: sorted(names - declared) for path, names in calls.items() if names - declared}
    assert not undeclared, f"kernel32 functions without a prototype: {undeclared}"
    # The scan sees the calls it must see (a scan that finds nothing would pass anything).
    assert {"OpenProcess", "GetProcessTimes", "GetCurrentProcess"} <= calls["trainer/system/liveness.py"]
    assert {"OpenFileMappingW", "CloseHandle"} <= calls["trainer/session/transport/shm.py"]
    assert set().union(*calls.values()) == declared, "a declared prototype no code calls"


def test_every_ntdll_function_the_code_calls_is_declared() -> None:
    calls = source_calls("ntdll")
    declared = {prototype.name for prototype in win32.PROTOTYPES if prototype.dll == "ntdll"}
    assert calls == {"trainer/session/transport/mappers.py": declared} and declared == {"NtQueryObject"}


def test_the_scan_finds_an_undeclared_call() -> None:
    tree = ast.parse(
        "def f(kernel32=None):\n"
        "    k = win32.kernel32()\n"
        "    k.GetTickCount64()\n"
        "    self._k32 = kernel32 if kernel32 is not None else win32.kernel32()\n"
        "    self._k32.Sleep(1)\n"
        "    win32.kernel32().GetLastError()\n"
        "    kernel32.SetEvent(h)\n"
        "    windll.kernel32.Beep(1, 2)\n"
    )
    assert kernel32_calls(tree) == {"GetTickCount64", "Sleep", "GetLastError", "SetEvent"}
    assert [function for function, _ in dll_loads(tree)] == ["f"]


@pytest.mark.parametrize("prototype", ALL_PROTOTYPES, ids=lambda p: f"{p.dll}.{p.name}")
def test_each_prototype_matches_the_documented_signature(prototype: win32.Prototype) -> None:
    assert (prototype.dll, prototype.name) in DOCUMENTED, "a prototype with no documented signature here"
    restype, argtypes = DOCUMENTED[(prototype.dll, prototype.name)]
    assert describe(prototype.restype) == restype, f"{prototype.name} returns {restype}"
    assert len(prototype.argtypes) == len(argtypes), f"{prototype.name} takes {len(argtypes)} arguments"
    for index, (declared, documented) in enumerate(zip(prototype.argtypes, argtypes, strict=True)):
        assert describe(declared) == documented, f"{prototype.name} argument {index + 1} is {documented}"


def test_every_documented_function_is_declared() -> None:
    assert {(p.dll, p.name) for p in ALL_PROTOTYPES} == set(DOCUMENTED)


def test_the_types_have_their_win64_sizes_here() -> None:
    """ctypes.sizeof of each type on this (64-bit) machine is its size on 64-bit Windows, so the checks
    above mean what they say; ctypes.wintypes would not (its DWORD is 8 bytes on Linux)."""
    sizes = {
        win32.HANDLE: 8,
        win32.DWORD: 4,
        win32.BOOL: 4,
        win32.LPCWSTR: 8,
        win32.FILETIME: 8,
        win32.PROCESSENTRY32W: 568,
        win32.PUBLIC_OBJECT_BASIC_INFORMATION: 56,
    }
    assert {ctype: ctypes.sizeof(ctype) for ctype in sizes} == sizes
    assert win32.INVALID_HANDLE_VALUE == (1 << 64) - 1
    # winternl.h: ULONG Attributes, GrantedAccess, HandleCount, PointerCount, Reserved[10].
    assert win32.PUBLIC_OBJECT_BASIC_INFORMATION.HandleCount.offset == 8


class _FakeFunction:
    argtypes: Any = None
    restype: Any = ctypes.c_int


class _FakeDll:
    def __init__(self) -> None:
        self.taken: list[str] = []

    def __getitem__(self, name: str) -> _FakeFunction:
        self.taken.append(name)
        return _FakeFunction()


def test_the_library_applies_the_table_and_refuses_undeclared_names() -> None:
    dll = _FakeDll()
    loads: list[int] = []
    library = win32.Library("kernel32", lambda: loads.append(1) or dll)
    assert loads == []  # nothing loaded until a function is asked for
    function = library.OpenProcess
    prototype = next(p for p in win32.PROTOTYPES if p.name == "OpenProcess")
    assert (function.restype, function.argtypes) == (prototype.restype, prototype.argtypes)
    assert library.OpenProcess is function and dll.taken == ["OpenProcess"] and loads == [1]  # bound once
    with pytest.raises(AttributeError, match="no prototype"):
        library.GetTickCount64  # noqa: B018
    assert dll.taken == ["OpenProcess"]  # never taken from the DLL undeclared


def test_the_test_support_prctl_is_declared() -> None:
    prctl = faults.libc_prctl()
    assert (prctl.restype, tuple(prctl.argtypes)) == (faults.PRCTL.restype, faults.PRCTL.argtypes)
