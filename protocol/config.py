"""The engine's configuration JSON as frozen dataclasses with the engine defaults (spec §2.6, §3, §4, §5.5).

The engine builds three objects: a trainer config (§4.1), a data config (§4.2: replay buffers and schemas)
and a model config (§4.3: networks and flow-matching settings). Where they end up depends on the
transport, and one assembly per transport turns them into a :class:`SessionConfig`:

* shared memory: ``trainer-config.json`` (+ ``TempDirectory``) and ``data-config.json`` (data keys with
  the model keys merged in) → :func:`session_from_shared_memory`;
* socket: one object = data + model keys + ``"TrainerSettings"`` (no ``TempDirectory``) →
  :func:`session_from_socket`;
* TrainingMaterials export: three separate files → :func:`session_from_files`.

``shared-memory-<GUID>.json`` (§2.6) is parsed on its own by :func:`parse_shared_memory_config`.

Policy for input from a newer or older engine: a missing optional key takes the engine default and adds
a warning to :attr:`SessionConfig.warnings`; an unknown key adds a warning (never silently dropped); a
missing essential key (ids, sizes, ReplayBuffers, Networks, Schemas, MaxByteNum, ...) or a wrong type
raises :class:`ConfigError` naming the key path, the expected type and the actual value. JSON numbers
are doubles on the engine side (§4), so integer fields accept ``3`` and ``3.0`` and reject ``3.5``.

Encoders (``*_to_json``) produce the objects the engine writes (used by the game-side emulator); for
every value ``x`` built by a parser, ``parse(encode(x)) == x``.
"""

from __future__ import annotations

import codecs
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from protocol.errors import ConfigError
from protocol.schema import (
    INT32_MAX,
    Role,
    SchemaNode,
    _json_bool,
    _json_float,
    _json_int,
    _json_list,
    _json_object,
    _json_str,
    _require,
    _where,
    parse_schema,
    schema_to_json,
)

__all__ = [
    "ACTIVATION_FUNCTIONS",
    "DATA_KEYS",
    "DEVICES",
    "FLOW_MATCHING_NETWORK_IDS",
    "MAX_JSON_DEPTH",
    "MODEL_KEYS",
    "SNAPSHOT_HEADER_BYTES",
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
    "check_shared_memory_config",
    "data_config_to_json",
    "dump_json",
    "model_config_to_json",
    "parse_data_config",
    "parse_json",
    "parse_model_config",
    "parse_shared_memory_config",
    "parse_trainer_config",
    "session_from_files",
    "session_from_shared_memory",
    "session_from_socket",
    "shared_memory_config_to_json",
    "socket_config_to_json",
    "trainer_config_to_json",
]

MAX_JSON_DEPTH = 256
"""Deepest array/object nesting accepted by :func:`parse_json`; engine configs nest about a dozen levels."""

SNAPSHOT_HEADER_BYTES = 24
"""A network snapshot is a 24-byte header plus a non-empty model blob (§6.1, §10 item 6): MaxByteNum > 24."""

FLOW_MATCHING_NETWORK_IDS = (0, 1, 2)
"""Denoiser, encoder, decoder: fixed by the engine's AddNetwork order (§4.3)."""

DEVICES = ("GPU", "CPU")
ACTIVATION_FUNCTIONS = ("ELU", "ReLU", "TanH", "GELU")

DATA_KEYS = ("ReplayBuffers", "Schemas")
"""Top-level keys of the data config (§4.2)."""
MODEL_KEYS = ("Networks", "FlowMatchingSettings")
"""Top-level keys of the model config (§4.3); merged into the data config for shared memory and socket."""


# --------------------------------------------------------------------------------------------------
# Values


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

    trainer_method: str = "FlowMatching"
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
    streams: tuple[StreamConfig, ...] = getattr(data.replay_buffers[0], _STREAM_ATTRS[kind])
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


# --------------------------------------------------------------------------------------------------
# parse_json


