"""Stop at every point of the session, Stop twice, Complete at the edges (spec §2.4, §7.1).

In-process: the trainer's ``run_with_link`` against the emulator's shared-memory engine on a thread.
Facts: Stop always ends the run with exit code OK, at any point, without waiting for a timeout; once
training has started, Stop still saves the final snapshot and a checkpoint of the iteration reached;
Complete comes after a full round whatever IterationNum is, including 0.
"""

from __future__ import annotations

import struct
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from emulator.drive import Ending, TickAction, tick_until_end
from emulator.game import Completed
from protocol.controls import Control
from tests.support.faults import (
    FAST,
    TINY,
    assert_no_traceback,
    assert_snapshots_intact,
    load_factor,
    network_sizes,
    play_rounds,
    send_all,
    shm_in_process,
    small_task,
)
from trainer.exitcodes import ExitCode
from trainer.training.checkpoint import CHECKPOINT_NAME, load_checkpoint

LONG = replace(TINY, iteration_num=1_000_000)
"""Training that would not end by itself."""
STOP_BOUND_S = FAST.wait
"""From Stop to the end of the run: sooner than the link's shortest bounded wait could time out."""


def _wait(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("the game script waited too long")
        time.sleep(0.001)


STOPPED_AT: list[float] = []


def _stop(game: Any) -> None:
    STOPPED_AT.append(time.monotonic())
    game.stop()


def _training(game: Any) -> bool:
    """A snapshot exists: the trainer is past job creation and has run steps."""
    return any((game.config_dir.parent / "Snapshots").glob("*.bin"))


def _tick_until(game: Any, predicate: Any, timeout: float = 60.0) -> None:
    """Take whatever rounds arrive (as the engine does every tick) until ``predicate`` holds."""
    ended = tick_until_end(
        game, tick_s=0.001, on_tick=lambda: TickAction.LEAVE if predicate() else None, timeout_s=timeout
    )
    assert ended.how is Ending.LEFT, ended


def stop_before_config(game: Any, config: Any, blobs: Any) -> None:
    _stop(game)


def stop_between_networks(game: Any, config: Any, blobs: Any) -> None:
    game.begin(config)
    game.send_network(0, blobs[0])
    _stop(game)


def stop_before_experience(game: Any, config: Any, blobs: Any) -> None:
    game.begin(config)
    for network_id, blob in enumerate(blobs):
        game.send_network(network_id, blob)
    _stop(game)


def stop_during_training(game: Any, config: Any, blobs: Any) -> None:
    send_all(game, config, blobs)
    _tick_until(game, lambda: _training(game))
    _stop(game)


def stop_during_sync(game: Any, config: Any, blobs: Any) -> None:
    send_all(game, config, blobs)
    _wait(game.has_network_or_completed, 60.0)
    game.receive_network(0)  # networks 1 and 2 of this round are never taken
    _stop(game)


def stop_twice(game: Any, config: Any, blobs: Any) -> None:
    send_all(game, config, blobs)
    _tick_until(game, lambda: _training(game))
    _stop(game)
    _wait(lambda: game.control(Control.STOP_SIGNAL) == 0)  # the trainer saw and cleared it
    # EndTraining again: the engine just stores 1 (the emulator's own state machine would refuse it).
    struct.pack_into("<i", game.controls_region.buf, 4 * Control.STOP_SIGNAL, 1)


STOPS = {
    "before-config": (stop_before_config, False),
    "between-networks": (stop_between_networks, False),
    "before-experience": (stop_before_experience, False),
    "during-training": (stop_during_training, True),
    "during-sync": (stop_during_sync, True),
    "twice": (stop_twice, True),
}


@pytest.mark.parametrize("where", list(STOPS))
def test_stop_ends_the_run_with_ok_and_keeps_what_was_trained(
    where: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    script, trained = STOPS[where]
    STOPPED_AT.clear()
    result = shm_in_process(tmp_path, script, capfd, settings=LONG)
    ended = time.monotonic()
    assert result.run.game_error is None, result.run.game_error
    assert result.code == int(ExitCode.OK), result.output
    assert STOPPED_AT and ended - STOPPED_AT[0] < STOP_BOUND_S * load_factor(), result.output
    assert "stop" in result.output.lower()
    assert_no_traceback(result.output)
    snapshots = result.task_dir / "Snapshots"
    assert_snapshots_intact(snapshots, network_sizes(small_task(), LONG))
    if trained:
        # Stop after training started: the state reached is on disk (final snapshot + checkpoint).
        state = load_checkpoint(snapshots / CHECKPOINT_NAME)
        assert state.iteration >= 1
        assert (snapshots / f"Denoiser_{state.iteration}.bin").is_file()
    else:
        assert not (snapshots / CHECKPOINT_NAME).exists()


@pytest.mark.parametrize(
    ("iterations", "rounds"),
    [(0, 1), (1, 1), (10, 1), (30, 3)],
    ids=["zero", "one", "one-sync-interval", "three-sync-intervals"],
)
def test_complete_follows_one_full_round_at_every_length(
    iterations: int, rounds: int, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A round every 10 iterations; the one due at the last iteration is the final round, not an extra."""
    got: list[Any] = []

    def script(game: Any, config: Any, blobs: Any) -> None:
        send_all(game, config, blobs)
        got.extend(play_rounds(game))

    result = shm_in_process(tmp_path, script, capfd, settings=replace(TINY, iteration_num=iterations))
    assert result.run.game_error is None, result.run.game_error
    assert result.code == int(ExitCode.OK), result.output
    assert isinstance(got[-1], Completed)
    assert len(got) - 1 == rounds, f"{len(got) - 1} rounds before Complete: {result.output}"
    assert all(len(r) == 3 for r in got[:-1])
    state = load_checkpoint(result.task_dir / "Snapshots" / CHECKPOINT_NAME)
    assert state.iteration == iterations


def test_stop_racing_the_final_round_still_exits_ok(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The game sends Stop as the final round starts (EndTraining while the trainer finishes)."""

    def script(game: Any, config: Any, blobs: Any) -> None:
        send_all(game, config, blobs)
        _wait(game.has_network_or_completed, 60.0)
        game.stop()

    result = shm_in_process(tmp_path, script, capfd, settings=replace(TINY, iteration_num=5))
    assert result.code == int(ExitCode.OK), result.output
    assert load_checkpoint(result.task_dir / "Snapshots" / CHECKPOINT_NAME).iteration == 5


def test_a_spawned_trainer_exits_when_the_game_stops_instead_of_taking_complete(tmp_path: Path) -> None:
    """Issue 24 item 1 (the demo's hang): the engine-spawned trainer posted Complete, the game answered
    with Stop and never took it, and stayed alive. The trainer waited for Complete to be taken for as
    long as the game lived; it must see the Stop, clear it and exit 0 by itself."""
    from emulator.drive import begin_training
    from emulator.game import ShmGame
    from emulator.launch import EngineLayout, TrainerProcess, make_task_dir, shared_memory_command
    from emulator.session import build_session_config
    from tests.support.faults import SETTINGS, STARTUP_S, trainer_env

    settings = replace(SETTINGS, iteration_num=60)  # a round at 40, then the final round and Complete
    layout = EngineLayout.create(tmp_path / "engine")
    config, blobs = build_session_config(small_task(), settings, str(layout.intermediate_dir))
    task_dir = make_task_dir(layout.intermediate_dir)
    game = ShmGame.create(task_dir / "Configs", timeout=STARTUP_S)
    argv = shared_memory_command(layout, "Training", task_dir, game.controls_guid)
    try:
        with TrainerProcess(argv, cwd=layout.root, env=trainer_env(settings)) as trainer:
            game.process_alive = trainer.alive
            begin_training(game, config, blobs, small_task().replay_buffer)

            def complete_posted() -> bool:
                # Take every round as the engine would, but never the Complete.
                if game.control(Control.COMPLETE_SIGNAL) == 1:
                    return True
                if game.control(Control.NETWORK_SIGNAL) == 1:
                    game.receive_round()
                return False

            _wait(complete_posted, STARTUP_S * load_factor())
            game.stop()  # EndTraining instead of taking Complete; the game (this process) lives on
            code = trainer.wait(STARTUP_S * load_factor())
            output = trainer.output()
        assert code == int(ExitCode.OK), f"exit {code} (None: still waiting for Complete):\n{output}"
        assert game.control(Control.STOP_SIGNAL) == 0, "the trainer never saw the Stop"
        assert_no_traceback(output)
    finally:
        game.close()
