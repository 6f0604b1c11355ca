"""Torch twins of the composite NNE layers: recurrent cells, attention aggregates, mixtures, FiLM, convolutions.

Part of :mod:`trainer.training.nne_torch` (which documents the conventions: ``forward`` (B, input_size) → (B,
output_size), ``nne_children()``, ``to_layer(template)``); kept apart because these layers hold sub-layers
at fixed roles and a forward pass of their own. Numerics follow :mod:`protocol.nne.reference` (each class
names its ``_eval_*`` twin there). :data:`COMPOSITE_MODULES` is this module's part of the layer-type
table that the package face assembles.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from protocol.errors import NNEError
from protocol.nne.layers import (
    AggregateOrExclusive,
    AggregateOrInclusive,
    AggregateSet,
    Conv1d,
    Conv2d,
    FiLM,
    GRUCell,
    Layer,
    LayerType,
    MemoryCell,
    SparseMixtureOfExperts,
)
from protocol.nne.reference import PADDING_CIRCULAR, PADDING_ZEROS
from trainer.training.nne_torch.base import (
    ModuleBuilder,
    ModuleFactory,
    NNEModule,
    from_torch,
    nne_modules,
    rebuild_layers,
    to_array,
    to_tensor,
)

__all__ = [
    "COMPOSITE_MODULES",
    "AggregateOrExclusiveModule",
    "AggregateOrInclusiveModule",
    "AggregateSetModule",
    "Conv1dModule",
    "Conv2dModule",
    "FiLMModule",
    "GRUCellModule",
    "MemoryCellModule",
    "SparseMixtureOfExpertsModule",
]


# --------------------------------------------------------------------------------------------------
# Recurrent cells


class MemoryCellModule(NNEModule):
    def __init__(self, layer: MemoryCell, build: ModuleBuilder) -> None:
        super().__init__(layer)
        self.n_in, self.n_mem = layer.input_size_, layer.memory_size
        self.remember_layer = build(layer.remember_layer)
        self.passthrough_layer = build(layer.passthrough_layer)
        self.memory_update_layer = build(layer.memory_update_layer)
        self.output_input_layer = build(layer.output_input_layer)
        self.output_memory_layer = build(layer.output_memory_layer)

    def forward(self, x: Tensor) -> Tensor:
        memory = x[:, self.n_in : self.n_in + self.n_mem]
        remember = torch.sigmoid(self.remember_layer(x))
        new_memory = (1 - remember) * memory + remember * torch.tanh(self.memory_update_layer(x))
        passthrough = torch.sigmoid(self.passthrough_layer(x))
        from_memory = torch.tanh(self.output_memory_layer(new_memory))
        from_input = torch.tanh(self.output_input_layer(x))
        y = (1 - passthrough) * from_memory + passthrough * from_input
        return torch.cat([y, new_memory], dim=1)

    def nne_children(self) -> tuple[NNEModule, ...]:
        return (
            self.remember_layer,
            self.passthrough_layer,
            self.memory_update_layer,
            self.output_input_layer,
            self.output_memory_layer,
        )

    def to_layer(self, template: MemoryCell) -> Layer:
        return replace(
            template,
            remember_layer=from_torch(self.remember_layer, template.remember_layer),
            passthrough_layer=from_torch(self.passthrough_layer, template.passthrough_layer),
            memory_update_layer=from_torch(self.memory_update_layer, template.memory_update_layer),
            output_input_layer=from_torch(self.output_input_layer, template.output_input_layer),
            output_memory_layer=from_torch(self.output_memory_layer, template.output_memory_layer),
        )


class GRUCellModule(NNEModule):
    def __init__(self, layer: GRUCell, build: ModuleBuilder) -> None:
        super().__init__(layer)
        self.n_in, self.n_out = layer.input_size_, layer.output_size_
        self.remember_layer = build(layer.remember_layer)
        self.update_layer = build(layer.update_layer)
        self.activation_layer = build(layer.activation_layer)

    def forward(self, x: Tensor) -> Tensor:
        hidden = x[:, self.n_in : self.n_in + self.n_out]
        remember = torch.sigmoid(self.remember_layer(x))
        update = torch.sigmoid(self.update_layer(x))
        masked = torch.cat([x[:, : self.n_in], remember * hidden], dim=1)
        candidate = torch.tanh(self.activation_layer(masked))
        new_hidden = (1 - update) * hidden + update * candidate
        return torch.cat([new_hidden, new_hidden], dim=1)

    def nne_children(self) -> tuple[NNEModule, ...]:
        return (self.remember_layer, self.update_layer, self.activation_layer)

    def to_layer(self, template: GRUCell) -> Layer:
        return replace(
            template,
            remember_layer=from_torch(self.remember_layer, template.remember_layer),
            update_layer=from_torch(self.update_layer, template.update_layer),
            activation_layer=from_torch(self.activation_layer, template.activation_layer),
        )


# --------------------------------------------------------------------------------------------------
# Attention aggregates and mixtures


def _attend(q: Tensor, k: Tensor, v: Tensor, present: Tensor, heads: int) -> Tensor:
    """Torch twin of ``protocol.nne.reference._attend``: (B, N, H·A) ×2, (B, N, H·E), (B, N) → (B, H·E)."""
    b, n = present.shape
    if n == 0 or heads == 0:
        return v.new_zeros((b, v.shape[2]))
    att_size, enc_size = q.shape[2] // heads, v.shape[2] // heads
    q4 = q.reshape(b, n, heads, att_size)
    k4 = k.reshape(b, n, heads, att_size)
    v4 = v.reshape(b, n, heads, enc_size)
    scores = (q4 * k4).sum(dim=3) / math.sqrt(att_size)
    mask = present[:, :, None]
    masked = torch.where(mask, scores, 0.0)
    peak = masked.amax(dim=1).clamp_min(0.0)  # the engine's maximum starts at 0
    e = torch.where(mask, torch.exp(masked - peak[:, None, :]), 0.0)
    weights = e / (e.sum(dim=1, keepdim=True) + 1.0)
    pooled = torch.einsum("bnh,bnhe->bhe", weights, torch.where(mask[..., None], v4, 0.0))
    return pooled.reshape(b, heads * enc_size)


class AggregateSetModule(NNEModule):
    def __init__(self, layer: AggregateSet, build: ModuleBuilder) -> None:
        super().__init__(layer)
        self.max_element_num = layer.max_element_num
        self.element_input_size = layer.element_input_size
        self.heads = layer.attention_head_num
        self.att = layer.attention_head_num * layer.attention_encoding_size
        self.val = layer.attention_head_num * layer.output_encoding_size
        self.element_layer = build(layer.element_layer)
        self.query_layer = build(layer.query_layer)
        self.key_layer = build(layer.key_layer)
        self.value_layer = build(layer.value_layer)

    def forward(self, x: Tensor) -> Tensor:
        b, m, e_in = x.shape[0], self.max_element_num, self.element_input_size
        elements = x[:, : m * e_in].reshape(b, m, e_in)
        count = (x[:, m * e_in : m * e_in + m] != 0).sum(dim=1)
        # The engine uses the first `count` slots, whatever the mask positions (reference docstring).
        present = torch.arange(m, device=x.device)[None, :] < count[:, None]
        act = self.element_layer(torch.where(present[:, :, None], elements, 0.0).reshape(b * m, e_in))
        q = self.query_layer(act).reshape(b, m, self.att)
        k = self.key_layer(act).reshape(b, m, self.att)
        v = self.value_layer(act).reshape(b, m, self.val)
        fraction = count.to(x.dtype)[:, None] / m
        return torch.cat([_attend(q, k, v, present, self.heads), fraction], dim=1)

    def nne_children(self) -> tuple[NNEModule, ...]:
        return (self.element_layer, self.query_layer, self.key_layer, self.value_layer)

    def to_layer(self, template: AggregateSet) -> Layer:
        return replace(
            template,
            element_layer=from_torch(self.element_layer, template.element_layer),
            query_layer=from_torch(self.query_layer, template.query_layer),
            key_layer=from_torch(self.key_layer, template.key_layer),
            value_layer=from_torch(self.value_layer, template.value_layer),
        )


class AggregateOrExclusiveModule(NNEModule):
    def __init__(self, layer: AggregateOrExclusive, build: ModuleBuilder) -> None:
        super().__init__(layer)
        self.input_sizes = list(layer.input_sizes)
        self.region = max(layer.input_sizes, default=0)
        self.encoding_size = layer.output_encoding_size
        self.sub_layers = nn.ModuleList(build(sub) for sub in layer.sub_layers)
        self.encoder_layers = nn.ModuleList(build(enc) for enc in layer.encoder_layers)

    def forward(self, x: Tensor) -> Tensor:
        n = len(self.input_sizes)
        one_hot = x[:, self.region : self.region + n]
        bits = one_hot != 0
        if not bool(bits.any(dim=1).all()):
            raise NNEError("an AggregateOrExclusive row has no set bit in its one-hot", field="one_hot")
        branch = bits.to(x.dtype).argmax(dim=1)  # first set bit, as the engine's scan
        out = x.new_zeros((x.shape[0], self.encoding_size))
        for i, (sub, enc) in enumerate(zip(self.sub_layers, self.encoder_layers, strict=True)):
            rows = torch.nonzero(branch == i).squeeze(1)
            if rows.numel():
                out = out.index_put((rows,), enc(sub(x[rows, : self.input_sizes[i]])))
        return torch.cat([out, one_hot], dim=1)

    def nne_children(self) -> tuple[NNEModule, ...]:
        return nne_modules(self.sub_layers) + nne_modules(self.encoder_layers)

    def to_layer(self, template: AggregateOrExclusive) -> Layer:
        return replace(
            template,
            sub_layers=rebuild_layers(nne_modules(self.sub_layers), template.sub_layers),
            encoder_layers=rebuild_layers(nne_modules(self.encoder_layers), template.encoder_layers),
        )


class AggregateOrInclusiveModule(NNEModule):
    def __init__(self, layer: AggregateOrInclusive, build: ModuleBuilder) -> None:
        super().__init__(layer)
        self.input_sizes = list(layer.input_sizes)
        self.heads = layer.attention_head_num
        self.att = layer.attention_head_num * layer.attention_encoding_size
        self.val = layer.attention_head_num * layer.output_encoding_size
        self.sub_layers = nn.ModuleList(build(sub) for sub in layer.sub_layers)
        self.query_layers = nn.ModuleList(build(q) for q in layer.query_layers)
        self.key_layers = nn.ModuleList(build(k) for k in layer.key_layers)
        self.value_layers = nn.ModuleList(build(v) for v in layer.value_layers)

    def forward(self, x: Tensor) -> Tensor:
        b, n = x.shape[0], len(self.input_sizes)
        total = sum(self.input_sizes)
        mask = x[:, total : total + n]
        present = mask != 0
        q = x.new_zeros((b, n, self.att))
        k = x.new_zeros((b, n, self.att))
        v = x.new_zeros((b, n, self.val))
        offset = 0
        for i, n_in in enumerate(self.input_sizes):
            rows = torch.nonzero(present[:, i]).squeeze(1)
            if rows.numel():
                hidden = self.sub_layers[i](x[rows, offset : offset + n_in])
                index = (rows, torch.full_like(rows, i))
                q = q.index_put(index, self.query_layers[i](hidden))
                k = k.index_put(index, self.key_layers[i](hidden))
                v = v.index_put(index, self.value_layers[i](hidden))
            offset += n_in
        return torch.cat([_attend(q, k, v, present, self.heads), mask], dim=1)

    def nne_children(self) -> tuple[NNEModule, ...]:
        return (
            nne_modules(self.sub_layers)
            + nne_modules(self.query_layers)
            + nne_modules(self.key_layers)
            + nne_modules(self.value_layers)
        )

    def to_layer(self, template: AggregateOrInclusive) -> Layer:
        return replace(
            template,
            sub_layers=rebuild_layers(nne_modules(self.sub_layers), template.sub_layers),
            query_layers=rebuild_layers(nne_modules(self.query_layers), template.query_layers),
            key_layers=rebuild_layers(nne_modules(self.key_layers), template.key_layers),
            value_layers=rebuild_layers(nne_modules(self.value_layers), template.value_layers),
        )


class SparseMixtureOfExpertsModule(NNEModule):
    """Top-2 gating (reference ``_eval_sparse_moe``). Every expert runs on every row so that the mix is a
    plain differentiable gather; rows are independent, so the values equal the engine's routed evaluation."""

    def __init__(self, layer: SparseMixtureOfExperts, build: ModuleBuilder) -> None:
        super().__init__(layer)
        self.gating_layer = build(layer.gating_layer)
        self.expert_layers = nn.ModuleList(build(e) for e in layer.expert_layers)

    def forward(self, x: Tensor) -> Tensor:
        if len(self.expert_layers) < 2:
            raise NNEError("a SparseMixtureOfExperts needs at least two experts", field="expert_layers")
        gates = self.gating_layer(x)
        first = gates.argmax(dim=1, keepdim=True)
        second = gates.scatter(1, first, float("-inf")).argmax(dim=1, keepdim=True)
        weights = torch.softmax(torch.cat([gates.gather(1, first), gates.gather(1, second)], dim=1), dim=1)
        outputs = torch.stack([expert(x) for expert in self.expert_layers], dim=1)  # (B, E, Out)
        width = outputs.shape[2]
        y0 = outputs.gather(1, first[:, :, None].expand(-1, 1, width)).squeeze(1)
        y1 = outputs.gather(1, second[:, :, None].expand(-1, 1, width)).squeeze(1)
        return weights[:, :1] * y0 + weights[:, 1:] * y1

    def nne_children(self) -> tuple[NNEModule, ...]:
        return (self.gating_layer, *nne_modules(self.expert_layers))

    def to_layer(self, template: SparseMixtureOfExperts) -> Layer:
        return replace(
            template,
            gating_layer=from_torch(self.gating_layer, template.gating_layer),
            expert_layers=rebuild_layers(nne_modules(self.expert_layers), template.expert_layers),
        )


