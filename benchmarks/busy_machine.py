"""Training throughput beside a busy machine (issue 28): the engine spawns the trainer where the editor
runs the game, and the game keeps cores busy.

Each row is one whole engine session over shared memory (the emulated engine spawns the real trainer
with the engine's command line, as in the demo) of one workload, under one thread policy, beside 0, 1 or
2 CPU-bound processes (``python -c 'while True: pass'``, started before the session and killed after).
Training throughput is read from the trainer's own run record: iterations over ``elapsed_s`` of the last
``metrics.jsonl`` point (from the first training iteration; sync rounds and held-out measurements
included, as a user sees it).

Workloads: ``demo`` (the demo's training: B2 "avoid", 200 demonstrations, HiddenLayerNum 2 x 256,
chunk 8, batch 256) and ``b1`` (B1 bimodal, 20,000 pairs, the engine's 1 x 128, batch 256).

Policies, side by side in one run:

* ``before``: what b7e6ee4 did: a fixed count from the denoiser's size (1 below the work threshold,
  else min(cores, 8)) and libgomp's own spin (``GOMP_SPINCOUNT=300000``, its default without
  ``OMP_WAIT_POLICY``);
* ``after``: today's default (nothing set: the measured count of :mod:`trainer.training.threads` and the spin of
  :mod:`trainer.system.openmp`);
* ``after-spin-default``: the measured count with libgomp's default spin, to show what the spin alone
  is worth.

Run (appends one JSON line per session to ``--out``, then prints and writes the table)::

    python -m benchmarks.busy_machine run --out benchmarks/results/busy-machine.jsonl
    python -m benchmarks.busy_machine table benchmarks/results/busy-machine.jsonl

Targets (issue 28): beside one busy process >= 0.7x the idle throughput, idle within 5 % of ``before``.
The machine's other load shifts every number: compare rows of one run, and run nothing else meanwhile.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from benchmarks.time_to_quality.run import commit
from emulator.session import EngineTask, SessionSettings, run_engine_session
from trainer.records.runrecord import find_run_folders, read_metrics
from trainer.training.threads import THREADS_WORK_THRESHOLD

__all__ = ["POLICIES", "WORKLOADS", "main", "table"]

LIBGOMP_DEFAULT_SPIN = "300000"
"""libgomp's spin count when neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT is set (its env.c)."""


@dataclass(frozen=True)
class Workload:
    task: str
    size: int
    hidden_layer_num: int
    hidden_layer_size: int
    chunk: int
    iterations: int

    def make(self) -> tuple[EngineTask, SessionSettings]:
        task = EngineTask.benchmark(self.task, size=self.size, seed=0)
        settings = SessionSettings(
            iteration_num=self.iterations,
            batch_size=256,
            learning_rate=1e-3,
            seed=0,
            save_snapshots=False,
            embed_normalizations_in_weights=True,
            hidden_layer_num=self.hidden_layer_num,
            hidden_layer_size=self.hidden_layer_size,
            action_chunk_size=self.chunk,
            sync_every_iterations=500,
            timeout_scale=1.0,
            session_timeout_s=1800.0,
            hard_timeout_s=1900.0,
            exit_timeout_s=120.0,
        )
        return task, settings

    def old_threads(self, obs_dim: int, act_dim: int) -> int:
        """b7e6ee4's choose_threads: batch x denoiser parameters against the work threshold (the
        denoiser's input width approximated by observation + chunked action + time; both workloads lie
        far from the threshold: demo about 2.3x above, b1 about 4x below)."""
        widths = [obs_dim + act_dim * self.chunk + 1]
        widths += [self.hidden_layer_size] * (self.hidden_layer_num + 1) + [act_dim * self.chunk]
        params = sum(a * b + b for a, b in itertools.pairwise(widths))
        return 1 if 256 * params < THREADS_WORK_THRESHOLD else min(os.cpu_count() or 1, 8)


WORKLOADS: dict[str, Workload] = {
    "demo": Workload("avoid", 200, 2, 256, 8, 2000),
    "b1": Workload("bimodal", 20_000, 1, 128, 1, 3000),
}

POLICIES = ("before", "after", "after-spin-default")
CONDITIONS = {"idle": 0, "busy1": 1, "busy2": 2}


@contextmanager
def busy(processes: int) -> Iterator[None]:
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        time.sleep(0.5 if hogs else 0.0)
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def policy_env(policy: str, workload: Workload, task: EngineTask) -> dict[str, str]:
    if policy == "before":
        obs = int(task.replay_buffer.observations[0].shape[1])
        act = int(task.replay_buffer.actions[0].shape[1])
        return {
            "LA_TRAINER_THREADS": str(workload.old_threads(obs, act)),
            "GOMP_SPINCOUNT": LIBGOMP_DEFAULT_SPIN,
        }
    if policy == "after-spin-default":
        return {"GOMP_SPINCOUNT": LIBGOMP_DEFAULT_SPIN}
    return {}


@dataclass
class Row:
    workload: str
    policy: str
    condition: str
    repeat: int
    env: dict[str, str]
    iterations: int = 0
    train_s: float = 0.0
    it_per_s: float = 0.0
    session_s: float = 0.0
    threads: dict[str, Any] = field(default_factory=dict)
    failure: str | None = None


