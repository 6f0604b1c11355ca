"""Issue 23's additions to the time-to-quality benchmark: the ideal-sampler ceiling, the winner rule of the
sweep, and ratios stated only over several evaluation draws."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.time_to_quality.ceiling import exact_field_metrics, exact_velocity, ideal_sampler_metrics
from benchmarks.time_to_quality.cli import main
from benchmarks.time_to_quality.report import draws_table
from benchmarks.time_to_quality.sweep import choose


def test_the_ideal_sampler_follows_the_demonstrations_and_a_blurred_one_does_not() -> None:
    sharp = ideal_sampler_metrics(0, 1000, 0.005, episodes=100)
    # A resolution wider than the world: every call takes a chunk of any demonstration state.
    blurred = ideal_sampler_metrics(0, 1000, 10.0, episodes=100)
    assert sharp["success"] >= 0.95 and sharp["entropy"] >= 0.8
    assert blurred["success"] < 0.5


def test_the_exact_b1_field_is_the_posterior_mean_of_the_path_velocity() -> None:
    """exact_velocity against a direct estimate of E[x1 - x0 | x_t]: x1 drawn from the mixture, weighted by
    the path's density of x_t given x1, N(t x1, (1 - t)^2 I); and at t = 0 the field is -x (to rounding)."""
    rng = np.random.default_rng(5)
    centre = np.array([[0.6, -1.1]])
    c = np.array([0.07, 0.05])
    x1 = np.where(rng.random((400_000, 1)) < 0.5, 1.0, -1.0) * centre + c * rng.standard_normal((400_000, 2))
    for t in (0.3, 0.6, 0.9):
        # Points the path visits (a typical x0 carried towards either mode), where the weights are not
        # degenerate; at the earlier times also one between the modes, where the field turns (late, the
        # path has almost no mass there and the direct estimate has no samples to weigh).
        points = [t * centre + (1.0 - t) * 0.8, -t * centre - (1.0 - t) * 0.5]
        if t < 0.8:
            points.append((1.0 - t) * np.array([[0.3, 0.2]]))
        for x in points:
            log_w = -0.5 * (((x - t * x1) / (1.0 - t)) ** 2).sum(axis=1)
            w = np.exp(log_w - log_w.max())
            w /= w.sum()
            direct = (w[:, None] * (x1 - (x - t * x1) / (1.0 - t))).sum(axis=0)
            np.testing.assert_allclose(exact_velocity(x, t, centre, c)[0], direct, atol=0.01)
    x = rng.standard_normal((5, 2))
    np.testing.assert_allclose(
        exact_velocity(x, 0.0, np.repeat(centre, 5, axis=0), c), -x, rtol=0, atol=1e-12
    )


def test_eight_euler_steps_of_the_exact_b1_field_meet_b1_and_one_step_is_the_mean_predictor() -> None:
    """The ceiling's point: the engine's 8 steps lose nothing of B1 with the true field (so a trained policy's
    gap is its field), while one step lands every sample on the conditional mean, 0, never a valid action."""
    eight = exact_field_metrics(0, 1000, 8)
    one = exact_field_metrics(0, 1000, 1)
    assert eight["on_mode"] >= 0.99 and eight["both_modes_covered"] == 1.0
    assert one["on_mode"] == 0.0 and one["mmd"] > 2.9


def _row(task: str, variant: str, seed: int, metrics: dict[str, float], target_it: int | None = None) -> Any:
    return {
        "task": task,
        "variant": variant,
        "seed": seed,
        "evals": [{"metrics": metrics}],
        "target_it": target_it,
    }


def _candidate(variant: str, on: float, success: float, entropy: float, b3: int) -> list[Any]:
    return [
        row
        for seed in (100, 101)
        for row in (
            _row("b1", variant, seed, {"on_mode": on, "both_modes_covered": 1.0}),
            _row("b2", variant, seed, {"success": success, "entropy": entropy}),
            _row("b3", variant, seed, {"score": 1.0}, b3),
        )
    ]


def test_the_winner_must_not_give_up_b2_for_b1_and_then_meets_the_most_targets() -> None:
    candidates = {"default": "default", "b1only": "b1only=x", "better": "better=y", "slow": "slow=z"}
    rows = [
        *_candidate("default", 0.85, 0.93, 0.86, 2000),
        # More targets met (B1), but B2's entropy 0.05 below the default's: not eligible.
        *_candidate("b1only", 0.96, 0.93, 0.81, 2000),
        *_candidate("better", 0.90, 0.95, 0.86, 2000),
        # B3 slower than 2,000 iterations: not eligible.
        *_candidate("slow", 0.97, 0.96, 0.90, 3000),
    ]
    winner, lines = choose(rows, candidates)
    assert winner == "better=y"
    assert any(line.startswith("candidate b1only") and "eligible False" in line for line in lines)


def _timed(task: str, variant: str, seed: int, eval_seed: int, target_it: int | None, ran: int) -> Any:
    return {
        "task": task,
        "variant": variant,
        "seed": seed,
        "eval_seed": eval_seed,
        "learning_rate": 1e-3,
        "settings": {},
        "evals": [{"it": ran, "train_s": 1.0, "metrics": {"score": 1.0}}],
        "target_it": target_it,
        "target_s": None if target_it is None else 1.0,
    }


def test_a_ratio_is_stated_as_its_range_over_the_draws_and_not_where_a_draw_misses() -> None:
    rows = [
        _timed("b3", "engine-loop", 0, 1000, 4000, 4000),
        _timed("b3", "engine-loop", 0, 1001, 3000, 3000),
        _timed("b3", "default", 0, 1000, 2000, 10000),
        _timed("b3", "default", 0, 1001, 2000, 10000),
        _timed("b3", "other", 0, 1000, 1000, 10000),
        _timed("b3", "other", 0, 1001, None, 10000),
    ]
    table = draws_table(rows, 1e-3)
    assert "| default | 2,000 (2.0x) | 2,000 (1.5x) | 1.5x-2.0x |" in table
    assert "| other | 1,000 (4.0x) | > 10,000 (-) | not stated" in table


def test_another_network_is_a_row_of_its_own_and_a_bad_shape_is_refused(tmp_path: Path) -> None:
    """run --network LxS trains that MLP (the row records it) under the name VARIANT@LxS, so no table
    mixes it with the task's own network; a shape that is not two positive integers stops before training."""
    out = tmp_path / "rows.jsonl"
    main(
        [
            "run",
            "--tasks",
            "b1",
            "--seeds",
            "0",
            "--variants",
            "default",
            "--network",
            "2x16",
            "--iterations",
            "20",
            "--out",
            str(out),
        ]
    )
    (row,) = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert row["variant"] == "default@2x16" and row["network"] == "2x16 ELU"
    for bad in ("2x0", "x128", "2*128", "0x16"):
        with pytest.raises(SystemExit, match="--network"):
            main(["run", "--tasks", "b1", "--network", bad, "--out", str(out)])
