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

The package, one module per part: ``values`` (the dataclasses), ``json_text`` (bytes ↔ JSON values),
``fields`` (the field tables every parser and encoder shares), ``trainer``, ``data``, ``model``,
``shared_memory`` (parse and encode each object) and ``session`` (the assemblies). Import from here.
"""

from __future__ import annotations

from protocol.config.data import data_config_to_json, parse_data_config
from protocol.config.json_text import MAX_JSON_DEPTH, dump_json, engine_json_bytes, parse_json
from protocol.config.model import (
    ACTIVATION_FUNCTIONS,
    model_config_to_json,
    parse_model_config,
)
from protocol.config.session import (
    session_from_files,
    session_from_shared_memory,
    session_from_socket,
    socket_config_to_json,
)
from protocol.config.shared_memory import (
    check_shared_memory_config,
    parse_shared_memory_config,
    shared_memory_config_to_json,
)
from protocol.config.trainer import DEVICES, parse_trainer_config, trainer_config_to_json
from protocol.config.values import (
    DATA_KEYS,
    MODEL_KEYS,
    DataConfig,
    FlowMatchingSettings,
    FlowMatchingTrainingSettings,
    ModelConfig,
    NetworkConfig,
    ReplayBufferConfig,
    ReplayBufferGuids,
    SchemaEntry,
    SessionConfig,
    SharedMemoryConfig,
    StreamConfig,
    TrainerConfig,
)

__all__ = [
    "ACTIVATION_FUNCTIONS",
    "DATA_KEYS",
    "DEVICES",
    "MAX_JSON_DEPTH",
    "MODEL_KEYS",
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
    "engine_json_bytes",
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
