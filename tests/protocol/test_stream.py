"""The socket stream codec (spec §3): one golden table drives encode and decode in both directions.

Every stream is also fed byte by byte, split at every point, with trailing data, and through the zero-copy
get_buffer/buffer_updated path. Golden bytes are written out in hex by hand from the spec's layouts.
"""

from __future__ import annotations

import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.errors import ReplayError, StreamError
from protocol.stream import (
    DEFAULT_MAX_CONFIG_BYTES,
    NEED_DATA,
    Complete,
    ConfigMessage,
    ExperienceMessage,
    GameStreamDecoder,
    NetworkToGame,
    NetworkToTrainer,
    Ping,
    ReplayLayoutLike,
    Signal,
    Stop,
    TrainerStreamDecoder,
    encode_complete,
    encode_config,
    encode_experience_header,
    encode_network_to_game,
    encode_network_to_trainer,
    encode_ping,
    encode_stop,
)

# -- a small replay layout of our own: starts[E] int32, lengths[E] int32, observations[S, 2] float32 ------


@dataclass(frozen=True)
class FakeReplay:
    replay_buffer_id: int
    starts: list[int]
    lengths: list[int]
    observations: list[list[float]]


@dataclass(frozen=True)
class FakeLayout:
    max_episode_num: int = 3
    max_step_num: int = 4
    obs_dim: int = 2
    fail: bool = False

    def socket_body_size(self, episode_num: int, step_num: int) -> int:
        return 8 * episode_num + 4 * self.obs_dim * step_num

    def decode_socket_body(
        self, buf: memoryview, episode_num: int, step_num: int, replay_buffer_id: int
    ) -> Any:
        if len(buf) != self.socket_body_size(episode_num, step_num):
            raise AssertionError("the decoder must hand over exactly the body")
        if self.fail:
            raise ReplayError("EpisodeStarts[0] is past StepNum", field="EpisodeStarts[0]")
        e = episode_num
        starts = np.frombuffer(buf, "<i4", e, 0)
        lengths = np.frombuffer(buf, "<i4", e, 4 * e)
        obs = np.frombuffer(buf, "<f4", step_num * self.obs_dim, 8 * e).reshape(step_num, self.obs_dim)
        return FakeReplay(replay_buffer_id, starts.tolist(), lengths.tolist(), obs.tolist())


SIZES = {0: 3, 1: 5, 2: 1}
LAYOUTS: dict[int, ReplayLayoutLike] = {0: FakeLayout()}
MAX_BODY = max(max(SIZES.values()), FakeLayout().socket_body_size(3, 4))


def norm(event: object) -> object:
    """A comparable form of an event (ExperienceMessage compares by identity)."""
    if isinstance(event, ExperienceMessage):
        return ("experience", event.networks_version, event.replay)
    if isinstance(event, NetworkToTrainer | NetworkToGame):
        return (type(event).__name__, event.network_id, getattr(event, "version", None), bytes(event.data))
    return event


# -- golden table: (event, exact bytes) ------------------------------------------------------------------

CONFIG = (ConfigMessage(b'{"A":1}'), bytes.fromhex("01" + "07000000") + b'{"A":1}')
NET0 = (NetworkToTrainer(0, b"\x10\x11\x12"), bytes.fromhex("04" + "00000000" + "101112"))
NET1 = (NetworkToTrainer(1, b"hello"), bytes.fromhex("04" + "01000000") + b"hello")
NET2 = (NetworkToTrainer(2, b"\xff"), bytes.fromhex("04" + "02000000" + "ff"))
EXPERIENCE = (
    ("experience", -1, FakeReplay(0, [0], [2], [[1.0, 2.0], [3.0, 4.0]])),
    bytes.fromhex(
        "02" + "ffffffff" + "00000000" + "01000000" + "02000000"  # version -1, buffer 0, E=1, S=2
        "00000000" + "02000000"  # starts [0], lengths [2]
        "0000803f" + "00000040" + "00004040" + "00008040"  # 1.0 2.0 3.0 4.0
    ),
)
EMPTY_EXPERIENCE = (
    ("experience", 7, FakeReplay(0, [], [], [])),
    bytes.fromhex("02" + "07000000" + "00000000" + "00000000" + "00000000"),
)
STOP = (Stop(), bytes.fromhex("06"))

