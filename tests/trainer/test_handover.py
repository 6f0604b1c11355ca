"""trainer.dropin.handover: where the engine's own train.py is, which runs go there, and how (spec §1.6, §11 item 3).
The whole hand-over, through a real trainer process, is tests/integration/test_handover.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from protocol.names import ENGINE_DEFAULT_MODULE, FLOW_MATCHING_MODULE
from trainer.dropin.handover import (
    DROPIN_MARKER,
    engine_train_py,
    hand_over,
    is_la_trainer_script,
    socket_hands_over,
)
from trainer.session.run import socket_refusal
from trainer.settings.environment import ENV_ENGINE_TRAIN_PY, ENV_HANDED_OVER

EXPERIMENTAL = ("Engine", "Plugins", "Experimental")


def _engine(tmp_path: Path, script: str = "print('engine')\n") -> tuple[Path, Path]:
    """A fake engine: (its NNE CPU python folder as --nne-cpu-path names it, its train.py)."""
    nne = tmp_path.joinpath(*EXPERIMENTAL, "NNERuntimeBasicCpu", "Content", "Python")
    nne.mkdir(parents=True)
    train = tmp_path.joinpath(*EXPERIMENTAL, "LearningCore", "Content", "Python", "train.py")
    train.parent.mkdir(parents=True)
    train.write_text(script)
    return nne, train


def test_the_engine_script_is_found_beside_the_nne_plugin(tmp_path: Path) -> None:
    nne, train = _engine(tmp_path)
    found, why = engine_train_py(str(nne), tmp_path / "ours.py", environ={})
    assert found == train and why == ""


def test_the_explicit_path_wins(tmp_path: Path) -> None:
    nne, _ = _engine(tmp_path)
    explicit = tmp_path / "elsewhere" / "train.py"
    explicit.parent.mkdir()
    explicit.write_text("print('other')\n")
    found, _ = engine_train_py(str(nne), tmp_path / "ours.py", environ={ENV_ENGINE_TRAIN_PY: str(explicit)})
    assert found == explicit


def test_our_own_drop_in_is_never_the_engine_script(tmp_path: Path) -> None:
    """A copy of the drop-in over the engine's file (what the README used to suggest) is refused."""
    nne, train = _engine(tmp_path, f'"""{DROPIN_MARKER}"""\nimport sys\n')
    found, why = engine_train_py(str(nne), tmp_path / "ours.py", environ={})
    assert found is None and "la-trainer itself" in why and str(train) in why


def test_every_script_we_ship_carries_the_marker() -> None:
    root = Path(__file__).resolve().parents[2]
    for script in (root / "scripts" / "train.py", root / "trainer" / "dropin" / "train.py"):
        assert is_la_trainer_script(script), script


def test_the_same_file_as_ours_is_refused(tmp_path: Path) -> None:
    nne, train = _engine(tmp_path)
    found, why = engine_train_py(str(nne), train, environ={})
    assert found is None and "la-trainer itself" in why


def test_a_second_hand_over_is_refused(tmp_path: Path) -> None:
    nne, _ = _engine(tmp_path)
    found, why = engine_train_py(str(nne), tmp_path / "ours.py", environ={ENV_HANDED_OVER: "1"})
    assert found is None and ENV_HANDED_OVER in why


def test_no_script_and_no_hint_says_why(tmp_path: Path) -> None:
    found, why = engine_train_py(None, tmp_path / "ours.py", environ={})
    assert found is None and "--nne-cpu-path" in why
    found, why = engine_train_py(str(tmp_path / "nowhere" / "Python"), tmp_path / "ours.py", environ={})
    assert found is None


@pytest.mark.parametrize(
    ("module", "hands_over"),
    [
        (None, False),
        ("", False),
        (ENGINE_DEFAULT_MODULE, False),  # what flow-matching call sites send unless changed (spec §1.6)
        (FLOW_MATCHING_MODULE, False),
        ("learning_core.train_ppo", True),
        ("my_project.custom_trainer", True),
    ],
)
def test_socket_runs_are_decided_from_the_module(module: str | None, hands_over: bool) -> None:
    assert socket_hands_over(module) is hands_over


def test_the_socket_refusal_names_the_method_and_what_to_do() -> None:
    text = str(socket_refusal("BehaviorCloning"))
    assert "'BehaviorCloning'" in text and "EditorEngineRelativePath" in text and "TrainerFileName" in text
    assert text.isascii()


