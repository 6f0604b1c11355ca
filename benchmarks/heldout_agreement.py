"""Does the held-out metric rank checkpoints as the task's own quality does? (issue 23, trainer/training/heldout.py)

For each task (B1-B4 of the time-to-quality benchmark, its network, batch and learning rate), one training
with the hold-out on (``heldout_share``, the trainer's split by episode), evaluated at a few checkpoints
both ways: the held-out metrics, exactly as a run measures them (:class:`trainer.training.heldout.HeldOutEvaluator`
on the networks being trained), and the task's closed-loop (B2-B4) or open-loop (B1) evaluation through
the engine's inference path at 8 Euler steps (:func:`benchmarks.time_to_quality.tasks.engine_policy`).
Per task, the Spearman rank correlation over the checkpoints between each held-out metric (sign chosen
so that +1 means "ranks as the task does": lower-is-better metrics are negated) and the task's quality
metric. A second training of the same seed with the hold-out off, evaluated at the last checkpoint, shows
what the smaller training set costs.

Run (appends one JSON line per training to ``--out``; then the table)::

    python -m benchmarks.heldout_agreement run --tasks b1 b2 b3 b4 --out benchmarks/results/heldout-agreement.jsonl
    python -m benchmarks.heldout_agreement table benchmarks/results/heldout-agreement.jsonl

Cheap on purpose (a few thousand iterations, six checkpoints, one seed): it runs on a busy 2-core machine.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.time_to_quality.run import commit, make_job
from benchmarks.time_to_quality.tasks import TASKS, engine_policy
from benchmarks.time_to_quality.variants import Variant
from trainer.session.run import encode_networks

__all__ = ["CHECKPOINTS", "QUALITY", "main", "spearman"]

QUALITY = {"b1": "on_mode", "b2": "success", "b3": "score", "b4": "score"}
"""The task metric the held-out metrics are ranked against (higher is better)."""

CHECKPOINTS = {
    "b1": (100, 250, 500, 1000, 1500, 2000, 2500, 3000, 3500, 4000, 4500, 5000),
    "b2": (250, 500, 1000, 2000, 4000, 6000, 8000, 10000, 12000, 14000, 16000),
    "b3": (100, 250, 500, 750, 1000, 1500, 2000, 2500, 3000, 4000),
    "b4": (100, 250, 500, 750, 1000, 1500, 2000, 2500, 3000, 4000),
}
"""Iterations evaluated per task: early ones (clearly worse) to where the default is close to its target."""

HIGHER_IS_BETTER = {"coverage", "precision"}
"""Held-out metrics where more is better; the others (losses, distances) are negated for the ranking."""

HELDOUT_METRICS = ("flow_loss", "energy_score", "energy_distance", "w1", "coverage", "precision")
EVAL_SEED = 1000
LEARNING_RATE = 1e-3
SHARE = 0.1


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation (average ranks for ties); NaN when either side is constant."""
    ra, rb = _ranks(np.asarray(a, dtype=float)), _ranks(np.asarray(b, dtype=float))
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def _ranks(values: np.ndarray) -> np.ndarray:
    order = values.argsort(kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(len(values), dtype=float)
    for value in np.unique(values):
        tied = values == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def _train(task_key: str, seed: int, share: float, points: Sequence[int]) -> dict[str, Any]:
    """One training, evaluated at ``points``: the raw row."""
    task = TASKS[task_key]
    torch.set_num_threads(1)
    variant = Variant("heldout" if share > 0 else "all-data", {"heldout_share": share})
    iterations = max(points)
    job, received = make_job(task, seed, variant, LEARNING_RATE, iterations)
    if share > 0 and job.heldout is None:
        raise SystemExit(f"{task_key}: nothing was held out (too few episodes?)")
    evals: list[dict[str, Any]] = []
    done, train_s = 0, 0.0
    for point in points:
        started = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            while done < point:
                job.step(done)
                done += 1
        train_s += time.perf_counter() - started
        entry: dict[str, Any] = {"it": point, "train_s": round(train_s, 3)}
        if job.heldout is not None:
            measured = job.heldout.evaluate(job.model, point)
            entry["heldout"] = measured.record()
        blobs = encode_networks(received, job.export())
        policy = engine_policy(task, blobs, np.random.default_rng([EVAL_SEED, seed, 8]))
        entry["metrics"] = task.evaluate(policy, EVAL_SEED)
        evals.append(entry)
        shown = f"{QUALITY[task_key]}={entry['metrics'][QUALITY[task_key]]:.3f}"
        if "heldout" in entry:
            shown += f" ES={entry['heldout']['energy_score']:.4f} cov={entry['heldout']['coverage']:.3f}"
        print(f"  {task_key} s{seed} share={share} it {point}: {shown}", flush=True)
    return {
        "task": task_key,
        "seed": seed,
        "heldout_share": share,
        "heldout": None if job.heldout is None else dict(job.heldout.summary()),
        "train_rows": job.sample_num,
        "learning_rate": LEARNING_RATE,
        "quality_metric": QUALITY[task_key],
        "eval_seed": EVAL_SEED,
        "evals": evals,
        "seconds_per_iteration": train_s / max(1, done),
        "commit": commit(),
        "torch": torch.__version__,
    }


def _run(args: argparse.Namespace) -> int:
    commit()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for key in args.tasks:
        points = CHECKPOINTS[key]
        for seed in args.seeds:
            for share in (SHARE, 0.0) if args.compare else (SHARE,):
                # the all-data twin needs only its last checkpoint (the comparison of final quality)
                row = _train(key, seed, share, points if share > 0 else points[-1:])
                with out.open("a", encoding="utf-8") as handle:
                    handle.write(json.dumps(row) + "\n")
    return 0


def _correlations(evals: Sequence[Mapping[str, Any]], quality: str) -> list[str]:
    q = [e["metrics"][quality] for e in evals]
    cells = []
    for name in HELDOUT_METRICS:
        sign = 1.0 if name in HIGHER_IS_BETTER else -1.0
        cells.append(f"{spearman([sign * e['heldout'][name] for e in evals], q):+.2f}")
    return cells


def _picked(evals: Sequence[Mapping[str, Any]], name: str) -> Mapping[str, Any]:
    """The checkpoint a metric calls best (the first of equals)."""
    sign = -1.0 if name in HIGHER_IS_BETTER else 1.0
    return min(evals, key=lambda e: sign * e["heldout"][name])


def table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Spearman per task, seed and held-out metric, over every checkpoint and over the late ones (from
    half the last checkpoint on: where the quality changes little and the ranking is hard); what picking
    the best checkpoint by each metric would gain over the last one; then the task's metrics at the last
    checkpoint with the hold-out on and off."""
    header = "| task | seed | checkpoints | " + " | ".join(HELDOUT_METRICS) + " |"
    rule = "|---|---|---|" + "---|" * len(HELDOUT_METRICS)
    lines = [
        "Spearman rank correlation between each held-out metric (negated where lower is better) and the",
        "task's quality over one training's checkpoints (+1: the same order).",
        "",
        header,
        rule,
    ]
    picks = [
        "",
        "Quality at the checkpoint each held-out metric calls best, minus the quality at the last checkpoint",
        "(what heldout_send_best would have gained), and the most any checkpoint would have gained:",
        "",
        "| task | seed | " + " | ".join(HELDOUT_METRICS) + " | best possible |",
        "|---|---|" + "---|" * (len(HELDOUT_METRICS) + 1),
    ]
    finals: dict[str, dict[float, list[Mapping[str, float]]]] = {}
    for row in rows:
        quality = row["quality_metric"]
        finals.setdefault(row["task"], {}).setdefault(row["heldout_share"], []).append(
            row["evals"][-1]["metrics"]
        )
        measured = [e for e in row["evals"] if "heldout" in e]
        if len(measured) < 3:
            continue
        last = measured[-1]["it"]
        late = [e for e in measured if e["it"] >= last / 2]
        task = f"{row['task']} ({quality})"
        lines.append(
            f"| {task} | {row['seed']} | all {len(measured)} | "
            + " | ".join(_correlations(measured, quality))
            + " |"
        )
        if len(late) >= 3:
            lines.append(
                f"| {task} | {row['seed']} | late {len(late)} (>= {late[0]['it']}) | "
                + " | ".join(_correlations(late, quality))
                + " |"
            )
        end = measured[-1]["metrics"][quality]
        gains = [_picked(measured, name)["metrics"][quality] - end for name in HELDOUT_METRICS]
        ceiling = max(e["metrics"][quality] for e in measured) - end
        picks.append(
            f"| {task} | {row['seed']} | " + " | ".join(f"{g:+.3f}" for g in gains) + f" | {ceiling:+.3f} |"
        )
    lines += picks
    lines += [
        "",
        "The task's metrics at the last checkpoint, mean over seeds (values per seed), hold-out 10 % against",
        "all data (the hold-out trains on 10 % fewer episodes):",
        "",
        "| task | metric | hold-out 10 % | all data |",
        "|---|---|---|---|",
    ]
    for task, by_share in sorted(finals.items()):
        names = [k for k in by_share.get(SHARE, [{}])[0] if not k.startswith("mode/")]
        for name in names:
            cells = []
            for share in (SHARE, 0.0):
                values = [m[name] for m in by_share.get(share, [])]
                cells.append(
                    f"{np.mean(values):.3f} ({', '.join(f'{v:.3f}' for v in values)})" if values else "-"
                )
            lines.append(f"| {task} | {name} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.heldout_agreement", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train and evaluate; one JSON line per training")
    run.add_argument("--tasks", nargs="+", default=list(QUALITY), choices=sorted(QUALITY))
    run.add_argument("--seeds", nargs="+", type=int, default=[0])
    run.add_argument("--no-compare", dest="compare", action="store_false", help="skip the all-data twin")
    run.add_argument("--out", required=True)
    tab = sub.add_parser("table", help="the Spearman table of JSON-lines files")
    tab.add_argument("files", nargs="+")
    args = parser.parse_args(argv)
    if args.command == "run":
        return _run(args)
    rows = [json.loads(line) for f in args.files for line in Path(f).read_text().splitlines() if line.strip()]
    sys.stdout.write(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
