"""Bad launch input ends the real trainer with a documented exit code and one readable paragraph.

The engine (or a user in attach mode) can hand the trainer a missing or garbled GUID, a region that does
not exist, a port that is taken, or config files that are unreadable or wrong. Each must end the process
quickly with a non-zero code from ``trainer/exitcodes.py`` and a message naming the switch or the file,
never with a Python traceback and never by hanging.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from emulator.game import ShmGame, SocketGame
from emulator.launch import (
    EngineLayout,
    TrainerProcess,
    make_task_dir,
    shared_memory_command,
    socket_command,
)
from emulator.session import EngineTask, build_session_config, free_tcp_port
from protocol.guid import new_guid
from tests.support.sessions import SETTINGS
from trainer.exitcodes import ExitCode

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EXIT_TIMEOUT_S = 40.0
"""Bound on one failing trainer's lifetime (it imports torch before it reads configs)."""
DOCUMENTED = {int(code) for code in ExitCode} - {int(ExitCode.OK)}
TRACEBACK = "Traceback (most recent call last)"


def trainer_env() -> dict[str, str]:
    env = dict(os.environ)
    env["LA_TRAINER_TIMEOUT_SCALE"] = "0.05"  # a wait that should not happen fails fast instead of hanging
    return env


def run_to_exit(
    argv: list[str], cwd: Path, before_wait: Callable[[TrainerProcess], None] | None = None
) -> tuple[int, str]:
    """Run the trainer to its exit (bounded; killed otherwise) and return (code, output)."""
    proc = TrainerProcess(argv, cwd=cwd, env=trainer_env())
    try:
        if before_wait is not None:
            before_wait(proc)
        code = proc.wait(EXIT_TIMEOUT_S)
        assert code is not None, f"the trainer did not exit within {EXIT_TIMEOUT_S} s:\n{proc.log_tail()}"
        return code, proc.output()
    finally:
        proc.close()


def check_failure(code: int, output: str, expected: ExitCode | set[ExitCode], *names: str) -> None:
    allowed = {int(expected)} if isinstance(expected, ExitCode) else {int(c) for c in expected}
    assert code in DOCUMENTED, f"exit code {code} is not documented in trainer/exitcodes.py:\n{output}"
    assert code in allowed, f"exit code {code} ({ExitCode(code).name}), expected {allowed}:\n{output}"
    assert TRACEBACK not in output, f"a user error must not print a traceback:\n{output}"
    for name in names:
        assert name in output, f"the message does not name {name!r}:\n{output}"


@pytest.fixture
def layout(tmp_path: Path) -> EngineLayout:
    return EngineLayout.create(tmp_path / "engine")


def spawned_argv(layout: EngineLayout, guid: str) -> list[str]:
    return shared_memory_command(layout, "Training", make_task_dir(layout.intermediate_dir), guid)


def test_missing_guid_names_the_switch(layout: EngineLayout) -> None:
    argv = spawned_argv(layout, new_guid(os.urandom(16)).braced_upper())
    g = argv.index("-g")
    del argv[g : g + 2]
    code, output = run_to_exit(argv, layout.root)
    check_failure(code, output, ExitCode.USAGE, "-g")


@pytest.mark.parametrize("garbled", ["{nonsense}", "1234", "{XXXXXXXX-XXXX-XXXX-XXXX-XXXXXXXXXXXX}", "-c"])
def test_garbled_guid_names_the_switch(layout: EngineLayout, garbled: str) -> None:
    argv = spawned_argv(layout, new_guid(os.urandom(16)).braced_upper())
    argv[argv.index("-g") + 1] = garbled
    code, output = run_to_exit(argv, layout.root)
    check_failure(code, output, ExitCode.USAGE, "-g")


def test_nonexistent_controls_region_names_the_guid(layout: EngineLayout) -> None:
    guid = new_guid(os.urandom(16)).braced_upper()  # never created: the engine would have made it first
    code, output = run_to_exit(spawned_argv(layout, guid), layout.root)
    check_failure(code, output, ExitCode.USAGE, guid)


