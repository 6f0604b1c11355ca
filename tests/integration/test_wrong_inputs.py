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
from tests.support.recordings import make_record as one_record
from tests.support.recordings import record_files as recorder_files
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
    """The project-wide file (<Project>/Intermediate/LearningCore, here tmp_path: the folder that holds
    TrainingMaterials/) is read by offline, as by every mode."""
    (tmp_path / "la-trainer.json").write_text(content, encoding="utf-8")
    check(*run_cli(["offline", str(export)], tmp_path), ExitCode.USAGE, "la-trainer.json", *needles)


def test_offline_reads_the_projects_settings_not_a_copy_inside_the_export(
    export: Path, tmp_path: Path
) -> None:
    (export / "la-trainer.json").write_text("{broken", encoding="utf-8")
    (tmp_path / "la-trainer.json").write_text('{"ode_steps": "two"}', encoding="utf-8")
    code, text, modules = run_cli(["offline", str(export)], tmp_path)
    check(code, text, modules, ExitCode.USAGE, f"settings file {tmp_path / 'la-trainer.json'}", "'two'")
    assert "not valid JSON" not in text


def test_a_settings_file_with_a_byte_order_mark_is_read(export: Path, tmp_path: Path) -> None:
    """Notepad and PowerShell 5 start a UTF-8 file with a BOM: the file is read (here: its bad value is
    named), not refused as broken JSON."""
    (tmp_path / "la-trainer.json").write_bytes(b"\xef\xbb\xbf" + b'{"ode_steps": "two"}')
    check(*run_cli(["offline", str(export)], tmp_path), ExitCode.USAGE, "option 'ode_steps' to 'two'")


def test_a_settings_file_that_is_a_folder_is_refused(export: Path, tmp_path: Path) -> None:
    (tmp_path / "la-trainer.json").mkdir()
    code, text, modules = run_cli(["offline", str(export), "--iterations", "1"], tmp_path)
    check(code, text, modules, ExitCode.USAGE, "la-trainer.json is a folder, not a file")


def test_attach_mode_reads_the_projects_settings(tmp_path: Path) -> None:
    """``la-trainer shm <Project>/Intermediate/LearningCore/External``: the file beside the task folder
    applies, refused before the control block is made (so no wait on a game: --wait 1 bounds the old
    behaviour, which ignored the file)."""
    (tmp_path / "la-trainer.json").write_text('{"threads": -3}', encoding="utf-8")
    code, text, modules = run_cli(["shm", "External", "--create", "--wait", "1"], tmp_path)
    check(code, text, modules, ExitCode.USAGE, "la-trainer.json", "option 'threads' to -3")
    assert "-LearningAgentsControlsGuid" not in text


def _run_record(folder: Path) -> Path:
    """A run record with nothing but its run.json (what report needs to find a run)."""
    run = folder / "Offline0" / "runs" / "Offline_FlowMatching_Files_x"
    run.mkdir(parents=True)
    (run / "run.json").write_text("{}", encoding="utf-8")
    return folder


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["socket", "--temp-dir", "afile/sub"], "(--temp-dir)"),
        (["offline", "{export}", "--out", "afile/x"], "(--out)"),
        (["shm", "afile/sub", "--create"], "(TASK_DIR)"),
        (["shm", "task", "--create", "--config-dir", "afile/c"], "(--config-dir)"),
        (["demo", "--quick", "--out", "afile/x"], "(--out)"),
        (["report", "{runs}", "--out", "afile/loss.png"], "(--out)"),
        (["record", "{record}", "--schema", "{schema}", "--out", "afile/r"], "(--out)"),
    ],
    ids=["socket", "offline", "shm", "shm-config-dir", "demo", "report", "record"],
)
def test_an_output_folder_under_a_file_is_refused(
    export: Path, tmp_path: Path, args: list[str], option: str
) -> None:
    """A folder that cannot be made (here: a regular file where a parent folder should be, which refuses
    root too) is exit 2 with the path and the fix, before any link opens, not a traceback."""
    (tmp_path / "afile").write_text("not a folder", encoding="utf-8")
    record_file, schema_file = recorder_files(tmp_path, [one_record(5)])  # record reads them first
    names = {
        "{export}": str(export),
        "{runs}": str(_run_record(tmp_path / "runs")),
        "{record}": str(record_file),
        "{schema}": str(schema_file),
    }
    code, text, modules = run_cli([names.get(a, a) for a in args], tmp_path)
    check(
        code, text, modules, ExitCode.USAGE, option, "afile' is a file, not a folder", "Move that file away"
    )
    assert "-LearningAgents" not in text  # no engine switches printed: nothing was opened


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
            "import sys; from trainer.dropin.engine import engine_main; sys.exit(engine_main(sys.argv[1:]))",
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


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--learning-rate", "nan"], "--learning-rate sets option 'learning_rate' to nan"),
        (["--learning-rate", "inf"], "--learning-rate sets option 'learning_rate' to inf"),
        (["--learning-rate", "-1"], "--learning-rate sets option 'learning_rate' to -1.0"),
        (["--seed", str(2**40)], "--seed sets option 'seed' to 1099511627776"),
        (["--batch-size", "0"], "--batch-size sets option 'batch_size' to 0"),
    ],
    ids=["lr-nan", "lr-inf", "lr-negative", "seed", "batch-size"],
)
def test_record_checks_its_own_values_before_reading_a_file(
    tmp_path: Path, args: list[str], needle: str
) -> None:
    """record's own options are refused like every command's: exit 2 naming the flag, before the records
    are read (the record file here is empty and the schema not the recorder's: neither is looked at) and
    before an export is written whose config a later check would blame."""
    (tmp_path / "r.record").write_bytes(b"")
    (tmp_path / "schema.json").write_text("{}", encoding="utf-8")
    code, text, modules = run_cli(["record", "r.record", "--schema", "schema.json", *args], tmp_path)
    check(code, text, modules, ExitCode.USAGE, needle)
    assert not (tmp_path / "la-trainer-record").exists()