TO_TRAINER = [CONFIG, NET0, NET1, NET2, EXPERIENCE, EMPTY_EXPERIENCE, STOP]

TO_GAME = [
    (NetworkToGame(2, 7, b"\xaa"), bytes.fromhex("03" + "02000000" + "07000000" + "aa")),
    (NetworkToGame(0, -1, b"abc"), bytes.fromhex("03" + "00000000" + "ffffffff") + b"abc"),
    (NetworkToGame(1, 2**31 - 1, b"12345"), bytes.fromhex("03" + "01000000" + "ffffff7f") + b"12345"),
    (Complete(), bytes.fromhex("05")),
    (Ping(), bytes.fromhex("07")),
]


def encode_to_trainer(expected: object) -> bytes:
    if isinstance(expected, ConfigMessage):
        return b"".join(encode_config(expected.raw_json))
    if isinstance(expected, NetworkToTrainer):
        return b"".join(encode_network_to_trainer(expected.network_id, expected.data))
    if isinstance(expected, Stop):
        return encode_stop()
    _, version, replay = cast(tuple[str, int, FakeReplay], expected)
    body = (
        np.asarray(replay.starts, "<i4").tobytes()
        + np.asarray(replay.lengths, "<i4").tobytes()
        + np.asarray(replay.observations, "<f4").tobytes()
    )
    e, s = len(replay.starts), len(replay.observations)
    return encode_experience_header(version, replay.replay_buffer_id, e, s) + body


def encode_to_game(event: object) -> bytes:
    if isinstance(event, NetworkToGame):
        return b"".join(encode_network_to_game(event.network_id, event.version, event.data))
    return encode_complete() if isinstance(event, Complete) else encode_ping()


@pytest.mark.parametrize(("expected", "wire"), TO_TRAINER)
def test_golden_encode_to_trainer(expected: object, wire: bytes) -> None:
    assert encode_to_trainer(expected) == wire


@pytest.mark.parametrize(("event", "wire"), TO_GAME)
def test_golden_encode_to_game(event: object, wire: bytes) -> None:
    assert encode_to_game(event) == wire


# -- drivers ------------------------------------------------------------------------------------------


def configured_trainer(max_config_bytes: int = DEFAULT_MAX_CONFIG_BYTES) -> TrainerStreamDecoder:
    decoder = TrainerStreamDecoder(max_config_bytes)
    decoder.feed(CONFIG[1])
    assert decoder.next_event() == CONFIG[0]
    decoder.configure(SIZES, LAYOUTS)
    return decoder


def drain(decoder: TrainerStreamDecoder | GameStreamDecoder, out: list[object]) -> None:
    while True:
        event = decoder.next_event()
        if event is NEED_DATA:
            return
        out.append(norm(event))
        if isinstance(event, ConfigMessage) and isinstance(decoder, TrainerStreamDecoder):
            decoder.configure(SIZES, LAYOUTS)


def feed_chunks(decoder: TrainerStreamDecoder | GameStreamDecoder, chunks: list[bytes]) -> list[object]:
    events: list[object] = []
    for chunk in chunks:
        decoder.feed(chunk)
        drain(decoder, events)
    decoder.eof()
    drain(decoder, events)
    return events


def recv_into_all(
    decoder: TrainerStreamDecoder | GameStreamDecoder, stream: bytes, limit: int
) -> list[object]:
    """What a transport does with sock.recv_into(decoder.get_buffer(-1)), at most ``limit`` bytes a call."""
    events: list[object] = []
    pos = 0
    while pos < len(stream):
        view = decoder.get_buffer(-1)
        assert len(view) > 0
        n = min(len(view), limit, len(stream) - pos)
        view[:n] = stream[pos : pos + n]
        pos += n
        decoder.buffer_updated(n)
        drain(decoder, events)
    decoder.eof()
    drain(decoder, events)
    return events


