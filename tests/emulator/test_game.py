"""The game-side emulator: drivers, launch helpers and the session harness, against trainer stubs.

The stubs are built directly on ``protocol.controls.TrainerControls`` and ``protocol.stream`` (threads for
driver tests, a small stub *process* for session tests), so these tests pin the engine's rules (spec §2.4,
§3, §5.5, §7.1, §10 items 6-9) without torch or the real trainer. The real trainer runs against the same
emulator in ``tests/integration``.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

from emulator.game import (
    COMPLETED,
    EngineFailure,
    Failure,
    FileExport,
    ReceivedNetwork,
    ShmGame,
    SocketGame,
    engine_load_snapshot,
)
from emulator.launch import (
    DEFAULT_TRAINER_MODULE,
    LOG_PREFIX,
    EngineLayout,
    TrainerProcess,
    attach_command,
    make_task_dir,
    shared_memory_command,
    socket_command,
)
from emulator.session import (
    EngineTask,
    Mode,
    SessionSettings,
    build_session_config,
    free_tcp_port,
    run_engine_session,
)
from protocol.argv import parse_launch_argv
from protocol.config import (
    SessionConfig,
    engine_json_bytes,
    parse_json,
    parse_shared_memory_config,
    session_from_files,
    session_from_shared_memory,
    session_from_socket,
)
from protocol.controls import CONTROL_BLOCK_BYTES, INITIAL_CONTROLS, Control, TrainerControls, read_controls
from protocol.guid import GuidFormat, format_guid, new_guid, os_shm_name, parse_guid, platform_guid_string
from protocol.replay import ReplayBuffer, ReplayLayout
from protocol.snapshot import HEADER, SNAPSHOT_MAGIC, SNAPSHOT_VERSION
from protocol.stream import (
    NEED_DATA,
    ConfigMessage,
    ExperienceMessage,
    NetworkToTrainer,
    Stop,
    TrainerStreamDecoder,
    encode_complete,
    encode_network_to_game,
    encode_ping,
)
from trainer.session.transport.shm import SharedRegion, region_exists

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX shared memory and poll()")

REPO = Path(__file__).resolve().parents[2]
Configured = tuple[SessionConfig, tuple[bytes, bytes, bytes]]
Pair = tuple[SocketGame, "SocketTrainerStub"]
SMALL = SessionSettings(hidden_layer_size=8, engine_timeout_s=2.0)


# ---------------------------------------------------------------------------------------------------------
# Fixtures and stub helpers


@pytest.fixture(scope="module")
def task() -> EngineTask:
    return EngineTask.benchmark("bimodal", size=24, seed=3)


@pytest.fixture(scope="module")
def configured(task: EngineTask, tmp_path_factory: pytest.TempPathFactory) -> Configured:
    temp = tmp_path_factory.mktemp("intermediate")
    return build_session_config(task, SMALL, str(temp))


def spin(predicate: Callable[[], object], timeout: float = 5.0) -> None:
    """Poll until ``predicate()`` is truthy; the stubs' bounded wait."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("stub wait timed out")
        time.sleep(0.0005)


class Background:
    """Run ``fn`` in a thread; ``join()`` re-raises its exception in the test."""

    def __init__(self, fn: Callable[[], object]) -> None:
        self.error: BaseException | None = None
        self.result: object = None

        def body() -> None:
            try:
                self.result = fn()
            except BaseException as exc:
                self.error = exc

        self.thread = threading.Thread(target=body, daemon=True)
        self.thread.start()

    def join(self, timeout: float = 10.0) -> object:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "background stub did not finish"
        if self.error is not None:
            raise self.error
        return self.result


class ShmTrainerStub:
    """The trainer's half over shared memory, on TrainerControls (spec §2.4)."""

    def __init__(self, controls_name: str, config_dir: Path) -> None:
        self.controls_region = SharedRegion.open(controls_name, CONTROL_BLOCK_BYTES)
        self.controls = TrainerControls(self.controls_region.buf, network_num=3)
        self.config_dir = config_dir
        self.regions: dict[int, SharedRegion] = {}
        self.received: list[bytes] = []
        self.experience: ReplayBuffer | None = None

    def handshake(self, guid: str) -> None:
        spin(self.controls.config_ready)
        shm = parse_shared_memory_config(
            parse_json((self.config_dir / f"shared-memory-{guid}.json").read_bytes(), "shm")
        )
        session = session_from_shared_memory(
            parse_json((self.config_dir / "trainer-config.json").read_bytes(), "t"),
            parse_json((self.config_dir / "data-config.json").read_bytes(), "d"),
        )
        self.controls.ack_config()
        for net in session.model.networks:
            name = os_shm_name(shm.network_guid(net.id), sys.platform)
            self.regions[net.id] = SharedRegion.open(name, net.max_byte_num)
        for network_id in (0, 1, 2):
            self.controls.request_network(network_id)
            spin(lambda: self.controls.network_received(network_id))  # noqa: B023 - called at once
            self.received.append(bytes(self.regions[network_id].buf))
        spin(lambda: self.controls.experience_ready() is not None)
        info = self.controls.experience_ready()
        assert info is not None
        layout = ReplayLayout.from_config(session.replay_buffer(0))
        guids = shm.replay_buffers[0].by_region_name()
        views = {
            spec.name: SharedRegion.open(os_shm_name(guids[spec.name], sys.platform), spec.nbytes)
            for spec in layout.regions()
        }
        rb = layout.read_regions({k: v.buf for k, v in views.items()}, info.episode_num, info.step_num, 0)
        self.experience = ReplayBuffer(
            0,
            rb.episode_starts.copy(),
            rb.episode_lengths.copy(),
            tuple(a.copy() for a in rb.observations),
            tuple(a.copy() for a in rb.actions),
        )
        del rb
        for region in views.values():
            region.close()
        self.controls.ack_experience()

    def post(self, network_id: int, data: bytes) -> None:
        spin(self.controls.can_send_network)
        self.regions[network_id].buf[:] = data
        self.controls.post_network(network_id)

    def close(self) -> None:
        for region in self.regions.values():
            region.close()
        self.controls_region.close()


