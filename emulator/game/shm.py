"""The engine's shared-memory communicator (spec §2, §7.1, §10 items 7, 9, 10).

Spawned mode (:meth:`ShmGame.create`) creates the controls block under a fresh braced upper-case GUID
(§1.2, §2.1); attach mode (:meth:`ShmGame.attach`) maps the block the trainer created (§2.5). Either way
it zeroes the block with [8] = [9] = −1, creates one region per network and per replay-buffer array, each
under its own GUID (§2.2), writes the three config files and raises ConfigSignal (§2.4).

The shared-memory rules that differ from the socket's: waits test NetworkSignal / CompleteSignal
*before* process liveness (§10 item 7), and ``SendExperience`` waits only for ExperienceSignal == 0
*before* writing (§10 item 9). The rules all transports share are in :mod:`emulator.game.common`.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final, TypeVar

import numpy as np

from emulator.game.common import (
    COMPLETED,
    DEFAULT_ENGINE_TIMEOUT_S,
    Completed,
    EngineFailure,
    Failure,
    ProcessAlive,
    ReceivedNetwork,
    RoundResult,
    engine_load_snapshot,
    engine_wait,
    new_platform_guid,
    receive_round,
)
from protocol.config import (
    ReplayBufferGuids,
    SessionConfig,
    SharedMemoryConfig,
    data_config_to_json,
    engine_json_bytes,
    shared_memory_config_to_json,
    trainer_config_to_json,
)
from protocol.controls import CONTROL_BLOCK_BYTES, Control, GameControls, read_controls
from protocol.errors import ControlError, GuidError
from protocol.guid import Guid, os_shm_name, parse_guid, platform_guid_string
from protocol.replay import ReplayBuffer, ReplayLayout
from trainer.session.transport.shm import SharedRegion, region_exists

__all__ = ["ShmGame"]

_ZERO_GUID: Final = Guid(0, 0, 0, 0)
"""[INF] The default GUID of a region view that was never allocated (§10 item 10: "presumably zeros")."""

T = TypeVar("T")


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
        self.take_late_s = 0.0
        """Seconds the game takes each network late (a slow frame; :func:`emulator.game.common.receive_round`)."""
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
        guid = new_platform_guid(platform)
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
        name = os_shm_name(guid, platform)
        # Checked here rather than by catching the region code's error: that error is the trainer's own
        # (trainer.errors.LaunchError), and the game side does not depend on the trainer's error classes.
        if not region_exists(name):
            raise EngineFailure(
                Failure.SETUP,
                f"mapping the trainer's controls block failed: no shared-memory region {name!r} exists "
                "(start the trainer first; the GUID must be the one it printed)",
            )
        region = SharedRegion.open(name, CONTROL_BLOCK_BYTES, label="controls block")
        return cls(
            region, guid, Path(config_dir), timeout=timeout, process_alive=process_alive, platform=platform
        )

    # -- helpers -----------------------------------------------------------------------------------------
    def _note(self, what: str) -> None:
        self.events.append((time.monotonic(), what))

    def _wait(self, poll: Callable[[], T | None], what: str) -> T:
        return engine_wait(
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
        guid = new_platform_guid(self.platform)
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
        return receive_round(
            self.receive_network, sorted(net.id for net in self.session.model.networks), self.take_late_s
        )

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
