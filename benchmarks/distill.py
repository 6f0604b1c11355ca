"""Few-step distillation benchmark: quality at N = 1, 2, 4, 8 Euler steps with and without distillation.

For each task (B1 bimodal, B2 avoid; ``docs/benchmarks.md``) and seed this script trains the networks
the engine would send with the trainer's own :class:`trainer.training.job.TrainingJob` (same code as the
trainer process, stepped in this process so that one flow-matching run can be shared):

* the **plain** model: ``IterationNum`` flow-matching iterations (``ode_steps`` 0);
* one **distilled** model per N: the very same run forked at its phase boundary (the boundary depends on
  N through the cost model of :mod:`trainer.training.steps.distill`) and continued with ``ode_steps = N``. Up to the
  boundary the two runs are the same iterations from the same seed, so each fork is bit for bit what
  ``LA_TRAINER_ODE_STEPS=N`` gives the trainer process;
* optionally the same-network MSE regression baseline (:mod:`benchmarks.mse_baseline`).

Every model is exported (:meth:`TrainingJob.export`, the bytes the engine receives: folded snapshots
read back), and scored through the engine's inference path (:class:`emulator.inference.EnginePolicy`:
encoder → N Euler steps of the denoiser from N(0, I) → decoder, float32 numpy) with fixed evaluation
seeds. Training time is wall-clock of the optimisation iterations only (setup and evaluation excluded).

Usage::

    .venv/bin/python -m benchmarks.distill --tasks bimodal avoid --seeds 0 1 2 --out distill.jsonl
    .venv/bin/python -m benchmarks.distill --table distill.jsonl        # print the tables again
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from benchmarks.mse_baseline import MsePolicy, MseSettings, train_mse_policy
from emulator.inference import EnginePolicy
from emulator.session import EngineTask, SessionSettings, build_session_config
from emulator.tasks import Demonstrations, Policy, avoid, bimodal, task_rng
from protocol.snapshot import Snapshot, read_snapshot
from trainer.session.run import encode_networks
from trainer.settings.options import TrainerOptions
from trainer.training.job import TrainingJob
from trainer.training.steps.distill import DistillSettings, distill_iterations

__all__ = [
    "TASKS",
    "Row",
    "TaskSetup",
    "evaluate",
    "exported_policy",
    "format_tables",
    "main",
    "make_job",
    "run_iterations",
    "run_seed",
]

_POLICY_NOISE_STREAM = 0xD157_0000
"""task_rng stream of the policies' N(0, I) draws (+ N), fixed per evaluation seed."""


@dataclass(frozen=True, slots=True)
class TaskSetup:
    """One task's training and evaluation sizes (``docs/benchmarks.md``)."""

    name: str
    demo_size: int
    """B1: pairs; B2: demonstrations."""
    chunk: int
    execute: int
    iterations: int
    batch_size: int = 256
    learning_rate: float = 1e-3
    hidden_layer_num: int = 2
    """Three hidden layers of 256 ("3×256 MLP", 4 Linear layers), as benchmarks/quality.py."""
    hidden_layer_size: int = 256
    embed: bool = True
    """EmbedNormalizationsInWeights (quality.py's main rows use true)."""

    def evaluate(self, policy: Policy, seed: int) -> dict[str, float]:
        if self.name == "bimodal":
            return bimodal.evaluate_policy(policy, seed)
        return avoid.evaluate_policy(policy, seed, execute=self.execute)


TASKS: Mapping[str, TaskSetup] = {
    # B1: 20 000 pairs, 12k iterations, batch 256 (benchmarks.md B1).
    "bimodal": TaskSetup("bimodal", bimodal.PAIR_NUM, chunk=1, execute=1, iterations=12_000),
    # B2: 200 demonstrations, chunks of 8 executing 4 (the prototype's best FM row), 12k iterations.
    "avoid": TaskSetup("avoid", avoid.DEMO_NUM, chunk=8, execute=4, iterations=12_000),
}


