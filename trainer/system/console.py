"""The one line writer: every message of the trainer reaches stdout or stderr through here.

The engine reads the trainer's output through a pipe and copies it into its log line by line (spec
§1.1), so a message is one complete, flushed line. When the game dies, the pipe's reader is gone and
every write fails (EPIPE, or ValueError on a closed stream): then the process's output is pointed at
the null device (:func:`silence_output`), so that neither this message nor the interpreter's final
flush turns a documented exit code into a crash (exit 1 or 120). The run goes on and ends as its link
sees the game go (exit code 5), with its status file saying where.

Standard library only: the drop-in writes through here before it knows whether this Python can train
(a half install, :mod:`trainer.dropin`).
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

__all__ = ["log", "log_error", "overwrite", "silence_output", "use_utf8_output", "warn"]


def log(message: str, stream: TextIO | None = None, *, ascii_only: bool = False) -> None:
    """One flushed line on stdout (or ``stream``) that never raises.

    ``ascii_only``: what is not ASCII is written as a backslash escape (the drop-in, before
    :func:`use_utf8_output`: a Windows pipe is written in the ANSI code page, which cannot hold every
    path)."""
    text = message.rstrip("\n") + "\n"
    if ascii_only:
        text = text.encode("ascii", "backslashreplace").decode("ascii")
    _write(text, stream if stream is not None else sys.stdout)


def log_error(message: str, *, ascii_only: bool = False) -> None:
    """:func:`log` on stderr: failures, warnings and anything a user must see even with stdout hidden
    (scale-out ranks other than 0 write their stdout to the null device)."""
    log(message, sys.stderr, ascii_only=ascii_only)


def warn(message: str) -> None:
    """``la-trainer: warning: <message>`` on stderr: something the run goes on without (a refused keep-alive
    option, an orphaned region it could not remove, an unknown ``LA_TRAINER_*`` name)."""
    log_error(f"la-trainer: warning: {message}")


def overwrite(text: str, stream: TextIO) -> None:
    """``text`` as it is (a terminal's progress bar redraws its line with ``\\r``), flushed, never
    raising."""
    _write(text, stream)


def _write(text: str, stream: TextIO) -> None:
    try:
        stream.write(text)
        stream.flush()
    except UnicodeEncodeError:
        # A stream in a narrow encoding (one use_utf8_output did not reach): escaped, never lost.
        _write(text.encode("ascii", "backslashreplace").decode("ascii"), stream)
    except (OSError, ValueError):
        # The process's own output: its reader (the engine) is gone. Another stream (a test's buffer, a
        # file) is the caller's: the line is dropped, the process's output left alone.
        if stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            silence_output()


def silence_output() -> None:
    """Point stdout and stderr (file descriptors 1 and 2) at the null device: their reader is gone."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            for fd in (1, 2):
                os.dup2(devnull, fd)
        finally:
            os.close(devnull)
    except OSError:
        pass


def use_utf8_output() -> None:
    """stdout and stderr in UTF-8 whatever the locale says; text that cannot be encoded is escaped, never
    raised.

    The engine reads the trainer's pipe and decodes it as UTF-8 (``FPlatformProcess::ReadPipe`` converts
    with ``FUTF8ToTCHAR``), while Python writes a Windows pipe in the ANSI code page (cp1252, spec §11
    item 7): a path outside cp1252 in a message raised UnicodeEncodeError there, which silenced every
    later line. Our own messages are ASCII (``tests/trainer/test_ascii_output.py``); this covers what
    they quote (paths, the game's JSON).
    """
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is None:
            continue  # replaced by a test harness or a null device: nothing to do
        try:
            reconfigure(encoding="utf-8", errors="backslashreplace")
        except (OSError, ValueError):
            pass  # a closed stream: _write copes with that