class FiLMModule(NNEModule):
    def __init__(self, layer: FiLM, build: ModuleBuilder) -> None:
        super().__init__(layer)
        self.p_in, self.p_out = layer.prefix_input_size, layer.prefix_output_size
        self.c_in = layer.condition_input_size
        self.prefix_layer = build(layer.prefix_layer)
        self.condition_layer = build(layer.condition_layer)
        self.postfix_layer = build(layer.postfix_layer)

    def forward(self, x: Tensor) -> Tensor:
        prefix = self.prefix_layer(x[:, : self.p_in])
        cond = self.condition_layer(x[:, self.p_in : self.p_in + self.c_in])
        y: Tensor = self.postfix_layer(prefix * cond[:, : self.p_out] + cond[:, self.p_out : 2 * self.p_out])
        return y

    def nne_children(self) -> tuple[NNEModule, ...]:
        return (self.prefix_layer, self.condition_layer, self.postfix_layer)

    def to_layer(self, template: FiLM) -> Layer:
        return replace(
            template,
            prefix_layer=from_torch(self.prefix_layer, template.prefix_layer),
            condition_layer=from_torch(self.condition_layer, template.condition_layer),
            postfix_layer=from_torch(self.postfix_layer, template.postfix_layer),
        )


# --------------------------------------------------------------------------------------------------
# Convolutions (the sub-layer runs first, then the convolution; reference ``_eval_conv1d``)


