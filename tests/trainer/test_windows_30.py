"""Windows, read against the documented API and PowerShell 5.1 (issue 30 item 6), checked on Linux.

Each check can fail against the real thing it is about: the Win32 code runs through the real prototype
table on the ctypes-marshalling fake kernel32 (tests/support/fake_kernel32.py: 64-bit handles, documented
results, failures as Windows reports them); the PowerShell checks read the real script text with the
tree-sitter grammar and the 5.1 lint of tests/test_powershell_scripts.py; the command and the documents
are the shipped ones.

* The scale-out pinger sees rank 0, which is younger than the pinger, and a poll leaves no handle open;
  a reused id (a process created after the lock file was written) is still refused.
* One rule for a failed GetProcessTimes / WaitForSingleObject / NtQueryObject, in the parent watch, the
  one-look check and the attach watch alike: a failed call never judges a process gone.
* ``la-trainer record Saved/Recordings/*.record`` expands the pattern itself (PowerShell passes it as
  typed).
* ``scripts/setup_env.ps1`` deletes only a virtual environment (or an empty folder), by literal path.
* The .ps1 checks reject ``&&``/``||`` and the other PowerShell 7 syntax 5.1 cannot parse.
* Every documented ``docker run`` with a host folder passes ``--user``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.support.fake_kernel32 import FakeKernel32, Process
from tests.support.recordings import make_record, record_files
from trainer.commands.record import expand_record_paths, record_command
from trainer.dropin.pinger import rank0_holds
from trainer.exitcodes import ExitCode
from trainer.session.transport.mappers import HandleCountWatch
from trainer.system import win32
from trainer.system.liveness import Win32Processes, parent_watch, process_alive, process_watch

ROOT = Path(__file__).resolve().parents[2]
EDITOR = r"C:\UE_5.8\Engine\Binaries\Win64\UnrealEditor.exe"
PYTHON = r"C:\Project\Intermediate\PipInstall\Scripts\python.exe"
FILETIME_UNIX_EPOCH = 116_444_736_000_000_000


def filetime(unix_seconds: float) -> int:
    return FILETIME_UNIX_EPOCH + int(unix_seconds * 10_000_000)


def win32_processes(fake: FakeKernel32) -> Win32Processes:
    """The real Win32Processes over the real prototype table, on the fake's functions."""
    return Win32Processes(win32.Library("kernel32", lambda: fake), last_error=lambda: fake.last_error)


# --- the scale-out pinger and rank 0 ------------------------------------------------------------------------


def _pinger_and_rank0(tmp_path: Path, rank0_created: float) -> tuple[FakeKernel32, Path, Process]:
    """The pinger started 100 s ago; rank 0 (pid 90) wrote its id into the lock file now."""
    now = time.time()
    pinger = Process(70, filetime(now - 100), PYTHON, 60)
    rank0 = Process(90, filetime(rank0_created), r"C:\Python311\python.exe", 80)
    fake = FakeKernel32([Process(60, filetime(now - 200), EDITOR, 4), rank0], own=pinger)
    lock = tmp_path / "la-trainer-controls.lock"
    lock.write_text("90".ljust(20), encoding="ascii")
    return fake, lock, rank0


def test_the_pinger_sees_rank_0_younger_than_itself(tmp_path: Path) -> None:
    """Issue 30: the pid-reuse guard of the engine's watch (a process younger than the watcher is another
    one) rejected rank 0, which torchrun starts after the pinger: the pinger never stopped."""
    fake, lock, rank0 = _pinger_and_rank0(tmp_path, time.time() - 5)
    api = win32_processes(fake)
    assert rank0_holds(lock, platform="win32", api=api)
    rank0.exited = True
    assert not rank0_holds(lock, platform="win32", api=api)


def test_the_pinger_refuses_a_reused_rank_0_id(tmp_path: Path) -> None:
    """A process created after the lock file was written cannot have written it: the id was reused."""
    fake, lock, _ = _pinger_and_rank0(tmp_path, time.time() + 60)
    assert not rank0_holds(lock, platform="win32", api=win32_processes(fake))
    del fake.processes[90]
    assert not rank0_holds(lock, platform="win32", api=win32_processes(fake))


def test_polling_for_rank_0_leaves_no_handle_open(tmp_path: Path) -> None:
    """Issue 30: each poll made a watch that opened rank 0 (and its launcher's parent) and never closed
    them: two handles a poll, for the pinger's whole life."""
    fake, lock, rank0 = _pinger_and_rank0(tmp_path, time.time() - 5)
    api = win32_processes(fake)
    for _ in range(50):
        assert rank0_holds(lock, platform="win32", api=api)
    rank0.exited = True
    for _ in range(50):
        assert not rank0_holds(lock, platform="win32", api=api)
    assert fake.handles == {}, f"{len(fake.handles)} handles left open"
    assert fake.calls.count("OpenProcess") == fake.calls.count("CloseHandle") == 100


