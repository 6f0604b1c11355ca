"""``la-trainer demo`` (the :mod:`emulator.demo` package): the newcomer's first run.

The unit tests at the top need no trainer process (seconds); the two marked ``integration``/``slow`` run
the real ``scripts/train.py`` over shared memory with a reduced budget (``--quick``), once to completion
and once stopped by the time limit, and check the report files and their keys.
"""

from __future__ import annotations

import io
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from emulator.demo import (
    EVALUATION_SEED,
    QUICK_PLAN,
    DemoPlan,
    ProgressLine,
    demo_command,
    evaluate_networks,
    evaluation_starts,
    make_plan,
    parse_progress_line,
    record_demonstrations,
)
from emulator.demo.command import Console
from emulator.demo.report import (
    FIGURE_FILE_NAME,
    JSON_FILE_NAME,
    MARKDOWN_FILE_NAME,
    DemoReport,
    ResultRow,
    Trajectories,
    report_json,
    results_table_markdown,
    results_table_text,
    write_report,
)
from emulator.demo.training import time_limit_stops
from emulator.session import SessionSettings, build_session_config
from emulator.tasks import Demonstrations, avoid, task_rng
from trainer.records.progress import ProgressReporter

METRIC_KEYS = {"success", "entropy", "collision", "mean_steps", "policy_calls", "ms_per_call"} | {
    f"mode/{name}" for name in avoid.MODE_NAMES
}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# --------------------------------------------------------------------------------------------------
# Progress lines


def test_progress_line_round_trips_the_trainers_own_format() -> None:
    """Invariant: every line ProgressReporter prints (plain mode) parses back to its iteration, total, loss."""
    stream = io.StringIO()
    reporter = ProgressReporter(12_000, stream=stream, tty=False)
    cases = [(1, 1.9201), (1200, 0.41234), (11_999, 0.0523), (12_000, 0.05)]
    for iteration, loss in cases:
        reporter.update(iteration, loss, force=True)
    lines = stream.getvalue().splitlines()
    assert len(lines) == len(cases)
    for line, (iteration, loss) in zip(lines, cases, strict=True):
        # The engine echoes the trainer's stdout with this prefix (spec §1.1); both forms parse.
        for text in (line, "Subprocess: " + line):
            parsed = parse_progress_line(text)
            assert parsed is not None, text
            assert (parsed.iteration, parsed.total) == (iteration, 12_000)
            assert parsed.loss == pytest.approx(loss, abs=5e-6)
            assert parsed.rate >= 0.0


def test_progress_line_parses_thousands_separators_and_nan() -> None:
    parsed = parse_progress_line("train: iteration 5/10 (50.0%) loss nan 1,850 it/s eta 2s syncs 3")
    assert parsed is not None
    assert (parsed.iteration, parsed.total, parsed.rate) == (5, 10, 1850.0)
    assert math.isnan(parsed.loss)


@pytest.mark.parametrize(
    "line",
    [
        "",
        "la-trainer: training 300 iterations on 1743 samples (observation 2, action 16, chunk 8)",
        "la-trainer: done after 300 iterations, 2 sync rounds.",
        "train: iteration x/10 (1%) loss 0.1 3 it/s",
    ],
)
def test_other_lines_are_not_progress(line: str) -> None:
    assert parse_progress_line(line) is None


def test_the_time_limit_never_stops_a_trainer_that_reported_its_last_iteration() -> None:
    """Issue 24 item 1: a Stop sent after the final round raced the trainer's Complete. Past the time
    limit the game stops only a trainer that is still training, and only with a round to evaluate."""
    assert time_limit_stops(have_round=True, iteration=300, total=600)
    assert not time_limit_stops(have_round=False, iteration=300, total=600)
    assert not time_limit_stops(have_round=True, iteration=600, total=600)  # final round + Complete coming
    assert time_limit_stops(have_round=True, iteration=0, total=0)  # no progress line seen yet


# --------------------------------------------------------------------------------------------------
# The plan


def test_plan_defaults_are_the_b2_benchmark_sizes() -> None:
    plan = make_plan()
    assert (plan.demo_num, plan.rollout_num) == (avoid.DEMO_NUM, avoid.EVAL_ROLLOUT_NUM) == (200, 200)
    assert (plan.chunk_size, plan.execute, plan.ode_steps) == (8, 4, 8)
    assert plan.evaluated_ode_steps == (8, 2, 4)
    assert not plan.quick