def test_windows_runs_the_engine_script_as_a_child_with_our_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[dict[str, Any]] = []

    def fake_call(command: list[str], **kwargs: Any) -> int:
        calls.append({"command": command, **kwargs})
        return 42

    monkeypatch.setattr(subprocess, "call", fake_call)
    target = tmp_path / "train.py"
    argv = ["Training", "-m", "learning_core.train_ppo", "", "SharedMemory", "C:\\Task", "-g", "{G}"]
    assert hand_over(target, argv, platform="win32") == 42
    (call,) = calls
    assert call["command"] == [sys.executable, str(target), *argv]  # verbatim: the empty item stays
    assert call["env"][ENV_HANDED_OVER] == "1"
    assert call["stdout"] == 1 and call["stderr"] == 2 and call["stdin"] == subprocess.DEVNULL


def test_posix_replaces_the_process(tmp_path: Path) -> None:
    """exec keeps the process id (the engine's handle) and the output pipe."""
    out = tmp_path / "seen.txt"
    target = tmp_path / "engine_train.py"
    target.write_text(
        "import os, sys\n"
        f"flag = os.environ.get({ENV_HANDED_OVER!r})\n"
        f"open({str(out)!r}, 'w').write(str(os.getpid()) + ' ' + str(sys.argv[1:]) + ' ' + str(flag))\n"
    )
    root = Path(__file__).resolve().parents[2]
    code = (
        "import os, sys\n"
        f"sys.path.insert(0, {str(root)!r})\n"
        "from pathlib import Path\n"
        "from trainer.dropin.handover import hand_over\n"
        "print(os.getpid(), flush=True)\n"
        f"hand_over(Path({str(target)!r}), ['Training', '', 'x y'])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    pid = done.stdout.strip()
    assert done.returncode == 0, done.stderr
    assert out.read_text() == f"{pid} ['Training', '', 'x y'] 1"


def test_the_relayed_command_line_changes_only_the_address() -> None:
    from trainer.dropin.relay import relayed_argv

    argv = ["Training", "-m", ENGINE_DEFAULT_MODULE, "", "Socket", "127.0.0.1:48491", "C:\\Temp"]
    assert relayed_argv(argv, 5000) == [*argv[:5], "127.0.0.1:5000", argv[6]]
    with pytest.raises(ValueError):
        relayed_argv(["Training", "SharedMemory", "/task"], 5000)


def test_the_method_is_read_from_a_whole_config_file_only() -> None:
    from trainer.dropin.method import method_from_config

    assert method_from_config(b'{"TrainerMethod": "PPO"}') == "PPO"
    assert method_from_config('{"TrainerMethod": "PPO"}'.encode("utf-16")) == "PPO"  # BOM: a UE writer
    assert method_from_config(b'{"TempDirectory": "x"}') == "FlowMatching"  # the engine default
    assert method_from_config(b'{"TrainerMethod": "PP') is None  # still being written
    assert method_from_config(b"") is None


@pytest.mark.parametrize(
    ("controls", "taken_over"),
    [
        ((0, 0, 0, 1, 0, 0, 0, 1, -1, -1), False),  # as handed over: config posted, our ping pending
        ((0, 0, 0, 0, 0, 0, 0, 0, -1, -1), False),  # the script acknowledged the config, asked nothing yet
        ((0, 0, 0, 0, 1, 0, 0, 0, -1, -1), True),  # it asked for a network
        ((0, 0, 0, 0, 0, 0, 0, 0, 0, -1), True),  # the game answered that request already
        ((0, 0, 0, 0, 0, 0, 1, 0, -1, -1), True),  # the game stopped the session
    ],
)
def test_the_hand_over_pinger_stops_at_the_scripts_first_handshake(
    controls: tuple[int, ...], taken_over: bool
) -> None:
    from trainer.dropin.pinger import script_took_over

    assert script_took_over(controls) is taken_over


def test_a_scale_out_job_ends_with_its_first_recorded_failure(tmp_path: Path) -> None:
    """torchrun stops the other ranks once one fails; they record "interrupted" after the real cause."""
    import os

    from trainer.dropin.torchrun import ENV_EXIT_DIR, job_exit_code, record_exit

    assert job_exit_code(tmp_path) is None
    record_exit(0, {ENV_EXIT_DIR: str(tmp_path), "RANK": "0"})
    assert job_exit_code(tmp_path) is None
    record_exit(6, {ENV_EXIT_DIR: str(tmp_path), "RANK": "1"})
    record_exit(8, {ENV_EXIT_DIR: str(tmp_path), "RANK": "0"})
    os.utime(tmp_path / "rank-1.txt", ns=(1, 1))  # the rank that failed first
    assert job_exit_code(tmp_path) == 6
    record_exit(5, {"RANK": "0"})  # outside the job: nothing recorded, nothing raised
