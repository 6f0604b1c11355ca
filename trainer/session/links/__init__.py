"""The trainer's links to the engine: one :class:`TrainerLink` protocol, one implementation per transport.

The training story (:func:`trainer.session.run.run_training`) only ever sees the protocol, so it reads the same
whether the engine talks through shared memory, a socket or an export folder (or, in tests, memory).
Each link is a short loop around the pure codecs of :mod:`protocol` (the controls table, the stream
decoder, the replay layout) and the byte movers of :mod:`trainer.session.transport`.

Modules:

* :mod:`~trainer.session.links.base`: the :class:`TrainerLink` protocol (the session order is written there) and
  the snapshot-size check every link applies to what it sends.
* :mod:`~trainer.session.links.shm`: :class:`ShmTrainerLink`, shared memory (spec §2).
* :mod:`~trainer.session.links.socket`: :class:`SocketTrainerLink`, TCP (spec §3).
* :mod:`~trainer.session.links.files`: :class:`FileTrainerLink`, the ``TrainingMaterials`` export (spec §5.5).
* :mod:`~trainer.session.links.memory`: :class:`MemoryLink`, values in memory, for tests of the story.
* :mod:`~trainer.session.links.keepalive`: :class:`KeepAlive`, pings while the trainer is busy.

:func:`parent_watch` (the spawning engine's liveness) lives in :mod:`trainer.system.liveness`.
"""

from __future__ import annotations

from trainer.session.links.base import TrainerLink, check_snapshot_size
from trainer.session.links.files import FileTrainerLink
from trainer.session.links.keepalive import KeepAlive
from trainer.session.links.memory import MemoryLink, SentNetwork
from trainer.session.links.shm import ShmTrainerLink
from trainer.session.links.socket import SocketTrainerLink
from trainer.system.liveness import parent_watch

__all__ = [
    "FileTrainerLink",
    "KeepAlive",
    "MemoryLink",
    "SentNetwork",
    "ShmTrainerLink",
    "SocketTrainerLink",
    "TrainerLink",
    "check_snapshot_size",
    "parent_watch",
]
