"""``python -m trainer.dropin.pinger NAME LOCK LIFETIME``: pings a waiting engine while torchrun starts.

With ``LA_TRAINER_NPROC_PER_NODE`` the engine-spawned drop-in becomes torchrun (:mod:`trainer.dropin`),
and rank 0 opens the control block only after torchrun, the ranks' interpreters and torch have started:
seconds to tens of seconds on a loaded machine, past the engine's 10 s communicator timeout if the game
posted its config at once (spec §2.4). This small process bridges that gap: it maps the engine's control
block ``NAME`` and raises PingSignal every :data:`PING_PERIOD_S`, until rank 0 holds the control block's
lock ``LOCK`` (its pid is in the file: rank 0 pings from then on), torchrun has gone (our parent changed)
or ``LIFETIME`` seconds have passed. It never touches another control.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["PING_PERIOD_S", "STARTUP_LIFETIME_S", "main", "rank0_holds"]

PING_PERIOD_S = 0.5
"""Well under the engine's 10 s timeout, which a ping resets."""
STARTUP_LIFETIME_S = 300.0
"""The longest torchrun start this bridges; rank 0 pings by itself once it holds the block."""


def rank0_holds(lock_file: Path) -> bool:
    """True when ``lock_file`` names a live process other than this one (rank 0 holds the block)."""
    try:
        text = lock_file.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return False
    if not text.isdigit() or int(text) == os.getpid():
        return False
    from trainer.transport.liveness import process_watch

    return process_watch(int(text))()


def main(argv: Sequence[str] | None = None) -> int:
    from protocol.controls import CONTROL_BLOCK_BYTES, TrainerControls
    from trainer.errors import LaunchError
    from trainer.transport.shm import SharedRegion

    name, lock, lifetime = list(sys.argv[1:] if argv is None else argv)
    try:
        region = SharedRegion.open(name, CONTROL_BLOCK_BYTES, label="control block")
    except LaunchError:
        return 0  # no block (yet): nothing is waiting on us, rank 0 reports what is wrong
    try:
        controls = TrainerControls(region.buf)
        parent = os.getppid()
        end = time.monotonic() + float(lifetime)
        while time.monotonic() < end and os.getppid() == parent and not rank0_holds(Path(lock)):
            controls.ping()
            time.sleep(PING_PERIOD_S)
    finally:
        region.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
