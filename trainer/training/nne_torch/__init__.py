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

The package: :mod:`~trainer.training.nne_torch.base` (the base class, the builder, copies in and out),
:mod:`~trainer.training.nne_torch.basic` (containers, affine and element-wise layers) and
:mod:`~trainer.training.nne_torch.composite` (recurrent cells, aggregates, mixtures, FiLM, convolutions). This face
joins the two layer tables into :data:`MODULE_FACTORIES`, one entry per layer type.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from protocol.nne.layers import Layer, LayerType
from trainer.training.nne_torch.base import ModuleBuilder, ModuleFactory, NNEModule, from_torch
from trainer.training.nne_torch.basic import (
    BASIC_MODULES,
    CompressedLinearModule,
    DenormalizeModule,
    ELUModule,
    LinearModule,
    ReLUModule,
    SequenceModule,
    TanHModule,
    iter_linear_layers,
    quantize_weights,
)
from trainer.training.nne_torch.composite import COMPOSITE_MODULES

__all__ = [
    "MODULE_FACTORIES",
    "CompressedLinearModule",
    "DenormalizeModule",
    "ELUModule",
    "LinearModule",
    "NNEModule",
    "ReLUModule",
    "SequenceModule",
    "TanHModule",
    "from_torch",
    "iter_linear_layers",
    "quantize_weights",
    "to_torch",
]

MODULE_FACTORIES: Mapping[LayerType, ModuleFactory] = MappingProxyType({**BASIC_MODULES, **COMPOSITE_MODULES})
"""Module class per layer type: every type but INVALID, each from exactly one of the two tables."""


def to_torch(layer: Layer, *, trainable_normalization: bool = False) -> NNEModule:
    """A module tree mirroring ``layer`` (its arrays copied). ``forward``: (B, In) → (B, Out).

    With ``trainable_normalization`` the Normalize/Denormalize mean and std are Parameters, otherwise
    buffers (still written back by :func:`from_torch`, so statistics set on them are kept).
    """
    return ModuleBuilder(MODULE_FACTORIES, trainable_normalization)(layer)
