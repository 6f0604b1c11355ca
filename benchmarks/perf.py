"""``python benchmarks/perf.py [OPTIONS]``: the same run as ``la-trainer bench`` (see :mod:`emulator.bench`).

A thin wrapper so the benchmark runs from a checkout without installing the package.
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["main"]

REPO_ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))  # a checkout that is not installed
    from emulator.bench import bench_command

    bench_command(prog_name="python benchmarks/perf.py")


if __name__ == "__main__":
    main()
