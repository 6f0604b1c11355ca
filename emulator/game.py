"""The engine's half of every handshake, over the real transports (spec §2, §3, §5.5, §7.1, §10 items 6-9).

Three drivers play the game side of a flow-matching session against a trainer process:

* :class:`ShmGame`: shared memory. Spawned mode (:meth:`ShmGame.create`) creates the controls block under
  a fresh braced upper-case GUID (§1.2, §2.1); attach mode (:meth:`ShmGame.attach`) maps the block the
  trainer created (§2.5). Either way it zeroes the block with [8] = [9] = −1, creates one region per
  network and per replay-buffer array, each under its own GUID (§2.2), writes the three config files and
  raises ConfigSignal (§2.4).
* :class:`SocketGame`: the engine is the TCP client (§1.3); one JSON config object, networks with signal
  4, experience with signal 2 (NetworksVersion −1 until a network came back), replies decoded with
  :class:`protocol.stream.GameStreamDecoder` (§3).
* :class:`FileExport`: the offline ``TrainingMaterials/<YYYYmmddHHMMSS>/`` folder (§5.5).

The rules are the engine's, not our trainer's, so a test fails where a real game would:

* Every blocking wait polls every 1 ms and gives up after the communicator timeout (default 10 s),
  adding up its 1 ms sleeps; a ping seen while waiting resets the count (§2.4, §3).
* A spawned trainer that has exited makes every wait fail. Shared memory tests NetworkSignal /
  CompleteSignal *before* process liveness; the socket tests liveness first, so after the process exits
  ``HasNetworkOrCompleted`` is false and reads fail even with bytes buffered (§10 item 7): a trainer that
  exits right after Complete loses it.
* Socket ``HasNetworkOrCompleted`` peeks one byte and consumes at most one leading ping per tick
  (§10 item 8).
* Shared-memory ``SendExperience`` waits only for ExperienceSignal == 0 *before* writing (§10 item 9).
* A returned snapshot is loaded as the engine loads it (§10 item 6): the transport insists on the
  network's byte size, the loader on size > 24, magic and version; InputSize, OutputSize and
  CompatibilityHash are adopted and recorded so tests can compare them with what was sent.
* ``ReceiveNetwork(0)`` may answer Completed; Completed in place of network 1 or 2 is an error (§7.1).

Failures raise :class:`EngineFailure` (the engine's non-Success responses); the session driver records
them. Nothing here waits without a bound.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Final, Protocol, TypeAlias, TypeVar, cast

import numpy as np

from protocol.config import (
    ReplayBufferGuids,
    SessionConfig,
    SharedMemoryConfig,
    data_config_to_json,
    model_config_to_json,
    shared_memory_config_to_json,
    socket_config_to_json,
    trainer_config_to_json,
)
from protocol.controls import CONTROL_BLOCK_BYTES, Control, GameControls, read_controls
from protocol.errors import ControlError, GuidError, ProtocolError, SnapshotError
from protocol.guid import Guid, new_guid, os_shm_name, parse_guid, platform_guid_string
from protocol.replay import ReplayBuffer, ReplayLayout
from protocol.snapshot import HEADER_BYTES, SnapshotHeader, read_snapshot_header
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
from trainer.errors import LaunchError
from trainer.transport.shm import SharedRegion

__all__ = [
    "COMPLETED",
    "DEFAULT_ENGINE_TIMEOUT_S",
    "ENGINE_POLL_S",
    "Completed",
    "EngineFailure",
    "ExportFlags",
    "Failure",
    "FileExport",
    "GameDriver",
    "ReceivedNetwork",
    "RoundResult",
    "ShmGame",
    "SocketGame",
    "engine_json_bytes",
    "engine_load_snapshot",
]

DEFAULT_ENGINE_TIMEOUT_S: Final = 10.0
"""The communicator Timeout default, seconds (shared memory and socket settings, §1.6)."""
ENGINE_POLL_S: Final = 0.001
"""The engine's sleep between polls in every wait loop, seconds (§2.4, §3)."""

_ZERO_GUID: Final = Guid(0, 0, 0, 0)
"""[INF] The default GUID of a region view that was never allocated (§10 item 10: "presumably zeros")."""

T = TypeVar("T")
ProcessAlive: TypeAlias = Callable[[], bool]
"""The engine's ``IsRunning`` check on the spawned trainer; None in attach mode (no process handle)."""


# ---------------------------------------------------------------------------------------------------------
# Results and failures


