"""Section 3 of ``la-trainer bench``: startup of the real trainer.

The drop-in ``trainer/dropin/train.py`` is spawned as the engine spawns it (shared memory), ``--startup-repeats`` times:
launch → first network request, → training loop start (its log line), → first sync round, which follows
the first iteration (``LA_TRAINER_SYNC_EVERY_ITERATIONS=1``). For context, ``import torch`` in a fresh
interpreter (the IPC worker's, when it ran).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from emulator.bench.config import ENGINE_TICK_S, ENGINE_TIMEOUT_S, SYNC_STEPS, TRAIN_CONFIGS, BenchSettings
from emulator.bench.stats import median
from emulator.bench.workload import session_for, synthetic_replay

if TYPE_CHECKING:
    from protocol.config import SessionConfig
    from protocol.replay import ReplayBuffer

__all__ = ["measure_startup"]


def _startup_once(
    work: Path, replay: ReplayBuffer, config: SessionConfig, snapshots: tuple[bytes, ...]
) -> dict[str, float]:
    from emulator.drive import begin_training, tick_until_end
    from emulator.game import ShmGame
    from emulator.launch import EngineLayout, TrainerProcess, make_task_dir, shared_memory_command

    layout = EngineLayout.create(work)
    task_dir = make_task_dir(layout.intermediate_dir)
    game = ShmGame.create(task_dir / "Configs", timeout=ENGINE_TIMEOUT_S)
    lines: list[tuple[float, str]] = []
    env = dict(os.environ)
    env |= {"LA_TRAINER_SYNC_EVERY_ITERATIONS": "1", "LA_TRAINER_SYNC_EVERY_SECONDS": "0"}
    argv = shared_memory_command(layout, "Training", task_dir, game.controls_guid)
    launched = time.monotonic()
    proc = TrainerProcess(
        argv, cwd=layout.root, env=env, echo=lambda line: lines.append((time.monotonic(), line))
    )
    game.process_alive = proc.alive
    out: dict[str, float] = {}

    def first_request(network_id: int) -> None:
        if network_id == 0:  # handed over once the trainer asked for network 0
            out["first_request_s"] = time.monotonic() - launched

    try:
        begin_training(game, config, snapshots, replay, after_network=first_request)
        # Stop after the first round (it follows iteration 1); Complete first leaves first_round_s out.
        ended = tick_until_end(game, tick_s=ENGINE_TICK_S, stop_after_rounds=1, timeout_s=120.0, trainer=proc)
        if ended.last_round is not None:
            out["first_round_s"] = ended.last_round[-1].received_at - launched
        proc.wait(30.0)
        for at, line in lines:
            if "la-trainer: training" in line:
                out["training_start_s"] = at - launched
                break
    finally:
        proc.close()
        game.close()
    return out


def measure_startup(settings: BenchSettings, work: Path, torch_import_s: float = math.nan) -> dict[str, Any]:
    """Section 3: the real trainer, spawned over shared memory, ``startup_repeats`` times. For context,
    ``import torch`` in a fresh interpreter (the IPC worker's, when it ran; else timed here)."""
    default = TRAIN_CONFIGS[0]
    replay = synthetic_replay(SYNC_STEPS)
    config, snapshots = session_for(replay, default)
    runs = [
        _startup_once(work / f"startup{i}", replay, config, snapshots)
        for i in range(settings.startup_repeats)
    ]
    torch_import = [] if math.isnan(torch_import_s) else [torch_import_s]
    while not torch_import:
        code = "import time; t = time.perf_counter(); import torch; print(time.perf_counter() - t)"
        done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
        torch_import.append(float(done.stdout.strip().splitlines()[-1]))
    keys = ("first_request_s", "training_start_s", "first_round_s")
    return {k: median([r[k] for r in runs if k in r]) for k in keys} | {
        "import_torch_s": median(torch_import),
        "runs": runs,
    }
