"""The engine's other trainers keep working with la-trainer in place of its train.py (trainer.dropin.handover).

The engine side is the emulator's game (ShmGame: control block, config files, regions); the engine's own
``train.py`` is a recording stand-in in the fake engine tree, where la-trainer finds it (beside the NNE
plugin named by ``--nne-cpu-path``). The stand-in writes down what it got (argv, process id, working
folder, interpreter, environment, the control block and the config as it found them) and then carries on
the session as the engine's trainer would: it acknowledges the config and asks for network 0, which the
game hands over. So the session reached it intact, from its start.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from emulator.game import ShmGame
from emulator.launch import (
    TRAIN_SCRIPT,
    EngineLayout,
    TrainerProcess,
    make_task_dir,
    shared_memory_command,
    socket_command,
)
from emulator.session import EngineTask, build_session_config, free_tcp_port
from tests.support.sessions import SETTINGS
from trainer.dropin.handover import DROPIN_MARKER
from trainer.exitcodes import ExitCode
from trainer.records.progress import STATUS_FILE_NAME
from trainer.settings.environment import ENV_HANDED_OVER

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform == "win32", reason="the stand-in maps the block with posix_ipc"),
]

EXIT_BOUND_S = 60.0
"""The trainer, the hand-over and the stand-in, start to end (python starts twice; no torch import)."""
ENGINE_TIMEOUT_S = 5.0
"""The game's communicator timeout in the slow-start test (the engine's default is 10 s)."""
SCRIPT_START_S = float(os.environ.get("HANDOVER_START_S", "15"))
"""How long the engine's script takes to its first handshake there: three times the game's timeout (the
issue's 30 s start against the engine's 10 s is ``HANDOVER_START_S=30`` with ENGINE_TIMEOUT_S 10)."""

RECORDING_STAND_IN = r"""
import json, mmap, os, struct, sys, time
# What the engine's script spends before its first handshake (its Python, torch, its trainer module).
time.sleep(float(os.environ.get("STAND_IN_START_S", "0")))
import posix_ipc

out = {"argv": sys.argv[1:], "pid": os.getpid(), "cwd": os.getcwd(), "executable": sys.executable,
       "handed_over": os.environ.get("LA_TRAINER_HANDED_OVER")}
if "SharedMemory" in sys.argv:
    guid = sys.argv[sys.argv.index("-g") + 1]
    task_dir = sys.argv[sys.argv.index("SharedMemory") + 1]
    shm = posix_ipc.SharedMemory("/" + guid, 0)
    block = mmap.mmap(shm.fd, 40)
    shm.close_fd()
    controls = list(struct.unpack_from("<10i", block))
    out["controls_found"] = controls
    with open(os.path.join(task_dir, "Configs", "trainer-config.json"), "rb") as f:
        raw = f.read()
    text = raw.decode("utf-16") if raw[:2] in (b"\xff\xfe", b"\xfe\xff") else raw.decode("utf-8")
    out["method"] = json.loads(text)["TrainerMethod"]
    # What the engine's trainer does next (spec 2.4): acknowledge the config, request network 0.
    struct.pack_into("<i", block, 12, 0)
    struct.pack_into("<i", block, 32, 0)
    struct.pack_into("<i", block, 16, 1)
    deadline = time.monotonic() + 30
    while struct.unpack_from("<i", block, 16)[0] != 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    out["network_0_taken"] = struct.unpack_from("<i", block, 16)[0] == 0
    block.close()
else:
    host, port = sys.argv[sys.argv.index("Socket") + 1].rsplit(":", 1)
    listener = __import__("socket").create_server((host, int(port)))  # the port is still free
    out["listened"] = True
    if os.environ.get("STAND_IN_SERVE"):
        # The engine's trainer over a socket (spec 3): the config first, then what the game sends unasked;
        # it ends the session with Complete (5) and reads until the game closes the connection.
        conn, _ = listener.accept()
        stream = conn.makefile("rb")
        out["first_signal"] = stream.read(1)[0]
        size = struct.unpack("<i", stream.read(4))[0]
        out["method"] = json.loads(stream.read(size))["TrainerSettings"]["TrainerMethod"]
        conn.sendall(bytes([5]))
        out["after_config"] = len(stream.read())
        conn.close()
    listener.close()
