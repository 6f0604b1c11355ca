"""One training job: the received networks and replay buffer turned into a model, an optimiser and a
sampler, stepped by :mod:`trainer.loop` and exported back to layer values on demand.

This is where the engine's settings (spec §4.1) meet our options (:mod:`trainer.options`): seed,
learning rate, weight decay, batch size, iteration count, observation noise, time distribution, EMA.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from protocol.config import SessionConfig
from protocol.nne.layers import Layer
from protocol.replay import ReplayBuffer
from protocol.snapshot import Snapshot
from trainer.data import TensorData, TrainingData
from trainer.errors import BadData, Unsupported
from trainer.flow import TimeDistribution
from trainer.model import FlowModel, ModelSettings
from trainer.options import TrainerOptions
from trainer.progress import log
from trainer.step import BatchSampler, make_optimizer, train_step

__all__ = ["TrainingJob"]

LOSS_SMOOTHING = 0.98
"""Exponential smoothing of the logged loss (the raw per-batch loss is noisy)."""


@dataclass
class TrainingJob:
    """Everything one run trains. Build with :meth:`create`."""

    config: SessionConfig
    options: TrainerOptions
    model: FlowModel
    optimizer: torch.optim.Optimizer
    sampler: BatchSampler
    generator: torch.Generator
    time_distribution: TimeDistribution
    data: TrainingData
    tensors: TensorData
    device: torch.device
    total_iterations: int
    start_iteration: int = 0
    smoothed_loss: float = math.nan
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def create(
        cls,
        config: SessionConfig,
        received: Mapping[int, Snapshot],
        replay: ReplayBuffer,
        *,
        options: TrainerOptions,
        device: torch.device,
    ) -> TrainingJob:
        training = config.trainer.training
        # Not in this version: refuse rather than silently ignore (the options exist so that settings
        # files written for later versions are read, not rejected as unknown).
        if options.resume:
            raise Unsupported("--resume is not implemented in this version of la-trainer yet.")
        if options.ode_steps > 0:
            raise Unsupported(
                "ode_steps (few-step distillation) is not implemented in this version of la-trainer yet; "
                "unset LA_TRAINER_ODE_STEPS / --ode-steps / 'ode_steps' in la-trainer.json."
            )
        # Same seed, same CPU result: every random draw comes from this one generator (spec §4.1 Seed).
        torch.manual_seed(training.seed)
        generator = torch.Generator(device=device)
        generator.manual_seed(training.seed)
        data = TrainingData.from_replay(replay, config.action_chunk_size)
        if data.row_num == 0:
            raise BadData(
                "the replay buffer holds no steps inside any episode: nothing to train on "
                f"({replay.episode_num} episodes, {replay.step_num} steps)"
            )
        settings = ModelSettings.from_session(config, ema_decay=options.ema_decay)
        model = FlowModel.from_networks(
            received[0].model,
            received[1].model,
            received[2].model,
            config.observation_schema.schema,
            config.action_schema.schema,
            settings,
            data,
            device,
        )
        placement = model.placement
        log(
            f"la-trainer: normalisation: observations in the {placement.observations}, actions in the "
            f"{placement.actions}; latents standardised: {placement.latents_standardized}; "
            f"encoder trained: {placement.encoder_trained}"
        )
        for note in placement.notes:
            log(f"la-trainer: note: {note}")
        tensors = model.tensor_data(data)
        optimizer = make_optimizer(model, training.learning_rate, training.weight_decay)
        sampler = BatchSampler(tensors, training.batch_size, generator)
        try:
            time_distribution = TimeDistribution.parse(options.time_distribution)
        except ValueError as error:
            raise BadData(f"option time_distribution: {error}") from None
        total = options.iteration_num or training.iteration_num
        return cls(
            config=config,
            options=options,
            model=model,
            optimizer=optimizer,
            sampler=sampler,
            generator=generator,
            time_distribution=time_distribution,
            data=data,
            tensors=tensors,
            device=device,
            total_iterations=total,
        )

    @property
    def sample_num(self) -> int:
        return self.data.row_num

    @property
    def observation_dim(self) -> int:
        return int(self.data.observations.shape[1])

    @property
    def action_dim(self) -> int:
        return int(self.data.targets.shape[1])

    def step(self, iteration: int) -> float:
        """One optimisation step; returns the smoothed loss."""
        metrics = train_step(
            self.model,
            self.optimizer,
            self.sampler.next(),
            self.generator,
            self.time_distribution,
            self.config.trainer.training.observation_noise_scale,
            iteration,
        )
        if math.isnan(self.smoothed_loss):
            self.smoothed_loss = metrics.loss
        else:
            self.smoothed_loss = LOSS_SMOOTHING * self.smoothed_loss + (1 - LOSS_SMOOTHING) * metrics.loss
        return self.smoothed_loss

    def export(self) -> dict[int, Layer]:
        """Networks 0 (denoiser), 1 (encoder), 2 (decoder) with every fold applied."""
        exported = self.model.export()
        return {0: exported.denoiser, 1: exported.encoder, 2: exported.decoder}

    def maybe_checkpoint(self, iteration: int, writer: object, *, force: bool = False) -> Path | None:
        """Resumable checkpoints (see :mod:`trainer.checkpoint`); a no-op until enabled there."""
        return None
