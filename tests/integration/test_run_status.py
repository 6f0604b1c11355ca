"""A finished, an interrupted, a diverged and a failed run each leave a status file and a run record that say
so: the right phase, the last iteration and the exit code, and ``watch --once`` exits 0 only for the
healthy ones (the Docker HEALTHCHECK's question).

The runs are whole training stories (trainer.session.run.run_training through trainer.session.app.run_with_link, as the
process entry runs them) over the in-memory link with a tiny engine-built task, so each costs about a
second; one real engine-spawned session checks ``watch`` on the engine's LearningCore folder.
"""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from emulator.session import EngineTask, SessionSettings, build_session_config, run_engine_session
from trainer.commands.watch import watch
from trainer.errors import PeerGone
from trainer.exitcodes import ExitCode
from trainer.records.progress import STATUS_FILE_NAME, RunPhase, read_status
from trainer.records.runrecord import find_run_folders, read_metrics
from trainer.session.app import InterruptFlag, run_with_link
from trainer.session.links import MemoryLink
from trainer.settings.options import TrainerOptions

ITERATIONS = 250
OPTIONS = TrainerOptions(
    sync_every_iterations=100, sync_every_seconds=0.0, threads=1, checkpoint_every_seconds=0.0, ema_decay=0.9
)


def _session(**settings: object) -> tuple[object, list[bytes], object]:
    task = EngineTask.benchmark("bimodal", size=64, seed=0)
    config, blobs = build_session_config(
        task,
        SessionSettings(iteration_num=ITERATIONS, batch_size=32, **settings),
        None,  # type: ignore[arg-type]
    )
    return config, list(blobs), task.replay_buffer


def _run(
    folder: Path, stop_when: Callable[[int, InterruptFlag], bool] | None = None, **settings: object
) -> int:
    config, blobs, replay = _session(**settings)

    def open_link(flag: InterruptFlag) -> MemoryLink:
        hook = None if stop_when is None else (lambda polls: stop_when(polls, flag))
        return MemoryLink(config, blobs, replay, stop_when=hook)  # type: ignore[arg-type]

    # A task folder named as the engine names them (<TaskName><N>): the run name takes its TaskName.
    return run_with_link(open_link, options=OPTIONS, task_dir=folder)


def _watch_once(task_dir: Path) -> tuple[int, str]:
    out = io.StringIO()
    return watch(task_dir, once=True, stream=out, tty=False), out.getvalue()


def _record(task_dir: Path) -> dict[str, object]:
    (folder,) = find_run_folders(task_dir)
    return json.loads((folder / "run.json").read_text(encoding="utf-8"))


def test_a_finished_run(tmp_path: Path) -> None:
    tmp_path = tmp_path / "Training0"
    assert _run(tmp_path) == 0
    status = read_status(tmp_path / STATUS_FILE_NAME)
    assert (status.phase, status.iteration, status.total, status.exit_code) == (
        RunPhase.COMPLETE,
        ITERATIONS,
        ITERATIONS,
        0,
    )
    assert math.isfinite(status.loss)
    code, line = _watch_once(tmp_path)
    assert code == 0 and f"complete | iteration {ITERATIONS}/{ITERATIONS}" in line, line
    record = _record(tmp_path)
    assert (record["phase"], record["exit_code"], record["iteration"]) == ("complete", 0, ITERATIONS)
    (folder,) = find_run_folders(tmp_path)
    assert folder.name.startswith("Training_FlowMatching_Memory_")  # the engine's run-name pattern
    points = read_metrics(folder)
    assert [p["iteration"] for p in points] == [100, 200, ITERATIONS]
    assert {p["phase"] for p in points} == {"flow_matching"}
    assert all(p["learning_rate"] == pytest.approx(1e-3) and p["iterations_per_second"] > 0 for p in points)
    options = json.loads((folder / "options.json").read_text(encoding="utf-8"))
    assert options["sync_every_iterations"] == 100 and options["ema_decay"] == 0.9
    engine = json.loads((folder / "engine-config.json").read_text(encoding="utf-8"))
    assert engine["TrainerSettings"]["FlowMatchingTrainingSettings"]["IterationNum"] == ITERATIONS
    assert sorted(p.name for p in (folder / "Networks").iterdir()) == [f"network_{i}.bin" for i in (0, 1, 2)]


