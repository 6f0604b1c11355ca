"""The time-to-quality benchmark's bookkeeping: every trainer option is classified (so a new training knob
cannot leak into the engine loop), the engine loop pins every training knob to the engine's plain loop,
variants parse, iterations-to-target and the tables are read off raw rows as written, and one short
in-process run produces a row with its evaluation points."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from benchmarks.time_to_quality.report import (
    ablation_table,
    encoder_check,
    labels,
    load_rows,
    retarget,
    time_table,
)
from benchmarks.time_to_quality.run import evaluation_points, train_and_evaluate
from benchmarks.time_to_quality.tasks import TASKS, Target, meets
from benchmarks.time_to_quality.variants import (
    ENGINE_LOOP,
    ENGINE_LOOP_OPTIONS,
    OTHER_KNOBS,
    TRAINING_KNOBS,
    parse_variant,
)
from trainer.settings.options import TrainerOptions


def test_every_trainer_option_is_classified_and_the_engine_loop_pins_every_training_knob() -> None:
    names = {f.name for f in fields(TrainerOptions)}
    assert names <= TRAINING_KNOBS | OTHER_KNOBS, names - TRAINING_KNOBS - OTHER_KNOBS
    assert not TRAINING_KNOBS & OTHER_KNOBS
    assert set(ENGINE_LOOP_OPTIONS) == TRAINING_KNOBS
    options = ENGINE_LOOP.trainer_options(TrainerOptions())
    assert (str(options.time_distribution), options.ema_decay, options.ode_steps) == ("uniform", 0.0, 0)


def test_variants_parse_by_name_and_by_overrides() -> None:
    assert parse_variant("engine-loop") is ENGINE_LOOP
    assert parse_variant("frozen-encoder").freeze_encoder
    custom = parse_variant("p02=time_distribution:power:0.2;ema_decay:0.99")
    assert custom.name == "p02" and custom.options == {"time_distribution": "power:0.2", "ema_decay": 0.99}
    assert custom.settings()["ema_decay"] == 0.99
    for bad in ("nope", "x=unknown_knob:1", "=ema_decay:0"):
        with pytest.raises(ValueError):
            parse_variant(bad)


def _row(
    task: str, variant: str, seed: int, curve: list[tuple[int, float]], lr: float = 1e-3
) -> dict[str, Any]:
    metric = TASKS[task].targets[0].metric
    evals = [
        {"it": it, "train_s": it / 1000, "metrics": {metric: value, "both_modes_covered": 1.0}}
        for it, value in curve
    ]
    first = next((e for e in evals if meets(TASKS[task].targets, e["metrics"])), None)
    return {
        "task": task,
        "seed": seed,
        "variant": variant,
        "settings": {"time_distribution": "uniform", "freeze_encoder": variant == "frozen-encoder"},
        "learning_rate": lr,
        "iterations": curve[-1][0],
        "eval_seed": 1000,
        "evals": evals,
        "target_it": None if first is None else first["it"],
        "target_s": None if first is None else first["train_s"],
        "commit": "abc",
    }


def test_time_table_reports_the_slowest_seed_and_the_ratio_to_the_engine_loop(tmp_path: Path) -> None:
    rows = [
        _row("b1", "default", 0, [(500, 0.5), (1000, 0.96)]),
        _row("b1", "default", 1, [(500, 0.96), (1000, 0.97)]),
        _row("b1", "engine-loop", 0, [(5000, 0.9), (10000, 0.951)]),
        _row("b1", "engine-loop", 1, [(5000, 0.9), (10000, 0.9)]),  # never reached: a lower bound
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    assert load_rows([path]) == rows
    table = time_table(rows, 1e-3)
    default = next(line for line in table.splitlines() if line.startswith("| default"))
    assert "s0: 1,000, s1: 500" in default and "| 1,000 | 1.0 | > 10.0 |" in default
    engine = next(line for line in table.splitlines() if line.startswith("| engine-loop"))
    assert "> 10,000" in engine
    assert time_table(rows, 1e-4) == ""
    assert ablation_table(rows).count("| default |") == 2


def test_encoder_check_compares_the_lowest_seeds() -> None:
    rows = [
        _row("b4", "default", 0, [(1000, 0.99)]),
        _row("b4", "default", 1, [(1000, 0.985)]),
        _row("b4", "frozen-encoder", 0, [(1000, 0.1)]),
        _row("b4flat", "default", 0, [(1000, 0.995)]),
        _row("b4flat", "default", 1, [(1000, 0.99)]),
    ]
    text = encoder_check(rows)
    assert "| frozen encoder | 0.100 | - | 0.100 |" in text
    assert "gap +0.005: PASS" in text
    rows[1] = _row("b4", "default", 1, [(1000, 0.9)])
    assert "FAIL" in encoder_check(rows)


def test_one_name_run_with_different_settings_is_told_apart_by_them() -> None:
    old = _row("b3", "default", 0, [(1000, 0.99)])
    new = {**old, "settings": {**old["settings"], "time_distribution": "power:0.5"}}
    engine = _row("b3", "engine-loop", 0, [(1000, 0.99)])
    assert labels([old, new, engine]) == [
        "default (time_distribution=uniform)",
        "default (time_distribution=power:0.5)",
        "engine-loop",
    ]
    table = time_table([old, new], 1e-3)
    assert (
        "| default (time_distribution=uniform) |" in table
        and "| default (time_distribution=power:0.5) |" in table
    )


def test_an_intermediate_target_is_read_again_from_the_evaluation_points() -> None:
    rows = [
        _row("b1", "default", 0, [(500, 0.5), (1000, 0.8), (1500, 0.96)]),
        _row("b1", "engine-loop", 0, [(5000, 0.6), (10000, 0.7)]),
    ]
    again = retarget(rows, {"b1": (Target("on_mode", 0.7),)})
    assert [r["target_it"] for r in again] == [1000, 10000]
    assert [r["target_it"] for r in rows] == [1500, None]  # the rows themselves are left as they were
    table = time_table(rows, 1e-3, targets={"b1": (Target("on_mode", 0.7),)})
    assert "on_mode >= 0.7 (budget" in table and "| 1,000 | 1.0 | 10.0 |" in table


def test_encoder_check_takes_the_flat_schema_from_its_default_run() -> None:
    rows = [
        _row("b4", "default", 0, [(1000, 0.99)]),
        _row("b4flat", "default", 0, [(1000, 0.995)]),
        _row("b4flat", "frozen-encoder", 0, [(1000, 0.5)]),
    ]
    assert "| flat schema | 0.995 | 0.995 |" in encoder_check(rows)


def test_a_short_run_is_a_row_with_its_evaluation_points() -> None:
    task = TASKS["b3"]
    assert evaluation_points(task, 2500) == [1000, 2000, 2500]
    row = train_and_evaluate(
        task, 7, ENGINE_LOOP, learning_rate=1e-3, iterations=20, eval_seed=5, points=[10, 20]
    )
    assert [e["it"] for e in row["evals"]] == [10, 20]
    assert set(row["evals"][-1]["metrics"]) == {"score", "upright", "return"}
    assert row["settings"]["time_distribution"] == "uniform" and row["chunk"] == "4/2"
    assert row["target_it"] is None and row["diverged"] is None
    json.dumps(row)  # one JSON line
