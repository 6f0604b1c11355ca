"""Issue 32, item 2: sync rounds go out from a thread of their own, and the protocol's rules still hold.

One test per rule (spec §7.1, §2.4, §3, design.md "Shared memory: Complete only after network 2"):

* a round is networks 0, 1, 2 in order with one version, never broken up, however late the game;
* versions count the rounds sent: 1, 2, 3, ... with no gap where a copy was dropped, the final round
  included;
* a game that keeps up gets every round; a late or paused game gets the newest copy when it comes back,
  and the copies it could not take are dropped;
* the final round holds the last iteration's networks (bitwise those of a run whose game keeps up) and
  Complete follows it, nothing after;
* a Stop while a round waits on the game ends the run like a Stop between steps: no further round, no
  Complete, exit code 0, the checkpoint written;
* the game going away during a round fails the run with the round named (exit code 5);
* training does not wait: while the game is paused the loop goes on stepping.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from emulator.session import EngineTask, SessionSettings, build_session_config
from trainer.errors import PeerGone
from trainer.exitcodes import ExitCode
from trainer.session.app import run_with_link
from trainer.session.links import MemoryLink
from trainer.session.run import SyncRounds
from trainer.session.sender import NetworkSender
from trainer.session.transport.wait import StopRequested
from trainer.settings.options import TrainerOptions
from trainer.training.copies import WeightsCopy

ITERATIONS = 400
OPTIONS = TrainerOptions(
    sync_every_iterations=20, sync_every_seconds=0.0, threads=1, checkpoint_every_seconds=0.0, ema_decay=0.9
)


class GameLink(MemoryLink):
    """The in-memory engine with a game that can be paused (it then takes no network: a send waits, as
    over shared memory, until the game is back or asks to stop) or that can vanish mid-round."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.paused = threading.Event()
        self.gone = False
        self.polls_while_paused = 0
        self.events: list[tuple[str, int, int]] = []
        """("network", id, version) and ("complete", -1, -1), in order."""

    def send_network(self, network_id: int, data: bytes, version: int) -> None:
        while self.paused.is_set():
            if self._stop.is_set():
                raise StopRequested("the game asked the trainer to stop while it waited (test)")
            if self.gone:
                raise PeerGone("the game went away (test)")
            time.sleep(0.002)
        super().send_network(network_id, data, version)
        self.events.append(("network", network_id, version))

    def send_complete(self) -> None:
        super().send_complete()
        self.events.append(("complete", -1, -1))

    def stop_requested(self) -> bool:
        if self.paused.is_set():
            self.polls_while_paused += 1
        return super().stop_requested()


def _link(**kwargs: object) -> GameLink:
    task = EngineTask.benchmark("bimodal", size=64, seed=0)
    config, blobs = build_session_config(task, SessionSettings(iteration_num=ITERATIONS, batch_size=32), None)
    return GameLink(config, list(blobs), task.replay_buffer, **kwargs)


def _run(link: GameLink, folder: Path | None = None) -> int:
    return run_with_link(lambda flag: link, options=OPTIONS, task_dir=folder)


def _assert_rounds_whole_and_numbered(link: GameLink) -> None:
    networks = [e for e in link.events if e[0] == "network"]
    assert len(networks) % 3 == 0
    for k in range(0, len(networks), 3):
        (_, a, va), (_, b, vb), (_, c, vc) = networks[k : k + 3]
        assert (a, b, c) == (0, 1, 2) and va == vb == vc == k // 3 + 1, networks[k : k + 3]


# -- the sender alone --------------------------------------------------------------------------------------


def _settle(sender: NetworkSender) -> None:
    """Wait until the sender has nothing waiting and nothing in flight (close() would drop a waiting copy)."""
    deadline = time.monotonic() + 10
    while sender.busy and time.monotonic() < deadline:
        time.sleep(0.001)


def _copy(iteration: int) -> WeightsCopy:
    return WeightsCopy(iteration, None, (), None)


def _encode(weights: WeightsCopy) -> Mapping[int, bytes]:
    return {nid: f"{nid}@{weights.iteration}".encode() for nid in (0, 1, 2)}


