"""``la-trainer watch``'s judgement and drawing (trainer/commands/watch.py) on status files written by hand: which
runs are healthy, which exit code says what, which file is followed, how a terminal is redrawn."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainer.commands.watch import Verdict, find_status_files, judge, render, watch
from trainer.exitcodes import ExitCode
from trainer.records.progress import STATUS_FILE_NAME, RunPhase, Status, read_status, write_status

HOST = "this-host"
NOW = 1_000_000.0


def status(phase: RunPhase, **changes: object) -> Status:
    base = Status(
        phase=phase,
        iteration=1200,
        total=3000,
        loss=0.41234,
        iterations_per_second=1850.0,
        eta_s=65.0,
        pid=4242,
        host=HOST,
        updated=NOW - 2,
    )
    for key, value in changes.items():
        setattr(base, key, value)
    return base


def alive(pid: int) -> bool:
    return True


def gone(pid: int) -> bool:
    return False


@pytest.mark.parametrize(
    ("given", "pid_alive", "verdict", "code"),
    [
        (status(RunPhase.TRAINING), alive, Verdict.RUNNING, 0),
        (status(RunPhase.WAITING_FOR_CONFIG, iteration=0, total=0), alive, Verdict.RUNNING, 0),
        (status(RunPhase.COMPLETE, iteration=3000, exit_code=0), gone, Verdict.COMPLETE, 0),
        (status(RunPhase.STOPPED, exit_code=0), gone, Verdict.COMPLETE, 0),
        (status(RunPhase.INTERRUPTED, exit_code=8), gone, Verdict.ENDED, 8),
        (status(RunPhase.DIVERGED, exit_code=9), gone, Verdict.ENDED, 9),
        (status(RunPhase.FAILED, exit_code=5), gone, Verdict.ENDED, 5),
        (status(RunPhase.FAILED), gone, Verdict.ENDED, 1),  # an older file without a code
        (status(RunPhase.TRAINING), gone, Verdict.DEAD, int(ExitCode.RUN_DEAD)),
        (status(RunPhase.TRAINING, updated=NOW - 300), alive, Verdict.STALE, int(ExitCode.RUN_STALE)),
        # Another machine's pid means nothing here: only the age counts.
        (status(RunPhase.TRAINING, host="elsewhere"), gone, Verdict.RUNNING, 0),
        (status(RunPhase.TRAINING, host="elsewhere", updated=NOW - 300), gone, Verdict.STALE, 11),
    ],
)
def test_verdicts_and_exit_codes(given: Status, pid_alive: object, verdict: Verdict, code: int) -> None:
    health = judge(given, now=NOW, max_age=60, host=HOST, pid_alive=pid_alive)  # type: ignore[arg-type]
    assert (health.verdict, health.exit_code) == (verdict, code)
    assert health.final is (verdict is not Verdict.RUNNING)


def test_a_finished_run_shows_where_it_finished() -> None:
    done = status(RunPhase.COMPLETE, iteration=3000, loss=0.05, exit_code=0)
    line = render(done, "LearningCore/Training3", judge(done, now=NOW, host=HOST, pid_alive=gone), now=NOW)
    assert line.startswith("LearningCore/Training3 | complete | iteration 3000/3000 (100.0%) | loss 0.05000")
    assert "nan" not in line and "it/s" not in line  # no speed or ETA for an ended run


def test_a_failed_run_shows_its_code_and_why() -> None:
    failed = status(RunPhase.FAILED, exit_code=5, message="la-trainer: the game went away (phase: training)")
    line = render(failed, "Training0", judge(failed, now=NOW, host=HOST, pid_alive=gone), now=NOW)
    assert "failed with exit code 5" in line and "iteration 1200/3000" in line
    assert line.endswith("\n  la-trainer: the game went away (phase: training)")


def test_a_running_run_shows_speed_and_eta() -> None:
    line = render(
        status(RunPhase.TRAINING),
        "Training0",
        judge(status(RunPhase.TRAINING), now=NOW, host=HOST, pid_alive=alive),
        now=NOW,
    )
    assert "| training | iteration 1200/3000 (40.0%) | loss 0.41234 | 1,850 it/s | eta 1m05s |" in line
    assert line.endswith("pid 4242 | updated 2s ago")


def _write(folder: Path, given: Status) -> Path:
    path = folder / STATUS_FILE_NAME
    write_status(path, given)
    return path


def test_the_newest_run_below_a_learningcore_or_intermediate_folder_is_followed(tmp_path: Path) -> None:
    learning_core = tmp_path / "Intermediate" / "LearningCore"
    old = _write(learning_core / "Training0", status(RunPhase.COMPLETE, exit_code=0))
    os.utime(old, (time.time() - 100, time.time() - 100))
    new = _write(learning_core / "Training1", status(RunPhase.TRAINING))
    assert find_status_files(learning_core) == [new, old]
    assert find_status_files(tmp_path / "Intermediate")[0] == new
    assert find_status_files(learning_core / "Training0") == [old]
    assert find_status_files(old) == [old]
    assert find_status_files(tmp_path / "nothing-here") == []


def test_status_round_trips_phase_and_exit_code(tmp_path: Path) -> None:
    path = _write(tmp_path, status(RunPhase.INTERRUPTED, exit_code=8, run_dir="x"))
    back = read_status(path)
    assert back.phase is RunPhase.INTERRUPTED and back.exit_code == 8 and back.run_dir == "x"
    assert back.phase == "interrupted"  # the stored text, for scripts that compare strings


def test_once_exits_with_the_verdict_and_prints_one_line(tmp_path: Path) -> None:
    _write(tmp_path / "Training0", status(RunPhase.DIVERGED, exit_code=9))
    out = io.StringIO()
    code = watch(tmp_path, once=True, stream=out, tty=False, pid_alive=gone)
    assert code == 9
    assert "diverged with exit code 9" in out.getvalue()


def test_no_status_file_is_a_usage_error(tmp_path: Path) -> None:
    out = io.StringIO()
    assert watch(tmp_path, once=True, stream=out, tty=False) == ExitCode.USAGE
    assert "no la-trainer-status.msgpack" in out.getvalue()


def test_following_redraws_in_place_on_a_terminal_and_ends_with_the_run(tmp_path: Path) -> None:
    folder = tmp_path / "Training0"
    _write(folder, status(RunPhase.TRAINING, updated=time.time()))
    frames = [
        status(RunPhase.TRAINING, iteration=2000, updated=time.time()),
        status(RunPhase.COMPLETE, iteration=3000, exit_code=0),
    ]

    def sleep(seconds: float) -> None:
        _write(folder, frames.pop(0))

    out = io.StringIO()
    code = watch(folder, interval=0.01, stream=out, tty=True, pid_alive=alive, sleep=sleep)
    assert code == 0
    text = out.getvalue()
    assert text.count("\r\x1b[2K") == 3 and text.endswith("\n")  # three frames over one line
    assert "iteration 3000/3000" in text.rsplit("\r", 1)[-1]


def test_following_without_a_terminal_prints_one_line_per_refresh(tmp_path: Path) -> None:
    folder = tmp_path / "Training0"
    _write(folder, status(RunPhase.TRAINING, updated=time.time()))
    frames = [status(RunPhase.INTERRUPTED, exit_code=8)]

    def sleep(seconds: float) -> None:
        _write(folder, frames.pop(0))

    out = io.StringIO()
    assert watch(folder, stream=out, tty=False, pid_alive=alive, sleep=sleep) == 8
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and "\r" not in out.getvalue()


def test_a_killed_trainer_is_dead_not_running(tmp_path: Path) -> None:
    """A real pid that has exited: the liveness check of this platform says so."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    _write(
        tmp_path,
        status(
            RunPhase.TRAINING, pid=child.pid, host=__import__("socket").gethostname(), updated=time.time()
        ),
    )
    out = io.StringIO()
    assert watch(tmp_path, once=True, stream=out, tty=False) == ExitCode.RUN_DEAD
    assert f"pid {child.pid}) is gone" in out.getvalue()
