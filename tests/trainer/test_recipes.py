"""The recipe pilot (trainer/training/recipes.py) and the selection score it chooses by
(trainer/training/heldout.py): decisions through a seam that scores the candidates, the rules that turn the
pilot off, the checkpoint's recipe, and the score's closed forms."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from emulator.session import EngineTask, SessionSettings, build_session_config
from protocol.snapshot import read_snapshot
from trainer.errors import Diverged
from trainer.settings.options import TrainerOptions
from trainer.settings.time_density import TimeDensity
from trainer.training import job as job_module
from trainer.training import recipes
from trainer.training.heldout import SELECTION_RADII, SELECTION_SAMPLES, HeldOutEvaluator, Selection
from trainer.training.job import TrainingJob

BASE = TrainerOptions(
    status_file=False, checkpoint_every_seconds=0.0, threads=1, heldout_share=0.2, heldout_min_episodes=50
)
DROP, PICK, RUN = 5, 12, 20


def _job(options: TrainerOptions, checkpoint_dir: Path | None = None, iterations: int = RUN) -> TrainingJob:
    task = EngineTask.benchmark("bimodal", size=64, seed=0)
    config, blobs = build_session_config(
        task,
        SessionSettings(iteration_num=iterations, batch_size=16),
        None,  # type: ignore[arg-type]
    )
    received = {nid: read_snapshot(blob) for nid, blob in enumerate(blobs)}
    return TrainingJob.create(
        config,
        received,
        task.replay_buffer,
        options=options,
        device=torch.device("cpu"),
        checkpoint_dir=checkpoint_dir,
    )


@pytest.fixture
def short_pilot(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pilot's schedule scaled down to a test's run: looks after DROP and PICK iterations."""
    monkeypatch.setattr(recipes, "DROP_AT", DROP)
    monkeypatch.setattr(recipes, "PICK_AT", PICK)
    monkeypatch.setattr(job_module, "MIN_ITERATIONS", 10)


def _score_by_spread(gains: dict[float, float], monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """A selection score per candidate, told apart by its source spread gain (0 standard, 6 sharp,
    2 smooth); returns the list of gains scored, in order."""
    seen: list[float] = []

    def select(self: HeldOutEvaluator, model: Any) -> Selection:
        gain = float(model.spread[1])
        seen.append(gain)
        score = gains[gain]
        return Selection(score=score, f1=score, energy=0.0, coverage=score, precision=score)

    monkeypatch.setattr(HeldOutEvaluator, "select", select)
    return seen


def _train(job: TrainingJob, iterations: int = RUN) -> None:
    for iteration in range(iterations):
        job.step(iteration)


def _weights(job: TrainingJob) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in job.model.state_dict().items()}


