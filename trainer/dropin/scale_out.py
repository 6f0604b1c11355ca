"""``python -m trainer.distributed <engine argv>``: the engine's ``train.py`` under torchrun (one rank of the
scale-out trainer, :mod:`trainer.distributed`), or launching torchrun, or, with one process, the ordinary
trainer (:func:`trainer.dropin.engine.engine_main`). ``trainer/distributed/__main__.py`` runs :func:`main`."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from trainer.distributed.environment import DEFAULT_STALL_S, DEFAULT_TIMEOUT_S, DistEnv, env_int, float_env
from trainer.distributed.rank import run_rank
from trainer.dropin.engine import engine_main
from trainer.dropin.torchrun import record_exit, reexec_under_torchrun
from trainer.errors import LaunchError
from trainer.exitcodes import ExitCode
from trainer.settings.environment import ENV_AGREE, ENV_NPROC, ENV_STALL, ENV_TIMEOUT
from trainer.system.console import log_error

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m trainer.distributed <engine argv>`` (under torchrun, or launching it). Under the
    engine-spawned scale-out each rank records its exit code for the launcher (:mod:`trainer.dropin.torchrun`),
    which ends with it instead of torchrun's 1."""
    code = _main(list(sys.argv[1:] if argv is None else argv))
    record_exit(code)
    return code


def _main(args: list[str]) -> int:
    try:
        env = DistEnv.from_environ(os.environ)
        nproc = env_int(os.environ, ENV_NPROC, 1)
        if env is not None and env.world_size > 1:
            float_env(ENV_STALL, DEFAULT_STALL_S)
            float_env(ENV_TIMEOUT, DEFAULT_TIMEOUT_S)
            env_int(os.environ, ENV_AGREE, 1)
    except LaunchError as error:
        log_error(f"la-trainer: {error}")
        return int(ExitCode.USAGE)
    if env is None:
        return reexec_under_torchrun(args, nproc) if nproc is not None and nproc > 1 else engine_main(args)
    if env.world_size == 1:
        return engine_main(args)  # one process: the ordinary path, bit for bit
    return run_rank(env, lambda runner: engine_main(args, runner=runner))