def one_session(name: str, policy: str, condition: str, repeat: int) -> Row:
    workload = WORKLOADS[name]
    task, settings = workload.make()
    env = policy_env(policy, workload, task)
    # Our own variables from the caller's shell must not leak into a row (the "after" rows are the default).
    clean = {
        k: v for k, v in os.environ.items() if not k.startswith(("LA_TRAINER_", "GOMP_", "OMP_", "KMP_"))
    }
    row = Row(name, policy, condition, repeat, env)
    with tempfile.TemporaryDirectory(prefix="la-busy-") as work, busy(CONDITIONS[condition]):
        os.environ.clear()
        os.environ.update(clean)  # the spawned trainer inherits this environment, plus settings.env
        started = time.perf_counter()
        record = run_engine_session("shm", task, work, _with_env(settings, env))
        row.session_s = time.perf_counter() - started
        if record.failure is not None:
            row.failure = record.failure[-2000:]
            return row
        assert record.task_dir is not None
        (run,) = find_run_folders(record.task_dir)
        points = [p for p in read_metrics(run) if "loss" in p]
        last = points[-1]
        row.iterations, row.train_s = int(last["iteration"]), float(last["elapsed_s"])
        row.it_per_s = row.iterations / row.train_s if row.train_s > 0 else 0.0
        row.threads = json.loads((run / "run.json").read_text(encoding="utf-8")).get("threads", {})
    return row


def _with_env(settings: SessionSettings, env: Mapping[str, str]) -> SessionSettings:
    return replace(settings, env={**settings.env, **env})


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    saved = dict(os.environ)
    head = commit()
    try:
        for repeat in range(args.repeats):
            for name in args.workloads:
                for condition in args.conditions:
                    # Policies interleaved within each (workload, condition): a load change of the machine
                    # hits all of them alike.
                    order = POLICIES[repeat % len(POLICIES) :] + POLICIES[: repeat % len(POLICIES)]
                    for policy in order:
                        row = one_session(name, policy, condition, repeat)
                        os.environ.clear()
                        os.environ.update(saved)
                        line = {
                            **row.__dict__,
                            "commit": head,
                            "cores": os.cpu_count(),
                            "machine": platform.processor() or platform.machine(),
                            "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
                        }
                        with out.open("a", encoding="utf-8") as handle:
                            handle.write(json.dumps(line) + "\n")
                        chosen = row.threads.get("threads", row.env.get("LA_TRAINER_THREADS", "?"))
                        print(
                            f"{name:5} {condition:6} {policy:19} {row.it_per_s:8.1f} it/s  "
                            f"threads {chosen}  session {row.session_s:6.1f} s"
                            + (f"  FAILED {row.failure[-300:]}" if row.failure else ""),
                            flush=True,
                        )
    finally:
        os.environ.clear()
        os.environ.update(saved)
    print(table(load(out)))
    if args.table:
        Path(args.table).write_text(table(load(out)) + "\n", encoding="utf-8")
    return 0


def load(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Median it/s per (commit, workload, policy, condition); ratios to idle and to ``before`` idle."""
    lines = []
    for head in dict.fromkeys(r["commit"] for r in rows):
        mine = [r for r in rows if r["commit"] == head and not r.get("failure")]
        cores = mine[0]["cores"] if mine else "?"
        lines += [
            f"commit {head}, {cores} cores; median training it/s over the repeats (sessions in brackets)",
            "",
            "| workload | policy | idle | busy 1 | busy 2 | busy 1 / idle | busy 2 / idle | idle / before idle |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for name in dict.fromkeys(r["workload"] for r in mine):
            rates: dict[tuple[str, str], float] = {}
            counts: dict[tuple[str, str], int] = {}
            for policy in POLICIES:
                for condition in CONDITIONS:
                    values = [
                        r["it_per_s"]
                        for r in mine
                        if (r["workload"], r["policy"], r["condition"]) == (name, policy, condition)
                    ]
                    if values:
                        rates[policy, condition] = _median(values)
                        counts[policy, condition] = len(values)
            base = rates.get(("before", "idle"))
            for policy in POLICIES:
                if (policy, "idle") in rates:
                    lines.append(_table_line(name, policy, rates, counts, base))
        lines.append("")
    return "\n".join(lines)


def _table_line(
    name: str,
    policy: str,
    rates: Mapping[tuple[str, str], float],
    counts: Mapping[tuple[str, str], int],
    base: float | None,
) -> str:
    idle = rates[policy, "idle"]

    def cell(condition: str) -> str:
        key = (policy, condition)
        return f"{rates[key]:,.0f} ({counts[key]})" if key in rates else "-"

    def ratio(condition: str) -> str:
        key = (policy, condition)
        return f"{rates[key] / idle:.2f}" if key in rates else "-"

    versus = f"{idle / base:.2f}" if base else "-"
    return (
        f"| {name} | {policy} | {cell('idle')} | {cell('busy1')} | {cell('busy2')} | "
        f"{ratio('busy1')} | {ratio('busy2')} | {versus} |"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.busy_machine", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="play the sessions and append one JSON line each")
    r.add_argument("--out", default="benchmarks/results/busy-machine.jsonl")
    r.add_argument("--table", default="benchmarks/results/busy-machine.md")
    r.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    r.add_argument("--conditions", nargs="+", default=list(CONDITIONS), choices=list(CONDITIONS))
    r.add_argument("--repeats", type=int, default=2)
    t = sub.add_parser("table", help="the table from raw rows")
    t.add_argument("rows")
    args = parser.parse_args(argv)
    if args.command == "run":
        return run(args)
    print(table(load(Path(args.rows))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
