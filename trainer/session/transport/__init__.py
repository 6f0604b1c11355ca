"""Byte movers for the three transports (shared memory, TCP, export folders), the one wait policy every
blocking call uses, the shm replay buffer's staging copy and, in attach mode, the game's processes that
map our control block. Process liveness, atomic writes and the Win32 prototypes are :mod:`trainer.system`'s.

Nothing here knows a message layout; :mod:`protocol` holds those, and :mod:`trainer.session.links` joins the
two into one link per transport.
"""

from __future__ import annotations

from trainer.session.transport.shm import SharedRegion, region_exists
from trainer.session.transport.tcp import TcpConnection, TcpServer, connect_with_retry
from trainer.session.transport.wait import StopRequested, WaitRule, wait_until

__all__ = [
    "SharedRegion",
    "StopRequested",
    "TcpConnection",
    "TcpServer",
    "WaitRule",
    "connect_with_retry",
    "region_exists",
    "wait_until",
]
