"""Byte codec for NNERuntimeBasicCpu models ("FileData", spec §6.2, §8, §10).

Layout of a model blob::

    uint32 magic 0x0BA51C01 | uint32 version 1 | root layer

and every layer is ``uint32 type id`` followed by its fields in the order documented on its dataclass in
:mod:`protocol.nne.layers` (that module is the field-order authority). Alignment, with offsets counted
from the first byte of the blob (the magic), as the engine's ``Serialization::Align`` does:

- uint32 and float scalars start on a 4-byte boundary (so the scalar after a uint16 array is realigned);
- every float32 / uint16 / uint32 array starts on a 64-byte boundary, has no length prefix (its length
  comes from earlier scalars) and is followed by nothing: the blob ends where the last field ends;
- padding is written as zero bytes.

One table, :data:`protocol.nne.layout.LAYER_SPECS`, maps each :class:`LayerType` to a declarative field
list; this module is its only interpreter: the reader, the writer, the size walk, :func:`structure_key`,
:func:`layers_equal` and :func:`first_structure_difference` each handle the six field kinds once, so a
layer's byte layout is written down exactly once (msgpack's ``_MSGPACK_HEADERS`` / h11's ``READERS`` play
the same role there).

Decoding is defensive: every count and array size is checked against the bytes that remain *before*
anything is allocated, nesting depth and the total number of layers are bounded, and every failure is an
:class:`NNEDecodeError` (a :class:`protocol.errors.NNEError`) naming the field path and the byte offset.
"""

from __future__ import annotations

import math
import struct
from typing import Any, Final, NoReturn

import numpy as np
import numpy.typing as npt

from protocol.errors import NNEError
from protocol.nne.layers import Layer
from protocol.nne.layout import (
    ARRAY_DTYPES,
    LAYER_SPECS,
    ArrayField,
    ArrayKind,
    CountField,
    Field,
    FloatField,
    ScalarField,
    SubField,
    SubsField,
    spec_of,
)

__all__ = [
    "ARRAY_ALIGNMENT",
    "MAX_LAYER_DEPTH",
    "MAX_LAYER_NUM",
    "MIN_LAYER_BYTES",
    "MODEL_HEADER_BYTES",
    "MODEL_MAGIC",
    "MODEL_VERSION",
    "SCALAR_ALIGNMENT",
    "NNEDecodeError",
    "first_structure_difference",
    "layers_equal",
    "model_byte_size",
    "read_model",
    "read_model_prefix",
    "structure_key",
    "write_model",
    "write_model_into",
]

MODEL_MAGIC: Final = 0x0BA51C01
"""uint32 at offset 0 of every model blob (NNERuntimeBasicCpu ``ModelMagicNumber``, spec §6.2, §8)."""
MODEL_VERSION: Final = 1
"""uint32 at offset 4 (``ModelVersionNumber``); the engine refuses any other value."""
MODEL_HEADER_BYTES: Final = 8
"""Bytes of magic + version in front of the root layer."""

SCALAR_ALIGNMENT: Final = 4
"""uint32 / float scalars start on a multiple of this many bytes from the blob start."""
ARRAY_ALIGNMENT: Final = 64
"""Every float32 / uint16 / uint32 array starts on a multiple of this many bytes from the blob start."""

MAX_LAYER_DEPTH: Final = 64
"""Deepest nesting accepted (the root layer is depth 1). Engine networks nest 2-6 levels (schema encoders
add one level per And/Array of the schema); 64 leaves ample room while keeping recursion bounded."""
MAX_LAYER_NUM: Final = 65_536
"""Most layers accepted in one model. [INF] The engine has no such bound, but a blob of tiny layers costs
~50x its size in Python objects; real flow-matching networks hold tens to a few hundred layers (one
Denormalize per schema leaf), so 65 536 bounds memory without refusing anything the engine builds."""
MIN_LAYER_BYTES: Final = 8
"""Smallest possible encoded layer: a type id and one uint32 (every layer type has at least one scalar).
Used to refuse a layer count the remaining bytes cannot hold before looping over it."""

_U32 = struct.Struct("<I")
_F32 = struct.Struct("<f")
_UINT32_MAX: Final = 0xFFFFFFFF


