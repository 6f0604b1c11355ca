"""``la-trainer doctor`` (trainer/commands/doctor.py) and ``la-trainer report`` (trainer/commands/report.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from trainer.commands import doctor, report
from trainer.exitcodes import ExitCode
from trainer.records.runrecord import METRICS_FILE, RUN_FILE


def test_the_engine_python_is_where_the_engine_makes_it(tmp_path: Path) -> None:
    expected = ("Scripts", "python.exe") if sys.platform == "win32" else ("bin", "python3")
    assert doctor.engine_python(tmp_path) == tmp_path.joinpath("Intermediate", "PipInstall", *expected)


def test_doctor_lists_every_part_on_one_screen() -> None:
    names = [check.name for check in doctor.run_checks()]
    assert names[:4] == ["la-trainer", "python", "torch", "gpu"]
    assert {"shared memory", "numpy", "msgpack", "click", "extras"} <= set(names)
    assert all(check.verdict in ("ok", "note", "FAIL") for check in doctor.run_checks())


def test_a_cpu_only_torch_says_how_to_get_a_cuda_build(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    (torch_check, gpu_check) = [c for c in doctor.run_checks() if c.name in ("torch", "gpu")]
    assert torch_check.verdict == "note" and "CPU-only build" in torch_check.detail
    assert "download.pytorch.org/whl/cu" in torch_check.fix
    assert gpu_check.verdict == "note" and "training runs on the CPU" in gpu_check.detail


def test_the_engine_python_is_probed_without_our_path(tmp_path: Path) -> None:
    python = tmp_path / "python3"
    python.write_text("")
    seen: dict[str, Any] = {}

    def fake_run(argv: list[str], **kwargs: Any) -> Any:
        seen.update(kwargs)
        answer = {
            "python": "3.11.8",
            "torch": "2.5.1+cu124",
            "cuda_build": "12.4",
            "cuda": True,
            "numpy": "1.26.4",
            "trainer": None,
        }
        return subprocess.CompletedProcess(argv, 0, json.dumps(answer) + "\n", "")

    checks = doctor._engine(python, run=fake_run)
    assert "PYTHONPATH" not in seen["env"] and seen["timeout"] > 0
    assert checks[0].verdict == "ok" and "torch 2.5.1+cu124 (CUDA 12.4, GPU visible)" in checks[0].detail
    assert checks[1].verdict == "note" and "install-engine" in checks[1].fix


@pytest.mark.skipif(sys.platform == "win32", reason="a shell script stands in for the engine's python3")
def test_an_engine_python_without_torch_and_numpy_is_not_ready(tmp_path: Path) -> None:
    """The probe really runs the engine's Python: here this interpreter without its site-packages (-S),
    a Python with neither torch nor numpy, as a PipInstall the editor never finished (before: "Ready to
    train", with "no torch" in the detail)."""
    python = doctor.engine_python(tmp_path)
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n', encoding="utf-8")
    python.chmod(0o755)
    result = CliRunner().invoke(doctor.doctor_command, ["--project", str(tmp_path)])
    assert result.exit_code == ExitCode.USAGE, result.output
    assert "Ready to train" not in result.output and "Not ready: engine python." in result.output
    assert "torch and numpy cannot be imported there" in result.output
    assert f"{python} -m pip install torch numpy" in result.output


def test_doctor_fails_for_a_project_without_the_engine_python(tmp_path: Path) -> None:
    result = CliRunner().invoke(doctor.doctor_command, ["--project", str(tmp_path)])
    assert result.exit_code == ExitCode.USAGE, result.output
    assert "engine python  FAIL" in result.output and "Not ready: engine python." in result.output


def _run_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "LearningCore" / "Training0" / "runs" / "Training_FlowMatching_SharedMemory_x"
    folder.mkdir(parents=True)
    (folder / RUN_FILE).write_text("{}")
    lines = [
        {
            "iteration": 100,
            "phase": "flow_matching",
            "loss": 1.5,
            "iterations_per_second": 900.0,
            "learning_rate": 1e-3,
            "sync_rounds": 1,
            "elapsed_s": 0.1,
        },
        {
            "iteration": 200,
            "phase": "flow_matching",
            "loss": 0.5,
            "iterations_per_second": 1000.0,
            "learning_rate": 1e-3,
            "sync_rounds": 2,
            "elapsed_s": 0.2,
        },
        {
            "iteration": 300,
            "phase": "distillation",
            "loss": 0.02,
            "iterations_per_second": 500.0,
            "learning_rate": 1e-3,
            "sync_rounds": 3,
            "elapsed_s": 0.4,
        },
    ]
    text = "".join(json.dumps(line) + "\n" for line in lines) + '{"iteration": 4'  # a killed run's torn line
    (folder / METRICS_FILE).write_text(text)
    return folder


def test_report_draws_the_newest_run_below_a_learningcore_folder(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")  # la-trainer[plots]; the engine-torch step's environment has none
    folder = _run_folder(tmp_path)
    result = CliRunner().invoke(report.report_command, [str(tmp_path / "LearningCore")])
    assert result.exit_code == 0, result.output
    assert f"run {folder}" in result.output
    assert "flow matching: loss 1.50000 at 100 -> 0.50000 at 200" in result.output
    assert "distillation: loss 0.02000 at 300 -> 0.02000 at 300" in result.output
    assert "median 900 it/s" in result.output
    png = folder / "loss.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_without_matplotlib_prints_the_summary_and_how_to_get_the_picture(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _run_folder(tmp_path)

    def missing() -> None:
        raise ImportError("No module named 'matplotlib'")

    monkeypatch.setattr(report, "_import_pyplot", missing)
    result = CliRunner().invoke(report.report_command, [str(tmp_path)])
    assert result.exit_code == ExitCode.OK  # a warning, as the demo's (issue 31 item 1)
    assert "3 points" in result.output and "pip install 'la-trainer[plots]'" in result.output


def test_report_on_a_folder_without_runs_names_it(tmp_path: Path) -> None:
    result = CliRunner().invoke(report.report_command, [str(tmp_path)])
    assert result.exit_code == ExitCode.USAGE and "no run record" in result.output


def test_phases_are_separate_series() -> None:
    points = [
        {"iteration": 1, "phase": "flow_matching", "loss": 1.0},
        {"iteration": 2, "phase": "distillation", "loss": 0.1},
        {"iteration": 3, "phase": "distillation", "loss": float("nan")},
    ]
    assert report.loss_series(points) == {"flow_matching": [(1, 1.0)], "distillation": [(2, 0.1)]}
