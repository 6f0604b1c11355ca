"""The held-out set (trainer/training/heldout.py): the split by episode at every limit, the closed forms of the
distances, seeded reproducibility, and that nothing changes when nothing is held out."""

from __future__ import annotations

import io
import math
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from emulator.session import EngineTask, SessionSettings, build_session_config
from protocol.replay import ReplayBuffer
from protocol.snapshot import read_snapshot
from trainer.records.progress import ProgressReporter
from trainer.records.runrecord import RunLog, RunRecord, read_metrics
from trainer.records.trackers import Trackers
from trainer.session.heldout import HeldOutRound
from trainer.settings.options import TrainerOptions
from trainer.training.data import TrainingData
from trainer.training.heldout import (
    SAMPLES_PER_ROW,
    HeldOutMetrics,
    Selection,
    energy_distance,
    energy_score,
    heldout_episode_count,
    split_episodes,
    wasserstein_1d,
)
from trainer.training.job import TrainingJob
from trainer.training.steps import Phase

# --------------------------------------------------------------------------------------------------
# The split


@pytest.mark.parametrize(
    ("episodes", "share", "minimum", "expected"),
    [
        (50, 0.1, 50, 5),  # exactly the minimum: held out
        (49, 0.1, 50, 0),  # one below: nothing
        (55, 0.1, 50, 6),  # 5.5 rounds half up
        (54, 0.1, 50, 5),  # 5.4 rounds down
        (65, 0.1, 50, 7),  # 6.5 rounds up (Python's round() would give 6)
        (50, 0.001, 50, 1),  # 0.05 -> at least one
        (2, 0.5, 2, 1),  # the smallest split: one each
        (3, 0.5, 2, 2),  # 1.5 -> 2, training keeps one
        (2, 0.5, 1, 1),  # a minimum below 2 is 2: training always keeps an episode
        (1, 0.5, 1, 0),
        (100, 0.0, 50, 0),  # share 0: off
    ],
)
def test_heldout_episode_count(episodes: int, share: float, minimum: int, expected: int) -> None:
    assert heldout_episode_count(episodes, share, minimum) == expected


def test_split_is_by_episode_and_seeded() -> None:
    lengths = np.array([3, 0, 5, 1] * 30, dtype=np.int32)  # 120 episodes, 30 of them empty
    split = split_episodes(lengths, 0.1, 50, seed=7)
    assert split.active
    assert split.heldout.size == 9  # 10 % of the 90 non-empty ones
    assert not set(split.train) & set(split.heldout)
    assert sorted([*split.train, *split.heldout]) == list(range(lengths.size))
    assert (lengths[split.heldout] > 0).all()  # an empty episode holds no row: never held out
    again = split_episodes(lengths, 0.1, 50, seed=7)
    assert np.array_equal(again.heldout, split.heldout)
    other = split_episodes(lengths, 0.1, 50, seed=8)
    assert not np.array_equal(other.heldout, split.heldout)


def test_below_the_minimum_everything_trains() -> None:
    lengths = np.ones(49, dtype=np.int32)
    split = split_episodes(lengths, 0.1, 50, seed=0)
    assert not split.active
    assert np.array_equal(split.train, np.arange(49))


def test_training_data_of_a_split_holds_only_its_episodes() -> None:
    rng = np.random.default_rng(0)
    lengths = np.array([4, 6, 3, 5, 2], dtype=np.int32)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int32)
    steps = int(lengths.sum())
    # the observation is the step's own index: each row says where it came from
    obs = np.arange(steps, dtype=np.float32)[:, None]
    actions = rng.standard_normal((steps, 2)).astype(np.float32)
    everything = TrainingData.from_arrays(starts, lengths, obs, actions, 2)
    replay = ReplayBuffer(0, starts, lengths, (obs,), (actions,))
    held = TrainingData.from_replay(replay, 2, np.array([1, 3]))
    train = TrainingData.from_replay(replay, 2, np.array([0, 2, 4]))
    held_rows = set(held.observations[:, 0].astype(int))
    train_rows = set(train.observations[:, 0].astype(int))
    assert held_rows == set(range(4, 10)) | set(range(13, 18))
    assert not held_rows & train_rows
    assert held.row_num + train.row_num == everything.row_num
    # chunks never cross into another episode: the padding repeats the episode's own last action
    last_of_episode_1 = actions[9]
    assert np.array_equal(held.targets[5], np.concatenate([last_of_episode_1, last_of_episode_1]))


