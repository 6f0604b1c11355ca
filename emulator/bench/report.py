"""The results of ``la-trainer bench`` read back: the flat summary, the target checks and the tables."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from emulator.bench.config import Target
from emulator.bench.stats import ratio

__all__ = ["check_target", "format_report", "summarise"]


def summarise(results: Mapping[str, Any]) -> dict[str, float]:
    """The flat numbers the targets read (``section.key``)."""
    out: dict[str, float] = {}
    for name, value in results.get("train", {}).items():
        if isinstance(value, dict) and "contenders" in value:
            for key in ("ours_over_reference", "ours_over_roofline", "ours_over_autograd"):
                out[f"train.{name}.{key}"] = value[key]
            if "ours_over_reference_default_threads" in value:  # results written before the best-of change
                out[f"train.{name}.ours_over_reference_default_threads"] = value[
                    "ours_over_reference_default_threads"
                ]
            ref1 = value["contenders"].get("reference_1_thread")
            if ref1 is not None:
                out[f"train.{name}.ours_over_reference_1_thread"] = ratio(
                    value["contenders"]["ours"]["it_per_s"], ref1["it_per_s"]
                )
            out[f"train.{name}.ours_it_per_s"] = value["contenders"]["ours"]["it_per_s"]
    ingest = results.get("ingest", {})
    if "shm" in ingest:
        shm = ingest["shm"]
        out["ingest.shm_over_memcpy"] = ratio(shm["ingest_gb_per_s"], shm["memcpy_warm_gb_per_s"])
        out["ingest.shm_over_memcpy_fresh"] = ratio(shm["ingest_gb_per_s"], shm["memcpy_fresh_gb_per_s"])
        out["ingest.peak_rss_over_buffer"] = shm["peak_rss_over_buffer"]
    if "socket" in ingest:
        sock = ingest["socket"]
        out["ingest.socket_over_raw"] = ratio(sock["ingest_gb_per_s"], sock.get("raw_gb_per_s", math.nan))
        out["ingest.socket_peak_rss_over_buffer"] = sock["peak_rss_over_buffer"]
        if "ingest.peak_rss_over_buffer" in out:
            out["ingest.peak_rss_over_buffer"] = max(
                out["ingest.peak_rss_over_buffer"], sock["peak_rss_over_buffer"]
            )
    for transport, sync in results.get("sync", {}).items():
        out[f"sync.{transport}_round_ms"] = sync["sync_round_ms"]
    startup = results.get("startup", {})
    for key in ("first_request_s", "training_start_s", "first_round_s"):
        if key in startup:
            out[f"startup.{key}"] = startup[key]
    return out


def check_target(target: Target, summary: Mapping[str, float]) -> dict[str, Any]:
    value = summary.get(target.key, math.nan)
    if math.isnan(value):
        met: bool | None = None
    elif target.op == ">=":
        met = value >= target.bound
    elif target.op == "<":
        met = value < target.bound
    else:
        met = value <= target.bound
    return {
        "key": target.key,
        "target": f"{target.op} {target.bound:g}",
        "value": value,
        "met": met,
        "text": target.text,
    }


def _fmt(value: Any, unit: str = "", digits: int = 0) -> str:
    if not isinstance(value, int | float) or math.isnan(value):
        return "-"
    return f"{value:,.{digits}f}{unit}"


def format_report(results: Mapping[str, Any]) -> str:
    """The human-readable tables."""
    lines: list[str] = []
    meta = results["meta"]
    lines.append(
        f"la-trainer bench | python {meta['python']} | torch {meta['torch']} | {meta['cores']} cores | "
        f"load {meta['load_before']} -> {meta.get('load_after')} | median of {meta['settings']['repeats']}"
    )
    for section in ("train", "train_cuda"):
        train = results.get(section)
        if not train:
            continue
        lines.append("")
        lines.append(
            f"Training iterations/s on {train['device']} (matmul {train['matmul_gflops']:.1f} GFLOP/s all "
            f"threads, {train['matmul_gflops_1_thread']:.1f} on 1)"
        )
        lines.append(
            f"  {'config':<8} {'ours':>8} {'thr':>3} {'autograd':>9} {'reference':>10} {'roofline':>9} "
            f"{'ours/ref':>8} {'ours/roof':>9} {'ref/roof':>8}"
        )
        lines.append("  (ours/ref and ref/roof use the reference at its best thread count in this run)")
        for name, value in train.items():
            if not (isinstance(value, dict) and "contenders" in value):
                continue
            c = value["contenders"]
            lines.append(
                f"  {name:<8} {_fmt(c['ours']['it_per_s']):>8} {value['threads']['ours']:>3} "
                f"{_fmt(c['autograd']['it_per_s']):>9} {_fmt(c['reference']['it_per_s']):>10} "
                f"{_fmt(value['roofline_it_per_s']):>9} {_fmt(value['ours_over_reference'], 'x', 2):>8} "
                f"{_fmt(100 * value['ours_over_roofline'], '%', 0):>9} "
                f"{_fmt(100 * value['reference_over_roofline'], '%', 0):>8}"
            )
            extra = [k for k in c if k.startswith("ours_") and k.endswith("_threads")]
            for k in extra:
                lines.append(
                    f"  {'':<8} {_fmt(c[k]['it_per_s']):>8} {k.split('_')[1]:>3}   (ours, other thread count)"
                )
            if "ours_compiled" in c:
                lines.append(
                    f"  {'':<8} {_fmt(c['ours_compiled']['it_per_s']):>8} {value['threads']['ours']:>3}"
                    "   (ours, torch.compile-d: option compile=on)"
                )
            if "ours_eager" in c:
                lines.append(
                    f"  {'':<8} {_fmt(c['ours_eager']['it_per_s']):>8} {value['threads']['ours']:>3}"
                    "   (ours without the CUDA graph: the eager fused step)"
                )
            if "gemm_floor" in c:
                floor = c["gemm_floor"]["it_per_s"]
                lines.append(
                    f"  {'':<8} {_fmt(floor):>8} {value['threads']['ours']:>3}   (the step's matmuls alone; "
                    f"ours reaches {_fmt(100 * ratio(c['ours']['it_per_s'], floor), '%', 0)} of it)"
                )
            if "reference_1_thread" in c:
                lines.append(
                    f"  {'':<8} {'':>8} {'':>3} {'':>9} {_fmt(c['reference_1_thread']['it_per_s']):>10}"
                    "   (reference on 1 thread)"
                )
            lines.append(
                f"  {'':<8} {_fmt(c['ours'].get('cpu_it_per_s')):>8} {'':>3} "
                f"{_fmt(c['autograd'].get('cpu_it_per_s')):>9} {_fmt(c['reference'].get('cpu_it_per_s')):>10}"
                "   (per CPU-second, all threads counted)"
            )
        for value in train.values():
            if isinstance(value, dict) and "config" in value:
                lines.append(f"  {value['config']['description']}")
    ingest = results.get("ingest")
    if ingest:
        lines.append("")
        lines.append("Replay-buffer ingest (trainer-side process)")
        lines.append(
            f"  {'transport':<9} {'MB':>7} {'ingest GB/s':>11} {'memcpy GB/s':>17} {'raw GB/s':>8} "
            f"{'ratio':>6} {'peak RSS MB':>11} {'xbuffer':>7}"
        )
        for transport, r in ingest.items():
            memcpy = (
                f"{_fmt(r['memcpy_warm_gb_per_s'], '', 2)} ({_fmt(r['memcpy_fresh_gb_per_s'], '', 2)} new)"
            )
            base = r.get("raw_gb_per_s", r["memcpy_warm_gb_per_s"])
            lines.append(
                f"  {transport:<9} {r['bytes'] / 2**20:>7.0f} {_fmt(r['ingest_gb_per_s'], '', 2):>11} {memcpy:>17} "
                f"{_fmt(r.get('raw_gb_per_s'), '', 2):>8} {_fmt(ratio(r['ingest_gb_per_s'], base), '', 2):>6} "
                f"{_fmt(r['peak_rss_bytes'] / 2**20):>11} {_fmt(r['peak_rss_over_buffer'], '', 2):>7}"
            )
    sync = results.get("sync")
    if sync:
        lines.append("")
        lines.append("Sync round (networks 0, 1, 2; default networks): median ms")
        for transport, r in sync.items():
            lines.append(
                f"  {transport:<9} round {_fmt(r['sync_round_ms'], '', 2):>7} = export+encode "
                f"{_fmt(r['sync_export_encode_ms'], '', 2)} + hand-over {_fmt(r['sync_handover_ms'], '', 2)}"
                f"  ({r['sync_rounds']} rounds)"
            )
    startup = results.get("startup")
    if startup:
        lines.append("")
        lines.append(
            f"Startup (spawned over shared memory): first network request {_fmt(startup['first_request_s'], ' s', 2)}"
            f", training loop {_fmt(startup['training_start_s'], ' s', 2)}, first round after iteration 1 "
            f"{_fmt(startup['first_round_s'], ' s', 2)}; `import torch` alone "
            f"{_fmt(startup['import_torch_s'], ' s', 2)}"
        )
    lines.append("")
    lines.append("Targets")
    for t in results.get("targets", []):
        mark = {True: "met", False: "MISSED", None: "not measured"}[t["met"]]
        lines.append(f"  {mark:<12} {t['text']:<45} value {_fmt(t['value'], '', 3)} (target {t['target']})")
    return "\n".join(lines)
