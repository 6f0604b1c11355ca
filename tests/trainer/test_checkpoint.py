"""Resumable checkpoints (trainer/training/checkpoint.py) and TrainingJob resume (trainer/training/job.py).

Facts: a checkpoint round-trips exactly; it loads with ``torch.load(weights_only=True)``; any damage
(flipped byte, truncation at any point, foreign pickle, other version) is a CheckpointError and never
anything else; the previous checkpoint survives a writer that dies at any step; a resumed job continues
bit-for-bit where an uninterrupted one would be; a mismatch is refused with one line per difference.
"""

from __future__ import annotations

import io
import math
import os
import pickle
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emulator.session import EngineTask, SessionSettings, build_session_config
from protocol.snapshot import read_snapshot
from trainer.errors import ResumeRefused, exit_code_for
from trainer.exitcodes import ExitCode
from trainer.settings.options import TrainerOptions
from trainer.training.checkpoint import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_NAME,
    PREVIOUS_CHECKPOINT_NAME,
    CheckpointError,
    Fingerprint,
    TrainingState,
    checkpoint_paths,
    load_checkpoint,
    load_for_resume,
    load_latest,
    remove_stale_temp_files,
    save_checkpoint,
    sibling_checkpoint_folders,
)
from trainer.training.job import TrainingJob

CPU = torch.device("cpu")
TINY = SessionSettings(iteration_num=40, batch_size=16, hidden_layer_size=8, learning_rate=1e-3)


@pytest.fixture(scope="module")
def task() -> EngineTask:
    return EngineTask.benchmark("bimodal", size=48, seed=0)


def fingerprint(task: EngineTask, settings: SessionSettings = TINY, ema_decay: float = 0.9) -> Fingerprint:
    config, blobs = build_session_config(task, settings, None)
    received = {nid: read_snapshot(blob) for nid, blob in enumerate(blobs)}
    return Fingerprint.of(config, received, task.replay_buffer, ema_decay=ema_decay)


def make_job(
    task: EngineTask,
    folder: Path | None,
    *,
    settings: SessionSettings = TINY,
    resume: bool = False,
    every: float = 0.0,
    ema_decay: float = 0.9,
    layer_lr: str = TrainerOptions().layer_lr,
) -> TrainingJob:
    config, blobs = build_session_config(task, settings, None)
    received = {nid: read_snapshot(blob) for nid, blob in enumerate(blobs)}
    options = TrainerOptions(
        resume=resume,
        checkpoint_every_seconds=every,
        ema_decay=ema_decay,
        status_file=False,
        threads=1,
        layer_lr=layer_lr,
    )
    return TrainingJob.create(
        config, received, task.replay_buffer, options=options, device=CPU, checkpoint_dir=folder
    )


def sample_state(iteration: int, fp: Fingerprint, scale: float = 1.0) -> TrainingState:
    generator = torch.Generator().manual_seed(iteration)
    weights = torch.arange(12, dtype=torch.float32).reshape(3, 4) * scale
    return TrainingState(
        iteration=iteration,
        model={"denoiser.0.weight": weights, "ema_updates": torch.tensor(iteration)},
        optimizer={"state": {0: {"step": torch.tensor(3.0)}}, "param_groups": [{"lr": 1e-3, "params": [0]}]},
        generator=generator.get_state(),
        generator_device="cpu",
        smoothed_loss=0.25,
        fingerprint=fp,
        trainer_version="test",
        saved_at=123.0,
    )


FP = Fingerprint((("FlowMatchingSettings.HiddenLayerSize", "8"), ("network 0 (denoiser).InputSize", "5")))


# -- file format -------------------------------------------------------------------------------------------


def test_round_trip_is_exact(tmp_path: Path) -> None:
    state = sample_state(7, FP)
    path = save_checkpoint(tmp_path, state)
    assert path == tmp_path / CHECKPOINT_NAME
    loaded = load_checkpoint(path)
    assert loaded.iteration == 7 and loaded.smoothed_loss == 0.25 and loaded.fingerprint == FP
    assert torch.equal(loaded.model["denoiser.0.weight"], state.model["denoiser.0.weight"])
    assert torch.equal(loaded.generator, state.generator)
    assert loaded.optimizer["param_groups"][0]["lr"] == 1e-3
    assert (loaded.trainer_version, loaded.saved_at, loaded.generator_device) == ("test", 123.0, "cpu")


def test_file_loads_with_weights_only_and_carries_its_checksum(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path, sample_state(1, FP))
    outer = torch.load(path, weights_only=True)
    assert outer["format"] == CHECKPOINT_FORMAT and outer["version"] == 1
    assert len(outer["sha256"]) == 64 and outer["payload_bytes"] == outer["payload"].numel()
    inner = torch.load(io.BytesIO(outer["payload"].numpy().tobytes()), weights_only=True)
    assert inner["iteration"] == 1


