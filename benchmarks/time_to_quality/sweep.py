"""Issue 23's measurement in one command: tune on the tuning seeds, pick by a rule fixed in advance, report.

``python -m benchmarks.time_to_quality sweep --out DIR --workers 15 --deadline 520`` runs many trainings
at once, one ``python -m benchmarks.time_to_quality run`` process per (task, variant, learning rate, seed,
evaluation seed), each on one CPU thread, longest first, and appends every finished row to ``DIR``:

* ``tune.jsonl``: :data:`CANDIDATES` on B1, B2 and B3, tuning seeds 100/101, evaluation seed 2000;
* ``report.jsonl``: the report seeds 0/1/2 (evaluation seed 1000, and 1001/1002 for the rows whose
  iteration ratios are stated): the default and the engine loop at LearningRate 1e-3 and 1e-4 on B1, B2
  and B3, B4 with its flat twin, the demo, and the tuning winner on every task;
* ``ceiling.jsonl``: B2's ideal-sampler ceiling (:mod:`~.ceiling`) on the tuning and the report seeds;
* ``sweep.log``: what started and ended when, and the winner with the numbers it was chosen by.

The winner is chosen from the tuning rows only, by :func:`choose`, as soon as they are all in; the report
seeds' rows of the candidates other than the winner are never run. Runs still going at ``--deadline``
seconds are ended (their rows are missing, which the log says).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CANDIDATES", "Job", "choose", "main_sweep", "plan_report", "plan_tuning", "plan_winner"]

TUNE_SEEDS = (100, 101)
REPORT_SEEDS = (0, 1, 2)
TUNE_EVAL = 2000
REPORT_EVALS = (1000, 1001, 1002)
"""Evaluation draws of the rows whose iteration ratios are stated (the first is the reported one)."""

CANDIDATES: Mapping[str, str] = {
    "default": "default",
    "d8": "d8=ode_steps:8",
    "d8f40": "d8f40=ode_steps:8;distill_fraction:0.4",
    "sp2": "sp2=spread_gain:2",
    "sp2-lnm05": "sp2-lnm05=spread_gain:2;time_distribution:logit_normal:-0.5,1",
    "sp2-lnm05-d8": "sp2-lnm05-d8=spread_gain:2;time_distribution:logit_normal:-0.5,1;ode_steps:8",
    "sp2-ln05-d8": "sp2-ln05-d8=spread_gain:2;time_distribution:logit_normal:0.5,1;ode_steps:8",
    "sp2-lnm025-d8": "sp2-lnm025-d8=spread_gain:2;time_distribution:logit_normal:-0.25,1;ode_steps:8",
    "ln05-d8": "ln05-d8=time_distribution:logit_normal:0.5,1;ode_steps:8",
}
"""The methods tried (issue 23, methods 1 and 2), as variant specs (:func:`~.variants.parse_variant`):
distillation for the game's 8 Euler steps (a quarter and 0.4 of the run's time), the late-time source
spread at gain 2 with the default and a noise-leaning density, and the two together."""

_COST = {"b1": 1, "b2": 6, "b3": 2, "b4": 8, "b4flat": 2, "demo": 8}
"""Rough relative run time per task at its budget (scheduling order only: longest first)."""


@dataclass(frozen=True, slots=True)
class Job:
    """One ``run`` process: one task, variant, learning rate, seed and evaluation seed."""

    phase: str
    task: str
    variant: str
    lr: float
    seed: int
    eval_seed: int
    reference_factor: int = 1

    @property
    def name(self) -> str:
        return f"{self.phase}-{self.task}-{self.variant.partition('=')[0]}-{self.lr:g}-s{self.seed}-e{self.eval_seed}"

    @property
    def cost(self) -> float:
        factor = self.reference_factor if self.variant == "engine-loop" else 1
        return _COST.get(self.task, 1) * factor * (1.5 if "ode_steps" in self.variant else 1.0)

    def argv(self, out: Path) -> list[str]:
        return [
            sys.executable,
            "-m",
            "benchmarks.time_to_quality",
            "run",
            "--tasks",
            self.task,
            "--seeds",
            str(self.seed),
            "--variants",
            self.variant,
            "--lr",
            f"{self.lr:g}",
            "--eval-seed",
            str(self.eval_seed),
            "--reference-factor",
            str(self.reference_factor),
            "--out",
            str(out),
        ]


def plan_tuning(candidates: Mapping[str, str] = CANDIDATES) -> list[Job]:
    """Every candidate on B1, B2, B3 at lr 1e-3, tuning seeds."""
    return [
        Job("tune", task, spec, 1e-3, seed, TUNE_EVAL)
        for spec in candidates.values()
        for task in ("b1", "b2", "b3")
        for seed in TUNE_SEEDS
    ]


def plan_report() -> list[Job]:
    """The report rows that do not depend on the winner: the default and the engine loop at lr 1e-3 (B1 and
    B3 over three evaluation draws, the ratios' rows) and 1e-4 (one draw), B2 at both rates, B4 with its
    flat twin, the demo."""
    jobs: list[Job] = []
    for seed in REPORT_SEEDS:
        for task in ("b1", "b3"):
            for eval_seed in REPORT_EVALS:
                jobs += [
                    Job("report", task, "default", 1e-3, seed, eval_seed),
                    Job("report", task, "engine-loop", 1e-3, seed, eval_seed, reference_factor=4),
                ]
            jobs += [
                Job("report", task, "default", 1e-4, seed, REPORT_EVALS[0]),
                Job("report", task, "engine-loop", 1e-4, seed, REPORT_EVALS[0], reference_factor=2),
            ]
        jobs += [
            Job("report", "b2", "default", 1e-3, seed, REPORT_EVALS[0]),
            Job("report", "b2", "engine-loop", 1e-3, seed, REPORT_EVALS[0]),
            Job("report", "b2", "default", 1e-4, seed, REPORT_EVALS[0]),
            Job("report", "b2", "engine-loop", 1e-4, seed, REPORT_EVALS[0]),
            Job("report", "b4", "default", 1e-3, seed, REPORT_EVALS[0]),
            Job("report", "b4flat", "default", 1e-3, seed, REPORT_EVALS[0]),
            Job("report", "demo", "default", 1e-3, seed, REPORT_EVALS[0]),
        ]
    return jobs


def plan_winner(spec: str) -> list[Job]:
    """The winner on every task, report seeds, evaluation seed 1000."""
    return [
        Job("report", task, spec, 1e-3, seed, REPORT_EVALS[0])
        for seed in REPORT_SEEDS
        for task in ("b1", "b2", "b3", "b4", "b4flat", "demo")
    ]


def _lowest(rows: Sequence[Mapping[str, Any]], task: str, variant: str, metric: str) -> float:
    values = [
        r["evals"][-1]["metrics"][metric] for r in rows if r["task"] == task and r["variant"] == variant
    ]
    return min(values) if len(values) == len(TUNE_SEEDS) else float("nan")


def _b3_within(rows: Sequence[Mapping[str, Any]], variant: str, iterations: int) -> bool:
    mine = [r for r in rows if r["task"] == "b3" and r["variant"] == variant]
    return len(mine) == len(TUNE_SEEDS) and all(
        r["target_it"] is not None and r["target_it"] <= iterations for r in mine
    )


def choose(
    rows: Sequence[Mapping[str, Any]], candidates: Mapping[str, str] = CANDIDATES
) -> tuple[str, list[str]]:
    """The winner's variant spec from the tuning rows, and the lines that explain it.

    The rule, fixed before any row existed: a candidate is eligible when, lowest of the tuning seeds at
    the budget, its B1 on-mode is at least the default's, its B2 success and route entropy are at most
    0.02 below the default's, and B3 reaches 0.98 within 2,000 iterations on both seeds. Among the
    eligible (the default always is), the most of the five targets met (B1 on-mode 0.95, both modes
    0.99, B2 success 0.95, entropy 0.88, B3) wins; ties go to the larger sum of the margins
    on-mode − 0.95, success − 0.95 and entropy − 0.88."""
    lines: list[str] = []
    base = {
        m: _lowest(rows, t, "default", m)
        for t, m in (("b1", "on_mode"), ("b2", "success"), ("b2", "entropy"))
    }
    best: tuple[int, float, str] | None = None
    winner = "default"
    for name, spec in candidates.items():
        on = _lowest(rows, "b1", name, "on_mode")
        both = _lowest(rows, "b1", name, "both_modes_covered")
        success = _lowest(rows, "b2", name, "success")
        entropy = _lowest(rows, "b2", name, "entropy")
        b3 = _b3_within(rows, name, 2000)
        eligible = name == "default" or (
            on >= base["on_mode"]
            and success >= base["success"] - 0.02
            and entropy >= base["entropy"] - 0.02
            and b3
        )
        met = sum([on >= 0.95, both >= 0.99, success >= 0.95, entropy >= 0.88, b3])
        margin = (on - 0.95) + (success - 0.95) + (entropy - 0.88)
        lines.append(
            f"candidate {name}: b1 on_mode {on:.3f} both {both:.3f}, b2 success {success:.3f} entropy {entropy:.3f}, "
            f"b3 within 2000 {b3}; eligible {eligible}, targets met {met}, margin {margin:+.3f}"
        )
        if eligible and margin == margin and (best is None or (met, margin) > best[:2]):
            best, winner = (met, margin, name), spec
    lines.append(f"winner: {winner}")
    return winner, lines


def _ceiling_jobs(parts: Path) -> list[tuple[list[str], Path]]:
    """The ceiling on the report seeds (evaluation seed 1000) and the tuning seeds (2000)."""
    out: list[tuple[list[str], Path]] = []
    for name, seeds, eval_seed in (
        ("report", REPORT_SEEDS, REPORT_EVALS[0]),
        ("tune", TUNE_SEEDS, TUNE_EVAL),
    ):
        path = parts / f"ceiling-{name}.jsonl"
        argv = [sys.executable, "-m", "benchmarks.time_to_quality", "ceiling", "--seeds", *map(str, seeds)]
        out.append(([*argv, "--eval-seed", str(eval_seed), "--out", str(path)], path))
    return out


def main_sweep(
    out_dir: Path,
    workers: int,
    deadline_s: float,
    commit: str,
    tasks: Sequence[str] | None,
    smoke_iterations: int = 0,
    candidates: Mapping[str, str] = CANDIDATES,
    baselines: bool = True,
) -> int:
    """Run the plan (module docstring); ``smoke_iterations`` > 0 runs every job that short (a check of the
    driver, not a measurement) and ``tasks`` keeps only those tasks' jobs. ``candidates``: the variants
    tuned (``default`` among them); ``baselines`` False: no winner-independent report rows and no ceiling
    (a second round, whose baselines the first one measured)."""
    started = time.monotonic()
    out_dir.mkdir(parents=True, exist_ok=True)
    parts = Path(os.environ.get("TMPDIR", "/tmp")) / f"ttq-sweep-{os.getpid()}"
    parts.mkdir(parents=True, exist_ok=True)
    log_file = (out_dir / "sweep.log").open("a", encoding="utf-8")

    def say(text: str) -> None:
        line = f"[{time.monotonic() - started:6.1f}s] {text}"
        print(line, flush=True)
        log_file.write(line + "\n")
        log_file.flush()

    def keep(jobs: list[Job]) -> list[Job]:
        return [j for j in jobs if tasks is None or j.task in tasks]

    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    pending = sorted(keep(plan_tuning(candidates)), key=lambda j: -j.cost)
    if baselines:
        pending += sorted(keep(plan_report()), key=lambda j: -j.cost)
    tuning_left = {j.name for j in pending if j.phase == "tune"}
    running: dict[str, tuple[Job | None, subprocess.Popen[bytes], Path]] = {}
    if baselines:
        for i, (argv, path) in enumerate(_ceiling_jobs(parts)):
            running[f"ceiling{i}"] = (None, subprocess.Popen(argv, env=env), path)
    tune_rows: list[dict[str, Any]] = []
    chosen = False

    def extra(job: Job) -> list[str]:
        return ["--iterations", str(smoke_iterations)] if smoke_iterations else []

    while pending or running:
        if time.monotonic() - started > deadline_s:
            for name, (_, proc, _) in running.items():
                proc.kill()
                say(f"deadline: ended {name} (no row)")
            for job in pending:
                say(f"deadline: never started {job.name}")
            break
        while pending and len(running) < workers:
            job = pending.pop(0)
            path = parts / f"{job.name}.jsonl"
            with (parts / f"{job.name}.err").open("wb") as err:
                proc = subprocess.Popen(
                    job.argv(path) + extra(job), env=env, stdout=subprocess.DEVNULL, stderr=err
                )
            running[job.name] = (job, proc, path)
        time.sleep(0.5)
        for name in [n for n, (_, p, _) in running.items() if p.poll() is not None]:
            done_job, proc, path = running.pop(name)
            rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
            for row in rows:
                if row.get("commit") in (None, "unknown"):
                    row["commit"] = commit
            target = "ceiling.jsonl" if done_job is None else f"{done_job.phase}.jsonl"
            with (out_dir / target).open("a", encoding="utf-8") as f:
                f.writelines(json.dumps(row) + "\n" for row in rows)
            say(f"done {name}: rc {proc.returncode}, {len(rows)} row(s)")
            errors = parts / f"{name}.err"
            if proc.returncode and errors.exists():
                say("  " + " | ".join(errors.read_text(errors="replace").strip().splitlines()[-3:]))
            if done_job is not None and done_job.phase == "tune":
                tune_rows += rows
                tuning_left.discard(name)
        if not chosen and not tuning_left:
            chosen = True
            winner, lines = choose(tune_rows, candidates)
            for line in lines:
                say(line)
            if winner != "default":
                pending = sorted(keep(plan_winner(winner)), key=lambda j: -j.cost) + pending
    say("sweep finished")
    return 0
