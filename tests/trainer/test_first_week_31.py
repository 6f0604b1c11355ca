"""Issue 31, "messages and help that tell the truth": one test (or more) per item, each failing before the
fix. Items that need a whole process (signals, ports, another user) are in
``tests/integration/test_first_week_31.py``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from trainer.commands import report
from trainer.commands.cli import main
from trainer.exitcodes import ExitCode
from trainer.records.runrecord import METRICS_FILE, RUN_FILE


def _run_folder(root: Path, lines: list[dict[str, object]] | None = None) -> Path:
    """A run record with a short metrics log (what every run leaves)."""
    folder = root / "LearningCore" / "Training0" / "runs" / "Training_FlowMatching_SharedMemory_x"
    folder.mkdir(parents=True)
    (folder / RUN_FILE).write_text("{}")
    rows = lines or [
        {"iteration": 100, "phase": "flow_matching", "loss": 1.5, "iterations_per_second": 900.0},
        {"iteration": 200, "phase": "flow_matching", "loss": 0.5, "iterations_per_second": 1000.0},
    ]
    (folder / METRICS_FILE).write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


# -- item 1: report --out with another suffix; report without matplotlib --------------------------------


@pytest.mark.parametrize("name", ["res1.txt", "loss"])
def test_report_refuses_an_out_it_cannot_draw_naming_the_suffixes(tmp_path: Path, name: str) -> None:
    _run_folder(tmp_path)
    result = CliRunner().invoke(main, ["report", str(tmp_path), "--out", str(tmp_path / name)])
    assert result.exit_code == ExitCode.USAGE, result.output
    assert "--out" in result.output and ".png, .svg, .pdf" in result.output
    assert ("'.txt'" if name.endswith(".txt") else "no suffix") in result.output
    assert "Traceback" not in result.output
    assert "points" not in result.output  # refused before the summary, as a wrong folder is


def test_report_without_matplotlib_warns_and_exits_0_as_the_demo_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One rule for a missing optional picture (report and demo): the summary, a warning, exit 0."""
    import trainer.system.container

    _run_folder(tmp_path)

    def missing() -> None:
        raise ImportError("No module named 'matplotlib'")

    monkeypatch.setattr(report, "_import_pyplot", missing)
    for container, advice in ((False, "then run the command again"), (True, "on the host")):
        monkeypatch.setattr(trainer.system.container, "in_container", lambda c=container: c)
        result = CliRunner().invoke(main, ["report", str(tmp_path)])
        assert result.exit_code == ExitCode.OK, result.output
        assert "2 points" in result.output and "warning: no picture drawn" in result.output
        assert "pip install 'la-trainer[plots]'" in result.output and advice in result.output


def test_the_demo_gives_the_same_advice_without_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    import trainer.system.container
    from emulator.demo import figure

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setattr(trainer.system.container, "in_container", lambda: True)
    with pytest.raises(figure.PlottingUnavailable) as raised:
        figure._import_pyplot("report.png")
    assert str(raised.value) == f"report.png was not drawn: {report.plots_advice()}."


# -- item 12: watch on a file that is not a status file ---------------------------------------------------


@pytest.mark.parametrize("once", [True, False])
@pytest.mark.parametrize(("content", "why"), [(b"", "it is empty"), (b'{"iteration": 1}\n', "status map")])
def test_watch_on_a_file_that_is_no_status_says_so(
    tmp_path: Path, once: bool, content: bytes, why: str
) -> None:
    path = tmp_path / "empty.msgpack"
    path.write_bytes(content)
    result = CliRunner().invoke(main, ["watch", str(path), *(["--once"] if once else [])])
    assert result.exit_code == ExitCode.USAGE, result.output
    assert f"{path} is not a status file (la-trainer-status.msgpack) or a folder: " in result.output
    assert why in result.output and "Unpack failed" not in result.output


# -- item 11: help that is not cut, options that apply, progress lines without syncs offline ----------------


def test_the_command_list_cuts_no_description() -> None:
    result = CliRunner().invoke(main, ["--help"], terminal_width=80)
    assert result.exit_code == 0
    commands = result.output.split("Commands:", 1)[1]
    assert "..." not in commands
    rows: dict[str, str] = {}
    for line in commands.splitlines():
        if line.startswith("  ") and not line.startswith("   "):
            name, _, text = line.strip().partition(" ")
            rows[name] = text.strip()
        elif line.strip():
            rows[name] += " " + line.strip()
    assert {"socket", "watch", "shm", "offline"} <= set(rows)
    assert all(text.endswith(".") for text in rows.values()), rows