class Failure(Enum):
    """Why an engine call did not succeed (the engine's non-Success ``ETrainerResponse`` values, and the
    emulator's finer split of its generic error)."""

    TIMEOUT = "timeout"
    """A wait ran past the communicator timeout without a ping."""
    PROCESS_EXITED = "process exited"
    """The spawned trainer process is no longer running."""
    DISCONNECTED = "disconnected"
    """Socket: the trainer closed or reset the connection."""
    UNEXPECTED = "unexpected"
    """The trainer broke the protocol: wrong NetworkId, bad signal byte, Complete mid-round, ..."""
    BAD_SNAPSHOT = "bad snapshot"
    """A returned snapshot failed the engine's load checks (size, magic, version)."""
    SETUP = "setup"
    """Mapping, connecting or writing the configs failed."""


class EngineFailure(Exception):
    """An engine call failed; ``str()`` says what the engine was doing and why it gave up."""

    def __init__(self, failure: Failure, message: str) -> None:
        super().__init__(f"engine {failure.value}: {message}")
        self.failure = failure
        self.message = message


@dataclass(frozen=True, slots=True)
class Completed:
    """``ETrainerResponse::Completed``: the trainer finished training."""


COMPLETED: Final = Completed()


@dataclass(frozen=True, slots=True, eq=False)
class ReceivedNetwork:
    """One network the engine loaded from the trainer.

    ``data``: the full snapshot bytes (exactly the network's MaxByteNum). ``header``: what the engine
    adopted from it. ``version``: the socket NetworksVersion that came with it (None for shared memory
    and files). ``received_at``: ``time.monotonic()`` when the load finished.
    """

    network_id: int
    data: bytes
    header: SnapshotHeader
    version: int | None
    received_at: float

    @property
    def raw_header(self) -> bytes:
        """The first 24 bytes exactly as received (magic, version, sizes, hash)."""
        return self.data[:HEADER_BYTES]


RoundResult: TypeAlias = tuple[ReceivedNetwork, ...] | Completed
"""A whole sync round (networks 0..N−1 in id order) or Completed."""


class GameDriver(Protocol):
    """What the session driver needs from every live transport."""

    def send_network(self, network_id: int, data: bytes) -> None: ...
    def send_experience(self, rb: ReplayBuffer) -> None: ...
    def has_network_or_completed(self) -> bool: ...
    def receive_round(self) -> RoundResult: ...
    def stop(self) -> None: ...
    def done(self) -> None: ...
    def close(self) -> None: ...


def engine_load_snapshot(data: bytes, expected_size: int, network_id: int) -> SnapshotHeader:
    """Load a returned snapshot as the engine does (§10 item 6) and return the header it adopts.

    The transport insists on ``expected_size`` (the network's current snapshot size); the loader checks
    size > 24, magic and version, then slices FileData by FileDataSize. [INF] A FileDataSize that does not
    fill the buffer exactly is refused here: the engine would adopt it and then fail on the *next*
    receive, because the snapshot byte size changed; failing now names the culprit.
    """
    where = f"network {network_id}"
    if len(data) != expected_size:
        raise EngineFailure(
            Failure.BAD_SNAPSHOT,
            f"{where} arrived with {len(data)} bytes but its snapshot size (MaxByteNum) is {expected_size}",
        )
    if len(data) <= HEADER_BYTES:
        raise EngineFailure(
            Failure.BAD_SNAPSHOT, f"{where} has {len(data)} bytes, not more than the 24-byte header"
        )
    try:
        header = read_snapshot_header(data)
    except SnapshotError as exc:
        raise EngineFailure(Failure.BAD_SNAPSHOT, f"{where}: {exc}") from None
    if header.snapshot_size != len(data):
        raise EngineFailure(
            Failure.BAD_SNAPSHOT,
            f"{where} header says FileDataSize {header.file_data_size} (snapshot {header.snapshot_size} bytes) "
            f"but the snapshot is {len(data)} bytes; the engine's next receive of this network would fail",
        )
    return header


def engine_json_bytes(obj: object) -> bytes:
    """A config object as the engine's file writer stores it.

    [INF] UE's JSON writer pretty-prints with tabs, and ``FFileHelper::SaveStringToFile`` (AutoDetect)
    writes plain 8-bit text when every character is ASCII, else UTF-16LE with a BOM. Paths with non-ASCII
    characters therefore produce UTF-16 files, which the trainer must read.
    """
    text = json.dumps(obj, indent="\t", ensure_ascii=False)
    if text.isascii():
        return text.encode("ascii")
    return b"\xff\xfe" + text.encode("utf-16-le")


# ---------------------------------------------------------------------------------------------------------
# The engine's wait loop


