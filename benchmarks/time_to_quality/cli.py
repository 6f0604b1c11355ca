"""``python -m benchmarks.time_to_quality``: run trainings (one JSON line each) and make the tables.

Run (appends to ``--out``, one line per training, written as soon as it finishes)::

    python -m benchmarks.time_to_quality run --tasks b1 b2 b3 --seeds 0 1 2 \\
        --variants default engine-loop --lr 1e-3 --out benchmarks/results/ttq/report.jsonl

``--iterations`` overrides a task's budget (the engine loop usually needs ``--reference-factor`` times
more: it runs that many times the budget and stops at its target). Tables::

    python -m benchmarks.time_to_quality table benchmarks/results/ttq/*.jsonl --lr 1e-3 1e-4

Threads: one torch thread per process (the networks are small; set ``OMP_NUM_THREADS=1`` too).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from benchmarks.time_to_quality.ceiling import exact_field_rows, ideal_sampler_rows
from benchmarks.time_to_quality.report import (
    ablation_table,
    ceiling_table,
    draws_table,
    encoder_check,
    load_rows,
    study_rows,
    time_table,
)
from benchmarks.time_to_quality.run import commit, train_and_evaluate
from benchmarks.time_to_quality.sweep import CANDIDATES, main_sweep
from benchmarks.time_to_quality.tasks import B2_EPISODES, TASKS, Target
from benchmarks.time_to_quality.variants import ENGINE_LOOP, parse_variant

__all__ = ["main"]

REPORT_EVAL_SEED = 1000
"""Evaluation seed of reported numbers (training seeds 0, 1, 2)."""
TUNE_EVAL_SEED = 2000
"""Evaluation seed while choosing settings (training seeds 100, 101): never used for reported numbers."""


def _run(args: argparse.Namespace) -> int:
    commit()  # the code this process imported, before any training (cached for every row)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    variants = [parse_variant(text) for text in args.variants]
    eval_seed = (
        args.eval_seed
        if args.eval_seed is not None
        else (TUNE_EVAL_SEED if all(s >= 100 for s in args.seeds) else REPORT_EVAL_SEED)
    )
    network = _parse_network(args.network) if args.network else None
    for key in args.tasks:
        task = TASKS[key]
        if network is not None:
            task = replace(task, hidden_layer_num=network[0], hidden_layer_size=network[1])
        for lr in args.lr:
            for named in variants:
                reference = named.name == ENGINE_LOOP.name
                # Another network is another row: its name says so, so no table mixes it with the task's own.
                variant = named if network is None else replace(named, name=f"{named.name}@{args.network}")
                budget = args.iterations or task.budget
                iterations = budget * args.reference_factor if reference else budget
                for seed in args.seeds:
                    row = train_and_evaluate(
                        task,
                        seed,
                        variant,
                        learning_rate=lr,
                        iterations=iterations,
                        eval_seed=eval_seed,
                        stop_at_target=reference or args.stop_at_target,
                        progress=args.progress,
                    )
                    with out.open("a", encoding="utf-8") as f:
                        f.write(json.dumps(row) + "\n")
                    reached = "not reached" if row["target_it"] is None else f"target at {row['target_it']}"
                    print(f"{key} seed {seed} {variant.name} lr {lr:g}: {reached}", flush=True)
    if args.table:
        _write_tables(load_rows([out]), args.lr, Path(args.table), ablation=True)
    return 0


def _parse_network(text: str) -> tuple[int, int]:
    """``--network LxS`` (e.g. ``2x128``): HiddenLayerNum L >= 1 of HiddenLayerSize S >= 1."""
    layers, sep, size = text.partition("x")
    if not (sep and layers.isdigit() and size.isdigit() and int(layers) >= 1 and int(size) >= 1):
        raise SystemExit(f"--network {text!r}: expected LAYERSxSIZE with both >= 1, e.g. 2x128")
    return int(layers), int(size)


def _parse_at(items: Sequence[str]) -> dict[str, tuple[Target, ...]]:
    """``--at TASK:METRIC=VALUE[,METRIC=VALUE]`` (e.g. ``b1:on_mode=0.7``): an intermediate target per task."""
    out: dict[str, tuple[Target, ...]] = {}
    for item in items:
        key, sep, spec = item.partition(":")
        if not sep or key not in TASKS:
            raise SystemExit(f"--at {item!r}: expected TASK:METRIC=VALUE with TASK one of {', '.join(TASKS)}")
        try:
            out[key] = tuple(
                Target(metric, float(value))
                for metric, _, value in (part.partition("=") for part in spec.split(","))
            )
        except ValueError:
            raise SystemExit(f"--at {item!r}: each target is METRIC=NUMBER") from None
    return out


def _write_tables(
    rows: Sequence[dict[str, object]],
    lrs: Sequence[float],
    path: Path | None,
    *,
    ablation: bool,
    at: Mapping[str, tuple[Target, ...]] | None = None,
) -> None:
    # The reported tables take only rows of this benchmark on the report draws (seeds 0, 1, 2 with
    # evaluation seed 1000); tuning rows and the research study's rows appear in the ablation only. The
    # ratio tables take the report seeds' other evaluation draws too; the ceiling's rows have no evals.
    ceiling = [r for r in rows if r.get("kind") == "ideal-sampler"]
    rows = [r for r in rows if r.get("kind") != "ideal-sampler"]
    ours = [r for r in rows if not str(r["commit"]).startswith("exp17@")]
    reported = [r for r in ours if r["eval_seed"] == REPORT_EVAL_SEED]
    draws = [r for r in ours if REPORT_EVAL_SEED <= int(str(r["eval_seed"])) < TUNE_EVAL_SEED]
    parts = [time_table(reported, lr) for lr in lrs]
    if at:
        parts += ["### At intermediate targets\n", *(time_table(reported, lr, targets=at) for lr in lrs)]
    ratio_parts = [draws_table(draws, lr) for lr in lrs]
    if at:
        ratio_parts += [draws_table(draws, lr, targets=at) for lr in lrs]
    if any(ratio_parts):
        parts += ["### Iteration ratios per evaluation draw\n", *filter(None, ratio_parts)]
    report_seeds = {r["seed"] for r in reported}
    parts.append(
        ceiling_table(
            [r for r in ceiling if r["eval_seed"] == REPORT_EVAL_SEED and r["seed"] in report_seeds], reported
        )
    )
    check = encoder_check(reported)
    if check:
        parts.append(check)
    if ablation:
        parts.append(ablation_table(rows))
    text = "\n".join(parts)
    if path is None:
        sys.stdout.write(text)
    else:
        path.write_text(text, encoding="utf-8")


def _table(args: argparse.Namespace) -> int:
    rows = load_rows(Path(p) for p in args.paths)
    _write_tables(
        rows, args.lr, Path(args.out) if args.out else None, ablation=args.ablation, at=_parse_at(args.at)
    )
    return 0


def _import_study(args: argparse.Namespace) -> int:
    rows = study_rows(Path(args.path))
    Path(args.out).write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    print(f"{len(rows)} rows -> {args.out}")
    return 0


def _ceiling(args: argparse.Namespace) -> int:
    rows = ideal_sampler_rows(args.seeds, args.eval_seed, episodes=args.episodes)
    with Path(args.out).open("a", encoding="utf-8") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    for row in rows:
        m = row["metrics"]
        print(
            f"b2 seed {row['seed']} resolution {row['resolution']:g}: success {m['success']:.3f}, "
            f"entropy {m['entropy']:.3f}"
        )
    return 0


def _field(args: argparse.Namespace) -> int:
    rows = exact_field_rows(args.seeds, args.eval_seed)
    with Path(args.out).open("a", encoding="utf-8") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    print("| seed | Euler steps | on_mode | both_modes_covered | balance_err | mmd |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        m = row["metrics"]
        print(
            f"| {row['seed']} | {row['steps']} | {m['on_mode']:.3f} | {m['both_modes_covered']:.3f} | "
            f"{m['balance_err']:.3f} | {m['mmd']:.3f} |"
        )
    return 0


def _sweep(args: argparse.Namespace) -> int:
    return main_sweep(
        Path(args.out),
        args.workers,
        args.deadline,
        args.commit or commit(),
        args.tasks or None,
        smoke_iterations=args.smoke_iterations,
        candidates=dict(_candidate(text) for text in args.candidates) if args.candidates else CANDIDATES,
        baselines=not args.no_baselines,
    )


def _candidate(text: str) -> tuple[str, str]:
    variant = parse_variant(text)  # refuses a bad spec before any run starts
    return variant.name, text


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.time_to_quality", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train and evaluate, one JSON line per training")
    run.add_argument("--tasks", nargs="+", choices=sorted(TASKS), default=["b1", "b2", "b3"])
    run.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    run.add_argument("--variants", nargs="+", default=["default", "engine-loop"])
    run.add_argument("--lr", nargs="+", type=float, default=[1e-3])
    run.add_argument("--iterations", type=int, default=0, help="0: each task's budget")
    run.add_argument("--reference-factor", type=int, default=10, help="engine loop: this times the budget")
    run.add_argument("--stop-at-target", action="store_true", help="every variant stops at its target")
    run.add_argument("--eval-seed", type=int, default=None)
    run.add_argument(
        "--network",
        default="",
        metavar="LxS",
        help="train this MLP (HiddenLayerNum x HiddenLayerSize) instead of the task's; rows named VARIANT@LxS",
    )
    run.add_argument("--out", required=True)
    run.add_argument("--progress", action="store_true")
    run.add_argument("--table", default="", help="afterwards, write the tables of --out's rows here")
    table = sub.add_parser("table", help="markdown tables from result files")
    table.add_argument("paths", nargs="+")
    table.add_argument("--lr", nargs="+", type=float, default=[1e-3, 1e-4])
    table.add_argument("--ablation", action="store_true", help="also every row tried")
    table.add_argument("--out", default="")
    table.add_argument(
        "--at",
        action="append",
        default=[],
        metavar="TASK:METRIC=VALUE",
        help="also the tables at this intermediate target (repeatable), e.g. b1:on_mode=0.7",
    )
    study = sub.add_parser("import-study", help="the research study's ablation.jsonl in this row format")
    study.add_argument("path")
    study.add_argument("--out", required=True)
    ceiling = sub.add_parser(
        "ceiling", help="B2's ideal-sampler ceiling (benchmarks.time_to_quality.ceiling)"
    )
    ceiling.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ceiling.add_argument("--eval-seed", type=int, default=REPORT_EVAL_SEED)
    ceiling.add_argument("--episodes", type=int, default=B2_EPISODES)
    ceiling.add_argument("--out", required=True)
    field = sub.add_parser(
        "field", help="B1's exact-field ceiling: N Euler steps of the true velocity field (ceiling.py)"
    )
    field.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    field.add_argument("--eval-seed", type=int, default=REPORT_EVAL_SEED)
    field.add_argument("--out", required=True)
    sweep = sub.add_parser("sweep", help="issue 23's tuning, choice and report runs in parallel processes")
    sweep.add_argument(
        "--out", required=True, help="folder for tune.jsonl, report.jsonl, ceiling.jsonl, sweep.log"
    )
    sweep.add_argument("--workers", type=int, default=15)
    sweep.add_argument("--deadline", type=float, default=520.0, help="seconds; runs still going are ended")
    sweep.add_argument(
        "--commit", default="", help="stamp for rows whose checkout has no git (default: this one)"
    )
    sweep.add_argument("--tasks", nargs="*", default=[], help="keep only these tasks' runs (a smoke check)")
    sweep.add_argument("--smoke-iterations", type=int, default=0, help="> 0: every run this short (a check)")
    sweep.add_argument(
        "--candidates",
        nargs="*",
        default=[],
        help="variants tuned instead of the built-in set (default among them)",
    )
    sweep.add_argument("--no-baselines", action="store_true", help="no baseline report rows, no ceiling")
    args = parser.parse_args(argv)
    commands = {
        "run": _run,
        "table": _table,
        "import-study": _import_study,
        "ceiling": _ceiling,
        "field": _field,
        "sweep": _sweep,
    }
    return commands[args.command](args)


if __name__ == "__main__":
    raise SystemExit(main())
