"""``python -m emulator.bench``: the bench command, or with ``--worker SPEC`` the IPC worker process that
:class:`emulator.bench.ipc.WorkerProcess` spawns (the trainer side of ingest, sync and peak RSS)."""

from __future__ import annotations

import json
import sys

from emulator.bench.command import bench_command
from emulator.bench.worker import run_worker

__all__: list[str] = []

if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        run_worker(json.loads(sys.argv[2]))
    else:
        bench_command()
