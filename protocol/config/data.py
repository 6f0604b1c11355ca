"""The data config (spec §4.2): replay buffers with their streams, and the schemas; parse and encode.

The file transport sends it as ``ReplayBuffers/data-config.json``; shared memory and the socket merge the
model config's keys into the same object (:func:`data_config_to_json` with ``model``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from protocol.config.fields import ParseContext, check_unique, join_path
from protocol.config.model import model_config_to_json
from protocol.config.values import (
    DATA_KEYS,
    ESSENTIAL_STREAMS,
    MODEL_KEYS,
    STREAM_ATTRS,
    DataConfig,
    ModelConfig,
    ReplayBufferConfig,
    SchemaEntry,
    StreamConfig,
)
from protocol.errors import ConfigError
from protocol.json_fields import json_bool, json_int, json_list, json_object, json_str, require
from protocol.schema import Role, parse_schema, schema_to_json

__all__ = ["data_config_to_json", "parse_data_config", "read_data"]

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
    ctx = ParseContext(source, warnings if warnings is not None else [])
    node = json_object(obj, path or "data config", source=source)
    ctx.unknown(node, (*DATA_KEYS, *MODEL_KEYS), path)
    return read_data(node, ctx, path)


def read_data(node: Mapping[str, object], ctx: ParseContext, path: str) -> DataConfig:
    """The data keys of ``node`` within a parse that is already under way (the assemblies)."""
    src = ctx.source
    rbs_path = join_path(path, "ReplayBuffers")
    raw_rbs = json_list(require(node, "ReplayBuffers", path, source=src), rbs_path, source=src)
    replay_buffers = tuple(_parse_replay_buffer(rb, f"{rbs_path}[{i}]", ctx) for i, rb in enumerate(raw_rbs))
    check_unique([rb.id for rb in replay_buffers], rbs_path, ctx)

    schemas_path = join_path(path, "Schemas")
    schemas = json_object(require(node, "Schemas", path, source=src), schemas_path, source=src)
    ctx.unknown(schemas, ("Observations", "Actions"), schemas_path)
    observation_schemas = _parse_schema_list(schemas, "Observations", "observation", schemas_path, ctx)
    action_schemas = _parse_schema_list(schemas, "Actions", "action", schemas_path, ctx)
    return DataConfig(replay_buffers, observation_schemas, action_schemas)


def _parse_replay_buffer(obj: object, path: str, ctx: ParseContext) -> ReplayBufferConfig:
    src = ctx.source
    node = json_object(obj, path, source=src)

    def req_int(key: str) -> int:
        return json_int(require(node, key, path, source=src), f"{path}.{key}", source=src)

    values: dict[str, Any] = {
        "id": req_int("Id"),
        "max_episode_num": req_int("MaxEpisodeNum"),
        "max_step_num": req_int("MaxStepNum"),
    }
    for key, attr in _RB_FLAGS:
        if key in node:
            values[attr] = json_bool(node[key], f"{path}.{key}", source=src)
        else:
            ctx.missing(f"{path}.{key}", False)
            values[attr] = False
    for key, attr in STREAM_ATTRS.items():
        list_path = f"{path}.{key}"
        if key in node:
            raw = json_list(node[key], list_path, source=src)
        elif key in ESSENTIAL_STREAMS:
            raise ConfigError(
                f"{ctx.where(list_path)} is missing", field=list_path, expected="array", actual="missing"
            )
        else:
            ctx.missing(list_path, [])
            raw = []
        streams = tuple(
            _parse_stream(s, f"{list_path}[{i}]", key in _SCHEMALESS_STREAMS, ctx) for i, s in enumerate(raw)
        )
        check_unique([s.id for s in streams], list_path, ctx)
        values[attr] = streams
    ctx.unknown(node, ("Id", "MaxEpisodeNum", "MaxStepNum", *(k for k, _ in _RB_FLAGS), *STREAM_ATTRS), path)
    return ReplayBufferConfig(**values)


def _parse_stream(obj: object, path: str, schemaless: bool, ctx: ParseContext) -> StreamConfig:
    src = ctx.source
    node = json_object(obj, path, source=src)
    stream_id = json_int(require(node, "Id", path, source=src), f"{path}.Id", source=src)
    if "Name" in node:
        name = json_str(node["Name"], f"{path}.Name", source=src)
    else:
        ctx.missing(f"{path}.Name", "")
        name = ""
    schema_id: int | None = None
    if "SchemaId" in node or not schemaless:
        schema_id = json_int(require(node, "SchemaId", path, source=src), f"{path}.SchemaId", source=src)
    dims = json_int(
        require(node, "VectorDimensionNum", path, source=src), f"{path}.VectorDimensionNum", source=src
    )
    ctx.unknown(node, ("Id", "Name", "SchemaId", "VectorDimensionNum"), path)
    return StreamConfig(stream_id, name, schema_id, dims)


def _parse_schema_list(
    schemas: Mapping[str, object], key: str, role: Role, path: str, ctx: ParseContext
) -> tuple[SchemaEntry, ...]:
    src = ctx.source
    list_path = f"{path}.{key}"
    raw = json_list(require(schemas, key, path, source=src), list_path, source=src)
    entries = []
    for i, item in enumerate(raw):
        entry_path = f"{list_path}[{i}]"
        node = json_object(item, entry_path, source=src)
        entry_id = json_int(require(node, "Id", entry_path, source=src), f"{entry_path}.Id", source=src)
        if "Name" in node:
            name = json_str(node["Name"], f"{entry_path}.Name", source=src)
        else:
            ctx.missing(f"{entry_path}.Name", "")
            name = ""
        schema = parse_schema(
            require(node, "Schema", entry_path, source=src),
            role,
            f"{entry_path}.Schema",
            ctx.warnings,
            source=src,
        )
        ctx.unknown(node, ("Id", "Name", "Schema"), entry_path)
        entries.append(SchemaEntry(entry_id, name, schema))
    check_unique([e.id for e in entries], list_path, ctx)
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
    for key, attr in STREAM_ATTRS.items():
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