class NNEDecodeError(NNEError):
    """A model blob cannot be decoded; ``offset`` is the byte offset from the blob start (the magic)
    where the offending field starts (``None`` when the error is not tied to one position)."""

    def __init__(
        self,
        message: str,
        *,
        offset: int | None = None,
        field: str | None = None,
        expected: object = None,
        actual: object = None,
    ) -> None:
        self.offset = offset
        where = "" if offset is None else f" at offset {offset}"
        # Only pass expected/actual when known, so that the message does not read "expected None".
        details: dict[str, object] = {}
        if expected is not None:
            details["expected"] = expected
        if actual is not None:
            details["actual"] = actual
        super().__init__(message + where, field=field, **details)


def _align(offset: int, alignment: int) -> int:
    return (offset + alignment - 1) // alignment * alignment


# --------------------------------------------------------------------------------------------------
# Reader and writer cursors


class _Reader:
    """A cursor over a read-only byte view; every read checks the bytes remaining first."""

    __slots__ = ("_buf", "_end", "layer_num", "pos")

    def __init__(self, buf: memoryview) -> None:
        self._buf = buf
        self._end = len(buf)
        self.pos = 0
        self.layer_num = 0

    @property
    def remaining(self) -> int:
        return self._end - self.pos

    def _need(self, nbytes: int, field: str) -> None:
        if nbytes > self._end - self.pos:
            raise NNEDecodeError(
                f"the model is truncated: {field} needs {nbytes} bytes",
                offset=self.pos,
                field=field,
                expected=f">= {nbytes} bytes",
                actual=f"{self._end - self.pos} bytes left",
            )

    def align(self, alignment: int, field: str) -> None:
        # The padding itself must be present: the engine's size computation counts it, so a blob that
        # stops inside padding was cut short. [INF] Its content is not checked: the engine's loader never
        # reads padding, and whether the engine zero-fills it when writing is unverified, so refusing
        # non-zero padding could refuse a genuine engine snapshot. The writer always writes zeros, so
        # write(read(b)) == b holds for every b whose padding is zero (everything the engine's Python
        # serialiser and this codec produce).
        target = _align(self.pos, alignment)
        self._need(target - self.pos, f"padding before {field}")
        self.pos = target

    def u32(self, field: str) -> int:
        self.align(SCALAR_ALIGNMENT, field)
        self._need(4, field)
        (value,) = _U32.unpack_from(self._buf, self.pos)
        self.pos += 4
        return int(value)

    def f32(self, field: str) -> float:
        self.align(SCALAR_ALIGNMENT, field)
        self._need(4, field)
        (value,) = _F32.unpack_from(self._buf, self.pos)
        self.pos += 4
        return float(value)

    def array(self, field: str, kind: ArrayKind, shape: tuple[int, ...]) -> npt.NDArray[Any]:
        # [INF] An empty array still moves the cursor to the next 64-byte boundary: the engine's
        # Serialization::Size/Save/Load call Align(64) before every array whatever its length, and so
        # does the 5.6/5.7 Python serialiser (serialization_align before each *_array).
        self.align(ARRAY_ALIGNMENT, field)
        dtype = ARRAY_DTYPES[kind]
        count = math.prod(shape)
        nbytes = count * dtype.itemsize
        # Checked before allocating: a size of 2^32-1 (or a product of two) can never fit.
        self._need(nbytes, field)
        if count == 0:
            try:
                out = np.zeros(shape, dtype=dtype.newbyteorder("="))
            except ValueError as exc:
                # e.g. (0, 2^32-1, 2^32-1): empty, yet numpy cannot represent the shape.
                raise NNEDecodeError(
                    f"{field} has a shape numpy cannot represent", offset=self.pos, field=field, actual=shape
                ) from exc
        else:
            # A copy, never a view: layers are values, and the source may be a shared-memory mapping
            # that the engine overwrites on its next send. astype to the native dtype copies.
            out = (
                np.frombuffer(self._buf, dtype=dtype, count=count, offset=self.pos)
                .reshape(shape)
                .astype(dtype.newbyteorder("="), copy=True)
            )
        self.pos += nbytes
        return out

    def check_count(self, count: int, field: str) -> None:
        if count * MIN_LAYER_BYTES > self._end - self.pos:
            raise NNEDecodeError(
                f"the model is truncated: {field} says {count} layers follow but too few bytes remain",
                offset=self.pos,
                field=field,
                expected=f"<= {self.remaining // MIN_LAYER_BYTES}",
                actual=count,
            )