# --------------------------------------------------------------------------------------------------
# Closed forms of the distances


def test_wasserstein_of_identical_samples_is_zero_and_of_a_shift_is_the_shift() -> None:
    gen = torch.Generator().manual_seed(0)
    a = torch.randn((300, 3), generator=gen, dtype=torch.float64)
    assert torch.equal(wasserstein_1d(a, a), torch.zeros(3, dtype=torch.float64))
    assert torch.equal(
        wasserstein_1d(a, a[torch.randperm(300, generator=gen)]), torch.zeros(3, dtype=torch.float64)
    )
    shift = torch.tensor([0.5, -2.0, 0.0], dtype=torch.float64)
    assert torch.allclose(wasserstein_1d(a, a + shift), shift.abs(), atol=1e-12)
    # unequal counts: the same empirical measure repeated is at distance 0, shifted at |c|
    assert torch.allclose(wasserstein_1d(a, a.repeat(4, 1) + shift), shift.abs(), atol=1e-12)


def test_wasserstein_of_two_point_masses() -> None:
    a = torch.tensor([[0.0], [0.0]], dtype=torch.float64)
    b = torch.tensor([[0.0], [1.0], [1.0]], dtype=torch.float64)
    # all mass at 0 against 1/3 at 0 and 2/3 at 1: two thirds of the mass moves by 1
    assert wasserstein_1d(a, b).item() == pytest.approx(2.0 / 3.0)


def test_energy_distance_is_zero_exactly_for_the_same_samples() -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn((200, 4), generator=gen, dtype=torch.float64)
    assert energy_distance(x, x).item() == pytest.approx(0.0, abs=1e-12)
    assert energy_distance(x, x.flip(0)).item() == pytest.approx(0.0, abs=1e-12)  # order does not matter
    assert energy_distance(x, x + 0.1).item() > 1e-3
    y = x.clone()
    y[0, 0] += 1.0  # one sample differs
    assert energy_distance(x, y).item() > 0.0
    # two point masses at distance d: 2d - 0 - 0
    p = torch.zeros((5, 2), dtype=torch.float64)
    q = torch.full((3, 2), 3.0, dtype=torch.float64)
    assert energy_distance(p, q).item() == pytest.approx(2 * math.sqrt(18.0))


def test_energy_score_closed_form() -> None:
    # one row, samples at -1 and +1 in 1-D, observed 0: E|Y - a| = 1, E|Y - Y'| over distinct pairs = 2
    samples = torch.tensor([[[-1.0], [1.0]]], dtype=torch.float64)
    observed = torch.tensor([[0.0]], dtype=torch.float64)
    assert energy_score(samples, observed).item() == pytest.approx(1.0 - 0.5 * 2.0)
    # samples collapsed on the observation: 0; collapsed at distance 2: 2
    assert energy_score(torch.zeros((1, 3, 1), dtype=torch.float64), observed).item() == 0.0
    assert energy_score(torch.full((1, 3, 1), 2.0, dtype=torch.float64), observed).item() == 2.0
    with pytest.raises(ValueError, match="at least 2"):
        energy_score(samples[:, :1], observed)


# --------------------------------------------------------------------------------------------------
# In a job


def _job(options: TrainerOptions, size: int = 64) -> TrainingJob:
    task = EngineTask.benchmark("bimodal", size=size, seed=0)
    config, blobs = build_session_config(
        task,
        SessionSettings(iteration_num=40, batch_size=16),
        None,  # type: ignore[arg-type]
    )
    received = {nid: read_snapshot(blob) for nid, blob in enumerate(blobs)}
    return TrainingJob.create(
        config, received, task.replay_buffer, options=options, device=torch.device("cpu")
    )


BASE = TrainerOptions(status_file=False, checkpoint_every_seconds=0.0, threads=1)


def test_the_job_trains_on_the_other_episodes_and_measures_the_held_out_ones() -> None:
    on = _job(replace(BASE, heldout_share=0.2, heldout_min_episodes=50))
    everything = _job(BASE)
    assert on.heldout is not None and everything.heldout is None
    # bimodal episodes are one step each: 64 episodes, 13 (12.8 rounded) held out
    assert on.heldout.episodes == 13 and on.heldout.rows == 13
    assert on.sample_num == everything.sample_num - 13
    train_obs = {tuple(row) for row in on.data.observations.tolist()}
    held_obs = {tuple(row) for row in on.heldout.sample_obs.numpy().tolist()}
    assert held_obs and not held_obs & train_obs
    assert on.heldout.sample_obs.shape[0] == 13 * SAMPLES_PER_ROW


