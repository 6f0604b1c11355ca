"""Pytest wiring of the fault suite; the harnesses themselves live in :mod:`tests.support.faults`."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from emulator.session import EngineTask
from tests.support.faults import FUZZ_STATS, small_task

if not sys.platform.startswith("linux"):  # pragma: no cover - subreaper, /dev/shm and poll() are Linux
    collect_ignore_glob = ["test_*.py"]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print how many inputs each decoder was fed and how many faults it survived."""
    if not FUZZ_STATS:
        return
    terminalreporter.section("la-trainer fuzz")
    total = [0, 0, 0]
    for name, (tried, rejected, decoded) in sorted(FUZZ_STATS.items()):
        terminalreporter.write_line(
            f"{name:34s} {tried:7d} inputs  {rejected:7d} faults survived (documented error)  {decoded:6d} decoded"
        )
        total = [total[0] + tried, total[1] + rejected, total[2] + decoded]
    terminalreporter.write_line(
        f"{'total':34s} {total[0]:7d} inputs  {total[1]:7d} faults survived  {total[2]:6d} decoded"
    )


@pytest.fixture(scope="session")
def task() -> EngineTask:
    return small_task()
