"""What every torch twin of an NNE layer shares: the base class, the builder and the copies in and out.

A module tree is built top down by a :class:`ModuleBuilder`: the builder looks the layer's type up in its
table of factories, and a container's factory calls the builder again for each sub-layer. The table is
handed to the builder (the package face assembles it from the basic and the composite layer modules), so
no layer module needs to know the others and none registers itself on import.

:func:`from_torch` walks the other way: each module writes its current values into a copy of its
template layer (``NNEModule.to_layer``), recursing through its children.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor, nn

from protocol.errors import NNEError
from protocol.nne.layers import Layer, LayerType

__all__ = [
    "ModuleBuilder",
    "ModuleFactory",
    "NNEModule",
    "from_torch",
    "nne_modules",
    "rebuild_layers",
    "to_array",
    "to_tensor",
    "vector_state",
]


def to_tensor(array: npt.NDArray[Any]) -> Tensor:
    """A tensor holding a copy of ``array``."""
    # torch.tensor copies: training must never write into the (frozen) layer value's arrays.
    return torch.tensor(np.ascontiguousarray(array))


def to_array(t: Tensor) -> npt.NDArray[np.float32]:
    """A float32 numpy copy of ``t``, on the CPU and detached."""
    # Copy out of the tensor: the returned layer must not change when training continues.
    return np.array(t.detach().to(device="cpu", dtype=torch.float32).numpy(), dtype=np.float32, copy=True)


def vector_state(module: nn.Module, name: str, values: npt.NDArray[np.float32], trainable: bool) -> None:
    """Attach ``values`` to ``module`` as a Parameter when ``trainable``, else as a buffer."""
    if trainable:
        module.register_parameter(name, nn.Parameter(to_tensor(values)))
    else:
        module.register_buffer(name, to_tensor(values))


class NNEModule(nn.Module):
    """Base of every module built by :func:`trainer.training.nne_torch.to_torch`: knows its layer type and widths."""

    layer_type: LayerType
    input_size: int
    output_size: int

    def __init__(self, layer: Layer) -> None:
        super().__init__()
        self.layer_type = LayerType(layer.type_id)
        self.input_size, self.output_size = layer.input_size, layer.output_size

    def nne_children(self) -> tuple[NNEModule, ...]:
        """Sub-modules in the order :func:`protocol.nne.layout.children` lists the sub-layers."""
        return ()

    def to_layer(self, template: Any) -> Layer:
        """A new layer like ``template`` holding this module's current values (see :func:`from_torch`)."""
        raise NotImplementedError

    def extra_repr(self) -> str:
        return f"in={self.input_size}, out={self.output_size}"


ModuleFactory = Callable[[Any, "ModuleBuilder"], NNEModule]
"""Builds the module of one layer: (layer value, the builder for its sub-layers) -> module."""


@dataclass(frozen=True, slots=True)
class ModuleBuilder:
    """Builds the module of a layer; container modules call it again for their sub-layers.

    ``trainable_normalization``: Normalize/Denormalize mean and std become Parameters instead of buffers.
    """

    factories: Mapping[LayerType, ModuleFactory]
    trainable_normalization: bool = False

    def __call__(self, layer: Layer) -> NNEModule:
        factory = self.factories.get(layer.type_id)
        if factory is None:
            raise NNEError("no torch module for this layer type", field="layer.type_id", actual=layer.type_id)
        return factory(layer, self)


def nne_modules(modules: nn.ModuleList) -> tuple[NNEModule, ...]:
    """The NNE modules of a ``ModuleList``, in order."""
    return tuple(m for m in modules if isinstance(m, NNEModule))


def rebuild_layers(modules: tuple[NNEModule, ...], templates: tuple[Layer, ...]) -> tuple[Layer, ...]:
    """:func:`from_torch` of each module with its template (same count required)."""
    return tuple(from_torch(m, t) for m, t in zip(modules, templates, strict=True))


def from_torch(module: nn.Module, template: Layer) -> Layer:
    """A new layer tree shaped like ``template`` holding ``module``'s current values as float32 copies.

    ``module`` must be the tree :func:`trainer.training.nne_torch.to_torch` built from a layer of the same
    structure. Untouched values come back bitwise identical; trained CompressedLinear weights are
    re-quantised (:func:`trainer.training.nne_torch.quantize_weights`).
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
