"""A small ``.record`` recording and its schema file, as `la-trainer record` takes them (shared by the record
command's tests, the device-option tests and the wrong-input sessions)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from protocol.record import Record, write_records

OBSERVATION: dict[str, Any] = {
    "VectorSize": 3,
    "EncodedSize": 3,
    "Type": "Continuous",
    "Num": 3,
    "Normalization": "AutoPerDimension",
}
ACTION: dict[str, Any] = {
    "VectorSize": 2,
    "DistributionSize": 4,
    "EncodedSize": 4,
    "ModifierSize": 5,
    "Type": "Continuous",
    "Num": 2,
    "Normalization": "AutoPerDimension",
}


def make_record(steps: int, obs_dim: int = 3, act_dim: int = 2, seed: int = 0) -> Record:
    rng = np.random.default_rng(seed)
    return Record(
        step_num=steps,
        observation_dim_num=obs_dim,
        action_dim_num=act_dim,
        observation_compatibility_hash=11,
        action_compatibility_hash=-22,
        observations=rng.standard_normal((steps, obs_dim)).astype(np.float32),
        actions=rng.standard_normal((steps, act_dim)).astype(np.float32),
    )


def record_files(
    tmp_path: Path, records: list[Record], observation: dict[str, Any] = OBSERVATION
) -> tuple[Path, Path]:
    record_file = tmp_path / "demo.record"
    record_file.write_bytes(write_records(records))
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps({"ObservationSchema": observation, "ActionSchema": ACTION}))
    return record_file, schema_file
