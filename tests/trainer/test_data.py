"""Training-data facts: action chunks on hand-made episodes (ends, short and zero-length episodes, gaps),
the replay buffer checked once where it becomes training data (episodes, finiteness of every stream),
statistics per Normalization mode on hand-made values, tensor boundary and batch validation."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.errors import ReplayError
from protocol.replay import ReplayBuffer
from protocol.schema import SchemaNode, parse_schema
from trainer.errors import BadData
from trainer.training.data import (
    MIN_STD,
    Batch,
    TensorData,
    TrainingData,
    build_action_chunks,
    decoder_inputs,
    leaf_statistics,
)

# --------------------------------------------------------------------------------------------------
# Chunks

S = 12
# actions[s] = (s, 100 + s): every value names its step.
ACTIONS = np.stack([np.arange(S), 100 + np.arange(S)], axis=1).astype(np.float32)
# Episodes: [0, 4), a zero-length one at 4, [6, 8), [9, 12). Steps 4, 5 and 8 are in no episode.
STARTS = np.array([0, 4, 6, 9], dtype=np.int32)
LENGTHS = np.array([4, 0, 2, 3], dtype=np.int32)


def steps_of(chunk: np.ndarray) -> list[int]:
    return [int(v) for v in chunk[0::2]]


def test_chunk_size_three_repeats_the_last_action_of_each_episode() -> None:
    chunks = build_action_chunks(STARTS, LENGTHS, ACTIONS, 3)
    assert chunks.rows.tolist() == [0, 1, 2, 3, 6, 7, 9, 10, 11]
    assert chunks.actions.shape == (9, 6) and chunks.actions.dtype == np.float32
    assert [steps_of(c) for c in chunks.actions] == [
        [0, 1, 2],
        [1, 2, 3],
        [2, 3, 3],  # episode end: hold the last action
        [3, 3, 3],
        [6, 7, 7],  # a 2-step episode (shorter than C) is padded the same way
        [7, 7, 7],  # never step 8 (outside every episode) nor 9 (the next episode)
        [9, 10, 11],
        [10, 11, 11],
        [11, 11, 11],
    ]
    # step-major layout: [a_t ‖ a_t+1 ‖ a_t+2], each a = (s, 100 + s)
    assert chunks.actions[0].tolist() == [0, 100, 1, 101, 2, 102]


def test_chunk_size_one_is_the_episode_steps_in_order() -> None:
    chunks = build_action_chunks(STARTS, LENGTHS, ACTIONS, 1)
    assert chunks.rows.tolist() == [0, 1, 2, 3, 6, 7, 9, 10, 11]
    np.testing.assert_array_equal(chunks.actions, ACTIONS[chunks.rows])


def test_chunk_longer_than_every_episode() -> None:
    chunks = build_action_chunks(np.array([0, 2]), np.array([1, 2]), ACTIONS, 4)
    assert [steps_of(c) for c in chunks.actions] == [[0, 0, 0, 0], [2, 3, 3, 3], [3, 3, 3, 3]]


def test_only_zero_length_episodes_give_no_rows() -> None:
    chunks = build_action_chunks(np.array([0, 5]), np.array([0, 0]), ACTIONS, 2)
    assert chunks.rows.shape == (0,) and chunks.actions.shape == (0, 4)
    empty = build_action_chunks(np.zeros(0), np.zeros(0), ACTIONS, 2)
    assert empty.actions.shape == (0, 4)


@given(
    lengths=st.lists(st.integers(0, 6), min_size=0, max_size=6),
    gaps=st.lists(st.integers(0, 3), min_size=6, max_size=6),
    chunk=st.integers(1, 5),
)
@settings(max_examples=150, deadline=None)
def test_every_chunk_stays_inside_its_episode_and_starts_at_its_row(
    lengths: list[int], gaps: list[int], chunk: int
) -> None:
    """Invariant: chunk k of row r holds the actions of steps min(r + k, episode end − 1), all in r's episode."""
    starts, position = [], 0
    for length, gap in zip(lengths, gaps, strict=False):
        position += gap
        starts.append(position)
        position += length
    step_num = position + 1
    actions = np.arange(step_num, dtype=np.float32)[:, None]
    chunks = build_action_chunks(np.array(starts), np.array(lengths), actions, chunk)
    expected_rows = [s + i for s, n in zip(starts, lengths, strict=True) for i in range(n)]
    assert chunks.rows.tolist() == expected_rows
    row = 0
    for s, n in zip(starts, lengths, strict=True):
        for i in range(n):
            want = [s + min(i + k, n - 1) for k in range(chunk)]
            assert chunks.actions[row].tolist() == want
            row += 1


