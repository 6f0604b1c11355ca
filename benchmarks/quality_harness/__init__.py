"""The quality benchmark: flow-matching policies trained by the REAL trainer process, scored the engine's way.

For every task (``docs/benchmarks.md`` B1 bimodal, B2 six-path avoid, B3 pendulum swing-up), seed and
row of the plan, the benchmark

1. builds the task's demonstrations and the three initial networks as the engine does, spawns
   ``scripts/train.py`` with the engine's argv and drives it over shared memory with the game-side
   emulator (:func:`emulator.session.run_engine_session`, mode ``shm``);
2. takes the snapshots the trainer sends back (one sync round every ``--curve-every`` iterations and the
   final one) and evaluates them through the engine's inference path (:class:`EnginePolicy`: encoder ->
   ``ODEStepsNum`` explicit Euler steps of the denoiser from N(0, I) -> decoder, numpy reference evaluator)
   at every NFE of ``--nfe`` (the final round) and at NFE 8 (every earlier round: the learning curve);
3. trains the same-network MSE regression baseline in-process (:mod:`benchmarks.mse_baseline`) and
   evaluates it through the same evaluator.

It prints one table per task (mean ± standard deviation over seeds, train steps, training wall-clock,
wall-clock per policy call), the time-distribution comparison when asked, and the target checks of the
flow-matching issue; it writes ``results.json``, ``tables.md`` and PNG plots into ``--out``.

The stages, in the order data flows through them: :mod:`.plan` (tasks, targets, rows, settings),
:mod:`.evaluation` (policies and their metrics), :mod:`.runs` (one row for one seed), :mod:`.tables`
(summaries, tables, target checks), :mod:`.plots`, :mod:`.benchmark` (the whole run and its report),
:mod:`.cli` (the command line). Run it as ``python benchmarks/quality.py --help``;
``benchmarks/README.md`` explains every column.
"""

from benchmarks.quality_harness.benchmark import run_benchmark
from benchmarks.quality_harness.cli import build_parser, config_from_args, main
from benchmarks.quality_harness.evaluation import evaluate_policy_for
from benchmarks.quality_harness.plan import (
    DEFAULT_ITERATIONS,
    DEFAULT_TIME_DISTRIBUTIONS,
    TARGETS,
    TASKS,
    HarnessConfig,
    RunResult,
    Target,
    Variant,
    plan_variants,
)
from benchmarks.quality_harness.tables import summarise

__all__ = [
    "DEFAULT_ITERATIONS",
    "DEFAULT_TIME_DISTRIBUTIONS",
    "TARGETS",
    "TASKS",
    "HarnessConfig",
    "RunResult",
    "Target",
    "Variant",
    "build_parser",
    "config_from_args",
    "evaluate_policy_for",
    "main",
    "plan_variants",
    "run_benchmark",
    "summarise",
]
