#!/usr/bin/env python3
"""Quality benchmark entry point: ``python benchmarks/quality.py --help`` (or ``python -m
benchmarks.quality``). The benchmark itself is the :mod:`benchmarks.quality_harness` package."""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # runnable as a plain script from a checkout
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.quality_harness.cli import main  # noqa: E402

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
