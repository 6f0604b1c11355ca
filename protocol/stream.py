"""The socket byte stream: signals, incremental decoders for both sides, encoders (spec §3, §10 items 7-8).

Each message is one signal byte followed by a payload with no overall length prefix; the reader knows the
sizes from the config (network snapshot sizes, replay-buffer layouts). All integers are little-endian int32.

======  ===============  =======  ===========================================================
byte    ESignal          from     payload after the signal byte
======  ===============  =======  ===========================================================
0       Invalid          –        never sent
1       SendConfig       game     int32 ConfigByteNum, that many bytes of UTF-8 JSON
2       SendExperience   game     int32 NetworksVersion, ReplayBufferId, EpisodeNum E, StepNum S,
                                  then the replay layout's body for (E, S)
3       RecvNetwork      trainer  int32 NetworkId, int32 NetworksVersion, snapshot bytes
4       SendNetwork      game     int32 NetworkId, snapshot bytes
5       RecvComplete     trainer  –
6       SendStop         game     –
7       RecvPing         trainer  –
======  ===============  =======  ===========================================================

Decoders are sans-IO in the h11 manner: ``feed(data)`` then call ``next_event()`` until it returns
:data:`NEED_DATA`; ``eof()`` when the peer closes. For large payloads there is a zero-copy path modelled on
:class:`asyncio.BufferedProtocol`: ``view = decoder.get_buffer(-1)``, ``n = sock.recv_into(view)``,
``decoder.buffer_updated(n)``. Once a message's header is parsed its body is one preallocated
``bytearray`` of the exact size, and ``get_buffer`` hands out the unfilled rest of it, so snapshot and
replay bytes go from the kernel straight to their final buffer. SendConfig is the exception: its size is
the only one a peer declares before anything is known about it (network and replay sizes come from an
accepted config), so its buffer starts at :data:`_GROW_FIRST` bytes and doubles as bytes arrive; a
5-byte header that claims 64 MiB allocates 64 KiB, not 64 MiB, until the bytes come. Header bytes go through a small scratch
buffer (a recv of exactly the header's missing bytes, so no body byte is ever read into it).

Bounds before allocation: ConfigByteNum ≤ ``max_config_bytes``; NetworkId must be configured and the body
is exactly that network's size; ReplayBufferId must be configured and 0 ≤ E ≤ MaxEpisodeNum,
0 ≤ S ≤ MaxStepNum of its layout before the layout is asked for a body size. Any violation is a
:class:`~protocol.errors.StreamError`; a decoder that raised refuses further use.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import TYPE_CHECKING, Final, Generic, Literal, Protocol, TypeAlias, TypeVar

from protocol.errors import StreamError
from protocol.ints import INT32_MAX, INT32_MIN

if TYPE_CHECKING:
    from protocol.replay import ReplayBuffer

__all__ = [
    "DEFAULT_MAX_CONFIG_BYTES",
    "NEED_DATA",
    "Complete",
    "ConfigMessage",
    "ExperienceMessage",
    "GameEvent",
    "GameStreamDecoder",
    "NeedData",
    "NetworkToGame",
    "NetworkToTrainer",
    "PayloadBytes",
    "Ping",
    "ReplayLayoutLike",
    "Signal",
    "Stop",
    "TrainerEvent",
    "TrainerStreamDecoder",
    "encode_complete",
    "encode_config",
    "encode_experience_header",
    "encode_network_to_game",
    "encode_network_to_trainer",
    "encode_ping",
    "encode_stop",
]


class Signal(IntEnum):
    """The signal byte in front of every message (``ESignal``; spec §3, values from 5.6/5.7)."""

    INVALID = 0
    """Never sent; a zero byte on the wire is an error."""
    SEND_CONFIG = 1
    """Game → trainer: int32 ConfigByteNum, then the config JSON (data + model keys + TrainerSettings)."""
    SEND_EXPERIENCE = 2
    """Game → trainer: NetworksVersion, ReplayBufferId, E, S (int32 each), then the replay body."""
    RECV_NETWORK = 3
    """Trainer → game: int32 NetworkId, int32 NetworksVersion, then exactly the network's snapshot bytes."""
    SEND_NETWORK = 4
    """Game → trainer: int32 NetworkId, then exactly the network's snapshot bytes (initial weights)."""
    RECV_COMPLETE = 5
    """Trainer → game: training finished. The game closes the socket; it does not send Stop (§10.7)."""
    SEND_STOP = 6
    """Game → trainer: stop now (``EndTraining``)."""
    RECV_PING = 7
    """Trainer → game: keep-alive; resets the game's receive timer (at most one consumed per tick, §10.8)."""


