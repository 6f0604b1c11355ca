"""The fused step is the reference step: same random draws, same weights, same optimiser and EMA state.

Facts checked: with ``exact=True`` and the networks the engine builds, every step is bitwise the
reference ``BatchSampler.next`` + ``train_step`` (weights, EMA, AdamW moments and the generator state);
the default fast mode agrees to float rounding; a fixed seed reproduces bit for bit; Diverged leaves
everything untouched; the torch optimiser can take over mid-run; unsupported models are refused."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from protocol.engine.networks import build_flow_matching_networks
from protocol.schema import parse_schema
from tests.support.fused import ACT, BATCH, assert_same, engine_model, everything
from tests.support.models import make_model
from trainer.errors import Diverged
from trainer.training.data import TensorData, TrainingData
from trainer.training.flow import TimeDistribution
from trainer.training.model import FlowModel, ModelSettings
from trainer.training.nne_torch import DenormalizeModule, SequenceModule
from trainer.training.steps.autograd import BatchSampler, make_optimizer, train_step
from trainer.training.steps.fused import FusedStep, fused_step_unsupported
from trainer.training.steps.mlp import parse_mlp


def reference_run(
    model: FlowModel,
    data: TrainingData,
    steps: int,
    seed: int,
    time: TimeDistribution,
    noise: float,
    layer_lr: str = "same",
) -> tuple[list[float], torch.optim.Optimizer, torch.Generator]:
    generator = torch.Generator().manual_seed(seed)
    sampler = BatchSampler(model.tensor_data(data), BATCH, generator)
    optimizer = make_optimizer(model, 3e-3, 1e-3, layer_lr)
    losses = [
        train_step(model, optimizer, sampler.next(), generator, time, noise, i).loss for i in range(steps)
    ]
    return losses, optimizer, generator


def fused_run(
    model: FlowModel,
    data: TrainingData,
    steps: int,
    seed: int,
    time: TimeDistribution,
    noise: float,
    *,
    exact: bool,
    layer_lr: str = "same",
) -> tuple[list[float], torch.optim.Optimizer, torch.Generator]:
    fused, optimizer, generator = build_fused(model, data, seed, time, noise, exact=exact, layer_lr=layer_lr)
    losses = [fused.step(i).loss for i in range(steps)]
    return losses, optimizer, generator


def build_fused(
    model: FlowModel,
    data: TrainingData,
    seed: int,
    time: TimeDistribution,
    noise: float,
    *,
    exact: bool,
    layer_lr: str = "same",
) -> tuple[FusedStep, torch.optim.Optimizer, torch.Generator]:
    """A fused step on ``model`` with the tests' optimiser settings and a generator seeded ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = make_optimizer(model, 3e-3, 1e-3, layer_lr)
    fused = FusedStep.build(
        model, optimizer, model.tensor_data(data), BATCH, generator, time, noise, exact=exact
    )
    assert fused is not None
    return fused, optimizer, generator


@pytest.mark.parametrize("activation", ["ELU", "ReLU", "TanH"])
def test_exact_mode_is_bitwise_the_reference_step_on_the_engine_networks(activation: str) -> None:
    base, data = engine_model(activation=activation)
    ref_model, fused_model = copy.deepcopy(base), copy.deepcopy(base)
    ref_losses, ref_opt, ref_gen = reference_run(ref_model, data, 30, 11, TimeDistribution.uniform(), 0.0)
    losses, opt, gen = fused_run(fused_model, data, 30, 11, TimeDistribution.uniform(), 0.0, exact=True)
    assert_same(everything(ref_model, ref_opt), everything(fused_model, opt), exact=True)
    assert torch.equal(ref_gen.get_state(), gen.get_state())  # same number and order of draws
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-6)  # one flat reduction for the report