TRAINER_STREAM = b"".join(w for _, w in [CONFIG, NET0, NET1, NET2, EXPERIENCE, NET0, EMPTY_EXPERIENCE, STOP])
TRAINER_EVENTS = [norm(e) for e, _ in [CONFIG, NET0, NET1, NET2, EXPERIENCE, NET0, EMPTY_EXPERIENCE, STOP]]
GAME_STREAM = b"".join(w for _, w in TO_GAME * 2)
GAME_EVENTS = [norm(e) for e, _ in TO_GAME * 2]

Factory = Callable[[], TrainerStreamDecoder | GameStreamDecoder]
STREAMS: list[tuple[str, Factory, bytes, list[object]]] = [
    ("to-trainer", TrainerStreamDecoder, TRAINER_STREAM, TRAINER_EVENTS),
    ("to-game", lambda: GameStreamDecoder(SIZES), GAME_STREAM, GAME_EVENTS),
]
stream_cases = pytest.mark.parametrize(
    ("name", "make", "stream", "events"), STREAMS, ids=[s[0] for s in STREAMS]
)


@pytest.mark.parametrize(("expected", "wire"), TO_TRAINER[1:])
def test_golden_decode_to_trainer(expected: object, wire: bytes) -> None:
    decoder = configured_trainer()
    decoder.feed(wire)
    assert norm(decoder.next_event()) == norm(expected)
    assert decoder.next_event() is NEED_DATA
    decoder.eof()


@pytest.mark.parametrize(("event", "wire"), TO_GAME)
def test_golden_decode_to_game(event: object, wire: bytes) -> None:
    decoder = GameStreamDecoder(SIZES)
    decoder.feed(wire)
    assert norm(decoder.next_event()) == norm(event)
    assert decoder.next_event() is NEED_DATA
    decoder.eof()


@stream_cases
def test_whole(name: str, make: Factory, stream: bytes, events: list[object]) -> None:
    assert feed_chunks(make(), [stream]) == events


@stream_cases
def test_byte_by_byte(name: str, make: Factory, stream: bytes, events: list[object]) -> None:
    assert feed_chunks(make(), [stream[i : i + 1] for i in range(len(stream))]) == events


@stream_cases
def test_every_split_point(name: str, make: Factory, stream: bytes, events: list[object]) -> None:
    for k in range(len(stream) + 1):
        assert feed_chunks(make(), [stream[:k], stream[k:]]) == events, k


@stream_cases
@pytest.mark.parametrize("limit", [1, 2, 3, 5, 7, 64, 1 << 20])
def test_zero_copy_path_gives_identical_results(
    name: str, make: Factory, stream: bytes, events: list[object], limit: int
) -> None:
    assert recv_into_all(make(), stream, limit) == events


@given(st.data())
@settings(max_examples=60)
def test_random_chunking_mixing_feed_and_get_buffer(data: st.DataObject) -> None:
    """Any chunking, each chunk delivered by feed() or by get_buffer()/buffer_updated(), gives the same events."""
    _name, make, stream, expected = data.draw(st.sampled_from(STREAMS))
    decoder = make()
    events: list[object] = []
    pos = 0
    while pos < len(stream):
        n = data.draw(st.integers(min_value=1, max_value=len(stream) - pos))
        if data.draw(st.booleans()):
            decoder.feed(stream[pos : pos + n])
        else:
            view = decoder.get_buffer(-1)
            n = min(n, len(view))
            view[:n] = stream[pos : pos + n]
            decoder.buffer_updated(n)
        pos += n
        if data.draw(st.booleans()):
            drain(decoder, events)
    drain(decoder, events)
    decoder.eof()
    assert events == expected


@pytest.mark.parametrize(("expected", "wire"), TO_TRAINER[1:])
@pytest.mark.parametrize("next_start", [NET0[1][:1], NET1[1][:3], EXPERIENCE[1][:9]])
def test_trailing_data_begins_the_next_message(expected: object, wire: bytes, next_start: bytes) -> None:
    decoder = configured_trainer()
    decoder.feed(wire + next_start)
    assert norm(decoder.next_event()) == norm(expected)
    assert decoder.next_event() is NEED_DATA
    with pytest.raises(StreamError, match="truncated"):
        decoder.eof()


