"""What a held-out measurement costs beside the training it measures, on one thread: the selection score
alone (``HeldOutEvaluator.select``), the whole measurement (``evaluate``: selection, flow loss and the
4-sample metrics) and 1,000 training steps of the same job, alternated in one process so the machine's
load falls on all three alike.

  python -m benchmarks.selection.cost --out benchmarks/results/selection/cost.jsonl

Rows: one per (task, repeat) with milliseconds per call and the measurement's share of 1,000 steps.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import time
from pathlib import Path

import torch

from benchmarks.time_to_quality.run import make_job
from benchmarks.time_to_quality.tasks import TASKS
from benchmarks.time_to_quality.variants import parse_variant


def measure(task_key: str, repeats: int, steps: int) -> list[dict[str, object]]:
    torch.set_num_threads(1)
    task = TASKS[task_key]
    variant = parse_variant("standard=recipe:standard")  # one candidate: the step a run has after the pilot
    job, _ = make_job(task, 100, variant, 1e-3, 10_000)
    assert job.heldout is not None, f"{task_key}: nothing held out"
    evaluator = job.heldout
    rows: list[dict[str, object]] = []
    done = 0
    with contextlib.redirect_stdout(io.StringIO()):
        for _ in range(50):  # warm up: the step's first calls build and allocate
            job.step(done)
            done += 1
    for repeat in range(repeats):
        started = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            for _ in range(steps):
                job.step(done)
                done += 1
        step_s = (time.perf_counter() - started) / steps
        started = time.perf_counter()
        evaluator.select(job.model)
        select_s = time.perf_counter() - started
        started = time.perf_counter()
        evaluator.evaluate(job.model, done)
        evaluate_s = time.perf_counter() - started
        rows.append(
            {
                "task": task_key,
                "network": f"{task.hidden_layer_num}x{task.hidden_layer_size}",
                "repeat": repeat,
                "step_ms": round(step_s * 1e3, 4),
                "select_ms": round(select_s * 1e3, 2),
                "evaluate_ms": round(evaluate_s * 1e3, 2),
                "share_of_1000_steps": round(evaluate_s / (1000 * step_s), 4),
                "selection_rows": int(evaluator.select_demonstrated.shape[0]),
                "torch": torch.__version__,
            }
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--tasks", nargs="+", default=["b1", "b3", "demo"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    with args.out.open("a", encoding="utf-8") as out:
        for key in args.tasks:
            rows = measure(key, args.repeats, args.steps)
            for row in rows:
                out.write(json.dumps(row) + "\n")
            share = statistics.median(float(str(r["share_of_1000_steps"])) for r in rows)
            evaluate = statistics.median(float(str(r["evaluate_ms"])) for r in rows)
            print(f"{key}: evaluate {evaluate:.0f} ms, {share:.1%} of 1,000 steps (median of {len(rows)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