def test_plan_options_override_and_quick_is_small() -> None:
    plan = make_plan(iterations=300, seed=5, ode_steps=4, quick=True, time_limit_s=0.0)
    assert plan.quick and plan.iterations == 300 and plan.seed == 5 and plan.time_limit_s == 0.0
    assert plan.hidden_layer_size == QUICK_PLAN.hidden_layer_size < DemoPlan().hidden_layer_size
    assert make_plan(quick=True).iterations == QUICK_PLAN.iterations
    # The headline step count comes first and is never repeated among the extra rows.
    assert make_plan(ode_steps=4).evaluated_ode_steps == (4, 2)
    assert make_plan(ode_steps=4, quick=True).evaluated_ode_steps == (4,)


# --------------------------------------------------------------------------------------------------
# Evaluation


def _straight_up(obs: np.ndarray) -> np.ndarray:
    """A deterministic policy that drifts right while climbing (some succeed, some collide)."""
    return np.tile(np.array([[0.3, 1.0]], np.float32), (obs.shape[0], 1))


def test_evaluation_starts_are_those_of_evaluate_policy() -> None:
    """Invariant: recording trajectories with evaluation_starts scores exactly what evaluate_policy scores."""
    official = avoid.evaluate_policy(_straight_up, EVALUATION_SEED, 200)
    ours = avoid.rollout(
        lambda idx, obs: _straight_up(obs), evaluation_starts(EVALUATION_SEED, 200)
    ).metrics()
    official.pop("ms_per_call")
    ours.pop("ms_per_call")
    assert ours == official


def test_demonstration_routes_are_those_the_world_measured() -> None:
    """Invariant: replaying recorded expert episodes classifies every one on the route the live run took."""
    rng = task_rng(0, 99)
    modes = np.arange(12) % len(avoid.MODE_NAMES)
    live = avoid.rollout(
        avoid._Expert(modes, rng, avoid.EXPERT_NOISE), avoid.sample_starts(12, rng), record=True
    )
    assert live.success.all()
    truth = Trajectories.from_rollouts(live)
    demos = Demonstrations(tuple(zip(live.observations, live.actions, strict=True)))
    replayed = Trajectories.from_demonstrations(demos)
    np.testing.assert_array_equal(replayed.routes, truth.routes)
    np.testing.assert_array_equal(replayed.routes, modes)
    for path, (obs, _) in zip(replayed.paths, demos.episodes, strict=True):
        assert path.shape == (obs.shape[0] + 1, 2)
        np.testing.assert_allclose(path[:-1], obs, atol=1e-6)
        assert path[-1, 1] >= avoid.GOAL_Y


def test_trajectories_from_rollouts_mark_failures_and_limit() -> None:
    result = avoid.rollout(
        lambda idx, obs: _straight_up(obs), evaluation_starts(EVALUATION_SEED, 30), record=True
    )
    paths = Trajectories.from_rollouts(result, limit=10)
    assert len(paths) == 10
    assert ((paths.routes >= 0) == result.success[:10]).all()
    np.testing.assert_array_equal(paths.collided, result.collided[:10])
    with pytest.raises(ValueError, match="not recorded"):
        Trajectories.from_rollouts(avoid.rollout(lambda idx, obs: _straight_up(obs), evaluation_starts(0, 3)))


def test_untrained_networks_evaluate_through_the_engine_path() -> None:
    """The engine's initial networks (no training) run as the game runs them: chunks of 8, 4 executed."""
    plan = make_plan(quick=True)
    _, task = record_demonstrations(replace(plan, demo_num=10))
    settings = SessionSettings(
        hidden_layer_num=plan.hidden_layer_num,
        hidden_layer_size=plan.hidden_layer_size,
        action_chunk_size=plan.chunk_size,
        embed_normalizations_in_weights=True,
    )
    _, snapshots = build_session_config(task, settings, None)
    evaluation = evaluate_networks(snapshots, plan, 2, record=True)
    assert set(evaluation.metrics) == METRIC_KEYS
    assert evaluation.trajectories is not None and len(evaluation.trajectories) == plan.plot_num
    starts = evaluation_starts(EVALUATION_SEED, plan.rollout_num)
    for path, start in zip(evaluation.trajectories.paths, starts, strict=False):
        np.testing.assert_allclose(path[0], start, atol=1e-6)
    # Each call returns a chunk of 8 actions, of which 4 run: at most ceil(60 / 4) calls per episode.
    assert evaluation.metrics["policy_calls"] <= math.ceil(avoid.MAX_STEPS / plan.execute)