def test_second_save_keeps_the_first_as_previous(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, sample_state(1, FP))
    save_checkpoint(tmp_path, sample_state(2, FP))
    current, previous = checkpoint_paths(tmp_path)
    assert load_checkpoint(current).iteration == 2
    assert load_checkpoint(previous).iteration == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([CHECKPOINT_NAME, PREVIOUS_CHECKPOINT_NAME])


def test_a_flipped_payload_byte_fails_the_checksum_and_the_previous_is_used(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, sample_state(1, FP))
    save_checkpoint(tmp_path, sample_state(2, FP, scale=2.0))
    current, _ = checkpoint_paths(tmp_path)
    outer = torch.load(current, weights_only=True)
    outer["payload"][len(outer["payload"]) // 2] ^= 0xFF
    torch.save(outer, current)  # a well-formed file whose payload no longer matches its digest
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        load_checkpoint(current)
    state, notes = load_latest(tmp_path)
    assert state is not None and state.iteration == 1
    assert len(notes) == 1 and "checksum mismatch" in notes[0]


def test_every_truncation_is_a_checkpoint_error(tmp_path: Path) -> None:
    """Invariant: a checkpoint cut at any byte either is refused with CheckpointError or is the whole file."""
    path = save_checkpoint(tmp_path, sample_state(3, FP))
    data = path.read_bytes()
    cut_path = tmp_path / "cut.pt"
    step = max(1, len(data) // 300)
    for cut in [*range(0, len(data), step), len(data) - 1]:
        cut_path.write_bytes(data[:cut])
        with pytest.raises(CheckpointError):
            load_checkpoint(cut_path)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=2048))
def test_fuzz_random_bytes_only_raise_checkpoint_error(tmp_path: Path, data: bytes) -> None:
    """Invariant: arbitrary bytes as a checkpoint file raise CheckpointError and nothing else."""
    path = tmp_path / "fuzz.pt"
    path.write_bytes(data)
    with pytest.raises(CheckpointError):
        load_checkpoint(path)


class _Boom:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("touch PWNED",))


def test_a_pickled_object_is_refused_and_never_executed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / CHECKPOINT_NAME
    torch.save({"format": CHECKPOINT_FORMAT, "version": 1, "payload": _Boom()}, path)
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        load_checkpoint(path)
    raw = tmp_path / "raw.pkl"
    raw.write_bytes(pickle.dumps(_Boom()))
    with pytest.raises(CheckpointError):
        load_checkpoint(raw)
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize(
    ("outer", "message"),
    [
        ({"format": "something-else", "version": 1}, "not an la-trainer checkpoint"),
        ({"format": CHECKPOINT_FORMAT, "version": 2}, "format version 2"),
        ({"format": CHECKPOINT_FORMAT, "version": 1, "payload": torch.zeros(3)}, "not a byte tensor"),
        (
            {
                "format": CHECKPOINT_FORMAT,
                "version": 1,
                "payload": torch.zeros(3, dtype=torch.uint8),
                "payload_bytes": 4,
            },
            "3 bytes",
        ),
        ([1, 2, 3], "not an la-trainer checkpoint"),
    ],
    ids=["foreign", "version", "float-payload", "size", "list"],
)
def test_foreign_or_malformed_outer_dicts_are_named(tmp_path: Path, outer: object, message: str) -> None:
    path = tmp_path / "x.pt"
    torch.save(outer, path)
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(path)


def test_missing_file_is_a_checkpoint_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nope.pt")


# -- dying at each step of a write ---------------------------------------------------------------------------


def test_a_writer_killed_between_renames_leaves_the_previous_loadable(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, sample_state(1, FP))
    current, previous = checkpoint_paths(tmp_path)
    # The state right after "rename current -> previous", before "rename temp -> current".
    os.replace(current, previous)
    (tmp_path / f".{CHECKPOINT_NAME}.abc123.tmp").write_bytes(b"half a checkpoint")
    state, notes = load_latest(tmp_path)
    assert state is not None and state.iteration == 1 and notes == []
    removed = remove_stale_temp_files(tmp_path)
    assert [p.name for p in removed] == [f".{CHECKPOINT_NAME}.abc123.tmp"]


def test_a_failing_write_leaves_both_files_and_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save_checkpoint(tmp_path, sample_state(1, FP))
    save_checkpoint(tmp_path, sample_state(2, FP))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    real_fsync = os.fsync

    def failing_fsync(fd: int) -> None:
        real_fsync(fd)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="No space"):
        save_checkpoint(tmp_path, sample_state(3, FP))
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