def test_one_look_closes_its_handle_on_every_path() -> None:
    now = time.time()
    live = Process(50, filetime(now - 10), EDITOR, 4)
    gone = Process(51, filetime(now - 10), EDITOR, 4, exited=True)
    newer = Process(52, filetime(now + 100), EDITOR, 4)
    fake = FakeKernel32([live, gone, newer], own=Process(70, filetime(now - 100), PYTHON, 50))
    api = win32_processes(fake)
    assert process_alive(50, started_by=now, platform="win32", api=api)
    assert not process_alive(51, started_by=now, platform="win32", api=api)
    assert not process_alive(52, started_by=now, platform="win32", api=api)
    assert process_alive(52, platform="win32", api=api)  # no guard asked for: it runs
    assert not process_alive(53, platform="win32", api=api)
    assert fake.handles == {}


def test_a_watch_that_judges_its_process_gone_at_start_closes_what_it_opened() -> None:
    now = time.time()
    reused = Process(50, filetime(now + 100), EDITOR, 4)
    fake = FakeKernel32([reused], own=Process(70, filetime(now), PYTHON, 50))
    assert process_watch(50, platform="win32", api=win32_processes(fake), executable=PYTHON)() is False
    assert fake.handles == {}


def test_la_trainer_watch_asks_without_holding_handles(monkeypatch: pytest.MonkeyPatch) -> None:
    """``la-trainer watch`` asks about the trainer's pid on every refresh (and the trainer may have
    started after it): the same one look."""
    from trainer.commands import watch

    now = time.time()
    trainer = Process(50, filetime(now + 100), PYTHON, 4)  # started after `watch`
    fake = FakeKernel32([trainer], own=Process(70, filetime(now), PYTHON, 4))
    real = process_alive
    monkeypatch.setattr(
        "trainer.system.liveness.process_alive",
        lambda pid, **kw: real(pid, platform="win32", api=win32_processes(fake), **kw),
    )
    assert all(watch._pid_alive(50) for _ in range(20))
    assert fake.handles == {}


# --- one rule for a failed call -----------------------------------------------------------------------------

FAILURES: dict[str, Callable[[Process, Process], None]] = {
    "WaitForSingleObject fails": lambda engine, own: setattr(engine, "wait_fails", True),
    "GetProcessTimes fails on the engine": lambda engine, own: setattr(engine, "times_fail", True),
    "GetProcessTimes fails on ourselves": lambda engine, own: setattr(own, "times_fail", True),
}


@pytest.mark.parametrize("failure", list(FAILURES))
def test_a_failed_call_never_judges_the_engine_gone_in_any_watch(failure: str) -> None:
    """The documented rule (trainer/system/liveness.py): the parent watch, the process watch and the
    one look all say "running" when a call fails, as the attach watch does when NtQueryObject fails
    (below). Before: WAIT_FAILED counted as exited and a failed GetProcessTimes of our own as a reused
    id, so the parent watch judged a live engine dead while the attach watch waited on."""
    now = time.time()
    pid = os.getppid()  # what parent_watch opens
    engine = Process(pid, filetime(now - 100), EDITOR, 4)
    own = Process(pid + 1, filetime(now), r"C:\Python311\python.exe", pid)
    FAILURES[failure](engine, own)
    fake = FakeKernel32([engine], own=own)
    api = win32_processes(fake)
    parent = parent_watch(platform="win32", api=api, executable=r"C:\Python311\python.exe")
    watch = process_watch(pid, platform="win32", api=api, executable=r"C:\Python311\python.exe")
    assert parent() and watch()
    assert process_alive(pid, started_by=now - 50, platform="win32", api=api)
    # A definite answer still counts: the engine exits (the wait works again) or its id is gone.
    engine.wait_fails = False
    engine.exited = True
    assert not parent() and not watch()
    assert not process_alive(pid, platform="win32", api=api)


def test_the_attach_watch_follows_the_same_rule() -> None:
    guid = "{0F1E2D3C-4B5A-6978-8796-A5B4C3D2E1F0}"
    fake = FakeKernel32([], own=Process(70, 1, "python.exe", 1), mappings={guid: True})
    watch = HandleCountWatch(
        guid, kernel32=win32.Library("kernel32", lambda: fake), ntdll=win32.Library("ntdll", lambda: fake)
    )
    fake.other_handles[guid] = 2
    assert watch.attach()
    fake.handles.clear()  # NtQueryObject fails (STATUS_INVALID_HANDLE)
    assert watch.handle_count() is None and watch.alive()


