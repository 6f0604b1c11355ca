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

One table, :data:`_LAYER_SPECS`, maps each :class:`LayerType` to a declarative field list; the reader, the
writer, the size walk, :func:`structure_key`, :func:`layers_equal` and :func:`first_structure_difference`
all interpret that one table, so a layer's byte layout is written down exactly once (msgpack's
``_MSGPACK_HEADERS`` / h11's ``READERS`` play the same role there).

Decoding is defensive: every count and array size is checked against the bytes that remain *before*
anything is allocated, nesting depth and the total number of layers are bounded, and every failure is an
:class:`NNEDecodeError` (a :class:`protocol.errors.NNEError`) naming the field path and the byte offset.
"""

from __future__ import annotations

import math
import struct
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from protocol.errors import NNEError
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

_LE_DTYPES: Final[dict[str, np.dtype[Any]]] = {
    "float32": np.dtype("<f4"),
    "uint16": np.dtype("<u2"),
    "uint32": np.dtype("<u4"),
}
"""On-wire dtype (explicit little-endian) per array kind."""


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

    def array(self, field: str, kind: str, shape: tuple[int, ...]) -> npt.NDArray[Any]:
        # [INF] An empty array still moves the cursor to the next 64-byte boundary: the engine's
        # Serialization::Size/Save/Load call Align(64) before every array whatever its length, and so
        # does the 5.6/5.7 Python serialiser (serialization_align before each *_array).
        self.align(ARRAY_ALIGNMENT, field)
        dtype = _LE_DTYPES[kind]
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

    def array(self, data: npt.NDArray[Any], kind: str) -> None:
        self.align(ARRAY_ALIGNMENT)
        nbytes = data.size * _LE_DTYPES[kind].itemsize
        if self.target is not None and nbytes:
            wire = np.ascontiguousarray(data).astype(_LE_DTYPES[kind], copy=False)
            self.target[self.pos : self.pos + nbytes] = wire.data.cast("B")
        self.pos += nbytes


# --------------------------------------------------------------------------------------------------
# Field descriptors: one class per kind of field, each knowing how to read, write and compare itself


class _Field(ABC):
    """One serialised field of a layer. ``name`` is the dataclass attribute (or, for a count, the name
    later fields use to refer to it)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    @abstractmethod
    def read(self, r: _Reader, ctx: dict[str, int], kwargs: dict[str, object], path: str, depth: int) -> None:
        """Read the field; put ints later fields need in ``ctx`` and constructor arguments in ``kwargs``."""

    @abstractmethod
    def write(self, w: _Writer, layer: Layer, ctx: dict[str, int], path: str, depth: int) -> None:
        """Write (or, with a counting writer, size) the field of ``layer``."""

    @abstractmethod
    def key(self, layer: Layer) -> object:
        """The field's contribution to :func:`structure_key` (``None`` for float data)."""

    @abstractmethod
    def equal(self, a: Layer, b: Layer) -> bool:
        """Whether ``a`` and ``b`` (same type) hold bitwise-identical values in this field."""

    @abstractmethod
    def diff(self, a: Layer, b: Layer, path: str) -> str | None:
        """The first structural difference in this field (ints and sub-layers; floats ignored)."""


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


class _Scalar(_Field):
    """``u``: a uint32 stored on the layer as an int attribute."""

    __slots__ = ()

    def read(self, r: _Reader, ctx: dict[str, int], kwargs: dict[str, object], path: str, depth: int) -> None:
        value = r.u32(f"{path}.{self.name}")
        ctx[self.name] = value
        kwargs[self.name] = value

    def write(self, w: _Writer, layer: Layer, ctx: dict[str, int], path: str, depth: int) -> None:
        value = _int_attr(layer, self.name)
        ctx[self.name] = value
        w.u32(value, f"{path}.{self.name}")

    def key(self, layer: Layer) -> object:
        return _int_attr(layer, self.name)

    def equal(self, a: Layer, b: Layer) -> bool:
        return _int_attr(a, self.name) == _int_attr(b, self.name)

    def diff(self, a: Layer, b: Layer, path: str) -> str | None:
        va, vb = _int_attr(a, self.name), _int_attr(b, self.name)
        return None if va == vb else f"{path}.{self.name} is {va} in one and {vb} in the other"


