"""Start-up checks and bounds a first-week user hits (issue 30 item 5).

Facts: a trainer that waits for games (``socket``, ``shm``) refuses an explicit CUDA device this machine
lacks before it listens (exit 2, nothing opened, no run folder); ``--threads`` is bounded (100,000 crashed
OpenMP) and ``record --batch-size`` too (100,000,000 was an out-of-memory traceback), each refusal naming
the bound and why; a BatchSize whose step cannot fit in the machine's memory is refused before anything
is allocated; one run per output folder (a second ``offline``/``record`` into the same ``--out`` is
refused with exit 2 while the first trains); a ``.record`` with a flipped byte warns, naming the column,
its range and the record; ``report`` on a metrics log that is not UTF-8 reports what it can, no traceback.

torch's view of CUDA is replaced (as in test_options_device.py), so the facts hold on any machine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from emulator.session import EngineTask, SessionSettings, build_session_config
from protocol.record import read_records, write_records
from protocol.snapshot import read_snapshot
from tests.support.recordings import make_record, record_files
from trainer.commands import report
from trainer.commands.cli import main
from trainer.errors import BadData
from trainer.exitcodes import ExitCode
from trainer.records.runrecord import METRICS_FILE, RUN_FILE
from trainer.settings.options import MAX_THREADS, OptionError, TrainerOptions, load_options
from trainer.system.lockfile import OUTPUT_LOCK_NAME, OutputFolderLock
from trainer.training.job import TrainingJob


def _no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


def _never_listen(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Replaces the link opener: a call means the command got as far as listening."""
    opened: list[Any] = []

    def opener(*args: Any, **kwargs: Any) -> Any:
        opened.append(args)
        raise AssertionError("the trainer opened its link (listened) before refusing the device")

    monkeypatch.setattr("trainer.session.app.open_link_for_launch", opener)
    return opened


# -- a missing CUDA device, before listening ---------------------------------------------------------------