@pytest.mark.parametrize(
    ("time", "noise", "chunk", "layers"),
    [
        (TimeDistribution.uniform(), 0.0, 1, 1),
        (TimeDistribution.beta(1.5, 1.0), 0.1, 3, 2),
        (TimeDistribution.logit_normal(0.3, 1.0), 0.0, 2, 0),
    ],
)
def test_fast_mode_matches_the_reference_to_float_rounding(
    time: TimeDistribution, noise: float, chunk: int, layers: int
) -> None:
    base, data = engine_model(chunk=chunk, layers=layers)
    ref_model, fused_model = copy.deepcopy(base), copy.deepcopy(base)
    ref_losses, ref_opt, ref_gen = reference_run(ref_model, data, 25, 3, time, noise)
    losses, opt, gen = fused_run(fused_model, data, 25, 3, time, noise, exact=False)
    assert_same(everything(ref_model, ref_opt), everything(fused_model, opt), exact=False)
    assert torch.equal(ref_gen.get_state(), gen.get_state())
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-4)


def masked_fitted_model(embed: bool) -> tuple[FlowModel, TrainingData]:
    """A flat And(Continuous 3, DiscreteExclusive 2) observation (noise masked off the one-hot) at raw
    scales, NormalizeLatents on (the fitted-source path), the engine's networks."""
    obs_schema = parse_schema(
        {
            "Type": "And",
            "VectorSize": 5,
            "EncodedSize": 5,
            "Elements": {
                "pos": {
                    "Type": "Continuous",
                    "VectorSize": 3,
                    "EncodedSize": 3,
                    "Num": 3,
                    "Normalization": "AutoPerDimension",
                    "Index": 0,
                },
                "kind": {
                    "Type": "DiscreteExclusive",
                    "VectorSize": 2,
                    "EncodedSize": 2,
                    "Num": 2,
                    "Index": 1,
                },
            },
        },
        "observation",
    )
    rng = np.random.default_rng(8)
    steps = 300
    obs = np.hstack([30 + 7 * rng.standard_normal((steps, 3)), np.eye(2)[rng.integers(0, 2, steps)]])
    act = (-2.0 + 3.0 * np.tanh(obs[:, :2] - 30.0) + 0.5 * rng.standard_normal((steps, 2))).astype(np.float32)
    data = TrainingData.from_arrays([0, 150], [150, 150], obs.astype(np.float32), act, 2)
    nets = build_flow_matching_networks(obs_schema, ACT, 2, 1, 24, "ELU", 3)
    settings = ModelSettings(embed_normalizations=embed, normalize_latents=True, chunk_size=2, ema_decay=0.9)
    model = FlowModel.from_networks(
        nets.denoiser.model, nets.encoder.model, nets.decoder.model, obs_schema, ACT, settings, data
    )
    return model, data


@pytest.mark.parametrize("embed", [False, True])
def test_exact_mode_is_bitwise_with_masked_noise_and_the_fitted_source(embed: bool) -> None:
    base, data = masked_fitted_model(embed)
    assert base.fitted_source and base.noise_on_latents and base.noise_std[3:].eq(0).all()
    ref_model, fused_model = copy.deepcopy(base), copy.deepcopy(base)
    time = TimeDistribution.logit_normal(0.0, 1.0)
    _, ref_opt, ref_gen = reference_run(ref_model, data, 25, 4, time, 0.3)
    _, opt, gen = fused_run(fused_model, data, 25, 4, time, 0.3, exact=True)
    assert_same(everything(ref_model, ref_opt), everything(fused_model, opt), exact=True)
    assert torch.equal(ref_gen.get_state(), gen.get_state())


@pytest.mark.parametrize("fitted", [False, True])
def test_exact_mode_is_bitwise_with_the_late_time_source_spread(fitted: bool) -> None:
    base, data = masked_fitted_model(False) if fitted else engine_model()
    base.spread = (0.5, 4.0)
    ref_model, fused_model = copy.deepcopy(base), copy.deepcopy(base)
    time = TimeDistribution.uniform()
    _, ref_opt, ref_gen = reference_run(ref_model, data, 25, 8, time, 0.1)
    _, opt, gen = fused_run(fused_model, data, 25, 8, time, 0.1, exact=True)
    assert_same(everything(ref_model, ref_opt), everything(fused_model, opt), exact=True)
    assert torch.equal(ref_gen.get_state(), gen.get_state())