def _engine_wait(
    poll: Callable[[], T | None],
    *,
    timeout: float,
    what: str,
    take_ping: Callable[[], bool],
    process_alive: ProcessAlive | None,
    liveness_first: bool,
) -> T:
    """Poll every 1 ms until ``poll`` returns a value (not None/False), as the engine's waits do (§2.4).

    The clock counts time slept and restarts when ``take_ping`` reports a ping. ``liveness_first``: check
    the process before looking for data (socket, §10 item 7) rather than after (shared memory).

    [INF] "Adds up the time it sleeps" (§2.4) is read as the usual engine pattern of adding the requested
    sleep (1 ms) per poll, not the measured one: on a loaded machine the engine's timeout then stretches
    in wall time exactly as the engine's would, instead of failing a trainer that is merely starved of CPU
    by the test run itself.
    """
    slept = 0.0
    while True:
        if liveness_first and process_alive is not None and not process_alive():
            raise EngineFailure(
                Failure.PROCESS_EXITED, f"the trainer process exited while the engine was {what}"
            )
        result = poll()
        if result is not None and result is not False:
            return result
        if take_ping():
            slept = 0.0
        if not liveness_first and process_alive is not None and not process_alive():
            raise EngineFailure(
                Failure.PROCESS_EXITED, f"the trainer process exited while the engine was {what}"
            )
        if slept >= timeout:
            raise EngineFailure(
                Failure.TIMEOUT, f"no answer within the {timeout:g} s communicator timeout while {what}"
            )
        time.sleep(ENGINE_POLL_S)
        slept += ENGINE_POLL_S


def _check_round_answer(network_id: int, got: ReceivedNetwork | Completed) -> None:
    if isinstance(got, Completed) and network_id != 0:
        # §7.1: only ReceiveNetwork(0) may answer Completed; any other non-Success ends training with an error.
        raise EngineFailure(
            Failure.UNEXPECTED,
            f"the trainer signalled Complete in place of network {network_id}; only the first network of a "
            "round may be replaced by Complete",
        )


def _new_platform_guid(platform: str) -> str:
    return platform_guid_string(new_guid(os.urandom(16)), platform)


# ---------------------------------------------------------------------------------------------------------
# Shared memory


