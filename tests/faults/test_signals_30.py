"""A second Ctrl-C during the save, SIGHUP, a SIGTERM storm and a signal before any game (issue 30 item 3).

Facts: exit code 8 always means "state saved": a second SIGINT 1-50 ms after the first (in the step, the
finish or the save) waits for the save and then stops without sending, so the checkpoint of the stop
iteration is there and loads; a third SIGINT stops at once, and then exits 8 only if the save had ended,
else 13 (NOT_SAVED) with the status file saying so. SIGHUP (a closed terminal) is SIGTERM: the step
finishes, the state is saved, the game gets the last networks and Complete, exit 8. A storm of SIGTERMs
from the first until the process is gone never kills it (never 143), and the game still gets Complete.
A signal before any game stops a one-session trainer as it stops a server: nothing to save, exit 0,
status "stopped" (the rule branch i31 chose, issue 31 item 4).

The handler's rules are also checked in this process with real signals (``signal.raise_signal``), so the
order of events is exact there; the subprocess sessions check them end to end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from emulator.session import free_tcp_port
from tests.support.faults import (
    LiveGame,
    assert_no_traceback,
    assert_snapshots_intact,
    network_sizes,
)
from trainer.errors import InterruptedAgain, exit_code_for
from trainer.exitcodes import ExitCode
from trainer.records.progress import STATUS_FILE_NAME, RunPhase, read_status
from trainer.session.app import InterruptFlag
from trainer.training.checkpoint import CHECKPOINT_NAME, load_checkpoint

END_ONLY = {"LA_TRAINER_CHECKPOINT_EVERY_SECONDS": "0"}
"""Checkpoints only at the end: a save that does not finish leaves no checkpoint at all."""


@pytest.fixture
def handlers() -> Iterator[None]:
    """The process's handlers as they were: a flag that saw a signal leaves its signals ignored."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old)


# -- the rules, in this process ----------------------------------------------------------------------------


def test_a_second_sigint_waits_for_the_save_then_stops_with_the_state_saved(handlers: None) -> None:
    flag = InterruptFlag()
    with flag.installed():
        signal.raise_signal(signal.SIGINT)
        assert flag.is_set() and flag.signal_name == "SIGINT"
        signal.raise_signal(signal.SIGINT)  # held: nothing raised while the step and the save go on
        with pytest.raises(InterruptedAgain) as stopped:
            flag.save_ended(True)
    assert stopped.value.saved and exit_code_for(stopped.value) == ExitCode.INTERRUPTED
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN  # exiting: a late SIGTERM cannot kill it


def test_a_third_sigint_stops_at_once_and_says_the_state_was_not_saved(handlers: None) -> None:
    flag = InterruptFlag()
    with flag.installed():
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)
        with pytest.raises(InterruptedAgain) as stopped:
            signal.raise_signal(signal.SIGINT)
    assert not stopped.value.saved and exit_code_for(stopped.value) == ExitCode.NOT_SAVED


def test_a_second_sigint_after_the_save_stops_at_once_with_the_state_saved(handlers: None) -> None:
    flag = InterruptFlag()
    with flag.installed():
        signal.raise_signal(signal.SIGINT)
        flag.save_ended(True)  # nothing held: no exception
        with pytest.raises(InterruptedAgain) as stopped:
            signal.raise_signal(signal.SIGINT)
    assert stopped.value.saved


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_ask_for_a_clean_stop_and_their_repeats_change_nothing(
    handlers: None, sig: signal.Signals
) -> None:
    flag = InterruptFlag()
    with flag.installed():
        for _ in range(5):
            signal.raise_signal(sig)
        assert flag.is_set() and flag.signal_name == sig.name
        flag.save_ended(True)  # nothing was held
    assert signal.getsignal(sig) is signal.SIG_IGN


def test_without_a_signal_the_handlers_are_given_back(handlers: None) -> None:
    before = signal.getsignal(signal.SIGTERM)
    flag = InterruptFlag()
    with flag.installed():
        flag.set("request")  # a stop asked by code, not by a signal: the process is not necessarily ending
    assert signal.getsignal(signal.SIGTERM) is before


# -- end to end ---------------------------------------------------------------------------------------------


