"""Numpy reference evaluator for NNERuntimeBasicCpu layers: the oracle the torch modules are checked against.

``evaluate(layer, x)`` maps a batch ``x`` of shape ``(B, In)`` to ``(B, Out)``. Every operator follows the
engine's CPU implementation (``NNERuntimeBasicCpuModel.cpp``, the ``Operator*`` functions and each layer's
``Evaluate``) as literally as numpy allows; the docstring of each ``_eval_*`` function states the operator.

Precision: the input is rounded to float32 (what the engine receives), then everything is computed in
float64 and the result is rounded to float32 once. The engine computes in float32 throughout, so the two
differ by float32 rounding only (about 1e-7 relative per operation). Known deliberate deviations:

- ELU: the engine uses ``FMath::InvExpApprox`` (an approximate exponential) for exp(x) − 1; we use the
  exact ``expm1``, so engine outputs on the negative side differ by that approximation's small error.
- Linear, CompressedLinear and MultiLinear skip input entries that are exactly zero; this changes the result
  only when a weight is infinite or NaN (0 · inf), which we do not model.

Layer widths are the ``input_size``/``output_size`` properties of :mod:`protocol.nne.layers`, which follow
the engine's GetInputSize/GetOutputSize for every type. The less obvious ones: AggregateSet writes
H·OES + 1, AggregateOrExclusive reads max(InputSizes) + n and writes OES + n, AggregateOrInclusive writes
H·OES + n, GRUCell writes its new state twice (2·Out), and Conv1d/Conv2d run their sub-layer first (so they
read its input width) and write Cout·Lout (Cout·Ho·Wo).

Source of these facts: two public releases of NNERuntimeBasicCpuModel.cpp, a 5.3/5.4-era one (layer ids up
to Clamp: Aggregate*, MemoryCell) and a 5.6/5.7-era one (ids up to Conv2d: the same code for those, plus
SparseMixtureOfExperts, LayerNorm, FiLM, GRUCell, Conv1d/2d, Tile, Spread, Slice, Residual), and Epic's
``nne_runtime_basic_cpu_pytorch.py``. Softmax (new in 5.8) was not in the
sources seen; its semantics (softmax over the whole vector) are [INF].
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeAlias

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
    "GELU_SIGMOID_SCALE",
    "PADDING_CIRCULAR",
    "PADDING_ZEROS",
    "dequantize_weights",
    "evaluate",
    "io_sizes",
]

F32: TypeAlias = npt.NDArray[np.float32]
F64: TypeAlias = npt.NDArray[np.float64]

#: GELU is approximated as x · sigmoid(1.702 x) by the engine (spec §6.2, §10).
GELU_SIGMOID_SCALE = 1.702

#: Conv padding modes (FModelBuilder::EPaddingMode): 0 pads with zeros, 1 wraps around (circular).
#: Conv2d supports zeros only (the engine checks it).
PADDING_ZEROS = 0
PADDING_CIRCULAR = 1


# --------------------------------------------------------------------------------------------------
# Widths


def io_sizes(layer: Layer) -> tuple[int, int]:
    """``(input width, output width)`` of ``layer``: ``(layer.input_size, layer.output_size)``, which are the
    engine's GetInputSize/GetOutputSize for every layer type."""
    return layer.input_size, layer.output_size


# --------------------------------------------------------------------------------------------------
# Entry points


def evaluate(layer: Layer, x: npt.ArrayLike) -> F32:
    """Evaluate ``layer`` on a batch: ``x`` (B, In) float32 → (B, Out) float32 (``layer.input_size``,
    ``layer.output_size``).

    Raises :class:`NNEError` if ``x`` is not a 2-D float array of width In, or if the layer cannot be
    evaluated (the engine would assert): an AggregateOrExclusive row without a set one-hot bit, a
    SparseMixtureOfExperts with fewer than two experts, an unknown padding mode, a sub-layer whose width
    disagrees with its parent's fields.
    """
    arr = np.asarray(x)
    if arr.ndim != 2:
        raise NNEError(
            "the input batch must be a 2-D array (batch, width)", field="x", expected=2, actual=arr.ndim
        )
    if not np.issubdtype(arr.dtype, np.floating):
        raise NNEError(
            "the input batch must hold floats", field="x", expected="float32", actual=arr.dtype.name
        )
    # Round to float32 first: the engine only ever sees float32 inputs.
    x64 = arr.astype(np.float32).astype(np.float64)
    # The engine has no floating-point traps; overflow to inf and 0/0 → NaN behave as in C.
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        y = _eval(layer, x64, "layer")
    return y.astype(np.float32)


