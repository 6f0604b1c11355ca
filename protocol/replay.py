"""Replay buffers: the value, and its three byte layouts (spec §2.2, §3, §5.5).

A replay buffer holds ``E`` episodes over ``S`` steps: ``episode_starts``/``episode_lengths`` index rows
of the per-step float32 streams (observations, actions, ...). :class:`ReplayLayout`, built from the
data config's :class:`~protocol.config.ReplayBufferConfig`, knows every array's dtype and width and
turns bytes into a :class:`ReplayBuffer` and back for:

* shared memory (§2.2): one region per array, sized for MaxEpisodeNum / MaxStepNum rows; the engine
  fills the first E / S rows (:meth:`ReplayLayout.regions`, :meth:`ReplayLayout.read_regions`);
* the socket SendExperience payload (§3): a 16-byte int32 header (NetworksVersion, ReplayBufferId,
  EpisodeNum, StepNum) then the sections in a fixed order, optional ones only when the config flags them
  (:meth:`ReplayLayout.socket_body_size`, :meth:`ReplayLayout.decode_socket_body`,
  :meth:`ReplayLayout.encode_socket_parts`);
* the exported ``replaybuffer_<id>.bin`` (§5.5): int32 id, E, S, starts, lengths, observation streams,
  action streams (:meth:`ReplayLayout.decode_file`, :meth:`ReplayLayout.encode_file`).

Decoders return zero-copy numpy views of the first E / S rows (the caller copies once, if at all) and
validate episode starts/lengths. E and S are checked against MaxEpisodeNum / MaxStepNum before any size
is computed, and sizes are Python ints (no int32 overflow). All values are little-endian (§ preamble).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

import numpy as np
from numpy.typing import NDArray

from protocol.config import ReplayBufferConfig
from protocol.errors import ReplayError
from protocol.ints import INT32_MAX, INT32_MIN

__all__ = [
    "FILE_HEADER",
    "FILE_HEADER_SIZE",
    "SOCKET_HEADER",
    "SOCKET_HEADER_SIZE",
    "RegionSpec",
    "ReplayBuffer",
    "ReplayLayout",
    "check_finite",
    "validate_episodes",
    "zero_length_episodes",
]

F32: np.dtype[np.float32] = np.dtype("<f4")
I32: np.dtype[np.int32] = np.dtype("<i4")
U8: np.dtype[np.uint8] = np.dtype("u1")

FloatArray: TypeAlias = NDArray[np.float32]
IntArray: TypeAlias = NDArray[np.int32]

SOCKET_HEADER = struct.Struct("<iiii")
"""SendExperience header after the signal byte: NetworksVersion, ReplayBufferId, EpisodeNum, StepNum (§3)."""
SOCKET_HEADER_SIZE = SOCKET_HEADER.size

FILE_HEADER = struct.Struct("<iii")
"""``replaybuffer_<id>.bin`` header: ReplayBufferId, EpisodeNum, StepNum (§5.5)."""
FILE_HEADER_SIZE = FILE_HEADER.size


# --------------------------------------------------------------------------------------------------
# The value


@dataclass(frozen=True, eq=False)
class ReplayBuffer:
    """E episodes over S steps (shapes checked at construction; dtypes exactly as on the wire).

    ``episode_starts``/``episode_lengths``: int32 (E,). ``completion_modes``: uint8 (E,) or None.
    ``final_observations``/``final_memory_states``: float32 (E, Dim_k) per stream.
    ``observations``/``actions``/``action_modifiers``/``memory_states``/``rewards``: float32
    (S, Dim_k) per stream. The arrays may be read-only views into a received buffer.
    """

    replay_buffer_id: int
    episode_starts: IntArray
    episode_lengths: IntArray
    observations: tuple[FloatArray, ...]
    actions: tuple[FloatArray, ...]
    completion_modes: NDArray[np.uint8] | None = None
    final_observations: tuple[FloatArray, ...] = ()
    final_memory_states: tuple[FloatArray, ...] = ()
    action_modifiers: tuple[FloatArray, ...] = ()
    memory_states: tuple[FloatArray, ...] = ()
    rewards: tuple[FloatArray, ...] = ()

    def __post_init__(self) -> None:
        _check_array("EpisodeStarts", self.episode_starts, I32, 1)
        _check_array("EpisodeLengths", self.episode_lengths, I32, 1)
        e = self.episode_starts.shape[0]
        _check_rows("EpisodeLengths", self.episode_lengths, e, "EpisodeNum")
        if self.completion_modes is not None:
            _check_array("EpisodeCompletionModes", self.completion_modes, U8, 1)
            _check_rows("EpisodeCompletionModes", self.completion_modes, e, "EpisodeNum")
        for name, arrays in (
            ("EpisodeFinalObservations", self.final_observations),
            ("EpisodeFinalMemoryStates", self.final_memory_states),
        ):
            for k, arr in enumerate(_tuple(name, arrays)):
                _check_array(f"{name}[{k}]", arr, F32, 2)
                _check_rows(f"{name}[{k}]", arr, e, "EpisodeNum")
        s: int | None = None
        for name, arr in self._step_streams():
            _check_array(name, arr, F32, 2)
            if s is None:
                s = arr.shape[0]
            _check_rows(name, arr, s, "StepNum")

    def _step_streams(self) -> Iterator[tuple[str, FloatArray]]:
        for name, arrays in (
            ("Observations", self.observations),
            ("Actions", self.actions),
            ("ActionModifiers", self.action_modifiers),
            ("MemoryStates", self.memory_states),
            ("Rewards", self.rewards),
        ):
            for k, arr in enumerate(_tuple(name, arrays)):
                yield f"{name}[{k}]", arr

    def float_streams(self) -> Iterator[tuple[str, FloatArray]]:
        """Every float32 array as ``(name, array)``, names as in :meth:`ReplayLayout.regions`."""
        for k, arr in enumerate(self.final_observations):
            yield f"EpisodeFinalObservations[{k}]", arr
        for k, arr in enumerate(self.final_memory_states):
            yield f"EpisodeFinalMemoryStates[{k}]", arr
        yield from self._step_streams()

    @property
    def episode_num(self) -> int:
        return int(self.episode_starts.shape[0])

    @property
    def step_num(self) -> int:
        """S: rows of the per-step streams. [INF] A buffer with no per-step stream at all (never sent by
        the engine) reports the end of its last episode instead."""
        for _, arr in self._step_streams():
            return int(arr.shape[0])
        if self.episode_num == 0:
            return 0
        return int((self.episode_starts.astype(np.int64) + self.episode_lengths).max())


def _tuple(name: str, value: object) -> tuple[Any, ...]:
    if not isinstance(value, tuple):
        raise ReplayError(f"{name} must be a tuple of arrays", field=name, actual=type(value).__name__)
    return value


def _check_array(name: str, arr: object, dtype: np.dtype[Any], ndim: int) -> None:
    if not isinstance(arr, np.ndarray):
        raise ReplayError(f"{name} must be a numpy array", field=name, actual=type(arr).__name__)
    if arr.dtype != dtype:
        raise ReplayError(
            f"{name} has dtype {arr.dtype}", field=name, expected=str(dtype), actual=str(arr.dtype)
        )
    if arr.ndim != ndim:
        raise ReplayError(f"{name} has {arr.ndim} dimensions", field=name, expected=ndim, actual=arr.ndim)


def _check_rows(name: str, arr: NDArray[Any], rows: int, what: str) -> None:
    if arr.shape[0] != rows:
        raise ReplayError(
            f"{name} has {arr.shape[0]} rows but {what} is {rows}",
            field=name,
            expected=rows,
            actual=arr.shape[0],
        )


# --------------------------------------------------------------------------------------------------
# Layout


@dataclass(frozen=True, slots=True)
class RegionSpec:
    """One shared-memory region (§2.2): ``name`` matches the §2.6 GUID key (``"Observations[0]"`` ↔
    ``ObservationsGuids[0]``); ``shape`` is for the maximum counts."""

    name: str
    dtype: np.dtype[Any]
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = self.dtype.itemsize
        for d in self.shape:
            n *= d
        return n


_Rows: TypeAlias = Literal["E", "S"]


@dataclass(frozen=True, slots=True)
class _Section:
    name: str  # region / stream name, e.g. "Observations[0]"
    attr: str  # ReplayBuffer attribute
    rows: _Rows
    dtype: np.dtype[Any]
    width: int | None  # None: a 1-D array

    def count(self, rows: int) -> int:
        return rows * (1 if self.width is None else self.width)

    def shape(self, rows: int) -> tuple[int, ...]:
        return (rows,) if self.width is None else (rows, self.width)


@dataclass(frozen=True, slots=True)
class ReplayLayout:
    """Dtypes and widths of one replay buffer's arrays; the codec for all three byte layouts.

    Widths are float counts per row (VectorDimensionNum of each stream).
    """

    replay_buffer_id: int
    max_episode_num: int
    max_step_num: int
    has_completions: bool = False
    has_final_observations: bool = False
    has_final_memory_states: bool = False
    observation_dims: tuple[int, ...] = ()
    action_dims: tuple[int, ...] = ()
    action_modifier_dims: tuple[int, ...] = ()
    memory_state_dims: tuple[int, ...] = ()
    reward_dims: tuple[int, ...] = ()

    @classmethod
    def from_config(cls, cfg: ReplayBufferConfig) -> ReplayLayout:
        return cls(
            replay_buffer_id=cfg.id,
            max_episode_num=cfg.max_episode_num,
            max_step_num=cfg.max_step_num,
            has_completions=cfg.has_completions,
            has_final_observations=cfg.has_final_observations,
            has_final_memory_states=cfg.has_final_memory_states,
            observation_dims=tuple(s.vector_dimension_num for s in cfg.observations),
            action_dims=tuple(s.vector_dimension_num for s in cfg.actions),
            action_modifier_dims=tuple(s.vector_dimension_num for s in cfg.action_modifiers),
            memory_state_dims=tuple(s.vector_dimension_num for s in cfg.memory_states),
            reward_dims=tuple(s.vector_dimension_num for s in cfg.rewards),
        )

    # -- the one table of sections, in socket order (§3) and region order (§2.2) -------------------

    def _sections(self) -> list[_Section]:
        out = [
            _Section("EpisodeStarts", "episode_starts", "E", I32, None),
            _Section("EpisodeLengths", "episode_lengths", "E", I32, None),
        ]
        if self.has_completions:
            out.append(_Section("EpisodeCompletionModes", "completion_modes", "E", U8, None))
        if self.has_final_observations:
            out += self._streams("EpisodeFinalObservations", "final_observations", "E", self.observation_dims)
        if self.has_final_memory_states:
            out += self._streams(
                "EpisodeFinalMemoryStates", "final_memory_states", "E", self.memory_state_dims
            )
        out += self._streams("Observations", "observations", "S", self.observation_dims)
        out += self._streams("Actions", "actions", "S", self.action_dims)
        out += self._streams("ActionModifiers", "action_modifiers", "S", self.action_modifier_dims)
        out += self._streams("MemoryStates", "memory_states", "S", self.memory_state_dims)
        out += self._streams("Rewards", "rewards", "S", self.reward_dims)
        return out

    @staticmethod
    def _streams(name: str, attr: str, rows: _Rows, dims: tuple[int, ...]) -> list[_Section]:
        return [_Section(f"{name}[{k}]", attr, rows, F32, d) for k, d in enumerate(dims)]

    def _file_sections(self) -> list[_Section]:
        # §5.5: no completions, final states, modifiers, memory or rewards in the exported file.
        return [
            s
            for s in self._sections()
            if s.attr in ("episode_starts", "episode_lengths", "observations", "actions")
        ]

    # -- counts ------------------------------------------------------------------------------------

    def _check_counts(self, episode_num: object, step_num: object) -> tuple[int, int]:
        """Bound E and S before any size is computed (they come from the peer)."""
        for name, value, hi, limit in (
            ("EpisodeNum", episode_num, self.max_episode_num, "MaxEpisodeNum"),
            ("StepNum", step_num, self.max_step_num, "MaxStepNum"),
        ):
            if isinstance(value, bool) or not isinstance(value, int | np.integer):
                raise ReplayError(f"{name} must be an integer", field=name, actual=value)
            if value < 0 or value > hi:
                raise ReplayError(
                    f"{name} is {value}, outside 0..{hi} ({limit} of replay buffer {self.replay_buffer_id})",
                    field=name,
                    expected=f"0..{hi}",
                    actual=int(value),
                )
        return int(episode_num), int(step_num)  # type: ignore[call-overload]

    def _check_id(self, replay_buffer_id: int, where: str) -> None:
        if replay_buffer_id != self.replay_buffer_id:
            raise ReplayError(
                f"{where} ReplayBufferId is {replay_buffer_id} but this layout is replay buffer {self.replay_buffer_id}",
                field="ReplayBufferId",
                expected=self.replay_buffer_id,
                actual=replay_buffer_id,
            )

    # -- shared memory -------------------------------------------------------------------------------

    def regions(self) -> list[RegionSpec]:
        """Every allocated region of §2.2, in a fixed order; zero-size regions are left out (not allocated)."""
        out = []
        for s in self._sections():
            rows = self.max_episode_num if s.rows == "E" else self.max_step_num
            spec = RegionSpec(s.name, s.dtype, s.shape(rows))
            if spec.nbytes > 0:
                out.append(spec)
        return out

    def region_bytes(self, episode_num: int, step_num: int) -> dict[str, int]:
        """Bytes the first E / S rows take in each allocated region (names as in :meth:`regions`).

        What a reader copies out of shared memory (§2.4 step 3); E and S are checked first.
        """
        e, s = self._check_counts(episode_num, step_num)
        out: dict[str, int] = {}
        for sec in self._sections():
            max_rows = self.max_episode_num if sec.rows == "E" else self.max_step_num
            if sec.count(max_rows) > 0:  # allocated (zero-size regions are not, §2.2)
                out[sec.name] = sec.count(e if sec.rows == "E" else s) * sec.dtype.itemsize
        return out

    def read_regions(
        self,
        views: Mapping[str, memoryview | bytes | bytearray],
        episode_num: int,
        step_num: int,
        replay_buffer_id: int,
    ) -> ReplayBuffer:
        """The first E / S rows of each region as zero-copy views (read from the control block's counts).

        ``views`` maps region names (:meth:`regions`) to buffers at least as large as the rows read
        (POSIX regions are rounded up to a page, so larger is fine). Zero-size regions need no entry.
        """
        self._check_id(replay_buffer_id, "the control block's")
        e, s = self._check_counts(episode_num, step_num)
        arrays: dict[str, Any] = {}
        for sec in self._sections():
            rows = e if sec.rows == "E" else s
            count = sec.count(rows)
            if count == 0:
                arr: NDArray[Any] = np.empty(sec.shape(rows), dtype=sec.dtype)
            else:
                if sec.name not in views:
                    raise ReplayError(
                        f"region {sec.name} is missing", field=sec.name, expected="a mapped region"
                    )
                mv = _byte_view(views[sec.name])
                need = count * sec.dtype.itemsize
                if mv.nbytes < need:
                    raise ReplayError(
                        f"region {sec.name} holds {mv.nbytes} bytes but {rows} rows need {need}",
                        field=sec.name,
                        expected=need,
                        actual=mv.nbytes,
                    )
                arr = np.frombuffer(mv, dtype=sec.dtype, count=count).reshape(sec.shape(rows))
            _put(arrays, sec, arr)
        return self._build(arrays, s)

    # -- socket --------------------------------------------------------------------------------------

    def socket_body_size(self, episode_num: int, step_num: int) -> int:
        """Bytes after the 16-byte SendExperience header for E episodes and S steps (§3)."""
        e, s = self._check_counts(episode_num, step_num)
        return sum(sec.count(e if sec.rows == "E" else s) * sec.dtype.itemsize for sec in self._sections())

    def decode_socket_body(
        self, buf: bytes | bytearray | memoryview, episode_num: int, step_num: int, replay_buffer_id: int
    ) -> ReplayBuffer:
        """The SendExperience sections (§3 items 5-14) as zero-copy views into ``buf``.

        ``buf`` must be exactly :meth:`socket_body_size` bytes (slice a larger receive buffer first).
        """
        self._check_id(replay_buffer_id, "the experience message's")
        e, s = self._check_counts(episode_num, step_num)
        return self._decode_sections(_byte_view(buf), self._sections(), e, s, "experience body")

    def encode_socket_parts(self, rb: ReplayBuffer, networks_version: int) -> list[bytes | memoryview]:
        """Header and body of a SendExperience payload (without the signal byte), in order.

        Big arrays are returned as byte memoryviews of ``rb``'s arrays (no copy unless an array is not
        C-contiguous). Zero-byte sections are left out.
        """
        if isinstance(networks_version, bool) or not INT32_MIN <= networks_version <= INT32_MAX:
            raise ReplayError(
                "NetworksVersion must be an int32", field="NetworksVersion", actual=networks_version
            )
        e, s = self._check_buffer(rb, self._sections(), strict=True)
        parts: list[bytes | memoryview] = [SOCKET_HEADER.pack(networks_version, self.replay_buffer_id, e, s)]
        parts += self._section_views(rb, self._sections())
        return parts

    def encode_socket(self, rb: ReplayBuffer, networks_version: int) -> bytes:
        """:meth:`encode_socket_parts` joined into one bytes object (tests, small buffers)."""
        return b"".join(self.encode_socket_parts(rb, networks_version))

    # -- exported file -------------------------------------------------------------------------------

    def decode_file(self, buf: bytes | bytearray | memoryview) -> ReplayBuffer:
        """``replaybuffer_<id>.bin`` (§5.5) as zero-copy views into ``buf``; only starts, lengths,
        observations and actions exist in that file, so the other streams come back empty/None."""
        mv = _byte_view(buf)
        if mv.nbytes < FILE_HEADER_SIZE:
            raise ReplayError(
                f"replay buffer file holds {mv.nbytes} bytes, less than its {FILE_HEADER_SIZE}-byte header",
                field="header",
                expected=FILE_HEADER_SIZE,
                actual=mv.nbytes,
            )
        rb_id, episode_num, step_num = FILE_HEADER.unpack_from(mv, 0)
        self._check_id(rb_id, "the file's")
        e, s = self._check_counts(episode_num, step_num)
        return self._decode_sections(mv[FILE_HEADER_SIZE:], self._file_sections(), e, s, "replay buffer file")

    def encode_file(self, rb: ReplayBuffer) -> bytes:
        """``replaybuffer_<id>.bin`` bytes (§5.5); streams the file has no place for are not written."""
        sections = self._file_sections()
        e, s = self._check_buffer(rb, sections, strict=False)
        return b"".join([FILE_HEADER.pack(self.replay_buffer_id, e, s), *self._section_views(rb, sections)])

    # -- shared helpers --------------------------------------------------------------------------------

    def _decode_sections(
        self, mv: memoryview, sections: list[_Section], e: int, s: int, what: str
    ) -> ReplayBuffer:
        need = sum(sec.count(e if sec.rows == "E" else s) * sec.dtype.itemsize for sec in sections)
        if mv.nbytes != need:
            raise ReplayError(
                f"{what} holds {mv.nbytes} bytes but {e} episodes and {s} steps need {need}",
                field=what,
                expected=need,
                actual=mv.nbytes,
            )
        arrays: dict[str, Any] = {}
        offset = 0
        for sec in sections:
            rows = e if sec.rows == "E" else s
            count = sec.count(rows)
            arr = np.frombuffer(mv, dtype=sec.dtype, count=count, offset=offset).reshape(sec.shape(rows))
            offset += count * sec.dtype.itemsize
            _put(arrays, sec, arr)
        return self._build(arrays, s)

    def _build(self, arrays: dict[str, Any], step_num: int) -> ReplayBuffer:
        rb = ReplayBuffer(
            replay_buffer_id=self.replay_buffer_id,
            episode_starts=arrays["episode_starts"],
            episode_lengths=arrays["episode_lengths"],
            observations=tuple(arrays.get("observations", ())),
            actions=tuple(arrays.get("actions", ())),
            completion_modes=arrays.get("completion_modes"),
            final_observations=tuple(arrays.get("final_observations", ())),
            final_memory_states=tuple(arrays.get("final_memory_states", ())),
            action_modifiers=tuple(arrays.get("action_modifiers", ())),
            memory_states=tuple(arrays.get("memory_states", ())),
            rewards=tuple(arrays.get("rewards", ())),
        )
        validate_episodes(rb.episode_starts, rb.episode_lengths, step_num)
        return rb

    def _check_buffer(self, rb: ReplayBuffer, sections: list[_Section], *, strict: bool) -> tuple[int, int]:
        """Check that ``rb`` has exactly the arrays ``sections`` name, with the layout's widths."""
        self._check_id(rb.replay_buffer_id, "the buffer's")
        e, s = self._check_counts(rb.episode_num, rb.step_num)
        for sec in sections:
            arr = _get(rb, sec)
            if arr is None:
                raise ReplayError(
                    f"{sec.name} is missing from the replay buffer", field=sec.name, expected="present"
                )
            want = sec.shape(e if sec.rows == "E" else s)
            if arr.shape != want:
                raise ReplayError(
                    f"{sec.name} has shape {arr.shape} but the layout needs {want}",
                    field=sec.name,
                    expected=want,
                    actual=arr.shape,
                )
        if strict:
            # Every array of ``rb`` must have a place in the payload: nothing is silently left out.
            for attr in _TUPLE_ATTRS:
                streams = sum(1 for sec in sections if sec.attr == attr)
                have = len(getattr(rb, attr))
                if have != streams:
                    raise ReplayError(
                        f"the replay buffer has {have} {attr} arrays but the layout has {streams}",
                        field=attr,
                        expected=streams,
                        actual=have,
                    )
            if rb.completion_modes is not None and not self.has_completions:
                raise ReplayError(
                    "the replay buffer has completion modes but the layout has no HasCompletions",
                    field="EpisodeCompletionModes",
                    expected=None,
                    actual="present",
                )
        return e, s

    @staticmethod
    def _section_views(rb: ReplayBuffer, sections: list[_Section]) -> list[bytes | memoryview]:
        out: list[bytes | memoryview] = []
        for sec in sections:
            arr = _get(rb, sec)
            if arr is None or arr.size == 0:
                continue
            contiguous = np.ascontiguousarray(arr, dtype=sec.dtype)
            out.append(contiguous.reshape(-1).view(np.uint8).data)
        return out


