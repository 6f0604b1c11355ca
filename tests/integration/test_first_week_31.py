"""Issue 31 items that need the real commands with their links: a refusal says only what happened
(item 3). Each runs ``la-trainer`` in this process (click's runner) against a port or a control block
held here."""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from emulator.session import free_tcp_port
from protocol.guid import new_guid
from trainer.commands.cli import main
from trainer.exitcodes import ExitCode
from trainer.session.transport.tcp import listen_refusal
from trainer.system.lockfile import ControlBlockLock

SWITCHES = "Start the game with these command-line switches"


# -- item 3: no switches before a refusal; advice for the side that is refused ----------------------------


def test_a_port_in_use_is_refused_without_switches_and_names_the_trainers_option(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = CliRunner().invoke(
            main, ["socket", "--port", str(port), "--once", "--temp-dir", str(tmp_path / "runs")]
        )
    assert result.exit_code == ExitCode.USAGE, result.output
    assert f"port {port} on 127.0.0.1 is already in use" in result.output
    assert SWITCHES not in result.output and "-LearningAgentsPort=" not in result.output
    assert "the trainer's --port" in result.output and "Traceback" not in result.output


def test_a_free_port_shows_the_switches_once_it_is_listening(tmp_path: Path) -> None:
    port = free_tcp_port()
    result = CliRunner().invoke(
        main,
        ["socket", "--port", str(port), "--once", "--wait", "0.2", "--temp-dir", str(tmp_path / "runs")],
        env={"LA_TRAINER_TIMEOUT_SCALE": "1"},
    )
    assert result.exit_code == ExitCode.TIMEOUT, result.output
    assert f"-LearningAgentsPort={port}" in result.output
    assert result.output.index(SWITCHES) < result.output.index("waiting up to")


def test_a_second_trainer_on_a_guid_is_refused_without_switches_or_torchrun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    guid = new_guid(os.urandom(16)).braced_upper()
    held = ControlBlockLock(guid)
    try:
        result = CliRunner().invoke(main, ["shm", str(tmp_path / "task"), "--create", "--guid", guid])
    finally:
        held.release()
    assert result.exit_code == ExitCode.USAGE, result.output
    assert f"already serves control block {guid}" in result.output
    assert SWITCHES not in result.output and "torchrun" not in result.output
    assert "another GUID" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(
    ("code", "port", "words"),
    [
        (errno.EACCES, 80, "ports below 1024 need administrator rights"),
        (errno.EADDRNOTAVAIL, 48491, "is not an address of this machine"),
    ],
)
def test_listen_refusals_say_what_to_change(code: int, port: int, words: str) -> None:
    text = listen_refusal("10.9.9.9", port, OSError(code, "refused"))
    assert words in text and ("--port" in text or "--host" in text)


@pytest.mark.parametrize(
    ("host", "words"),
    [
        ("nosuchhost.invalid", "cannot resolve the listen address 'nosuchhost.invalid'"),
        ("no such host", "'no such host' is not a host name or address"),
    ],
)
def test_a_host_that_cannot_be_listened_on_names_the_option(tmp_path: Path, host: str, words: str) -> None:
    result = CliRunner().invoke(
        main, ["socket", "--host", host, "--once", "--temp-dir", str(tmp_path / "runs")]
    )
    assert result.exit_code == ExitCode.USAGE, result.output
    assert words in result.output and "--host" in result.output
    assert SWITCHES not in result.output and "train.py" not in result.output


def test_under_torchrun_the_refusal_says_what_torchrun_should_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainer.errors import LaunchError

    guid = new_guid(os.urandom(16)).braced_upper()
    monkeypatch.setenv("LOCAL_RANK", "1")
    with ControlBlockLock(guid, folder=tmp_path), pytest.raises(LaunchError) as refused:
        ControlBlockLock(guid, folder=tmp_path)
    assert "Under torchrun only rank 0 talks to the game" in str(refused.value)


# -- item 2: a server with --wait says it does not apply ---------------------------------------------------


def _start(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "trainer", *argv],
        cwd=cwd,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _read_until(proc: subprocess.Popen[str], words: str, lines: list[str]) -> None:
    assert proc.stdout is not None
    deadline = time.monotonic() + 120.0
    while not any(words in line for line in lines):
        assert time.monotonic() < deadline and proc.poll() is None, "".join(lines)
        lines.append(proc.stdout.readline())


def _stop(proc: subprocess.Popen[str], lines: list[str]) -> str:
    try:
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    return "".join(lines) + rest


@pytest.mark.skipif(sys.platform == "win32", reason="SIGTERM")
@pytest.mark.parametrize("command", ["socket", "shm"])
def test_a_server_given_a_wait_says_it_does_not_apply(tmp_path: Path, command: str) -> None:
    if command == "socket":
        argv = ["socket", "--wait", "5", "--port", str(free_tcp_port()), "--temp-dir", str(tmp_path / "runs")]
        env = None
    else:
        argv = ["shm", str(tmp_path / "task"), "--create", "--serve"]
        env = {"LA_TRAINER_WAIT": "5"}
    proc = _start(argv, tmp_path, env)
    lines: list[str] = []
    _read_until(proc, SWITCHES, lines)
    output = _stop(proc, lines)
    assert proc.returncode == ExitCode.OK, output
    source = "command-line option --wait" if command == "socket" else "environment variable LA_TRAINER_WAIT"
    assert f"la-trainer: note: {source} sets wait to 5 s, which does not apply to a server" in output
    assert "waiting up to" not in output and "Traceback" not in output


# -- item 10: the image's command as its user, on a folder it cannot write -----------------------------------

IMAGE_UID = 10001
"""The Dockerfile's USER (tests/integration/test_docker_entrypoint.py reads it from the file)."""


def test_the_image_user_refused_a_folder_hears_its_uid_and_the_user_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil
    import tempfile

    import trainer.system.container

    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("needs root to run the command as the image's user")
    if not trainer.system.container.in_container():
        pytest.skip("the Docker advice is given in a container only")
    assert f"USER {IMAGE_UID}" in (Path(__file__).resolve().parents[2] / "Dockerfile").read_text()
    fresh = Path(tempfile.mkdtemp(prefix="la-trainer-uid-"))
    try:
        os.chmod(fresh, 0o755)
        runs = fresh / "runs"
        runs.mkdir(mode=0o755)  # root's, as Docker makes a missing host folder

        def become() -> None:
            os.setgroups([])
            os.setgid(IMAGE_UID)
            os.setuid(IMAGE_UID)

        argv = [sys.executable, "-m", "trainer", "socket", "--once", "--temp-dir", str(runs)]
        try:
            done = subprocess.run(
                argv,
                cwd=fresh,
                env={**os.environ, "HOME": str(fresh), "PYTHONDONTWRITEBYTECODE": "1"},
                capture_output=True,
                text=True,
                timeout=120,
                preexec_fn=become,
            )
        except PermissionError:
            pytest.skip(f"{sys.executable} cannot be run by uid {IMAGE_UID}")
        output = done.stdout + done.stderr
        if "No module named" in output:
            pytest.skip(f"la-trainer cannot be imported as uid {IMAGE_UID}")
    finally:
        shutil.rmtree(fresh, ignore_errors=True)
    assert done.returncode == ExitCode.USAGE, output
    assert f"this process runs as uid {IMAGE_UID}; {str(runs)!r} belongs to uid 0" in output
    assert 'docker run --user "$(id -u):$(id -g)"' in output and "Traceback" not in output