class Recorder:
    """A link's send side: records (id, version, payload); blocks while ``hold`` is set."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, int, bytes]] = []
        self.hold = threading.Event()
        self.raise_: BaseException | None = None

    def send_network(self, network_id: int, data: bytes, version: int) -> None:
        while self.hold.is_set():
            time.sleep(0.001)
        if self.raise_ is not None:
            raise self.raise_
        self.sent.append((network_id, version, data))


def test_a_game_that_keeps_up_gets_every_round_in_order() -> None:
    game = Recorder()
    sync = SyncRounds(game)  # type: ignore[arg-type]
    with NetworkSender(_encode, sync.send) as sender:
        for i in range(1, 31):
            sender.offer(_copy(i))
        _settle(sender)
    assert sender.dropped == 0 and sender.sent_iterations == list(range(1, 31))
    assert [v for _, v, _ in game.sent] == [v for v in range(1, 31) for _ in range(3)]
    assert [d for _, _, d in game.sent][-3:] == [b"0@30", b"1@30", b"2@30"]


def test_a_late_game_gets_the_newest_copy_and_rounds_stay_whole_and_numbered() -> None:
    game = Recorder()
    sync = SyncRounds(game)  # type: ignore[arg-type]
    game.hold.set()
    with NetworkSender(_encode, sync.send, late_s=0.01) as sender:
        sender.offer(_copy(1))  # in flight, held by the game
        for i in range(2, 11):
            sender.offer(_copy(i))  # each replaces the one waiting: the game is late
        started = time.monotonic()
        game.hold.clear()
        while sender.sent < 2 and time.monotonic() - started < 5:
            time.sleep(0.001)
    assert sender.sent_iterations == [1, 10] and sender.dropped == 8
    assert [(n, v) for n, v, _ in game.sent] == [(0, 1), (1, 1), (2, 1), (0, 2), (1, 2), (2, 2)]
    assert [d for _, _, d in game.sent][3:] == [b"0@10", b"1@10", b"2@10"]


def test_close_waits_for_the_round_in_flight_then_the_final_round_takes_the_next_version() -> None:
    game = Recorder()
    sync = SyncRounds(game)  # type: ignore[arg-type]
    game.hold.set()
    sender = NetworkSender(_encode, sync.send, late_s=0.01)
    sender.offer(_copy(1))
    time.sleep(0.03)
    sender.offer(_copy(2))  # waiting: dropped by close
    threading.Timer(0.05, game.hold.clear).start()
    sender.close()
    assert sender.sent_iterations == [1]
    sync.send(_encode(_copy(3)))  # the story's final round, after the sender
    assert [(n, v) for n, v, _ in game.sent] == [(0, 1), (1, 1), (2, 1), (0, 2), (1, 2), (2, 2)]


def test_a_stop_while_a_round_waits_ends_the_sender_quietly() -> None:
    game = Recorder()
    game.raise_ = StopRequested("stop (test)")
    sender = NetworkSender(_encode, SyncRounds(game).send)  # type: ignore[arg-type]
    sender.offer(_copy(1))
    _settle(sender)
    sender.close()
    assert sender.stopped and sender.sent == 0
    sender.check()  # nothing to raise: the loop sees the Stop through the link
    sender.offer(_copy(2))  # ignored once ended


def test_a_failure_during_a_round_is_raised_on_the_training_thread_with_the_round_named() -> None:
    game = Recorder()
    game.raise_ = PeerGone("the game went away (test)")
    sender = NetworkSender(_encode, SyncRounds(game).send)  # type: ignore[arg-type]
    sender.offer(_copy(1))
    _settle(sender)
    sender.close()
    with pytest.raises(PeerGone, match="during sync round 1"):
        sender.check()


def test_a_busy_sender_is_waited_for_so_a_game_that_keeps_up_loses_no_round() -> None:
    game = Recorder()

    def slow_encode(weights: WeightsCopy) -> Mapping[int, bytes]:
        time.sleep(0.005)  # export and encoding: CPU work, not the game
        return _encode(weights)

    with NetworkSender(slow_encode, SyncRounds(game).send, late_s=0.01) as sender:  # type: ignore[arg-type]
        for i in range(1, 21):
            sender.offer(_copy(i))
        _settle(sender)
    assert sender.dropped == 0 and sender.sent_iterations == list(range(1, 21))


# -- whole runs ----------------------------------------------------------------------------------------------


def test_a_paused_game_does_not_stop_training_and_gets_the_last_networks(tmp_path: Path) -> None:
    fast, paused = _link(), _link()
    assert _run(fast) == ExitCode.OK

    def pause_then_resume() -> None:
        while paused.complete_rounds < 2:
            time.sleep(0.001)
        paused.paused.set()
        time.sleep(0.5)
        paused.paused.clear()

    threading.Thread(target=pause_then_resume, daemon=True).start()
    assert _run(paused) == ExitCode.OK
    assert paused.polls_while_paused > 20, "training waited for the paused game"
    _assert_rounds_whole_and_numbered(paused)
    assert paused.events[-1] == ("complete", -1, -1) and paused.completed
    # The final round: the last iteration's networks, bitwise those of the run whose game kept up.
    assert paused.rounds[-1] == fast.rounds[-1]
    assert len(paused.rounds) <= len(fast.rounds)


def test_a_game_that_keeps_up_gets_every_round_and_then_complete() -> None:
    link = _link()
    assert _run(link) == ExitCode.OK
    _assert_rounds_whole_and_numbered(link)
    assert len(link.rounds) == ITERATIONS // OPTIONS.sync_every_iterations  # 19 on cadence + the final
    assert link.events[-1] == ("complete", -1, -1)


def test_a_stop_while_a_round_waits_ends_the_run_without_complete(tmp_path: Path) -> None:
    link = _link()

    def pause_then_stop() -> None:
        while link.complete_rounds < 1:
            time.sleep(0.001)
        link.paused.set()
        time.sleep(0.2)
        link.request_stop()

    threading.Thread(target=pause_then_stop, daemon=True).start()
    folder = tmp_path / "Training0"
    assert _run(link, folder) == ExitCode.OK
    assert not link.completed and ("complete", -1, -1) not in link.events
    _assert_rounds_whole_and_numbered(link)
    assert len(link.rounds) == 1  # the round that waited was never finished, none started after it
    assert (folder / "Snapshots" / "la-trainer-checkpoint.pt").is_file(), "no checkpoint after the Stop"


def test_the_game_gone_during_a_round_fails_the_run(tmp_path: Path) -> None:
    link = _link()

    def pause_then_vanish() -> None:
        while link.complete_rounds < 1:
            time.sleep(0.001)
        link.paused.set()
        time.sleep(0.1)
        link.gone = True

    threading.Thread(target=pause_then_vanish, daemon=True).start()
    assert _run(link, tmp_path / "Training0") == ExitCode.PEER_GONE
    assert not link.completed
