"""One optimisation step, and what feeds it: the optimiser and the minibatch sampler.

:func:`train_step` is a plain function (inputs in, metrics out) in the order of the maths: draw noise
and times, interpolate, forward, loss, backward, check, step. Every random number comes from the one
``torch.Generator`` the caller passes (on the training device), so a run is reproducible from its seed
(bitwise on CPU).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from trainer.errors import Diverged
from trainer.system.torch_compat import total_norm
from trainer.training.data import Batch, TensorData
from trainer.training.flow import TimeDistribution, flow_matching_loss, stratified_draws
from trainer.training.model import FlowModel
from trainer.training.nne_torch import LinearModule
from trainer.training.steps.base import StepMetrics

__all__ = [
    "LAYER_LR_CHOICES",
    "AutogradStep",
    "BatchSampler",
    "apply_gradients",
    "layer_lr_scale",
    "make_optimizer",
    "set_learning_rate",
    "train_step",
]


LAYER_LR_CHOICES = ("same", "fan_in")
"""``layer_lr`` values: every parameter at ``LearningRate`` (the engine's trainers), or each Linear layer's
at ``LearningRate · max(1, fan_out / fan_in)`` (:func:`layer_lr_scale`)."""


def layer_lr_scale(module: torch.nn.Module, rule: str) -> float:
    """The learning-rate multiplier of a Linear ``module`` under ``rule`` (1 for anything else).

    ``fan_in``: ``max(1, fan_out / fan_in)``. Adam moves every weight by about the learning rate per step
    whatever its scale, so a layer with few inputs and many outputs (the denoiser's first Linear reads
    [latents | x | t], a handful of values in a small game, into HiddenLayerSize units: 5 -> 128 for B1)
    changes its features far more slowly, relative to their size, than the layers after it. Scaling its rate by
    fan_out/fan_in (the µP-style per-layer rate) lets its features (where the denoiser's kinks sit in
    input space) move as fast as the rest learns; square and narrowing layers keep the rate. (Capping the
    multiplier at 4 was measured worse: ``benchmarks/results/ttq/``.)
    """
    if rule == "same" or not isinstance(module, LinearModule):
        return 1.0
    fan_out, fan_in = module.weight.shape
    return max(1.0, fan_out / fan_in)


def make_optimizer(
    model: FlowModel, lr: float, weight_decay: float, layer_lr: str = "same"
) -> torch.optim.AdamW:
    """AdamW with amsgrad over the trainable parameters: the engine's 5.6/5.7 behaviour-cloning trainer
    uses exactly this with ``LearningRate`` and ``WeightDecay`` (spec §7.2 step 3).

    ``layer_lr`` (:data:`LAYER_LR_CHOICES`): ``same`` is that optimiser; ``fan_in`` puts each Linear
    layer whose :func:`layer_lr_scale` is not 1 in a parameter group of its own, its ``lr`` the scaled
    rate and ``lr_scale`` the multiplier (whoever sets the rate later multiplies by it). Groups keep the
    parameters' order, so each group is a contiguous run of it (the fused step relies on that)."""
    if layer_lr not in LAYER_LR_CHOICES:
        raise ValueError(f"layer_lr must be one of {', '.join(LAYER_LR_CHOICES)}, got {layer_lr!r}")
    params = list(model.trainable_parameters())
    if not params:
        raise ValueError("the model has no trainable parameters")
    scale_of = {
        id(p): layer_lr_scale(module, layer_lr)
        for module in model.modules()
        for p in module.parameters(recurse=False)
    }
    groups: list[dict[str, object]] = []
    for p in params:
        scale = scale_of.get(id(p), 1.0)
        if groups and groups[-1]["lr_scale"] == scale:
            groups[-1]["params"].append(p)  # type: ignore[attr-defined]
        else:
            groups.append({"params": [p], "lr": lr * scale, "lr_scale": scale})
    return torch.optim.AdamW(groups, lr=lr, weight_decay=weight_decay, amsgrad=True)


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Every group's rate from the base ``lr`` and its ``lr_scale`` (:func:`make_optimizer`)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * float(group.get("lr_scale", 1.0))


class BatchSampler:
    """Minibatches of ``batch_size`` rows drawn uniformly WITH replacement from ``data`` (the engine's BC
    trainer samples random steps each iteration, spec §7.2; with replacement there are no epochs to
    track and each batch is one ``randint``). ``generator`` must live on ``data``'s device."""

    def __init__(self, data: TensorData, batch_size: int, generator: torch.Generator) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        self.data = data
        self.batch_size = batch_size
        self.generator = generator

    def next(self) -> Batch:
        index = torch.randint(
            self.data.row_num, (self.batch_size,), generator=self.generator, device=self.data.obs.device
        )
        return Batch(obs=self.data.obs.index_select(0, index), x1=self.data.x1.index_select(0, index))


def train_step(
    model: FlowModel,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    generator: torch.Generator,
    time_dist: TimeDistribution,
    obs_noise_scale: float,
    iteration: int,
    draws_per_row: int = 1,
) -> StepMetrics:
    """One flow-matching step on ``batch`` (see :mod:`trainer.training.flow` for the convention).

    ``draws_per_row`` K > 1: each row is trained on K (x0, t) draws, stratified in t and antithetic in
    x0 (:func:`trainer.training.flow.stratified_draws`; the fused step draws the same).

    ``obs_noise_scale``: ``ObservationNoiseScale``, the largest per-row magnitude of the noise on the
    standardised continuous observations, training only (:meth:`FlowModel.observation_noise`, design.md
    [INF]). ``iteration`` only names the step in errors.
    Raises :class:`Diverged` when the loss or the gradient norm is not finite, BEFORE the optimiser step,
    so the weights (and the EMA) stay those of the last good step. One host sync per step.
    """
    obs, x1 = batch.obs, batch.x1
    if draws_per_row > 1:
        draws = stratified_draws(time_dist, batch.size, draws_per_row, x1.shape[1], generator, x1.device)
        obs, x1 = obs.repeat_interleave(draws_per_row, 0), x1.repeat_interleave(draws_per_row, 0)
        x0, t = draws.x0.to(x1.dtype), draws.t.to(x1.dtype)
    else:
        x0 = torch.randn(x1.shape, generator=generator, device=x1.device, dtype=x1.dtype)
        t = time_dist.sample(batch.size, generator, x1.device, x1.dtype)
    path = model.flow_path(x0, x1, t)

    samples = x1.shape[0]
    noise = model.observation_noise(samples, obs_noise_scale, generator) if obs_noise_scale > 0 else None
    z = model.encode(obs, noise)
    pred = model.velocity_standardized(z, path.x_t, t)
    loss = flow_matching_loss(pred, model.standardize_velocity(path.target))

    metrics = apply_gradients(loss, optimizer, iteration)
    model.update_ema()
    return metrics


class AutogradStep:
    """:func:`train_step` on the sampler's minibatches: the flow-matching :class:`~trainer.training.steps.base.
    TrainingStep` for any model (the readable reference; the fused step covers the engine's MLP).

    ``before_backward``: called before each step's forward (scale-out arms its gradient averaging
    there, :meth:`~trainer.training.steps.base.GradientAveraging.arm_autograd`)."""

    def __init__(
        self,
        model: FlowModel,
        optimizer: torch.optim.Optimizer,
        sampler: BatchSampler,
        generator: torch.Generator,
        time_dist: TimeDistribution,
        obs_noise_scale: float,
        before_backward: Callable[[], None] | None = None,
        draws_per_row: int = 1,
    ) -> None:
        self.model = model
        self.draws_per_row = draws_per_row
        self.optimizer = optimizer
        self.sampler = sampler
        self.generator = generator
        self.time_dist = time_dist
        self.obs_noise_scale = obs_noise_scale
        self.before_backward = before_backward

    def step(self, iteration: int) -> StepMetrics:
        if self.before_backward is not None:
            self.before_backward()
        batch = self.sampler.next()
        return train_step(
            self.model,
            self.optimizer,
            batch,
            self.generator,
            self.time_dist,
            self.obs_noise_scale,
            iteration,
            self.draws_per_row,
        )


def apply_gradients(
    loss: torch.Tensor, optimizer: torch.optim.Optimizer, iteration: int, what: str = "loss"
) -> StepMetrics:
    """Backward, global gradient norm, the finiteness check, then the optimiser step. One host sync.

    Raises :class:`Diverged` *before* the optimiser step when the loss or the gradient norm is not
    finite, so the weights and moments stay those of the last good iteration."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()  # type: ignore[no-untyped-call]
    grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    grad_norm = total_norm(grads) if grads else torch.zeros((), device=loss.device)
    loss_value, norm_value = torch.stack((loss.detach().float(), grad_norm.float())).tolist()
    if not (math.isfinite(loss_value) and math.isfinite(norm_value)):
        optimizer.zero_grad(set_to_none=True)
        raise Diverged(
            f"the {what} became non-finite at iteration {iteration} ({what} {loss_value}, gradient norm "
            f"{norm_value}); the weights of the last good iteration were kept"
        )
    optimizer.step()
    return StepMetrics(loss=loss_value, grad_norm=norm_value)