def test_body_lands_in_the_buffer_handed_out() -> None:
    decoder = configured_trainer()
    assert decoder.body_remaining == 0
    view = decoder.get_buffer(-1)
    assert len(view) == 1  # exactly the signal byte: a recv never reads past a header
    view[:] = b"\x04"
    decoder.buffer_updated(1)
    assert decoder.next_event() is NEED_DATA
    assert decoder.body_remaining == 0  # the header is still missing
    view = decoder.get_buffer(4096)
    assert len(view) == 4  # exactly the NetworkId, whatever the hint
    view[:] = (1).to_bytes(4, "little")
    decoder.buffer_updated(4)
    assert decoder.next_event() is NEED_DATA
    assert decoder.body_size == 5
    assert decoder.body_remaining == 5
    view = decoder.get_buffer(-1)
    assert len(view) == 5
    view[:2] = b"he"
    decoder.buffer_updated(2)
    assert decoder.body_remaining == 3  # back-to-back receives need no next_event() in between
    view = decoder.get_buffer(-1)
    assert len(view) == 3
    view[:] = b"llo"
    decoder.buffer_updated(3)
    assert decoder.body_remaining == 0
    event = decoder.next_event()
    assert isinstance(event, NetworkToTrainer)
    assert bytes(event.data) == b"hello"
    assert isinstance(event.data, memoryview)
    assert event.data.obj is view.obj  # the very buffer recv_into wrote: no copy
    assert event.data.readonly


def test_feed_accepts_any_contiguous_buffer() -> None:
    decoder = GameStreamDecoder({0: 8})
    payload = array.array("i", [1, 2])  # a non-byte format: fed as its 8 raw bytes
    decoder.feed(b"\x03" + bytes(8))
    decoder.feed(memoryview(payload))
    event = decoder.next_event()
    assert isinstance(event, NetworkToGame)
    assert bytes(event.data) == payload.tobytes()


# -- limits -----------------------------------------------------------------------------------------------


def _config_header(n: int) -> bytes:
    return b"\x01" + n.to_bytes(4, "little", signed=True)


def test_config_byte_num_zero_and_max() -> None:
    decoder = TrainerStreamDecoder(max_config_bytes=16)
    decoder.feed(_config_header(0))
    assert decoder.next_event() == ConfigMessage(b"")
    decoder = TrainerStreamDecoder(max_config_bytes=16)
    decoder.feed(_config_header(16) + b"x" * 16)
    assert decoder.next_event() == ConfigMessage(b"x" * 16)


@pytest.mark.parametrize(
    ("max_bytes", "n"), [(16, 17), (16, -1), (DEFAULT_MAX_CONFIG_BYTES, 2**31 - 1), (16, -(2**31))]
)
def test_config_byte_num_out_of_range_allocates_nothing(max_bytes: int, n: int) -> None:
    decoder = TrainerStreamDecoder(max_config_bytes=max_bytes)
    decoder.feed(_config_header(n))
    with pytest.raises(StreamError, match="ConfigByteNum") as info:
        decoder.next_event()
    assert info.value.actual == n
    assert decoder.body_size is None


def test_default_config_limit_is_64_mib() -> None:
    assert DEFAULT_MAX_CONFIG_BYTES == 64 * 1024 * 1024
    decoder = TrainerStreamDecoder()
    decoder.feed(_config_header(DEFAULT_MAX_CONFIG_BYTES))
    assert decoder.next_event() is NEED_DATA
    assert decoder.body_size == DEFAULT_MAX_CONFIG_BYTES


@pytest.mark.parametrize("byte", [0, 8, 255])
def test_unknown_signal_bytes(byte: int) -> None:
    for decoder in (configured_trainer(), GameStreamDecoder(SIZES)):
        decoder.feed(bytes([byte]))
        with pytest.raises(StreamError, match=f"signal byte {byte}"):
            decoder.next_event()


