"""benchmarks/heldout_agreement.py: its rank correlation and its table, on rows whose answers are known."""

from __future__ import annotations

import math
from typing import Any

import pytest

from benchmarks.heldout_agreement import HELDOUT_METRICS, spearman, table


def test_spearman_closed_forms() -> None:
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3, 4], [1, 8, 27, 64]) == pytest.approx(1.0)  # ranks, not values
    # ties share their average rank: ranks (1.5, 1.5, 3) against (1, 2, 3)
    assert spearman([5, 5, 7], [1, 2, 3]) == pytest.approx(math.sqrt(3) / 2)
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))


def _row(share: float, qualities: list[float], losses: list[float]) -> dict[str, Any]:
    evals = []
    for it, (q, loss) in enumerate(zip(qualities, losses, strict=True), start=1):
        entry: dict[str, Any] = {"it": it * 100, "metrics": {"success": q}}
        if share > 0:
            entry["heldout"] = {name: loss for name in HELDOUT_METRICS} | {"coverage": q, "precision": q}
        evals.append(entry)
    return {"task": "b2", "seed": 0, "heldout_share": share, "quality_metric": "success", "evals": evals}


def test_the_table_ranks_and_compares() -> None:
    # quality rises while every loss falls: +1 for every metric; the last checkpoint is the best
    text = table([_row(0.1, [0.2, 0.5, 0.7, 0.9], [4.0, 3.0, 2.0, 1.0]), _row(0.0, [0.95], [0.0])])
    (all_row,) = [line for line in text.splitlines() if line.startswith("| b2 (success) | 0 | all 4 |")]
    assert all_row.count("+1.00") == len(HELDOUT_METRICS)
    assert "| b2 | success | 0.900 (0.900) | 0.950 (0.950) |" in text
    (pick_row,) = [line for line in text.splitlines() if line.startswith("| b2 (success) | 0 | +")]
    assert pick_row.count("+0.000") == len(HELDOUT_METRICS) + 1