def test_held_out_metrics_are_seeded_and_leave_training_alone() -> None:
    options = replace(BASE, heldout_share=0.2, heldout_min_episodes=50)
    a, b = _job(options), _job(options)
    assert a.heldout is not None and b.heldout is not None
    for i in range(20):
        a.step(i)
        b.step(i)
    generator_state = a.generator.get_state()
    weights = {k: v.clone() for k, v in a.model.state_dict().items()}
    first = a.heldout.evaluate(a.model, 20)
    again = a.heldout.evaluate(a.model, 20)
    other = b.heldout.evaluate(b.model, 20)
    assert first.record() | {"seconds": 0} == again.record() | {"seconds": 0}
    assert first.record() | {"seconds": 0} == other.record() | {"seconds": 0}
    assert torch.equal(a.generator.get_state(), generator_state)  # the training stream is untouched
    assert all(torch.equal(v, weights[k]) for k, v in a.model.state_dict().items())
    values = first.record()
    assert all(math.isfinite(v) for k, v in values.items() if k != "w1_raw")
    assert 0.0 <= values["coverage"] <= 1.0 and 0.0 <= values["precision"] <= 1.0
    # training changes the numbers (they measure the weights): a further step, another score
    a.step(20)
    assert a.heldout.evaluate(a.model, 21).energy_score != first.energy_score


@pytest.mark.parametrize("options", [BASE, replace(BASE, heldout_share=0.3, heldout_min_episodes=65)])
def test_nothing_held_out_means_byte_identical_training(options: TrainerOptions) -> None:
    """With the option off, or fewer episodes (64) than its minimum, the data, the statistics and the
    seeded weights after training are byte for byte those of a run that has no such option."""
    plain = _job(replace(BASE, heldout_share=0.0))
    other = _job(options)
    assert other.heldout is None
    assert np.array_equal(plain.data.observations, other.data.observations)
    assert np.array_equal(plain.data.targets, other.data.targets)
    for i in range(30):
        plain.step(i)
        other.step(i)
    left, right = plain.model.state_dict(), other.model.state_dict()
    assert left.keys() == right.keys()
    assert all(torch.equal(left[k], right[k]) for k in left)


# --------------------------------------------------------------------------------------------------
# heldout_send_best


def _metrics(iteration: int, loss: float) -> HeldOutMetrics:
    """A measurement whose selection score is ``-loss`` (the lower ``loss``, the better)."""
    selection = Selection(score=-loss, f1=0.5, energy=0.5 + loss, coverage=0.5, precision=0.5)
    return HeldOutMetrics(iteration, selection, loss, 1.0, 0.1, 0.1, (0.1, 0.1), 0.5, 0.5, 0.0)


