"""Trainer options: defaults < settings file < environment < command line; every value checked against its
domain in one place, every refusal naming the option, the value, its source and what is accepted."""

from __future__ import annotations

import ast
import json
import re
from dataclasses import fields
from pathlib import Path

import pytest

from trainer.errors import LaunchError
from trainer.exitcodes import ExitCode
from trainer.settings.environment import NOT_OPTIONS
from trainer.settings.options import (
    ALIASES,
    SETTINGS_FILE_NAME,
    OptionError,
    TrainerOptions,
    cli_flag,
    env_name,
    load_options,
    option_names,
    unknown_environment_names,
)

REPO = Path(__file__).resolve().parents[2]


def test_later_sources_win(tmp_path: Path) -> None:
    (tmp_path / SETTINGS_FILE_NAME).write_text(json.dumps({"ode_steps": 2, "threads": 3, "compile": "on"}))
    environ = {"LA_TRAINER_THREADS": "4", "LA_TRAINER_COMPILE": "OFF"}
    options = load_options(tmp_path, {"threads": 5, "iteration_num": None}, environ)
    assert (options.ode_steps, options.threads, options.compile) == (2, 5, "off")
    assert options.iteration_num == TrainerOptions().iteration_num  # None means "not given"
    assert load_options(None, None, {}) == TrainerOptions()


@pytest.mark.parametrize(
    ("file", "environ", "overrides", "message"),
    [
        (
            {"compile": "auto"},
            {},
            {},
            "la-trainer.json sets option 'compile' to 'auto', but it must be on or off",
        ),
        ({}, {"LA_TRAINER_COMPILE": "maybe"}, {}, "LA_TRAINER_COMPILE sets option 'compile' to 'maybe'"),
        ({}, {}, {"compile": ""}, "--compile sets option 'compile' to '', but it must be on or off"),
        ({"threads": 1.5}, {}, {}, "option 'threads' to 1.5, but it must be a whole number >= 0"),
        ({"resume": "perhaps"}, {}, {}, "option 'resume' to 'perhaps', but it must be true or false"),
        ({"nonsense": 1}, {}, {}, "unknown option 'nonsense'"),
        ({}, {}, {"nonsense": 1}, "unknown option 'nonsense'"),
        ({"thread": 1}, {}, {}, "unknown option 'thread'. Did you mean 'threads'?"),
        ({}, {"LA_TRAINER_ODE_STEPS": "abc"}, {}, "LA_TRAINER_ODE_STEPS sets option 'ode_steps' to 'abc'"),
        ({}, {}, {"iteration_num": -5}, "--iterations sets option 'iteration_num' to -5"),
        ({}, {}, {"threads": -2}, "--threads sets option 'threads' to -2"),
        ({}, {}, {"device": "tpu"}, "--device sets option 'device' to 'tpu', but it must be cpu, cuda"),
        ({}, {}, {"time_distribution": "gauss"}, "'time_distribution' to 'gauss', but it must be uniform"),
        ({}, {}, {"time_distribution": "beta:1"}, "'time_distribution' to 'beta:1'"),
        ({}, {}, {"ema_decay": 1.0}, "'ema_decay' to 1.0, but it must be a number from 0"),
        ({}, {}, {"ode_steps": 101}, "'ode_steps' to 101, but it must be a whole number from 0 to 100"),
        ({}, {"LA_TRAINER_SYNC_EVERY_SECONDS": "nan"}, {}, "'sync_every_seconds' to 'nan'"),
        ({}, {"LA_TRAINER_PROGRESS_EVERY_SECONDS": "0"}, {}, "'progress_every_seconds' to '0'"),
        ({"distill_fraction": 1}, {}, {}, "'distill_fraction' to 1"),
        ({"mlflow": 5}, {}, {}, "'mlflow' to 5"),
    ],
)
def test_bad_values_name_the_option_the_value_and_where_it_came_from(
    tmp_path: Path,
    file: dict[str, object],
    environ: dict[str, str],
    overrides: dict[str, object],
    message: str,
) -> None:
    if file:
        (tmp_path / SETTINGS_FILE_NAME).write_text(json.dumps(file))
    with pytest.raises(LaunchError, match=re.escape(message)) as caught:
        load_options(tmp_path, overrides, environ)
    assert caught.value.exit_code is ExitCode.USAGE
    assert "Traceback" not in str(caught.value)


def test_an_environment_error_says_how_to_fix_it() -> None:
    with pytest.raises(OptionError) as caught:
        load_options(None, None, {"LA_TRAINER_THREADS": "-2"})
    error = caught.value
    assert (error.name, error.value, error.source) == (
        "threads",
        "-2",
        "environment variable LA_TRAINER_THREADS",
    )
    assert "Change or unset LA_TRAINER_THREADS" in str(error)


def test_a_settings_file_that_is_not_a_json_object_is_refused(tmp_path: Path) -> None:
    (tmp_path / SETTINGS_FILE_NAME).write_text("[1, 2]")
    with pytest.raises(LaunchError, match="must hold a JSON object, not list"):
        load_options(tmp_path, None, {})
    (tmp_path / SETTINGS_FILE_NAME).write_text('{"threads": 1,\n "ode_steps": 2,}')
    with pytest.raises(LaunchError, match=r"is not valid JSON: line 2, column 17: .*or remove it"):
        load_options(tmp_path, None, {})


