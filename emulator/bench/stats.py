"""The arithmetic every section shares: medians and ratios that carry NaN through, the load average."""

from __future__ import annotations

import math
import os
import statistics

__all__ = ["load_average", "median", "ratio"]


def median(values: list[float]) -> float:
    """The median, NaN for no values (a section that measured nothing)."""
    return float(statistics.median(values)) if values else math.nan


def ratio(a: float, b: float) -> float:
    """``a / b``, NaN when either is NaN or ``b`` is zero (a missing measurement stays missing)."""
    return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan


def load_average() -> list[float]:
    """The 1-, 5- and 15-minute load averages (empty where the platform has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover - not on every platform
        return []
