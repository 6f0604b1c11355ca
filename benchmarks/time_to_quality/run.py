"""One training of one task, seed and variant, evaluated along the way: one JSON line of raw results.

The job is the trainer's own :class:`trainer.training.job.TrainingJob`, built from the configs and initial networks
the engine would send (:func:`protocol.engine.configs.build_engine_session`: EmbedNormalizationsInWeights
true, CPU, ``Seed = 1234 + seed``, the engine's weight decay) and stepped with :meth:`TrainingJob.step`,
as the trainer process steps it. At each evaluation point the networks it would send are exported,
encoded as snapshots in the received headers (:func:`trainer.session.run.encode_networks`, what a sync round
sends) and scored through the engine's inference path (:func:`~.tasks.engine_policy`). The seconds
counted are those of the iterations only (building the job and evaluating are left out).
"""

from __future__ import annotations

import contextlib
import functools
import io
import math
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.time_to_quality.tasks import NFE, TaskDef, engine_policy, meets
from benchmarks.time_to_quality.variants import Variant
from emulator.session import EngineTask
from protocol.config import FlowMatchingSettings, FlowMatchingTrainingSettings, TrainerConfig
from protocol.engine.configs import build_engine_session
from protocol.snapshot import Snapshot, read_snapshot
from trainer.errors import Diverged
from trainer.session.run import encode_networks
from trainer.settings.options import TrainerOptions
from trainer.training.job import TrainingJob
from trainer.training.steps.autograd import make_optimizer

__all__ = ["SEED_OFFSET", "commit", "evaluation_points", "make_job", "train_and_evaluate"]

SEED_OFFSET = 1234
"""Training seed ``s`` trains with the engine's ``Seed = 1234 + s`` (the engine's default seed at s = 0)."""

_REPO = Path(__file__).resolve().parents[2]


@functools.cache
def commit() -> str:
    """The checkout's commit, with ``+dirty`` when tracked files under trainer/, protocol/, emulator/ or
    benchmarks/ differ from it (the raw results record what produced them). Read once per process, at the
    first call (the CLI makes it before training): the code a process runs is the code it imported, and a
    long run must not stamp its later rows with commits made while it ran."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, cwd=_REPO, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            [
                "git",
                "status",
                "--porcelain",
                "--untracked-files=no",
                "trainer",
                "protocol",
                "emulator",
                "benchmarks",
            ],
            capture_output=True,
            text=True,
            cwd=_REPO,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def make_job(
    task: TaskDef, seed: int, variant: Variant, learning_rate: float, iterations: int
) -> tuple[TrainingJob, Mapping[int, Snapshot]]:
    """The job the trainer process builds for ``task``'s demonstrations of ``seed``, and the snapshots it
    received. ``variant.freeze_encoder``: the encoder's weights are frozen before the first step."""
    demos = task.demonstrations(seed)
    engine_task = EngineTask.from_demonstrations(task.key, task.observation_schema, task.action_schema, demos)
    trainer = TrainerConfig(
        training=FlowMatchingTrainingSettings(
            iteration_num=iterations,
            learning_rate=learning_rate,
            batch_size=task.batch_size,
            seed=SEED_OFFSET + seed,
            save_snapshots=False,
        ),
        embed_normalizations_in_weights=task.embed,
        device="CPU",
    )
    flow_matching = FlowMatchingSettings(
        action_chunk_size=task.chunk,
        hidden_layer_num=task.hidden_layer_num,
        hidden_layer_size=task.hidden_layer_size,
        activation_function="ELU",
    )
    config, snapshots = build_engine_session(
        engine_task.observation_schema,
        engine_task.action_schema,
        engine_task.replay_buffer,
        trainer=trainer,
        flow_matching=flow_matching,
    )
    received = {nid: read_snapshot(blob) for nid, blob in enumerate(snapshots)}
    options = variant.trainer_options(TrainerOptions(status_file=False, checkpoint_every_seconds=0.0))
    with contextlib.redirect_stdout(io.StringIO()):  # the job's log lines are the trainer process's
        job = TrainingJob.create(
            config, received, engine_task.replay_buffer, options=options, device=torch.device("cpu")
        )
    if variant.freeze_encoder:
        job.model.encoder.requires_grad_(False)
        job.optimizer = make_optimizer(job.model, learning_rate, config.trainer.training.weight_decay)
    return job, received


