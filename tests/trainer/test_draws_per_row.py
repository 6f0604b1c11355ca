"""K (x0, t) draws per batch row (option ``draws_per_row``, :func:`trainer.training.flow.stratified_draws`).

Facts checked: each row's K times fall one in each K-th of the density (stratified through its
quantile), each row's second half of noises mirrors the first (antithetic), the density itself is
unchanged, and the fused step with K draws is bitwise the reference step with K draws (same draws, same
weights, moments and generator state)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from tests.support.fused import BATCH, assert_same, engine_model, everything
from trainer.settings.options import OptionError, TrainerOptions
from trainer.training.flow import TimeDistribution, stratified_draws
from trainer.training.steps.autograd import BatchSampler, make_optimizer, train_step
from trainer.training.steps.fused import FusedStep


@pytest.mark.parametrize(
    "time",
    [TimeDistribution.uniform(), TimeDistribution.logit_normal(0.0, 1.0), TimeDistribution.power(2.0)],
)
def test_each_rows_times_take_one_stratum_each_of_the_density(time: TimeDistribution) -> None:
    rows, k = 500, 4
    draws = stratified_draws(time, rows, k, 3, torch.Generator().manual_seed(3), "cpu")
    t = draws.t.reshape(rows, k)
    # Stratum j of the density: between its quantiles at j/K and (j+1)/K.
    edges = time.quantile(torch.tensor([1e-6, 0.25, 0.5, 0.75, 1 - 1e-6]))
    for j in range(k):
        assert bool(((t[:, j] >= edges[j] - 1e-6) & (t[:, j] <= edges[j + 1] + 1e-6)).all())
    # Pooled over rows and strata the times follow the density (its median within sampling error).
    assert abs(float(t.median()) - float(edges[2])) < 0.05


def test_the_last_half_of_a_rows_noise_mirrors_the_first_and_an_odd_middle_draw_is_free() -> None:
    draws = stratified_draws(TimeDistribution.uniform(), 7, 5, 2, torch.Generator().manual_seed(1), "cpu")
    x0 = draws.x0.reshape(7, 5, 2)
    assert torch.equal(x0[:, 3:5], -x0[:, 0:2])
    assert not torch.equal(x0[:, 2], -x0[:, 0]) and not torch.equal(x0[:, 2], -x0[:, 1])
    even = stratified_draws(TimeDistribution.uniform(), 3, 4, 2, torch.Generator().manual_seed(1), "cpu")
    assert torch.equal(even.x0.reshape(3, 4, 2)[:, 2:], -even.x0.reshape(3, 4, 2)[:, :2])
    assert draws.t.shape == (35, 1)


def test_beta_has_no_closed_form_quantile_and_draws_its_times_independently() -> None:
    beta = TimeDistribution.beta(2.0, 1.0)
    assert not beta.has_quantile
    with pytest.raises(ValueError, match="quantile"):
        beta.quantile(torch.tensor([0.5]))
    draws = stratified_draws(beta, 4, 2, 1, torch.Generator().manual_seed(0), "cpu")
    assert draws.t.shape == (8, 1) and bool(((draws.t >= 0) & (draws.t <= 1)).all())


@pytest.mark.parametrize("k", [2, 3])
def test_the_fused_step_with_k_draws_is_bitwise_the_reference_step_with_k_draws(k: int) -> None:
    base, data = engine_model()
    base.spread = (0.5, 2.0)
    ref_model, fused_model = copy.deepcopy(base), copy.deepcopy(base)
    time = TimeDistribution.logit_normal(0.0, 1.0)

    ref_gen = torch.Generator().manual_seed(5)
    sampler = BatchSampler(ref_model.tensor_data(data), BATCH, ref_gen)
    ref_opt = make_optimizer(ref_model, 3e-3, 1e-3)
    ref_losses = [
        train_step(ref_model, ref_opt, sampler.next(), ref_gen, time, 0.1, i, draws_per_row=k).loss
        for i in range(20)
    ]

    gen = torch.Generator().manual_seed(5)
    opt = make_optimizer(fused_model, 3e-3, 1e-3)
    fused = FusedStep.build(
        fused_model, opt, fused_model.tensor_data(data), BATCH, gen, time, 0.1, exact=True, draws_per_row=k
    )
    assert fused is not None
    losses = [fused.step(i).loss for i in range(20)]

    assert_same(everything(ref_model, ref_opt), everything(fused_model, opt), exact=True)
    assert torch.equal(ref_gen.get_state(), gen.get_state())
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-6)


def test_one_draw_per_row_is_the_default_and_the_option_refuses_zero() -> None:
    assert TrainerOptions().draws_per_row == 1
    with pytest.raises(OptionError, match="draws_per_row"):
        TrainerOptions(draws_per_row=0)
