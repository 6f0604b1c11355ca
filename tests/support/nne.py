"""Shared test builders."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

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

Rng = np.random.Generator
F32 = npt.NDArray[np.float32]


def f32(rng: Rng, *shape: int, scale: float = 1.0) -> F32:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def linear(rng: Rng, n_in: int, n_out: int) -> Linear:
    return Linear(
        n_in, n_out, f32(rng, n_out, scale=0.1), f32(rng, n_in, n_out, scale=1 / math.sqrt(max(n_in, 1)))
    )


def mlp(rng: Rng, n_in: int, n_out: int, hidden: int = 5) -> Sequence:
    return Sequence((linear(rng, n_in, hidden), TanH(hidden), linear(rng, hidden, n_out)))


def _compressed(rng: Rng, n: int) -> CompressedLinear:
    n_in, n_out = n, n + 1
    scales = (rng.uniform(0.5, 1.5, n_in) * 2 / 65535).astype(np.float32)
    offsets = (-scales * 32768).astype(np.float32)
    codes = rng.integers(0, 65536, (n_in, n_out)).astype(np.uint16)
    return CompressedLinear(n_in, n_out, offsets, scales, f32(rng, n_out, scale=0.1), codes)


def _aggregate_set(rng: Rng, n: int) -> AggregateSet:
    m, e_out, oes, att, heads = 4, 3, 2, 2, 2
    element = Sequence((linear(rng, n, e_out), TanH(e_out)))
    return AggregateSet(
        m, n, e_out, oes, att, heads,
        element, linear(rng, e_out, heads * att), linear(rng, e_out, heads * att), linear(rng, e_out, heads * oes),
    )  # fmt: skip


def _or_exclusive(rng: Rng, n: int) -> AggregateOrExclusive:
    ins, outs, oes = (n, 2, n + 1), (3, 2, 3), 2
    subs = tuple(linear(rng, i, o) for i, o in zip(ins, outs, strict=True))
    encoders = (linear(rng, 3, oes), mlp(rng, 2, oes), linear(rng, 3, oes))
    return AggregateOrExclusive(oes, ins, outs, subs, encoders)


def _or_inclusive(rng: Rng, n: int) -> AggregateOrInclusive:
    ins, outs, oes, att, heads = (n, 2, 3), (3, 2, 2), 3, 2, 2
    subs = tuple(linear(rng, i, o) for i, o in zip(ins, outs, strict=True))
    return AggregateOrInclusive(
        oes, att, heads, ins, outs, subs,
        tuple(linear(rng, o, heads * att) for o in outs),
        tuple(linear(rng, o, heads * att) for o in outs),
        tuple(linear(rng, o, heads * oes) for o in outs),
    )  # fmt: skip


def _memory_cell(rng: Rng, n: int) -> MemoryCell:
    out, mem = 2, 3
    return MemoryCell(
        n, out, mem,
        linear(rng, n + mem, mem), linear(rng, n + mem, out), linear(rng, n + mem, mem),
        linear(rng, n + mem, out), linear(rng, mem, out),
    )  # fmt: skip


def _gru(rng: Rng, n: int) -> GRUCell:
    out = 3
    return GRUCell(n, out, linear(rng, n + out, out), linear(rng, n + out, out), mlp(rng, n + out, out))


def _conv1d(rng: Rng, n: int) -> Conv1d:
    c_in, length, c_out, k = 2, 5, 3, 3
    mode = int(rng.integers(0, 2))
    pad = int(rng.integers(0, 3))
    return Conv1d(
        length,
        c_in,
        c_out,
        k,
        pad,
        mode,
        f32(rng, c_out, c_in, k),
        f32(rng, c_out),
        linear(rng, n, c_in * length),
    )


def _conv2d(rng: Rng, n: int) -> Conv2d:
    c_in, h, w, c_out, k = 2, 4, 5, 3, 3
    stride, pad = int(rng.integers(1, 3)), int(rng.integers(0, 2))
    return Conv2d(
        h, w, c_in, c_out, k, stride, pad, 0, f32(rng, c_out, c_in, k, k), f32(rng, c_out), Copy(c_in * h * w)
    )


def _film(rng: Rng, n: int) -> FiLM:
    return FiLM(n, 3, 2, 6, 3, 2, linear(rng, n, 3), linear(rng, 2, 6), mlp(rng, 3, 2))


#: One random-instance factory per layer type: (rng, size hint n >= 1) -> layer.
SAMPLES: dict[LayerType, Callable[[Rng, int], Layer]] = {
    LayerType.SEQUENCE: lambda rng, n: Sequence((linear(rng, n, n + 1), ELU(n + 1), linear(rng, n + 1, n))),
    LayerType.NORMALIZE: lambda rng, n: Normalize(n, f32(rng, n), rng.uniform(0.5, 2, n).astype(np.float32)),
    LayerType.DENORMALIZE: lambda rng, n: Denormalize(
        n, f32(rng, n), rng.uniform(0.5, 2, n).astype(np.float32)
    ),
    LayerType.LINEAR: lambda rng, n: linear(rng, n, n + 2),
    LayerType.COMPRESSED_LINEAR: _compressed,
    LayerType.MULTI_LINEAR: lambda rng, n: MultiLinear(3, n, 2, f32(rng, 3, 2), f32(rng, 3, n, 2)),
    LayerType.RELU: lambda rng, n: ReLU(n + 3),
    LayerType.ELU: lambda rng, n: ELU(n + 3),
    LayerType.TANH: lambda rng, n: TanH(n + 3),
    LayerType.PRELU: lambda rng, n: PReLU(n, rng.uniform(0, 0.5, n).astype(np.float32)),
    LayerType.MEMORY_CELL: _memory_cell,
    LayerType.COPY: lambda rng, n: Copy(n),
    LayerType.CONCAT: lambda rng, n: Concat(
        (n, 2), (n + 1, 3), (linear(rng, n, n + 1), Sequence((linear(rng, 2, 3), GELU(3))))
    ),
    LayerType.ARRAY: lambda rng, n: Array(3, n, 2, mlp(rng, n, 2)),
    LayerType.AGGREGATE_SET: _aggregate_set,
    LayerType.AGGREGATE_OR_EXCLUSIVE: _or_exclusive,
    LayerType.AGGREGATE_OR_INCLUSIVE: _or_inclusive,
    LayerType.CLAMP: lambda rng, n: Clamp(
        n, (-np.abs(f32(rng, n)) - 0.1).astype(np.float32), (np.abs(f32(rng, n)) + 0.1).astype(np.float32)
    ),
    LayerType.SPARSE_MIXTURE_OF_EXPERTS: lambda rng, n: SparseMixtureOfExperts(
        n, 3, linear(rng, n, 3), (linear(rng, n, 3), mlp(rng, n, 3), linear(rng, n, 3))
    ),
    LayerType.GELU: lambda rng, n: GELU(n + 3),
    LayerType.LAYER_NORM: lambda rng, n: LayerNorm(n + 2, f32(rng, n + 2), f32(rng, n + 2), 1e-5),
    LayerType.LIPSCHIZT_LINEAR: lambda rng, n: LipschiztLinear(n, 2, f32(rng, 2), f32(rng, n, 2)),
    LayerType.TILE: lambda rng, n: Tile(n, 3),
    LayerType.SPREAD: lambda rng, n: Spread(n, (2, 3), (linear(rng, n, 2), mlp(rng, n, 3))),
    LayerType.SLICE: lambda rng, n: Slice(n + 3, 1, n),
    LayerType.RESIDUAL: lambda rng, n: Residual(n, Sequence((linear(rng, n, n), TanH(n)))),
    LayerType.FILM: _film,
    LayerType.GRU_CELL: _gru,
    LayerType.CONV1D: _conv1d,
    LayerType.CONV2D: _conv2d,
    LayerType.SOFTMAX: lambda rng, n: Softmax(n + 2),
}


#: Layer types whose input carries a mask/one-hot at a fixed place (inputs need care, no nesting).
MASKED_TYPES = frozenset(
    {LayerType.AGGREGATE_SET, LayerType.AGGREGATE_OR_EXCLUSIVE, LayerType.AGGREGATE_OR_INCLUSIVE}
)


def sample_input(layer: Layer, rng: Rng, batch: int) -> F32:
    """A valid random batch for ``layer``: N(0, 1) features; masks and one-hots where the layer reads them."""
    x = f32(rng, batch, layer.input_size)
    if isinstance(layer, AggregateSet):
        m = layer.max_element_num
        x[:, -m:] = rng.integers(0, 2, (batch, m))
    elif isinstance(layer, AggregateOrExclusive):
        n = len(layer.sub_layers)
        x[:, -n:] = np.eye(n, dtype=np.float32)[rng.integers(0, n, batch)]
    elif isinstance(layer, AggregateOrInclusive):
        n = len(layer.sub_layers)
        x[:, -n:] = rng.integers(0, 2, (batch, n))
    return x


def random_tree(rng: Rng, n_in: int, depth: int) -> Layer:
    """A random nested tree of containers (Sequence/Concat/Array/Spread/Residual) over simple layers."""
    if depth == 0:
        leaf = int(rng.integers(0, 5))
        leaves: list[Callable[[], Layer]] = [
            lambda: linear(rng, n_in, int(rng.integers(1, 5))),
            lambda: ELU(n_in),
            lambda: GELU(n_in),
            lambda: Denormalize(n_in, f32(rng, n_in), rng.uniform(0.5, 2, n_in).astype(np.float32)),
            lambda: LayerNorm(n_in, f32(rng, n_in), f32(rng, n_in), 1e-5),
        ]
        return leaves[leaf]()
    kind = int(rng.integers(0, 5))
    if kind == 0:
        first = random_tree(rng, n_in, depth - 1)
        return Sequence((first, random_tree(rng, first.output_size, depth - 1)))
    if kind == 1:
        split = int(rng.integers(1, n_in)) if n_in > 1 else 1
        sizes = (split, n_in - split) if n_in > 1 else (1,)
        parts = tuple(random_tree(rng, s, depth - 1) for s in sizes)
        return Concat(sizes, tuple(p.output_size for p in parts), parts)
    if kind == 2:
        element = int(rng.integers(1, 4))
        sub = random_tree(rng, element, depth - 1)
        return Sequence((linear(rng, n_in, 3 * element), Array(3, element, sub.output_size, sub)))
    if kind == 3:
        parts = (random_tree(rng, n_in, depth - 1), random_tree(rng, n_in, depth - 1))
        return Spread(n_in, tuple(p.output_size for p in parts), parts)
    inner = random_tree(rng, n_in, depth - 1)
    return Residual(n_in, Sequence((inner, linear(rng, inner.output_size, n_in))))
