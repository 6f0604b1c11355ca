"""The trainer's half of a session over each transport (spec §2, §3, §5.5, §7, §10 items 7-9).

One :class:`TrainerLink` protocol, three implementations. The training loop only ever sees the
protocol, so it reads the same whether the engine talks through shared memory, a socket or an export
folder. Each link is a short loop around the pure codecs of :mod:`protocol`: the controls table
(:mod:`protocol.controls`), the stream decoder (:mod:`protocol.stream`) and the replay layout
(:mod:`protocol.replay`).

Session order, as the engine drives it (§7.1): config → networks 0, 1, 2 → experience (once) → any
number of rounds "send 0, 1, 2" → Complete. Stop (the engine's ``EndTraining``) may arrive at any time:
:meth:`TrainerLink.stop_requested` turns True and stays True, and a blocking call that sees it raises
:class:`~trainer.transport.wait.StopRequested` (exit code 0).

Every blocking call is bounded by a :class:`~trainer.timeouts.Timeouts` field and watches the engine:
shared memory by the controls region and (spawned mode) the parent process, sockets by EOF.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Protocol, TypeVar

from protocol.config import (
    SessionConfig,
    SharedMemoryConfig,
    check_shared_memory_config,
    parse_json,
    parse_shared_memory_config,
    session_from_shared_memory,
    session_from_socket,
)
from protocol.controls import CONTROL_BLOCK_BYTES, Control, TrainerControls, init_controls, read_controls
from protocol.errors import ControlError, GuidError, ProtocolError, StreamError
from protocol.guid import os_shm_name, parse_guid, platform_guid_string
from protocol.replay import ReplayBuffer, ReplayLayout
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
from trainer.errors import BadData, Interrupted, LaunchError, PeerGone, TrainerError, WaitTimeout
from trainer.timeouts import Timeouts
from trainer.transport.files import (
    TrainingMaterials,
    find_training_materials,
    read_training_materials,
    write_network_files,
)
from trainer.transport.shm import SharedRegion, region_exists
from trainer.transport.staging import ReplayStaging
from trainer.transport.tcp import TcpConnection, TcpServer
from trainer.transport.wait import StopRequested, wait_until

__all__ = [
    "FileTrainerLink",
    "KeepAlive",
    "ShmTrainerLink",
    "SocketTrainerLink",
    "TrainerLink",
    "parent_watch",
]

T = TypeVar("T")

CONFIG_FILE_LIMIT = 256 * 1024 * 1024
"""Largest config JSON file read from the config folder (bytes); real ones are kilobytes."""

_SOCKET_POLL_SLICE = 0.05
"""Seconds per readiness wait on the socket, so peer checks run between them."""
_BODY_BURST_SECONDS = 0.05
"""Longest run of back-to-back receives into a message body before the link looks at events again."""


class TrainerLink(Protocol):
    """What the training loop needs from a transport. Calls follow the session order above."""

    def receive_config(self) -> SessionConfig:
        """Block until the engine's config arrives; parse it."""
        ...

    def receive_network(self, network_id: int) -> bytes:
        """The initial snapshot of ``network_id`` (exactly its MaxByteNum bytes)."""
        ...

    def receive_experience(self) -> ReplayBuffer:
        """The replay buffer, its arrays copied into process memory (they outlive the transport)."""
        ...

    def send_network(self, network_id: int, data: bytes, version: int) -> None:
        """Hand one trained snapshot to the engine (same size as received). Rounds go 0, 1, 2."""
        ...

    def send_complete(self) -> None:
        """Training is finished; replaces the next round's network 0 (spec §7.1)."""
        ...

    def stop_requested(self) -> bool:
        """Non-blocking: True once the engine asked to stop (and from then on)."""
        ...

    def ping(self) -> None:
        """Keep-alive for an engine that waits on us; thread-safe and cheap."""
        ...

    def finish(self, timeout: float) -> None:
        """After Complete: let the engine wind down before we exit (bounded by ``timeout`` seconds)."""
        ...

    def close(self) -> None:
        """Release everything; unlink only what we created. Idempotent."""
        ...


# ---------------------------------------------------------------------------------------------------------
# Helpers shared by the links


