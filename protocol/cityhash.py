"""CityHash32 (Google CityHash v1.1 ``CityHash32``), the hash the engine stores in network snapshots.

The engine ships CityHash v1.1 (``Core/Public/Hash/CityHash.h``) and computes the denoiser's snapshot
``CompatibilityHash`` as ``CityHash32`` over the little-endian int32 triple ``[EncodedObsSize, ActDim, 1]``
(spec §6.3, §10 "Confirmed"). The snapshot header stores that uint32 bit pattern in an int32 field, so
:func:`denoiser_compatibility_hash` returns the signed reinterpretation.

The algorithm below is written from the published description of CityHash v1.1 (32-bit variant): four
length classes (0–4, 5–12, 13–24, > 24 bytes), little-endian 32-bit fetches, the Murmur3 constants
``c1``/``c2`` and finaliser. All arithmetic is modulo 2^32, expressed with ``& _MASK`` because Python
integers are unbounded. Pure Python: the inputs it sees (a 12-byte triple, a few-KB schema JSON) are small,
so speed does not matter and a C dependency is not worth it. Golden vectors in the tests pin it to the
reference implementation.
"""

from __future__ import annotations

import struct

from protocol.errors import SnapshotError
from protocol.ints import INT32_MAX

__all__ = ["city_hash32", "denoiser_compatibility_hash", "to_int32"]

_MASK = 0xFFFFFFFF
# Murmur3 mixing constants used by CityHash32.
_C1 = 0xCC9E2D51
_C2 = 0x1B873593
# Additive constant of the Murmur3-style step ``h = h * 5 + _N``.
_N = 0xE6546B64


_U32 = struct.Struct("<I")
_TRIPLE = struct.Struct("<iii")


def _fetch32(data: bytes, offset: int) -> int:
    """Little-endian uint32 at ``offset`` (the engine only runs on little-endian targets)."""
    value: int = _U32.unpack_from(data, offset)[0]
    return value


def _rotate(value: int, shift: int) -> int:
    """Rotate a uint32 right by ``shift`` bits (shift 0 is the identity, as in the reference)."""
    if shift == 0:
        return value
    return ((value >> shift) | (value << (32 - shift))) & _MASK


def _bswap(value: int) -> int:
    return int.from_bytes(value.to_bytes(4, "little"), "big")


def _fmix(h: int) -> int:
    """Murmur3's 32-bit finaliser."""
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _MASK
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _MASK
    h ^= h >> 16
    return h


def _mur(a: int, h: int) -> int:
    """One Murmur3 compression step of ``a`` into ``h``."""
    a = (a * _C1) & _MASK
    a = _rotate(a, 17)
    a = (a * _C2) & _MASK
    h ^= a
    h = _rotate(h, 19)
    return (h * 5 + _N) & _MASK


def _hash_len_0_to_4(data: bytes) -> int:
    length = len(data)
    b = 0
    c = 9
    for byte in data:
        # The reference reads each byte as ``signed char``: bytes >= 0x80 contribute a negative value.
        v = byte - 256 if byte >= 128 else byte
        b = (b * _C1 + v) & _MASK
        c ^= b
    return _fmix(_mur(b, _mur(length, c)))


def _hash_len_5_to_12(data: bytes) -> int:
    length = len(data)
    a = length
    b = (length * 5) & _MASK
    c = 9
    d = b
    a = (a + _fetch32(data, 0)) & _MASK
    b = (b + _fetch32(data, length - 4)) & _MASK
    c = (c + _fetch32(data, (length >> 1) & 4)) & _MASK
    return _fmix(_mur(c, _mur(b, _mur(a, d))))


def _hash_len_13_to_24(data: bytes) -> int:
    length = len(data)
    a = _fetch32(data, (length >> 1) - 4)
    b = _fetch32(data, 4)
    c = _fetch32(data, length - 8)
    d = _fetch32(data, length >> 1)
    e = _fetch32(data, 0)
    f = _fetch32(data, length - 4)
    h = length
    return _fmix(_mur(f, _mur(e, _mur(d, _mur(c, _mur(b, _mur(a, h)))))))


