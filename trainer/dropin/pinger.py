"""``python -m trainer.dropin.pinger NAME LIFETIME (--lock LOCK | --handover) [--engine PID]``: keeps a
waiting engine's clock running while another process starts up.

The engine waits for the trainer with a 10 s clock that a ping resets (spec §2.4). Two start-ups of the
engine-spawned drop-in take longer than that on a loaded machine, after the game may already have posted
its config:

* **scale-out** (``--lock LOCK``): the drop-in becomes torchrun (:mod:`trainer.dropin`), and rank 0 opens
  the control block only after torchrun, the ranks' interpreters and torch have started. The pinger stops
  once rank 0 holds the control block's lock ``LOCK`` (its pid is in the file: rank 0 pings from then on).
* **hand-over** (``--handover``): the run goes to the engine's own ``train.py`` (:mod:`trainer.dropin.handover`),
  which starts Python and imports torch before its first handshake. The pinger stops once that script has
  taken over: it asked for a network (NetworkSignal = 1, or NetworkId set by the game's answer) or ended
  the session (CompleteSignal), or the game asked to stop.

Either way it maps the engine's control block ``NAME``, raises PingSignal every :data:`PING_PERIOD_S` and
also stops when its parent (torchrun; the process that became the engine's script) is gone, when the
engine ``--engine PID`` is gone, or after ``LIFETIME`` seconds. It never writes another control.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainer.system.liveness import ProcessApi

__all__ = [
    "HANDOVER_LIFETIME_S",
    "PING_PERIOD_S",
    "STARTUP_LIFETIME_S",
    "main",
    "rank0_holds",
    "script_took_over",
    "start_pinger",
]

PING_PERIOD_S = 0.5
"""Well under the engine's 10 s timeout, which a ping resets."""
STARTUP_LIFETIME_S = 300.0
"""The longest torchrun start this bridges; rank 0 pings by itself once it holds the block."""
HANDOVER_LIFETIME_S = 300.0
"""The longest start of the engine's own script this bridges (its Python, torch and its module)."""


def rank0_holds(lock_file: Path, *, platform: str | None = None, api: ProcessApi | None = None) -> bool:
    """True when ``lock_file`` names a live process other than this one (rank 0 holds the block).

    Rank 0 starts after this pinger, so the check must take a younger process (issue 30: a watch made for
    the engine took rank 0 for a reused id on Windows, and leaked its handles on every poll): one look
    that closes its handles, with the file's write time as the reuse guard (rank 0 wrote its id there
    after it started). ``platform``/``api``: seams for tests (:func:`trainer.system.liveness.process_alive`).
    """
    try:
        text = lock_file.read_text(encoding="ascii", errors="replace").strip()
        written = lock_file.stat().st_mtime
    except OSError:
        return False
    if not text.isdigit() or int(text) == os.getpid():
        return False
    from trainer.system.liveness import process_alive

    return process_alive(int(text), started_by=written, platform=platform, api=api)


def script_took_over(controls: Sequence[int]) -> bool:
    """True once the trainer side of the block shows a handshake la-trainer did not make (``controls``:
    the ten values, :func:`protocol.controls.read_controls`).

    At the hand-over la-trainer has requested nothing (NetworkSignal 0, NetworkId -1, spec §2.4), so a
    request, the game's answer to one, a Complete, or the game's Stop all mean the engine's script runs
    its own session (or the session is over) and our pings are no longer needed.
    """
    from protocol.controls import Control

    return (
        controls[Control.NETWORK_SIGNAL] == 1
        or controls[Control.NETWORK_ID] != -1
        or controls[Control.COMPLETE_SIGNAL] == 1
        or controls[Control.STOP_SIGNAL] == 1
    )


def start_pinger(
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    lock: bool = False,
    engine_pid: int | None = None,
) -> subprocess.Popen[bytes] | None:
    """Start the pinger for the control block named in a spawned shared-memory ``argv`` (None for any
    other command line, or when the pinger cannot run: the caller goes on without it).

    ``lock``: scale-out mode (stop when rank 0 holds the block's lock); else hand-over mode. The pinger
    inherits nothing but the environment: no output handle of the engine's pipe is kept open by it.
    """
    from protocol.argv import SharedMemoryArgs, parse_launch_argv
    from protocol.errors import ProtocolError
    from protocol.guid import os_shm_name

    try:
        mode = parse_launch_argv(list(argv)).mode
        if not isinstance(mode, SharedMemoryArgs) or mode.create_mem or not mode.controls_guid:
            return None
        name = os_shm_name(mode.controls_guid, sys.platform)
    except ProtocolError:
        return None  # the trainer reports the bad command line
    command = [sys.executable, "-m", "trainer.dropin.pinger", name]
    if lock:
        from trainer.system.lockfile import lock_path

        command += [str(STARTUP_LIFETIME_S), "--lock", str(lock_path(mode.controls_guid))]
    else:
        command += [str(HANDOVER_LIFETIME_S), "--handover"]
    if engine_pid is not None:
        command += ["--engine", str(engine_pid)]
    root = str(Path(__file__).resolve().parents[2])  # the package root: trainer/dropin/pinger.py
    child_env = dict(env)
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (root, child_env.get("PYTHONPATH", "")) if p)
    try:
        return subprocess.Popen(
            command,
            env=child_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    except OSError:
        return None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m trainer.dropin.pinger")
    parser.add_argument("name", help="the control block's OS name")
    parser.add_argument("lifetime", type=float, help="seconds at most")
    until = parser.add_mutually_exclusive_group(required=True)
    until.add_argument("--lock", type=Path, help="scale-out: stop once rank 0 holds this lock file")
    until.add_argument("--handover", action="store_true", help="stop once the engine's script took over")
    parser.add_argument("--engine", type=int, default=None, help="stop once this process is gone")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from protocol.controls import CONTROL_BLOCK_BYTES, TrainerControls, read_controls
    from trainer.errors import LaunchError
    from trainer.session.transport.shm import SharedRegion
    from trainer.system.liveness import parent_watch, process_watch

    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        region = SharedRegion.open(args.name, CONTROL_BLOCK_BYTES, label="control block")
    except LaunchError:
        return 0  # no block (any more): nothing is waiting on us, the trainer reports what is wrong
    lock: Path | None = args.lock
    done: Callable[[], bool]
    if lock is not None:
        done = lambda: rank0_holds(lock)  # noqa: E731
    else:
        done = lambda: script_took_over(read_controls(region.buf))  # noqa: E731
    parent_alive = parent_watch()
    engine_alive = process_watch(args.engine) if args.engine is not None else (lambda: True)
    try:
        controls = TrainerControls(region.buf)
        end = time.monotonic() + args.lifetime
        while time.monotonic() < end and parent_alive() and engine_alive() and not done():
            controls.ping()
            time.sleep(PING_PERIOD_S)
    finally:
        region.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
