"""Training steps: one protocol, the implementations, and the one place that chooses between them.

Every step is a :class:`~trainer.training.steps.base.TrainingStep` (``step(iteration) -> StepMetrics``, batch
drawing included). :func:`choose_step` builds the one for a phase of the run and logs which and why:

* flow matching, the engine's MLP denoiser with a frozen encoder: :class:`~trainer.training.steps.fused.FusedStep`
  (:mod:`trainer.training.steps.fused`: same draws and maths as the reference, fewer kernels), its arithmetic
  ``torch.compile``-d (:mod:`trainer.training.steps.compiled`) when the ``compile`` option asks and it can;
  on CUDA replayed as one CUDA graph (:class:`~trainer.training.steps.graphed.GraphedStep`) unless compiled;
* flow matching, any other model: :class:`~trainer.training.steps.autograd.AutogradStep` (the readable reference);
* distillation (the last part of a run with ``ode_steps`` > 0):
  :class:`~trainer.training.steps.distill.DistillationStep`.

Scale-out plugs in through :class:`~trainer.training.steps.base.GradientAveraging`, passed in :class:`StepInputs`:
each implementation calls it where its gradients exist and its update has not happened yet.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from trainer.system.console import log
from trainer.training.data import TensorData
from trainer.training.flow import TimeDistribution
from trainer.training.model import FlowModel
from trainer.training.steps.autograd import AutogradStep, BatchSampler
from trainer.training.steps.base import GradientAveraging, Phase, StepMetrics, TrainingStep
from trainer.training.steps.compiled import compile_wanted
from trainer.training.steps.distill import DistillationStep, Distiller, DistillSettings
from trainer.training.steps.fused import FusedStep, fused_step_unsupported
from trainer.training.steps.graphed import GraphedStep, graph_unavailable

__all__ = [
    "GradientAveraging",
    "Phase",
    "StepInputs",
    "StepMetrics",
    "TrainingStep",
    "choose_step",
    "fused_step",
]


@dataclass(frozen=True, slots=True)
class StepInputs:
    """What a step trains and draws from: the job's model, optimiser, data and random stream, and the
    settings that decide the implementation. ``layer_lr``: the per-layer learning-rate rule of the
    optimisers built here (the distillation phase's; :func:`trainer.training.steps.autograd.make_optimizer`).

    ``sampler.batch_size`` is this process's share of the batch (the config's ``BatchSize``, or B / N
    under scale-out), which the fused step draws too. ``compile``: the option (``"on"``/``"off"``).
    ``ode_steps``: the game's step count, used by the distillation phase. ``averaging``: scale-out's
    gradient averaging (None: one process). ``draws_per_row``: (x0, t) draws per batch row in the flow-matching
    phase (:func:`trainer.training.flow.stratified_draws`; 1: one independent draw, the reference's stream).
    ``cuda_graph``: on CUDA, replay the fused step as a CUDA graph (False: eager)."""

    model: FlowModel
    optimizer: torch.optim.Optimizer
    tensors: TensorData
    sampler: BatchSampler
    generator: torch.Generator
    time_distribution: TimeDistribution
    obs_noise_scale: float
    learning_rate: float
    weight_decay: float
    device: torch.device
    layer_lr: str = "same"
    compile: str = "off"
    ode_steps: int = 0
    averaging: GradientAveraging | None = None
    draws_per_row: int = 1
    cuda_graph: bool = True


def fused_step(
    inputs: StepInputs,
    *,
    compiled: bool = False,
    average_gradients: Callable[[torch.Tensor], None] | None = None,
    device_state: bool = False,
) -> FusedStep | None:
    """The fused step over ``inputs`` (None where it cannot run them: :func:`fused_step_unsupported`);
    ``device_state``: every number that changes between steps read from a device tensor, as a CUDA
    graph needs (:mod:`trainer.training.steps.graphed`)."""
    return FusedStep.build(
        inputs.model,
        inputs.optimizer,
        inputs.tensors,
        inputs.sampler.batch_size,
        inputs.generator,
        inputs.time_distribution,
        inputs.obs_noise_scale,
        compiled=compiled,
        average_gradients=average_gradients,
        draws_per_row=inputs.draws_per_row,
        device_state=device_state,
    )


def choose_step(phase: Phase, inputs: StepInputs, iteration: int) -> TrainingStep:
    """The step for ``phase``, built now, with one log line where the choice is worth knowing.

    Build it at the phase's first iteration, after anything that loads state (a resume): the fused step
    adopts the model's and the optimiser's tensors as they are then, and the distillation phase freezes
    its teacher from the model as ordinary training left it."""
    averaging = inputs.averaging
    arm = None if averaging is None else averaging.arm_autograd
    if phase is Phase.DISTILLATION:
        distiller = Distiller(
            inputs.model,
            DistillSettings(inputs.ode_steps),
            learning_rate=inputs.learning_rate,
            weight_decay=inputs.weight_decay,
            layer_lr=inputs.layer_lr,
            time_dist=inputs.time_distribution,
            obs_noise_scale=inputs.obs_noise_scale,
        )
        log(f"la-trainer: iteration {iteration}: distilling for {inputs.ode_steps} Euler step(s)")
        return DistillationStep(distiller, inputs.sampler, inputs.generator, arm)

    compiled, why = compile_wanted(inputs.compile, inputs.device)
    if compiled and averaging is not None:
        # [INF] Scale-out has always run the eager fused step: the compiled function with the gradient
        # all-reduce between it and AdamW has not been measured or tested.
        compiled, why = False, "scale-out runs the eager fused step"
    # [INF] Scale-out's all-reduce sits between the backward and AdamW: not captured (not measured).
    graphed = (
        inputs.cuda_graph and not compiled and averaging is None and graph_unavailable(inputs.device) is None
    )
    fused = fused_step(
        inputs,
        compiled=compiled,
        average_gradients=None if averaging is None else averaging.average_flat,
        device_state=graphed,
    )
    if fused is None:
        reason = fused_step_unsupported(inputs.model, inputs.optimizer)
        log(f"la-trainer: note: using the autograd training step ({reason})")
        return AutogradStep(
            inputs.model,
            inputs.optimizer,
            inputs.sampler,
            inputs.generator,
            inputs.time_distribution,
            inputs.obs_noise_scale,
            arm,
            draws_per_row=inputs.draws_per_row,
        )
    if fused.compiling:
        log("la-trainer: compiling the training step with torch.compile (once per run; seconds)")
    elif inputs.compile.strip().lower() == "on":
        # Wanted and available, yet not compiling: the compiled function gathers precomputed latents,
        # which this buffer is too large for (trainer.training.steps.fused.PRECOMPUTE_LIMIT_BYTES).
        if not compiled:
            reason = why
        elif inputs.model.fitted_source:
            reason = "NormalizeLatents' fitted-source path runs eagerly"
        else:
            reason = "the replay buffer's latents are too large to precompute"
        log(f"la-trainer: warning: training step not compiled ({reason})")
    if graphed:
        return GraphedStep(fused)  # logs whether the capture worked, at the step after the warm-up
    return fused
