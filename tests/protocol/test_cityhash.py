"""CityHash32 against golden values of the reference CityHash v1.1 implementation.

The expected values were computed once with the PyPI package ``cityhash`` 0.4.10 (a wrapper of Google's
C++ CityHash v1.1, the version the engine ships) in a throwaway virtual environment; the package is not a
dependency of this project.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.cityhash import city_hash32, denoiser_compatibility_hash, to_int32
from protocol.errors import ProtocolError, SnapshotError
from protocol.ints import INT32_MAX


def _counting(n: int) -> bytes:
    return bytes(i % 256 for i in range(n))


def _high(n: int) -> bytes:
    # Mostly bytes >= 0x80: exercises the signed-char reading of the 0..4 byte path.
    return bytes((255 - 7 * i) % 256 for i in range(n))


# (data, CityHash32) covering every length class: 0-4, 5-12, 13-24, > 24 (one, two and more 20-byte blocks).
GOLDEN: list[tuple[bytes, int]] = [
    (_counting(0), 0xDC56D17A),
    (_counting(1), 0xC0A92754),
    (_counting(2), 0x2A1678B6),
    (_counting(3), 0xD7C992E2),
    (_counting(4), 0x616E1132),
    (_counting(5), 0xFE6E37D4),
    (_counting(7), 0xCFEA845D),
    (_counting(8), 0xEB0FD2D6),
    (_counting(11), 0x931DA128),
    (_counting(12), 0xDE42EF1C),
    (_counting(13), 0x8ADD7404),
    (_counting(16), 0x17AEBF87),
    (_counting(19), 0xF7CFBFDA),
    (_counting(23), 0x1DE0E4F5),
    (_counting(24), 0x60CF6AA4),
    (_counting(25), 0x2E6DDF78),
    (_counting(31), 0xE4345328),
    (_counting(40), 0x5042DF8C),
    (_counting(44), 0xFDB76981),
    (_counting(45), 0x716E5ED0),
    (_counting(63), 0xEFB0D898),
    (_counting(64), 0x53D2A4C3),
    (_counting(65), 0x7A49977D),
    (_counting(99), 0xE5C2ED21),
    (_counting(100), 0x56E258E5),
    (_high(1), 0x1D89FECE),
    (_high(3), 0x8B6192BC),
    (_high(4), 0x237581E7),
    (_high(5), 0x9907293C),
    (_high(12), 0x3D86D033),
    (_high(13), 0x075E75B7),
    (_high(24), 0x42A0E090),
    (_high(25), 0x98BF42D3),
    (_high(100), 0xC73A7AC5),
    (b"abc", 0x2F635EC7),
    (b"hello world", 0x19A7581A),
    (b"The quick brown fox jumps over the lazy dog", 0xA339C810),
]

# (EncodedObsSize, ActDim) -> the signed int32 the snapshot header stores (same reference package).
DENOISER_GOLDEN: list[tuple[int, int, int]] = [
    (2, 2, -2070982371),
    (2, 4, -418952019),
    (3, 1, -1650525933),
    (64, 8, -1089921118),
    (0, 0, 424571503),
    (128, 32, -1776063388),
]


@pytest.mark.parametrize(
    ("data", "expected"), GOLDEN, ids=[f"len{len(d)}-{i}" for i, (d, _) in enumerate(GOLDEN)]
)
def test_golden(data: bytes, expected: int) -> None:
    assert city_hash32(data) == expected


def test_golden_covers_every_length_class() -> None:
    lengths = {len(d) for d, _ in GOLDEN}
    assert any(n <= 4 for n in lengths)
    assert any(5 <= n <= 12 for n in lengths)
    assert any(13 <= n <= 24 for n in lengths)
    assert any(n > 24 for n in lengths)
    assert max(lengths) == 100


@pytest.mark.parametrize(("enc", "act", "expected"), DENOISER_GOLDEN)
def test_denoiser_hash_golden(enc: int, act: int, expected: int) -> None:
    assert denoiser_compatibility_hash(enc, act) == expected


@pytest.mark.parametrize(("enc", "act", "expected"), DENOISER_GOLDEN)
def test_denoiser_hash_is_city_hash_of_the_packed_triple(enc: int, act: int, expected: int) -> None:
    raw = city_hash32(struct.pack("<iii", enc, act, 1))
    assert struct.unpack("<i", struct.pack("<I", raw))[0] == expected


@pytest.mark.parametrize("value", [INT32_MAX, 0])
def test_denoiser_hash_accepts_int32_limits(value: int) -> None:
    assert -(2**31) <= denoiser_compatibility_hash(value, value) <= INT32_MAX


@pytest.mark.parametrize("value", [-1, INT32_MAX + 1, 2**32, True])
@pytest.mark.parametrize("position", [0, 1])
def test_denoiser_hash_rejects_out_of_range(value: int, position: int) -> None:
    args = [4, 4]
    args[position] = value
    with pytest.raises(SnapshotError) as info:
        denoiser_compatibility_hash(*args)
    assert info.value.field == ("EncodedObsSize", "ActDim")[position]
    assert isinstance(info.value, ProtocolError)


@pytest.mark.parametrize(
    ("unsigned", "signed"), [(0, 0), (INT32_MAX, INT32_MAX), (2**31, -(2**31)), (2**32 - 1, -1)]
)
def test_to_int32(unsigned: int, signed: int) -> None:
    assert to_int32(unsigned) == signed


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_range_and_buffer_types(data: bytes) -> None:
    """Invariant: any bytes hash to a uint32, identically whether given as bytes, bytearray or memoryview."""
    h = city_hash32(data)
    assert 0 <= h <= 0xFFFFFFFF
    assert city_hash32(bytearray(data)) == h
    assert city_hash32(memoryview(data)) == h
