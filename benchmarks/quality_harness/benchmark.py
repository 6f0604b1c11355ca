"""The whole benchmark: every (row, seed) in priority order, one at a time or in ``--jobs`` processes,
each finished training appended to ``<out>/partial.json`` at once; then the report (tables printed and in
``tables.md``, plots, ``results.json``)."""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.quality_harness.plan import (
    CURVE_NFE,
    PRIMARY,
    TASK_TITLES,
    WEIGHT_DECAY,
    HarnessConfig,
    RunResult,
    Variant,
    plan_variants,
    time_rows,
)
from benchmarks.quality_harness.plots import write_plots
from benchmarks.quality_harness.runs import run_one
from benchmarks.quality_harness.tables import (
    check_targets,
    describe_variant,
    summarise,
    task_table,
    time_table,
)

__all__ = ["load_partial", "run_benchmark", "write_report"]


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, np.generic):
        return _jsonable(obj.item())
    return obj


def _timed_run_one(
    variant: Variant, seed: int, cfg: HarnessConfig, work_dir: Path
) -> tuple[RunResult, dict[str, Any], float]:
    started = time.perf_counter()
    result, data = run_one(variant, seed, cfg, work_dir)
    return result, data, time.perf_counter() - started


def _merge_plot_data(into: dict[str, Any], data: Mapping[str, Any]) -> None:
    for kind, by_variant in data.items():
        into.setdefault(kind, {}).update(by_variant)


def run_benchmark(cfg: HarnessConfig, command: str = "") -> dict[str, Any]:
    """Run the plan, print the tables, write results.json, tables.md and plots; return the report dict."""
    started = time.perf_counter()
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    load_start = os.getloadavg()
    cfg.out.mkdir(parents=True, exist_ok=True)
    variants = plan_variants(cfg)
    results: list[RunResult] = []
    plot_data: dict[str, Any] = {}
    own_work = cfg.work_dir is None
    work_dir = Path(tempfile.mkdtemp(prefix="la-quality-")) if own_work else Path(cfg.work_dir or ".")
    total_runs = len(variants) * len(cfg.seeds)
    print(
        f"quality: {len(variants)} rows × {len(cfg.seeds)} seeds = {total_runs} trainings; "
        f"NFE {', '.join(map(str, cfg.nfe))}; MLP HiddenLayerNum {cfg.hidden_layer_num} × {cfg.hidden_layer_size} "
        f"({cfg.hidden_layer_num + 2} Linear layers), batch {cfg.batch_size}, lr {cfg.learning_rate:g}",
        flush=True,
    )
    order = sorted(range(len(variants)), key=lambda i: (variants[i].priority, i))
    jobs = [(variants[i], seed) for i in order for seed in cfg.seeds]
    by_job: dict[tuple[str, int], RunResult] = {}
    if cfg.resume:
        # Keep the successful runs of an interrupted run with the same output folder; redo the rest.
        _, kept = load_partial(cfg.out / "partial.json")
        for run in kept:
            if run.failure is None and any(v.key == run.variant and s == run.seed for v, s in jobs):
                by_job[(run.variant, run.seed)] = run
        jobs = [(v, seed) for v, seed in jobs if (v.key, seed) not in by_job]
        print(
            f"quality: resuming: {len(by_job)} trainings kept from partial.json, {len(jobs)} to run",
            flush=True,
        )

    def announce(v: Variant, seed: int, result: RunResult, seconds: float) -> None:
        primary = PRIMARY[v.task]
        shown = result.metrics.get(str(CURVE_NFE)) or result.metrics.get("-") or {}
        status = (
            f"FAILED: {result.failure}"
            if result.failure
            else f"{primary} {shown.get(primary, math.nan):.3f} (NFE {CURVE_NFE if v.method == 'fm' else '-'})"
        )
        print(
            f"quality: [{len(by_job)}/{total_runs}] {describe_variant(v)} seed {seed}: {status}; "
            f"train {result.train_s:.1f} s, total {seconds:.1f} s (elapsed {time.perf_counter() - started:.0f} s)",
            flush=True,
        )
        if result.failure:
            print(result.log_tail, flush=True)
        # Everything finished so far, in case the run is interrupted before the tables.
        partial = {"command": command, "runs": [asdict(r) for r in by_job.values()]}
        (cfg.out / "partial.json").write_text(json.dumps(_jsonable(partial), indent=1), encoding="utf-8")

    try:
        if cfg.jobs <= 1:
            for v, seed in jobs:
                t0 = time.perf_counter()
                result, data = run_one(v, seed, cfg, work_dir)
                by_job[(v.key, seed)] = result
                _merge_plot_data(plot_data, data)
                announce(v, seed, result, time.perf_counter() - t0)
        else:
            # Separate processes (spawned: the harness has torch loaded, and forking a process with
            # torch's thread pools running is unsafe). Each worker runs one training at a time.
            context = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(max_workers=cfg.jobs, mp_context=context) as pool:
                futures = {pool.submit(_timed_run_one, v, seed, cfg, work_dir): (v, seed) for v, seed in jobs}
                for future in as_completed(futures):
                    v, seed = futures[future]
                    result, data, seconds = future.result()
                    by_job[(v.key, seed)] = result
                    _merge_plot_data(plot_data, data)
                    announce(v, seed, result, seconds)
    finally:
        if own_work:
            shutil.rmtree(work_dir, ignore_errors=True)
    results.extend(by_job[(v.key, seed)] for v in variants for seed in cfg.seeds if (v.key, seed) in by_job)

    return write_report(
        cfg,
        variants,
        results,
        plot_data,
        command=command,
        started_at=started_at,
        total_s=time.perf_counter() - started,
        load_start=load_start,
    )


