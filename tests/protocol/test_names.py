"""What the engine calls things, written once (protocol/names.py): the facts each name stands for."""

from __future__ import annotations

import json

import pytest

from protocol.argv import SHARED_MEMORY, SOCKET
from protocol.names import FLOW_MATCHING, CommType, NetworkId, network_label, trainer_method


def test_network_ids_follow_the_engines_add_network_order() -> None:
    assert [(int(n), n.role, n.title) for n in NetworkId] == [
        (0, "denoiser", "Denoiser"),
        (1, "encoder", "Encoder"),
        (2, "decoder", "Decoder"),
    ]


def test_a_network_label_also_names_an_id_outside_the_three() -> None:
    assert NetworkId.ENCODER.describe() == network_label(1) == "network 1 (encoder)"
    assert network_label(7) == "network 7 (network)"  # a checkpoint fingerprint key: spelling is format


def test_a_comm_type_reads_as_the_engines_spelling_everywhere() -> None:
    assert (CommType.SHARED_MEMORY, CommType.SOCKET) == (SHARED_MEMORY, SOCKET)  # the launch's words
    assert f"{CommType.FILES}" == str(CommType.FILES) == "Files"
    assert "_".join(["Training", CommType.SOCKET]) == "Training_Socket"
    assert json.dumps({"comm_type": CommType.MEMORY}) == '{"comm_type": "Memory"}'


@pytest.mark.parametrize(
    ("settings", "method"),
    [
        ({}, FLOW_MATCHING),  # the engine's default when the key is absent
        ({"TrainerMethod": "PPO"}, "PPO"),
        ({"TrainerMethod": ""}, ""),
        ({"TrainerMethod": 5}, None),
        (["TrainerMethod"], None),
        (None, None),
    ],
)
def test_the_trainer_method_of_a_decoded_config(settings: object, method: str | None) -> None:
    assert trainer_method(settings) == method
