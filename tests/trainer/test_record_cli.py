"""``la-trainer record``: .record files and a recorder schema file in, trained networks out (spec §5)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from protocol.record import Record
from protocol.snapshot import read_snapshot_header
from tests.support.recordings import OBSERVATION, make_record, record_files
from trainer.commands.record import record_command
from trainer.exitcodes import ExitCode

ROOT = Path(__file__).resolve().parents[2]

SET_OBSERVATION: dict[str, Any] = {
    "VectorSize": 3,
    "EncodedSize": 4,
    "Type": "Set",
    "MaxNum": 1,
    "AttentionEncodingSize": 4,
    "AttentionHeadNum": 1,
    "ValueEncodingSize": 4,
    "Element": {**OBSERVATION, "VectorSize": 2, "EncodedSize": 2, "Num": 2},
}


def test_record_trains_an_export_of_the_recording(tmp_path: Path) -> None:
    record_file, schema_file = record_files(tmp_path, [make_record(40, seed=1), make_record(25, seed=2)])
    out = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "trainer.commands.cli",
        "record",
        str(record_file),
        "--schema",
        str(schema_file),
    ]
    options = ["--out", str(out), "--iterations", "30", "--batch-size", "16", "--hidden-size", "8"]
    env = {**os.environ, "LA_TRAINER_THREADS": "1"}
    done = subprocess.run(
        [*command, *options, "--device", "CPU"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 records, 65 steps" in done.stdout
    (folder,) = (out / "TrainingMaterials").iterdir()
    names = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    expected = [
        "Networks/model-config.json",
        "Networks/network_0.bin",
        "Networks/network_1.bin",
        "Networks/network_2.bin",
        "ReplayBuffers/data-config.json",
        "ReplayBuffers/replaybuffer_0.bin",
        "trainer-config.json",
    ]
    assert set(expected) <= set(names)  # the export; the trainer adds its snapshots and status beside it
    trainer_config = json.loads((folder / "trainer-config.json").read_text())
    assert trainer_config["TempDirectory"] == str(out.resolve())
    assert trainer_config["FlowMatchingTrainingSettings"]["IterationNum"] == 30
    model_config = json.loads((folder / "Networks/model-config.json").read_text())
    trained = out / "Offline0"  # the export keeps its initial networks; the outputs go to a new folder
    assert str(trained / "Networks") in done.stdout  # named on exit
    for network in model_config["Networks"]:
        initial = (folder / f"Networks/network_{network['Id']}.bin").read_bytes()
        data = (trained / f"Networks/network_{network['Id']}.bin").read_bytes()
        assert len(data) == len(initial) == network["MaxByteNum"]  # same sizes and headers
    assert (trained / "Networks/network_0.bin").read_bytes() != (
        folder / "Networks/network_0.bin"
    ).read_bytes()
    denoiser = read_snapshot_header((trained / "Networks/network_0.bin").read_bytes())
    assert (denoiser.input_size, denoiser.output_size) == (3 + 2 + 1, 2)


def _invoke(args: list[str]) -> Any:
    return CliRunner().invoke(record_command, args)


def test_a_schema_element_the_builder_cannot_build_is_bad_data(tmp_path: Path) -> None:
    record_file, schema_file = record_files(tmp_path, [make_record(5)], observation=SET_OBSERVATION)
    result = _invoke([str(record_file), "--schema", str(schema_file), "--out", str(tmp_path / "run")])
    assert result.exit_code == ExitCode.BAD_DATA, result.output
    assert "ObservationSchema" in result.output and "Set" in result.output
    assert not (tmp_path / "run").exists()  # nothing written before the refusal


@pytest.mark.parametrize(
    ("document", "needle"),
    [
        ("{not json", "not readable JSON"),
        (json.dumps({"ObservationSchema": OBSERVATION}), "'ObservationSchema' and 'ActionSchema'"),
        (json.dumps({"ObservationSchema": OBSERVATION, "ActionSchema": [1]}), "must be JSON objects"),
    ],
)
def test_a_schema_file_that_is_not_the_recorders_is_a_usage_error(
    tmp_path: Path, document: str, needle: str
) -> None:
    record_file, schema_file = record_files(tmp_path, [make_record(5)])
    schema_file.write_text(document)
    result = _invoke([str(record_file), "--schema", str(schema_file)])
    assert result.exit_code == ExitCode.USAGE, result.output
    assert needle in result.output


@pytest.mark.parametrize(
    ("records", "needle"),
    [
        ([], "hold no records"),
        ([make_record(5), make_record(5, obs_dim=4)], "records do not fit together"),
    ],
)
def test_records_that_cannot_be_trained_on_are_bad_data(
    tmp_path: Path, records: list[Record], needle: str
) -> None:
    record_file, schema_file = record_files(tmp_path, records)
    result = _invoke([str(record_file), "--schema", str(schema_file), "--out", str(tmp_path / "run")])
    assert result.exit_code == ExitCode.BAD_DATA, result.output
    assert needle in result.output


def test_a_malformed_record_file_is_bad_data(tmp_path: Path) -> None:
    record_file, schema_file = record_files(tmp_path, [make_record(5)])
    record_file.write_bytes(record_file.read_bytes()[:-3])
    result = _invoke([str(record_file), "--schema", str(schema_file)])
    assert result.exit_code == ExitCode.BAD_DATA, result.output
    assert str(record_file) in result.output