def write_report(
    cfg: HarnessConfig,
    variants: Sequence[Variant],
    results: Sequence[RunResult],
    plot_data: Mapping[str, Any],
    *,
    command: str,
    started_at: str,
    total_s: float,
    load_start: Sequence[float],
    complete: bool = True,
) -> dict[str, Any]:
    """Summary, targets, tables (printed and ``tables.md``), plots and ``results.json`` for ``results``.

    ``complete`` False marks tables rebuilt from an interrupted run's ``partial.json`` (``--tables-from``).
    """
    summary = summarise(variants, results)
    targets = check_targets(variants, summary)
    sections: list[str] = []
    for task in cfg.tasks:
        sections.append(f"### {TASK_TITLES[task]}\n\n{task_table(task, variants, summary, results)}")
    if cfg.time_dists:
        for task in cfg.time_dist_tasks:
            if time_rows(cfg, variants, task):
                sections.append(
                    f"### {TASK_TITLES[task]}: training-time distribution of t\n\n"
                    f"{time_table(task, cfg, variants, summary)}"
                )
    if targets:
        lines = [
            f"- {c['variant']} NFE {c['nfe']}: {c['metric']} {c['mean']:.3f} (min over seeds {c['min']:.3f}) "
            f">= {c['threshold']}: {'PASS' if c['passed'] else 'FAIL'}"
            if math.isfinite(c["mean"])
            else f"- {c['variant']} NFE {c['nfe']}: {c['metric']} >= {c['threshold']}: no result"
            for c in targets
        ]
        sections.append("### Targets (mean over seeds)\n\n" + "\n".join(lines))
    header = (
        f"Seeds {', '.join(map(str, cfg.seeds))} (evaluation seed {cfg.eval_seed}); "
        f"MLP HiddenLayerNum {cfg.hidden_layer_num}, HiddenLayerSize {cfg.hidden_layer_size} "
        f"({cfg.hidden_layer_num + 2} Linear layers), {cfg.activation}; batch {cfg.batch_size}; "
        f"AdamW(amsgrad) lr {cfg.learning_rate:g} wd {WEIGHT_DECAY:g}; EMA {cfg.ema_decay}; "
        f"EmbedNormalizationsInWeights true unless the row says false. "
        f"Values: mean ± std over seeds. Total wall-clock {total_s / 60:.1f} min "
        f"(1-min load average {load_start[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end, "
        f"{os.cpu_count()} CPUs)."
    )
    if not complete:
        done = len({(r.variant, r.seed) for r in results})
        header = (
            f"PARTIAL: {done} of {len(variants) * len(cfg.seeds)} trainings of an interrupted run; rows show "
            f"the seeds that finished (n in results.json). Wall-clock and load refer to the rebuild. "
            + header
        )
    tables = header + "\n\n" + "\n\n".join(sections) + "\n"
    print("\n" + tables, flush=True)

    plot_files = write_plots(cfg, variants, summary, results, plot_data) if cfg.plots else []
    report = {
        "command": command,
        "started_at": started_at,
        "complete": complete,
        "total_s": total_s,
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            # Wall-clock numbers are only comparable between runs on an equally loaded machine.
            "load_average_start": list(load_start),
            "load_average_end": list(os.getloadavg()),
        },
        "config": {
            k: (dict(v) if isinstance(v, Mapping) else v)
            for k, v in asdict(replace(cfg, out=Path(str(cfg.out)))).items()
            if k != "work_dir"
        },
        "weight_decay": WEIGHT_DECAY,
        "variants": [asdict(v) for v in variants],
        "runs": [asdict(r) for r in results],
        "summary": summary,
        "targets": targets,
        "plots": [p.name for p in plot_files],
    }
    (cfg.out / "tables.md").write_text(tables, encoding="utf-8")
    (cfg.out / "results.json").write_text(json.dumps(_jsonable(report), indent=1), encoding="utf-8")
    print(f"quality: wrote {cfg.out / 'results.json'}, tables.md and {len(plot_files)} plots", flush=True)
    return report


def load_partial(path: Path) -> tuple[str, list[RunResult]]:
    """The command and the finished runs recorded in a ``partial.json`` (``("", [])`` when the file does
    not exist)."""
    if not path.is_file():
        return "", []
    partial = json.loads(path.read_text(encoding="utf-8"))
    runs = [
        RunResult(**{**r, "curve": [tuple(point) for point in r.get("curve", [])]})
        for r in partial.get("runs", [])
    ]
    return str(partial.get("command", "")), runs