_TUPLE_ATTRS = (
    "observations",
    "actions",
    "final_observations",
    "final_memory_states",
    "action_modifiers",
    "memory_states",
    "rewards",
)


def _stream_index(sec: _Section) -> int:
    return int(sec.name[sec.name.index("[") + 1 : -1])


def _put(arrays: dict[str, Any], sec: _Section, arr: NDArray[Any]) -> None:
    if sec.attr in _TUPLE_ATTRS:
        arrays.setdefault(sec.attr, []).append(arr)
    else:
        arrays[sec.attr] = arr


def _get(rb: ReplayBuffer, sec: _Section) -> NDArray[Any] | None:
    value = getattr(rb, sec.attr)
    if sec.attr in _TUPLE_ATTRS:
        k = _stream_index(sec)
        return value[k] if k < len(value) else None
    return value  # type: ignore[no-any-return]


def _byte_view(buf: bytes | bytearray | memoryview) -> memoryview:
    try:
        mv = memoryview(buf)
        if mv.ndim != 1 or mv.format not in ("B", "b", "c"):
            mv = mv.cast("B")
    except TypeError as exc:  # not a C-contiguous buffer
        raise ReplayError(f"cannot read the buffer as bytes: {exc}", field="buffer") from None
    return mv


# --------------------------------------------------------------------------------------------------
# Checks


