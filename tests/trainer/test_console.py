"""The one line writer (trainer/system/console.py): every message reaches its stream as one flushed line,
and a stream that cannot take it never ends the run."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest

from emulator.launch import REPO_ROOT
from trainer.system.console import log, log_error, warn


def test_a_line_is_written_whole_and_flushed() -> None:
    out = io.StringIO()
    log("one\n", out)
    log("two", out)
    assert out.getvalue() == "one\ntwo\n"


def test_ascii_only_escapes_what_a_narrow_pipe_cannot_hold() -> None:
    out = io.StringIO()
    log("Proj\u00ebkt \u2192 x", out, ascii_only=True)
    assert out.getvalue() == "Proj\\xebkt \\u2192 x\n"


def test_a_narrow_stream_gets_the_escaped_line_instead_of_an_error() -> None:
    raw = io.BytesIO()
    narrow = io.TextIOWrapper(raw, encoding="ascii", errors="strict", write_through=True)
    log("caf\u00e9", narrow)
    assert raw.getvalue() == b"caf\\xe9\n"


def test_a_closed_stream_of_a_caller_drops_the_line() -> None:
    closed = io.StringIO()
    closed.close()
    log("nobody reads this", closed)  # no exception, and the process's own output is left alone


def test_warnings_and_errors_go_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    warn("a knob is ignored")
    log_error("la-trainer: failed")
    err = capsys.readouterr().err
    assert err == "la-trainer: warning: a knob is ignored\nla-trainer: failed\n"


def test_a_closed_pipe_silences_the_process_instead_of_ending_it() -> None:
    """The engine reads our stdout through a pipe (spec §1.1); when it is gone every write fails (EPIPE).
    The writer points the output at the null device and the process goes on to its own exit code."""
    child = (
        "from trainer.system.console import log, log_error\n"
        "for i in range(20000):\n"
        "    log('x' * 80)\n"
        "log_error('still here')\n"
        "raise SystemExit(5)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", child],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader goes away at once
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 5
    assert b"Traceback" not in err and b"BrokenPipe" not in err