@pytest.mark.skipif(os.name == "nt", reason="POSIX permission bits")
def test_checkpoints_get_the_mode_open_gives(tmp_path: Path) -> None:
    """Written through the one atomic writer: not mkstemp's 0600 (a user's backup tool must read it)."""
    reference = tmp_path / "reference"
    reference.write_bytes(b"")
    expected = reference.stat().st_mode & 0o777
    save_checkpoint(tmp_path, sample_state(1, FP))
    save_checkpoint(tmp_path, sample_state(2, FP))
    current, previous = checkpoint_paths(tmp_path)
    assert current.stat().st_mode & 0o777 == expected
    assert previous.stat().st_mode & 0o777 == expected


# -- fingerprints and resume refusal ------------------------------------------------------------------------


def test_fingerprint_diff_names_each_changed_key(task: EngineTask) -> None:
    saved = fingerprint(task)
    assert saved.differences(fingerprint(task)) == []
    changed = fingerprint(task, replace(TINY, hidden_layer_size=16, activation="ReLU"))
    lines = changed.differences(saved)
    text = "\n".join(lines)
    assert "  FlowMatchingSettings.HiddenLayerSize: checkpoint 16, now 8" in lines
    assert '  FlowMatchingSettings.ActivationFunction: checkpoint "ReLU", now "ELU"' in lines
    assert "network 0 (denoiser).structure" in text and "network 0 (denoiser).FileDataSize" in text
    # Knobs a user may change between a crash and its resume are not part of it.
    assert fingerprint(task, replace(TINY, learning_rate=0.5, batch_size=3, iteration_num=9, seed=1)) == saved


def test_fingerprint_covers_the_data_and_the_ema_layout(task: EngineTask) -> None:
    saved = fingerprint(task)
    other = EngineTask.benchmark("bimodal", size=48, seed=1)
    assert [line.split(":")[0] for line in fingerprint(other).differences(saved)] == [
        "  replay buffer.data sha256"
    ]
    assert "option ema_decay" in "\n".join(fingerprint(task, ema_decay=0.0).differences(saved))


def test_load_for_resume_refuses_a_mismatch_with_a_readable_diff(task: EngineTask, tmp_path: Path) -> None:
    save_checkpoint(tmp_path, sample_state(5, fingerprint(task)))
    with pytest.raises(ResumeRefused) as info:
        load_for_resume(tmp_path, fingerprint(task, replace(TINY, hidden_layer_size=16)))
    message = str(info.value)
    assert "iteration 5" in message and "HiddenLayerSize: checkpoint 8, now 16" in message
    assert exit_code_for(info.value) is ExitCode.RESUME_REFUSED


def test_load_for_resume_without_files_and_with_only_corrupt_files(tmp_path: Path) -> None:
    assert load_for_resume(tmp_path, FP) == (None, [])
    (tmp_path / CHECKPOINT_NAME).write_bytes(b"garbage")
    (tmp_path / PREVIOUS_CHECKPOINT_NAME).write_bytes(b"")
    with pytest.raises(ResumeRefused, match="no usable checkpoint") as info:
        load_for_resume(tmp_path, FP)
    assert CHECKPOINT_NAME in str(info.value) and PREVIOUS_CHECKPOINT_NAME in str(info.value)


# -- TrainingJob ---------------------------------------------------------------------------------------------


def run_steps(job: TrainingJob, start: int, stop: int) -> list[float]:
    return [job.step(i) for i in range(start, stop)]


