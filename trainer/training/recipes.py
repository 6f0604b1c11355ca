"""Training recipes and the pilot that picks one per task inside the run.

A recipe is how flow matching draws its training time ``t`` and its path's late-time source spread. No
fixed recipe served every benchmark task at the engine's network (1 x 128, 8 Euler steps; the table in
docs/training.md "Recipes"): a late, sharpening recipe is the only one that met B1 (two modes of a 1-D
action) but lost B2's success and B3/B4's speed; an early, smoothing one met the demo's entropy and B3
fastest but collapsed a four-mode task. A game developer cannot be asked to guess, so by default
(option ``recipe`` ``auto``) the run tries them:

* every candidate of :data:`RECIPES` starts from the received networks and trains side by side, one step
  each per iteration, on the same data (the first candidate on the run's own random stream: a run whose
  pilot keeps ``standard`` trains exactly the networks of a run with ``recipe standard``);
* after :data:`DROP_AT` iterations the candidate with the lowest held-out selection score
  (:meth:`trainer.training.heldout.HeldOutEvaluator.select`: samples through the engine's sampler from
  draws every candidate shares) stops; after :data:`PICK_AT` the best of the others is kept and trains
  alone to the end. Measured on the benchmark tasks (benchmarks/results/selection/pilot.md) these two
  looks picked a recipe within 0.01 of the best candidate's final quality on B1, B3, B4, the demo and the
  four-mode task; one look at 500 picked the sharpening recipe on B4, where it ends 0.05 lower.
* until the pick, the leader (the candidate with the best score at the last look, ``standard`` before the
  first) is the one exported, measured and checkpointed; a resumed run continues the recipe its
  checkpoint names, without a pilot.

Cost: ``DROP_AT · 3 + (PICK_AT − DROP_AT) · 2 = 2,250`` candidate steps in the first 1,000 iterations,
1,250 more than one recipe. The pilot runs when nothing fixes the recipe: the ``recipe`` option is
``auto``, no recipe knob (``time_distribution``, ``spread_start``, ``spread_gain``, ``draws_per_row``) is
changed, something is held out (the score needs held-out episodes), the run has at least
:data:`MIN_ITERATIONS` iterations, and it trains in one process (scale-out ranks would each need every
candidate's gradients).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from trainer.errors import Diverged
from trainer.settings.options import TrainerOptions
from trainer.settings.recipes import RECIPES, Recipe, recipe_named
from trainer.training.flow import TimeDistribution
from trainer.training.heldout import HeldOutEvaluator, Selection
from trainer.training.model import FlowModel
from trainer.training.steps import Phase, StepInputs, TrainingStep, choose_step
from trainer.training.steps.autograd import BatchSampler, make_optimizer
from trainer.training.steps.base import DeferredStep, smoothed

__all__ = [
    "DROP_AT",
    "MIN_ITERATIONS",
    "PICK_AT",
    "Lane",
    "RecipeLook",
    "RecipePilot",
    "fixed_by_user",
    "pilot_plan",
]

DROP_AT = 250
"""Iterations after which the candidate with the lowest selection score stops."""
PICK_AT = 1000
"""Iterations after which the best remaining candidate is kept and the others stop."""
MIN_ITERATIONS = 3000
"""Shortest run that pilots: shorter, the pilot's 1,250 extra candidate steps would be more than a third of
the run's own, and a run that short is a test, not a policy."""


_KNOBS = ("time_distribution", "spread_start", "spread_gain", "draws_per_row")
"""Options a recipe sets or depends on: when a user changed one, the user's recipe is kept."""

_LANE_STREAM = 7919
"""A candidate's generator seed: the config's Seed + its index times this (``standard``'s is the run's)."""


def pilot_plan() -> str:
    """The pilot in one sentence, for the log."""
    names = ", ".join(recipe.name for recipe in RECIPES)
    return (
        f"training {names} side by side; the lowest held-out selection score stops at iteration {DROP_AT}, "
        f"the best at iteration {PICK_AT} trains on (option recipe; trainer/training/recipes.py)"
    )


def fixed_by_user(options: TrainerOptions) -> list[str]:
    """The recipe knobs ``options`` changes from their defaults (empty: ``auto`` may pilot)."""
    defaults = {f.name: f.default for f in fields(TrainerOptions)}
    return [name for name in _KNOBS if getattr(options, name) != defaults[name]]


@dataclass(eq=False)
class Lane:
    """One candidate's training state: what :class:`trainer.training.job.TrainingJob` trains, swapped in and
    out of the job as a whole (:meth:`RecipePilot.install`)."""

    recipe: Recipe
    model: FlowModel
    optimizer: torch.optim.Optimizer
    sampler: BatchSampler
    generator: torch.Generator
    time_distribution: TimeDistribution
    training_step: TrainingStep | None = None
    phase: Phase | None = None
    smoothed_loss: float = math.nan
    unread: bool = False
    """A launched step not read yet (:meth:`RecipePilot.settle_others`)."""


