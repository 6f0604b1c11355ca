"""Scale-out's errors, and how a failed collective is recognised."""

from __future__ import annotations

import re

import torch.distributed as dist

from trainer.errors import Diverged, TrainerError, TrainingPeerLost
from trainer.exitcodes import ExitCode

__all__ = ["RankLost", "ReplicasDiffer", "ScaleOutError", "first_line", "is_collective_failure"]

_COLLECTIVE_MARKERS = (
    "gloo",
    "nccl",
    "c10d",
    "connection closed by peer",
    "connection reset",
    "broken pipe",
    "timed out",
    "processgroup",
)
"""Lower-case words in the message of a collective that failed because a peer died or timed out."""


class ScaleOutError(TrainerError):
    """A scale-out failure outside the training steps (launch, rank frames, start-state sync)."""

    def __init__(self, message: str, exit_code: ExitCode = ExitCode.INTERNAL) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class ReplicasDiffer(Diverged):
    """The ranks' weights drifted apart (a bug). A :class:`Diverged` for the same reason as
    :class:`RankLost`."""

    exit_code = ExitCode.INTERNAL


class RankLost(TrainingPeerLost):
    """Another rank failed or vanished during training.

    A :class:`TrainingPeerLost` (a :class:`Diverged`) on purpose: the loop's divergence path is exactly what
    a lost rank needs (stop now, keep the last good weights, send them and Complete, write the snapshot
    and checkpoint), and the run records it as a lost rank (phase "rank lost", ``PEER_GONE``), not as a
    divergence that would send the user to the learning rate.
    """

    exit_code = ExitCode.PEER_GONE


def is_collective_failure(error: BaseException) -> bool:
    """True for the errors a collective raises when a peer died or timed out (gloo raises a plain
    RuntimeError "Connection closed by peer"; newer c10d raises ``DistError`` subclasses)."""
    dist_error = getattr(dist, "DistError", None)
    if dist_error is not None and isinstance(error, dist_error):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(marker in text for marker in _COLLECTIVE_MARKERS)


def first_line(error: BaseException) -> str:
    """The gist of an error on one line: gloo's "[.../pair.cc:537] Read error ...: Connection reset by
    peer. This is typically caused by ..." becomes "Read error ...: Connection reset by peer"."""
    lines = str(error).strip().splitlines()
    text = re.sub(r"^\[[^\]]*\.(?:cc|cpp|h)(?::\d+)?\]\s*", "", lines[0]) if lines else type(error).__name__
    return text.split(". This is typically")[0].rstrip(".")
