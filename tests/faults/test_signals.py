"""SIGTERM/SIGINT reach the trainer mid-step, mid-write and mid-round; SIGKILL reaches it mid-checkpoint.

Facts: a signal finishes the current step (or round), writes the final snapshot and checkpoint, sends the
last round and Complete, and exits with INTERRUPTED; the engine sees complete rounds and then Complete;
no file is ever partial; after a SIGKILL in the middle of checkpoint writes one checkpoint still loads, and
``--resume`` (LA_TRAINER_RESUME=1) in the engine's next run continues from exactly that iteration.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from emulator.game import Completed
from tests.support.faults import (
    SETTINGS,
    LiveGame,
    assert_no_traceback,
    assert_snapshots_intact,
    in_process_options,
    network_sizes,
    play_rounds,
    send_all,
    shm_in_process,
    wait_for,
)
from trainer.exitcodes import ExitCode
from trainer.settings.options import TrainerOptions
from trainer.training.checkpoint import CHECKPOINT_NAME, load_checkpoint, load_latest

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def check_interrupted_run(session: LiveGame, signal_name: str) -> None:
    """Complete seen, exit INTERRUPTED, files intact, the last round is the last snapshot and checkpoint."""
    assert session.completed
    code = session.wait_exit()
    output = session.proc.output()
    assert code == int(ExitCode.INTERRUPTED), output
    assert f"{signal_name} received" in output
    assert_no_traceback(output)
    assert_snapshots_intact(session.snapshots, network_sizes(session.task, session.settings))
    state = load_checkpoint(session.snapshots / CHECKPOINT_NAME)
    final = session.snapshots / f"Denoiser_{state.iteration}.bin"
    assert final.is_file(), f"no final snapshot for iteration {state.iteration}"
    assert session.rounds, "the engine got no round"
    assert session.rounds[-1][0].data == final.read_bytes(), "the last round is not the saved final state"


def test_sigint_during_training_over_the_socket_finishes_saves_and_completes(tmp_path: Path) -> None:
    """(SIGTERM over shared memory: the storm test below.)"""
    with LiveGame("socket", tmp_path) as session:
        session.begin()
        session.wait_files("*.bin")
        os.kill(session.proc.pid, signal.SIGINT)
        session.play_until_end()
        check_interrupted_run(session, "SIGINT")


def test_sigterm_storm_during_snapshot_writes_leaves_no_partial_file(tmp_path: Path) -> None:
    """A snapshot every iteration (three atomic writes each), then five SIGTERMs 3 ms apart."""
    settings = replace(SETTINGS, iterations_per_snapshot=1)
    with LiveGame("shm", tmp_path, settings=settings) as session:
        session.begin()
        session.wait_files("*.bin", count=30)
        for _ in range(5):
            os.kill(session.proc.pid, signal.SIGTERM)
            time.sleep(0.003)
        session.play_until_end()
        check_interrupted_run(session, "SIGTERM")


def test_sigterm_in_the_middle_of_a_round_finishes_the_round(tmp_path: Path) -> None:
    with LiveGame("shm", tmp_path) as session:
        session.begin()
        game = session.game
        wait_for(game.has_network_or_completed, 60.0, "the first round", session.proc)
        first = game.receive_network(0)
        os.kill(session.proc.pid, signal.SIGTERM)
        time.sleep(0.3)  # the trainer is blocked handing over network 1 when the signal lands
        rest = (game.receive_network(1), game.receive_network(2))  # raise if the round was abandoned
        session.rounds.append((first, *rest))
        session.play_until_end()
        check_interrupted_run(session, "SIGTERM")


def test_sigkill_during_checkpoint_writes_then_resume(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Checkpoint after every iteration, SIGKILL at some point; the engine's next run (next TaskId, so
    another folder) resumes from exactly the checkpoint that survived."""
    every_iteration = {
        "LA_TRAINER_CHECKPOINT_EVERY_SECONDS": "0.000001",
        "LA_TRAINER_SYNC_EVERY_ITERATIONS": "100000000",  # keep it writing checkpoints, never waiting
    }
    with LiveGame("shm", tmp_path, env=every_iteration) as first:
        first.begin()
        first.wait_files("la-trainer-checkpoint.prev.pt")
        time.sleep(0.2)
        os.kill(first.proc.pid, signal.SIGKILL)
        assert first.proc.wait(30.0) == -signal.SIGKILL
        state, notes = load_latest(first.snapshots)
        assert state is not None, notes
        assert_snapshots_intact_except_temps(first.snapshots, first)
        intermediate = first.layout.intermediate_dir
    # The engine's next session, in-process: Training1 next to Training0, resume asked for. Same options
    # as the subprocess (ema_decay is part of the state's layout, hence of the fingerprint).
    options = in_process_options(resume=True, ema_decay=TrainerOptions().ema_decay)
    rounds: list[Any] = []

    def game(g: Any, config: Any, blobs: Any) -> None:
        send_all(g, config, blobs)
        rounds.extend(play_rounds(g))

    settings = replace(SETTINGS, iteration_num=state.iteration + 30)
    result = shm_in_process(
        intermediate, game, capfd, settings=settings, options=options, task_name="Training1"
    )
    assert result.code == int(ExitCode.OK), result.output
    assert f"resumed from the checkpoint of iteration {state.iteration}" in result.output
    assert "Training0" in result.output  # it says which run it continues
    assert isinstance(rounds[-1], Completed)
    final = load_checkpoint(result.task_dir / "Snapshots" / CHECKPOINT_NAME)
    assert final.iteration == state.iteration + 30


def assert_snapshots_intact_except_temps(folder: Path, session: LiveGame) -> None:
    """After a SIGKILL a temp file may remain (nothing can remove it); everything else must be whole."""
    for temp in folder.glob(".*.tmp"):
        temp.unlink()
    assert_snapshots_intact(folder, network_sizes(session.task, session.settings))
