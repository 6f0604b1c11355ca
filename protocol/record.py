"""``.record`` files: a Learning Agents recording exported to disk (spec §5.2), and its replay buffer (§5.3).

Layout (all little-endian int32 / float32)::

    int32 magic 0x06b5fb26, int32 version 1, int32 RecordNum
    per record:
        int32 StepNum, ObservationDimNum, ActionDimNum, ObservationCompatibilityHash, ActionCompatibilityHash
        observations: int32 dim count (= 2), int32 StepNum, int32 ObservationDimNum, float32 [StepNum × ObsDim]
        actions:      int32 dim count (= 2), int32 StepNum, int32 ActionDimNum,      float32 [StepNum × ActDim]

Every count is bounded by the bytes that remain before anything is sliced, and each array's serialised
shape must equal the record header's. Trailing bytes after the last record are rejected: the format has
no padding, so they mean a truncated write or a different file. The engine builds one replay-buffer
episode per record (§5.3); :func:`records_to_replay_buffer` does the same.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from protocol.errors import RecordError
from protocol.ints import INT32_MAX, INT32_MIN
from protocol.replay import ReplayBuffer

__all__ = [
    "RECORD_MAGIC",
    "RECORD_VERSION",
    "Record",
    "read_records",
    "records_to_replay_buffer",
    "write_records",
]

RECORD_MAGIC = 0x06B5FB26
RECORD_VERSION = 1

_FILE_HEADER = struct.Struct("<iii")  # magic, version, RecordNum
_RECORD_HEADER = struct.Struct("<iiiii")  # StepNum, ObsDim, ActDim, ObsHash, ActHash
_ARRAY_HEADER = struct.Struct("<iii")  # dim count, rows, columns (LearningArray SerializeToBytes, §5.2)
_ARRAY_DIMS = 2
_MIN_RECORD_BYTES = _RECORD_HEADER.size + 2 * _ARRAY_HEADER.size
"""A record with zero steps still takes 44 bytes: the bound on RecordNum from the remaining bytes."""

_F32 = np.dtype("<f4")


@dataclass(frozen=True, eq=False)
class Record:
    """One recorded episode. ``observations``: float32 (step_num, observation_dim_num); ``actions``:
    float32 (step_num, action_dim_num). Hashes are the engine's signed int32 values, kept as read."""

    step_num: int
    observation_dim_num: int
    action_dim_num: int
    observation_compatibility_hash: int
    action_compatibility_hash: int
    observations: NDArray[np.float32]
    actions: NDArray[np.float32]

    def __post_init__(self) -> None:
        for name in ("step_num", "observation_dim_num", "action_dim_num"):
            _check_int(name, getattr(self, name), 0)
        for name in ("observation_compatibility_hash", "action_compatibility_hash"):
            _check_int(name, getattr(self, name), INT32_MIN)
        for name, arr, cols in (
            ("observations", self.observations, self.observation_dim_num),
            ("actions", self.actions, self.action_dim_num),
        ):
            if not isinstance(arr, np.ndarray) or arr.dtype != _F32:
                raise RecordError(
                    f"Record.{name} must be a float32 array", field=name, actual=getattr(arr, "dtype", arr)
                )
            if arr.shape != (self.step_num, cols):
                raise RecordError(
                    f"Record.{name} has shape {arr.shape} but the header says {(self.step_num, cols)}",
                    field=name,
                    expected=(self.step_num, cols),
                    actual=arr.shape,
                )


