"""The quality benchmark's bookkeeping without training: the plan, the summaries and target checks, and
``partial.json`` read back as written. (The whole pipeline runs in ``tests/integration/test_quality_smoke.py``.)"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from benchmarks.quality_harness.benchmark import load_partial
from benchmarks.quality_harness.cli import COMMAND, build_parser, config_from_args
from benchmarks.quality_harness.plan import (
    DEFAULT_T,
    TARGETS,
    HarnessConfig,
    RunResult,
    plan_variants,
    time_rows,
)
from benchmarks.quality_harness.tables import check_targets, summarise, task_table


def config(*argv: str) -> HarnessConfig:
    return config_from_args(build_parser().parse_args(list(argv)))


def test_the_default_plan_has_the_documented_rows_targets_first() -> None:
    keys = [v.key for v in plan_variants(config())]
    assert keys == [
        "b1/fm",
        "b1/fm-embed-false",
        "b1/mse",
        "b2/fm",
        "b2/fm-chunk8x4",
        "b2/mse",
        "b2/mse-chunk8x4",
        "b3/fm-chunk4x2",
        "b3/mse-chunk4x2",
    ]
    assert {v.task for v in plan_variants(config("--rows", "b2/fm-chunk"))} == {"b2"}


def test_the_time_comparison_reuses_the_main_row_for_the_default_distribution() -> None:
    cfg = config("--tasks", "b1", "--time-dists", DEFAULT_T, "beta:1,1.5")
    variants = plan_variants(cfg)
    pairs = [(dist, v.key) for dist, v in time_rows(cfg, variants, "b1")]
    assert pairs == [(DEFAULT_T, "b1/fm"), ("beta:1,1.5", "b1/fm-t=beta:1,1.5")]


def test_summaries_and_targets_are_over_the_seeds_that_succeeded() -> None:
    cfg = config("--tasks", "b1", "--no-embed-false-row")
    variants = plan_variants(cfg)
    runs = [
        RunResult("b1/fm", 0, train_steps=100, metrics={"8": {"on_mode": 0.9, "both_modes_covered": 1.0}}),
        RunResult("b1/fm", 1, train_steps=100, metrics={"8": {"on_mode": 1.0, "both_modes_covered": 1.0}}),
        RunResult("b1/fm", 2, failure="boom"),
    ]
    summary = summarise(variants, runs)
    fm = next(s for s in summary if s["variant"] == "b1/fm")
    assert fm["seeds"] == [0, 1]
    assert fm["metrics"]["on_mode"]["mean"] == pytest.approx(0.95)
    assert fm["metrics"]["on_mode"]["n"] == 2
    checks = {c["metric"]: c for c in check_targets(variants, summary)}
    assert set(checks) == {t.metric for t in TARGETS if t.task == "b1"}
    assert checks["on_mode"]["passed"] is True and checks["both_modes_covered"]["passed"] is True
    table = task_table("b1", variants, summary, runs)
    assert "(failed seeds: [2])" in table and "| MSE (" not in table and "not run" in table


def test_partial_json_reads_back_as_written(tmp_path: Path) -> None:
    # Finite numbers only: the writer stores NaN as null, which reads back as None.
    runs = [RunResult("b1/fm", 0, 3, 1.5, 2.0, metrics={"8": {"mmd": 0.1}}, curve=[(3, 0.5)])]
    path = tmp_path / "partial.json"
    path.write_text(json.dumps({"command": f"{COMMAND} --tasks b1", "runs": [asdict(r) for r in runs]}))
    command, read = load_partial(path)
    assert command == f"{COMMAND} --tasks b1"
    assert read == runs
    assert load_partial(tmp_path / "missing.json") == ("", [])
