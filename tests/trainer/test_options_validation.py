"""The option checks of trainer/settings/options.py agree with the torch-side values they stand for.

``--time-distribution`` has one grammar, :meth:`trainer.settings.time_density.TimeDensity.parse`: the option
is parsed into a :class:`TimeDensity` where it is read, and the training draws from that value
(:meth:`trainer.training.flow.TimeDistribution.of`); the first test holds that fact. The ``--ode-steps``
range is restated from :class:`trainer.training.steps.distill.DistillSettings` (options.py must not import
torch: a bad value is refused within a second of starting); the second fails when one side changes without
the other.
"""

from __future__ import annotations

import pytest

from trainer.errors import LaunchError
from trainer.settings.options import TrainerOptions
from trainer.training.flow import TimeDistribution
from trainer.training.steps.distill import DistillSettings

TIME_TEXTS = [
    "uniform",
    "uniform:1",
    "beta:1,1.5",
    "beta:0,1",
    "beta:1",
    "beta:a,b",
    "logit_normal",
    "logit_normal:0,1",
    "logit_normal:0.5,0",
    "logit_normal:1",
    "power:2",
    "power:0",
    "power:-1",
    "power:1,2",
    "gauss",
    "",
    "uniform:",
    " logit_normal:0,1 ",
    "beta:inf,1",
    "power:nan",
]


@pytest.mark.parametrize("text", TIME_TEXTS)
def test_time_distribution_check_matches_the_parser(text: str) -> None:
    try:
        TimeDistribution.parse(text)
        parser_ok = True
    except ValueError:
        parser_ok = False
    try:
        TrainerOptions(time_distribution=text)
        options_ok = True
    except LaunchError:
        options_ok = False
    assert options_ok == parser_ok, f"{text!r}: options {options_ok}, TimeDistribution.parse {parser_ok}"


@pytest.mark.parametrize("steps", [1, 2, 8, 100, 101])
def test_ode_steps_range_matches_the_distillation_settings(steps: int) -> None:
    try:
        DistillSettings(steps)
        distill_ok = True
    except ValueError:
        distill_ok = False
    try:
        TrainerOptions(ode_steps=steps)
        options_ok = True
    except LaunchError:
        options_ok = False
    assert options_ok == distill_ok