@pytest.mark.parametrize("command", ["offline", "record"])
def test_commands_that_train_from_files_list_no_game_options(command: str) -> None:
    result = CliRunner().invoke(main, [command, "--help"], terminal_width=120)
    assert result.exit_code == 0
    for flag in ("--sync-every-iterations", "--sync-every-seconds", "--wait"):
        assert flag not in result.output
    assert "--iterations" in result.output and "--device" in result.output
    refused = CliRunner().invoke(main, [command, ".", "--wait", "5"])
    assert refused.exit_code == ExitCode.USAGE and "No such option '--wait'" in refused.output


@pytest.mark.parametrize("command", ["shm", "socket"])
def test_commands_with_a_game_keep_the_game_options(command: str) -> None:
    result = CliRunner().invoke(main, [command, "--help"], terminal_width=120)
    for flag in ("--sync-every-iterations", "--sync-every-seconds", "--wait"):
        assert flag in result.output


def test_offline_progress_lines_count_no_syncs(tmp_path: Path) -> None:
    import io

    from trainer.records.progress import ProgressReporter, read_status

    for syncs, shown in ((True, True), (False, False)):
        stream = io.StringIO()
        status = tmp_path / f"status-{syncs}.msgpack"
        with ProgressReporter(10, stream=stream, tty=False, syncs=syncs, status_path=status) as reporter:
            reporter.syncs = 3
            reporter.update(5, 0.5, force=True)
            assert ("syncs 3" in stream.getvalue()) is shown, stream.getvalue()
            assert read_status(status).syncs == (3 if shown else 0)


# -- item 9: which settings files were read, and where each option came from ------------------------------


def _export(root: Path) -> Path:
    """An engine export (TrainingMaterials/<stamp>) of a tiny task, under ``root``/TrainingMaterials."""
    from emulator.game import FileExport
    from emulator.session import build_session_config
    from tests.support.faults import TINY, small_task

    config, blobs = build_session_config(small_task(), TINY, str(root))
    return FileExport(root).write(config, dict(enumerate(blobs)), small_task().replay_buffer)


def test_offline_says_which_settings_files_it_read_and_records_every_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainer.records.runrecord import OPTION_SOURCES_FILE, OPTIONS_FILE, find_run_folders

    export = _export(tmp_path)
    project_file = tmp_path / "la-trainer.json"
    project_file.write_text(json.dumps({"threads": 1, "heldout_share": 0}))
    monkeypatch.setenv("LA_TRAINER_EMA_DECAY", "0.9")
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["offline", str(export), "--out", str(out), "--iterations", "12"])
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("la-trainer: settings files:"))
    # --out is new: it holds no settings file to look for.
    assert line == f"la-trainer: settings files: read {project_file} (threads, heldout_share)"
    (record,) = find_run_folders(out)
    sources = json.loads((record / OPTION_SOURCES_FILE).read_text())
    assert sources["threads"] == sources["heldout_share"] == f"settings file {project_file}"
    assert sources["ema_decay"] == "environment variable LA_TRAINER_EMA_DECAY"
    assert sources["iteration_num"] == "command-line option --iterations"
    assert sources["spread_gain"] == "default"
    assert set(sources) == set(json.loads((record / OPTIONS_FILE).read_text()))


def test_the_settings_line_says_when_no_file_was_there(tmp_path: Path) -> None:
    from trainer.settings.options import load_options_traced

    loaded = load_options_traced(tmp_path / "task", shared_dir=tmp_path, environ={})
    assert loaded.settings_line() == (
        f"la-trainer: settings files: none at {tmp_path / 'la-trainer.json'}; "
        f"none at {tmp_path / 'task' / 'la-trainer.json'}"
    )
    assert load_options_traced(None, environ={}).settings_line() == ""


# -- item 2: a server does not advise --wait, and says --wait does not apply to it --------------------------


def test_a_servers_long_wait_line_does_not_advise_wait() -> None:
    import math

    from trainer.session.transport.wait import WaitRule
    from trainer.settings.timeouts import Timeouts

    said: list[str] = []
    rule = WaitRule(
        Timeouts(wait=30.0), visible=False, why_unseen="serving", output=said.append, serving=True
    )
    assert math.isinf(rule.bound) and math.isinf(rule.start("the game"))
    rule.notice("the game to connect")(20.0)
    (line,) = said  # the start of an unbounded wait announces nothing
    assert "without a bound" in line and "--wait bounds only a --once trainer's wait" in line
    assert "change it with --wait" not in line