def validate_episodes(starts: NDArray[Any], lengths: NDArray[Any], step_num: int) -> None:
    """Check episode starts/lengths (E,) against S = ``step_num``.

    Starts and lengths are non-negative, every episode lies inside ``[0, step_num)``, non-empty episodes
    do not overlap (compared in start order) and the lengths sum to at most ``step_num``. Zero-length
    episodes are allowed (:func:`zero_length_episodes` lists them). Raises ReplayError naming the episode
    index and its values.
    """
    starts64 = np.asarray(starts, dtype=np.int64)
    lengths64 = np.asarray(lengths, dtype=np.int64)
    if starts64.ndim != 1 or starts64.shape != lengths64.shape:
        raise ReplayError(
            "EpisodeStarts and EpisodeLengths must be 1-D arrays of one length",
            field="EpisodeStarts",
            expected=starts64.shape,
            actual=lengths64.shape,
        )
    for name, arr in (("EpisodeStarts", starts64), ("EpisodeLengths", lengths64)):
        bad = np.flatnonzero(arr < 0)
        if bad.size:
            i = int(bad[0])
            raise ReplayError(
                f"{name}[{i}] is {int(arr[i])}", field=f"{name}[{i}]", expected=">= 0", actual=int(arr[i])
            )
    ends = starts64 + lengths64
    bad = np.flatnonzero(ends > step_num)
    if bad.size:
        i = int(bad[0])
        raise ReplayError(
            f"episode {i} covers steps {int(starts64[i])}..{int(ends[i]) - 1} but StepNum is {step_num}",
            field=f"EpisodeStarts[{i}]",
            expected=f"start + length <= {step_num}",
            actual=(int(starts64[i]), int(lengths64[i])),
        )
    total = int(lengths64.sum())
    if total > step_num:
        raise ReplayError(
            f"episode lengths sum to {total} but StepNum is {step_num}",
            field="EpisodeLengths",
            expected=f"<= {step_num}",
            actual=total,
        )
    nonempty = np.flatnonzero(lengths64 > 0)
    order = nonempty[np.argsort(starts64[nonempty], kind="stable")]
    overlap = np.flatnonzero(starts64[order[1:]] < ends[order[:-1]])
    if overlap.size:
        a, b = int(order[overlap[0]]), int(order[overlap[0] + 1])
        raise ReplayError(
            f"episode {b} (start {int(starts64[b])}, length {int(lengths64[b])}) overlaps episode {a} "
            f"(start {int(starts64[a])}, length {int(lengths64[a])})",
            field=f"EpisodeStarts[{b}]",
            expected=f">= {int(ends[a])}",
            actual=int(starts64[b]),
        )


def zero_length_episodes(lengths: NDArray[Any]) -> list[int]:
    """Indices of episodes with length 0 (allowed, but worth reporting: they contribute no samples)."""
    return [int(i) for i in np.flatnonzero(np.asarray(lengths) == 0)]


def check_finite(rb: ReplayBuffer) -> list[str]:
    """One message per float stream holding a NaN or infinity, naming the first such row and column."""
    out = []
    for name, arr in rb.float_streams():
        finite = np.isfinite(arr)
        if not finite.all():
            flat = int(np.argmin(finite.reshape(-1)))
            row, col = divmod(flat, arr.shape[1])
            out.append(f"{name} row {row} column {col} is {float(arr[row, col])!r}")
    return out
