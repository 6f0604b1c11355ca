"""The trainer's links to the engine, one per transport (the face of :mod:`trainer.links.shm`)."""

from __future__ import annotations

from trainer.links.shm import (
    FileTrainerLink,
    KeepAlive,
    ShmTrainerLink,
    SocketTrainerLink,
    TrainerLink,
    parent_watch,
)

__all__ = [
    "FileTrainerLink",
    "KeepAlive",
    "ShmTrainerLink",
    "SocketTrainerLink",
    "TrainerLink",
    "parent_watch",
]
