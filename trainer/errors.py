"""Trainer-side failures, each mapped to one documented exit code.

Protocol decoding errors stay :class:`protocol.errors.ProtocolError`; :func:`exit_code_for` maps both
families onto :class:`trainer.exitcodes.ExitCode` in one place.
"""

from __future__ import annotations

from protocol.errors import ConfigError, ProtocolError, RecordError, ReplayError, SnapshotError
from trainer.exitcodes import ExitCode

__all__ = [
    "BadData",
    "Diverged",
    "Interrupted",
    "InterruptedAgain",
    "LaunchError",
    "NoSpace",
    "PeerGone",
    "ResumeRefused",
    "TrainerError",
    "TrainingPeerLost",
    "Unsupported",
    "WaitTimeout",
    "exit_code_for",
]


class TrainerError(Exception):
    """Base class: ``str(error)`` is a complete, user-facing paragraph."""

    exit_code: ExitCode = ExitCode.INTERNAL


class LaunchError(TrainerError):
    """Bad launch input: command line, GUID, missing region or file, port in use."""

    exit_code = ExitCode.USAGE


class NoSpace(TrainerError):
    """What the run exists to produce could not be written: the disk or quota is full, or the disk failed
    the write (:mod:`trainer.system.diskspace`); the message names the folder, the free space and the fix."""

    exit_code = ExitCode.NO_SPACE


class WaitTimeout(TrainerError):
    """A wait for the engine ran past its timeout; the message names what was awaited."""

    exit_code = ExitCode.TIMEOUT


class PeerGone(TrainerError):
    """The engine disappeared (EOF, process exit, region gone) while we waited for ``what``."""

    exit_code = ExitCode.PEER_GONE


class BadData(TrainerError):
    """Readable but unusable input: non-finite values, empty recording, mismatched dimensions."""

    exit_code = ExitCode.BAD_DATA


class Unsupported(TrainerError):
    """The config asks for something this trainer does not implement (e.g. TrainerMethod PPO)."""

    exit_code = ExitCode.UNSUPPORTED


class Interrupted(TrainerError):
    """SIGINT/SIGTERM arrived; the trainer saved its state and stopped."""

    exit_code = ExitCode.INTERRUPTED


class InterruptedAgain(KeyboardInterrupt):
    """A repeated Ctrl-C stopped the trainer at once (:class:`trainer.session.app.InterruptFlag`); ``saved``:
    its final state had been saved by then (exit 8), else exit 13 (NOT_SAVED). A KeyboardInterrupt so that
    no ``except Exception`` on its way catches it."""

    def __init__(self, *, saved: bool) -> None:
        super().__init__("saved" if saved else "not saved")
        self.saved = saved


class Diverged(TrainerError):
    """The loss became non-finite; the last good weights were kept.

    ``iteration``: the step that was not finite, where the raiser knows it (the training loop reports
    the run's iteration count from it: the weights kept are those after that many steps)."""

    exit_code = ExitCode.DIVERGED

    def __init__(self, message: str, *, iteration: int | None = None) -> None:
        super().__init__(message)
        self.iteration = iteration


class TrainingPeerLost(Diverged):
    """Another process training this job with us (a scale-out rank) failed or vanished.

    A :class:`Diverged` so that the loop ends the same way (stop now, send the last good weights and
    Complete, write the snapshot and checkpoint), but recorded as what it is: the weights are fine and
    the learning rate is not to blame, so the run ends with ``PEER_GONE`` and its own phase
    (:class:`trainer.distributed.errors.RankLost` is the one scale-out raises)."""

    exit_code = ExitCode.PEER_GONE


class ResumeRefused(TrainerError):
    """A checkpoint does not match the current networks or config."""

    exit_code = ExitCode.RESUME_REFUSED


def exit_code_for(error: BaseException) -> ExitCode:
    """The exit code for any exception that ends a run."""
    if isinstance(error, TrainerError):
        return error.exit_code
    if isinstance(error, (ConfigError, ReplayError, SnapshotError, RecordError)):
        # Readable framing, unusable content: the user must fix a file or a recording.
        return ExitCode.BAD_DATA
    if isinstance(error, ProtocolError):
        return ExitCode.PROTOCOL
    if isinstance(error, InterruptedAgain) and not error.saved:
        return ExitCode.NOT_SAVED
    if isinstance(error, KeyboardInterrupt):
        return ExitCode.INTERRUPTED
    return ExitCode.INTERNAL
