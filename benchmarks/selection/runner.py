"""One training per (task, seed, variant, lr) through the time-to-quality harness's job (the trainer's own
TrainingJob, engine inference path for the task metrics), with the candidate selection metrics
(benchmarks/selection/metrics.py, two draws) and the trainer's own held-out metrics at every point.
Appends one JSON line per training to --out (issue 33's: benchmarks/results/selection/recipes.jsonl).

  python -m benchmarks.selection.runner --tasks b1 --seeds 100 --variants default \
      "s6=time_distribution:logit_normal:0.5,1;spread_gain:6" --out benchmarks/results/selection/x.jsonl
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.selection.metrics import Selector
from benchmarks.time_to_quality.run import SEED_OFFSET, commit, evaluation_points, make_job
from benchmarks.time_to_quality.tasks import NFE, TASKS, Target, TaskDef, engine_policy
from benchmarks.time_to_quality.variants import Variant, parse_variant
from emulator.session import EngineTask
from emulator.tasks import fourmode
from trainer.errors import Diverged
from trainer.session.run import encode_networks
from trainer.settings.options import TrainerOptions
from trainer.training.data import TrainingData
from trainer.training.heldout import split_episodes

FOUR = TaskDef(
    "four",
    "four-mode B1",
    fourmode.OBSERVATION_SCHEMA,
    fourmode.ACTION_SCHEMA,
    lambda seed: fourmode.make_demonstrations(seed),
    lambda p, s: fourmode.evaluate_policy(p, s),
    (Target("on_mode", 0.95),),
    budget=10_000,
    eval_every=1_000,
)
FOURPI = TaskDef(
    "fourpi",
    "four-mode B1, theta = pi*o0",
    fourmode.OBSERVATION_SCHEMA,
    fourmode.ACTION_SCHEMA,
    lambda seed: fourmode.make_demonstrations(seed, turn=np.pi),
    lambda p, s: fourmode.evaluate_policy(p, s, turn=np.pi),
    (Target("on_mode", 0.95),),
    budget=10_000,
    eval_every=1_000,
)
ALL = {**TASKS, "four": FOUR, "fourpi": FOURPI}
PILOT = (250, 500, 1000, 1500, 2000)


def heldout_data(task: TaskDef, seed: int, options: TrainerOptions) -> TrainingData:
    demos = task.demonstrations(seed)
    et = EngineTask.from_demonstrations(task.key, task.observation_schema, task.action_schema, demos)
    replay = et.replay_buffer
    split = split_episodes(
        replay.episode_lengths, options.heldout_share, options.heldout_min_episodes, SEED_OFFSET + seed
    )
    assert split.active, "nothing held out"
    return TrainingData.from_replay(replay, task.chunk, split.heldout)


def run_one(
    task: TaskDef, seed: int, variant: Variant, lr: float, eval_seed: int, iterations: int, sel_draws: int = 2
) -> dict[str, Any]:
    torch.set_num_threads(1)
    job, received = make_job(task, seed, variant, lr, iterations)
    held = heldout_data(task, seed, job.options)
    selectors = [Selector(job.model, held, seed, d) for d in range(sel_draws)]
    points = sorted({*evaluation_points(task, iterations), *[p for p in PILOT if p < iterations]})
    evals: list[dict[str, Any]] = []
    done, secs = 0, 0.0
    diverged: str | None = None
    for point in points:
        t0 = time.perf_counter()
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                while done < point:
                    job.step(done)
                    done += 1
        except Diverged as e:
            diverged = str(e)
        secs += time.perf_counter() - t0
        if diverged:
            break
        t1 = time.perf_counter()
        blobs = encode_networks(received, job.export())
        policy = engine_policy(task, blobs, np.random.default_rng([eval_seed, seed, NFE]))
        metrics = task.evaluate(policy, eval_seed)
        t2 = time.perf_counter()
        sel = [s.evaluate(job.model) for s in selectors]
        t3 = time.perf_counter()
        ho = job.heldout.evaluate(job.model, point).record() if job.heldout is not None else None
        if ho:
            ho.pop("w1_raw", None)
        evals.append(
            {
                "it": point,
                "train_s": round(secs, 3),
                "metrics": metrics,
                "sel": sel,
                "heldout": ho,
                "task_eval_s": round(t2 - t1, 3),
                "sel_eval_s": round(t3 - t2, 3),
            }
        )
        shown = " ".join(f"{k}={metrics[k]:.3f}" for k in [t.metric for t in task.targets])
        print(
            f"{task.key} s{seed} {variant.name} lr={lr:g} it {point}: {shown} "
            f"f1avg={sel[0]['f1_avg']:.3f} flu={sel[0]['fl_uniform']:.4f} ({t2 - t1:.1f}s/{t3 - t2:.2f}s)",
            flush=True,
        )
    return {
        "task": task.key,
        "seed": seed,
        "variant": variant.name,
        "settings": variant.settings(),
        "learning_rate": lr,
        "iterations": iterations,
        "network": f"{task.hidden_layer_num}x{task.hidden_layer_size}",
        "eval_seed": eval_seed,
        "heldout_rows": held.row_num,
        "evals": evals,
        "seconds_per_iteration": secs / max(done, 1),
        "diverged": diverged,
        "commit": commit(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", nargs="+", required=True)
    ap.add_argument("--seeds", nargs="+", type=int, required=True)
    ap.add_argument("--variants", nargs="+", default=["default"])
    ap.add_argument("--lr", nargs="+", type=float, default=[1e-3])
    ap.add_argument("--iterations", type=int, default=0)
    ap.add_argument("--eval-seed", type=int, default=None)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    commit()
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for key in a.tasks:
        task = ALL[key]
        for seed in a.seeds:
            es = a.eval_seed if a.eval_seed is not None else (2000 if seed >= 100 else 1000)
            for vt in a.variants:
                v = parse_variant(vt)
                # every run holds out the default share (the selection metric needs the split)
                v = dataclasses.replace(v, options={**v.options, "heldout_share": 0.1})
                for lr in a.lr:
                    while os.path.exists("/tmp/QUIET"):
                        time.sleep(10)
                    row = run_one(task, seed, v, lr, es, a.iterations or task.budget)
                    with out.open("a") as f:
                        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