with open(os.environ["STAND_IN_OUT"], "w") as f:
    json.dump(out, f)
sys.exit(0)
"""


@pytest.fixture
def layout(tmp_path: Path) -> EngineLayout:
    layout = EngineLayout.create(tmp_path / "engine")
    layout.engine_train_py.write_text(RECORDING_STAND_IN, encoding="utf-8")
    return layout


@pytest.fixture(scope="module")
def task() -> EngineTask:
    return EngineTask.benchmark("bimodal", size=48, seed=0)


def _env(tmp_path: Path) -> dict[str, str]:
    env = {**os.environ, "STAND_IN_OUT": str(tmp_path / "stand-in.json")}
    env.pop(ENV_HANDED_OVER, None)
    return env


def _method(method: str) -> Callable[[Path], None]:
    def tamper(config_dir: Path) -> None:
        path = config_dir / "trainer-config.json"
        raw = path.read_bytes()
        encoding = "utf-16" if raw[:2] in (b"\xff\xfe", b"\xfe\xff") else "utf-8"
        text = raw.decode(encoding).replace('"FlowMatching"', f'"{method}"')
        path.write_bytes(text.encode(encoding))

    return tamper


@pytest.mark.parametrize("method", ["BehaviorCloning", "PPO"])
def test_a_shared_memory_run_of_another_method_reaches_the_engine_script_intact(
    method: str, layout: EngineLayout, task: EngineTask, tmp_path: Path
) -> None:
    config, snapshots = build_session_config(task, SETTINGS, str(layout.intermediate_dir))
    task_dir = make_task_dir(layout.intermediate_dir)
    game = ShmGame.create(task_dir / "Configs", timeout=EXIT_BOUND_S)
    argv = shared_memory_command(layout, "Training", task_dir, game.controls_guid, log=False)
    proc = TrainerProcess(argv, cwd=layout.root, env=_env(tmp_path))
    try:
        game.process_alive = proc.alive
        game.begin(config, before_signal=_method(method))
        game.send_network(0, snapshots[0])  # returns once the stand-in asked for it and took it
        code = proc.wait(EXIT_BOUND_S)
        output = proc.output()
    finally:
        proc.close()
        game.close()
    assert code == 0, output
    seen = json.loads((tmp_path / "stand-in.json").read_text())
    assert seen["argv"] == argv[2:]  # verbatim, the empty log item included
    assert seen["pid"] == proc.pid  # exec: the engine's process handle and output pipe still name it
    assert seen["cwd"] == str(layout.root) and seen["executable"] == sys.executable
    assert seen["handed_over"] == "1"
    assert seen["method"] == method
    controls = seen["controls_found"]
    assert controls[3] == 1, controls  # ConfigSignal still raised: la-trainer acknowledged nothing
    assert controls[4] == 0 and controls[8] == -1, controls  # no network was requested before it
    assert seen["network_0_taken"] is True
    assert f"TrainerMethod is '{method}'" in output and str(layout.engine_train_py) in output


def _process_group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def test_an_engine_script_that_starts_slower_than_the_engine_timeout_still_takes_the_run(
    layout: EngineLayout, task: EngineTask, tmp_path: Path
) -> None:
    """The engine's clock, reset once before the hand-over, would run out while the engine's script
    starts (its Python and torch): la-trainer keeps pinging until the script asks for network 0 itself.
    Also: the run's status file does not stay at "waiting for config", and the pinger ends with the run."""
    config, snapshots = build_session_config(task, SETTINGS, str(layout.intermediate_dir))
    task_dir = make_task_dir(layout.intermediate_dir)
    game = ShmGame.create(task_dir / "Configs", timeout=ENGINE_TIMEOUT_S)
    argv = shared_memory_command(layout, "Training", task_dir, game.controls_guid)
    env = {**_env(tmp_path), "STAND_IN_START_S": str(SCRIPT_START_S)}
    proc = TrainerProcess(argv, cwd=layout.root, env=env)
    try:
        game.process_alive = proc.alive
        game.begin(config, before_signal=_method("BehaviorCloning"))
        game.send_network(0, snapshots[0])  # raises EngineFailure(TIMEOUT) if the clock ran out
        code = proc.wait(EXIT_BOUND_S + SCRIPT_START_S)
        output = proc.output()
        pings = [what for _, what in game.events if what.startswith("ping taken")]
    finally:
        proc.close()
        game.close()
    assert code == 0, output
    seen = json.loads((tmp_path / "stand-in.json").read_text())
    assert seen["network_0_taken"] is True and seen["pid"] == proc.pid
    # One ping before the exec cannot cover a start three times the timeout: the pinger did.
    assert len(pings) >= 2, game.events
    assert not (task_dir / STATUS_FILE_NAME).exists()
    # The pinger was a child of the process that became the script: nothing of the run outlives it.
    for _ in range(100):
        if _process_group_gone(proc.pid):
            break
        time.sleep(0.1)
    assert _process_group_gone(proc.pid), "the pinger outlived the engine's script"


