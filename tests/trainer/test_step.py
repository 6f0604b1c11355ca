"""One optimisation step: the engine's optimiser, bitwise reproducibility from the seed on CPU, Diverged
before the step with the weights kept, and a tiny two-mode run that learns."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

from protocol.engine.networks import build_decoder, build_denoiser, build_encoder
from protocol.schema import parse_schema
from tests.support.models import make_model, train
from trainer.errors import Diverged
from trainer.training.data import Batch, TensorData, TrainingData
from trainer.training.flow import TimeDistribution
from trainer.training.model import FlowModel, ModelSettings
from trainer.training.nne_torch import LinearModule
from trainer.training.steps.autograd import BatchSampler, make_optimizer, set_learning_rate, train_step
from trainer.training.steps.base import StepMetrics


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """These networks are tiny: one intra-op thread is faster, and on a shared 2-core machine a second
    spinning thread makes them many times slower."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_optimizer_is_adamw_amsgrad_over_the_trainable_parameters() -> None:
    model, _ = make_model(False, False, 1, ema=0.9)
    optimizer = make_optimizer(model, 3e-4, 1e-3)
    assert isinstance(optimizer, torch.optim.AdamW)
    group = optimizer.param_groups[0]
    assert group["amsgrad"] is True and group["lr"] == 3e-4 and group["weight_decay"] == 1e-3
    params = {id(p) for p in group["params"]}
    # Every network with weights trains, in both Embed modes: the denoiser and the Encoding MLP of the
    # encoder (the EMA copies are no parameters to optimise)
    assert params == {id(p) for p in [*model.denoiser.parameters(), *model.encoder.parameters()]}
    assert any(True for _ in model.encoder.parameters())
    embedded, _ = make_model(True, False, 1, ema=0.9)
    trained = {id(p) for p in make_optimizer(embedded, 1e-4, 0.0).param_groups[0]["params"]}
    assert trained == {id(p) for p in [*embedded.denoiser.parameters(), *embedded.encoder.parameters()]}


def test_fan_in_learning_rates_scale_each_linear_by_its_outputs_over_inputs() -> None:
    model, _ = make_model(True, False, 1)  # denoiser 23 -> 32 -> 32 -> 3; Encoding MLP 2 -> 4 -> 4
    optimizer = make_optimizer(model, 1e-3, 0.0, "fan_in")
    scales = {id(p): group["lr_scale"] for group in optimizer.param_groups for p in group["params"]}
    for module in model.modules():
        if isinstance(module, LinearModule) and module.weight.requires_grad:
            out, inp = module.weight.shape
            assert scales[id(module.weight)] == scales[id(module.bias)] == max(1.0, out / inp)
    assert sorted({*scales.values()}) == [1.0, 32 / 23, 2.0]
    for group in optimizer.param_groups:
        assert group["lr"] == pytest.approx(1e-3 * group["lr_scale"])
    set_learning_rate(optimizer, 5e-4)
    assert [g["lr"] for g in optimizer.param_groups] == [5e-4 * g["lr_scale"] for g in optimizer.param_groups]
    with pytest.raises(ValueError, match="layer_lr"):
        make_optimizer(model, 1e-3, 0.0, "per_unit")


def run(seed: int, steps: int = 50) -> dict[str, torch.Tensor]:
    model, data = make_model(True, True, 3, ema=0.95)
    generator = torch.Generator().manual_seed(seed)
    sampler = BatchSampler(model.tensor_data(data), 32, generator)
    optimizer = make_optimizer(model, 1e-3, 1e-4)
    for i in range(steps):
        train_step(model, optimizer, sampler.next(), generator, TimeDistribution.beta(1.5, 1.0), 0.1, i)
    return state(model)


def test_same_seed_gives_bitwise_identical_weights_after_50_steps() -> None:
    first, second = run(1234), run(1234)
    assert_bitwise_equal(first, second)
    other = run(1235)
    assert not torch.equal(
        first["denoiser.layers.0.layers.0.weight"], other["denoiser.layers.0.layers.0.weight"]
    )


def test_non_finite_loss_raises_diverged_before_the_step_and_keeps_the_weights() -> None:
    model, data = make_model(True, False, 1, ema=0.9)
    train(model, data, 3)  # some optimiser and EMA state to keep
    optimizer = make_optimizer(model, 1e-3, 1e-4)
    generator = torch.Generator().manual_seed(0)
    sampler = BatchSampler(model.tensor_data(data), 16, generator)
    train_step(model, optimizer, sampler.next(), generator, TimeDistribution.uniform(), 0.0, 0)
    weights = state(model)
    adam = {k: v.clone() for s in optimizer.state.values() for k, v in s.items()}
    good = sampler.next()
    x1 = good.x1.clone()
    x1[3, 1] = float("nan")
    with pytest.raises(Diverged, match="iteration 417"):
        train_step(model, optimizer, Batch(good.obs, x1), generator, TimeDistribution.uniform(), 0.0, 417)
    assert_bitwise_equal(weights, state(model))
    assert {k: v for s in optimizer.state.values() for k, v in s.items()}.keys() == adam.keys()
    assert all(p.grad is None for p in model.trainable_parameters())
    obs = good.obs.clone()
    obs[0, 0] = float("inf")
    with pytest.raises(Diverged):
        train_step(model, optimizer, Batch(obs, good.x1), generator, TimeDistribution.uniform(), 0.0, 418)
    assert_bitwise_equal(weights, state(model))
    # and training goes on from the kept weights
    metrics = train_step(model, optimizer, good, generator, TimeDistribution.uniform(), 0.0, 419)
    assert isinstance(metrics, StepMetrics) and np.isfinite(metrics.loss) and metrics.grad_norm > 0


