"""The engine's configuration as frozen dataclasses with the engine defaults (spec §2.6, §4).

Values only: :mod:`protocol.config` parses the engine's JSON into these and encodes them back. A
:class:`SessionConfig` (trainer + data + model config) is what the trainer works from whatever the
transport; :class:`SharedMemoryConfig` is ``shared-memory-<GUID>.json``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from protocol.errors import ConfigError
from protocol.names import FLOW_MATCHING
from protocol.schema import SchemaNode

__all__ = [
    "DATA_KEYS",
    "ESSENTIAL_STREAMS",
    "MODEL_KEYS",
    "STREAM_ATTRS",
    "DataConfig",
    "FlowMatchingSettings",
    "FlowMatchingTrainingSettings",
    "ModelConfig",
    "NetworkConfig",
    "ReplayBufferConfig",
    "ReplayBufferGuids",
    "SchemaEntry",
    "SessionConfig",
    "SharedMemoryConfig",
    "StreamConfig",
    "TrainerConfig",
]

DATA_KEYS = ("ReplayBuffers", "Schemas")
"""Top-level keys of the data config (§4.2)."""
MODEL_KEYS = ("Networks", "FlowMatchingSettings")
"""Top-level keys of the model config (§4.3); merged into the data config for shared memory and socket."""

STREAM_ATTRS = {
    "Observations": "observations",
    "Actions": "actions",
    "ActionModifiers": "action_modifiers",
    "MemoryStates": "memory_states",
    "Rewards": "rewards",
}
"""The stream lists of a replay buffer: data-config key (§4.2) -> :class:`ReplayBufferConfig` attribute."""

ESSENTIAL_STREAMS = ("Observations", "Actions")
"""Stream lists every replay buffer must carry; flow matching needs exactly one stream in each (§2.2)."""


@dataclass(frozen=True, slots=True)
class FlowMatchingTrainingSettings:
    """``FlowMatchingTrainingSettings`` of the trainer config (§4.1); defaults are the engine's."""

    iteration_num: int = 1_000_000
    learning_rate: float = 1e-4
    weight_decay: float = 1e-4
    batch_size: int = 256
    observation_noise_scale: float = 0.0
    normalize_latents: bool = False
    seed: int = 1234
    save_snapshots: bool = True
    iterations_per_snapshot: int = 1000


@dataclass(frozen=True, slots=True)
class TrainerConfig:
    """The trainer config (§4.1). ``temp_directory`` is None where the transport does not send it (socket)."""

    trainer_method: str = FLOW_MATCHING
    time_stamp: str = ""
    training: FlowMatchingTrainingSettings = field(default_factory=FlowMatchingTrainingSettings)
    embed_normalizations_in_weights: bool = False
    device: str = "GPU"
    use_tensorboard: bool = False
    use_mlflow: bool = False
    mlflow_tracking_uri: str = ""
    temp_directory: str | None = None


@dataclass(frozen=True, slots=True)
class StreamConfig:
    """One stream of a replay buffer: a float32 ``[rows, vector_dimension_num]`` array (§4.2).

    ``schema_id`` is None for streams that name no schema (memory states, rewards).
    """

    id: int
    name: str
    schema_id: int | None
    vector_dimension_num: int


@dataclass(frozen=True, slots=True)
class ReplayBufferConfig:
    """One replay buffer of the data config (§4.2); its region sizes follow from these counts (§2.2)."""

    id: int
    max_episode_num: int
    max_step_num: int
    has_completions: bool
    has_final_observations: bool
    has_final_memory_states: bool
    observations: tuple[StreamConfig, ...]
    actions: tuple[StreamConfig, ...]
    action_modifiers: tuple[StreamConfig, ...] = ()
    memory_states: tuple[StreamConfig, ...] = ()
    rewards: tuple[StreamConfig, ...] = ()


@dataclass(frozen=True, slots=True)
class SchemaEntry:
    """One entry of ``Schemas.Observations`` / ``Schemas.Actions`` (§4.2)."""

    id: int
    name: str
    schema: SchemaNode