_WIRE_NAMES: Final[dict[Signal, str]] = {
    Signal.INVALID: "Invalid",
    Signal.SEND_CONFIG: "SendConfig",
    Signal.SEND_EXPERIENCE: "SendExperience",
    Signal.RECV_NETWORK: "RecvNetwork",
    Signal.SEND_NETWORK: "SendNetwork",
    Signal.RECV_COMPLETE: "RecvComplete",
    Signal.SEND_STOP: "SendStop",
    Signal.RECV_PING: "RecvPing",
}

DEFAULT_MAX_CONFIG_BYTES: Final = 64 * 1024 * 1024
"""Largest config JSON accepted (bytes). Real configs are kilobytes; this only stops a bad length from
allocating gigabytes."""


# Headers after the signal byte, and the full headers the encoders write (signal byte included).
_NO_FIELDS: Final = struct.Struct("<")
_ONE_INT: Final = struct.Struct("<i")
_TWO_INTS: Final = struct.Struct("<ii")
_FOUR_INTS: Final = struct.Struct("<4i")
_SIGNAL_AND_ONE_INT: Final = struct.Struct("<Bi")
_SIGNAL_AND_TWO_INTS: Final = struct.Struct("<Bii")
_SIGNAL_AND_FOUR_INTS: Final = struct.Struct("<B4i")
_SCRATCH_BYTES: Final = 64  # larger than any header; also the chunk handed out when bytes are undrained
_GROW_FIRST: Final = 64 * 1024
"""First allocation of a body that grows as it arrives (SendConfig): a real config (kilobytes) fits in it
at once, and a silent or junk peer holds no more than this however large the size it claimed."""


# ---------------------------------------------------------------------------------------------------------
# Messages


class NeedData(Enum):
    """Type of the :data:`NEED_DATA` sentinel."""

    NEED_DATA = "NEED_DATA"


NEED_DATA: Final = NeedData.NEED_DATA
"""Returned by ``next_event()`` when no complete message is buffered."""

PayloadBytes: TypeAlias = bytes | bytearray | memoryview
"""Any contiguous buffer of payload bytes (other formats are read as their raw bytes)."""


@dataclass(frozen=True, slots=True)
class ConfigMessage:
    """SendConfig: the raw config JSON (UTF-8, no NUL); parsed by :mod:`protocol.config`."""

    raw_json: bytes


@dataclass(frozen=True, slots=True, eq=False)
class ExperienceMessage:
    """SendExperience: the replay buffer and the engine's NetworksVersion (−1 before any network arrived)."""

    networks_version: int
    replay: ReplayBuffer


@dataclass(frozen=True, slots=True)
class NetworkToTrainer:
    """SendNetwork (signal 4): an initial network snapshot from the game; ``data`` has exactly its size."""

    network_id: int
    data: memoryview | bytes


@dataclass(frozen=True, slots=True)
class NetworkToGame:
    """RecvNetwork (signal 3): a trained snapshot for the game, tagged with the trainer's version counter."""

    network_id: int
    version: int
    data: memoryview | bytes


@dataclass(frozen=True, slots=True)
class Complete:
    """RecvComplete (signal 5)."""


@dataclass(frozen=True, slots=True)
class Stop:
    """SendStop (signal 6)."""


@dataclass(frozen=True, slots=True)
class Ping:
    """RecvPing (signal 7)."""


TrainerEvent: TypeAlias = ConfigMessage | ExperienceMessage | NetworkToTrainer | Stop
"""What the trainer side decodes (what the game sends)."""
GameEvent: TypeAlias = NetworkToGame | Complete | Ping
"""What the game side decodes (what the trainer sends)."""


