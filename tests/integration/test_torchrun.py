"""One drop-in for every launch: under torchrun the engine's ``train.py`` becomes the scale-out trainer.

``torchrun --standalone --nproc-per-node 2 scripts/train.py <engine argv>`` must complete an engine
session with exit code 0 and leave nothing behind (no process, no shared-memory region, no lock file);
with ``LA_TRAINER_NPROC_PER_NODE=2`` the engine-spawned drop-in re-executes itself under torchrun; and a
second trainer can never attach to a control block one already serves.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from emulator.drive import Ending, begin_training, tick_until_end
from emulator.game import ShmGame
from emulator.launch import REPO_ROOT, EngineLayout, TrainerProcess, make_task_dir, shared_memory_command
from emulator.session import EngineTask, Mode, build_session_config, run_engine_session
from emulator.session.host import leaked_shm_entries, shm_entries
from tests.support.sessions import SETTINGS
from trainer.system.lockfile import lock_path

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform == "win32", reason="POSIX process groups and /dev/shm"),
]

CHECKOUT_DROP_IN = REPO_ROOT / "scripts" / "train.py"
SESSION_BOUND_S = 150.0
"""Two ranks each import torch and build the job on a loaded 2-core box."""


def _process_group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def test_torchrun_on_the_drop_in_completes_a_session_and_leaves_nothing_behind(tmp_path: Path) -> None:
    task = EngineTask.benchmark("bimodal", size=200, seed=0)
    layout = EngineLayout.create(tmp_path / "engine")
    config, snapshots = build_session_config(task, SETTINGS, str(layout.intermediate_dir))
    task_dir = make_task_dir(layout.intermediate_dir)
    before = shm_entries()
    game = ShmGame.create(task_dir / "Configs", timeout=SESSION_BOUND_S)
    engine_argv = shared_memory_command(layout, "Training", task_dir, game.controls_guid)[2:]
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(CHECKOUT_DROP_IN),
        *engine_argv,
    ]
    env = {
        **os.environ,
        "LA_TRAINER_SYNC_EVERY_ITERATIONS": "50",
        "LA_TRAINER_SYNC_EVERY_SECONDS": "0",
        "LA_TRAINER_THREADS": "1",
    }
    proc = TrainerProcess(argv, cwd=layout.root, env=env)
    try:
        game.process_alive = proc.alive
        begin_training(game, config, snapshots, task.replay_buffer)
        ended = tick_until_end(game, tick_s=0.005, timeout_s=SESSION_BOUND_S, trainer=proc)
        game.done()
        code = proc.wait(60.0)
        output = proc.output()
    finally:
        proc.close()
        engine_names = {name.lstrip("/") for name in game.region_names}
        game.close()
    assert ended.how is Ending.COMPLETED and ended.rounds >= 2, output
    assert code == 0, output
    assert "scale-out: 2 processes" in output, output
    assert _process_group_gone(proc.pid), "a process of the torchrun job outlived it"
    assert leaked_shm_entries(before, engine_names) == ()
    assert not lock_path(game.controls_guid).exists()


def test_the_engine_spawned_drop_in_reexecutes_under_torchrun(tmp_path: Path) -> None:
    task = EngineTask.benchmark("bimodal", size=200, seed=0)
    settings = replace(
        SETTINGS,
        env={"LA_TRAINER_NPROC_PER_NODE": "2", "LA_TRAINER_THREADS": "1"},
        session_timeout_s=SESSION_BOUND_S,
        hard_timeout_s=SESSION_BOUND_S + 30,
        exit_timeout_s=60.0,
    )
    record = run_engine_session(Mode.SHM, task, tmp_path, settings)
    record.check()
    assert record.exit_code == 0 and record.completed, record.describe()
    assert any("scale-out: 2 processes" in line for line in record.log), record.describe()
    assert record.leaked_shm == ()


def _spawned_scale_out(
    tmp_path: Path, env: dict[str, str], *, guid: str | None = None, post_config: bool = True
) -> tuple[int | None, str]:
    """The engine spawning the drop-in with LA_TRAINER_NPROC_PER_NODE=2; its exit code and output."""
    task = EngineTask.benchmark("bimodal", size=48, seed=0)
    layout = EngineLayout.create(tmp_path / "engine")
    config, _ = build_session_config(task, SETTINGS, str(layout.intermediate_dir))
    task_dir = make_task_dir(layout.intermediate_dir)
    (layout.intermediate_dir / "la-trainer.json").write_text(env.pop("SETTINGS", "{}"), encoding="utf-8")
    game = ShmGame.create(task_dir / "Configs", timeout=SESSION_BOUND_S)
    argv = shared_memory_command(layout, "Training", task_dir, guid or game.controls_guid)
    proc = TrainerProcess(
        argv,
        cwd=layout.root,
        env={**os.environ, "LA_TRAINER_NPROC_PER_NODE": "2", "LA_TRAINER_THREADS": "1", **env},
    )
    try:
        game.process_alive = proc.alive
        if post_config:
            game.begin(config)
        code = proc.wait(SESSION_BOUND_S)
        output = proc.output()
    finally:
        proc.close()
        game.close()
    return code, output


WRONG_INPUTS = {
    # Checked before torchrun starts (they used to come out of torchrun as 1 with its traceback).
    "bad-settings-file": ({"SETTINGS": "{ not json"}, None, "la-trainer.json"),
    "missing-control-block": ({}, "{0F1E2D3C-4B5A-6978-8796-A5B4C3D2E1F0}", "control block"),
    # Refused by each rank under torchrun: the rank's code comes out of the job.
    "bad-rank-setting": ({"LA_TRAINER_DIST_STALL_SECONDS": "-1"}, None, "LA_TRAINER_DIST_STALL_SECONDS"),
}


@pytest.mark.parametrize("case", list(WRONG_INPUTS))
def test_wrong_inputs_of_an_engine_spawned_scale_out_end_with_their_exit_code(
    case: str, tmp_path: Path
) -> None:
    env, guid, named = WRONG_INPUTS[case]
    code, output = _spawned_scale_out(tmp_path, dict(env), guid=guid)
    assert code == 2, output  # ExitCode.USAGE, as without scale-out
    assert named in output and "Traceback" not in output and "ChildFailedError" not in output, output