@pytest.mark.usefixtures("short_pilot")
def test_a_pilot_that_keeps_standard_trains_the_networks_of_recipe_standard(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _score_by_spread({0.0: 0.9, 6.0: 0.1, 2.0: 0.5}, monkeypatch)
    piloted = _job(BASE)
    fixed = _job(replace(BASE, recipe="standard"))
    assert piloted.pilot_wanted and not fixed.pilot_wanted
    _train(piloted)
    _train(fixed)
    assert piloted.recipe is not None and piloted.recipe.name == "standard"
    assert piloted.pilot is not None and piloted.pilot.done and not piloted.pilot.others
    left, right = _weights(piloted), _weights(fixed)
    assert left.keys() == right.keys() and all(torch.equal(left[k], right[k]) for k in left)
    assert torch.equal(piloted.generator.get_state(), fixed.generator.get_state())


@pytest.mark.usefixtures("short_pilot")
def test_the_lowest_stops_first_and_the_best_trains_on(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _score_by_spread({0.0: 0.1, 6.0: 0.9, 2.0: 0.5}, monkeypatch)
    job = _job(BASE)
    _train(job, DROP)
    assert job.recipe is not None and job.recipe.name == "sharp"  # the leader is exported from here
    assert job.model.spread == (BASE.spread_start, 6.0)
    looks = job.take_recipe_looks()
    assert [look.record()["stage"] for look in looks] == ["drop"]
    assert looks[0].stopped == ("standard",) and looks[0].leader == "sharp"
    assert set(looks[0].scores) == {"standard", "sharp", "smooth"}
    for iteration in range(DROP, RUN):
        job.step(iteration)
    (pick,) = job.take_recipe_looks()
    assert pick.final and pick.iteration == PICK and pick.leader == "sharp" and pick.stopped == ("smooth",)
    assert seen == [0.0, 6.0, 2.0, 6.0, 2.0]  # three candidates scored at the drop, two at the pick
    assert job.pilot is not None and job.pilot.done and not job.pilot.others
    assert str(job.time_distribution) == "logit_normal:0.5,1"
    record = job.recipe_record()
    assert record["name"] == "sharp" and record["chosen_by"] == "pilot"
    assert [look["stage"] for look in record["looks"]] == ["drop", "pick"]
    assert "selection score" in record["why"]


@pytest.mark.usefixtures("short_pilot")
def test_candidates_step_only_during_the_pilot(monkeypatch: pytest.MonkeyPatch) -> None:
    _score_by_spread({0.0: 0.1, 6.0: 0.9, 2.0: 0.5}, monkeypatch)
    job = _job(BASE)
    _train(job, PICK)
    assert job.pilot is not None and job.pilot.done
    winner = _weights(job)
    job.step(PICK)
    after = _weights(job)
    assert any(not torch.equal(after[k], winner[k]) for k in after)  # the winner trains on


@pytest.mark.usefixtures("short_pilot")
@pytest.mark.parametrize(
    ("options", "recipe", "why"),
    [
        (replace(BASE, time_distribution=TimeDensity.parse("uniform")), None, "time_distribution"),
        (replace(BASE, spread_gain=1.0), None, "spread_gain"),
        (replace(BASE, draws_per_row=2), None, "draws_per_row"),
        (replace(BASE, heldout_share=0.0), "standard", "nothing is held out"),
        (replace(BASE, recipe="smooth"), "smooth", "option recipe"),
    ],
)
def test_no_pilot_when_something_fixes_the_recipe(
    options: TrainerOptions, recipe: str | None, why: str
) -> None:
    job = _job(options)
    assert not job.pilot_wanted
    assert (job.recipe.name if job.recipe is not None else None) == recipe
    assert why in job.recipe_why
    _train(job, PICK + 1)
    assert job.pilot is None


def test_no_pilot_in_a_short_run() -> None:
    job = _job(BASE, iterations=40)
    assert not job.pilot_wanted and job.recipe is not None and job.recipe.name == "standard"
    assert "fewer than the pilot's minimum of 3000" in job.recipe_why


@pytest.mark.usefixtures("short_pilot")
def test_scale_out_trains_one_recipe() -> None:
    job = _job(BASE)
    # scale-out's averaging as a no-op: what matters is that the job has one
    job.gradient_averaging = SimpleNamespace(arm_autograd=None, average_flat=None)  # type: ignore[assignment]
    _train(job, PICK + 1)
    assert job.pilot is None and "scale-out" in job.recipe_why


def test_a_named_recipe_sets_the_time_density_and_the_spread() -> None:
    job = _job(replace(BASE, recipe="smooth"))
    assert str(job.time_distribution) == "logit_normal:-0.5,1"
    assert job.model.spread == (BASE.spread_start, 2.0)


@pytest.mark.usefixtures("short_pilot")
def test_the_checkpoint_names_the_recipe_and_a_resume_continues_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _score_by_spread({0.0: 0.1, 6.0: 0.2, 2.0: 0.9}, monkeypatch)
    options = replace(BASE, checkpoint_every_seconds=1e-9)
    job = _job(options, tmp_path)
    job.step(0)
    assert job.maybe_checkpoint(1) is None  # due, but not during the pilot
    _train_from(job, 1, PICK)
    assert job.recipe is not None and job.recipe.name == "smooth"
    assert job.maybe_checkpoint(PICK) is not None
    resumed = _job(replace(options, resume=True), tmp_path)
    assert resumed.start_iteration == PICK and not resumed.pilot_wanted
    assert resumed.recipe is not None and resumed.recipe.name == "smooth"
    assert resumed.model.spread == (BASE.spread_start, 2.0)
    assert str(resumed.time_distribution) == "logit_normal:-0.5,1"
    left, right = _weights(job), _weights(resumed)
    assert all(torch.equal(left[k], right[k]) for k in left)


def _train_from(job: TrainingJob, first: int, end: int) -> None:
    for iteration in range(first, end):
        job.step(iteration)


# --------------------------------------------------------------------------------------------------
# The selection score


def _evaluator(options: TrainerOptions = BASE) -> tuple[TrainingJob, HeldOutEvaluator]:
    job = _job(options)
    assert job.heldout is not None
    return job, job.heldout


def _demonstrated(evaluator: HeldOutEvaluator) -> torch.Tensor:
    """The selection rows' demonstrated actions in raw units, each repeated per sample."""
    raw = evaluator.select_demonstrated * evaluator.select_scale
    return raw.repeat_interleave(SELECTION_SAMPLES, dim=0)


def test_samples_on_the_demonstrations_score_one() -> None:
    """Every sample on its row's demonstrated action: coverage and precision 1 at every radius, the
    energy score's two terms 0, so the score is exactly 1."""
    _, evaluator = _evaluator()
    exact = SimpleNamespace(sample=lambda obs, x0, steps: _demonstrated(evaluator))
    score = evaluator.select(exact)
    assert score == Selection(score=1.0, f1=1.0, energy=0.0, coverage=1.0, precision=1.0)


def test_samples_far_from_every_demonstration_score_their_distance() -> None:
    """Every sample shifted by 10 demonstrated stds in every dimension: nothing within any radius (f1 0),
    all samples of a row equal (spread 0), so the energy is the RMS shift, 10, and the score -10."""
    _, evaluator = _evaluator()
    far = SimpleNamespace(
        sample=lambda obs, x0, steps: _demonstrated(evaluator) + 10.0 * evaluator.select_scale
    )
    score = evaluator.select(far)
    assert score.f1 == 0.0 and score.coverage == 0.0 and score.precision == 0.0
    assert score.energy == pytest.approx(10.0, rel=1e-9) and score.score == pytest.approx(-10.0, rel=1e-9)
    assert max(SELECTION_RADII) < 10.0


def test_the_selection_draws_do_not_depend_on_the_run_s_options() -> None:
    """Two runs of one seed with other time densities and spreads: the same rows, the same noise, and
    the same score for the same networks (what lets the pilot and a user compare recipes)."""
    job, evaluator = _evaluator()
    _, other = _evaluator(replace(BASE, time_distribution=TimeDensity.parse("power:0.2"), spread_gain=3.0))
    assert torch.equal(evaluator.select_x0, other.select_x0)
    assert torch.equal(evaluator.select_obs, other.select_obs)
    assert evaluator.select(job.model) == other.select(job.model)
    assert not torch.equal(evaluator.loss_t, other.loss_t)  # the flow loss's draws do depend on them


@pytest.mark.usefixtures("short_pilot")
def test_a_diverged_leader_hands_over_to_a_live_candidate(monkeypatch: pytest.MonkeyPatch) -> None:
    _score_by_spread({0.0: 0.9, 6.0: 0.1, 2.0: 0.5}, monkeypatch)
    job = _job(BASE)
    job.step(0)
    own_step = job._own_advance

    def diverge_once(iteration: int) -> None:
        if iteration == 1:
            raise Diverged("non-finite loss")
        own_step(iteration)

    monkeypatch.setattr(job, "_own_advance", diverge_once)
    job.step(1)
    assert job.recipe is not None and job.recipe.name == "sharp"  # the first live candidate
    assert job.model.spread == (BASE.spread_start, 6.0)
    monkeypatch.setattr(job, "_own_advance", own_step)
    _train_from(job, 2, RUN)
    assert job.recipe is not None and job.recipe.name == "smooth"  # the better of the two left, at the drop
