"""trainer.system.liveness: the spawning engine's liveness on POSIX (parent id) and on Windows (a process
handle with a creation-time check, the venv launcher's parent): the watch's logic through a fake of the
ProcessApi seam, and Win32Processes itself through the real prototype table on a fake kernel32 that
converts arguments and results as ctypes does (tests/support/fake_kernel32.py)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from emulator.launch import REPO_ROOT
from tests.support.fake_kernel32 import FakeKernel32, Process
from trainer.system import win32
from trainer.system.liveness import Win32Processes, parent_watch, process_watch

VENV_PYTHON = r"C:\Project\Intermediate\PipInstall\Scripts\python.exe"
EDITOR = r"C:\UE_5.8\Engine\Binaries\Win64\UnrealEditor.exe"


@dataclass
class FakeProcess:
    pid: int
    created: int
    image: str
    parent: int | None
    exited: bool = False


@dataclass
class FakeWin32:
    """A process table; handles are pids (opaque to the code under test)."""

    processes: dict[int, FakeProcess]
    own_created: int = 1000
    opened: list[int] = field(default_factory=list)

    def open(self, pid: int) -> int | None:
        self.opened.append(pid)
        return pid if pid in self.processes else None

    def creation_time(self, handle: int) -> int:
        return self.processes[handle].created

    def own_creation_time(self) -> int:
        return self.own_created

    def exited(self, handle: int) -> bool:
        return self.processes[handle].exited

    def image_path(self, handle: int) -> str:
        return self.processes[handle].image

    def parent_pid(self, pid: int) -> int | None:
        return self.processes[pid].parent

    def close(self, handle: int) -> None:
        pass


def test_posix_parent_watch_is_true_while_our_parent_lives() -> None:
    alive = parent_watch()
    assert alive() and alive()


GRANDCHILD = """
import sys, time
sys.path.insert(0, sys.argv[1])
from trainer.system.liveness import parent_watch
alive = parent_watch()
out = open(sys.argv[2], "a")
out.write(f"{int(alive())}\\n"); out.flush()
deadline = time.monotonic() + 30
while alive() and time.monotonic() < deadline:
    time.sleep(0.02)
out.write(f"{int(alive())}\\n"); out.close()
"""


def test_posix_parent_watch_turns_false_when_the_parent_dies(tmp_path: Path) -> None:
    """The parent starts a child and exits; the child's watch, built while the parent lived, turns False
    (the child was re-parented) within a poll."""
    out = tmp_path / "seen.txt"
    parent = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2], sys.argv[3]])\n"
        "deadline = time.monotonic() + 30\n"
        "while time.monotonic() < deadline:\n"
        "    try:\n"
        "        if open(sys.argv[3]).read().strip(): break\n"
        "    except OSError: pass\n"
        "    time.sleep(0.02)\n"
    )
    subprocess.run(
        [sys.executable, "-c", parent, GRANDCHILD, str(REPO_ROOT), str(out)], timeout=60, check=True
    )
    deadline = time.monotonic() + 30
    while out.read_text().split() == ["1"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert out.read_text().split() == ["1", "0"]


def test_posix_process_watch_of_a_dead_pid_is_false() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(30)
    assert process_watch(os.getpid())() is True
    assert process_watch(child.pid)() is False


def test_windows_watch_holds_a_handle_and_follows_it() -> None:
    api = FakeWin32({50: FakeProcess(50, 10, EDITOR, 1)})
    alive = process_watch(50, platform="win32", api=api, executable=sys.executable)
    assert alive()
    api.processes[50].exited = True
    assert not alive()
    assert api.opened == [50]  # opened once, at start; polled through the handle afterwards


def test_windows_a_reused_pid_is_a_dead_parent() -> None:
    """The id now names a process created after us: our real parent is gone (no re-parenting)."""
    api = FakeWin32({50: FakeProcess(50, 5000, r"C:\other.exe", 1)}, own_created=1000)
    assert process_watch(50, platform="win32", api=api, executable=sys.executable)() is False


def test_windows_a_parent_gone_before_the_watch_is_dead() -> None:
    api = FakeWin32({})
    assert process_watch(50, platform="win32", api=api, executable=sys.executable)() is False


def test_windows_the_venv_launcher_parent_is_watched_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """Our parent is the engine venv's Scripts\\python.exe launcher: a crashed editor leaves it running,
    so the editor above it must be watched as well."""
    monkeypatch.setattr(sys, "_base_executable", r"C:\Python311\python.exe", raising=False)
    api = FakeWin32(
        {
            40: FakeProcess(40, 10, EDITOR, 1),
            60: FakeProcess(60, 20, VENV_PYTHON, 40),
        }
    )
    alive = process_watch(60, platform="win32", api=api, executable=VENV_PYTHON)
    assert alive() and api.opened == [60, 40]
    api.processes[40].exited = True  # the editor crashed; the launcher still waits for us
    assert not alive()


def test_windows_a_parent_that_is_not_the_launcher_is_watched_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "_base_executable", VENV_PYTHON, raising=False)  # not in a venv
    api = FakeWin32({40: FakeProcess(40, 10, EDITOR, 1), 60: FakeProcess(60, 20, VENV_PYTHON, 40)})
    alive = process_watch(60, platform="win32", api=api, executable=VENV_PYTHON)
    assert alive() and api.opened == [60]


# --- Win32Processes itself, through the declared prototypes and a kernel32 that marshals like ctypes -----

OWN_CREATED = 134_100_000_000_000_000  # FILETIME ticks in 2026: above 32 bits


def win32_processes(fake: FakeKernel32) -> Win32Processes:
    """The real Win32Processes over the real prototype table, on the fake's functions."""
    return Win32Processes(win32.Library("kernel32", lambda: fake), last_error=lambda: fake.last_error)


