"""Shared test builders."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from emulator.session import SessionRecord, SessionSettings
from emulator.tasks import continuous_observation_schema

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
