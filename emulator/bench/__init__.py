"""``la-trainer bench``: training throughput, replay ingest, startup and sync, each next to its limit.

One run measures everything side by side, so the ratios hold even on a loaded machine (each number is
the median of ``--repeats`` runs, contenders interleaved so that load changes hit all of them alike):

1. **Training** (iterations/s) against a reference loop and the matmul roofline
   (:mod:`emulator.bench.training`);
2. **Ingest** of a replay buffer over shared memory and the socket against memcpy and raw loopback,
4. **Sync** rounds, and 5. **peak RSS** while ingesting: the engine side here
   (:mod:`emulator.bench.ipc`), the trainer side in one worker process (:mod:`emulator.bench.worker`);
3. **Startup** of the real trainer, spawned as the engine spawns it (:mod:`emulator.bench.startup`).

What is measured and the targets: :mod:`emulator.bench.config`; the synthetic data, session and job:
:mod:`emulator.bench.workload`; the whole run: :mod:`emulator.bench.run`; summary, targets and tables:
:mod:`emulator.bench.report`; the click command (loaded by name by ``trainer.commands.cli``):
:mod:`emulator.bench.command`.

The speed bench lives in the installed game-side package, not in ``benchmarks/``, so that
``la-trainer bench`` works from a wheel and in the Docker image. Torch and the trainer are imported
inside the functions that use them: the worker times its own ``import torch``, and ``--help`` stays quick.
"""

from emulator.bench.command import bench_command
from emulator.bench.config import TARGETS, TRAIN_CONFIGS, BenchSettings, Target, TrainConfig
from emulator.bench.report import format_report
from emulator.bench.run import run_bench

__all__ = [
    "TARGETS",
    "TRAIN_CONFIGS",
    "BenchSettings",
    "Target",
    "TrainConfig",
    "bench_command",
    "format_report",
    "run_bench",
]
