"""The model config (spec §4.3): the networks and the flow-matching settings; parse and encode.

The file transport sends it as ``Networks/model-config.json``; shared memory and the socket merge its
keys into the data config's object.
"""

from __future__ import annotations

from collections.abc import Mapping

from protocol.config.fields import (
    FieldTable,
    ParseContext,
    check_unique,
    int_reader,
    join_path,
    read_fields,
    str_reader,
    write_fields,
)
from protocol.config.values import DATA_KEYS, MODEL_KEYS, FlowMatchingSettings, ModelConfig, NetworkConfig
from protocol.json_fields import json_int, json_list, json_object, json_str, require
from protocol.snapshot import HEADER_BYTES

__all__ = [
    "ACTIVATION_FUNCTIONS",
    "model_config_to_json",
    "parse_model_config",
    "read_model",
]

ACTIVATION_FUNCTIONS = ("ELU", "ReLU", "TanH", "GELU")
"""The ``FlowMatchingSettings.ActivationFunction`` values the engine offers (§4.3)."""

_FLOW_MATCHING_FIELDS: FieldTable = (
    ("ActionChunkSize", "action_chunk_size", int_reader(lo=1)),
    ("HiddenLayerNum", "hidden_layer_num", int_reader()),
    ("HiddenLayerSize", "hidden_layer_size", int_reader(lo=1)),
    ("ActivationFunction", "activation_function", str_reader),
)


def parse_model_config(
    obj: object, warnings: list[str] | None = None, *, path: str = "", source: str = "model-config.json"
) -> ModelConfig:
    """Parse a model config (§4.3), alone or merged into a data config (the data keys are not read here)."""
    ctx = ParseContext(source, warnings if warnings is not None else [])
    node = json_object(obj, path or "model config", source=source)
    ctx.unknown(node, (*DATA_KEYS, *MODEL_KEYS), path)
    return read_model(node, ctx, path)


def read_model(node: Mapping[str, object], ctx: ParseContext, path: str) -> ModelConfig:
    """The model keys of ``node`` within a parse that is already under way (the assemblies)."""
    src = ctx.source
    nets_path = join_path(path, "Networks")
    raw = json_list(require(node, "Networks", path, source=src), nets_path, source=src)
    networks = tuple(_parse_network(n, f"{nets_path}[{i}]", ctx) for i, n in enumerate(raw))
    check_unique([n.id for n in networks], nets_path, ctx)
    fm_path = join_path(path, "FlowMatchingSettings")
    if "FlowMatchingSettings" in node:
        fm_obj = json_object(node["FlowMatchingSettings"], fm_path, source=src)
        flow_matching = FlowMatchingSettings(
            **read_fields(fm_obj, _FLOW_MATCHING_FIELDS, FlowMatchingSettings, fm_path, ctx)  # type: ignore[arg-type]
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


def _parse_network(obj: object, path: str, ctx: ParseContext) -> NetworkConfig:
    src = ctx.source
    node = json_object(obj, path, source=src)
    net_id = json_int(require(node, "Id", path, source=src), f"{path}.Id", source=src)
    if "Name" in node:
        name = json_str(node["Name"], f"{path}.Name", source=src)
    else:
        ctx.missing(f"{path}.Name", "")
        name = ""
    max_byte_num = json_int(
        require(node, "MaxByteNum", path, source=src),
        f"{path}.MaxByteNum",
        lo=HEADER_BYTES + 1,  # a 24-byte header and a non-empty model blob (§6.1, §10 item 6)
        source=src,
    )
    input_schema_id = output_schema_id = None
    if "InputSchemaId" in node:
        input_schema_id = json_int(node["InputSchemaId"], f"{path}.InputSchemaId", source=src)
    if "OutputSchemaId" in node:
        output_schema_id = json_int(node["OutputSchemaId"], f"{path}.OutputSchemaId", source=src)
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
        "FlowMatchingSettings": write_fields(model.flow_matching, _FLOW_MATCHING_FIELDS),
    }
