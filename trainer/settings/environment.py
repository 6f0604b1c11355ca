"""The one table of ``LA_TRAINER_*`` environment names, and the reader of those that are numbers.

Two kinds of name share the prefix :data:`ENV_PREFIX`:

* **options**: ``LA_TRAINER_`` + an option's name in capitals (``LA_TRAINER_ODE_STEPS``), derived from the
  option itself (:func:`trainer.settings.options.env_name`), never written out;
* **the others**, below: each is defined here once, with what it does, and imported by the module that
  reads it. :data:`NOT_OPTIONS` lists them with their readers, so that setting one never draws the
  "not a la-trainer setting" warning meant for a misspelt option (a test checks that every
  ``LA_TRAINER_`` name in the source, the scripts and the documentation is an option, an alias or here).

A number that is not an option (``LA_TRAINER_TIMEOUT_SCALE``) is refused as options are
(:func:`environment_number`): at once, exit code 2, one paragraph with the variable, its value, what is
accepted and the fix (the form of :class:`trainer.settings.options.OptionError`).

Standard library only (with :mod:`trainer.errors`): the drop-in reads these names before it knows
whether this Python can train.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping

from trainer.errors import LaunchError

__all__ = [
    "ENV_AGREE",
    "ENV_BACKEND",
    "ENV_ENGINE_PID",
    "ENV_ENGINE_TRAIN_PY",
    "ENV_EXIT_DIR",
    "ENV_HANDED_OVER",
    "ENV_NPROC",
    "ENV_PREFIX",
    "ENV_STALL",
    "ENV_TIMEOUT",
    "ENV_TIMEOUT_SCALE",
    "ENV_TORCHRUN_ARGS",
    "NOT_OPTIONS",
    "environment_number",
]

ENV_PREFIX = "LA_TRAINER_"
"""The prefix of every name here and of every option's variable."""

ENV_TIMEOUT_SCALE = "LA_TRAINER_TIMEOUT_SCALE"
"""Multiplies every bounded wait (:meth:`trainer.settings.timeouts.Timeouts.from_env`; tests make waits
fail fast with a small scale)."""
ENV_NPROC = "LA_TRAINER_NPROC_PER_NODE"
"""Outside torchrun: > 1 makes the drop-in re-execute itself under torchrun with this many processes."""
ENV_TORCHRUN_ARGS = "LA_TRAINER_TORCHRUN_ARGS"
"""Extra torchrun arguments for that re-execution (default ``--standalone``; multi-node: ``--nnodes``...)."""
ENV_ENGINE_PID = "LA_TRAINER_ENGINE_PID"
"""Set by the re-execution: the process that started us (the engine); rank 0 stops when it is gone."""
ENV_BACKEND = "LA_TRAINER_DIST_BACKEND"
"""Override the process-group backend string (default: ``cpu:gloo,cuda:nccl`` with CUDA, else ``gloo``)."""
ENV_TIMEOUT = "LA_TRAINER_DIST_TIMEOUT_SECONDS"
"""Collective timeout, seconds (default :data:`trainer.distributed.environment.DEFAULT_TIMEOUT_S`)."""
ENV_AGREE = "LA_TRAINER_DIST_AGREE_EVERY"
"""Steps between the ranks' agreements on stop / interrupt / loss (default 8)."""
ENV_STALL = "LA_TRAINER_DIST_STALL_SECONDS"
"""Seconds a training step may wait on the other ranks before rank 0 gives up (default 300)."""
ENV_EXIT_DIR = "LA_TRAINER_EXIT_DIR"
"""The folder each torchrun rank writes ``rank-<RANK>.txt`` (its exit code) into, for the launcher
(:mod:`trainer.dropin.torchrun`)."""
ENV_ENGINE_TRAIN_PY = "LA_TRAINER_ENGINE_TRAIN_PY"
"""Explicit path of the engine's own ``train.py``, for the hand-over of other methods
(:mod:`trainer.dropin.handover`; the install-engine shim sets it from its record)."""
ENV_HANDED_OVER = "LA_TRAINER_HANDED_OVER"
"""Set in the environment of the engine's script: a la-trainer started with it refuses to hand over again."""

NOT_OPTIONS: dict[str, str] = {
    ENV_TIMEOUT_SCALE: "trainer/settings/timeouts.py: multiplies every bounded wait",
    ENV_NPROC: "trainer/dropin: re-run the engine-spawned trainer under torchrun",
    ENV_TORCHRUN_ARGS: "trainer/dropin: extra torchrun arguments",
    ENV_ENGINE_PID: "trainer/distributed: the engine's pid, passed to the ranks",
    ENV_BACKEND: "trainer/distributed: torch.distributed backend",
    ENV_TIMEOUT: "trainer/distributed: collective timeout",
    ENV_AGREE: "trainer/distributed: weight-agreement check cadence",
    ENV_STALL: "trainer/distributed: watchdog",
    ENV_EXIT_DIR: "trainer/dropin/torchrun.py: where each rank records its exit code for the launcher",
    ENV_ENGINE_TRAIN_PY: "the engine's own train.py for hand-over (docs/unreal-install.md)",
    ENV_HANDED_OVER: "set by the hand-over to the engine's own train.py",
    "LA_TRAINER_VENV": "scripts/setup_env.sh: where the virtual environment goes",
    "LA_TRAINER_TORCH": "scripts/setup_env.sh: the torch build to install first (cpu, cu126, ...)",
    "LA_TRAINER_ENGINE_VENV": "scripts/test_engine_torch.sh: where the engine-torch environment goes",
    "LA_TRAINER_FUZZ_EXAMPLES": "tests/faults/test_fuzz.py: examples per decoder",
}
"""Every ``LA_TRAINER_*`` name that is not an option, with who reads it and why (the last four are read
by the set-up scripts and the tests, not by the trainer, and are often still set in the shell that runs
it)."""


def environment_number(
    name: str,
    default: float,
    expected: str,
    check: Callable[[float], bool],
    environ: Mapping[str, str] | None = None,
) -> float:
    """The number in the variable ``name`` (``default`` when unset or empty).

    Raises:
        LaunchError: not a finite number, or ``check`` refuses it; the message says ``expected``.
    """
    raw = (os.environ if environ is None else environ).get(name, "")
    if not raw.strip():
        return default
    try:
        value = float(raw.strip())
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not check(value):
        raise LaunchError(
            f"environment variable {name} is set to {raw!r}, but it must be {expected}. "
            f"Change or unset {name} in the environment that starts the trainer."
        )
    return value
