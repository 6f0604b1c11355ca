"""What a real Unreal install does to the trainer, played by the emulator (issue 16, spec §11).

* The engine's torch (2.5.1 on Windows/Linux) with numpy 1.x: the sessions below run in CI's second
  environment too (``constraints-engine.txt``, ``.ci/run``); their networks, run through the engine's
  inference path, reproduce the demonstrations.
* An editor paused at a breakpoint stops ticking for minutes: the trainer waits for as long as the game
  lives (``trainer.settings.timeouts``) and the final networks and Complete still reach it.
* A game that begins training long after it spawned the trainer is served.
* A game that dies leaves a checkpoint of the last iteration, not only the periodic ones.
* A Windows pipe in cp1252 does not silence the trainer.

Every bounded wait is made short here (``LA_TRAINER_WAIT``) so that no test can pass because a bound
happened to be long: where the trainer can see the game, it must not be waiting on a bound at all.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from emulator.session import (
    EngineTask,
    Mode,
    SessionRecord,
    SessionSettings,
    free_tcp_port,
    run_engine_session,
)
from emulator.session.host import leaked_shm_entries, shm_entries
from emulator.tasks import pendulum
from protocol.argv import SharedMemoryArgs, parse_launch_argv
from tests.support.sessions import SETTINGS
from trainer.session.links import ShmTrainerLink, SocketTrainerLink
from trainer.settings.timeouts import Timeouts

pytestmark = [pytest.mark.integration]

PAUSE_S = float(os.environ.get("PAUSE_S", "75"))
"""How long the paused game stops ticking (issue 16: 75 s, longer than every bound the trainer had)."""
LATE_START_S = float(os.environ.get("LATE_START_S", "5"))
"""How long after spawning the trainer the game begins training. CI: 5 s, five times the bound of an
unseen wait set below; the 5-minute run of the issue is ``LATE_START_S=300`` (docs/unreal-install.md)."""
SHORT_WAIT = {"LA_TRAINER_WAIT": "1"}
"""A 1 s bound for every wait that cannot see the game: a test that passes past it did not use a bound."""

ENGINE_RUNS: dict[str, tuple[Mode, dict[str, Any], dict[str, str]]] = {
    "shm-embedded-normalisation": (Mode.SHM, {"embed_normalizations_in_weights": True}, {}),
    # ode_steps prints the distillation line; PYTHONIOENCODING reproduces the Windows pipe (cp1252).
    "socket-ode-steps-2": (Mode.SOCKET, {}, {"LA_TRAINER_ODE_STEPS": "2", "PYTHONIOENCODING": "cp1252"}),
}
REPRODUCING = replace(
    SETTINGS,
    iteration_num=2000,
    batch_size=128,
    hidden_layer_num=2,
    hidden_layer_size=64,
    sync_every_iterations=500,
    session_timeout_s=240.0,
    hard_timeout_s=300.0,
    exit_timeout_s=30.0,
)
"""Long enough for the pendulum policy to match its demonstrator (score 0.94-0.97 over seeds 1-2 and both
runs on torch 2.13; the bound below leaves a wide margin)."""
SCORE_FLOOR = 0.7
"""Normalised return: 0 = random torques, 1 = the demonstrating controller."""


@pytest.fixture(scope="module")
def pendulum_task() -> EngineTask:
    """B3 pendulum: 20 demonstrations of 200 steps by a PD controller."""
    return EngineTask.benchmark("pendulum", size=20, seed=0)


def _check_completed(record: SessionRecord, *, alone: bool = True) -> None:
    record.check()
    assert record.exit_code == 0, record.describe()
    assert record.completed and not record.stop_sent, record.describe()
    if alone:  # a session's leak check sees the regions of another one running beside it
        assert record.leaked_shm == (), record.leaked_shm


@pytest.mark.slow
@pytest.mark.parametrize("run", list(ENGINE_RUNS))
def test_returned_networks_reproduce_the_demonstrations(
    run: str, pendulum_task: EngineTask, tmp_path: Path
) -> None:
    mode, knobs, env = ENGINE_RUNS[run]
    settings = replace(REPRODUCING, **knobs, env={"LA_TRAINER_THREADS": "1", **env})
    record = run_engine_session(mode, pendulum_task, tmp_path, settings)
    _check_completed(record)
    log = "\n".join(record.log)
    assert "Traceback" not in log and "UnicodeEncodeError" not in log, record.describe()
    if "LA_TRAINER_ODE_STEPS" in env:
        assert "distilling for 2 Euler step(s)" in log, record.describe()
    policy = record.policy(ode_steps=2 if "LA_TRAINER_ODE_STEPS" in env else 8)
    rng = np.random.default_rng(0)
    metrics = pendulum.evaluate_policy(lambda obs: policy.act(obs, rng), seed=0, episode_num=20)
    assert metrics["score"] > SCORE_FLOOR and metrics["upright"] >= 0.9, metrics


@pytest.mark.slow
def test_a_game_paused_after_the_first_round_still_gets_the_final_networks_and_complete(
    pendulum_task: EngineTask, tmp_path: Path
) -> None:
    """Shared memory and socket, side by side (the pause costs wall time, not CPU): after the first round
    the game stops ticking for PAUSE_S seconds, then carries on. Over shared memory the trainer waits for
    the game to take round 2 across the pause; over the socket it finishes training during the pause and
    keeps the connection until the game took Complete."""
    settings = replace(
        SETTINGS,
        pause_after_round=(1, PAUSE_S),
        session_timeout_s=PAUSE_S + 60.0,
        hard_timeout_s=PAUSE_S + 90.0,
        env=SHORT_WAIT,
    )
    modes = (Mode.SHM, Mode.SOCKET)
    before = shm_entries()
    with ThreadPoolExecutor(len(modes)) as pool:
        futures = [
            pool.submit(run_engine_session, mode, pendulum_task, tmp_path / mode.value, settings)
            for mode in modes
        ]
        records = [future.result() for future in futures]
    assert leaked_shm_entries(before, set()) == ()  # both sessions over: nothing left in /dev/shm
    for record in records:
        _check_completed(record, alone=False)
        assert len(record.rounds) >= 2, record.describe()
        paused = [t for t, what in record.engine_events if what.startswith("paused")]
        assert paused and record.rounds[-1].at_s - paused[0] >= PAUSE_S, record.describe()
    if PAUSE_S > Timeouts().notice_after:
        shm_log = "\n".join(records[0].log)
        assert "still waiting for the game to take the previous network" in shm_log, records[0].describe()
        assert "waits for as long as it runs" in shm_log
    assert records[1].exited_before_close is False


@pytest.mark.slow
@pytest.mark.parametrize("mode", [Mode.SHM, Mode.SOCKET])
def test_a_game_that_begins_training_late_is_served(
    mode: Mode, pendulum_task: EngineTask, tmp_path: Path
) -> None:
    settings = replace(
        SETTINGS,
        config_delay_s=LATE_START_S,
        session_timeout_s=60.0,
        hard_timeout_s=LATE_START_S + 90.0,
        env=SHORT_WAIT,
    )
    record = run_engine_session(mode, pendulum_task, tmp_path, settings)
    _check_completed(record)
    assert len(record.rounds) >= 2, record.describe()


@pytest.mark.parametrize(
    "argv",
    [
        ["Training", "SharedMemory", "{TASK}", "-g", "{GUID}"],
        ["Training", "Socket", "127.0.0.1:{PORT}", "{TASK}"],
    ],
    ids=["shared-memory", "socket"],
)
def test_no_bound_is_armed_for_a_game_that_spawned_the_trainer(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The faithful form of "a game that begins training 5 minutes later is served": the first wait of an
    engine-spawned trainer has no bound at all, even with a tiny one configured."""
    from trainer.session.app import open_link_for_launch
    from trainer.session.transport.shm import SharedRegion

    guid = "{0F1E2D3C-4B5A-6978-8796-A5B4C3D2E1F0}"
    task = tmp_path / "Training0"
    (task / "Configs").mkdir(parents=True)
    port = str(free_tcp_port())
    args = parse_launch_argv(
        [a.replace("{TASK}", str(task)).replace("{GUID}", guid).replace("{PORT}", port) for a in argv]
    )
    tiny = Timeouts(wait=0.001)
    region = SharedRegion.create(f"/{guid}", 40) if isinstance(args.mode, SharedMemoryArgs) else None
    try:
        link = open_link_for_launch(args, tiny, engine_spawned=True)
        try:
            assert isinstance(link, ShmTrainerLink | SocketTrainerLink)
            assert math.isinf(link.wait_bound)
        finally:
            link.close()
        unseen = open_link_for_launch(args, tiny, engine_spawned=False)
        try:
            assert isinstance(unseen, ShmTrainerLink | SocketTrainerLink)
            assert unseen.wait_bound == 0.001
        finally:
            unseen.close()
    finally:
        if region is not None:
            region.close()


