"""Byte movers for the three transports (shared memory, TCP, export folders), the one wait policy every
blocking call uses, and the one atomic file writer.

Nothing here knows a message layout; :mod:`protocol` holds those, and :mod:`trainer.links` joins the
two into one link per transport.
"""

from __future__ import annotations

from trainer.transport.atomic import atomic_file, atomic_write
from trainer.transport.shm import SharedRegion, region_exists
from trainer.transport.tcp import TcpConnection, TcpServer, connect_with_retry
from trainer.transport.wait import StopRequested, parent_watch, wait_until

__all__ = [
    "SharedRegion",
    "StopRequested",
    "TcpConnection",
    "TcpServer",
    "atomic_file",
    "atomic_write",
    "connect_with_retry",
    "parent_watch",
    "region_exists",
    "wait_until",
]