@pytest.mark.parametrize("exact", [True, False])
def test_per_layer_learning_rates_run_the_same_update_as_torchs_grouped_adamw(exact: bool) -> None:
    base, data = engine_model(layers=2)
    ref_model, fused_model = copy.deepcopy(base), copy.deepcopy(base)
    time = TimeDistribution.uniform()
    _, ref_opt, ref_gen = reference_run(ref_model, data, 25, 5, time, 0.1, layer_lr="fan_in")
    assert [g["lr_scale"] for g in ref_opt.param_groups] == [24 / 9, 1.0]  # 9 inputs -> 24 units
    _, opt, gen = fused_run(fused_model, data, 25, 5, time, 0.1, exact=exact, layer_lr="fan_in")
    assert_same(everything(ref_model, ref_opt), everything(fused_model, opt), exact=exact)
    assert torch.equal(ref_gen.get_state(), gen.get_state())


def test_fast_mode_matches_with_masked_noise_and_the_fitted_source() -> None:
    base, data = masked_fitted_model(False)
    ref_model, fused_model = copy.deepcopy(base), copy.deepcopy(base)
    time = TimeDistribution.uniform()
    _, ref_opt, _ = reference_run(ref_model, data, 25, 6, time, 0.2)
    _, opt, _ = fused_run(fused_model, data, 25, 6, time, 0.2, exact=False)
    assert_same(everything(ref_model, ref_opt), everything(fused_model, opt), exact=False)


def test_a_fixed_seed_is_bitwise_reproducible_and_another_seed_differs() -> None:
    def run(seed: int) -> dict[str, torch.Tensor]:
        model, data = engine_model()
        _, opt, _ = fused_run(model, data, 40, seed, TimeDistribution.uniform(), 0.05, exact=False)
        return everything(model, opt)

    first, second, other = run(21), run(21), run(22)
    assert_same(first, second, exact=True)
    key = "denoiser.layers.0.layers.0.weight"
    assert not torch.equal(first[key], other[key])


def test_the_torch_optimizer_can_take_over_mid_run() -> None:
    # Parameters and AdamW state are views into the fused step's buffers, so autograd steps with the
    # same optimiser object continue exactly where the fused steps stopped.
    base, data = engine_model()
    ref_model, mixed = copy.deepcopy(base), copy.deepcopy(base)
    time = TimeDistribution.uniform()
    _, ref_opt, _ = reference_run(ref_model, data, 20, 4, time, 0.0)
    generator = torch.Generator().manual_seed(4)
    optimizer = make_optimizer(mixed, 3e-3, 1e-3)
    tensors = mixed.tensor_data(data)
    fused = FusedStep.build(mixed, optimizer, tensors, BATCH, generator, time, 0.0, exact=True)
    assert fused is not None
    for i in range(10):
        fused.step(i)
    sampler = BatchSampler(tensors, BATCH, generator)
    for i in range(10, 20):
        train_step(mixed, optimizer, sampler.next(), generator, time, 0.0, i)
    assert_same(everything(ref_model, ref_opt), everything(mixed, optimizer), exact=True)
    assert int(optimizer.state_dict()["state"][0]["step"]) == 20


