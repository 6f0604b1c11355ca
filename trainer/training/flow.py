"""Flow-matching maths, stateless: time sampling, the probability path, the Euler sampler, the loss.

Time convention (written once, here; every other module follows it):

* ``t = 0`` is noise ``x0 ~ N(0, I)``, ``t = 1`` is data ``x1`` (a normalised action chunk).
* Path: ``x_t = (1 − t)·x0 + t·x1``; target velocity ``u = x1 − x0`` (constant along the path);
  loss = mean squared error between the predicted velocity and ``u`` (rectified flow / conditional
  flow matching with the linear path).
* Sampling: explicit Euler from ``x ~ N(0, I)`` with ``N`` steps, ``x ← x + v(x, t)/N`` at
  ``t = k/N`` for ``k = 0 … N−1``, which is exactly how the engine integrates (spec §6.4: dt = 1/N,
  t = k·dt, input [encoded obs ‖ x ‖ t]). The convention is not a free choice: the engine's sampler
  fixes it, so a network trained the other way round would be integrated backwards.

With ``NormalizeLatents`` the source is a Gaussian fitted to the data instead of N(0, I) (the engine's
header: "we sample from a gaussian fitted to the latent distribution instead of N(0, 1)"), while the
engine's sampler still starts from N(0, I) and integrates the network's output as it is. Both hold at
once in the engine's coordinates (:func:`interpolate_fitted`): with the fitted source
``x0 = μ + σ·z`` and its linear path ``x_t = (1 − t)·x0 + t·x1``, the network is trained on
``x̃ = (x − (1 − t)·μ)/((1 − t)·σ + t)``, which is ``z ~ N(0, I)`` at ``t = 0`` and ``x1`` at ``t = 1``.
Written out, ``x̃_t = ((1 − t)·σ·z + t·x1)/s`` with ``s = (1 − t)·σ + t``: the mean μ drops out, and per
dimension this is the plain linear path under the time change ``τ(t) = t/s`` (``1 − τ = (1 − t)σ/s``),
so its velocity is ``dx̃/dt = τ'(t)·(x1 − z) = σ·(x1 − z)/s²``. The continuous flow the engine
integrates from N(0, I) is then exactly the fitted-Gaussian flow seen through that affine map, which is
the identity at ``t = 1``; only the Euler grid's placement along the path differs (σ < 1: larger
steps near the noise, smaller near the data).

Late-time source spread (our own knob, :func:`source_spread`): for ``t`` past ``start`` the path's source
is widened, ``x0' = s(t)·x0`` with ``s(t) = sqrt(1 + (gain·(t − start)/(1 − start))²)`` (so ``x0'`` is
distributed as ``x0 + γ(t)·ε``, ε a second N(0, I) draw), and the pair is the linear path's from
``x0'``: ``x_t = (1 − t)·x0' + t·x1``, target ``x1 − x0'``. The engine's sampler leaves the data
manifold a little at every step (its own errors), and at late times the plain path never trains the field
there: its samples hug the data within ``(1 − t)``. With the wider source the late field is learned over
a band around the data, pointing back at it (the posterior mean of a blurrier path), while the early
times, where the sampler chooses between modes, keep the plain path: "input perturbation" against
exposure bias, in flow-matching form.

Shapes: ``B`` batch, ``A`` denoiser action width (see :mod:`trainer.training.data`); ``t`` is ``(B, 1)`` so
that it broadcasts over the action dims and concatenates as the denoiser's last input column.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor

from trainer.settings.time_density import TIME_KINDS, TimeDensity, TimeKind

__all__ = [
    "TIME_KINDS",
    "Draws",
    "PathSample",
    "TimeDistribution",
    "TimeKind",
    "euler_integrate",
    "flow_matching_loss",
    "interpolate",
    "interpolate_fitted",
    "source_spread",
    "stratified_draws",
]

_GAMMA_CANDIDATES = 8
"""Marsaglia–Tsang proposals drawn per gamma sample. Each is accepted with probability ≥ 0.95 (shape
≥ 1), so all 8 fail with probability < 1e-10; such a sample falls back to the distribution's mode
region (d = shape − 1/3). Drawing a fixed number keeps the sampler free of data-dependent loops and
host syncs, and every draw comes from the caller's generator (torch's own Beta ignores generators)."""


@dataclass(frozen=True, slots=True)
class TimeDistribution(TimeDensity):
    """A :class:`~trainer.settings.time_density.TimeDensity` (the option value: kinds, parameters, text
    grammar and checks live there) that draws times: :meth:`sample`, :meth:`quantile`. Build it from the
    option with :meth:`of`, or with the density's constructors (``TimeDistribution.beta(1.5, 1)``)."""

    @classmethod
    def of(cls, density: TimeDensity) -> TimeDistribution:
        """The distribution of an option value (``options.time_distribution``)."""
        return cls(density.kind, density.a, density.b, text=density.text)

    def sample(
        self,
        n: int,
        generator: torch.Generator,
        device: torch.device | str,
        dtype: torch.dtype = torch.float32,
    ) -> Tensor:
        """``n`` times as an ``(n, 1)`` tensor in [0, 1], drawn only from ``generator`` (which must live on
        ``device``), so a seeded generator reproduces the sequence bit for bit."""
        shape = (n, 1)
        if self.kind == "uniform":
            return torch.rand(shape, generator=generator, device=device, dtype=dtype)
        if self.kind == "power":
            return torch.rand(shape, generator=generator, device=device, dtype=dtype).pow_(self.a)
        if self.kind == "logit_normal":
            # normal(a, b) draws the same standard normals as randn and scales them in the kernel: one
            # op instead of three (bitwise randn's for the default (0, 1)).
            z = torch.normal(self.a, self.b, shape, generator=generator, device=device, dtype=dtype)
            return z.sigmoid_()
        # Beta(a, b) = X / (X + Y) with X ~ Gamma(a), Y ~ Gamma(b); float64 so that tiny shapes
        # (whose gamma samples underflow float32) still give a finite ratio.
        x = _sample_gamma(self.a, n, generator, device)
        y = _sample_gamma(self.b, n, generator, device)
        t = x / (x + y).clamp_min(torch.finfo(torch.float64).tiny)
        return t.clamp_(0.0, 1.0).to(dtype).reshape(shape)

    @property
    def has_quantile(self) -> bool:
        """Whether :meth:`quantile` exists in closed form (every kind but Beta)."""
        return self.kind != "beta"

    def quantile(self, u: Tensor) -> Tensor:
        """The inverse CDF at ``u`` in (0, 1), elementwise: the time whose probability below it is ``u``
        (stratified draws, :func:`stratified_draws`). Beta has no closed form: ValueError."""
        if self.kind == "uniform":
            return u.clone()
        if self.kind == "power":
            return u.pow(self.a)
        if self.kind == "logit_normal":
            normal: Tensor = torch.special.ndtri(u)
            return normal.mul_(self.b).add_(self.a).sigmoid_()
        raise ValueError("the Beta time distribution has no closed-form quantile")