class ShmGame:
    """The engine's shared-memory communicator (§2). Build with :meth:`create` or :meth:`attach`, then
    :meth:`begin` with the session's configs.

    ``process_alive`` is the engine's check on a spawned trainer (None in attach mode, where the engine
    has no process handle). ``platform`` picks the GUID string form and OS names (``sys.platform``).
    """

    def __init__(
        self,
        controls: SharedRegion,
        controls_guid: str,
        config_dir: Path,
        *,
        timeout: float,
        process_alive: ProcessAlive | None,
        platform: str,
    ) -> None:
        self.controls_region = controls
        self.controls_guid = controls_guid
        """The controls GUID string exactly as the engine prints it (the ``-g`` value, the JSON file name)."""
        self.config_dir = config_dir
        self.timeout = timeout
        self.process_alive = process_alive
        self.platform = platform
        self.controls = GameControls(controls.buf)
        self.controls.init()
        self.session: SessionConfig | None = None
        self.network_regions: dict[int, SharedRegion] = {}
        self.network_guids: dict[int, str] = {}
        self.replay_regions: dict[str, SharedRegion] = {}
        self.replay_guids: dict[str, str] = {}
        self.layout: ReplayLayout | None = None
        self.events: list[tuple[float, str]] = []
        """(monotonic time, what happened) for every engine step, for assertions and failure messages."""
        self._note("controls initialised: all 0, NetworkId = ReplayBufferId = -1")

    # -- construction ------------------------------------------------------------------------------------
    @classmethod
    def create(
        cls,
        config_dir: str | os.PathLike[str],
        *,
        timeout: float = DEFAULT_ENGINE_TIMEOUT_S,
        process_alive: ProcessAlive | None = None,
        platform: str = sys.platform,
    ) -> ShmGame:
        """Spawned mode (§1.2): create the 40-byte controls block under a fresh GUID and initialise it.

        Call before launching the trainer (its ``-g`` is :attr:`controls_guid`); set
        :attr:`process_alive` once the process exists.
        """
        guid = _new_platform_guid(platform)
        region = SharedRegion.create(os_shm_name(guid, platform), CONTROL_BLOCK_BYTES, label="controls block")
        return cls(
            region, guid, Path(config_dir), timeout=timeout, process_alive=process_alive, platform=platform
        )

    @classmethod
    def attach(
        cls,
        controls_guid: str,
        config_dir: str | os.PathLike[str],
        *,
        timeout: float = DEFAULT_ENGINE_TIMEOUT_S,
        process_alive: ProcessAlive | None = None,
        platform: str = sys.platform,
    ) -> ShmGame:
        """Attach mode (§2.5): map the block the trainer created (``-LearningAgentsControlsGuid``) and
        initialise it. The GUID is parsed with FGuid::Parse rules and the region named by the platform
        string, as the engine does, so any accepted spelling of the GUID reaches the same region.
        """
        try:
            guid = platform_guid_string(parse_guid(controls_guid), platform)
        except GuidError as exc:
            raise EngineFailure(Failure.SETUP, f"-LearningAgentsControlsGuid: {exc}") from None
        try:
            region = SharedRegion.open(
                os_shm_name(guid, platform), CONTROL_BLOCK_BYTES, label="controls block"
            )
        except LaunchError as exc:
            raise EngineFailure(
                Failure.SETUP, f"mapping the trainer's controls block failed: {exc}"
            ) from None
        return cls(
            region, guid, Path(config_dir), timeout=timeout, process_alive=process_alive, platform=platform
        )

    # -- helpers -----------------------------------------------------------------------------------------
    def _note(self, what: str) -> None:
        self.events.append((time.monotonic(), what))

    def _wait(self, poll: Callable[[], T | None], what: str) -> T:
        return _engine_wait(
            poll,
            timeout=self.timeout,
            what=what,
            take_ping=self._take_ping,
            process_alive=self.process_alive,
            liveness_first=False,
        )

    def _take_ping(self) -> bool:
        if self.controls.take_ping():
            self._note("ping taken: timeout clock reset")
            return True
        return False

    def _new_region(self, size: int, label: str) -> tuple[str, SharedRegion]:
        guid = _new_platform_guid(self.platform)
        return guid, SharedRegion.create(os_shm_name(guid, self.platform), size, label=label)

    def control(self, index: Control) -> int:
        """One control's current value (for assertions: e.g. ConfigSignal cleared by the trainer)."""
        return read_controls(self.controls_region.buf)[index]

    @property
    def region_names(self) -> tuple[str, ...]:
        """OS names of every region this engine created (controls only in spawned mode)."""
        names = [r.name for r in self.network_regions.values()] + [
            r.name for r in self.replay_regions.values()
        ]
        if self.controls_region.created:
            names.insert(0, self.controls_region.name)
        return tuple(names)

    # -- BeginTraining: AddNetwork, AddReplayBuffer, SendConfigs (§7.1 steps 2-3) -----------------------
    def begin(self, session: SessionConfig, *, before_signal: Callable[[Path], None] | None = None) -> None:
        """Create the network and replay-buffer regions, write the three config files, raise ConfigSignal.

        ``before_signal(config_dir)`` runs between writing the files and raising the signal (fault
        injection for tests: corrupt or remove a file the way a broken engine or disk would).
        """
        if self.session is not None:
            raise EngineFailure(Failure.SETUP, "begin() was already called")
        self.session = session
        for net in sorted(session.model.networks, key=lambda n: n.id):
            guid, region = self._new_region(net.max_byte_num, f"network {net.id} region")
            self.network_guids[net.id], self.network_regions[net.id] = guid, region
        if len(session.data.replay_buffers) != 1:
            raise EngineFailure(Failure.SETUP, "the flow-matching engine adds exactly one replay buffer")
        rb_config = session.data.replay_buffers[0]
        self.layout = ReplayLayout.from_config(rb_config)
        for spec in self.layout.regions():
            guid, region = self._new_region(spec.nbytes, f"replay buffer region {spec.name}")
            self.replay_guids[spec.name], self.replay_regions[spec.name] = guid, region
        self._write_configs(session)
        if before_signal is not None:
            before_signal(self.config_dir)
        self.controls.post_config()
        self._note("configs written; ConfigSignal = 1")

    def _replay_guids(self) -> ReplayBufferGuids:
        assert self.layout is not None and self.session is not None  # begin() sets both first
        rb = self.session.data.replay_buffers[0]
        zero = platform_guid_string(_ZERO_GUID, self.platform)

        def streams(name: str, count: int) -> tuple[str, ...]:
            # A zero-size region is not allocated (§2.2); its slot keeps the default GUID.
            return tuple(self.replay_guids.get(f"{name}[{k}]", zero) for k in range(count))

        return ReplayBufferGuids(
            episode_starts_guid=self.replay_guids.get("EpisodeStarts", zero),
            episode_lengths_guid=self.replay_guids.get("EpisodeLengths", zero),
            episode_completion_modes_guid=self.replay_guids.get("EpisodeCompletionModes", zero),
            # §10 item 10: without final observations / memory states these lists are empty.
            episode_final_observations_guids=(
                streams("EpisodeFinalObservations", len(rb.observations)) if rb.has_final_observations else ()
            ),
            episode_final_memory_states_guids=(
                streams("EpisodeFinalMemoryStates", len(rb.memory_states))
                if rb.has_final_memory_states
                else ()
            ),
            observations_guids=streams("Observations", len(rb.observations)),
            actions_guids=streams("Actions", len(rb.actions)),
            action_modifiers_guids=streams("ActionModifiers", len(rb.action_modifiers)),
            memory_states_guids=streams("MemoryStates", len(rb.memory_states)),
            rewards_guids=streams("Rewards", len(rb.rewards)),
        )

    def _write_configs(self, session: SessionConfig) -> None:
        shm = SharedMemoryConfig(
            network_guids=tuple(sorted(self.network_guids.items())), replay_buffers=(self._replay_guids(),)
        )
        files = {
            f"shared-memory-{self.controls_guid}.json": shared_memory_config_to_json(shm),
            "data-config.json": data_config_to_json(session.data, session.model),
            "trainer-config.json": trainer_config_to_json(session.trainer, include_temp_directory=True),
        }
        try:
            # [INF] UE's file writer creates missing directories (attach mode: ConfigPath may not exist).
            self.config_dir.mkdir(parents=True, exist_ok=True)
            for name, obj in files.items():
                (self.config_dir / name).write_bytes(engine_json_bytes(obj))
        except OSError as exc:
            raise EngineFailure(
                Failure.SETUP, f"writing the configs into {self.config_dir} failed: {exc}"
            ) from None

    # -- SendNetwork / SendExperience (§2.4, §7.1 steps 4-5) ---------------------------------------------
    def send_network(self, network_id: int, data: bytes) -> None:
        """Wait for the trainer's request, copy the snapshot into region ``network_id``, hand it over."""
        region = self.network_regions[network_id]
        if len(data) != region.size:
            raise EngineFailure(
                Failure.SETUP, f"network {network_id} snapshot is {len(data)} bytes, its region {region.size}"
            )
        self._wait(
            self.controls.network_requested, f"waiting for the trainer to request network {network_id}"
        )
        region.buf[:] = data
        self.controls.post_network(network_id)
        self._note(f"network {network_id} sent")

    def send_experience(self, rb: ReplayBuffer) -> None:
        """Wait for ExperienceSignal == 0, copy the arrays into the regions, post E, S, id (§2.4, §10 item 9)."""
        layout = self.layout
        if layout is None:
            raise EngineFailure(Failure.SETUP, "send_experience() before begin()")
        self._wait(self.controls.can_post_experience, "waiting for ExperienceSignal to be 0")
        arrays: dict[str, np.ndarray] = {
            "EpisodeStarts": rb.episode_starts,
            "EpisodeLengths": rb.episode_lengths,
        }
        if rb.completion_modes is not None:
            arrays["EpisodeCompletionModes"] = rb.completion_modes
        arrays.update(rb.float_streams())
        for spec in layout.regions():
            raw = np.ascontiguousarray(arrays[spec.name], dtype=spec.dtype).reshape(-1).view(np.uint8).data
            self.replay_regions[spec.name].buf[: raw.nbytes] = raw
        self.controls.post_experience(rb.episode_num, rb.step_num, rb.replay_buffer_id)
        self._note(f"experience posted: E={rb.episode_num} S={rb.step_num}")

    # -- IterateTraining (§7.1) ---------------------------------------------------------------------------
    def has_network_or_completed(self) -> bool:
        """NetworkSignal == 1 or CompleteSignal == 1 (no wait, no liveness check: §10 item 7)."""
        return self.controls.has_network_or_completed()

    def receive_network(self, network_id: int) -> ReceivedNetwork | Completed:
        """``ReceiveNetwork(i)``: wait for a network or Complete; load region ``i`` (§2.4)."""
        self._wait(self.controls.has_network_or_completed, f"waiting for network {network_id}")
        if self.controls.take_completed():
            self._note("Complete taken")
            return COMPLETED
        try:
            self.controls.network_ready(network_id)
        except ControlError as exc:
            # The engine asserts on a NetworkId mismatch (§2.4).
            raise EngineFailure(Failure.UNEXPECTED, f"receiving network {network_id}: {exc}") from None
        region = self.network_regions[network_id]
        data = bytes(region.buf)
        try:
            header = engine_load_snapshot(data, region.size, network_id)
        finally:
            # On a load failure the engine still resets NetworkId and NetworkSignal (§2.4).
            self.controls.release_network()
        self._note(f"network {network_id} received")
        return ReceivedNetwork(network_id, data, header, None, time.monotonic())

    def receive_round(self) -> RoundResult:
        """Networks 0..N−1 in order, or Completed in place of network 0 (§7.1)."""
        assert self.session is not None  # begin() first: a programming error in the test, not peer data
        got: list[ReceivedNetwork] = []
        for net in sorted(self.session.model.networks, key=lambda n: n.id):
            answer = self.receive_network(net.id)
            _check_round_answer(net.id, answer)
            if isinstance(answer, Completed):
                return answer
            got.append(answer)
        return tuple(got)

    # -- EndTraining / DoneTraining -----------------------------------------------------------------------
    def stop(self) -> None:
        """``EndTraining``: StopSignal = 1, no wait (§2.4)."""
        self.controls.post_stop()
        self._note("StopSignal = 1")

    def done(self) -> None:
        """``DoneTraining`` → Terminate: unmap and unlink the network and replay regions (the creator
        unlinks, §2.1). The controls block stays with the communicator until :meth:`close`."""
        for region in (*self.network_regions.values(), *self.replay_regions.values()):
            region.close()
        self._note("network and replay regions released")

    def close(self) -> None:
        """Release everything; the controls block is unlinked only if this engine created it."""
        self.done()
        self.controls_region.close()