def test_building_adopts_existing_optimizer_state() -> None:
    base, data = engine_model()
    ref_model, resumed = copy.deepcopy(base), copy.deepcopy(base)
    time = TimeDistribution.uniform()
    _, ref_opt, _ = reference_run(ref_model, data, 16, 8, time, 0.0)
    generator = torch.Generator().manual_seed(8)
    optimizer = make_optimizer(resumed, 3e-3, 1e-3)
    tensors = resumed.tensor_data(data)
    sampler = BatchSampler(tensors, BATCH, generator)
    for i in range(8):
        train_step(resumed, optimizer, sampler.next(), generator, time, 0.0, i)
    fused = FusedStep.build(resumed, optimizer, tensors, BATCH, generator, time, 0.0, exact=True)
    assert fused is not None
    for i in range(8, 16):
        fused.step(i)
    assert_same(everything(ref_model, ref_opt), everything(resumed, optimizer), exact=True)


def test_diverged_is_raised_before_anything_changes() -> None:
    model, data = engine_model()
    generator = torch.Generator().manual_seed(0)
    optimizer = make_optimizer(model, 1e-3, 1e-4)
    tensors = model.tensor_data(data)
    fused = FusedStep.build(model, optimizer, tensors, BATCH, generator, TimeDistribution.uniform(), 0.0)
    assert fused is not None
    for i in range(3):
        fused.step(i)
    before = everything(model, optimizer)
    # Poison every row's target where the step gathers it (a batch of 32 from 300 rows may miss a single
    # bad row).
    fused._x1[:, 0] = float("nan")
    with pytest.raises(Diverged, match="iteration 77"):
        fused.step(77)
    assert_same(before, everything(model, optimizer), exact=True)
    assert all(p.grad is None for p in model.trainable_parameters())


def test_unsupported_models_and_optimizers_are_refused_with_a_reason() -> None:
    embedded, data = make_model(False, False, 1, ema=0.9)  # an Encoding MLP: the encoder is trained
    optimizer = make_optimizer(embedded, 1e-3, 0.0)
    reason = fused_step_unsupported(embedded, optimizer)
    assert reason is not None and "encoder is trained" in reason
    tensors = embedded.tensor_data(data)
    generator = torch.Generator()
    assert (
        FusedStep.build(embedded, optimizer, tensors, 8, generator, TimeDistribution.uniform(), 0.0) is None
    )

    gelu, _ = engine_model(activation="GELU")
    reason = fused_step_unsupported(gelu, make_optimizer(gelu, 1e-3, 0.0))
    assert reason is not None and "GELU" in reason

    model, _ = engine_model()
    sgd = torch.optim.SGD(model.trainable_parameters(), lr=0.1)
    assert fused_step_unsupported(model, sgd) == "the optimiser is not an AdamW"
    assert fused_step_unsupported(model, make_optimizer(model, 1e-3, 0.0)) is None


def output_denormalize(model: FlowModel) -> DenormalizeModule:
    """The denoiser's final Denormalize (identity during training)."""
    assert isinstance(model.denoiser, SequenceModule)
    final = model.denoiser.layers[-1]
    assert isinstance(final, DenormalizeModule)
    return final


def test_parse_mlp_reads_the_engine_denoiser_and_a_non_identity_output_map() -> None:
    model, _ = engine_model(layers=2)
    layout = parse_mlp(model.denoiser)
    assert not isinstance(layout, str)
    assert [tuple(lin.weight.shape) for lin in layout.linears] == [(24, 9), (24, 24), (24, 24), (2, 24)]
    assert layout.activations == ("ELU", "ELU", "ELU")
    assert layout.output_mean is None and layout.output_std is None  # identity during training
    final = output_denormalize(model)
    final.mean.fill_(0.5)
    final.std.fill_(2.0)
    layout = parse_mlp(model.denoiser)
    assert not isinstance(layout, str) and layout.output_std is not None


def test_a_non_identity_output_denormalize_is_trained_like_the_reference() -> None:
    base, data = engine_model()
    final = output_denormalize(base)
    final.mean.copy_(torch.tensor([0.25, -0.5]))
    final.std.copy_(torch.tensor([1.5, 0.75]))
    ref_model, fused_model = copy.deepcopy(base), copy.deepcopy(base)
    _, ref_opt, _ = reference_run(ref_model, data, 15, 2, TimeDistribution.uniform(), 0.0)
    _, opt, _ = fused_run(fused_model, data, 15, 2, TimeDistribution.uniform(), 0.0, exact=True)
    assert_same(everything(ref_model, ref_opt), everything(fused_model, opt), exact=False)