def test_the_note_names_where_the_wait_came_from_and_what_applies() -> None:
    from trainer.commands.cli import _wait_note
    from trainer.settings.options import load_options_traced

    loaded = load_options_traced(None, {"wait": 30.0}, environ={})
    note = _wait_note(loaded.sources, loaded.options.wait)
    assert note.startswith(
        "la-trainer: note: command-line option --wait sets wait to 30 s, which does not apply"
    )
    assert "without a bound" in note and "--once" in note
    assert _wait_note(load_options_traced(None, environ={}).sources, 600.0) == ""  # nobody set it: no note


# -- item 7: --out inside the export, an empty --out, run names from the output folder ---------------------


@pytest.mark.parametrize("inside", ["export", "materials"])
def test_offline_refuses_an_out_inside_the_export(tmp_path: Path, inside: str) -> None:
    export = _export(tmp_path)
    out = (export if inside == "export" else export.parent) / "res"
    result = CliRunner().invoke(main, ["offline", str(export.parent), "--out", str(out), "--iterations", "2"])
    assert result.exit_code == ExitCode.USAGE, result.output
    assert f"the output folder {str(out)!r} (--out) is inside" in result.output
    assert "never written to" in result.output and not out.exists()


@pytest.mark.parametrize(
    "args",
    [
        ["demo", "--out", ""],
        ["offline", ".", "--out", ""],
        ["socket", "--temp-dir", " "],
        ["shm", "", "--create"],
        ["report", ".", "--out", ""],
        ["bench", "--json", ""],
    ],
)
def test_an_empty_path_is_refused_not_taken_for_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, args)
    assert result.exit_code == ExitCode.USAGE, result.output
    assert "is empty: name a folder or file" in result.output
    assert list(tmp_path.iterdir()) == []  # nothing written where the user did not point


def test_offline_run_names_keep_the_output_folders_name(tmp_path: Path) -> None:
    from trainer.records.runrecord import find_run_folders

    export = _export(tmp_path)
    names = []
    for out in (tmp_path / "runs" / "res1", tmp_path / "runs" / "res2", None, None):
        args = ["offline", str(export), "--iterations", "2", "--threads", "1"]
        result = CliRunner().invoke(main, [*args, *(["--out", str(out)] if out else [])])
        assert result.exit_code == 0, result.output
        folder = out or max(tmp_path.glob("Offline*"), key=lambda p: p.stat().st_mtime)
        (record,) = find_run_folders(folder)
        names.append(record.name)
    stamp = names[0].split("_Files_")[1]
    assert names == [
        f"{prefix}_FlowMatching_Files_{stamp}" for prefix in ("res1", "res2", "Offline0", "Offline1")
    ]


# -- item 5: held-out numbers in the status file and watch, named in words; one measurement in the report --


def test_a_heldout_measurement_reaches_the_status_file_and_watch(tmp_path: Path) -> None:
    import io
    import time

    from trainer.commands.watch import Health, Verdict, render
    from trainer.records.progress import ProgressReporter, read_status

    status_path = tmp_path / "la-trainer-status.msgpack"
    stream = io.StringIO()
    with ProgressReporter(5000, stream=stream, tty=False, status_path=status_path) as reporter:
        reporter.heldout(
            3000,
            0.142,
            0.4786,
            1.5012,
            0.48,
            note="held-out selection 0.142 loss 0.4786 energy score 1.501 coverage 0.48",
        )
        reporter.update(3000, 0.5, force=True)
        status = read_status(status_path)
    assert (status.heldout_iteration, status.heldout_loss, status.heldout_coverage) == (3000, 0.4786, 0.48)
    assert (
        stream.getvalue()
        .rstrip()
        .endswith("| held-out selection 0.142 loss 0.4786 energy score 1.501 coverage 0.48")
    )
    line = render(status, "Training0", Health(Verdict.RUNNING, 0), now=time.time())
    assert "held-out at 3000: selection 0.142 loss 0.4786 energy score 1.501 coverage 0.48" in line


def test_the_progress_note_spells_out_its_numbers() -> None:
    from trainer.training.heldout import HeldOutMetrics, Selection

    selection = Selection(score=0.142, f1=0.7, energy=0.558, coverage=0.8, precision=0.6)
    metrics = HeldOutMetrics(1000, selection, 0.4786, 1.5012, 0.2, 0.3, (0.1,), 0.48, 0.9, 0.05)
    assert metrics.short() == "held-out selection 0.142 loss 0.4786 energy score 1.501 coverage 0.48"
    assert " ES " not in metrics.short() and " cov " not in metrics.short()