def trained(data: bytes, salt: int = 1) -> bytes:
    """Same header and size, different weights (the last float's bytes changed)."""
    out = bytearray(data)
    out[-1] ^= salt
    return bytes(out)


@pytest.fixture
def shm_game(configured: Configured, tmp_path: Path) -> Iterator[ShmGame]:
    game = ShmGame.create(tmp_path / "Configs", timeout=2.0)
    yield game
    game.close()


def full_shm_setup(game: ShmGame, configured: Configured) -> ShmTrainerStub:
    """BeginTraining against a stub: configs, networks, experience; returns the stub after its handshake."""
    config, snapshots = configured
    task_rb = _task_rb(config)
    game.begin(config)
    stub = ShmTrainerStub(game.controls_region.name, game.config_dir)
    background = Background(lambda: stub.handshake(game.controls_guid))
    for network_id, data in enumerate(snapshots):
        game.send_network(network_id, data)
    game.send_experience(task_rb)
    background.join()
    return stub


_RB_CACHE: dict[int, ReplayBuffer] = {}


def _task_rb(config: SessionConfig) -> ReplayBuffer:
    rb_cfg = config.replay_buffer(0)
    key = rb_cfg.max_step_num
    if key not in _RB_CACHE:
        _RB_CACHE[key] = EngineTask.benchmark("bimodal", size=key, seed=3).replay_buffer
    return _RB_CACHE[key]


# ---------------------------------------------------------------------------------------------------------
# Shared memory


def test_shm_create_names_controls_by_a_braced_upper_guid_and_initialises_them(shm_game: ShmGame) -> None:
    guid = shm_game.controls_guid
    assert len(guid) == 38 and guid.startswith("{") and guid == guid.upper()
    assert parse_guid(guid).braced_upper() == guid
    assert shm_game.controls_region.name == "/" + guid
    assert read_controls(shm_game.controls_region.buf) == INITIAL_CONTROLS


def test_shm_session_with_stub_round_trips_configs_networks_experience_and_rounds(
    shm_game: ShmGame,
    configured: Configured,
) -> None:
    config, snapshots = configured
    stub = full_shm_setup(shm_game, configured)
    try:
        # Configs as the engine writes them (§2.4): model keys merged into data-config, TempDirectory added.
        data_obj = json.loads((shm_game.config_dir / "data-config.json").read_bytes())
        assert {"ReplayBuffers", "Schemas", "Networks", "FlowMatchingSettings"} <= set(data_obj)
        trainer_obj = json.loads((shm_game.config_dir / "trainer-config.json").read_bytes())
        assert trainer_obj["TempDirectory"] == config.trainer.temp_directory
        shm_obj = json.loads(
            (shm_game.config_dir / f"shared-memory-{shm_game.controls_guid}.json").read_bytes()
        )
        assert [e["NetworkId"] for e in shm_obj["NetworkGuids"]] == [0, 1, 2]
        assert shm_obj["ReplayBuffers"][0]["EpisodeFinalObservationsGuids"] == []
        assert (
            shm_obj["ReplayBuffers"][0]["EpisodeCompletionModesGuid"]
            == "{00000000-0000-0000-0000-000000000000}"
        )
        assert stub.received == list(snapshots)
        assert stub.experience is not None
        rb = _task_rb(config)
        np.testing.assert_array_equal(stub.experience.observations[0], rb.observations[0])
        np.testing.assert_array_equal(stub.experience.actions[0], rb.actions[0])
        assert shm_game.control(Control.CONFIG_SIGNAL) == 0
        assert shm_game.control(Control.REPLAY_BUFFER_ID) == 0

        assert not shm_game.has_network_or_completed()

        def trainer() -> None:
            for i, d in enumerate(snapshots):
                stub.post(i, trained(d))

        back = Background(trainer)
        spin(shm_game.has_network_or_completed)
        result = shm_game.receive_round()
        back.join()
        assert isinstance(result, tuple) and [n.network_id for n in result] == [0, 1, 2]
        for net, sent in zip(result, snapshots, strict=True):
            assert net.data == trained(sent) and net.raw_header == sent[:24] and net.version is None
        assert read_controls(shm_game.controls_region.buf)[4] == 0
        assert read_controls(shm_game.controls_region.buf)[8] == -1

        stub.controls.post_complete()
        assert shm_game.has_network_or_completed()
        assert shm_game.receive_round() is COMPLETED
        assert shm_game.control(Control.COMPLETE_SIGNAL) == 0
    finally:
        stub.close()
    names = shm_game.region_names
    assert len(names) == 1 + 3 + 4  # controls, 3 networks, starts/lengths/observations/actions
    shm_game.close()
    assert not any(region_exists(name) for name in names)


def test_shm_send_network_times_out_without_a_request(configured: Configured, tmp_path: Path) -> None:
    config, snapshots = configured
    game = ShmGame.create(tmp_path / "Configs", timeout=0.05)
    try:
        game.begin(config)
        start = time.monotonic()
        with pytest.raises(EngineFailure) as info:
            game.send_network(0, snapshots[0])
        assert info.value.failure is Failure.TIMEOUT
        assert time.monotonic() - start >= 0.05
    finally:
        game.close()