# --------------------------------------------------------------------------------------------------
# Report rendering (synthetic data)


def _synthetic_report(stopped: str = "no") -> DemoReport:
    result = avoid.rollout(
        lambda idx, obs: _straight_up(obs), evaluation_starts(EVALUATION_SEED, 20), record=True
    )
    metrics = result.metrics()
    expert = avoid.evaluate_expert(EVALUATION_SEED, 20)
    return DemoReport(
        title="test report",
        summary="A synthetic report.",
        rows=(ResultRow("expert (scripted)", None, expert), ResultRow("flow matching", 8, metrics)),
        expert=Trajectories.from_rollouts(result),
        expert_label="expert",
        policy=Trajectories.from_rollouts(result, limit=5),
        policy_label="policy",
        loss_curve=((10, 1.5), (20, 1.0), (30, math.nan), (40, 0.5)),
        training={"iterations_planned": 100, "iterations_done": 40, "stopped_early": stopped},
        settings={"IterationNum": 100},
        timings={"train": 1.25},
        notes=("a note",),
        command="la-trainer demo --quick",
    )


def test_report_tables_hold_every_row_and_route() -> None:
    report = _synthetic_report()
    markdown = results_table_markdown(report.rows).splitlines()
    assert len(markdown) == 2 + len(report.rows)
    assert all(name in markdown[0] for name in avoid.MODE_NAMES)
    # The expert row shows no ODE step count and no call time (its "policy" is not a network).
    assert markdown[2].startswith("| expert (scripted) | – |") and markdown[2].count("| – |") == 2
    text = results_table_text(report.rows).splitlines()
    assert len(text) == 1 + len(report.rows)
    assert text[2].startswith("flow matching")
    assert f"{report.rows[1].metrics['success']:.3f}" in text[2]


def test_report_json_keys_and_nan_become_null() -> None:
    data = report_json(_synthetic_report())
    assert set(data) == {
        "title",
        "expert",
        "policy",
        "rows",
        "training",
        "settings",
        "timings_s",
        "notes",
        "command",
    }
    assert set(data["expert"]) == METRIC_KEYS and set(data["policy"]) == {"8"}
    assert data["training"]["loss_curve"][2] == [30, None]
    json.dumps(data, allow_nan=False)  # strict JSON: no NaN/Infinity literals


def test_write_report_writes_markdown_json_and_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    files = write_report(_synthetic_report(stopped="time limit"), tmp_path / "out")
    assert files.warning is None and files.figure == tmp_path / "out" / FIGURE_FILE_NAME
    assert files.figure.read_bytes().startswith(PNG_MAGIC)
    markdown = files.markdown.read_text(encoding="utf-8")
    assert f"]({FIGURE_FILE_NAME})" in markdown and "> a note" in markdown
    assert json.loads(files.metrics.read_text(encoding="utf-8"))["title"] == "test report"
    assert not list((tmp_path / "out").glob(".*.tmp"))


def test_write_report_without_matplotlib_says_how_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / FIGURE_FILE_NAME).write_bytes(b"stale figure from an earlier run")
    # A None entry in sys.modules makes `import matplotlib` raise ImportError.
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    files = write_report(_synthetic_report(), tmp_path)
    assert files.figure is None
    assert files.warning is not None and "pip install" in files.warning and "matplotlib" in files.warning
    assert not (tmp_path / FIGURE_FILE_NAME).exists()
    markdown = (tmp_path / MARKDOWN_FILE_NAME).read_text(encoding="utf-8")
    assert FIGURE_FILE_NAME not in markdown.split("pip install")[0].split("## Training")[0]
    assert (tmp_path / JSON_FILE_NAME).is_file()


def test_trajectories_reject_mismatched_arrays() -> None:
    path = np.zeros((3, 2), np.float32)
    with pytest.raises(ValueError, match="routes"):
        Trajectories((path,), np.zeros(2, np.int64), np.zeros(1, np.bool_))
    with pytest.raises(ValueError, match="shape"):
        Trajectories((np.zeros((3, 3), np.float32),), np.zeros(1, np.int64), np.zeros(1, np.bool_))


