"""The README's first steps as a new user follows them: the venv the scripts make is activated before
the first ``la-trainer`` command, and ``la-trainer demo --help`` promises the demo's time the README
states (issue 24 item 8)."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

from emulator.demo import demo_command

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")


def test_the_venv_is_activated_before_the_first_la_trainer_command() -> None:
    first = re.search(r"`la-trainer [a-z]", README)
    assert first is not None
    before = README[: first.start()]
    assert "source .venv/bin/activate" in before
    assert ".venv/bin/la-trainer" in README[: first.start() + 400]  # or the full path, said in the same place


def test_demo_help_and_the_readme_state_the_same_time() -> None:
    result = CliRunner().invoke(demo_command, ["--help"])
    assert result.exit_code == 0, result.output
    claim = re.search(r"la-trainer demo\s+# (.+) on (.+)", result.output)
    assert claim is not None, result.output
    readme = " ".join(README.split())  # its lines are wrapped
    duration, machine = claim.group(1).strip(), claim.group(2).strip()
    assert f"{machine} the demo takes {duration}" in readme, f"demo --help says {claim.group(0)!r}"
