"""NNE layer trees as differentiable torch modules, and back (spec §6.2, §6.3, §10).

``to_torch(layer)`` builds a module tree that mirrors the layer tree one to one; ``from_torch(module,
template)`` builds a new layer tree with the template's structure and the module's current values. The
numerics are those of :mod:`protocol.nne.reference` (the numpy oracle, which documents every operator and
the [INF] choices); the tests check the two against each other for every layer type.

Every module is an :class:`NNEModule` with ``layer_type``, ``input_size`` and ``output_size`` (the layer's
widths, which are the engine's) and ``nne_children()`` (sub-modules in serialisation order).
``forward`` takes ``(B, input_size)`` and returns ``(B, output_size)``; it is dtype-agnostic (float32 for
training, float64 works for checks) and device-agnostic.

Parameters and buffers:

- Linear / LipschiztLinear / CompressedLinear: ``weight`` (Out, In), i.e. **Wᵀ in torch layout**, and
  ``bias`` (Out,), both Parameters, evaluated with ``F.linear``. CompressedLinear is trained in float (the
  weights dequantised) and re-quantised by ``from_torch``.
- MultiLinear: ``weight`` (Blocks, In, Out) and ``bias`` (Blocks, Out), engine layout.
- PReLU ``alpha``; LayerNorm ``scale`` and ``offset``; Conv ``weight`` (Out, In, K[, K]) and ``bias``:
  Parameters. Conv weights keep the layer value's shape, which is also torch's conv layout.
- Normalize / Denormalize ``mean`` and ``std``: buffers, or Parameters with ``trainable_normalization``.
- Clamp ``min`` / ``max``: buffers.

Round trip: ``from_torch(to_torch(l), l)`` is bitwise equal to ``l``. For an untouched CompressedLinear the
original quantised bytes are kept (re-quantising would not reproduce them).

This module holds the entry points, the base class and the modules of the containers, affine and
element-wise layers; the composite layers (recurrent cells, aggregates, mixtures, FiLM, convolutions) are in
:mod:`trainer.nne_torch_composite`, imported at the end of this module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from protocol.errors import NNEError
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

__all__ = [
    "CompressedLinearModule",
    "LinearModule",
    "NNEModule",
    "from_torch",
    "iter_linear_layers",
    "quantize_weights",
    "to_torch",
]

#: Largest uint16 code of a CompressedLinear weight.
_Q_MAX = 65535


def _tensor(array: npt.NDArray[Any]) -> Tensor:
    # torch.tensor copies: training must never write into the (frozen) layer value's arrays.
    return torch.tensor(np.ascontiguousarray(array))


def _array(t: Tensor) -> npt.NDArray[np.float32]:
    # Copy out of the tensor: the returned layer must not change when training continues.
    return np.array(t.detach().to(device="cpu", dtype=torch.float32).numpy(), dtype=np.float32, copy=True)


def _vector_state(module: nn.Module, name: str, values: npt.NDArray[np.float32], trainable: bool) -> None:
    if trainable:
        module.register_parameter(name, nn.Parameter(_tensor(values)))
    else:
        module.register_buffer(name, _tensor(values))


class NNEModule(nn.Module):
    """Base of every module built by :func:`to_torch`: knows its layer type and engine widths."""

    layer_type: LayerType
    input_size: int
    output_size: int

    def __init__(self, layer: Layer) -> None:
        super().__init__()
        self.layer_type = LayerType(layer.type_id)
        self.input_size, self.output_size = layer.input_size, layer.output_size

    def nne_children(self) -> tuple[NNEModule, ...]:
        """Sub-modules in the order :func:`protocol.nne.layers.children` lists the sub-layers."""
        return ()

    def to_layer(self, template: Any) -> Layer:
        """A new layer like ``template`` holding this module's current values (see :func:`from_torch`)."""
        raise NotImplementedError

    def extra_repr(self) -> str:
        return f"in={self.input_size}, out={self.output_size}"


def _children(modules: nn.ModuleList) -> tuple[NNEModule, ...]:
    return tuple(m for m in modules if isinstance(m, NNEModule))