class _Count(_Field):
    """``u`` LayerNum-style count: written as ``len(layer.<of>)``, not stored on the layer itself."""

    __slots__ = ("of",)

    def __init__(self, name: str, of: str) -> None:
        super().__init__(name)
        self.of = of

    def read(self, r: _Reader, ctx: dict[str, int], kwargs: dict[str, object], path: str, depth: int) -> None:
        ctx[self.name] = r.u32(f"{path}.{self.name}")

    def write(self, w: _Writer, layer: Layer, ctx: dict[str, int], path: str, depth: int) -> None:
        value = len(_layers_attr(layer, self.of))
        ctx[self.name] = value
        w.u32(value, f"{path}.{self.name}")

    def key(self, layer: Layer) -> object:
        return len(_layers_attr(layer, self.of))

    def equal(self, a: Layer, b: Layer) -> bool:
        return len(_layers_attr(a, self.of)) == len(_layers_attr(b, self.of))

    def diff(self, a: Layer, b: Layer, path: str) -> str | None:
        va, vb = len(_layers_attr(a, self.of)), len(_layers_attr(b, self.of))
        return None if va == vb else f"{path}.{self.of} has {va} layers in one and {vb} in the other"


class _Float(_Field):
    """``float``: a 4-byte float32 scalar (LayerNorm epsilon)."""

    __slots__ = ()

    def read(self, r: _Reader, ctx: dict[str, int], kwargs: dict[str, object], path: str, depth: int) -> None:
        kwargs[self.name] = r.f32(f"{path}.{self.name}")

    def write(self, w: _Writer, layer: Layer, ctx: dict[str, int], path: str, depth: int) -> None:
        w.f32(float(getattr(layer, self.name)), f"{path}.{self.name}")

    def key(self, layer: Layer) -> object:
        return None

    def equal(self, a: Layer, b: Layer) -> bool:
        return _f32_bits(float(getattr(a, self.name))) == _f32_bits(float(getattr(b, self.name)))

    def diff(self, a: Layer, b: Layer, path: str) -> str | None:
        return None


def _f32_bits(value: float) -> bytes:
    """The bytes ``value`` serialises to (compared bitwise, so NaN == NaN and 0.0 != -0.0); values outside
    the float32 range fall back to their float64 bytes so that the comparison stays total."""
    try:
        return _F32.pack(value)
    except (OverflowError, struct.error):
        return struct.pack("<d", value)


class _ArrayField(_Field):
    """``F`` / ``uint16`` / ``U`` array of the shape named by earlier scalars (64-byte aligned, no prefix)."""

    __slots__ = ("dims", "kind")

    def __init__(self, name: str, kind: str, dims: tuple[str, ...]) -> None:
        super().__init__(name)
        self.kind = kind
        self.dims = dims

    def read(self, r: _Reader, ctx: dict[str, int], kwargs: dict[str, object], path: str, depth: int) -> None:
        shape = tuple(ctx[d] for d in self.dims)
        data = r.array(f"{path}.{self.name}", self.kind, shape)
        # uint32 arrays are size lists, which the layer values hold as tuples of int.
        kwargs[self.name] = tuple(int(v) for v in data) if self.kind == "uint32" else data

    def _data(self, layer: Layer) -> npt.NDArray[Any]:
        value = getattr(layer, self.name)
        if self.kind == "uint32":
            return np.asarray(value, dtype=np.int64)
        if not isinstance(value, np.ndarray):
            raise TypeError(f"{type(layer).__name__}.{self.name} is not a numpy array")
        return value

    def write(self, w: _Writer, layer: Layer, ctx: dict[str, int], path: str, depth: int) -> None:
        data = self._data(layer)
        shape = tuple(ctx[d] for d in self.dims)
        if (
            self.kind == "uint32"
            and data.size
            and not (0 <= int(data.min()) and int(data.max()) <= _UINT32_MAX)
        ):
            raise NNEError(f"{path}.{self.name} holds a value outside uint32", field=f"{path}.{self.name}")
        if data.size != math.prod(shape):
            # Cannot happen for a validated layer value; guards values altered after construction.
            raise NNEError(
                f"{path}.{self.name} does not match the sizes written before it",
                field=f"{path}.{self.name}",
                expected=shape,
                actual=data.shape,
            )
        w.array(data, self.kind)

    def key(self, layer: Layer) -> object:
        return tuple(getattr(layer, self.name)) if self.kind == "uint32" else None

    def equal(self, a: Layer, b: Layer) -> bool:
        if self.kind == "uint32":
            return tuple(getattr(a, self.name)) == tuple(getattr(b, self.name))
        da, db = self._data(a), self._data(b)
        # Bitwise: compare the raw bytes, so NaN payloads count and 0.0 differs from -0.0.
        return bool(da.shape == db.shape and da.dtype == db.dtype and da.tobytes() == db.tobytes())

    def diff(self, a: Layer, b: Layer, path: str) -> str | None:
        if self.kind != "uint32":
            return None
        va, vb = tuple(getattr(a, self.name)), tuple(getattr(b, self.name))
        return None if va == vb else f"{path}.{self.name} is {va} in one and {vb} in the other"


