"""Byte movers for the three transports: shared memory, TCP and export folders.

Nothing here knows a message layout; :mod:`protocol` holds those, and :mod:`trainer.links` joins the
two into one link per transport.
"""

from __future__ import annotations

from trainer.transport.shm import SharedRegion, region_exists
from trainer.transport.tcp import TcpConnection, TcpServer, connect_with_retry
from trainer.transport.wait import StopRequested, wait_until

__all__ = [
    "SharedRegion",
    "StopRequested",
    "TcpConnection",
    "TcpServer",
    "connect_with_retry",
    "region_exists",
    "wait_until",
]