def _check_saved_at_the_stop(session: LiveGame, output: str) -> None:
    """Exit 8 means: the status says interrupted, and the checkpoint of that iteration is there."""
    status = read_status(session.task_dir / STATUS_FILE_NAME)
    assert (status.phase, status.exit_code) == (RunPhase.INTERRUPTED, 8), (status, output)
    state = load_checkpoint(session.snapshots / CHECKPOINT_NAME)
    assert state.iteration == status.iteration, (state.iteration, status.iteration, output)
    assert_snapshots_intact(session.snapshots, network_sizes(session.task, session.settings))


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("gap_ms", [1, 10, 50])
def test_a_second_sigint_soon_after_the_first_keeps_the_checkpoint(tmp_path: Path, gap_ms: int) -> None:
    with LiveGame("socket", tmp_path, env=END_ONLY) as session:
        session.begin()
        session.wait_files("*.bin")
        os.kill(session.proc.pid, signal.SIGINT)
        time.sleep(gap_ms / 1000)
        os.kill(session.proc.pid, signal.SIGINT)
        code = session.wait_exit(60.0)
        output = session.proc.output()
        assert code == ExitCode.INTERRUPTED, output
        assert_no_traceback(output)
        _check_saved_at_the_stop(session, output)


@pytest.mark.slow
@pytest.mark.integration
def test_a_sigint_storm_exits_8_only_with_the_state_saved(tmp_path: Path) -> None:
    """Three SIGINTs 1 ms apart: the third may land before the save ended (exit 13) or after (exit 8);
    either way the exit code tells the truth."""
    with LiveGame("socket", tmp_path, env=END_ONLY) as session:
        session.begin()
        session.wait_files("*.bin")
        for _ in range(3):
            os.kill(session.proc.pid, signal.SIGINT)
            time.sleep(0.001)
        code = session.wait_exit(60.0)
        output = session.proc.output()
        assert_no_traceback(output)
        if code == ExitCode.INTERRUPTED:
            _check_saved_at_the_stop(session, output)
        else:
            assert code == ExitCode.NOT_SAVED, output
            status = read_status(session.task_dir / STATUS_FILE_NAME)
            assert (status.phase, status.exit_code) == (RunPhase.FAILED, 13), status
            assert "before the state was saved" in output


@pytest.mark.slow
@pytest.mark.integration
def test_sighup_finishes_saves_and_completes_as_sigterm_does(tmp_path: Path) -> None:
    with LiveGame("socket", tmp_path) as session:
        session.begin()
        session.wait_files("*.bin")
        os.kill(session.proc.pid, signal.SIGHUP)
        session.play_until_end()
        code = session.wait_exit()
        output = session.proc.output()
        assert code == ExitCode.INTERRUPTED, output  # not 129
        assert "SIGHUP received: finishing the current step, saving and stopping" in output
        assert_no_traceback(output)
        _check_saved_at_the_stop(session, output)
        final = (
            session.snapshots
            / f"Denoiser_{load_checkpoint(session.snapshots / CHECKPOINT_NAME).iteration}.bin"
        )
        assert session.rounds and session.rounds[-1][0].data == final.read_bytes()


@pytest.mark.slow
@pytest.mark.integration
def test_a_sigterm_storm_until_the_process_is_gone_never_kills_it(tmp_path: Path) -> None:
    """SIGTERM every 2 ms from the first until the trainer has exited: through the step, the save, the
    last round, Complete, the close and the interpreter's own exit. Before: exit 143 once the handlers
    were given back after the save."""
    with LiveGame("socket", tmp_path) as session:
        session.begin()
        session.wait_files("*.bin")
        proc = session.proc
        deadline = time.monotonic() + 60.0

        def storm() -> None:
            while proc.alive() and time.monotonic() < deadline:
                try:
                    os.kill(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    return
                time.sleep(0.002)

        stormer = threading.Thread(target=storm, daemon=True)
        stormer.start()
        session.play_until_end()
        code = session.wait_exit(60.0)
        stormer.join(10.0)
        output = proc.output()
        assert code == ExitCode.INTERRUPTED, f"exit {code}:\n{output}"
        assert output.count("received again") <= 1
        assert_no_traceback(output)


# -- a signal before any game -------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("command", ["shm", "socket"])
def test_a_signal_before_any_game_stops_a_one_session_trainer_with_exit_0(
    tmp_path: Path, command: str
) -> None:
    if command == "shm":
        argv = ["shm", str(tmp_path / "task"), "--create", "--once"]
    else:
        argv = ["socket", "--once", "--port", str(free_tcp_port()), "--temp-dir", str(tmp_path / "task")]
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer", *argv],
        cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        deadline = time.monotonic() + 120.0
        while not any("waiting" in line for line in lines):
            assert time.monotonic() < deadline and proc.poll() is None, "".join(lines)
            lines.append(proc.stdout.readline())
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    output = "".join(lines) + rest
    assert proc.returncode == ExitCode.OK, output
    assert "SIGTERM received while no game is connected" in output
    assert "nothing to save" in output and "finishing the current step" not in output
    assert_no_traceback(output)
    (status,) = (tmp_path / "task").rglob(STATUS_FILE_NAME)
    assert (read_status(status).phase, read_status(status).exit_code) == (RunPhase.STOPPED, 0)