def test_the_log_explains_the_heldout_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    from trainer.settings.options import TrainerOptions

    _bench_job(TrainerOptions(heldout_min_episodes=2, heldout_share=0.5))
    line = next(x for x in capsys.readouterr().out.splitlines() if "held out" in x)
    assert "energy score of the sampled actions" in line and "(lower is better)" in line
    assert "coverage, the share of held-out rows" in line and "(higher is better)" in line


def test_one_heldout_measurement_is_written_out_not_drawn_under_the_legend() -> None:
    pytest.importorskip("matplotlib")
    plt = report._import_pyplot()
    fig, ax = plt.subplots()
    try:
        series = {"energy_score": [(1000, 1.5)], "coverage": [(1000, 0.48)], "precision": [(1000, 0.9)]}
        report.draw_heldout_panel(ax, series, total=1000)
        texts = " ".join(t.get_text() for t in ax.texts)
        assert "one measurement, at iteration 1000" in texts and "energy score 1.500" in texts
        assert "coverage 0.480" in texts and ax.get_legend() is None and not ax.lines
    finally:
        plt.close(fig)


# -- item 6: distill_fraction is a share of the time (estimated), and says so --------------------------------


def _bench_job(options: object, rows: int = 2000) -> object:
    import torch

    from emulator.bench.config import TRAIN_CONFIGS
    from emulator.bench.workload import session_for, synthetic_replay
    from protocol.snapshot import read_snapshot
    from trainer.training.job import TrainingJob

    replay = synthetic_replay(rows)
    config, snapshots = session_for(replay, TRAIN_CONFIGS[0])
    received = {i: read_snapshot(blob) for i, blob in enumerate(snapshots)}
    return TrainingJob.create(config, received, replay, options=options, device=torch.device("cpu"))  # type: ignore[arg-type]


