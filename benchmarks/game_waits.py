"""Training speed while the game is slow to take networks or paused, against a game that keeps up.

Issue 32 item 2: the trainer must not wait for the game. Each session is a real engine-spawned
shared-memory session (the game-side emulator plays the engine, ``emulator/session``) at the engine's
default network (1 hidden layer of 128, batch 256), syncing every ``--sync-every`` iterations, in one of
three game conditions:

* ``fast``: the game takes each round at its next tick (5 ms ticks);
* ``late``: the game takes each network ``--late`` seconds late (``SessionSettings.take_late_s``: a
  slow frame between its receives), so a trainer that sent its rounds itself would wait about three
  times that per round;
* ``paused``: after round 2 the game stops ticking for ``--pause`` seconds (``pause_after_round``:
  an editor at a breakpoint or in a level load, spec §11 item 6).

The rate is the trainer's own: iterations over seconds between its first and last metrics points
(``metrics.jsonl`` of its run record; a point every 100 iterations), so start-up and the last round are
out. ``--before DIR`` also runs the trainer of another checkout (``DIR/scripts/train.py``, for instance
the commit before issue 32 unpacked with ``git archive``) against the same game, interleaved.

    python -m benchmarks.game_waits --out benchmarks/results/game-waits.jsonl \\
        --before /tmp/la-trainer-before

Each row of ``--out`` is one session (raw); the summary printed (and written next to it as ``.md``) is
the median per (trainer, condition) and its ratio to the same trainer's ``fast`` median.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from emulator.launch import TRAIN_SCRIPT
from emulator.session import EngineTask, SessionSettings, run_engine_session
from trainer.records.runrecord import find_run_folders, read_metrics

__all__ = ["CONDITIONS", "main", "run_session"]

CONDITIONS = ("fast", "late", "paused")


def _settings(condition: str, args: argparse.Namespace, script: Path) -> SessionSettings:
    extra: dict[str, Any] = {}
    if condition == "late":
        extra["take_late_s"] = args.late
    elif condition == "paused":
        extra["pause_after_round"] = (2, args.pause)
    bound = args.iterations / 200 + args.pause + 120  # generous: a slow machine must not cut a session
    return SessionSettings(
        iteration_num=args.iterations,
        batch_size=256,
        hidden_layer_num=1,
        hidden_layer_size=128,
        learning_rate=1e-3,
        save_snapshots=False,
        sync_every_iterations=args.sync_every,
        timeout_scale=1.0,
        session_timeout_s=bound,
        hard_timeout_s=bound + 30,
        exit_timeout_s=60.0,
        env={"LA_TRAINER_THREADS": str(args.threads), "LA_TRAINER_HELDOUT_SHARE": "0"},
        script=script,
        **extra,
    )


def run_session(condition: str, trainer: str, script: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One session; its raw row."""
    task = EngineTask.benchmark("bimodal", size=200, seed=0)  # flat schemas: the fused step
    with tempfile.TemporaryDirectory() as work:
        started = time.monotonic()
        record = run_engine_session("shm", task, work, _settings(condition, args, script))
        wall = time.monotonic() - started
        row: dict[str, Any] = {
            "trainer": trainer,
            "condition": condition,
            "iterations": args.iterations,
            "sync_every": args.sync_every,
            "take_late_s": args.late if condition == "late" else 0.0,
            "pause_s": args.pause if condition == "paused" else 0.0,
            "threads": args.threads,
            "exit_code": record.exit_code,
            "failure": record.failure,
            "rounds_taken": len(record.rounds),
            "session_wall_s": round(wall, 3),
        }
        if record.task_dir is not None:
            folders = find_run_folders(record.task_dir)
            points = [p for p in read_metrics(folders[0]) if "loss" in p] if folders else []
            if len(points) >= 2:
                first, last = points[0], points[-1]
                seconds = last["elapsed_s"] - first["elapsed_s"]
                row["measured_iterations"] = last["iteration"] - first["iteration"]
                row["measured_s"] = round(seconds, 4)
                row["it_per_s"] = round(row["measured_iterations"] / seconds, 2) if seconds > 0 else None
        return row


