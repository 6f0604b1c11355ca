"""Flow maths facts: the path and target recomputed from the formulas, Euler against closed forms, time
distributions against their known moments (fixed seeds, tolerances stated at each check)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from trainer.training.flow import (
    PathSample,
    TimeDistribution,
    euler_integrate,
    flow_matching_loss,
    interpolate,
    interpolate_fitted,
    source_spread,
)

N_SAMPLES = 40_000


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------------------------------
# interpolate


def test_interpolate_matches_the_formulas_under_a_fixed_seed() -> None:
    g = gen(7)
    x0 = torch.randn((64, 5), generator=g)
    x1 = 3.0 + 2.0 * torch.randn((64, 5), generator=g)
    t = torch.rand((64, 1), generator=g)
    sample = interpolate(x0, x1, t)
    assert isinstance(sample, PathSample)
    x0d, x1d, td = x0.double(), x1.double(), t.double()
    torch.testing.assert_close(sample.x_t.double(), (1 - td) * x0d + td * x1d, rtol=0, atol=2e-6)
    assert torch.equal(sample.target, x1 - x0)


def test_interpolate_endpoints_are_noise_at_t0_and_data_at_t1() -> None:
    g = gen(1)
    x0, x1 = torch.randn((8, 3), generator=g), torch.randn((8, 3), generator=g)
    assert torch.equal(interpolate(x0, x1, torch.zeros(8, 1)).x_t, x0)
    torch.testing.assert_close(interpolate(x0, x1, torch.ones(8, 1)).x_t, x1, rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    ("x0_shape", "x1_shape", "t_shape"),
    [((4, 3), (4, 2), (4, 1)), ((4, 3), (4, 3), (4,)), ((4, 3), (4, 3), (3, 1)), ((12,), (12,), (12, 1))],
)
def test_interpolate_rejects_bad_shapes(
    x0_shape: tuple[int, ...], x1_shape: tuple[int, ...], t_shape: tuple[int, ...]
) -> None:
    with pytest.raises(ValueError):
        interpolate(torch.zeros(x0_shape), torch.zeros(x1_shape), torch.zeros(t_shape))


# --------------------------------------------------------------------------------------------------
# interpolate_fitted (NormalizeLatents)


def _fitted_case(seed: int = 3) -> tuple[torch.Tensor, ...]:
    g = gen(seed)
    z = torch.randn((256, 4), generator=g, dtype=torch.float64)
    x1 = 5.0 + 0.1 * torch.randn((256, 4), generator=g, dtype=torch.float64)
    t = torch.rand((256, 1), generator=g, dtype=torch.float64)
    sigma = torch.tensor([0.1, 0.5, 1.0, 4.0], dtype=torch.float64)
    return z, x1, t, sigma


def test_fitted_path_is_the_fitted_source_path_in_the_engines_coordinates() -> None:
    # x = (1 − t)(μ + σz) + t·x1 seen through x̃ = (x − (1 − t)μ)/((1 − t)σ + t), for any μ.
    z, x1, t, sigma = _fitted_case()
    path = interpolate_fitted(z, x1, t, sigma)
    s = (1 - t) * sigma + t
    for mu in (0.0, 5.0, -30.0):
        x = (1 - t) * (mu + sigma * z) + t * x1
        torch.testing.assert_close(path.x_t, (x - (1 - t) * mu) / s, rtol=1e-12, atol=1e-12)


def test_fitted_path_starts_at_the_engines_noise_and_ends_at_the_data() -> None:
    z, x1, _, sigma = _fitted_case()
    zeros, ones = torch.zeros((256, 1), dtype=torch.float64), torch.ones((256, 1), dtype=torch.float64)
    torch.testing.assert_close(interpolate_fitted(z, x1, zeros, sigma).x_t, z, rtol=0, atol=1e-12)
    torch.testing.assert_close(interpolate_fitted(z, x1, ones, sigma).x_t, x1, rtol=0, atol=1e-12)


def test_fitted_target_is_the_time_derivative_of_the_path() -> None:
    z, x1, t, sigma = _fitted_case()
    t = t.clamp(1e-3, 1 - 1e-3)
    h = 1e-6
    ahead = interpolate_fitted(z, x1, t + h, sigma).x_t
    behind = interpolate_fitted(z, x1, t - h, sigma).x_t
    torch.testing.assert_close(
        interpolate_fitted(z, x1, t, sigma).target, (ahead - behind) / (2 * h), rtol=1e-6, atol=1e-6
    )


def test_fitted_path_with_unit_sigma_is_the_linear_path() -> None:
    z, x1, t, _ = _fitted_case()
    ones = torch.ones(4, dtype=torch.float64)
    fitted, linear = interpolate_fitted(z, x1, t, ones), interpolate(z, x1, t)
    torch.testing.assert_close(fitted.x_t, linear.x_t, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(fitted.target, linear.target, rtol=1e-12, atol=1e-12)


def test_fitted_path_rejects_a_source_std_of_the_wrong_width() -> None:
    z, x1, t, _ = _fitted_case()
    with pytest.raises(ValueError, match="source_std"):
        interpolate_fitted(z, x1, t, torch.ones(3, dtype=torch.float64))


def test_source_spread_is_one_until_start_and_reaches_sqrt_one_plus_gain_squared_at_one() -> None:
    t = torch.tensor([[0.0], [0.5], [0.7], [0.85], [1.0]])
    s = source_spread(t, 0.7, 6.0)
    torch.testing.assert_close(s, torch.sqrt(1 + torch.tensor([[0.0], [0.0], [0.0], [3.0], [6.0]]) ** 2))
    assert torch.equal(t, torch.tensor([[0.0], [0.5], [0.7], [0.85], [1.0]]))  # t is not modified
    with pytest.raises(ValueError):
        source_spread(t, 1.0, 1.0)
    with pytest.raises(ValueError):
        source_spread(t, 0.5, -1.0)


def test_spread_source_is_distributed_as_a_second_noise_draw() -> None:
    # s(t)·x0 ~ N(0, 1 + γ²) = x0 + γ·ε in distribution: the wider source the late times train on.
    g = gen(4)
    t = torch.full((N_SAMPLES, 1), 0.9)
    scaled = torch.randn((N_SAMPLES, 1), generator=g) * source_spread(t, 0.7, 3.0)
    gamma = 3.0 * (0.9 - 0.7) / 0.3
    assert abs(float(scaled.var()) - (1 + gamma**2)) < 0.05 * (1 + gamma**2)


def test_loss_is_the_mean_squared_error() -> None:
    g = gen(3)
    p, u = torch.randn((10, 4), generator=g), torch.randn((10, 4), generator=g)
    assert flow_matching_loss(p, u).item() == pytest.approx(((p - u) ** 2).mean().item(), rel=1e-6)
    with pytest.raises(ValueError):
        flow_matching_loss(p, u[:, :3])


# --------------------------------------------------------------------------------------------------
# Euler


@pytest.mark.parametrize("steps", [1, 2, 3, 8, 100])
def test_euler_integrates_a_constant_velocity_exactly_and_visits_t_equal_k_over_n(steps: int) -> None:
    x0 = torch.tensor([[0.5, -2.0]])
    c = torch.tensor([[1.25, 3.0]])
    seen: list[float] = []

    def v(x: torch.Tensor, t: float) -> torch.Tensor:
        seen.append(t)
        return c

    x1 = euler_integrate(v, x0, steps)
    torch.testing.assert_close(x1, x0 + c, rtol=0, atol=1e-5)
    assert seen == pytest.approx([k / steps for k in range(steps)], abs=1e-12)
    assert seen[0] == 0.0  # the engine starts at pure noise, t = 0 (spec §6.4)


@pytest.mark.parametrize("steps", [1, 2, 4, 8, 50])
def test_euler_on_v_equal_minus_x_gives_the_discrete_factor(steps: int) -> None:
    # x_{k+1} = x_k − x_k/N, so x_N = (1 − 1/N)^N · x_0 exactly (not e^−1: Euler's own error).
    x0 = np.array([[1.0, -3.0, 0.25]], dtype=np.float32)
    x1 = euler_integrate(lambda x, t: -x, x0, steps)
    factor = (1.0 - 1.0 / steps) ** steps
    assert x1.dtype == np.float32  # numpy in, numpy float32 out: the engine-path evaluator uses this
    np.testing.assert_allclose(x1, factor * x0, rtol=1e-5, atol=1e-7)


def test_euler_uses_the_time_argument_to_integrate_a_time_dependent_field() -> None:
    # v = t: Euler sum Σ (k/N)·(1/N) = (N − 1)/(2N).
    steps = 10
    x1 = euler_integrate(lambda x, t: torch.full_like(x, t), torch.zeros(2, 1), steps)
    torch.testing.assert_close(x1, torch.full((2, 1), (steps - 1) / (2 * steps)), rtol=0, atol=1e-6)


@pytest.mark.parametrize("steps", [0, -1, True, 2.0])
def test_euler_rejects_bad_step_counts(steps: object) -> None:
    with pytest.raises(ValueError):
        euler_integrate(lambda x, t: x, torch.zeros(1, 1), steps)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------
# Time distributions (tolerances: ≥ 5 standard errors at N_SAMPLES)


def moments(dist: TimeDistribution, seed: int = 0) -> tuple[torch.Tensor, float, float]:
    t = dist.sample(N_SAMPLES, gen(seed), "cpu").double()
    return t, t.mean().item(), t.var().item()


def test_uniform_has_mean_one_half_and_unit_interval_support() -> None:
    t, mean, var = moments(TimeDistribution.uniform())
    assert t.shape == (N_SAMPLES, 1)
    assert t.min().item() >= 0.0 and t.max().item() < 1.0
    assert mean == pytest.approx(0.5, abs=0.008)  # se 0.0014
    assert var == pytest.approx(1 / 12, abs=0.003)


@pytest.mark.parametrize(("a", "b"), [(2.0, 5.0), (1.5, 1.0), (0.5, 0.5), (0.3, 2.0), (1.0, 1.0)])
def test_beta_has_the_beta_mean_and_variance(a: float, b: float) -> None:
    t, mean, var = moments(TimeDistribution.beta(a, b), seed=11)
    expected_mean = a / (a + b)
    expected_var = a * b / ((a + b) ** 2 * (a + b + 1))
    assert t.min().item() >= 0.0 and t.max().item() <= 1.0
    assert torch.isfinite(t).all()
    se = math.sqrt(expected_var / N_SAMPLES)
    assert mean == pytest.approx(expected_mean, abs=6 * se)
    assert var == pytest.approx(expected_var, rel=0.05)


def test_beta_one_one_is_uniform_by_quantiles() -> None:
    t, _, _ = moments(TimeDistribution.beta(1.0, 1.0), seed=5)
    q = torch.quantile(t.squeeze(1), torch.tensor([0.1, 0.25, 0.5, 0.75, 0.9], dtype=torch.float64))
    torch.testing.assert_close(
        q, torch.tensor([0.1, 0.25, 0.5, 0.75, 0.9], dtype=torch.float64), rtol=0, atol=0.01
    )


@pytest.mark.parametrize("exponent", [0.5, 1.0, 3.0])
def test_power_has_mean_one_over_one_plus_exponent(exponent: float) -> None:
    t, mean, _ = moments(TimeDistribution.power(exponent), seed=2)
    assert t.min().item() >= 0.0 and t.max().item() <= 1.0
    expected_var = 1 / (2 * exponent + 1) - 1 / (1 + exponent) ** 2
    assert mean == pytest.approx(1 / (1 + exponent), abs=6 * math.sqrt(expected_var / N_SAMPLES))
    # exponent > 1 skews toward noise (t near 0), < 1 toward data
    assert (mean < 0.5) == (exponent > 1) or exponent == 1.0


@pytest.mark.parametrize(("loc", "scale"), [(0.0, 1.0), (1.0, 0.5), (-0.5, 2.0)])
def test_logit_normal_has_median_sigmoid_loc(loc: float, scale: float) -> None:
    t, _, _ = moments(TimeDistribution.logit_normal(loc, scale), seed=3)
    assert t.min().item() >= 0.0 and t.max().item() <= 1.0
    median = torch.median(t).item()
    assert median == pytest.approx(1 / (1 + math.exp(-loc)), abs=0.01)
    logits = torch.logit(t.clamp(1e-12, 1 - 1e-12))
    assert logits.std().item() == pytest.approx(scale, rel=0.03)


@pytest.mark.parametrize(
    "dist",
    [
        TimeDistribution.uniform(),
        TimeDistribution.beta(1.5, 1.0),
        TimeDistribution.logit_normal(),
        TimeDistribution.power(2.0),
    ],
)
def test_sampling_is_reproducible_from_the_generator_and_keeps_dtype(dist: TimeDistribution) -> None:
    a = dist.sample(100, gen(42), "cpu")
    b = dist.sample(100, gen(42), "cpu")
    c = dist.sample(100, gen(43), "cpu")
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.dtype == torch.float32 and a.shape == (100, 1)
    assert dist.sample(3, gen(0), "cpu", torch.float64).dtype == torch.float64


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("uniform", TimeDistribution("uniform")),
        ("beta:1.5,1", TimeDistribution("beta", 1.5, 1.0)),
        ("logit_normal", TimeDistribution("logit_normal", 0.0, 1.0)),
        ("logit_normal:0,1", TimeDistribution("logit_normal", 0.0, 1.0)),
        ("power:2", TimeDistribution("power", 2.0)),
    ],
)
def test_parse(text: str, expected: TimeDistribution) -> None:
    assert TimeDistribution.parse(text) == expected


@pytest.mark.parametrize(
    "text", ["gauss", "beta:1", "beta:1,x", "power:1,2", "uniform:3", "beta:0,1", "power:-1"]
)
def test_parse_rejects_bad_text(text: str) -> None:
    with pytest.raises(ValueError):
        TimeDistribution.parse(text)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"kind": "normal"},
        {"kind": "beta", "a": 0.0},
        {"kind": "beta", "b": -1.0},
        {"kind": "logit_normal", "b": 0.0},
        {"kind": "power", "a": 0.0},
        {"kind": "uniform", "a": float("nan")},
    ],
)
def test_invalid_parameters_are_rejected(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        TimeDistribution(**kwargs)  # type: ignore[arg-type]
