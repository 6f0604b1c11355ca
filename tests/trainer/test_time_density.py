"""``--time-distribution`` is parsed once, into the option value the training draws from
(trainer/settings/time_density.py, trainer/training/flow.py)."""

from __future__ import annotations

import dataclasses

import pytest

from trainer.errors import LaunchError
from trainer.settings.options import TrainerOptions, load_options, options_json
from trainer.settings.time_density import TimeDensity
from trainer.training.flow import TimeDistribution


@pytest.mark.parametrize("text", ["uniform", "beta:1,1.5", "logit_normal", " logit_normal:0,1 ", "power:0.2"])
def test_the_users_spelling_is_kept_and_reads_back_to_the_same_value(text: str) -> None:
    density = TimeDensity.parse(text)
    assert str(density) == text.strip()
    assert TimeDensity.parse(str(density)) == density


def test_a_density_built_from_numbers_has_a_spelling_that_parses_back() -> None:
    for density in (TimeDensity.beta(0.1234567, 2.0), TimeDensity.logit_normal(), TimeDensity.power(3.0)):
        assert TimeDensity.parse(str(density)) == density
    assert str(TimeDensity.logit_normal()) == "logit_normal:0,1"


def test_the_option_holds_the_parsed_value_and_the_record_its_text() -> None:
    options = load_options(None, environ={"LA_TRAINER_TIME_DISTRIBUTION": "beta:2,1"})
    assert options.time_distribution == TimeDensity.beta(2.0, 1.0)
    assert options_json(options)["time_distribution"] == "beta:2,1"
    assert str(TrainerOptions().time_distribution) == "logit_normal:0,1"


def test_text_given_to_the_options_in_code_is_parsed_and_checked_there() -> None:
    options = dataclasses.replace(TrainerOptions(), time_distribution="power:2")  # type: ignore[arg-type]
    assert options.time_distribution == TimeDensity.power(2.0)
    with pytest.raises(LaunchError, match="'time_distribution' to 'gauss'"):
        TrainerOptions(time_distribution="gauss")  # type: ignore[arg-type]


def test_the_training_draws_from_the_option_value() -> None:
    density = TimeDensity.parse("logit_normal:0.5,2")
    drawn = TimeDistribution.of(density)
    assert (drawn.kind, drawn.a, drawn.b, str(drawn)) == ("logit_normal", 0.5, 2.0, "logit_normal:0.5,2")