@pytest.mark.parametrize("byte", [3, 5, 7])
def test_trainer_side_refuses_trainer_to_game_signals(byte: int) -> None:
    decoder = configured_trainer()
    decoder.feed(bytes([byte]))
    with pytest.raises(StreamError, match="never receives it"):
        decoder.next_event()


@pytest.mark.parametrize("byte", [1, 2, 4, 6])
def test_game_side_refuses_game_to_trainer_signals(byte: int) -> None:
    decoder = GameStreamDecoder(SIZES)
    decoder.feed(bytes([byte]))
    with pytest.raises(StreamError, match="never receives it"):
        decoder.next_event()


@pytest.mark.parametrize("wire", [NET0[1], EXPERIENCE[1]])
def test_before_the_config_only_config_and_stop(wire: bytes) -> None:
    decoder = TrainerStreamDecoder()
    decoder.feed(wire)
    with pytest.raises(StreamError, match="waiting for SendConfig"):
        decoder.next_event()


def test_stop_before_the_config_is_fine() -> None:
    decoder = TrainerStreamDecoder()
    decoder.feed(STOP[1])
    assert decoder.next_event() == Stop()


def test_sized_message_before_configure_names_the_state() -> None:
    decoder = TrainerStreamDecoder()
    decoder.feed(CONFIG[1] + NET0[1])
    assert decoder.next_event() == CONFIG[0]
    with pytest.raises(StreamError, match=r"SendNetwork.*configure\(\) not called"):
        decoder.next_event()


def test_second_config_and_second_configure() -> None:
    decoder = configured_trainer()
    decoder.feed(CONFIG[1])
    with pytest.raises(StreamError, match="second time"):
        decoder.next_event()
    decoder = configured_trainer()
    with pytest.raises(StreamError, match="once"):
        decoder.configure(SIZES, LAYOUTS)


@pytest.mark.parametrize("network_id", [3, -1, 2**31 - 1])
def test_unknown_network_id(network_id: int) -> None:
    wire = network_id.to_bytes(4, "little", signed=True)
    trainer = configured_trainer()
    trainer.feed(b"\x04" + wire)
    with pytest.raises(StreamError, match="NetworkId") as info:
        trainer.next_event()
    assert (info.value.actual, info.value.expected) == (network_id, [0, 1, 2])
    assert trainer.body_size is None
    game = GameStreamDecoder(SIZES)
    game.feed(b"\x03" + wire + bytes(4))
    with pytest.raises(StreamError, match="NetworkId"):
        game.next_event()


@pytest.mark.parametrize(
    ("replay_id", "e", "s", "field"),
    [
        (1, 0, 0, "ReplayBufferId"),
        (-1, 0, 0, "ReplayBufferId"),
        (0, 4, 0, "EpisodeNum"),
        (0, -1, 0, "EpisodeNum"),
        (0, 2**31 - 1, 0, "EpisodeNum"),
        (0, 0, 5, "StepNum"),
        (0, 0, -1, "StepNum"),
        (0, 0, -(2**31), "StepNum"),
    ],
)
def test_experience_header_bounds_before_allocation(replay_id: int, e: int, s: int, field: str) -> None:
    decoder = configured_trainer()
    header = b"".join(v.to_bytes(4, "little", signed=True) for v in (0, replay_id, e, s))
    decoder.feed(b"\x02" + header)
    with pytest.raises(StreamError, match=field) as info:
        decoder.next_event()
    assert info.value.field == field
    assert decoder.body_size is None


def test_experience_at_the_layout_maximum() -> None:
    decoder = configured_trainer()
    body = bytes(FakeLayout().socket_body_size(3, 4))
    decoder.feed(encode_experience_header(5, 0, 3, 4) + body)
    event = decoder.next_event()
    assert isinstance(event, ExperienceMessage)
    assert event.networks_version == 5
    assert cast(FakeReplay, event.replay).observations == [[0.0, 0.0]] * 4