def parent_watch() -> Callable[[], bool]:
    """A liveness check for a spawning engine: False once our parent process has changed.

    When the engine that spawned us dies, we are re-parented (to init or a subreaper), so the parent id
    changes. Comparing with the id at start (rather than testing for 1) also works under subreapers.
    """
    initial = os.getppid()
    return lambda: os.getppid() == initial


def _read_config_file(path: Path) -> bytes:
    try:
        size = path.stat().st_size
        if size > CONFIG_FILE_LIMIT:
            raise BadData(f"{path} is {size} bytes; config files are at most {CONFIG_FILE_LIMIT} bytes")
        return path.read_bytes()
    except FileNotFoundError:
        raise LaunchError(
            f"the config file {path} does not exist although the game raised ConfigSignal. Check that the "
            "trainer reads the folder the game writes to (-LearningAgentsConfigPath in attach mode, "
            "<task dir>/Configs when the game spawns the trainer)."
        ) from None
    except OSError as error:
        # A directory, a permission problem or an I/O error: name the file, never a traceback.
        raise LaunchError(f"the config file {path} cannot be read: {error.strerror or error}.") from None


def _check_snapshot_size(network_id: int, data: bytes | bytearray | memoryview, expected: int) -> None:
    # The engine reads exactly MaxByteNum bytes and rejects other sizes (spec §8, §10 item 6).
    size = memoryview(data).nbytes
    if size != expected:
        raise BadData(
            f"network {network_id} snapshot is {size} bytes but the engine expects exactly {expected} "
            "(its MaxByteNum); a snapshot must keep the size it was received with."
        )


# ---------------------------------------------------------------------------------------------------------
# Shared memory (spec §2)