def dequantize_weights(layer: CompressedLinear) -> F32:
    """CompressedLinear weights as float32 (In, Out): W[i, o] = WeightScales[i] · q[i, o] + WeightOffsets[i].

    Computed in float32 in the engine's order (``Scales * (float)q + Offset``), so the torch module that
    starts from these values reproduces the engine's products exactly. (The engine formula has no 1/65535
    factor: the scale already includes it.)
    """
    q = layer.weights.astype(np.float32)
    w = layer.weight_scales[:, None] * q + layer.weight_offsets[:, None]
    return np.asarray(w, dtype=np.float32)


def _eval(layer: Layer, x: F64, path: str) -> F64:
    """Evaluate one (sub-)layer in float64 after checking that ``x`` has the engine's input width."""
    width = layer.input_size
    if x.shape[1] != width:
        name = LayerType(layer.type_id).name
        raise NNEError(
            f"{path} ({name}) reads {width} columns but is given {x.shape[1]}",
            field=path,
            expected=width,
            actual=x.shape[1],
        )
    evaluator = _EVALUATORS.get(layer.type_id)
    if evaluator is None:
        raise NNEError(f"{path} has a layer type without an evaluator", field=path, actual=layer.type_id)
    return evaluator(layer, x, path)


def _run(layer: Layer, x: F64, width: int, path: str) -> F64:
    """Evaluate a sub-layer and check that it writes ``width`` columns (its parent's field says so)."""
    y = _eval(layer, x, path)
    if y.shape[1] != width:
        raise NNEError(
            f"{path} writes {y.shape[1]} columns, expected {width}",
            field=path,
            expected=width,
            actual=y.shape[1],
        )
    return y


def _hstack(parts: list[F64], batch: int) -> F64:
    if not parts:
        return np.zeros((batch, 0), dtype=np.float64)
    return np.concatenate(parts, axis=1)


def _f64(a: npt.ArrayLike) -> F64:
    return np.asarray(a, dtype=np.float64)


def _sigmoid(z: F64) -> F64:
    # 1 / (1 + exp(-z)) written through tanh so that no intermediate overflows (same value).
    return 0.5 * (1.0 + np.tanh(0.5 * z))


# --------------------------------------------------------------------------------------------------
# Containers


def _eval_sequence(layer: Sequence, x: F64, path: str) -> F64:
    """Applies the layers one after another."""
    for i, sub in enumerate(layer.layers):
        x = _eval(sub, x, f"{path}.layers[{i}]")
    return x


def _eval_concat(layer: Concat, x: F64, path: str) -> F64:
    """Splits the input by InputSizes, applies one layer per part, concatenates the outputs."""
    parts: list[F64] = []
    offset = 0
    for i, (sub, n_in, n_out) in enumerate(
        zip(layer.layers, layer.input_sizes, layer.output_sizes, strict=True)
    ):
        parts.append(_run(sub, x[:, offset : offset + n_in], n_out, f"{path}.layers[{i}]"))
        offset += n_in
    return _hstack(parts, x.shape[0])


def _eval_array(layer: Array, x: F64, path: str) -> F64:
    """Applies the one sub-layer to each of ElementNum consecutive slices (as one batch of B·N rows)."""
    b, n = x.shape[0], layer.element_num
    elements = x.reshape(b * n, layer.element_input_size)
    y = _run(layer.layer, elements, layer.element_output_size, f"{path}.layer")
    return y.reshape(b, n * layer.element_output_size)


def _eval_spread(layer: Spread, x: F64, path: str) -> F64:
    """Every sub-layer reads the whole input; the outputs are concatenated."""
    parts = [
        _run(sub, x, n_out, f"{path}.layers[{i}]")
        for i, (sub, n_out) in enumerate(zip(layer.layers, layer.output_sizes, strict=True))
    ]
    return _hstack(parts, x.shape[0])


def _eval_residual(layer: Residual, x: F64, path: str) -> F64:
    """y = x + layer(x)."""
    return x + _run(layer.layer, x, layer.size, f"{path}.layer")


# --------------------------------------------------------------------------------------------------
# Element-wise and affine


def _eval_normalize(layer: Normalize, x: F64, path: str) -> F64:
    """y = (x − mean) / std."""
    return (x - _f64(layer.mean)) / _f64(layer.std)