def test_programmatic_options_are_checked_too() -> None:
    with pytest.raises(OptionError, match="TrainerOptions sets option 'threads' to -1"):
        TrainerOptions(threads=-1)
    with pytest.raises(OptionError, match="'device' to 'tpu'"):
        TrainerOptions(device="tpu")
    with pytest.raises(OptionError, match="'status_file' to 1"):
        TrainerOptions(status_file=1)  # type: ignore[arg-type]
    assert TrainerOptions(device="CUDA:1").device == "CUDA:1"  # case is the user's; choose_device lowers it


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("12", 12), ("1_000", 1000), ("1e6", 1_000_000), (" 7 ", 7), ("3.0", 3)],
)
def test_whole_numbers_are_read_in_their_usual_spellings(raw: str, expected: int) -> None:
    assert load_options(None, None, {"LA_TRAINER_ITERATION_NUM": raw}).iteration_num == expected


def test_the_command_line_spelling_is_a_documented_alias() -> None:
    assert ALIASES == {"iterations": "iteration_num"}
    assert cli_flag("iteration_num") == "--iterations" and cli_flag("ode_steps") == "--ode-steps"
    assert load_options(None, None, {"LA_TRAINER_ITERATIONS": "5"}).iteration_num == 5
    assert load_options(None, {"iterations": 6}, {}).iteration_num == 6
    with pytest.raises(LaunchError, match="both set option 'iteration_num'"):
        load_options(None, None, {"LA_TRAINER_ITERATIONS": "5", "LA_TRAINER_ITERATION_NUM": "6"})


def test_settings_file_accepts_the_alias_but_not_both_spellings(tmp_path: Path) -> None:
    (tmp_path / SETTINGS_FILE_NAME).write_text(json.dumps({"iterations": 9}))
    assert load_options(tmp_path, None, {}).iteration_num == 9
    (tmp_path / SETTINGS_FILE_NAME).write_text(json.dumps({"iterations": 9, "iteration_num": 8}))
    with pytest.raises(LaunchError, match="twice"):
        load_options(tmp_path, None, {})


def test_unknown_environment_names_warn_with_the_closest_name() -> None:
    environ = {
        "LA_TRAINER_ITERATON_NUM": "5",  # misspelt
        "LA_TRAINER_TIMEOUT_SCALE": "1",  # read by trainer/settings/timeouts.py, not an option
        "LA_TRAINER_THREADS": "1",
        "OTHER": "x",
    }
    warnings: list[str] = []
    options = load_options(None, None, environ, warn=warnings.append)
    assert options.threads == 1
    assert len(warnings) == 1
    assert "LA_TRAINER_ITERATON_NUM is not a la-trainer setting" in warnings[0]
    assert "Did you mean 'LA_TRAINER_ITERATION_NUM'?" in warnings[0]
    assert unknown_environment_names({"LA_TRAINER_FOO": ""})[0].startswith(
        "environment variable LA_TRAINER_FOO"
    )


def test_every_option_has_a_declared_domain_and_a_docstring() -> None:
    source = (REPO / "trainer" / "settings" / "options.py").read_text(encoding="utf-8")
    for f in fields(TrainerOptions):
        assert "domain" in f.metadata, f"{f.name}: declare its domain with _option()"
        assert re.search(rf"\n    {f.name}: .*?\n    \"\"\"", source, re.S), f"{f.name}: no docstring"


def _string_constants(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }


def test_every_la_trainer_variable_the_code_reads_is_known() -> None:
    """An option, an alias, or listed in NOT_OPTIONS: otherwise setting it would draw the
    'not a la-trainer setting' warning although something reads it."""
    known = {env_name(n) for n in option_names()} | {env_name(a) for a in ALIASES} | set(NOT_OPTIONS)
    used: set[str] = set()
    for folder in ("trainer", "emulator", "scripts", "tests"):
        for path in (REPO / folder).rglob("*.py"):
            if path.name in ("test_options.py", "test_wrong_inputs.py"):
                continue  # they misspell names on purpose
            for text in _string_constants(path):
                used |= set(re.findall(r"\bLA_TRAINER_[A-Z0-9_]*[A-Z0-9]\b", text))
    assert used - known == set()


def test_every_la_trainer_variable_the_scripts_and_docs_name_is_known() -> None:
    """A variable the set-up scripts read (LA_TRAINER_TORCH, LA_TRAINER_VENV) is often still set in the
    shell that then runs la-trainer: it must not be warned about as a misspelt option."""
    known = {env_name(n) for n in option_names()} | {env_name(a) for a in ALIASES} | set(NOT_OPTIONS)
    files = [REPO / "README.md", REPO / "Dockerfile", *(REPO / "docs").rglob("*.md")]
    files += [path for path in (REPO / "scripts").iterdir() if path.suffix in (".sh", ".ps1")]
    named: set[str] = set()
    for path in files:
        named |= set(re.findall(r"\bLA_TRAINER_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(encoding="utf-8")))
    assert "LA_TRAINER_TORCH" in named  # the scan sees scripts/setup_env.sh
    assert named - known == set()
    assert unknown_environment_names({"LA_TRAINER_TORCH": "cu126", "LA_TRAINER_VENV": "/opt/venv"}) == []
