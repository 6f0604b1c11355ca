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

from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from trainer.commands.cli import main
from trainer.exitcodes import ExitCode


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
