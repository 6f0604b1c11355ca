"""Facts about the numpy NNE reference evaluator (protocol/nne/reference.py).

The module also holds the random layer/input factories (``SAMPLES``, ``sample_input``, ``random_tree``)
that tests/trainer/test_nne_torch.py reuses to check the torch modules against this oracle.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.errors import NNEError
from protocol.nne.layers import (
    ELU,
    GELU,
    AggregateOrExclusive,
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
    Layer,
    LayerNorm,
    LayerType,
    Linear,
    LipschiztLinear,
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
from protocol.nne.reference import dequantize_weights, evaluate, io_sizes
from tests.support.nne import (
    F32,
    SAMPLES,
    _aggregate_set,
    _gru,
    _memory_cell,
    _or_exclusive,
    _or_inclusive,
    f32,
    linear,
    random_tree,
    sample_input,
)

# --------------------------------------------------------------------------------------------------
# Factories (shared with the torch tests)


def one(layer: Layer, *rows: npt.ArrayLike) -> F32:
    """Evaluate on the given rows and return the output as a float32 array."""
    return evaluate(layer, np.array(rows, dtype=np.float32))


# --------------------------------------------------------------------------------------------------
# Every layer type


def test_samples_cover_every_layer_type_but_invalid() -> None:
    assert set(SAMPLES) == set(LayerType) - {LayerType.INVALID}


@pytest.mark.parametrize("kind", sorted(SAMPLES), ids=lambda k: LayerType(k).name)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_type_evaluates_to_the_engine_width_in_float32(kind: LayerType, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for n in (1, 2, 5):
        layer = SAMPLES[kind](rng, n)
        for batch in (0, 1, 7):
            y = evaluate(layer, sample_input(layer, rng, batch))
            assert y.dtype == np.float32
            assert y.shape == (batch, layer.output_size)
            assert np.isfinite(y).all()


@pytest.mark.parametrize("kind", sorted(SAMPLES), ids=lambda k: LayerType(k).name)
def test_rows_are_evaluated_independently(kind: LayerType) -> None:
    """The engine evaluates every batch row on its own: evaluating row by row gives the same rows."""
    rng = np.random.default_rng(7)
    layer = SAMPLES[kind](rng, 3)
    x = sample_input(layer, rng, 6)
    whole = evaluate(layer, x)
    for i in range(6):
        np.testing.assert_allclose(evaluate(layer, x[i : i + 1])[0], whole[i], rtol=1e-6, atol=1e-7)


# --------------------------------------------------------------------------------------------------
# Widths


@pytest.mark.parametrize("kind", sorted(SAMPLES), ids=lambda k: LayerType(k).name)
def test_io_sizes_are_the_layer_widths(kind: LayerType) -> None:
    layer = SAMPLES[kind](np.random.default_rng(0), 4)
    assert io_sizes(layer) == (layer.input_size, layer.output_size)


def test_engine_widths_of_the_composite_types() -> None:
    """The six types whose widths are not the plain sum of their parts, as the engine computes them."""
    rng = np.random.default_rng(0)
    s = _aggregate_set(rng, 5)  # M=4, Ein=5, H=2, OES=2
    ex = _or_exclusive(rng, 5)  # InputSizes (5, 2, 6), OES=2
    inc = _or_inclusive(rng, 5)  # InputSizes (5, 2, 3), H=2, OES=3
    gru = _gru(rng, 5)  # In 5, Out 3
    c1 = Conv1d(5, 2, 3, 3, 1, 0, f32(rng, 3, 2, 3), f32(rng, 3), linear(rng, 4, 10))
    c2 = Conv2d(4, 5, 2, 3, 3, 2, 1, 0, f32(rng, 3, 2, 3, 3), f32(rng, 3), linear(rng, 7, 40))
    expected: list[tuple[Layer, tuple[int, int]]] = [
        (s, (4 * 5 + 4, 2 * 2 + 1)),
        (ex, (6 + 3, 2 + 3)),
        (inc, (10 + 3, 6 + 3)),
        (gru, (8, 6)),
        (c1, (4, 3 * 5)),
        (c2, (7, 3 * 2 * 3)),
        (Sequence((Copy(8), gru)), (8, 6)),  # a Sequence takes its last layer's width
    ]
    for layer, widths in expected:
        assert (layer.input_size, layer.output_size) == widths
        assert io_sizes(layer) == widths
        assert evaluate(layer, sample_input(layer, rng, 2)).shape == (2, widths[1])


# --------------------------------------------------------------------------------------------------
# Closed-form facts: affine and element-wise layers


def test_linear_is_x_times_w_plus_b() -> None:
    w = np.array([[1, 2], [3, 4], [5, 6]], dtype=np.float32)
    layer = Linear(3, 2, np.array([0.5, -1], dtype=np.float32), w)
    np.testing.assert_array_equal(one(layer, [1, 0, -1], [0, 1, 0]), [[-3.5, -5.0], [3.5, 3.0]])


def test_lipschizt_linear_uses_the_stored_weights_as_a_linear() -> None:
    rng = np.random.default_rng(3)
    lin = linear(rng, 4, 3)
    lip = LipschiztLinear(4, 3, lin.bias, lin.weights)
    x = f32(rng, 5, 4)
    np.testing.assert_array_equal(evaluate(lip, x), evaluate(lin, x))


def test_compressed_linear_dequantises_scale_times_code_plus_offset() -> None:
    # W[0] = (-0.5, 0.5), W[1] = (2, 2 + 3 * 65535 / 65535) = (2, 5): no extra 1/65535 factor.
    codes = np.array([[0, 65535], [0, 65535]], dtype=np.uint16)
    layer = CompressedLinear(
        2, 2,
        np.array([-0.5, 2.0], dtype=np.float32), np.array([1 / 65535, 3 / 65535], dtype=np.float32),
        np.array([0.0, 1.0], dtype=np.float32), codes,
    )  # fmt: skip
    np.testing.assert_allclose(dequantize_weights(layer), [[-0.5, 0.5], [2.0, 5.0]], rtol=1e-6)
    expected = np.array([[-0.5, 1.5], [2.0, 6.0], [-3.0, -3.0]])
    np.testing.assert_allclose(one(layer, [1, 0], [0, 1], [2, -1]), expected, rtol=1e-6)


def test_multi_linear_is_a_block_diagonal_linear() -> None:
    rng = np.random.default_rng(4)
    layer = MultiLinear(3, 2, 4, f32(rng, 3, 4), f32(rng, 3, 2, 4))
    w = np.zeros((6, 12), dtype=np.float32)
    for k in range(3):
        w[2 * k : 2 * k + 2, 4 * k : 4 * k + 4] = layer.weights[k]
    dense = Linear(6, 12, layer.bias.reshape(-1), w)
    x = f32(rng, 5, 6)
    np.testing.assert_allclose(evaluate(layer, x), evaluate(dense, x), rtol=1e-6, atol=1e-6)


def test_normalize_and_denormalize_are_inverses() -> None:
    rng = np.random.default_rng(5)
    mean, std = f32(rng, 4), rng.uniform(0.5, 2, 4).astype(np.float32)
    x = f32(rng, 8, 4)
    there = evaluate(Denormalize(4, mean, std), x)
    np.testing.assert_allclose(there, x * std + mean, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(evaluate(Normalize(4, mean, std), there), x, rtol=1e-5, atol=1e-6)


def test_denormalize_with_inverse_statistics_standardises() -> None:
    """Spec §6.3: mean = −μ/σ, std = 1/σ in a Denormalize implements (x − μ)/σ."""
    mu, sigma = np.float32(3.0), np.float32(2.0)
    layer = Denormalize(1, np.array([-mu / sigma], np.float32), np.array([1 / sigma], np.float32))
    np.testing.assert_allclose(one(layer, [7.0], [3.0]), [[2.0], [0.0]], atol=1e-6)


def test_activations_at_known_points() -> None:
    xs = [-2.0, -1.0, 0.0, 1.0, 3.0]
    np.testing.assert_array_equal(one(ReLU(5), xs), [[0, 0, 0, 1, 3]])
    np.testing.assert_allclose(one(ELU(5), xs), [[math.exp(-2) - 1, math.exp(-1) - 1, 0, 1, 3]], rtol=1e-6)
    np.testing.assert_allclose(one(TanH(5), xs), [[math.tanh(v) for v in xs]], rtol=1e-6)
    gelu = [v / (1 + math.exp(-1.702 * v)) for v in xs]
    np.testing.assert_allclose(one(GELU(5), xs), [gelu], rtol=1e-6)
    assert one(GELU(1), [1.0])[0, 0] == np.float32(1 / (1 + math.exp(-1.702)))
    np.testing.assert_array_equal(one(Copy(5), xs), [xs])


def test_extreme_inputs_stay_finite_where_the_math_is() -> None:
    big = [-1e30, -100.0, 100.0, 1e30]
    assert np.isfinite(one(GELU(4), big)).all()
    np.testing.assert_array_equal(one(ELU(4), big), np.array([[-1, -1, 100, 1e30]], np.float32))
    np.testing.assert_allclose(one(Softmax(3), [1000.0, 1000.0, -1000.0]), [[0.5, 0.5, 0.0]])


def test_softmax_over_the_whole_vector() -> None:
    np.testing.assert_allclose(one(Softmax(2), [0.0, math.log(2)]), [[1 / 3, 2 / 3]], rtol=1e-6)
    y = evaluate(Softmax(6), f32(np.random.default_rng(0), 4, 6))
    np.testing.assert_allclose(y.sum(axis=1), 1.0, rtol=1e-6)


def test_prelu_scales_only_positive_side_through() -> None:
    layer = PReLU(3, np.array([0.1, 0.2, 0.3], np.float32))
    np.testing.assert_allclose(one(layer, [-1, 2, -3]), [[-0.1, 2, -0.9]], rtol=1e-6)


def test_clamp_follows_fmath_clamp_including_min_above_max() -> None:
    layer = Clamp(3, np.array([-1, -1, 2], np.float32), np.array([1, 1, -2], np.float32))
    # FMath::Clamp: x < min ? min : (x < max ? x : max); with min 2 > max −2 a small x gives min.
    np.testing.assert_array_equal(one(layer, [-5, 0.5, 0], [5, 0, 5]), [[-1, 0.5, 2], [1, 0, -2]])


def test_layer_norm_uses_the_biased_variance() -> None:
    layer = LayerNorm(4, np.zeros(4, np.float32), np.ones(4, np.float32), 0.0)
    y = one(layer, [1, 2, 3, 4])
    expected = (np.array([1, 2, 3, 4]) - 2.5) / math.sqrt(1.25)
    np.testing.assert_allclose(y, [expected], rtol=1e-6)
    affine = LayerNorm(2, np.array([1, 2], np.float32), np.array([3, 4], np.float32), 1e-5)
    np.testing.assert_allclose(
        one(affine, [0, 2]), [[1 - 3 / math.sqrt(1 + 1e-5), 2 + 4 / math.sqrt(1 + 1e-5)]], rtol=1e-6
    )


# --------------------------------------------------------------------------------------------------
# Closed-form facts: shape layers and containers


def test_concat_splits_by_input_sizes() -> None:
    layer = Concat((2, 3), (2, 1), (Copy(2), Slice(3, 1, 1)))
    np.testing.assert_array_equal(one(layer, [0, 1, 2, 3, 4]), [[0, 1, 3]])


def test_array_applies_the_shared_layer_to_each_slice() -> None:
    layer = Array(3, 2, 1, Slice(2, 1, 1))
    np.testing.assert_array_equal(one(layer, [0, 1, 2, 3, 4, 5]), [[1, 3, 5]])
    scaled = Array(2, 2, 2, Denormalize(2, np.array([10, 20], np.float32), np.array([1, 2], np.float32)))
    np.testing.assert_array_equal(one(scaled, [0, 1, 2, 3]), [[10, 22, 12, 26]])


def test_tile_spread_slice_residual() -> None:
    np.testing.assert_array_equal(one(Tile(3, 2), [0, 1, 2]), [[0, 1, 2, 0, 1, 2]])
    spread = Spread(3, (3, 1), (Copy(3), Slice(3, 2, 1)))
    np.testing.assert_array_equal(one(spread, [0, 1, 2]), [[0, 1, 2, 2]])
    np.testing.assert_array_equal(one(Slice(4, 1, 2), [0, 1, 2, 3]), [[1, 2]])
    np.testing.assert_array_equal(one(Residual(2, Copy(2)), [1, -3]), [[2, -6]])


def test_sequence_chains() -> None:
    layer = Sequence(
        (Tile(1, 3), Denormalize(3, np.arange(3, dtype=np.float32), np.full(3, 2, np.float32)), ReLU(3))
    )
    np.testing.assert_array_equal(one(layer, [-1.0], [1.0]), [[0, 0, 0], [2, 3, 4]])


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 4), min_size=1, max_size=5),
    element_num=st.integers(0, 4),
    element_size=st.integers(0, 3),
    batch=st.integers(0, 3),
)
def test_containers_of_copies_are_identities(
    sizes: list[int], element_num: int, element_size: int, batch: int
) -> None:
    """Invariant: a Concat of Copy layers (any split) and an Array of Copy (any shape) are the identity."""
    concat = Concat(tuple(sizes), tuple(sizes), tuple(Copy(s) for s in sizes))
    x = np.arange(batch * sum(sizes), dtype=np.float32).reshape(batch, sum(sizes))
    np.testing.assert_array_equal(evaluate(concat, x), x)
    array = Array(element_num, element_size, element_size, Copy(element_size))
    xa = np.arange(batch * element_num * element_size, dtype=np.float32).reshape(
        batch, element_num * element_size
    )
    np.testing.assert_array_equal(evaluate(array, xa), xa)


# --------------------------------------------------------------------------------------------------
# Closed-form facts: cells


def _sig(z: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    return np.asarray(1 / (1 + np.exp(-z)), dtype=np.float64)


def _ev(layer: Layer, v: npt.ArrayLike) -> npt.NDArray[np.float64]:
    return evaluate(layer, np.asarray(v, dtype=np.float32)).astype(np.float64)


def test_memory_cell_gates() -> None:
    rng = np.random.default_rng(8)
    cell = _memory_cell(rng, 4)  # In 4, Out 2, Mem 3
    x = f32(rng, 5, 7)
    e = _ev
    r = _sig(e(cell.remember_layer, x))
    m_new = (1 - r) * x[:, 4:] + r * np.tanh(e(cell.memory_update_layer, x))
    p = _sig(e(cell.passthrough_layer, x))
    y = (1 - p) * np.tanh(e(cell.output_memory_layer, m_new.astype(np.float32))) + p * np.tanh(
        e(cell.output_input_layer, x)
    )
    np.testing.assert_allclose(evaluate(cell, x), np.concatenate([y, m_new], axis=1), rtol=1e-5, atol=1e-6)


def test_gru_cell_writes_the_new_state_twice() -> None:
    rng = np.random.default_rng(9)
    cell = _gru(rng, 2)  # In 2, Out 3
    x = f32(rng, 6, 5)
    y = evaluate(cell, x)
    np.testing.assert_array_equal(y[:, :3], y[:, 3:])
    e = _ev
    h = x[:, 2:].astype(np.float64)
    r, u = _sig(e(cell.remember_layer, x)), _sig(e(cell.update_layer, x))
    masked = np.concatenate([x[:, :2], r * h], axis=1).astype(np.float32)
    h_new = (1 - u) * h + u * np.tanh(e(cell.activation_layer, masked))
    np.testing.assert_allclose(y[:, :3], h_new, rtol=1e-5, atol=1e-6)


def test_film_modulates_the_prefix() -> None:
    layer = FiLM(1, 1, 1, 2, 1, 1, Copy(1), Tile(1, 2), Copy(1))
    # prefix = x0; condition = [x1, x1]; y = x0 * x1 + x1.
    np.testing.assert_array_equal(one(layer, [3, 2], [-1, 4]), [[8], [0]])


def test_film_needs_scale_and_shift() -> None:
    layer = FiLM(1, 2, 1, 3, 2, 2, Tile(1, 2), Tile(1, 3), Copy(2))
    with pytest.raises(NNEError, match="scale and shift"):
        one(layer, [1, 2])


# --------------------------------------------------------------------------------------------------
# Closed-form facts: aggregates and mixtures


def test_aggregate_set_uses_the_first_count_slots_and_appends_the_fraction() -> None:
    rng = np.random.default_rng(10)
    layer = _aggregate_set(rng, 2)  # M = 4, Ein = 2
    x = f32(rng, 1, 12)
    x[0, 8:] = [0, 1, 0, 1]  # two elements present → slots 0 and 1 are used
    moved = x.copy()
    moved[0, 8:] = [1, 1, 0, 0]
    garbage = x.copy()
    garbage[0, 4:8] = 1e6  # slots 2 and 3 are not read
    y = evaluate(layer, x)
    assert y[0, -1] == np.float32(0.5)
    np.testing.assert_array_equal(evaluate(layer, moved), y)
    np.testing.assert_array_equal(evaluate(layer, garbage), y)
    empty = x.copy()
    empty[0, 8:] = 0
    np.testing.assert_array_equal(evaluate(layer, empty), np.zeros((1, 5), np.float32))


def test_aggregate_set_softmax_plus_one_for_a_single_element() -> None:
    # One head, one-wide attention: query = key = e, value = e, so s = e² / sqrt(1) and the weight is
    # exp(s − max(0, s)) / (exp(s − max(0, s)) + 1).
    one_by_one = Linear(1, 1, np.zeros(1, np.float32), np.ones((1, 1), np.float32))
    layer = AggregateSet(2, 1, 1, 1, 1, 1, Copy(1), one_by_one, one_by_one, one_by_one)
    for e in (-0.5, 0.3, 2.0):
        s = e * e
        a = math.exp(s - max(0.0, s)) / (math.exp(s - max(0.0, s)) + 1)
        np.testing.assert_allclose(one(layer, [e, 9.0, 1, 0]), [[a * e, 0.5]], rtol=1e-6)


def test_or_exclusive_picks_the_first_set_bit_and_copies_the_one_hot() -> None:
    layer = AggregateOrExclusive(
        1,
        (1, 2),
        (1, 1),
        (Copy(1), Slice(2, 1, 1)),
        (Tile(1, 1), Denormalize(1, np.ones(1, np.float32), np.ones(1, np.float32))),
    )
    # Region = max(1, 2) = 2 columns, then the 2-wide one-hot.
    np.testing.assert_array_equal(
        one(layer, [5, 7, 1, 0], [5, 7, 0, 1], [5, 7, 0, 3]), [[5, 1, 0], [8, 0, 1], [8, 0, 3]]
    )
    np.testing.assert_array_equal(one(layer, [5, 7, 2, 1]), [[5, 2, 1]])  # first set bit wins
    with pytest.raises(NNEError, match="no set bit"):
        one(layer, [5, 7, 0, 0])


def test_or_inclusive_pools_present_branches_and_copies_the_mask() -> None:
    rng = np.random.default_rng(11)
    layer = _or_inclusive(rng, 2)  # InputSizes (2, 2, 3), H·OES = 6
    x = f32(rng, 1, 10)
    x[0, 7:] = [1, 0, 1]
    y = evaluate(layer, x)
    np.testing.assert_array_equal(y[0, 6:], [1, 0, 1])
    changed = x.copy()
    changed[0, 2:4] = 1e6  # branch 1 is absent: its inputs are not read
    np.testing.assert_array_equal(evaluate(layer, changed), y)
    x[0, 7:] = 0
    np.testing.assert_array_equal(evaluate(layer, x)[0, :6], np.zeros(6))


def test_sparse_moe_mixes_the_two_best_experts_with_a_two_way_softmax() -> None:
    experts = tuple(
        Denormalize(1, np.array([10.0 * i], np.float32), np.ones(1, np.float32)) for i in range(3)
    )
    gating = Linear(1, 3, np.array([0.0, 1.0, 2.0], np.float32), np.zeros((1, 3), np.float32))
    layer = SparseMixtureOfExperts(1, 1, gating, experts)
    # Best experts 2 (logit 2) and 1 (logit 1): w = softmax(2, 1).
    w2 = 1 / (1 + math.exp(-1))
    np.testing.assert_allclose(one(layer, [0.5]), [[w2 * 20.5 + (1 - w2) * 10.5]], rtol=1e-6)


def test_sparse_moe_ties_go_to_the_lowest_indices() -> None:
    experts = tuple(
        Denormalize(1, np.array([10.0 * i], np.float32), np.ones(1, np.float32)) for i in range(3)
    )
    gating = Linear(1, 3, np.zeros(3, np.float32), np.zeros((1, 3), np.float32))
    layer = SparseMixtureOfExperts(1, 1, gating, experts)
    np.testing.assert_allclose(one(layer, [0.0]), [[0.5 * 0 + 0.5 * 10]], rtol=1e-6)  # experts 0 and 1


def test_sparse_moe_needs_two_experts() -> None:
    layer = SparseMixtureOfExperts(
        1, 1, Linear(1, 1, np.zeros(1, np.float32), np.zeros((1, 1), np.float32)), (Copy(1),)
    )
    with pytest.raises(NNEError, match="two experts"):
        one(layer, [1.0])


# --------------------------------------------------------------------------------------------------
# Convolutions against the engine's loops written out


def _conv1d_loops(layer: Conv1d, z: F32) -> npt.NDArray[np.float64]:
    c_in, c_out, k, pad, length = (
        layer.in_channels,
        layer.out_channels,
        layer.kernel_size,
        layer.padding,
        layer.input_length,
    )
    w = layer.weights.reshape(-1)  # flat [Out][In][K]
    out_len = length + 2 * pad - k + 1
    out = np.zeros((z.shape[0], c_out * out_len))
    for b in range(z.shape[0]):
        for o in range(c_out):
            for t in range(out_len):
                acc = float(layer.bias[o])
                for c in range(c_in):
                    for j in range(k):
                        idx = t + j - pad
                        if layer.padding_mode == 1:
                            idx %= length
                            val = z[b, c * length + idx]
                        else:
                            val = z[b, c * length + idx] if 0 <= idx < length else 0.0
                        acc += val * w[o * c_in * k + c * k + j]
                out[b, o * out_len + t] = acc
    return out


@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize("pad", [0, 1, 2, 6])
def test_conv1d_matches_the_engine_loop(mode: int, pad: int) -> None:
    rng = np.random.default_rng(12 + pad)
    c_in, length, c_out, k = 2, 4, 3, 3
    layer = Conv1d(
        length, c_in, c_out, k, pad, mode, f32(rng, c_out, c_in, k), f32(rng, c_out), Copy(c_in * length)
    )
    z = f32(rng, 3, c_in * length)
    np.testing.assert_allclose(evaluate(layer, z), _conv1d_loops(layer, z), rtol=1e-5, atol=1e-6)


def test_conv1d_runs_its_sub_layer_first() -> None:
    rng = np.random.default_rng(13)
    sub = linear(rng, 3, 8)
    layer = Conv1d(4, 2, 1, 1, 0, 0, np.ones((1, 2, 1), np.float32), np.zeros(1, np.float32), sub)
    x = f32(rng, 2, 3)
    z = evaluate(sub, x)
    np.testing.assert_allclose(evaluate(layer, x), z[:, :4] + z[:, 4:], rtol=1e-6)


def test_conv2d_matches_the_engine_loop_with_stride_and_zero_padding() -> None:
    rng = np.random.default_rng(14)
    c_in, h, w_in, c_out, k, s, pad = 2, 5, 4, 2, 3, 2, 1
    layer = Conv2d(
        h,
        w_in,
        c_in,
        c_out,
        k,
        s,
        pad,
        0,
        f32(rng, c_out, c_in, k, k),
        f32(rng, c_out),
        Copy(c_in * h * w_in),
    )
    z = f32(rng, 2, c_in * h * w_in)
    w = layer.weights.reshape(-1)
    out_h, out_w = (h + 2 * pad - k) // s + 1, (w_in + 2 * pad - k) // s + 1
    expected = np.zeros((2, c_out * out_h * out_w))
    for b in range(2):
        for o in range(c_out):
            for oy in range(out_h):
                for ox in range(out_w):
                    acc = float(layer.bias[o])
                    for c in range(c_in):
                        for ky in range(k):
                            for kx in range(k):
                                y, xx = oy * s + ky - pad, ox * s + kx - pad
                                if 0 <= y < h and 0 <= xx < w_in:
                                    acc += (
                                        z[b, c * h * w_in + y * w_in + xx]
                                        * w[((o * c_in + c) * k + ky) * k + kx]
                                    )
                    expected[b, (o * out_h + oy) * out_w + ox] = acc
    np.testing.assert_allclose(evaluate(layer, z), expected, rtol=1e-5, atol=1e-6)


def test_conv_configurations_the_engine_rejects_raise() -> None:
    rng = np.random.default_rng(15)
    bad_mode = Conv1d(4, 1, 1, 3, 0, 2, f32(rng, 1, 1, 3), f32(rng, 1), Copy(4))
    too_wide = Conv1d(2, 1, 1, 5, 0, 0, f32(rng, 1, 1, 5), f32(rng, 1), Copy(2))
    circular_2d = Conv2d(3, 3, 1, 1, 1, 1, 0, 1, f32(rng, 1, 1, 1, 1), f32(rng, 1), Copy(9))
    stride_zero = Conv2d(3, 3, 1, 1, 1, 0, 0, 0, f32(rng, 1, 1, 1, 1), f32(rng, 1), Copy(9))
    for layer in (bad_mode, too_wide, circular_2d, stride_zero):
        with pytest.raises(NNEError):
            evaluate(layer, np.zeros((1, layer.input_size), np.float32))


# --------------------------------------------------------------------------------------------------
# Bad input


@pytest.mark.parametrize("delta", [-1, 1])
def test_wrong_width_raises(delta: int) -> None:
    layer = SAMPLES[LayerType.SEQUENCE](np.random.default_rng(0), 3)
    with pytest.raises(NNEError) as info:
        evaluate(layer, np.zeros((2, 3 + delta), np.float32))
    assert info.value.expected == 3
    assert info.value.actual == 3 + delta


def test_wrong_rank_or_dtype_raises() -> None:
    layer = Copy(3)
    with pytest.raises(NNEError):
        evaluate(layer, np.zeros(3, np.float32))
    with pytest.raises(NNEError):
        evaluate(layer, np.zeros((1, 1, 3), np.float32))
    with pytest.raises(NNEError):
        evaluate(layer, np.zeros((1, 3), np.int32))


def test_sub_layer_with_a_width_the_parent_does_not_expect_raises() -> None:
    """Aggregate layers do not validate their sub-layers on construction; evaluation names the culprit."""
    layer = AggregateSet(2, 1, 1, 1, 1, 1, Copy(1), Copy(1), Copy(1), Copy(2))
    with pytest.raises(NNEError, match="value_layer"):
        one(layer, [1, 1, 1, 1])


def test_float64_input_is_rounded_to_float32_first() -> None:
    x64 = np.array([[1 + 1e-12]], dtype=np.float64)
    assert evaluate(Copy(1), x64)[0, 0] == np.float32(1)


@settings(max_examples=100, deadline=None)
@given(width=st.integers(0, 12), batch=st.integers(0, 3))
def test_any_width_but_the_right_one_raises_nne_error(width: int, batch: int) -> None:
    """Invariant: evaluate either returns (B, Out) or raises NNEError; nothing else escapes."""
    layer = SAMPLES[LayerType.CONCAT](np.random.default_rng(1), 3)  # reads 5 columns
    x = np.ones((batch, width), np.float32)
    if width == 5:
        assert evaluate(layer, x).shape == (batch, 7)
    else:
        with pytest.raises(NNEError):
            evaluate(layer, x)


@pytest.mark.parametrize("seed", range(4))
def test_random_nested_trees_evaluate(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    tree = random_tree(rng, 4, 3)
    y = evaluate(tree, f32(rng, 5, 4))
    assert y.shape == (5, tree.output_size)
    assert np.isfinite(y).all()
