"""Facts about the torch twins of the NNE layers (trainer/training/nne_torch/), checked against the numpy oracle."""

from __future__ import annotations

import copy
import dataclasses
import math

import numpy as np
import numpy.typing as npt
import pytest
import torch
from torch import nn

from protocol.errors import NNEError
from protocol.nne.layers import (
    ELU,
    Array,
    CompressedLinear,
    Concat,
    Copy,
    Denormalize,
    Layer,
    LayerType,
    Linear,
    LipschiztLinear,
    Normalize,
    Sequence,
    TanH,
)
from protocol.nne.layout import children
from protocol.nne.reference import dequantize_weights, evaluate
from tests.support.nne import MASKED_TYPES, SAMPLES, f32, linear, random_tree, sample_input
from trainer.training.nne_torch import (
    MODULE_FACTORIES,
    CompressedLinearModule,
    LinearModule,
    NNEModule,
    from_torch,
    iter_linear_layers,
    quantize_weights,
    to_torch,
)
from trainer.training.nne_torch.base import ModuleBuilder
from trainer.training.nne_torch.basic import BASIC_MODULES
from trainer.training.nne_torch.composite import COMPOSITE_MODULES

ATOL = RTOL = 1e-5


def forward(module: nn.Module, x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    with torch.no_grad():
        y: torch.Tensor = module(torch.from_numpy(x))
    return y.numpy()


def assert_close(
    actual: npt.NDArray[np.float32], expected: npt.NDArray[np.float32], tol: float = ATOL
) -> None:
    """|actual − expected| <= tol + tol · |expected| element-wise (absolute plus relative)."""
    assert actual.shape == expected.shape
    np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol)