class _Writer:
    """A cursor that writes into ``target`` (explicitly zeroing padding) or, with ``target=None``,
    only counts bytes (the size walk shares the writer's code path, so sizes and writes never disagree)."""

    __slots__ = ("layer_num", "pos", "target")

    def __init__(self, target: memoryview | None) -> None:
        self.target = target
        self.pos = 0
        self.layer_num = 0

    def align(self, alignment: int) -> None:
        target = _align(self.pos, alignment)
        if self.target is not None and target > self.pos:
            self.target[self.pos : target] = bytes(target - self.pos)
        self.pos = target

    def u32(self, value: int, field: str) -> None:
        if not 0 <= value <= _UINT32_MAX:
            raise NNEError(
                f"{field} does not fit in a uint32", field=field, expected="0..2^32-1", actual=value
            )
        self.align(SCALAR_ALIGNMENT)
        if self.target is not None:
            _U32.pack_into(self.target, self.pos, value)
        self.pos += 4

    def f32(self, value: float, field: str) -> None:
        # Packed even when only counting, so that sizing refuses exactly what writing refuses.
        try:
            packed = _F32.pack(value)
        except (OverflowError, struct.error) as exc:
            raise NNEError(f"{field} is outside the float32 range", field=field, actual=value) from exc
        self.align(SCALAR_ALIGNMENT)
        if self.target is not None:
            self.target[self.pos : self.pos + 4] = packed
        self.pos += 4

    def array(self, data: npt.NDArray[Any], kind: ArrayKind) -> None:
        self.align(ARRAY_ALIGNMENT)
        nbytes = data.size * ARRAY_DTYPES[kind].itemsize
        if self.target is not None and nbytes:
            wire = np.ascontiguousarray(data).astype(ARRAY_DTYPES[kind], copy=False)
            self.target[self.pos : self.pos + nbytes] = wire.data.cast("B")
        self.pos += nbytes


# --------------------------------------------------------------------------------------------------
# Field access shared by the interpreters below


def _int_attr(layer: Layer, name: str) -> int:
    value = getattr(layer, name)
    if not isinstance(value, int):
        raise TypeError(f"{type(layer).__name__}.{name} is not an int")
    return value


def _layers_attr(layer: Layer, name: str) -> tuple[Layer, ...]:
    value = getattr(layer, name)
    if not isinstance(value, tuple):
        raise TypeError(f"{type(layer).__name__}.{name} is not a tuple of layers")
    return value


def _array_data(layer: Layer, field: ArrayField) -> npt.NDArray[Any]:
    value = getattr(layer, field.name)
    if field.kind == "uint32":
        return np.asarray(value, dtype=np.int64)
    if not isinstance(value, np.ndarray):
        raise TypeError(f"{type(layer).__name__}.{field.name} is not a numpy array")
    return value


def _f32_bits(value: float) -> bytes:
    """The bytes ``value`` serialises to (compared bitwise, so NaN == NaN and 0.0 != -0.0); values outside
    the float32 range fall back to their float64 bytes so that the comparison stays total."""
    try:
        return _F32.pack(value)
    except (OverflowError, struct.error):
        return struct.pack("<d", value)


def _unknown_field(field: object) -> NoReturn:
    # Unreachable while protocol.nne.layout only uses the six kinds of its Field union.
    raise TypeError(f"{field!r} is not a field descriptor")


# --------------------------------------------------------------------------------------------------
# Reading