# ---------------------------------------------------------------------------------------------------------
# Socket


class SocketGame:
    """The engine's socket communicator (§3): a TCP client to the trainer's listening socket.

    Build with :meth:`connect`, then :meth:`begin`. ``networks_version`` is the engine's NetworksVersion:
    −1 until a network came back, then the version of the latest one (§8).
    """

    def __init__(
        self,
        sock: socket.socket,
        *,
        timeout: float,
        process_alive: ProcessAlive | None,
    ) -> None:
        self.sock = sock
        self.timeout = timeout
        self.process_alive = process_alive
        self.networks_version = -1
        self.session: SessionConfig | None = None
        self.network_sizes: dict[int, int] = {}
        self._decoder: GameStreamDecoder | None = None
        self.pings_taken = 0
        """Pings consumed (by the tick peek or inside a receive)."""
        self.closed_at: float | None = None
        self.peer_closed = False
        """The tick peek saw the trainer close the connection (the engine itself would wait forever)."""
        self.events: list[tuple[float, str]] = []
        # Sends block at most the communicator timeout; receives poll first, so recv never blocks.
        sock.settimeout(timeout)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    @classmethod
    def connect(
        cls,
        host: str,
        port: int,
        *,
        timeout: float = DEFAULT_ENGINE_TIMEOUT_S,
        process_alive: ProcessAlive | None = None,
    ) -> SocketGame:
        """Connect as the engine does: retry about every 1 ms until ``timeout`` seconds (§1.3)."""
        slept = 0.0
        last: OSError | None = None
        while True:
            try:
                sock = socket.create_connection((host, port), timeout=max(timeout - slept, ENGINE_POLL_S))
            except OSError as exc:
                last = exc
            else:
                game = cls(sock, timeout=timeout, process_alive=process_alive)
                game._note(f"connected to {host}:{port}")
                return game
            if slept >= timeout:
                raise EngineFailure(
                    Failure.SETUP,
                    f"could not connect to the trainer at {host}:{port} within {timeout:g} s ({last})",
                )
            time.sleep(ENGINE_POLL_S)
            slept += ENGINE_POLL_S  # the same accounting as every engine wait (see _engine_wait)

    # -- helpers -----------------------------------------------------------------------------------------
    def _note(self, what: str) -> None:
        self.events.append((time.monotonic(), what))

    def _alive(self) -> bool:
        return self.process_alive is None or self.process_alive()

    def _readable(self) -> bool:
        if self.closed_at is not None:
            return False
        poller = select.poll()
        poller.register(self.sock, select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR)
        return bool(poller.poll(0))

    def peer_hung_up(self) -> bool:
        """The trainer closed its end of the connection (FIN or reset), even with unread bytes before it.

        Not an engine call: the harness uses it to tell "still waiting for the close" from "gone" while
        Complete is pending (§10 item 7), without consuming anything.
        """
        if self.closed_at is not None:
            return False
        poller = select.poll()
        poller.register(self.sock, getattr(select, "POLLRDHUP", 0) | select.POLLHUP | select.POLLERR)
        return bool(poller.poll(0))

    def _send(self, parts: Sequence[bytes | memoryview], what: str) -> None:
        try:
            for part in parts:
                self.sock.sendall(part)
        except TimeoutError:
            raise EngineFailure(
                Failure.TIMEOUT, f"sending {what}: the trainer did not read for {self.timeout:g} s"
            ) from None
        except OSError as exc:
            raise EngineFailure(Failure.DISCONNECTED, f"sending {what}: {exc}") from None

    # -- BeginTraining ------------------------------------------------------------------------------------
    def begin(self, session: SessionConfig, *, raw_config: bytes | None = None) -> None:
        """Send the config: one JSON object, data + model keys + TrainerSettings, no TempDirectory (§3).

        ``raw_config`` replaces the encoded JSON (fault injection for tests).
        """
        if self.session is not None:
            raise EngineFailure(Failure.SETUP, "begin() was already called")
        self.session = session
        self.network_sizes = {net.id: net.max_byte_num for net in session.model.networks}
        self._decoder = GameStreamDecoder(self.network_sizes)
        raw = raw_config
        if raw is None:
            raw = json.dumps(socket_config_to_json(session), indent="\t", ensure_ascii=False).encode("utf-8")
        self._send(encode_config(raw), "the config")
        self._note(f"config sent ({len(raw)} bytes)")

    def send_network(self, network_id: int, data: bytes) -> None:
        """SendNetwork: byte 4, int32 id, the snapshot (exactly MaxByteNum)."""
        size = self.network_sizes.get(network_id)
        if size is None or len(data) != size:
            raise EngineFailure(
                Failure.SETUP, f"network {network_id} snapshot is {len(data)} bytes, MaxByteNum {size}"
            )
        self._send(encode_network_to_trainer(network_id, data), f"network {network_id}")
        self._note(f"network {network_id} sent")

    def send_experience(self, rb: ReplayBuffer) -> None:
        """SendExperience: byte 2, NetworksVersion, ReplayBufferId, E, S, then the arrays (§3)."""
        if self.session is None:
            raise EngineFailure(Failure.SETUP, "send_experience() before begin()")
        layout = ReplayLayout.from_config(self.session.replay_buffer(rb.replay_buffer_id))
        parts = [bytes((Signal.SEND_EXPERIENCE,)), *layout.encode_socket_parts(rb, self.networks_version)]
        self._send(parts, "the experience")
        self._note(
            f"experience sent: E={rb.episode_num} S={rb.step_num} NetworksVersion={self.networks_version}"
        )

    # -- IterateTraining ----------------------------------------------------------------------------------
    def has_network_or_completed(self) -> bool:
        """Peek one byte (§3). False once the spawned process exited, even with Complete pending
        (§10 item 7). A leading ping is consumed and the answer is False for this tick (§10 item 8).

        [INF] Whether the engine peeks again after consuming a ping is not known; answering False keeps
        the stricter reading, under which pings sent faster than the tick rate delay networks.
        [INF] A closed connection peeks as "nothing": the engine learns of it in its next blocking call.
        """
        if not self._alive() or not self._readable():
            return False
        try:
            head = self.sock.recv(1, socket.MSG_PEEK)
        except OSError:
            return False
        if not head:
            if not self.peer_closed:
                self.peer_closed = True
                self._note("the trainer closed the connection")
            return False
        if head[0] == Signal.RECV_PING:
            self.sock.recv(1)
            self.pings_taken += 1
            return False
        return True

    def _pump(self) -> NetworkToGame | Complete | Ping | None:
        """Read what is available of the current message (never past it) and return a finished event."""
        decoder = self._decoder
        assert decoder is not None  # begin() first: a programming error in the test, not peer data
        while self._readable():
            view = decoder.get_buffer(-1)
            try:
                n = self.sock.recv_into(view)
            except OSError as exc:
                decoder.buffer_updated(0)
                raise EngineFailure(Failure.DISCONNECTED, f"the connection failed: {exc}") from None
            decoder.buffer_updated(n)
            if n == 0:
                try:
                    decoder.eof()
                except ProtocolError as exc:
                    raise EngineFailure(
                        Failure.DISCONNECTED, f"the trainer closed the connection: {exc}"
                    ) from None
                raise EngineFailure(Failure.DISCONNECTED, "the trainer closed the connection")
            try:
                event = decoder.next_event()
            except ProtocolError as exc:
                raise EngineFailure(Failure.UNEXPECTED, str(exc)) from None
            if event is not NEED_DATA:
                return event
        return None

    def receive_network(self, network_id: int) -> ReceivedNetwork | Completed:
        """``ReceiveNetwork(i)``: wait for a signal byte; Ping resets the clock, Complete ends, RecvNetwork
        must carry id ``i`` and exactly MaxByteNum bytes (§3). Reads fail once the process exited."""
        pinged = False

        def poll() -> NetworkToGame | Complete | None:
            nonlocal pinged
            event = self._pump()
            if isinstance(event, Ping):
                self.pings_taken += 1
                pinged = True
                return None
            return event

        def take_ping() -> bool:
            nonlocal pinged
            was, pinged = pinged, False
            return was

        event = cast(
            "NetworkToGame | Complete",
            _engine_wait(
                poll,
                timeout=self.timeout,
                what=f"waiting for network {network_id}",
                take_ping=take_ping,
                process_alive=self.process_alive,
                liveness_first=True,
            ),
        )
        if isinstance(event, Complete):
            self._note("Complete received")
            return COMPLETED
        if event.network_id != network_id:
            raise EngineFailure(
                Failure.UNEXPECTED,
                f"expected network {network_id} but the trainer sent network {event.network_id}",
            )
        data = bytes(event.data)
        header = engine_load_snapshot(data, self.network_sizes[network_id], network_id)
        self.networks_version = event.version
        self._note(f"network {network_id} received (version {event.version})")
        return ReceivedNetwork(network_id, data, header, event.version, time.monotonic())

    def receive_round(self) -> RoundResult:
        """Networks 0..N−1 in order, or Completed in place of network 0 (§7.1)."""
        got: list[ReceivedNetwork] = []
        for network_id in sorted(self.network_sizes):
            answer = self.receive_network(network_id)
            _check_round_answer(network_id, answer)
            if isinstance(answer, Completed):
                return answer
            got.append(answer)
        return tuple(got)

    # -- EndTraining / DoneTraining -----------------------------------------------------------------------
    def stop(self) -> None:
        """``EndTraining``: the single byte 6 (§3)."""
        self._send([encode_stop()], "Stop")
        self._note("Stop sent")

    def done(self) -> None:
        """``DoneTraining`` → Terminate: close the connection (no Stop after Completed, §10 item 7).

        The engine does not drain the socket first; unread trainer bytes make the close a reset, which a
        trainer must survive as well.
        """
        if self.closed_at is None:
            with contextlib.suppress(OSError):
                self.sock.close()
            self.closed_at = time.monotonic()
            self._note("connection closed")

    def close(self) -> None:
        self.done()