@dataclass(frozen=True, slots=True)
class Row:
    """One evaluated model. ``policy``: "fm" (plain), "fm+distill" (distilled for ``distilled_for``) or
    "mse"; ``ode_steps``: N the policy was run with (None for MSE); ``train_s``: its training wall-clock."""

    task: str
    seed: int
    policy: str
    distilled_for: int | None
    ode_steps: int | None
    iterations: int
    distill_iterations: int
    train_s: float
    metrics: Mapping[str, float]

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, line: str) -> Row:
        return cls(**json.loads(line))


# --------------------------------------------------------------------------------------------------
# Training


def make_job(
    setup: TaskSetup, seed: int, iterations: int, options: TrainerOptions
) -> tuple[TrainingJob, Mapping[int, Snapshot]]:
    """The job the trainer process builds for ``setup`` with training seed ``seed`` (the demonstrations use
    the same seed), on the CPU, and the initial snapshots it was built from: every export goes back in
    their headers (:func:`exported_policy`), as the trainer's sync rounds do."""
    task = EngineTask.benchmark(setup.name, setup.demo_size, seed)
    settings = SessionSettings(
        iteration_num=iterations,
        batch_size=setup.batch_size,
        learning_rate=setup.learning_rate,
        seed=seed,
        hidden_layer_num=setup.hidden_layer_num,
        hidden_layer_size=setup.hidden_layer_size,
        action_chunk_size=setup.chunk,
        embed_normalizations_in_weights=setup.embed,
        device="CPU",
    )
    config, snapshots = build_session_config(task, settings, None)
    received = {nid: read_snapshot(blob) for nid, blob in enumerate(snapshots)}
    job = TrainingJob.create(
        config, received, task.replay_buffer, options=options, device=torch.device("cpu")
    )
    return job, received


def exported_policy(job: TrainingJob, received: Mapping[int, Snapshot], ode_steps: int) -> EnginePolicy:
    """The job's networks as the engine receives them (snapshot bytes in, snapshot bytes out): encoded
    as the trainer's sync rounds encode them."""
    blobs = encode_networks(received, job.export())
    return EnginePolicy.from_snapshots(blobs[1], blobs[0], blobs[2], ode_steps)


def evaluate(
    setup: TaskSetup, job: TrainingJob, received: Mapping[int, Snapshot], ode_steps: int, seed: int
) -> dict[str, float]:
    """Task metrics through the engine path, plus ``decision_ms`` (:func:`decision_ms`); ``received``: the
    snapshots :func:`make_job` returned with the job."""
    policy = exported_policy(job, received, ode_steps)
    metrics = setup.evaluate(policy.bind(task_rng(seed, _POLICY_NOISE_STREAM + ode_steps)), seed)
    metrics["decision_ms"] = decision_ms(policy)
    return metrics


TIMING_AGENTS = 200
"""Agents per timed policy call (B2's batch)."""
TIMING_REPEATS = 21


def decision_ms(policy: EnginePolicy, agents: int = TIMING_AGENTS, repeats: int = TIMING_REPEATS) -> float:
    """Median wall-clock (ms) of one engine-path policy call for ``agents`` agents: the in-game cost of a
    decision, N denoiser evaluations plus encoder and decoder. The median of ``repeats`` calls resists
    other processes' load better than one timed evaluation."""
    rng = np.random.default_rng(0)
    obs = rng.uniform(-1, 1, (agents, policy.obs_dim)).astype(np.float32)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        policy.act(obs, rng)
        times.append(time.perf_counter() - started)
    return 1000.0 * float(np.median(times))


def run_iterations(job: TrainingJob, start: int, stop: int) -> float:
    """Step ``job`` through iterations ``start`` .. ``stop`` − 1; returns the wall-clock seconds."""
    started = time.perf_counter()
    for iteration in range(start, stop):
        job.step(iteration)
    return time.perf_counter() - started


def boundary(total: int, fraction: float, ode_steps: int) -> int:
    """First distillation iteration of a run distilling for ``ode_steps`` (as :meth:`TrainingJob.create`)."""
    return total - distill_iterations(total, fraction, DistillSettings(ode_steps).cost)


