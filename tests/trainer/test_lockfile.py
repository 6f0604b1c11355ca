"""trainer.transport.lockfile: one trainer per control block, robust to a crashed holder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from emulator.game import ShmGame
from emulator.launch import REPO_ROOT
from trainer.errors import LaunchError
from trainer.links import ShmTrainerLink
from trainer.transport.lockfile import ControlBlockLock, lock_path

GUID = "{0A1B2C3D-4E5F-6071-8293-A4B5C6D7E8F9}"


def test_a_second_holder_is_refused_naming_the_first(tmp_path: Path) -> None:
    with ControlBlockLock(GUID, folder=tmp_path):
        with pytest.raises(LaunchError) as info:
            ControlBlockLock(GUID, folder=tmp_path)
        assert f"pid {os.getpid()}" in str(info.value) and GUID in str(info.value)
        assert "torchrun" in str(info.value)
    with ControlBlockLock(GUID, folder=tmp_path):  # released: free again
        pass
    assert not lock_path(GUID, tmp_path).exists()  # a clean release leaves nothing behind


def test_other_blocks_are_independent(tmp_path: Path) -> None:
    with ControlBlockLock(GUID, folder=tmp_path), ControlBlockLock("{" + "1" * 8 + GUID[9:], folder=tmp_path):
        pass


def test_a_holder_killed_with_sigkill_does_not_block_the_next(tmp_path: Path) -> None:
    code = (
        "import sys, time\n"
        f"sys.path.insert(0, {str(REPO_ROOT)!r})\n"
        "from trainer.transport.lockfile import ControlBlockLock\n"
        f"lock = ControlBlockLock({GUID!r}, folder={str(tmp_path)!r})\n"
        "print('held', flush=True)\n"
        "time.sleep(60)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(LaunchError, match=f"pid {holder.pid}"):
            ControlBlockLock(GUID, folder=tmp_path)
        holder.send_signal(signal.SIGKILL)
        holder.wait(30)
        assert lock_path(GUID, tmp_path).exists()  # the crashed holder left its file ...
        started = time.monotonic()
        with ControlBlockLock(GUID, folder=tmp_path):  # ... and the kernel its lock
            assert time.monotonic() - started < 1.0
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(30)


def test_a_second_link_on_a_served_control_block_is_refused(tmp_path: Path) -> None:
    game = ShmGame.create(tmp_path / "Configs", timeout=5.0)
    try:
        with ShmTrainerLink(tmp_path / "Configs", game.controls_guid):
            with pytest.raises(LaunchError, match="already serves control block"):
                ShmTrainerLink(tmp_path / "Configs", game.controls_guid)
        with ShmTrainerLink(tmp_path / "Configs", game.controls_guid):  # after close: free again
            pass
    finally:
        game.close()