def _read_layer(r: _Reader, path: str, depth: int) -> Layer:
    start = r.pos
    if depth > MAX_LAYER_DEPTH:
        raise NNEDecodeError(
            f"layers nest too deeply at {path}",
            offset=start,
            field=path,
            expected=f"<= {MAX_LAYER_DEPTH}",
            actual=depth,
        )
    r.layer_num += 1
    if r.layer_num > MAX_LAYER_NUM:
        raise NNEDecodeError(
            "the model holds too many layers", offset=start, field=path, expected=f"<= {MAX_LAYER_NUM}"
        )
    type_id = r.u32(f"{path}.type_id")
    spec = LAYER_SPECS.get(type_id)
    if spec is None:
        raise NNEDecodeError(
            f"unknown layer type id {type_id} at {path}",
            offset=r.pos - 4,
            field=f"{path}.type_id",
            expected="1..31",
            actual=type_id,
        )
    ctx: dict[str, int] = {}
    kwargs: dict[str, object] = {}
    for field in spec.fields:
        _read_field(field, r, ctx, kwargs, path, depth)
    try:
        return spec.cls(**kwargs)
    except NNEDecodeError:
        raise
    except NNEError as exc:
        # The value constructors check sizes against sub-layers; re-raise with where it happened.
        raise NNEDecodeError(
            f"{spec.type_id.name} layer at {path} is inconsistent: {exc}",
            offset=start,
            field=f"{path}: {exc.field}" if exc.field else path,
            expected=exc.expected,
            actual=exc.actual,
        ) from exc


def _read_field(
    field: Field, r: _Reader, ctx: dict[str, int], kwargs: dict[str, object], path: str, depth: int
) -> None:
    """Read one field of the layer at ``path``: ints later fields refer to go to ``ctx``, constructor
    arguments to ``kwargs``."""
    match field:
        case ScalarField(name=name):
            value = r.u32(f"{path}.{name}")
            ctx[name] = value
            kwargs[name] = value
        case CountField(name=name):
            ctx[name] = r.u32(f"{path}.{name}")
        case FloatField(name=name):
            kwargs[name] = r.f32(f"{path}.{name}")
        case ArrayField(name=name, kind=kind, dims=dims):
            data = r.array(f"{path}.{name}", kind, tuple(ctx[d] for d in dims))
            # uint32 arrays are size lists, which the layer values hold as tuples of int.
            kwargs[name] = tuple(int(v) for v in data) if kind == "uint32" else data
        case SubField(name=name):
            kwargs[name] = _read_layer(r, f"{path}.{name}", depth + 1)
        case SubsField(name=name, count=count):
            n = ctx[count]
            r.check_count(n, f"{path}.{count}")
            kwargs[name] = tuple(_read_layer(r, f"{path}.{name}[{i}]", depth + 1) for i in range(n))
        case _:
            _unknown_field(field)


def _as_bytes_view(buf: bytes | bytearray | memoryview) -> memoryview:
    view = memoryview(buf)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def read_model_prefix(buf: bytes | bytearray | memoryview) -> tuple[Layer, int]:
    """Decode the model at the start of ``buf``; return it and the number of bytes it occupies.

    Bytes after the root layer are ignored (see :func:`read_model` to refuse them). Offsets in errors
    count from ``buf[0]``, which must be the magic. Arrays in the result are copies, never views of ``buf``.
    """
    r = _Reader(_as_bytes_view(buf))
    magic = r.u32("model.magic")
    if magic != MODEL_MAGIC:
        raise NNEDecodeError(
            "the model does not start with the NNERuntimeBasicCpu magic",
            offset=0,
            field="model.magic",
            expected=f"0x{MODEL_MAGIC:08X}",
            actual=f"0x{magic:08X}",
        )
    version = r.u32("model.version")
    if version != MODEL_VERSION:
        raise NNEDecodeError(
            "unsupported NNERuntimeBasicCpu model version",
            offset=4,
            field="model.version",
            expected=MODEL_VERSION,
            actual=version,
        )
    layer = _read_layer(r, "root", 1)
    return layer, r.pos


def read_model(buf: bytes | bytearray | memoryview, *, allow_trailing: bool = False) -> Layer:
    """Decode a whole model blob (magic, version, root layer).

    Raises :class:`NNEDecodeError` for any malformed input, including bytes left over after the root
    layer unless ``allow_trailing`` is true.
    """
    view = _as_bytes_view(buf)
    layer, used = read_model_prefix(view)
    if not allow_trailing and used != len(view):
        raise NNEDecodeError(
            f"{len(view) - used} bytes follow the root layer",
            offset=used,
            field="model.length",
            expected=used,
            actual=len(view),
        )
    return layer


# --------------------------------------------------------------------------------------------------
# Writing and sizes