class _Sub(_Field):
    """One sub-layer stored in attribute ``name``."""

    __slots__ = ()

    def read(self, r: _Reader, ctx: dict[str, int], kwargs: dict[str, object], path: str, depth: int) -> None:
        kwargs[self.name] = _read_layer(r, f"{path}.{self.name}", depth + 1)

    def write(self, w: _Writer, layer: Layer, ctx: dict[str, int], path: str, depth: int) -> None:
        _write_layer(w, getattr(layer, self.name), f"{path}.{self.name}", depth + 1)

    def key(self, layer: Layer) -> object:
        return structure_key(getattr(layer, self.name))

    def equal(self, a: Layer, b: Layer) -> bool:
        return layers_equal(getattr(a, self.name), getattr(b, self.name))

    def diff(self, a: Layer, b: Layer, path: str) -> str | None:
        return first_structure_difference(getattr(a, self.name), getattr(b, self.name), f"{path}.{self.name}")


class _Subs(_Field):
    """``count`` sub-layers (count read earlier) stored as a tuple in attribute ``name``."""

    __slots__ = ("count",)

    def __init__(self, name: str, count: str) -> None:
        super().__init__(name)
        self.count = count

    def read(self, r: _Reader, ctx: dict[str, int], kwargs: dict[str, object], path: str, depth: int) -> None:
        n = ctx[self.count]
        r.check_count(n, f"{path}.{self.count}")
        kwargs[self.name] = tuple(_read_layer(r, f"{path}.{self.name}[{i}]", depth + 1) for i in range(n))

    def write(self, w: _Writer, layer: Layer, ctx: dict[str, int], path: str, depth: int) -> None:
        subs = _layers_attr(layer, self.name)
        if len(subs) != ctx[self.count]:
            raise NNEError(
                f"{path}.{self.name} does not have the number of layers written before it",
                field=f"{path}.{self.name}",
                expected=ctx[self.count],
                actual=len(subs),
            )
        for i, sub in enumerate(subs):
            _write_layer(w, sub, f"{path}.{self.name}[{i}]", depth + 1)

    def key(self, layer: Layer) -> object:
        return tuple(structure_key(sub) for sub in _layers_attr(layer, self.name))

    def equal(self, a: Layer, b: Layer) -> bool:
        sa, sb = _layers_attr(a, self.name), _layers_attr(b, self.name)
        return len(sa) == len(sb) and all(layers_equal(x, y) for x, y in zip(sa, sb, strict=True))

    def diff(self, a: Layer, b: Layer, path: str) -> str | None:
        sa, sb = _layers_attr(a, self.name), _layers_attr(b, self.name)
        if len(sa) != len(sb):
            return f"{path}.{self.name} has {len(sa)} layers in one and {len(sb)} in the other"
        for i, (x, y) in enumerate(zip(sa, sb, strict=True)):
            found = first_structure_difference(x, y, f"{path}.{self.name}[{i}]")
            if found is not None:
                return found
        return None


# --------------------------------------------------------------------------------------------------
# The layout table (field order from protocol/nne/layers.py, which follows spec §6.2)


@dataclass(frozen=True, slots=True)
class _LayerSpec:
    type_id: LayerType
    cls: Callable[..., Layer]
    fields: tuple[_Field, ...]


def _u(*names: str) -> tuple[_Field, ...]:
    return tuple(_Scalar(n) for n in names)


def _f(name: str, *dims: str) -> _Field:
    return _ArrayField(name, "float32", dims)


def _uarr(name: str, count: str) -> _Field:
    return _ArrayField(name, "uint32", (count,))


def _linear_fields() -> tuple[_Field, ...]:
    return (
        *_u("input_size", "output_size"),
        _f("bias", "output_size"),
        _f("weights", "input_size", "output_size"),
    )