# ---------------------------------------------------------------------------------------------------------
# File export (§5.5)


class ExportFlags(Enum):
    """``ETrainerExportFlags``: which parts an export writes."""

    REPLAY_BUFFERS = "ReplayBuffers"
    NETWORKS = "Networks"
    TRAINER_CONFIG = "TrainerConfig"


_ALL_EXPORT_FLAGS: Final = frozenset(ExportFlags)


class FileExport:
    """The engine's FileTrainer export into ``<intermediate_dir>/TrainingMaterials/<YYYYmmddHHMMSS>/``."""

    def __init__(self, intermediate_dir: str | os.PathLike[str]) -> None:
        self.intermediate_dir = Path(intermediate_dir)

    @staticmethod
    def _write(path: Path, data: bytes) -> None:
        # §5.5: "<name>.tmp" first, then renamed over the final name.
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)

    def write(
        self,
        session: SessionConfig,
        networks: Mapping[int, bytes],
        replay_buffer: ReplayBuffer,
        *,
        flags: frozenset[ExportFlags] = _ALL_EXPORT_FLAGS,
        now: datetime | None = None,
    ) -> Path:
        """Write the chosen parts and return the export folder.

        ``trainer-config.json`` carries TempDirectory (the intermediate dir); the data config has no
        model keys; the replay file holds only starts, lengths, observations and actions (§5.5).
        """
        stamp = (now or datetime.now()).strftime("%Y%m%d%H%M%S")
        folder = self.intermediate_dir / "TrainingMaterials" / stamp
        folder.mkdir(parents=True, exist_ok=True)
        if ExportFlags.TRAINER_CONFIG in flags:
            trainer = session.trainer
            if trainer.temp_directory is None:
                trainer = replace(trainer, temp_directory=str(self.intermediate_dir.resolve()))
            self._write(
                folder / "trainer-config.json", engine_json_bytes(trainer_config_to_json(trainer, True))
            )
        if ExportFlags.REPLAY_BUFFERS in flags:
            self._write(
                folder / "ReplayBuffers" / "data-config.json",
                engine_json_bytes(data_config_to_json(session.data)),
            )
            layout = ReplayLayout.from_config(session.replay_buffer(replay_buffer.replay_buffer_id))
            self._write(
                folder / "ReplayBuffers" / f"replaybuffer_{replay_buffer.replay_buffer_id}.bin",
                layout.encode_file(replay_buffer),
            )
        if ExportFlags.NETWORKS in flags:
            self._write(
                folder / "Networks" / "model-config.json",
                engine_json_bytes(model_config_to_json(session.model)),
            )
            for network_id, data in sorted(networks.items()):
                self._write(folder / "Networks" / f"network_{network_id}.bin", bytes(data))
        return folder

    @staticmethod
    def read_networks(folder: str | os.PathLike[str], session: SessionConfig) -> tuple[ReceivedNetwork, ...]:
        """Load ``Networks/network_<id>.bin`` back with the engine's snapshot checks (sizes from the model
        config), in id order; what an import of offline results would see."""
        out = []
        for net in sorted(session.model.networks, key=lambda n: n.id):
            path = Path(folder) / "Networks" / f"network_{net.id}.bin"
            try:
                data = path.read_bytes()
            except OSError as exc:
                raise EngineFailure(Failure.BAD_SNAPSHOT, f"reading {path}: {exc}") from None
            header = engine_load_snapshot(data, net.max_byte_num, net.id)
            out.append(ReceivedNetwork(net.id, data, header, None, time.monotonic()))
        return tuple(out)
