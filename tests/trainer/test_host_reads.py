"""Issue 32, item 1: the training loop does not read the device every iteration.

Counted with a seam on every call that waits for a device's numbers on a GPU (tests/support/host_reads.py):
a whole run over the in-memory link, with sync rounds, snapshot files, held-out measurements and progress
lines, reads at most once per hundred iterations on the training thread between its first and last step;
the exports behind the sync rounds read on the sender's thread instead. A fused step by itself reads
nothing until asked, and a divergence is reported by that read, naming the step that diverged.
"""

from __future__ import annotations

import copy
import threading
from pathlib import Path

import pytest
import torch

from emulator.session import EngineTask, SessionSettings, build_session_config
from tests.support.fused import BATCH, assert_same, engine_model, everything
from tests.support.host_reads import count_host_reads
from trainer.errors import Diverged
from trainer.exitcodes import ExitCode
from trainer.records.runrecord import find_run_folders, read_metrics
from trainer.session.app import run_with_link
from trainer.session.links import MemoryLink
from trainer.settings.options import TrainerOptions
from trainer.training.checkpoint import CHECKPOINT_NAME, PREVIOUS_CHECKPOINT_NAME, load_checkpoint
from trainer.training.flow import TimeDistribution
from trainer.training.job import TrainingJob
from trainer.training.steps.autograd import BatchSampler, make_optimizer, train_step
from trainer.training.steps.fused import FusedStep

ITERATIONS = 3000


PILOT_READS = 30
"""What the recipe pilot's two looks may add, once per run (trainer/training/recipes.py): each candidate's
launched steps read, its 8,192 selection samples copied and its numbers read in one go."""


@pytest.mark.parametrize("recipe", ["standard", "auto"])
def test_a_real_run_reads_the_device_at_most_once_per_hundred_iterations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recipe: str
) -> None:
    """The steady state (a fixed recipe) reads at most once per 100 iterations; the default's recipe pilot
    adds at most PILOT_READS in the run's first 1,000 iterations."""
    task = EngineTask.benchmark("bimodal", size=200, seed=0)  # 200 one-step episodes: 20 are held out
    settings = SessionSettings(iteration_num=ITERATIONS, batch_size=64, iterations_per_snapshot=500)
    config, blobs = build_session_config(task, settings, None)
    options = TrainerOptions(
        sync_every_iterations=100,
        sync_every_seconds=0.0,
        threads=1,
        checkpoint_every_seconds=0.0,
        heldout_every_iterations=500,
        progress_every_seconds=0.25,
        recipe=recipe,
    )
    link = MemoryLink(config, list(blobs), task.replay_buffer)
    training_thread = threading.current_thread().name
    window: dict[str, int] = {}
    advance = TrainingJob.advance

    def counted_advance(self: TrainingJob, iteration: int) -> None:
        window.setdefault("first", reads.on(training_thread))
        advance(self, iteration)
        window["last"] = reads.on(training_thread)
        window["steps"] = window.get("steps", 0) + 1

    monkeypatch.setattr(TrainingJob, "advance", counted_advance)
    folder = tmp_path / "Training0"
    with count_host_reads() as reads:
        assert run_with_link(lambda flag: link, options=options, task_dir=folder) == ExitCode.OK

    assert window["steps"] == ITERATIONS
    in_loop = window["last"] - window["first"]
    print(
        f"host reads on the training thread in {ITERATIONS} steps: {in_loop}; by call: {dict(reads.by_call)}"
    )
    assert in_loop <= ITERATIONS / 100 + (PILOT_READS if recipe == "auto" else 0), (in_loop, reads.by_call)
    # The exports behind the sync rounds and the snapshots read on threads of their own.
    assert reads.on("la-trainer-sender") > 0 and reads.on("la-trainer-snapshots") > 0, reads.by_thread
    assert len(link.rounds) >= 2 and link.completed
    (run,) = find_run_folders(folder)
    lines = read_metrics(run)
    assert [p["iteration"] for p in lines if "loss" in p] == list(range(100, ITERATIONS + 1, 100))
    heldout = [p["iteration"] for p in lines if "heldout" in p]
    assert heldout == [500, 1000, 1500, 2000, 2500, ITERATIONS]
    snapshots = sorted(p.name for p in (folder / "Snapshots").glob("*.bin"))
    assert len(snapshots) == 3 * (ITERATIONS // 500)


@pytest.mark.parametrize(
    ("found_by", "checkpoint_every_seconds"), [("a checkpoint", 0.001), ("a batch of points", 0.0)]
)
def test_a_run_that_diverges_keeps_no_point_or_checkpoint_of_a_skipped_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, found_by: str, checkpoint_every_seconds: float
) -> None:
    """Steps after a divergence are skipped on the device until a read finds it (a due checkpoint reads
    first; else the tenth metrics point does): no metrics point and no checkpoint of those steps is
    written, and the run ends as diverged with the weights of the iteration the error names."""
    task = EngineTask.benchmark("bimodal", size=64, seed=0)
    config, blobs = build_session_config(task, SessionSettings(iteration_num=1500, batch_size=32), None)
    options = TrainerOptions(
        sync_every_iterations=0,
        sync_every_seconds=0.0,
        threads=1,
        checkpoint_every_seconds=checkpoint_every_seconds,
        progress_every_seconds=3600.0,  # no progress line reads the device: only the points or a checkpoint
    )
    advance = TrainingJob.advance

    def poisoning(self: TrainingJob, iteration: int) -> None:
        if iteration == 250:
            step = self.training_step
            assert isinstance(step, FusedStep)
            step._x1[:, 0] = float("nan")  # every step from here on is not finite
        advance(self, iteration)

    monkeypatch.setattr(TrainingJob, "advance", poisoning)
    link = MemoryLink(config, list(blobs), task.replay_buffer)
    folder = tmp_path / "Training0"
    assert run_with_link(lambda flag: link, options=options, task_dir=folder) == ExitCode.DIVERGED
    assert link.completed, "the last good networks and Complete go to the game"
    (run,) = find_run_folders(folder)
    points = [p for p in read_metrics(run) if "loss" in p]
    assert [p["iteration"] for p in points] == [100, 200, 250], points
    assert all(p["loss"] is not None for p in points), points
    for name in (CHECKPOINT_NAME, PREVIOUS_CHECKPOINT_NAME):
        path = folder / "Snapshots" / name
        if path.exists():
            assert load_checkpoint(path).iteration <= 250, (found_by, name)
    assert load_checkpoint(folder / "Snapshots" / CHECKPOINT_NAME).iteration == 250