def test_console_plain_lines_are_throttled_and_the_bar_draws(capsys: pytest.CaptureFixture[str]) -> None:
    plain = Console(tty=False)
    for i in range(1, 101):
        plain.progress(ProgressLine(i * 10, 1000, 1.0, 100.0))
    plain.finished()
    lines = [line for line in capsys.readouterr().out.splitlines() if "training:" in line]
    # The first line at once, then one per period; the last state is always shown at the end.
    assert lines[0].startswith("  training: iteration 10/1000") and lines[-1].startswith(
        "  training: iteration 1000/1000"
    )
    assert len(lines) <= 3
    bar = Console(tty=True)
    bar.progress(ProgressLine(500, 1000, 0.25, 100.0))
    bar.progress(ProgressLine(1000, 1000, 0.20, 100.0))
    bar.finished()


# --------------------------------------------------------------------------------------------------
# The real thing, with a reduced budget


def _run_demo(out: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(demo_command, ["--quick", "--out", str(out), *args], catch_exceptions=False)
    return result.exit_code, result.output


@pytest.mark.integration
@pytest.mark.slow
def test_quick_demo_trains_over_shared_memory_and_writes_the_report(tmp_path: Path) -> None:
    """Invariant: the quick demo completes and leaves report.md, report.png and metrics.json with every key."""
    out = tmp_path / "demo"
    code, output = _run_demo(out, "--iterations", "300", "--time-limit", "0")
    assert code == 0, output[-4000:]
    assert f"Report: {(out / MARKDOWN_FILE_NAME).resolve()}" in output
    assert "expert (scripted)" in output and "flow matching" in output
    for name in (MARKDOWN_FILE_NAME, JSON_FILE_NAME, "trainer.log"):
        assert (out / name).is_file(), name
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "pip install" in output
    else:
        assert (out / FIGURE_FILE_NAME).read_bytes().startswith(PNG_MAGIC)
    # The engine's config files as the game wrote them (trainer, data and shared-memory configs).
    assert {p.name.split("-{")[0] for p in (out / "engine-configs").iterdir()} == {
        "trainer-config.json",
        "data-config.json",
        "shared-memory",
    }

    metrics = json.loads((out / JSON_FILE_NAME).read_text(encoding="utf-8"))
    assert set(metrics["expert"]) == METRIC_KEYS
    assert set(metrics["policy"]) == {"8"} and set(metrics["policy"]["8"]) == METRIC_KEYS
    for row in (metrics["expert"], metrics["policy"]["8"]):
        assert 0.0 <= row["success"] <= 1.0 and 0.0 <= row["entropy"] <= 1.0
    assert metrics["expert"]["success"] == 1.0
    training = metrics["training"]
    assert training["completed"] is True and training["stopped_early"] == "no"
    assert training["trainer_exit_code"] == 0
    assert training["iterations_done"] == training["iterations_planned"] == 300
    assert training["rounds_received"] >= 1
    curve = training["loss_curve"]
    assert curve and curve[-1][0] == 300 and all(loss is None or loss > 0 for _, loss in curve)
    assert [i for i, _ in curve] == sorted(i for i, _ in curve)
    assert "SharedMemory" in training["trainer_command"] and " -g " in training["trainer_command"]


@pytest.mark.integration
@pytest.mark.slow
def test_time_limit_stops_training_as_the_game_does_and_reports_it(tmp_path: Path) -> None:
    """Invariant: past the time limit the game sends Stop, evaluates its last round and says so."""
    out = tmp_path / "demo"
    # A limit shorter than the quick plan's reserve: the game stops at the first round it receives.
    code, output = _run_demo(out, "--iterations", "1000000", "--time-limit", "1")
    assert code == 0, output[-4000:]
    metrics = json.loads((out / JSON_FILE_NAME).read_text(encoding="utf-8"))
    training = metrics["training"]
    assert training["stopped_early"] == "time limit" and training["completed"] is False
    assert training["trainer_exit_code"] == 0
    assert training["rounds_received"] >= 1
    assert 0 < training["iterations_done"] < 1_000_000
    assert set(metrics["policy"]["8"]) == METRIC_KEYS
    assert any("stopped early (time limit)" in note for note in metrics["notes"])
    assert "stopped early (time limit)" in output
