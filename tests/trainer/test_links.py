"""Trainer links driven against the emulator's game halves (spec §2.4, §3, §5.5, §7.1, §10 items 7-9).

The game side is the emulator's own (:class:`emulator.game.ShmGame`, :class:`emulator.game.SocketGame`,
driven by :mod:`emulator.drive` or call by call), so these tests and the session harness play the same
engine. It runs on a daemon thread, and every wait on both sides is bounded, so a broken link fails a test
within seconds instead of hanging it.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from emulator.drive import Ending, begin_training, tick_until_end
from emulator.game import ReceivedNetwork, RoundResult, ShmGame, SocketGame
from protocol.config import SessionConfig
from protocol.controls import Control, read_controls
from protocol.guid import os_shm_name
from protocol.replay import ReplayBuffer
from protocol.stream import encode_network_to_trainer
from tests.support.configs import sample_networks, sample_replay, write_export
from tests.support.links import NETWORK_IDS, PLATFORM, config, initial_networks, trained
from trainer.errors import Interrupted, PeerGone, WaitTimeout
from trainer.session.links import FileTrainerLink, KeepAlive, ShmTrainerLink, SocketTrainerLink
from trainer.session.transport.files import network_path
from trainer.session.transport.shm import region_exists
from trainer.session.transport.wait import StopRequested
from trainer.settings.timeouts import Timeouts

posix_ipc = pytest.importorskip("posix_ipc")

FAST = Timeouts(
    wait=5,
    ping_interval=0.02,
    poll_interval=0.0005,
    peer_check_interval=0.05,
)
GAME_TIMEOUT = 5.0
JOIN_TIMEOUT = 10.0
ROUNDS = 2


def poll(predicate: Callable[[], Any], what: str, timeout: float = GAME_TIMEOUT) -> Any:
    """The game side's bounded wait (the engine polls every 1 ms)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(0.0005)
    raise TimeoutError(f"game side timed out waiting for {what}")


@dataclass
class GameThread:
    """Runs a game script on a daemon thread; ``join()`` re-raises its exception in the test."""

    target: Callable[[], None]
    error: list[BaseException] = field(default_factory=list)
    thread: threading.Thread | None = None

    def start(self) -> GameThread:
        def run() -> None:
            try:
                self.target()
            except BaseException as exc:
                self.error.append(exc)

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        return self

    def join(self) -> None:
        assert self.thread is not None
        self.thread.join(JOIN_TIMEOUT)
        assert not self.thread.is_alive(), "game thread hung"
        if self.error:
            raise self.error[0]


@dataclass
class Played:
    """What the game took back: each round's snapshots by network id, and the networks as received."""

    rounds: list[tuple[ReceivedNetwork, ...]] = field(default_factory=list)

    @property
    def received(self) -> list[dict[int, bytes]]:
        return [{network.network_id: network.data for network in r} for r in self.rounds]

    @property
    def versions(self) -> list[int | None]:
        return [network.version for r in self.rounds for network in r]


def begin(game: ShmGame | SocketGame) -> None:
    """BeginTraining: the configs, the three initial networks, the experience (§7.1 steps 3-5)."""
    begin_training(game, config(), initial_networks(), sample_replay())


def play_to_complete(game: ShmGame | SocketGame, played: Played) -> None:
    """Tick as the engine does until Completed, keeping each round."""
    ended = tick_until_end(
        game, tick_s=0.001, on_round=played.rounds.append, timeout_s=GAME_TIMEOUT + JOIN_TIMEOUT
    )
    assert ended.how is Ending.COMPLETED, ended


def run_trainer_session(link: Any) -> tuple[SessionConfig, dict[int, bytes], ReplayBuffer]:
    """The trainer half of the full session: config, 3 networks, experience, 2 rounds, Complete, finish."""
    cfg = link.receive_config()
    networks = {nid: link.receive_network(nid) for nid in NETWORK_IDS}
    replay = link.receive_experience()
    for r in range(ROUNDS):
        for nid, blob in trained(r).items():
            link.send_network(nid, blob, r + 1)
    assert link.stop_requested() is False
    link.send_complete()
    link.finish(GAME_TIMEOUT)
    return cfg, networks, replay