@dataclass(frozen=True, slots=True)
class DataConfig:
    """The data config (§4.2)."""

    replay_buffers: tuple[ReplayBufferConfig, ...]
    observation_schemas: tuple[SchemaEntry, ...]
    action_schemas: tuple[SchemaEntry, ...]

    def observation_schema(self, schema_id: int) -> SchemaEntry:
        """The observation schema with ``Id == schema_id``; ConfigError when there is none."""
        return _find_schema(self.observation_schemas, schema_id, "observation")

    def action_schema(self, schema_id: int) -> SchemaEntry:
        """The action schema with ``Id == schema_id``; ConfigError when there is none."""
        return _find_schema(self.action_schemas, schema_id, "action")


@dataclass(frozen=True, slots=True)
class NetworkConfig:
    """One network of the model config (§4.3). ``max_byte_num`` is the exact snapshot size in bytes."""

    id: int
    name: str
    max_byte_num: int
    input_schema_id: int | None = None
    output_schema_id: int | None = None


@dataclass(frozen=True, slots=True)
class FlowMatchingSettings:
    """``FlowMatchingSettings`` of the model config (§4.3); defaults are the engine's."""

    action_chunk_size: int = 1
    hidden_layer_num: int = 1
    hidden_layer_size: int = 128
    activation_function: str = "ELU"


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """The model config (§4.3)."""

    networks: tuple[NetworkConfig, ...]
    flow_matching: FlowMatchingSettings = field(default_factory=FlowMatchingSettings)


@dataclass(frozen=True, slots=True)
class ReplayBufferGuids:
    """The GUID strings of one replay buffer's regions (§2.6), as written (not parsed: see protocol.guid).

    ``episode_completion_modes_guid`` is the zero GUID when the region is not allocated (§10 item 10);
    the per-stream tuples are empty when the region kind is not allocated.
    """

    episode_starts_guid: str
    episode_lengths_guid: str
    episode_completion_modes_guid: str = ""
    episode_final_observations_guids: tuple[str, ...] = ()
    episode_final_memory_states_guids: tuple[str, ...] = ()
    observations_guids: tuple[str, ...] = ()
    actions_guids: tuple[str, ...] = ()
    action_modifiers_guids: tuple[str, ...] = ()
    memory_states_guids: tuple[str, ...] = ()
    rewards_guids: tuple[str, ...] = ()

    def by_region_name(self) -> dict[str, str]:
        """GUID per region name, using the names of ``protocol.replay.ReplayLayout.regions()``
        (``"EpisodeStarts"``, ``"Observations[0]"``, ...). Includes regions that may not be allocated;
        the layout decides which ones exist."""
        out = {
            "EpisodeStarts": self.episode_starts_guid,
            "EpisodeLengths": self.episode_lengths_guid,
            "EpisodeCompletionModes": self.episode_completion_modes_guid,
        }
        for name, guids in _guid_lists(self):
            for k, guid in enumerate(guids):
                out[f"{name}[{k}]"] = guid
        return out


@dataclass(frozen=True, slots=True)
class SharedMemoryConfig:
    """``shared-memory-<GUID>.json`` (§2.6): ``network_guids`` as ``(NetworkId, Guid)`` in file order;
    ``replay_buffers[i]`` belongs to the replay buffer with id ``i``."""

    network_guids: tuple[tuple[int, str], ...]
    replay_buffers: tuple[ReplayBufferGuids, ...]

    def network_guid(self, network_id: int) -> str:
        """The GUID string of network ``network_id``; ConfigError when it is not listed."""
        for nid, guid in self.network_guids:
            if nid == network_id:
                return guid
        raise ConfigError(
            f"shared-memory config lists no GUID for network {network_id}",
            field="NetworkGuids",
            expected=network_id,
            actual=[nid for nid, _ in self.network_guids],
        )