def test_win32_own_creation_time_survives_the_pseudo_handle() -> None:
    """GetCurrentProcess returns (HANDLE)-1, all 64 bits set; cut to an int it names nothing and the
    creation time read 0 (issue 22)."""
    fake = FakeKernel32([], own=Process(70, OWN_CREATED, sys.executable, 60))
    assert win32_processes(fake).own_creation_time() == OWN_CREATED


def test_win32_the_engine_is_alive_through_a_handle_above_32_bits() -> None:
    editor = Process(50, OWN_CREATED - 10**9, EDITOR, 4)
    fake = FakeKernel32([editor], own=Process(70, OWN_CREATED, sys.executable, 50))
    api = win32_processes(fake)
    alive = process_watch(50, platform="win32", api=api, executable=sys.executable)
    assert alive() and alive()
    assert [h for h in fake.handles if h > 0xFFFF_FFFF]  # the handle held really is a 64-bit one
    editor.exited = True
    assert not alive()


def test_win32_a_reused_pid_is_dead_and_a_missing_one_too() -> None:
    newer = Process(50, OWN_CREATED + 10**9, r"C:\other.exe", 4)
    fake = FakeKernel32([newer], own=Process(70, OWN_CREATED, sys.executable, 50))
    assert (
        process_watch(50, platform="win32", api=win32_processes(fake), executable=sys.executable)() is False
    )
    assert (
        process_watch(51, platform="win32", api=win32_processes(fake), executable=sys.executable)() is False
    )


def test_win32_the_venv_launcher_and_its_parent(monkeypatch: pytest.MonkeyPatch) -> None:
    """The image path (QueryFullProcessImageNameW) and the parent (a Toolhelp snapshot) come through."""
    monkeypatch.setattr(sys, "_base_executable", r"C:\Python311\python.exe", raising=False)
    editor = Process(40, OWN_CREATED - 2 * 10**9, EDITOR, 4)
    launcher = Process(60, OWN_CREATED - 10**9, VENV_PYTHON, 40)
    fake = FakeKernel32([editor, launcher], own=Process(70, OWN_CREATED, r"C:\Python311\python.exe", 60))
    api = win32_processes(fake)
    handle = api.open(60)
    assert handle is not None and api.image_path(handle) == VENV_PYTHON
    assert api.parent_pid(60) == 40 and api.parent_pid(999) is None
    alive = process_watch(60, platform="win32", api=api, executable=VENV_PYTHON)
    assert alive()
    editor.exited = True
    assert not alive()


def test_win32_a_process_that_refuses_a_handle_is_still_there() -> None:
    """OpenProcess says ERROR_ACCESS_DENIED: the process exists, so it is not judged dead; it is
    asked again on each check and judged dead once its id names no process."""
    editor = Process(50, OWN_CREATED - 10**9, EDITOR, 4, protected=True)
    fake = FakeKernel32([editor], own=Process(70, OWN_CREATED, sys.executable, 50))
    alive = process_watch(50, platform="win32", api=win32_processes(fake), executable=sys.executable)
    assert alive()
    del fake.processes[50]
    assert not alive()


def test_win32_undeclared_calls_fail_on_the_fake() -> None:
    """The same calls without prototypes (main before issue 22): the fake returns handles as ctypes'
    default C int (cut to 32 bits: the fake's handles then name nothing) and passes int arguments as 32
    bits, so every call on a handle fails.
    A failed call never judges a process gone (the rule of trainer/system/liveness.py, issue 30), so
    what shows is the other half: an engine that exits is never seen to. This is what makes the tests
    above able to fail."""

    class Undeclared:
        def __getattr__(self, name: str) -> object:
            return fake[name]  # a function with ctypes' defaults: no argtypes, restype c_int

    editor = Process(50, OWN_CREATED - 10**9, EDITOR, 4)
    fake = FakeKernel32([editor], own=Process(70, OWN_CREATED, "x", 50))
    api = Win32Processes(Undeclared(), last_error=lambda: fake.last_error)  # type: ignore[arg-type]
    assert api.own_creation_time() != OWN_CREATED
    try:
        alive = process_watch(50, platform="win32", api=api, executable=sys.executable)
        editor.exited = True
        seen_exiting = not alive()
    except (OSError, ctypes.ArgumentError):
        seen_exiting = False
    assert not seen_exiting
