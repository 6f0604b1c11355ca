"""Every wrong input a new user is likely to type is answered at parse time: the documented exit code (2 for
a launch or usage error, 6 for bad data), one paragraph naming the value and what is accepted, no
traceback, and torch is never imported (so the answer comes within a second, before any link is opened or
any game data is read).

Each case runs the real command line in a fresh interpreter with ``-X importtime``, whose report on
stderr lists every module imported: the absence of torch there is the structural form of "within a
second" (importing torch alone takes 1 to 5 s on the machines this runs on; no test here times anything).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.configs import write_export
from trainer.exitcodes import ExitCode

pytestmark = [pytest.mark.integration]

TRACEBACK = "Traceback (most recent call last)"


def run_cli(args: list[str], cwd: Path, **env: str) -> tuple[int, str, str]:
    """``python -X importtime -m trainer ARGS``: (exit code, output without the import report, modules)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("LA_TRAINER_")} | env
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "trainer", *args],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    report = [line for line in done.stderr.splitlines() if line.startswith("import time:")]
    modules = "\n".join(line.rsplit("|", 1)[-1].strip() for line in report)
    text = done.stdout + "\n".join(
        line for line in done.stderr.splitlines() if not line.startswith("import time:")
    )
    return done.returncode, text, modules


def check(code: int, text: str, modules: str, expected: ExitCode, *needles: str) -> None:
    assert code == expected, f"exit {code}, expected {int(expected)}:\n{text}"
    assert TRACEBACK not in text, text
    for needle in needles:
        assert needle in text, f"{needle!r} not in:\n{text}"
    assert not re.search(r"^torch$", modules, re.M), f"torch was imported before the refusal:\n{text}"
    assert text.isascii(), text  # the engine's pipe on Windows is not UTF-8


@pytest.fixture
def export(tmp_path: Path) -> Path:
    return write_export(tmp_path / "TrainingMaterials" / "20250101120000")


def test_offline_on_an_empty_folder(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    check(*run_cli(["offline", "empty"], tmp_path), ExitCode.USAGE, "'empty' holds neither an engine export")


@pytest.mark.parametrize(
    ("args", "env", "needles"),
    [
        (
            [],
            {"LA_TRAINER_ODE_STEPS": "abc"},
            ("LA_TRAINER_ODE_STEPS", "'abc'", "whole number from 0 to 100"),
        ),
        ([], {"LA_TRAINER_THREADS": "-2"}, ("LA_TRAINER_THREADS", "'-2'", "whole number >= 0")),
        (["--time-distribution", "gauss"], {}, ("--time-distribution", "'gauss'", "logit_normal")),
        (["--device", "tpu"], {}, ("--device", "'tpu'", "cpu, cuda, cuda:N or gpu")),
        (["--iterations", "-5"], {}, ("--iterations", "-5", "whole number >= 0")),
        (["--threads", "-2"], {}, ("--threads", "-2")),
        (["--compile", "maybe"], {}, ("--compile", "'maybe'", "on or off")),
        (["--mlflow", " http://x"], {}, ("--mlflow",)),
    ],
    ids=[
        "env-ode-steps",
        "env-threads",
        "time-distribution",
        "device",
        "iterations",
        "threads",
        "compile",
        "mlflow",
    ],
)
def test_bad_values_for_a_valid_export(
    export: Path, tmp_path: Path, args: list[str], env: dict[str, str], needles: tuple[str, ...]
) -> None:
    check(*run_cli(["offline", str(export), *args], tmp_path, **env), ExitCode.USAGE, *needles)
    assert not (tmp_path / "Offline0").exists()  # nothing was created before the refusal


@pytest.mark.parametrize(
    ("content", "needles"),
    [
        ('{"thread": 1}', ("unknown option 'thread'", "Did you mean 'threads'?")),
        ('{"threads": 1,}', ("is not valid JSON: line 1, column", "or remove it")),
        ('{"ode_steps": "two"}', ("option 'ode_steps' to 'two'",)),
    ],
    ids=["typo", "broken-json", "bad-value"],
)
def test_a_bad_settings_file(export: Path, tmp_path: Path, content: str, needles: tuple[str, ...]) -> None:
    (export / "la-trainer.json").write_text(content, encoding="utf-8")
    check(*run_cli(["offline", str(export)], tmp_path), ExitCode.USAGE, "la-trainer.json", *needles)


def test_a_misspelt_variable_is_named_with_the_right_one(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    code, text, modules = run_cli(["offline", "empty"], tmp_path, LA_TRAINER_ITERATON_NUM="5")
    check(code, text, modules, ExitCode.USAGE, "LA_TRAINER_ITERATON_NUM is not a la-trainer setting")
    assert "Did you mean 'LA_TRAINER_ITERATION_NUM'?" in text


def test_the_documented_alias_is_accepted(export: Path, tmp_path: Path) -> None:
    """LA_TRAINER_ITERATIONS (the --iterations spelling) is read, not ignored: a bad value is refused."""
    check(
        *run_cli(["offline", str(export)], tmp_path, LA_TRAINER_ITERATIONS="-1"),
        ExitCode.USAGE,
        "LA_TRAINER_ITERATIONS",
    )


def test_a_bad_timeout_scale(tmp_path: Path) -> None:
    code, text, modules = run_cli(["socket", "--port", "1"], tmp_path, LA_TRAINER_TIMEOUT_SCALE="abc")
    check(code, text, modules, ExitCode.USAGE, "LA_TRAINER_TIMEOUT_SCALE is set to 'abc'", "a number > 0")
    assert not (tmp_path / "la-trainer-runs").exists()  # refused before the run folder or the port


def test_a_corrupt_record_file_is_bad_data(tmp_path: Path) -> None:
    (tmp_path / "bad.record").write_bytes(os.urandom(100))
    schema = {"ObservationSchema": {"Type": "Null"}, "ActionSchema": {"Type": "Null"}}
    (tmp_path / "schema.json").write_text(json.dumps(schema), encoding="utf-8")
    check(
        *run_cli(["record", "bad.record", "--schema", "schema.json"], tmp_path),
        ExitCode.BAD_DATA,
        "bad.record",
    )


@pytest.mark.parametrize(
    ("variable", "value", "needle"),
    [
        ("LA_TRAINER_ODE_STEPS", "abc", "LA_TRAINER_ODE_STEPS sets option 'ode_steps' to 'abc'"),
        ("LA_TRAINER_TIMEOUT_SCALE", "abc", "LA_TRAINER_TIMEOUT_SCALE is set to 'abc'"),
    ],
)
def test_a_bad_engine_environment_is_refused_before_the_link_opens(
    tmp_path: Path, variable: str, value: str, needle: str
) -> None:
    """The engine-spawned path: the options paragraph, not the missing-region one that opening the link
    (for a GUID nobody created) would give."""
    task_dir = tmp_path / "LearningCore" / "Training0"
    (task_dir / "Configs").mkdir(parents=True)
    argv = ["Training", "-l", "SharedMemory", str(task_dir), "-g", "{0A1B2C3D-0000-0000-0000-000000000002}"]
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from trainer.app import engine_main; sys.exit(engine_main(sys.argv[1:]))",
            *argv,
        ],
        env={**os.environ, variable: value},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == ExitCode.USAGE, done.stderr
    assert needle in done.stderr
    assert "0A1B2C3D" not in done.stderr and TRACEBACK not in done.stderr