def _eval_denormalize(layer: Denormalize, x: F64, path: str) -> F64:
    """y = x · std + mean."""
    return x * _f64(layer.std) + _f64(layer.mean)


def _eval_linear(layer: Linear | LipschiztLinear, x: F64, path: str) -> F64:
    """y = x · W + b with W (In, Out). LipschiztLinear stores already-normalised weights: same operator."""
    return x @ _f64(layer.weights) + _f64(layer.bias)


def _eval_compressed_linear(layer: CompressedLinear, x: F64, path: str) -> F64:
    """y = x · W + b with W[i, o] = WeightScales[i] · q[i, o] + WeightOffsets[i]."""
    w = _f64(layer.weight_scales)[:, None] * _f64(layer.weights) + _f64(layer.weight_offsets)[:, None]
    return x @ w + _f64(layer.bias)


def _eval_multi_linear(layer: MultiLinear, x: F64, path: str) -> F64:
    """Block k of the output = block k of the input · Weights[k] + Bias[k] (block-diagonal linear)."""
    b, n = x.shape[0], layer.block_num
    xb = x.reshape(b, n, layer.block_input_size)
    y = np.einsum("bni,nio->bno", xb, _f64(layer.weights)) + _f64(layer.bias)[None, :, :]
    return _f64(y).reshape(b, n * layer.block_output_size)


def _eval_relu(layer: ReLU, x: F64, path: str) -> F64:
    """y = FMath::Max(x, 0) = (x >= 0 ? x : 0)."""
    return np.where(x >= 0.0, x, 0.0)


def _eval_elu(layer: ELU, x: F64, path: str) -> F64:
    """y = x > 0 ? x : exp(x) − 1 (exact exponential; the engine approximates it)."""
    return np.where(x > 0.0, x, np.expm1(np.minimum(x, 0.0)))


def _eval_tanh(layer: TanH, x: F64, path: str) -> F64:
    """y = tanh(x)."""
    return np.tanh(x)


def _eval_gelu(layer: GELU, x: F64, path: str) -> F64:
    """y = x · sigmoid(1.702 x)."""
    return x * _sigmoid(GELU_SIGMOID_SCALE * x)


def _eval_copy(layer: Copy, x: F64, path: str) -> F64:
    """y = x."""
    return x.copy()


def _eval_softmax(layer: Softmax, x: F64, path: str) -> F64:
    """y = exp(x − max x) / Σ exp(x − max x) over the whole vector [INF: 5.8 source not seen]."""
    if x.shape[1] == 0:
        return x.copy()
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return _f64(e / e.sum(axis=1, keepdims=True))


def _eval_prelu(layer: PReLU, x: F64, path: str) -> F64:
    """y = x > 0 ? x : alpha · x."""
    return np.where(x > 0.0, x, _f64(layer.alpha) * x)


def _eval_clamp(layer: Clamp, x: F64, path: str) -> F64:
    """y = FMath::Clamp(x, min, max) = x < min ? min : (x < max ? x : max) (so min wins if min > max)."""
    lo, hi = _f64(layer.min), _f64(layer.max)
    return np.where(x < lo, lo, np.where(x < hi, x, hi))


def _eval_layer_norm(layer: LayerNorm, x: F64, path: str) -> F64:
    """y = (x − mean) / sqrt(var + epsilon) · scale + offset; var is the biased (1/N) variance."""
    mean = x.mean(axis=1, keepdims=True) if x.shape[1] else np.zeros((x.shape[0], 1))
    var = ((x - mean) ** 2).mean(axis=1, keepdims=True) if x.shape[1] else np.zeros((x.shape[0], 1))
    return _f64((x - mean) / np.sqrt(var + float(layer.epsilon)) * _f64(layer.scale) + _f64(layer.offset))


def _eval_tile(layer: Tile, x: F64, path: str) -> F64:
    """y = [x, x, …, x] (Repeats copies)."""
    return np.tile(x, (1, layer.repeats))


def _eval_slice(layer: Slice, x: F64, path: str) -> F64:
    """y = x[SliceOffset : SliceOffset + SliceSize]."""
    return x[:, layer.slice_offset : layer.slice_offset + layer.slice_size].copy()


# --------------------------------------------------------------------------------------------------
# Recurrent cells


