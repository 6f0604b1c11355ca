"""One :class:`~protocol.config.SessionConfig` per transport, from the objects the engine sends (spec §3, §4, §5.5).

* shared memory: ``trainer-config.json`` (+ ``TempDirectory``) and ``data-config.json`` (data keys with
  the model keys merged in) → :func:`session_from_shared_memory`;
* socket: one object = data + model keys + ``"TrainerSettings"`` (no ``TempDirectory``) →
  :func:`session_from_socket`;
* TrainingMaterials export: three separate files → :func:`session_from_files`.

Each assembly parses the parts and then checks what needs more than one of them (stream widths against
schemas, schema and network ids); all parts share one list of warnings.
"""

from __future__ import annotations

from protocol.config.data import data_config_to_json, read_data
from protocol.config.fields import ParseContext
from protocol.config.model import read_model
from protocol.config.trainer import read_trainer, trainer_config_to_json
from protocol.config.values import (
    DATA_KEYS,
    ESSENTIAL_STREAMS,
    MODEL_KEYS,
    STREAM_ATTRS,
    DataConfig,
    ModelConfig,
    SchemaEntry,
    SessionConfig,
    TrainerConfig,
)
from protocol.errors import ConfigError
from protocol.json_fields import json_object
from protocol.names import FLOW_MATCHING, NetworkId

__all__ = ["session_from_files", "session_from_shared_memory", "session_from_socket", "socket_config_to_json"]


def session_from_shared_memory(trainer_obj: object, data_obj: object) -> SessionConfig:
    """Shared-memory transport: ``trainer-config.json`` and ``data-config.json`` (model keys merged in)."""
    warnings: list[str] = []
    trainer = read_trainer(trainer_obj, ParseContext("trainer-config.json", warnings), "", True)
    ctx = ParseContext("data-config.json", warnings)
    node = json_object(data_obj, "data config", source=ctx.source)
    ctx.unknown(node, (*DATA_KEYS, *MODEL_KEYS), "")
    data = read_data(node, ctx, "")
    model = read_model(node, ctx, "")
    _cross_check(trainer, data, model, ctx, ctx)
    return SessionConfig(trainer, data, model, tuple(warnings))


def session_from_socket(obj: object) -> SessionConfig:
    """Socket transport: one object = data + model keys + ``"TrainerSettings"`` (no TempDirectory, §3)."""
    warnings: list[str] = []
    ctx = ParseContext("socket config", warnings)
    node = json_object(obj, "socket config", source=ctx.source)
    ctx.unknown(node, (*DATA_KEYS, *MODEL_KEYS, "TrainerSettings"), "")
    if "TrainerSettings" in node:
        trainer = read_trainer(node["TrainerSettings"], ctx, "TrainerSettings", False)
    else:
        ctx.missing_object("TrainerSettings")
        trainer = read_trainer({}, ParseContext(ctx.source, []), "TrainerSettings", False)
    data = read_data(node, ctx, "")
    model = read_model(node, ctx, "")
    _cross_check(trainer, data, model, ctx, ctx)
    return SessionConfig(trainer, data, model, tuple(warnings))


def session_from_files(trainer_obj: object, data_obj: object, model_obj: object) -> SessionConfig:
    """TrainingMaterials export (§5.5): ``trainer-config.json``, ``ReplayBuffers/data-config.json`` and
    ``Networks/model-config.json``, each its own object."""
    warnings: list[str] = []
    trainer = read_trainer(trainer_obj, ParseContext("trainer-config.json", warnings), "", True)
    data_ctx = ParseContext("ReplayBuffers/data-config.json", warnings)
    data_node = json_object(data_obj, "data config", source=data_ctx.source)
    data_ctx.unknown(data_node, DATA_KEYS, "")
    data = read_data(data_node, data_ctx, "")
    model_ctx = ParseContext("Networks/model-config.json", warnings)
    model_node = json_object(model_obj, "model config", source=model_ctx.source)
    model_ctx.unknown(model_node, MODEL_KEYS, "")
    model = read_model(model_node, model_ctx, "")
    _cross_check(trainer, data, model, data_ctx, model_ctx)
    return SessionConfig(trainer, data, model, tuple(warnings))


def socket_config_to_json(session: SessionConfig) -> dict[str, object]:
    """The socket config object (§3): data + model keys + ``TrainerSettings`` without TempDirectory."""
    out = data_config_to_json(session.data, session.model)
    out["TrainerSettings"] = trainer_config_to_json(session.trainer, include_temp_directory=False)
    return out


def _cross_check(
    trainer: TrainerConfig,
    data: DataConfig,
    model: ModelConfig,
    data_ctx: ParseContext,
    model_ctx: ParseContext,
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
            for k, stream in enumerate(getattr(rb, STREAM_ATTRS[kind])):
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
    if trainer.trainer_method == FLOW_MATCHING:
        ids = [n.id for n in model.networks]
        missing = [int(i) for i in NetworkId if i not in ids]
        if missing:
            raise ConfigError(
                f"{model_ctx.where('Networks')} lacks the flow-matching network ids {missing} "
                f"({', '.join(f'{int(n)} {n.role}' for n in NetworkId)})",
                field="Networks",
                expected=[int(n) for n in NetworkId],
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
        for kind in ESSENTIAL_STREAMS:
            count = len(getattr(data.replay_buffers[0], STREAM_ATTRS[kind]))
            if count != 1:
                raise ConfigError(
                    f"{data_ctx.where(f'ReplayBuffers[0].{kind}')} has {count} streams; flow matching needs exactly 1",
                    field=f"ReplayBuffers[0].{kind}",
                    expected=1,
                    actual=count,
                )