class ShmTrainerLink:
    """Shared-memory link: the control block, the network regions and the replay-buffer regions.

    Spawned mode (``create=False``): the engine created the control block; it also watches our parent
    process. Attach mode (``create=True``, launched with ``-c``): we create the control block under the
    user's GUID and initialise it (the engine does the same when it maps it, spec §2.5); the engine's
    liveness cannot be observed before it writes, so only timeouts and the stop flag apply.

    Args:
        config_dir: the folder the engine writes the config JSONs to, or the task directory above its
            ``Configs`` folder.
        controls_guid: the ``-g`` GUID string (attach mode: any FGuid::Parse format; it is normalised).
        create: attach mode (``-c``): create the control block instead of opening the engine's.
        timeouts: every wait's bound; defaults to :class:`Timeouts` ().
        platform: ``sys.platform`` value naming the regions (tests only).
        watch_parent: treat a change of our parent process as the engine's death (default: spawned mode).
        interrupted: polled during waits; True (SIGINT/SIGTERM seen by the app) raises ``Interrupted``.
    """

    comm_type = "SharedMemory"
    """Names TensorBoard/MLflow runs (spec §7.2: ``<TaskName>_<TrainerMethod>_<CommType>_<TimeStamp>``)."""

    def __init__(
        self,
        config_dir: str | os.PathLike[str],
        controls_guid: str,
        *,
        create: bool = False,
        timeouts: Timeouts | None = None,
        platform: str | None = None,
        watch_parent: bool | None = None,
        interrupted: Callable[[], bool] | None = None,
    ) -> None:
        self._timeouts = timeouts or Timeouts()
        self._interrupted = interrupted
        self._platform = platform or sys.platform
        self._config_path = Path(config_dir)
        try:
            guid = parse_guid(controls_guid)
            # Attach mode: the engine names the block with its own platform string of the parsed GUID,
            # so normalise what the user typed. Spawned mode: use the engine's string byte for byte
            # (names are case-sensitive; no conversion can get it wrong).
            self._guid_string = platform_guid_string(guid, self._platform) if create else controls_guid
            self._controls_name = os_shm_name(self._guid_string, self._platform)
        except GuidError as error:
            raise LaunchError(f"the controls GUID {controls_guid!r} cannot be used: {error}") from None
        self._regions: list[SharedRegion] = []
        self._network_regions: dict[int, SharedRegion] = {}
        self._replay_views: dict[int, dict[str, memoryview]] = {}
        self._layouts: dict[int, ReplayLayout] = {}
        # Destination of the next shared-memory replay buffer, pre-faulted while we wait (staging.py).
        self._staging: ReplayStaging | None = None
        self._config: SessionConfig | None = None
        self._stopped = False
        self._closed = False
        if create:
            self._control_region = SharedRegion.create(
                self._controls_name, CONTROL_BLOCK_BYTES, label="control block"
            )
            init_controls(self._control_region.buf)
        else:
            self._control_region = SharedRegion.open(
                self._controls_name, CONTROL_BLOCK_BYTES, label=f"control block {self._guid_string}"
            )
        self._controls = TrainerControls(self._control_region.buf)
        self._parent_alive = (
            parent_watch() if (watch_parent if watch_parent is not None else not create) else None
        )
        self._next_peer_check = time.monotonic() + self._timeouts.peer_check_interval

    @property
    def guid_string(self) -> str:
        """The controls GUID as the engine prints it (attach mode: give this to the game)."""
        return self._guid_string

    @property
    def config_dir(self) -> Path:
        """Where the config files are read from (resolved when read: attach mode may create it late)."""
        return _config_folder(self._config_path)

    # -- waiting ---------------------------------------------------------------------------------------

    def _peer_alive(self) -> bool:
        if self._parent_alive is not None and not self._parent_alive():
            return False
        # The engine unlinks the regions it created when it ends (spec §2.1); ours stays while we run.
        return region_exists(self._controls_name)

    def _wait(
        self, predicate: Callable[[], T | None], timeout: float, what: str, *, interruptible: bool = True
    ) -> T:
        # Sends are not interruptible: a SIGINT/SIGTERM in the middle of a round would leave the engine
        # blocked in ReceiveNetwork for the rest of it (an error there, spec §7.1). The round finishes
        # (each wait is still bounded by its timeout) and the loop stops at the next step boundary.
        return wait_until(
            predicate,
            timeout=timeout,
            what=what,
            poll_interval=self._timeouts.poll_interval,
            peer_alive=self._peer_alive,
            stop=self._stop_seen,
            peer_check_interval=self._timeouts.peer_check_interval,
            interrupted=self._interrupted if interruptible else None,
            on_poll=self._prepare_staging,
        )

    def _prepare_staging(self) -> None:
        # Every wait after the config (networks, experience) spends its idle polls faulting in the
        # replay buffer's destination, so the copy-out runs at memory speed (staging.py).
        if self._staging is not None:
            self._staging.advance()

    def _new_staging(self) -> None:
        # Only for the single buffer flow matching uses (§2.2); with several, which one comes next
        # is unknown and staging them all would fault in memory that may never be used.
        if self._staging is None and len(self._layouts) == 1:
            ((rb_id, layout),) = self._layouts.items()
            self._staging = ReplayStaging(layout, self._replay_views[rb_id])

    # -- the session -----------------------------------------------------------------------------------

    def receive_config(self) -> SessionConfig:
        """Wait for ConfigSignal, read the three files (§2.4), acknowledge, map every region."""
        self._wait(
            self._controls.config_ready,
            self._timeouts.config,
            f"the game's config (ConfigSignal on control block {self._guid_string})",
        )
        folder = self.config_dir
        shm_path = folder / f"shared-memory-{self._guid_string}.json"
        if not shm_path.is_file():
            others = sorted(p.name for p in folder.glob("shared-memory-*.json")) if folder.is_dir() else []
            raise LaunchError(
                f"the game raised ConfigSignal but {shm_path} does not exist"
                + (f" (the folder holds {', '.join(others)})" if others else "")
                + ". Check that the trainer and the game use the same config folder and controls GUID."
            )
        shm_obj = parse_json(_read_config_file(shm_path), shm_path.name)
        data_obj = parse_json(_read_config_file(folder / "data-config.json"), "data-config.json")
        trainer_obj = parse_json(_read_config_file(folder / "trainer-config.json"), "trainer-config.json")
        config = session_from_shared_memory(trainer_obj, data_obj)
        shm_config = parse_shared_memory_config(shm_obj, source=shm_path.name)
        check_shared_memory_config(config, shm_config)
        # Acknowledge before mapping: the engine does not wait for it (§2.4), and the files are read.
        self._controls.ack_config()
        self._map_regions(config, shm_config)
        self._config = config
        return config

    def _map_regions(self, config: SessionConfig, shm: SharedMemoryConfig) -> None:
        for net in config.model.networks:
            guid = shm.network_guid(net.id)
            region = self._open(guid, net.max_byte_num, f"network {net.id} ({net.name}) region {guid}")
            self._network_regions[net.id] = region
        for rb in config.data.replay_buffers:
            layout = ReplayLayout.from_config(rb)
            guids = shm.replay_buffers[rb.id].by_region_name()
            views: dict[str, memoryview] = {}
            for spec in layout.regions():
                guid = guids.get(spec.name, "")
                if not guid:
                    raise LaunchError(
                        f"shared-memory-{self._guid_string}.json names no region for replay buffer {rb.id} "
                        f"{spec.name}, which the data config says exists"
                    )
                region = self._open(guid, spec.nbytes, f"replay buffer {rb.id} {spec.name} region {guid}")
                views[spec.name] = region.buf
            self._layouts[rb.id] = layout
            self._replay_views[rb.id] = views
        self._new_staging()

    def _open(self, guid: str, size: int, label: str) -> SharedRegion:
        try:
            name = os_shm_name(guid, self._platform)
        except GuidError as error:
            raise LaunchError(f"the {label} has an unusable GUID: {error}") from None
        region = SharedRegion.open(name, size, label=label)
        self._regions.append(region)
        return region

    def _require_config(self, what: str) -> SessionConfig:
        if self._config is None:
            raise ControlError(f"{what} needs the config first (call receive_config)", field=what)
        return self._config

    def receive_network(self, network_id: int) -> bytes:
        """Request network ``network_id`` and copy its region once the engine has filled it (§2.4)."""
        config = self._require_config("receive_network")
        region = self._network_regions.get(network_id)
        if region is None:
            raise ControlError(
                f"network {network_id} is not in the config",
                field="network_id",
                expected=sorted(self._network_regions),
                actual=network_id,
            )
        self._controls.request_network(network_id)
        self._wait(
            lambda: self._controls.network_received(network_id),
            self._timeouts.network,
            f"network {network_id} ({config.network(network_id).name}) from the game",
        )
        return bytes(region.buf)

    def receive_experience(self) -> ReplayBuffer:
        """Wait for ExperienceSignal, copy the first E/S rows out of the regions, acknowledge (§2.4)."""
        self._require_config("receive_experience")
        self._new_staging()
        info = self._wait(
            self._controls.experience_ready, self._timeouts.experience, "the replay buffer from the game"
        )
        layout = self._layouts.get(info.replay_buffer_id)
        if layout is None:
            raise ControlError(
                f"ReplayBufferId {info.replay_buffer_id} is not a replay buffer of the config",
                field="REPLAY_BUFFER_ID",
                expected=sorted(self._layouts),
                actual=info.replay_buffer_id,
            )
        views = self._replay_views[info.replay_buffer_id]
        # Ids, counts and region sizes checked before anything is copied (zero-copy views, dropped here).
        layout.read_regions(views, info.episode_num, info.step_num, info.replay_buffer_id)
        staging, self._staging = self._staging, None
        if staging is None or staging.layout.replay_buffer_id != info.replay_buffer_id:
            staging = ReplayStaging(layout, views)  # nothing pre-faulted: the copy faults as it goes
        copied = staging.copy_out(info.episode_num, info.step_num, info.replay_buffer_id)
        self._controls.ack_experience()
        return copied

    def send_network(self, network_id: int, data: bytes, version: int) -> None:
        """Wait until the engine took the previous network, write region ``network_id``, publish it.

        ``version`` has no place in the control block (it is a socket field) and is ignored.
        """
        config = self._require_config("send_network")
        region = self._network_regions.get(network_id)
        if region is None:
            raise ControlError(
                f"network {network_id} is not in the config", field="network_id", actual=network_id
            )
        _check_snapshot_size(network_id, data, config.network(network_id).max_byte_num)
        self._wait(
            self._controls.can_send_network,
            self._timeouts.send,
            f"the game to take the previous network before network {network_id} (NetworkSignal back to 0)",
            interruptible=False,
        )
        region.buf[:] = data
        self._controls.post_network(network_id)

    def send_complete(self) -> None:
        """CompleteSignal = 1, once the engine has taken the last network.

        Waiting first matters: the engine tests CompleteSignal before NetworkSignal, so a Complete raised
        while network 2 is still pending would make it skip loading that network (spec §2.4).
        """
        self._wait(
            self._controls.can_send_network,
            self._timeouts.send,
            "the game to take the last network before Complete (NetworkSignal back to 0)",
            interruptible=False,
        )
        self._controls.post_complete()

    def stop_requested(self) -> bool:
        """True once StopSignal was seen; it is cleared right away (the engine does not wait, §2.4).

        Raises:
            PeerGone: the engine is gone (checked every ``peer_check_interval`` seconds). The training
                loop polls this between steps, so a game that dies while we train (no wait is running)
                is noticed within that interval instead of at the next sync round.
        """
        if self._stop_seen():
            return True
        if self._closed:
            return False
        now = time.monotonic()
        if now >= self._next_peer_check:
            self._next_peer_check = now + self._timeouts.peer_check_interval
            if not self._peer_alive():
                raise PeerGone("the engine went away during training")
        return False

    def _stop_seen(self) -> bool:
        """StopSignal seen (and cleared); waits poll this (they check the peer themselves)."""
        if self._stopped:
            return True
        if self._closed:
            return False
        if self._controls.stop_requested():
            self._controls.clear_stop()
            self._stopped = True
        return self._stopped

    def ping(self) -> None:
        """PingSignal = 1: a waiting engine resets its timeout clock (a single int32 store)."""
        if not self._closed:
            self._controls.ping()

    def finish(self, timeout: float) -> None:
        """Give the engine up to ``timeout`` s to take Complete; shared memory has no exit race (§10.7)."""
        if self._closed:
            return
        try:
            wait_until(
                lambda: read_controls(self._control_region.buf)[Control.COMPLETE_SIGNAL] == 0,
                timeout=timeout,
                what="the game to take Complete",
                poll_interval=max(self._timeouts.poll_interval, 0.001),
                peer_alive=self._peer_alive,
                peer_check_interval=self._timeouts.peer_check_interval,
            )
        except (WaitTimeout, PeerGone):
            pass  # Complete stays in the block; nothing else to do for us.

    def close(self) -> None:
        """Unmap every region; unlink the control block only if we created it. Idempotent."""
        if self._closed:
            return
        self._closed = True
        regions, self._regions = self._regions, []
        self._network_regions.clear()
        self._replay_views.clear()
        self._staging = None
        try:
            for region in regions:
                region.close()
        finally:
            self._control_region.close()

    def __enter__(self) -> ShmTrainerLink:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _config_folder(path: Path) -> Path:
    """Accept the task directory as well as its ``Configs`` folder (the 5.6/5.7 layout, spec §2.5)."""
    if path.name != "Configs" and (path / "Configs").is_dir():
        return path / "Configs"
    return path