def test_missing_task_directory_names_it(layout: EngineLayout) -> None:
    game = ShmGame.create(layout.root / "unused", timeout=1.0)
    try:
        missing = layout.intermediate_dir / "NoSuchTask7"
        argv = shared_memory_command(layout, "Training", missing, game.controls_guid)
        code, output = run_to_exit(argv, layout.root)
        check_failure(code, output, ExitCode.USAGE, str(missing))
    finally:
        game.close()


def test_port_in_use_names_the_address(layout: EngineLayout) -> None:
    port = free_tcp_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen(1)
        code, output = run_to_exit(socket_command(layout, "Training", "127.0.0.1", port), layout.root)
    check_failure(code, output, ExitCode.USAGE, str(port))


def _write(name: str, content: bytes) -> Callable[[Path], None]:
    def tamper(config_dir: Path) -> None:
        (config_dir / name).write_bytes(content)

    return tamper


def _make_directory(name: str) -> Callable[[Path], None]:
    def tamper(config_dir: Path) -> None:
        (config_dir / name).unlink()
        (config_dir / name).mkdir()  # unreadable as a file, whoever runs the test (root reads chmod 000)

    return tamper


def _remove_shared_memory_json(config_dir: Path) -> None:
    for path in config_dir.glob("shared-memory-*.json"):
        path.unlink()


def _method(method: str) -> Callable[[Path], None]:
    def tamper(config_dir: Path) -> None:
        path = config_dir / "trainer-config.json"
        path.write_bytes(path.read_bytes().replace(b'"FlowMatching"', f'"{method}"'.encode()))

    return tamper


@pytest.mark.parametrize(
    ("tamper", "expected", "names"),
    [
        (_write("data-config.json", b'{"ReplayBuffers": [ oops'), ExitCode.BAD_DATA, ("data-config.json",)),
        (_write("trainer-config.json", b"[1, 2, 3]"), ExitCode.BAD_DATA, ("trainer-config.json",)),
        (
            _make_directory("trainer-config.json"),
            {ExitCode.USAGE, ExitCode.BAD_DATA},
            ("trainer-config.json",),
        ),
        (_remove_shared_memory_json, {ExitCode.USAGE, ExitCode.BAD_DATA}, ("shared-memory-",)),
    ],
    ids=[
        "garbled-data-config",
        "wrong-type-trainer-config",
        "unreadable-trainer-config",
        "missing-shm-json",
    ],  # other TrainerMethods go to the engine's own train.py: tests/integration/test_handover.py
)
def test_bad_shared_memory_configs_name_the_file(
    layout: EngineLayout,
    bimodal_task: EngineTask,
    tamper: Callable[[Path], None],
    expected: ExitCode | set[ExitCode],
    names: tuple[str, ...],
) -> None:
    config, _ = build_session_config(bimodal_task, SETTINGS, str(layout.intermediate_dir))
    task_dir = make_task_dir(layout.intermediate_dir)
    game = ShmGame.create(task_dir / "Configs", timeout=5.0)
    try:
        argv = shared_memory_command(layout, "Training", task_dir, game.controls_guid)

        def begin(proc: TrainerProcess) -> None:
            game.process_alive = proc.alive
            game.begin(config, before_signal=tamper)

        code, output = run_to_exit(argv, layout.root, begin)
        check_failure(code, output, expected, *names)
    finally:
        game.close()


def test_bad_socket_config_json_fails_with_bad_data(layout: EngineLayout, bimodal_task: EngineTask) -> None:
    config, _ = build_session_config(bimodal_task, SETTINGS, None)
    port = free_tcp_port()
    games: list[SocketGame] = []

    def begin(proc: TrainerProcess) -> None:
        game = SocketGame.connect(
            "127.0.0.1", port, timeout=SETTINGS.engine_timeout_s, process_alive=proc.alive
        )
        games.append(game)
        game.begin(config, raw_config=b'{"TrainerSettings": {"TrainerMethod": ')

    try:
        code, output = run_to_exit(socket_command(layout, "Training", "127.0.0.1", port), layout.root, begin)
        check_failure(code, output, ExitCode.BAD_DATA, "config")
    finally:
        for game in games:
            game.close()
