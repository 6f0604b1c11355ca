"""Everything the trainer prints survives the engine's output pipe (spec §1.1, §11 item 7).

On Windows the pipe's Python encoding is the ANSI code page (cp1252) while the engine decodes UTF-8. Two
facts: no message literal in ``trainer/`` or ``protocol/`` (whose errors the trainer prints) holds a
non-ASCII character, and a message that quotes a non-ASCII path reaches the pipe as UTF-8 under
``PYTHONIOENCODING=cp1252`` instead of raising UnicodeEncodeError.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from emulator.launch import REPO_ROOT, TRAIN_SCRIPT
from tests.support.ascii_scan import non_ascii_literals
from trainer.exitcodes import ExitCode

PRINTING_PACKAGES = ("trainer", "protocol")


def test_the_scan_finds_a_non_ascii_literal_and_skips_docstrings(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text('"""Doc \u00a7."""\nX = 1\n"""Attr \u2248."""\nprint(f"a \u2192 {X}")\n')
    found = non_ascii_literals(tmp_path)
    assert len(found) == 1 and ":4:" in found[0], found


@pytest.mark.parametrize("package", PRINTING_PACKAGES)
def test_no_message_literal_is_outside_ascii(package: str) -> None:
    found = non_ascii_literals(REPO_ROOT / package)
    assert found == [], "messages must be ASCII (the engine's pipe is not UTF-8 on Windows):\n" + "\n".join(
        found
    )


def test_a_non_ascii_path_reaches_a_cp1252_pipe_as_utf8(tmp_path: Path) -> None:
    """The task directory is quoted in the error; under cp1252 a plain print of it would raise."""
    missing = tmp_path / "Proj\u00ebkt \u03a9 \u2192 \u65e5\u672c"
    guid = "{12345678-1234-1234-1234-1234567890AB}"
    env = {**os.environ, "PYTHONIOENCODING": "cp1252", "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, str(TRAIN_SCRIPT), "Training", "SharedMemory", str(missing), "-g", guid],
        env=env,
        capture_output=True,
        timeout=120,
    )
    stderr = done.stderr.decode("utf-8")  # strict: the engine decodes UTF-8
    assert done.returncode == ExitCode.USAGE, stderr
    assert str(missing) in stderr
    assert "Traceback" not in stderr and "UnicodeEncodeError" not in stderr