def assert_identical(a: object, b: object, path: str = "layer") -> None:
    """Layer trees equal field by field; arrays with the same dtype, shape and bits."""
    assert type(a) is type(b), path
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray)
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert a.tobytes() == b.tobytes(), path
    elif dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            assert_identical(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")
    elif isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_identical(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


def all_modules(module: NNEModule) -> list[NNEModule]:
    out = [module]
    for child in module.nne_children():
        out.extend(all_modules(child))
    return out


def all_layers(layer: Layer) -> list[Layer]:
    out = [layer]
    for child in children(layer):
        out.extend(all_layers(child))
    return out


KINDS = sorted(SAMPLES)
IDS = [LayerType(k).name for k in KINDS]


# --------------------------------------------------------------------------------------------------
# Forward agrees with the oracle


@pytest.mark.parametrize("kind", KINDS, ids=IDS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_forward_matches_the_numpy_reference(kind: LayerType, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for n in (1, 3, 6):
        layer = SAMPLES[kind](rng, n)
        module = to_torch(layer)
        for batch in (1, 9):
            x = sample_input(layer, rng, batch)
            assert_close(forward(module, x), evaluate(layer, x))


@pytest.mark.parametrize("kind", KINDS, ids=IDS)
def test_modules_carry_the_engine_widths(kind: LayerType) -> None:
    layer = SAMPLES[kind](np.random.default_rng(0), 4)
    module = to_torch(layer)
    for m, sub in zip(all_modules(module), all_layers(layer), strict=True):
        assert m.layer_type == sub.type_id
        assert (m.input_size, m.output_size) == (sub.input_size, sub.output_size)
    assert forward(module, sample_input(layer, np.random.default_rng(1), 0)).shape == (0, layer.output_size)


@pytest.mark.parametrize("seed", range(8))
def test_nested_trees_match_the_numpy_reference(seed: int) -> None:
    rng = np.random.default_rng(200 + seed)
    tree = random_tree(rng, int(rng.integers(2, 6)), 3)
    x = f32(rng, 7, tree.input_size)
    assert_close(forward(to_torch(tree), x), evaluate(tree, x))


def test_every_type_nests_inside_containers() -> None:
    """Sequence(Concat(Array(Sequence(layer)), layer)) for every type that reads no mask or one-hot."""
    rng = np.random.default_rng(300)
    for kind in KINDS:
        layer = SAMPLES[kind](rng, 2)
        n_in, n_out = layer.input_size, layer.output_size
        if kind in MASKED_TYPES:
            continue
        element = Sequence((layer, TanH(n_out)))
        array = Array(2, n_in, n_out, element)
        # The same value twice: Conv samples draw their padding and stride, so a fresh draw may differ in width.
        concat = Concat((2 * n_in, n_in), (2 * n_out, n_out), (array, layer))
        tree = Sequence((concat, linear(rng, 3 * n_out, 2)))
        x = f32(rng, 5, 3 * n_in)
        assert_close(forward(to_torch(tree), x), evaluate(tree, x))


def test_flow_matching_denoiser_shape() -> None:
    """Spec §10.1: Sequence[Sequence[Linear, act, Linear, act, Linear], Denormalize] runs and matches."""
    rng = np.random.default_rng(400)
    obs, act, hidden = 5, 3, 16
    mlp = Sequence(
        (
            linear(rng, obs + act + 1, hidden),
            ELU(hidden),
            linear(rng, hidden, hidden),
            ELU(hidden),
            linear(rng, hidden, act),
        )
    )
    denoiser = Sequence((mlp, Denormalize(act, np.zeros(act, np.float32), np.ones(act, np.float32))))
    module = to_torch(denoiser)
    x = f32(rng, 64, obs + act + 1)
    assert_close(forward(module, x), evaluate(denoiser, x))
    linears = list(iter_linear_layers(module))
    assert [tuple(m.weight.shape) for m in linears] == [
        (hidden, obs + act + 1),
        (hidden, hidden),
        (act, hidden),
    ]
    first = mlp.layers[0]
    assert isinstance(first, Linear)
    np.testing.assert_array_equal(linears[0].weight.detach().numpy(), first.weights.T)


def test_iter_linear_layers_yields_linear_layers_in_serialisation_order_only() -> None:
    rng = np.random.default_rng(401)
    a, b, c = linear(rng, 2, 2), linear(rng, 2, 3), linear(rng, 5, 1)
    lip = LipschiztLinear(2, 2, f32(rng, 2), f32(rng, 2, 2))
    tree = Sequence((Concat((2, 2), (2, 3), (Sequence((a, lip)), b)), c))
    found = list(iter_linear_layers(to_torch(tree)))
    assert all(isinstance(m, LinearModule) for m in found)
    assert [m.weights_in_engine_layout().tobytes() for m in found] == [x.weights.tobytes() for x in (a, b, c)]


# --------------------------------------------------------------------------------------------------
# Round trips and write-back


@pytest.mark.parametrize("kind", KINDS, ids=IDS)
def test_round_trip_is_bitwise(kind: LayerType) -> None:
    for seed in range(3):
        layer = SAMPLES[kind](np.random.default_rng(seed), 3)
        assert_identical(from_torch(to_torch(layer), layer), layer)
        assert_identical(from_torch(to_torch(layer, trainable_normalization=True), layer), layer)


@pytest.mark.parametrize("seed", range(4))
def test_nested_round_trip_is_bitwise(seed: int) -> None:
    tree = random_tree(np.random.default_rng(500 + seed), 4, 3)
    assert_identical(from_torch(to_torch(tree), tree), tree)


def test_module_and_layer_share_no_memory() -> None:
    rng = np.random.default_rng(600)
    layer = linear(rng, 3, 2)
    before = layer.weights.copy()
    module = to_torch(layer)
    assert isinstance(module, LinearModule)
    rebuilt = from_torch(module, layer)
    assert isinstance(rebuilt, Linear)
    with torch.no_grad():
        module.weight.add_(1.0)  # training keeps going after a snapshot
    np.testing.assert_array_equal(layer.weights, before)
    np.testing.assert_array_equal(rebuilt.weights, before)


def _train_step(module: nn.Module, x: npt.NDArray[np.float32], seed: int) -> None:
    torch.manual_seed(seed)
    params = [p for p in module.parameters() if p.requires_grad]
    if not params:  # stateless layer types: nothing to step
        return
    optimizer = torch.optim.SGD(params, lr=0.05)
    y = module(torch.from_numpy(x))
    loss = (y - torch.randn_like(y)).pow(2).mean()
    loss.backward()
    optimizer.step()


@pytest.mark.parametrize(
    "kind", sorted(set(KINDS) - {LayerType.COMPRESSED_LINEAR}), ids=lambda k: LayerType(k).name
)
def test_after_a_step_the_rebuilt_layer_evaluates_like_the_module(kind: LayerType) -> None:
    rng = np.random.default_rng(700)
    layer = SAMPLES[kind](rng, 3)
    module = to_torch(layer, trainable_normalization=True)
    x = sample_input(layer, rng, 16)
    _train_step(module, x, 0)
    rebuilt = from_torch(module, layer)
    # The module in float64 computes the same maths as the float64 oracle; only the final rounding differs.
    reference = forward(copy.deepcopy(module).double(), x.astype(np.float64)).astype(np.float32)
    assert_close(evaluate(rebuilt, x), reference, tol=1e-6)


def test_a_step_changes_the_weights_and_the_untouched_branch_stays_bitwise() -> None:
    rng = np.random.default_rng(701)
    trained, frozen = linear(rng, 3, 2), linear(rng, 2, 2)
    tree = Concat((3, 2), (2, 2), (Sequence((trained, TanH(2))), frozen))
    module = to_torch(tree)
    for p in module.nne_children()[1].parameters():
        p.requires_grad_(False)
    _train_step(module, f32(rng, 8, 5), 1)
    rebuilt = from_torch(module, tree)
    assert isinstance(rebuilt, Concat)
    new_trained = rebuilt.layers[0]
    assert isinstance(new_trained, Sequence) and isinstance(new_trained.layers[0], Linear)
    assert not np.array_equal(new_trained.layers[0].weights, trained.weights)
    np.testing.assert_array_equal(
        new_trained.layers[0].weights, next(iter_linear_layers(module)).weight.detach().numpy().T
    )
    assert_identical(rebuilt.layers[1], frozen)


def test_normalisation_statistics_are_buffers_unless_trainable() -> None:
    rng = np.random.default_rng(702)
    layer = Denormalize(3, f32(rng, 3), np.ones(3, np.float32))
    module = to_torch(layer)
    assert [name for name, _ in module.named_parameters()] == []
    assert sorted(name for name, _ in module.named_buffers()) == ["mean", "std"]
    module.get_buffer("mean").copy_(torch.tensor([1.0, 2.0, 3.0]))  # statistics written by the trainer
    rebuilt = from_torch(module, layer)
    assert isinstance(rebuilt, Denormalize)
    np.testing.assert_array_equal(rebuilt.mean, [1, 2, 3])
    trainable = to_torch(Normalize(3, layer.mean, layer.std), trainable_normalization=True)
    assert sorted(name for name, _ in trainable.named_parameters()) == ["mean", "std"]


def test_every_layer_type_has_one_module_class() -> None:
    """The face joins the basic and composite tables: together they cover every type, neither twice."""
    assert set(BASIC_MODULES).isdisjoint(COMPOSITE_MODULES)
    assert set(MODULE_FACTORIES) == set(LayerType) - {LayerType.INVALID}
    assert all(MODULE_FACTORIES[kind] is factory for kind, factory in BASIC_MODULES.items())
    assert all(MODULE_FACTORIES[kind] is factory for kind, factory in COMPOSITE_MODULES.items())


def test_a_layer_type_without_a_module_class_is_refused() -> None:
    film = SAMPLES[LayerType.FILM](np.random.default_rng(0), 2)
    with pytest.raises(NNEError, match="no torch module"):
        ModuleBuilder(BASIC_MODULES)(film)


def test_from_torch_rejects_a_module_of_another_shape() -> None:
    rng = np.random.default_rng(703)
    with pytest.raises(NNEError):
        from_torch(to_torch(linear(rng, 2, 2)), TanH(2))
    with pytest.raises(NNEError):
        from_torch(nn.Linear(2, 2), linear(rng, 2, 2))


# --------------------------------------------------------------------------------------------------
# CompressedLinear quantisation


def test_untouched_compressed_linear_keeps_its_bytes_even_with_foreign_offsets() -> None:
    rng = np.random.default_rng(800)
    layer = SAMPLES[LayerType.COMPRESSED_LINEAR](rng, 4)
    assert isinstance(layer, CompressedLinear)
    assert_identical(from_torch(to_torch(layer), layer), layer)


def test_trained_compressed_linear_is_requantised_within_half_a_step() -> None:
    rng = np.random.default_rng(801)
    layer = SAMPLES[LayerType.COMPRESSED_LINEAR](rng, 4)
    module = to_torch(layer)
    _train_step(module, f32(rng, 8, 4), 2)
    rebuilt = from_torch(module, layer)
    assert isinstance(rebuilt, CompressedLinear)
    assert isinstance(layer, CompressedLinear)
    assert rebuilt.weights.dtype == np.uint16 and rebuilt.weights.shape == layer.weights.shape
    assert isinstance(module, CompressedLinearModule)
    trained = module.weights_in_engine_layout()
    np.testing.assert_array_equal(rebuilt.weight_offsets, trained.min(axis=1))
    error = np.abs(dequantize_weights(rebuilt) - trained)
    assert (error <= rebuilt.weight_scales[:, None] / 2 + 1e-6).all()
    assert (rebuilt.weights.max(axis=1) == 65535).all() and (rebuilt.weights.min(axis=1) == 0).all()


def test_quantize_constant_rows_and_empty_outputs() -> None:
    codes, offsets, scales = quantize_weights(np.array([[2.0, 2.0, 2.0], [0.0, 1.0, -1.0]], np.float32))
    np.testing.assert_array_equal(codes[0], [0, 0, 0])
    assert offsets[0] == 2.0 and scales[0] == 0.0
    np.testing.assert_array_equal(codes[1], [32768, 65535, 0])
    assert scales[1] == np.float32(2 / 65535)
    empty = quantize_weights(np.zeros((3, 0), np.float32))
    assert empty[0].shape == (3, 0) and empty[1].shape == (3,) and empty[2].shape == (3,)


# --------------------------------------------------------------------------------------------------
# Gradients


TRAINABLE = [
    k
    for k in KINDS
    if any(
        True
        for _ in to_torch(SAMPLES[k](np.random.default_rng(0), 2), trainable_normalization=True).parameters()
    )
]


@pytest.mark.parametrize("kind", TRAINABLE, ids=lambda k: LayerType(k).name)
def test_backward_gives_finite_gradients(kind: LayerType) -> None:
    rng = np.random.default_rng(900)
    layer = SAMPLES[kind](rng, 3)
    module = to_torch(layer, trainable_normalization=True)
    x = torch.from_numpy(sample_input(layer, rng, 12)).requires_grad_(kind not in MASKED_TYPES)
    module(x).square().sum().backward()
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    assert grads, "no parameter received a gradient"
    assert all(torch.isfinite(g).all() for g in grads)
    assert any(bool(g.abs().sum() > 0) for g in grads)
    if x.grad is not None:
        assert torch.isfinite(x.grad).all()


def test_every_trainable_type_is_covered() -> None:
    stateless = {
        LayerType.RELU,
        LayerType.ELU,
        LayerType.TANH,
        LayerType.GELU,
        LayerType.COPY,
        LayerType.SOFTMAX,
    }
    stateless |= {LayerType.TILE, LayerType.SLICE, LayerType.CLAMP}
    assert set(TRAINABLE) == set(KINDS) - stateless


def test_float64_gradcheck_on_a_small_tree() -> None:
    rng = np.random.default_rng(901)
    tree = Sequence((linear(rng, 3, 4), ELU(4), Concat((2, 2), (2, 2), (Copy(2), linear(rng, 2, 2)))))
    module = to_torch(tree).double()
    x = torch.from_numpy(f32(rng, 4, 3).astype(np.float64)).requires_grad_(True)
    assert torch.autograd.gradcheck(module, (x,))


def test_gelu_module_at_one() -> None:
    y = to_torch(SAMPLES[LayerType.GELU](np.random.default_rng(0), 1))(torch.ones(1, 4))
    assert math.isclose(float(y[0, 0]), 1 / (1 + math.exp(-1.702)), rel_tol=1e-6)
