"""Seeded end-to-end sessions, fingerprinted: did a change keep the trained networks bit for bit?

Runs five short sessions through the game-side emulator and the real trainer process, one per mode
(spawned shared memory, socket, offline files, attach) with chunks, distillation, embed true/false,
another activation, EMA off and another time distribution among them, and prints the SHA-256 of the
three networks each session ends with. Two commits that train the same way print the same table;
``--compare FILE`` checks against a saved run and exits 1 on any difference.

Used for the layout redesign (moves only): ``benchmarks/results/seeded-sessions-{before,after}.json`` hold
the table before and after it; ``seeded-sessions-{before,after}-29.json`` before and after issue 29 (``trainer/``
regrouped by concern, one owner per engine fact, the long functions split into named steps);
``seeded-sessions-after-32.json`` after issue 32 (steps checked, skipped and smoothed on the device, sync
rounds and snapshots behind the loop), merged with main at b7c588b: the same networks as after 29 (and as
main at b7c588b).

    python benchmarks/seeded_sessions.py --out benchmarks/results/seeded-sessions-after.json \
        --compare benchmarks/results/seeded-sessions-before.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from emulator.session import EngineTask, SessionSettings, run_engine_session

__all__ = ["CASES", "main", "run_cases"]

CASES: tuple[tuple[str, str, str, Mapping[str, Any], Mapping[str, str]], ...] = (
    (
        "shm-avoid-chunk4-embed",
        "shm",
        "avoid",
        {
            "iteration_num": 600,
            "batch_size": 64,
            "action_chunk_size": 4,
            "embed_normalizations_in_weights": True,
        },
        {},
    ),
    (
        "socket-bimodal-distill2",
        "socket",
        "bimodal",
        {"iteration_num": 600, "batch_size": 64},
        {"LA_TRAINER_ODE_STEPS": "2"},
    ),
    (
        "file-pendulum-uniform",
        "file",
        "pendulum",
        {"iteration_num": 400, "batch_size": 64, "action_chunk_size": 2},
        {"LA_TRAINER_TIME_DISTRIBUTION": "uniform"},
    ),
    (
        "attach-bimodal-relu2",
        "attach",
        "bimodal",
        {
            "iteration_num": 400,
            "batch_size": 32,
            "hidden_layer_num": 2,
            "activation": "ReLU",
            "embed_normalizations_in_weights": True,
        },
        {},
    ),
    (
        "shm-bimodal-noema-beta",
        "shm",
        "bimodal",
        {"iteration_num": 500, "batch_size": 128},
        {"LA_TRAINER_EMA_DECAY": "0", "LA_TRAINER_TIME_DISTRIBUTION": "beta:1,1.5"},
    ),
)
"""(name, mode, task, engine-side settings, trainer environment): small, but every code path that decides
what the networks become (fused step, distillation, folds, chunks, EMA, time draws) runs in one of them."""


def run_cases() -> dict[str, list[str]]:
    """SHA-256 of networks 0, 1, 2 at the end of each case (one torch thread: bitwise reproducible)."""
    out: dict[str, list[str]] = {}
    for name, mode, task, settings, env in CASES:
        with tempfile.TemporaryDirectory() as work:
            record = run_engine_session(
                mode,
                EngineTask.benchmark(task, size=200, seed=0),
                work,
                SessionSettings(
                    env={"LA_TRAINER_THREADS": "1", **env},
                    sync_every_iterations=200,
                    session_timeout_s=120,
                    hard_timeout_s=150,
                    **settings,
                ),
            )
            record.check()
            out[name] = [hashlib.sha256(blob).hexdigest() for blob in record.final_networks]
            print(f"{name:28s} exit {record.exit_code}  " + "  ".join(h[:12] for h in out[name]), flush=True)
    return out


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, help="write {commit, networks} as JSON here")
    parser.add_argument("--compare", type=Path, help="a saved run; exit 1 if any network differs")
    args = parser.parse_args(argv)
    networks = run_cases()
    if args.out is not None:
        args.out.write_text(json.dumps({"commit": _commit(), "networks": networks}, indent=1) + "\n")
    if args.compare is not None:
        saved = json.loads(args.compare.read_text())
        differing = sorted(k for k in networks if saved["networks"].get(k) != networks[k])
        if differing:
            print(f"differ from {args.compare} ({saved.get('commit')}): {', '.join(differing)}")
            return 1
        print(f"bitwise the same networks as {args.compare} ({saved.get('commit')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
