"""A whole training story with a held-out set (trainer/training/heldout.py): its measurements land in the run's
metrics.jsonl, on the progress line and in ``la-trainer report``'s picture; without one, nothing of it
appears. The run is the in-memory link's (no game), a tiny engine-built B1 task of 64 one-step episodes."""

from __future__ import annotations

import contextlib
import io
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from emulator.session import EngineTask, SessionSettings, build_session_config
from trainer.commands.report import report_command
from trainer.records.progress import STATUS_FILE_NAME, read_status
from trainer.records.runrecord import HELDOUT_ACTIONS_FILE, find_run_folders, read_metrics
from trainer.session.app import InterruptFlag, run_with_link
from trainer.session.links import MemoryLink
from trainer.settings.options import TrainerOptions
from trainer.training import job as job_module
from trainer.training import recipes

ITERATIONS = 250
OPTIONS = TrainerOptions(
    sync_every_iterations=100,
    sync_every_seconds=0.0,
    threads=1,
    checkpoint_every_seconds=0.0,
    progress_every_seconds=1e-6,  # a progress line at every iteration: the held-out note must show
    heldout_share=0.2,
    heldout_min_episodes=50,
    heldout_every_iterations=100,
)


def _run(folder: Path, options: TrainerOptions) -> tuple[int, str]:
    task = EngineTask.benchmark("bimodal", size=64, seed=0)
    config, blobs = build_session_config(
        task,
        SessionSettings(iteration_num=ITERATIONS, batch_size=32),
        None,  # type: ignore[arg-type]
    )

    def open_link(flag: InterruptFlag) -> MemoryLink:
        return MemoryLink(config, list(blobs), task.replay_buffer)

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = run_with_link(open_link, options=options, task_dir=folder)
    return code, out.getvalue()


def test_the_measurements_reach_the_record_the_progress_line_and_the_report(tmp_path: Path) -> None:
    code, output = _run(tmp_path / "Training0", OPTIONS)
    assert code == 0, output
    assert "held out 13 of 64 episodes" in output
    assert "held-out selection " in output  # the progress line carries the latest numbers
    (folder,) = find_run_folders(tmp_path / "Training0")
    points = read_metrics(folder)
    measured = [p for p in points if "heldout" in p]
    assert [p["iteration"] for p in measured] == [100, 200, ITERATIONS]
    assert measured[0]["best"] is True
    for point in measured:
        values = point["heldout"]
        assert set(values) == {
            "selection",
            "selection_f1",
            "selection_energy",
            "selection_coverage",
            "selection_precision",
            "flow_loss",
            "energy_score",
            "energy_distance",
            "w1",
            "w1_raw",
            "coverage",
            "precision",
            "seconds",
        }
        assert all(math.isfinite(v) for k, v in values.items() if k != "w1_raw")
        assert len(values["w1_raw"]) == 2  # B1: one step of a 2-D action
    # the training lines are as before, beside them
    assert [p["iteration"] for p in points if "loss" in p] == [100, 200, ITERATIONS]
    actions = json.loads((folder / HELDOUT_ACTIONS_FILE).read_text(encoding="utf-8"))
    assert actions["iteration"] == ITERATIONS and actions["ode_steps"] == 8
    assert len(actions["demonstrated"]) == 13 and len(actions["sampled"]) == 13 * 4

    pytest.importorskip("matplotlib")
    picture = tmp_path / "report.png"
    result = CliRunner().invoke(report_command, [str(folder), "--out", str(picture)])
    assert result.exit_code == 0, result.output
    assert "held-out: selection score" in result.output
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # three panels side by side: wider than the loss-only picture (7 x 4 inches at 110 dpi)
    width = int.from_bytes(picture.read_bytes()[16:20], "big")
    assert width > 2 * 7 * 110


def test_without_a_held_out_set_nothing_of_it_appears(tmp_path: Path) -> None:
    code, output = _run(tmp_path / "Training0", replace(OPTIONS, heldout_min_episodes=65))
    assert code == 0, output
    assert "nothing held out: 64 episodes, fewer than heldout_min_episodes (65)" in output
    assert "held-out selection" not in output
    (folder,) = find_run_folders(tmp_path / "Training0")
    assert not any("heldout" in p for p in read_metrics(folder))
    assert not (folder / HELDOUT_ACTIONS_FILE).exists()


def test_the_recipe_pilot_reaches_the_record_the_status_and_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pilot (trainer/training/recipes.py) on a schedule scaled to the run: looks after 50 and 100
    iterations, each a metrics line, run.json's ``recipe``, the status file's recipe and the report's
    text and picture."""
    monkeypatch.setattr(recipes, "DROP_AT", 50)
    monkeypatch.setattr(recipes, "PICK_AT", 100)
    monkeypatch.setattr(job_module, "MIN_ITERATIONS", 200)
    task_dir = tmp_path / "Training0"
    code, output = _run(task_dir, OPTIONS)
    assert code == 0, output
    assert "recipe pilot: training standard, sharp, smooth side by side" in output
    (folder,) = find_run_folders(task_dir)
    looks = [p["recipe"] for p in read_metrics(folder) if "recipe" in p]
    assert [(look["iteration"], look["stage"]) for look in looks] == [(50, "drop"), (100, "pick")]
    assert len(looks[0]["scores"]) == 3 and len(looks[1]["scores"]) == 2 and len(looks[0]["stopped"]) == 1
    chosen = looks[1]["chosen"]
    assert (
        chosen in looks[1]["scores"]
        and max(looks[1]["scores"], key=lambda name: looks[1]["scores"][name]["score"]) == chosen
    )
    record = json.loads((folder / "run.json").read_text(encoding="utf-8"))["recipe"]
    assert record["name"] == chosen and record["chosen_by"] == "pilot" and len(record["looks"]) == 2
    status = read_status(task_dir / STATUS_FILE_NAME)
    assert status.recipe == chosen and "chosen at iteration 100" in status.recipe_note

    pytest.importorskip("matplotlib")
    result = CliRunner().invoke(report_command, [str(folder), "--out", str(tmp_path / "report.png")])
    assert result.exit_code == 0, result.output
    assert f"recipe: {chosen} chosen at 100 by the held-out selection score" in result.output
    assert "recipe pilot at 50: selection score" in result.output
