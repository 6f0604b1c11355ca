"""The offline transport: the engine's ``TrainingMaterials`` export folder (spec §5.5).

Layout of one export (``<IntermediatePath>/TrainingMaterials/<YYYYmmddHHMMSS>/``)::

    trainer-config.json
    ReplayBuffers/data-config.json          data config only (model keys not merged)
    ReplayBuffers/replaybuffer_<id>.bin     int32 id, E, S, starts[E], lengths[E], obs..., act...
    Networks/model-config.json
    Networks/network_<id>.bin               raw snapshot bytes (ids 0 denoiser, 1 encoder, 2 decoder)

The engine writes ``<name>.tmp`` then renames; trained networks go out through
:func:`trainer.system.atomic.atomic_write`, which does the same and also fsyncs, so a crash never leaves
a half-written network where the engine or a user would pick it up.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from protocol.config import SessionConfig, parse_json, session_from_files
from protocol.replay import ReplayBuffer, ReplayLayout
from trainer.errors import BadData, LaunchError
from trainer.system.atomic import atomic_write_all

__all__ = [
    "CONFIG_FILE_LIMIT",
    "DATA_CONFIG",
    "MAX_REPLAY_FILE_BYTES",
    "MODEL_CONFIG",
    "NETWORKS_DIR",
    "REPLAY_BUFFERS_DIR",
    "TRAINER_CONFIG",
    "TRAINING_MATERIALS_DIR",
    "TrainingMaterials",
    "find_training_materials",
    "network_path",
    "read_training_materials",
    "replay_buffer_path",
    "write_network_files",
]

TRAINING_MATERIALS_DIR = "TrainingMaterials"
TRAINER_CONFIG = "trainer-config.json"
REPLAY_BUFFERS_DIR = "ReplayBuffers"
NETWORKS_DIR = "Networks"
DATA_CONFIG = f"{REPLAY_BUFFERS_DIR}/data-config.json"
MODEL_CONFIG = f"{NETWORKS_DIR}/model-config.json"

_STAMP = re.compile(r"^\d{14}$")
"""An export folder name: ``YYYYmmddHHMMSS`` (fixed width, so name order is time order)."""

MAX_REPLAY_FILE_BYTES = 1 << 40
"""Sanity bound on one ``replaybuffer_<id>.bin`` (1 TiB); the layout then checks the exact size."""

CONFIG_FILE_LIMIT = 256 * 1024 * 1024
"""Largest config JSON file read from an export or a config folder (bytes); real ones are kilobytes."""

_REQUIRED = (TRAINER_CONFIG, DATA_CONFIG, MODEL_CONFIG)
"""Files an export must hold for training (the export flags may leave parts out, spec §5.5)."""


def network_path(folder: Path, network_id: int) -> Path:
    """``<folder>/Networks/network_<id>.bin``."""
    return folder / NETWORKS_DIR / f"network_{network_id}.bin"


def replay_buffer_path(folder: Path, replay_buffer_id: int) -> Path:
    """``<folder>/ReplayBuffers/replaybuffer_<id>.bin``."""
    return folder / REPLAY_BUFFERS_DIR / f"replaybuffer_{replay_buffer_id}.bin"


def find_training_materials(path: str | os.PathLike[str]) -> Path:
    """The export folder to train from.

    ``path`` may be one export (``.../TrainingMaterials/20250101120000``), the ``TrainingMaterials``
    folder (the newest stamp is chosen), or the folder above it (the engine's IntermediatePath).

    Raises:
        LaunchError: nothing usable there; the message lists what is missing.
    """
    root = Path(path)
    if not root.is_dir():
        raise LaunchError(f"the training-materials folder {str(root)!r} does not exist or is not a folder")
    folder = root
    if not _looks_like_export(root):
        parent = root / TRAINING_MATERIALS_DIR if (root / TRAINING_MATERIALS_DIR).is_dir() else root
        stamps = sorted(p for p in parent.iterdir() if p.is_dir() and _STAMP.match(p.name))
        if not stamps:
            raise LaunchError(
                f"{str(root)!r} holds neither an engine export (trainer-config.json, ReplayBuffers/, "
                "Networks/) nor export folders named YYYYmmddHHMMSS. Point the trainer at "
                "<Project>/Intermediate/LearningCore/TrainingMaterials or one export inside it."
            )
        folder = stamps[-1]
    missing = [name for name in _REQUIRED if not (folder / name).is_file()]
    if not any(folder.glob(f"{REPLAY_BUFFERS_DIR}/replaybuffer_*.bin")):
        missing.append(f"{REPLAY_BUFFERS_DIR}/replaybuffer_<id>.bin")
    if not any(folder.glob(f"{NETWORKS_DIR}/network_*.bin")):
        missing.append(f"{NETWORKS_DIR}/network_<id>.bin")
    if missing:
        raise LaunchError(
            f"the export {str(folder)!r} is incomplete; missing: {', '.join(missing)}. Export again "
            "with the ReplayBuffers, Networks and TrainerConfig flags all set."
        )
    return folder


def _looks_like_export(folder: Path) -> bool:
    return any((folder / name).exists() for name in (TRAINER_CONFIG, REPLAY_BUFFERS_DIR, NETWORKS_DIR))


def write_network_files(folder: str | os.PathLike[str], networks: Mapping[int, bytes]) -> None:
    """Write ``Networks/network_<id>.bin`` for each network, each atomically (same bytes as the wire), as
    one set: all are written before any replaces its file, so a failed write (a full disk) leaves the
    previous set whole (:func:`trainer.system.atomic.atomic_write_all`)."""
    root = Path(folder)
    (root / NETWORKS_DIR).mkdir(parents=True, exist_ok=True)
    atomic_write_all({network_path(root, network_id): data for network_id, data in sorted(networks.items())})


class TrainingMaterials(NamedTuple):
    """Everything an export holds, ready for training."""

    config: SessionConfig
    networks: dict[int, bytes]
    """Snapshot bytes per network id (each exactly the model config's MaxByteNum)."""
    replay_buffers: tuple[ReplayBuffer, ...]
    """One per replay buffer of the data config, in id order; arrays are writable and own their memory."""


def read_training_materials(folder: str | os.PathLike[str]) -> TrainingMaterials:
    """Read one export (spec §5.5): configs, ``Networks/network_<id>.bin``, ``replaybuffer_<id>.bin``.

    Raises:
        LaunchError: a file is missing.
        BadData: a network file does not have its MaxByteNum size.
        protocol.errors.ConfigError / ReplayError: a file is malformed.
    """
    root = Path(folder)
    trainer_obj = parse_json(_read_file(root / TRAINER_CONFIG, CONFIG_FILE_LIMIT), TRAINER_CONFIG)
    data_obj = parse_json(_read_file(root / DATA_CONFIG, CONFIG_FILE_LIMIT), DATA_CONFIG)
    model_obj = parse_json(_read_file(root / MODEL_CONFIG, CONFIG_FILE_LIMIT), MODEL_CONFIG)
    config = session_from_files(trainer_obj, data_obj, model_obj)

    networks: dict[int, bytes] = {}
    for net in sorted(config.model.networks, key=lambda n: n.id):
        path = network_path(root, net.id)
        size = _file_size(path)
        if size != net.max_byte_num:
            raise BadData(
                f"{path} has {size} bytes but {MODEL_CONFIG} gives network {net.id} ({net.name}) "
                f"MaxByteNum {net.max_byte_num}; the export mixes files from different sessions."
            )
        networks[net.id] = bytes(_read_file(path, net.max_byte_num))

    replay_buffers = []
    for rb_config in sorted(config.data.replay_buffers, key=lambda rb: rb.id):
        layout = ReplayLayout.from_config(rb_config)
        # Read into a bytearray so the decoded (zero-copy) arrays are writable and own this one copy.
        raw = _read_file(replay_buffer_path(root, rb_config.id), MAX_REPLAY_FILE_BYTES)
        replay_buffers.append(layout.decode_file(raw))
    return TrainingMaterials(config, networks, tuple(replay_buffers))


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        raise LaunchError(f"{path} is missing from the export") from None


def _read_file(path: Path, limit: int) -> bytearray:
    """The whole file, read once into a preallocated buffer, after checking its size against ``limit``."""
    size = _file_size(path)
    if size > limit:
        raise BadData(f"{path} is {size} bytes, more than the {limit} bytes such a file can need")
    buf = bytearray(size)
    with path.open("rb") as handle:
        view = memoryview(buf)
        filled = 0
        while filled < size:
            n = handle.readinto(view[filled:])
            if not n:
                raise BadData(f"{path} shrank while it was being read ({filled} of {size} bytes)")
            filled += n
    return buf