def _scramble(word: int) -> int:
    """``Rotate32(word * c1, 17) * c2``: the per-word pre-mix of the long-input path."""
    return (_rotate((word * _C1) & _MASK, 17) * _C2) & _MASK


def _step(h: int, rotation: int) -> int:
    return (_rotate(h, rotation) * 5 + _N) & _MASK


def _hash_len_over_24(data: bytes) -> int:
    length = len(data)
    h = length & _MASK
    g = (_C1 * length) & _MASK
    f = g
    a0 = _scramble(_fetch32(data, length - 4))
    a1 = _scramble(_fetch32(data, length - 8))
    a2 = _scramble(_fetch32(data, length - 16))
    a3 = _scramble(_fetch32(data, length - 12))
    a4 = _scramble(_fetch32(data, length - 20))
    h = _step(h ^ a0, 19)
    h = _step(h ^ a2, 19)
    g = _step(g ^ a1, 19)
    g = _step(g ^ a3, 19)
    f = _step((f + a4) & _MASK, 19)
    # Whole 20-byte blocks from the front; the tail was folded in above from the back.
    iterations = (length - 1) // 20
    offset = 0
    for _ in range(iterations):
        b0 = _scramble(_fetch32(data, offset))
        b1 = _fetch32(data, offset + 4)
        b2 = _scramble(_fetch32(data, offset + 8))
        b3 = _scramble(_fetch32(data, offset + 12))
        b4 = _fetch32(data, offset + 16)
        h = _step(h ^ b0, 18)
        f = (_rotate((f + b1) & _MASK, 19) * _C1) & _MASK
        g = _step((g + b2) & _MASK, 18)
        h = _step(h ^ ((b3 + b1) & _MASK), 19)
        g = (_bswap(g ^ b4) * 5) & _MASK
        h = _bswap((h + b4 * 5) & _MASK)
        f = (f + b0) & _MASK
        # PERMUTE3(f, h, g) = swap(f, h); swap(f, g).
        f, h, g = g, f, h
        offset += 20
    g = (_rotate(g, 11) * _C1) & _MASK
    g = (_rotate(g, 17) * _C1) & _MASK
    f = (_rotate(f, 11) * _C1) & _MASK
    f = (_rotate(f, 17) * _C1) & _MASK
    h = _step((h + g) & _MASK, 19)
    h = (_rotate(h, 17) * _C1) & _MASK
    h = _step((h + f) & _MASK, 19)
    h = (_rotate(h, 17) * _C1) & _MASK
    return h


def city_hash32(data: bytes | bytearray | memoryview) -> int:
    """CityHash v1.1 ``CityHash32`` of ``data``, as an unsigned 32-bit integer (0 .. 2^32 − 1)."""
    buf = bytes(data)
    length = len(buf)
    if length <= 4:
        return _hash_len_0_to_4(buf)
    if length <= 12:
        return _hash_len_5_to_12(buf)
    if length <= 24:
        return _hash_len_13_to_24(buf)
    return _hash_len_over_24(buf)


def to_int32(value: int) -> int:
    """Reinterpret a uint32 bit pattern as the int32 the snapshot header stores."""
    value &= _MASK
    return value - (1 << 32) if value > INT32_MAX else value


def denoiser_compatibility_hash(encoded_obs_size: int, act_dim: int) -> int:
    """The denoiser snapshot's ``CompatibilityHash`` (spec §6.3, §10), as a signed int32.

    CityHash32 over the little-endian int32 triple ``[EncodedObsSize, ActDim, 1]`` (the trailing 1 is the
    width of the scalar time input). Sizes must be in 0 .. 2^31 − 1 (they are int32 in the engine);
    anything else raises :class:`~protocol.errors.SnapshotError`.
    """
    for name, value in (("EncodedObsSize", encoded_obs_size), ("ActDim", act_dim)):
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= INT32_MAX:
            raise SnapshotError(
                f"{name} does not fit the engine's int32 size field",
                field=name,
                expected=f"0..{INT32_MAX}",
                actual=value,
            )
    return to_int32(city_hash32(_TRIPLE.pack(encoded_obs_size, act_dim, 1)))