def _eval_memory_cell(layer: MemoryCell, x: F64, path: str) -> F64:
    """Input [x (In) ‖ m (Mem)], output [y (Out) ‖ m' (Mem)]:

    r = σ(remember([x, m])), m' = (1 − r)·m + r·tanh(memory_update([x, m])),
    p = σ(passthrough([x, m])), y = (1 − p)·tanh(output_memory(m')) + p·tanh(output_input([x, m])).
    """
    n_in, n_out, n_mem = layer.input_size_, layer.output_size_, layer.memory_size
    memory = x[:, n_in : n_in + n_mem]
    remember = _sigmoid(_run(layer.remember_layer, x, n_mem, f"{path}.remember_layer"))
    update = np.tanh(_run(layer.memory_update_layer, x, n_mem, f"{path}.memory_update_layer"))
    new_memory = (1.0 - remember) * memory + remember * update
    passthrough = _sigmoid(_run(layer.passthrough_layer, x, n_out, f"{path}.passthrough_layer"))
    from_memory = np.tanh(_run(layer.output_memory_layer, new_memory, n_out, f"{path}.output_memory_layer"))
    from_input = np.tanh(_run(layer.output_input_layer, x, n_out, f"{path}.output_input_layer"))
    y = (1.0 - passthrough) * from_memory + passthrough * from_input
    return np.concatenate([y, new_memory], axis=1)


def _eval_gru_cell(layer: GRUCell, x: F64, path: str) -> F64:
    """Input [x (In) ‖ h (Out)], output [h' ‖ h'] (the engine writes the new state twice):

    r = σ(remember([x, h])), u = σ(update([x, h])), c = tanh(activation([x, r·h])), h' = (1 − u)·h + u·c.
    """
    n_in, n_out = layer.input_size_, layer.output_size_
    hidden = x[:, n_in : n_in + n_out]
    remember = _sigmoid(_run(layer.remember_layer, x, n_out, f"{path}.remember_layer"))
    update = _sigmoid(_run(layer.update_layer, x, n_out, f"{path}.update_layer"))
    masked = np.concatenate([x[:, :n_in], remember * hidden], axis=1)
    candidate = np.tanh(_run(layer.activation_layer, masked, n_out, f"{path}.activation_layer"))
    new_hidden = (1.0 - update) * hidden + update * candidate
    return np.concatenate([new_hidden, new_hidden], axis=1)


# --------------------------------------------------------------------------------------------------
# Attention aggregates


def _attend(q: F64, k: F64, v: F64, present: npt.NDArray[np.bool_], heads: int) -> F64:
    """The engine's attention pooling over N candidate elements per row.

    q, k: (B, N, H·A); v: (B, N, H·E); present: (B, N). Each element's score per head is its own
    query·key / sqrt(A); weights are a "softmax plus one" over the present elements with the maximum taken
    from 0 upwards: a = exp(s − m) / (Σ exp(s − m) + 1), m = max(0, max s). Output Σ a·v, (B, H·E).
    """
    b, n = present.shape
    if heads == 0:
        return np.zeros((b, 0))
    att_size, enc_size = q.shape[2] // heads, v.shape[2] // heads
    q4 = q.reshape(b, n, heads, att_size)
    k4 = k.reshape(b, n, heads, att_size)
    v4 = v.reshape(b, n, heads, enc_size)
    scores = (q4 * k4).sum(axis=3) / np.sqrt(float(att_size))
    mask = present[:, :, None]
    peak = np.max(np.where(mask, scores, 0.0), axis=1, initial=0.0)
    e = np.where(mask, np.exp(np.where(mask, scores, 0.0) - peak[:, None, :]), 0.0)
    weights = e / (e.sum(axis=1, keepdims=True) + 1.0)
    pooled = np.einsum("bnh,bnhe->bhe", weights, np.where(mask[..., None], v4, 0.0))
    return _f64(pooled).reshape(b, heads * enc_size)