@pytest.mark.parametrize("send_best", [False, True])
def test_the_best_networks_go_out_only_when_asked(send_best: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    job = _job(replace(BASE, heldout_share=0.2, heldout_min_episodes=50, heldout_send_best=send_best))
    assert job.heldout is not None
    scores = iter([0.5, 0.3, 0.4])  # the second measurement is the best, the last is worse
    monkeypatch.setattr(job.heldout, "evaluate", lambda model, it: _metrics(it, next(scores)))
    exports = iter([{0: "first"}, {0: "best"}, {0: "unused"}])
    monkeypatch.setattr(job, "export", lambda: next(exports))
    written: list[tuple[int, bool]] = []
    kept: list[object] = []
    runlog = SimpleNamespace(
        heldout=lambda it, record, scalars, best: written.append((it, best)),
        heldout_actions=lambda value: None,
        best_networks=lambda blobs: kept.append(blobs) or [Path("Networks/best/network_0.bin")],
    )
    reporter = ProgressReporter(0, stream=io.StringIO(), tty=False)  # no status file: no heartbeat
    round_ = HeldOutRound(job, runlog, reporter)  # type: ignore[arg-type]
    for iteration in (10, 20, 30):
        round_.measure(iteration)
    assert written == [(10, True), (20, True), (30, False)]
    assert reporter.note == "held-out selection -0.400 loss 0.4000 energy score 1.000 coverage 0.50"
    last = {0: "last"}
    expected = {0: "best"} if send_best else last
    assert round_.final_networks(last) == expected  # type: ignore[arg-type]
    # the record keeps the best networks beside the sent ones only when they were not sent
    round_.keep_best(lambda layers: {0: f"bytes of {layers[0]}".encode()})  # type: ignore[arg-type,index]
    assert kept == ([] if send_best else [{0: b"bytes of best"}])


def test_the_last_measurement_being_the_best_sends_the_last_networks(monkeypatch: pytest.MonkeyPatch) -> None:
    job = _job(replace(BASE, heldout_share=0.2, heldout_min_episodes=50, heldout_send_best=True))
    assert job.heldout is not None
    scores = iter([0.5, 0.3])
    monkeypatch.setattr(job.heldout, "evaluate", lambda model, it: _metrics(it, next(scores)))
    monkeypatch.setattr(job, "export", lambda: {0: "snapshot"})
    runlog = SimpleNamespace(heldout=lambda *a, **k: None, heldout_actions=lambda value: None)
    round_ = HeldOutRound(job, runlog, ProgressReporter(0, stream=io.StringIO(), tty=False))  # type: ignore[arg-type]
    round_.measure(10)
    round_.measure(10)  # once per iteration: no second measurement
    round_.measure(20)
    last = {0: "last"}
    assert round_.final_networks(last) is last  # type: ignore[arg-type]


def test_distillation_networks_compete_only_among_themselves(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run with ode_steps > 0 ends distilling for the game's few Euler steps; a flow-matching checkpoint
    before the boundary with a lower flow loss must not be sent instead of the distilled networks."""
    job = _job(replace(BASE, heldout_share=0.2, heldout_min_episodes=50, heldout_send_best=True))
    assert job.heldout is not None
    losses = iter([0.3, 0.5, 0.6])
    monkeypatch.setattr(job.heldout, "evaluate", lambda model, it: _metrics(it, next(losses)))
    exports = iter([{0: "flow matching"}, {0: "first distilled"}])
    monkeypatch.setattr(job, "export", lambda: next(exports))
    runlog = SimpleNamespace(heldout=lambda *a, **k: None, heldout_actions=lambda value: None)
    round_ = HeldOutRound(job, runlog, ProgressReporter(0, stream=io.StringIO(), tty=False))  # type: ignore[arg-type]
    job.phase = Phase.FLOW_MATCHING
    round_.measure(10)
    job.phase = Phase.DISTILLATION
    round_.measure(20)
    round_.measure(30)
    assert round_.final_networks({0: "last"}) == {0: "first distilled"}  # type: ignore[arg-type]


def test_a_measurement_reaches_the_metrics_log_and_the_trackers(tmp_path: Path) -> None:
    class Tracker:
        name = "fake"

        def __init__(self) -> None:
            self.logged: list[tuple[int, dict[str, float]]] = []

        def scalars(self, step: int, values: Mapping[str, float]) -> None:
            self.logged.append((step, dict(values)))

        def params(self, values: Mapping[str, str]) -> None: ...
        def artifacts(self, paths: object) -> None: ...
        def close(self) -> None: ...

    tracker = Tracker()
    runlog = RunLog()
    runlog.record = RunRecord(tmp_path, {})
    runlog.trackers = Trackers([tracker])  # type: ignore[list-item]
    measured = replace(_metrics(300, 0.25), flow_loss=math.nan)  # a non-finite value is written as null
    runlog.heldout(300, measured.record(), measured.tracker_values(), best=True)
    runlog.finish(phase="complete", exit_code=0, iteration=300, loss=0.1)
    (line,) = read_metrics(tmp_path)
    assert line["iteration"] == 300 and line["best"] is True
    assert line["heldout"]["flow_loss"] is None and line["heldout"]["w1_raw"] == [0.1, 0.1]
    ((step, values),) = tracker.logged
    assert step == 300 and values["heldout/energy_score"] == 1.0 and "heldout/w1_raw" not in values


@pytest.mark.filterwarnings("error")
def test_the_smallest_split_measures_without_warnings() -> None:
    """Two one-step episodes, one held out: one held-out row, fewer than the neighbours and samples
    asked for; the numbers are finite and the picture's file has its four samples."""
    job = _job(replace(BASE, heldout_share=0.5, heldout_min_episodes=2), size=2)
    assert job.heldout is not None and job.heldout.rows == 1 and job.sample_num == 1
    job.step(0)
    measured = job.heldout.evaluate(job.model, 1)
    assert all(math.isfinite(v) for k, v in measured.record().items() if k != "w1_raw")
    record = job.heldout.actions_record(1)
    assert len(record["demonstrated"]) == 1 and len(record["sampled"]) == SAMPLES_PER_ROW