def _rebuild(modules: tuple[NNEModule, ...], templates: tuple[Layer, ...]) -> tuple[Layer, ...]:
    return tuple(from_torch(m, t) for m, t in zip(modules, templates, strict=True))


# --------------------------------------------------------------------------------------------------
# Containers


class SequenceModule(NNEModule):
    def __init__(self, layer: Sequence, trainable: bool) -> None:
        super().__init__(layer)
        self.layers = nn.ModuleList(_build(sub, trainable) for sub in layer.layers)

    def forward(self, x: Tensor) -> Tensor:
        for module in self.layers:
            x = module(x)
        return x

    def nne_children(self) -> tuple[NNEModule, ...]:
        return _children(self.layers)

    def to_layer(self, template: Sequence) -> Layer:
        return replace(template, layers=_rebuild(self.nne_children(), template.layers))


class ConcatModule(NNEModule):
    def __init__(self, layer: Concat, trainable: bool) -> None:
        super().__init__(layer)
        self.splits = list(layer.input_sizes)
        self.layers = nn.ModuleList(_build(sub, trainable) for sub in layer.layers)

    def forward(self, x: Tensor) -> Tensor:
        if not self.splits:
            return x.new_zeros((x.shape[0], 0))
        parts = torch.split(x, self.splits, dim=1)
        return torch.cat([module(part) for module, part in zip(self.layers, parts, strict=True)], dim=1)

    def nne_children(self) -> tuple[NNEModule, ...]:
        return _children(self.layers)

    def to_layer(self, template: Concat) -> Layer:
        return replace(template, layers=_rebuild(self.nne_children(), template.layers))


class ArrayModule(NNEModule):
    def __init__(self, layer: Array, trainable: bool) -> None:
        super().__init__(layer)
        self.element_num = layer.element_num
        self.element_input_size = layer.element_input_size
        self.element_output_size = layer.element_output_size
        self.layer = _build(layer.layer, trainable)

    def forward(self, x: Tensor) -> Tensor:
        b = x.shape[0]
        y: Tensor = self.layer(x.reshape(b * self.element_num, self.element_input_size))
        return y.reshape(b, self.element_num * self.element_output_size)

    def nne_children(self) -> tuple[NNEModule, ...]:
        return (self.layer,)

    def to_layer(self, template: Array) -> Layer:
        return replace(template, layer=from_torch(self.layer, template.layer))


class SpreadModule(NNEModule):
    def __init__(self, layer: Spread, trainable: bool) -> None:
        super().__init__(layer)
        self.layers = nn.ModuleList(_build(sub, trainable) for sub in layer.layers)

    def forward(self, x: Tensor) -> Tensor:
        if len(self.layers) == 0:
            return x.new_zeros((x.shape[0], 0))
        return torch.cat([module(x) for module in self.layers], dim=1)

    def nne_children(self) -> tuple[NNEModule, ...]:
        return _children(self.layers)

    def to_layer(self, template: Spread) -> Layer:
        return replace(template, layers=_rebuild(self.nne_children(), template.layers))


class ResidualModule(NNEModule):
    def __init__(self, layer: Residual, trainable: bool) -> None:
        super().__init__(layer)
        self.layer = _build(layer.layer, trainable)

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

    def __init__(self, layer: Normalize, trainable: bool) -> None:
        super().__init__(layer)
        _vector_state(self, "mean", layer.mean, trainable)
        _vector_state(self, "std", layer.std, trainable)

    def forward(self, x: Tensor) -> Tensor:
        return (x - self.mean) / self.std

    def to_layer(self, template: Normalize) -> Layer:
        return replace(template, mean=_array(self.mean), std=_array(self.std))


class DenormalizeModule(NNEModule):
    mean: Tensor
    std: Tensor

    def __init__(self, layer: Denormalize, trainable: bool) -> None:
        super().__init__(layer)
        _vector_state(self, "mean", layer.mean, trainable)
        _vector_state(self, "std", layer.std, trainable)

    def forward(self, x: Tensor) -> Tensor:
        return torch.addcmul(self.mean, x, self.std)  # mean + x · std in one kernel

    def to_layer(self, template: Denormalize) -> Layer:
        return replace(template, mean=_array(self.mean), std=_array(self.std))


