"""Facts about the NNERuntimeBasicCpu model codec (spec §6.2, §10).

The golden table below is written independently of the codec: every expected blob is assembled from
explicit ``struct.pack`` calls and explicit zero padding, with the byte offset of each field counted by
hand in the comment next to it. The same table drives the encode and the decode tests.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from protocol.errors import NNEError, ProtocolError, SnapshotError
from protocol.nne import codec
from protocol.nne.codec import (
    MAX_LAYER_DEPTH,
    NNEDecodeError,
    first_structure_difference,
    layers_equal,
    model_byte_size,
    read_model,
    read_model_prefix,
    structure_key,
    write_model,
    write_model_into,
)
from protocol.nne.layers import (
    ELU,
    GELU,
    AggregateOrExclusive,
    AggregateOrInclusive,
    AggregateSet,
    Array,
    Clamp,
    CompressedLinear,
    Concat,
    Conv1d,
    Conv2d,
    Copy,
    Denormalize,
    FiLM,
    GRUCell,
    Layer,
    LayerNorm,
    LayerType,
    Linear,
    LipschiztLinear,
    MemoryCell,
    MultiLinear,
    Normalize,
    PReLU,
    ReLU,
    Residual,
    Sequence,
    Slice,
    Softmax,
    SparseMixtureOfExperts,
    Spread,
    TanH,
    Tile,
)
from protocol.nne.layout import children
from protocol.nne.reference import evaluate

# --------------------------------------------------------------------------------------------------
# Byte-building helpers (independent of the codec)


def u32(*values: int) -> bytes:
    return struct.pack(f"<{len(values)}I", *values)


def u16(*values: int) -> bytes:
    return struct.pack(f"<{len(values)}H", *values)


def f32(*values: float) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def z(n: int) -> bytes:
    return bytes(n)


def fa(*values: float, shape: tuple[int, ...] | None = None) -> np.ndarray:
    arr = np.array(values, dtype=np.float32)
    return arr if shape is None else arr.reshape(shape)


HEAD = u32(0x0BA51C01, 1)  # offsets 0 (magic) and 4 (version); the root layer starts at 8


# --------------------------------------------------------------------------------------------------
# Golden table: (id, layer value, exact bytes)

GOLDEN: list[tuple[str, Layer, bytes]] = [
    (
        "Sequence",
        Sequence((ReLU(2),)),
        # 8 type 1 | 12 LayerNum 1 | 16 type 7 | 20 Size 2 | end 24
        HEAD + u32(1, 1) + u32(7, 2),
    ),
    (
        "Normalize",
        Normalize(2, fa(1, 2), fa(3, 4)),
        # 8 type | 12 Size | 16..64 pad | 64 Mean (8) | 72..128 pad | 128 Std (8) | end 136
        HEAD + u32(2, 2) + z(48) + f32(1, 2) + z(56) + f32(3, 4),
    ),
    (
        "Normalize-empty",
        Normalize(0, fa(), fa()),
        # empty arrays still align: 16..64 pad | Mean at 64 (0 bytes) | Std at 64 (0 bytes) | end 64
        HEAD + u32(2, 0) + z(48),
    ),
    (
        "Denormalize",
        Denormalize(1, fa(0.5), fa(2.0)),
        # 8 type | 12 Size | 16..64 pad | 64 Mean (4) | 68..128 pad | 128 Std (4) | end 132
        HEAD + u32(3, 1) + z(48) + f32(0.5) + z(60) + f32(2.0),
    ),
    (
        "Linear",
        Linear(2, 1, fa(0.25), fa(1, 2, shape=(2, 1))),
        # 8 type | 12 In | 16 Out | 20..64 pad | 64 Bias (4) | 68..128 pad | 128 Weights (8) | end 136
        HEAD + u32(4, 2, 1) + z(44) + f32(0.25) + z(60) + f32(1, 2),
    ),
    (
        "Linear-long-bias",
        Linear(1, 17, fa(*range(17)), fa(*range(100, 117), shape=(1, 17))),
        # 20..64 pad | 64 Bias (68) -> 132 | 132..192 pad | 192 Weights (68) | end 260
        HEAD + u32(4, 1, 17) + z(44) + f32(*range(17)) + z(60) + f32(*range(100, 117)),
    ),
    (
        "CompressedLinear",
        CompressedLinear(1, 3, fa(0.5), fa(2.0), fa(1, 2, 3), np.array([[1, 2, 3]], dtype=np.uint16)),
        # 8 type | 12 In | 16 Out | 20..64 pad | 64 Offsets (4) | 68..128 pad | 128 Scales (4)
        # | 132..192 pad | 192 Bias (12) | 204..256 pad | 256 uint16 Weights (6) | end 262
        HEAD
        + u32(5, 1, 3)
        + z(44)
        + f32(0.5)
        + z(60)
        + f32(2.0)
        + z(60)
        + f32(1, 2, 3)
        + z(52)
        + u16(1, 2, 3),
    ),
    (
        "CompressedLinear-then-scalar",
        Sequence((CompressedLinear(1, 1, fa(0), fa(1), fa(0), np.array([[7]], dtype=np.uint16)), ReLU(1))),
        # 8 type 1 | 12 count 2 | 16 type 5 | 20 In | 24 Out | 28..64 pad | 64 Offsets | 68..128 pad
        # | 128 Scales | 132..192 pad | 192 Bias | 196..256 pad | 256 Weights (2) -> 258
        # | 258..260 pad (the next scalar is 4-byte aligned) | 260 type 7 | 264 Size | end 268
        HEAD
        + u32(1, 2, 5, 1, 1)
        + z(36)
        + f32(0)
        + z(60)
        + f32(1)
        + z(60)
        + f32(0)
        + z(60)
        + u16(7)
        + z(2)
        + u32(7, 1),
    ),
    (
        "MultiLinear",
        MultiLinear(2, 1, 1, fa(1, 2, shape=(2, 1)), fa(3, 4, shape=(2, 1, 1))),
        # 8 type | 12 Blocks | 16 In | 20 Out | 24..64 pad | 64 Bias (8) | 72..128 pad | 128 Weights (8) | end 136
        HEAD + u32(6, 2, 1, 1) + z(40) + f32(1, 2) + z(56) + f32(3, 4),
    ),
    ("ReLU", ReLU(5), HEAD + u32(7, 5)),
    ("ELU", ELU(4), HEAD + u32(8, 4)),
    ("TanH", TanH(3), HEAD + u32(9, 3)),
    (
        "PReLU",
        PReLU(2, fa(0.1, 0.2)),
        # 8 type | 12 Size | 16..64 pad | 64 Alpha (8) | end 72
        HEAD + u32(10, 2) + z(48) + f32(0.1, 0.2),
    ),
    (
        "MemoryCell",
        # In 2, Out 1, Memory 3: four gates read [x ‖ memory] (5 wide), output_memory reads the memory.
        MemoryCell(2, 1, 3, Slice(5, 2, 3), Slice(5, 0, 1), Slice(5, 1, 3), Slice(5, 4, 1), Slice(3, 0, 1)),
        # 8 type | 12 In | 16 Out | 20 Memory | 24 Slice | 40 Slice | 56 Slice | 72 Slice | 88 Slice | end 104
        HEAD
        + u32(11, 2, 1, 3)
        + u32(25, 5, 2, 3)
        + u32(25, 5, 0, 1)
        + u32(25, 5, 1, 3)
        + u32(25, 5, 4, 1)
        + u32(25, 3, 0, 1),
    ),
    ("Copy", Copy(6), HEAD + u32(12, 6)),
    (
        "Concat",
        Concat((1, 2), (1, 2), (ReLU(1), TanH(2))),
        # 8 type | 12 LayerNum | 16..64 pad | 64 InputSizes (8) | 72..128 pad | 128 OutputSizes (8)
        # | 136 ReLU | 144 TanH | end 152
        HEAD + u32(13, 2) + z(48) + u32(1, 2) + z(56) + u32(1, 2) + u32(7, 1, 9, 2),
    ),
    (
        "Concat-empty",
        Concat((), (), ()),
        # 8 type | 12 LayerNum 0 | 16..64 pad | both empty size arrays at 64 | end 64
        HEAD + u32(13, 0) + z(48),
    ),
    (
        "Array",
        Array(3, 2, 2, ReLU(2)),
        # 8 type | 12 ElementNum | 16 ElementIn | 20 ElementOut | 24 ReLU | end 32
        HEAD + u32(14, 3, 2, 2) + u32(7, 2),
    ),
    (
        "AggregateSet",
        # Max 5, ElementIn 1, ElementOut 2, OutputEncoding 3, AttentionEncoding 1, Heads 2: element 1 -> 2,
        # query and key 2 -> Heads·AttentionEncoding = 2, value 2 -> Heads·OutputEncoding = 6.
        AggregateSet(5, 1, 2, 3, 1, 2, Tile(1, 2), ReLU(2), ELU(2), Tile(2, 3)),
        # 8 type | 12..36 six sizes | 36 Tile | 48 ReLU | 56 ELU | 64 Tile | end 76
        HEAD + u32(15, 5, 1, 2, 3, 1, 2) + u32(23, 1, 2) + u32(7, 2) + u32(8, 2) + u32(23, 2, 3),
    ),
    (
        "AggregateOrExclusive",
        # Branch 0: sub-layer 1 -> 3 (OutputSizes), encoder 3 -> 2 (OutputEncodingSize).
        AggregateOrExclusive(2, (1,), (3,), (Tile(1, 3),), (Slice(3, 1, 2),)),
        # 8 type | 12 LayerNum | 16 OutputEncodingSize | 20..64 pad | 64 InputSizes (4) | 68..128 pad
        # | 128 OutputSizes (4) | 132 Tile | 144 Slice | end 160
        HEAD + u32(16, 1, 2) + z(44) + u32(1) + z(60) + u32(3) + u32(23, 1, 3) + u32(25, 3, 1, 2),
    ),
    (
        "AggregateOrInclusive",
        # OutEnc 3, AttnEnc 2, Heads 1: sub-layer 1 -> 1, query and key 1 -> 2, value 1 -> 3.
        AggregateOrInclusive(3, 2, 1, (1,), (1,), (Copy(1),), (Tile(1, 2),), (Tile(1, 2),), (Tile(1, 3),)),
        # 8 type | 12 LayerNum | 16 OutEnc | 20 AttnEnc | 24 Heads | 28..64 pad | 64 InputSizes (4)
        # | 68..128 pad | 128 OutputSizes (4) | 132 Copy | 140 Tile | 152 Tile | 164 Tile | end 176
        HEAD
        + u32(17, 1, 3, 2, 1)
        + z(36)
        + u32(1)
        + z(60)
        + u32(1)
        + u32(12, 1)
        + u32(23, 1, 2)
        + u32(23, 1, 2)
        + u32(23, 1, 3),
    ),
    (
        "Clamp",
        Clamp(2, fa(-1, -2), fa(1, 2)),
        # 8 type | 12 Size | 16..64 pad | 64 Min (8) | 72..128 pad | 128 Max (8) | end 136
        HEAD + u32(18, 2) + z(48) + f32(-1, -2) + z(56) + f32(1, 2),
    ),
    (
        "SparseMixtureOfExperts",
        SparseMixtureOfExperts(2, 2, Copy(2), (ReLU(2), TanH(2))),
        # 8 type | 12 In | 16 Out | 20 gating Copy | 28 ExpertNum | 32 ReLU | 40 TanH | end 48
        HEAD + u32(19, 2, 2) + u32(12, 2) + u32(2) + u32(7, 2, 9, 2),
    ),
    ("GELU", GELU(7), HEAD + u32(20, 7)),
    (
        "LayerNorm",
        LayerNorm(2, fa(0, 1), fa(2, 3), 0.5),
        # 8 type | 12 Size | 16..64 pad | 64 Offset (8) | 72..128 pad | 128 Scale (8) | 136 Epsilon | end 140
        HEAD + u32(21, 2) + z(48) + f32(0, 1) + z(56) + f32(2, 3) + f32(0.5),
    ),
    (
        "LipschiztLinear",
        LipschiztLinear(1, 2, fa(1, 2), fa(3, 4, shape=(1, 2))),
        # 8 type | 12 In | 16 Out | 20..64 pad | 64 Bias (8) | 72..128 pad | 128 Weights (8) | end 136
        HEAD + u32(22, 1, 2) + z(44) + f32(1, 2) + z(56) + f32(3, 4),
    ),
    ("Tile", Tile(3, 2), HEAD + u32(23, 3, 2)),
    (
        "Spread",
        Spread(2, (2, 1), (ReLU(2), Slice(2, 1, 1))),
        # 8 type | 12 LayerNum | 16 InputSize | 20..64 pad | 64 OutputSizes (8) | 72 ReLU | 80 Slice | end 96
        HEAD + u32(24, 2, 2) + z(44) + u32(2, 1) + u32(7, 2) + u32(25, 2, 1, 1),
    ),
    ("Slice", Slice(5, 1, 3), HEAD + u32(25, 5, 1, 3)),
    ("Residual", Residual(2, ReLU(2)), HEAD + u32(26, 2) + u32(7, 2)),
    (
        "FiLM",
        FiLM(1, 2, 1, 4, 2, 2, Tile(1, 2), Tile(1, 4), ReLU(2)),
        # 8 type | 12..36 six sizes | 36 Tile | 48 Tile | 60 ReLU | end 68
        HEAD + u32(27, 1, 2, 1, 4, 2, 2) + u32(23, 1, 2) + u32(23, 1, 4) + u32(7, 2),
    ),
    (
        "GRUCell",
        # In 2, Out 1: the three gates read [x ‖ h] (3 wide) and write Out.
        GRUCell(2, 1, Slice(3, 0, 1), Slice(3, 1, 1), Slice(3, 2, 1)),
        # 8 type | 12 In | 16 Out | 20 Slice | 36 Slice | 52 Slice | end 68
        HEAD + u32(28, 2, 1) + u32(25, 3, 0, 1) + u32(25, 3, 1, 1) + u32(25, 3, 2, 1),
    ),
    (
        "Conv1d",
        # The sub-layer runs first and writes InChannels·InputLength = 3.
        Conv1d(3, 1, 1, 2, 0, 0, fa(0.5, -0.5, shape=(1, 1, 2)), fa(0.25), ReLU(3)),
        # 8 type | 12..36 six sizes | 36..64 pad | 64 Weights (8) | 72..128 pad | 128 Bias (4) | 132 ReLU | end 140
        HEAD + u32(29, 3, 1, 1, 2, 0, 0) + z(28) + f32(0.5, -0.5) + z(56) + f32(0.25) + u32(7, 3),
    ),
    (
        "Conv1d-channel-major",
        # Length 2, In 2, Out 3, Kernel 1: Weights[o][i][0] = 1 + 2·o + i on the wire.
        Conv1d(2, 2, 3, 1, 0, 0, fa(1, 2, 3, 4, 5, 6, shape=(3, 2, 1)), fa(7, 8, 9), Copy(4)),
        # 8 type | 12..36 six sizes | 36..64 pad | 64 Weights (24) | 88..128 pad | 128 Bias (12) | 140 Copy
        # | end 148
        HEAD + u32(29, 2, 2, 3, 1, 0, 0) + z(28) + f32(1, 2, 3, 4, 5, 6) + z(40) + f32(7, 8, 9) + u32(12, 4),
    ),
    (
        "Conv2d",
        Conv2d(2, 2, 1, 1, 1, 1, 0, 0, fa(2.0, shape=(1, 1, 1, 1)), fa(0.0), ReLU(4)),
        # 8 type | 12..44 eight sizes | 44..64 pad | 64 Weights (4) | 68..128 pad | 128 Bias (4) | 132 ReLU | end 140
        HEAD + u32(30, 2, 2, 1, 1, 1, 1, 0, 0) + z(20) + f32(2.0) + z(60) + f32(0.0) + u32(7, 4),
    ),
    (
        "Conv2d-channel-major",
        # 1x1 image, In 2, Out 2, Kernel 1: Weights[o][i][0][0] = 1 + 2·o + i on the wire.
        Conv2d(1, 1, 2, 2, 1, 1, 0, 0, fa(1, 2, 3, 4, shape=(2, 2, 1, 1)), fa(5, 6), Copy(2)),
        # 8 type | 12..44 eight sizes | 44..64 pad | 64 Weights (16) | 80..128 pad | 128 Bias (8) | 136 Copy
        # | end 144
        HEAD + u32(30, 1, 1, 2, 2, 1, 1, 0, 0) + z(20) + f32(1, 2, 3, 4) + z(48) + f32(5, 6) + u32(12, 2),
    ),
    ("Softmax", Softmax(3), HEAD + u32(31, 3)),
    (
        "nested-MLP",
        Sequence(
            (Sequence((Linear(1, 1, fa(0), fa(1, shape=(1, 1))), ELU(1))), Denormalize(1, fa(0), fa(1)))
        ),
        # 8 Seq | 12 count 2 | 16 Seq | 20 count 2 | 24 Linear | 28 In | 32 Out | 36..64 pad | 64 Bias
        # | 68..128 pad | 128 Weights -> 132 | 132 ELU | 136 Size | 140 Denormalize | 144 Size
        # | 148..192 pad | 192 Mean | 196..256 pad | 256 Std | end 260
        HEAD
        + u32(1, 2, 1, 2, 4, 1, 1)
        + z(28)
        + f32(0)
        + z(60)
        + f32(1)
        + u32(8, 1)
        + u32(3, 1)
        + z(44)
        + f32(0)
        + z(60)
        + f32(1),
    ),
]

GOLDEN_IDS = [name for name, _, _ in GOLDEN]
GOLDEN_PARAMS = [pytest.param(layer, blob, id=name) for name, layer, blob in GOLDEN]


def test_golden_table_covers_every_layer_type() -> None:
    covered: set[int] = set()

    def visit(layer: Layer) -> None:
        covered.add(int(layer.type_id))
        for child in children(layer):
            visit(child)

    for _, layer, _ in GOLDEN:
        visit(layer)
    assert covered == {int(t) for t in LayerType if t != LayerType.INVALID}
    assert len(covered) == 31


def test_golden_lengths_match_hand_counted_ends() -> None:
    ends = {"Normalize": 136, "CompressedLinear": 262, "CompressedLinear-then-scalar": 268, "Concat": 152}
    ends |= {"Linear-long-bias": 260, "AggregateOrInclusive": 176, "nested-MLP": 260, "Concat-empty": 64}
    ends |= {"MemoryCell": 104, "Conv1d-channel-major": 148, "Conv2d-channel-major": 144}
    blobs = {name: blob for name, _, blob in GOLDEN}
    assert {name: len(blobs[name]) for name in ends} == ends


def test_golden_values_are_well_formed_engine_networks() -> None:
    # Every value evaluates (numpy oracle, independent of the codec) at its declared widths, so the
    # table never holds sub-layers whose widths the engine would refuse. Ones set every mask bit.
    for name, layer, _ in GOLDEN:
        y = evaluate(layer, np.ones((2, layer.input_size), np.float32))
        assert y.shape == (2, layer.output_size), name


def test_conv_weights_are_read_channel_major() -> None:
    blobs = {name: blob for name, _, blob in GOLDEN}
    conv1d = read_model(blobs["Conv1d-channel-major"])
    conv2d = read_model(blobs["Conv2d-channel-major"])
    assert isinstance(conv1d, Conv1d) and isinstance(conv2d, Conv2d)
    # Flat [Out][In][K...] order: the value at weights[o, i] is 1 + 2·o + i, not the transpose.
    assert conv1d.weights[:, :, 0].tolist() == [[1, 2], [3, 4], [5, 6]]
    assert conv2d.weights[:, :, 0, 0].tolist() == [[1, 2], [3, 4]]


@pytest.mark.parametrize(("layer", "blob"), GOLDEN_PARAMS)
def test_write_matches_golden_bytes(layer: Layer, blob: bytes) -> None:
    assert write_model(layer) == blob
    assert model_byte_size(layer) == len(blob)


@pytest.mark.parametrize(("layer", "blob"), GOLDEN_PARAMS)
def test_read_golden_bytes_gives_the_value(layer: Layer, blob: bytes) -> None:
    decoded = read_model(blob)
    assert type(decoded) is type(layer)
    assert layers_equal(decoded, layer)
    assert structure_key(decoded) == structure_key(layer)
    assert read_model_prefix(blob)[1] == len(blob)


@pytest.mark.parametrize(("layer", "blob"), GOLDEN_PARAMS)
def test_read_accepts_bytearray_and_memoryview(layer: Layer, blob: bytes) -> None:
    framed = bytearray(b"\xaa" * 24 + blob)
    assert layers_equal(read_model(bytearray(blob)), layer)
    assert layers_equal(read_model(memoryview(framed)[24:]), layer)


@pytest.mark.parametrize(("layer", "blob"), GOLDEN_PARAMS)
def test_write_into_dirty_buffer_zeroes_padding(layer: Layer, blob: bytes) -> None:
    buf = bytearray(b"\xff" * (len(blob) + 40))
    assert write_model_into(layer, buf, 16) == len(blob)
    assert bytes(buf[16 : 16 + len(blob)]) == blob
    assert buf[:16] == b"\xff" * 16 and buf[16 + len(blob) :] == b"\xff" * 24


def test_write_into_too_small_buffer_is_refused() -> None:
    with pytest.raises(NNEError, match="too small"):
        write_model_into(ReLU(1), bytearray(15))


def test_decoded_arrays_are_copies_not_views() -> None:
    blob = bytearray(write_model(Denormalize(2, fa(1, 2), fa(3, 4))))
    layer = read_model(blob)
    blob[64:72] = f32(9, 9)  # the engine overwriting its shared-memory region
    assert isinstance(layer, Denormalize)
    assert layer.mean.tolist() == [1.0, 2.0]
    assert layer.mean.dtype == np.float32 and layer.mean.flags.owndata


# --------------------------------------------------------------------------------------------------
# Bad input: every split point, trailing data, limits, magic/version, type ids, depth


@pytest.mark.parametrize(("layer", "blob"), GOLDEN_PARAMS)
def test_every_truncation_raises_nne_error_with_offset(layer: Layer, blob: bytes) -> None:
    for cut in range(len(blob)):
        with pytest.raises(NNEDecodeError) as info:
            read_model(blob[:cut])
        assert info.value.offset is not None and 0 <= info.value.offset <= cut
        with pytest.raises(NNEDecodeError):
            read_model_prefix(blob[:cut])


@pytest.mark.parametrize(("layer", "blob"), GOLDEN_PARAMS[:6])
def test_trailing_bytes_rejected_unless_allowed(layer: Layer, blob: bytes) -> None:
    for extra in (b"\x00", b"\x00" * 64, b"junk"):
        with pytest.raises(NNEDecodeError, match="follow the root layer") as info:
            read_model(blob + extra)
        assert info.value.offset == len(blob)
        assert layers_equal(read_model(blob + extra, allow_trailing=True), layer)
        assert read_model_prefix(blob + extra)[1] == len(blob)


@pytest.mark.parametrize("magic", [0, 0x0BA51C00, 0x011CA50B, 0xFFFFFFFF])
def test_bad_magic(magic: int) -> None:
    with pytest.raises(NNEDecodeError, match="magic") as info:
        read_model(u32(magic, 1, 7, 1))
    assert info.value.field == "model.magic" and info.value.offset == 0


@pytest.mark.parametrize("version", [0, 2, 0xFFFFFFFF])
def test_bad_version(version: int) -> None:
    with pytest.raises(NNEDecodeError, match="version") as info:
        read_model(u32(0x0BA51C01, version, 7, 1))
    assert info.value.field == "model.version" and info.value.offset == 4


@pytest.mark.parametrize("type_id", [0, 32, 0xFFFFFFFF])
def test_unknown_type_id_names_id_and_offset(type_id: int) -> None:
    with pytest.raises(NNEDecodeError, match=f"unknown layer type id {type_id}") as info:
        read_model(HEAD + u32(type_id, 1))
    assert info.value.offset == 8
    # Nested: the second child of a Sequence, at offset 24.
    with pytest.raises(NNEDecodeError, match=f"unknown layer type id {type_id}") as info:
        read_model(HEAD + u32(1, 2, 7, 1, type_id, 1))
    assert info.value.offset == 24 and info.value.field == "root.layers[1].type_id"


@pytest.mark.parametrize("count", [2**31 - 1, 2**31, 2**32 - 1])
def test_huge_sequence_count_is_refused_before_looping(count: int) -> None:
    with pytest.raises(NNEDecodeError, match=r"truncated: root\.layer_num says"):
        read_model(HEAD + u32(1, count) + u32(7, 1))


def test_sequence_count_zero_is_refused() -> None:
    with pytest.raises(NNEDecodeError, match="at least one layer") as info:
        read_model(HEAD + u32(1, 0))
    assert info.value.offset == 8


@pytest.mark.parametrize("count", [2**31 - 1, 2**32 - 1])
def test_huge_concat_count_never_allocates(count: int) -> None:
    with pytest.raises(NNEDecodeError, match="truncated"):
        read_model(HEAD + u32(13, count) + z(48) + u32(1, 2))


@pytest.mark.parametrize("size", [2**31 - 1, 2**32 - 1])
def test_huge_array_sizes_never_allocate(size: int) -> None:
    for blob in (
        HEAD + u32(2, size) + z(48) + f32(1, 2),  # Normalize
        HEAD + u32(4, size, size) + z(44) + f32(1),  # Linear: In x Out ~ 2^64 floats
        HEAD + u32(6, size, size, size) + z(40) + f32(1),  # MultiLinear: ~2^96 floats
        HEAD + u32(5, size, 1) + z(44),  # CompressedLinear
    ):
        with pytest.raises(NNEDecodeError, match="truncated"):
            read_model(blob)


@pytest.mark.parametrize(
    "blob",
    [
        HEAD + u32(6, 0, 2**32 - 1, 2**32 - 1) + z(40),  # MultiLinear weights (0, 2^32-1, 2^32-1)
        HEAD + u32(30, 1, 1, 2**32 - 1, 2**32 - 1, 0, 1, 0, 0) + z(20),  # Conv2d weights (0, 0, big, big)
    ],
)
def test_empty_arrays_with_unrepresentable_shapes(blob: bytes) -> None:
    with pytest.raises(NNEDecodeError, match="numpy cannot represent") as info:
        read_model(blob)
    assert info.value.offset == 64


def test_array_size_max_fits_and_max_plus_one_is_truncated() -> None:
    exact = HEAD + u32(3, 3) + z(48) + f32(1, 2, 3) + z(52) + f32(4, 5, 6)
    assert isinstance(read_model(exact), Denormalize)
    patched = bytearray(exact)
    patched[12:16] = u32(4)  # Size 4: Std would run 4 bytes past the end
    with pytest.raises(NNEDecodeError, match=r"root\.std") as info:
        read_model(bytes(patched))
    assert info.value.offset == 128


def _nested_sequences(depth: int) -> bytes:
    return HEAD + u32(1, 1) * (depth - 1) + u32(7, 1)


def test_depth_limit_is_inclusive() -> None:
    layer = read_model(_nested_sequences(MAX_LAYER_DEPTH))
    assert model_byte_size(layer) == 8 + 8 * MAX_LAYER_DEPTH
    with pytest.raises(NNEDecodeError, match="nest too deeply"):
        read_model(_nested_sequences(MAX_LAYER_DEPTH + 1))


def test_depth_bomb_fails_fast_without_recursion_error() -> None:
    with pytest.raises(NNEDecodeError, match="nest too deeply"):
        read_model(_nested_sequences(200_000))


def test_layer_count_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codec, "MAX_LAYER_NUM", 4)
    assert isinstance(read_model(HEAD + u32(1, 3) + u32(7, 1) * 3), Sequence)  # 4 layers
    with pytest.raises(NNEDecodeError, match="too many layers"):
        read_model(HEAD + u32(1, 4) + u32(7, 1) * 4)


@pytest.mark.parametrize(
    ("blob", "offset", "pattern"),
    [
        # Sequence[Linear(2, 3), ReLU(4)]: ReLU reads 4 but Linear writes 3.
        (
            HEAD + u32(1, 2, 4, 2, 3) + z(36) + f32(0, 0, 0) + z(52) + f32(*[0] * 6) + u32(7, 4),
            8,
            "reads the wrong",
        ),
        # Concat says InputSizes (2,) but its child reads 1.
        (HEAD + u32(13, 1) + z(48) + u32(2) + z(60) + u32(1) + u32(7, 1), 8, "reads the wrong"),
        # Slice offset 2 + size 2 > input 3.
        (HEAD + u32(25, 3, 2, 2), 8, "past its input"),
        # Array element sizes (2, 2) but its layer is ReLU(3), nested in a Sequence at offset 16.
        (HEAD + u32(1, 1, 14, 1, 2, 2, 7, 3), 16, "inconsistent"),
    ],
)
def test_sizes_inconsistent_with_sub_layers(blob: bytes, offset: int, pattern: str) -> None:
    with pytest.raises(NNEDecodeError, match=pattern) as info:
        read_model(blob)
    assert info.value.offset == offset


def test_error_hierarchy() -> None:
    assert issubclass(NNEDecodeError, NNEError)
    assert issubclass(NNEError, SnapshotError) and issubclass(NNEError, ProtocolError)
    assert issubclass(NNEDecodeError, ValueError)


# --------------------------------------------------------------------------------------------------
# Writer refusals


def test_writer_refuses_too_deep_values() -> None:
    layer: Layer = ReLU(1)
    for _ in range(MAX_LAYER_DEPTH):
        layer = Sequence((layer,))
    with pytest.raises(NNEError, match="nest too deeply"):
        write_model(layer)


def test_writer_refuses_values_mutated_after_construction() -> None:
    layer = Linear(1, 2, fa(1, 2), fa(3, 4, shape=(1, 2)))
    object.__setattr__(layer, "bias", fa(1, 2, 3))
    with pytest.raises(NNEError, match=r"root\.bias"):
        write_model(layer)


def test_writer_refuses_unrepresentable_epsilon() -> None:
    for refuse in (write_model, model_byte_size):
        with pytest.raises(NNEError, match="float32 range"):
            refuse(LayerNorm(1, fa(0), fa(1), 1e300))


def test_writer_refuses_non_layers() -> None:
    with pytest.raises(TypeError):
        write_model("ReLU")  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------
# Equality and structure keys


def test_layers_equal_is_bitwise() -> None:
    nan_a = np.array([np.nan], dtype=np.float32)
    nan_b = np.frombuffer(struct.pack("<I", 0x7FC00001), dtype=np.float32).copy()
    assert layers_equal(PReLU(1, nan_a), PReLU(1, nan_a.copy()))
    assert not layers_equal(PReLU(1, nan_a), PReLU(1, nan_b))  # different NaN payload
    assert not layers_equal(PReLU(1, fa(0.0)), PReLU(1, fa(-0.0)))
    assert not layers_equal(ReLU(1), ELU(1))
    assert not layers_equal(LayerNorm(1, fa(0), fa(1), 0.5), LayerNorm(1, fa(0), fa(1), 0.25))


def test_structure_key_ignores_floats_and_sees_every_size() -> None:
    a = Concat((1, 2), (1, 2), (PReLU(1, fa(1)), LayerNorm(2, fa(0, 0), fa(1, 1), 0.5)))
    b = Concat((1, 2), (1, 2), (PReLU(1, fa(7)), LayerNorm(2, fa(3, 3), fa(2, 2), 0.125)))
    c = Concat((2, 1), (2, 1), (LayerNorm(2, fa(0, 0), fa(1, 1), 0.5), PReLU(1, fa(1))))
    assert structure_key(a) == structure_key(b)
    assert model_byte_size(a) == model_byte_size(b)
    assert structure_key(a) != structure_key(c)
    assert first_structure_difference(a, b) is None
    assert first_structure_difference(a, c) == "root.input_sizes is (1, 2) in one and (2, 1) in the other"
    assert first_structure_difference(Sequence((ReLU(1),)), Sequence((ReLU(1), ReLU(1)))) == (
        "root.layers has 1 layers in one and 2 in the other"
    )
    assert first_structure_difference(Array(2, 1, 1, ReLU(1)), Array(2, 1, 1, ELU(1))) == (
        "root.layer is a ReLU in one and a ELU in the other"
    )


# --------------------------------------------------------------------------------------------------
# Hypothesis: random valid layer trees


SIZE = st.integers(0, 3)
PAD = st.integers(0, 1)  # conv outputs grow with padding; 0 and 1 exercise the field
F32 = st.floats(width=32, allow_nan=True, allow_infinity=True)


def f32_array(shape: tuple[int, ...]) -> st.SearchStrategy[np.ndarray]:
    return hnp.arrays(np.float32, shape, elements=F32)


@st.composite
def same_width(draw: st.DrawFn, n: int, depth: int) -> Layer:
    """A layer reading and writing ``n`` floats."""
    kind = draw(st.integers(0, 6 if depth > 0 else 4))
    if kind == 0:
        activations: list[Callable[[int], Layer]] = [ReLU, ELU, TanH, GELU, Copy, Softmax]
        return draw(st.sampled_from(activations))(n)
    if kind == 1:
        affine: list[Callable[..., Layer]] = [Normalize, Denormalize, Clamp]
        make: Callable[..., Layer] = draw(st.sampled_from(affine))
        return make(n, draw(f32_array((n,))), draw(f32_array((n,))))
    if kind == 2:
        return PReLU(n, draw(f32_array((n,))))
    if kind == 3:
        return LayerNorm(n, draw(f32_array((n,))), draw(f32_array((n,))), draw(F32))
    if kind == 4:
        return Slice(n, 0, n)
    if kind == 5:
        return Residual(n, draw(same_width(n, depth - 1)))
    first = draw(layer_from(n, depth - 1))
    back = draw(layer_from_to(first.output_size, n, depth - 1))
    return Sequence((first, back))


@st.composite
def layer_from_to(draw: st.DrawFn, n: int, m: int, depth: int) -> Layer:
    """A layer reading ``n`` and writing ``m`` floats."""
    if n == m and draw(st.booleans()):
        return draw(same_width(n, depth))
    linears: list[Callable[..., Layer]] = [Linear, LipschiztLinear]
    make: Callable[..., Layer] = draw(st.sampled_from(linears))
    return make(n, m, draw(f32_array((m,))), draw(f32_array((n, m))))


@st.composite
def layer_from(draw: st.DrawFn, n: int, depth: int) -> Layer:
    """A layer reading ``n`` floats (any output width)."""
    kind = draw(st.integers(0, 6 if depth > 0 else 3))
    if kind == 0:
        return draw(same_width(n, depth))
    if kind == 1:
        return draw(layer_from_to(n, draw(SIZE), depth))
    if kind == 2:
        m = draw(SIZE)
        q = hnp.arrays(np.uint16, (n, m))
        return CompressedLinear(
            n, m, draw(f32_array((n,))), draw(f32_array((n,))), draw(f32_array((m,))), draw(q)
        )
    if kind == 3:
        offset = draw(st.integers(0, n))
        shaped: list[Layer] = [Tile(n, draw(SIZE)), Slice(n, offset, draw(st.integers(0, n - offset)))]
        return draw(st.sampled_from(shaped))
    if kind == 4:
        first = draw(layer_from(n, depth - 1))
        rest = [first]
        for _ in range(draw(st.integers(0, 2))):
            rest.append(draw(layer_from(rest[-1].output_size, depth - 1)))
        return Sequence(tuple(rest))
    if kind == 5:
        subs = tuple(draw(st.lists(layer_from(n, depth - 1), max_size=3)))
        return Spread(n, tuple(s.output_size for s in subs), subs)
    cut = draw(st.integers(0, n))
    parts = [p for p in (cut, n - cut) if p or draw(st.booleans())]
    subs = tuple(draw(layer_from(p, depth - 1)) for p in parts)
    return Concat(tuple(parts), tuple(s.output_size for s in subs), subs)


@st.composite
def layer_between(draw: st.DrawFn, n: int, m: int, depth: int) -> Layer:
    """A layer reading ``n`` and writing ``m`` floats; with depth left, possibly any layer tree between
    two adapters (so that every type also appears as a sub-layer at the widths its parent expects)."""
    if depth > 0 and draw(st.booleans()):
        inner = draw(any_layer(depth - 1))
        before = draw(layer_from_to(n, inner.input_size, 0))
        return Sequence((before, inner, draw(layer_from_to(inner.output_size, m, 0))))
    return draw(layer_from_to(n, m, depth))


@st.composite
def any_layer(draw: st.DrawFn, depth: int = 3) -> Layer:
    """Any valid layer tree covering all 31 types, with sub-layer widths as the engine defines them."""
    kind = draw(st.integers(-3, 12 if depth > 0 else 1))
    if kind <= 0:
        return draw(layer_from(draw(SIZE), depth))
    if kind == 1:
        b, i, o = draw(SIZE), draw(SIZE), draw(SIZE)
        return MultiLinear(b, i, o, draw(f32_array((b, o))), draw(f32_array((b, i, o))))

    def sub(n: int, m: int) -> Layer:
        return draw(layer_between(n, m, depth - 1))

    if kind == 2:
        child = draw(any_layer(depth - 1))
        return Array(draw(SIZE), child.input_size, child.output_size, child)
    if kind == 3:
        i, o, mem = draw(SIZE), draw(SIZE), draw(SIZE)
        gates = (sub(i + mem, mem), sub(i + mem, o), sub(i + mem, mem), sub(i + mem, o))
        return MemoryCell(i, o, mem, *gates, sub(mem, o))
    if kind == 4:
        i, o = draw(SIZE), draw(SIZE)
        return GRUCell(i, o, sub(i + o, o), sub(i + o, o), sub(i + o, o))
    if kind == 5:
        m, ei, eo, oe, ae, heads = (draw(SIZE) for _ in range(6))
        element, value = sub(ei, eo), sub(eo, heads * oe)
        return AggregateSet(
            m, ei, eo, oe, ae, heads, element, sub(eo, heads * ae), sub(eo, heads * ae), value
        )
    k = draw(st.integers(0, 2))
    ins, outs = tuple(draw(SIZE) for _ in range(k)), tuple(draw(SIZE) for _ in range(k))
    if kind == 6:
        oe = draw(SIZE)
        subs = tuple(sub(i, o) for i, o in zip(ins, outs, strict=True))
        return AggregateOrExclusive(oe, ins, outs, subs, tuple(sub(o, oe) for o in outs))
    if kind == 7:
        oe, ae, heads = draw(SIZE), draw(SIZE), draw(SIZE)
        subs = tuple(sub(i, o) for i, o in zip(ins, outs, strict=True))
        queries, keys = (tuple(sub(o, heads * ae) for o in outs) for _ in range(2))
        values = tuple(sub(o, heads * oe) for o in outs)
        return AggregateOrInclusive(oe, ae, heads, ins, outs, subs, queries, keys, values)
    if kind == 8:
        i, o = draw(SIZE), draw(SIZE)
        return SparseMixtureOfExperts(i, o, sub(i, k), tuple(sub(i, o) for _ in range(k)))
    if kind == 9:
        # The condition layer writes a scale and a shift per prefix output; the postfix reads the prefix.
        pi, po, ci, qo = (draw(SIZE) for _ in range(4))
        co = 2 * po + draw(st.integers(0, 1))
        return FiLM(pi, po, ci, co, po, qo, sub(pi, po), sub(ci, co), sub(po, qo))
    if kind == 10:
        length, cin, cout, kernel = draw(SIZE), draw(SIZE), draw(SIZE), draw(SIZE)
        w = draw(f32_array((cout, cin, kernel)))
        layer = sub(draw(SIZE), cin * length)  # runs first and writes [InChannels][InputLength]
        return Conv1d(length, cin, cout, kernel, draw(PAD), draw(SIZE), w, draw(f32_array((cout,))), layer)
    if kind == 11:
        h, w_, cin, cout, kernel = (draw(SIZE) for _ in range(5))
        weights = draw(f32_array((cout, cin, kernel, kernel)))
        bias = draw(f32_array((cout,)))
        layer = sub(draw(SIZE), cin * h * w_)
        return Conv2d(h, w_, cin, cout, kernel, draw(SIZE), draw(PAD), draw(SIZE), weights, bias, layer)
    subs = tuple(draw(any_layer(depth - 1)) for _ in range(k))
    return Concat(tuple(s.input_size for s in subs), tuple(s.output_size for s in subs), subs)


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(any_layer())
def test_round_trip_of_random_trees(layer: Layer) -> None:
    """Invariant: write(read(write(l))) == write(l), and read(write(l)) equals l bitwise and structurally."""
    blob = write_model(layer)
    assert len(blob) == model_byte_size(layer)
    decoded = read_model(blob)
    assert write_model(decoded) == blob
    assert layers_equal(decoded, layer)
    assert structure_key(decoded) == structure_key(layer)
    assert first_structure_difference(decoded, layer) is None


@FUZZ
@given(st.binary(max_size=300))
def test_fuzz_any_bytes(data: bytes) -> None:
    """Invariant: any bytes either decode to a Layer or raise NNEError; nothing else escapes."""
    _decode_or_nne_error(data)
    _decode_or_nne_error(HEAD + data)


SMALL_U32 = st.one_of(st.integers(0, 40), st.sampled_from([0, 1, 2, 2**31 - 1, 2**31, 2**32 - 1]))


@FUZZ
@given(st.lists(SMALL_U32, max_size=40))
def test_fuzz_small_integer_streams(words: list[int]) -> None:
    """Invariant: a header followed by any uint32 words (small values reach deep into the layer
    decoders) either decodes to a Layer or raises NNEError; nothing else escapes."""
    _decode_or_nne_error(HEAD + u32(*words))


@FUZZ
@given(
    st.sampled_from(GOLDEN_IDS),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4),
)
def test_fuzz_mutated_golden_encodings(name: str, edits: list[tuple[int, int]]) -> None:
    """Invariant: a valid encoding with bytes overwritten either raises NNEError or decodes to a layer
    that re-encodes and decodes to an equal layer; nothing else escapes."""
    blob = bytearray(dict((n, b) for n, _, b in GOLDEN)[name])
    for pos, value in edits:
        blob[pos % len(blob)] = value
    layer = _decode_or_nne_error(bytes(blob))
    if layer is not None:
        again = read_model(write_model(layer))
        assert layers_equal(again, layer)


def _decode_or_nne_error(data: bytes) -> Layer | None:
    try:
        return read_model(data, allow_trailing=True)
    except NNEError:
        return None


def test_minimum_layer_bytes_is_the_smallest_encoding() -> None:
    # The decoder refuses a count whose layers cannot fit at MIN_LAYER_BYTES each; that is only sound
    # if no layer encodes smaller. The smallest golden layers (ReLU, Copy, ...) take exactly 8 bytes.
    assert codec.MIN_LAYER_BYTES == min(len(blob) - 8 for _, _, blob in GOLDEN) == 8