def test_latents_are_encoded_per_batch_when_the_table_would_be_too_big(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import trainer.training.steps.fused as fused_step

    monkeypatch.setattr(fused_step, "PRECOMPUTE_LIMIT_BYTES", 0)
    base, data = engine_model()
    ref_model, fused_model = copy.deepcopy(base), copy.deepcopy(base)
    _, ref_opt, _ = reference_run(ref_model, data, 15, 6, TimeDistribution.uniform(), 0.0)
    _, opt, _ = fused_run(fused_model, data, 15, 6, TimeDistribution.uniform(), 0.0, exact=True)
    assert_same(everything(ref_model, ref_opt), everything(fused_model, opt), exact=True)


def test_build_checks_the_batch_size() -> None:
    model, data = engine_model()
    tensors: TensorData = model.tensor_data(data)
    optimizer = make_optimizer(model, 1e-3, 0.0)
    with pytest.raises(ValueError, match="batch_size"):
        FusedStep.build(model, optimizer, tensors, 0, torch.Generator(), TimeDistribution.uniform(), 0.0)


def undisturbed(base: FlowModel, data: TrainingData, steps: int, seed: int) -> dict[str, torch.Tensor]:
    """Everything after ``steps`` exact fused steps on a copy of ``base`` (t uniform, no noise)."""
    model = copy.deepcopy(base)
    _, optimizer, _ = fused_run(model, data, steps, seed, TimeDistribution.uniform(), 0.0, exact=True)
    return everything(model, optimizer)


def test_a_resume_that_loads_state_dicts_is_picked_up_by_the_next_step() -> None:
    # optimizer.load_state_dict installs new state tensors and model.load_state_dict copies weights in:
    # the fused step notices and re-adopts them, so resuming from a checkpoint continues exactly.
    base, data = engine_model()
    time = TimeDistribution.uniform()
    expected = undisturbed(base, data, 16, 12)

    first = copy.deepcopy(base)
    fused, optimizer, generator = build_fused(first, data, 12, time, 0.0, exact=True)
    for i in range(8):
        fused.step(i)
    saved = (copy.deepcopy(first.state_dict()), copy.deepcopy(optimizer.state_dict()), generator.get_state())

    resumed = copy.deepcopy(base)
    fused, optimizer, generator = build_fused(resumed, data, 99, time, 0.0, exact=True)
    fused.step(0)  # some unrelated progress that the resume overwrites
    resumed.load_state_dict(saved[0])
    optimizer.load_state_dict(saved[1])
    generator.set_state(saved[2])
    for i in range(8, 16):
        fused.step(i)
    assert_same(expected, everything(resumed, optimizer), exact=True)


def test_weights_replaced_while_the_optimiser_state_stays_keeps_the_moments_and_the_ema() -> None:
    # The parameters get new storage (same Parameter objects, e.g. a tool that moves tensors) while the
    # optimiser state and the EMA copies are still the step's own views: re-adopting must read those
    # before it rewrites the flat buffers, or the moments would restart from zero.
    base, data = engine_model()
    time = TimeDistribution.uniform()
    expected = undisturbed(base, data, 12, 4)

    model = copy.deepcopy(base)
    fused, optimizer, _ = build_fused(model, data, 4, time, 0.0, exact=True)
    assert fused.flat.ema is not None  # the EMA is flat here
    for i in range(6):
        fused.step(i)
    for p in model.denoiser.parameters():
        p.data = p.data.clone()  # same values, new storage
    for i in range(6, 12):
        fused.step(i)
    assert_same(expected, everything(model, optimizer), exact=True)
