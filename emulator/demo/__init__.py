"""``la-trainer demo``: the whole loop on the built-in game emulator, no Unreal needed.

The story, in execution order (:func:`run_demo` in :mod:`emulator.demo.run`):

1. **Record** (:func:`record_demonstrations`): the scripted expert of benchmark B2 ("avoid", six path
   modes, ``docs/benchmarks.md``) plays 200 episodes; they become the engine's replay buffer, one
   episode per record (spec §5.3).
2. **Train** (:func:`train_over_shared_memory`, :mod:`emulator.demo.training`): the emulated engine
   builds its three flow-matching networks (spec §6.3), creates the controls block and regions, writes the
   config files, and spawns the real trainer (its drop-in ``trainer/dropin/train.py``) with the engine's command line (spec
   §1.2). It sends networks 0, 1, 2 and the replay buffer, then ticks (:mod:`emulator.drive`): every round
   of networks the trainer syncs back is taken as a game takes it (spec §7.1). The trainer's stdout
   progress lines drive the progress bar and the loss curve.
3. **Evaluate** (:func:`evaluate_networks`, :mod:`emulator.demo.evaluation`): the last networks the game
   received run through the engine's inference path (encoder → ``ODEStepsNum`` Euler steps of the
   denoiser from N(0, I) → decoder, :class:`emulator.inference.EnginePolicy`) in 200 closed-loop
   rollouts; the scripted expert is scored on the same start positions.
4. **Report** (:mod:`emulator.demo.report`, :mod:`emulator.demo.figure`): ``report.md``, ``report.png``
   and ``metrics.json`` in ``--out``.

Sizes and knobs are the :class:`DemoPlan` (:mod:`emulator.demo.plan`); the click command and its console
are :mod:`emulator.demo.command`.

Time: the whole command is meant to end within ``--time-limit`` seconds (default 110, under two minutes
on two CPU cores). When training would run past that, the game sends Stop (the engine's EndTraining,
spec §2.4) and the networks it received last are evaluated; the report says so. Ctrl-C does the same
early stop; a second Ctrl-C aborts.

This module only re-exports the public names; ``la-trainer demo`` loads ``emulator.demo:demo_command``.
"""

from emulator.demo.command import DEFAULT_OUT_DIR, demo_command
from emulator.demo.evaluation import Evaluation, evaluate_networks, evaluation_starts
from emulator.demo.plan import DEFAULT_TIME_LIMIT_S, EVALUATION_SEED, QUICK_PLAN, DemoPlan, make_plan
from emulator.demo.run import DemoOutcome, record_demonstrations, run_demo
from emulator.demo.training import (
    DemoError,
    ProgressLine,
    TrainingMonitor,
    TrainingRun,
    parse_progress_line,
    train_over_shared_memory,
)

__all__ = [
    "DEFAULT_OUT_DIR",
    "DEFAULT_TIME_LIMIT_S",
    "EVALUATION_SEED",
    "QUICK_PLAN",
    "DemoError",
    "DemoOutcome",
    "DemoPlan",
    "Evaluation",
    "ProgressLine",
    "TrainingMonitor",
    "TrainingRun",
    "demo_command",
    "evaluate_networks",
    "evaluation_starts",
    "make_plan",
    "parse_progress_line",
    "record_demonstrations",
    "run_demo",
    "train_over_shared_memory",
]
