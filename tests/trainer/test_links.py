"""Trainer links driven against a minimal in-test game side (spec §2.4, §3, §5.5, §7.1, §10 items 7-9).

The game side is built from the engine halves in :mod:`protocol` (``GameControls``, the game-side stream
encoders and decoder), runs on a daemon thread, and every wait on both sides is bounded, so a broken
link fails a test within seconds instead of hanging it.
"""

from __future__ import annotations

import functools
import json
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from protocol.config import (
    ReplayBufferGuids,
    SessionConfig,
    SharedMemoryConfig,
    session_from_shared_memory,
    shared_memory_config_to_json,
)
from protocol.controls import CONTROL_BLOCK_BYTES, Control, GameControls, read_controls
from protocol.guid import os_shm_name
from protocol.replay import ReplayBuffer, ReplayLayout
from protocol.stream import (
    NEED_DATA,
    Complete,
    GameStreamDecoder,
    NetworkToGame,
    Ping,
    Signal,
    encode_config,
    encode_network_to_trainer,
    encode_stop,
)
from tests.protocol.test_config import MODEL, TRAINER
from tests.trainer.test_transport_files import sample_networks, sample_replay, small_data, write_export
from trainer.errors import Interrupted, PeerGone, WaitTimeout
from trainer.links import FileTrainerLink, KeepAlive, ShmTrainerLink, SocketTrainerLink
from trainer.timeouts import Timeouts
from trainer.transport.files import network_path
from trainer.transport.shm import SharedRegion, region_exists
from trainer.transport.tcp import TcpConnection, connect_with_retry
from trainer.transport.wait import StopRequested

posix_ipc = pytest.importorskip("posix_ipc")

PLATFORM = "linux" if sys.platform.startswith("linux") else sys.platform
FAST = Timeouts(
    config=5,
    network=5,
    experience=5,
    send=5,
    connect=5,
    close=5,
    ping_interval=0.02,
    poll_interval=0.0005,
    peer_check_interval=0.05,
)
GAME_TIMEOUT = 5.0
JOIN_TIMEOUT = 10.0
ROUNDS = 2
NETWORK_IDS = (0, 1, 2)


def trained(round_index: int) -> dict[int, bytes]:
    """Distinct snapshot bytes per round (same sizes as received)."""
    return sample_networks(seed=100 + round_index)


def config() -> SessionConfig:
    return session_from_shared_memory(TRAINER, {**small_data(), **MODEL})


def new_guid() -> str:
    return "{" + str(uuid.uuid4()).upper() + "}"


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


def run_trainer_session(
    link: Any, *, expect_version_echo: bool = False
) -> tuple[SessionConfig, dict[int, bytes], ReplayBuffer]:
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


