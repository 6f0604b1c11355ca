"""Shared pieces of the integration tests: small tasks and session settings for the real trainer.

Every test here runs ``scripts/train.py`` (or ``python -m trainer.commands.cli offline``) as a child process against
the game-side emulator (:mod:`emulator.session`). Sizes are chosen so that one session, including
the trainer's torch import, takes seconds on two CPU cores; every wait is bounded well under 60 s and the
child is killed on the way out whatever happens.
"""

from __future__ import annotations

import sys

import pytest

from emulator.session import EngineTask
from emulator.tasks import continuous_action_schema, pendulum
from tests.support.sessions import (
    NESTED_OBSERVATION_SCHEMA,
)

if sys.platform == "win32":  # pragma: no cover - the emulator's shared memory and poll() are POSIX
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session")
def bimodal_task() -> EngineTask:
    """B1 with 500 one-step episodes (500 steps)."""
    return EngineTask.benchmark("bimodal", size=500, seed=0)


@pytest.fixture(scope="session")
def nested_task() -> EngineTask:
    """B3 pendulum, 3 demonstrations of 200 steps, with a nested (And) observation schema."""
    demos = pendulum.make_demonstrations(0, demo_num=3)
    return EngineTask.from_demonstrations(
        "pendulum-nested", NESTED_OBSERVATION_SCHEMA, continuous_action_schema(1), demos
    )
