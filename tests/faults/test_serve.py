"""A trainer the game did not spawn outlives its game: attach mode and the socket server.

Facts:

* attach mode (``la-trainer shm --create``, one session by default): a game SIGKILLed after its first
  round is seen to be gone through the processes that map the control block (Linux ``/proc/*/maps``), so
  the trainer exits with PEER_GONE and unlinks its control block and lock file long before the 600 s
  bound of a wait that cannot see the game (issue 22 item 7: within 60 s);
* serving (``la-trainer shm --create --serve``, ``la-trainer socket``): one trainer process serves two
  sessions back to back over the same GUID / port, the second after the first game was SIGKILLed after
  its first round; each session gets its own run record; SIGTERM then stops the server with exit 0 and
  it unlinks what it created.
"""

from __future__ import annotations

import re
import sys
import time
import uuid
from pathlib import Path

import pytest

from emulator.launch import REPO_ROOT, TrainerProcess
from emulator.session import free_tcp_port
from protocol.guid import os_shm_name
from tests.support.faults import STARTUP_S, load_factor, trainer_env, unlink_regions
from tests.support.served_game import game_process, play
from trainer.exitcodes import ExitCode
from trainer.records.runrecord import find_run_folders
from trainer.session.transport.shm import region_exists
from trainer.system.lockfile import lock_path

pytestmark = [pytest.mark.integration, pytest.mark.slow]

posix_ipc = pytest.importorskip("posix_ipc")

GONE_S = 60.0
"""Issue 22 item 7: from the game's death to the trainer's exit (attach mode) or its next session."""
COMPLETE_ITERATIONS = 60
"""The completing session: one round at 40 iterations, then the final round and Complete."""


def _wait_line(proc: TrainerProcess, words: str, timeout: float, count: int = 1) -> None:
    deadline = time.monotonic() + timeout * load_factor()
    while sum(words in line for line in proc.log) < count:
        if not proc.alive():
            pytest.fail(f"the trainer exited ({proc.returncode}) before saying {words!r}:\n{proc.output()}")
        if time.monotonic() > deadline:
            pytest.fail(
                f"the trainer did not say {words!r} (x{count}) within {timeout:g} s:\n{proc.output()}"
            )
        time.sleep(0.02)


def _kill_game_after_first_round(transport: str, where: str, task_dir: Path) -> None:
    game = game_process(transport, where, str(task_dir), die_after_rounds=1)
    try:
        code = game.wait(STARTUP_S * 2 * load_factor())
    finally:
        if game.poll() is None:
            game.kill()
    stderr = game.stderr.read().decode(errors="replace") if game.stderr is not None else ""
    assert code == -9, f"the game did not die as planned (exit {code}):\n{stderr}"


def _engine_regions_of(task_dir: Path, guid: str) -> list[str]:
    """The regions the killed game created (its shared-memory config names them); it cannot unlink them."""
    path = task_dir / "Configs" / f"shared-memory-{guid}.json"
    if not path.exists():
        return []
    found = set(
        re.findall(
            r"[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}", path.read_text()
        )
    )
    controls = guid.strip("{}").upper()
    return [os_shm_name("{" + g.upper() + "}", sys.platform) for g in found if g.upper() != controls]


def test_attach_mode_exits_when_its_game_is_killed_after_a_round(tmp_path: Path) -> None:
    task_dir = tmp_path / "External"
    guid = "{" + str(uuid.uuid4()).upper() + "}"
    controls = os_shm_name(guid, sys.platform)
    argv = [sys.executable, "-m", "trainer", "shm", str(task_dir), "--create", "--guid", guid]
    # The real bound (600 s): only seeing the game's death can end this test in time.
    env = {k: v for k, v in trainer_env().items() if k != "LA_TRAINER_TIMEOUT_SCALE"}
    with TrainerProcess(argv, cwd=REPO_ROOT, env=env) as trainer:
        _wait_line(trainer, "Start the game with", STARTUP_S)
        deadline = time.monotonic() + STARTUP_S
        while not region_exists(controls) and time.monotonic() < deadline:
            time.sleep(0.01)
        try:
            _kill_game_after_first_round("shm", guid, task_dir)
            died = time.monotonic()
            code = trainer.wait(GONE_S)
            took = time.monotonic() - died
        finally:
            unlink_regions(_engine_regions_of(task_dir, guid))
        output = trainer.output()
    assert code == int(ExitCode.PEER_GONE), f"exit {code} after {took:.1f} s:\n{output}"
    assert "maps the control block" in output, output  # it said which liveness check runs
    assert not region_exists(controls), "the trainer left its control block"
    assert not lock_path(guid).exists(), "the trainer left its lock file"


@pytest.mark.parametrize("transport", ["shm", "socket"])
def test_one_server_serves_two_sessions_the_first_game_killed(transport: str, tmp_path: Path) -> None:
    guid = "{" + str(uuid.uuid4()).upper() + "}"
    if transport == "shm":
        task_dir = runs = tmp_path / "External"
        where = guid
        argv = [sys.executable, "-m", "trainer", "shm", str(task_dir), "--create", "--guid", guid, "--serve"]
    else:
        task_dir, runs = tmp_path, tmp_path / "runs"
        where = str(free_tcp_port())
        argv = [sys.executable, "-m", "trainer", "socket", "--port", where, "--temp-dir", str(runs)]
    env = trainer_env()
    with TrainerProcess(argv, cwd=REPO_ROOT, env=env) as trainer:
        _wait_line(trainer, "serving session after session", STARTUP_S)
        try:
            _kill_game_after_first_round(transport, where, task_dir)
            _wait_line(trainer, "session 1 ended with exit code 5", GONE_S)
        finally:
            if transport == "shm":
                unlink_regions(_engine_regions_of(task_dir, guid))
        _wait_line(trainer, "serving session after session", GONE_S, count=2)
        assert play(
            transport, where, str(task_dir), iterations=COMPLETE_ITERATIONS, die_after_rounds=None
        ) == ("completed")
        _wait_line(trainer, "session 2 ended with exit code 0", GONE_S)
        _wait_line(trainer, "serving session after session", GONE_S, count=3)
        code = trainer.kill(grace=30.0 * load_factor())  # SIGTERM first: the server stops cleanly
        output = trainer.output()
    assert code == int(ExitCode.OK), f"exit {code}:\n{output}"
    assert "server stopped" in output, output
    assert "Traceback" not in output, output
    records = find_run_folders(runs)
    assert len(records) == 2, f"one run record per session expected, found {records}:\n{output}"
    if transport == "shm":
        assert not region_exists(os_shm_name(guid, sys.platform)), "the server left its control block"
        assert not lock_path(guid).exists(), "the server left its lock file"