@dataclass
class ShmGame:
    """The engine's side of a shared-memory session: regions, config files, GameControls."""

    config_dir: Path
    controls_guid: str
    create_controls: bool
    regions: list[SharedRegion] = field(default_factory=list)
    controls_region: SharedRegion | None = None
    networks: dict[int, SharedRegion] = field(default_factory=dict)
    replay: dict[str, SharedRegion] = field(default_factory=dict)
    received: list[dict[int, bytes]] = field(default_factory=list)

    def setup(self) -> None:
        cfg = config()
        if self.create_controls:
            self.controls_region = SharedRegion.create(
                os_shm_name(self.controls_guid, PLATFORM), CONTROL_BLOCK_BYTES
            )
        else:  # attach mode: the trainer created the block; the engine maps it
            self.controls_region = SharedRegion.open(
                os_shm_name(self.controls_guid, PLATFORM), CONTROL_BLOCK_BYTES
            )
        network_guids = []
        for net in cfg.model.networks:
            guid = new_guid()
            network_guids.append((net.id, guid))
            self.networks[net.id] = self._create(guid, net.max_byte_num)
        layout = ReplayLayout.from_config(cfg.replay_buffer(0))
        names: dict[str, str] = {}
        for spec in layout.regions():
            guid = new_guid()
            names[spec.name] = guid
            self.replay[spec.name] = self._create(guid, spec.nbytes)
        guids = ReplayBufferGuids(
            episode_starts_guid=names["EpisodeStarts"],
            episode_lengths_guid=names["EpisodeLengths"],
            episode_completion_modes_guid="{00000000-0000-0000-0000-000000000000}",
            observations_guids=(names["Observations[0]"],),
            actions_guids=(names["Actions[0]"],),
        )
        shm_json = shared_memory_config_to_json(SharedMemoryConfig(tuple(network_guids), (guids,)))
        self.config_dir.mkdir(parents=True, exist_ok=True)
        (self.config_dir / f"shared-memory-{self.controls_guid}.json").write_text(json.dumps(shm_json))
        (self.config_dir / "data-config.json").write_text(json.dumps({**small_data(), **MODEL}))
        (self.config_dir / "trainer-config.json").write_text(json.dumps(TRAINER))

    def _create(self, guid: str, size: int) -> SharedRegion:
        region = SharedRegion.create(os_shm_name(guid, PLATFORM), size, label=f"engine region {guid}")
        self.regions.append(region)
        return region

    def controls(self) -> GameControls:
        assert self.controls_region is not None
        game = GameControls(self.controls_region.buf)
        game.init()
        return game

    def serve_start(self, game: GameControls) -> None:
        """Config, the three initial networks on request, then the experience (§7.1 steps 3-5)."""
        game.post_config()
        for nid, blob in sample_networks().items():
            poll(game.network_requested, f"request for network {nid}")
            self.networks[nid].buf[:] = blob
            game.post_network(nid)
        rb = sample_replay()
        for name, arr in (
            ("EpisodeStarts", rb.episode_starts),
            ("EpisodeLengths", rb.episode_lengths),
            ("Observations[0]", rb.observations[0]),
            ("Actions[0]", rb.actions[0]),
        ):
            raw = arr.tobytes()
            self.replay[name].buf[: len(raw)] = raw
        poll(game.can_post_experience, "ExperienceSignal 0")
        game.post_experience(rb.episode_num, rb.step_num, 0)

    def serve_rounds_then_complete(self, game: GameControls) -> None:
        for _ in range(ROUNDS):
            poll(game.has_network_or_completed, "network 0 or Complete")
            got = {}
            for nid in NETWORK_IDS:
                poll(functools.partial(game.network_ready, nid), f"network {nid}")
                got[nid] = bytes(self.networks[nid].buf)
                game.release_network()
            self.received.append(got)
        poll(game.has_network_or_completed, "Complete")
        assert game.take_completed()

    def close(self) -> None:
        for region in self.regions:
            region.close()
        if self.create_controls and self.controls_region is not None:
            self.controls_region.close()


@pytest.fixture
def shm_game(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ShmGame]:
    game = ShmGame(
        tmp_path / "Task0" / "Configs", new_guid(), create_controls=getattr(request, "param", True)
    )
    yield game
    game.close()
    # Whatever a failing test left behind.
    names = [os_shm_name(game.controls_guid, PLATFORM)] + [r.name for r in game.regions]
    for name in names:
        try:
            posix_ipc.unlink_shared_memory(name)
        except posix_ipc.ExistentialError:
            pass


@pytest.mark.parametrize("shm_game", [True, False], ids=["spawned", "attach"], indirect=True)
def test_shm_full_session(shm_game: ShmGame) -> None:
    spawned = shm_game.create_controls
    if spawned:
        shm_game.setup()
    link = ShmTrainerLink(
        shm_game.config_dir.parent,  # the task directory: the link finds Configs/ itself
        shm_game.controls_guid.lower() if not spawned else shm_game.controls_guid,
        create=not spawned,
        timeouts=FAST,
        platform=PLATFORM,
    )
    try:
        if not spawned:
            assert link.guid_string == shm_game.controls_guid  # normalised as the engine prints it
            shm_game.setup()

        def game_script() -> None:
            game = shm_game.controls()
            shm_game.serve_start(game)
            shm_game.serve_rounds_then_complete(game)

        game_thread = GameThread(game_script).start()
        cfg, networks, replay = run_trainer_session(link)
        game_thread.join()
        assert cfg == config()
        assert networks == sample_networks()
        assert_replay_equal(replay, sample_replay())
        assert replay.observations[0].flags.owndata or replay.observations[0].base is not None
        assert shm_game.received == [trained(0), trained(1)]
        assert read_controls(link._control_region.buf)[Control.EXPERIENCE_SIGNAL] == 0
        assert link._staging is None  # the staged memory went to the caller with the buffer
        # The engine may reuse its regions once we acknowledged: what we hold is our own copy.
        for region in shm_game.replay.values():
            region.buf[:] = bytes(len(region.buf))
        assert_replay_equal(replay, sample_replay())
    finally:
        link.close()
    controls_name = os_shm_name(shm_game.controls_guid, PLATFORM)
    # The engine's regions stay; our control block (attach mode) is gone.
    assert all(region_exists(r.name) for r in shm_game.regions)
    assert region_exists(controls_name) is spawned
    # The copied experience survives the link.
    assert_replay_equal(replay, sample_replay())
    link.close()  # idempotent