@pytest.mark.parametrize("command", ["socket", "shm"])
def test_a_server_with_a_missing_cuda_device_is_refused_before_it_listens(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, command: str
) -> None:
    _no_cuda(monkeypatch)
    opened = _never_listen(monkeypatch)
    runs = tmp_path / "runs"
    if command == "socket":
        args = ["socket", "--once", "--port", "48999", "--temp-dir", str(runs), "--device", "cuda"]
    else:
        args = ["shm", str(runs), "--create", "--device", "cuda:0"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == ExitCode.USAGE, result.output
    assert "the device option is 'cuda" in result.output and "CUDA is not available here" in result.output
    assert "Start the game" not in result.output  # no switches for a game this trainer would refuse
    assert not opened
    assert not list(runs.glob("External*")) if runs.exists() else True


# -- bounds ------------------------------------------------------------------------------------------------


def test_threads_beyond_the_bound_are_refused_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _never_listen(monkeypatch)
    server = ["socket", "--once", "--port", "48999", "--temp-dir", str(tmp_path), "--wait", "1"]
    result = CliRunner().invoke(main, [*server, "--threads", "100000"])
    assert result.exit_code == ExitCode.USAGE, result.output
    assert f">= 0 and at most {MAX_THREADS}" in result.output and "OpenMP" in result.output
    assert "Traceback" not in result.output
    monkeypatch.setenv("LA_TRAINER_THREADS", str(MAX_THREADS + 1))
    with pytest.raises(OptionError, match="LA_TRAINER_THREADS"):
        load_options(None, {})
    monkeypatch.setenv("LA_TRAINER_THREADS", str(MAX_THREADS))
    assert load_options(None, {}).threads == MAX_THREADS


def test_record_batch_size_beyond_the_bound_is_refused_before_any_file(tmp_path: Path) -> None:
    record_file, schema_file = record_files(tmp_path, [make_record(20)])
    out = tmp_path / "out"
    args = ["record", str(record_file), "--schema", str(schema_file), "--out", str(out)]
    result = CliRunner().invoke(main, [*args, "--batch-size", "100000000"])
    assert result.exit_code == ExitCode.USAGE, result.output
    assert "--batch-size" in result.output and "from 1 to 1048576" in result.output
    assert "memory" in result.output and "Traceback" not in result.output
    assert not out.exists()


def test_a_batch_that_cannot_fit_in_memory_is_refused_before_anything_is_allocated() -> None:
    task = EngineTask.benchmark("bimodal", size=64, seed=0)
    config, blobs = build_session_config(task, SessionSettings(batch_size=2**31 - 1), None)
    received = {nid: read_snapshot(blob) for nid, blob in enumerate(blobs)}
    with pytest.raises(BadData) as refused:
        TrainingJob.create(
            config,
            received,
            task.replay_buffer,
            options=TrainerOptions(threads=1),
            device=torch.device("cpu"),
        )
    text = str(refused.value)
    assert "BatchSize 2147483647 does not fit in memory" in text and "Lower BatchSize" in text
    assert refused.value.exit_code == ExitCode.BAD_DATA


# -- one run per output folder -----------------------------------------------------------------------------


def test_a_second_run_into_the_same_out_folder_is_refused_while_the_first_trains(tmp_path: Path) -> None:
    record_file, schema_file = record_files(tmp_path, [make_record(20)])
    out = tmp_path / "out"
    args = ["record", str(record_file), "--schema", str(schema_file), "--out", str(out)]
    quick = ["--iterations", "2", "--threads", "1"]
    first = CliRunner().invoke(main, [*args, *quick, "--hidden-size", "8"])
    assert first.exit_code == 0, first.output
    assert not (out / OUTPUT_LOCK_NAME).exists(), "a finished run left its lock file"
    export = out / "TrainingMaterials"
    trained = tmp_path / "trained"
    trained.mkdir()
    # A first run still training into each folder (an OS lock belongs to its open file, so this process
    # holding one refuses a second open of it, as another process would).
    with OutputFolderLock(trained):
        offline = CliRunner().invoke(main, ["offline", str(export), "--out", str(trained), *quick])
    with OutputFolderLock(out):
        record = CliRunner().invoke(main, [*args, *quick])
    for result, folder in ((offline, trained), (record, out)):
        assert result.exit_code == ExitCode.USAGE, result.output
        assert f"is training into {str(folder)!r} (--out)" in result.output
        assert "choose another folder with --out" in result.output
    assert not (trained / "Networks").exists()  # the refused run wrote nothing
    after = CliRunner().invoke(main, ["offline", str(export), "--out", str(trained), *quick])
    assert after.exit_code == 0, after.output  # released: the folder is free again


# -- a record with a flipped byte -------------------------------------------------------------------------


def test_a_record_with_a_flipped_byte_warns_naming_the_column_and_the_range(tmp_path: Path) -> None:
    records = [make_record(30, seed=1), make_record(30, seed=2)]
    data = bytearray(write_records(records))
    target = records[1].observations[7, 2]
    at = bytes(data).index(records[1].observations.tobytes()) + (7 * 3 + 2) * 4
    data[at + 3] = 0x76  # the sign and high exponent bits of one float32: about 1e33, still finite
    flipped = read_records(bytes(data))[1].observations[7, 2]
    assert np.isfinite(flipped) and abs(flipped) > 1e30 and flipped != target
    record_file, schema_file = record_files(tmp_path, records)
    record_file.write_bytes(bytes(data))
    args = ["record", str(record_file), "--schema", str(schema_file), "--out", str(tmp_path / "out")]
    result = CliRunner().invoke(main, [*args, "--iterations", "2", "--threads", "1", "--hidden-size", "8"])
    assert "Traceback" not in result.output
    warning = next(line for line in result.output.splitlines() if "observation column 2" in line)
    assert f"to {flipped:.4g}" in warning or f"from {flipped:.4g}" in warning, warning
    assert "demo.record record 1" in warning and "flipped bytes" in warning
    assert "action column" not in result.output  # only the damaged column is named


# -- report on a metrics log that is not UTF-8 ------------------------------------------------------------


def test_report_on_a_metrics_log_that_is_not_utf8_reports_what_it_can(tmp_path: Path) -> None:
    folder = tmp_path / "Training0" / "runs" / "Training_FlowMatching_Memory_x"
    folder.mkdir(parents=True)
    (folder / RUN_FILE).write_text("{}")
    good = {"iteration": 100, "phase": "flow_matching", "loss": 1.5, "iterations_per_second": 900.0}
    later = {**good, "iteration": 200, "loss": 0.5}
    damaged = json.dumps(good).encode() + b"\n\xff\xfe\x00garbage\x80\n" + json.dumps(later).encode() + b"\n"
    (folder / METRICS_FILE).write_bytes(damaged)
    result = CliRunner().invoke(report.report_command, [str(tmp_path), "--out", str(tmp_path / "loss.png")])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output and "UnicodeDecodeError" not in result.output
    assert "2 points, iterations 100 to 200" in result.output
    assert "1 line(s) of" in result.output and "first: line 2" in result.output