def run_seed(
    setup: TaskSetup,
    seed: int,
    steps: Sequence[int],
    *,
    iterations: int,
    fraction: float,
    eval_steps: Sequence[int],
    cross_steps: Sequence[int],
    mse: bool,
    emit: Callable[[Row], None],
) -> None:
    """Train the plain model once, fork a distilled model at each N's boundary, evaluate, ``emit(row)``.

    The plain model is scored at ``steps`` and ``eval_steps``; each distilled model at its own N and at
    ``cross_steps`` (what happens if the game's ODEStepsNum differs from the one distilled for)."""
    # Every demonstration trains, as in the rows before the held-out share became a default: the
    # benchmark scores on the task's own evaluation set, and its rows stay comparable across commits.
    options = TrainerOptions(distill_fraction=fraction, heldout_share=0.0)
    job, received = make_job(setup, seed, iterations, options)
    forks = sorted({(boundary(iterations, fraction, n), n) for n in steps})
    done, fm_s = 0, 0.0
    for start, n in forks:
        # Fork the run at this N's boundary and distil the copy to the end; the plain run goes on below.
        fm_s += run_iterations(job, done, start)
        done = start
        fork = copy.deepcopy(job)
        fork.options = dataclasses.replace(options, ode_steps=n)
        fork.distill_start = start
        train_s = fm_s + run_iterations(fork, start, iterations)
        for n_eval in sorted({n, *cross_steps}):
            metrics = evaluate(setup, fork, received, n_eval, seed)
            emit(
                Row(
                    setup.name,
                    seed,
                    "fm+distill",
                    n,
                    n_eval,
                    iterations,
                    iterations - start,
                    train_s,
                    metrics,
                )
            )
        del fork
    fm_s += run_iterations(job, done, iterations)
    for n_eval in sorted(set(eval_steps) | set(steps)):
        metrics = evaluate(setup, job, received, n_eval, seed)
        emit(Row(setup.name, seed, "fm", None, n_eval, iterations, 0, fm_s, metrics))
    if mse:
        result = train_mse_policy(
            _demonstrations(setup, seed),
            MseSettings(
                iterations=iterations,
                batch_size=setup.batch_size,
                learning_rate=setup.learning_rate,
                hidden_layer_num=setup.hidden_layer_num,
                hidden_layer_size=setup.hidden_layer_size,
                chunk_size=setup.chunk,
                seed=seed,
            ),
        )
        mse_policy = MsePolicy(result.network)
        metrics = setup.evaluate(mse_policy, seed)
        obs = (
            np.random.default_rng(0)
            .uniform(-1, 1, (TIMING_AGENTS, result.network.input_size))
            .astype(np.float32)
        )
        times = []
        for _ in range(TIMING_REPEATS):
            started = time.perf_counter()
            mse_policy(obs)
            times.append(time.perf_counter() - started)
        metrics["decision_ms"] = 1000.0 * float(np.median(times))
        emit(Row(setup.name, seed, "mse", None, None, iterations, 0, result.train_s, metrics))


def _demonstrations(setup: TaskSetup, seed: int) -> Demonstrations:
    """The demonstrations :func:`make_job` trains on (same task, size and seed)."""
    if setup.name == "bimodal":
        return bimodal.make_demonstrations(seed, pair_num=setup.demo_size)
    return avoid.make_demonstrations(seed, demo_num=setup.demo_size)


# --------------------------------------------------------------------------------------------------
# Tables

_COLUMNS: Mapping[str, tuple[str, ...]] = {
    "bimodal": ("on_mode", "both_modes_covered", "balance_err", "mmd"),
    "avoid": ("success", "entropy", "collision"),
}


def _mean_spread(values: Iterable[float]) -> str:
    v = np.array([x for x in values if not math.isnan(x)], dtype=np.float64)
    if v.size == 0:
        return "–"
    if v.size == 1:
        return f"{v[0]:.3f}"
    return f"{v.mean():.3f} ± {v.std(ddof=1):.3f}"


def _label(row: Row) -> str:
    if row.policy == "fm+distill":
        return f"FM distilled for N={row.distilled_for}"
    return {"fm": "FM", "mse": "MSE"}.get(row.policy, row.policy)