class Conv1dModule(NNEModule):
    pad_index: Tensor

    def __init__(self, layer: Conv1d, build: ModuleBuilder) -> None:
        super().__init__(layer)
        self.in_channels, self.length, self.padding = layer.in_channels, layer.input_length, layer.padding
        if layer.kernel_size < 1 or layer.output_length < 1:
            raise NNEError("Conv1d kernel larger than the padded input", field="Conv1d.kernel_size")
        if layer.padding_mode not in (PADDING_ZEROS, PADDING_CIRCULAR) or (
            layer.padding_mode == PADDING_CIRCULAR and layer.input_length == 0
        ):
            raise NNEError(
                "unsupported Conv1d padding mode", field="Conv1d.padding_mode", actual=layer.padding_mode
            )
        self.circular = layer.padding_mode == PADDING_CIRCULAR
        self.weight = nn.Parameter(to_tensor(layer.weights))  # (Out, In, K): the engine's order is torch's
        self.bias = nn.Parameter(to_tensor(layer.bias))
        index = (torch.arange(self.length + 2 * self.padding) - self.padding) % max(self.length, 1)
        self.register_buffer("pad_index", index, persistent=False)
        self.layer = build(layer.layer)

    def forward(self, x: Tensor) -> Tensor:
        z = self.layer(x).reshape(x.shape[0], self.in_channels, self.length)
        padded = (
            z.index_select(2, self.pad_index) if self.circular else F.pad(z, (self.padding, self.padding))
        )
        return F.conv1d(padded, self.weight, self.bias).reshape(x.shape[0], self.output_size)

    def nne_children(self) -> tuple[NNEModule, ...]:
        return (self.layer,)

    def to_layer(self, template: Conv1d) -> Layer:
        return replace(
            template,
            weights=to_array(self.weight),
            bias=to_array(self.bias),
            layer=from_torch(self.layer, template.layer),
        )