@pytest.mark.parametrize(("expected", "wire"), [*TO_TRAINER[1:], CONFIG])
def test_truncated_at_eof(expected: object, wire: bytes) -> None:
    for k in range(1, len(wire)):
        decoder = configured_trainer() if wire is not CONFIG[1] else TrainerStreamDecoder()
        decoder.feed(wire[:k])
        assert decoder.next_event() is NEED_DATA
        with pytest.raises(StreamError, match=f"truncated .* after {k}"):
            decoder.eof()


def test_truncation_message_counts_bytes() -> None:
    decoder = configured_trainer()
    decoder.feed(NET1[1][:7])
    assert decoder.next_event() is NEED_DATA
    with pytest.raises(StreamError, match="truncated SendNetwork message after 7 of 10 bytes"):
        decoder.eof()
    game = GameStreamDecoder(SIZES)
    game.feed(b"\x03\x00")
    assert game.next_event() is NEED_DATA
    with pytest.raises(StreamError, match="truncated RecvNetwork message after 2 bytes: its 9-byte header"):
        game.eof()


def test_eof_before_draining_still_delivers() -> None:
    decoder = GameStreamDecoder(SIZES)
    decoder.feed(TO_GAME[0][1] + b"\x07")
    decoder.eof()
    assert norm(decoder.next_event()) == norm(TO_GAME[0][0])
    assert decoder.next_event() == Ping()
    assert decoder.next_event() is NEED_DATA


def test_clean_eof_and_use_after_eof() -> None:
    decoder = GameStreamDecoder(SIZES)
    decoder.eof()
    assert decoder.next_event() is NEED_DATA
    with pytest.raises(StreamError, match="after eof"):
        decoder.feed(b"\x07")


def test_a_decoder_that_raised_refuses_further_use() -> None:
    decoder = GameStreamDecoder(SIZES)
    decoder.feed(b"\x00")
    with pytest.raises(StreamError):
        decoder.next_event()
    for call in (
        decoder.next_event,
        lambda: decoder.feed(b"\x07"),
        lambda: decoder.get_buffer(-1),
        decoder.eof,
    ):
        with pytest.raises(StreamError, match="refuses"):
            call()


def test_layout_errors_pass_through_and_poison_the_decoder() -> None:
    decoder = TrainerStreamDecoder()
    decoder.feed(CONFIG[1])
    decoder.next_event()
    decoder.configure(SIZES, {0: FakeLayout(fail=True)})
    decoder.feed(EXPERIENCE[1])
    with pytest.raises(ReplayError, match="EpisodeStarts"):
        decoder.next_event()
    with pytest.raises(StreamError, match="refuses"):
        decoder.next_event()


def test_buffer_protocol_misuse() -> None:
    decoder = GameStreamDecoder(SIZES)
    with pytest.raises(StreamError, match="without get_buffer"):
        decoder.buffer_updated(1)
    decoder = GameStreamDecoder(SIZES)
    decoder.get_buffer(-1)
    with pytest.raises(StreamError, match="outside the view"):
        decoder.buffer_updated(2)
    decoder = GameStreamDecoder(SIZES)
    decoder.get_buffer(-1)
    decoder.feed(b"\x07")  # feed() abandons the unreported view ...
    with pytest.raises(StreamError, match="without get_buffer"):
        decoder.buffer_updated(1)  # ... so this report has no view to refer to


def test_an_abandoned_get_buffer_is_harmless() -> None:
    # asyncio calls get_buffer() again when a read would block, without buffer_updated().
    decoder = GameStreamDecoder(SIZES)
    decoder.get_buffer(-1)
    view = decoder.get_buffer(-1)
    view[:1] = b"\x07"
    decoder.buffer_updated(1)
    assert decoder.next_event() == Ping()


@pytest.mark.parametrize("sizes", [{-1: 3}, {0: -1}, {0: 2**31}, {2**31: 1}, {0: True}])
def test_bad_network_sizes(sizes: dict[int, int]) -> None:
    with pytest.raises(StreamError):
        GameStreamDecoder(sizes)


# -- encoders ---------------------------------------------------------------------------------------------