class ReplayLayoutLike(Protocol):
    """What the trainer decoder needs from a replay layout (implemented by ``protocol.replay.ReplayLayout``)."""

    @property
    def max_episode_num(self) -> int:
        """MaxEpisodeNum of the buffer: the bound on E."""
        ...

    @property
    def max_step_num(self) -> int:
        """MaxStepNum of the buffer: the bound on S."""
        ...

    def socket_body_size(self, episode_num: int, step_num: int) -> int:
        """Bytes after the 4-int header of a SendExperience with E episodes and S steps (spec §3 items 5-14)."""
        ...

    def decode_socket_body(
        self, buf: memoryview, episode_num: int, step_num: int, replay_buffer_id: int
    ) -> ReplayBuffer:
        """Decode a body of exactly ``socket_body_size(E, S)`` bytes (the buffer belongs to the result)."""
        ...


# ---------------------------------------------------------------------------------------------------------
# The decoder machine: signal byte → fixed header → body of a size computed from the header → event.

EventT = TypeVar("EventT")


@dataclass(frozen=True, slots=True)
class _Reader(Generic[EventT]):
    """One row of a decoder's table: how to read the message that follows one signal byte."""

    signal: Signal
    header: struct.Struct
    body_size: Callable[[tuple[int, ...]], int]
    """Validate the header (bounds first) and return the body size in bytes."""
    finish: Callable[[tuple[int, ...], bytearray], EventT]
    """Build the event from the header and the filled body (which then belongs to the event)."""
    grows: bool = False
    """The body is allocated as it arrives (doubling from :data:`_GROW_FIRST`), not all at once: for a size
    the peer alone declares (SendConfig), so a header cannot make us hold memory the bytes never fill."""

    @property
    def name(self) -> str:
        return _WIRE_NAMES[self.signal]


def _int32(name: str, value: object, low: int = INT32_MIN) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= INT32_MAX:
        raise StreamError(f"{name} must be an int32 in {low}..{INT32_MAX}", field=name, actual=value)
    return value


