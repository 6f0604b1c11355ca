"""Distillation variants from one teacher: what moves few-step quality (docs/distillation.md).

One flow-matching run of ``--iterations`` (the trainer's own :class:`trainer.training.job.TrainingJob`, seeded)
is forked at ``iterations − n`` for each variant's distillation length ``n``; each fork distils for
``--ode-steps`` N to the end with the variant's settings and is scored through the engine's inference
path at N (:func:`benchmarks.distill.evaluate`). Variants:

* ``iters=<n>``: plain distillation for ``n`` iterations (:class:`trainer.training.steps.distill.DistillSettings` defaults);
* ``cosine``: a cosine learning-rate decay to 0 over the phase;
* ``huber=<c>``: the pseudo-Huber loss with constant ``c``;
* ``teacher=<s>``: ``s`` teacher midpoint steps over [0, 1] (default 8).

Combine with commas inside one variant: ``iters=5500,cosine``. One JSON line per variant.

Usage::

    .venv/bin/python -m benchmarks.distill_sweep --task bimodal --ode-steps 1 --iterations 50000 \\
        --variant iters=5500 --variant iters=5500,cosine --variant iters=11000 --out sweep.jsonl
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.distill import TASKS, evaluate, make_job, run_iterations
from trainer.settings.options import TrainerOptions
from trainer.training.job import TrainingJob
from trainer.training.steps.base import Phase
from trainer.training.steps.distill import DistillationStep, Distiller, DistillSettings

__all__ = ["Variant", "main", "parse_variant"]


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    iterations: int
    cosine: bool
    settings: dict[str, Any]


def parse_variant(text: str) -> Variant:
    """``iters=5500,cosine,huber=0.03,teacher=16`` → :class:`Variant` (``iters`` is required)."""
    iterations, cosine, settings = 0, False, {}
    for part in text.split(","):
        key, _, value = part.strip().partition("=")
        if key == "iters":
            iterations = int(value)
        elif key == "cosine" and not value:
            cosine = True
        elif key == "huber":
            settings["huber"] = float(value)
        elif key == "teacher":
            settings["teacher_steps"] = int(value)
        else:
            raise SystemExit(f"variant {text!r}: unknown part {part!r} (iters=, cosine, huber=, teacher=)")
    if iterations < 1:
        raise SystemExit(f"variant {text!r}: needs iters=<n> with n >= 1")
    return Variant(text, iterations, cosine, settings)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--task", choices=sorted(TASKS), default="bimodal")
    parser.add_argument("--ode-steps", type=int, default=1)
    parser.add_argument("--iterations", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variant", action="append", required=True, help="repeatable; see the module doc")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True, help="append one JSON line per variant")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    variants = [parse_variant(v) for v in args.variant]
    total = args.iterations
    if any(v.iterations >= total for v in variants):
        raise SystemExit("every variant must distil for fewer iterations than --iterations")
    setup = TASKS[args.task]
    job, received = make_job(setup, args.seed, total, TrainerOptions())
    forks: dict[int, TrainingJob] = {}
    done = 0
    for start in sorted({total - v.iterations for v in variants}):
        run_iterations(job, done, start)
        done = start
        forks[start] = copy.deepcopy(job)
    training = job.config.trainer.training
    for variant in variants:
        start = total - variant.iterations
        fork = copy.deepcopy(forks[start])
        fork.options = dataclasses.replace(fork.options, ode_steps=args.ode_steps)
        fork.distill_start = start
        # The distillation phase the job would choose at its boundary (trainer.training.steps.choose_step), built
        # here with the variant's settings; the job keeps a step of the current phase.
        distiller = Distiller(
            fork.model,
            DistillSettings(args.ode_steps, **variant.settings),
            learning_rate=training.learning_rate,
            weight_decay=training.weight_decay,
            time_dist=fork.time_distribution,
            obs_noise_scale=training.observation_noise_scale,
        )
        fork.training_step = DistillationStep(distiller, fork.sampler, fork.generator)
        fork.phase = Phase.DISTILLATION
        fork.smoothed_loss = math.nan  # another loss: not smoothed across the boundary (as the job does)
        started = time.perf_counter()
        for iteration in range(start, total):
            if variant.cosine:
                scale = 0.5 * (1.0 + math.cos(math.pi * (iteration - start) / variant.iterations))
                for group in distiller.optimizer.param_groups:
                    group["lr"] = training.learning_rate * scale
            fork.step(iteration)
        row = {
            "task": args.task,
            "seed": args.seed,
            "iterations": total,
            "teacher_iterations": start,
            "variant": variant.name,
            "ode_steps": args.ode_steps,
            "distill_s": time.perf_counter() - started,
            "metrics": evaluate(setup, fork, received, args.ode_steps, args.seed),
        }
        print(json.dumps(row), flush=True)
        with args.out.open("a", encoding="utf-8") as out:
            out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