class Conv2dModule(NNEModule):
    def __init__(self, layer: Conv2d, build: ModuleBuilder) -> None:
        super().__init__(layer)
        k, s, p = layer.kernel_size, layer.stride, layer.padding
        if layer.padding_mode != PADDING_ZEROS:
            raise NNEError(
                "Conv2d pads with zeros only", field="Conv2d.padding_mode", actual=layer.padding_mode
            )
        if s < 1 or k < 1 or layer.input_height + 2 * p < k or layer.input_width + 2 * p < k:
            raise NNEError("Conv2d kernel/stride do not fit the padded input", field="Conv2d.kernel_size")
        self.in_shape = (layer.in_channels, layer.input_height, layer.input_width)
        self.stride, self.padding = s, p
        self.weight = nn.Parameter(to_tensor(layer.weights))  # (Out, In, K, K), torch's layout too
        self.bias = nn.Parameter(to_tensor(layer.bias))
        self.layer = build(layer.layer)

    def forward(self, x: Tensor) -> Tensor:
        z = self.layer(x).reshape(x.shape[0], *self.in_shape)
        y = F.conv2d(z, self.weight, self.bias, stride=self.stride, padding=self.padding)
        return y.reshape(x.shape[0], self.output_size)

    def nne_children(self) -> tuple[NNEModule, ...]:
        return (self.layer,)

    def to_layer(self, template: Conv2d) -> Layer:
        return replace(
            template,
            weights=to_array(self.weight),
            bias=to_array(self.bias),
            layer=from_torch(self.layer, template.layer),
        )


# --------------------------------------------------------------------------------------------------
# The composite part of the layer-type table


COMPOSITE_MODULES: Mapping[LayerType, ModuleFactory] = {
    LayerType.MEMORY_CELL: MemoryCellModule,
    LayerType.AGGREGATE_SET: AggregateSetModule,
    LayerType.AGGREGATE_OR_EXCLUSIVE: AggregateOrExclusiveModule,
    LayerType.AGGREGATE_OR_INCLUSIVE: AggregateOrInclusiveModule,
    LayerType.SPARSE_MIXTURE_OF_EXPERTS: SparseMixtureOfExpertsModule,
    LayerType.FILM: FiLMModule,
    LayerType.GRU_CELL: GRUCellModule,
    LayerType.CONV1D: Conv1dModule,
    LayerType.CONV2D: Conv2dModule,
}
"""Module class per composite layer type."""
