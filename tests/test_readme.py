"""The README is the user's manual: every option, exit code and command is in it, and it links to nothing
a user who cloned the repository does not have."""

from __future__ import annotations

import re
from pathlib import Path

import click

from trainer.commands.cli import main
from trainer.exitcodes import ExitCode
from trainer.settings.options import ALIASES, env_name, experimental_options, option_names

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")


def test_every_option_is_documented_with_its_environment_name() -> None:
    for name in option_names():
        assert f"`{name}`" in README, f"option {name} is not in the README"
        assert env_name(name) in README, f"{env_name(name)} is not in the README"
    for alias in ALIASES:
        assert env_name(alias) in README


def test_the_options_table_marks_exactly_the_experimental_options() -> None:
    marked = set(re.findall(r"^\| `([a-z_]+)`[^\n]*\| experimental: ", README, re.M))
    assert marked == set(experimental_options())


def test_every_exit_code_is_in_the_table() -> None:
    for code in ExitCode:
        assert re.search(rf"^\| {int(code)} \| {code.name} \|", README, re.M), f"exit code {code} is missing"


def test_every_command_exists_and_every_command_is_listed() -> None:
    ctx = click.Context(main)
    commands = set(main.list_commands(ctx))  # type: ignore[attr-defined]
    listed = set(re.findall(r"^\| `la-trainer ([a-z][a-z-]*)", README, re.M))
    assert listed <= commands, f"the README lists commands that do not exist: {listed - commands}"
    missing = commands - listed
    assert not missing, f"commands missing from the README's table: {missing}"


def test_links_stay_inside_the_repository_and_exist() -> None:
    for target in re.findall(r"\]\(([^)#]+)\)", README):
        assert not target.startswith(("../", "/")), f"link outside the repository: {target}"
        if not target.startswith(("http://", "https://")):
            assert (REPO / target).exists(), f"broken link: {target}"


def test_docker_run_comes_after_docker_build() -> None:
    assert README.index("docker build") < README.index("docker run")
