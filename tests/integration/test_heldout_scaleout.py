"""Scale-out with a held-out set (trainer/training/heldout.py, trainer/distributed): rank 0 measures, the other
rank trains only, and the run completes as without the option (the measurement holds no collective, so
the ranks stay in step). Every rank holds out the same episodes: the split is seeded by the config."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from emulator.drive import Ending, begin_training, tick_until_end
from emulator.game import ShmGame
from emulator.launch import REPO_ROOT, EngineLayout, TrainerProcess, make_task_dir, shared_memory_command
from emulator.session import EngineTask, build_session_config
from tests.support.sessions import SETTINGS
from trainer.records.runrecord import find_run_folders, read_metrics

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform == "win32", reason="POSIX process groups and /dev/shm"),
]

SESSION_BOUND_S = 150.0
"""Two ranks each import torch and build the job on a loaded 2-core box."""


def test_rank_0_measures_the_held_out_set_under_torchrun(tmp_path: Path) -> None:
    task = EngineTask.benchmark("bimodal", size=200, seed=0)
    layout = EngineLayout.create(tmp_path / "engine")
    config, snapshots = build_session_config(task, SETTINGS, str(layout.intermediate_dir))
    task_dir = make_task_dir(layout.intermediate_dir)
    game = ShmGame.create(task_dir / "Configs", timeout=SESSION_BOUND_S)
    engine_argv = shared_memory_command(layout, "Training", task_dir, game.controls_guid)[2:]
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(REPO_ROOT / "scripts" / "train.py"),
        *engine_argv,
    ]
    env = {
        **os.environ,
        "LA_TRAINER_SYNC_EVERY_ITERATIONS": "50",
        "LA_TRAINER_SYNC_EVERY_SECONDS": "0",
        "LA_TRAINER_THREADS": "1",
        "LA_TRAINER_HELDOUT_SHARE": "0.1",
        "LA_TRAINER_HELDOUT_EVERY_ITERATIONS": "100",
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
        game.close()
    assert ended.how is Ending.COMPLETED, output
    assert code == 0, output
    assert "scale-out: 2 processes" in output, output
    assert "held out 20 of 200 episodes" in output, output
    # rank 0 measured at its cadence and at the end, once each: the record is rank 0's alone
    (folder,) = find_run_folders(task_dir)
    measured = [p["iteration"] for p in read_metrics(folder) if "heldout" in p]
    assert measured == [100, 200, SETTINGS.iteration_num], measured