# ---------------------------------------------------------------------------------------------------------
# Socket (spec §3)


class SocketTrainerLink:
    """Socket link: we listen, the engine connects once and streams config, networks and experience.

    Binding happens in the constructor, so a port in use fails before any waiting. The connection is
    accepted by :meth:`receive_config`. Messages are decoded as they arrive and kept until asked for:
    the engine sends networks 0, 1, 2 and the experience without being asked, and Stop at any time.

    ``peer_alive`` (e.g. :func:`parent_watch` when the engine spawned us) and ``interrupted`` are polled
    during waits, as in :class:`ShmTrainerLink`.
    """

    comm_type = "Socket"
    """Names TensorBoard/MLflow runs (spec §7.2: ``<TaskName>_<TrainerMethod>_<CommType>_<TimeStamp>``)."""

    def __init__(
        self,
        host: str,
        port: int,
        timeouts: Timeouts | None = None,
        *,
        peer_alive: Callable[[], bool] | None = None,
        interrupted: Callable[[], bool] | None = None,
    ) -> None:
        self._timeouts = timeouts or Timeouts()
        self._interrupted = interrupted
        self._server: TcpServer | None = TcpServer(host, port, send_timeout=self._timeouts.send)
        self._peer_alive_check = peer_alive
        self._conn: TcpConnection | None = None
        self._decoder = TrainerStreamDecoder()
        self._send_lock = threading.Lock()
        self._config_raw: bytes | None = None
        self._config: SessionConfig | None = None
        self._networks: dict[int, bytes] = {}
        self._experiences: deque[ReplayBuffer] = deque()
        self.networks_version: int | None = None
        """NetworksVersion echoed in the last experience message (−1 before any network arrived)."""
        self._stop = False
        self._eof = False
        self._eof_detail = ""
        self._truncated = False
        self._closed = False

    @property
    def port(self) -> int:
        """The port we listen on (useful with port 0)."""
        if self._server is None:
            raise LaunchError("the socket link is no longer listening")
        return self._server.port

    # -- receiving -------------------------------------------------------------------------------------

    def _connection(self) -> TcpConnection:
        if self._conn is None:
            raise PeerGone("the game is not connected")
        return self._conn

    def _receive_once(self, conn: TcpConnection) -> None:
        """One recv straight into the decoder's buffer (zero copy for bodies), then, while a large body is
        arriving, more receives into it back to back (bounded by :data:`_BODY_BURST_SECONDS`, so stop,
        interrupt and peer checks still run); EOF is remembered."""
        decoder = self._decoder
        try:
            view = decoder.get_buffer(-1)
            decoder.buffer_updated(conn.recv_into(view, 0.0))
            # A 1 GiB replay buffer arrives in ~16k receives; going round the event pump for each (two
            # polls, the event drain, the clock) cost half the loopback rate (la-trainer bench).
            deadline = time.monotonic() + _BODY_BURST_SECONDS
            while decoder.body_remaining > 0:
                n = conn.recv_into_nowait(decoder.get_buffer(-1))
                decoder.buffer_updated(n)
                if n == 0 or time.monotonic() >= deadline:
                    break
        except PeerGone as error:
            decoder.buffer_updated(0)
            self._eof = True
            self._eof_detail = str(error)
            try:
                decoder.eof()
            except StreamError as truncated:
                # The engine vanished in the middle of a message: a peer failure, not bad framing.
                self._truncated = True
                self._eof_detail = f"the game closed the connection in the middle of a message ({truncated})"

    def _drain_events(self) -> None:
        if self._truncated:
            return  # the decoder refuses further use after reporting the truncation
        while True:
            event = self._decoder.next_event()
            if event is NEED_DATA:
                return
            if isinstance(event, Stop):
                self._stop = True
            elif isinstance(event, ConfigMessage):
                self._config_raw = event.raw_json
            elif isinstance(event, NetworkToTrainer):
                if event.network_id in self._networks:
                    raise StreamError(
                        f"network {event.network_id} arrived twice before the trainer used it",
                        field="NetworkId",
                        actual=event.network_id,
                    )
                self._networks[event.network_id] = bytes(event.data)
            elif isinstance(event, ExperienceMessage):
                self.networks_version = event.networks_version
                # The decoder allocated this body for this message alone: the arrays already own it.
                self._experiences.append(event.replay)

    def _pump_until(self, ready: Callable[[], T | None], timeout: float, what: str) -> T:
        conn = self._connection()
        start = time.monotonic()
        deadline = start + timeout
        next_peer_check = start + self._timeouts.peer_check_interval
        while True:
            self._drain_events()
            result = ready()
            if result is not None:
                return result
            if self._stop:
                raise StopRequested(f"the game asked the trainer to stop while it was waiting for {what}")
            if self._eof:
                raise PeerGone(f"the engine went away while waiting for {what}: {self._eof_detail}")
            if self._interrupted is not None and self._interrupted():
                raise Interrupted(f"interrupted while waiting for {what}")
            now = time.monotonic()
            if now >= deadline:
                raise WaitTimeout(f"timed out after {timeout:g} s waiting for {what}")
            if self._peer_alive_check is not None and now >= next_peer_check:
                if not self._peer_alive_check():
                    raise PeerGone(f"the engine went away while waiting for {what}")
                next_peer_check = now + self._timeouts.peer_check_interval
            if conn.poll_readable(min(deadline - now, _SOCKET_POLL_SLICE)):
                self._receive_once(conn)

    def receive_config(self) -> SessionConfig:
        """Accept the engine's connection, then decode its SendConfig message (§3)."""
        if self._config is not None:
            return self._config
        if self._conn is None:
            server = self._server
            if server is None:
                raise LaunchError("the socket link is closed")
            self._conn = server.accept(
                self._timeouts.connect, peer_alive=self._peer_alive_check, interrupted=self._interrupted
            )
            self._server = None  # accept() closed the listener: no second client (§3)
        raw = self._pump_until(lambda: self._config_raw, self._timeouts.config, "the game's config message")
        config = session_from_socket(parse_json(raw, "socket config"))
        self._decoder.configure(
            {net.id: net.max_byte_num for net in config.model.networks},
            {rb.id: ReplayLayout.from_config(rb) for rb in config.data.replay_buffers},
        )
        self._config = config
        return config

    def receive_network(self, network_id: int) -> bytes:
        """The engine's SendNetwork for ``network_id`` (it sends 0, 1, 2 unasked after the config)."""
        self._require_config("receive_network")
        data = self._pump_until(
            lambda: self._networks.get(network_id),
            self._timeouts.network,
            f"network {network_id} from the game",
        )
        del self._networks[network_id]
        return data

    def receive_experience(self) -> ReplayBuffer:
        """The engine's SendExperience; its arrays live in a buffer allocated for it alone."""
        self._require_config("receive_experience")
        return self._pump_until(
            lambda: self._experiences.popleft() if self._experiences else None,
            self._timeouts.experience,
            "the replay buffer from the game",
        )

    def _require_config(self, what: str) -> SessionConfig:
        if self._config is None:
            raise StreamError(f"{what} needs the config first (call receive_config)", field=what)
        return self._config

    # -- sending ---------------------------------------------------------------------------------------

    def _send(self, parts: list[bytes | memoryview] | list[bytes]) -> None:
        conn = self._connection()
        # One lock for every writer: the keep-alive thread's ping must never land inside a message.
        with self._send_lock:
            conn.send_parts(parts)

    def send_network(self, network_id: int, data: bytes, version: int) -> None:
        """RecvNetwork: id, version, snapshot; the snapshot goes out as a view, not joined (§3)."""
        config = self._require_config("send_network")
        _check_snapshot_size(network_id, data, config.network(network_id).max_byte_num)
        self._send(encode_network_to_game(network_id, version, data))

    def send_complete(self) -> None:
        """RecvComplete; follow with :meth:`finish` (the engine closes the connection, §10 item 7)."""
        self._send([encode_complete()])

    def ping(self) -> None:
        """RecvPing, unless a message is being sent right now (its bytes keep the engine's clock alive)."""
        conn = self._conn
        if conn is None or self._closed:
            return
        if not self._send_lock.acquire(blocking=False):
            return
        try:
            conn.send_parts([encode_ping()])
        finally:
            self._send_lock.release()

    # -- stop, finish, close ---------------------------------------------------------------------------

    def stop_requested(self) -> bool:
        """Non-blocking: read whatever has arrived; True once SendStop was seen.

        Raises:
            PeerGone: the engine closed the connection without sending Stop (it crashed or quit).
        """
        if self._stop:
            return True
        conn = self._conn
        if conn is None or self._closed:
            return False
        while not self._eof and conn.poll_readable(0.0):
            self._receive_once(conn)
        self._drain_events()
        if self._stop:
            return True
        if self._eof:
            raise PeerGone(f"the engine went away during training: {self._eof_detail}")
        return False

    def finish(self, timeout: float) -> None:
        """Wait (at most ``timeout`` s) for the engine to close the connection after Complete.

        With a spawned trainer the engine stops reading the socket as soon as our process exits, even
        with Complete still buffered, so exiting first can lose the Complete (spec §10 item 7).
        """
        conn = self._conn
        if conn is None or self._closed or self._eof:
            return
        if not conn.wait_closed(timeout):
            print(
                f"la-trainer: warning: the game did not close the connection within {timeout:g} s after "
                "Complete; exiting anyway.",
                file=sys.stderr,
                flush=True,
            )

    def close(self) -> None:
        """Close the connection and the listener. Idempotent."""
        if self._closed:
            return
        self._closed = True
        # Take the send lock so a keep-alive ping is not cut in half, but do not wait long: a ping stuck
        # in a full socket buffer would otherwise hold close() for the whole send timeout.
        locked = self._send_lock.acquire(timeout=1.0)
        try:
            conn, self._conn = self._conn, None
        finally:
            if locked:
                self._send_lock.release()
        server, self._server = self._server, None
        if conn is not None:
            conn.close()
        if server is not None:
            server.close()

    def __enter__(self) -> SocketTrainerLink:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------------------