class _AffineModule(NNEModule):
    """y = x · Wᵀ + b with ``weight`` (Out, In) in torch layout."""

    def __init__(self, layer: Layer, weights: npt.NDArray[np.float32], bias: npt.NDArray[np.float32]) -> None:
        super().__init__(layer)
        self.weight = nn.Parameter(_tensor(weights.T))
        self.bias = nn.Parameter(_tensor(bias))

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)

    def weights_in_engine_layout(self) -> npt.NDArray[np.float32]:
        """The current weights as the engine stores them: (In, Out) float32."""
        return np.ascontiguousarray(_array(self.weight).T)


class LinearModule(_AffineModule):
    """A Linear layer. ``weight`` is Wᵀ, shape (Out, In); the layer value's ``weights`` is W, (In, Out)."""

    def __init__(self, layer: Linear, trainable: bool) -> None:
        super().__init__(layer, layer.weights, layer.bias)

    def to_layer(self, template: Linear) -> Layer:
        return replace(template, weights=self.weights_in_engine_layout(), bias=_array(self.bias))


class LipschiztLinearModule(_AffineModule):
    """Same operator as Linear; the stored weights are used as they are (no Lipschitz re-normalisation)."""

    def __init__(self, layer: LipschiztLinear, trainable: bool) -> None:
        super().__init__(layer, layer.weights, layer.bias)

    def to_layer(self, template: LipschiztLinear) -> Layer:
        return replace(template, weights=self.weights_in_engine_layout(), bias=_array(self.bias))


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

    def __init__(self, layer: CompressedLinear, trainable: bool) -> None:
        super().__init__(layer, dequantize_weights(layer), layer.bias)

    def to_layer(self, template: CompressedLinear) -> Layer:
        weights = self.weights_in_engine_layout()
        bias = _array(self.bias)
        if np.array_equal(weights, dequantize_weights(template)):
            # Untouched: keep the received bytes (their offsets/scales need not follow our scheme).
            return replace(template, bias=bias)
        codes, offsets, scales = quantize_weights(weights)
        return replace(template, weights=codes, weight_offsets=offsets, weight_scales=scales, bias=bias)


class MultiLinearModule(NNEModule):
    def __init__(self, layer: MultiLinear, trainable: bool) -> None:
        super().__init__(layer)
        self.block_num = layer.block_num
        self.block_input_size = layer.block_input_size
        self.block_output_size = layer.block_output_size
        self.weight = nn.Parameter(_tensor(layer.weights))  # (Blocks, In, Out), engine layout
        self.bias = nn.Parameter(_tensor(layer.bias))  # (Blocks, Out)

    def forward(self, x: Tensor) -> Tensor:
        b = x.shape[0]
        xb = x.reshape(b, self.block_num, self.block_input_size)
        y = torch.einsum("bni,nio->bno", xb, self.weight) + self.bias
        return y.reshape(b, self.block_num * self.block_output_size)

    def to_layer(self, template: MultiLinear) -> Layer:
        return replace(template, weights=_array(self.weight), bias=_array(self.bias))


# --------------------------------------------------------------------------------------------------
# Element-wise layers


class _StatelessModule(NNEModule):
    def __init__(self, layer: Layer, trainable: bool) -> None:
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
    def __init__(self, layer: Tile, trainable: bool) -> None:
        super().__init__(layer, trainable)
        self.repeats = layer.repeats

    def forward(self, x: Tensor) -> Tensor:
        return x.repeat(1, self.repeats)


class SliceModule(_StatelessModule):
    def __init__(self, layer: Slice, trainable: bool) -> None:
        super().__init__(layer, trainable)
        self.start = layer.slice_offset
        self.stop = layer.slice_offset + layer.slice_size

    def forward(self, x: Tensor) -> Tensor:
        return x[:, self.start : self.stop]


class PReLUModule(NNEModule):
    def __init__(self, layer: PReLU, trainable: bool) -> None:
        super().__init__(layer)
        self.alpha = nn.Parameter(_tensor(layer.alpha))

    def forward(self, x: Tensor) -> Tensor:
        return torch.where(x > 0, x, self.alpha * x)

    def to_layer(self, template: PReLU) -> Layer:
        return replace(template, alpha=_array(self.alpha))