def test_shm_pings_reset_the_engine_clock(configured: Configured, tmp_path: Path) -> None:
    """Invariant: a wait survives any delay as long as pings come more often than the timeout (§2.4)."""
    config, snapshots = configured
    game = ShmGame.create(tmp_path / "Configs", timeout=0.08)
    try:
        game.begin(config)
        stub = TrainerControls(SharedRegion.open(game.controls_region.name, CONTROL_BLOCK_BYTES).buf)

        def trainer() -> None:
            spin(stub.config_ready)
            stub.ack_config()
            end = time.monotonic() + 0.4  # five timeouts long
            while time.monotonic() < end:
                stub.ping()
                time.sleep(0.02)
            stub.request_network(0)

        back = Background(trainer)
        game.send_network(0, snapshots[0])
        back.join()
        assert any("ping taken" in what for _, what in game.events)
    finally:
        game.close()


def test_shm_waits_fail_once_the_process_exited_but_complete_is_checked_first(
    configured: Configured,
    tmp_path: Path,
) -> None:
    config, snapshots = configured
    game = ShmGame.create(tmp_path / "Configs", timeout=2.0, process_alive=lambda: False)
    try:
        game.begin(config)
        with pytest.raises(EngineFailure) as info:
            game.send_network(0, snapshots[0])
        assert info.value.failure is Failure.PROCESS_EXITED
        # §10 item 7: shared memory takes a pending Complete even after the process exited.
        game.controls_region.buf[4 * Control.COMPLETE_SIGNAL : 4 * Control.COMPLETE_SIGNAL + 4] = (
            1
        ).to_bytes(4, "little")
        assert game.has_network_or_completed()
        assert game.receive_network(0) is COMPLETED
    finally:
        game.close()


def _set(game: ShmGame, control: Control, value: int) -> None:
    game.controls_region.buf[4 * control : 4 * control + 4] = value.to_bytes(4, "little", signed=True)


def test_shm_receive_refuses_a_network_id_mismatch(configured: Configured, tmp_path: Path) -> None:
    config, _ = configured
    game = ShmGame.create(tmp_path / "Configs", timeout=1.0)
    try:
        game.begin(config)
        _set(game, Control.NETWORK_ID, 1)
        _set(game, Control.NETWORK_SIGNAL, 1)
        with pytest.raises(EngineFailure) as info:
            game.receive_network(0)
        assert info.value.failure is Failure.UNEXPECTED and "NETWORK_ID" in str(info.value)
    finally:
        game.close()


def test_shm_bad_snapshot_fails_and_still_releases_the_network(
    configured: Configured, tmp_path: Path
) -> None:
    config, snapshots = configured
    game = ShmGame.create(tmp_path / "Configs", timeout=1.0)
    try:
        game.begin(config)
        bad = bytearray(snapshots[0])
        bad[0] ^= 0xFF  # magic
        game.network_regions[0].buf[:] = bad
        _set(game, Control.NETWORK_ID, 0)
        _set(game, Control.NETWORK_SIGNAL, 1)
        with pytest.raises(EngineFailure) as info:
            game.receive_network(0)
        assert info.value.failure is Failure.BAD_SNAPSHOT and "magic" in str(info.value)
        controls = read_controls(game.controls_region.buf)
        assert controls[Control.NETWORK_SIGNAL] == 0 and controls[Control.NETWORK_ID] == -1
    finally:
        game.close()


def test_shm_complete_in_place_of_network_1_is_an_error(shm_game: ShmGame, configured: Configured) -> None:
    stub = full_shm_setup(shm_game, configured)
    try:
        _, snapshots = configured

        def trainer() -> None:
            stub.post(0, snapshots[0])
            spin(stub.controls.can_send_network)
            # Bypass the stub's own order checks: write CompleteSignal as a broken trainer would.
            stub.controls_region.buf[4 * Control.COMPLETE_SIGNAL : 4 * Control.COMPLETE_SIGNAL + 4] = (
                1
            ).to_bytes(4, "little")

        back = Background(trainer)
        spin(shm_game.has_network_or_completed)
        with pytest.raises(EngineFailure) as info:
            shm_game.receive_round()
        back.join()
        assert info.value.failure is Failure.UNEXPECTED and "network 1" in str(info.value)
    finally:
        stub.close()


def test_shm_send_experience_waits_only_for_the_signal_to_be_clear(
    configured: Configured, tmp_path: Path
) -> None:
    """§10 item 9: the engine returns right after raising ExperienceSignal; a second send waits for 0."""
    config, _ = configured
    game = ShmGame.create(tmp_path / "Configs", timeout=0.05)
    try:
        game.begin(config)
        rb = _task_rb(config)
        game.send_experience(rb)  # nobody consumes it: returns anyway
        controls = read_controls(game.controls_region.buf)
        assert controls[:3] == (rb.episode_num, rb.step_num, 1) and controls[9] == 0
        with pytest.raises(EngineFailure) as info:
            game.send_experience(rb)
        assert info.value.failure is Failure.TIMEOUT
    finally:
        game.close()


@pytest.mark.parametrize(
    "fmt", [GuidFormat.DIGITS_WITH_HYPHENS_LOWER, GuidFormat.DIGITS, GuidFormat.DIGITS_WITH_HYPHENS_IN_BRACES]
)
def test_attach_maps_the_trainer_block_by_its_platform_name_and_initialises_it(
    fmt: GuidFormat, tmp_path: Path
) -> None:
    guid = new_guid(os.urandom(16))
    name = os_shm_name(platform_guid_string(guid, sys.platform), sys.platform)
    trainer_block = SharedRegion.create(name, CONTROL_BLOCK_BYTES)
    try:
        trainer_block.buf[:] = b"\x07" * CONTROL_BLOCK_BYTES
        game = ShmGame.attach(format_guid(guid, fmt), tmp_path / "Configs", timeout=1.0)
        assert game.controls_guid == guid.braced_upper()
        assert read_controls(trainer_block.buf) == INITIAL_CONTROLS
        assert game.region_names == ()  # the engine created nothing yet, and not the controls block
        game.close()
        assert region_exists(name)  # the creator (the trainer) unlinks, not the engine
    finally:
        trainer_block.close()