class _Decoder(Generic[EventT]):
    """Shared state machine; subclasses choose the reader for each signal byte."""

    _side: str  # "trainer" or "game", for messages

    def __init__(self) -> None:
        self._pending = bytearray()  # fed bytes not consumed yet (never exported, so it can shrink)
        self._scratch = bytearray(_SCRATCH_BYTES)  # fixed size; get_buffer hands out views of it
        self._reader: _Reader[EventT] | None = None  # None between messages
        self._header: tuple[int, ...] | None = None
        self._body: bytearray | None = None
        self._size = 0  # the body's declared size; len(self._body) is less while a growing body fills
        self._filled = 0
        self._given: Literal["scratch", "body"] | None = None
        self._given_size = 0
        self._eof = False
        self._failed: Exception | None = None

    # -- what subclasses supply ------------------------------------------------------------------------
    def _reader_for(self, byte: int) -> _Reader[EventT]:
        raise NotImplementedError

    def _signal_error(self, byte: int) -> StreamError:
        """The error for a byte that is not a signal this side can receive at all."""
        try:
            signal = Signal(byte)
        except ValueError:
            return StreamError(
                f"unknown signal byte {byte} on the {self._side} side",
                field="signal",
                expected="1..7",
                actual=byte,
            )
        if signal is Signal.INVALID:
            return StreamError("signal byte 0 (Invalid) is never sent", field="signal", actual=byte)
        return StreamError(
            f"signal {byte} ({_WIRE_NAMES[signal]}) travels towards the other side; the {self._side} never "
            "receives it",
            field="signal",
            actual=byte,
        )

    # -- public API --------------------------------------------------------------------------------------
    @property
    def body_size(self) -> int | None:
        """The current message's body size in bytes (from its header); None between messages or before its
        header."""
        return None if self._body is None else self._size

    @property
    def body_allocated(self) -> int:
        """Bytes allocated for the current message's body so far: its size, except for a body that grows
        as it arrives (SendConfig); 0 between messages."""
        return 0 if self._body is None else len(self._body)

    def feed(self, data: PayloadBytes) -> None:
        """Append received bytes (copied; use the get_buffer path to avoid the copy)."""
        self._usable("feed")
        # A view from get_buffer() that was not reported is abandoned (asyncio does the same when a read
        # would block): a later buffer_updated() must follow a new get_buffer().
        self._given = None
        view = _byte_view(data)
        body = self._body
        if body is not None and not self._pending:
            # Straight into the body; whatever is beyond it starts the next message.
            take = min(self._size - self._filled, len(view))
            body = self._room(self._filled + take)
            body[self._filled : self._filled + take] = view[:take]
            self._filled += take
            view = view[take:]
        self._pending += view

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """A writable view to receive into; call :meth:`buffer_updated` with the byte count written.

        Calling it again (or :meth:`feed`) without reporting abandons the previous view.

        While a body of known size is being received it is the unfilled rest of that body (zero copy; of
        the part allocated so far, for a body that grows as it arrives);
        otherwise a scratch view of exactly the missing header bytes. ``sizehint`` is accepted for
        BufferedProtocol compatibility and ignored: larger views would let a recv run past the message.
        """
        self._usable("get_buffer")
        body = self._body
        if body is not None and not self._pending and self._filled < self._size:
            body = self._room(self._filled + 1)  # a growing body that is full doubles here
            view = memoryview(body)[self._filled :]
            self._given, self._given_size = "body", len(view)
            return view
        reader = self._reader
        if reader is None:
            missing = 1 - len(self._pending)  # the signal byte
        elif self._header is None:
            missing = reader.header.size - len(self._pending)
        else:
            missing = 0
        size = missing if missing > 0 else _SCRATCH_BYTES  # bytes are undrained: any size is correct
        self._given, self._given_size = "scratch", size
        return memoryview(self._scratch)[:size]

    def buffer_updated(self, nbytes: int) -> None:
        """``nbytes`` were written into the view from :meth:`get_buffer`."""
        self._usable("buffer_updated")
        given, size = self._given, self._given_size
        if given is None:
            raise self._fail(StreamError("buffer_updated() without get_buffer()", field="buffer_updated"))
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or not 0 <= nbytes <= size:
            raise self._fail(
                StreamError(
                    "buffer_updated() byte count is outside the view",
                    field="nbytes",
                    expected=f"0..{size}",
                    actual=nbytes,
                )
            )
        self._given = None
        if given == "body":
            self._filled += nbytes
        else:
            self._pending += self._scratch[:nbytes]

    def next_event(self) -> EventT | NeedData:
        """The next complete message, or :data:`NEED_DATA`."""
        self._usable("next_event")
        try:
            return self._next_event()
        except Exception as exc:  # the machine's state is unknown after any error: refuse further use
            self._failed = exc
            raise

    def eof(self) -> None:
        """The peer closed the stream. Raises StreamError if it stopped in the middle of a message.

        Call it after ``next_event()`` returned NEED_DATA; messages still buffered are delivered first.
        """
        self._usable("eof")
        self._eof = True
        if not self._can_progress():
            truncation = self._truncation()
            if truncation is not None:
                raise self._fail(truncation)

    # -- internals -----------------------------------------------------------------------------------
    def _usable(self, what: str) -> None:
        if self._failed is not None:
            raise StreamError(
                f"the {self._side}-side decoder failed earlier and refuses {what}(): {self._failed}",
                field="state",
            )
        if self._eof and what in ("feed", "get_buffer", "buffer_updated"):
            raise self._fail(StreamError(f"{what}() after eof()", field=what))

    def _fail(self, error: StreamError) -> StreamError:
        self._failed = error
        return error

    @property
    def body_remaining(self) -> int:
        """Bytes still missing from the body being received straight into its buffer (0: none is).

        While it is positive, :meth:`get_buffer` hands out the rest of that body, so a transport may
        receive into it several times in a row without looking for events in between."""
        body = self._body
        if body is None or self._pending:
            return 0
        return self._size - self._filled

    def _can_progress(self) -> bool:
        if self._reader is None:
            return bool(self._pending)
        if self._header is None:
            return len(self._pending) >= self._reader.header.size
        return self._body is not None and (self._filled == self._size or bool(self._pending))

    def _truncation(self) -> StreamError | None:
        reader = self._reader
        if reader is None:
            return None
        if self._header is None:
            got = 1 + len(self._pending)
            return StreamError(
                f"truncated {reader.name} message after {got} bytes: its {1 + reader.header.size}-byte header "
                "is incomplete",
                field=reader.name,
                expected=1 + reader.header.size,
                actual=got,
            )
        body_len = 0 if self._body is None else self._size
        total = 1 + reader.header.size + body_len
        got = 1 + reader.header.size + self._filled
        return StreamError(
            f"truncated {reader.name} message after {got} of {total} bytes",
            field=reader.name,
            expected=total,
            actual=got,
        )

    def _need_data(self) -> NeedData:
        if self._eof:
            truncation = self._truncation()
            if truncation is not None:
                raise truncation
        return NEED_DATA

    def _next_event(self) -> EventT | NeedData:
        pending = self._pending
        reader = self._reader
        if reader is None:
            if not pending:
                return self._need_data()
            reader = self._reader_for(pending[0])
            del pending[0]
            self._reader = reader
        if self._header is None:
            need = reader.header.size
            if len(pending) < need:
                return self._need_data()
            header = reader.header.unpack_from(pending, 0)
            size = reader.body_size(header)  # bounds are checked in there, before this allocation
            del pending[:need]
            self._header = header
            self._size = size
            self._body = bytearray(min(size, _GROW_FIRST) if reader.grows else size)
            self._filled = 0
        if self._filled < self._size and pending:
            take = min(self._size - self._filled, len(pending))
            room = self._room(self._filled + take)
            room[self._filled : self._filled + take] = pending[:take]
            del pending[:take]
            self._filled += take
        if self._filled < self._size:
            return self._need_data()
        header, body = self._header, self._body
        assert body is not None and len(body) == self._size  # invariants of this machine, not peer data
        self._reader, self._header, self._body, self._size, self._filled = None, None, None, 0, 0
        return reader.finish(header, body)

    def _room(self, needed: int) -> bytearray:
        """The body, with room for ``needed`` bytes (at most its size): a growing body is replaced by one
        twice as large (or ``needed``), never resized in place, since a view of it handed out by
        :meth:`get_buffer` may still be alive (a bytearray with exported views cannot be resized)."""
        body = self._body
        assert body is not None  # only called while a body is being received
        if needed <= len(body):
            return body
        grown = bytearray(min(self._size, max(needed, 2 * len(body))))
        grown[: self._filled] = memoryview(body)[: self._filled]
        self._body = grown
        return grown