@pytest.mark.parametrize(
    ("starts", "lengths", "field"),
    [
        ([0, 10], [4, 3], "EpisodeStarts[1]"),  # runs past S = 12
        ([-1], [2], "EpisodeStarts[0]"),
        ([0], [-2], "EpisodeLengths[0]"),
        ([0, 0], [12, 12], "EpisodeLengths"),  # more steps than the buffer holds
        ([0, 1], [2], "EpisodeLengths"),
        ([0, 2], [4, 4], "EpisodeStarts[1]"),  # overlaps episode 0
    ],
)
def test_bad_episodes_raise_replay_errors_at_the_boundary(
    starts: list[int], lengths: list[int], field: str
) -> None:
    with pytest.raises(ReplayError) as info:
        TrainingData.from_arrays(starts, lengths, np.zeros((S, 2), np.float32), ACTIONS, 2)
    assert info.value.field == field


@pytest.mark.parametrize("chunk", [0, -1, True, 1.0])
def test_bad_chunk_sizes(chunk: Any) -> None:
    with pytest.raises(ValueError):
        build_action_chunks(STARTS, LENGTHS, ACTIONS, chunk)


# --------------------------------------------------------------------------------------------------
# TrainingData


def test_training_data_pairs_each_chunk_with_its_observation_row() -> None:
    observations = (np.arange(S, dtype=np.float32) * 10)[:, None].repeat(3, axis=1)
    data = TrainingData.from_arrays(STARTS, LENGTHS, observations, ACTIONS, 2)
    assert data.row_num == 9 and data.observations.shape == (9, 3) and data.targets.shape == (9, 4)
    assert data.observations[:, 0].tolist() == [0, 10, 20, 30, 60, 70, 90, 100, 110]
    np.testing.assert_array_equal(data.step_actions, ACTIONS[[0, 1, 2, 3, 6, 7, 9, 10, 11]])
    assert data.action_width == 2 and data.chunk_size == 2


def test_training_data_from_a_replay_buffer_reads_stream_0() -> None:
    replay = ReplayBuffer(
        replay_buffer_id=3,
        episode_starts=STARTS,
        episode_lengths=LENGTHS,
        observations=(np.ones((S, 2), dtype=np.float32), np.zeros((S, 5), dtype=np.float32)),
        actions=(ACTIONS, np.zeros((S, 1), dtype=np.float32)),
    )
    data = TrainingData.from_replay(replay, 1)
    assert data.observations.shape == (9, 2) and data.targets.shape == (9, 2)


def test_non_finite_values_anywhere_in_the_recording_are_bad_data_naming_stream_row_and_column() -> None:
    observations = np.zeros((S, 2), dtype=np.float32)
    observations[5, 1] = np.nan  # step 5 is in no episode: the recording is broken all the same
    with pytest.raises(BadData, match=r"non-finite values: Observations\[0\] row 5 column 1 is nan$"):
        TrainingData.from_arrays(STARTS, LENGTHS, observations, ACTIONS, 1)
    actions = ACTIONS.copy()
    actions[10, 0] = -np.inf
    with pytest.raises(BadData, match=r"Actions\[0\] row 10 column 0 is -inf"):
        TrainingData.from_arrays(STARTS, LENGTHS, np.zeros((S, 2), np.float32), actions, 3)
    rewards = np.zeros((S, 1), dtype=np.float32)
    rewards[0, 0] = np.inf  # a stream flow matching does not read
    replay = ReplayBuffer(0, STARTS, LENGTHS, (observations * 0,), (ACTIONS,), rewards=(rewards,))
    with pytest.raises(BadData, match=r"Rewards\[0\] row 0 column 0 is inf"):
        TrainingData.from_replay(replay, 1)


