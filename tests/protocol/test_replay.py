"""Replay buffers (spec §2.2, §3 SendExperience, §5.5): golden bytes both ways, limits, regions, checks."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from protocol.config import ReplayBufferConfig, StreamConfig
from protocol.errors import ProtocolError, ReplayError
from protocol.replay import (
    SOCKET_HEADER_SIZE,
    RegionSpec,
    ReplayBuffer,
    ReplayLayout,
    check_finite,
    validate_episodes,
    zero_length_episodes,
)
from tests.support.replay import (
    FM_BUFFER,
    FM_LAYOUT,
    FULL_BUFFER,
    FULL_LAYOUT,
    assert_same,
    f32,
    fill_regions,
    i32,
)

INT32_MAX = 2**31 - 1


# --------------------------------------------------------------------------------------------------
# Golden table: (layout, buffer, NetworksVersion, exact SendExperience bytes after the signal byte)

FM_BYTES = (
    struct.pack("<iiii", -1, 0, 2, 3)  # NetworksVersion starts at -1 (§3), id 0, E 2, S 3
    + struct.pack("<2i", 0, 2)  # EpisodeStarts
    + struct.pack("<2i", 2, 1)  # EpisodeLengths
    + struct.pack("<6f", 1, 2, 3, 4, 5, 6)  # Observations[0] (S × 2)
    + struct.pack("<3f", 0.5, -1, 2)  # Actions[0] (S × 1)
)

FULL_BYTES = (
    struct.pack("<iiii", 41, 7, 1, 2)
    + struct.pack("<i", 0)  # starts
    + struct.pack("<i", 2)  # lengths
    + struct.pack("<B", 2)  # completion modes (uint8, only with HasCompletions)
    + struct.pack("<2f", 7, 8)  # final observations [E × 2]
    + struct.pack("<f", 9)  # final memory states [E × 1]
    + struct.pack("<4f", 1, 2, 3, 4)  # observations
    + struct.pack("<2f", 5, 6)  # actions
    + struct.pack("<6f", 10, 11, 12, 13, 14, 15)  # action modifiers
    + struct.pack("<2f", 16, 17)  # memory states
    + struct.pack("<2f", 18, 19)  # rewards
)

GOLDEN = [
    pytest.param(FM_LAYOUT, FM_BUFFER, -1, FM_BYTES, id="flow-matching"),
    pytest.param(FULL_LAYOUT, FULL_BUFFER, 41, FULL_BYTES, id="all-optional-sections"),
]


@pytest.mark.parametrize(("layout", "rb", "version", "golden"), GOLDEN)
def test_socket_encode_golden(layout: ReplayLayout, rb: ReplayBuffer, version: int, golden: bytes) -> None:
    parts = layout.encode_socket_parts(rb, version)
    assert b"".join(parts) == golden
    assert layout.encode_socket(rb, version) == golden
    assert len(parts[0]) == SOCKET_HEADER_SIZE


@pytest.mark.parametrize(("layout", "rb", "version", "golden"), GOLDEN)
def test_socket_decode_golden(layout: ReplayLayout, rb: ReplayBuffer, version: int, golden: bytes) -> None:
    v, rb_id, e, s = struct.unpack_from("<iiii", golden)
    assert v == version
    body = golden[SOCKET_HEADER_SIZE:]
    assert layout.socket_body_size(e, s) == len(body)
    assert_same(layout.decode_socket_body(body, e, s, rb_id), rb)


def test_socket_parts_do_not_copy_the_arrays() -> None:
    parts = FM_LAYOUT.encode_socket_parts(FM_BUFFER, 3)
    assert all(isinstance(p, memoryview) for p in parts[1:])
    assert np.shares_memory(np.frombuffer(parts[3], dtype=np.float32), FM_BUFFER.observations[0])


def test_socket_decode_is_zero_copy() -> None:
    body = bytearray(FM_BYTES[SOCKET_HEADER_SIZE:])
    rb = FM_LAYOUT.decode_socket_body(body, 2, 3, 0)
    body[16:20] = struct.pack("<f", 42.0)  # first observation float
    assert rb.observations[0][0, 0] == 42.0


def test_socket_body_must_be_exact() -> None:
    body = FM_BYTES[SOCKET_HEADER_SIZE:]
    for cut in range(len(body)):
        with pytest.raises(ReplayError):
            FM_LAYOUT.decode_socket_body(body[:cut], 2, 3, 0)
    with pytest.raises(ReplayError) as info:
        FM_LAYOUT.decode_socket_body(body + b"\0", 2, 3, 0)
    assert (info.value.expected, info.value.actual) == (len(body), len(body) + 1)


def test_socket_decode_checks_the_replay_buffer_id() -> None:
    with pytest.raises(ReplayError) as info:
        FM_LAYOUT.decode_socket_body(FM_BYTES[SOCKET_HEADER_SIZE:], 2, 3, 1)
    assert info.value.field == "ReplayBufferId"


def test_socket_decode_validates_episodes() -> None:
    body = bytearray(FM_BYTES[SOCKET_HEADER_SIZE:])
    body[4:8] = struct.pack("<i", 1)  # episode 1 starts at 1: overlaps episode 0 (0..1)
    with pytest.raises(ReplayError, match=r"episode 1 .* overlaps episode 0"):
        FM_LAYOUT.decode_socket_body(body, 2, 3, 0)


# --------------------------------------------------------------------------------------------------
# Limits: E and S are bounded before any size is computed


@pytest.mark.parametrize(
    ("e", "s", "ok"),
    [
        (3, 5, True),
        (0, 0, True),
        (4, 5, False),
        (3, 6, False),
        (-1, 0, False),
        (0, -1, False),
        (INT32_MAX, 0, False),
        (0, INT32_MAX, False),
        (-(2**31), 0, False),
        (True, 0, False),
        (1.0, 0, False),
    ],
)
def test_counts_limits(e: Any, s: Any, ok: bool) -> None:
    if ok:
        assert FM_LAYOUT.socket_body_size(e, s) == 8 * e + 12 * s
    else:
        with pytest.raises(ReplayError) as info:
            FM_LAYOUT.socket_body_size(e, s)
        assert info.value.field in ("EpisodeNum", "StepNum")
        with pytest.raises(ReplayError):
            FM_LAYOUT.decode_socket_body(b"", e, s, 0)


def test_sizes_use_python_ints() -> None:
    big = ReplayLayout(0, INT32_MAX, INT32_MAX, observation_dims=(INT32_MAX,), action_dims=(INT32_MAX,))
    assert big.socket_body_size(INT32_MAX, INT32_MAX) == 8 * INT32_MAX + 2 * 4 * INT32_MAX * INT32_MAX
    region = big.regions()[2]
    assert region.nbytes == 4 * INT32_MAX * INT32_MAX > 2**63


def test_file_header_counts_are_bounded_before_allocating() -> None:
    with pytest.raises(ReplayError) as info:
        FM_LAYOUT.decode_file(struct.pack("<iii", 0, INT32_MAX, INT32_MAX))
    assert info.value.field == "EpisodeNum"


# --------------------------------------------------------------------------------------------------
# Exported replaybuffer_<id>.bin (§5.5)

FILE_BYTES = (
    struct.pack("<iii", 0, 2, 3)
    + struct.pack("<2i", 0, 2)
    + struct.pack("<2i", 2, 1)
    + struct.pack("<6f", 1, 2, 3, 4, 5, 6)
    + struct.pack("<3f", 0.5, -1, 2)
)


def test_file_golden_both_ways() -> None:
    assert FM_LAYOUT.encode_file(FM_BUFFER) == FILE_BYTES
    assert_same(FM_LAYOUT.decode_file(FILE_BYTES), FM_BUFFER)


def test_file_leaves_out_the_optional_sections() -> None:
    data = FULL_LAYOUT.encode_file(FULL_BUFFER)
    assert data == (
        struct.pack("<iii", 7, 1, 2)
        + struct.pack("<ii", 0, 2)
        + struct.pack("<4f", 1, 2, 3, 4)
        + struct.pack("<2f", 5, 6)
    )
    rb = FULL_LAYOUT.decode_file(data)
    assert rb.completion_modes is None and rb.rewards == () and rb.final_observations == ()
    np.testing.assert_array_equal(rb.actions[0], FULL_BUFFER.actions[0])


def test_file_every_truncation_and_trailing_byte() -> None:
    for cut in range(len(FILE_BYTES)):
        with pytest.raises(ReplayError):
            FM_LAYOUT.decode_file(FILE_BYTES[:cut])
    with pytest.raises(ReplayError):
        FM_LAYOUT.decode_file(FILE_BYTES + b"\0")


def test_file_checks_the_replay_buffer_id() -> None:
    with pytest.raises(ReplayError) as info:
        FM_LAYOUT.decode_file(struct.pack("<iii", 5, 0, 0))
    assert (info.value.expected, info.value.actual) == (0, 5)


# --------------------------------------------------------------------------------------------------
# Shared-memory regions (§2.2)


def test_regions_names_order_and_shapes() -> None:
    assert FULL_LAYOUT.regions() == [
        RegionSpec("EpisodeStarts", np.dtype("<i4"), (2,)),
        RegionSpec("EpisodeLengths", np.dtype("<i4"), (2,)),
        RegionSpec("EpisodeCompletionModes", np.dtype("u1"), (2,)),
        RegionSpec("EpisodeFinalObservations[0]", np.dtype("<f4"), (2, 2)),
        RegionSpec("EpisodeFinalMemoryStates[0]", np.dtype("<f4"), (2, 1)),
        RegionSpec("Observations[0]", np.dtype("<f4"), (2, 2)),
        RegionSpec("Actions[0]", np.dtype("<f4"), (2, 1)),
        RegionSpec("ActionModifiers[0]", np.dtype("<f4"), (2, 3)),
        RegionSpec("MemoryStates[0]", np.dtype("<f4"), (2, 1)),
        RegionSpec("Rewards[0]", np.dtype("<f4"), (2, 1)),
    ]


def test_zero_size_regions_are_omitted() -> None:
    layout = ReplayLayout(0, 0, 4, observation_dims=(2, 0), action_dims=(1,))
    assert [r.name for r in layout.regions()] == ["Observations[0]", "Actions[0]"]
    rb = layout.read_regions({"Observations[0]": bytes(32), "Actions[0]": bytes(16)}, 0, 4, 0)
    assert rb.observations[1].shape == (4, 0) and rb.episode_starts.shape == (0,)


@pytest.mark.parametrize(("layout", "rb"), [(FM_LAYOUT, FM_BUFFER), (FULL_LAYOUT, FULL_BUFFER)])
def test_read_regions(layout: ReplayLayout, rb: ReplayBuffer) -> None:
    views = fill_regions(layout, rb)
    got = layout.read_regions(views, rb.episode_num, rb.step_num, rb.replay_buffer_id)
    assert_same(got, rb)
    views["Observations[0]"][0:4] = struct.pack("<f", -3.0)
    assert got.observations[0][0, 0] == -3.0  # zero-copy views


def test_read_regions_errors() -> None:
    views: dict[str, Any] = dict(fill_regions(FM_LAYOUT, FM_BUFFER))
    del views["Actions[0]"]
    with pytest.raises(ReplayError, match="region Actions\\[0\\] is missing"):
        FM_LAYOUT.read_regions(views, 2, 3, 0)
    views["Actions[0]"] = bytes(11)  # 3 rows × 1 float need 12 bytes
    with pytest.raises(ReplayError) as info:
        FM_LAYOUT.read_regions(views, 2, 3, 0)
    assert (info.value.expected, info.value.actual) == (12, 11)
    views["Actions[0]"] = np.zeros(3, dtype=np.float32).data  # a typed memoryview works too
    FM_LAYOUT.read_regions(views, 2, 3, 0)
    with pytest.raises(ReplayError):
        FM_LAYOUT.read_regions(views, 4, 3, 0)
    with pytest.raises(ReplayError):
        FM_LAYOUT.read_regions(views, 2, 3, 1)


def test_region_bytes_are_the_rows_read() -> None:
    # FM: E=2 starts/lengths (int32), S=3 rows of 2 and 1 floats.
    assert FM_LAYOUT.region_bytes(2, 3) == {
        "EpisodeStarts": 8,
        "EpisodeLengths": 8,
        "Observations[0]": 24,
        "Actions[0]": 12,
    }
    full = FULL_LAYOUT.region_bytes(1, 2)
    assert [name for name in full] == [r.name for r in FULL_LAYOUT.regions()]
    assert full["EpisodeCompletionModes"] == 1 and full["ActionModifiers[0]"] == 24
    assert FM_LAYOUT.region_bytes(0, 0) == dict.fromkeys(full.keys() & FM_LAYOUT.region_bytes(0, 0), 0)
    # Zero-size regions are not allocated, so they have no entry (§2.2).
    assert ReplayLayout(0, 0, 4, observation_dims=(2, 0), action_dims=(1,)).region_bytes(0, 4) == {
        "Observations[0]": 32,
        "Actions[0]": 16,
    }
    for e, s in ((4, 3), (2, 6), (-1, 3), (2, -1)):  # max+1 and negative counts
        with pytest.raises(ReplayError):
            FM_LAYOUT.region_bytes(e, s)


def test_layout_from_config() -> None:
    cfg = ReplayBufferConfig(
        id=0,
        max_episode_num=3,
        max_step_num=5,
        has_completions=False,
        has_final_observations=False,
        has_final_memory_states=False,
        observations=(StreamConfig(0, "Observations", 0, 2),),
        actions=(StreamConfig(0, "Actions", 0, 1),),
    )
    assert ReplayLayout.from_config(cfg) == FM_LAYOUT


# --------------------------------------------------------------------------------------------------
# Encoding refuses buffers that do not fit the layout


def _with(**changes: Any) -> dict[str, Any]:
    fields = {
        "replay_buffer_id": 0,
        "episode_starts": FM_BUFFER.episode_starts,
        "episode_lengths": FM_BUFFER.episode_lengths,
        "observations": FM_BUFFER.observations,
        "actions": FM_BUFFER.actions,
    }
    fields.update(changes)
    return fields


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"replay_buffer_id": 1}, "ReplayBufferId"),
        ({"observations": (f32([[1, 2, 3]] * 3),)}, "Observations[0]"),
        ({"actions": ()}, "Actions[0]"),
        ({"rewards": (f32([[1]] * 3),)}, "rewards"),
        ({"completion_modes": np.zeros(2, np.uint8)}, "EpisodeCompletionModes"),
        (
            {
                "episode_starts": i32([0, 0, 0, 0]),
                "episode_lengths": i32([0, 0, 0, 0]),
            },
            "EpisodeNum",
        ),
    ],
)
def test_encode_rejects_mismatched_buffers(changes: dict[str, Any], field: str) -> None:
    rb = ReplayBuffer(**_with(**changes))
    with pytest.raises(ReplayError) as info:
        FM_LAYOUT.encode_socket_parts(rb, 0)
    assert info.value.field == field


def test_encode_checks_networks_version() -> None:
    with pytest.raises(ReplayError):
        FM_LAYOUT.encode_socket_parts(FM_BUFFER, 2**31)


@pytest.mark.parametrize(
    "changes",
    [
        {"episode_starts": np.array([0, 2], dtype=np.int64)},
        {"episode_lengths": i32([2])},
        {"observations": (f32([[1, 2]] * 4),)},
        {"actions": (np.zeros(3, np.float32),)},
        {"observations": [f32([[1, 2]] * 3)]},
        {"completion_modes": np.zeros(3, np.uint8)},
        {"final_observations": (f32([[1]]),)},
    ],
)
def test_replay_buffer_validates_shapes(changes: dict[str, Any]) -> None:
    with pytest.raises(ReplayError):
        ReplayBuffer(**_with(**changes))


# --------------------------------------------------------------------------------------------------
# validate_episodes, zero_length_episodes, check_finite


@pytest.mark.parametrize(
    ("starts", "lengths", "steps", "message"),
    [
        ([0, 2], [2, 1], 3, None),
        ([2, 0], [1, 2], 3, None),  # any order
        ([0, 1, 3], [3, 0, 0], 3, None),  # zero-length episodes overlap nothing, may sit at S
        ([], [], 0, None),
        ([-1], [1], 3, "EpisodeStarts[0] is -1"),
        ([0, 1], [1, -2], 3, "EpisodeLengths[1] is -2"),
        ([0, 2], [2, 2], 3, "episode 1 covers steps 2..3 but StepNum is 3"),
        ([0, 1], [2, 1], 3, "episode 1 (start 1, length 1) overlaps episode 0 (start 0, length 2)"),
        ([2, 0], [1, 3], 4, "episode 0 (start 2, length 1) overlaps episode 1 (start 0, length 3)"),
        ([INT32_MAX], [INT32_MAX], 3, "episode 0 covers steps"),
    ],
)
def test_validate_episodes(starts: list[int], lengths: list[int], steps: int, message: str | None) -> None:
    if message is None:
        validate_episodes(i32(starts), i32(lengths), steps)
    else:
        with pytest.raises(ReplayError) as info:
            validate_episodes(i32(starts), i32(lengths), steps)
        assert message in str(info.value)


def test_zero_length_episodes() -> None:
    assert zero_length_episodes(i32([3, 0, 1, 0])) == [1, 3]


def test_check_finite_names_stream_row_and_column() -> None:
    obs = f32([[1, 2], [3, 4], [5, 6]])
    obs[1, 1] = np.nan
    obs[2, 0] = np.inf
    act = f32([[0], [0], [-np.inf]])
    rb = ReplayBuffer(0, i32([0]), i32([3]), (obs,), (act,))
    assert check_finite(rb) == ["Observations[0] row 1 column 1 is nan", "Actions[0] row 2 column 0 is -inf"]
    assert check_finite(FM_BUFFER) == []


# --------------------------------------------------------------------------------------------------
# Fuzz


@settings(max_examples=300, deadline=None)
@given(
    data=st.binary(max_size=120),
    e=st.integers(-2, 5),
    s=st.integers(-2, 7),
    rb_id=st.integers(6, 8),
    layout=st.sampled_from([FM_LAYOUT, FULL_LAYOUT]),
)
def test_fuzz_decode_socket_body(data: bytes, e: int, s: int, rb_id: int, layout: ReplayLayout) -> None:
    """Any bytes and counts either decode into a valid buffer or raise ReplayError; nothing else escapes."""
    try:
        rb = layout.decode_socket_body(data, e, s, rb_id if layout is FULL_LAYOUT else 0)
    except ProtocolError as exc:
        assert isinstance(exc, ReplayError)
        return
    assert layout.encode_socket(rb, 0)[SOCKET_HEADER_SIZE:] == data


@settings(max_examples=300, deadline=None)
@given(
    data=st.binary(max_size=80)
    | st.integers(0, 3).map(lambda e: struct.pack("<iii", 0, e, 5) + bytes(8 * e + 60))
)
def test_fuzz_decode_file(data: bytes) -> None:
    """Any bytes either decode as a replay buffer file or raise ReplayError; nothing else escapes."""
    try:
        rb = FM_LAYOUT.decode_file(data)
    except ProtocolError as exc:
        assert isinstance(exc, ReplayError)
        return
    assert FM_LAYOUT.encode_file(rb) == data


@st.composite
def _buffers(draw: st.DrawFn) -> ReplayBuffer:
    lengths = draw(st.lists(st.integers(0, 2), max_size=3))
    starts = [sum(lengths[:k]) for k in range(len(lengths))]
    s = sum(lengths) + draw(st.integers(0, 2))
    floats = st.floats(width=32, allow_nan=False)

    def arr(rows: int, cols: int) -> np.ndarray:
        return draw(hnp.arrays(np.float32, (rows, cols), elements=floats))

    e = len(starts)
    return ReplayBuffer(
        7,
        i32(starts),
        i32(lengths),
        (arr(s, 2),),
        (arr(s, 1),),
        completion_modes=draw(hnp.arrays(np.uint8, (e,))),
        final_observations=(arr(e, 2),),
        final_memory_states=(arr(e, 1),),
        action_modifiers=(arr(s, 3),),
        memory_states=(arr(s, 1),),
        rewards=(arr(s, 1),),
    )


@settings(max_examples=150, deadline=None)
@given(rb=_buffers(), version=st.integers(-(2**31), INT32_MAX))
def test_round_trip_socket(rb: ReplayBuffer, version: int) -> None:
    """decode(encode(rb)) reproduces every array and the header carries the counts and version."""
    layout = ReplayLayout(7, 3, 8, True, True, True, (2,), (1,), (3,), (1,), (1,))
    data = layout.encode_socket(rb, version)
    assert struct.unpack_from("<iiii", data) == (version, 7, rb.episode_num, rb.step_num)
    assert_same(layout.decode_socket_body(data[16:], rb.episode_num, rb.step_num, 7), rb)


def test_non_contiguous_buffer_is_a_replay_error() -> None:
    with pytest.raises(ReplayError):
        FM_LAYOUT.decode_socket_body(np.zeros((4, 4), np.uint8).T.data, 0, 0, 0)