@dataclass(frozen=True, slots=True)
class SessionConfig:
    """Everything the trainer works from, whatever the transport.

    The convenience properties describe the flow-matching data: replay buffer 0 with one observation
    and one action stream (checked by the assemblies when ``TrainerMethod`` is ``"FlowMatching"``).
    """

    trainer: TrainerConfig
    data: DataConfig
    model: ModelConfig
    warnings: tuple[str, ...] = ()

    def network(self, network_id: int) -> NetworkConfig:
        """The network with ``Id == network_id``; ConfigError when there is none."""
        for net in self.model.networks:
            if net.id == network_id:
                return net
        raise ConfigError(
            f"the model config has no network with Id {network_id}",
            field="Networks",
            expected=network_id,
            actual=[n.id for n in self.model.networks],
        )

    def replay_buffer(self, replay_buffer_id: int) -> ReplayBufferConfig:
        """The replay buffer with ``Id == replay_buffer_id``; ConfigError when there is none."""
        for rb in self.data.replay_buffers:
            if rb.id == replay_buffer_id:
                return rb
        raise ConfigError(
            f"the data config has no replay buffer with Id {replay_buffer_id}",
            field="ReplayBuffers",
            expected=replay_buffer_id,
            actual=[rb.id for rb in self.data.replay_buffers],
        )

    @property
    def observation_stream(self) -> StreamConfig:
        """The flow-matching observation stream (replay buffer 0, stream 0)."""
        return _single_stream(self.data, "Observations")

    @property
    def action_stream(self) -> StreamConfig:
        """The flow-matching action stream (replay buffer 0, stream 0)."""
        return _single_stream(self.data, "Actions")

    @property
    def observation_dim(self) -> int:
        """Width of one observation vector (the observation schema's VectorSize)."""
        return self.observation_stream.vector_dimension_num

    @property
    def action_dim(self) -> int:
        """Width of one per-step action vector (ActionVectorSize; not multiplied by the chunk size, §4.2)."""
        return self.action_stream.vector_dimension_num

    @property
    def action_chunk_size(self) -> int:
        return self.model.flow_matching.action_chunk_size

    @property
    def denoiser_action_dim(self) -> int:
        """ActDim of the denoiser and decoder: ActionVectorSize × ActionChunkSize (§5.4, §6.3)."""
        return self.action_dim * self.action_chunk_size

    @property
    def observation_schema(self) -> SchemaEntry:
        """The schema of the flow-matching observation stream."""
        return self.data.observation_schema(_schema_id(self.observation_stream, "Observations"))

    @property
    def action_schema(self) -> SchemaEntry:
        """The schema of the flow-matching action stream."""
        return self.data.action_schema(_schema_id(self.action_stream, "Actions"))


def _find_schema(entries: tuple[SchemaEntry, ...], schema_id: int, role: str) -> SchemaEntry:
    for entry in entries:
        if entry.id == schema_id:
            return entry
    raise ConfigError(
        f"the data config has no {role} schema with Id {schema_id}",
        field=f"Schemas.{role.capitalize()}s",
        expected=schema_id,
        actual=[e.id for e in entries],
    )


def _single_stream(data: DataConfig, kind: str) -> StreamConfig:
    if not data.replay_buffers:
        raise ConfigError(
            "the data config has no replay buffer", field="ReplayBuffers", expected=">= 1", actual=0
        )
    streams: tuple[StreamConfig, ...] = getattr(data.replay_buffers[0], STREAM_ATTRS[kind])
    if len(streams) != 1:
        raise ConfigError(
            f"flow matching needs exactly one {kind} stream in ReplayBuffers[0]",
            field=f"ReplayBuffers[0].{kind}",
            expected=1,
            actual=len(streams),
        )
    return streams[0]


def _schema_id(stream: StreamConfig, kind: str) -> int:
    if stream.schema_id is None:
        raise ConfigError(
            f"ReplayBuffers[0].{kind}[0] names no schema", field=f"ReplayBuffers[0].{kind}[0].SchemaId"
        )
    return stream.schema_id


def _guid_lists(guids: ReplayBufferGuids) -> tuple[tuple[str, tuple[str, ...]], ...]:
    return (
        ("EpisodeFinalObservations", guids.episode_final_observations_guids),
        ("EpisodeFinalMemoryStates", guids.episode_final_memory_states_guids),
        ("Observations", guids.observations_guids),
        ("Actions", guids.actions_guids),
        ("ActionModifiers", guids.action_modifiers_guids),
        ("MemoryStates", guids.memory_states_guids),
        ("Rewards", guids.rewards_guids),
    )
