"""Torch twins of the basic NNE layers: containers, affine maps and element-wise functions (spec §6.2, §10).

Part of :mod:`trainer.training.nne_torch`, whose docstring gives the conventions (``forward`` (B, input_size) →
(B, output_size), parameters in torch layout, the round trip). Numerics follow
:mod:`protocol.nne.reference`, the numpy oracle. :data:`BASIC_MODULES` is this module's part of the
layer-type table that the package face assembles.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from protocol.nne.layers import (
    Array,
    Clamp,
    CompressedLinear,
    Concat,
    Denormalize,
    Layer,
    LayerNorm,
    LayerType,
    Linear,
    LipschiztLinear,
    MultiLinear,
    Normalize,
    PReLU,
    Residual,
    Sequence,
    Slice,
    Spread,
    Tile,
)
from protocol.nne.reference import GELU_SIGMOID_SCALE, dequantize_weights
from trainer.training.nne_torch.base import (
    ModuleBuilder,
    ModuleFactory,
    NNEModule,
    from_torch,
    nne_modules,
    rebuild_layers,
    to_array,
    to_tensor,
    vector_state,
)

__all__ = [
    "BASIC_MODULES",
    "ArrayModule",
    "ClampModule",
    "CompressedLinearModule",
    "ConcatModule",
    "CopyModule",
    "DenormalizeModule",
    "ELUModule",
    "GELUModule",
    "LayerNormModule",
    "LinearModule",
    "LipschiztLinearModule",
    "MultiLinearModule",
    "NormalizeModule",
    "PReLUModule",
    "ReLUModule",
    "ResidualModule",
    "SequenceModule",
    "SliceModule",
    "SoftmaxModule",
    "SpreadModule",
    "TanHModule",
    "TileModule",
    "iter_linear_layers",
    "quantize_weights",
]

#: Largest uint16 code of a CompressedLinear weight.
_Q_MAX = 65535


# --------------------------------------------------------------------------------------------------
# Containers


class SequenceModule(NNEModule):
    def __init__(self, layer: Sequence, build: ModuleBuilder) -> None:
        super().__init__(layer)
        self.layers = nn.ModuleList(build(sub) for sub in layer.layers)

    def forward(self, x: Tensor) -> Tensor:
        for module in self.layers:
            x = module(x)
        return x

    def nne_children(self) -> tuple[NNEModule, ...]:
        return nne_modules(self.layers)

    def to_layer(self, template: Sequence) -> Layer:
        return replace(template, layers=rebuild_layers(self.nne_children(), template.layers))


class ConcatModule(NNEModule):
    def __init__(self, layer: Concat, build: ModuleBuilder) -> None:
        super().__init__(layer)
        self.splits = list(layer.input_sizes)
        self.layers = nn.ModuleList(build(sub) for sub in layer.layers)

    def forward(self, x: Tensor) -> Tensor:
        if not self.splits:
            return x.new_zeros((x.shape[0], 0))
        parts = torch.split(x, self.splits, dim=1)
        return torch.cat([module(part) for module, part in zip(self.layers, parts, strict=True)], dim=1)

    def nne_children(self) -> tuple[NNEModule, ...]:
        return nne_modules(self.layers)

    def to_layer(self, template: Concat) -> Layer:
        return replace(template, layers=rebuild_layers(self.nne_children(), template.layers))


class ArrayModule(NNEModule):
    def __init__(self, layer: Array, build: ModuleBuilder) -> None:
        super().__init__(layer)
        self.element_num = layer.element_num
        self.element_input_size = layer.element_input_size
        self.element_output_size = layer.element_output_size
        self.layer = build(layer.layer)

    def forward(self, x: Tensor) -> Tensor:
        b = x.shape[0]
        y: Tensor = self.layer(x.reshape(b * self.element_num, self.element_input_size))
        return y.reshape(b, self.element_num * self.element_output_size)

    def nne_children(self) -> tuple[NNEModule, ...]:
        return (self.layer,)

    def to_layer(self, template: Array) -> Layer:
        return replace(template, layer=from_torch(self.layer, template.layer))


class SpreadModule(NNEModule):
    def __init__(self, layer: Spread, build: ModuleBuilder) -> None:
        super().__init__(layer)
        self.layers = nn.ModuleList(build(sub) for sub in layer.layers)

    def forward(self, x: Tensor) -> Tensor:
        if len(self.layers) == 0:
            return x.new_zeros((x.shape[0], 0))
        return torch.cat([module(x) for module in self.layers], dim=1)

    def nne_children(self) -> tuple[NNEModule, ...]:
        return nne_modules(self.layers)

    def to_layer(self, template: Spread) -> Layer:
        return replace(template, layers=rebuild_layers(self.nne_children(), template.layers))


class ResidualModule(NNEModule):
    def __init__(self, layer: Residual, build: ModuleBuilder) -> None:
        super().__init__(layer)
        self.layer = build(layer.layer)

    def forward(self, x: Tensor) -> Tensor:
        y: Tensor = self.layer(x)
        return x + y

    def nne_children(self) -> tuple[NNEModule, ...]:
        return (self.layer,)

    def to_layer(self, template: Residual) -> Layer:
        return replace(template, layer=from_torch(self.layer, template.layer))


# --------------------------------------------------------------------------------------------------
# Affine layers


class NormalizeModule(NNEModule):
    mean: Tensor
    std: Tensor

    def __init__(self, layer: Normalize, build: ModuleBuilder) -> None:
        super().__init__(layer)
        vector_state(self, "mean", layer.mean, build.trainable_normalization)
        vector_state(self, "std", layer.std, build.trainable_normalization)

    def forward(self, x: Tensor) -> Tensor:
        return (x - self.mean) / self.std

    def to_layer(self, template: Normalize) -> Layer:
        return replace(template, mean=to_array(self.mean), std=to_array(self.std))


class DenormalizeModule(NNEModule):
    mean: Tensor
    std: Tensor

    def __init__(self, layer: Denormalize, build: ModuleBuilder) -> None:
        super().__init__(layer)
        vector_state(self, "mean", layer.mean, build.trainable_normalization)
        vector_state(self, "std", layer.std, build.trainable_normalization)

    def forward(self, x: Tensor) -> Tensor:
        return torch.addcmul(self.mean, x, self.std)  # mean + x · std in one kernel

    def to_layer(self, template: Denormalize) -> Layer:
        return replace(template, mean=to_array(self.mean), std=to_array(self.std))


class _AffineModule(NNEModule):
    """y = x · Wᵀ + b with ``weight`` (Out, In) in torch layout."""

    def __init__(self, layer: Layer, weights: npt.NDArray[np.float32], bias: npt.NDArray[np.float32]) -> None:
        super().__init__(layer)
        self.weight = nn.Parameter(to_tensor(weights.T))
        self.bias = nn.Parameter(to_tensor(bias))

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)

    def weights_in_engine_layout(self) -> npt.NDArray[np.float32]:
        """The current weights as the engine stores them: (In, Out) float32."""
        return np.ascontiguousarray(to_array(self.weight).T)


class LinearModule(_AffineModule):
    """A Linear layer. ``weight`` is Wᵀ, shape (Out, In); the layer value's ``weights`` is W, (In, Out)."""

    def __init__(self, layer: Linear, build: ModuleBuilder) -> None:
        super().__init__(layer, layer.weights, layer.bias)

    def to_layer(self, template: Linear) -> Layer:
        return replace(template, weights=self.weights_in_engine_layout(), bias=to_array(self.bias))