def test_shm_stop_after_experience_is_seen_and_cleared(shm_game: ShmGame) -> None:
    shm_game.setup()
    with ShmTrainerLink(
        shm_game.config_dir, shm_game.controls_guid, timeouts=FAST, platform=PLATFORM
    ) as link:

        def game_script() -> None:
            game = shm_game.controls()
            shm_game.serve_start(game)
            game.post_stop()

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
    shm_game.setup()
    with ShmTrainerLink(
        shm_game.config_dir, shm_game.controls_guid, timeouts=FAST, platform=PLATFORM
    ) as link:
        game = shm_game.controls()
        game.post_stop()
        with pytest.raises(StopRequested) as info:
            link.receive_config()
        assert "config" in str(info.value)


def test_shm_config_timeout_names_what(shm_game: ShmGame) -> None:
    shm_game.setup()
    quick = Timeouts(config=0.1, poll_interval=0.001, peer_check_interval=0.05)
    with ShmTrainerLink(
        shm_game.config_dir, shm_game.controls_guid, timeouts=quick, platform=PLATFORM
    ) as link:
        shm_game.controls()
        with pytest.raises(WaitTimeout) as info:
            link.receive_config()
        assert "config" in str(info.value)


def test_shm_engine_gone_while_waiting_is_peer_gone(shm_game: ShmGame) -> None:
    shm_game.setup()
    with ShmTrainerLink(
        shm_game.config_dir, shm_game.controls_guid, timeouts=FAST, platform=PLATFORM
    ) as link:
        shm_game.controls()
        assert shm_game.controls_region is not None
        shm_game.controls_region.close()  # the engine unlinks its control block when it ends
        start = time.monotonic()
        with pytest.raises(PeerGone):
            link.receive_config()
        assert time.monotonic() - start < 2.0


def test_shm_ping_and_keepalive_set_the_ping_signal(shm_game: ShmGame) -> None:
    shm_game.setup()
    with ShmTrainerLink(
        shm_game.config_dir, shm_game.controls_guid, timeouts=FAST, platform=PLATFORM
    ) as link:
        game = shm_game.controls()
        with KeepAlive(link, 0.01) as keep:
            poll(game.take_ping, "a ping", timeout=2)
            poll(game.take_ping, "a second ping", timeout=2)
        assert keep.pings >= 2 and keep.error is None


def test_shm_complete_waits_for_the_last_network(shm_game: ShmGame) -> None:
    """Complete is not raised while network 2 is still pending (the engine would skip loading it)."""
    shm_game.setup()
    with ShmTrainerLink(
        shm_game.config_dir, shm_game.controls_guid, timeouts=FAST, platform=PLATFORM
    ) as link:
        game = shm_game.controls()
        start = GameThread(lambda: shm_game.serve_start(game)).start()
        link.receive_config()
        for nid in NETWORK_IDS:
            link.receive_network(nid)
        link.receive_experience()
        start.join()
        taken: list[bool] = []

        def take_round_slowly() -> None:
            for k in NETWORK_IDS:
                poll(functools.partial(game.network_ready, k), f"network {k}")
                if k == 2:
                    time.sleep(0.1)  # the engine is slow to load the last network
                    taken.append(read_controls(link._control_region.buf)[Control.COMPLETE_SIGNAL] == 0)
                game.release_network()

        thread = GameThread(take_round_slowly).start()
        for nid, blob in trained(0).items():
            link.send_network(nid, blob, 1)
        link.send_complete()
        thread.join()
        assert taken == [True]  # Complete was not raised while network 2 was pending
        assert read_controls(link._control_region.buf)[Control.COMPLETE_SIGNAL] == 1


# =========================================================================================================
# Socket