class Draws(NamedTuple):
    """``K`` draws for each of ``R`` rows, row-major (row r's draws are rows ``r·K … r·K + K − 1``):
    ``x0`` ``(R·K, A)``, ``t`` ``(R·K, 1)``."""

    x0: Tensor
    t: Tensor


def stratified_draws(
    time_distribution: TimeDistribution,
    rows: int,
    draws: int,
    width: int,
    generator: torch.Generator,
    device: torch.device | str,
) -> Draws:
    """``draws`` (x0, t) pairs for each of ``rows`` rows, each row's spread out instead of independent.

    * **t, stratified:** draw j of a row has ``u = (j + U)/K`` with U ~ U[0, 1), and ``t`` is the
      distribution's quantile at ``u``: each row sees one time from every K-th of the density, so the K
      losses of a row cover the whole time range (independent draws bunch up; the density is the same).
      Beta, without a closed-form quantile, draws its times independently.
    * **x0, antithetic:** draws ``ceil(K/2) … K − 1`` are ``−x0`` of draws ``0 … floor(K/2) − 1`` (the last
      half mirrors the first; an odd K's middle draw ``floor(K/2)`` has no mirror). A pair's noise averages
      to zero exactly, so its two targets ``x1 − x0`` straddle the row's action.

    Order of the generator's draws: the normals ``(R, ceil(K/2), A)``, then the uniforms ``(R, K)``."""
    if draws < 1 or rows < 1:
        raise ValueError(f"need rows >= 1 and draws >= 1, got rows={rows}, draws={draws}")
    half = (draws + 1) // 2
    base = torch.randn((rows, half, width), generator=generator, device=device)
    mirrored = draws // 2
    x0 = torch.cat((base, -base[:, :mirrored]), dim=1) if mirrored else base
    if time_distribution.has_quantile:
        u = torch.rand((rows, draws), generator=generator, device=device)
        u = (u + torch.arange(draws, device=device, dtype=u.dtype)).div_(draws)
        # Keep u inside (0, 1): the logit-normal quantile is infinite at its ends.
        t = time_distribution.quantile(u.clamp_(1e-6, 1.0 - 1e-6))
    else:
        t = time_distribution.sample(rows * draws, generator, device).reshape(rows, draws)
    return Draws(x0=x0.reshape(rows * draws, width), t=t.reshape(rows * draws, 1))