def test_a_socket_run_for_another_module_is_handed_over_before_anything_is_bound(
    layout: EngineLayout, tmp_path: Path
) -> None:
    port = free_tcp_port()
    argv = socket_command(layout, "Training", "127.0.0.1", port, trainer_module="learning_core.train_ppo")
    proc = TrainerProcess(argv, cwd=layout.root, env=_env(tmp_path))
    try:
        code = proc.wait(EXIT_BOUND_S)
        output = proc.output()
    finally:
        proc.close()
    assert code == 0, output
    seen = json.loads((tmp_path / "stand-in.json").read_text())
    assert seen["argv"] == argv[2:] and seen["pid"] == proc.pid and seen["listened"] is True


def _socket_session(
    layout: EngineLayout,
    task: EngineTask,
    tmp_path: Path,
    method: str,
    env: dict[str, str],
    *,
    script: Path | None = None,
) -> tuple[int | None, str, object, int]:
    """A socket session with the engine's default -m and a ``method`` config: the trainer's exit code and
    output, what the game got back first (network 0 or Completed), and the network's size."""
    from dataclasses import replace

    from emulator.game import SocketGame
    from emulator.game.common import EngineFailure

    config, snapshots = build_session_config(task, SETTINGS, str(layout.intermediate_dir))
    config = replace(config, trainer=replace(config.trainer, trainer_method=method))
    port = free_tcp_port()
    # The engine's default -m (DEFAULT_TRAINER_MODULE).
    argv = socket_command(layout, "Training", "127.0.0.1", port, script=script or TRAIN_SCRIPT)
    proc = TrainerProcess(argv, cwd=layout.root, env=env)
    try:
        game = SocketGame.connect("127.0.0.1", port, timeout=EXIT_BOUND_S, process_alive=proc.alive)
        answer: object
        try:
            game.begin(config)
            game.send_network(0, snapshots[0])  # unasked, as the engine does after its config
            answer = game.receive_network(0)
        except EngineFailure as failure:  # the trainer ended the session (a refusal)
            answer = failure
        finally:
            game.close()
        code = proc.wait(EXIT_BOUND_S)
        output = proc.output()
    finally:
        proc.close()
    return code, output, answer, len(snapshots[0])


def test_a_socket_run_of_another_method_with_the_default_module_is_relayed_to_the_engine_script(
    layout: EngineLayout, task: EngineTask, tmp_path: Path
) -> None:
    """The engine's default -m is what flow-matching call sites send too, so only the config tells: the
    drop-in reads it, then relays the session (the config, then everything both ways) to the engine's
    script. It used to end with exit 7 although the install message said such runs are handed over."""
    from emulator.game.common import COMPLETED

    env = {**_env(tmp_path), "STAND_IN_SERVE": "1"}
    code, output, answer, network_size = _socket_session(layout, task, tmp_path, "BehaviorCloning", env)
    assert code == 0, output
    assert answer is COMPLETED, output  # the script's Complete reached the game through the relay
    seen = json.loads((tmp_path / "stand-in.json").read_text())
    assert seen["first_signal"] == 1 and seen["method"] == "BehaviorCloning"
    assert seen["after_config"] == 1 + 4 + network_size  # SendNetwork 0, byte for byte
    assert seen["handed_over"] == "1" and "Traceback" not in output