@dataclass
class SocketGame:
    """The engine's side of a socket session: connect, stream config/networks/experience, decode replies."""

    port: int
    conn: TcpConnection | None = None
    received: list[dict[int, bytes]] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    pings: int = 0

    def connect_and_send_start(self) -> None:
        cfg = config()
        self.conn = connect_with_retry("127.0.0.1", self.port, timeout=GAME_TIMEOUT)
        socket_json = {
            **small_data(),
            **MODEL,
            "TrainerSettings": {k: v for k, v in TRAINER.items() if k != "TempDirectory"},
        }
        self.conn.send_parts(encode_config(json.dumps(socket_json).encode()))
        for nid, blob in sample_networks().items():
            self.conn.send_parts(encode_network_to_trainer(nid, blob))
        layout = ReplayLayout.from_config(cfg.replay_buffer(0))
        self.conn.send_parts(
            [bytes([Signal.SEND_EXPERIENCE]), *layout.encode_socket_parts(sample_replay(), -1)]
        )

    def events(self) -> Iterator[object]:
        """Decoded trainer messages until EOF (bounded by GAME_TIMEOUT per read)."""
        assert self.conn is not None
        decoder = GameStreamDecoder({net.id: net.max_byte_num for net in config().model.networks})
        while True:
            event = decoder.next_event()
            if event is NEED_DATA:
                view = decoder.get_buffer()
                try:
                    n = self.conn.recv_into(view, GAME_TIMEOUT)
                except PeerGone:
                    decoder.buffer_updated(0)
                    decoder.eof()
                    return
                decoder.buffer_updated(n)
                continue
            yield event

    def take_rounds_then_complete(self) -> None:
        """Read ROUNDS rounds of networks 0, 1, 2 (skipping pings) and the Complete, then close (§10.7)."""
        current: dict[int, bytes] = {}
        for event in self.events():
            if isinstance(event, Ping):
                self.pings += 1
            elif isinstance(event, NetworkToGame):
                assert event.network_id == len(current), "networks out of order"
                current[event.network_id] = bytes(event.data)
                self.versions.append(event.version)
                if len(current) == len(NETWORK_IDS):
                    self.received.append(current)
                    current = {}
            elif isinstance(event, Complete):
                assert current == {}, "Complete in the middle of a round"
                break
        assert self.conn is not None
        time.sleep(0.05)  # the engine closes on its next tick; the trainer must still be waiting
        self.conn.close()


@pytest.fixture
def socket_link() -> Iterator[SocketTrainerLink]:
    link = SocketTrainerLink("127.0.0.1", 0, FAST)
    yield link
    link.close()


def test_socket_full_session(socket_link: SocketTrainerLink) -> None:
    game = SocketGame(socket_link.port)

    def game_script() -> None:
        game.connect_and_send_start()
        game.take_rounds_then_complete()

    game_thread = GameThread(game_script).start()
    cfg, networks, replay = run_trainer_session(socket_link)
    game_thread.join()
    assert cfg.data == config().data and cfg.model == config().model
    assert cfg.trainer.temp_directory is None
    assert networks == sample_networks()
    assert_replay_equal(replay, sample_replay())
    assert socket_link.networks_version == -1
    assert game.received == [trained(0), trained(1)]
    assert game.versions == [1, 1, 1, 2, 2, 2]


def test_socket_second_engine_cannot_connect(socket_link: SocketTrainerLink) -> None:
    game = SocketGame(socket_link.port)
    game_thread = GameThread(game.connect_and_send_start).start()
    socket_link.receive_config()
    game_thread.join()
    with pytest.raises(OSError):
        intruder = socket.create_connection(("127.0.0.1", game.port), timeout=1)
        intruder.settimeout(1)
        if intruder.recv(1) == b"":
            raise ConnectionResetError
    assert game.conn is not None
    game.conn.close()


def test_socket_stop_is_seen_without_blocking(socket_link: SocketTrainerLink) -> None:
    game = SocketGame(socket_link.port)

    def game_script() -> None:
        game.connect_and_send_start()
        assert game.conn is not None
        time.sleep(0.05)
        game.conn.send_parts([encode_stop()])

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
    assert game.conn is not None
    game.conn.close()


def test_socket_stop_before_networks_raises_stop_requested(socket_link: SocketTrainerLink) -> None:
    def game_script() -> None:
        conn = connect_with_retry("127.0.0.1", socket_link.port, timeout=GAME_TIMEOUT)
        socket_json = {**small_data(), **MODEL, "TrainerSettings": {}}
        conn.send_parts([*encode_config(json.dumps(socket_json).encode()), encode_stop()])
        time.sleep(0.2)
        conn.close()

    game_thread = GameThread(game_script).start()
    socket_link.receive_config()
    with pytest.raises(StopRequested):
        socket_link.receive_network(0)
    assert socket_link.stop_requested() is True
    game_thread.join()


