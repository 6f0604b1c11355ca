"""Byte layout of every NNERuntimeBasicCpu layer type, as data (spec §6.2, §10).

Each layer is serialised as ``uint32 type id`` followed by its fields in the order of its
:class:`LayerSpec` (the same order as the field list on its dataclass in :mod:`protocol.nne.layers`).
The field kinds, as the docstrings of :mod:`protocol.nne.layers` abbreviate them:

==============  ====  =====================================================================================
descriptor      abbr  on the wire
==============  ====  =====================================================================================
ScalarField     u     uint32, 4-byte aligned, held by the layer value as an ``int`` attribute
CountField      u     uint32 layer count, 4-byte aligned, written as ``len`` of a tuple of sub-layers
FloatField      float float32 scalar, 4-byte aligned (LayerNorm epsilon)
ArrayField      F/U   float32 / uint16 / uint32 array, 64-byte aligned, no length prefix: its shape is the
                      product of scalars read earlier in the same layer
SubField              one nested layer
SubsField             as many nested layers as a CountField read earlier says
==============  ====  =====================================================================================

This module only *describes* layouts; :mod:`protocol.nne.codec` is the one interpreter of the table (reader,
writer, size walk, equality and structure keys), so a layer's layout is written down exactly once (as
msgpack's ``_MSGPACK_HEADERS`` and h11's ``READERS`` do).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias

import numpy as np

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
    "ARRAY_DTYPES",
    "LAYER_SPECS",
    "ArrayField",
    "ArrayKind",
    "CountField",
    "Field",
    "FloatField",
    "LayerSpec",
    "ScalarField",
    "SubField",
    "SubsField",
    "children",
    "spec_of",
]

ArrayKind: TypeAlias = Literal["float32", "uint16", "uint32"]
"""Element type of an array field."""

ARRAY_DTYPES: Final[dict[ArrayKind, np.dtype[Any]]] = {
    "float32": np.dtype("<f4"),
    "uint16": np.dtype("<u2"),
    "uint32": np.dtype("<u4"),
}
"""On-wire dtype (explicit little-endian) per array kind."""


# --------------------------------------------------------------------------------------------------
# Field descriptors. ``name`` is the dataclass attribute, or for a count the name later fields use.


@dataclass(frozen=True, slots=True)
class ScalarField:
    """``u``: a uint32 held by the layer as the int attribute ``name``; later fields may use it as a dim."""

    name: str


@dataclass(frozen=True, slots=True)
class CountField:
    """``u`` LayerNum-style count: written as ``len(layer.<of>)``, not an attribute of the layer itself."""

    name: str
    of: str


@dataclass(frozen=True, slots=True)
class FloatField:
    """``float``: a float32 scalar held by the layer as the float attribute ``name``."""

    name: str


@dataclass(frozen=True, slots=True)
class ArrayField:
    """``F`` / uint16 / ``U`` array of shape ``dims`` (names of earlier scalars or counts).

    float32 and uint16 arrays are numpy arrays on the layer; uint32 arrays are size lists, which the layer
    holds as a tuple of int.
    """

    name: str
    kind: ArrayKind
    dims: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SubField:
    """One nested layer in attribute ``name``."""

    name: str


@dataclass(frozen=True, slots=True)
class SubsField:
    """``count`` nested layers (a count read earlier) held as a tuple in attribute ``name``."""

    name: str
    count: str


Field: TypeAlias = ScalarField | CountField | FloatField | ArrayField | SubField | SubsField


@dataclass(frozen=True, slots=True)
class LayerSpec:
    """The serialised form of one layer type: its id, its value class and its fields in wire order."""

    type_id: LayerType
    cls: Callable[..., Layer]
    fields: tuple[Field, ...]


# --------------------------------------------------------------------------------------------------
# The table (field order from protocol/nne/layers.py, which follows spec §6.2)


def _u(*names: str) -> tuple[Field, ...]:
    return tuple(ScalarField(n) for n in names)


def _f(name: str, *dims: str) -> Field:
    return ArrayField(name, "float32", dims)


def _uarr(name: str, count: str) -> Field:
    return ArrayField(name, "uint32", (count,))


def _linear_fields() -> tuple[Field, ...]:
    return (
        *_u("input_size", "output_size"),
        _f("bias", "output_size"),
        _f("weights", "input_size", "output_size"),
    )


def _sized(*arrays: str) -> tuple[Field, ...]:
    return (*_u("size"), *(_f(a, "size") for a in arrays))


_SPEC_LIST: tuple[LayerSpec, ...] = (
    LayerSpec(
        LayerType.SEQUENCE, Sequence, (CountField("layer_num", "layers"), SubsField("layers", "layer_num"))
    ),
    LayerSpec(LayerType.NORMALIZE, Normalize, _sized("mean", "std")),
    LayerSpec(LayerType.DENORMALIZE, Denormalize, _sized("mean", "std")),
    LayerSpec(LayerType.LINEAR, Linear, _linear_fields()),
    LayerSpec(
        LayerType.COMPRESSED_LINEAR,
        CompressedLinear,
        (
            *_u("input_size", "output_size"),
            _f("weight_offsets", "input_size"),
            _f("weight_scales", "input_size"),
            _f("bias", "output_size"),
            ArrayField("weights", "uint16", ("input_size", "output_size")),
        ),
    ),
    LayerSpec(
        LayerType.MULTI_LINEAR,
        MultiLinear,
        (
            *_u("block_num", "block_input_size", "block_output_size"),
            _f("bias", "block_num", "block_output_size"),
            _f("weights", "block_num", "block_input_size", "block_output_size"),
        ),
    ),
    LayerSpec(LayerType.RELU, ReLU, _sized()),
    LayerSpec(LayerType.ELU, ELU, _sized()),
    LayerSpec(LayerType.TANH, TanH, _sized()),
    LayerSpec(LayerType.PRELU, PReLU, _sized("alpha")),
    LayerSpec(
        LayerType.MEMORY_CELL,
        MemoryCell,
        (
            *_u("input_size_", "output_size_", "memory_size"),
            SubField("remember_layer"),
            SubField("passthrough_layer"),
            SubField("memory_update_layer"),
            SubField("output_input_layer"),
            SubField("output_memory_layer"),
        ),
    ),
    LayerSpec(LayerType.COPY, Copy, _sized()),
    LayerSpec(
        LayerType.CONCAT,
        Concat,
        (
            CountField("layer_num", "layers"),
            _uarr("input_sizes", "layer_num"),
            _uarr("output_sizes", "layer_num"),
            SubsField("layers", "layer_num"),
        ),
    ),
    LayerSpec(
        LayerType.ARRAY,
        Array,
        (*_u("element_num", "element_input_size", "element_output_size"), SubField("layer")),
    ),
    LayerSpec(
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
            SubField("element_layer"),
            SubField("query_layer"),
            SubField("key_layer"),
            SubField("value_layer"),
        ),
    ),
    LayerSpec(
        LayerType.AGGREGATE_OR_EXCLUSIVE,
        AggregateOrExclusive,
        (
            CountField("layer_num", "sub_layers"),
            *_u("output_encoding_size"),
            _uarr("input_sizes", "layer_num"),
            _uarr("output_sizes", "layer_num"),
            SubsField("sub_layers", "layer_num"),
            SubsField("encoder_layers", "layer_num"),
        ),
    ),
    LayerSpec(
        LayerType.AGGREGATE_OR_INCLUSIVE,
        AggregateOrInclusive,
        (
            CountField("layer_num", "sub_layers"),
            *_u("output_encoding_size", "attention_encoding_size", "attention_head_num"),
            _uarr("input_sizes", "layer_num"),
            _uarr("output_sizes", "layer_num"),
            SubsField("sub_layers", "layer_num"),
            SubsField("query_layers", "layer_num"),
            SubsField("key_layers", "layer_num"),
            SubsField("value_layers", "layer_num"),
        ),
    ),
    LayerSpec(LayerType.CLAMP, Clamp, _sized("min", "max")),
    LayerSpec(
        LayerType.SPARSE_MIXTURE_OF_EXPERTS,
        SparseMixtureOfExperts,
        (
            *_u("input_size_", "output_size_"),
            SubField("gating_layer"),
            CountField("expert_num", "expert_layers"),
            SubsField("expert_layers", "expert_num"),
        ),
    ),
    LayerSpec(LayerType.GELU, GELU, _sized()),
    LayerSpec(LayerType.LAYER_NORM, LayerNorm, (*_sized("offset", "scale"), FloatField("epsilon"))),
    LayerSpec(LayerType.LIPSCHIZT_LINEAR, LipschiztLinear, _linear_fields()),
    LayerSpec(LayerType.TILE, Tile, _u("input_size_", "repeats")),
    LayerSpec(
        LayerType.SPREAD,
        Spread,
        (
            CountField("layer_num", "layers"),
            *_u("input_size_"),
            _uarr("output_sizes", "layer_num"),
            SubsField("layers", "layer_num"),
        ),
    ),
    LayerSpec(LayerType.SLICE, Slice, _u("input_size_", "slice_offset", "slice_size")),
    LayerSpec(LayerType.RESIDUAL, Residual, (*_u("size"), SubField("layer"))),
    LayerSpec(
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
            SubField("prefix_layer"),
            SubField("condition_layer"),
            SubField("postfix_layer"),
        ),
    ),
    LayerSpec(
        LayerType.GRU_CELL,
        GRUCell,
        (
            *_u("input_size_", "output_size_"),
            SubField("remember_layer"),
            SubField("update_layer"),
            SubField("activation_layer"),
        ),
    ),
    LayerSpec(
        LayerType.CONV1D,
        Conv1d,
        (
            *_u("input_length", "in_channels", "out_channels", "kernel_size", "padding", "padding_mode"),
            # Channel-major [Out][In][Kernel], as the engine's Conv1d loops index it.
            _f("weights", "out_channels", "in_channels", "kernel_size"),
            _f("bias", "out_channels"),
            SubField("layer"),
        ),
    ),
    LayerSpec(
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
            # Channel-major [Out][In][KernelY][KernelX], as the engine's Conv2d loops index it.
            _f("weights", "out_channels", "in_channels", "kernel_size", "kernel_size"),
            _f("bias", "out_channels"),
            SubField("layer"),
        ),
    ),
    LayerSpec(LayerType.SOFTMAX, Softmax, _sized()),
)

LAYER_SPECS: Final[dict[int, LayerSpec]] = {int(s.type_id): s for s in _SPEC_LIST}
"""Type id -> layout. Id 0 (Invalid) is deliberately absent: the engine refuses it too."""
_SPEC_BY_CLASS: Final[dict[object, LayerSpec]] = {s.cls: s for s in _SPEC_LIST}


def spec_of(layer: Layer) -> LayerSpec:
    """The layout of ``layer``'s type; ``TypeError`` if ``layer`` is not a layer value."""
    spec = _SPEC_BY_CLASS.get(type(layer))
    if spec is None:
        raise TypeError(f"{type(layer).__name__} is not an NNE layer value")
    return spec


def children(layer: Layer) -> tuple[Layer, ...]:
    """The direct sub-layers of ``layer`` in serialisation order (empty for leaf layers): its
    :class:`SubField` and :class:`SubsField` values, read off its :class:`LayerSpec`."""
    found: list[Layer] = []
    for field in spec_of(layer).fields:
        if isinstance(field, SubField):
            found.append(getattr(layer, field.name))
        elif isinstance(field, SubsField):
            found.extend(getattr(layer, field.name))
    return tuple(found)