def test_a_launched_step_reads_nothing_until_asked() -> None:
    model, data = engine_model()
    generator = torch.Generator().manual_seed(0)
    optimizer = make_optimizer(model, 1e-3, 1e-4)
    fused = FusedStep.build(
        model, optimizer, model.tensor_data(data), BATCH, generator, TimeDistribution.uniform(), 0.0
    )
    assert fused is not None
    fused.launch(0)  # the first step adopts the state (reads it once)
    with count_host_reads() as reads:
        for i in range(1, 50):
            fused.launch(i)
        assert reads.total() == 0, reads.by_call
        metrics = fused.read()
    assert reads.total() == 1 and metrics.grad_norm > 0
    assert 0 < fused.smoothed_loss < 10 and 0 < metrics.loss < 10


def test_a_divergence_is_reported_at_the_next_read_with_the_weights_before_it() -> None:
    model, data = engine_model()
    generator = torch.Generator().manual_seed(0)
    optimizer = make_optimizer(model, 1e-3, 1e-4)
    fused = FusedStep.build(
        model, optimizer, model.tensor_data(data), BATCH, generator, TimeDistribution.uniform(), 0.0
    )
    assert fused is not None
    for i in range(5):
        fused.launch(i)
    fused.read()
    good = fused.smoothed_loss
    for i in range(5, 8):
        fused.launch(i)
    before = everything(model, optimizer)  # after iteration 7: what must be kept
    smoothed = fused._smoothed.item() / fused._divisor  # and the smoothed loss after it
    fused._x1[:, 0] = float("nan")  # every later step is not finite
    for i in range(8, 12):
        fused.launch(i)
    fused._x1[:, 0] = 0.0  # later steps would be finite again: still skipped until the read
    for i in range(12, 15):
        fused.launch(i)
    with pytest.raises(Diverged, match="iteration 8 ") as raised:
        fused.read()
    assert raised.value.iteration == 8 and "6 steps later" in str(raised.value)
    assert_same(before, everything(model, optimizer), exact=True)  # weights, EMA, moments, counts
    assert fused.smoothed_loss == smoothed != good  # the last good step's, not the last read's
    fused.launch(15)  # reported once: training may go on
    fused.read()
    assert int(model.ema_updates) == 9


def test_the_job_smooths_on_the_device_as_it_did_on_the_host() -> None:
    model, data = engine_model()
    device_model, host_model = copy.deepcopy(model), copy.deepcopy(model)
    generator = torch.Generator().manual_seed(3)
    optimizer = make_optimizer(device_model, 1e-3, 1e-4)
    fused = FusedStep.build(
        device_model,
        optimizer,
        device_model.tensor_data(data),
        BATCH,
        generator,
        TimeDistribution.uniform(),
        0.0,
    )
    assert fused is not None
    for i in range(40):
        fused.launch(i)
    fused.read()
    # The reference step on the same draws, smoothed on the host as the job did before issue 32.
    generator = torch.Generator().manual_seed(3)
    sampler = BatchSampler(host_model.tensor_data(data), BATCH, generator)
    reference = make_optimizer(host_model, 1e-3, 1e-4)
    smoothed = float("nan")
    for i in range(40):
        loss = train_step(
            host_model, reference, sampler.next(), generator, TimeDistribution.uniform(), 0.0, i
        ).loss
        smoothed = loss if i == 0 else 0.98 * smoothed + 0.02 * loss
    assert fused.smoothed_loss == pytest.approx(smoothed, rel=1e-4)
