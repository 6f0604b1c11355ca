"""One training job: the received networks and replay buffer turned into a model, an optimiser and a
sampler, stepped by :mod:`trainer.session.run` and exported back to layer values on demand.

This is where the engine's settings (spec §4.1) meet our options (:mod:`trainer.settings.options`): seed,
learning rate, weight decay, batch size, iteration count, observation noise, time distribution, EMA.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from protocol.config import SessionConfig
from protocol.names import NetworkId
from protocol.nne.layers import Layer
from protocol.replay import ReplayBuffer
from protocol.snapshot import Snapshot
from trainer import __version__
from trainer.errors import BadData, Diverged
from trainer.settings.options import TrainerOptions
from trainer.settings.recipes import RECIPES, Recipe, recipe_named
from trainer.system.console import log
from trainer.system.diskspace import OptionalWrite
from trainer.training.checkpoint import (
    CheckpointError,
    Fingerprint,
    TrainingState,
    load_for_resume,
    remove_stale_temp_files,
    save_checkpoint,
)
from trainer.training.copies import exported_layers
from trainer.training.data import TensorData, TrainingData
from trainer.training.flow import TimeDistribution
from trainer.training.heldout import DEFAULT_ODE_STEPS, EpisodeSplit, HeldOutEvaluator, split_episodes
from trainer.training.model import FlowModel, ModelSettings
from trainer.training.recipes import (
    MIN_ITERATIONS,
    Lane,
    RecipeLook,
    RecipePilot,
    fixed_by_user,
    pilot_plan,
)
from trainer.training.steps import GradientAveraging, Phase, StepInputs, TrainingStep, choose_step
from trainer.training.steps.autograd import BatchSampler, make_optimizer, set_learning_rate
from trainer.training.steps.base import LOSS_SMOOTHING, DeferredStep, smoothed
from trainer.training.steps.distill import RECOMMENDED_ITERATIONS, DistillSettings, distill_iterations

__all__ = ["LOSS_SMOOTHING", "TrainingJob"]


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
    distill_start: int | None = None
    """First distillation iteration (``options.ode_steps`` > 0, see :mod:`trainer.training.steps.distill`); None: off."""
    gradient_averaging: GradientAveraging | None = None
    """Scale-out's averaging of every step's gradients across the processes (:mod:`trainer.distributed`);
    None: this process trains alone."""
    phase: Phase | None = field(default=None, init=False)
    """The phase :attr:`training_step` belongs to; None before the first step."""
    training_step: TrainingStep | None = field(default=None, init=False, repr=False)
    """The step of the current phase, chosen at the phase's first iteration by
    :func:`trainer.training.steps.choose_step` (after anything that loads state, so it adopts the loaded state)."""
    checkpoint_dir: Path | None = None
    """Where resumable checkpoints go (``<task_dir>/Snapshots``); None: no checkpoints."""
    fingerprint: Fingerprint | None = None
    """What a checkpoint of this job is valid for (networks, config, data), see :mod:`trainer.training.checkpoint`."""
    last_checkpoint: Path | None = None
    checkpoint_iteration: int = -1
    """Iteration of the newest checkpoint this job wrote or resumed from (−1: none)."""
    checkpoint_clock: float = field(default_factory=time.monotonic)
    checkpoint_failed: bool = False
    """The newest checkpoint attempt found the disk full (:attr:`checkpoint_iteration` is older than the
    state then)."""
    checkpoint_disk: OptionalWrite = field(
        default_factory=lambda: OptionalWrite("checkpoints", "at the next checkpoint"), repr=False
    )
    heldout: HeldOutEvaluator | None = None
    """The held-out measurements (:mod:`trainer.training.heldout`); None: nothing held out, or a scale-out rank
    other than 0."""
    cuda_graph: bool = True
    """On CUDA, replay the fused step as one CUDA graph where it captures
    (:mod:`trainer.training.steps.graphed`); False: the eager fused step (the bench's comparison)."""
    unread: int = field(default=0, init=False)
    """Steps launched since the last :meth:`settle` (their numbers are still on the device)."""
    _checked: tuple[TrainingStep | None, DeferredStep | None] = field(
        default=(None, None), init=False, repr=False
    )
    """(step, the same step if it is a DeferredStep): ``isinstance`` on a runtime-checkable protocol costs
    tens of microseconds, too much to ask every step."""
    recipe: Recipe | None = None
    """The recipe trained (:mod:`trainer.training.recipes`; during the pilot, the leader); None: the user's own
    time density and spread (a recipe knob was set)."""
    recipe_why: str = ""
    """Why the recipe is what it is, for the log and the run record."""
    pilot_wanted: bool = False
    """The pilot starts at the first step (:meth:`step`), unless scale-out or a resume fixed the recipe."""
    pilot: RecipePilot | None = field(default=None, repr=False)
    recipe_looks: list[RecipeLook] = field(default_factory=list, repr=False)
    """Pilot looks not yet taken by the session (:meth:`take_recipe_looks`)."""

    @classmethod
    def create(
        cls,
        config: SessionConfig,
        received: Mapping[int, Snapshot],
        replay: ReplayBuffer,
        *,
        options: TrainerOptions,
        device: torch.device,
        checkpoint_dir: Path | None = None,
    ) -> TrainingJob:
        """Build the job; with ``options.resume`` and a checkpoint in ``checkpoint_dir`` (or in the
        folder of an earlier run of the same task), continue from it. ``options`` were checked where they
        were read (:mod:`trainer.settings.options`): nothing here refuses them again.

        Raises:
            ResumeRefused: the checkpoint belongs to other networks, config or data, or none is usable.
        """
        training = config.trainer.training
        # Same seed, same CPU result: every random draw comes from this one generator (spec §4.1 Seed).
        torch.manual_seed(training.seed)
        generator = torch.Generator(device=device)
        generator.manual_seed(training.seed)
        # Held-out episodes (trainer.training.heldout): with the option off or too few episodes the split
        # holds nothing out and the training data is built exactly as without it.
        split = split_episodes(
            replay.episode_lengths, options.heldout_share, options.heldout_min_episodes, training.seed
        )
        data = TrainingData.from_replay(
            replay, config.action_chunk_size, split.train if split.active else None
        )
        _check_batch_fits(config, data, options.draws_per_row, device)
        model = _model(config, received, options, data, device)
        tensors = model.tensor_data(data)
        optimizer = make_optimizer(model, training.learning_rate, training.weight_decay, options.layer_lr)
        sampler = BatchSampler(tensors, training.batch_size, generator)
        time_distribution = TimeDistribution.of(options.time_distribution)
        total = options.iteration_num or training.iteration_num
        distill_start = _distill_start(options, total)
        recipe, recipe_why, pilot_wanted = _recipe(options, split.active, total, distill_start)
        if recipe is not None:
            time_distribution = TimeDistribution.of(recipe.time_distribution)
            model.spread = (options.spread_start, recipe.spread_gain)
        heldout = _heldout(config, replay, split, model, options, time_distribution, total, device)
        job = cls(
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
            distill_start=distill_start,
            checkpoint_dir=checkpoint_dir,
            fingerprint=Fingerprint.of(config, received, replay, ema_decay=options.ema_decay),
            heldout=heldout,
            recipe=recipe,
            recipe_why=recipe_why,
            pilot_wanted=pilot_wanted,
        )
        if checkpoint_dir is not None:
            for stale in remove_stale_temp_files(checkpoint_dir):
                log(f"la-trainer: removed {stale.name}, left by a checkpoint write that did not finish")
        if options.resume:
            if checkpoint_dir is None:
                log("la-trainer: warning: --resume: this run has no folder for checkpoints; starting fresh.")
            else:
                job._resume()
        return job

    def _resume(self) -> None:
        """Load the newest usable checkpoint (``--resume``) into the model, optimiser and generator.

        Runs before the first step, so the step chosen then (:func:`trainer.training.steps.choose_step`) adopts the
        loaded state.
        """
        assert self.checkpoint_dir is not None and self.fingerprint is not None  # create() sets both
        state, notes = load_for_resume(self.checkpoint_dir, self.fingerprint)
        for note in notes:
            log(f"la-trainer: resume: {note}")
        if state is None:
            # [INF] --resume without a checkpoint starts fresh (ML-Agents refuses): an engine-spawned run
            # gets a new task folder each time, so a standing LA_TRAINER_RESUME=1 must not break the first.
            log(f"la-trainer: --resume: no checkpoint in {self.checkpoint_dir}; starting a fresh run.")
            return
        self.model.load_state_dict(state.model)
        self.optimizer.load_state_dict(_regrouped(state.optimizer, self.optimizer.state_dict()))
        training = self.config.trainer.training
        # The config of this run wins for the knobs a user may change between crash and resume.
        set_learning_rate(self.optimizer, training.learning_rate)
        for group in self.optimizer.param_groups:
            group["weight_decay"] = training.weight_decay
        if state.generator_device == self.generator.device.type:
            self.generator.set_state(state.generator)
        else:
            # A CPU generator state cannot seed a CUDA generator (and vice versa): reseed from the run's
            # seed and the iteration, so the resumed run is still reproducible on this device.
            self.generator.manual_seed(training.seed + state.iteration)
            log(
                f"la-trainer: note: the checkpoint was made on {state.generator_device}; the random generator "
                f"was reseeded for {self.generator.device.type}"
            )
        if self.recipe is not None and self.options.recipe == "auto":
            # The checkpoint's recipe goes on, without a pilot: the one a pilot chose, or its leader when
            # the run stopped during the pilot; a checkpoint without one trained the standard recipe.
            named = state.recipe or RECIPES[0].name
            if named not in {recipe.name for recipe in RECIPES}:
                log(
                    f"la-trainer: resume: the checkpoint's recipe {named!r} is unknown here; continuing as standard"
                )
                named = RECIPES[0].name
            self._use_recipe(recipe_named(named), f"continued from the checkpoint ({named})")
            log(f"la-trainer: recipe: {recipe_named(named).describe()}, continued from the checkpoint")
        self.start_iteration = state.iteration
        self.smoothed_loss = state.smoothed_loss
        self.checkpoint_iteration = state.iteration
        log(
            f"la-trainer: resumed from the checkpoint of iteration {state.iteration} in {self.checkpoint_dir}"
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

    def _use_recipe(self, recipe: Recipe, why: str) -> None:
        """Train ``recipe`` without a pilot (a resumed run continues its checkpoint's)."""
        self.recipe, self.recipe_why, self.pilot_wanted = recipe, why, False
        self.time_distribution = TimeDistribution.of(recipe.time_distribution)
        self.model.spread = (self.options.spread_start, recipe.spread_gain)

    def _start_pilot(self, iteration: int) -> None:
        self.pilot_wanted = False
        if self.gradient_averaging is not None:
            self.recipe_why = "scale-out trains one recipe (each rank would need every candidate's gradients)"
            log(f"la-trainer: recipe: {RECIPES[0].describe()}: {self.recipe_why}")
            return
        if iteration != 0 or self.heldout is None:
            return
        training = self.config.trainer.training
        self.pilot = RecipePilot.start(
            self._lane(),
            self._step_inputs,
            seed=training.seed,
            learning_rate=training.learning_rate,
            weight_decay=training.weight_decay,
            layer_lr=self.options.layer_lr,
            spread_start=self.options.spread_start,
        )
        log(f"la-trainer: recipe pilot: {pilot_plan()}")

    def _lane(self) -> Lane:
        """The job's own training state as a pilot candidate."""
        assert self.recipe is not None
        return Lane(
            recipe=self.recipe,
            model=self.model,
            optimizer=self.optimizer,
            sampler=self.sampler,
            generator=self.generator,
            time_distribution=self.time_distribution,
            training_step=self.training_step,
            phase=self.phase,
            smoothed_loss=self.smoothed_loss,
        )

    def _install(self, lane: Lane) -> None:
        """Train ``lane`` from now on (the pilot's leader or choice)."""
        self.recipe = lane.recipe
        self.model, self.optimizer, self.sampler = lane.model, lane.optimizer, lane.sampler
        self.generator, self.time_distribution = lane.generator, lane.time_distribution
        self.training_step, self.phase, self.smoothed_loss = (
            lane.training_step,
            lane.phase,
            lane.smoothed_loss,
        )

    def take_recipe_looks(self) -> list[RecipeLook]:
        """The pilot's looks since the last call (the session writes them to the log and the record)."""
        looks, self.recipe_looks = self.recipe_looks, []
        return looks

    def recipe_record(self) -> dict[str, Any]:
        """run.json's ``recipe``: what trains and why."""
        if self.pilot is not None:
            return {**self.pilot.summary(), "why": self.recipe_why}
        if self.recipe is None:
            return {"name": "custom", "why": self.recipe_why}
        return {
            "name": self.recipe.name,
            "time_distribution": str(self.recipe.time_distribution),
            "spread_gain": self.recipe.spread_gain,
            "chosen_by": "option" if self.options.recipe != "auto" else "default",
            "why": self.recipe_why,
        }

    def step(self, iteration: int) -> float:
        """One optimisation step (flow matching, or distillation from :attr:`distill_start` on), then
        :meth:`settle`: returns the smoothed loss; one host read per step."""
        self._advance(iteration)
        return self.settle()

    def advance(self, iteration: int) -> None:
        """One optimisation step without a host read where the step allows it
        (:class:`~trainer.training.steps.base.DeferredStep`: the fused step, eager or as a CUDA graph):
        its loss is smoothed on the device and a non-finite step is skipped there, both reported by
        the next :meth:`settle`. Other steps read their numbers at once, as before. During the recipe
        pilot every other candidate steps first, the same way; before each of the pilot's looks every
        candidate's steps are read, and after a look the job may train another candidate
        (:mod:`trainer.training.recipes`)."""
        self._advance(iteration)

    def _advance(self, iteration: int) -> None:
        if self.pilot_wanted:
            self._start_pilot(iteration)
        pilot = self.pilot if self.pilot is not None and self.pilot.active else None
        if pilot is None:
            self._own_advance(iteration)
            return
        for name in pilot.step_others(iteration):
            log(f"la-trainer: recipe pilot: {name} diverged at iteration {iteration}; it stops")
        try:
            self._own_advance(iteration)
            if pilot.look_due(iteration + 1):
                self.settle()  # the look compares the candidates' weights: every launched step read first
        except Diverged:
            if not pilot.others:
                raise
            # [INF] A candidate that diverges during the pilot stops; the job's own is no exception.
            failed, successor = self.recipe, pilot.others.pop(0)
            self._install(successor)
            pilot.leader = successor.recipe
            log(
                f"la-trainer: recipe pilot: {failed.name if failed else '?'} diverged at iteration {iteration}; "
                f"it stops and {successor.recipe.name} leads"
            )
            if not pilot.others:
                pilot.done = True
        if self.heldout is not None and pilot.active:
            look, lane = pilot.look(iteration + 1, self._lane(), self.heldout)
            if look is not None:
                if lane.recipe is not self.recipe:
                    self._install(lane)
                if look.final:
                    self.recipe_why = look.why()
                self.recipe_looks.append(look)
                log(f"la-trainer: {look.describe()}")

    def _own_advance(self, iteration: int) -> None:
        phase = Phase.FLOW_MATCHING
        if self.distill_start is not None and iteration >= self.distill_start:
            phase = Phase.DISTILLATION
        if phase is not self.phase or self.training_step is None:
            self.settle()  # the phase that ends may hold unread steps (and an unreported divergence)
            self.training_step = choose_step(phase, self._step_inputs(), iteration)
            if phase is Phase.DISTILLATION:
                self.smoothed_loss = math.nan  # another loss: do not smooth across the boundary
            elif (deferred := self._deferred()) is not None:
                deferred.smooth_from(self.smoothed_loss)  # a resumed run's, or NaN
            self.phase = phase
        deferred = self._deferred()
        if deferred is not None:
            deferred.launch(iteration)
            self.unread += 1
            return
        assert self.training_step is not None
        self.smoothed_loss = smoothed(self.smoothed_loss, self.training_step.step(iteration).loss)

    def settle(self) -> float:
        """Read what the launched steps left on the device (one host read; none when nothing is unread):
        :attr:`smoothed_loss` is current afterwards. Raises :class:`trainer.errors.Diverged` when one of
        them was not finite; it was skipped on the device, and so was every step after it, so the weights
        are those of the iteration the error names (``Diverged.iteration``)."""
        step = self._deferred()
        if self.unread == 0 or step is None:
            return self.smoothed_loss
        self.unread = 0
        try:
            step.read()
        finally:  # after a Diverged: the last good step's
            self.smoothed_loss = step.smoothed_loss
        return self.smoothed_loss

    def loss_probe(self) -> torch.Tensor | float:
        """The smoothed loss now without a host read: a 0-d device tensor while steps are unread (read it
        later, with others), else :attr:`smoothed_loss`."""
        step = self._deferred()
        if self.unread and step is not None:
            return step.probe()
        return self.smoothed_loss

    def _deferred(self) -> DeferredStep | None:
        """The current step when it leaves its numbers on the device, else None (cached per step)."""
        step = self.training_step
        if step is not self._checked[0]:
            self._checked = (step, step if isinstance(step, DeferredStep) else None)
        return self._checked[1]

    def _step_inputs(self, lane: Lane | None = None) -> StepInputs:
        """The inputs of a step of the job's own training state, or of a pilot candidate's ``lane``."""
        own: Lane | TrainingJob = self if lane is None else lane
        training = self.config.trainer.training
        return StepInputs(
            model=own.model,
            optimizer=own.optimizer,
            tensors=self.tensors,
            sampler=own.sampler,
            generator=own.generator,
            time_distribution=own.time_distribution,
            obs_noise_scale=training.observation_noise_scale,
            learning_rate=training.learning_rate,
            weight_decay=training.weight_decay,
            layer_lr=self.options.layer_lr,
            device=self.device,
            compile=self.options.compile,
            ode_steps=self.options.ode_steps,
            averaging=self.gradient_averaging,
            draws_per_row=self.options.draws_per_row,
            cuda_graph=self.cuda_graph,
        )

    def export(self) -> dict[int, Layer]:
        """Networks 0 (denoiser), 1 (encoder), 2 (decoder) with every fold applied."""
        return exported_layers(self.model)

    def maybe_checkpoint(self, iteration: int, *, force: bool = False) -> Path | None:
        """Write a resumable checkpoint after ``iteration`` steps when one is due; returns its path.

        Due: ``force`` (end of run, stop, interrupt, lost engine), or ``checkpoint_every_seconds`` since the
        last one (0: only forced ones). Checkpoints go to :attr:`checkpoint_dir`, the same folder as the
        snapshots, whether or not the config saves snapshots. Cheap when not due.

        [INF] Distillation (the last part of a run with ``ode_steps`` > 0) is not checkpointed: its teacher
        and second optimiser would double the file. A checkpoint is forced at the phase boundary instead,
        so a resume repeats at most the distillation phase.
        """
        if self.checkpoint_dir is None or self.fingerprint is None:
            return None
        boundary = self.distill_start is not None and iteration == self.distill_start
        if self.distill_start is not None and iteration > self.distill_start:
            return self.last_checkpoint
        if iteration == self.checkpoint_iteration:
            return self.last_checkpoint
        every = self.options.checkpoint_every_seconds
        now = time.monotonic()
        if not (force or boundary or (every > 0 and now - self.checkpoint_clock >= every)):
            return None
        if self.pilot is not None and self.pilot.active and not force:
            # [INF] Not during the pilot (its candidates are not in a checkpoint): the first timed one
            # comes after the pick; a forced one keeps the leader, whose recipe a resume continues.
            return None
        # Steps still unread may hold a divergence, skipped on the device with every step after it: read
        # them first (Diverged: no checkpoint; the loop ends as diverged and checkpoints the good weights),
        # so that a checkpoint's iteration is that of its weights and its smoothed loss is current.
        self.settle()
        state = TrainingState(
            iteration=iteration,
            model=self.model.state_dict(),
            optimizer=self.optimizer.state_dict(),
            generator=self.generator.get_state(),
            generator_device=self.generator.device.type,
            smoothed_loss=float(self.smoothed_loss),
            fingerprint=self.fingerprint,
            recipe=self.recipe.name if self.recipe is not None else "",
            trainer_version=__version__,
            saved_at=time.time(),
        )
        try:
            self.last_checkpoint = save_checkpoint(self.checkpoint_dir, state)
        except (OSError, RuntimeError) as error:
            # A full disk (torch.save reports it as a RuntimeError raised while handling the OSError): the
            # previous checkpoint stays whole (atomic_file), training goes on, and the next due (or forced)
            # checkpoint tries again; any other error is the run's.
            if not self.checkpoint_disk.failed(self.checkpoint_dir, error):
                raise
            self.checkpoint_failed = True
            self.checkpoint_clock = time.monotonic()
            return self.last_checkpoint
        self.checkpoint_disk.written()
        self.checkpoint_failed = False
        self.checkpoint_iteration = iteration
        self.checkpoint_clock = time.monotonic()
        return self.last_checkpoint


def _check_batch_fits(
    config: SessionConfig, data: TrainingData, draws_per_row: int, device: torch.device
) -> None:
    """Refuse a BatchSize whose step cannot fit in this machine's memory before anything is allocated: the
    allocation would end the run in an out-of-memory traceback (a 100,000,000-row batch did) or, worse,
    in the kernel's OOM killer. Only what a step certainly holds is counted (each sample's inputs and
    targets, every layer's activation and its gradient, as float32), against all the memory of the
    device, so a batch refused here could never run; one that passes may still be too large for what
    is free. Unknown memory (Windows' CPU): not checked."""
    rows = config.trainer.training.batch_size * max(1, draws_per_row)
    flow = config.model.flow_matching
    floats = int(data.observations.shape[1]) + int(data.targets.shape[1])
    floats += 2 * flow.hidden_layer_size * (flow.hidden_layer_num + 1)
    needed = rows * floats * 4
    available = _memory_bytes(device)
    if available is None or needed <= available:
        return
    raise BadData(
        f"BatchSize {config.trainer.training.batch_size} does not fit in memory: one training step holds at "
        f"least {needed / 1e9:,.1f} GB ({rows} rows x {floats} floats: inputs, targets and every "
        f"HiddenLayerSize-wide activation with its gradient), and {device} has {available / 1e9:,.1f} GB. "
        "Lower BatchSize (the game's training settings; la-trainer record --batch-size); the engine's "
        "default is 256."
    )


def _memory_bytes(device: torch.device) -> int | None:
    """All the memory of ``device`` in bytes (a CUDA device's, or this machine's RAM); None: unknown."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows) or no such name
        return None


def _model(
    config: SessionConfig,
    received: Mapping[int, Snapshot],
    options: TrainerOptions,
    data: TrainingData,
    device: torch.device,
) -> FlowModel:
    """The model from the received networks (:meth:`FlowModel.from_networks`), and one log line on where
    the normalisation went (and a note for each fallback)."""
    settings = ModelSettings.from_session(
        config,
        ema_decay=options.ema_decay,
        spread_start=options.spread_start,
        spread_gain=options.spread_gain,
    )
    model = FlowModel.from_networks(
        received[NetworkId.DENOISER].model,
        received[NetworkId.ENCODER].model,
        received[NetworkId.DECODER].model,
        config.observation_schema.schema,
        config.action_schema.schema,
        settings,
        data,
        device,
    )
    placement = model.placement
    log(
        f"la-trainer: normalisation: observations in the {placement.observations}, actions in the "
        f"{placement.actions}; source fitted to the data (NormalizeLatents): {placement.fitted_source}; "
        f"encoder trained: {placement.encoder_trained}"
    )
    for note in placement.notes:
        log(f"la-trainer: note: {note}")
    return model


def _distill_start(options: TrainerOptions, total: int) -> int | None:
    """The first distillation iteration (``ode_steps`` > 0): the last iterations distil for the game's
    ODEStepsNum, as many as fit into ``distill_fraction`` of the run's time (trainer.training.steps.
    distill); None when off. Says so, with a warning below the recommended count."""
    if options.ode_steps <= 0:
        return None
    cost = DistillSettings(options.ode_steps).cost
    distill_start = total - distill_iterations(total, options.distill_fraction, cost)
    log(
        f"la-trainer: distilling for {options.ode_steps} Euler step(s) from iteration {distill_start} "
        f"({total - distill_start} of {total} iterations: distill_fraction {options.distill_fraction:g} "
        f"of the run's time, as estimated for a distillation iteration costing {cost:.1f} flow-matching "
        "iterations)"
    )
    if total - distill_start < RECOMMENDED_ITERATIONS:
        log(
            f"la-trainer: warning: {total - distill_start} distillation iterations are fewer than the "
            f"{RECOMMENDED_ITERATIONS} that measured close to many-step quality (docs/distillation.md); "
            "raise IterationNum or distill_fraction for better few-step behaviour."
        )
    return distill_start


def _recipe(
    options: TrainerOptions, heldout: bool, total: int, distill_start: int | None
) -> tuple[Recipe | None, str, bool]:
    """The recipe the run starts with, why, and whether the pilot runs (:mod:`trainer.training.recipes`);
    one log line unless the pilot's own follows at the first step."""
    if options.recipe != "auto":
        recipe = recipe_named(options.recipe)
        log(f"la-trainer: recipe: {recipe.describe()} (option recipe)")
        return recipe, "option recipe", False
    changed = fixed_by_user(options)
    if changed:
        why = f"your {', '.join(changed)} (a recipe knob is set: no pilot)"
        log(f"la-trainer: recipe: {why}")
        return None, why, False
    standard = RECIPES[0]
    if not heldout:
        why = "nothing is held out to choose by (option heldout_share, heldout_min_episodes)"
    elif total < MIN_ITERATIONS:
        why = f"the run's {total} iterations are fewer than the pilot's minimum of {MIN_ITERATIONS}"
    elif distill_start is not None and distill_start < MIN_ITERATIONS:
        why = f"distillation starts at iteration {distill_start}, before the pilot would end"
    else:
        return standard, "pilot", True
    if options.heldout_share > 0:  # hold-out switched off (a benchmark's job): nothing to say about it
        log(f"la-trainer: recipe: {standard.describe()}: no pilot, {why}")
    return standard, why, False


def _heldout(
    config: SessionConfig,
    replay: ReplayBuffer,
    split: EpisodeSplit,
    model: FlowModel,
    options: TrainerOptions,
    time_distribution: TimeDistribution,
    total: int,
    device: torch.device,
) -> HeldOutEvaluator | None:
    """The held-out measurements when the split holds episodes out (one log line either way)."""
    if not split.active:
        if options.heldout_share > 0:
            log(
                f"la-trainer: nothing held out: {int((replay.episode_lengths > 0).sum())} episodes, fewer than "
                f"heldout_min_episodes ({options.heldout_min_episodes}); training on every episode"
            )
        return None
    heldout = HeldOutEvaluator.build(
        model,
        TrainingData.from_replay(replay, config.action_chunk_size, split.heldout),
        episodes=int(split.heldout.size),
        time_distribution=time_distribution,
        seed=config.trainer.training.seed,
        steps=options.ode_steps or DEFAULT_ODE_STEPS,
        device=device,
    )
    log(
        f"la-trainer: held out {split.heldout.size} of {split.heldout.size + split.train.size} episodes "
        f"({heldout.rows} rows) to measure imitation quality on, every "
        f"{options.heldout_every_iterations or total} iterations at {heldout.steps} Euler steps "
        "(option heldout_share; trainer/training/heldout.py). The progress line then ends in its numbers: "
        "the selection score, samples against the demonstrated actions, comparable across runs (higher "
        "is better; it picks the recipe and the best networks), the held-out flow loss (lower is better), "
        "the energy score of the sampled actions against the "
        "demonstrated ones (lower is better) and the coverage, the share of held-out rows whose demonstrated "
        "action the policy reaches (higher is better); la-trainer watch shows them too"
    )
    return heldout


def _regrouped(saved: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any]:
    """The checkpoint's optimiser state in this run's parameter groups.

    ``layer_lr`` decides how the parameters are grouped (one group, or one per distinct per-layer rate),
    and it may differ between the run that wrote the checkpoint and this one (a user changed it, or a
    newer la-trainer changed its default). The Adam moments belong to each parameter, not to its group,
    and the parameters come in the same order either way (the fingerprint has checked the networks), so
    the moments carry over by position; the groups' settings are this run's, as for the learning rate.
    """
    saved_ids = [i for group in saved["param_groups"] for i in group["params"]]
    current_ids = [i for group in current["param_groups"] for i in group["params"]]
    if saved_ids == current_ids and len(saved["param_groups"]) == len(current["param_groups"]):
        return dict(saved)
    if len(saved_ids) != len(current_ids):
        raise CheckpointError(
            f"the checkpoint's optimiser holds {len(saved_ids)} parameters, this model {len(current_ids)}"
        )
    by_position = dict(zip(saved_ids, current_ids, strict=True))
    state = {by_position[key]: value for key, value in saved["state"].items()}
    return {"state": state, "param_groups": [dict(group) for group in current["param_groups"]]}