def test_attach_to_a_missing_block_or_a_garbled_guid_fails_setup(tmp_path: Path) -> None:
    with pytest.raises(EngineFailure) as missing:
        ShmGame.attach(new_guid(os.urandom(16)).braced_upper(), tmp_path)
    assert missing.value.failure is Failure.SETUP
    with pytest.raises(EngineFailure) as garbled:
        ShmGame.attach("{not-a-guid}", tmp_path)
    assert garbled.value.failure is Failure.SETUP


# ---------------------------------------------------------------------------------------------------------
# Socket (driver on one end of a socket pair, the trainer stub on the other)


class SocketTrainerStub:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.decoder = TrainerStreamDecoder()
        sock.settimeout(5.0)

    def next_event(self) -> object:
        while True:
            event = self.decoder.next_event()
            if event is not NEED_DATA:
                return event
            data = self.sock.recv(65536)
            if not data:
                self.decoder.eof()
                return None
            self.decoder.feed(data)

    def handshake(self) -> tuple[SessionConfig, list[NetworkToTrainer], ExperienceMessage]:
        message = self.next_event()
        assert isinstance(message, ConfigMessage)
        session = session_from_socket(parse_json(message.raw_json, "socket config"))
        self.decoder.configure(
            {n.id: n.max_byte_num for n in session.model.networks},
            {0: ReplayLayout.from_config(session.replay_buffer(0))},
        )
        networks = [self.next_event() for _ in range(3)]
        assert all(isinstance(n, NetworkToTrainer) for n in networks)
        experience = self.next_event()
        assert isinstance(experience, ExperienceMessage)
        return session, networks, experience  # type: ignore[return-value]  # narrowed by the assert above

    def send(self, *parts: bytes | memoryview | list[bytes | memoryview]) -> None:
        for part in parts:
            for piece in part if isinstance(part, list) else [part]:
                self.sock.sendall(piece)


@pytest.fixture
def socket_pair(configured: Configured) -> Iterator[tuple[SocketGame, SocketTrainerStub]]:
    a, b = socket.socketpair()
    game = SocketGame(a, timeout=1.0, process_alive=None)
    stub = SocketTrainerStub(b)
    yield game, stub
    game.close()
    b.close()


def begin_socket(game: SocketGame, stub: SocketTrainerStub, configured: Configured) -> None:
    config, snapshots = configured
    back = Background(stub.handshake)
    game.begin(config)
    for network_id, data in enumerate(snapshots):
        game.send_network(network_id, data)
    game.send_experience(_task_rb(config))
    result = back.join()
    assert isinstance(result, tuple)
    session, networks, experience = result
    assert [n.network_id for n in networks] == [0, 1, 2]
    assert [bytes(n.data) for n in networks] == list(snapshots)
    assert experience.networks_version == -1  # §3: starts at −1
    np.testing.assert_array_equal(experience.replay.actions[0], _task_rb(config).actions[0])
    assert session.trainer.temp_directory is None  # no TempDirectory over the socket (§3)


def test_socket_config_is_one_object_with_trainer_settings_and_no_temp_directory(
    socket_pair: Pair, configured: Configured
) -> None:
    game, stub = socket_pair
    config, _ = configured
    back = Background(stub.next_event)
    game.begin(config)
    message = back.join()
    assert isinstance(message, ConfigMessage)
    obj = json.loads(message.raw_json)
    assert set(obj) == {"ReplayBuffers", "Schemas", "Networks", "FlowMatchingSettings", "TrainerSettings"}
    assert "TempDirectory" not in obj["TrainerSettings"]
    assert obj["TrainerSettings"]["TrainerMethod"] == "FlowMatching"


def test_socket_session_rounds_versions_and_complete(socket_pair: Pair, configured: Configured) -> None:
    game, stub = socket_pair
    _, snapshots = configured
    begin_socket(game, stub, configured)
    assert not game.has_network_or_completed()
    for version in (7, 8):
        stub.send(*[encode_network_to_game(i, version, trained(d, version)) for i, d in enumerate(snapshots)])
        spin(game.has_network_or_completed)
        result = game.receive_round()
        assert isinstance(result, tuple)
        assert [(n.network_id, n.version, n.data) for n in result] == [
            (i, version, trained(d, version)) for i, d in enumerate(snapshots)
        ]
        assert game.networks_version == version
    stub.send(encode_complete())
    spin(game.has_network_or_completed)
    assert game.receive_round() is COMPLETED
    game.done()
    assert stub.sock.recv(1) == b""  # the engine closed; it sends no Stop after Completed (§10 item 7)


def test_socket_tick_peek_consumes_at_most_one_leading_ping(
    socket_pair: Pair, configured: Configured
) -> None:
    """§10 item 8: each HasNetworkOrCompleted takes one ping, so three pings delay the network three ticks."""
    game, stub = socket_pair
    _, snapshots = configured
    begin_socket(game, stub, configured)
    stub.send(
        encode_ping(),
        encode_ping(),
        encode_ping(),
        *[encode_network_to_game(i, 1, d) for i, d in enumerate(snapshots)],
    )
    time.sleep(0.05)
    answers = [game.has_network_or_completed() for _ in range(4)]
    assert answers == [False, False, False, True]
    assert game.pings_taken == 3
    assert isinstance(game.receive_round(), tuple)


def test_socket_pings_inside_a_receive_reset_the_clock(socket_pair: Pair, configured: Configured) -> None:
    game, stub = socket_pair
    _, snapshots = configured
    begin_socket(game, stub, configured)
    game.timeout = 0.08

    def trainer() -> None:
        stub.send(encode_network_to_game(0, 1, snapshots[0]))
        end = time.monotonic() + 0.4
        while time.monotonic() < end:
            stub.send(encode_ping())
            time.sleep(0.02)
        stub.send(*[encode_network_to_game(i, 1, snapshots[i]) for i in (1, 2)])

    back = Background(trainer)
    spin(game.has_network_or_completed)
    assert isinstance(game.receive_round(), tuple)
    back.join()