def assert_replay_equal(actual: ReplayBuffer, expected: ReplayBuffer) -> None:
    np.testing.assert_array_equal(actual.episode_starts, expected.episode_starts)
    np.testing.assert_array_equal(actual.episode_lengths, expected.episode_lengths)
    for a, b in zip(
        actual.observations + actual.actions, expected.observations + expected.actions, strict=True
    ):
        np.testing.assert_array_equal(a, b)


# =========================================================================================================
# Shared memory


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    return tmp_path / "Task0" / "Configs"


@pytest.fixture
def shm_game(config_dir: Path) -> Iterator[ShmGame]:
    """The engine's communicator in spawned mode: it created (and initialised) the controls block."""
    game = ShmGame.create(config_dir, timeout=GAME_TIMEOUT, platform=PLATFORM)
    yield game
    game.close()  # unlinks every region it created, including what a failing test left behind


def test_shm_full_session_spawned(shm_game: ShmGame) -> None:
    link = ShmTrainerLink(
        shm_game.config_dir.parent,  # the task directory: the link finds Configs/ itself
        shm_game.controls_guid,
        timeouts=FAST,
        platform=PLATFORM,
    )
    check_shm_full_session(shm_game, link, spawned=True)


def test_shm_full_session_attach(config_dir: Path) -> None:
    guid = "{" + str(uuid.uuid4()).upper() + "}"
    link = ShmTrainerLink(config_dir.parent, guid.lower(), create=True, timeouts=FAST, platform=PLATFORM)
    assert link.guid_string == guid  # normalised as the engine prints it
    game = ShmGame.attach(guid, config_dir, timeout=GAME_TIMEOUT, platform=PLATFORM)
    try:
        check_shm_full_session(game, link, spawned=False)
    finally:
        game.close()


def check_shm_full_session(game: ShmGame, link: ShmTrainerLink, *, spawned: bool) -> None:
    played = Played()
    try:

        def game_script() -> None:
            begin(game)
            play_to_complete(game, played)

        game_thread = GameThread(game_script).start()
        cfg, networks, replay = run_trainer_session(link)
        game_thread.join()
        assert cfg == config()
        assert networks == sample_networks()
        assert_replay_equal(replay, sample_replay())
        assert replay.observations[0].flags.owndata or replay.observations[0].base is not None
        assert played.received == [trained(0), trained(1)]
        assert read_controls(link._control_region.buf)[Control.EXPERIENCE_SIGNAL] == 0
        assert link._staging is None  # the staged memory went to the caller with the buffer
        # The engine may reuse its regions once we acknowledged: what we hold is our own copy.
        for region in game.replay_regions.values():
            region.buf[:] = bytes(len(region.buf))
        assert_replay_equal(replay, sample_replay())
    finally:
        link.close()
    controls_name = os_shm_name(game.controls_guid, PLATFORM)
    # The engine's regions stay (the controls block too, when it created it); ours (attach mode) is gone.
    assert game.region_names and all(region_exists(name) for name in game.region_names)
    assert region_exists(controls_name) is spawned
    # The copied experience survives the link.
    assert_replay_equal(replay, sample_replay())
    link.close()  # idempotent


def test_shm_stop_after_experience_is_seen_and_cleared(shm_game: ShmGame) -> None:
    with ShmTrainerLink(
        shm_game.config_dir, shm_game.controls_guid, timeouts=FAST, platform=PLATFORM
    ) as link:

        def game_script() -> None:
            begin(shm_game)
            shm_game.stop()

        game_thread = GameThread(game_script).start()
        link.receive_config()
        for nid in NETWORK_IDS:
            link.receive_network(nid)
        link.receive_experience()
        game_thread.join()
        assert link.stop_requested() is True
        assert read_controls(link._control_region.buf)[Control.STOP_SIGNAL] == 0  # cleared on seeing it
        assert link.stop_requested() is True  # and it stays seen