def _check_int(name: str, value: object, lo: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= INT32_MAX:
        raise RecordError(
            f"Record.{name} must be an int32 >= {lo}",
            field=name,
            expected=f"{lo}..{INT32_MAX}",
            actual=value,
        )


def read_records(buf: bytes | bytearray | memoryview) -> tuple[Record, ...]:
    """Decode a ``.record`` file. Arrays are zero-copy (read-only for ``bytes``) views into ``buf``."""
    try:
        mv = memoryview(buf)
        if mv.ndim != 1 or mv.format not in ("B", "b", "c"):
            mv = mv.cast("B")
    except TypeError as exc:  # not a C-contiguous buffer
        raise RecordError(f"cannot read the buffer as bytes: {exc}", field="buffer") from None
    size = mv.nbytes
    if size < _FILE_HEADER.size:
        raise RecordError(
            f"record file holds {size} bytes, less than its {_FILE_HEADER.size}-byte header",
            field="header",
            expected=_FILE_HEADER.size,
            actual=size,
        )
    magic, version, record_num = _FILE_HEADER.unpack_from(mv, 0)
    if magic != RECORD_MAGIC:
        raise RecordError(
            "not a .record file (bad magic)", field="magic", expected=hex(RECORD_MAGIC), actual=hex(magic)
        )
    if version != RECORD_VERSION:
        raise RecordError(
            "unsupported .record version", field="version", expected=RECORD_VERSION, actual=version
        )
    offset = _FILE_HEADER.size
    if record_num < 0 or record_num > (size - offset) // _MIN_RECORD_BYTES:
        raise RecordError(
            f"RecordNum is {record_num} but {size - offset} bytes hold at most "
            f"{(size - offset) // _MIN_RECORD_BYTES} records",
            field="RecordNum",
            expected=f"0..{(size - offset) // _MIN_RECORD_BYTES}",
            actual=record_num,
        )
    records = []
    for r in range(record_num):
        where = f"records[{r}]"
        _need(size, offset, _RECORD_HEADER.size, f"{where} header")
        step_num, obs_dim, act_dim, obs_hash, act_hash = _RECORD_HEADER.unpack_from(mv, offset)
        offset += _RECORD_HEADER.size
        for name, value in (("StepNum", step_num), ("ObservationDimNum", obs_dim), ("ActionDimNum", act_dim)):
            if value < 0:
                raise RecordError(
                    f"{where}.{name} is {value}", field=f"{where}.{name}", expected=">= 0", actual=value
                )
        observations, offset = _read_array(mv, offset, size, step_num, obs_dim, f"{where}.observations")
        actions, offset = _read_array(mv, offset, size, step_num, act_dim, f"{where}.actions")
        records.append(Record(step_num, obs_dim, act_dim, obs_hash, act_hash, observations, actions))
    if offset != size:
        raise RecordError(
            f"record file has {size - offset} bytes after its last record",
            field="trailing bytes",
            expected=0,
            actual=size - offset,
        )
    return tuple(records)


def _need(size: int, offset: int, count: int, what: str) -> None:
    if size - offset < count:
        raise RecordError(
            f"record file ends inside {what}: {count} bytes needed at offset {offset}, {size - offset} left",
            field=what,
            expected=count,
            actual=size - offset,
        )


def _read_array(
    mv: memoryview, offset: int, size: int, rows: int, cols: int, where: str
) -> tuple[NDArray[np.float32], int]:
    _need(size, offset, _ARRAY_HEADER.size, f"{where} shape")
    ndim, got_rows, got_cols = _ARRAY_HEADER.unpack_from(mv, offset)
    offset += _ARRAY_HEADER.size
    if ndim != _ARRAY_DIMS:
        raise RecordError(f"{where} has {ndim} dimensions", field=where, expected=_ARRAY_DIMS, actual=ndim)
    if (got_rows, got_cols) != (rows, cols):
        raise RecordError(
            f"{where} has shape {(got_rows, got_cols)} but the record header says {(rows, cols)}",
            field=where,
            expected=(rows, cols),
            actual=(got_rows, got_cols),
        )
    nbytes = rows * cols * _F32.itemsize  # Python ints: no overflow, compared before any slicing
    _need(size, offset, nbytes, f"{where} data")
    arr = np.frombuffer(mv, dtype=_F32, count=rows * cols, offset=offset).reshape(rows, cols)
    return arr, offset + nbytes


def write_records(records: Sequence[Record]) -> bytes:
    """Encode records as a ``.record`` file (inverse of :func:`read_records`)."""
    if len(records) > INT32_MAX:
        raise RecordError("too many records for an int32 RecordNum", field="RecordNum", actual=len(records))
    parts = [_FILE_HEADER.pack(RECORD_MAGIC, RECORD_VERSION, len(records))]
    for rec in records:
        parts.append(
            _RECORD_HEADER.pack(
                rec.step_num,
                rec.observation_dim_num,
                rec.action_dim_num,
                rec.observation_compatibility_hash,
                rec.action_compatibility_hash,
            )
        )
        for arr in (rec.observations, rec.actions):
            parts.append(_ARRAY_HEADER.pack(_ARRAY_DIMS, *arr.shape))
            parts.append(np.ascontiguousarray(arr, dtype=_F32).tobytes())
    return b"".join(parts)


def records_to_replay_buffer(records: Sequence[Record], replay_buffer_id: int = 0) -> ReplayBuffer:
    """One episode per record, in order, as the engine builds it (§5.3): EpisodeStarts[k] = the sum of the
    earlier StepNums, EpisodeLengths[k] = StepNum; one observation and one action stream.

    All records must share the observation and action widths. Compatibility hashes are not compared:
    the engine matches records to the current schema by a subset test we cannot reproduce (§5.3, §8),
    so equal widths are the check available here.
    """
    if not records:
        raise RecordError(
            "a replay buffer needs at least one record", field="records", expected=">= 1", actual=0
        )
    obs_dim, act_dim = records[0].observation_dim_num, records[0].action_dim_num
    for k, rec in enumerate(records):
        if (rec.observation_dim_num, rec.action_dim_num) != (obs_dim, act_dim):
            raise RecordError(
                f"records[{k}] has widths ({rec.observation_dim_num}, {rec.action_dim_num}) but records[0] has "
                f"({obs_dim}, {act_dim})",
                field=f"records[{k}]",
                expected=(obs_dim, act_dim),
                actual=(rec.observation_dim_num, rec.action_dim_num),
            )
    lengths = np.array([rec.step_num for rec in records], dtype=np.int64)
    total = int(lengths.sum())
    if total > INT32_MAX or len(records) > INT32_MAX:
        raise RecordError(
            f"the records hold {total} steps, more than an int32 StepNum",
            field="StepNum",
            expected=f"<= {INT32_MAX}",
            actual=total,
        )
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int32)
    return ReplayBuffer(
        replay_buffer_id=replay_buffer_id,
        episode_starts=starts,
        episode_lengths=lengths.astype(np.int32),
        observations=(
            np.concatenate([rec.observations for rec in records], axis=0).astype(_F32, copy=False),
        ),
        actions=(np.concatenate([rec.actions for rec in records], axis=0).astype(_F32, copy=False),),
    )
