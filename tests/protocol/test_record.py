"""``.record`` files (spec §5.2) and the replay buffer built from records (§5.3)."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from protocol.errors import ProtocolError, RecordError
from protocol.record import RECORD_MAGIC, Record, read_records, records_to_replay_buffer, write_records
from protocol.replay import ReplayLayout

INT32_MAX = 2**31 - 1


def f32(rows: list[list[float]], cols: int | None = None) -> np.ndarray:
    arr = np.array(rows, dtype=np.float32)
    return arr.reshape(0, cols) if cols is not None and not rows else arr


RECORDS = (
    Record(2, 3, 1, 0x12345678, -5, f32([[1, 2, 3], [4, 5, 6]]), f32([[7], [8]])),
    Record(0, 3, 1, 0, 0, f32([], 3), f32([], 1)),  # an empty episode still carries both arrays
    Record(1, 3, 1, -1, 2**31 - 1, f32([[9, 10, 11]]), f32([[12]])),
)
GOLDEN = (
    struct.pack("<iii", 0x06B5FB26, 1, 3)  # magic, version, RecordNum
    + struct.pack("<5i", 2, 3, 1, 0x12345678, -5)  # StepNum, ObsDim, ActDim, ObsHash, ActHash
    + struct.pack("<3i", 2, 2, 3)  # observations: 2 dims, shape (2, 3)
    + struct.pack("<6f", 1, 2, 3, 4, 5, 6)
    + struct.pack("<3i", 2, 2, 1)  # actions: 2 dims, shape (2, 1)
    + struct.pack("<2f", 7, 8)
    + struct.pack("<5i", 0, 3, 1, 0, 0)
    + struct.pack("<3i", 2, 0, 3)
    + struct.pack("<3i", 2, 0, 1)
    + struct.pack("<5i", 1, 3, 1, -1, 2**31 - 1)
    + struct.pack("<3i", 2, 1, 3)
    + struct.pack("<3f", 9, 10, 11)
    + struct.pack("<3i", 2, 1, 1)
    + struct.pack("<f", 12)
)


def assert_records_equal(a: tuple[Record, ...] | list[Record], b: tuple[Record, ...] | list[Record]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        header = ("step_num", "observation_dim_num", "action_dim_num")
        hashes = ("observation_compatibility_hash", "action_compatibility_hash")
        assert [getattr(x, n) for n in header + hashes] == [getattr(y, n) for n in header + hashes]
        np.testing.assert_array_equal(x.observations, y.observations, strict=True)
        np.testing.assert_array_equal(x.actions, y.actions, strict=True)


def test_magic_is_the_engines() -> None:
    assert RECORD_MAGIC == 0x06B5FB26


def test_write_golden() -> None:
    assert write_records(RECORDS) == GOLDEN


def test_read_golden() -> None:
    assert_records_equal(read_records(GOLDEN), RECORDS)


def test_read_is_zero_copy() -> None:
    buf = bytearray(GOLDEN)
    records = read_records(buf)
    buf[12 + 20 + 12 : 12 + 20 + 16] = struct.pack("<f", -1.0)
    assert records[0].observations[0, 0] == -1.0


def test_empty_file() -> None:
    data = struct.pack("<iii", RECORD_MAGIC, 1, 0)
    assert write_records([]) == data and read_records(data) == ()


def test_every_truncation_and_trailing_byte() -> None:
    for cut in range(len(GOLDEN)):
        with pytest.raises(RecordError):
            read_records(GOLDEN[:cut])
    with pytest.raises(RecordError) as info:
        read_records(GOLDEN + b"\0")
    assert info.value.actual == 1


def _patched(offset: int, fmt: str, value: int) -> bytes:
    buf = bytearray(GOLDEN)
    struct.pack_into(fmt, buf, offset, value)
    return bytes(buf)


@pytest.mark.parametrize(
    ("offset", "value", "field"),
    [
        (0, 0x06B5FB27, "magic"),
        (4, 2, "version"),
        (8, -1, "RecordNum"),
        (8, INT32_MAX, "RecordNum"),
        (8, 5, "RecordNum"),  # 5 records of at least 44 bytes cannot fit in the 180 left
        (8, 4, "records[3] header"),  # 4 could, by size alone; the file ends inside the 4th
        (12, -1, "records[0].StepNum"),
        (16, -3, "records[0].ObservationDimNum"),
        (32, 3, "records[0].observations"),  # dim count must be 2
        (36, 1, "records[0].observations"),  # rows disagree with StepNum
        (40, 4, "records[0].observations"),  # columns disagree with ObservationDimNum
    ],
)
def test_header_errors(offset: int, value: int, field: str) -> None:
    with pytest.raises(RecordError) as info:
        read_records(_patched(offset, "<i", value))
    assert info.value.field == field


@pytest.mark.parametrize("steps", [INT32_MAX, 2**20])
def test_huge_counts_are_refused_before_allocating(steps: int) -> None:
    data = (
        struct.pack("<iii", RECORD_MAGIC, 1, 1)
        + struct.pack("<5i", steps, INT32_MAX, 1, 0, 0)
        + struct.pack("<3i", 2, steps, INT32_MAX)
        + bytes(64)
    )
    with pytest.raises(RecordError) as info:
        read_records(data)
    assert info.value.field == "records[0].observations data"
    assert info.value.expected == steps * INT32_MAX * 4


def test_non_contiguous_buffer_is_a_record_error() -> None:
    with pytest.raises(RecordError):
        read_records(np.zeros((4, 4), np.uint8).T.data)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"observations": f32([[1, 2, 3]])},  # 1 row, StepNum 2
        {"actions": np.zeros((2, 1), np.float64)},
        {"step_num": -1},
        {"observation_compatibility_hash": 2**31},
        {"action_dim_num": True},
    ],
)
def test_record_values_are_validated(kwargs: dict[str, Any]) -> None:
    fields: dict[str, Any] = {
        "step_num": 2,
        "observation_dim_num": 3,
        "action_dim_num": 1,
        "observation_compatibility_hash": 0,
        "action_compatibility_hash": 0,
        "observations": f32([[1, 2, 3], [4, 5, 6]]),
        "actions": f32([[7], [8]]),
    }
    fields.update(kwargs)
    with pytest.raises(RecordError):
        Record(**fields)


# --------------------------------------------------------------------------------------------------
# Records → replay buffer (§5.3)


def test_records_to_replay_buffer() -> None:
    rb = records_to_replay_buffer(RECORDS, replay_buffer_id=0)
    assert rb.episode_starts.tolist() == [0, 2, 2] and rb.episode_lengths.tolist() == [2, 0, 1]
    assert rb.episode_starts.dtype == np.int32 and rb.observations[0].dtype == np.float32
    np.testing.assert_array_equal(rb.observations[0], f32([[1, 2, 3], [4, 5, 6], [9, 10, 11]]))
    np.testing.assert_array_equal(rb.actions[0], f32([[7], [8], [12]]))
    # The engine sizes the buffer to the recording (MaxEpisodeNum = E, MaxStepNum = S): it is always full.
    layout = ReplayLayout(0, rb.episode_num, rb.step_num, observation_dims=(3,), action_dims=(1,))
    assert layout.encode_file(rb)[:12] == struct.pack("<iii", 0, 3, 3)


def test_records_must_share_widths() -> None:
    other = Record(1, 2, 1, 0, 0, f32([[1, 2]]), f32([[3]]))
    with pytest.raises(RecordError) as info:
        records_to_replay_buffer([*RECORDS, other])
    assert info.value.field == "records[3]"


def test_no_records_is_an_error() -> None:
    with pytest.raises(RecordError):
        records_to_replay_buffer([])


# --------------------------------------------------------------------------------------------------
# Fuzz


@settings(max_examples=300, deadline=None)
@given(
    data=st.binary(max_size=100)
    | st.tuples(st.integers(0, len(GOLDEN)), st.binary(max_size=8)).map(lambda t: GOLDEN[: t[0]] + t[1])
)
def test_fuzz_read_records(data: bytes) -> None:
    """Any bytes either decode as records or raise RecordError; nothing else escapes."""
    try:
        records = read_records(data)
    except ProtocolError as exc:
        assert isinstance(exc, RecordError)
        return
    assert write_records(records) == data


@st.composite
def _records(draw: st.DrawFn) -> list[Record]:
    obs_dim, act_dim = draw(st.integers(0, 3)), draw(st.integers(0, 2))
    out = []
    for _ in range(draw(st.integers(0, 3))):
        steps = draw(st.integers(0, 3))
        hashes = draw(st.tuples(st.integers(-(2**31), INT32_MAX), st.integers(-(2**31), INT32_MAX)))
        obs = draw(hnp.arrays(np.float32, (steps, obs_dim)))
        act = draw(hnp.arrays(np.float32, (steps, act_dim)))
        out.append(Record(steps, obs_dim, act_dim, *hashes, obs, act))
    return out


@settings(max_examples=150, deadline=None)
@given(records=_records())
def test_round_trip(records: list[Record]) -> None:
    """read(write(records)) returns the same headers and the same bits."""
    data = write_records(records)
    again = read_records(data)
    assert len(again) == len(records)
    for x, y in zip(again, records, strict=True):
        assert x.observations.tobytes() == y.observations.tobytes()
        assert x.actions.tobytes() == y.actions.tobytes()
        assert (x.step_num, x.observation_compatibility_hash) == (
            y.step_num,
            y.observation_compatibility_hash,
        )
    if records:
        rb = records_to_replay_buffer(records)
        assert rb.step_num == sum(r.step_num for r in records)
