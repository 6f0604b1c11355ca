"""The quality benchmark's command line: options → :class:`HarnessConfig` → the whole benchmark, or the
tables of an interrupted run (``--tables-from``)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from benchmarks.quality_harness.benchmark import load_partial, run_benchmark, write_report
from benchmarks.quality_harness.plan import (
    CURVE_NFE,
    DEFAULT_DEMOS,
    DEFAULT_ITERATIONS,
    DEFAULT_TIME_DISTRIBUTIONS,
    TASKS,
    HarnessConfig,
    plan_variants,
)

__all__ = ["COMMAND", "build_parser", "config_from_args", "main", "tables_from_partial"]

COMMAND = "python benchmarks/quality.py"
"""How the benchmark is run (README), recorded in ``results.json`` and ``partial.json``."""


def _int_list(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def _task_list(text: str) -> tuple[str, ...]:
    tasks = tuple(t.strip().lower() for t in text.split(",") if t.strip())
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown task(s) {unknown}; known: {', '.join(TASKS)}")
    return tasks


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=COMMAND.split()[1],
        description="Quality benchmark: trains through the real trainer process, evaluates the engine's way.",
    )
    p.add_argument(
        "--tasks", type=_task_list, default=("b1", "b2", "b3"), help="comma list of b1,b2,b3 ('' for none)"
    )
    p.add_argument("--seeds", type=int, default=3, help="number of training seeds (0..N-1)")
    p.add_argument(
        "--iterations", type=int, default=0, help="train steps for every row (0: 12k B1/B2, 8k B3)"
    )
    p.add_argument("--nfe", type=_int_list, default=(1, 2, 4, 8, 16), help="ODEStepsNum values to evaluate")
    p.add_argument("--out", type=Path, default=Path("reports/quality"))
    p.add_argument(
        "--quick", action="store_true", help="tiny budget: 1 seed, 300 steps, small data (smoke run)"
    )
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument(
        "--hidden-layer-num",
        type=int,
        default=2,
        help="FlowMatchingSettings.HiddenLayerNum; the MLP has HiddenLayerNum + 2 Linear layers (2: 3 hidden layers)",
    )
    p.add_argument("--hidden-layer-size", type=int, default=256)
    p.add_argument("--ema-decay", type=float, default=0.999)
    p.add_argument("--threads", type=int, default=0, help="LA_TRAINER_THREADS (0: the trainer's choice)")
    p.add_argument(
        "--curve-every", type=int, default=2000, help="sync (and evaluate) every N steps; 0: final only"
    )
    p.add_argument(
        "--no-embed-false-row", action="store_true", help="skip the B1 EmbedNormalizationsInWeights=false row"
    )
    p.add_argument("--no-b2-chunk-row", action="store_true", help="skip the B2 chunk 8/4 rows")
    p.add_argument(
        "--time-dists",
        nargs="*",
        default=None,
        help=f"compare these t distributions (no value: {' '.join(DEFAULT_TIME_DISTRIBUTIONS)})",
    )
    p.add_argument("--time-dist-tasks", type=_task_list, default=("b1",))
    p.add_argument("--b1-demos", type=int, default=0, help="B1 demonstration pairs (0: 20000)")
    p.add_argument("--eval-seed", type=int, default=1000)
    p.add_argument(
        "--work-dir", type=Path, default=None, help="keep the engine folders here (default: a temp dir)"
    )
    p.add_argument(
        "--jobs", type=int, default=1, help="trainings at the same time (wall-clock columns then shared)"
    )
    p.add_argument("--resume", action="store_true", help="keep finished trainings from <out>/partial.json")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument(
        "--tables-from",
        type=Path,
        default=None,
        help="rebuild tables.md/results.json from an interrupted run's partial.json (trains nothing)",
    )
    p.add_argument("--echo", action="store_true", help="echo the trainer's output")
    p.add_argument("--rows", default="", help="regex: only the rows whose key matches (e.g. 'b2/fm-chunk')")
    return p


def config_from_args(args: argparse.Namespace) -> HarnessConfig:
    iterations = {t: (args.iterations or DEFAULT_ITERATIONS[t]) for t in TASKS}
    demos = dict(DEFAULT_DEMOS)
    if args.b1_demos:
        demos["b1"] = args.b1_demos
    time_dists: tuple[str, ...] = ()
    if args.time_dists is not None:
        time_dists = tuple(args.time_dists) or DEFAULT_TIME_DISTRIBUTIONS
    cfg = HarnessConfig(
        tasks=tuple(args.tasks),
        seeds=tuple(range(args.seeds)),
        nfe=tuple(args.nfe),
        iterations=iterations,
        batch_size=args.batch_size,
        learning_rate=args.lr,
        hidden_layer_num=args.hidden_layer_num,
        hidden_layer_size=args.hidden_layer_size,
        ema_decay=args.ema_decay,
        threads=args.threads,
        eval_seed=args.eval_seed,
        curve_every=args.curve_every,
        demos=demos,
        embed_false_row=not args.no_embed_false_row,
        b2_chunk_row=not args.no_b2_chunk_row,
        time_dists=time_dists,
        time_dist_tasks=tuple(args.time_dist_tasks),
        rows=args.rows,
        out=args.out,
        work_dir=args.work_dir,
        plots=not args.no_plots,
        echo=args.echo,
        jobs=max(1, args.jobs),
        resume=args.resume,
    )
    if args.quick:
        # A smoke run of the whole pipeline, not a measurement: every number it prints is under-trained.
        cfg = replace(
            cfg,
            seeds=(0,),
            nfe=(1, CURVE_NFE),
            iterations={t: (args.iterations or 300) for t in TASKS},
            batch_size=min(args.batch_size, 64),
            hidden_layer_size=min(args.hidden_layer_size, 64),
            curve_every=0,
            demos={"b1": args.b1_demos or 2000, "b2": 40, "b3": 10},
            eval_sizes={"b1": 50, "b2": 40, "b3": 10},
            b1_samples=16,
            embed_false_row=False,
            b2_chunk_row=False,
            quick=True,
        )
    for nfe in cfg.nfe:
        if not 1 <= nfe <= 100:
            raise SystemExit(f"--nfe values must be in 1..100 (the engine's clamp), got {nfe}")
    return cfg


def tables_from_partial(path: Path, override: HarnessConfig) -> int:
    """Tables of the runs an interrupted benchmark finished: its plan comes from the command recorded in
    ``partial.json``; the output goes next to it."""
    if not path.is_file():
        raise SystemExit(f"--tables-from: no such file {path}")
    command, runs = load_partial(path)
    recorded = command.split()
    argv = recorded[2:] if recorded[:2] == COMMAND.split() else recorded
    cfg = replace(config_from_args(build_parser().parse_args(argv)), out=path.parent, plots=override.plots)
    write_report(
        cfg,
        plan_variants(cfg),
        runs,
        {},
        command=" ".join(recorded),
        started_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        total_s=0.0,
        load_start=os.getloadavg(),
        complete=False,
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry; returns 0 when every training ran (targets are reported, not enforced), 1 otherwise."""
    args = build_parser().parse_args(argv)
    cfg = config_from_args(args)
    command = COMMAND + " " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.tables_from is not None:
        return tables_from_partial(args.tables_from, cfg)
    report = run_benchmark(cfg, command)
    failed = [r for r in report["runs"] if r["failure"]]
    return 1 if failed else 0