def test_socket_receive_times_out_between_networks(socket_pair: Pair, configured: Configured) -> None:
    game, stub = socket_pair
    _, snapshots = configured
    begin_socket(game, stub, configured)
    game.timeout = 0.05
    stub.send(encode_network_to_game(0, 1, snapshots[0]))
    spin(game.has_network_or_completed)
    with pytest.raises(EngineFailure) as info:
        game.receive_round()
    assert info.value.failure is Failure.TIMEOUT and "network 1" in str(info.value)


def test_socket_after_process_exit_a_pending_complete_is_ignored_and_reads_fail(
    socket_pair: Pair, configured: Configured
) -> None:
    """§10 item 7: liveness is checked before the peek and before every read, even with bytes buffered."""
    game, stub = socket_pair
    begin_socket(game, stub, configured)
    stub.send(encode_complete())
    time.sleep(0.02)
    alive = [True]
    game.process_alive = lambda: alive[0]
    assert game.has_network_or_completed()
    alive[0] = False
    assert not game.has_network_or_completed()
    with pytest.raises(EngineFailure) as info:
        game.receive_network(0)
    assert info.value.failure is Failure.PROCESS_EXITED


@pytest.mark.parametrize(
    ("payload", "failure", "words"),
    [
        (lambda snaps: encode_network_to_game(1, 1, snaps[1]), Failure.UNEXPECTED, "network 1"),
        (lambda snaps: [bytes((4,))], Failure.UNEXPECTED, "signal 4"),
        (lambda snaps: [bytes((0,))], Failure.UNEXPECTED, "Invalid"),
        (lambda snaps: [bytes((99,))], Failure.UNEXPECTED, "unknown signal"),
    ],
)
def test_socket_protocol_violations_end_training(
    socket_pair: Pair,
    configured: Configured,
    payload: Callable[[tuple[bytes, ...]], list[bytes | memoryview]],
    failure: Failure,
    words: str,
) -> None:
    game, stub = socket_pair
    _, snapshots = configured
    begin_socket(game, stub, configured)
    stub.send(payload(snapshots))
    spin(game.has_network_or_completed)
    with pytest.raises(EngineFailure) as info:
        game.receive_network(0)
    assert info.value.failure is failure and words in str(info.value)


def test_socket_bad_snapshot_magic_and_eof(socket_pair: Pair, configured: Configured) -> None:
    game, stub = socket_pair
    _, snapshots = configured
    begin_socket(game, stub, configured)
    bad = bytearray(snapshots[0])
    bad[4] = 9  # version
    stub.send(encode_network_to_game(0, 1, bytes(bad)))
    spin(game.has_network_or_completed)
    with pytest.raises(EngineFailure) as info:
        game.receive_network(0)
    assert info.value.failure is Failure.BAD_SNAPSHOT and "version" in str(info.value)
    stub.send(encode_network_to_game(1, 1, snapshots[1])[0])  # header only, then the trainer goes away
    stub.sock.close()
    with pytest.raises(EngineFailure) as eof:
        game.receive_network(1)
    assert eof.value.failure is Failure.DISCONNECTED


def test_socket_peer_hang_up_is_seen_behind_unread_bytes(socket_pair: Pair) -> None:
    game, stub = socket_pair
    assert not game.peer_hung_up()
    stub.send(encode_ping())
    time.sleep(0.02)
    assert not game.peer_hung_up()  # data alone is not a hang-up
    stub.sock.shutdown(socket.SHUT_WR)
    time.sleep(0.02)
    assert game.peer_hung_up()
    game.done()
    assert not game.peer_hung_up()  # after the engine's own close there is nothing left to watch


def test_socket_stop_is_the_single_byte_6(socket_pair: Pair, configured: Configured) -> None:
    game, stub = socket_pair
    begin_socket(game, stub, configured)
    game.stop()
    assert isinstance(stub.next_event(), Stop)


def test_socket_connect_retries_until_the_trainer_listens() -> None:
    port = free_tcp_port()
    server = socket.socket()

    def listen_later() -> socket.socket:
        time.sleep(0.1)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", port))
        server.listen(1)
        conn, _ = server.accept()
        return conn

    back = Background(listen_later)
    game = SocketGame.connect("127.0.0.1", port, timeout=3.0)
    conn = back.join()
    assert isinstance(conn, socket.socket)
    game.close()
    conn.close()
    server.close()
    with pytest.raises(EngineFailure) as info:
        SocketGame.connect("127.0.0.1", free_tcp_port(), timeout=0.05)
    assert info.value.failure is Failure.SETUP


# ---------------------------------------------------------------------------------------------------------
# Files, snapshot loading, JSON


def test_file_export_layout_matches_spec_5_5(configured: Configured, tmp_path: Path) -> None:
    config, snapshots = configured
    rb = _task_rb(config)
    folder = FileExport(tmp_path).write(
        config, dict(enumerate(snapshots)), rb, now=datetime(2026, 1, 2, 3, 4, 5)
    )
    assert folder == tmp_path / "TrainingMaterials" / "20260102030405"
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    assert files == [
        "Networks/model-config.json",
        "Networks/network_0.bin",
        "Networks/network_1.bin",
        "Networks/network_2.bin",
        "ReplayBuffers/data-config.json",
        "ReplayBuffers/replaybuffer_0.bin",
        "trainer-config.json",
    ]
    data_obj = json.loads((folder / "ReplayBuffers/data-config.json").read_bytes())
    assert set(data_obj) == {"ReplayBuffers", "Schemas"}  # model keys not merged (§5.5)
    trainer_obj = json.loads((folder / "trainer-config.json").read_bytes())
    assert trainer_obj["TempDirectory"] == config.trainer.temp_directory
    parsed = session_from_files(
        trainer_obj, data_obj, json.loads((folder / "Networks/model-config.json").read_bytes())
    )
    assert parsed.model == config.model
    back = ReplayLayout.from_config(config.replay_buffer(0)).decode_file(
        (folder / "ReplayBuffers/replaybuffer_0.bin").read_bytes()
    )
    np.testing.assert_array_equal(back.observations[0], rb.observations[0])
    assert [n.data for n in FileExport.read_networks(folder, config)] == list(snapshots)
    (folder / "Networks/network_2.bin").write_bytes(snapshots[2][:-1])
    with pytest.raises(EngineFailure) as info:
        FileExport.read_networks(folder, config)
    assert info.value.failure is Failure.BAD_SNAPSHOT


