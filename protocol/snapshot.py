"""``ULearningNeuralNetworkData`` snapshots: a 24-byte header around an NNE model blob (spec §6.1, §8, §10).

Layout (all little-endian int32)::

    offset 0  magic 0x1e9b0c80
    offset 4  version 1
    offset 8  InputSize
    offset 12 OutputSize
    offset 16 CompatibilityHash
    offset 20 FileDataSize
    offset 24 FileData: the NNERuntimeBasicCpu model (protocol.nne.codec), FileDataSize bytes

Snapshot byte count = 24 + FileDataSize = the network's ``MaxByteNum`` = the size of its shared-memory
region / socket payload. When a trainer sends a network back, the engine checks only size > 24, magic and
version, *adopts* InputSize, OutputSize and CompatibilityHash from the header, and its transport insists on
the same byte count as before (spec §10 item 6). Hence :func:`snapshot_with_model`: keep the received
header, swap in new weights, refuse any change of layout.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from protocol.errors import SnapshotError
from protocol.ints import INT32_MAX, INT32_MIN
from protocol.nne.codec import (
    first_structure_difference,
    model_byte_size,
    read_model_prefix,
    write_model_into,
)
from protocol.nne.layers import Layer

__all__ = [
    "HEADER",
    "HEADER_BYTES",
    "SNAPSHOT_MAGIC",
    "SNAPSHOT_VERSION",
    "Snapshot",
    "SnapshotHeader",
    "check_header_matches_model",
    "make_snapshot",
    "read_snapshot",
    "read_snapshot_header",
    "snapshot_byte_size",
    "snapshot_with_model",
    "write_snapshot",
    "write_snapshot_into",
]

SNAPSHOT_MAGIC: Final = 0x1E9B0C80
"""int32 at offset 0 (``ULearningNeuralNetworkData`` snapshot magic, spec §6.1, §8)."""
SNAPSHOT_VERSION: Final = 1
"""int32 at offset 4; the engine refuses any other value."""
HEADER: Final = struct.Struct("<6i")
"""magic, version, InputSize, OutputSize, CompatibilityHash, FileDataSize."""
HEADER_BYTES: Final = HEADER.size  # 24


def _check_int32(name: str, value: int, *, minimum: int = INT32_MIN) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise SnapshotError(f"{name} must be an int", field=name, actual=type(value).__name__)
    if not minimum <= value <= INT32_MAX:
        raise SnapshotError(
            f"{name} is outside its int32 range",
            field=name,
            expected=f"{minimum}..{INT32_MAX}",
            actual=value,
        )


@dataclass(frozen=True, slots=True)
class SnapshotHeader:
    """The four variable header fields (magic and version are constants).

    ``input_size`` / ``output_size``: widths of the network's input and output vectors (floats).
    ``compatibility_hash``: signed int32 exactly as stored (the engine's CityHash32 reinterpreted).
    ``file_data_size``: bytes of FileData after the header.
    """

    input_size: int
    output_size: int
    compatibility_hash: int
    file_data_size: int

    def __post_init__(self) -> None:
        # [INF] The engine adopts InputSize/OutputSize without checking them (§10 item 6); a negative
        # width can only be corruption, so it is refused rather than carried along.
        _check_int32("snapshot.InputSize", self.input_size, minimum=0)
        _check_int32("snapshot.OutputSize", self.output_size, minimum=0)
        _check_int32("snapshot.CompatibilityHash", self.compatibility_hash)
        _check_int32("snapshot.FileDataSize", self.file_data_size, minimum=0)

    @property
    def compatibility_hash_u32(self) -> int:
        """The hash as the unsigned 32-bit value CityHash32 returns."""
        return self.compatibility_hash & 0xFFFFFFFF

    @property
    def snapshot_size(self) -> int:
        """Total bytes of the snapshot: 24 + FileDataSize (the network's MaxByteNum)."""
        return HEADER_BYTES + self.file_data_size


@dataclass(frozen=True, slots=True, eq=False)
class Snapshot:
    """A decoded snapshot. ``trailing`` holds any FileData bytes after the root layer, so that
    ``write_snapshot(read_snapshot(b)) == b`` for every valid snapshot whose padding is zero."""

    header: SnapshotHeader
    model: Layer
    trailing: bytes = b""

    def __post_init__(self) -> None:
        if not isinstance(self.header, SnapshotHeader):
            raise SnapshotError("Snapshot.header must be a SnapshotHeader", actual=type(self.header).__name__)
        if not isinstance(self.trailing, bytes):
            raise SnapshotError("Snapshot.trailing must be bytes", actual=type(self.trailing).__name__)
        expected = model_byte_size(self.model) + len(self.trailing)
        if self.header.file_data_size != expected:
            raise SnapshotError(
                "FileDataSize does not match the model's encoded size plus trailing bytes",
                field="snapshot.FileDataSize",
                expected=expected,
                actual=self.header.file_data_size,
            )


def _as_bytes_view(buf: bytes | bytearray | memoryview) -> memoryview:
    view = memoryview(buf)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def read_snapshot_header(buf: bytes | bytearray | memoryview) -> SnapshotHeader:
    """Decode and check the 24-byte header at the start of ``buf`` (magic, version, sizes).

    Does not look at FileData, so it works on a buffer holding only the header.
    """
    view = _as_bytes_view(buf)
    if len(view) < HEADER_BYTES:
        raise SnapshotError(
            "the snapshot is shorter than its header",
            field="snapshot.length",
            expected=f">= {HEADER_BYTES}",
            actual=len(view),
        )
    magic, version, input_size, output_size, compatibility_hash, file_data_size = HEADER.unpack_from(view, 0)
    if magic != SNAPSHOT_MAGIC:
        raise SnapshotError(
            "the snapshot does not start with the network-data magic",
            field="snapshot.magic",
            expected=f"0x{SNAPSHOT_MAGIC:08X}",
            actual=f"0x{magic & 0xFFFFFFFF:08X}",
        )
    if version != SNAPSHOT_VERSION:
        raise SnapshotError(
            "unsupported snapshot version",
            field="snapshot.version",
            expected=SNAPSHOT_VERSION,
            actual=version,
        )
    return SnapshotHeader(input_size, output_size, compatibility_hash, file_data_size)


def read_snapshot(buf: bytes | bytearray | memoryview) -> Snapshot:
    """Decode a whole snapshot; ``len(buf)`` must be exactly 24 + FileDataSize.

    Raises :class:`SnapshotError` for a bad header and :class:`protocol.errors.NNEError` (a subclass)
    for a bad model; model error offsets count from the start of FileData. Arrays are copies.
    """
    view = _as_bytes_view(buf)
    header = read_snapshot_header(view)
    if len(view) != header.snapshot_size:
        raise SnapshotError(
            "the snapshot length disagrees with its FileDataSize",
            field="snapshot.FileDataSize",
            expected=f"{len(view) - HEADER_BYTES} (buffer length - 24)",
            actual=header.file_data_size,
        )
    file_data = view[HEADER_BYTES:]
    model, used = read_model_prefix(file_data)
    return Snapshot(header, model, bytes(file_data[used:]))


def snapshot_byte_size(snapshot: Snapshot) -> int:
    """Bytes :func:`write_snapshot` produces: 24 + FileDataSize."""
    return snapshot.header.snapshot_size


def write_snapshot_into(snapshot: Snapshot, buf: bytearray | memoryview, offset: int = 0) -> int:
    """Encode ``snapshot`` into ``buf[offset:]`` (e.g. a shared-memory region); return the bytes written.

    Every byte of the snapshot's span is written (padding as zeros), so stale region content never leaks.
    """
    h = snapshot.header
    view = _as_bytes_view(buf)
    if offset < 0 or len(view) - offset < h.snapshot_size:
        raise SnapshotError(
            "the target buffer is too small for the snapshot",
            field="buffer.length",
            expected=f">= {offset + h.snapshot_size}",
            actual=len(view),
        )
    HEADER.pack_into(
        view,
        offset,
        SNAPSHOT_MAGIC,
        SNAPSHOT_VERSION,
        h.input_size,
        h.output_size,
        h.compatibility_hash,
        h.file_data_size,
    )
    # The model must start 64-byte aligned *relative to FileData* (alignment counts from the magic),
    # which the codec guarantees by counting from the slice it is handed.
    pos = offset + HEADER_BYTES
    pos += write_model_into(snapshot.model, view, pos)
    view[pos : pos + len(snapshot.trailing)] = snapshot.trailing
    return h.snapshot_size


def write_snapshot(snapshot: Snapshot) -> bytes:
    """Encode ``snapshot`` (header, model blob, trailing bytes)."""
    out = bytearray(snapshot.header.snapshot_size)
    write_snapshot_into(snapshot, out)
    return bytes(out)


def make_snapshot(model: Layer, compatibility_hash: int, *, trailing: bytes = b"") -> Snapshot:
    """Build a snapshot as the engine does for a fresh network: sizes from the root layer, FileDataSize
    from the encoding. ``compatibility_hash`` may be given signed (int32) or unsigned (uint32)."""
    if not -(2**31) <= compatibility_hash <= 0xFFFFFFFF:
        raise SnapshotError(
            "CompatibilityHash does not fit in 32 bits",
            field="snapshot.CompatibilityHash",
            actual=compatibility_hash,
        )
    signed = compatibility_hash - 2**32 if compatibility_hash > INT32_MAX else compatibility_hash
    header = SnapshotHeader(
        model.input_size, model.output_size, signed, model_byte_size(model) + len(trailing)
    )
    return Snapshot(header, model, trailing)


def snapshot_with_model(snapshot: Snapshot, model: Layer) -> Snapshot:
    """``snapshot`` with its model replaced by ``model``, keeping header and trailing bytes unchanged.

    The engine requires every returned network to keep the byte size and layout it sent (spec §6.1,
    §10 item 6), so a model whose :func:`~protocol.nne.codec.structure_key` differs is refused with a
    :class:`SnapshotError` naming the first difference.
    """
    difference = first_structure_difference(snapshot.model, model)
    if difference is not None:
        raise SnapshotError(
            f"the new model's layout differs from the received one: {difference}", field="snapshot.model"
        )
    return Snapshot(snapshot.header, model, snapshot.trailing)


def check_header_matches_model(snapshot: Snapshot, *, strict: bool = False) -> tuple[str, ...]:
    """Sentences for each header size that disagrees with the model's root layer (empty when all agree).

    A warning-level check: the engine adopts the header values without comparing them to the model
    (spec §10 item 6), so a mismatch is reported rather than refused unless ``strict`` is true, in which
    case the first mismatch raises :class:`SnapshotError`.
    """
    problems: list[tuple[str, int, int]] = []
    if snapshot.header.input_size != snapshot.model.input_size:
        problems.append(("snapshot.InputSize", snapshot.model.input_size, snapshot.header.input_size))
    if snapshot.header.output_size != snapshot.model.output_size:
        problems.append(("snapshot.OutputSize", snapshot.model.output_size, snapshot.header.output_size))
    if strict and problems:
        name, expected, actual = problems[0]
        raise SnapshotError(
            f"{name} disagrees with the model's root layer", field=name, expected=expected, actual=actual
        )
    return tuple(
        f"{name} is {actual} but the model's root layer says {expected}"
        for name, expected, actual in problems
    )
