"""The fixed affine maps around the trained networks: one value, :class:`Standardization`, and how its
statistics are measured (:func:`flow_statistics`, :func:`latent_statistics`).

The model (:mod:`trainer.training.model`) applies these maps explicitly during training and folds them
into the networks at export; every array is per dimension. Shapes: ``L`` latents, ``A`` the denoiser's
action width (the decoder-input space), ``O`` observations.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor, nn

from trainer.training.data import MIN_STD
from trainer.training.normalization import ElementwiseAffine

__all__ = ["Standardization", "flow_statistics", "latent_statistics"]

Floats = npt.NDArray[np.float32]
Doubles = npt.NDArray[np.float64]
Values = npt.NDArray[Any]

_LATENT_CHUNK = 65536
"""Rows per encoder pass when measuring latent statistics (bounds the temporary memory)."""

_STATISTICS_TIMES = 4096
"""Midpoints of [0, 1] over which the x/velocity standardisation of the fitted-source path is averaged
(it has no closed form in t; any affine choice folds exactly, so this only sets the conditioning)."""


@dataclass(frozen=True, slots=True, eq=False)
class Standardization:
    """The model's fixed affine maps, per dimension; identity maps are 0/1.

    The field order is the order the model registers them as float32 buffers (its state dict, and so its
    checkpoints, follow it)."""

    latent_mean: Values
    """(L,) subtracted from the encoder's output."""
    latent_std: Values
    """(L,) the encoder's output is divided by it."""
    x_mean: Values
    """(A,) the denoiser's x input standardisation."""
    x_std: Values
    v_mean: Values
    """(A,) the denoiser's velocity output de-standardisation."""
    v_std: Values
    decoder_scale: Values
    """(A,) the decoder as the element-wise affine map it is: action = x·scale + shift."""
    decoder_shift: Values
    source_std: Values
    """(A,) σ of the fitted source (``NormalizeLatents``); 1 without it."""
    noise_std: Values
    """(L, or O when the noise goes on the observations) one unit of observation noise."""

    def buffers(self) -> Iterator[tuple[str, Floats]]:
        """(name, float32 array) in field order: what the model holds as buffers."""
        for f in dataclasses.fields(self):
            yield f.name, np.ascontiguousarray(getattr(self, f.name), dtype=np.float32)

    def stored(self) -> Standardization:
        """Every map as the float32 buffers hold it (as float64): what training used, so that a fold at
        export and the training model differ only by float rounding."""
        return Standardization(
            **{
                f.name: np.asarray(getattr(self, f.name), dtype=np.float32).astype(np.float64)
                for f in dataclasses.fields(self)
            }
        )

    def exported_latents(self, handed_on: ElementwiseAffine | None) -> Standardization:
        """The latent standardisation as the exported encoder needs it: when the encoder hands on
        ``moved(x)`` with ``trained(x) = moved(x)·scale + shift`` (Embed false), then
        ``(trained(x) − m)/s = (moved(x) − (m − shift)/scale)/(s/scale)``."""
        if handed_on is None:
            return self
        return dataclasses.replace(
            self,
            latent_mean=(self.latent_mean - handed_on.shift) / handed_on.scale,
            latent_std=self.latent_std / handed_on.scale,
        )

    def input_affine(self) -> tuple[Doubles, Doubles]:
        """Shift and scale (L + A + 1,) of the denoiser input [z ‖ x ‖ t]; t is never standardised."""
        shift = np.concatenate([np.asarray(self.latent_mean), np.asarray(self.x_mean), [0.0]])
        scale = np.concatenate([np.asarray(self.latent_std), np.asarray(self.x_std), [1.0]])
        return shift.astype(np.float64), scale.astype(np.float64)


def flow_statistics(x1: Floats, source_std: Doubles | None) -> tuple[Doubles, Doubles, Doubles, Doubles]:
    """Per-dim standardisation of the denoiser's x input and velocity output in the decoder-input space.

    [INF] x: the marginal of the training path over x0 ~ N(0, 1), t ~ U[0, 1]. For the linear path
    (``source_std`` None) in closed form: mean μ/2, variance 1/3 + σ²/3 + μ²/12 (μ, σ of x1); velocity
    u = x1 − x0: mean μ, variance σ² + 1. For the fitted-source path (:func:`trainer.training.flow.
    interpolate_fitted`, source std ς) the per-t moments are closed-form (x̃: mean tμ/s, variance
    (a² + t²σ²)/s²; u: mean ςμ/s², variance ς²(σ² + 1)/s⁴, with a = (1 − t)ς, s = a + t) and are
    averaged over :data:`_STATISTICS_TIMES` midpoints of [0, 1]. Deterministic (no sampling); any affine
    choice folds exactly, so this only sets the conditioning. Variances are floored at MIN_STD².
    """
    mu = x1.mean(axis=0, dtype=np.float64)
    var = x1.var(axis=0, dtype=np.float64)
    if source_std is None:
        x_mean = mu / 2.0
        x_std = np.sqrt(1.0 / 3.0 + var / 3.0 + mu * mu / 12.0)
        return x_mean, x_std, mu, np.sqrt(var + 1.0)
    t = ((np.arange(_STATISTICS_TIMES) + 0.5) / _STATISTICS_TIMES)[:, None]
    a = (1.0 - t) * source_std
    s = a + t
    x_mean_t = t * mu / s
    x_second = ((a * a + t * t * var) / (s * s) + x_mean_t**2).mean(axis=0)
    u_mean_t = source_std * mu / (s * s)
    u_second = (source_std**2 * (var + 1.0) / s**4 + u_mean_t**2).mean(axis=0)
    x_mean, u_mean = x_mean_t.mean(axis=0), u_mean_t.mean(axis=0)
    floor = MIN_STD * MIN_STD
    x_std = np.sqrt(np.maximum(x_second - x_mean**2, floor))
    u_std = np.sqrt(np.maximum(u_second - u_mean**2, floor))
    return x_mean, x_std, u_mean, u_std


@torch.no_grad()
def latent_statistics(
    encoder: nn.Module, observations: Floats, device: torch.device | str
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Per-dim mean and std (L,) of the encoder's outputs over every training row (float64, combined
    chunk by chunk with Chan's parallel formula); std < MIN_STD → 1."""
    count = 0
    mean: Tensor | None = None
    m2: Tensor | None = None
    for start in range(0, observations.shape[0], _LATENT_CHUNK):
        obs = torch.from_numpy(observations[start : start + _LATENT_CHUNK]).to(device)
        z = encoder(obs).to(torch.float64)
        n = z.shape[0]
        chunk_mean = z.mean(dim=0)
        chunk_m2 = ((z - chunk_mean) ** 2).sum(dim=0)
        if mean is None or m2 is None:
            mean, m2 = chunk_mean, chunk_m2
        else:
            delta = chunk_mean - mean
            total = count + n
            mean = mean + delta * (n / total)
            m2 = m2 + chunk_m2 + delta * delta * (count * n / total)
        count += n
    assert mean is not None and m2 is not None  # TrainingData has at least one row
    std = torch.sqrt(m2 / count)
    std = torch.where(std < MIN_STD, torch.ones_like(std), std)
    return mean.cpu().numpy(), std.cpu().numpy()