# Export folder (spec §5.5)


class FileTrainerLink:
    """Offline link over a ``TrainingMaterials`` export: everything is read from files.

    Trained networks are written as ``Networks/network_<id>.bin`` (atomically) into ``output_dir``,
    which defaults to the export folder itself, replacing the exported initial networks: the same
    files the engine would import back. Stop never comes; Complete has nowhere to go.
    """

    comm_type = "Files"
    """Names TensorBoard/MLflow runs (spec §7.2: ``<TaskName>_<TrainerMethod>_<CommType>_<TimeStamp>``)."""

    def __init__(
        self, folder: str | os.PathLike[str], *, output_dir: str | os.PathLike[str] | None = None
    ) -> None:
        self._folder = find_training_materials(folder)
        self._output_dir = Path(output_dir) if output_dir is not None else self._folder
        self._materials: TrainingMaterials | None = None
        self._next_replay = 0

    @property
    def folder(self) -> Path:
        """The export folder in use (the newest stamp when given ``TrainingMaterials``)."""
        return self._folder

    def _loaded(self) -> TrainingMaterials:
        if self._materials is None:
            self._materials = read_training_materials(self._folder)
        return self._materials

    def receive_config(self) -> SessionConfig:
        return self._loaded().config

    def receive_network(self, network_id: int) -> bytes:
        networks = self._loaded().networks
        if network_id not in networks:
            raise LaunchError(f"the export {self._folder} has no network {network_id}")
        return networks[network_id]

    def receive_experience(self) -> ReplayBuffer:
        buffers = self._loaded().replay_buffers
        if self._next_replay >= len(buffers):
            raise LaunchError(f"the export {self._folder} holds no further replay buffer")
        rb = buffers[self._next_replay]
        self._next_replay += 1
        return rb

    def send_network(self, network_id: int, data: bytes, version: int) -> None:
        config = self._loaded().config
        _check_snapshot_size(network_id, data, config.network(network_id).max_byte_num)
        write_network_files(self._output_dir, {network_id: data})

    def send_complete(self) -> None:
        """Nothing to signal offline."""

    def stop_requested(self) -> bool:
        return False

    def ping(self) -> None:
        """Nobody waits on us offline."""

    def finish(self, timeout: float) -> None:
        """Nothing to wait for offline."""

    def close(self) -> None:
        """Nothing is held open (files are read whole and written atomically)."""


