"""The engine's ``train.py``, as la-trainer ships it: one entry for every way the engine or a user starts it.

``trainer/dropin/train.py`` is a file the engine can run (install-engine points the engine at it through
a small shim, ``scripts/train.py`` is a thin shim over it in a checkout), and :func:`main` decides:

* under torchrun (``RANK``/``WORLD_SIZE`` set): this process is one rank of the scale-out trainer
  (:mod:`trainer.distributed`; rank 0 alone talks to the game);
* with ``LA_TRAINER_NPROC_PER_NODE=N`` (N > 1) outside torchrun: re-execute under torchrun with N
  processes (the engine spawned one process; its id and output pipe stay the same on POSIX);
* otherwise the ordinary trainer (:func:`trainer.app.engine_main`), which hands runs it does not train
  to the engine's own ``train.py`` (:mod:`trainer.handover`).

The checks read the environment only: torch is imported after the link is open (spec §2.4).
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = [
    "ENV_ENGINE_PID",
    "ENV_NPROC",
    "ENV_TORCHRUN_ARGS",
    "main",
    "reexec_under_torchrun",
    "scale_out_requested",
    "torchrun_command",
]

ENV_NPROC = "LA_TRAINER_NPROC_PER_NODE"
"""Outside torchrun: > 1 makes the drop-in re-execute itself under torchrun with this many processes."""
ENV_TORCHRUN_ARGS = "LA_TRAINER_TORCHRUN_ARGS"
"""Extra torchrun arguments for that re-execution (default ``--standalone``; multi-node: ``--nnodes``...)."""
ENV_ENGINE_PID = "LA_TRAINER_ENGINE_PID"
"""Set by the re-execution: the process that started us (the engine); rank 0 stops when it is gone."""

_TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE")
"""What torchrun sets in every process it starts (``trainer.distributed.DistEnv`` reads them)."""


def scale_out_requested(environ: Mapping[str, str]) -> bool:
    """True under torchrun, or when :data:`ENV_NPROC` asks for more than one process (its value is checked
    by :mod:`trainer.distributed`, which reports a bad one with exit code 2)."""
    if any(name in environ for name in _TORCHRUN_VARIABLES):
        return True
    raw = environ.get(ENV_NPROC, "").strip()
    return bool(raw) and raw != "1"


def torchrun_command(argv: Sequence[str], nproc: int, extra: Sequence[str] = ()) -> list[str]:
    """``python -m torch.distributed.run [EXTRA | --standalone] --nproc-per-node N -m trainer.distributed
    ARGV``."""
    launch = list(extra) if extra else ["--standalone"]
    torchrun = [sys.executable, "-m", "torch.distributed.run", *launch, "--nproc-per-node", str(nproc)]
    return [*torchrun, "-m", "trainer.distributed", *argv]


def reexec_under_torchrun(argv: Sequence[str], nproc: int) -> int:
    """Engine-spawned scale-out: become torchrun with ``nproc`` processes, before torch is imported here.

    POSIX: ``os.execve``, so the engine's process handle and output pipe still name this process. Windows
    has no such exec: torchrun runs as our child and we return its exit code. Either way a small pinger
    (:mod:`trainer.dropin.pinger`) keeps a waiting engine's clock running until rank 0 holds the control
    block (shared memory; over a socket the engine retries its connection for its own timeout).
    """
    command = torchrun_command(argv, nproc, shlex.split(os.environ.get(ENV_TORCHRUN_ARGS, "")))
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # the package root: trainer/dropin/__init__.py
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env[ENV_ENGINE_PID] = str(os.getppid())
    from trainer.dropin.pinger import start_pinger

    pinger = start_pinger(argv, env, lock=True, engine_pid=os.getppid())
    sys.stdout.flush()
    if os.name == "nt":  # pragma: no cover - no exec on Windows
        import subprocess

        try:
            return subprocess.call(command, env=env)
        finally:
            if pinger is not None:
                pinger.kill()
    os.execve(sys.executable, command, env)
    raise AssertionError("os.execve returned")  # pragma: no cover


def main(argv: Sequence[str] | None = None) -> int:
    """The engine's command line (spec §1.2-1.4) in, an exit code out (README, "Exit codes")."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not any(name in os.environ for name in _TORCHRUN_VARIABLES):
        nproc = _nproc(os.environ)
        if nproc is None:
            return 2  # ExitCode.USAGE, said on stderr (trainer.exitcodes is not imported this early)
        if nproc > 1:
            return reexec_under_torchrun(args, nproc)
    if scale_out_requested(os.environ):
        from trainer.distributed.launch import main as scale_out

        return scale_out(args)
    from trainer.app import engine_main

    return engine_main(args)


def _nproc(environ: Mapping[str, str]) -> int | None:
    """:data:`ENV_NPROC` as a process count (1 when unset); None, after saying why, when it is not one."""
    raw = environ.get(ENV_NPROC, "").strip()
    if not raw:
        return 1
    if not raw.isdigit() or int(raw) < 1:
        print(
            f"la-trainer: environment variable {ENV_NPROC} must be a whole number >= 1, got {raw!r}.",
            file=sys.stderr,
            flush=True,
        )
        return None
    return int(raw)