def _snapshot(
    input_size: int = 3, output_size: int = 2, hash_: int = -5, blob: bytes = b"\x01" * 64
) -> bytes:
    return HEADER.pack(SNAPSHOT_MAGIC, SNAPSHOT_VERSION, input_size, output_size, hash_, len(blob)) + blob


@pytest.mark.parametrize(
    ("data", "size", "words"),
    [
        (_snapshot(), 87, "88 bytes but its snapshot size (MaxByteNum) is 87"),
        (_snapshot(blob=b""), 24, "not more than the 24-byte header"),
        (b"\0" * 4 + _snapshot()[4:], 88, "magic"),
        (_snapshot()[:4] + (2).to_bytes(4, "little") + _snapshot()[8:], 88, "version"),
        (_snapshot()[:20] + (63).to_bytes(4, "little") + _snapshot()[24:], 88, "FileDataSize 63"),
    ],
)
def test_engine_load_snapshot_checks_what_the_engine_checks(data: bytes, size: int, words: str) -> None:
    with pytest.raises(EngineFailure) as info:
        engine_load_snapshot(data, size, 0)
    assert info.value.failure is Failure.BAD_SNAPSHOT and words in str(info.value)


def test_engine_load_snapshot_adopts_sizes_and_hash() -> None:
    header = engine_load_snapshot(_snapshot(7, 4, -123), 88, 2)
    assert (header.input_size, header.output_size, header.compatibility_hash, header.file_data_size) == (
        7,
        4,
        -123,
        64,
    )


def test_engine_json_is_ascii_or_utf16_with_bom() -> None:
    assert engine_json_bytes({"a": 1}) == b'{\n\t"a": 1\n}'
    raw = engine_json_bytes({"TempDirectory": "C:/Projekt/Überall"})
    assert raw.startswith(b"\xff\xfe")
    assert parse_json(raw, "trainer-config.json") == {"TempDirectory": "C:/Projekt/Überall"}


def test_received_network_raw_header_is_the_first_24_bytes() -> None:
    data = _snapshot()
    net = ReceivedNetwork(0, data, engine_load_snapshot(data, len(data), 0), None, 0.0)
    assert net.raw_header == data[:24]


# ---------------------------------------------------------------------------------------------------------
# Launch


def test_make_task_dir_takes_the_smallest_free_id(tmp_path: Path) -> None:
    (tmp_path / "Training0" / "Configs").mkdir(parents=True)
    (tmp_path / "Training2" / "Configs").mkdir(parents=True)
    (tmp_path / "Training1").mkdir()  # a task dir without Configs is free (§1.2 tests Configs)
    assert make_task_dir(tmp_path) == tmp_path / "Training1"
    assert (tmp_path / "Training1" / "Configs").is_dir()
    assert make_task_dir(tmp_path) == tmp_path / "Training3"
    assert make_task_dir(tmp_path, "Run") == tmp_path / "Run0"


def test_engine_argv_order_and_silent_log_placeholder(tmp_path: Path) -> None:
    layout = EngineLayout.create(tmp_path)
    task_dir = make_task_dir(layout.intermediate_dir)
    guid = new_guid(bytes(range(16))).braced_upper()
    argv = shared_memory_command(layout, "Training", task_dir, guid, log=True)
    assert argv[0] == sys.executable and argv[1].endswith("trainer/dropin/train.py")  # the packaged drop-in
    assert argv[2:] == [
        "Training",
        "-p",
        str(layout.custom_trainer_path),
        "-m",
        DEFAULT_TRAINER_MODULE,
        "-l",
        "--nne-cpu-path",
        str(layout.nne_cpu_path),
        "SharedMemory",
        str(task_dir),
        "-g",
        guid,
    ]
    assert all(Path(p).is_absolute() for p in (argv[4], argv[9], argv[11]))
    silent = socket_command(layout, "Training", "127.0.0.1", 48491, log=False)
    assert silent[2:] == [
        "Training",
        "-p",
        str(layout.custom_trainer_path),
        "-m",
        DEFAULT_TRAINER_MODULE,
        "",
        "--nne-cpu-path",
        str(layout.nne_cpu_path),
        "Socket",
        "127.0.0.1:48491",
        str(layout.intermediate_dir),
    ]
    parsed = parse_launch_argv(silent[2:])
    assert not parsed.log
    attach = attach_command("Training", task_dir, guid)
    assert attach[2:] == ["Training", "-l", "SharedMemory", str(task_dir), "-g", guid, "-c", "-d"]


def test_trainer_process_echoes_prefixed_lines_and_reports_the_exit_code(tmp_path: Path) -> None:
    code = (
        "import sys; print('out one', flush=True); print('err two', file=sys.stderr, flush=True); sys.exit(3)"
    )
    with TrainerProcess([sys.executable, "-c", code], cwd=tmp_path) as proc:
        assert proc.wait(10.0) == 3
        assert set(proc.log) == {f"{LOG_PREFIX}out one", f"{LOG_PREFIX}err two"}
        assert not proc.alive() and proc.exited_at is not None