def test_socket_eof_mid_message_is_peer_gone(socket_link: SocketTrainerLink) -> None:
    def game_script() -> None:
        conn = connect_with_retry("127.0.0.1", socket_link.port, timeout=GAME_TIMEOUT)
        socket_json = {**small_data(), **MODEL, "TrainerSettings": {}}
        conn.send_parts(encode_config(json.dumps(socket_json).encode()))
        parts = encode_network_to_trainer(0, sample_networks()[0])
        conn.send_parts([parts[0], bytes(parts[1])[:100]])  # the engine dies mid-snapshot
        conn.close()

    game_thread = GameThread(game_script).start()
    socket_link.receive_config()
    with pytest.raises(PeerGone) as info:
        socket_link.receive_network(0)
    assert "middle of a message" in str(info.value)
    game_thread.join()


def test_socket_eof_during_training_is_peer_gone(socket_link: SocketTrainerLink) -> None:
    game = SocketGame(socket_link.port)

    def game_script() -> None:
        game.connect_and_send_start()
        assert game.conn is not None
        game.conn.close()

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


def test_shm_wait_is_interruptible(shm_game: ShmGame) -> None:
    shm_game.setup()
    flag = threading.Event()
    with ShmTrainerLink(
        shm_game.config_dir, shm_game.controls_guid, timeouts=FAST, platform=PLATFORM, interrupted=flag.is_set
    ) as link:
        shm_game.controls()
        threading.Timer(0.05, flag.set).start()
        with pytest.raises(Interrupted):
            link.receive_config()


def test_socket_accept_timeout() -> None:
    with SocketTrainerLink("127.0.0.1", 0, Timeouts(connect=0.1)) as link, pytest.raises(WaitTimeout):
        link.receive_config()


def test_socket_keepalive_pings_never_split_a_message(socket_link: SocketTrainerLink) -> None:
    game = SocketGame(socket_link.port)

    def game_script() -> None:
        game.connect_and_send_start()
        game.take_rounds_then_complete()

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
    assert game.received == [trained(0), trained(1)]
    # Each ping arrived whole between messages (a split message would have failed the decoder above);
    # pings that found the send lock taken were skipped, so the game may count fewer than were tried.
    assert 0 < game.pings <= keep.pings


def test_socket_finish_is_bounded_when_the_game_never_closes(
    socket_link: SocketTrainerLink, capfd: pytest.CaptureFixture[str]
) -> None:
    game = SocketGame(socket_link.port)
    game_thread = GameThread(game.connect_and_send_start).start()
    socket_link.receive_config()
    game_thread.join()
    socket_link.send_complete()
    start = time.monotonic()
    socket_link.finish(0.1)
    assert time.monotonic() - start < 1.0
    assert "did not close the connection" in capfd.readouterr().err
    assert game.conn is not None
    game.conn.close()


# =========================================================================================================
# Files


def test_file_link_session(tmp_path: Path) -> None:
    stamp = write_export(tmp_path / "TrainingMaterials" / "20250101120000")
    link = FileTrainerLink(tmp_path / "TrainingMaterials")
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
    assert {nid: network_path(stamp, nid).read_bytes() for nid in NETWORK_IDS} == trained(0)


def test_file_link_output_dir(tmp_path: Path) -> None:
    stamp = write_export(tmp_path / "20250101120000")
    out = tmp_path / "out"
    link = FileTrainerLink(stamp, output_dir=out)
    link.receive_config()
    link.send_network(1, trained(0)[1], 1)
    assert network_path(out, 1).read_bytes() == trained(0)[1]
    assert network_path(stamp, 1).read_bytes() == sample_networks()[1]


def test_snapshot_of_another_size_is_refused(tmp_path: Path) -> None:
    from trainer.errors import BadData

    link = FileTrainerLink(write_export(tmp_path / "20250101120000"))
    link.receive_config()
    with pytest.raises(BadData):
        link.send_network(0, b"short", 1)


def test_keepalive_rejects_non_positive_interval() -> None:
    with pytest.raises(ValueError):
        KeepAlive(FileTrainerLink.__new__(FileTrainerLink), 0)
