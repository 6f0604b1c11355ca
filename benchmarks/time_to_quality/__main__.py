"""``python -m benchmarks.time_to_quality``: see :mod:`benchmarks.time_to_quality.cli`."""

from __future__ import annotations

from benchmarks.time_to_quality.cli import main

__all__: list[str] = []

if __name__ == "__main__":
    raise SystemExit(main())