def test_no_steps_at_all_is_bad_data() -> None:
    with pytest.raises(BadData, match="no episode"):
        TrainingData.from_arrays([0], [0], np.zeros((S, 2), np.float32), ACTIONS, 1)


def test_mismatched_step_counts_are_replay_errors() -> None:
    with pytest.raises(ReplayError):
        TrainingData.from_arrays(STARTS, LENGTHS, np.zeros((S - 1, 2), np.float32), ACTIONS, 1)


# --------------------------------------------------------------------------------------------------
# Statistics


def continuous(num: int, mode: str | None, index: int | None = None) -> dict[str, Any]:
    node: dict[str, Any] = {"Type": "Continuous", "VectorSize": num, "EncodedSize": num, "Num": num}
    if mode is not None:
        node["Normalization"] = mode
    if index is not None:
        node["Index"] = index
    return node


def obs_schema(obj: dict[str, Any]) -> SchemaNode:
    return parse_schema(obj, "observation")


def test_manual_is_identity() -> None:
    stats = leaf_statistics(np.array([[1.0, 50.0], [3.0, 70.0]]), obs_schema(continuous(2, "Manual")))
    assert stats.mean.tolist() == [0.0, 0.0] and stats.std.tolist() == [1.0, 1.0]


def test_unknown_or_missing_mode_is_identity() -> None:
    for mode in ("Fancy", None):
        stats = leaf_statistics(np.array([[1.0], [3.0]]), obs_schema(continuous(1, mode)))
        assert stats.mean.tolist() == [0.0] and stats.std.tolist() == [1.0]


def test_auto_shared_uses_one_mean_and_std_over_the_leaf() -> None:
    values = np.array([[1.0, 3.0], [3.0, 5.0]])
    stats = leaf_statistics(values, obs_schema(continuous(2, "AutoShared")))
    assert stats.mean.tolist() == [3.0, 3.0]
    np.testing.assert_allclose(stats.std, [np.sqrt(2.0)] * 2, rtol=1e-12)


def test_auto_per_dimension() -> None:
    values = np.array([[1.0, 3.0], [3.0, 5.0], [2.0, 10.0]])
    stats = leaf_statistics(values, obs_schema(continuous(2, "AutoPerDimension")))
    np.testing.assert_allclose(stats.mean, [2.0, 6.0], rtol=1e-12)
    np.testing.assert_allclose(stats.std, values.std(axis=0), rtol=1e-12)


def test_auto_dimension_average_averages_the_per_dimension_stds() -> None:
    values = np.array([[0.0, 0.0], [2.0, 6.0]])  # per-dim std 1 and 3
    stats = leaf_statistics(values, obs_schema(continuous(2, "AutoDimensionAverage")))
    assert stats.mean.tolist() == [1.0, 3.0]
    assert stats.std.tolist() == [2.0, 2.0]


def test_constant_features_get_std_one() -> None:
    values = np.array([[5.0, 1.0, 7.0], [5.0, 2.0, 7.0 + 1e-8]])
    stats = leaf_statistics(values, obs_schema(continuous(3, "AutoPerDimension")))
    assert stats.std[0] == 1.0 and stats.std[2] == 1.0 and stats.std[1] == 0.5
    assert stats.mean[0] == 5.0  # the mean is still subtracted
    shared = leaf_statistics(np.full((4, 2), 3.0), obs_schema(continuous(2, "AutoShared")))
    assert shared.std.tolist() == [1.0, 1.0] and shared.mean.tolist() == [3.0, 3.0]
    assert MIN_STD == 1e-6


def test_array_elements_are_pooled_because_the_engine_shares_one_sub_layer() -> None:
    schema = obs_schema(
        {
            "Type": "Array",
            "VectorSize": 2,
            "EncodedSize": 2,
            "Num": 2,
            "Element": continuous(1, "AutoPerDimension"),
        }
    )
    values = np.array([[0.0, 10.0], [2.0, 12.0]])  # pooled: {0, 2, 10, 12}
    stats = leaf_statistics(values, schema)
    assert stats.mean.tolist() == [6.0, 6.0]
    np.testing.assert_allclose(stats.std, [np.sqrt(26.0)] * 2, rtol=1e-12)