def _sized(*arrays: str) -> tuple[_Field, ...]:
    return (*_u("size"), *(_f(a, "size") for a in arrays))


_SPEC_LIST: tuple[_LayerSpec, ...] = (
    _LayerSpec(LayerType.SEQUENCE, Sequence, (_Count("layer_num", "layers"), _Subs("layers", "layer_num"))),
    _LayerSpec(LayerType.NORMALIZE, Normalize, _sized("mean", "std")),
    _LayerSpec(LayerType.DENORMALIZE, Denormalize, _sized("mean", "std")),
    _LayerSpec(LayerType.LINEAR, Linear, _linear_fields()),
    _LayerSpec(
        LayerType.COMPRESSED_LINEAR,
        CompressedLinear,
        (
            *_u("input_size", "output_size"),
            _f("weight_offsets", "input_size"),
            _f("weight_scales", "input_size"),
            _f("bias", "output_size"),
            _ArrayField("weights", "uint16", ("input_size", "output_size")),
        ),
    ),
    _LayerSpec(
        LayerType.MULTI_LINEAR,
        MultiLinear,
        (
            *_u("block_num", "block_input_size", "block_output_size"),
            _f("bias", "block_num", "block_output_size"),
            _f("weights", "block_num", "block_input_size", "block_output_size"),
        ),
    ),
    _LayerSpec(LayerType.RELU, ReLU, _sized()),
    _LayerSpec(LayerType.ELU, ELU, _sized()),
    _LayerSpec(LayerType.TANH, TanH, _sized()),
    _LayerSpec(LayerType.PRELU, PReLU, _sized("alpha")),
    _LayerSpec(
        LayerType.MEMORY_CELL,
        MemoryCell,
        (
            *_u("input_size_", "output_size_", "memory_size"),
            _Sub("remember_layer"),
            _Sub("passthrough_layer"),
            _Sub("memory_update_layer"),
            _Sub("output_input_layer"),
            _Sub("output_memory_layer"),
        ),
    ),
    _LayerSpec(LayerType.COPY, Copy, _sized()),
    _LayerSpec(
        LayerType.CONCAT,
        Concat,
        (
            _Count("layer_num", "layers"),
            _uarr("input_sizes", "layer_num"),
            _uarr("output_sizes", "layer_num"),
            _Subs("layers", "layer_num"),
        ),
    ),
    _LayerSpec(
        LayerType.ARRAY,
        Array,
        (*_u("element_num", "element_input_size", "element_output_size"), _Sub("layer")),
    ),
    _LayerSpec(
        LayerType.AGGREGATE_SET,
        AggregateSet,
        (
            *_u(
                "max_element_num",
                "element_input_size",
                "element_output_size",
                "output_encoding_size",
                "attention_encoding_size",
                "attention_head_num",
            ),
            _Sub("element_layer"),
            _Sub("query_layer"),
            _Sub("key_layer"),
            _Sub("value_layer"),
        ),
    ),
    _LayerSpec(
        LayerType.AGGREGATE_OR_EXCLUSIVE,
        AggregateOrExclusive,
        (
            _Count("layer_num", "sub_layers"),
            *_u("output_encoding_size"),
            _uarr("input_sizes", "layer_num"),
            _uarr("output_sizes", "layer_num"),
            _Subs("sub_layers", "layer_num"),
            _Subs("encoder_layers", "layer_num"),
        ),
    ),
    _LayerSpec(
        LayerType.AGGREGATE_OR_INCLUSIVE,
        AggregateOrInclusive,
        (
            _Count("layer_num", "sub_layers"),
            *_u("output_encoding_size", "attention_encoding_size", "attention_head_num"),
            _uarr("input_sizes", "layer_num"),
            _uarr("output_sizes", "layer_num"),
            _Subs("sub_layers", "layer_num"),
            _Subs("query_layers", "layer_num"),
            _Subs("key_layers", "layer_num"),
            _Subs("value_layers", "layer_num"),
        ),
    ),
    _LayerSpec(LayerType.CLAMP, Clamp, _sized("min", "max")),
    _LayerSpec(
        LayerType.SPARSE_MIXTURE_OF_EXPERTS,
        SparseMixtureOfExperts,
        (
            *_u("input_size_", "output_size_"),
            _Sub("gating_layer"),
            _Count("expert_num", "expert_layers"),
            _Subs("expert_layers", "expert_num"),
        ),
    ),
    _LayerSpec(LayerType.GELU, GELU, _sized()),
    _LayerSpec(LayerType.LAYER_NORM, LayerNorm, (*_sized("offset", "scale"), _Float("epsilon"))),
    _LayerSpec(LayerType.LIPSCHIZT_LINEAR, LipschiztLinear, _linear_fields()),
    _LayerSpec(LayerType.TILE, Tile, _u("input_size_", "repeats")),
    _LayerSpec(
        LayerType.SPREAD,
        Spread,
        (
            _Count("layer_num", "layers"),
            *_u("input_size_"),
            _uarr("output_sizes", "layer_num"),
            _Subs("layers", "layer_num"),
        ),
    ),
    _LayerSpec(LayerType.SLICE, Slice, _u("input_size_", "slice_offset", "slice_size")),
    _LayerSpec(LayerType.RESIDUAL, Residual, (*_u("size"), _Sub("layer"))),
    _LayerSpec(
        LayerType.FILM,
        FiLM,
        (
            *_u(
                "prefix_input_size",
                "prefix_output_size",
                "condition_input_size",
                "condition_output_size",
                "postfix_input_size",
                "postfix_output_size",
            ),
            _Sub("prefix_layer"),
            _Sub("condition_layer"),
            _Sub("postfix_layer"),
        ),
    ),
    _LayerSpec(
        LayerType.GRU_CELL,
        GRUCell,
        (
            *_u("input_size_", "output_size_"),
            _Sub("remember_layer"),
            _Sub("update_layer"),
            _Sub("activation_layer"),
        ),
    ),
    _LayerSpec(
        LayerType.CONV1D,
        Conv1d,
        (
            *_u("input_length", "in_channels", "out_channels", "kernel_size", "padding", "padding_mode"),
            _f("weights", "kernel_size", "in_channels", "out_channels"),
            _f("bias", "out_channels"),
            _Sub("layer"),
        ),
    ),
    _LayerSpec(
        LayerType.CONV2D,
        Conv2d,
        (
            *_u(
                "input_height",
                "input_width",
                "in_channels",
                "out_channels",
                "kernel_size",
                "stride",
                "padding",
                "padding_mode",
            ),
            _f("weights", "kernel_size", "kernel_size", "in_channels", "out_channels"),
            _f("bias", "out_channels"),
            _Sub("layer"),
        ),
    ),
    _LayerSpec(LayerType.SOFTMAX, Softmax, _sized()),
)