def test_a_socket_run_of_another_method_without_an_engine_script_fails_fast_and_says_what_to_do(
    layout: EngineLayout, task: EngineTask, tmp_path: Path
) -> None:
    layout.engine_train_py.unlink()
    code, output, _, _ = _socket_session(layout, task, tmp_path, "BehaviorCloning", _env(tmp_path))
    assert code == ExitCode.UNSUPPORTED, output
    assert "'BehaviorCloning'" in output and "TrainerFileName" in output and "Traceback" not in output
    assert not (tmp_path / "stand-in.json").exists()


def test_la_trainer_copied_over_the_engine_script_is_refused_not_looped(
    layout: EngineLayout, task: EngineTask, tmp_path: Path
) -> None:
    """The README used to tell users to copy the drop-in over the engine's file: then there is no original
    to hand a PPO run to, and la-trainer must say so (exit 7), never run itself again."""
    layout.engine_train_py.write_text(f'"""{DROPIN_MARKER}"""\nimport sys\nsys.exit(98)\n', encoding="utf-8")
    config, _ = build_session_config(task, SETTINGS, str(layout.intermediate_dir))
    task_dir = make_task_dir(layout.intermediate_dir)
    game = ShmGame.create(task_dir / "Configs", timeout=EXIT_BOUND_S)
    argv = shared_memory_command(layout, "Training", task_dir, game.controls_guid)
    proc = TrainerProcess(argv, cwd=layout.root, env=_env(tmp_path))
    try:
        game.process_alive = proc.alive
        game.begin(config, before_signal=_method("PPO"))
        code = proc.wait(EXIT_BOUND_S)
        output = proc.output()
    finally:
        proc.close()
        game.close()
    assert code == ExitCode.UNSUPPORTED, output
    assert "'PPO'" in output and "la-trainer itself" in output and "Traceback" not in output


BLOCKER = r"""
import os, sys

_BLOCKED = {m for m in os.environ.get("BLOCKED_MODULES", "").split(",") if m}


class _Blocker:
    # The engine's Python without these modules (a changed engine Python, a half install); the engine's
    # own script (started by the hand-over, which marks its environment) sees them again.
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in _BLOCKED:
            raise ImportError(f"No module named {name!r} (blocked by the test)")
        return None


if _BLOCKED and not os.environ.get("LA_TRAINER_HANDED_OVER"):
    sys.meta_path.insert(0, _Blocker())
"""


def _installed_shim(tmp_path: Path, layout: EngineLayout) -> Path:
    """The shim install-engine writes, at its place in a project; la-trainer is found through the
    checkout on PYTHONPATH (the project's site-packages is empty)."""
    from trainer.commands.install_engine import ENGINE_SCRIPT, INSTALL_FOLDER, _shim_text

    shim = layout.project_dir.joinpath(INSTALL_FOLDER, "Engine", *ENGINE_SCRIPT)
    shim.parent.mkdir(parents=True)
    shim.write_text(_shim_text(layout.engine_train_py), encoding="utf-8")
    return shim


def _blocked_env(tmp_path: Path, modules: str) -> dict[str, str]:
    from emulator.launch import REPO_ROOT

    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(BLOCKER, encoding="utf-8")
    path = os.pathsep.join([str(blocker), str(REPO_ROOT)])
    return {**_env(tmp_path), "BLOCKED_MODULES": modules, "PYTHONPATH": path}


MISSING = "torch,msgpack,posix_ipc"


def test_a_half_install_still_hands_other_methods_to_the_engine_script(
    layout: EngineLayout, task: EngineTask, tmp_path: Path
) -> None:
    """torch, msgpack and posix_ipc cannot be loaded: a BehaviorCloning run still reaches the engine's
    script through the installed shim (it used to end with exit 1 and an ImportError traceback)."""
    shim = _installed_shim(tmp_path, layout)
    config, snapshots = build_session_config(task, SETTINGS, str(layout.intermediate_dir))
    task_dir = make_task_dir(layout.intermediate_dir)
    game = ShmGame.create(task_dir / "Configs", timeout=EXIT_BOUND_S)
    argv = shared_memory_command(layout, "Training", task_dir, game.controls_guid, script=shim)
    proc = TrainerProcess(argv, cwd=layout.root, env=_blocked_env(tmp_path, MISSING))
    try:
        game.process_alive = proc.alive
        game.begin(config, before_signal=_method("BehaviorCloning"))
        game.send_network(0, snapshots[0])
        code = proc.wait(EXIT_BOUND_S)
        output = proc.output()
    finally:
        proc.close()
        game.close()
    assert code == 0, output
    seen = json.loads((tmp_path / "stand-in.json").read_text())
    assert seen["method"] == "BehaviorCloning" and seen["network_0_taken"] is True
    assert seen["controls_found"][3] == 1  # the config reached it unacknowledged
    assert "Traceback" not in output


