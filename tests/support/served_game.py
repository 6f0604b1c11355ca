"""A game session against a trainer that was started first (attach mode, or the socket server), played by
the emulator's engine half; the game may SIGKILL itself after a number of rounds.

:func:`play` runs in the test process (a game that completes) or, through :func:`game_process`, in a
child process that can die the way a crashed editor does (``python -c`` with a JSON spec; nothing is
pickled across the process boundary).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from emulator.drive import Ending, begin_training, tick_until_end
from emulator.game import ShmGame, SocketGame
from emulator.launch import REPO_ROOT
from emulator.session import build_session_config
from tests.support.faults import ENGINE_TIMEOUT_S, SETTINGS, STARTUP_S, small_task

__all__ = ["game_process", "play"]

SESSION_S = 120.0
"""Bound on one whole game session (torch is already imported by the served trainer)."""


def play(transport: str, where: str, task_dir: str, *, iterations: int, die_after_rounds: int | None) -> str:
    """One session: ``transport`` "shm" (``where``: the controls GUID, configs in ``task_dir``/Configs)
    or "socket" (``where``: the port). Returns how it ended ("completed"); with ``die_after_rounds`` the
    process SIGKILLs itself once that many rounds arrived."""
    from dataclasses import replace

    settings = replace(SETTINGS, iteration_num=iterations)
    task = small_task()
    config, blobs = build_session_config(task, settings, task_dir)
    game: ShmGame | SocketGame
    if transport == "shm":
        game = ShmGame.attach(where, Path(task_dir) / "Configs", timeout=ENGINE_TIMEOUT_S)
    else:
        game = SocketGame.connect("127.0.0.1", int(where), timeout=STARTUP_S)
    try:
        begin_training(game, config, blobs, task.replay_buffer)
        rounds = 0

        def on_round(_: Any) -> None:
            nonlocal rounds
            rounds += 1
            if die_after_rounds is not None and rounds >= die_after_rounds:
                os.kill(os.getpid(), signal.SIGKILL)  # the editor crashes: no cleanup of any kind

        ended = tick_until_end(game, tick_s=0.002, on_round=on_round, timeout_s=SESSION_S)
        if ended.how is not Ending.COMPLETED:
            raise AssertionError(f"the session ended with {ended.how}")
        if isinstance(game, SocketGame):
            time.sleep(0.05)  # the engine closes on its next tick after Completed
        game.done()
        return "completed"
    finally:
        game.close()


def game_process(
    transport: str, where: str, task_dir: str, *, die_after_rounds: int
) -> subprocess.Popen[bytes]:
    """:func:`play` in a child process that SIGKILLs itself after ``die_after_rounds`` rounds."""
    spec = json.dumps(
        {
            "transport": transport,
            "where": where,
            "task_dir": task_dir,
            "iterations": SETTINGS.iteration_num,
            "die_after_rounds": die_after_rounds,
        }
    )
    code = (
        "import json, sys; from tests.support.served_game import play; s = json.loads(sys.argv[1]); "
        "play(s['transport'], s['where'], s['task_dir'], iterations=s['iterations'], "
        "die_after_rounds=s['die_after_rounds'])"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code, spec],
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