def parse_json(raw: bytes | bytearray | memoryview, source: str) -> object:
    """Decode one JSON document; ConfigError names ``source`` and the position of the fault.

    The caller bounds ``len(raw)``. Beyond plain ``json.loads`` this rejects:
    NaN/Infinity literals (not JSON, and the engine never writes them; a NaN learning rate would only fail
    later and obscurely), duplicate keys (ambiguous: which one did the engine mean?), and nesting deeper
    than :data:`MAX_JSON_DEPTH`.
    [INF] Text encoding: the socket sends UTF-8 (§3). Files may come from a UE string writer that emits
    UTF-16 with a BOM when a path holds non-ASCII characters, so a UTF-8 or UTF-16 BOM is honoured.
    """
    data = bytes(raw)
    try:
        if data.startswith(codecs.BOM_UTF8):
            text = data[len(codecs.BOM_UTF8) :].decode("utf-8")
        elif data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
            text = data.decode("utf-16")
        else:
            text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{source}: not valid text at byte {exc.start}: {exc.reason}",
            field=source,
            expected="UTF-8 JSON",
            actual=data[exc.start : exc.start + 8],
        ) from None
    try:
        value = json.loads(
            text, parse_constant=_reject_constant(source), object_pairs_hook=_no_duplicates(source)
        )
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{source}: invalid JSON at line {exc.lineno} column {exc.colno} (character {exc.pos}): {exc.msg}",
            field=source,
            expected="JSON",
            actual=text[exc.pos : exc.pos + 16],
        ) from None
    except RecursionError:
        raise ConfigError(
            f"{source}: JSON nests deeper than {MAX_JSON_DEPTH} levels",
            field=source,
            expected=f"<= {MAX_JSON_DEPTH}",
        ) from None
    except ValueError as exc:  # e.g. an integer literal beyond Python's digit limit
        raise ConfigError(f"{source}: invalid JSON: {exc}", field=source, expected="JSON") from None
    _check_depth(value, source)
    return value


def _reject_constant(source: str) -> Callable[[str], object]:
    def reject(name: str) -> object:
        raise ConfigError(
            f"{source}: {name} is not a JSON number (the engine never writes it)",
            field=source,
            expected="finite number",
            actual=name,
        )

    return reject


def _no_duplicates(source: str) -> Callable[[list[tuple[str, object]]], dict[str, object]]:
    def build(pairs: list[tuple[str, object]]) -> dict[str, object]:
        out: dict[str, object] = {}
        for key, value in pairs:
            if key in out:
                raise ConfigError(f"{source}: duplicate key {key!r} in one object", field=key, actual=key)
            out[key] = value
        return out

    return build


def _check_depth(value: object, source: str) -> None:
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > MAX_JSON_DEPTH:
                raise ConfigError(
                    f"{source}: JSON nests deeper than {MAX_JSON_DEPTH} levels",
                    field=source,
                    expected=f"<= {MAX_JSON_DEPTH}",
                    actual=depth,
                )
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)


def dump_json(obj: object) -> bytes:
    """UTF-8 JSON bytes for an encoder's output (what the emulator writes into files or the socket)."""
    return json.dumps(obj, indent="\t", allow_nan=False).encode("utf-8")


# --------------------------------------------------------------------------------------------------
# Parsing context and field tables


@dataclass(slots=True)
class _Ctx:
    source: str
    warnings: list[str]

    def where(self, path: str) -> str:
        return _where(path, self.source)

    def missing(self, path: str, default: object) -> None:
        self.warnings.append(f"{self.where(path)} is missing; using the engine default {default!r}")

    def missing_object(self, path: str) -> None:
        self.warnings.append(f"{self.where(path)} is missing; using the engine defaults for all its keys")

    def unknown(self, obj: Mapping[str, object], known: tuple[str, ...] | set[str], path: str) -> None:
        for key in obj:
            if key not in known:
                self.warnings.append(f"{self.where(_join(path, key))} is not a known key; ignored")


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


_Reader = Callable[[object, str, str], Any]


def _int_reader(lo: int = 0, hi: int = INT32_MAX) -> _Reader:
    return lambda value, path, source: _json_int(value, path, lo=lo, hi=hi, source=source)


def _float_reader(lo: float = 0.0) -> _Reader:
    return lambda value, path, source: _json_float(value, path, lo=lo, source=source)


def _bool_reader(value: object, path: str, source: str) -> bool:
    return _json_bool(value, path, source=source)


def _str_reader(value: object, path: str, source: str) -> str:
    return _json_str(value, path, source=source)


_Table = tuple[tuple[str, str, _Reader], ...]

_TRAINING_FIELDS: _Table = (
    ("IterationNum", "iteration_num", _int_reader()),
    ("LearningRate", "learning_rate", _float_reader()),
    ("WeightDecay", "weight_decay", _float_reader()),
    ("BatchSize", "batch_size", _int_reader(lo=1)),
    ("ObservationNoiseScale", "observation_noise_scale", _float_reader()),
    ("NormalizeLatents", "normalize_latents", _bool_reader),
    ("Seed", "seed", _int_reader(lo=-INT32_MAX - 1)),
    ("SaveSnapshots", "save_snapshots", _bool_reader),
    # >= 1: the trainer takes ``iteration % IterationsPerSnapshot``; 0 would divide by zero.
    ("IterationsPerSnapshot", "iterations_per_snapshot", _int_reader(lo=1)),
)
"""(JSON key, attribute, reader) for :class:`FlowMatchingTrainingSettings`, in engine order."""

_TRAINER_FIELDS: _Table = (
    ("TrainerMethod", "trainer_method", _str_reader),
    ("TimeStamp", "time_stamp", _str_reader),
    ("EmbedNormalizationsInWeights", "embed_normalizations_in_weights", _bool_reader),
    ("Device", "device", _str_reader),
    ("UseTensorBoard", "use_tensorboard", _bool_reader),
    ("UseMLflow", "use_mlflow", _bool_reader),
    ("MLflowTrackingUri", "mlflow_tracking_uri", _str_reader),
)
"""Scalar trainer-config keys (the nested settings object and TempDirectory are handled apart)."""

