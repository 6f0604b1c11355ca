"""Summaries and tables: every metric's mean/std/min/max over seeds, the markdown tables per task and per
training-time distribution, and the target checks."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from benchmarks.quality_harness.plan import (
    DEFAULT_T,
    TABLE_METRICS,
    TARGETS,
    HarnessConfig,
    RunResult,
    Variant,
    time_rows,
)

__all__ = ["check_targets", "describe_variant", "summarise", "task_table", "time_table"]


def _stats(values: Iterable[float]) -> dict[str, float]:
    v = np.array([x for x in values if x is not None and math.isfinite(x)], dtype=np.float64)
    if v.size == 0:
        return {"mean": math.nan, "std": math.nan, "min": math.nan, "max": math.nan, "n": 0}
    return {
        "mean": float(v.mean()),
        "std": float(v.std(ddof=1)) if v.size > 1 else 0.0,
        "min": float(v.min()),
        "max": float(v.max()),
        "n": int(v.size),
    }


def summarise(variants: Sequence[Variant], results: Sequence[RunResult]) -> list[dict[str, Any]]:
    """One entry per (variant, NFE): every metric's mean/std/min/max over the seeds that succeeded."""
    summary: list[dict[str, Any]] = []
    for v in variants:
        runs = [r for r in results if r.variant == v.key and r.failure is None]
        keys: list[str] = []
        for r in runs:
            for k in r.metrics:
                if k not in keys:
                    keys.append(k)
        for nfe in keys:
            metric_names = sorted({m for r in runs if nfe in r.metrics for m in r.metrics[nfe]})
            summary.append(
                {
                    "variant": v.key,
                    "nfe": nfe,
                    "seeds": [r.seed for r in runs if nfe in r.metrics],
                    "train_steps": _stats(r.train_steps for r in runs),
                    "train_s": _stats(r.train_s for r in runs),
                    "metrics": {
                        m: _stats(r.metrics[nfe].get(m, math.nan) for r in runs if nfe in r.metrics)
                        for m in metric_names
                    },
                }
            )
    return summary


def _fmt(stat: Mapping[str, float] | None, digits: int = 3) -> str:
    if stat is None or stat.get("n", 0) == 0 or not math.isfinite(stat["mean"]):
        return "–"
    if stat["n"] > 1:
        return f"{stat['mean']:.{digits}f} ± {stat['std']:.{digits}f}"
    return f"{stat['mean']:.{digits}f}"


def _digits(metric: str) -> int:
    return 1 if metric in ("return",) else 3


def _variant_desc(v: Variant) -> str:
    parts = [v.label]
    if v.method == "fm" and v.time_distribution != DEFAULT_T and v.group == "main":
        parts.append(f"t~{v.time_distribution}")
    return " ".join(parts)


def _failed_note(v: Variant, results: Sequence[RunResult]) -> str:
    failed = [r.seed for r in results if r.variant == v.key and r.failure is not None]
    return f" (failed seeds: {failed})" if failed else ""


def task_table(
    task: str, variants: Sequence[Variant], summary: Sequence[Mapping[str, Any]], results: Sequence[RunResult]
) -> str:
    """The markdown table of ``task``'s main rows."""
    metrics = TABLE_METRICS[task]
    chunk_col = task in ("b2", "b3")
    head = ["policy", "train steps"] + (["chunk (predict/execute)"] if chunk_col else []) + ["NFE"]
    head += [label for _, label in metrics] + ["ms/call", "rows/call", "train s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for v in variants:
        if v.task != task or v.group != "main":
            continue
        entries = [s for s in summary if s["variant"] == v.key]
        if not entries:
            cells = [_variant_desc(v) + _failed_note(v, results), str(v.iterations)]
            cells += [f"{v.chunk_size}/{v.execute}"] if chunk_col else []
            ran = any(r.variant == v.key for r in results)
            cells += ["failed" if ran else "not run"] + [""] * (len(metrics) + 3)
            lines.append("| " + " | ".join(cells) + " |")
            continue
        for s in entries:
            cells = [_variant_desc(v) + _failed_note(v, results), f"{s['train_steps']['mean']:.0f}"]
            cells += [f"{v.chunk_size}/{v.execute}"] if chunk_col else []
            cells.append(s["nfe"])
            cells += [_fmt(s["metrics"].get(m), _digits(m)) for m, _ in metrics]
            cells += [
                _fmt(s["metrics"].get("ms_per_call"), 1),
                f"{s['metrics']['rows_per_call']['mean']:.0f}" if "rows_per_call" in s["metrics"] else "–",
                _fmt(s["train_s"], 0),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def time_table(
    task: str, cfg: HarnessConfig, variants: Sequence[Variant], summary: Sequence[Mapping[str, Any]]
) -> str:
    """The time-distribution comparison for ``task``: primary metrics per distribution and NFE."""
    metrics = TABLE_METRICS[task]
    head = ["t distribution", "train steps", "NFE"] + [label for _, label in metrics] + ["train s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for dist, v in time_rows(cfg, variants, task):
        for s in (s for s in summary if s["variant"] == v.key):
            cells = [dist, f"{s['train_steps']['mean']:.0f}", s["nfe"]]
            cells += [_fmt(s["metrics"].get(m), _digits(m)) for m, _ in metrics]
            cells.append(_fmt(s["train_s"], 0))
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def check_targets(variants: Sequence[Variant], summary: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every target against every main FM row of its task (mean over seeds at the target's NFE)."""
    checks: list[dict[str, Any]] = []
    for target in TARGETS:
        for v in variants:
            if v.task != target.task or v.method != "fm" or v.group != "main":
                continue
            s = next((s for s in summary if s["variant"] == v.key and s["nfe"] == str(target.nfe)), None)
            stat = s["metrics"].get(target.metric) if s is not None else None
            mean = stat["mean"] if stat is not None and stat["n"] > 0 else math.nan
            checks.append(
                {
                    "task": target.task,
                    "variant": v.key,
                    "metric": target.metric,
                    "nfe": target.nfe,
                    "threshold": target.threshold,
                    "mean": mean,
                    "min": stat["min"] if stat is not None and stat["n"] > 0 else math.nan,
                    "passed": bool(math.isfinite(mean) and mean >= target.threshold),
                }
            )
    return checks


def describe_variant(v: Variant) -> str:
    extras = []
    if v.chunk_size > 1:
        extras.append(f"chunk {v.chunk_size}/{v.execute}")
    if not v.embed:
        extras.append("embed=false")
    if v.time_distribution != DEFAULT_T:
        extras.append(f"t~{v.time_distribution}")
    return v.key + (f" ({', '.join(extras)})" if extras else "")