def test_shm_stop_during_a_wait_raises_stop_requested(shm_game: ShmGame) -> None:
    with ShmTrainerLink(
        shm_game.config_dir, shm_game.controls_guid, timeouts=FAST, platform=PLATFORM
    ) as link:
        shm_game.stop()
        with pytest.raises(StopRequested) as info:
            link.receive_config()
        assert "config" in str(info.value)


def test_shm_config_timeout_names_what_and_how_to_change_it(
    shm_game: ShmGame, capsys: pytest.CaptureFixture[str]
) -> None:
    """A link that cannot see the game (not started by it) bounds its waits, announces the bound when the
    first wait starts, and names the wait and the knob when it gives up."""
    quick = Timeouts(wait=0.1, poll_interval=0.001, peer_check_interval=0.05)
    with ShmTrainerLink(
        shm_game.config_dir, shm_game.controls_guid, timeouts=quick, platform=PLATFORM, watch_parent=False
    ) as link:
        started = time.monotonic()
        with pytest.raises(WaitTimeout) as info:
            link.receive_config()
        assert 0.1 <= time.monotonic() - started < 2.0
    message = str(info.value)
    assert "config" in message and "--wait SECONDS" in message and "LA_TRAINER_WAIT" in message, message
    announced = capsys.readouterr().out
    assert "waiting up to 0.1 s for the game's config" in announced and "--wait SECONDS" in announced


def test_spawned_shm_waits_have_no_bound(shm_game: ShmGame) -> None:
    """Spawned (the engine process is watched): a wait outlasts Timeouts.wait, and a long one says so."""
    said: list[str] = []
    quick = Timeouts(wait=0.05, notice_after=0.1, poll_interval=0.001, peer_check_interval=0.02)
    with ShmTrainerLink(
        shm_game.config_dir, shm_game.controls_guid, timeouts=quick, platform=PLATFORM, watch_parent=True
    ) as link:
        link._rule._say = said.append  # the log line, captured
        Path(shm_game.config_dir).mkdir(parents=True, exist_ok=True)
        (Path(shm_game.config_dir) / "trainer-config.json").write_text('{"TrainerMethod": "FlowMatching"}')
        timer = threading.Timer(0.5, shm_game.controls.post_config)
        timer.start()
        try:
            assert link.peek_trainer_method() == "FlowMatching"  # waited 10x the bound, no timeout
        finally:
            timer.cancel()
    assert said and all("still waiting for the game's config" in line for line in said), said
    assert "waits for as long as it runs" in said[0]


def test_shm_engine_gone_while_waiting_is_peer_gone(shm_game: ShmGame) -> None:
    with ShmTrainerLink(
        shm_game.config_dir, shm_game.controls_guid, timeouts=FAST, platform=PLATFORM
    ) as link:
        shm_game.controls_region.close()  # the engine unlinks its control block when it ends
        start = time.monotonic()
        with pytest.raises(PeerGone):
            link.receive_config()
        assert time.monotonic() - start < 2.0


def test_shm_ping_and_keepalive_set_the_ping_signal(shm_game: ShmGame) -> None:
    with ShmTrainerLink(
        shm_game.config_dir, shm_game.controls_guid, timeouts=FAST, platform=PLATFORM
    ) as link:
        with KeepAlive(link, 0.01) as keep:
            poll(shm_game.controls.take_ping, "a ping", timeout=2)
            poll(shm_game.controls.take_ping, "a second ping", timeout=2)
        assert keep.pings >= 2 and keep.error is None


