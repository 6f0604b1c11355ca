"""NNERuntimeBasicCpu layers as values (spec §6.2, §10).

One frozen dataclass per layer type id. Fields appear in the order the engine serialises them, with the
engine's names in snake case. Float arrays are ``numpy.float32`` arrays of the documented shape, integer
size lists are tuples of ``int``. Construction validates every shape against the scalars that describe
it, so a value that exists is always serialisable.

``input_size`` / ``output_size`` give the width of the flat float vector the layer reads and writes.
They follow the engine's GetInputSize/GetOutputSize (NNERuntimeBasicCpuModel.cpp, read for facts), including
the less obvious ones: AggregateSet writes H·OES + 1, AggregateOrExclusive reads max(InputSizes) + n, GRUCell
writes its new state twice, and Conv layers run their sub-layer first. The exact arithmetic inside the
rare composite layers is documented (and [INF] where unverified) in :mod:`protocol.nne.reference`.

The byte codec lives in :mod:`protocol.nne.codec`; numeric evaluation in :mod:`protocol.nne.reference`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import TypeAlias

import numpy as np
import numpy.typing as npt

from protocol.errors import NNEError

__all__ = [
    "ELU",
    "GELU",
    "AggregateOrExclusive",
    "AggregateOrInclusive",
    "AggregateSet",
    "Array",
    "Clamp",
    "CompressedLinear",
    "Concat",
    "Conv1d",
    "Conv2d",
    "Copy",
    "Denormalize",
    "FiLM",
    "FloatArray",
    "GRUCell",
    "Layer",
    "LayerNorm",
    "LayerType",
    "Linear",
    "LipschiztLinear",
    "MemoryCell",
    "MultiLinear",
    "Normalize",
    "PReLU",
    "ReLU",
    "Residual",
    "Sequence",
    "Slice",
    "Softmax",
    "SparseMixtureOfExperts",
    "Spread",
    "TanH",
    "Tile",
    "U16Array",
]

FloatArray: TypeAlias = npt.NDArray[np.float32]
U16Array: TypeAlias = npt.NDArray[np.uint16]


class LayerType(IntEnum):
    """Layer type ids as serialised (uint32) in front of every layer (spec §6.2)."""

    INVALID = 0
    SEQUENCE = 1
    NORMALIZE = 2
    DENORMALIZE = 3
    LINEAR = 4
    COMPRESSED_LINEAR = 5
    MULTI_LINEAR = 6
    RELU = 7
    ELU = 8
    TANH = 9
    PRELU = 10
    MEMORY_CELL = 11
    COPY = 12
    CONCAT = 13
    ARRAY = 14
    AGGREGATE_SET = 15
    AGGREGATE_OR_EXCLUSIVE = 16
    AGGREGATE_OR_INCLUSIVE = 17
    CLAMP = 18
    SPARSE_MIXTURE_OF_EXPERTS = 19
    GELU = 20
    LAYER_NORM = 21
    LIPSCHIZT_LINEAR = 22  # sic: the engine's spelling
    TILE = 23
    SPREAD = 24
    SLICE = 25
    RESIDUAL = 26
    FILM = 27
    GRU_CELL = 28
    CONV1D = 29
    CONV2D = 30
    SOFTMAX = 31


def _check_size(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise NNEError(f"{name} must be an int", field=name, actual=type(value).__name__)
    if value < 0 or value > 0xFFFFFFFF:
        raise NNEError(f"{name} is outside the uint32 range", field=name, expected="0..2^32-1", actual=value)


def _check_array(name: str, array: object, shape: tuple[int, ...], dtype: type = np.float32) -> None:
    if not isinstance(array, np.ndarray):
        raise NNEError(f"{name} must be a numpy array", field=name, actual=type(array).__name__)
    if array.dtype != dtype:
        raise NNEError(
            f"{name} has the wrong dtype", field=name, expected=np.dtype(dtype).name, actual=array.dtype.name
        )
    if array.shape != shape:
        raise NNEError(f"{name} has the wrong shape", field=name, expected=shape, actual=array.shape)


def _check_sizes(name: str, sizes: tuple[int, ...], count: int) -> None:
    if not isinstance(sizes, tuple):
        raise NNEError(f"{name} must be a tuple", field=name, actual=type(sizes).__name__)
    if len(sizes) != count:
        raise NNEError(f"{name} has the wrong length", field=name, expected=count, actual=len(sizes))
    for i, s in enumerate(sizes):
        _check_size(f"{name}[{i}]", s)


def _check_layers(name: str, layers: tuple[Layer, ...], count: int | None = None) -> None:
    if not isinstance(layers, tuple):
        raise NNEError(f"{name} must be a tuple of layers", field=name, actual=type(layers).__name__)
    if count is not None and len(layers) != count:
        raise NNEError(
            f"{name} has the wrong number of layers", field=name, expected=count, actual=len(layers)
        )


def _check_io(name: str, layer: Layer, input_size: int | None, output_size: int | None) -> None:
    if input_size is not None and layer.input_size != input_size:
        raise NNEError(
            f"{name} reads the wrong width",
            field=f"{name}.input_size",
            expected=input_size,
            actual=layer.input_size,
        )
    if output_size is not None and layer.output_size != output_size:
        raise NNEError(
            f"{name} writes the wrong width",
            field=f"{name}.output_size",
            expected=output_size,
            actual=layer.output_size,
        )


# --------------------------------------------------------------------------------------------------
# Containers


@dataclass(frozen=True, slots=True, eq=False)
class Sequence:
    """Applies ``layers`` one after another. Fields: u LayerNum; then the layers."""

    layers: tuple[Layer, ...]
    type_id = LayerType.SEQUENCE

    def __post_init__(self) -> None:
        _check_layers("Sequence.layers", self.layers)
        if not self.layers:
            raise NNEError(
                "a Sequence needs at least one layer", field="Sequence.layers", expected=">= 1", actual=0
            )
        for i in range(1, len(self.layers)):
            _check_io(f"Sequence.layers[{i}]", self.layers[i], self.layers[i - 1].output_size, None)

    @property
    def input_size(self) -> int:
        return self.layers[0].input_size

    @property
    def output_size(self) -> int:
        return self.layers[-1].output_size


@dataclass(frozen=True, slots=True, eq=False)
class Concat:
    """Splits the input by ``input_sizes``, applies one layer per part, concatenates the outputs.

    Fields: u LayerNum; U InputSizes[n]; U OutputSizes[n]; then n layers.
    """

    input_sizes: tuple[int, ...]
    output_sizes: tuple[int, ...]
    layers: tuple[Layer, ...]
    type_id = LayerType.CONCAT

    def __post_init__(self) -> None:
        _check_layers("Concat.layers", self.layers)
        n = len(self.layers)
        _check_sizes("Concat.input_sizes", self.input_sizes, n)
        _check_sizes("Concat.output_sizes", self.output_sizes, n)
        for i, layer in enumerate(self.layers):
            _check_io(f"Concat.layers[{i}]", layer, self.input_sizes[i], self.output_sizes[i])

    @property
    def input_size(self) -> int:
        return sum(self.input_sizes)

    @property
    def output_size(self) -> int:
        return sum(self.output_sizes)


@dataclass(frozen=True, slots=True, eq=False)
class Array:
    """Applies one shared ``layer`` to each of ``element_num`` consecutive input slices.

    Fields: u ElementNum; u ElementInputSize; u ElementOutputSize; then 1 layer.
    """

    element_num: int
    element_input_size: int
    element_output_size: int
    layer: Layer
    type_id = LayerType.ARRAY

    def __post_init__(self) -> None:
        _check_size("Array.element_num", self.element_num)
        _check_size("Array.element_input_size", self.element_input_size)
        _check_size("Array.element_output_size", self.element_output_size)
        _check_io("Array.layer", self.layer, self.element_input_size, self.element_output_size)

    @property
    def input_size(self) -> int:
        return self.element_num * self.element_input_size

    @property
    def output_size(self) -> int:
        return self.element_num * self.element_output_size


# --------------------------------------------------------------------------------------------------
# Element-wise and affine layers


@dataclass(frozen=True, slots=True, eq=False)
class Normalize:
    """y = (x − mean) / std. Fields: u Size; F Mean[Size]; F Std[Size]."""

    size: int
    mean: FloatArray
    std: FloatArray
    type_id = LayerType.NORMALIZE

    def __post_init__(self) -> None:
        _check_size("Normalize.size", self.size)
        _check_array("Normalize.mean", self.mean, (self.size,))
        _check_array("Normalize.std", self.std, (self.size,))

    @property
    def input_size(self) -> int:
        return self.size

    @property
    def output_size(self) -> int:
        return self.size


@dataclass(frozen=True, slots=True, eq=False)
class Denormalize:
    """y = x · std + mean. Fields: u Size; F Mean[Size]; F Std[Size]."""

    size: int
    mean: FloatArray
    std: FloatArray
    type_id = LayerType.DENORMALIZE

    def __post_init__(self) -> None:
        _check_size("Denormalize.size", self.size)
        _check_array("Denormalize.mean", self.mean, (self.size,))
        _check_array("Denormalize.std", self.std, (self.size,))

    @property
    def input_size(self) -> int:
        return self.size

    @property
    def output_size(self) -> int:
        return self.size


@dataclass(frozen=True, slots=True, eq=False)
class Linear:
    """y = x · W + b with W[input][output] row-major. Fields: u In; u Out; F Bias[Out]; F Weights[In×Out]."""

    input_size: int
    output_size: int
    bias: FloatArray  # (output_size,)
    weights: FloatArray  # (input_size, output_size)
    type_id = LayerType.LINEAR

    def __post_init__(self) -> None:
        _check_size("Linear.input_size", self.input_size)
        _check_size("Linear.output_size", self.output_size)
        _check_array("Linear.bias", self.bias, (self.output_size,))
        _check_array("Linear.weights", self.weights, (self.input_size, self.output_size))


@dataclass(frozen=True, slots=True, eq=False)
class LipschiztLinear:
    """Same fields and operator as :class:`Linear` (type id 22, the engine's spelling)."""

    input_size: int
    output_size: int
    bias: FloatArray
    weights: FloatArray
    type_id = LayerType.LIPSCHIZT_LINEAR

    def __post_init__(self) -> None:
        _check_size("LipschiztLinear.input_size", self.input_size)
        _check_size("LipschiztLinear.output_size", self.output_size)
        _check_array("LipschiztLinear.bias", self.bias, (self.output_size,))
        _check_array("LipschiztLinear.weights", self.weights, (self.input_size, self.output_size))


@dataclass(frozen=True, slots=True, eq=False)
class CompressedLinear:
    """Linear with uint16-quantised weights: W[i, o] = offset[i] + scale[i] · q[i, o] (engine source;
    the scale already includes the 1/65535 step).

    Fields: u In; u Out; F WeightOffsets[In]; F WeightScales[In]; F Bias[Out]; uint16 Weights[In×Out].
    """

    input_size: int
    output_size: int
    weight_offsets: FloatArray  # (input_size,)
    weight_scales: FloatArray  # (input_size,)
    bias: FloatArray  # (output_size,)
    weights: U16Array  # (input_size, output_size)
    type_id = LayerType.COMPRESSED_LINEAR

    def __post_init__(self) -> None:
        _check_size("CompressedLinear.input_size", self.input_size)
        _check_size("CompressedLinear.output_size", self.output_size)
        _check_array("CompressedLinear.weight_offsets", self.weight_offsets, (self.input_size,))
        _check_array("CompressedLinear.weight_scales", self.weight_scales, (self.input_size,))
        _check_array("CompressedLinear.bias", self.bias, (self.output_size,))
        _check_array("CompressedLinear.weights", self.weights, (self.input_size, self.output_size), np.uint16)


@dataclass(frozen=True, slots=True, eq=False)
class MultiLinear:
    """``block_num`` independent linears over consecutive input blocks.

    Fields: u BlockNum; u In; u Out; F Bias[Blocks×Out]; F Weights[Blocks×In×Out].
    """

    block_num: int
    block_input_size: int
    block_output_size: int
    bias: FloatArray  # (block_num, block_output_size)
    weights: FloatArray  # (block_num, block_input_size, block_output_size)
    type_id = LayerType.MULTI_LINEAR

    def __post_init__(self) -> None:
        _check_size("MultiLinear.block_num", self.block_num)
        _check_size("MultiLinear.block_input_size", self.block_input_size)
        _check_size("MultiLinear.block_output_size", self.block_output_size)
        _check_array("MultiLinear.bias", self.bias, (self.block_num, self.block_output_size))
        _check_array(
            "MultiLinear.weights",
            self.weights,
            (self.block_num, self.block_input_size, self.block_output_size),
        )

    @property
    def input_size(self) -> int:
        return self.block_num * self.block_input_size

    @property
    def output_size(self) -> int:
        return self.block_num * self.block_output_size


@dataclass(frozen=True, slots=True, eq=False)
class _Elementwise:
    """The element-wise layers below: one field, u Size, and ``size`` values in and out. Each subclass is
    one row of the table: its name, its type id and its formula."""

    size: int

    def __post_init__(self) -> None:
        _check_size(f"{type(self).__name__}.size", self.size)

    @property
    def input_size(self) -> int:
        return self.size

    @property
    def output_size(self) -> int:
        return self.size


@dataclass(frozen=True, slots=True, eq=False)
class ReLU(_Elementwise):
    """y = max(x, 0)."""

    type_id = LayerType.RELU


@dataclass(frozen=True, slots=True, eq=False)
class ELU(_Elementwise):
    """y = x if x > 0 else exp(x) − 1 (alpha 1)."""

    type_id = LayerType.ELU


@dataclass(frozen=True, slots=True, eq=False)
class TanH(_Elementwise):
    """y = tanh(x)."""

    type_id = LayerType.TANH


@dataclass(frozen=True, slots=True, eq=False)
class GELU(_Elementwise):
    """y = x · sigmoid(1.702 x) (the engine's sigmoid approximation)."""

    type_id = LayerType.GELU


@dataclass(frozen=True, slots=True, eq=False)
class Copy(_Elementwise):
    """y = x."""

    type_id = LayerType.COPY


@dataclass(frozen=True, slots=True, eq=False)
class Softmax(_Elementwise):
    """y = softmax(x) over the whole vector (new in 5.8)."""

    type_id = LayerType.SOFTMAX


@dataclass(frozen=True, slots=True, eq=False)
class PReLU:
    """y = x if x > 0 else alpha · x. Fields: u Size; F Alpha[Size]."""

    size: int
    alpha: FloatArray
    type_id = LayerType.PRELU

    def __post_init__(self) -> None:
        _check_size("PReLU.size", self.size)
        _check_array("PReLU.alpha", self.alpha, (self.size,))

    @property
    def input_size(self) -> int:
        return self.size

    @property
    def output_size(self) -> int:
        return self.size


@dataclass(frozen=True, slots=True, eq=False)
class Clamp:
    """y = min(max(x, min), max). Fields: u Size; F Min[Size]; F Max[Size]."""

    size: int
    min: FloatArray
    max: FloatArray
    type_id = LayerType.CLAMP

    def __post_init__(self) -> None:
        _check_size("Clamp.size", self.size)
        _check_array("Clamp.min", self.min, (self.size,))
        _check_array("Clamp.max", self.max, (self.size,))

    @property
    def input_size(self) -> int:
        return self.size

    @property
    def output_size(self) -> int:
        return self.size


@dataclass(frozen=True, slots=True, eq=False)
class LayerNorm:
    """y = (x − mean(x)) / sqrt(var(x) + epsilon) · scale + offset.

    Fields: u Size; F Offset[Size]; F Scale[Size]; float Epsilon (4-byte scalar, not an array).
    """

    size: int
    offset: FloatArray
    scale: FloatArray
    epsilon: float
    type_id = LayerType.LAYER_NORM

    def __post_init__(self) -> None:
        _check_size("LayerNorm.size", self.size)
        _check_array("LayerNorm.offset", self.offset, (self.size,))
        _check_array("LayerNorm.scale", self.scale, (self.size,))
        if not isinstance(self.epsilon, float):
            raise NNEError(
                "LayerNorm.epsilon must be a float", field="LayerNorm.epsilon", actual=self.epsilon
            )

    @property
    def input_size(self) -> int:
        return self.size

    @property
    def output_size(self) -> int:
        return self.size


# --------------------------------------------------------------------------------------------------
# Shape-changing layers without weights


@dataclass(frozen=True, slots=True, eq=False)
class Tile:
    """y = x repeated ``repeats`` times. Fields: u InputSize; u Repeats."""

    input_size_: int
    repeats: int
    type_id = LayerType.TILE

    def __post_init__(self) -> None:
        _check_size("Tile.input_size", self.input_size_)
        _check_size("Tile.repeats", self.repeats)

    @property
    def input_size(self) -> int:
        return self.input_size_

    @property
    def output_size(self) -> int:
        return self.input_size_ * self.repeats


@dataclass(frozen=True, slots=True, eq=False)
class Slice:
    """y = x[offset : offset + size]. Fields: u InputSize; u SliceOffset; u SliceSize."""

    input_size_: int
    slice_offset: int
    slice_size: int
    type_id = LayerType.SLICE

    def __post_init__(self) -> None:
        _check_size("Slice.input_size", self.input_size_)
        _check_size("Slice.slice_offset", self.slice_offset)
        _check_size("Slice.slice_size", self.slice_size)
        if self.slice_offset + self.slice_size > self.input_size_:
            raise NNEError(
                "Slice reaches past its input",
                field="Slice.slice_offset",
                expected=f"offset + size <= {self.input_size_}",
                actual=self.slice_offset + self.slice_size,
            )

    @property
    def input_size(self) -> int:
        return self.input_size_

    @property
    def output_size(self) -> int:
        return self.slice_size


@dataclass(frozen=True, slots=True, eq=False)
class Spread:
    """Every sub-layer reads the whole input; outputs are concatenated.

    Fields: u LayerNum; u InputSize; U OutputSizes[n]; then n layers.
    """

    input_size_: int
    output_sizes: tuple[int, ...]
    layers: tuple[Layer, ...]
    type_id = LayerType.SPREAD

    def __post_init__(self) -> None:
        _check_layers("Spread.layers", self.layers)
        _check_size("Spread.input_size", self.input_size_)
        _check_sizes("Spread.output_sizes", self.output_sizes, len(self.layers))
        for i, layer in enumerate(self.layers):
            _check_io(f"Spread.layers[{i}]", layer, self.input_size_, self.output_sizes[i])

    @property
    def input_size(self) -> int:
        return self.input_size_

    @property
    def output_size(self) -> int:
        return sum(self.output_sizes)


@dataclass(frozen=True, slots=True, eq=False)
class Residual:
    """y = x + layer(x). Fields: u Size; then 1 layer."""

    size: int
    layer: Layer
    type_id = LayerType.RESIDUAL

    def __post_init__(self) -> None:
        _check_size("Residual.size", self.size)
        _check_io("Residual.layer", self.layer, self.size, self.size)

    @property
    def input_size(self) -> int:
        return self.size

    @property
    def output_size(self) -> int:
        return self.size


# --------------------------------------------------------------------------------------------------
# Composite layers (field orders from the builder; semantics [INF] where the spec is silent)


@dataclass(frozen=True, slots=True, eq=False)
class MemoryCell:
    """A gated memory cell [INF semantics]. Input [x (InputSize) ‖ memory (MemorySize)],
    output [y (OutputSize) ‖ new memory (MemorySize)].

    Fields: u InputSize; u OutputSize; u MemorySize; then 5 layers: remember, passthrough,
    memory-update, output-input, output-memory.
    """

    input_size_: int
    output_size_: int
    memory_size: int
    remember_layer: Layer
    passthrough_layer: Layer
    memory_update_layer: Layer
    output_input_layer: Layer
    output_memory_layer: Layer
    type_id = LayerType.MEMORY_CELL

    def __post_init__(self) -> None:
        _check_size("MemoryCell.input_size", self.input_size_)
        _check_size("MemoryCell.output_size", self.output_size_)
        _check_size("MemoryCell.memory_size", self.memory_size)

    @property
    def input_size(self) -> int:
        return self.input_size_ + self.memory_size

    @property
    def output_size(self) -> int:
        return self.output_size_ + self.memory_size


@dataclass(frozen=True, slots=True, eq=False)
class GRUCell:
    """A GRU cell. Input [x (InputSize) ‖ h (OutputSize)]; output [h' ‖ h'] (2·OutputSize: the engine
    writes the new state twice, once as output and once as the next memory).

    Fields: u InputSize; u OutputSize; then remember, update, activation layers.
    """

    input_size_: int
    output_size_: int
    remember_layer: Layer
    update_layer: Layer
    activation_layer: Layer
    type_id = LayerType.GRU_CELL

    def __post_init__(self) -> None:
        _check_size("GRUCell.input_size", self.input_size_)
        _check_size("GRUCell.output_size", self.output_size_)

    @property
    def input_size(self) -> int:
        return self.input_size_ + self.output_size_

    @property
    def output_size(self) -> int:
        return 2 * self.output_size_


@dataclass(frozen=True, slots=True, eq=False)
class AggregateSet:
    """Attention pooling over a masked set. Input: MaxElementNum element vectors followed by a
    MaxElementNum presence mask; output: AttentionHeadNum·OutputEncodingSize pooled values plus one
    element count (widths as the engine's GetInputSize/GetOutputSize compute them).

    Fields: u MaxElementNum; u ElementInputSize; u ElementOutputSize; u OutputEncodingSize;
    u AttentionEncodingSize; u AttentionHeadNum; then element, query, key, value layers.
    """

    max_element_num: int
    element_input_size: int
    element_output_size: int
    output_encoding_size: int
    attention_encoding_size: int
    attention_head_num: int
    element_layer: Layer
    query_layer: Layer
    key_layer: Layer
    value_layer: Layer
    type_id = LayerType.AGGREGATE_SET

    def __post_init__(self) -> None:
        for name in (
            "max_element_num",
            "element_input_size",
            "element_output_size",
            "output_encoding_size",
            "attention_encoding_size",
            "attention_head_num",
        ):
            _check_size(f"AggregateSet.{name}", getattr(self, name))

    @property
    def input_size(self) -> int:
        return self.max_element_num * self.element_input_size + self.max_element_num

    @property
    def output_size(self) -> int:
        return self.attention_head_num * self.output_encoding_size + 1


@dataclass(frozen=True, slots=True, eq=False)
class AggregateOrExclusive:
    """Exclusive-or encoder. Input: one sub-vector slot as wide as the widest branch, followed by a
    LayerNum one-hot; output: OutputEncodingSize followed by the one-hot (engine widths).

    Fields: u LayerNum; u OutputEncodingSize; U InputSizes[n]; U OutputSizes[n]; n sub-layers;
    n encoder layers.
    """

    output_encoding_size: int
    input_sizes: tuple[int, ...]
    output_sizes: tuple[int, ...]
    sub_layers: tuple[Layer, ...]
    encoder_layers: tuple[Layer, ...]
    type_id = LayerType.AGGREGATE_OR_EXCLUSIVE

    def __post_init__(self) -> None:
        _check_layers("AggregateOrExclusive.sub_layers", self.sub_layers)
        n = len(self.sub_layers)
        _check_layers("AggregateOrExclusive.encoder_layers", self.encoder_layers, n)
        _check_size("AggregateOrExclusive.output_encoding_size", self.output_encoding_size)
        _check_sizes("AggregateOrExclusive.input_sizes", self.input_sizes, n)
        _check_sizes("AggregateOrExclusive.output_sizes", self.output_sizes, n)

    @property
    def input_size(self) -> int:
        return max(self.input_sizes, default=0) + len(self.sub_layers)

    @property
    def output_size(self) -> int:
        return self.output_encoding_size + len(self.sub_layers)


@dataclass(frozen=True, slots=True, eq=False)
class AggregateOrInclusive:
    """Inclusive-or attention encoder. Input: all sub-vectors followed by a LayerNum presence mask;
    output: AttentionHeadNum·OutputEncodingSize followed by the mask (engine widths).

    Fields: u LayerNum; u OutputEncodingSize; u AttentionEncodingSize; u AttentionHeadNum;
    U InputSizes[n]; U OutputSizes[n]; n sub-layers; n query; n key; n value layers.
    """

    output_encoding_size: int
    attention_encoding_size: int
    attention_head_num: int
    input_sizes: tuple[int, ...]
    output_sizes: tuple[int, ...]
    sub_layers: tuple[Layer, ...]
    query_layers: tuple[Layer, ...]
    key_layers: tuple[Layer, ...]
    value_layers: tuple[Layer, ...]
    type_id = LayerType.AGGREGATE_OR_INCLUSIVE

    def __post_init__(self) -> None:
        _check_layers("AggregateOrInclusive.sub_layers", self.sub_layers)
        n = len(self.sub_layers)
        _check_layers("AggregateOrInclusive.query_layers", self.query_layers, n)
        _check_layers("AggregateOrInclusive.key_layers", self.key_layers, n)
        _check_layers("AggregateOrInclusive.value_layers", self.value_layers, n)
        _check_size("AggregateOrInclusive.output_encoding_size", self.output_encoding_size)
        _check_size("AggregateOrInclusive.attention_encoding_size", self.attention_encoding_size)
        _check_size("AggregateOrInclusive.attention_head_num", self.attention_head_num)
        _check_sizes("AggregateOrInclusive.input_sizes", self.input_sizes, n)
        _check_sizes("AggregateOrInclusive.output_sizes", self.output_sizes, n)

    @property
    def input_size(self) -> int:
        return sum(self.input_sizes) + len(self.sub_layers)

    @property
    def output_size(self) -> int:
        return self.attention_head_num * self.output_encoding_size + len(self.sub_layers)


@dataclass(frozen=True, slots=True, eq=False)
class SparseMixtureOfExperts:
    """Top-1 gated mixture of experts [INF semantics].

    Fields: u InputSize; u OutputSize; gating layer; u ExpertNum; then ExpertNum expert layers.
    """

    input_size_: int
    output_size_: int
    gating_layer: Layer
    expert_layers: tuple[Layer, ...]
    type_id = LayerType.SPARSE_MIXTURE_OF_EXPERTS

    def __post_init__(self) -> None:
        _check_size("SparseMixtureOfExperts.input_size", self.input_size_)
        _check_size("SparseMixtureOfExperts.output_size", self.output_size_)
        _check_layers("SparseMixtureOfExperts.expert_layers", self.expert_layers)

    @property
    def input_size(self) -> int:
        return self.input_size_

    @property
    def output_size(self) -> int:
        return self.output_size_


@dataclass(frozen=True, slots=True, eq=False)
class FiLM:
    """Feature-wise linear modulation [INF semantics]: input [prefix input ‖ condition input].

    Fields: u PrefixInputSize; u PrefixOutputSize; u ConditionInputSize; u ConditionOutputSize;
    u PostfixInputSize; u PostfixOutputSize; then prefix, condition, postfix layers.
    """

    prefix_input_size: int
    prefix_output_size: int
    condition_input_size: int
    condition_output_size: int
    postfix_input_size: int
    postfix_output_size: int
    prefix_layer: Layer
    condition_layer: Layer
    postfix_layer: Layer
    type_id = LayerType.FILM

    def __post_init__(self) -> None:
        for name in (
            "prefix_input_size",
            "prefix_output_size",
            "condition_input_size",
            "condition_output_size",
            "postfix_input_size",
            "postfix_output_size",
        ):
            _check_size(f"FiLM.{name}", getattr(self, name))

    @property
    def input_size(self) -> int:
        return self.prefix_input_size + self.condition_input_size

    @property
    def output_size(self) -> int:
        return self.postfix_output_size


@dataclass(frozen=True, slots=True, eq=False)
class Conv1d:
    """``layer`` first, then a 1-D convolution of its output read channel-major [InChannels][InputLength]
    (engine source); output channel-major [OutChannels][OutputLength].

    Fields: u InputLength; u InChannels; u OutChannels; u KernelSize; u Padding; u PaddingMode;
    F Weights[Out·In·K]; F Bias[Out]; then 1 layer.
    """

    input_length: int
    in_channels: int
    out_channels: int
    kernel_size: int
    padding: int
    padding_mode: int
    weights: FloatArray  # (out_channels, in_channels, kernel_size)
    bias: FloatArray  # (out_channels,)
    layer: Layer
    type_id = LayerType.CONV1D

    def __post_init__(self) -> None:
        for name in ("input_length", "in_channels", "out_channels", "kernel_size", "padding", "padding_mode"):
            _check_size(f"Conv1d.{name}", getattr(self, name))
        _check_array("Conv1d.weights", self.weights, (self.out_channels, self.in_channels, self.kernel_size))
        _check_array("Conv1d.bias", self.bias, (self.out_channels,))

    @property
    def output_length(self) -> int:
        return max(self.input_length + 2 * self.padding - self.kernel_size + 1, 0)

    @property
    def input_size(self) -> int:
        return self.layer.input_size

    @property
    def output_size(self) -> int:
        return self.out_channels * self.output_length


@dataclass(frozen=True, slots=True, eq=False)
class Conv2d:
    """``layer`` first, then a 2-D convolution of its output read channel-major [InChannels][H][W]
    (engine source); output channel-major [OutChannels][OutputHeight][OutputWidth].

    Fields: u InputHeight; u InputWidth; u InChannels; u OutChannels; u KernelSize; u Stride; u Padding;
    u PaddingMode; F Weights[Out·In·K·K]; F Bias[Out]; then 1 layer.
    """

    input_height: int
    input_width: int
    in_channels: int
    out_channels: int
    kernel_size: int
    stride: int
    padding: int
    padding_mode: int
    weights: FloatArray  # (out_channels, in_channels, kernel_size, kernel_size)
    bias: FloatArray  # (out_channels,)
    layer: Layer
    type_id = LayerType.CONV2D

    def __post_init__(self) -> None:
        for name in (
            "input_height",
            "input_width",
            "in_channels",
            "out_channels",
            "kernel_size",
            "stride",
            "padding",
            "padding_mode",
        ):
            _check_size(f"Conv2d.{name}", getattr(self, name))
        _check_array(
            "Conv2d.weights",
            self.weights,
            (self.out_channels, self.in_channels, self.kernel_size, self.kernel_size),
        )
        _check_array("Conv2d.bias", self.bias, (self.out_channels,))

    @property
    def output_height(self) -> int:
        s = max(self.stride, 1)
        return max((self.input_height + 2 * self.padding - self.kernel_size) // s + 1, 0)

    @property
    def output_width(self) -> int:
        s = max(self.stride, 1)
        return max((self.input_width + 2 * self.padding - self.kernel_size) // s + 1, 0)

    @property
    def input_size(self) -> int:
        return self.layer.input_size

    @property
    def output_size(self) -> int:
        return self.out_channels * self.output_height * self.output_width


Layer: TypeAlias = (
    Sequence
    | Normalize
    | Denormalize
    | Linear
    | CompressedLinear
    | MultiLinear
    | ReLU
    | ELU
    | TanH
    | PReLU
    | MemoryCell
    | Copy
    | Concat
    | Array
    | AggregateSet
    | AggregateOrExclusive
    | AggregateOrInclusive
    | Clamp
    | SparseMixtureOfExperts
    | GELU
    | LayerNorm
    | LipschiztLinear
    | Tile
    | Spread
    | Slice
    | Residual
    | FiLM
    | GRUCell
    | Conv1d
    | Conv2d
    | Softmax
)