def _eval_aggregate_set(layer: AggregateSet, x: F64, path: str) -> F64:
    """Input [MaxElementNum element vectors ‖ MaxElementNum mask], output [H·OES attention ‖ count/Max].

    The engine counts the non-zero mask entries and then takes the *first* ``count`` element slots (it
    assumes present elements are packed at the front, whatever the mask's positions). Each element goes
    through element_layer, then query/key (H·A) and value (H·OES) layers; see :func:`_attend`.
    """
    b, m, e_in = x.shape[0], layer.max_element_num, layer.element_input_size
    heads = layer.attention_head_num
    elements = x[:, : m * e_in].reshape(b, m, e_in)
    count = (x[:, m * e_in : m * e_in + m] != 0.0).sum(axis=1)
    present = np.arange(m)[None, :] < count[:, None]
    # Absent slots are zeroed before the sub-layers so that garbage there cannot produce inf/NaN.
    flat = np.where(present[:, :, None], elements, 0.0).reshape(b * m, e_in)
    act = _run(layer.element_layer, flat, layer.element_output_size, f"{path}.element_layer")
    att = heads * layer.attention_encoding_size
    q = _run(layer.query_layer, act, att, f"{path}.query_layer").reshape(b, m, att)
    k = _run(layer.key_layer, act, att, f"{path}.key_layer").reshape(b, m, att)
    val = heads * layer.output_encoding_size
    v = _run(layer.value_layer, act, val, f"{path}.value_layer").reshape(b, m, val)
    pooled = _attend(q, k, v, present, heads)
    # count / MaxElementNum in float (0/0 → NaN for a zero-size set, as in the engine).
    fraction = count.astype(np.float64)[:, None] / np.float64(m)
    return np.concatenate([pooled, fraction], axis=1)


def _eval_or_exclusive(layer: AggregateOrExclusive, x: F64, path: str) -> F64:
    """Input [sub-vector region (max InputSizes) ‖ n one-hot], output [OES encoding ‖ the one-hot].

    The row's branch is the first non-zero one-hot entry; its sub-layer reads the first InputSizes[i]
    columns, its encoder maps the result to OES. The one-hot is copied to the output unchanged.
    """
    n = len(layer.sub_layers)
    region = max(layer.input_sizes, default=0)
    one_hot = x[:, region : region + n]
    set_bits = one_hot != 0.0
    missing = np.flatnonzero(~set_bits.any(axis=1))
    if missing.size:
        raise NNEError(
            f"{path}: row {int(missing[0])} has no set bit in its one-hot (the engine asserts)",
            field=f"{path}.one_hot",
            expected="one non-zero entry",
            actual=one_hot[missing[0]].tolist(),
        )
    branch = set_bits.argmax(axis=1)
    out = np.zeros((x.shape[0], layer.output_encoding_size), dtype=np.float64)
    for i in range(n):
        rows = np.flatnonzero(branch == i)
        if rows.size == 0:
            continue
        sub_path = f"{path}.sub_layers[{i}]"
        hidden = _run(layer.sub_layers[i], x[rows, : layer.input_sizes[i]], layer.output_sizes[i], sub_path)
        enc_path = f"{path}.encoder_layers[{i}]"
        out[rows] = _run(layer.encoder_layers[i], hidden, layer.output_encoding_size, enc_path)
    return np.concatenate([out, one_hot], axis=1)


def _eval_or_inclusive(layer: AggregateOrInclusive, x: F64, path: str) -> F64:
    """Input [all sub-vectors (Σ InputSizes) ‖ n mask], output [H·OES attention ‖ the mask].

    Every present branch (non-zero mask entry) runs its sub-layer and its query/key/value layers; the
    elements are pooled with :func:`_attend`. The mask is copied to the output unchanged.
    """
    b, n = x.shape[0], len(layer.sub_layers)
    heads = layer.attention_head_num
    att = heads * layer.attention_encoding_size
    val = heads * layer.output_encoding_size
    total = sum(layer.input_sizes)
    mask = x[:, total : total + n]
    present = mask != 0.0
    q = np.zeros((b, n, att))
    k = np.zeros((b, n, att))
    v = np.zeros((b, n, val))
    offset = 0
    for i in range(n):
        rows = np.flatnonzero(present[:, i])
        n_in = layer.input_sizes[i]
        if rows.size:
            sub_path = f"{path}.sub_layers[{i}]"
            hidden = _run(
                layer.sub_layers[i], x[rows, offset : offset + n_in], layer.output_sizes[i], sub_path
            )
            q[rows, i] = _run(layer.query_layers[i], hidden, att, f"{path}.query_layers[{i}]")
            k[rows, i] = _run(layer.key_layers[i], hidden, att, f"{path}.key_layers[{i}]")
            v[rows, i] = _run(layer.value_layers[i], hidden, val, f"{path}.value_layers[{i}]")
        offset += n_in
    return np.concatenate([_attend(q, k, v, present, heads), mask], axis=1)