def _sample_gamma(shape: float, n: int, generator: torch.Generator, device: torch.device | str) -> Tensor:
    """``n`` samples of Gamma(shape, 1) in float64 (Marsaglia & Tsang 2000, vectorised; shapes < 1 use
    the boost Gamma(s) = Gamma(s + 1)·U^(1/s))."""
    boosted = shape < 1.0
    s = shape + 1.0 if boosted else shape
    d = s - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * d)
    z = torch.randn((n, _GAMMA_CANDIDATES), generator=generator, device=device, dtype=torch.float64)
    u = torch.rand((n, _GAMMA_CANDIDATES), generator=generator, device=device, dtype=torch.float64)
    v = (1.0 + c * z) ** 3
    positive = v > 0
    log_v = torch.log(torch.where(positive, v, torch.ones_like(v)))
    accepted = positive & (torch.log(u) < 0.5 * z * z + d - d * v + d * log_v)
    first = accepted.to(torch.uint8).argmax(dim=1, keepdim=True)  # index of the first accepted proposal
    g = d * v.gather(1, first).squeeze(1)
    g = torch.where(accepted.any(dim=1), g, torch.full_like(g, d))
    if boosted:
        b = torch.rand((n,), generator=generator, device=device, dtype=torch.float64)
        g = g * b.pow(1.0 / shape)
    return g


class PathSample(NamedTuple):
    """A point on the linear path and the velocity to regress onto, both ``(B, A)``."""

    x_t: Tensor
    target: Tensor


def interpolate(x0: Tensor, x1: Tensor, t: Tensor) -> PathSample:
    """``x_t = (1 − t)·x0 + t·x1`` and ``target = x1 − x0``.

    ``x0`` (noise) and ``x1`` (data) are ``(B, A)``, ``t`` is ``(B, 1)``.
    """
    if x0.shape != x1.shape or x0.dim() != 2:
        raise ValueError(f"x0 and x1 must both be (B, A); got {tuple(x0.shape)} and {tuple(x1.shape)}")
    if t.shape != (x0.shape[0], 1):
        raise ValueError(f"t must be (B, 1) = ({x0.shape[0]}, 1); got {tuple(t.shape)}")
    # x0 + t·(x1 − x0) is the same line with one fewer multiply, and reuses the target.
    target = x1 - x0
    return PathSample(x_t=torch.addcmul(x0, t, target), target=target)