def test_distill_fraction_sizes_the_distillation_by_time_as_documented(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from trainer.settings.options import TrainerOptions
    from trainer.training.steps.distill import DistillSettings

    options = TrainerOptions(ode_steps=2, distill_fraction=0.25, iteration_num=12000, heldout_share=0)
    job = _bench_job(options)
    distilled = 12000 - job.distill_start  # type: ignore[attr-defined]
    assert distilled == 1148  # docs/distillation.md's example: about 10 % of the iterations, not 25 %
    cost = DistillSettings(2).cost
    assert distilled * cost / ((12000 - distilled) + distilled * cost) == pytest.approx(0.25, abs=1e-3)
    line = next(x for x in capsys.readouterr().out.splitlines() if "distilling for 2" in x)
    assert "1148 of 12000 iterations: distill_fraction 0.25 of the run's time, as estimated" in line
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    row = next(x for x in readme.splitlines() if x.startswith("| `distill_fraction`"))
    assert "share of the run's *time*" in row and "share of the iterations" not in row


# -- item 8: record's Device from the machine; the network's size and a slow first iteration said ---------


@pytest.mark.parametrize(("cuda", "device"), [(False, "CPU"), (True, "GPU")])
def test_record_writes_the_device_this_machine_has(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cuda: bool, device: str
) -> None:
    import torch

    from tests.support.recordings import make_record, record_files
    from trainer.commands import record as record_cli

    record_file, schema_file = record_files(tmp_path, [make_record(40, seed=1), make_record(25, seed=2)])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(record_cli, "run_with_link", lambda *a, **k: 0)  # the export is what is checked
    out = tmp_path / "run"
    result = CliRunner().invoke(
        main, ["record", str(record_file), "--schema", str(schema_file), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    (export,) = (out / "TrainingMaterials").iterdir()
    assert json.loads((export / "trainer-config.json").read_text())["Device"] == device


def test_record_on_a_cpu_machine_trains_without_a_gpu_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from tests.support.recordings import make_record, record_files

    record_file, schema_file = record_files(tmp_path, [make_record(40, seed=1), make_record(25, seed=2)])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args = ["--out", str(tmp_path / "run"), "--iterations", "3", "--hidden-size", "8", "--threads", "1"]
    result = CliRunner().invoke(main, ["record", str(record_file), "--schema", str(schema_file), *args])
    assert result.exit_code == 0, result.output
    assert "CUDA is not available" not in result.output
    size = next(x for x in result.output.splitlines() if "la-trainer: training 3 iterations" in x)
    assert "denoiser 1 hidden layer(s) of 8," in size and " parameters, batch 256" in size


def test_a_slow_rate_is_not_shown_as_zero() -> None:
    from trainer.records.progress import format_rate

    assert [format_rate(r) for r in (1850.2, 42.6, 4.24, 0.1834, 0.0)] == ["1,850", "43", "4.2", "0.183", "0"]


def test_a_first_iteration_that_runs_long_says_so(tmp_path: Path) -> None:
    import io
    import time

    from trainer.records.progress import ProgressReporter, RunPhase

    stream = io.StringIO()
    status = tmp_path / "status.msgpack"
    with ProgressReporter(
        20000, stream=stream, tty=False, status_path=status, heartbeat_s=0.05, slow_iteration_s=0.2
    ) as reporter:
        reporter.start(20000)
        reporter.phase(RunPhase.TRAINING)
        deadline = time.monotonic() + 10.0
        while "first iteration is still running" not in stream.getvalue():
            assert time.monotonic() < deadline, stream.getvalue()
            time.sleep(0.05)
        time.sleep(0.3)
        reporter.update(1, 0.5, force=True)
    text = stream.getvalue()
    assert text.count("first iteration is still running") == 1  # once, and only before it ends
    assert "its size is in the line above" in text and "iteration 1/20000" in text


# -- item 10: a folder the Docker image's user cannot write: the uid and the --user fix --------------------


@pytest.mark.skipif(not hasattr(__import__("os"), "getuid"), reason="uids")
@pytest.mark.parametrize("container", [True, False])
def test_an_unwritable_output_folder_names_the_uids_and_in_docker_the_user_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, container: bool
) -> None:
    import os

    import trainer.system.container
    from trainer.errors import LaunchError
    from trainer.records import runrecord

    monkeypatch.setattr(trainer.system.container, "in_container", lambda: container)
    monkeypatch.setattr(runrecord, "_writable", lambda folder: "this user may not write there")
    with pytest.raises(LaunchError) as refused:
        runrecord.check_output_folder(tmp_path / "runs", "--temp-dir")
    text = str(refused.value)
    owner = (tmp_path / "runs").stat().st_uid
    assert (
        f"(this process runs as uid {os.getuid()}; {str(tmp_path / 'runs')!r} belongs to uid {owner})" in text
    )
    docker = 'docker run --user "$(id -u):$(id -g)"'
    assert (docker in text and "uid 10001" in text) is container
    assert "--temp-dir" in text


# -- item 13: the benchmarks README names files that exist; bench --sections runs what it names -----------


def test_the_benchmarks_readme_names_paths_that_exist() -> None:
    import re

    root = Path(__file__).resolve().parents[2]
    text = (root / "benchmarks" / "README.md").read_text(encoding="utf-8")
    named = set(
        re.findall(r"`((?:emulator|trainer|protocol|benchmarks|scripts|docs)/[A-Za-z0-9_./-]*)`", text)
    )
    assert "emulator/inference.py" in named  # the pattern finds them
    assert sorted(p for p in named if not (root / p).exists()) == []


@pytest.mark.parametrize(("sections", "ingested"), [(("sync",), False), (("ingest", "sync"), True)])
def test_bench_runs_the_large_ingest_only_when_asked(
    monkeypatch: pytest.MonkeyPatch, sections: tuple[str, ...], ingested: bool
) -> None:
    from emulator.bench import run as bench_run
    from emulator.bench.config import BenchSettings

    seen: list[float] = []

    def measure_ipc(settings: BenchSettings, work: Path) -> tuple[dict[str, dict[str, object]], float]:
        seen.append(settings.ingest_mb)
        return {"shm": {"ingest_s": 1.0, "sync_round_ms": 2.0}}, 1.0

    monkeypatch.setattr(bench_run, "measure_ipc", measure_ipc)
    monkeypatch.setattr(bench_run, "summarise", lambda results: {})  # the fake results hold no numbers
    progress: list[str] = []
    results = bench_run.run_bench(
        BenchSettings(sections=sections, ingest_mb=1024.0), progress=progress.append
    )
    assert seen == [1024.0 if ingested else bench_run.SYNC_ONLY_INGEST_MB]
    assert ("ingest" in results) is ingested and results["sync"] == {"shm": {"sync_round_ms": 2.0}}
    assert any(line.startswith("ingest 1024 MB" if ingested else "sync over") for line in progress)


def test_bench_jobs_hold_nothing_out_and_print_nothing_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    from emulator.bench.config import TRAIN_CONFIGS
    from emulator.bench.training import _our_step
    from emulator.bench.workload import make_job

    job = make_job(TRAIN_CONFIGS[0], 2000, torch.device("cpu"))
    step = _our_step(job)
    step(0)
    step(1)
    captured = capsys.readouterr()
    assert job.heldout is None and "held out" not in captured.out + captured.err
    assert captured.out == ""  # stdout keeps only the bench's tables