def _summary(rows: list[dict[str, Any]]) -> str:
    """Per (trainer, condition): the median rate, and the median over repeats of the ratio to the same
    trainer's fast-game session of that repeat (sessions a few minutes apart: a shared machine's load
    drifts less between them than over the whole run)."""
    lines = [
        "| trainer | game | sessions | it/s (median) | vs fast game (median of per-repeat ratios) | per-repeat ratios | rounds the game took |",
        "|---|---|---|---|---|---|---|",
    ]
    rate = {(r["trainer"], r["condition"], r["repeat"]): r["it_per_s"] for r in rows if r.get("it_per_s")}
    keys = sorted({(r["trainer"], r["condition"]) for r in rows})
    for trainer, condition in keys:
        mine = [r for r in rows if (r["trainer"], r["condition"]) == (trainer, condition)]
        rates = [r["it_per_s"] for r in mine if r.get("it_per_s")]
        ratios = [
            rate[(trainer, condition, r["repeat"])] / rate[(trainer, "fast", r["repeat"])]
            for r in mine
            if (trainer, condition, r["repeat"]) in rate and (trainer, "fast", r["repeat"]) in rate
        ]
        ratio = f"{statistics.median(ratios):.2f}x" if ratios else "-"
        lines.append(
            f"| {trainer} | {condition} | {len(mine)} | {statistics.median(rates):,.0f} | {ratio} | "
            f"{', '.join(f'{x:.2f}' for x in ratios)} | {', '.join(str(r['rounds_taken']) for r in mine)} |"
        )
    return "\n".join(lines)


def _commit(root: Path) -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--iterations", type=int, default=20_000)
    parser.add_argument("--sync-every", type=int, default=50, help="iterations between sync rounds")
    parser.add_argument(
        "--late", type=float, default=0.05, help="seconds the late game takes each network late"
    )
    parser.add_argument("--pause", type=float, default=10.0, help="seconds the paused game stops ticking")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="the trainer's CPU threads (pinned)")
    parser.add_argument("--conditions", default=",".join(CONDITIONS))
    parser.add_argument("--before", type=Path, help="another checkout whose trainer runs too ('before')")
    parser.add_argument("--out", type=Path, required=True, help="raw rows (JSON lines); a .md summary beside")
    args = parser.parse_args(argv)
    trainers = [("after", TRAIN_SCRIPT)]
    if args.before is not None:
        trainers.append(("before", args.before / "scripts" / "train.py"))
    conditions = [c for c in args.conditions.split(",") if c]
    rows: list[dict[str, Any]] = []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as out:
        for repeat in range(args.repeats):
            # Rotated each repeat: a machine whose load drifts during the run biases no condition.
            shift = repeat % len(conditions)
            for condition in conditions[shift:] + conditions[:shift]:
                for trainer, script in trainers if repeat % 2 == 0 else trainers[::-1]:
                    row = run_session(condition, trainer, script, args) | {"repeat": repeat}
                    rows.append(row)
                    out.write(json.dumps(row) + "\n")
                    out.flush()
                    print(
                        f"{trainer:6s} {condition:6s} repeat {repeat}: {row.get('it_per_s')} it/s, "
                        f"{row['rounds_taken']} rounds, exit {row['exit_code']}"
                        + (f", failure: {row['failure']}" if row["failure"] else ""),
                        flush=True,
                    )
    here = Path(__file__).resolve().parents[1]
    header = (
        f"# Training speed with a late or paused game\n\n`python -m benchmarks.game_waits "
        f"--iterations {args.iterations} --sync-every {args.sync_every} --late {args.late} --pause {args.pause} "
        f"--repeats {args.repeats} --threads {args.threads}`"
        + (f" `--before {args.before}` ({_commit(args.before)})" if args.before else "")
        + f", after: {_commit(here)}. Raw rows: `{args.out.name}`.\n\n"
    )
    summary = _summary(rows)
    args.out.with_suffix(".md").write_text(header + summary + "\n", encoding="utf-8")
    print(summary)
    return 0 if all(r["exit_code"] == 0 and not r["failure"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