@pytest.mark.slow
def test_a_game_killed_during_training_leaves_a_checkpoint_of_the_last_iteration(tmp_path: Path) -> None:
    """The trainer notices the death between steps and forces a checkpoint of the iteration it reached:
    at least as new as every snapshot it wrote, trained (finite loss and weights), and what ``--resume``
    picks up."""
    import torch

    from tests.support.faults import run_killed_game
    from trainer.records.progress import STATUS_FILE_NAME, read_status
    from trainer.training.checkpoint import CHECKPOINT_NAME, load_checkpoint, load_latest

    env = {"LA_TRAINER_SYNC_EVERY_ITERATIONS": "100000000", "LA_TRAINER_CHECKPOINT_EVERY_SECONDS": "0"}
    run = run_killed_game("shm", "during-training", tmp_path, bound_s=60.0, env=env)
    assert run.code == 5, run.describe()  # PEER_GONE
    snapshots = run.task_dir / "Snapshots"
    latest = load_checkpoint(snapshots / CHECKPOINT_NAME)
    status = read_status(run.task_dir / STATUS_FILE_NAME)
    newest_snapshot = max(int(p.stem.rpartition("_")[2]) for p in snapshots.glob("Denoiser_*.bin"))
    # Periodic checkpoints are off (0: only at the end): this one was forced by the game's death.
    assert latest.iteration >= max(status.iteration, newest_snapshot) > 0, (latest.iteration, status)
    assert math.isfinite(latest.smoothed_loss)
    assert all(bool(torch.isfinite(t).all()) for t in latest.model.values() if t.is_floating_point())
    resumed, notes = load_latest(snapshots)
    assert resumed is not None and resumed.iteration == latest.iteration, notes


def test_pause_knob_is_part_of_the_session_settings() -> None:
    assert SessionSettings(pause_after_round=(1, 2.0)).pause_after_round == (1, 2.0)
