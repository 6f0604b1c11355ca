"""The run's CPU thread count: chosen from the denoiser's size, set before ``prepare_job`` (scale-out
divides it among a node's ranks), and reported as what the step really uses."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from emulator.session import EngineTask, SessionSettings, build_session_config
from trainer.exitcodes import ExitCode
from trainer.records.progress import read_status
from trainer.records.runrecord import find_run_folders, read_metrics
from trainer.session.links import MemoryLink
from trainer.session.run import run_training
from trainer.settings.options import TrainerOptions
from trainer.training.job import TrainingJob
from trainer.training.threads import (
    THREADS_WORK_THRESHOLD,
    ThreadPolicy,
    ThreadSettings,
    choose_threads,
    usable_cores,
)

SETTINGS = SessionSettings(
    iteration_num=6, batch_size=32, hidden_layer_num=1, hidden_layer_size=16, device="CPU", seed=3
)


def test_the_threshold_splits_one_thread_from_several() -> None:
    options = TrainerOptions()
    assert choose_threads(options.threads, THREADS_WORK_THRESHOLD - 1) == 1
    assert choose_threads(options.threads, THREADS_WORK_THRESHOLD) == min(usable_cores(), 8)
    assert choose_threads(dataclasses.replace(options, threads=3).threads, 10) == 3  # an explicit choice wins


def test_prepare_job_sees_the_trainers_choice_and_the_banner_reports_its_cap(
    capsys: pytest.CaptureFixture[str],
) -> None:
    seen: list[int] = []

    def cap_to_one(job: TrainingJob) -> TrainingJob:
        # What trainer.distributed.scale_out_job does for 2+ ranks on a node: take a share.
        seen.append(torch.get_num_threads())
        torch.set_num_threads(1)
        return job

    previous = torch.get_num_threads()
    try:
        task = EngineTask.benchmark("bimodal", size=96, seed=0)
        config, blobs = build_session_config(task, SETTINGS, None)
        link = MemoryLink(config, blobs, task.replay_buffer)
        options = TrainerOptions(threads=2, status_file=False, checkpoint_every_seconds=0)
        prepare: Callable[[TrainingJob], TrainingJob] = cap_to_one
        result = run_training(link, options=options, task_dir=None, prepare_job=prepare)
    finally:
        torch.set_num_threads(previous)
    assert result == ExitCode.OK
    assert [sent.network_id for sent in link.sent[-3:]] == [0, 1, 2] and link.completed
    assert seen == [2]  # the trainer's choice (here the explicit option) was in force before the hook
    out = capsys.readouterr().out
    assert "| threads 1 |" in out  # the banner reports the share the hook left, which the step uses


def test_an_automatic_cpu_run_measures_its_threads_and_says_so_in_the_log_status_and_record(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The wiring, not the policy (tests/trainer/test_threads.py): a probe short enough for a short run."""
    quick = ThreadSettings(probe_seconds=0.001, window_seconds=0.002)

    def quick_policy(candidates: tuple[int, ...], *, threads: int) -> ThreadPolicy:
        return ThreadPolicy((1, 2), quick, threads=threads)

    monkeypatch.setattr("trainer.session.run.ThreadPolicy", quick_policy)
    previous = torch.get_num_threads()
    try:
        task = EngineTask.benchmark("bimodal", size=96, seed=0)
        config, blobs = build_session_config(task, dataclasses.replace(SETTINGS, iteration_num=200), None)
        link = MemoryLink(config, blobs, task.replay_buffer)
        options = TrainerOptions(checkpoint_every_seconds=0)
        assert run_training(link, options=options, task_dir=tmp_path) == ExitCode.OK
    finally:
        torch.set_num_threads(previous)
    out = capsys.readouterr().out
    assert "| threads measured, from 1 |" in out
    assert "la-trainer: threads: " in out and "(start of training; it/s: 1 thread " in out
    status = read_status(tmp_path / "la-trainer-status.msgpack")
    assert status.threads in (1, 2) and "2 threads" in status.threads_note
    (run,) = find_run_folders(tmp_path)
    lines = [p["threads"] for p in read_metrics(run) if "threads" in p]
    assert lines and lines[0]["why"] == "start" and set(lines[0]["rates"]) == {"1", "2"}
    recorded = json.loads((run / "run.json").read_text(encoding="utf-8"))["threads"]
    assert recorded == lines[-1]


def test_an_explicit_count_is_never_measured(capsys: pytest.CaptureFixture[str]) -> None:
    previous = torch.get_num_threads()
    try:
        task = EngineTask.benchmark("bimodal", size=96, seed=0)
        config, blobs = build_session_config(task, SETTINGS, None)
        link = MemoryLink(config, blobs, task.replay_buffer)
        options = TrainerOptions(threads=1, status_file=False, checkpoint_every_seconds=0)
        assert run_training(link, options=options, task_dir=None) == ExitCode.OK
    finally:
        torch.set_num_threads(previous)
    out = capsys.readouterr().out
    assert "| threads 1 |" in out and "la-trainer: threads:" not in out