def _byte_view(data: PayloadBytes) -> memoryview:
    view = memoryview(data)
    if view.format != "B" or view.ndim != 1:
        if not view.c_contiguous:
            raise StreamError("payload buffers must be C-contiguous", field="data")
        view = view.cast("B")
    return view


def _check_network_sizes(network_sizes: Mapping[int, int]) -> dict[int, int]:
    sizes: dict[int, int] = {}
    for network_id, size in network_sizes.items():
        _int32("network id", network_id, low=0)
        _int32(f"network {network_id} size", size, low=0)
        sizes[network_id] = size
    return sizes


class _TrainerState(Enum):
    AWAIT_CONFIG = "waiting for SendConfig"
    AWAIT_CONFIGURE = "config received, configure() not called yet"
    CONFIGURED = "configured"


class TrainerStreamDecoder(_Decoder[TrainerEvent]):
    """Decodes what the game sends: SendConfig, SendNetwork, SendExperience, SendStop.

    Before :meth:`configure` only SendConfig and SendStop can be decoded (the sizes of the others come
    from the config). The intended loop: take the :class:`ConfigMessage`, parse it, ``configure(...)``,
    then keep calling ``next_event()``.
    """

    _side = "trainer"

    def __init__(self, max_config_bytes: int = DEFAULT_MAX_CONFIG_BYTES) -> None:
        super().__init__()
        self._max_config_bytes = _int32("max_config_bytes", max_config_bytes, low=0)
        self._state = _TrainerState.AWAIT_CONFIG
        self._network_sizes: dict[int, int] = {}
        self._layouts: dict[int, ReplayLayoutLike] = {}
        self._readers: dict[int, _Reader[TrainerEvent]] = {
            Signal.SEND_CONFIG: _Reader(
                Signal.SEND_CONFIG, _ONE_INT, self._config_size, self._config_event, grows=True
            ),
            Signal.SEND_EXPERIENCE: _Reader(
                Signal.SEND_EXPERIENCE, _FOUR_INTS, self._experience_size, self._experience_event
            ),
            Signal.SEND_NETWORK: _Reader(
                Signal.SEND_NETWORK, _ONE_INT, self._network_size, self._network_event
            ),
            Signal.SEND_STOP: _Reader(Signal.SEND_STOP, _NO_FIELDS, _no_body, _stop_event),
        }

    def configure(
        self, network_sizes: Mapping[int, int], replay_layouts: Mapping[int, ReplayLayoutLike]
    ) -> None:
        """Give the sizes from the parsed config: snapshot bytes per network id, layout per replay buffer id."""
        self._usable("configure")
        if self._state is not _TrainerState.AWAIT_CONFIGURE:
            raise self._fail(
                StreamError(
                    f"configure() is valid once, after the config message (state: {self._state.value})"
                )
            )
        try:
            sizes = _check_network_sizes(network_sizes)
            layouts: dict[int, ReplayLayoutLike] = {}
            for replay_id, layout in replay_layouts.items():
                _int32("replay buffer id", replay_id, low=0)
                _int32(f"replay buffer {replay_id} max_episode_num", layout.max_episode_num, low=0)
                _int32(f"replay buffer {replay_id} max_step_num", layout.max_step_num, low=0)
                layouts[replay_id] = layout
        except StreamError as exc:
            raise self._fail(exc) from None
        self._network_sizes, self._layouts = sizes, layouts
        self._state = _TrainerState.CONFIGURED

    def _reader_for(self, byte: int) -> _Reader[TrainerEvent]:
        reader = self._readers.get(byte)
        if reader is None:
            raise self._signal_error(byte)
        signal = reader.signal
        if signal is Signal.SEND_CONFIG and self._state is not _TrainerState.AWAIT_CONFIG:
            raise StreamError("SendConfig received a second time", field="signal", actual=byte)
        if (
            signal in (Signal.SEND_EXPERIENCE, Signal.SEND_NETWORK)
            and self._state is not _TrainerState.CONFIGURED
        ):
            raise StreamError(
                f"signal {byte} ({reader.name}) cannot be decoded in state '{self._state.value}': its sizes "
                "come from the config",
                field="signal",
                actual=byte,
            )
        return reader

    def _config_size(self, header: tuple[int, ...]) -> int:
        (byte_num,) = header
        if not 0 <= byte_num <= self._max_config_bytes:
            raise StreamError(
                f"SendConfig ConfigByteNum {byte_num} is outside 0..{self._max_config_bytes}",
                field="ConfigByteNum",
                expected=f"0..{self._max_config_bytes}",
                actual=byte_num,
            )
        return byte_num

    def _config_event(self, header: tuple[int, ...], body: bytearray) -> TrainerEvent:
        self._state = _TrainerState.AWAIT_CONFIGURE
        return ConfigMessage(bytes(body))

    def _network_size(self, header: tuple[int, ...]) -> int:
        (network_id,) = header
        size = self._network_sizes.get(network_id)
        if size is None:
            raise StreamError(
                f"SendNetwork NetworkId {network_id} is not a configured network",
                field="NetworkId",
                expected=sorted(self._network_sizes),
                actual=network_id,
            )
        return size

    def _network_event(self, header: tuple[int, ...], body: bytearray) -> TrainerEvent:
        return NetworkToTrainer(header[0], memoryview(body).toreadonly())

    def _experience_size(self, header: tuple[int, ...]) -> int:
        _version, replay_id, episode_num, step_num = header
        layout = self._layouts.get(replay_id)
        if layout is None:
            raise StreamError(
                f"SendExperience ReplayBufferId {replay_id} is not a configured replay buffer",
                field="ReplayBufferId",
                expected=sorted(self._layouts),
                actual=replay_id,
            )
        for name, value, high in (
            ("EpisodeNum", episode_num, layout.max_episode_num),
            ("StepNum", step_num, layout.max_step_num),
        ):
            if not 0 <= value <= high:
                raise StreamError(
                    f"SendExperience {name} {value} is outside 0..{high} (replay buffer {replay_id})",
                    field=name,
                    expected=f"0..{high}",
                    actual=value,
                )
        size = layout.socket_body_size(episode_num, step_num)
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise StreamError(
                f"the replay layout returned a bad body size {size!r}", field="socket_body_size"
            )
        return size

    def _experience_event(self, header: tuple[int, ...], body: bytearray) -> TrainerEvent:
        version, replay_id, episode_num, step_num = header
        # A ProtocolError from the layout (e.g. ReplayError for inconsistent episodes) passes through with
        # its own field names; next_event() marks this decoder failed either way.
        replay = self._layouts[replay_id].decode_socket_body(
            memoryview(body), episode_num, step_num, replay_id
        )
        return ExperienceMessage(version, replay)


