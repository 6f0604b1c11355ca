"""One whole ``la-trainer bench`` run: every selected section in order, the summary and the targets."""

from __future__ import annotations

import math
import os
import platform
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from emulator.bench.config import TARGETS, BenchSettings
from emulator.bench.ipc import measure_ipc
from emulator.bench.report import check_target, summarise
from emulator.bench.startup import measure_startup
from emulator.bench.stats import load_average
from emulator.bench.training import measure_train_section

__all__ = ["SYNC_ONLY_INGEST_MB", "run_bench"]

SYNC_ONLY_INGEST_MB = 0.1
"""The replay buffer of a run without the ingest section (MiB): sync needs a session, not a large buffer;
the workload's smallest (one episode) is used."""


def run_bench(settings: BenchSettings, progress: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Every selected section; returns the JSON-ready results."""
    import torch

    results: dict[str, Any] = {
        "meta": {
            "settings": asdict(settings),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "machine": platform.machine(),
            "cores": os.cpu_count(),
            "load_before": load_average(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
    }
    cpu = torch.device("cpu")
    seconds: dict[str, float] = {}
    clock = time.monotonic()
    if "train" in settings.sections:
        progress("training throughput (CPU) ...")
        results["train"] = measure_train_section(settings, cpu)
        if settings.device in ("auto", "cuda") and torch.cuda.is_available():
            progress("training throughput (CUDA) ...")
            results["train_cuda"] = measure_train_section(settings, torch.device("cuda"))
        seconds["train"], clock = time.monotonic() - clock, time.monotonic()
    with tempfile.TemporaryDirectory(prefix="la-trainer-bench-") as tmp:
        work = Path(tmp)
        transports: dict[str, dict[str, Any]] = {}
        torch_import_s = math.nan
        if "ingest" in settings.sections or "sync" in settings.sections:
            over = ", ".join(settings.transports)
            if "ingest" in settings.sections:
                progress(f"ingest {settings.ingest_mb:g} MB and sync over {over} ...")
                transports, torch_import_s = measure_ipc(settings, work)
            else:
                # Sync alone: the session still needs a replay buffer, the smallest one (not --ingest-mb).
                progress(f"sync over {over} ...")
                transports, torch_import_s = measure_ipc(
                    replace(settings, ingest_mb=SYNC_ONLY_INGEST_MB), work
                )
            seconds["ipc"], clock = time.monotonic() - clock, time.monotonic()
        if transports and "ingest" in settings.sections:
            results["ingest"] = {
                t: {k: v for k, v in r.items() if not k.startswith("sync")} for t, r in transports.items()
            }
        if transports and "sync" in settings.sections:
            results["sync"] = {
                t: {k: v for k, v in r.items() if k.startswith("sync")} for t, r in transports.items()
            }
        if "startup" in settings.sections:
            progress("startup ...")
            results["startup"] = measure_startup(settings, work, torch_import_s)
            seconds["startup"] = time.monotonic() - clock
    results["meta"]["load_after"] = load_average()
    results["meta"]["section_seconds"] = seconds
    results["summary"] = summarise(results)
    results["targets"] = [check_target(t, results["summary"]) for t in TARGETS]
    return results