def test_shm_complete_waits_for_the_last_network(shm_game: ShmGame, monkeypatch: pytest.MonkeyPatch) -> None:
    """Complete is not raised while network 2 is still pending (the engine would skip loading it)."""
    with ShmTrainerLink(
        shm_game.config_dir, shm_game.controls_guid, timeouts=FAST, platform=PLATFORM
    ) as link:
        start = GameThread(lambda: begin(shm_game)).start()
        link.receive_config()
        for nid in NETWORK_IDS:
            link.receive_network(nid)
        link.receive_experience()
        start.join()
        released: list[None] = []
        taken: list[bool] = []
        release = shm_game.controls.release_network

        def release_slowly() -> None:
            released.append(None)
            if len(released) == len(NETWORK_IDS):
                time.sleep(0.1)  # the engine is slow to load the last network
                taken.append(read_controls(link._control_region.buf)[Control.COMPLETE_SIGNAL] == 0)
            release()

        monkeypatch.setattr(shm_game.controls, "release_network", release_slowly)
        got: list[RoundResult] = []
        thread = GameThread(lambda: got.append(shm_game.receive_round())).start()
        for nid, blob in trained(0).items():
            link.send_network(nid, blob, 1)
        link.send_complete()
        thread.join()
        (taken_round,) = got
        assert isinstance(taken_round, tuple)
        assert {network.network_id: network.data for network in taken_round} == trained(0)
        assert taken == [True]  # Complete was not raised while network 2 was pending
        assert read_controls(link._control_region.buf)[Control.COMPLETE_SIGNAL] == 1


def test_shm_wait_is_interruptible(shm_game: ShmGame) -> None:
    flag = threading.Event()
    with ShmTrainerLink(
        shm_game.config_dir, shm_game.controls_guid, timeouts=FAST, platform=PLATFORM, interrupted=flag.is_set
    ) as link:
        threading.Timer(0.05, flag.set).start()
        with pytest.raises(Interrupted):
            link.receive_config()


# =========================================================================================================
# Socket


@pytest.fixture
def socket_link() -> Iterator[SocketTrainerLink]:
    link = SocketTrainerLink("127.0.0.1", 0, FAST)
    yield link
    link.close()


@pytest.fixture
def socket_games() -> Iterator[list[SocketGame]]:
    """Closes (DoneTraining) whatever game a test connected, however it ended."""
    games: list[SocketGame] = []
    yield games
    for game in games:
        game.close()


def connect(link: SocketTrainerLink, games: list[SocketGame]) -> SocketGame:
    """The engine's connect (retried every 1 ms until the communicator timeout, §1.3)."""
    game = SocketGame.connect("127.0.0.1", link.port, timeout=GAME_TIMEOUT)
    games.append(game)
    return game


def test_socket_full_session(socket_link: SocketTrainerLink, socket_games: list[SocketGame]) -> None:
    played = Played()

    def game_script() -> None:
        game = connect(socket_link, socket_games)
        begin(game)
        play_to_complete(game, played)
        time.sleep(0.05)  # the engine closes on its next tick; the trainer must still be waiting
        game.done()

    game_thread = GameThread(game_script).start()
    cfg, networks, replay = run_trainer_session(socket_link)
    game_thread.join()
    assert cfg.data == config().data and cfg.model == config().model
    assert cfg.trainer.temp_directory is None
    assert networks == sample_networks()
    assert_replay_equal(replay, sample_replay())
    assert socket_link.networks_version == -1
    assert played.received == [trained(0), trained(1)]
    assert played.versions == [1, 1, 1, 2, 2, 2]


def test_socket_second_engine_cannot_connect(
    socket_link: SocketTrainerLink, socket_games: list[SocketGame]
) -> None:
    port = socket_link.port  # the link stops listening once the engine is connected
    game_thread = GameThread(lambda: begin(connect(socket_link, socket_games))).start()
    socket_link.receive_config()
    game_thread.join()
    with pytest.raises(OSError):
        intruder = socket.create_connection(("127.0.0.1", port), timeout=1)
        intruder.settimeout(1)
        if intruder.recv(1) == b"":
            raise ConnectionResetError