class GameStreamDecoder(_Decoder[GameEvent]):
    """Decodes what the trainer sends: RecvNetwork, RecvComplete, RecvPing (for the game-side emulator)."""

    _side = "game"

    def __init__(self, network_sizes: Mapping[int, int]) -> None:
        super().__init__()
        self._network_sizes = _check_network_sizes(network_sizes)
        self._readers: dict[int, _Reader[GameEvent]] = {
            Signal.RECV_NETWORK: _Reader(
                Signal.RECV_NETWORK, _TWO_INTS, self._network_size, self._network_event
            ),
            Signal.RECV_COMPLETE: _Reader(Signal.RECV_COMPLETE, _NO_FIELDS, _no_body, _complete_event),
            Signal.RECV_PING: _Reader(Signal.RECV_PING, _NO_FIELDS, _no_body, _ping_event),
        }

    def _reader_for(self, byte: int) -> _Reader[GameEvent]:
        reader = self._readers.get(byte)
        if reader is None:
            raise self._signal_error(byte)
        return reader

    def _network_size(self, header: tuple[int, ...]) -> int:
        network_id, _version = header
        size = self._network_sizes.get(network_id)
        if size is None:
            raise StreamError(
                f"RecvNetwork NetworkId {network_id} is not a configured network",
                field="NetworkId",
                expected=sorted(self._network_sizes),
                actual=network_id,
            )
        return size

    def _network_event(self, header: tuple[int, ...], body: bytearray) -> GameEvent:
        return NetworkToGame(header[0], header[1], memoryview(body).toreadonly())


