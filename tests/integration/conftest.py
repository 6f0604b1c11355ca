"""Shared pieces of the integration tests: small tasks and session settings for the real trainer.

Every test here runs ``scripts/train.py`` (or ``python -m trainer.cli offline``) as a child process against
the game-side emulator (:mod:`emulator.session`). Sizes are chosen so that one session, including
the trainer's torch import, takes seconds on two CPU cores; every wait is bounded well under 60 s and the
child is killed on the way out whatever happens.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import Any

import pytest

from emulator.session import EngineTask, SessionRecord, SessionSettings
from emulator.tasks import continuous_action_schema, continuous_observation_schema, pendulum

if sys.platform == "win32":  # pragma: no cover - the emulator's shared memory and poll() are POSIX
    collect_ignore_glob = ["test_*.py"]

SETTINGS = SessionSettings(
    iteration_num=300,
    batch_size=64,
    hidden_layer_num=1,
    hidden_layer_size=32,
    device="CPU",
    sync_every_iterations=50,
    timeout_scale=0.25,
    session_timeout_s=40.0,
    exit_timeout_s=12.0,
)
"""Complete variants: 300 iterations, a round every 50, so about six rounds before Complete."""

STOP_SETTINGS = replace(SETTINGS, iteration_num=1_000_000, stop_after_rounds=2)
"""Stop variants: training would run for hours; the engine sends Stop after two rounds."""

NESTED_OBSERVATION_SCHEMA: dict[str, Any] = {
    "VectorSize": 3,
    "EncodedSize": 3,
    "Type": "And",
    "Elements": {
        "Angle": {**continuous_observation_schema(2), "Index": 0},
        "Velocity": {**continuous_observation_schema(1, "AutoShared"), "Index": 1},
    },
}
"""Pendulum observations (cos θ, sin θ, ω/8) as a struct of two leaves: the encoder becomes a Concat."""


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


def assert_same_layout(record: SessionRecord) -> None:
    """Every returned snapshot has the size and the 24-byte header of the one the engine sent (§6.1)."""
    for rnd in record.rounds:
        assert [n.network_id for n in rnd.networks] == [0, 1, 2]
        for net, sent in zip(rnd.networks, record.sent, strict=True):
            assert len(net.data) == len(sent), f"round {rnd.index} network {net.network_id} size"
            assert net.raw_header == sent[:24], f"round {rnd.index} network {net.network_id} header"


def assert_trained(record: SessionRecord) -> None:
    """The denoiser came back with different weights (training happened, §7.2)."""
    assert record.final_networks[0] != record.sent[0], "the denoiser came back unchanged"