# ---------------------------------------------------------------------------------------------------------
# Keep-alive


class _Pingable(Protocol):
    def ping(self) -> None: ...


class KeepAlive:
    """Pings ``link`` every ``interval`` seconds from a daemon thread while the block runs.

    Use it around slow work during which the engine may be waiting on us (spec §2.4: a waiting engine
    times out after 10 s without a ping). The first ping goes out at once. A failing ping stops the
    thread quietly and is kept in :attr:`error`; the next real transfer reports the failure.
    """

    def __init__(self, link: _Pingable, interval: float) -> None:
        if interval <= 0:
            raise ValueError(f"KeepAlive interval must be positive, got {interval}")
        self._link = link
        self._interval = interval
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.pings = 0
        """Pings sent so far (for tests and logs)."""

    def _run(self) -> None:
        while True:
            try:
                self._link.ping()
            except (TrainerError, ProtocolError, OSError) as error:
                self.error = error
                return
            self.pings += 1
            if self._done.wait(self._interval):
                return

    def __enter__(self) -> KeepAlive:
        if self._thread is not None:
            raise RuntimeError("KeepAlive is not re-entrant")
        self._done.clear()
        self._thread = threading.Thread(target=self._run, name="la-trainer-keepalive", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._done.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            # A ping stuck in a full socket buffer is bounded by the send timeout; do not wait that
            # long here: the thread is a daemon and ends with the process.
            thread.join(timeout=1.0)
