"""Shared test builders."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np

from protocol.config import (
    session_from_files,
)
from protocol.replay import ReplayBuffer, ReplayLayout
from tests.support.schemas import ACTION_SCHEMA, OBSERVATION_SCHEMA

TRAINER: dict[str, Any] = {
    "TrainerMethod": "FlowMatching",
    "TimeStamp": "2026-05-09_12-30-417",
    "FlowMatchingTrainingSettings": {
        "IterationNum": 20000,
        "LearningRate": 0.0003,
        "WeightDecay": 0.0001,
        "BatchSize": 512,
        "ObservationNoiseScale": 0.05,
        "NormalizeLatents": True,
        "Seed": 77,
        "SaveSnapshots": False,
        "IterationsPerSnapshot": 500,
    },
    "EmbedNormalizationsInWeights": True,
    "Device": "CPU",
    "UseTensorBoard": True,
    "UseMLflow": False,
    "MLflowTrackingUri": "",
    "TempDirectory": "C:/Projects/Racer/Intermediate/LearningCore",
}


DATA: dict[str, Any] = {
    "ReplayBuffers": [
        {
            "Id": 0,
            "MaxEpisodeNum": 12,
            "MaxStepNum": 3400,
            "HasCompletions": False,
            "HasFinalObservations": False,
            "HasFinalMemoryStates": False,
            "Observations": [{"Id": 0, "Name": "Observations", "SchemaId": 0, "VectorDimensionNum": 22}],
            "Actions": [{"Id": 0, "Name": "Actions", "SchemaId": 0, "VectorDimensionNum": 6}],
            "ActionModifiers": [],
            "MemoryStates": [],
            "Rewards": [],
        }
    ],
    "Schemas": {
        "Observations": [{"Id": 0, "Name": "Default", "Schema": OBSERVATION_SCHEMA}],
        "Actions": [{"Id": 0, "Name": "Default", "Schema": ACTION_SCHEMA}],
    },
}


MODEL: dict[str, Any] = {
    "Networks": [
        {"Id": 0, "Name": "FM_Denoiser", "MaxByteNum": 70336},
        {"Id": 1, "Name": "FM_Encoder", "MaxByteNum": 1600, "InputSchemaId": 0},
        {"Id": 2, "Name": "FM_Decoder", "MaxByteNum": 600, "OutputSchemaId": 0},
    ],
    "FlowMatchingSettings": {
        "ActionChunkSize": 4,
        "HiddenLayerNum": 2,
        "HiddenLayerSize": 256,
        "ActivationFunction": "GELU",
    },
}


def small_data() -> dict[str, Any]:
    """The engine-shaped data config of tests/protocol, with small Max counts."""
    data = copy.deepcopy(DATA)
    data["ReplayBuffers"][0]["MaxEpisodeNum"] = 3
    data["ReplayBuffers"][0]["MaxStepNum"] = 20
    return data


def sample_replay(seed: int = 0) -> ReplayBuffer:
    """2 episodes over 10 steps with the widths of ``small_data()`` (observation 22, action 6)."""
    rng = np.random.default_rng(seed)
    return ReplayBuffer(
        replay_buffer_id=0,
        episode_starts=np.array([0, 4], dtype=np.int32),
        episode_lengths=np.array([4, 6], dtype=np.int32),
        observations=(rng.standard_normal((10, 22)).astype(np.float32),),
        actions=(rng.standard_normal((10, 6)).astype(np.float32),),
    )


def sample_networks(seed: int = 0) -> dict[int, bytes]:
    """Bytes of each network's MaxByteNum (the links move them without parsing)."""
    rng = np.random.default_rng(seed)
    return {
        net["Id"]: rng.integers(0, 256, net["MaxByteNum"], dtype=np.uint8).tobytes()
        for net in MODEL["Networks"]
    }


def write_export(folder: Path, *, skip: tuple[str, ...] = ()) -> Path:
    """An export as the engine's FileTrainer writes it; returns ``folder``."""
    (folder / "ReplayBuffers").mkdir(parents=True)
    (folder / "Networks").mkdir(parents=True)
    files: dict[str, bytes] = {
        "trainer-config.json": json.dumps(TRAINER).encode(),
        "ReplayBuffers/data-config.json": json.dumps(small_data()).encode(),
        "Networks/model-config.json": json.dumps(MODEL).encode(),
    }
    config = session_from_files(TRAINER, small_data(), MODEL)
    files["ReplayBuffers/replaybuffer_0.bin"] = ReplayLayout.from_config(config.replay_buffer(0)).encode_file(
        sample_replay()
    )
    for nid, blob in sample_networks().items():
        files[f"Networks/network_{nid}.bin"] = blob
    for name, blob in files.items():
        if name not in skip:
            (folder / name).write_bytes(blob)
    return folder