def test_the_rule_is_written_where_both_watches_are() -> None:
    liveness = (ROOT / "trainer/system/liveness.py").read_text(encoding="utf-8")
    mappers = (ROOT / "trainer/session/transport/mappers.py").read_text(encoding="utf-8")
    assert "One rule for a failed Windows call" in liveness
    assert "never a game judged gone on a failed" in mappers.replace("\n    ", " ")


# --- la-trainer record: the pattern PowerShell does not expand -----------------------------------------------


def test_record_expands_a_pattern_the_shell_passed_as_typed(tmp_path: Path) -> None:
    (tmp_path / "Saved" / "Recordings").mkdir(parents=True)
    first, schema = record_files(tmp_path / "Saved" / "Recordings", [make_record(20, seed=1)])
    second = first.with_name("b.record")
    second.write_bytes(first.read_bytes())
    pattern = str(tmp_path / "Saved" / "Recordings" / "*.record")
    assert expand_record_paths([pattern]) == sorted([first, second])
    result = CliRunner().invoke(
        record_command,
        [pattern, "--schema", str(schema), "--out", str(tmp_path / "run"), "--iterations", "2"],
        env={"LA_TRAINER_THREADS": "1"},
    )
    assert "2 records" in result.output, result.output


def test_record_names_a_pattern_that_matches_nothing(tmp_path: Path) -> None:
    _, schema = record_files(tmp_path, [make_record(5)])
    result = CliRunner().invoke(
        record_command, [str(tmp_path / "none" / "*.record"), "--schema", str(schema)]
    )
    assert result.exit_code == ExitCode.USAGE, result.output
    assert "no file matches" in result.output and "Traceback" not in result.output


def test_record_takes_an_existing_name_literally_and_refuses_a_folder(tmp_path: Path) -> None:
    record, _ = record_files(tmp_path, [make_record(5)])
    odd = record.with_name("take[1].record")  # [1] would be a character class as a pattern
    odd.write_bytes(record.read_bytes())
    assert expand_record_paths([str(odd)]) == [odd]
    with pytest.raises(Exception, match="is a folder"):
        expand_record_paths([str(tmp_path)])
    with pytest.raises(Exception, match="no such file"):
        expand_record_paths([str(tmp_path / "missing.record")])


# --- scripts/setup_env.sh: the rule setup_env.ps1 now follows (its text is checked in
# tests/test_powershell_scripts.py) ----------------------------------------------------------------------


def test_setup_env_sh_refuses_a_folder_that_is_not_a_venv(tmp_path: Path) -> None:
    """The rule both scripts follow, run for real where bash is: the folder and its file stay."""
    real = tmp_path / "Documents"
    real.mkdir()
    (real / "thesis.txt").write_text("keep me")
    done = subprocess.run(
        ["bash", "-c", 'source scripts/setup_env.sh && la_trainer_setup demo; echo "rc=$?"'],
        cwd=ROOT,
        env={**os.environ, "LA_TRAINER_VENV": str(real)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "rc=1" in done.stdout and "is not a virtual environment" in done.stderr, done.stdout + done.stderr
    assert (real / "thesis.txt").read_text() == "keep me"


# --- documented docker runs with a host folder pass --user -------------------------------------------------


def _docker_runs() -> list[tuple[str, str]]:
    runs: list[tuple[str, str]] = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text(encoding="utf-8").replace("\\\n", " ")
        for line in text.splitlines():
            if re.search(r"\bdocker run\b", line) and not line.lstrip().startswith(("|", ">")):
                runs.append((path.name, line))
    return runs


def test_every_documented_docker_run_with_a_host_folder_passes_user() -> None:
    """A host folder mounted for the image's own user (uid 10001) is not writable by it (issue 30: the
    scale-out page's run had no --user). A named volume (-v name:/path) needs none."""
    runs = _docker_runs()
    assert any(name == "scale-out.md" for name, _ in runs), runs
    for name, line in runs:
        mounts = re.findall(r"-v\s+\"?([^\s\":]+):", line)
        if any(mount.startswith(("$", "/", ".", "~")) for mount in mounts):
            assert "--user" in line, f"{name}: {line.strip()}"


@pytest.mark.skipif(sys.platform == "win32", reason="reads the Linux documents' shell lines")
def test_the_scale_out_docker_run_makes_its_folder_first() -> None:
    text = (ROOT / "docs" / "scale-out.md").read_text(encoding="utf-8")
    assert text.index("mkdir -p runs") < text.index("docker run --gpus all --network host")