def source_spread(t: Tensor, start: float, gain: float) -> Tensor:
    """The late-time source scale ``s(t) = sqrt(1 + (gain·max(0, t − start)/(1 − start))²)``, like ``t``
    (``(B, 1)``): 1 up to ``start``, growing to ``sqrt(1 + gain²)`` at ``t = 1``. The training path's noise
    is ``s(t)·x0`` (module docstring). ``0 <= start < 1``, ``gain >= 0``. The operation order is the one
    :class:`trainer.training.steps.fused.FusedStep` repeats."""
    if not 0.0 <= start < 1.0 or not gain >= 0.0:
        raise ValueError(f"need 0 <= start < 1 and gain >= 0, got start={start}, gain={gain}")
    gamma = (t - start).clamp_min_(0.0).mul_(gain / (1.0 - start))
    return gamma.mul_(gamma).add_(1.0).sqrt_()


def interpolate_fitted(x0: Tensor, x1: Tensor, t: Tensor, source_std: Tensor) -> PathSample:
    """The fitted-source path in the engine's coordinates (module docstring, ``NormalizeLatents``):
    ``a = (1 − t)·σ``, ``s = a + t``, ``x_t = (a·x0 + t·x1)/s``, ``target = (x1 − x0)·σ/(s·s)``.

    ``x0`` (the engine's N(0, I) draw, ``z``) and ``x1`` are ``(B, A)``, ``t`` is ``(B, 1)``,
    ``source_std`` is σ ``(A,)`` (> 0). σ = 1 gives :func:`interpolate`'s path and target (up to
    rounding). The operation order is the one :class:`trainer.training.steps.fused.FusedStep` repeats.
    """
    if x0.shape != x1.shape or x0.dim() != 2:
        raise ValueError(f"x0 and x1 must both be (B, A); got {tuple(x0.shape)} and {tuple(x1.shape)}")
    if t.shape != (x0.shape[0], 1):
        raise ValueError(f"t must be (B, 1) = ({x0.shape[0]}, 1); got {tuple(t.shape)}")
    if source_std.shape != (x0.shape[1],):
        raise ValueError(f"source_std must be ({x0.shape[1]},); got {tuple(source_std.shape)}")
    a = (1.0 - t) * source_std
    s = a + t
    x_t = torch.addcmul(a * x0, t, x1) / s
    target = (x1 - x0) * source_std / (s * s)
    return PathSample(x_t=x_t, target=target)


Vector = TypeVar("Vector", Tensor, npt.NDArray[np.float32])


def euler_integrate(velocity_fn: Callable[[Vector, float], Vector], x0: Vector, steps: int) -> Vector:
    """Integrate ``dx/dt = velocity_fn(x, t)`` from ``t = 0`` (``x0``, noise) to ``t = 1`` with ``steps``
    explicit Euler steps, exactly as the engine does (spec §6.4): ``dt = 1/steps``, ``t = k·dt``,
    ``x ← x + dt·v``.

    ``velocity_fn`` receives the current ``x`` (same type and shape as ``x0``: a torch tensor or a
    float32 numpy array, ``(B, A)``) and ``t`` as a Python float, and returns ``v`` like ``x``.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    dt = 1.0 / steps
    x = x0
    for k in range(steps):
        x = x + dt * velocity_fn(x, k * dt)
    return x


def flow_matching_loss(pred: Tensor, target: Tensor) -> Tensor:
    """Mean squared error over every element of ``(B, A)``: a scalar tensor."""
    if pred.shape != target.shape:
        raise ValueError(f"pred and target shapes differ: {tuple(pred.shape)} vs {tuple(target.shape)}")
    return torch.nn.functional.mse_loss(pred, target)