def test_socket_stop_is_seen_without_blocking(
    socket_link: SocketTrainerLink, socket_games: list[SocketGame]
) -> None:
    def game_script() -> None:
        game = connect(socket_link, socket_games)
        begin(game)
        time.sleep(0.05)
        game.stop()

    game_thread = GameThread(game_script).start()
    socket_link.receive_config()
    for nid in NETWORK_IDS:
        socket_link.receive_network(nid)
    socket_link.receive_experience()
    start = time.monotonic()
    assert poll(socket_link.stop_requested, "stop", timeout=2) is True
    assert time.monotonic() - start < 2
    assert socket_link.stop_requested() is True
    game_thread.join()


def test_socket_stop_before_networks_raises_stop_requested(
    socket_link: SocketTrainerLink, socket_games: list[SocketGame]
) -> None:
    def game_script() -> None:
        game = connect(socket_link, socket_games)
        game.begin(config())
        game.stop()
        time.sleep(0.2)
        game.done()

    game_thread = GameThread(game_script).start()
    socket_link.receive_config()
    with pytest.raises(StopRequested):
        socket_link.receive_network(0)
    assert socket_link.stop_requested() is True
    game_thread.join()


@pytest.mark.parametrize("stop_first", [True, False], ids=["stop-then-close", "close"])
def test_socket_send_into_a_closed_game_is_a_stop_only_if_the_game_sent_stop(
    socket_link: SocketTrainerLink, socket_games: list[SocketGame], stop_first: bool
) -> None:
    """The engine may send Stop and close at once while a network is still going out (spec §2.4): the
    failed send is then the requested stop (exit 0), not a lost game (exit 5)."""

    def game_script() -> None:
        game = connect(socket_link, socket_games)
        begin(game)
        if stop_first:
            game.stop()
        game.done()

    game_thread = GameThread(game_script).start()
    socket_link.receive_config()
    for nid in NETWORK_IDS:
        socket_link.receive_network(nid)
    socket_link.receive_experience()
    game_thread.join()
    expected = StopRequested if stop_first else PeerGone
    with pytest.raises(expected):
        for version in range(1, 1001):  # the first sends may still fit into the socket's buffers
            socket_link.send_network(0, trained(0)[0], version)
            time.sleep(0.001)


def test_socket_eof_mid_message_is_peer_gone(
    socket_link: SocketTrainerLink, socket_games: list[SocketGame]
) -> None:
    def game_script() -> None:
        game = connect(socket_link, socket_games)
        game.begin(config())
        parts = encode_network_to_trainer(0, sample_networks()[0])
        # The engine dies mid-snapshot: half a SendNetwork on its connection, then the close.
        game.sock.sendall(parts[0])
        game.sock.sendall(bytes(parts[1])[:100])
        game.done()

    game_thread = GameThread(game_script).start()
    socket_link.receive_config()
    with pytest.raises(PeerGone) as info:
        socket_link.receive_network(0)
    assert "middle of a message" in str(info.value)
    game_thread.join()


def test_socket_eof_during_training_is_peer_gone(
    socket_link: SocketTrainerLink, socket_games: list[SocketGame]
) -> None:
    def game_script() -> None:
        game = connect(socket_link, socket_games)
        begin(game)
        game.done()

    game_thread = GameThread(game_script).start()
    socket_link.receive_config()
    for nid in NETWORK_IDS:
        socket_link.receive_network(nid)
    socket_link.receive_experience()
    game_thread.join()
    with pytest.raises(PeerGone):
        poll(socket_link.stop_requested, "EOF", timeout=2)


def test_socket_wait_for_connection_is_interruptible() -> None:
    with (
        SocketTrainerLink("127.0.0.1", 0, FAST, interrupted=lambda: True) as link,
        pytest.raises(Interrupted),
    ):
        link.receive_config()


def test_socket_accept_timeout() -> None:
    """Not started by a game and nobody connected: the one socket wait with a bound."""
    with SocketTrainerLink("127.0.0.1", 0, Timeouts(wait=0.1)) as link, pytest.raises(WaitTimeout) as info:
        link.receive_config()
    assert "connect" in str(info.value) and "--wait SECONDS" in str(info.value)