_FLOW_MATCHING_FIELDS: _Table = (
    ("ActionChunkSize", "action_chunk_size", _int_reader(lo=1)),
    ("HiddenLayerNum", "hidden_layer_num", _int_reader()),
    ("HiddenLayerSize", "hidden_layer_size", _int_reader(lo=1)),
    ("ActivationFunction", "activation_function", _str_reader),
)

_T = TypeVar("_T")


def _read_fields(
    obj: Mapping[str, object], table: _Table, cls: type[_T], path: str, ctx: _Ctx
) -> dict[str, object]:
    """Read the keys of ``table``; missing ones take ``cls``'s default and add a warning."""
    defaults = {f.name: f.default for f in fields(cls)}  # type: ignore[arg-type]
    out: dict[str, object] = {}
    for key, attr, reader in table:
        key_path = _join(path, key)
        if key in obj:
            out[attr] = reader(obj[key], key_path, ctx.source)
        else:
            ctx.missing(key_path, defaults[attr])
            out[attr] = defaults[attr]
    return out


def _write_fields(value: object, table: _Table) -> dict[str, object]:
    return {key: _number(getattr(value, attr)) for key, attr, _ in table}


def _number(value: object) -> object:
    """Whole floats as integers, as the engine's double writer prints them (§4)."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value


# --------------------------------------------------------------------------------------------------
# Trainer config


def parse_trainer_config(
    obj: object,
    warnings: list[str] | None = None,
    *,
    path: str = "",
    source: str = "trainer-config.json",
    expect_temp_directory: bool = True,
) -> TrainerConfig:
    """Parse a trainer config object (§4.1). ``TempDirectory`` is read when present; its absence is a
    warning only when ``expect_temp_directory`` (shared memory and exported files add it, the socket not)."""
    ctx = _Ctx(source, warnings if warnings is not None else [])
    return _parse_trainer(obj, ctx, path, expect_temp_directory)


def _parse_trainer(obj: object, ctx: _Ctx, path: str, expect_temp_directory: bool) -> TrainerConfig:
    node = _json_object(obj, path or "trainer config", source=ctx.source)
    values = _read_fields(node, _TRAINER_FIELDS, TrainerConfig, path, ctx)
    settings_path = _join(path, "FlowMatchingTrainingSettings")
    if "FlowMatchingTrainingSettings" in node:
        settings_obj = _json_object(node["FlowMatchingTrainingSettings"], settings_path, source=ctx.source)
        training = FlowMatchingTrainingSettings(
            **_read_fields(settings_obj, _TRAINING_FIELDS, FlowMatchingTrainingSettings, settings_path, ctx)  # type: ignore[arg-type]
        )
        ctx.unknown(settings_obj, tuple(k for k, _, _ in _TRAINING_FIELDS), settings_path)
    else:
        ctx.missing_object(settings_path)
        training = FlowMatchingTrainingSettings()
    temp_directory: str | None = None
    if "TempDirectory" in node:
        temp_directory = _json_str(node["TempDirectory"], _join(path, "TempDirectory"), source=ctx.source)
    elif expect_temp_directory:
        ctx.warnings.append(
            f"{ctx.where(_join(path, 'TempDirectory'))} is missing; no temp directory is known"
        )
    if values["device"] not in DEVICES:
        ctx.warnings.append(
            f"{ctx.where(_join(path, 'Device'))} {values['device']!r} is not one of {', '.join(DEVICES)}; kept as given"
        )
    known = (*(k for k, _, _ in _TRAINER_FIELDS), "FlowMatchingTrainingSettings", "TempDirectory")
    ctx.unknown(node, known, path)
    return TrainerConfig(training=training, temp_directory=temp_directory, **values)  # type: ignore[arg-type]


def trainer_config_to_json(cfg: TrainerConfig, include_temp_directory: bool = True) -> dict[str, object]:
    """The trainer config object the engine writes; ``TempDirectory`` only when asked for and known."""
    out = _write_fields(cfg, _TRAINER_FIELDS[:2])
    out["FlowMatchingTrainingSettings"] = _write_fields(cfg.training, _TRAINING_FIELDS)
    out.update(_write_fields(cfg, _TRAINER_FIELDS[2:]))
    if include_temp_directory and cfg.temp_directory is not None:
        out["TempDirectory"] = cfg.temp_directory
    return out


# --------------------------------------------------------------------------------------------------
# Data config

_STREAM_ATTRS = {
    "Observations": "observations",
    "Actions": "actions",
    "ActionModifiers": "action_modifiers",
    "MemoryStates": "memory_states",
    "Rewards": "rewards",
}
_ESSENTIAL_STREAMS = ("Observations", "Actions")
# [INF] Memory-state and reward streams need not name a schema; the FM engine sends none of them (§2.2).
_SCHEMALESS_STREAMS = ("MemoryStates", "Rewards")
_RB_FLAGS = (
    ("HasCompletions", "has_completions"),
    ("HasFinalObservations", "has_final_observations"),
    ("HasFinalMemoryStates", "has_final_memory_states"),
)


def parse_data_config(
    obj: object, warnings: list[str] | None = None, *, path: str = "", source: str = "data-config.json"
) -> DataConfig:
    """Parse a data config (§4.2), with or without the model keys merged in (those are not read here)."""
    ctx = _Ctx(source, warnings if warnings is not None else [])
    node = _json_object(obj, path or "data config", source=source)
    ctx.unknown(node, (*DATA_KEYS, *MODEL_KEYS), path)
    return _parse_data(node, ctx, path)


def _parse_data(node: Mapping[str, object], ctx: _Ctx, path: str) -> DataConfig:
    src = ctx.source
    rbs_path = _join(path, "ReplayBuffers")
    raw_rbs = _json_list(_require(node, "ReplayBuffers", path, source=src), rbs_path, source=src)
    replay_buffers = tuple(_parse_replay_buffer(rb, f"{rbs_path}[{i}]", ctx) for i, rb in enumerate(raw_rbs))
    _check_unique([rb.id for rb in replay_buffers], rbs_path, ctx)

    schemas_path = _join(path, "Schemas")
    schemas = _json_object(_require(node, "Schemas", path, source=src), schemas_path, source=src)
    ctx.unknown(schemas, ("Observations", "Actions"), schemas_path)
    observation_schemas = _parse_schema_list(schemas, "Observations", "observation", schemas_path, ctx)
    action_schemas = _parse_schema_list(schemas, "Actions", "action", schemas_path, ctx)
    return DataConfig(replay_buffers, observation_schemas, action_schemas)


def _check_unique(ids: list[int], path: str, ctx: _Ctx) -> None:
    if len(set(ids)) != len(ids):
        raise ConfigError(
            f"{ctx.where(path)} has duplicate Id values", field=path, expected="unique", actual=ids
        )


def _parse_replay_buffer(obj: object, path: str, ctx: _Ctx) -> ReplayBufferConfig:
    src = ctx.source
    node = _json_object(obj, path, source=src)

    def req_int(key: str) -> int:
        return _json_int(_require(node, key, path, source=src), f"{path}.{key}", source=src)

    values: dict[str, Any] = {
        "id": req_int("Id"),
        "max_episode_num": req_int("MaxEpisodeNum"),
        "max_step_num": req_int("MaxStepNum"),
    }
    for key, attr in _RB_FLAGS:
        if key in node:
            values[attr] = _json_bool(node[key], f"{path}.{key}", source=src)
        else:
            ctx.missing(f"{path}.{key}", False)
            values[attr] = False
    for key, attr in _STREAM_ATTRS.items():
        list_path = f"{path}.{key}"
        if key in node:
            raw = _json_list(node[key], list_path, source=src)
        elif key in _ESSENTIAL_STREAMS:
            raise ConfigError(
                f"{ctx.where(list_path)} is missing", field=list_path, expected="array", actual="missing"
            )
        else:
            ctx.missing(list_path, [])
            raw = []
        streams = tuple(
            _parse_stream(s, f"{list_path}[{i}]", key in _SCHEMALESS_STREAMS, ctx) for i, s in enumerate(raw)
        )
        _check_unique([s.id for s in streams], list_path, ctx)
        values[attr] = streams
    ctx.unknown(node, ("Id", "MaxEpisodeNum", "MaxStepNum", *(k for k, _ in _RB_FLAGS), *_STREAM_ATTRS), path)
    return ReplayBufferConfig(**values)


def _parse_stream(obj: object, path: str, schemaless: bool, ctx: _Ctx) -> StreamConfig:
    src = ctx.source
    node = _json_object(obj, path, source=src)
    stream_id = _json_int(_require(node, "Id", path, source=src), f"{path}.Id", source=src)
    if "Name" in node:
        name = _json_str(node["Name"], f"{path}.Name", source=src)
    else:
        ctx.missing(f"{path}.Name", "")
        name = ""
    schema_id: int | None = None
    if "SchemaId" in node or not schemaless:
        schema_id = _json_int(_require(node, "SchemaId", path, source=src), f"{path}.SchemaId", source=src)
    dims = _json_int(
        _require(node, "VectorDimensionNum", path, source=src), f"{path}.VectorDimensionNum", source=src
    )
    ctx.unknown(node, ("Id", "Name", "SchemaId", "VectorDimensionNum"), path)
    return StreamConfig(stream_id, name, schema_id, dims)


def _parse_schema_list(
    schemas: Mapping[str, object], key: str, role: Role, path: str, ctx: _Ctx
) -> tuple[SchemaEntry, ...]:
    src = ctx.source
    list_path = f"{path}.{key}"
    raw = _json_list(_require(schemas, key, path, source=src), list_path, source=src)
    entries = []
    for i, item in enumerate(raw):
        entry_path = f"{list_path}[{i}]"
        node = _json_object(item, entry_path, source=src)
        entry_id = _json_int(_require(node, "Id", entry_path, source=src), f"{entry_path}.Id", source=src)
        if "Name" in node:
            name = _json_str(node["Name"], f"{entry_path}.Name", source=src)
        else:
            ctx.missing(f"{entry_path}.Name", "")
            name = ""
        schema = parse_schema(
            _require(node, "Schema", entry_path, source=src),
            role,
            f"{entry_path}.Schema",
            ctx.warnings,
            source=src,
        )
        ctx.unknown(node, ("Id", "Name", "Schema"), entry_path)
        entries.append(SchemaEntry(entry_id, name, schema))
    _check_unique([e.id for e in entries], list_path, ctx)
    return tuple(entries)


def _stream_to_json(stream: StreamConfig) -> dict[str, object]:
    out: dict[str, object] = {"Id": stream.id, "Name": stream.name}
    if stream.schema_id is not None:
        out["SchemaId"] = stream.schema_id
    out["VectorDimensionNum"] = stream.vector_dimension_num
    return out


def _replay_buffer_to_json(rb: ReplayBufferConfig) -> dict[str, object]:
    out: dict[str, object] = {"Id": rb.id, "MaxEpisodeNum": rb.max_episode_num, "MaxStepNum": rb.max_step_num}
    for key, attr in _RB_FLAGS:
        out[key] = getattr(rb, attr)
    for key, attr in _STREAM_ATTRS.items():
        out[key] = [_stream_to_json(s) for s in getattr(rb, attr)]
    return out


def _schema_entries_to_json(entries: tuple[SchemaEntry, ...]) -> list[dict[str, object]]:
    return [{"Id": e.id, "Name": e.name, "Schema": schema_to_json(e.schema)} for e in entries]


def data_config_to_json(data: DataConfig, model: ModelConfig | None = None) -> dict[str, object]:
    """The data config the engine writes; with ``model``, its keys merged in (shared memory, socket)."""
    out: dict[str, object] = {
        "ReplayBuffers": [_replay_buffer_to_json(rb) for rb in data.replay_buffers],
        "Schemas": {
            "Observations": _schema_entries_to_json(data.observation_schemas),
            "Actions": _schema_entries_to_json(data.action_schemas),
        },
    }
    if model is not None:
        out.update(model_config_to_json(model))
    return out


# --------------------------------------------------------------------------------------------------
# Model config


def parse_model_config(
    obj: object, warnings: list[str] | None = None, *, path: str = "", source: str = "model-config.json"
) -> ModelConfig:
    """Parse a model config (§4.3), alone or merged into a data config (the data keys are not read here)."""
    ctx = _Ctx(source, warnings if warnings is not None else [])
    node = _json_object(obj, path or "model config", source=source)
    ctx.unknown(node, (*DATA_KEYS, *MODEL_KEYS), path)
    return _parse_model(node, ctx, path)


def _parse_model(node: Mapping[str, object], ctx: _Ctx, path: str) -> ModelConfig:
    src = ctx.source
    nets_path = _join(path, "Networks")
    raw = _json_list(_require(node, "Networks", path, source=src), nets_path, source=src)
    networks = tuple(_parse_network(n, f"{nets_path}[{i}]", ctx) for i, n in enumerate(raw))
    _check_unique([n.id for n in networks], nets_path, ctx)
    fm_path = _join(path, "FlowMatchingSettings")
    if "FlowMatchingSettings" in node:
        fm_obj = _json_object(node["FlowMatchingSettings"], fm_path, source=src)
        flow_matching = FlowMatchingSettings(
            **_read_fields(fm_obj, _FLOW_MATCHING_FIELDS, FlowMatchingSettings, fm_path, ctx)  # type: ignore[arg-type]
        )
        ctx.unknown(fm_obj, tuple(k for k, _, _ in _FLOW_MATCHING_FIELDS), fm_path)
    else:
        ctx.missing_object(fm_path)
        flow_matching = FlowMatchingSettings()
    if flow_matching.activation_function not in ACTIVATION_FUNCTIONS:
        ctx.warnings.append(
            f"{ctx.where(fm_path)}.ActivationFunction {flow_matching.activation_function!r} is not one of "
            f"{', '.join(ACTIVATION_FUNCTIONS)}; kept as given"
        )
    return ModelConfig(networks, flow_matching)


def _parse_network(obj: object, path: str, ctx: _Ctx) -> NetworkConfig:
    src = ctx.source
    node = _json_object(obj, path, source=src)
    net_id = _json_int(_require(node, "Id", path, source=src), f"{path}.Id", source=src)
    if "Name" in node:
        name = _json_str(node["Name"], f"{path}.Name", source=src)
    else:
        ctx.missing(f"{path}.Name", "")
        name = ""
    max_byte_num = _json_int(
        _require(node, "MaxByteNum", path, source=src),
        f"{path}.MaxByteNum",
        lo=SNAPSHOT_HEADER_BYTES + 1,
        source=src,
    )
    input_schema_id = output_schema_id = None
    if "InputSchemaId" in node:
        input_schema_id = _json_int(node["InputSchemaId"], f"{path}.InputSchemaId", source=src)
    if "OutputSchemaId" in node:
        output_schema_id = _json_int(node["OutputSchemaId"], f"{path}.OutputSchemaId", source=src)
    ctx.unknown(node, ("Id", "Name", "MaxByteNum", "InputSchemaId", "OutputSchemaId"), path)
    return NetworkConfig(net_id, name, max_byte_num, input_schema_id, output_schema_id)


def model_config_to_json(model: ModelConfig) -> dict[str, object]:
    """The model config object the engine writes (§4.3)."""
    networks = []
    for net in model.networks:
        item: dict[str, object] = {"Id": net.id, "Name": net.name, "MaxByteNum": net.max_byte_num}
        if net.input_schema_id is not None:
            item["InputSchemaId"] = net.input_schema_id
        if net.output_schema_id is not None:
            item["OutputSchemaId"] = net.output_schema_id
        networks.append(item)
    return {
        "Networks": networks,
        "FlowMatchingSettings": _write_fields(model.flow_matching, _FLOW_MATCHING_FIELDS),
    }


# --------------------------------------------------------------------------------------------------
# Shared-memory config

_GUID_FIELDS = ("EpisodeStartsGuid", "EpisodeLengthsGuid", "EpisodeCompletionModesGuid")
_GUID_LIST_FIELDS = (
    ("EpisodeFinalObservationsGuids", "episode_final_observations_guids"),
    ("EpisodeFinalMemoryStatesGuids", "episode_final_memory_states_guids"),
    ("ObservationsGuids", "observations_guids"),
    ("ActionsGuids", "actions_guids"),
    ("ActionModifiersGuids", "action_modifiers_guids"),
    ("MemoryStatesGuids", "memory_states_guids"),
    ("RewardsGuids", "rewards_guids"),
)


def parse_shared_memory_config(
    obj: object, warnings: list[str] | None = None, *, source: str = "shared-memory config"
) -> SharedMemoryConfig:
    """Parse ``shared-memory-<GUID>.json`` (§2.6). GUID strings are kept as written (protocol.guid parses)."""
    ctx = _Ctx(source, warnings if warnings is not None else [])
    node = _json_object(obj, "shared-memory config", source=source)
    raw_nets = _json_list(_require(node, "NetworkGuids", "", source=source), "NetworkGuids", source=source)
    network_guids = []
    for i, item in enumerate(raw_nets):
        p = f"NetworkGuids[{i}]"
        entry = _json_object(item, p, source=source)
        nid = _json_int(_require(entry, "NetworkId", p, source=source), f"{p}.NetworkId", source=source)
        guid = _json_str(_require(entry, "Guid", p, source=source), f"{p}.Guid", source=source)
        ctx.unknown(entry, ("NetworkId", "Guid"), p)
        network_guids.append((nid, guid))
    _check_unique([nid for nid, _ in network_guids], "NetworkGuids", ctx)

    raw_rbs = _json_list(_require(node, "ReplayBuffers", "", source=source), "ReplayBuffers", source=source)
    replay_buffers = []
    for i, item in enumerate(raw_rbs):
        p = f"ReplayBuffers[{i}]"
        entry = _json_object(item, p, source=source)
        starts = _json_str(
            _require(entry, "EpisodeStartsGuid", p, source=source), f"{p}.EpisodeStartsGuid", source=source
        )
        lengths = _json_str(
            _require(entry, "EpisodeLengthsGuid", p, source=source), f"{p}.EpisodeLengthsGuid", source=source
        )
        completions = ""
        if "EpisodeCompletionModesGuid" in entry:
            completions = _json_str(
                entry["EpisodeCompletionModesGuid"], f"{p}.EpisodeCompletionModesGuid", source=source
            )
        else:
            ctx.missing(f"{p}.EpisodeCompletionModesGuid", "")
        lists: dict[str, tuple[str, ...]] = {}
        for key, attr in _GUID_LIST_FIELDS:
            if key in entry:
                raw = _json_list(entry[key], f"{p}.{key}", source=source)
                lists[attr] = tuple(_json_str(g, f"{p}.{key}[{k}]", source=source) for k, g in enumerate(raw))
            else:
                ctx.missing(f"{p}.{key}", [])
                lists[attr] = ()
        ctx.unknown(entry, (*_GUID_FIELDS, *(k for k, _ in _GUID_LIST_FIELDS)), p)
        replay_buffers.append(ReplayBufferGuids(starts, lengths, completions, **lists))
    ctx.unknown(node, ("NetworkGuids", "ReplayBuffers"), "")
    return SharedMemoryConfig(tuple(network_guids), tuple(replay_buffers))


def shared_memory_config_to_json(cfg: SharedMemoryConfig) -> dict[str, object]:
    """``shared-memory-<GUID>.json`` as the engine writes it (§2.6)."""
    return {
        "NetworkGuids": [{"NetworkId": nid, "Guid": guid} for nid, guid in cfg.network_guids],
        "ReplayBuffers": [
            {
                "EpisodeStartsGuid": rb.episode_starts_guid,
                "EpisodeLengthsGuid": rb.episode_lengths_guid,
                "EpisodeCompletionModesGuid": rb.episode_completion_modes_guid,
                **{key: list(getattr(rb, attr)) for key, attr in _GUID_LIST_FIELDS},
            }
            for rb in cfg.replay_buffers
        ],
    }


def check_shared_memory_config(session: SessionConfig, shm: SharedMemoryConfig) -> None:
    """Check that ``shm`` names a region for every network and every allocated replay-buffer stream.

    The replay buffer with Id ``i`` uses ``shm.replay_buffers[i]`` (array index = id, §2.6).
    """
    for net in session.model.networks:
        shm.network_guid(net.id)
    for rb in session.data.replay_buffers:
        p = f"ReplayBuffers[{rb.id}]"
        if rb.id >= len(shm.replay_buffers):
            raise ConfigError(
                f"shared-memory config has no entry {p} for replay buffer {rb.id}",
                field=p,
                expected=rb.id + 1,
                actual=len(shm.replay_buffers),
            )
        guids = shm.replay_buffers[rb.id]
        expected = {
            "EpisodeFinalObservationsGuids": len(rb.observations) if rb.has_final_observations else None,
            "EpisodeFinalMemoryStatesGuids": len(rb.memory_states) if rb.has_final_memory_states else None,
            "ObservationsGuids": len(rb.observations),
            "ActionsGuids": len(rb.actions),
            "ActionModifiersGuids": len(rb.action_modifiers),
            "MemoryStatesGuids": len(rb.memory_states),
            "RewardsGuids": len(rb.rewards),
        }
        for key, attr in _GUID_LIST_FIELDS:
            want = expected[key]
            have = len(getattr(guids, attr))
            # Unflagged final-state lists are empty in 5.8 (§10 item 10); any count is harmless there.
            if want is not None and have != want:
                raise ConfigError(
                    f"shared-memory config {p}.{key} has {have} GUIDs but the data config has {want} streams",
                    field=f"{p}.{key}",
                    expected=want,
                    actual=have,
                )


# --------------------------------------------------------------------------------------------------
# Assemblies


def session_from_shared_memory(trainer_obj: object, data_obj: object) -> SessionConfig:
    """Shared-memory transport: ``trainer-config.json`` and ``data-config.json`` (model keys merged in)."""
    warnings: list[str] = []
    trainer = _parse_trainer(trainer_obj, _Ctx("trainer-config.json", warnings), "", True)
    ctx = _Ctx("data-config.json", warnings)
    node = _json_object(data_obj, "data config", source=ctx.source)
    ctx.unknown(node, (*DATA_KEYS, *MODEL_KEYS), "")
    data = _parse_data(node, ctx, "")
    model = _parse_model(node, ctx, "")
    _cross_check(trainer, data, model, ctx, ctx)
    return SessionConfig(trainer, data, model, tuple(warnings))


def session_from_socket(obj: object) -> SessionConfig:
    """Socket transport: one object = data + model keys + ``"TrainerSettings"`` (no TempDirectory, §3)."""
    warnings: list[str] = []
    ctx = _Ctx("socket config", warnings)
    node = _json_object(obj, "socket config", source=ctx.source)
    ctx.unknown(node, (*DATA_KEYS, *MODEL_KEYS, "TrainerSettings"), "")
    if "TrainerSettings" in node:
        trainer = _parse_trainer(node["TrainerSettings"], ctx, "TrainerSettings", False)
    else:
        ctx.missing_object("TrainerSettings")
        trainer = _parse_trainer({}, _Ctx(ctx.source, []), "TrainerSettings", False)
    data = _parse_data(node, ctx, "")
    model = _parse_model(node, ctx, "")
    _cross_check(trainer, data, model, ctx, ctx)
    return SessionConfig(trainer, data, model, tuple(warnings))


def session_from_files(trainer_obj: object, data_obj: object, model_obj: object) -> SessionConfig:
    """TrainingMaterials export (§5.5): ``trainer-config.json``, ``ReplayBuffers/data-config.json`` and
    ``Networks/model-config.json``, each its own object."""
    warnings: list[str] = []
    trainer = _parse_trainer(trainer_obj, _Ctx("trainer-config.json", warnings), "", True)
    data_ctx = _Ctx("ReplayBuffers/data-config.json", warnings)
    data_node = _json_object(data_obj, "data config", source=data_ctx.source)
    data_ctx.unknown(data_node, DATA_KEYS, "")
    data = _parse_data(data_node, data_ctx, "")
    model_ctx = _Ctx("Networks/model-config.json", warnings)
    model_node = _json_object(model_obj, "model config", source=model_ctx.source)
    model_ctx.unknown(model_node, MODEL_KEYS, "")
    model = _parse_model(model_node, model_ctx, "")
    _cross_check(trainer, data, model, data_ctx, model_ctx)
    return SessionConfig(trainer, data, model, tuple(warnings))


def socket_config_to_json(session: SessionConfig) -> dict[str, object]:
    """The socket config object (§3): data + model keys + ``TrainerSettings`` without TempDirectory."""
    out = data_config_to_json(session.data, session.model)
    out["TrainerSettings"] = trainer_config_to_json(session.trainer, include_temp_directory=False)
    return out


def _cross_check(
    trainer: TrainerConfig, data: DataConfig, model: ModelConfig, data_ctx: _Ctx, model_ctx: _Ctx
) -> None:
    """Checks that need more than one object: stream widths against schemas, schema ids, network ids."""
    schemas: dict[str, tuple[tuple[SchemaEntry, ...], str]] = {
        "Observations": (data.observation_schemas, "observation"),
        "Actions": (data.action_schemas, "action"),
        # [INF] Modifier streams name an action schema; their width (ModifierSize?) is not verified, so
        # only the schema id is checked for them.
        "ActionModifiers": (data.action_schemas, "action"),
    }
    for i, rb in enumerate(data.replay_buffers):
        for kind, (entries, role) in schemas.items():
            for k, stream in enumerate(getattr(rb, _STREAM_ATTRS[kind])):
                p = f"ReplayBuffers[{i}].{kind}[{k}]"
                entry = next((e for e in entries if e.id == stream.schema_id), None)
                if entry is None:
                    raise ConfigError(
                        f"{data_ctx.where(p)}.SchemaId is {stream.schema_id} but no {role} schema has that Id",
                        field=f"{p}.SchemaId",
                        expected=[e.id for e in entries],
                        actual=stream.schema_id,
                    )
                if kind != "ActionModifiers" and stream.vector_dimension_num != entry.schema.vector_size:
                    raise ConfigError(
                        f"{data_ctx.where(p)}.VectorDimensionNum is {stream.vector_dimension_num} but the {role} "
                        f"schema {entry.name!r} has VectorSize {entry.schema.vector_size}",
                        field=f"{p}.VectorDimensionNum",
                        expected=entry.schema.vector_size,
                        actual=stream.vector_dimension_num,
                    )
    for i, net in enumerate(model.networks):
        p = f"Networks[{i}]"
        if net.input_schema_id is not None and all(
            e.id != net.input_schema_id for e in data.observation_schemas
        ):
            raise ConfigError(
                f"{model_ctx.where(p)}.InputSchemaId is {net.input_schema_id} but no observation schema has that Id",
                field=f"{p}.InputSchemaId",
                actual=net.input_schema_id,
            )
        if net.output_schema_id is not None and all(
            e.id != net.output_schema_id for e in data.action_schemas
        ):
            raise ConfigError(
                f"{model_ctx.where(p)}.OutputSchemaId is {net.output_schema_id} but no action schema has that Id",
                field=f"{p}.OutputSchemaId",
                actual=net.output_schema_id,
            )
    if trainer.trainer_method == "FlowMatching":
        ids = [n.id for n in model.networks]
        missing = [i for i in FLOW_MATCHING_NETWORK_IDS if i not in ids]
        if missing:
            raise ConfigError(
                f"{model_ctx.where('Networks')} lacks the flow-matching network ids {missing} "
                "(0 denoiser, 1 encoder, 2 decoder)",
                field="Networks",
                expected=list(FLOW_MATCHING_NETWORK_IDS),
                actual=ids,
            )
        # One replay buffer with one observation and one action stream (§2.2).
        if not data.replay_buffers:
            raise ConfigError(
                f"{data_ctx.where('ReplayBuffers')} is empty; flow matching needs one replay buffer",
                field="ReplayBuffers",
                expected=">= 1",
                actual=0,
            )
        for kind in _ESSENTIAL_STREAMS:
            count = len(getattr(data.replay_buffers[0], _STREAM_ATTRS[kind]))
            if count != 1:
                raise ConfigError(
                    f"{data_ctx.where(f'ReplayBuffers[0].{kind}')} has {count} streams; flow matching needs exactly 1",
                    field=f"ReplayBuffers[0].{kind}",
                    expected=1,
                    actual=count,
                )