def held_from(task: TaskDef, evals: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The first evaluation from which every later one meets the targets (a target "within N" counts from
    there), or None when the last one does not."""
    held = None
    for evaluation in evals:
        if meets(task.targets, evaluation["metrics"]):
            held = held or evaluation
        else:
            held = None
    return held


def evaluation_points(task: TaskDef, iterations: int, every: int | None = None) -> list[int]:
    """Iterations after which the networks are evaluated: every ``every`` (the task's spacing) and the end."""
    step = every or task.eval_every
    return sorted({*range(step, iterations, step), iterations})


def train_and_evaluate(
    task: TaskDef,
    seed: int,
    variant: Variant,
    *,
    learning_rate: float,
    iterations: int,
    eval_seed: int,
    points: Iterable[int] | None = None,
    stop_at_target: bool = False,
    progress: bool = False,
) -> dict[str, Any]:
    """Train once and evaluate at ``points`` (default :func:`evaluation_points`); the raw result row.

    ``stop_at_target``: end the run at the first point that meets every target (a reference run that
    only needs its iterations-to-target). The policy's start noise comes from
    ``default_rng([eval_seed, seed, NFE])``; the task's evaluation draws from ``eval_seed``."""
    torch.set_num_threads(1)
    job, received = make_job(task, seed, variant, learning_rate, iterations)
    evals: list[dict[str, Any]] = []
    done, seconds, diverged = 0, 0.0, None
    for point in sorted(set(points) if points is not None else evaluation_points(task, iterations)):
        started = time.perf_counter()
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # the step's one-off log lines
                while done < point:
                    job.step(done)
                    done += 1
        except Diverged as error:
            diverged = str(error)
        seconds += time.perf_counter() - started
        if diverged is not None:
            break
        blobs = encode_networks(received, job.export())
        policy = engine_policy(task, blobs, np.random.default_rng([eval_seed, seed, NFE]))
        metrics = task.evaluate(policy, eval_seed)
        recipe = job.recipe.name if job.recipe is not None else "custom"
        evals.append({"it": point, "train_s": round(seconds, 3), "metrics": metrics, "recipe": recipe})
        if progress:
            shown = " ".join(f"{t.metric}={metrics[t.metric]:.3f}" for t in task.targets)
            print(f"  {task.key} s{seed} {variant.name} lr={learning_rate:g} it {point}: {shown}", flush=True)
        if stop_at_target and meets(task.targets, metrics):
            break
    first = next((e for e in evals if meets(task.targets, e["metrics"])), None)
    holds = held_from(task, evals)
    return {
        "task": task.key,
        "seed": seed,
        "variant": variant.name,
        "settings": variant.settings(),
        "learning_rate": learning_rate,
        "iterations": iterations,
        "batch_size": task.batch_size,
        "network": f"{task.hidden_layer_num}x{task.hidden_layer_size} ELU",
        "chunk": f"{task.chunk}/{task.execute}",
        "nfe": NFE,
        "eval_seed": eval_seed,
        "eval_episodes": task.eval_episodes,
        "targets": [str(t) for t in task.targets],
        "evals": evals,
        "target_it": None if first is None else first["it"],
        "target_s": None if first is None else first["train_s"],
        "holds_it": None if holds is None else holds["it"],
        "holds_s": None if holds is None else holds["train_s"],
        "recipe": job.recipe_record(),
        "seconds_per_iteration": seconds / done if done else math.nan,
        "diverged": diverged,
        "commit": commit(),
        "time": datetime.now().isoformat(timespec="seconds"),
        "torch": torch.__version__,
    }