def _write_layer(w: _Writer, layer: Layer, path: str, depth: int) -> None:
    # The writer refuses what the reader would refuse, so every blob we produce decodes again.
    if depth > MAX_LAYER_DEPTH:
        raise NNEError(
            f"layers nest too deeply at {path}", field=path, expected=f"<= {MAX_LAYER_DEPTH}", actual=depth
        )
    w.layer_num += 1
    if w.layer_num > MAX_LAYER_NUM:
        raise NNEError("the model holds too many layers", field=path, expected=f"<= {MAX_LAYER_NUM}")
    spec = spec_of(layer)
    w.u32(int(spec.type_id), f"{path}.type_id")
    ctx: dict[str, int] = {}
    for field in spec.fields:
        _write_field(field, w, layer, ctx, path, depth)


def _write_field(field: Field, w: _Writer, layer: Layer, ctx: dict[str, int], path: str, depth: int) -> None:
    """Write (or, with a counting writer, size) one field of ``layer``; ints go to ``ctx`` as when reading."""
    match field:
        case ScalarField(name=name):
            value = _int_attr(layer, name)
            ctx[name] = value
            w.u32(value, f"{path}.{name}")
        case CountField(name=name, of=of):
            value = len(_layers_attr(layer, of))
            ctx[name] = value
            w.u32(value, f"{path}.{name}")
        case FloatField(name=name):
            w.f32(float(getattr(layer, name)), f"{path}.{name}")
        case ArrayField():
            _write_array(field, w, layer, ctx, path)
        case SubField(name=name):
            _write_layer(w, getattr(layer, name), f"{path}.{name}", depth + 1)
        case SubsField(name=name, count=count):
            subs = _layers_attr(layer, name)
            if len(subs) != ctx[count]:
                raise NNEError(
                    f"{path}.{name} does not have the number of layers written before it",
                    field=f"{path}.{name}",
                    expected=ctx[count],
                    actual=len(subs),
                )
            for i, sub in enumerate(subs):
                _write_layer(w, sub, f"{path}.{name}[{i}]", depth + 1)
        case _:
            _unknown_field(field)


def _write_array(field: ArrayField, w: _Writer, layer: Layer, ctx: dict[str, int], path: str) -> None:
    data = _array_data(layer, field)
    shape = tuple(ctx[d] for d in field.dims)
    where = f"{path}.{field.name}"
    if field.kind == "uint32" and data.size and not (0 <= int(data.min()) and int(data.max()) <= _UINT32_MAX):
        raise NNEError(f"{where} holds a value outside uint32", field=where)
    if data.size != math.prod(shape):
        # Cannot happen for a validated layer value; guards values altered after construction.
        raise NNEError(
            f"{where} does not match the sizes written before it",
            field=where,
            expected=shape,
            actual=data.shape,
        )
    w.array(data, field.kind)


def _walk(layer: Layer, w: _Writer) -> int:
    w.u32(MODEL_MAGIC, "model.magic")
    w.u32(MODEL_VERSION, "model.version")
    _write_layer(w, layer, "root", 1)
    return w.pos


def model_byte_size(layer: Layer) -> int:
    """Bytes :func:`write_model` produces for ``layer`` (the snapshot's FileDataSize without trailing data)."""
    return _walk(layer, _Writer(None))


def write_model(layer: Layer) -> bytes:
    """Encode ``layer`` as a model blob (magic, version, layer) with zero padding."""
    out = bytearray(model_byte_size(layer))
    _walk(layer, _Writer(memoryview(out)))
    return bytes(out)


def write_model_into(layer: Layer, buf: bytearray | memoryview, offset: int = 0) -> int:
    """Encode ``layer`` into ``buf[offset:]`` (e.g. a shared-memory region) and return the bytes written.

    Alignment counts from ``buf[offset]``; padding is written as zeros, so stale bytes never leak.
    """
    size = model_byte_size(layer)
    view = _as_bytes_view(buf)
    if offset < 0 or len(view) - offset < size:
        raise NNEError(
            "the target buffer is too small for the model",
            field="buffer.length",
            expected=f">= {offset + size}",
            actual=len(view),
        )
    return _walk(layer, _Writer(view[offset : offset + size]))


# --------------------------------------------------------------------------------------------------
# Comparisons


def layers_equal(a: Layer, b: Layer) -> bool:
    """True when ``a`` and ``b`` have the same types, sizes and bitwise-identical float data, i.e. when
    they serialise to the same bytes."""
    if type(a) is not type(b):
        return False
    return all(_field_equal(field, a, b) for field in spec_of(a).fields)


