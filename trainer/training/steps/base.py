"""What the job asks of a training step, and the seam through which scale-out averages gradients.

A run has up to two phases (:class:`Phase`): flow matching, then, with ``ode_steps`` > 0, few-step
distillation (:mod:`trainer.training.steps.distill`). Each phase is stepped by one :class:`TrainingStep`, which
draws its own minibatch from the job's generator and takes one optimisation step;
:func:`trainer.training.steps.choose_step` picks the implementation. Nothing here imports the implementations, so
each of them can import this module.
"""

from __future__ import annotations

import math
from enum import Enum
from typing import NamedTuple, Protocol, runtime_checkable

from torch import Tensor

__all__ = [
    "LOSS_SMOOTHING",
    "DeferredStep",
    "GradientAveraging",
    "Phase",
    "StepMetrics",
    "TrainingStep",
    "smoothed",
]

LOSS_SMOOTHING = 0.98
"""Exponential smoothing of the logged loss (the raw per-batch loss is noisy): each step moves the
smoothed value by ``1 - LOSS_SMOOTHING`` of the way to its own loss."""


def smoothed(previous: float, loss: float) -> float:
    """The logged loss after a step whose loss is ``loss`` (on the host): the first step's own (``previous``
    NaN), then :data:`LOSS_SMOOTHING` of ``previous``. The fused step does the same on the device."""
    return loss if math.isnan(previous) else LOSS_SMOOTHING * previous + (1 - LOSS_SMOOTHING) * loss


class StepMetrics(NamedTuple):
    """``loss``: the step's MSE in standardised velocity units; ``grad_norm``: the global L2 norm of the
    gradients before the step."""

    loss: float
    grad_norm: float


class Phase(Enum):
    """The part of a run a step belongs to; the value names it in log lines."""

    FLOW_MATCHING = "flow matching"
    """Ordinary training, from the first iteration to ``TrainingJob.distill_start``."""
    DISTILLATION = "distillation"
    """The last iterations of a run with ``ode_steps`` > 0: the engine's few Euler steps are taught to
    land where the many-step flow lands."""


class TrainingStep(Protocol):
    """One optimisation step of a phase, batch drawing included.

    Every implementation keeps the model's and the optimiser's state current after each step, so the
    job's export and checkpoints read the model and the optimiser and never the step itself."""

    def step(self, iteration: int) -> StepMetrics:
        """Draw a minibatch and take one step. ``iteration`` only names the step in errors.

        Raises :class:`trainer.errors.Diverged` BEFORE the update when the loss or the gradient norm is
        not finite, so the weights (and the EMA) stay those of the last good iteration."""
        ...


@runtime_checkable
class DeferredStep(TrainingStep, Protocol):
    """A step that leaves its numbers on the device: :meth:`launch` takes a step without reading
    anything back to the host (on a GPU the host never waits for the device), :meth:`read` reads once.

    A step whose loss or gradients are not finite is skipped on the device (weights, optimiser state and
    EMA stay those of the last good step), and so is every later one until :meth:`read` reports it:
    a divergence is found at the next read instead of at its own step, with the weights it found.
    ``step`` is ``launch`` then ``read``'s metrics."""

    def launch(self, iteration: int) -> None:
        """Draw a minibatch and take one step, smoothing the loss on the device; no host read.
        ``iteration`` names the step in a later :class:`trainer.errors.Diverged`."""
        ...

    def smooth_from(self, value: float) -> None:
        """Continue the smoothed loss from ``value`` (a resumed run's) instead of from the next step's."""
        ...

    def probe(self) -> Tensor:
        """The smoothed loss now, as a new 0-d tensor on the device (no host read): a metrics point taken
        now and read later with others."""
        ...

    def read(self) -> StepMetrics:
        """One host read: the latest step's metrics, and :attr:`smoothed_loss` updated.

        Raises :class:`trainer.errors.Diverged` (with the first skipped iteration) when a step since the
        last read was not finite; the report clears it, so the next launch trains again."""
        ...

    @property
    def smoothed_loss(self) -> float:
        """The smoothed loss as of the last :meth:`read` (NaN before the first)."""
        ...


class GradientAveraging(Protocol):
    """How a data-parallel run (:mod:`trainer.distributed`) makes every process apply the same update.

    A step calls it at the one point where its gradients exist and the update has not happened yet. A
    step built without one trains alone (one process)."""

    def arm_autograd(self) -> None:
        """Before an autograd step computes its loss: arm the averaging of the coming backward (DDP's
        reducer averages the gradients while the backward runs). Called only when a backward follows:
        an armed reducer without a backward breaks the next iteration."""
        ...

    def average_flat(self, flat_grads: Tensor) -> None:
        """The fused step's flat gradient buffer, after its backward and its finiteness check, before
        AdamW: replace it in place by the processes' average. Raises :class:`trainer.errors.Diverged`
        when the average is not finite (every process sees the same average, so all stop together)."""
        ...
