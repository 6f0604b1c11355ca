"""The training recipes (the ``recipe`` option's choices): a time density for flow matching's ``t`` and the
late-time source spread of its path. What they are is a setting, read where the option is checked; the
pilot that picks one per task inside the run is :mod:`trainer.training.recipes`."""

from __future__ import annotations

from dataclasses import dataclass

from trainer.settings.time_density import TimeDensity

__all__ = ["RECIPES", "Recipe", "recipe_named"]


@dataclass(frozen=True, slots=True)
class Recipe:
    """A time density for ``t`` and the late-time source spread (:func:`trainer.training.flow.source_spread`,
    from the ``spread_start`` option on)."""

    name: str
    time_distribution: TimeDensity
    spread_gain: float

    def describe(self) -> str:
        spread = f", spread_gain {self.spread_gain:g}" if self.spread_gain else ""
        return f"{self.name} (time_distribution {self.time_distribution}{spread})"


RECIPES: tuple[Recipe, ...] = (
    # the time density of the engine's examples' successors; the default of earlier versions
    Recipe("standard", TimeDensity.parse("logit_normal:0,1"), 0.0),
    # late times and a wide late source: separates nearby modes of a low-dimensional action
    Recipe("sharp", TimeDensity.parse("logit_normal:0.5,1"), 6.0),
    # early times and a mild late spread: keeps the spread of many-dimensional, many-step demonstrations
    Recipe("smooth", TimeDensity.parse("logit_normal:-0.5,1"), 2.0),
)
"""The candidates, ``standard`` first (the run's own random stream). Chosen from 13 recipes measured on
B1-B4, the demo and a four-mode task (benchmarks/results/selection/): the fewest that contain, for each
task, one within 0.01 of the best of all 13."""


def recipe_named(name: str) -> Recipe:
    """The recipe called ``name`` (one of :data:`RECIPES`)."""
    for recipe in RECIPES:
        if recipe.name == name:
            return recipe
    raise KeyError(name)