def test_batch_sampler_draws_rows_with_replacement_reproducibly() -> None:
    obs = torch.arange(10, dtype=torch.float32)[:, None]
    data = TensorData(obs=obs, x1=obs * 2)
    a = BatchSampler(data, 64, torch.Generator().manual_seed(3)).next()
    b = BatchSampler(data, 64, torch.Generator().manual_seed(3)).next()
    assert torch.equal(a.obs, b.obs) and a.size == 64
    assert torch.equal(a.x1, a.obs * 2)  # rows stay paired
    assert set(a.obs.squeeze(1).tolist()) <= set(range(10)) and len(set(a.obs.squeeze(1).tolist())) > 5
    with pytest.raises(ValueError):
        BatchSampler(data, 0, torch.Generator())


def two_mode_loss_floor(centre: float, sigma: float, n: int = 200_000) -> float:
    """The minimum flow-matching MSE for x1 ~ ½N(−c, σ²) + ½N(c, σ²), x0 ~ N(0, 1), t ~ U[0, 1]: the
    variance of u = x1 − x0 around its exact conditional mean E[u | x_t] (Gaussian posteriors per
    mode), by Monte Carlo with a fixed seed (standard error ≈ 0.003)."""
    rng = np.random.default_rng(0)
    mode = rng.choice([-centre, centre], n)
    x1 = mode + sigma * rng.standard_normal(n)
    x0 = rng.standard_normal(n)
    t = rng.random(n)
    xt = (1 - t) * x0 + t * x1
    var = (1 - t) ** 2 + (t * sigma) ** 2  # of x_t given the mode
    weighted, total = np.zeros(n), np.zeros(n)
    for m in (-centre, centre):
        r = xt - t * m
        likelihood = np.exp(-(r**2) / (2 * var))
        weighted += likelihood * (m + t * sigma**2 * r / var - (1 - t) * r / var)
        total += likelihood
    return float(np.mean((x1 - x0 - weighted / total) ** 2))


def test_a_tiny_two_mode_run_reduces_the_loss_and_samples_both_modes() -> None:
    # o ~ U[−1, 1]; a = ±1 (p = ½) + 0.05·N: the conditional mean 0 is never a valid action (benchmarks B1, 1-D).
    obs_schema = parse_schema(
        {
            "Type": "Continuous",
            "VectorSize": 1,
            "EncodedSize": 1,
            "Num": 1,
            "Normalization": "AutoPerDimension",
        },
        "observation",
    )
    action_schema = parse_schema(
        {
            "Type": "Continuous",
            "VectorSize": 1,
            "EncodedSize": 2,
            "DistributionSize": 2,
            "ModifierSize": 3,
            "Num": 1,
            "Normalization": "AutoPerDimension",
        },
        "action",
    )
    rng = np.random.default_rng(0)
    n = 4000
    obs = rng.uniform(-1, 1, (n, 1)).astype(np.float32)
    actions = (rng.choice([-1.0, 1.0], (n, 1)) + 0.05 * rng.standard_normal((n, 1))).astype(np.float32)
    data = TrainingData.from_arrays([0], [n], obs, actions, 1)
    encoder = build_encoder(obs_schema, np.random.default_rng(1))
    decoder = build_decoder(action_schema, 1)
    denoiser = build_denoiser(1, 1, 1, 64, "ELU", np.random.default_rng(2))
    settings = ModelSettings(embed_normalizations=True, ema_decay=0.0)
    model = FlowModel.from_networks(denoiser, encoder, decoder, obs_schema, action_schema, settings, data)
    torch.manual_seed(0)
    losses = train(model, data, 600, lr=3e-3)
    first, last = float(np.mean(losses[:20])), float(np.mean(losses[-100:]))
    # Two modes leave an irreducible loss (near t = 0 the mode cannot be known): compare the excess.
    floor = two_mode_loss_floor(1.0 / float(actions.std()), 0.05 / float(actions.std()))
    assert 1.0 < floor < 1.2
    assert last - floor < 0.35 * (first - floor), (first, last, floor)

    generator = torch.Generator().manual_seed(1)
    probe = torch.linspace(-0.9, 0.9, 400)[:, None]
    sampled = model.sample(probe, torch.randn((400, 1), generator=generator), 10).squeeze(1)
    near = ((sampled - 1).abs() < 0.25) | ((sampled + 1).abs() < 0.25)
    assert near.float().mean().item() > 0.6
    positive = (sampled > 0).float().mean().item()
    assert 0.25 < positive < 0.75  # both modes, not a collapse onto one