def _top_two(gates: F64) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """Indices of the best and second-best gate per row, ties to the lowest index (the engine's strict >)."""
    first = gates.argmax(axis=1)
    masked = gates.copy()
    masked[np.arange(gates.shape[0]), first] = -np.inf
    return first, masked.argmax(axis=1)


def _eval_sparse_moe(layer: SparseMixtureOfExperts, x: F64, path: str) -> F64:
    """Top-2 mixture: the gating layer writes one logit per expert; the two best experts run on the row
    and their outputs are mixed with a softmax over the two logits. Fewer than two experts is an error
    (the engine asserts)."""
    n = len(layer.expert_layers)
    if n < 2:
        raise NNEError(
            f"{path} needs at least two experts", field=f"{path}.expert_layers", expected=">= 2", actual=n
        )
    gates = _run(layer.gating_layer, x, n, f"{path}.gating_layer")
    first, second = _top_two(gates)
    rows = np.arange(x.shape[0])
    g0, g1 = gates[rows, first], gates[rows, second]
    top = np.maximum(g0, g1)
    e0, e1 = np.exp(g0 - top), np.exp(g1 - top)
    w0, w1 = e0 / (e0 + e1), e1 / (e0 + e1)
    out = np.zeros((x.shape[0], layer.output_size_))
    for i in range(n):
        picked = np.flatnonzero((first == i) | (second == i))
        if picked.size == 0:
            continue
        y = _run(layer.expert_layers[i], x[picked], layer.output_size_, f"{path}.expert_layers[{i}]")
        weight = np.where(first[picked] == i, w0[picked], w1[picked])
        out[picked] += weight[:, None] * y
    return out


def _eval_film(layer: FiLM, x: F64, path: str) -> F64:
    """prefix = P(x[:PrefixIn]); c = C(x[PrefixIn:]); y = postfix(prefix · c[:PrefixOut] + c[PrefixOut:2·PrefixOut])."""
    p_in, p_out = layer.prefix_input_size, layer.prefix_output_size
    if layer.condition_output_size < 2 * p_out:
        raise NNEError(
            f"{path}: the condition layer must write scale and shift for every prefix output",
            field=f"{path}.condition_output_size",
            expected=f">= {2 * p_out}",
            actual=layer.condition_output_size,
        )
    prefix = _run(layer.prefix_layer, x[:, :p_in], p_out, f"{path}.prefix_layer")
    cond_in = x[:, p_in : p_in + layer.condition_input_size]
    cond = _run(layer.condition_layer, cond_in, layer.condition_output_size, f"{path}.condition_layer")
    modulated = prefix * cond[:, :p_out] + cond[:, p_out : 2 * p_out]
    return _run(layer.postfix_layer, modulated, layer.postfix_output_size, f"{path}.postfix_layer")


# --------------------------------------------------------------------------------------------------
# Convolutions


def _eval_conv1d(layer: Conv1d, x: F64, path: str) -> F64:
    """The sub-layer runs first; its output is read channel-major [InChannels][InputLength] and convolved
    (cross-correlation, stride 1) with weights [Out][In][Kernel] plus a bias per output channel, padding
    ``Padding`` on both sides with zeros (mode 0) or wrap-around values (mode 1). Output [Out][OutLength].
    """
    c_in, c_out, k, pad, length = (
        layer.in_channels,
        layer.out_channels,
        layer.kernel_size,
        layer.padding,
        layer.input_length,
    )
    out_len = length + 2 * pad - k + 1
    if k < 1 or out_len < 1:
        raise NNEError(
            f"{path}: kernel larger than the padded input",
            field=f"{path}.kernel_size",
            expected=f"1..{length + 2 * pad}",
            actual=k,
        )
    z = _run(layer.layer, x, c_in * length, f"{path}.layer").reshape(x.shape[0], c_in, length)
    if layer.padding_mode == PADDING_ZEROS:
        padded = np.zeros((x.shape[0], c_in, length + 2 * pad))
        padded[:, :, pad : pad + length] = z
    elif layer.padding_mode == PADDING_CIRCULAR and length > 0:
        padded = z[:, :, (np.arange(length + 2 * pad) - pad) % length]
    else:
        raise NNEError(
            f"{path}: unsupported padding mode",
            field=f"{path}.padding_mode",
            expected="0 or 1",
            actual=layer.padding_mode,
        )
    w = _f64(layer.weights)  # (Out, In, Kernel)
    out = np.zeros((x.shape[0], c_out, out_len))
    for j in range(k):
        out += np.einsum("bcl,oc->bol", padded[:, :, j : j + out_len], w[:, :, j])
    out += _f64(layer.bias)[None, :, None]
    return out.reshape(x.shape[0], c_out * out_len)


