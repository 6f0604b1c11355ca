"""Trainer options: defaults < settings file < environment < command line, every bad value named with its source."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer.errors import LaunchError
from trainer.options import SETTINGS_FILE_NAME, TrainerOptions, load_options


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
        ({"compile": "auto"}, {}, {}, "la-trainer.json: option 'compile' must be one of on, off, got 'auto'"),
        ({}, {"LA_TRAINER_COMPILE": "maybe"}, {}, "LA_TRAINER_COMPILE: option 'compile' must be one of on, off"),
        ({}, {}, {"compile": ""}, "command line: option 'compile' must be one of on, off, got ''"),
        ({"threads": 1.5}, {}, {}, "option 'threads' must be an int, got 1.5"),
        ({"resume": "perhaps"}, {}, {}, "option 'resume' must be a bool"),
        ({"nonsense": 1}, {}, {}, "unknown option 'nonsense'"),
        ({}, {}, {"nonsense": 1}, "Unknown option 'nonsense'"),
    ],
)
def test_bad_values_name_the_option_and_where_it_came_from(
    tmp_path: Path, file: dict[str, object], environ: dict[str, str], overrides: dict[str, object], message: str
) -> None:
    if file:
        (tmp_path / SETTINGS_FILE_NAME).write_text(json.dumps(file))
    with pytest.raises(LaunchError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_options(tmp_path, overrides, environ)


def test_a_settings_file_that_is_not_a_json_object_is_refused(tmp_path: Path) -> None:
    (tmp_path / SETTINGS_FILE_NAME).write_text("[1, 2]")
    with pytest.raises(LaunchError, match="must hold a JSON object"):
        load_options(tmp_path, None, {})
    (tmp_path / SETTINGS_FILE_NAME).write_text("{not json")
    with pytest.raises(LaunchError, match="is not readable JSON"):
        load_options(tmp_path, None, {})