def test_trainer_process_kill_is_bounded(tmp_path: Path) -> None:
    proc = TrainerProcess([sys.executable, "-c", "import time; time.sleep(60)"], cwd=tmp_path)
    assert proc.wait(0.05) is None and proc.alive()
    start = time.monotonic()
    assert proc.kill(grace=2.0) is not None
    assert time.monotonic() - start < 5.0
    proc.close()


# ---------------------------------------------------------------------------------------------------------
# The session harness, against a stub trainer *process* (no torch, but a process per test: marked slow).
# The stub follows the train.py grammar.

STUB_TRAINER = r"""
import os, socket, sys, time
sys.path.insert(0, os.environ["STUB_REPO"])
from pathlib import Path
from protocol.argv import SharedMemoryArgs, parse_launch_argv
from protocol.config import parse_json, parse_shared_memory_config, session_from_shared_memory, session_from_socket
from protocol.controls import CONTROL_BLOCK_BYTES, TrainerControls
from protocol.guid import os_shm_name, parse_guid, platform_guid_string
from protocol.replay import ReplayLayout
from protocol.stream import (NEED_DATA, ConfigMessage, Stop, TrainerStreamDecoder, encode_complete,
                             encode_network_to_game, encode_ping)
from trainer.session.transport.shm import SharedRegion

behaviour = os.environ.get("STUB_BEHAVIOUR", "normal")
rounds = int(os.environ.get("STUB_ROUNDS", "2"))
args = parse_launch_argv(sys.argv[1:])
print("stub trainer", behaviour, flush=True)
if behaviour == "crash":
    sys.exit(3)

def spin(pred, timeout=10.0):
    end = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > end:
            print("stub timed out", flush=True); sys.exit(4)
        time.sleep(0.0005)

if isinstance(args.mode, SharedMemoryArgs):
    mode = args.mode
    name = os_shm_name(platform_guid_string(parse_guid(mode.controls_guid), sys.platform), sys.platform)
    if mode.make_task_dir:
        (Path(mode.task_dir) / "Configs").mkdir(parents=True, exist_ok=True)
    block = (SharedRegion.create if mode.create_mem else SharedRegion.open)(name, CONTROL_BLOCK_BYTES)
    ctl = TrainerControls(block.buf, network_num=3)
    if behaviour == "silent":
        time.sleep(30); sys.exit(0)
    if behaviour == "ping_forever":
        while True:
            ctl.ping(); time.sleep(0.01)
    spin(ctl.config_ready)
    cfg = Path(mode.task_dir) / "Configs"
    guid = platform_guid_string(parse_guid(mode.controls_guid), sys.platform)
    shm = parse_shared_memory_config(parse_json((cfg / f"shared-memory-{guid}.json").read_bytes(), "shm"))
    session = session_from_shared_memory(parse_json((cfg / "trainer-config.json").read_bytes(), "t"),
                                         parse_json((cfg / "data-config.json").read_bytes(), "d"))
    ctl.ack_config()
    regions = {n.id: SharedRegion.open(os_shm_name(shm.network_guid(n.id), sys.platform), n.max_byte_num)
               for n in session.model.networks}
    nets = {}
    for i in (0, 1, 2):
        ctl.request_network(i)
        spin(lambda: ctl.network_received(i))
        nets[i] = bytes(regions[i].buf)
    spin(lambda: ctl.experience_ready() is not None)
    ctl.ack_experience()
    for r in range(rounds):
        for i in (0, 1, 2):
            spin(lambda: ctl.can_send_network() or ctl.stop_requested())
            if ctl.stop_requested():
                ctl.clear_stop(); print("stopped", flush=True); sys.exit(0)
            regions[i].buf[:] = nets[i]
            ctl.post_network(i)
        ctl.ping()
        time.sleep(0.01)
    spin(ctl.can_send_network)
    if behaviour == "leak":
        import posix_ipc
        posix_ipc.SharedMemory(os.environ["STUB_LEAK_NAME"], posix_ipc.O_CREX, size=4096).close_fd()
    if behaviour == "unlink_engine_region":
        import posix_ipc
        posix_ipc.unlink_shared_memory(os_shm_name(shm.network_guid(0), sys.platform))
    ctl.post_complete()
    print("complete", flush=True)
    block.close()
    sys.exit(0)

mode = args.mode
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind((mode.host, mode.port)); server.listen(1); server.settimeout(10)
conn, _ = server.accept(); conn.settimeout(10)
dec = TrainerStreamDecoder()
def event():
    while True:
        ev = dec.next_event()
        if ev is not NEED_DATA:
            return ev
        data = conn.recv(1 << 16)
        if not data:
            return None
        dec.feed(data)
msg = event()
session = session_from_socket(parse_json(msg.raw_json, "socket"))
dec.configure({n.id: n.max_byte_num for n in session.model.networks},
              {0: ReplayLayout.from_config(session.replay_buffer(0))})
nets = {}
for _ in range(3):
    ev = event(); nets[ev.network_id] = bytes(ev.data)
event()  # experience
if behaviour == "close_early":
    conn.close()
    time.sleep(30)
    sys.exit(0)
for r in range(rounds):
    conn.setblocking(False)
    try:
        data = conn.recv(1 << 16)
        if data:
            dec.feed(data)
            if isinstance(dec.next_event(), Stop):
                print("stopped", flush=True); sys.exit(0)
    except BlockingIOError:
        pass
    conn.setblocking(True); conn.settimeout(10)
    for i in (0, 1, 2):
        for part in encode_network_to_game(i, r, nets[i]):
            conn.sendall(part)
    conn.sendall(encode_ping())
    time.sleep(0.01)
conn.sendall(encode_complete())
print("complete", flush=True)
if behaviour == "exit_after_complete":
    os._exit(0)
try:
    while conn.recv(1 << 16):
        pass
except OSError:
    pass
sys.exit(0)
"""


@pytest.fixture(scope="module")
def stub_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("stub") / "train.py"
    path.write_text(STUB_TRAINER)
    return path


