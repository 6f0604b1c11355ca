"""Byte movers for the three transports (shared memory, TCP, export folders), the one wait policy every
blocking call uses (and where the engine's liveness comes from), and the one atomic file writer.

Nothing here knows a message layout; :mod:`protocol` holds those, and :mod:`trainer.links` joins the
two into one link per transport.
"""

from __future__ import annotations

from trainer.transport.atomic import atomic_file, atomic_write
from trainer.transport.liveness import parent_watch, process_watch
from trainer.transport.shm import SharedRegion, region_exists
from trainer.transport.tcp import TcpConnection, TcpServer, connect_with_retry
from trainer.transport.wait import StopRequested, WaitRule, wait_until

__all__ = [
    "SharedRegion",
    "StopRequested",
    "TcpConnection",
    "TcpServer",
    "WaitRule",
    "atomic_file",
    "atomic_write",
    "connect_with_retry",
    "parent_watch",
    "process_watch",
    "region_exists",
    "wait_until",
]
