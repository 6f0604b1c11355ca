"""The small session every link test runs: its config, the networks BeginTraining sends and distinct trained
snapshots per round (shared by tests/trainer/test_links.py and tests/faults/test_waits_end.py)."""

from __future__ import annotations

import sys

import numpy as np

from protocol.config import SessionConfig, session_from_shared_memory
from protocol.names import NetworkId
from protocol.snapshot import HEADER, HEADER_BYTES, SNAPSHOT_MAGIC, SNAPSHOT_VERSION
from tests.support.configs import MODEL, TRAINER, sample_networks, small_data

PLATFORM = "linux" if sys.platform.startswith("linux") else sys.platform
NETWORK_IDS = tuple(int(n) for n in NetworkId)


def trained(round_index: int) -> dict[int, bytes]:
    """Distinct snapshots per round, each of its network's MaxByteNum.

    The game halves load what comes back as the engine does (size, magic, version, FileDataSize; §10 item
    6), so the bytes carry a valid 24-byte header; the model blob behind it is noise (links move it
    without parsing).
    """
    rng = np.random.default_rng(100 + round_index)
    out: dict[int, bytes] = {}
    for net in config().model.networks:
        body = rng.integers(0, 256, net.max_byte_num - HEADER_BYTES, dtype=np.uint8).tobytes()
        out[net.id] = HEADER.pack(SNAPSHOT_MAGIC, SNAPSHOT_VERSION, 1, 1, 0, len(body)) + body
    return out


def config() -> SessionConfig:
    return session_from_shared_memory(TRAINER, {**small_data(), **MODEL})


def initial_networks() -> tuple[bytes, ...]:
    """The networks BeginTraining sends, in id order."""
    networks = sample_networks()
    return tuple(networks[nid] for nid in NETWORK_IDS)