def structure_key(layer: Layer) -> tuple[object, ...]:
    """Types and every integer size, no float values: two layers with equal keys serialise to the same
    byte size and layout (the engine requires that of every network it receives back, spec §6.1, §10.6)."""
    spec = spec_of(layer)
    return (int(spec.type_id), *(k for k in (_field_key(f, layer) for f in spec.fields) if k is not None))


def first_structure_difference(a: Layer, b: Layer, path: str = "root") -> str | None:
    """A sentence naming the first place where ``a`` and ``b`` differ in type or an integer size (in
    serialisation order), or ``None`` when their :func:`structure_key` values are equal."""
    if type(a) is not type(b):
        return f"{path} is a {type(a).__name__} in one and a {type(b).__name__} in the other"
    for field in spec_of(a).fields:
        found = _field_diff(field, a, b, path)
        if found is not None:
            return found
    return None


def _field_equal(field: Field, a: Layer, b: Layer) -> bool:
    """Whether ``a`` and ``b`` (same type) hold bitwise-identical values in ``field``."""
    match field:
        case ScalarField(name=name):
            return _int_attr(a, name) == _int_attr(b, name)
        case CountField(of=of):
            return len(_layers_attr(a, of)) == len(_layers_attr(b, of))
        case FloatField(name=name):
            return _f32_bits(float(getattr(a, name))) == _f32_bits(float(getattr(b, name)))
        case ArrayField(name=name, kind="uint32"):
            return tuple(getattr(a, name)) == tuple(getattr(b, name))
        case ArrayField():
            da, db = _array_data(a, field), _array_data(b, field)
            # Bitwise: compare the raw bytes, so NaN payloads count and 0.0 differs from -0.0.
            return bool(da.shape == db.shape and da.dtype == db.dtype and da.tobytes() == db.tobytes())
        case SubField(name=name):
            return layers_equal(getattr(a, name), getattr(b, name))
        case SubsField(name=name):
            sa, sb = _layers_attr(a, name), _layers_attr(b, name)
            return len(sa) == len(sb) and all(layers_equal(x, y) for x, y in zip(sa, sb, strict=True))
        case _:
            _unknown_field(field)


def _field_key(field: Field, layer: Layer) -> object:
    """``field``'s contribution to :func:`structure_key`: ints and sub-layer keys, ``None`` for float data."""
    match field:
        case ScalarField(name=name):
            return _int_attr(layer, name)
        case CountField(of=of):
            return len(_layers_attr(layer, of))
        case ArrayField(name=name, kind="uint32"):
            return tuple(getattr(layer, name))
        case FloatField() | ArrayField():
            return None
        case SubField(name=name):
            return structure_key(getattr(layer, name))
        case SubsField(name=name):
            return tuple(structure_key(sub) for sub in _layers_attr(layer, name))
        case _:
            _unknown_field(field)


def _field_diff(field: Field, a: Layer, b: Layer, path: str) -> str | None:
    """The first structural difference in ``field`` (ints and sub-layers; float data is ignored)."""
    match field:
        case ScalarField(name=name):
            va, vb = _int_attr(a, name), _int_attr(b, name)
            return None if va == vb else f"{path}.{name} is {va} in one and {vb} in the other"
        case CountField(of=of):
            na, nb = len(_layers_attr(a, of)), len(_layers_attr(b, of))
            return None if na == nb else f"{path}.{of} has {na} layers in one and {nb} in the other"
        case ArrayField(name=name, kind="uint32"):
            ta, tb = tuple(getattr(a, name)), tuple(getattr(b, name))
            return None if ta == tb else f"{path}.{name} is {ta} in one and {tb} in the other"
        case FloatField() | ArrayField():
            return None
        case SubField(name=name):
            return first_structure_difference(getattr(a, name), getattr(b, name), f"{path}.{name}")
        case SubsField(name=name):
            sa, sb = _layers_attr(a, name), _layers_attr(b, name)
            if len(sa) != len(sb):
                return f"{path}.{name} has {len(sa)} layers in one and {len(sb)} in the other"
            for i, (x, y) in enumerate(zip(sa, sb, strict=True)):
                found = first_structure_difference(x, y, f"{path}.{name}[{i}]")
                if found is not None:
                    return found
            return None
        case _:
            _unknown_field(field)