def _eval_conv2d(layer: Conv2d, x: F64, path: str) -> F64:
    """The sub-layer runs first; its output is read as [InChannels][Height][Width] and convolved with
    weights [Out][In][K][K], stride ``Stride``, zero padding (the engine supports no other mode for 2-D).
    Output [Out][OutHeight][OutWidth].

    [INF] The engine's plain C++ fallback reads outside the input instead of padding when Padding > 0; the
    ISPC path that ships is not public. Zero padding is what the builder documents, so that is used here.
    """
    c_in, c_out, k, s, pad = (
        layer.in_channels,
        layer.out_channels,
        layer.kernel_size,
        layer.stride,
        layer.padding,
    )
    h, w_in = layer.input_height, layer.input_width
    if layer.padding_mode != PADDING_ZEROS:
        raise NNEError(
            f"{path}: Conv2d pads with zeros only",
            field=f"{path}.padding_mode",
            expected=0,
            actual=layer.padding_mode,
        )
    if s < 1 or k < 1 or h + 2 * pad < k or w_in + 2 * pad < k:
        raise NNEError(
            f"{path}: kernel/stride do not fit the padded input", field=f"{path}.kernel_size", actual=(k, s)
        )
    out_h, out_w = (h + 2 * pad - k) // s + 1, (w_in + 2 * pad - k) // s + 1
    z = _run(layer.layer, x, c_in * h * w_in, f"{path}.layer").reshape(x.shape[0], c_in, h, w_in)
    padded = np.zeros((x.shape[0], c_in, h + 2 * pad, w_in + 2 * pad))
    padded[:, :, pad : pad + h, pad : pad + w_in] = z
    weights = _f64(layer.weights)  # (Out, In, K, K)
    out = np.zeros((x.shape[0], c_out, out_h, out_w))
    for ky in range(k):
        for kx in range(k):
            window = padded[:, :, ky : ky + s * (out_h - 1) + 1 : s, kx : kx + s * (out_w - 1) + 1 : s]
            out += np.einsum("bchw,oc->bohw", window, weights[:, :, ky, kx])
    out += _f64(layer.bias)[None, :, None, None]
    return out.reshape(x.shape[0], c_out * out_h * out_w)


_EVALUATORS: dict[LayerType, Callable[[Any, F64, str], F64]] = {
    LayerType.SEQUENCE: _eval_sequence,
    LayerType.NORMALIZE: _eval_normalize,
    LayerType.DENORMALIZE: _eval_denormalize,
    LayerType.LINEAR: _eval_linear,
    LayerType.COMPRESSED_LINEAR: _eval_compressed_linear,
    LayerType.MULTI_LINEAR: _eval_multi_linear,
    LayerType.RELU: _eval_relu,
    LayerType.ELU: _eval_elu,
    LayerType.TANH: _eval_tanh,
    LayerType.PRELU: _eval_prelu,
    LayerType.MEMORY_CELL: _eval_memory_cell,
    LayerType.COPY: _eval_copy,
    LayerType.CONCAT: _eval_concat,
    LayerType.ARRAY: _eval_array,
    LayerType.AGGREGATE_SET: _eval_aggregate_set,
    LayerType.AGGREGATE_OR_EXCLUSIVE: _eval_or_exclusive,
    LayerType.AGGREGATE_OR_INCLUSIVE: _eval_or_inclusive,
    LayerType.CLAMP: _eval_clamp,
    LayerType.SPARSE_MIXTURE_OF_EXPERTS: _eval_sparse_moe,
    LayerType.GELU: _eval_gelu,
    LayerType.LAYER_NORM: _eval_layer_norm,
    LayerType.LIPSCHIZT_LINEAR: _eval_linear,
    LayerType.TILE: _eval_tile,
    LayerType.SPREAD: _eval_spread,
    LayerType.SLICE: _eval_slice,
    LayerType.RESIDUAL: _eval_residual,
    LayerType.FILM: _eval_film,
    LayerType.GRU_CELL: _eval_gru_cell,
    LayerType.CONV1D: _eval_conv1d,
    LayerType.CONV2D: _eval_conv2d,
    LayerType.SOFTMAX: _eval_softmax,
}
