"""The engine's training story (emulator/drive.py) against a scripted game half, no trainer (spec §7.1).

Facts: BeginTraining sends configs, networks in id order and the replay buffer once, with the hooks in
between; the tick loop hands every round to ``on_round`` in order and ends at Completed, after Stop
(``stop_after_rounds`` or ``on_tick``) or when ``on_tick`` leaves; a loop that cannot end raises
``TrainingStalled`` naming why, and a Complete pending when the trainer exited is still taken.
"""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from emulator.drive import Ending, Stall, TickAction, TrainingStalled, begin_training, tick_until_end
from emulator.game import COMPLETED, ReceivedNetwork, RoundResult, SocketGame
from emulator.launch import TrainerProcess
from emulator.session import EngineTask, SessionSettings, build_session_config
from protocol.config import SessionConfig
from protocol.replay import ReplayBuffer
from protocol.snapshot import SnapshotHeader

TASK = EngineTask.benchmark("bimodal", size=8, seed=0)
CONFIG, SNAPSHOTS = build_session_config(TASK, SessionSettings(hidden_layer_size=8), None)


def a_round(index: int) -> tuple[ReceivedNetwork, ...]:
    header = SnapshotHeader(1, 1, 0, 1)
    return tuple(ReceivedNetwork(k, bytes([index, k]), header, None, 0.0) for k in range(3))


class ScriptedGame:
    """A game half whose ticks answer from a script: None (nothing yet), a round, or Completed."""

    def __init__(self, ticks: list[RoundResult | None] | None = None) -> None:
        self.ticks = list(ticks or [])
        self.calls: list[str] = []

    def begin(self, session: SessionConfig) -> None:
        self.calls.append("begin")

    def send_network(self, network_id: int, data: bytes) -> None:
        self.calls.append(f"network {network_id}")

    def send_experience(self, rb: ReplayBuffer) -> None:
        self.calls.append("experience")

    def has_network_or_completed(self) -> bool:
        return bool(self.ticks) and self.ticks[0] is not None

    def receive_round(self) -> RoundResult:
        answer = self.ticks.pop(0)
        assert answer is not None
        return answer

    def stop(self) -> None:
        self.calls.append("stop")

    def tick(self) -> TickAction | None:
        """``on_tick``: advance the script by one tick (a tick with nothing to take consumes its None)."""
        if self.ticks and self.ticks[0] is None:
            self.ticks.pop(0)
        return None


def test_begin_training_sends_configs_networks_in_order_then_the_experience_once() -> None:
    game = ScriptedGame()
    begin_training(
        game,
        CONFIG,
        SNAPSHOTS,
        TASK.replay_buffer,
        after_configs=lambda: game.calls.append("after configs"),
        after_network=lambda network_id: game.calls.append(f"after {network_id}"),
    )
    assert game.calls == [
        "begin",
        "after configs",
        "network 0",
        "after 0",
        "network 1",
        "after 1",
        "network 2",
        "after 2",
        "experience",
    ]


def test_ticks_hand_every_round_over_in_order_and_end_at_completed() -> None:
    game = ScriptedGame([None, a_round(1), None, None, a_round(2), COMPLETED])
    seen: list[tuple[ReceivedNetwork, ...]] = []
    ended = tick_until_end(game, tick_s=0.0, on_round=seen.append, on_tick=game.tick)
    assert ended.how is Ending.COMPLETED
    assert [[network.data for network in r] for r in seen] == [
        [network.data for network in a_round(k)] for k in (1, 2)
    ]
    assert ended.rounds == 2 and ended.last_round is seen[-1]
    assert "stop" not in game.calls


def test_stop_after_rounds_sends_stop_once_and_takes_no_more() -> None:
    game = ScriptedGame([a_round(1), a_round(2), a_round(3), COMPLETED])
    ended = tick_until_end(game, tick_s=0.0, stop_after_rounds=2)
    assert (ended.how, ended.rounds) == (Ending.STOPPED, 2)
    assert game.calls == ["stop"]
    assert len(game.ticks) == 2  # round 3 and Complete were never taken


@pytest.mark.parametrize(
    ("action", "how", "calls"),
    [(TickAction.STOP, Ending.STOPPED, ["stop"]), (TickAction.LEAVE, Ending.LEFT, [])],
)
def test_on_tick_stops_or_leaves_after_the_round_check(
    action: TickAction, how: Ending, calls: list[str]
) -> None:
    game = ScriptedGame([a_round(1), None])
    ended = tick_until_end(game, tick_s=0.0, on_tick=lambda: action)
    assert (ended.how, ended.rounds) == (how, 1)  # the round of the same tick was taken first
    assert game.calls == calls


def test_no_complete_within_the_timeout_is_a_stall_with_the_round_count() -> None:
    game = ScriptedGame([a_round(1)])
    start = time.monotonic()
    with pytest.raises(TrainingStalled) as info:
        tick_until_end(game, tick_s=0.001, timeout_s=0.05)
    assert info.value.why is Stall.TIMED_OUT and info.value.rounds == 1
    assert "no Complete within 0.05 s (1 rounds)" in str(info.value)
    assert time.monotonic() - start < 2.0


@pytest.fixture
def exited_trainer(tmp_path: Path) -> Iterator[TrainerProcess]:
    proc = TrainerProcess([sys.executable, "-c", "raise SystemExit(3)"], cwd=tmp_path)
    assert proc.wait(30.0) == 3
    yield proc
    proc.close()


def test_a_trainer_that_exited_without_complete_is_a_stall(exited_trainer: TrainerProcess) -> None:
    with pytest.raises(TrainingStalled) as info:
        tick_until_end(ScriptedGame(), tick_s=0.0, trainer=exited_trainer)
    assert info.value.why is Stall.TRAINER_EXITED
    assert "exited with code 3 without completing" in str(info.value)


def test_a_complete_pending_when_the_trainer_exited_is_still_taken(exited_trainer: TrainerProcess) -> None:
    """Shared memory reads a Complete posted before the exit (§10 item 7: only the socket ignores it)."""
    ended = tick_until_end(ScriptedGame([a_round(1), COMPLETED]), tick_s=0.0, trainer=exited_trainer)
    assert (ended.how, ended.rounds) == (Ending.COMPLETED, 1)


def test_a_socket_trainer_that_hangs_up_without_complete_is_a_stall() -> None:
    ours, theirs = socket.socketpair()
    game = SocketGame(ours, timeout=1.0, process_alive=None)
    theirs.close()
    try:
        with pytest.raises(TrainingStalled) as info:
            tick_until_end(game, tick_s=0.001, timeout_s=5.0)
        assert info.value.why is Stall.PEER_CLOSED
        assert "closed the connection without sending Complete" in str(info.value)
    finally:
        game.close()
