"""Tables from raw result rows (:func:`~.run.train_and_evaluate`, one JSON line each).

* :func:`time_table`: per task, each variant's iterations and seconds to the targets, per seed and for
  the slowest seed, with the engine loop's on the same seeds and the ratio between them;
* :func:`ablation_table`: every row tried, with its settings, iterations to target and final metrics;
* :func:`encoder_check`: B4's trained encoder against the flat schema's score, the frozen encoder beside.

Seeds that never met the targets count as "not reached within" their run's iterations: the ratio to the
engine loop is then a lower bound (``>``).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.time_to_quality.tasks import TASKS, Target, meets

__all__ = [
    "ablation_table",
    "ceiling_table",
    "draws_table",
    "encoder_check",
    "labels",
    "load_rows",
    "retarget",
    "study_rows",
    "time_table",
]

Row = Mapping[str, Any]

_STUDY_METRICS = {"b1big": ["on_mode", "both_modes_covered"], "b2c1": ["success", "entropy"]}
"""Metrics of the tasks only the research study ran (B1 with a 2 x 256 network, B2 without chunks)."""


def load_rows(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Every JSON line of every file (blank lines skipped)."""
    rows: list[dict[str, Any]] = []
    for path in paths:
        rows += [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return rows


def study_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of the issue-17 research study (``ttq/results/ablation.jsonl`` of the ``exp17`` worktree:
    an in-process harness on the pre-restructure code, with knobs the trainer does not all have, e.g.
    ``init`` and ``lr_mult``) in this benchmark's row format, so that one table lists every row tried.
    Its settings keep the study's own names; its commit is prefixed ``exp17@``."""
    out: list[dict[str, Any]] = []
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        settings = {k: v for k, v in r["config"].items() if k != "name"}
        settings["phase"] = r.get("phase", "tune")
        evals = r.get("curve") or [{"it": r["budget"], "train_s": r["train_s"], "metrics": r["metrics"]}]
        first = next((e for e in evals if e["it"] == r.get("first_pass_it")), None)
        out.append(
            {
                "task": r["task"],
                "seed": r["seed"],
                "variant": r["name"],
                "settings": settings,
                "learning_rate": r["lr"],
                "iterations": r["budget"],
                "eval_seed": r["eval_seed"],
                "evals": evals,
                "target_it": r.get("first_pass_it"),
                "target_s": None if first is None else first["train_s"],
                "diverged": r.get("diverged"),
                "commit": f"exp17@{r['commit']}",
                "time": r["time"],
            }
        )
    return out


def _final(row: Row) -> Mapping[str, float]:
    return row["evals"][-1]["metrics"] if row["evals"] else {}


def _slowest(rows: Sequence[Row]) -> tuple[int | None, float | None, int]:
    """(iterations, seconds) to target of the slowest seed (None: some seed never reached it), and the
    most iterations any of them ran (the bound when not reached)."""
    ran = max(row["evals"][-1]["it"] if row["evals"] else 0 for row in rows)
    if any(row["target_it"] is None for row in rows):
        return None, None, ran
    slowest = max(rows, key=lambda row: (row["target_it"], row["target_s"]))
    return slowest["target_it"], slowest["target_s"], ran


def _iterations(value: int | None, ran: int) -> str:
    return f"> {ran:,}" if value is None else f"{value:,}"


def labels(rows: Sequence[Row]) -> list[str]:
    """Each row's variant name, with the settings that tell it apart where one name was run with different
    settings (``default`` is whatever the trainer's defaults were at the row's commit): e.g.
    ``default (layer_lr=same)`` beside ``default (layer_lr=fan_in)``."""
    by_name: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        by_name[row["variant"]].append(row["settings"])
    out: list[str] = []
    for row in rows:
        seen = by_name[row["variant"]]
        differing = sorted(
            k for k in row["settings"] if any(other.get(k) != row["settings"][k] for other in seen)
        )
        suffix = ", ".join(f"{k}={row['settings'][k]}" for k in differing)
        out.append(f"{row['variant']} ({suffix})" if suffix else row["variant"])
    return out


def retarget(rows: Sequence[Row], targets: Mapping[str, Sequence[Target]]) -> list[Row]:
    """``rows`` with iterations and seconds to target read again from their evaluation points for the tasks
    in ``targets`` (an intermediate quality, where the task's own targets are out of reach for every
    variant); the other rows as they are."""
    out: list[Row] = []
    for row in rows:
        wanted = targets.get(row["task"])
        if wanted is None:
            out.append(row)
            continue
        first = next((e for e in row["evals"] if meets(wanted, e["metrics"])), None)
        out.append(
            {
                **row,
                "target_it": None if first is None else first["it"],
                "target_s": None if first is None else first["train_s"],
            }
        )
    return out


def time_table(
    rows: Sequence[Row],
    learning_rate: float,
    reference: str = "engine-loop",
    targets: Mapping[str, Sequence[Target]] | None = None,
) -> str:
    """Markdown: per task, every variant run at ``learning_rate``, iterations/seconds to every target (the
    task's own, or ``targets``' for the tasks it names: :func:`retarget`)."""
    targets = targets or {}
    rows = retarget(rows, targets)
    groups: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for row, label in zip(rows, labels(rows), strict=True):
        if row["learning_rate"] == learning_rate:
            groups[(row["task"], label)].append(row)
    out: list[str] = []
    for key, task in TASKS.items():
        variants = sorted({v for (t, v) in groups if t == key}, key=lambda v: (v == reference, v))
        if not variants:
            continue
        wanted = targets.get(key, task.targets)
        goal = " and ".join(str(t) for t in wanted)
        out += [
            f"#### {task.title}: {goal} (budget {task.budget:,} iterations), lr {learning_rate:g}",
            "",
            "| variant | seeds | iterations to target per seed | slowest seed: iterations | seconds | "
            f"x fewer than {reference} | lowest-seed final metrics |",
            "|---|---|---|---|---|---|---|",
        ]
        ref = groups.get((key, reference), [])
        ref_it, _, ref_ran = _slowest(ref) if ref else (None, None, 0)
        for variant in variants:
            runs = sorted(groups[(key, variant)], key=lambda r: r["seed"])
            slowest, seconds, ran = _slowest(runs)
            per_seed = ", ".join(
                f"s{r['seed']}: " + _iterations(r["target_it"], r["evals"][-1]["it"] if r["evals"] else 0)
                for r in runs
            )
            finals = [_final(r) for r in runs]
            lowest = ", ".join(
                f"{t.metric} {min(f.get(t.metric, float('nan')) for f in finals):.3f}" for t in wanted
            )
            ratio = "-"
            if variant != reference and ref:
                if slowest is None:
                    ratio = "-"
                elif ref_it is None:
                    ratio = f"> {ref_ran / slowest:.1f}"
                else:
                    ratio = f"{ref_it / slowest:.1f}"
            out.append(
                f"| {variant} | {len(runs)} | {per_seed} | {_iterations(slowest, ran)} | "
                f"{'-' if seconds is None else f'{seconds:.1f}'} | {ratio} | {lowest} |"
            )
        out.append("")
    return "\n".join(out)


def ablation_table(rows: Sequence[Row]) -> str:
    """Markdown: every row tried (the losers too), grouped by task, in the order they ran."""
    out: list[str] = []
    keys = [*TASKS, *sorted({r["task"] for r in rows} - set(TASKS))]
    for key in keys:
        mine = [r for r in rows if r["task"] == key]
        if not mine:
            continue
        task = TASKS.get(key)
        metrics = [t.metric for t in task.targets] if task else _STUDY_METRICS.get(key, [])
        title = task.title if task else f"{key} (study-only task)"
        out += [
            f"#### {title}",
            "",
            "| variant | settings | lr | seed | iterations | eval seed | to target | "
            + " | ".join(metrics)
            + " | curve (first target metric) | commit |",
            "|---|---|---|---|---|---|---|" + "---|" * len(metrics) + "---|---|",
        ]
        for r in mine:
            final = _final(r)
            curve = " ".join(f"{e['it'] // 100 / 10:g}k:{e['metrics'][metrics[0]]:.2f}" for e in r["evals"])
            settings = "; ".join(f"{k}={v}" for k, v in r["settings"].items())
            reached = "-" if r["target_it"] is None else f"{r['target_it']:,}"
            out.append(
                f"| {r['variant']} | {settings} | {r['learning_rate']:g} | {r['seed']} | {r['iterations']:,} | "
                f"{r['eval_seed']} | {reached} | "
                + " | ".join(f"{final.get(m, float('nan')):.3f}" for m in metrics)
                + f" | {curve} | {r['commit']} |"
            )
        out.append("")
    return "\n".join(out)


def encoder_check(rows: Sequence[Row], tolerance: float = 0.02) -> str:
    """Markdown: B4's final score per seed with the trained encoder, the frozen one and the flat schema;
    the check is the trained encoder's lowest seed within ``tolerance`` of the flat schema's."""
    by: dict[str, dict[int, float]] = defaultdict(dict)
    for r in rows:
        if r["task"] in ("b4", "b4flat") and r["evals"]:
            label = (
                "flat schema"
                if r["task"] == "b4flat"
                else ("frozen encoder" if r["settings"].get("freeze_encoder") else "trained encoder")
            )
            # The flat schema has no encoder weights to freeze: its reference is the default run only.
            if r["variant"] == "default" or (r["variant"] == "frozen-encoder" and r["task"] == "b4"):
                by[label][r["seed"]] = float(_final(r)["score"])
    if not by:
        return ""
    seeds = sorted({s for scores in by.values() for s in scores})
    out = [
        "| B4 policy | " + " | ".join(f"score s{s}" for s in seeds) + " | lowest |",
        "|---|" + "---|" * (len(seeds) + 1),
    ]
    for label in ("trained encoder", "frozen encoder", "flat schema"):
        scores = by.get(label, {})
        cells = [f"{scores[s]:.3f}" if s in scores else "-" for s in seeds]
        out.append(
            f"| {label} | " + " | ".join(cells) + f" | {min(scores.values(), default=float('nan')):.3f} |"
        )
    trained, flat = by.get("trained encoder", {}), by.get("flat schema", {})
    if trained and flat:
        gap = min(flat.values()) - min(trained.values())
        verdict = "PASS" if gap <= tolerance else "FAIL"
        out += [
            "",
            f"Trained encoder within {tolerance} of the flat schema (lowest seeds): gap {gap:+.3f}: {verdict}.",
        ]
    return "\n".join(out) + "\n"


def draws_table(
    rows: Sequence[Row],
    learning_rate: float,
    reference: str = "engine-loop",
    targets: Mapping[str, Sequence[Target]] | None = None,
) -> str:
    """Markdown: the iteration ratio to ``reference`` per evaluation draw (the rows' ``eval_seed``), for
    every task and variant run at ``learning_rate`` on more than one draw. A ratio is stated only as the
    range over the draws: one draw's ratio can flip with another (issue 23: a B3 2.0x was 1.5x on another
    draw). Iterations are the slowest training seed's, as in :func:`time_table`."""
    targets = targets or {}
    rows = [r for r in retarget(rows, targets) if r["learning_rate"] == learning_rate]
    groups: dict[tuple[str, str, int], list[Row]] = defaultdict(list)
    for row, label in zip(rows, labels(rows), strict=True):
        groups[(row["task"], label, row["eval_seed"])].append(row)
    out: list[str] = []
    for key, task in TASKS.items():
        if targets and key not in targets:
            continue  # the task's own targets: the table without ``targets`` has it
        draws = sorted({d for (t, v, d) in groups if t == key and v == reference})
        variants = sorted({v for (t, v, d) in groups if t == key and v != reference})
        if len(draws) < 2 or not variants:
            continue
        goal = " and ".join(str(t) for t in targets.get(key, task.targets))
        out += [
            f"#### {task.title}: {goal}, lr {learning_rate:g}, per evaluation draw",
            "",
            "| variant | "
            + " | ".join(f"draw {d}: iterations (ratio)" for d in draws)
            + " | ratio over the draws |",
            "|---|" + "---|" * (len(draws) + 1),
        ]
        for variant in variants:
            cells: list[str] = []
            ratios: list[float] = []
            for d in draws:
                mine, ref = groups.get((key, variant, d), []), groups.get((key, reference, d), [])
                if not mine or not ref:
                    cells.append("-")
                    continue
                it, _, ran = _slowest(mine)
                ref_it, _, ref_ran = _slowest(ref)
                if it is None:
                    cells.append(f"> {ran:,} (-)")
                    continue
                ratio = (ref_it if ref_it is not None else ref_ran) / it
                ratios.append(ratio)
                cells.append(f"{it:,} ({'> ' if ref_it is None else ''}{ratio:.1f}x)")
            summary = (
                f"{min(ratios):.1f}x-{max(ratios):.1f}x"
                if len(ratios) == len(draws)
                else "not stated (a draw without the target)"
            )
            out.append(f"| {variant} | " + " | ".join(cells) + f" | {summary} |")
        out.append("")
    return "\n".join(out)


def ceiling_table(ceiling: Sequence[Row], trained: Sequence[Row]) -> str:
    """Markdown: B2's ideal-sampler ceiling (:mod:`~.ceiling`) per seed and resolution, beside the final
    success and route entropy of the trained B2 rows on the same seeds and evaluation draw."""
    if not ceiling:
        return ""
    seeds = sorted({r["seed"] for r in ceiling})
    out = [
        "#### B2's ideal-sampler ceiling (a demonstrated 8-step chunk from a demonstration state within the "
        "resolution, 4 executed) beside the trained policies",
        "",
        "| policy | episodes | "
        + " | ".join(f"s{s} success / entropy" for s in seeds)
        + " | lowest success / entropy |",
        "|---|---|" + "---|" * (len(seeds) + 1),
    ]

    def line(label: str, episodes: object, by_seed: Mapping[int, Mapping[str, float]]) -> str:
        cells = [
            f"{by_seed[s]['success']:.3f} / {by_seed[s]['entropy']:.3f}" if s in by_seed else "-"
            for s in seeds
        ]
        low = f"{min(m['success'] for m in by_seed.values()):.3f} / {min(m['entropy'] for m in by_seed.values()):.3f}"
        return f"| {label} | {episodes} | " + " | ".join(cells) + f" | {low} |"

    for resolution in sorted({r["resolution"] for r in ceiling}):
        mine = [r for r in ceiling if r["resolution"] == resolution]
        out.append(
            line(
                f"ideal sampler, resolution {resolution:g}",
                mine[0]["episodes"],
                {r["seed"]: r["metrics"] for r in mine},
            )
        )
    groups: dict[tuple[str, float], list[Row]] = defaultdict(list)
    b2 = [r for r in trained if r["task"] == "b2" and r["evals"] and r["seed"] in seeds]
    for row, label in zip(b2, labels(b2), strict=True):
        groups[(label, row["learning_rate"])].append(row)
    for (label, lr), rows in sorted(groups.items()):
        out.append(
            line(
                f"{label}, lr {lr:g}, {rows[0]['evals'][-1]['it']:,} iterations",
                rows[0].get("eval_episodes") or "200",
                {r["seed"]: _final(r) for r in rows},
            )
        )
    return "\n".join(out) + "\n"
