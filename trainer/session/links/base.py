"""What the training story needs from a link to the engine, and the checks every link shares.

Session order, as the engine drives it (spec §7.1): config → networks 0, 1, 2 → experience (once) → any
number of rounds "send 0, 1, 2" → Complete. Stop (the engine's ``EndTraining``) may arrive at any time:
:meth:`TrainerLink.stop_requested` turns True and stays True, and a blocking call that sees it raises
:class:`~trainer.session.transport.wait.StopRequested` (exit code 0).
"""

from __future__ import annotations

from typing import Protocol

from protocol.config import SessionConfig
from protocol.names import CommType
from protocol.replay import ReplayBuffer
from trainer.errors import BadData

__all__ = ["TrainerLink", "check_snapshot_size"]


class TrainerLink(Protocol):
    """The trainer's half of one session over one transport; :func:`trainer.session.run.run_training` sees only
    this, so the story reads the same over shared memory, a socket, an export folder or memory.

    Every blocking call is bounded by a :class:`~trainer.settings.timeouts.Timeouts` field and watches the engine;
    every call may raise :class:`~trainer.errors.PeerGone` once the engine is gone.
    """

    @property
    def comm_type(self) -> CommType:
        """The transport's name in tracker run names (spec §7.2: ``<Task>_<Method>_<CommType>_<TimeStamp>``);
        read-only, so a class attribute or a property of a wrapping link both satisfy it."""
        ...

    def receive_config(self) -> SessionConfig:
        """Block until the engine's config arrives; parse it. Called first, once."""
        ...

    def receive_network(self, network_id: int) -> bytes:
        """The initial snapshot of ``network_id`` (exactly its MaxByteNum bytes); called for 0, 1, 2."""
        ...

    def receive_experience(self) -> ReplayBuffer:
        """The replay buffer, its arrays copied into process memory (they outlive the transport)."""
        ...

    def send_network(self, network_id: int, data: bytes, version: int) -> None:
        """Hand one trained snapshot to the engine (same size as received). Rounds go 0, 1, 2; ``version``
        counts rounds from 1 (the socket sends it; shared memory has no field for it)."""
        ...

    def send_complete(self) -> None:
        """Training is finished; replaces the next round's network 0 (spec §7.1)."""
        ...

    def stop_requested(self) -> bool:
        """Non-blocking: True once the engine asked to stop (and from then on). The story polls it once
        per training iteration, so it must be cheap."""
        ...

    def ping(self) -> None:
        """Keep-alive for an engine that waits on us; thread-safe (a keep-alive thread calls it) and cheap."""
        ...

    def finish(self, timeout: float) -> None:
        """After Complete: let the engine wind down before we exit (bounded by ``timeout`` seconds)."""
        ...

    def close(self) -> None:
        """Release everything; unlink only what we created. Idempotent."""
        ...


def check_snapshot_size(network_id: int, data: bytes | bytearray | memoryview, expected: int) -> None:
    """Refuse a snapshot whose size is not ``expected`` (the network's MaxByteNum) with :class:`BadData`."""
    # The engine reads exactly MaxByteNum bytes and rejects other sizes (spec §8, §10 item 6).
    size = memoryview(data).nbytes
    if size != expected:
        raise BadData(
            f"network {network_id} snapshot is {size} bytes but the engine expects exactly {expected} "
            "(its MaxByteNum); a snapshot must keep the size it was received with."
        )