def test_an_interrupted_run(tmp_path: Path) -> None:
    tmp_path = tmp_path / "Training0"

    def interrupt_at_120(polls: int, flag: InterruptFlag) -> bool:
        if polls == 120:
            flag.set("SIGTERM")
        return False

    assert _run(tmp_path, interrupt_at_120) == ExitCode.INTERRUPTED
    status = read_status(tmp_path / STATUS_FILE_NAME)
    assert (status.phase, status.iteration, status.exit_code) == (RunPhase.INTERRUPTED, 120, 8)
    code, line = _watch_once(tmp_path)
    assert code == 8 and "interrupted with exit code 8 | iteration 120/250" in line, line
    assert _record(tmp_path)["exit_code"] == 8


def test_a_diverged_run(tmp_path: Path) -> None:
    tmp_path = tmp_path / "Training0"
    # A learning rate no optimiser survives: the loss becomes non-finite within a few steps.
    assert _run(tmp_path, learning_rate=1e30) == ExitCode.DIVERGED
    status = read_status(tmp_path / STATUS_FILE_NAME)
    assert (status.phase, status.exit_code) == (RunPhase.DIVERGED, 9)
    assert status.iteration < ITERATIONS
    code, line = _watch_once(tmp_path)
    assert code == 9 and "diverged with exit code 9" in line, line


def test_a_failed_run(tmp_path: Path) -> None:
    tmp_path = tmp_path / "Training0"

    def game_gone_at_150(polls: int, flag: InterruptFlag) -> bool:
        if polls == 150:
            raise PeerGone("the game went away (test)")
        return False

    assert _run(tmp_path, game_gone_at_150) == ExitCode.PEER_GONE
    status = read_status(tmp_path / STATUS_FILE_NAME)
    assert (status.phase, status.exit_code) == (RunPhase.FAILED, 5)
    assert status.iteration >= 100 and "the game went away" in status.message  # where it failed is kept
    code, line = _watch_once(tmp_path)
    assert code == 5 and "failed with exit code 5" in line, line
    assert _record(tmp_path)["phase"] == "failed" and _record(tmp_path)["exit_code"] == 5


def test_refused_options_are_recorded_before_the_link_opens(tmp_path: Path) -> None:
    """The engine-spawned path: a bad settings file is refused with exit 2 before any link is opened, the
    paragraph on stderr and in the status file."""
    learning_core = tmp_path / "Intermediate" / "LearningCore"
    task_dir = learning_core / "Training0"
    (task_dir / "Configs").mkdir(parents=True)
    (learning_core / "la-trainer.json").write_text('{"thread": 1}', encoding="utf-8")
    argv = ["Training", "-l", "SharedMemory", str(task_dir), "-g", "{0A1B2C3D-0000-0000-0000-000000000001}"]
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from trainer.dropin.engine import engine_main; sys.exit(engine_main(sys.argv[1:]))",
            *argv,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == ExitCode.USAGE, done.stdout + done.stderr
    assert "unknown option 'thread'. Did you mean 'threads'?" in done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    status = read_status(task_dir / STATUS_FILE_NAME)
    assert (status.phase, status.exit_code) == (RunPhase.FAILED, 2)
    assert "unknown option 'thread'" in status.message
    code, _ = _watch_once(learning_core)
    assert code == 2


@pytest.mark.integration
@pytest.mark.slow
def test_watch_follows_an_engine_spawned_run_from_the_learningcore_folder(tmp_path: Path) -> None:
    settings = replace(SessionSettings(iteration_num=200, batch_size=32), sync_every_iterations=100)
    record = run_engine_session("shm", EngineTask.benchmark("bimodal", size=64, seed=0), tmp_path, settings)
    record.check()
    learning_core = next(tmp_path.rglob("LearningCore"))
    done = subprocess.run(
        [sys.executable, "-m", "trainer", "watch", str(learning_core.parent), "--once"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "complete | iteration 200/200" in done.stdout
    assert find_run_folders(learning_core)  # the run record is found from the same folder
