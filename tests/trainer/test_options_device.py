"""An explicit CUDA device that is not there is refused (exit 2); only ``gpu`` and the engine's own
``Device`` fall back to the CPU, with a warning (issue 24 item 4).

torch's view of the machine is replaced (``torch.cuda.is_available``/``device_count``), so the facts hold
on a CPU-only runner and on a GPU machine alike; no device is touched.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from tests.support.recordings import make_record as one_record
from tests.support.recordings import record_files as recorder_files
from trainer.commands.cli import main
from trainer.errors import LaunchError
from trainer.exitcodes import ExitCode
from trainer.training.device import choose_device


def _cuda(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


@pytest.mark.parametrize("option", ["cuda", "cuda:0", "CUDA:3"])
def test_an_explicit_cuda_device_without_cuda_is_refused(
    monkeypatch: pytest.MonkeyPatch, option: str
) -> None:
    _cuda(monkeypatch, 0)
    with pytest.raises(LaunchError, match="CUDA is not available here") as caught:
        choose_device("GPU", option)
    assert f"the device option is {option!r}" in str(caught.value)
    assert "--device gpu" in str(caught.value)  # the fix: the fallback spelling, or cpu
    assert caught.value.exit_code == ExitCode.USAGE


def test_a_device_index_past_the_last_gpu_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    _cuda(monkeypatch, 2)
    with pytest.raises(LaunchError, match="only cuda:0 to cuda:1"):
        choose_device("GPU", "cuda:2")
    assert choose_device("GPU", "cuda:1") == torch.device("cuda:1")


@pytest.mark.parametrize(("config_device", "option"), [("GPU", "gpu"), ("GPU", ""), ("", "")])
def test_gpu_and_the_engines_device_fall_back_to_the_cpu_announced(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], config_device: str, option: str
) -> None:
    _cuda(monkeypatch, 0)
    assert choose_device(config_device, option) == torch.device("cpu")
    assert "CUDA is not available here" in capsys.readouterr().out + capsys.readouterr().err


def test_a_training_command_with_cuda_on_a_machine_without_it_exits_2(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The whole command (record: its export, then the offline run): before, it trained on the CPU and
    exited 0."""
    _cuda(monkeypatch, 0)
    record_file, schema_file = recorder_files(tmp_path, [one_record(20)])
    out = tmp_path / "out"
    args = ["record", str(record_file), "--schema", str(schema_file), "--out", str(out), "--iterations", "2"]
    result = CliRunner().invoke(main, [*args, "--device", "cuda"])
    assert result.exit_code == ExitCode.USAGE, result.output
    assert "the device option is 'cuda'" in result.output
    assert not list(out.glob("Offline0/Networks/network_*.bin"))  # nothing was trained
