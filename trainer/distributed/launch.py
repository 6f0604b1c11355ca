"""The entry point: ``python -m trainer.distributed <engine argv>``, under torchrun or launching it."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from trainer.app import engine_main
from trainer.distributed.environment import (
    DEFAULT_STALL_S,
    DEFAULT_TIMEOUT_S,
    ENV_AGREE,
    ENV_ENGINE_PID,
    ENV_NPROC,
    ENV_STALL,
    ENV_TIMEOUT,
    ENV_TORCHRUN_ARGS,
    DistEnv,
    env_int,
    float_env,
)
from trainer.distributed.rank import run_rank
from trainer.errors import LaunchError
from trainer.exitcodes import ExitCode

__all__ = ["main", "torchrun_command"]


def torchrun_command(argv: Sequence[str], nproc: int, extra: Sequence[str] = ()) -> list[str]:
    """``python -m torch.distributed.run [EXTRA | --standalone] --nproc-per-node N -m trainer.distributed
    ARGV``."""
    launch = list(extra) if extra else ["--standalone"]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *launch,
        "--nproc-per-node",
        str(nproc),
        "-m",
        "trainer.distributed",
        *argv,
    ]


def _exec_torchrun(argv: Sequence[str], nproc: int) -> int:
    """Engine-spawned mode: replace this process by torchrun (same pid, so the engine still watches it)."""
    command = torchrun_command(argv, nproc, shlex.split(os.environ.get(ENV_TORCHRUN_ARGS, "")))
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # the checkout: trainer/distributed/launch.py
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env[ENV_ENGINE_PID] = str(os.getppid())
    sys.stdout.flush()
    if os.name == "nt":  # pragma: no cover - no exec on Windows
        import subprocess

        return subprocess.call(command, env=env)
    os.execve(sys.executable, command, env)
    return int(ExitCode.INTERNAL)  # pragma: no cover - execve does not return


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m trainer.distributed <engine argv>`` (under torchrun, or launching it)."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        env = DistEnv.from_environ(os.environ)
        nproc = env_int(os.environ, ENV_NPROC, 1)
        if env is not None and env.world_size > 1:
            float_env(ENV_STALL, DEFAULT_STALL_S)
            float_env(ENV_TIMEOUT, DEFAULT_TIMEOUT_S)
            env_int(os.environ, ENV_AGREE, 1)
    except LaunchError as error:
        print(f"la-trainer: {error}", file=sys.stderr, flush=True)
        return int(ExitCode.USAGE)
    if env is None:
        return _exec_torchrun(args, nproc) if nproc is not None and nproc > 1 else engine_main(args)
    if env.world_size == 1:
        return engine_main(args)  # one process: the ordinary path, bit for bit
    return run_rank(env, lambda runner: engine_main(args, runner=runner))