@dataclass(frozen=True, slots=True)
class RecipeLook:
    """One look of the pilot: after ``iteration`` iterations each live candidate's selection score;
    ``stopped``: the candidates that stop here; ``leader``: the one exported from here on (after the pick:
    the recipe kept)."""

    iteration: int
    scores: Mapping[str, Selection]
    stopped: tuple[str, ...]
    leader: str
    final: bool

    def record(self) -> dict[str, Any]:
        """The run record's ``recipe`` object (a metrics line and run.json)."""
        return {
            "iteration": self.iteration,
            "stage": "pick" if self.final else "drop",
            "chosen" if self.final else "leader": self.leader,
            "stopped": list(self.stopped),
            "scores": {name: score.record() for name, score in self.scores.items()},
        }

    def tracker_values(self) -> dict[str, float]:
        return {f"recipe/{name}/selection": score.score for name, score in self.scores.items()}

    def _ranked(self) -> str:
        ranked = sorted(self.scores.items(), key=lambda item: -item[1].score)
        return ", ".join(f"{name} {score.score:.3f}" for name, score in ranked)

    def why(self) -> str:
        """Why the pick kept its recipe: each live candidate's score, best first."""
        return f"the held-out selection score ({self._ranked()})"

    def describe(self) -> str:
        if self.final:
            return (
                f"recipe: {recipe_named(self.leader).describe()} chosen at iteration {self.iteration} "
                f"by {self.why()}"
            )
        return (
            f"recipe pilot: iteration {self.iteration}: selection score {self._ranked()}; "
            f"{', '.join(self.stopped)} stopped, {self.leader} leads"
        )


@dataclass(eq=False)
class RecipePilot:
    """The candidates other than the job's own (:attr:`others`) and the looks so far. The job calls
    :meth:`step_others` before its own step and :meth:`look` after it."""

    others: list[Lane]
    leader: Recipe
    inputs: Callable[[Lane], StepInputs]
    """A candidate's step inputs (the job's settings with the candidate's training state)."""
    looks: list[RecipeLook] = field(default_factory=list)
    done: bool = False

    @classmethod
    def start(
        cls,
        own: Lane,
        inputs: Callable[[Lane], StepInputs],
        *,
        seed: int,
        learning_rate: float,
        weight_decay: float,
        layer_lr: str,
        spread_start: float,
    ) -> RecipePilot:
        """Candidates for every recipe after ``own``'s (the job's, ``standard``), each a copy of the job's
        untrained model with its own optimiser and generator; ``inputs`` turns a lane into its step's
        inputs (the job's settings)."""
        others = []
        for index, recipe in enumerate(RECIPES[1:], start=1):
            model = copy.deepcopy(own.model)
            model.spread = (spread_start, recipe.spread_gain)
            generator = torch.Generator(device=own.generator.device)
            generator.manual_seed(seed + _LANE_STREAM * index)
            lane = Lane(
                recipe=recipe,
                model=model,
                optimizer=make_optimizer(model, learning_rate, weight_decay, layer_lr),
                sampler=BatchSampler(own.sampler.data, own.sampler.batch_size, generator),
                generator=generator,
                time_distribution=TimeDistribution.of(recipe.time_distribution),
            )
            others.append(lane)
        return cls(others=others, leader=own.recipe, inputs=inputs)

    @property
    def active(self) -> bool:
        return not self.done

    def step_others(self, iteration: int) -> list[str]:
        """One step of every other live candidate, without a host read where the step leaves its numbers
        on the device (read at the next look, :meth:`settle_others`); returns the names of those found
        diverged (stopped)."""
        diverged = []
        for lane in list(self.others):
            if lane.training_step is None:
                lane.training_step = choose_step(Phase.FLOW_MATCHING, self.inputs(lane), iteration)
                lane.phase = Phase.FLOW_MATCHING
            step = lane.training_step
            try:
                if isinstance(step, DeferredStep):
                    step.launch(iteration)
                    lane.unread = True
                    continue
                loss = step.step(iteration).loss
            except Diverged:
                self.others.remove(lane)
                diverged.append(lane.recipe.name)
                continue
            lane.smoothed_loss = smoothed(lane.smoothed_loss, loss)
        return diverged

    def settle_others(self) -> list[str]:
        """Read the other candidates' launched steps; returns the names of those that diverged (stopped)."""
        diverged = []
        for lane in list(self.others):
            step = lane.training_step
            if not lane.unread or not isinstance(step, DeferredStep):
                continue
            lane.unread = False
            try:
                step.read()
            except Diverged:
                self.others.remove(lane)
                diverged.append(lane.recipe.name)
                continue
            lane.smoothed_loss = step.smoothed_loss
        return diverged

    def look_due(self, done: int) -> bool:
        """A look comes after ``done`` iterations (:meth:`look`)."""
        return not self.done and done in (DROP_AT, PICK_AT)

    def look(self, done: int, own: Lane, evaluator: HeldOutEvaluator) -> tuple[RecipeLook | None, Lane]:
        """After ``done`` iterations: at :data:`DROP_AT` and :data:`PICK_AT` score every live candidate
        (``own``: the job's) and stop the lowest (the pick: all but the best). Returns the look (None
        between looks) and the lane the job trains from here on (``own`` or another)."""
        if not self.look_due(done):
            return None, own
        self.settle_others()
        lanes = [own, *self.others]
        scores = {lane.recipe.name: evaluator.select(lane.model) for lane in lanes}
        ranked = sorted(lanes, key=lambda lane: -_finite(scores[lane.recipe.name].score))
        final = done >= PICK_AT
        keep = ranked[:1] if final else ranked[:-1] if len(ranked) > 1 else ranked
        stopped = tuple(lane.recipe.name for lane in lanes if lane not in keep)
        best = ranked[0]
        self.others = [lane for lane in keep if lane is not best]
        self.leader = best.recipe
        self.done = final or not self.others
        result = RecipeLook(done, scores, stopped, best.recipe.name, self.done)
        self.looks.append(result)
        return result, best

    def summary(self) -> dict[str, Any]:
        """run.json's ``recipe``: the choice, how it was made and every look."""
        return {
            "name": self.leader.name,
            "time_distribution": str(self.leader.time_distribution),
            "spread_gain": self.leader.spread_gain,
            "chosen_by": "pilot" if self.done else "pilot (leader so far)",
            "looks": [look.record() for look in self.looks],
        }


def _finite(value: float) -> float:
    return value if math.isfinite(value) else -math.inf