def test_encoders_do_not_copy_payloads() -> None:
    data = bytearray(b"snapshot")
    parts = encode_network_to_game(1, 3, data)
    assert isinstance(parts[1], memoryview) and parts[1].obj is data
    parts = encode_network_to_trainer(1, data)
    assert isinstance(parts[1], memoryview) and parts[1].obj is data
    parts = encode_config(data)
    assert isinstance(parts[1], memoryview) and parts[1].obj is data


@pytest.mark.parametrize(
    "call",
    [
        lambda: encode_network_to_game(-1, 0, b""),
        lambda: encode_network_to_game(0, 2**31, b""),
        lambda: encode_network_to_trainer(2**31, b""),
        lambda: encode_experience_header(0, 0, -1, 0),
        lambda: encode_experience_header(2**31, 0, 0, 0),
        lambda: encode_experience_header(0, -1, 0, 0),
    ],
)
def test_encoders_refuse_values_outside_int32(call: Callable[[], object]) -> None:
    with pytest.raises(StreamError):
        call()


def test_signal_values() -> None:
    assert [s.value for s in Signal] == list(range(8))
    assert encode_stop() == b"\x06" and encode_complete() == b"\x05" and encode_ping() == b"\x07"


# -- fuzz -------------------------------------------------------------------------------------------------

_INTERESTING = [-(2**31), -1, 0, 1, 2, 3, 4, 5, 16, 17, 2**31 - 1]
_PIECES = (
    [bytes([b]) for b in (*range(9), 255)]
    + [v.to_bytes(4, "little", signed=True) for v in _INTERESTING]
    + [w for _, w in TO_TRAINER]
    + [w for _, w in TO_GAME]
    + [encode_experience_header(0, r, e, s) for r in (0, 1) for e in (0, 1, 3, 4) for s in (0, 2, 4, 5)]
)
# Pieces twice as likely as raw bytes: random bytes are mostly unknown signals and end a run early.
_piece = st.sampled_from(_PIECES)
_fuzz_bytes = st.lists(st.one_of(_piece, _piece, st.binary(max_size=8)), max_size=24)
_MAX_CONFIG = 32


def _fuzz_run(
    decoder: TrainerStreamDecoder | GameStreamDecoder, pieces: list[bytes], zero_copy: bool
) -> None:
    bound = max(_MAX_CONFIG, MAX_BODY)
    for piece in pieces:
        if zero_copy:
            rest = memoryview(piece)
            while rest:
                view = decoder.get_buffer(-1)
                n = min(len(view), len(rest))
                view[:n] = rest[:n]
                rest = rest[n:]
                decoder.buffer_updated(n)
        else:
            decoder.feed(piece)
        while (event := decoder.next_event()) is not NEED_DATA:
            assert decoder.body_size is None or decoder.body_size <= bound
            if isinstance(event, ConfigMessage):
                assert len(event.raw_json) <= _MAX_CONFIG
                assert isinstance(decoder, TrainerStreamDecoder)
                decoder.configure(SIZES, LAYOUTS)
            elif isinstance(event, NetworkToTrainer | NetworkToGame):
                assert len(event.data) == SIZES[event.network_id]
        assert decoder.body_size is None or decoder.body_size <= bound
    decoder.eof()


@given(_fuzz_bytes, st.sampled_from(["trainer", "configured trainer", "game"]), st.booleans())
@settings(max_examples=400)
def test_fuzz(pieces: list[bytes], side: str, zero_copy: bool) -> None:
    """Any bytes either decode or raise StreamError; nothing else escapes, nothing allocates past max_config_bytes or the configured sizes."""
    decoder: TrainerStreamDecoder | GameStreamDecoder = (
        GameStreamDecoder(SIZES) if side == "game" else TrainerStreamDecoder(_MAX_CONFIG)
    )
    if side == "configured trainer":
        pieces = [CONFIG[1], *pieces]  # start past the config so the sized messages are reachable
    try:
        _fuzz_run(decoder, pieces, zero_copy)
    except StreamError:
        pass