def test_resumed_job_continues_bit_for_bit(task: EngineTask, tmp_path: Path) -> None:
    straight = make_job(task, None)
    losses = run_steps(straight, 0, 30)

    first = make_job(task, tmp_path)
    first_losses = run_steps(first, 0, 12)
    assert first.maybe_checkpoint(12, force=True) == tmp_path / CHECKPOINT_NAME
    run_steps(first, 12, 15)  # work after the checkpoint is lost in the "crash"
    del first

    resumed = make_job(task, tmp_path, resume=True)
    assert resumed.start_iteration == 12
    assert resumed.smoothed_loss == first_losses[-1]
    resumed_losses = run_steps(resumed, 12, 30)
    assert first_losses + resumed_losses == losses
    for (name, a), (_, b) in zip(
        straight.model.state_dict().items(), resumed.model.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    assert resumed.export()[0] is not None


def test_resume_without_a_checkpoint_starts_fresh(task: EngineTask, tmp_path: Path) -> None:
    job = make_job(task, tmp_path, resume=True)
    assert job.start_iteration == 0 and math.isnan(job.smoothed_loss)


def test_resume_takes_the_learning_rate_of_this_run(task: EngineTask, tmp_path: Path) -> None:
    job = make_job(task, tmp_path)
    run_steps(job, 0, 3)
    job.maybe_checkpoint(3, force=True)
    resumed = make_job(task, tmp_path, settings=replace(TINY, learning_rate=0.125), resume=True)
    # Every group at this run's rate times its per-layer multiplier (layer_lr; 1 for the plain groups).
    groups = resumed.optimizer.param_groups
    assert [g["lr"] for g in groups] == [0.125 * g.get("lr_scale", 1.0) for g in groups]
    assert any(g.get("lr_scale", 1.0) == 1.0 for g in groups)
    assert resumed.optimizer.state_dict()["state"]  # the AdamW moments came back


@pytest.mark.parametrize(("before", "after"), [("same", "fan_in"), ("fan_in", "same")])
def test_resume_across_a_change_of_layer_lr_keeps_each_parameters_moments(
    task: EngineTask, tmp_path: Path, before: str, after: str
) -> None:
    """layer_lr regroups the parameters (a newer la-trainer changed its default): the Adam moments follow
    their parameter, the groups and their rates are this run's."""
    job = make_job(task, tmp_path, layer_lr=before)
    run_steps(job, 0, 3)
    job.maybe_checkpoint(3, force=True)
    saved = job.optimizer.state_dict()
    resumed = make_job(task, tmp_path, resume=True, layer_lr=after)
    fresh = make_job(task, None, layer_lr=after)
    assert len(resumed.optimizer.param_groups) == len(fresh.optimizer.param_groups)
    assert len(saved["param_groups"]) != len(fresh.optimizer.param_groups)
    assert [g["lr"] for g in resumed.optimizer.param_groups] == [
        g["lr"] for g in fresh.optimizer.param_groups
    ]
    saved_order = [i for g in saved["param_groups"] for i in g["params"]]
    params = [p for g in resumed.optimizer.param_groups for p in g["params"]]
    for position, param in enumerate(params):
        moments = resumed.optimizer.state[param]
        for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
            assert torch.equal(moments[key], saved["state"][saved_order[position]][key])


def test_resume_refuses_other_networks(task: EngineTask, tmp_path: Path) -> None:
    job = make_job(task, tmp_path)
    job.maybe_checkpoint(0, force=True)
    with pytest.raises(ResumeRefused, match="HiddenLayerSize: checkpoint 8, now 16"):
        make_job(task, tmp_path, settings=replace(TINY, hidden_layer_size=16), resume=True)


def test_checkpoint_cadence(task: EngineTask, tmp_path: Path) -> None:
    job = make_job(task, tmp_path, every=0.0)
    assert job.maybe_checkpoint(1) is None  # 0: only forced checkpoints
    path = job.maybe_checkpoint(1, force=True)
    assert path is not None and load_checkpoint(path).iteration == 1
    stamp = path.stat().st_mtime_ns
    assert job.maybe_checkpoint(1, force=True) == path  # same iteration: not written again
    assert path.stat().st_mtime_ns == stamp
    timed = make_job(task, tmp_path / "timed", every=1e-9)
    assert timed.maybe_checkpoint(2) == tmp_path / "timed" / CHECKPOINT_NAME
    assert make_job(task, None).maybe_checkpoint(3, force=True) is None


def test_a_new_job_removes_temp_files_of_a_killed_writer(task: EngineTask, tmp_path: Path) -> None:
    tmp_path.mkdir(exist_ok=True)
    stale = tmp_path / f".{CHECKPOINT_NAME}.x1y2.tmp"
    stale.write_bytes(b"partial")
    make_job(task, tmp_path)
    assert not stale.exists()


def test_resume_finds_the_previous_task_folder_of_a_spawned_run(task: EngineTask, tmp_path: Path) -> None:
    """The engine gives each spawned run a new ``<TaskName><TaskId>`` folder (spec §1.2)."""
    earlier = make_job(task, tmp_path / "Training0" / "Snapshots")
    run_steps(earlier, 0, 4)
    earlier.maybe_checkpoint(4, force=True)
    other = make_job(task, tmp_path / "Training1" / "Snapshots", settings=replace(TINY, hidden_layer_size=16))
    other.maybe_checkpoint(0, force=True)  # newer, but another experiment: skipped, not refused
    (tmp_path / "Unrelated7" / "Snapshots").mkdir(parents=True)
    assert sibling_checkpoint_folders(tmp_path / "Training2" / "Snapshots") == [
        tmp_path / "Training1" / "Snapshots",
        tmp_path / "Training0" / "Snapshots",
    ]
    resumed = make_job(task, tmp_path / "Training2" / "Snapshots", resume=True)
    assert resumed.start_iteration == 4
    assert sibling_checkpoint_folders(tmp_path / "Snapshots") == []  # a folder without a TaskId
