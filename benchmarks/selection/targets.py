"""Issue 33's targets table: the default (the recipe pilot) against each fixed recipe, from
``time_to_quality run`` rows (report seeds 0, 1, 2; 1 x 128 unless the row says otherwise).

  python -m benchmarks.selection.targets benchmarks/results/recipes/report.jsonl \
      benchmarks/results/recipes/fixed.jsonl --out benchmarks/results/recipes/targets.md

Per task and variant: the lowest seed's final value of each target metric, the iteration from which every
target holds to the end of the budget ("within", per seed; "-" where the last evaluation misses), the
training seconds to that point (every candidate's steps counted: the pilot's are inside the default's
seconds) and, for the default, the recipe each seed's pilot chose. The cost column divides the default's
seconds-to-hold by the best fixed recipe's for that task and seed (the fixed recipe that holds on every
seed with the least seconds on its slowest seed), the largest ratio over the seeds.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.time_to_quality.run import held_from
from benchmarks.time_to_quality.tasks import TASKS
from trainer.settings.recipes import RECIPES
from trainer.training.recipes import DROP_AT, PICK_AT

Row = Mapping[str, Any]

WITHIN: Mapping[str, int] = {"b1": 5_000, "b2": 30_000, "b3": 2_000, "b4": 10_000, "b4flat": 10_000}
"""The issue's budget for each target where it is not the task's own (B3: within 2,000)."""


def load(paths: Iterable[Path]) -> list[Row]:
    rows: list[Row] = []
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                rows.append(json.loads(line))
    return rows


def hold(row: Row, budget: int) -> tuple[int | None, float | None]:
    """(iteration, seconds) from which the targets hold to ``budget``; (None, None) when they do not."""
    held = held_from(TASKS[row["task"]], [e for e in row["evals"] if e["it"] <= budget])
    if held is None:
        return None, None
    return int(held["it"]), float(held["train_s"])


def candidate_steps(row: Row, iteration: int) -> int:
    """Training steps of every candidate up to ``iteration``: a piloted run's three candidates step until
    DROP_AT, two until PICK_AT, one after; a fixed recipe's one."""
    if row.get("recipe", {}).get("chosen_by") != "pilot":
        return iteration
    three = min(iteration, DROP_AT)
    two = max(0, min(iteration, PICK_AT) - DROP_AT)
    return len(RECIPES) * three + 2 * two + max(0, iteration - PICK_AT)


def _final(row: Row, budget: int) -> Mapping[str, float]:
    evals = [e for e in row["evals"] if e["it"] <= budget]
    return evals[-1]["metrics"] if evals else {}


def table(rows: Sequence[Row]) -> list[str]:
    by: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for row in rows:
        by[(row["task"], row["variant"])].append(row)
    order = [key for key in TASKS if any(task == key for task, _ in by)]
    lines = [
        "| task (targets, within) | recipe | lowest final | holds from (seeds 0/1/2) | candidate steps to hold | "
        "seconds to hold | chosen by the pilot | cost vs best fixed: steps, seconds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for task in order:
        budget = WITHIN.get(task, TASKS[task].budget)
        variants = sorted((v for t, v in by if t == task), key=lambda v: (v != "default", v))
        holds: dict[str, list[tuple[int | None, float | None]]] = {}
        for variant in variants:
            seeded = sorted(by[(task, variant)], key=lambda r: r["seed"])
            holds[variant] = [hold(r, budget) for r in seeded]
        # The best fixed recipe on the task's own network (a row of another network is named "...@LxS").
        fixed = [
            v
            for v in variants
            if not v.startswith("default") and "@" not in v and all(h[0] is not None for h in holds[v])
        ]
        best = min(fixed, key=lambda v: max(float(h[1] or 0.0) for h in holds[v]), default=None)
        targets = ", ".join(str(t) for t in TASKS[task].targets)
        for variant in variants:
            seeded = sorted(by[(task, variant)], key=lambda r: r["seed"])
            finals = [_final(r, budget) for r in seeded]
            lowest = " / ".join(
                f"{min(f.get(t.metric, math.nan) for f in finals):.3f}" for t in TASKS[task].targets
            )
            its = "/".join("-" if h[0] is None else f"{h[0]:,}" for h in holds[variant])
            steps = [
                None if h[0] is None else candidate_steps(r, h[0])
                for h, r in zip(holds[variant], seeded, strict=True)
            ]
            shown_steps = "/".join("-" if n is None else f"{n:,}" for n in steps)
            secs = "/".join("-" if h[1] is None else f"{h[1]:.0f}" for h in holds[variant])
            chosen = ""
            if variant == "default":
                chosen = "/".join(str(r.get("recipe", {}).get("name", "?")) for r in seeded)
            cost = ""
            if variant == "default" and best is not None:
                ratios = [
                    (own[1] / ref[1]) if own[1] is not None and ref[1] else math.inf
                    for own, ref in zip(holds[variant], holds[best], strict=False)
                ]
                step_ratios = [
                    (own / ref[0]) if own is not None and ref[0] else math.inf
                    for own, ref in zip(steps, holds[best], strict=False)
                ]
                if ratios and all(math.isfinite(r) for r in ratios):
                    cost = f"{max(step_ratios):.2f}x, {max(ratios):.2f}x ({best})"
                else:
                    cost = f"not held on every seed ({best} is)"
            name = "**default (pilot)**" if variant == "default" else variant
            first = f"{task} ({targets}; {budget:,})" if variant == variants[0] else ""
            lines.append(
                f"| {first} | {name} | {lowest} | {its} | {shown_steps} | {secs} | {chosen} | {cost} |"
            )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("paths", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    lines = table(load(args.paths))
    text = "\n".join(lines) + "\n"
    if args.out is not None:
        args.out.write_text(text, encoding="utf-8")
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
