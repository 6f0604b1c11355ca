"""Timeouts and cadences: the one settings object every wait in the trainer reads.

The engine's own communicator timeout is 10 s (spec §1.6, §2.4); it is reset by a ping. Our waits are
longer where the engine may legitimately be slow (a game loading a level before it sends the config) and
every wait also watches the peer, so a vanished engine ends the run within seconds of being noticed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

__all__ = ["Timeouts"]


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Every wait of the trainer, in seconds."""

    config: float = 120.0
    """Waiting for the engine to post its config (attach mode: the user still has to start the game)."""
    network: float = 30.0
    """Waiting for one initial network after asking for it."""
    experience: float = 60.0
    """Waiting for the replay buffer after the networks."""
    send: float = 30.0
    """Waiting for the engine to take a network we sent (NetworkSignal back to 0)."""
    connect: float = 120.0
    """Socket mode: waiting for the engine to connect."""
    close: float = 30.0
    """After Complete, how long :meth:`~trainer.links.TrainerLink.finish` lets the engine wind down (socket:
    until it closes the connection, spec §10 item 7; shared memory: until it takes Complete)."""
    ping_interval: float = 1.0
    """Keep-alive period while we are busy and the engine may be waiting; well under its 10 s timeout."""
    poll_interval: float = 0.0005
    """Sleep between polls of the control block (the engine polls every 1 ms)."""
    peer_check_interval: float = 0.5
    """How often a wait checks that the engine is still there."""

    @classmethod
    def from_env(cls) -> Timeouts:
        """Defaults, scaled by ``LA_TRAINER_TIMEOUT_SCALE`` (tests use a small scale to fail fast)."""
        base = cls()
        scale = float(os.environ.get("LA_TRAINER_TIMEOUT_SCALE", "1") or "1")
        if scale == 1.0:
            return base
        return replace(
            base,
            config=base.config * scale,
            network=base.network * scale,
            experience=base.experience * scale,
            send=base.send * scale,
            connect=base.connect * scale,
            close=base.close * scale,
        )