_LAYER_SPECS: Final[dict[int, _LayerSpec]] = {int(s.type_id): s for s in _SPEC_LIST}
"""Type id -> layout. Id 0 (Invalid) is deliberately absent: the engine refuses it too."""
_SPEC_BY_CLASS: Final[dict[object, _LayerSpec]] = {s.cls: s for s in _SPEC_LIST}


def _spec_of(layer: Layer) -> _LayerSpec:
    spec = _SPEC_BY_CLASS.get(type(layer))
    if spec is None:
        raise TypeError(f"{type(layer).__name__} is not an NNE layer value")
    return spec


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
    spec = _LAYER_SPECS.get(type_id)
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
        field.read(r, ctx, kwargs, path, depth)
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
    spec = _spec_of(layer)
    w.u32(int(spec.type_id), f"{path}.type_id")
    ctx: dict[str, int] = {}
    for field in spec.fields:
        field.write(w, layer, ctx, path, depth)


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
    return all(field.equal(a, b) for field in _spec_of(a).fields)


def structure_key(layer: Layer) -> tuple[object, ...]:
    """Types and every integer size, no float values: two layers with equal keys serialise to the same
    byte size and layout (the engine requires that of every network it receives back, spec §6.1, §10.6)."""
    spec = _spec_of(layer)
    return (int(spec.type_id), *(k for k in (f.key(layer) for f in spec.fields) if k is not None))


def first_structure_difference(a: Layer, b: Layer, path: str = "root") -> str | None:
    """A sentence naming the first place where ``a`` and ``b`` differ in type or an integer size (in
    serialisation order), or ``None`` when their :func:`structure_key` values are equal."""
    if type(a) is not type(b):
        return f"{path} is a {type(a).__name__} in one and a {type(b).__name__} in the other"
    for field in _spec_of(a).fields:
        found = field.diff(a, b, path)
        if found is not None:
            return found
    return None