def format_tables(rows: Sequence[Row]) -> str:
    """Markdown tables per task: mean ± std over seeds (number of seeds shown), sorted by the N the policy
    runs with: the plain model, the model distilled for that N, and models distilled for another N run
    with this one (off-diagonal). ``extra time``: training wall-clock over the plain run of the same
    seed, minus 1 (both include the shared flow-matching iterations)."""
    out: list[str] = []
    for task in sorted({r.task for r in rows}):
        columns = _COLUMNS.get(task, ())
        plain_s = {r.seed: r.train_s for r in rows if r.task == task and r.policy == "fm"}
        out.append(f"### {task}\n")
        head = [
            "policy",
            "N (game)",
            "seeds",
            *columns,
            f"ms/decision ({TIMING_AGENTS} agents)",
            "distil iterations",
            "train s",
            "extra time",
        ]
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "---|" * len(head))
        groups: dict[tuple[int, int, str], list[Row]] = {}
        for r in rows:
            if r.task != task:
                continue
            off = int(r.policy == "fm+distill" and r.distilled_for != r.ode_steps)
            groups.setdefault((r.ode_steps or 0, off, _label(r)), []).append(r)
        order = {"MSE": 0, "FM": 1}
        for (n, _, label), group in sorted(
            groups.items(), key=lambda kv: (kv[0][0], kv[0][1], order.get(kv[0][2], 2), kv[0][2])
        ):
            extra = [
                r.train_s / plain_s[r.seed] - 1.0
                for r in group
                if r.policy == "fm+distill" and r.seed in plain_s
            ]
            cells = [
                label,
                "–" if n == 0 else str(n),
                str(len(group)),
                *(_mean_spread(r.metrics.get(c, math.nan) for r in group) for c in columns),
                _mean_spread(r.metrics.get("decision_ms", math.nan) for r in group),
                str(group[0].distill_iterations) if group[0].distill_iterations else "–",
                _mean_spread(r.train_s for r in group),
                f"{100 * float(np.mean(extra)):+.0f} %" if extra else "–",
            ]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


# --------------------------------------------------------------------------------------------------
# CLI


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", nargs="+", default=["bimodal", "avoid"], choices=sorted(TASKS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", nargs="+", type=int, default=[1, 2, 4, 8], help="N to distil for")
    parser.add_argument(
        "--eval-steps", nargs="*", type=int, default=[1, 2, 4, 8, 16], help="N for the plain model"
    )
    parser.add_argument(
        "--cross-steps", nargs="*", type=int, default=[8], help="other N for distilled models"
    )
    parser.add_argument("--iterations", type=int, default=0, help="override the task's IterationNum")
    parser.add_argument("--fraction", type=float, default=TrainerOptions().distill_fraction)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-mse", action="store_true")
    parser.add_argument("--out", type=Path, default=None, help="append rows as JSON lines")
    parser.add_argument("--table", type=Path, default=None, help="print the tables of a JSON-lines file")
    parser.add_argument(
        "--decision-cost",
        action="store_true",
        help="only time one engine-path decision (200 agents, median of 101) at each --eval-steps N",
    )
    args = parser.parse_args(argv)

    if args.table is not None:
        saved = [Row.from_json(line) for line in args.table.read_text().splitlines() if line.strip()]
        print(format_tables(saved))
        return 0

    torch.set_num_threads(args.threads)
    if args.decision_cost:
        # The cost does not depend on the weights: any exported network of the task's shapes will do.
        for name in args.tasks:
            job, received = make_job(TASKS[name], 0, 20, TrainerOptions())
            for i in range(20):
                job.step(i)
            costs = {n: decision_ms(exported_policy(job, received, n), repeats=101) for n in args.eval_steps}
            print(
                f"{name}: ms per decision, {TIMING_AGENTS} agents: "
                + ", ".join(f"N={n} {ms:.2f}" for n, ms in costs.items())
            )
        return 0
    rows: list[Row] = []

    def emit(row: Row) -> None:
        rows.append(row)
        print(row.to_json(), file=sys.stderr, flush=True)
        if args.out is not None:
            with args.out.open("a", encoding="utf-8") as f:
                f.write(row.to_json() + "\n")

    for name in args.tasks:
        setup = TASKS[name]
        for seed in args.seeds:
            run_seed(
                setup,
                seed,
                args.steps,
                iterations=args.iterations or setup.iterations,
                fraction=args.fraction,
                eval_steps=args.eval_steps,
                cross_steps=args.cross_steps,
                mse=not args.no_mse,
                emit=emit,
            )
    print(format_tables(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
