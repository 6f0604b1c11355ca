"""Facts about the 24-byte network snapshot header and whole snapshots (spec §6.1, §6.3, §10 items 1, 2, 6).

Expected bytes are built with explicit ``struct.pack`` and hand-counted offsets, independently of the code
under test.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol.errors import NNEError, SnapshotError
from protocol.nne.codec import layers_equal, model_byte_size
from protocol.nne.layers import ELU, Array, Concat, Denormalize, Layer, Linear, ReLU, Sequence
from protocol.snapshot import (
    HEADER_BYTES,
    Snapshot,
    SnapshotHeader,
    check_header_matches_model,
    make_snapshot,
    read_snapshot,
    read_snapshot_header,
    snapshot_byte_size,
    snapshot_with_model,
    write_snapshot,
    write_snapshot_into,
)


def i32(*values: int) -> bytes:
    return struct.pack(f"<{len(values)}i", *values)


def u32(*values: int) -> bytes:
    return struct.pack(f"<{len(values)}I", *values)


MAGIC = 0x1E9B0C80
MODEL_HEAD = u32(0x0BA51C01, 1)
HASH_U32 = 0x9E3779B9  # sign bit set: stored as the int32 -1640531527
HASH_I32 = HASH_U32 - 2**32

# A tiny snapshot: ReLU(3). FileData = magic, version, type 7, Size 3 = 16 bytes.
TINY = i32(MAGIC, 1, 3, 3, HASH_I32, 16) + MODEL_HEAD + u32(7, 3)


def test_tiny_snapshot_golden_bytes_both_ways() -> None:
    snap = make_snapshot(ReLU(3), HASH_U32)
    assert write_snapshot(snap) == TINY
    assert snapshot_byte_size(snap) == len(TINY) == 40
    decoded = read_snapshot(TINY)
    assert decoded.header == SnapshotHeader(3, 3, HASH_I32, 16)
    assert decoded.header.compatibility_hash_u32 == HASH_U32
    assert layers_equal(decoded.model, ReLU(3)) and decoded.trailing == b""


def test_make_snapshot_accepts_signed_and_unsigned_hash() -> None:
    assert make_snapshot(ReLU(1), HASH_U32).header == make_snapshot(ReLU(1), HASH_I32).header
    for bad in (2**32, -(2**31) - 1):
        with pytest.raises(SnapshotError, match="CompatibilityHash"):
            make_snapshot(ReLU(1), bad)


# --------------------------------------------------------------------------------------------------
# The three flow-matching networks as the engine builds them (spec §6.3, §10 corrections 1-2)

OBS = 23  # And{a: Continuous(3), b: Array(4, And{c: Continuous(2), d: DiscreteExclusive(3)})} = 3 + 4*5
ACT = 2
HIDDEN = 4


def _zeros(*shape: int) -> np.ndarray:
    return np.zeros(shape, dtype=np.float32)


def _ones(*shape: int) -> np.ndarray:
    return np.ones(shape, dtype=np.float32)


def denoiser(obs: int = OBS, act: int = ACT, hidden: int = HIDDEN, hidden_layers: int = 1) -> Layer:
    """Sequence[Sequence[Linear, ELU, (Linear, ELU)*, Linear], Denormalize(act)]: HiddenLayerNum + 2 linears."""
    widths = [obs + act + 1, *[hidden] * (hidden_layers + 1), act]
    mlp: list[Layer] = []
    for i in range(len(widths) - 1):
        if mlp:
            mlp.append(ELU(widths[i]))
        mlp.append(Linear(widths[i], widths[i + 1], _zeros(widths[i + 1]), _zeros(widths[i], widths[i + 1])))
    return Sequence((Sequence(tuple(mlp)), Denormalize(act, _zeros(act), _ones(act))))


def encoder() -> Layer:
    element = Concat(
        (2, 3), (2, 3), (Denormalize(2, _zeros(2), _ones(2)), Denormalize(3, _zeros(3), _ones(3)))
    )
    return Concat((3, 20), (3, 20), (Denormalize(3, _zeros(3), _ones(3)), Array(4, 5, 5, element)))


def decoder() -> Layer:
    return Denormalize(ACT, _zeros(ACT), _ones(ACT))


# FileDataSize counted by hand from the layouts:
# denoiser: 8 Seq | 16 Seq | 24 Linear 26->4: bias @64, weights @128 (416 B) -> 544 | 544 ELU -> 552
#   | 552 Linear 4->4: bias @576, weights @640 -> 704 | 704 ELU -> 712 | 712 Linear 4->2: bias @768,
#   weights @832 -> 864 | 864 Denormalize: mean @896, std @960 -> 968
# encoder: 8 Concat: sizes @64 and @128 -> 136 | 136 Denormalize(3): mean @192, std @256 -> 268
#   | 268 Array (4, 5, 5) -> 284 | 284 Concat: sizes @320, @384 -> 392 | 392 Denormalize(2): @448, @512
#   -> 520 | 520 Denormalize(3): @576, @640 -> 652
# decoder: 8 Denormalize(2): mean @64, std @128 -> 136
FM_NETWORKS = [
    pytest.param(denoiser, OBS + ACT + 1, ACT, HASH_U32, 968, id="denoiser"),
    pytest.param(encoder, OBS, OBS, 0x12345678, 652, id="encoder"),
    pytest.param(decoder, ACT, ACT, 0x7FFFFFFF, 136, id="decoder"),
]


@pytest.mark.parametrize(("build", "input_size", "output_size", "hash_u32", "file_data_size"), FM_NETWORKS)
def test_flow_matching_network_snapshots(
    build: object, input_size: int, output_size: int, hash_u32: int, file_data_size: int
) -> None:
    assert callable(build)
    model = build()
    snap = make_snapshot(model, hash_u32)
    blob = write_snapshot(snap)
    # Header fields read back independently of the codec.
    assert struct.unpack_from("<6i", blob, 0) == (
        MAGIC,
        1,
        input_size,
        output_size,
        struct.unpack("<i", struct.pack("<I", hash_u32))[0],
        file_data_size,
    )
    assert len(blob) == 24 + file_data_size
    assert blob[24:32] == MODEL_HEAD
    decoded = read_snapshot(blob)
    assert write_snapshot(decoded) == blob
    assert layers_equal(decoded.model, model)
    assert decoded.header.compatibility_hash_u32 == hash_u32
    assert check_header_matches_model(decoded) == ()


def test_denoiser_nesting_and_sizes_follow_the_engine() -> None:
    model = denoiser(hidden_layers=1)
    assert isinstance(model, Sequence) and len(model.layers) == 2
    mlp, denorm = model.layers
    assert isinstance(mlp, Sequence) and isinstance(denorm, Denormalize)
    assert [type(layer).__name__ for layer in mlp.layers] == ["Linear", "ELU", "Linear", "ELU", "Linear"]
    assert (model.input_size, model.output_size) == (OBS + ACT + 1, ACT)


def test_trained_weights_round_trip_bitwise() -> None:
    rng = np.random.default_rng(7)
    template = make_snapshot(denoiser(), HASH_U32)
    trained = _with_random_floats(template.model, rng)
    updated = snapshot_with_model(template, trained)
    blob = write_snapshot(updated)
    assert len(blob) == len(write_snapshot(template))
    assert blob[:24] == write_snapshot(template)[:24]
    assert layers_equal(read_snapshot(blob).model, trained)


def _with_random_floats(layer: Layer, rng: np.random.Generator) -> Layer:
    def rand(a: np.ndarray) -> np.ndarray:
        return rng.standard_normal(a.shape).astype(np.float32)

    if isinstance(layer, Sequence):
        return Sequence(tuple(_with_random_floats(sub, rng) for sub in layer.layers))
    if isinstance(layer, Linear):
        return Linear(layer.input_size, layer.output_size, rand(layer.bias), rand(layer.weights))
    if isinstance(layer, Denormalize):
        return Denormalize(layer.size, rand(layer.mean), rand(layer.std))
    return layer


# --------------------------------------------------------------------------------------------------
# snapshot_with_model: same layout or a SnapshotError naming the first difference


@pytest.mark.parametrize(
    ("other", "difference"),
    [
        (denoiser(hidden=5), "root.layers[0].layers[0].output_size is 4 in one and 5 in the other"),
        (denoiser(hidden_layers=2), "root.layers[0].layers has 5 layers in one and 7 in the other"),
        (denoiser(act=3), "root.layers[0].layers[0].input_size is 26 in one and 27 in the other"),
        (decoder(), "root is a Sequence in one and a Denormalize in the other"),
    ],
)
def test_snapshot_with_model_refuses_layout_changes(other: Layer, difference: str) -> None:
    snap = make_snapshot(denoiser(), HASH_U32)
    with pytest.raises(SnapshotError, match="layout differs") as info:
        snapshot_with_model(snap, other)
    assert difference in str(info.value)


def test_snapshot_with_model_refuses_activation_swap() -> None:
    snap = make_snapshot(Sequence((Linear(1, 1, _zeros(1), _zeros(1, 1)), ELU(1))), 1)
    with pytest.raises(SnapshotError, match=r"root\.layers\[1\] is a ELU in one and a ReLU"):
        snapshot_with_model(snap, Sequence((Linear(1, 1, _zeros(1), _zeros(1, 1)), ReLU(1))))


def test_snapshot_with_model_keeps_header_and_trailing_even_if_header_disagrees() -> None:
    # The engine adopts header sizes as sent (spec §10 item 6): keep whatever was received.
    header = SnapshotHeader(99, 98, -5, 16 + 3)
    snap = Snapshot(header, ReLU(3), b"xyz")
    new = snapshot_with_model(snap, ReLU(3))
    assert new.header == header and new.trailing == b"xyz"
    assert write_snapshot(new) == write_snapshot(snap)


# --------------------------------------------------------------------------------------------------
# Trailing bytes inside FileData and header/model agreement


def test_trailing_file_data_is_kept_byte_exact() -> None:
    blob = i32(MAGIC, 1, 3, 3, 7, 16 + 5) + MODEL_HEAD + u32(7, 3) + b"\x01\x02\x03\x04\x05"
    snap = read_snapshot(blob)
    assert snap.trailing == b"\x01\x02\x03\x04\x05"
    assert write_snapshot(snap) == blob


def test_check_header_matches_model() -> None:
    snap = Snapshot(SnapshotHeader(4, 3, 0, 16), ReLU(3))
    problems = check_header_matches_model(snap)
    assert problems == ("snapshot.InputSize is 4 but the model's root layer says 3",)
    with pytest.raises(SnapshotError, match="InputSize") as info:
        check_header_matches_model(snap, strict=True)
    assert info.value.field == "snapshot.InputSize" and info.value.expected == 3 and info.value.actual == 4
    assert check_header_matches_model(Snapshot(SnapshotHeader(3, 3, 0, 16), ReLU(3)), strict=True) == ()


def test_snapshot_value_checks_file_data_size() -> None:
    with pytest.raises(SnapshotError, match="FileDataSize"):
        Snapshot(SnapshotHeader(3, 3, 0, 17), ReLU(3))
    with pytest.raises(SnapshotError, match="trailing"):
        Snapshot(SnapshotHeader(3, 3, 0, 17), ReLU(3), bytearray(b"x"))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "name"),
    [
        ((-1, 3, 0, 16), "InputSize"),
        ((3, -1, 0, 16), "OutputSize"),
        ((3, 3, 2**31, 16), "CompatibilityHash"),
        ((3, 3, 0, -1), "FileDataSize"),
        ((2**31, 3, 0, 16), "InputSize"),
    ],
)
def test_header_value_ranges(fields: tuple[int, int, int, int], name: str) -> None:
    with pytest.raises(SnapshotError, match=name):
        SnapshotHeader(*fields)


def test_header_extremes_are_accepted() -> None:
    h = SnapshotHeader(2**31 - 1, 0, -(2**31), 2**31 - 1)
    assert h.compatibility_hash_u32 == 0x80000000 and h.snapshot_size == 24 + 2**31 - 1


# --------------------------------------------------------------------------------------------------
# Bad snapshots


def test_header_only_buffer_reads_header() -> None:
    assert read_snapshot_header(TINY[:24]) == SnapshotHeader(3, 3, HASH_I32, 16)
    assert HEADER_BYTES == 24


@pytest.mark.parametrize("length", [0, 1, 23])
def test_shorter_than_header(length: int) -> None:
    for reader in (read_snapshot, read_snapshot_header):
        with pytest.raises(SnapshotError, match="shorter than its header") as info:
            reader(TINY[:length])
        assert info.value.field == "snapshot.length"


@pytest.mark.parametrize("magic", [0, MAGIC + 1, 0x800C9B1E - 2**32, -1])
def test_bad_snapshot_magic(magic: int) -> None:
    with pytest.raises(SnapshotError, match="magic") as info:
        read_snapshot(i32(magic) + TINY[4:])
    assert info.value.field == "snapshot.magic"


@pytest.mark.parametrize("version", [0, 2, -1, 2**31 - 1])
def test_bad_snapshot_version(version: int) -> None:
    with pytest.raises(SnapshotError, match="version") as info:
        read_snapshot(TINY[:4] + i32(version) + TINY[8:])
    assert info.value.field == "snapshot.version"


@pytest.mark.parametrize("size", [-1, -(2**31), 15, 17, 2**31 - 1])
def test_file_data_size_must_match_the_buffer(size: int) -> None:
    with pytest.raises(SnapshotError, match="FileDataSize") as info:
        read_snapshot(TINY[:20] + i32(size) + TINY[24:])
    assert info.value.field == "snapshot.FileDataSize"
    assert not isinstance(info.value, NNEError)


def test_every_split_point_of_a_snapshot_is_refused() -> None:
    blob = write_snapshot(make_snapshot(encoder(), 1))
    for cut in range(len(blob)):
        with pytest.raises(SnapshotError):
            read_snapshot(blob[:cut])
        # With FileDataSize patched to the cut length the header is fine and the model is truncated.
        if cut >= 24:
            patched = blob[:20] + i32(cut - 24) + blob[24:cut]
            with pytest.raises(NNEError, match="truncated"):
                read_snapshot(patched)


def test_model_errors_surface_as_nne_error() -> None:
    blob = i32(MAGIC, 1, 3, 3, 0, 16) + u32(0x0BA51C01, 1, 32, 3)
    with pytest.raises(NNEError, match="unknown layer type id 32"):
        read_snapshot(blob)


def test_write_into_dirty_region_and_small_region() -> None:
    snap = make_snapshot(encoder(), 5)
    expected = write_snapshot(snap)
    region = bytearray(b"\xee" * (len(expected) + 8))
    assert write_snapshot_into(snap, region) == len(expected)
    assert bytes(region[: len(expected)]) == expected and region[len(expected) :] == b"\xee" * 8
    with pytest.raises(SnapshotError, match="too small"):
        write_snapshot_into(snap, bytearray(len(expected) - 1))


# --------------------------------------------------------------------------------------------------
# Hypothesis

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(
    st.integers(1, 40), st.integers(1, 6), st.integers(1, 16), st.integers(0, 3), st.integers(0, 2**32 - 1)
)
def test_denoiser_snapshots_round_trip(obs: int, act: int, hidden: int, layers: int, hash_u32: int) -> None:
    """Invariant: for any denoiser shape, write(read(b)) == b and the header follows the root layer."""
    model = denoiser(obs, act, hidden, layers)
    blob = write_snapshot(make_snapshot(model, hash_u32))
    snap = read_snapshot(blob)
    assert write_snapshot(snap) == blob
    assert snap.header.file_data_size == model_byte_size(model) == len(blob) - 24
    assert (snap.header.input_size, snap.header.output_size) == (obs + act + 1, act)
    assert snap.header.compatibility_hash_u32 == hash_u32


@FUZZ
@given(st.binary(max_size=200))
def test_fuzz_any_bytes(data: bytes) -> None:
    """Invariant: any bytes either decode to a Snapshot or raise SnapshotError; nothing else escapes."""
    _decode_or_snapshot_error(data)
    # Also behind a valid header whose FileDataSize matches, so the model decoder is reached.
    _decode_or_snapshot_error(i32(MAGIC, 1, 3, 3, 0, len(data)) + data)
    _decode_or_snapshot_error(i32(MAGIC, 1, 3, 3, 0, len(data) + 8) + MODEL_HEAD + data)


@FUZZ
@given(
    st.sampled_from(["denoiser", "encoder", "decoder", "tiny"]),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4),
)
def test_fuzz_mutated_snapshots(name: str, edits: list[tuple[int, int]]) -> None:
    """Invariant: a valid snapshot with bytes overwritten either raises SnapshotError or decodes to a
    snapshot that re-encodes to the same length and decodes again; nothing else escapes."""
    blobs = {
        "denoiser": write_snapshot(make_snapshot(denoiser(obs=3, act=1, hidden=2), 1)),
        "encoder": write_snapshot(make_snapshot(encoder(), 2)),
        "decoder": write_snapshot(make_snapshot(decoder(), 3)),
        "tiny": TINY,
    }
    blob = bytearray(blobs[name])
    for pos, value in edits:
        blob[pos % len(blob)] = value
    snap = _decode_or_snapshot_error(bytes(blob))
    if snap is not None:
        again = write_snapshot(snap)
        assert len(again) == len(blob)
        assert layers_equal(read_snapshot(again).model, snap.model)


def _decode_or_snapshot_error(data: bytes) -> Snapshot | None:
    try:
        return read_snapshot(data)
    except SnapshotError:
        return None