def stub_settings(stub_script: Path, behaviour: str = "normal", **kw: object) -> SessionSettings:
    env = {"STUB_REPO": str(REPO), "STUB_BEHAVIOUR": behaviour, "STUB_ROUNDS": str(kw.pop("rounds", 2))}
    return SessionSettings(
        hidden_layer_size=8,
        script=stub_script,
        env=env,
        session_timeout_s=20.0,
        exit_timeout_s=10.0,
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.slow
@pytest.mark.parametrize("mode", [Mode.SHM, Mode.ATTACH, Mode.SOCKET])
def test_session_with_stub_trainer_completes(mode: Mode, stub_script: Path, tmp_path: Path) -> None:
    task = EngineTask.benchmark("bimodal", size=16)
    record = run_engine_session(mode, task, tmp_path, stub_settings(stub_script, regions_until_exit=True))
    record.check()
    assert record.completed and record.exit_code == 0
    assert record.network_send_order == [0, 1, 2]
    assert len(record.rounds) == 2
    for rnd in record.rounds:
        assert [n.data for n in rnd.networks] == list(record.sent)
    assert any(line == f"{LOG_PREFIX}complete" for line in record.log)
    assert record.leaked_shm == ()
    if mode is Mode.SOCKET:
        assert record.exited_before_close is False
        assert [n.version for n in record.rounds[-1].networks] == [1, 1, 1]
    else:
        assert record.config_signal_after_first_request == 0
        assert record.experience_signal_at_first_round == 0
        assert record.regions_present_at_exit and all(record.regions_present_at_exit.values())
    if mode is Mode.ATTACH:
        assert record.trainer_controls_left is False


@pytest.mark.slow
@pytest.mark.parametrize("mode", [Mode.SHM, Mode.SOCKET])
def test_session_with_stub_trainer_stops(mode: Mode, stub_script: Path, tmp_path: Path) -> None:
    task = EngineTask.benchmark("bimodal", size=16)
    record = run_engine_session(
        mode, task, tmp_path, stub_settings(stub_script, rounds=100_000, stop_after_rounds=2)
    )
    record.check()
    assert record.stop_sent and not record.completed and record.exit_code == 0
    assert len(record.rounds) == 2


@pytest.mark.slow
def test_session_fails_a_socket_trainer_that_exits_right_after_complete(
    stub_script: Path, tmp_path: Path
) -> None:
    task = EngineTask.benchmark("bimodal", size=16)
    record = run_engine_session(
        Mode.SOCKET, task, tmp_path, stub_settings(stub_script, "exit_after_complete")
    )
    assert record.failure is not None and "§10 item 7" in record.failure


@pytest.mark.slow
def test_session_fails_when_the_trainer_never_requests_networks(stub_script: Path, tmp_path: Path) -> None:
    task = EngineTask.benchmark("bimodal", size=16)
    record = run_engine_session(
        Mode.SHM, task, tmp_path, stub_settings(stub_script, "silent", engine_timeout_s=0.3)
    )
    assert (
        record.failure is not None and "timeout" in record.failure and "request network 0" in record.failure
    )
    assert record.exit_code is None  # it was killed, not waited for


@pytest.mark.slow
def test_session_fails_when_the_trainer_crashes(stub_script: Path, tmp_path: Path) -> None:
    task = EngineTask.benchmark("bimodal", size=16)
    record = run_engine_session(Mode.SHM, task, tmp_path, stub_settings(stub_script, "crash"))
    assert record.failure is not None and "process exited" in record.failure


@pytest.mark.slow
def test_session_reports_a_region_the_trainer_leaked(stub_script: Path, tmp_path: Path) -> None:
    posix_ipc = pytest.importorskip("posix_ipc")
    name = f"/la-emulator-test-leak-{os.getpid()}"
    settings = stub_settings(stub_script, "leak")
    settings = replace(settings, env={**settings.env, "STUB_LEAK_NAME": name})
    try:
        record = run_engine_session(Mode.SHM, EngineTask.benchmark("bimodal", size=16), tmp_path, settings)
        record.check()
        assert record.leaked_shm == (name.lstrip("/"),)
    finally:
        with contextlib.suppress(posix_ipc.ExistentialError):
            posix_ipc.unlink_shared_memory(name)


@pytest.mark.slow
def test_session_reports_an_engine_region_the_trainer_unlinked(stub_script: Path, tmp_path: Path) -> None:
    settings = stub_settings(stub_script, "unlink_engine_region", regions_until_exit=True)
    record = run_engine_session(Mode.SHM, EngineTask.benchmark("bimodal", size=16), tmp_path, settings)
    record.check()
    assert record.regions_present_at_exit is not None
    gone = [name for name, present in record.regions_present_at_exit.items() if not present]
    assert len(gone) == 1 and len(record.regions_present_at_exit) == 3 + 4


@pytest.mark.slow
def test_session_fails_fast_when_the_socket_trainer_hangs_up(stub_script: Path, tmp_path: Path) -> None:
    record = run_engine_session(
        Mode.SOCKET,
        EngineTask.benchmark("bimodal", size=16),
        tmp_path,
        stub_settings(stub_script, "close_early"),
    )
    assert record.failure is not None and "closed the connection without sending Complete" in record.failure
    assert record.elapsed_s < 15.0


@pytest.mark.slow
def test_session_watchdog_kills_a_trainer_that_pings_forever(stub_script: Path, tmp_path: Path) -> None:
    """Pings keep an engine wait alive indefinitely (faithful); the harness watchdog still ends the session."""
    settings = stub_settings(stub_script, "ping_forever", hard_timeout_s=2.0)
    start = time.monotonic()
    record = run_engine_session(Mode.SHM, EngineTask.benchmark("bimodal", size=16), tmp_path, settings)
    assert record.failure is not None and record.failure.startswith("watchdog")
    assert time.monotonic() - start < 15.0
