"""What the engine builds for a recording (spec §4, §5.3, §6.3) and its TrainingMaterials export (§5.5)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import numpy as np
import pytest

from protocol.config import (
    FlowMatchingSettings,
    FlowMatchingTrainingSettings,
    SessionConfig,
    TrainerConfig,
    parse_json,
    session_from_files,
)
from protocol.engine.configs import build_engine_session, format_time_stamp
from protocol.engine.export import (
    DATA_CONFIG,
    MODEL_CONFIG,
    TRAINER_CONFIG,
    ExportFlags,
    encode_training_materials,
    export_folder_name,
    network_file,
    replay_buffer_file,
)
from protocol.engine.networks import UnsupportedSchemaError, build_flow_matching_networks
from protocol.names import NetworkId
from protocol.replay import ReplayBuffer, ReplayLayout
from protocol.schema import parse_schema
from protocol.snapshot import read_snapshot_header

# Observation: And{ Pos: Continuous(2), Kind: DiscreteExclusive(3) }; action: Continuous(2).
OBSERVATION: dict[str, Any] = {
    "VectorSize": 5,
    "EncodedSize": 5,
    "Type": "And",
    "Elements": {
        "Pos": {
            "VectorSize": 2,
            "EncodedSize": 2,
            "Type": "Continuous",
            "Num": 2,
            "Normalization": "AutoPerDimension",
            "Index": 0,
        },
        "Kind": {"VectorSize": 3, "EncodedSize": 3, "Type": "DiscreteExclusive", "Num": 3, "Index": 1},
    },
}
ACTION: dict[str, Any] = {
    "VectorSize": 2,
    "DistributionSize": 4,
    "EncodedSize": 4,
    "ModifierSize": 5,
    "Type": "Continuous",
    "Num": 2,
    "Normalization": "AutoPerDimension",
}
TRAINER = TrainerConfig(
    time_stamp="2026-05-09_12-30-417",
    training=FlowMatchingTrainingSettings(iteration_num=300, batch_size=64, learning_rate=1e-3, seed=77),
    embed_normalizations_in_weights=True,
    device="CPU",
    temp_directory="/project/Intermediate/LearningCore",
)
FLOW_MATCHING = FlowMatchingSettings(
    action_chunk_size=2, hidden_layer_num=2, hidden_layer_size=16, activation_function="GELU"
)


def _replay(lengths: tuple[int, ...] = (3, 4), seed: int = 0) -> ReplayBuffer:
    rng = np.random.default_rng(seed)
    steps = sum(lengths)
    return ReplayBuffer(
        replay_buffer_id=0,
        episode_starts=np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int32),
        episode_lengths=np.array(lengths, dtype=np.int32),
        observations=(rng.standard_normal((steps, 5)).astype(np.float32),),
        actions=(rng.standard_normal((steps, 2)).astype(np.float32),),
    )


def _session() -> tuple[SessionConfig, tuple[bytes, bytes, bytes], ReplayBuffer]:
    replay = _replay()
    config, snapshots = build_engine_session(
        OBSERVATION, ACTION, replay, trainer=TRAINER, flow_matching=FLOW_MATCHING
    )
    return config, snapshots, replay


# --------------------------------------------------------------------------------------------------
# Configs and initial networks


def test_time_stamp_has_milliseconds_last() -> None:
    # §10 item 11: the flow-matching trainer formats %Y-%m-%d_%H-%M-%s, milliseconds as the last field.
    assert format_time_stamp(datetime(2026, 5, 9, 12, 30, 5, 417_999)) == "2026-05-09_12-30-417"
    assert format_time_stamp(datetime(2026, 1, 2, 3, 4, 5, 7_000)) == "2026-01-02_03-04-007"


def test_snapshots_are_the_builders_networks_seeded_by_the_trainer_config() -> None:
    _, snapshots, _ = _session()
    expected = build_flow_matching_networks(
        parse_schema(OBSERVATION, "observation"),
        parse_schema(ACTION, "action"),
        chunk_size=2,
        hidden_layer_num=2,
        hidden_layer_size=16,
        activation="GELU",
        seed=77,
    ).to_bytes()
    assert snapshots == expected


def test_model_config_names_the_three_networks_with_their_snapshot_sizes() -> None:
    config, snapshots, _ = _session()
    networks = config.model.networks
    assert [(n.id, n.name) for n in networks] == [(int(n), n.title) for n in NetworkId]
    assert [n.max_byte_num for n in networks] == [len(s) for s in snapshots]
    assert [(n.input_schema_id, n.output_schema_id) for n in networks] == [(None, None), (0, None), (None, 0)]
    assert config.model.flow_matching == FLOW_MATCHING
    # Widths the trainer relies on (§6.3): the denoiser reads [latents ‖ x_t ‖ t], ActDim = 2 · chunk 2.
    headers = [read_snapshot_header(s) for s in snapshots]
    assert [(h.input_size, h.output_size) for h in headers] == [(5 + 4 + 1, 4), (5, 5), (4, 4)]


def test_data_config_describes_the_recording_as_a_full_buffer() -> None:
    config, _, replay = _session()
    (rb,) = config.data.replay_buffers
    assert (rb.id, rb.max_episode_num, rb.max_step_num) == (0, 2, 7)
    assert (rb.has_completions, rb.has_final_observations, rb.has_final_memory_states) == (
        False,
        False,
        False,
    )
    assert [(s.name, s.schema_id, s.vector_dimension_num) for s in (*rb.observations, *rb.actions)] == [
        ("Observations", 0, 5),
        ("Actions", 0, 2),  # per-step actions: not multiplied by the chunk size (§4.2)
    ]
    assert rb.action_modifiers == rb.memory_states == rb.rewards == ()
    assert config.observation_schema.name == config.action_schema.name == "Default"
    assert config.observation_schema.schema == parse_schema(OBSERVATION, "observation")
    assert ReplayLayout.from_config(rb).encode_file(replay)  # the buffer fits the config it is sent with


def test_trainer_config_is_sent_as_given_and_defaults_are_the_engines() -> None:
    config, _, _ = _session()
    assert config.trainer == TRAINER
    default, _ = build_engine_session(OBSERVATION, ACTION, _replay())
    assert default.trainer == TrainerConfig()
    assert default.model.flow_matching == FlowMatchingSettings()


def test_another_seed_gives_other_weights_of_the_same_sizes() -> None:
    _, first, _ = _session()
    other_trainer = TrainerConfig(training=FlowMatchingTrainingSettings(seed=78))
    _, second = build_engine_session(
        OBSERVATION, ACTION, _replay(), trainer=other_trainer, flow_matching=FLOW_MATCHING
    )
    assert [len(s) for s in first] == [len(s) for s in second]
    assert first[0] != second[0]  # the denoiser's Kaiming-uniform weights
    assert first[2] == second[2]  # the decoder holds no random weights


def test_a_schema_the_builder_cannot_build_is_refused_with_its_path() -> None:
    observation = {**OBSERVATION, "Type": "OrExclusive", "EncodingSize": 5}
    with pytest.raises(UnsupportedSchemaError) as info:
        build_engine_session(observation, ACTION, _replay())
    assert (info.value.element_type, info.value.path) == ("OrExclusive", "ObservationSchema")


# --------------------------------------------------------------------------------------------------
# TrainingMaterials export


def test_export_holds_the_engines_files_in_its_order() -> None:
    config, snapshots, replay = _session()
    files = encode_training_materials(config, dict(enumerate(snapshots)), replay)
    assert list(files) == [
        "trainer-config.json",
        "ReplayBuffers/data-config.json",
        "ReplayBuffers/replaybuffer_0.bin",
        "Networks/model-config.json",
        "Networks/network_0.bin",
        "Networks/network_1.bin",
        "Networks/network_2.bin",
    ]
    assert [files[network_file(i)] for i in range(3)] == list(snapshots)


def test_export_reads_back_as_the_same_session_and_replay_buffer() -> None:
    config, snapshots, replay = _session()
    files = encode_training_materials(config, dict(enumerate(snapshots)), replay)
    data_obj = parse_json(files[DATA_CONFIG], DATA_CONFIG)
    assert isinstance(data_obj, dict) and set(data_obj) == {"ReplayBuffers", "Schemas"}  # no model keys
    parsed = session_from_files(
        parse_json(files[TRAINER_CONFIG], TRAINER_CONFIG),
        data_obj,
        parse_json(files[MODEL_CONFIG], MODEL_CONFIG),
    )
    assert parsed == config  # TempDirectory included, no warnings
    decoded = ReplayLayout.from_config(parsed.replay_buffer(0)).decode_file(files[replay_buffer_file(0)])
    np.testing.assert_array_equal(decoded.episode_starts, replay.episode_starts)
    np.testing.assert_array_equal(decoded.episode_lengths, replay.episode_lengths)
    np.testing.assert_array_equal(decoded.observations[0], replay.observations[0])
    np.testing.assert_array_equal(decoded.actions[0], replay.actions[0])


@pytest.mark.parametrize(
    ("flags", "prefixes"),
    [
        ({ExportFlags.NETWORKS}, {"Networks/"}),
        ({ExportFlags.REPLAY_BUFFERS}, {"ReplayBuffers/"}),
        ({ExportFlags.TRAINER_CONFIG}, {"trainer-config.json"}),
        (set(), set()),
    ],
)
def test_export_flags_choose_the_parts(flags: set[ExportFlags], prefixes: set[str]) -> None:
    config, snapshots, replay = _session()
    files = encode_training_materials(config, dict(enumerate(snapshots)), replay, flags=frozenset(flags))
    assert {next(p for p in prefixes if name.startswith(p)) for name in files} == prefixes


def test_a_non_ascii_temp_directory_makes_a_utf16_trainer_config() -> None:
    config, snapshots, replay = _session()
    trainer = TrainerConfig(temp_directory="C:/Projekt/Überall/Intermediate/LearningCore")
    config = SessionConfig(trainer, config.data, config.model)
    raw = encode_training_materials(config, dict(enumerate(snapshots)), replay)[TRAINER_CONFIG]
    assert raw.startswith(b"\xff\xfe")  # as the engine's file writer stores non-ASCII text
    parsed = parse_json(raw, TRAINER_CONFIG)
    assert isinstance(parsed, dict) and parsed["TempDirectory"] == trainer.temp_directory


def test_export_folder_is_named_by_its_second() -> None:
    assert export_folder_name(datetime(2026, 5, 9, 12, 30, 5, 999_999)) == "20260509123005"