@pytest.mark.parametrize("modules", ["torch", "msgpack", "posix_ipc"])
def test_a_flow_matching_run_of_a_half_install_ends_with_one_line_naming_what_is_missing(
    modules: str, layout: EngineLayout, task: EngineTask, tmp_path: Path
) -> None:
    shim = _installed_shim(tmp_path, layout)
    config, _ = build_session_config(task, SETTINGS, str(layout.intermediate_dir))
    task_dir = make_task_dir(layout.intermediate_dir)
    game = ShmGame.create(task_dir / "Configs", timeout=EXIT_BOUND_S)
    argv = shared_memory_command(layout, "Training", task_dir, game.controls_guid, script=shim)
    proc = TrainerProcess(argv, cwd=layout.root, env=_blocked_env(tmp_path, modules))
    try:
        game.process_alive = proc.alive
        game.begin(config)
        code = proc.wait(EXIT_BOUND_S)
        output = proc.output()
    finally:
        proc.close()
        game.close()
    assert code == ExitCode.USAGE, output
    lines = [line for line in output.splitlines() if line.startswith("la-trainer:")]
    assert len(lines) == 1, output
    assert modules in lines[0] and "la-trainer install-engine" in lines[0], output
    assert "Traceback" not in output and lines[0].isascii()
    assert not (tmp_path / "stand-in.json").exists()  # a FlowMatching run is never handed over


def test_under_scale_out_another_method_is_handed_over_without_torchrun(
    layout: EngineLayout, task: EngineTask, tmp_path: Path
) -> None:
    """LA_TRAINER_NPROC_PER_NODE=2 used to send every run through torchrun, whose ranks cannot hand a run
    over (exit 7): the method is now read from the config file before torchrun would start."""
    config, snapshots = build_session_config(task, SETTINGS, str(layout.intermediate_dir))
    task_dir = make_task_dir(layout.intermediate_dir)
    game = ShmGame.create(task_dir / "Configs", timeout=EXIT_BOUND_S)
    argv = shared_memory_command(layout, "Training", task_dir, game.controls_guid)
    env = {**_env(tmp_path), "LA_TRAINER_NPROC_PER_NODE": "2"}
    proc = TrainerProcess(argv, cwd=layout.root, env=env)
    try:
        game.process_alive = proc.alive
        game.begin(config, before_signal=_method("PPO"))
        game.send_network(0, snapshots[0])
        code = proc.wait(EXIT_BOUND_S)
        output = proc.output()
    finally:
        proc.close()
        game.close()
    assert code == 0, output
    seen = json.loads((tmp_path / "stand-in.json").read_text())
    assert seen["method"] == "PPO" and seen["pid"] == proc.pid and seen["network_0_taken"] is True
    assert seen["controls_found"][3] == 1
    assert "scale-out: 2 processes" not in output, output  # no rank ever started


def test_a_half_install_relays_a_socket_run_of_another_method(
    layout: EngineLayout, task: EngineTask, tmp_path: Path
) -> None:
    """Over a socket too, with the engine's default -m: torch, msgpack and posix_ipc cannot be loaded, and
    a BehaviorCloning session still reaches the engine's script (the front is standard library only)."""
    from emulator.game.common import COMPLETED

    shim = _installed_shim(tmp_path, layout)
    env = {**_blocked_env(tmp_path, MISSING), "STAND_IN_SERVE": "1"}
    code, output, answer, _ = _socket_session(layout, task, tmp_path, "BehaviorCloning", env, script=shim)
    assert code == 0 and answer is COMPLETED, output
    assert json.loads((tmp_path / "stand-in.json").read_text())["method"] == "BehaviorCloning"
    assert "Traceback" not in output