class LipschiztLinearModule(_AffineModule):
    """Same operator as Linear; the stored weights are used as they are (no Lipschitz re-normalisation)."""

    def __init__(self, layer: LipschiztLinear, build: ModuleBuilder) -> None:
        super().__init__(layer, layer.weights, layer.bias)

    def to_layer(self, template: LipschiztLinear) -> Layer:
        return replace(template, weights=self.weights_in_engine_layout(), bias=to_array(self.bias))


def quantize_weights(
    weights: npt.NDArray[np.float32],
) -> tuple[npt.NDArray[np.uint16], npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """Quantise (In, Out) float weights per input row: returns (q uint16, offsets, scales).

    offset = row minimum, scale = (row maximum − row minimum) / 65535 (float32), q = round((W − offset) /
    scale) in 0..65535, and q = 0 for a constant row (scale 0). The engine's dequantisation is
    scale · q + offset, so the error per weight is at most scale / 2 plus float32 rounding.
    """
    w = np.asarray(weights, dtype=np.float32)
    n_in, n_out = w.shape
    if n_out == 0:
        zeros = np.zeros(n_in, dtype=np.float32)
        return np.zeros((n_in, 0), dtype=np.uint16), zeros, zeros.copy()
    offsets = w.min(axis=1)
    scales = ((w.max(axis=1).astype(np.float64) - offsets) / _Q_MAX).astype(np.float32)
    safe = np.where(scales > 0, scales, np.float32(1)).astype(np.float64)
    codes = np.rint((w.astype(np.float64) - offsets[:, None]) / safe[:, None])
    codes = np.where(scales[:, None] > 0, np.clip(codes, 0, _Q_MAX), 0)
    return codes.astype(np.uint16), offsets.astype(np.float32), scales


class CompressedLinearModule(_AffineModule):
    """Trains the dequantised float weights; :meth:`to_layer` re-quantises them (same byte layout)."""

    def __init__(self, layer: CompressedLinear, build: ModuleBuilder) -> None:
        super().__init__(layer, dequantize_weights(layer), layer.bias)

    def to_layer(self, template: CompressedLinear) -> Layer:
        weights = self.weights_in_engine_layout()
        bias = to_array(self.bias)
        if np.array_equal(weights, dequantize_weights(template)):
            # Untouched: keep the received bytes (their offsets/scales need not follow our scheme).
            return replace(template, bias=bias)
        codes, offsets, scales = quantize_weights(weights)
        return replace(template, weights=codes, weight_offsets=offsets, weight_scales=scales, bias=bias)


class MultiLinearModule(NNEModule):
    def __init__(self, layer: MultiLinear, build: ModuleBuilder) -> None:
        super().__init__(layer)
        self.block_num = layer.block_num
        self.block_input_size = layer.block_input_size
        self.block_output_size = layer.block_output_size
        self.weight = nn.Parameter(to_tensor(layer.weights))  # (Blocks, In, Out), engine layout
        self.bias = nn.Parameter(to_tensor(layer.bias))  # (Blocks, Out)

    def forward(self, x: Tensor) -> Tensor:
        b = x.shape[0]
        xb = x.reshape(b, self.block_num, self.block_input_size)
        y = torch.einsum("bni,nio->bno", xb, self.weight) + self.bias
        return y.reshape(b, self.block_num * self.block_output_size)

    def to_layer(self, template: MultiLinear) -> Layer:
        return replace(template, weights=to_array(self.weight), bias=to_array(self.bias))


# --------------------------------------------------------------------------------------------------
# Element-wise layers


class _StatelessModule(NNEModule):
    def __init__(self, layer: Layer, build: ModuleBuilder) -> None:
        super().__init__(layer)

    def to_layer(self, template: Any) -> Layer:
        layer: Layer = template  # no values to write back
        return layer


class ReLUModule(_StatelessModule):
    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(x)


class ELUModule(_StatelessModule):
    def forward(self, x: Tensor) -> Tensor:
        return F.elu(x)


class TanHModule(_StatelessModule):
    def forward(self, x: Tensor) -> Tensor:
        return torch.tanh(x)


class GELUModule(_StatelessModule):
    def forward(self, x: Tensor) -> Tensor:
        return x * torch.sigmoid(GELU_SIGMOID_SCALE * x)


class CopyModule(_StatelessModule):
    def forward(self, x: Tensor) -> Tensor:
        return x


class SoftmaxModule(_StatelessModule):
    def forward(self, x: Tensor) -> Tensor:
        return torch.softmax(x, dim=1) if x.shape[1] else x


class TileModule(_StatelessModule):
    def __init__(self, layer: Tile, build: ModuleBuilder) -> None:
        super().__init__(layer, build)
        self.repeats = layer.repeats

    def forward(self, x: Tensor) -> Tensor:
        return x.repeat(1, self.repeats)


class SliceModule(_StatelessModule):
    def __init__(self, layer: Slice, build: ModuleBuilder) -> None:
        super().__init__(layer, build)
        self.start = layer.slice_offset
        self.stop = layer.slice_offset + layer.slice_size

    def forward(self, x: Tensor) -> Tensor:
        return x[:, self.start : self.stop]


class PReLUModule(NNEModule):
    def __init__(self, layer: PReLU, build: ModuleBuilder) -> None:
        super().__init__(layer)
        self.alpha = nn.Parameter(to_tensor(layer.alpha))

    def forward(self, x: Tensor) -> Tensor:
        return torch.where(x > 0, x, self.alpha * x)

    def to_layer(self, template: PReLU) -> Layer:
        return replace(template, alpha=to_array(self.alpha))


class ClampModule(NNEModule):
    min: Tensor
    max: Tensor

    def __init__(self, layer: Clamp, build: ModuleBuilder) -> None:
        super().__init__(layer)
        self.register_buffer("min", to_tensor(layer.min))
        self.register_buffer("max", to_tensor(layer.max))

    def forward(self, x: Tensor) -> Tensor:
        # FMath::Clamp order (min wins when min > max), unlike torch.clamp.
        return torch.where(x < self.min, self.min, torch.where(x < self.max, x, self.max))

    def to_layer(self, template: Clamp) -> Layer:
        return replace(template, min=to_array(self.min), max=to_array(self.max))


class LayerNormModule(NNEModule):
    def __init__(self, layer: LayerNorm, build: ModuleBuilder) -> None:
        super().__init__(layer)
        self.size = layer.size
        self.epsilon = float(layer.epsilon)
        self.offset = nn.Parameter(to_tensor(layer.offset))
        self.scale = nn.Parameter(to_tensor(layer.scale))

    def forward(self, x: Tensor) -> Tensor:
        if self.size == 0:
            return x
        # F.layer_norm uses the biased variance, as the engine does.
        return F.layer_norm(x, (self.size,), self.scale, self.offset, self.epsilon)

    def to_layer(self, template: LayerNorm) -> Layer:
        return replace(template, offset=to_array(self.offset), scale=to_array(self.scale))


# --------------------------------------------------------------------------------------------------
# The basic part of the layer-type table


BASIC_MODULES: Mapping[LayerType, ModuleFactory] = {
    LayerType.SEQUENCE: SequenceModule,
    LayerType.NORMALIZE: NormalizeModule,
    LayerType.DENORMALIZE: DenormalizeModule,
    LayerType.LINEAR: LinearModule,
    LayerType.COMPRESSED_LINEAR: CompressedLinearModule,
    LayerType.MULTI_LINEAR: MultiLinearModule,
    LayerType.RELU: ReLUModule,
    LayerType.ELU: ELUModule,
    LayerType.TANH: TanHModule,
    LayerType.PRELU: PReLUModule,
    LayerType.COPY: CopyModule,
    LayerType.CONCAT: ConcatModule,
    LayerType.ARRAY: ArrayModule,
    LayerType.CLAMP: ClampModule,
    LayerType.GELU: GELUModule,
    LayerType.LAYER_NORM: LayerNormModule,
    LayerType.LIPSCHIZT_LINEAR: LipschiztLinearModule,
    LayerType.TILE: TileModule,
    LayerType.SPREAD: SpreadModule,
    LayerType.SLICE: SliceModule,
    LayerType.RESIDUAL: ResidualModule,
    LayerType.SOFTMAX: SoftmaxModule,
}
"""Module class per basic layer type."""


def iter_linear_layers(module: nn.Module) -> Iterator[LinearModule]:
    """The modules of Linear layers (type 4 only) in serialisation order (depth first, children in order).

    Their ``weight`` is Wᵀ (Out, In); ``weights_in_engine_layout()`` gives W (In, Out).
    """
    if isinstance(module, LinearModule):
        yield module
    if isinstance(module, NNEModule):
        for child in module.nne_children():
            yield from iter_linear_layers(child)
