"""What the session harness asks of the host: a free TCP port, and the shared-memory names a run leaked.

Linux-specific where it reads ``/dev/shm`` and ``/proc/<pid>/maps``; elsewhere the leak check sees
nothing (empty sets), which only makes it less strict.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

__all__ = ["free_tcp_port", "leaked_shm_entries", "shm_entries"]

_DEV_SHM = Path("/dev/shm")
_TRANSIENT_RECHECK_S = 0.3
"""A new /dev/shm entry must survive this long to count as a leak (other test processes on the same
machine create and remove their own regions meanwhile)."""


def free_tcp_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (bind to 0, read it, release it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def shm_entries() -> set[str]:
    """Names in ``/dev/shm`` that could be protocol regions (empty where it does not exist).

    POSIX semaphores (``sem.*``, e.g. Python multiprocessing's) live in the same folder but are never
    protocol regions; other processes on the machine create them at any time, so they are ignored.
    """
    try:
        return {name for name in os.listdir(_DEV_SHM) if not name.startswith("sem.")}
    except OSError:
        return set()


def _mapped_shm_names() -> set[str]:
    """Names under /dev/shm that some live process has mapped (from /proc/<pid>/maps; Linux only)."""
    names: set[str] = set()
    marker = str(_DEV_SHM) + "/"
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text(errors="replace")
        except OSError:
            continue  # the process ended or is not ours to read
        for line in text.splitlines():
            at = line.find(marker)
            if at >= 0:
                names.add(line[at + len(marker) :].removesuffix(" (deleted)"))
    return names


def leaked_shm_entries(before: set[str], ours: set[str]) -> tuple[str, ...]:
    """Entries of ``/dev/shm`` that appeared since ``before`` (:func:`shm_entries`), are not ``ours`` and
    are mapped by no live process, sorted. Call once the trainer has exited."""
    new = shm_entries() - before - ours
    if new:
        # Other processes on this machine (parallel test runs) create regions too. The trainer has
        # exited, so a region it leaked is mapped by nobody and stays; others' come and go or are mapped.
        time.sleep(_TRANSIENT_RECHECK_S)
        new &= shm_entries()
        new -= _mapped_shm_names()
    return tuple(sorted(new))
