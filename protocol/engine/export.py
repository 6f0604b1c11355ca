"""The engine's TrainingMaterials export (spec §5.5) as files: relative path -> bytes.

``ExportToFile`` writes, into ``<IntermediatePath>/TrainingMaterials/<YYYYmmddHHMMSS>/``, only the parts its
``ETrainerExportFlags`` choose::

    trainer-config.json                     trainer config with TempDirectory
    ReplayBuffers/data-config.json          data config only (model keys not merged)
    ReplayBuffers/replaybuffer_<id>.bin     int32 id, E, S, starts[E], lengths[E], obs..., act...
    Networks/model-config.json
    Networks/network_<id>.bin               raw snapshot bytes (ids 0 denoiser, 1 encoder, 2 decoder)

:func:`encode_training_materials` produces those files' bytes; whoever writes them (the game-side
emulator, ``la-trainer record``) adds the folder and writes each file atomically, as the engine does with
its ``<name>.tmp`` then rename.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from enum import Enum

from protocol.config import (
    SessionConfig,
    data_config_to_json,
    engine_json_bytes,
    model_config_to_json,
    trainer_config_to_json,
)
from protocol.replay import ReplayBuffer, ReplayLayout

__all__ = [
    "ALL_EXPORT_FLAGS",
    "DATA_CONFIG",
    "MODEL_CONFIG",
    "NETWORKS_DIR",
    "REPLAY_BUFFERS_DIR",
    "TRAINER_CONFIG",
    "TRAINING_MATERIALS_DIR",
    "ExportFlags",
    "encode_training_materials",
    "export_folder_name",
    "network_file",
    "replay_buffer_file",
]

TRAINING_MATERIALS_DIR = "TrainingMaterials"
"""The folder under the engine's IntermediatePath that holds one folder per export."""
TRAINER_CONFIG = "trainer-config.json"
REPLAY_BUFFERS_DIR = "ReplayBuffers"
NETWORKS_DIR = "Networks"
DATA_CONFIG = f"{REPLAY_BUFFERS_DIR}/data-config.json"
MODEL_CONFIG = f"{NETWORKS_DIR}/model-config.json"


class ExportFlags(Enum):
    """``ETrainerExportFlags``: which parts an export writes."""

    REPLAY_BUFFERS = "ReplayBuffers"
    """The data config and the replay buffer file."""
    NETWORKS = "Networks"
    """The model config and one snapshot file per network."""
    TRAINER_CONFIG = "TrainerConfig"
    """The trainer config."""


ALL_EXPORT_FLAGS = frozenset(ExportFlags)
"""Every part: what a trainer needs to train from the export."""


def export_folder_name(now: datetime) -> str:
    """The name of the export folder made at ``now``: ``YYYYmmddHHMMSS`` (fixed width: name order is time
    order)."""
    return now.strftime("%Y%m%d%H%M%S")


def network_file(network_id: int) -> str:
    """``Networks/network_<id>.bin``."""
    return f"{NETWORKS_DIR}/network_{network_id}.bin"


def replay_buffer_file(replay_buffer_id: int) -> str:
    """``ReplayBuffers/replaybuffer_<id>.bin``."""
    return f"{REPLAY_BUFFERS_DIR}/replaybuffer_{replay_buffer_id}.bin"


def encode_training_materials(
    session: SessionConfig,
    networks: Mapping[int, bytes],
    replay_buffer: ReplayBuffer,
    *,
    flags: frozenset[ExportFlags] = ALL_EXPORT_FLAGS,
) -> dict[str, bytes]:
    """The files of one export, by path relative to the export folder ('/'-separated), in the order the
    engine writes them.

    ``trainer-config.json`` carries ``session.trainer.temp_directory`` as its TempDirectory (the engine
    writes its IntermediatePath there); the data config has no model keys; the replay file holds only
    starts, lengths, observations and actions. ``networks``: snapshot bytes per network id.

    Raises:
        ConfigError: the data config has no replay buffer with ``replay_buffer``'s id.
        ReplayError: ``replay_buffer`` does not fit its config.
    """
    files: dict[str, bytes] = {}
    if ExportFlags.TRAINER_CONFIG in flags:
        files[TRAINER_CONFIG] = engine_json_bytes(trainer_config_to_json(session.trainer, True))
    if ExportFlags.REPLAY_BUFFERS in flags:
        files[DATA_CONFIG] = engine_json_bytes(data_config_to_json(session.data))
        layout = ReplayLayout.from_config(session.replay_buffer(replay_buffer.replay_buffer_id))
        files[replay_buffer_file(replay_buffer.replay_buffer_id)] = layout.encode_file(replay_buffer)
    if ExportFlags.NETWORKS in flags:
        files[MODEL_CONFIG] = engine_json_bytes(model_config_to_json(session.model))
        for network_id, data in sorted(networks.items()):
            files[network_file(network_id)] = bytes(data)
    return files