class ClampModule(NNEModule):
    min: Tensor
    max: Tensor

    def __init__(self, layer: Clamp, trainable: bool) -> None:
        super().__init__(layer)
        self.register_buffer("min", _tensor(layer.min))
        self.register_buffer("max", _tensor(layer.max))

    def forward(self, x: Tensor) -> Tensor:
        # FMath::Clamp order (min wins when min > max), unlike torch.clamp.
        return torch.where(x < self.min, self.min, torch.where(x < self.max, x, self.max))

    def to_layer(self, template: Clamp) -> Layer:
        return replace(template, min=_array(self.min), max=_array(self.max))


class LayerNormModule(NNEModule):
    def __init__(self, layer: LayerNorm, trainable: bool) -> None:
        super().__init__(layer)
        self.size = layer.size
        self.epsilon = float(layer.epsilon)
        self.offset = nn.Parameter(_tensor(layer.offset))
        self.scale = nn.Parameter(_tensor(layer.scale))

    def forward(self, x: Tensor) -> Tensor:
        if self.size == 0:
            return x
        # F.layer_norm uses the biased variance, as the engine does.
        return F.layer_norm(x, (self.size,), self.scale, self.offset, self.epsilon)

    def to_layer(self, template: LayerNorm) -> Layer:
        return replace(template, offset=_array(self.offset), scale=_array(self.scale))


# --------------------------------------------------------------------------------------------------
# Entry points


_ModuleFactory = Callable[[Any, bool], NNEModule]
"""Builds the module of one layer: (layer value, trainable normalisation) -> module."""

_MODULES: dict[LayerType, _ModuleFactory] = {
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
"""Module class per layer type; :mod:`trainer.nne_torch_composite` adds the composite types on import."""


def _register_modules(factories: Mapping[LayerType, _ModuleFactory]) -> None:
    """Adds the module factories of more layer types (called by :mod:`trainer.nne_torch_composite`)."""
    _MODULES.update(factories)


def _build(layer: Layer, trainable: bool) -> NNEModule:
    factory = _MODULES.get(layer.type_id)
    if factory is None:
        raise NNEError("no torch module for this layer type", field="layer.type_id", actual=layer.type_id)
    return factory(layer, trainable)


def to_torch(layer: Layer, *, trainable_normalization: bool = False) -> NNEModule:
    """A module tree mirroring ``layer`` (its arrays copied). ``forward``: (B, In) → (B, Out).

    With ``trainable_normalization`` the Normalize/Denormalize mean and std are Parameters, otherwise
    buffers (still written back by :func:`from_torch`, so statistics set on them are kept).
    """
    return _build(layer, trainable_normalization)


def from_torch(module: nn.Module, template: Layer) -> Layer:
    """A new layer tree shaped like ``template`` holding ``module``'s current values as float32 copies.

    ``module`` must be the tree :func:`to_torch` built from a layer of the same structure. Untouched values
    come back bitwise identical; trained CompressedLinear weights are re-quantised (:func:`quantize_weights`).
    """
    if not isinstance(module, NNEModule) or module.layer_type != template.type_id:
        actual = getattr(module, "layer_type", type(module).__name__)
        raise NNEError(
            "the module tree does not mirror the template layer",
            field="module",
            expected=LayerType(template.type_id).name,
            actual=str(actual),
        )
    return module.to_layer(template)


def iter_linear_layers(module: nn.Module) -> Iterator[LinearModule]:
    """The modules of Linear layers (type 4 only) in serialisation order (depth first, children in order).

    Their ``weight`` is Wᵀ (Out, In); ``weights_in_engine_layout()`` gives W (In, Out).
    """
    if isinstance(module, LinearModule):
        yield module
    if isinstance(module, NNEModule):
        for child in module.nne_children():
            yield from iter_linear_layers(child)


# The composite modules subclass NNEModule and build their children with _build, so their module imports
# this one and can only run once everything above exists; it registers its classes in _MODULES when it is
# imported. Importing it here, last, makes every layer type available after `import trainer.nne_torch`,
# and works in either import order (whichever module starts first, both are complete before it returns).
from trainer import nne_torch_composite  # noqa: E402, F401
