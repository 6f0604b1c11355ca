"""The Docker image's own command, as its own user, against a fresh folder (issue 24 item 7).

The command is read from the Dockerfile text (ENTRYPOINT + CMD, exec form; ``la-trainer`` is run as
``python -m trainer``, the same program), the user from its ``USER`` line, and ``/runs`` is replaced by a
fresh folder. It needs root to become that user (``os.setuid`` before exec), so it is skipped otherwise;
no Docker daemon is needed. Facts:

* a folder the image's user may write (a named volume, or ``--user`` set to the folder's owner as the
  README's ``docker run`` does): the server starts serving, keeps waiting for a game (a server, not one
  session with a 600 s bound), and SIGTERM (``docker stop``) ends it with exit 0;
* a folder it may not write (a host folder owned by someone else, the README's old ``-v`` without
  ``--user``): exit 2 at once with the folder and the fix, no traceback.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from emulator.launch import REPO_ROOT
from emulator.session import free_tcp_port

pytestmark = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0,
    reason="needs root to run the command as the image's user",
)

DOCKERFILE = REPO_ROOT / "Dockerfile"
START_S = 120.0
"""Bound on the server reaching its wait for a game (python + the trainer's imports on a busy box)."""
STOP_S = 60.0
"""Bound on the exit after SIGTERM."""


def _instruction(name: str) -> str:
    """The argument of the last ``name`` instruction (continuation lines joined)."""
    text = DOCKERFILE.read_text(encoding="utf-8").replace("\\\n", " ")
    found = re.findall(rf"^{name}\s+(.+)$", text, flags=re.MULTILINE)
    assert found, f"the Dockerfile has no {name} instruction"
    return str(found[-1]).strip()


def image_command(runs: Path, port: int) -> list[str]:
    """ENTRYPOINT + CMD of the Dockerfile, with /runs -> ``runs`` and the port -> ``port``."""
    entrypoint = json.loads(_instruction("ENTRYPOINT"))
    cmd = json.loads(_instruction("CMD"))
    assert entrypoint == ["la-trainer"], entrypoint
    argv = [sys.executable, "-m", "trainer", *cmd]
    argv = [str(runs) if a == "/runs" else a for a in argv]
    return [str(port) if a == "48491" else a for a in argv]


def image_user() -> int:
    return int(_instruction("USER").split(":")[0])


def _become(uid: int) -> Callable[[], None]:
    def preexec() -> None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)

    return preexec


@pytest.fixture
def fresh() -> Iterator[Path]:
    """A fresh folder the image's user can reach (pytest's own tmp_path sits below a 0700 folder)."""
    folder = Path(tempfile.mkdtemp(prefix="la-trainer-docker-"))
    os.chmod(folder, 0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(autouse=True)
def _interpreter_usable_by_the_image_user(fresh: Path) -> None:
    """This Python must be runnable by that user (a pyenv under /root is not): else skip."""
    try:
        probe = subprocess.run(
            [sys.executable, "-c", "import trainer.commands.cli"],
            cwd=fresh,
            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
            capture_output=True,
            timeout=START_S,
            preexec_fn=_become(image_user()),
        )
    except PermissionError:
        pytest.skip(f"{sys.executable} cannot be run by uid {image_user()}")
    if probe.returncode != 0:
        pytest.skip(
            f"{sys.executable} cannot import la-trainer as uid {image_user()}: {probe.stderr[-300:]!r}"
        )


def _start(argv: list[str], uid: int, home: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "HOME": str(home), "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        argv,
        cwd=home,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_become(uid),
    )


def test_the_image_command_serves_as_its_user_and_stops_on_sigterm(fresh: Path) -> None:
    uid = image_user()
    assert uid != 0, "the image must not run as root"
    runs = fresh / "runs"
    runs.mkdir()
    os.chown(runs, uid, uid)  # what the image does for /runs, or --user does for a host folder
    proc = _start(image_command(runs, free_tcp_port()), uid, runs)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + START_S
        os.set_blocking(proc.stdout.fileno(), False)
        while not any("serving session after session" in line for line in lines):
            assert proc.poll() is None, f"the server exited ({proc.returncode}):\n{''.join(lines)}"
            assert time.monotonic() < deadline, f"no 'serving' line within {START_S:g} s:\n{''.join(lines)}"
            line = proc.stdout.readline()
            if line:
                lines.append(line)
            else:
                time.sleep(0.05)
        # A session's folder comes with a game's config (issue 30); the volume was checked writable at start.
        assert not (runs / "External0").exists(), "a session folder before any game"
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(STOP_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    os.set_blocking(proc.stdout.fileno(), True)
    output = "".join(lines) + proc.stdout.read()
    assert code == 0, f"exit {code} after SIGTERM:\n{output}"
    assert "server stopped" in output and "Traceback" not in output, output


def test_the_image_command_refuses_a_folder_its_user_cannot_write(fresh: Path) -> None:
    uid = image_user()
    runs = fresh / "runs"
    runs.mkdir(mode=0o755)  # root's, as Docker creates a missing host folder for -v
    home = fresh / "home"
    home.mkdir()
    os.chown(home, uid, uid)
    proc = _start(image_command(runs, free_tcp_port()), uid, home)
    try:
        output, _ = proc.communicate(timeout=START_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 2, f"exit {proc.returncode}:\n{output}"
    assert str(runs) in output and "--temp-dir" in output and "Traceback" not in output, output