def _no_body(header: tuple[int, ...]) -> int:
    return 0


def _stop_event(header: tuple[int, ...], body: bytearray) -> TrainerEvent:
    return Stop()


def _complete_event(header: tuple[int, ...], body: bytearray) -> GameEvent:
    return Complete()


def _ping_event(header: tuple[int, ...], body: bytearray) -> GameEvent:
    return Ping()


# ---------------------------------------------------------------------------------------------------------
# Encoders. Payload-carrying ones return [header, payload view]: send them with sendmsg/writelines, no join.


def encode_config(raw_json: PayloadBytes) -> list[bytes | memoryview]:
    """Game side: SendConfig with the given JSON bytes."""
    view = _byte_view(raw_json)
    _int32("ConfigByteNum", view.nbytes, low=0)
    return [_SIGNAL_AND_ONE_INT.pack(Signal.SEND_CONFIG, view.nbytes), view]


def encode_network_to_trainer(network_id: int, data: PayloadBytes) -> list[bytes | memoryview]:
    """Game side: SendNetwork (signal 4), initial snapshot ``data`` of network ``network_id``."""
    _int32("NetworkId", network_id, low=0)
    return [_SIGNAL_AND_ONE_INT.pack(Signal.SEND_NETWORK, network_id), _byte_view(data)]


def encode_experience_header(
    networks_version: int, replay_buffer_id: int, episode_num: int, step_num: int
) -> bytes:
    """Game side: the signal byte and 4-int header of SendExperience; the body comes from the replay layout."""
    _int32("NetworksVersion", networks_version)
    _int32("ReplayBufferId", replay_buffer_id, low=0)
    _int32("EpisodeNum", episode_num, low=0)
    _int32("StepNum", step_num, low=0)
    return _SIGNAL_AND_FOUR_INTS.pack(
        Signal.SEND_EXPERIENCE, networks_version, replay_buffer_id, episode_num, step_num
    )


def encode_stop() -> bytes:
    """Game side: SendStop."""
    return bytes((Signal.SEND_STOP,))


def encode_network_to_game(network_id: int, version: int, data: PayloadBytes) -> list[bytes | memoryview]:
    """Trainer side: RecvNetwork (signal 3): id, version counter, then the snapshot (a view, not a copy)."""
    _int32("NetworkId", network_id, low=0)
    _int32("NetworksVersion", version)
    return [_SIGNAL_AND_TWO_INTS.pack(Signal.RECV_NETWORK, network_id, version), _byte_view(data)]


def encode_complete() -> bytes:
    """Trainer side: RecvComplete. Afterwards wait for the game to close the socket (§10.7)."""
    return bytes((Signal.RECV_COMPLETE,))


def encode_ping() -> bytes:
    """Trainer side: RecvPing keep-alive."""
    return bytes((Signal.RECV_PING,))