def test_socket_keepalive_pings_never_split_a_message(
    socket_link: SocketTrainerLink, socket_games: list[SocketGame]
) -> None:
    played = Played()

    def game_script() -> None:
        game = connect(socket_link, socket_games)
        begin(game)
        play_to_complete(game, played)
        time.sleep(0.05)  # the engine closes on its next tick; the trainer must still be waiting
        game.done()

    game_thread = GameThread(game_script).start()
    socket_link.receive_config()
    for nid in NETWORK_IDS:
        socket_link.receive_network(nid)
    socket_link.receive_experience()
    with KeepAlive(socket_link, 0.0005) as keep:
        time.sleep(0.02)
        for r in range(ROUNDS):
            for nid, blob in trained(r).items():
                socket_link.send_network(nid, blob, r + 1)
        time.sleep(0.02)
    socket_link.send_complete()
    socket_link.finish(GAME_TIMEOUT)
    game_thread.join()
    assert keep.error is None
    assert played.received == [trained(0), trained(1)]
    # Each ping arrived whole between messages (a split message would have failed the game's decoder);
    # pings that found the send lock taken were skipped, so the game may count fewer than were tried.
    (game,) = socket_games
    assert 0 < game.pings_taken <= keep.pings


def test_socket_finish_waits_while_the_connection_is_open(
    socket_link: SocketTrainerLink, socket_games: list[SocketGame]
) -> None:
    """After Complete the trainer waits for the game to close the connection for as long as it is open
    (spec §10 item 7; a game paused right after Complete still gets it), whatever bound it is given."""
    game_thread = GameThread(lambda: begin(connect(socket_link, socket_games))).start()
    socket_link.receive_config()
    game_thread.join()
    socket_link.send_complete()
    (game,) = socket_games
    closer = threading.Timer(0.6, game.done)
    closer.start()
    start = time.monotonic()
    try:
        socket_link.finish(0.1)
    finally:
        closer.cancel()
    assert 0.6 <= time.monotonic() - start < 5.0


# =========================================================================================================
# Files


def test_file_link_session(tmp_path: Path) -> None:
    stamp = write_export(tmp_path / "TrainingMaterials" / "20250101120000")
    out = tmp_path / "Offline0"
    link = FileTrainerLink(tmp_path / "TrainingMaterials", output_dir=out)
    assert link.folder == stamp
    cfg = link.receive_config()
    assert cfg.replay_buffer(0).max_step_num == 20
    assert {nid: link.receive_network(nid) for nid in NETWORK_IDS} == sample_networks()
    assert_replay_equal(link.receive_experience(), sample_replay())
    with KeepAlive(link, 0.01):
        assert link.stop_requested() is False
    for nid, blob in trained(0).items():
        link.send_network(nid, blob, 1)
    link.send_complete()
    link.finish(1)
    link.close()
    assert {nid: network_path(out, nid).read_bytes() for nid in NETWORK_IDS} == trained(0)
    assert {nid: network_path(stamp, nid).read_bytes() for nid in NETWORK_IDS} == sample_networks()


def test_file_link_output_dir(tmp_path: Path) -> None:
    stamp = write_export(tmp_path / "20250101120000")
    out = tmp_path / "out"
    link = FileTrainerLink(stamp, output_dir=out)
    link.receive_config()
    for network_id, data in trained(0).items():  # a round is written whole, once all its networks came
        link.send_network(network_id, data, 1)
    assert network_path(out, 1).read_bytes() == trained(0)[1]
    assert network_path(stamp, 1).read_bytes() == sample_networks()[1]


def test_snapshot_of_another_size_is_refused(tmp_path: Path) -> None:
    from trainer.errors import BadData

    link = FileTrainerLink(write_export(tmp_path / "20250101120000"), output_dir=tmp_path / "out")
    link.receive_config()
    with pytest.raises(BadData):
        link.send_network(0, b"short", 1)


def test_keepalive_rejects_non_positive_interval() -> None:
    with pytest.raises(ValueError):
        KeepAlive(FileTrainerLink.__new__(FileTrainerLink), 0)