def test_and_with_every_leaf_kind_and_large_offsets() -> None:
    schema = obs_schema(
        {
            "Type": "And",
            "VectorSize": 8,
            "EncodedSize": 8,
            "Elements": {
                # given out of Index order on purpose: the vector follows Index
                "b": {"Type": "DiscreteExclusive", "VectorSize": 2, "EncodedSize": 2, "Num": 2, "Index": 1},
                "a": continuous(1, "AutoShared", 0),
                "c": {
                    "Type": "Array",
                    "VectorSize": 4,
                    "EncodedSize": 4,
                    "Num": 2,
                    "Element": continuous(2, "AutoPerDimension"),
                    "Index": 2,
                },
                "d": continuous(1, "Manual", 3),
            },
        }
    )
    rng = np.random.default_rng(0)
    values = 100.0 + 50.0 * rng.standard_normal((500, 8))
    stats = leaf_statistics(values, schema)
    np.testing.assert_allclose(stats.mean[0], values[:, 0].mean(), rtol=1e-12)
    assert stats.mean[1:3].tolist() == [0.0, 0.0] and stats.std[1:3].tolist() == [1.0, 1.0]
    pooled = np.concatenate([values[:, 3:5], values[:, 5:7]])
    np.testing.assert_allclose(stats.mean[3:5], pooled.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(stats.mean[5:7], pooled.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(stats.std[3:7], np.tile(pooled.std(axis=0), 2), rtol=1e-10)
    assert stats.mean[7] == 0.0 and stats.std[7] == 1.0


def test_statistics_of_float32_data_with_a_large_offset_are_accurate() -> None:
    # float64 two-pass accumulation: E[x²] − E[x]² would lose the variance of 1e6 + N(0, 1).
    rng = np.random.default_rng(1)
    values = (1e6 + rng.standard_normal((20000, 1))).astype(np.float32)
    stats = leaf_statistics(values, obs_schema(continuous(1, "AutoPerDimension")))
    np.testing.assert_allclose(stats.std, values.astype(np.float64).std(axis=0), rtol=1e-9)


def test_width_mismatch_is_bad_data() -> None:
    with pytest.raises(BadData):
        leaf_statistics(np.zeros((3, 2)), obs_schema(continuous(3, "AutoShared")))


# --------------------------------------------------------------------------------------------------
# Tensors


def test_decoder_inputs_invert_the_decoder_affine_map() -> None:
    targets = np.array([[1.0, 5.0, 9.0]], dtype=np.float32)
    x1 = decoder_inputs(targets, [2.0, 1.0, 0.0], [1.0, -1.0, 9.0])
    assert x1.tolist() == [[0.0, 6.0, 0.0]]  # scale 0 → x1 = 0 (the decoder outputs a constant there)
    assert x1.dtype == np.float32
    with pytest.raises(ValueError):
        decoder_inputs(targets, [1.0], [0.0])


def test_tensor_data_build_and_batch_validation() -> None:
    observations = np.arange(S * 2, dtype=np.float32).reshape(S, 2)
    data = TrainingData.from_arrays(STARTS, LENGTHS, observations, ACTIONS, 1)
    tensors = TensorData.build(data, [2.0, 2.0], [0.0, 100.0], "cpu")
    assert tensors.row_num == 9
    torch.testing.assert_close(tensors.x1[:, 0], torch.from_numpy(data.targets[:, 0] / 2.0))
    torch.testing.assert_close(tensors.x1[:, 1], torch.from_numpy((data.targets[:, 1] - 100) / 2.0))
    assert torch.equal(tensors.obs, torch.from_numpy(data.observations))
    batch = Batch(obs=torch.zeros(4, 2), x1=torch.zeros(4, 3))
    assert batch.size == 4
    for obs, x1 in [
        (torch.zeros(4, 2), torch.zeros(3, 3)),
        (torch.zeros(4), torch.zeros(4, 3)),
        (torch.zeros(4, 2, dtype=torch.int64), torch.zeros(4, 3)),
    ]:
        with pytest.raises(ValueError):
            Batch(obs=obs, x1=x1)
