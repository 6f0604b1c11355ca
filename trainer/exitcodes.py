"""Process exit codes: one enum, documented in the README.

The engine only looks at whether the trainer exits; users and scripts look at the code, so each failure
category gets a distinct, stable number.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["ExitCode"]


class ExitCode(IntEnum):
    """Exit status of ``scripts/train.py`` and ``la-trainer``."""

    OK = 0
    """Training finished (Complete sent) or the engine asked to stop."""
    INTERNAL = 1
    """An unexpected error inside the trainer (a bug: please report it with the log)."""
    USAGE = 2
    """Bad command line or launch input: missing/garbled GUID, port in use, missing file or region."""
    PROTOCOL = 3
    """The engine sent bytes that break the protocol (bad signal, sizes, NetworkId mismatch)."""
    TIMEOUT = 4
    """A wait for the engine ran past its timeout."""
    PEER_GONE = 5
    """The engine went away (connection closed, control block gone, process exited)."""
    BAD_DATA = 6
    """Configs, snapshots or the replay buffer are readable but inconsistent or non-finite."""
    UNSUPPORTED = 7
    """The config asks for a trainer method or feature this trainer does not implement."""
    INTERRUPTED = 8
    """SIGINT/SIGTERM: the current step was finished, state saved, and the trainer exited."""
    DIVERGED = 9
    """The loss became NaN/Inf; the last good weights were kept and sent."""
    RESUME_REFUSED = 10
    """A resume was asked for but the checkpoint does not match the networks or config."""
    RUN_STALE = 11
    """``la-trainer watch``: the run's status file was not updated for ``--max-age`` seconds (the trainer is
    frozen, or gone on another machine)."""
    RUN_DEAD = 12
    """``la-trainer watch``: the trainer process is gone without having recorded an end (killed)."""
    NOT_SAVED = 13
    """A third Ctrl-C (SIGINT) stopped the trainer before its final save had ended: the newest checkpoint
    is an earlier one, or there is none. (A second Ctrl-C waits for the save, and exits 8.)"""
    NO_SPACE = 14
    """The disk (or quota) was full, or failed the write, where the run's product goes: an offline run's
    trained networks, ``record``'s export. Optional files (snapshots, checkpoints, the run record) are a
    warning instead; the game of a live run still got its networks and Complete."""
