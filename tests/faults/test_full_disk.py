"""A full disk during a run (issue 30 item 1).

Facts: a write the disk cannot take (ENOSPC, EDQUOT, EIO) at an optional file (snapshots, checkpoints, the
run record, the status file, a tracker) is one warning per outage naming the folder and the free space;
the last good files stay whole (a snapshot set is written whole or not at all); the next write of that
kind tries again and says when it works again; training goes on and the game gets its networks and
Complete (exit 0). Where the disk stays full to the end, run.json and the status file still record the
end (written in place). An offline run whose final networks cannot be written ends with exit code 14
(NO_SPACE) and one paragraph (the folder, the free space, the fix), its output folder keeping a whole
earlier set.

Two ways in: a seam that fails each write site in turn (in this process, any user: a temporary file
opened on /dev/full fails as a full disk does, at the write; EDQUOT and EIO are raised where the file is
created), and whole sessions on a small tmpfs (root only: mounting needs it, as CI runs the suite;
elsewhere skipped with the reason).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from emulator.game import FileExport
from emulator.session import EngineTask, SessionSettings, build_session_config
from tests.support.faults import SETTINGS, LiveGame, assert_no_traceback
from trainer.exitcodes import ExitCode
from trainer.records import runrecord
from trainer.records.progress import STATUS_FILE_NAME, RunPhase, read_status
from trainer.records.runrecord import RUN_FILE, RunRecord, find_run_folders, read_metrics
from trainer.records.trackers import Trackers
from trainer.session import links as session_links
from trainer.session.app import run_with_link
from trainer.session.links import FileTrainerLink, MemoryLink
from trainer.settings.options import TrainerOptions
from trainer.system import atomic
from trainer.training.checkpoint import CHECKPOINT_NAME, load_checkpoint, load_latest

ITERATIONS = 300
OPTIONS = TrainerOptions(
    sync_every_iterations=50,
    sync_every_seconds=0.0,
    threads=1,
    checkpoint_every_seconds=0.02,
    ema_decay=0.9,
    progress_every_seconds=0.05,
)


@dataclass
class Disk:
    """The seam: while ``full``, every atomic write whose target ``matches`` fails with ``code``.

    Snapshot files and metrics lines are written a little after their iteration, behind the training loop
    (the snapshot thread, the metrics points read in batches: issue 32), so for them the outage is the
    iterations it lasted, ``outage`` (first, last]: a write belongs to the iteration in its name or its
    line, whenever a thread gets to it. Every other write is full while ``full`` is."""

    matches: Callable[[Path], bool]
    code: int
    full: bool = False
    failures: int = 0
    outage: tuple[int, int | None] | None = None

    def full_at(self, iteration: int) -> bool:
        if self.outage is None:
            return self.full
        first, last = self.outage
        return first < iteration and (last is None or iteration <= last)

    def full_for(self, target: Path) -> bool:
        if not self.matches(target):
            return False
        behind = re.fullmatch(r".+_(\d+)\.bin", target.name) if target.parent.name == "Snapshots" else None
        return self.full_at(int(behind.group(1))) if behind else self.full


def _fail_writes(monkeypatch: pytest.MonkeyPatch, disk: Disk) -> None:
    original = atomic._create_temp

    def create(target: Path) -> tuple[Path, int]:
        if not disk.full_for(target):
            return original(target)
        disk.failures += 1
        if disk.code == errno.ENOSPC:
            # A real temporary file whose writes go to /dev/full: ENOSPC at the write or the flush, as on a
            # full disk (and inside torch.save for a checkpoint, which re-raises it as a RuntimeError).
            tmp, fd = original(target)
            os.close(fd)
            return tmp, os.open("/dev/full", os.O_WRONLY)
        raise OSError(disk.code, os.strerror(disk.code), str(target))

    monkeypatch.setattr(atomic, "_create_temp", create)


def _fail_metrics(monkeypatch: pytest.MonkeyPatch, disk: Disk) -> None:
    """metrics.jsonl is appended to, not replaced: while full its lines go to /dev/full."""
    original = RunRecord.metrics

    def metrics(self: RunRecord, point: Any) -> None:
        if disk.full_at(point.iteration):
            disk.failures += 1
            handle = self._metrics
            if handle is None or handle.name != "/dev/full":
                if handle is not None:
                    handle.close()
                self._metrics = open("/dev/full", "a", encoding="utf-8")
        original(self, point)

    monkeypatch.setattr(RunRecord, "metrics", metrics)


SITES: dict[str, tuple[str, Callable[[Path], bool]]] = {
    "snapshots": ("snapshots", lambda p: p.parent.name == "Snapshots" and p.suffix == ".bin"),
    "checkpoints": ("checkpoints", lambda p: p.name.startswith("la-trainer-checkpoint")),
    "run record": ("the run record", lambda p: runrecord.RUNS_DIR in p.parts),
    "status": ("the status file", lambda p: p.name == STATUS_FILE_NAME),
}
"""Each optional write site: the words of its warning and the files it writes."""


def _session(tmp_path: Path, disk: Disk, until: int | None) -> tuple[int, MemoryLink, Path]:
    """A whole in-memory session; the disk is full from the step after iteration 100 to the step after
    ``until`` (None: to the end): the game's Stop poll comes before each step."""
    task = EngineTask.benchmark("bimodal", size=64, seed=0)
    settings = SessionSettings(iteration_num=ITERATIONS, batch_size=32, iterations_per_snapshot=50)
    config, blobs = build_session_config(task, settings, None)
    folder = tmp_path / "Training0"

    def weather(polls: int) -> bool:
        disk.full = polls >= 100 and (until is None or polls < until)
        if disk.full:  # the outage outlasts two progress intervals, so the status file is written during it
            time.sleep(0.001)
        return False

    disk.outage = (100, until)  # the steps after iteration 100 up to iteration ``until``

    game = MemoryLink(config, list(blobs), task.replay_buffer, stop_when=weather)
    code = run_with_link(lambda flag: game, options=OPTIONS, task_dir=folder)
    return code, game, folder


def _run_json(folder: Path) -> dict[str, Any]:
    (record,) = find_run_folders(folder)
    return dict(json.loads((record / RUN_FILE).read_text(encoding="utf-8")))


@pytest.mark.parametrize("site", sorted(SITES))
@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EIO], ids=["ENOSPC", "EDQUOT", "EIO"])
def test_an_optional_write_on_a_full_disk_warns_once_keeps_the_last_files_and_retries(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    site: str,
    code: int,
) -> None:
    words, matches = SITES[site]
    disk = Disk(matches, code)
    _fail_writes(monkeypatch, disk)
    if site == "run record":
        _fail_metrics(monkeypatch, disk)
    result, game, folder = _session(tmp_path, disk, until=200)
    captured = capfd.readouterr()
    output = captured.out + captured.err
    assert result == ExitCode.OK, output
    assert game.completed and game.complete_rounds >= ITERATIONS // 50, "the game lost networks or Complete"
    assert disk.failures > 0, "the seam never fired"
    assert_no_traceback(output)
    if site != "status":  # the status file's own warning is the one it always had
        assert output.count(f"cannot write {words} in ") == 1, output
        assert f"{words}: written again" in output
        assert "free there" in output
    snapshots = folder / "Snapshots"
    assert load_checkpoint(snapshots / CHECKPOINT_NAME).iteration == ITERATIONS
    assert (snapshots / "Denoiser_50.bin").is_file() and (snapshots / f"Denoiser_{ITERATIONS}.bin").is_file()
    if site == "snapshots":  # the sets of the outage (150, 200): none of their files, not part of one
        outage = [p.name for p in snapshots.glob("*.bin") if p.stem.endswith(("_150", "_200"))]
        assert not outage, outage
        assert (snapshots / "Encoder_100.bin").is_file() and (snapshots / "Encoder_250.bin").is_file()
    assert not list(folder.rglob(".*.tmp")), "a temporary file was left behind"
    assert _run_json(folder)["phase"] == "complete"
    assert read_status(folder / STATUS_FILE_NAME).phase is RunPhase.COMPLETE
    if site == "run record":
        iterations = [p["iteration"] for p in read_metrics(find_run_folders(folder)[0]) if "loss" in p]
        assert 100 in iterations and 300 in iterations and 200 not in iterations, iterations


@pytest.mark.parametrize("site", sorted(SITES))
def test_a_disk_full_to_the_end_still_completes_and_records_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], site: str
) -> None:
    _, matches = SITES[site]
    disk = Disk(matches, errno.ENOSPC)
    _fail_writes(monkeypatch, disk)
    if site == "run record":
        _fail_metrics(monkeypatch, disk)
    result, game, folder = _session(tmp_path, disk, until=None)
    captured = capfd.readouterr()
    output = captured.out + captured.err
    assert result == ExitCode.OK, output
    assert game.completed and game.rounds, "the game lost networks or Complete"
    assert_no_traceback(output)
    # run.json and the status file record the end even when their own writes fail (in place).
    record = _run_json(folder)
    assert (record["phase"], record["exit_code"], record["iteration"]) == ("complete", 0, ITERATIONS)
    status = read_status(folder / STATUS_FILE_NAME)
    assert (status.phase, status.exit_code) == (RunPhase.COMPLETE, 0)
    state, _ = load_latest(folder / "Snapshots")
    assert state is not None
    if site == "checkpoints":  # the last good checkpoint stays, from before the disk filled
        assert state.iteration <= 100
    if site == "snapshots":
        names = sorted(p.name for p in (folder / "Snapshots").glob("Denoiser_*.bin"))
        assert names == ["Denoiser_100.bin", "Denoiser_50.bin"], names


def test_a_tracker_on_a_full_disk_is_kept_and_tried_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from types import SimpleNamespace

    from protocol.config import FlowMatchingTrainingSettings, TrainerConfig

    full = [True]
    logged: list[int] = []

    class Writer:
        def __init__(self, log_dir: str) -> None:
            pass

        def add_scalar(self, key: str, value: float, step: int) -> None:
            if full[0]:
                raise OSError(errno.ENOSPC, "No space left on device")
            logged.append(step)

        def add_text(self, *args: object) -> None:
            pass

        def close(self) -> None:
            pass

    config = TrainerConfig(use_tensorboard=True, training=FlowMatchingTrainingSettings())
    modules = {"torch.utils.tensorboard": SimpleNamespace(SummaryWriter=Writer)}
    trackers = Trackers.for_run(
        config, TrainerOptions(), "run", tmp_path, import_module=lambda name: modules.get(name)
    )
    for step in (100, 200):
        trackers.scalars(step, {"loss/flow_matching": 1.0})
    full[0] = False
    trackers.scalars(300, {"loss/flow_matching": 1.0})
    out = capsys.readouterr()
    assert trackers.names == ["TensorBoard"] and logged == [300]
    assert (out.out + out.err).count("cannot write TensorBoard's logs in") == 1
    assert "TensorBoard's logs: written again" in out.out + out.err


# -- offline: the final networks are the run's product ---------------------------------------------------


def _export(tmp_path: Path, iterations: int, hidden: int = 16) -> Path:
    task = EngineTask.benchmark("bimodal", size=64, seed=0)
    settings = SessionSettings(iteration_num=iterations, batch_size=32, hidden_layer_size=hidden)
    config, blobs = build_session_config(task, settings, None)
    return FileExport(tmp_path / "project").write(config, dict(enumerate(blobs)), task.replay_buffer)


@pytest.mark.parametrize("recovers", [False, True], ids=["full-to-the-end", "full-then-freed"])
def test_offline_final_networks_on_a_full_disk_end_with_exit_14_and_the_last_whole_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], recovers: bool
) -> None:
    export = _export(tmp_path, ITERATIONS)
    out = tmp_path / "Offline0"
    disk = Disk(lambda p: p.parent.name == "Networks" and p.parent.parent == out, errno.ENOSPC)
    _fail_writes(monkeypatch, disk)
    written: list[dict[int, bytes]] = []
    original = session_links.files.write_network_files

    def write_network_files(folder: Any, networks: Any) -> None:
        # Two rounds written, then full: to the end, or for two rounds only.
        disk.full = len(written) >= 2 and (not recovers or disk.failures < 2)
        original(folder, networks)
        written.append(dict(networks))

    monkeypatch.setattr(session_links.files, "write_network_files", write_network_files)
    link = FileTrainerLink(export, output_dir=out)
    code = run_with_link(lambda flag: link, options=OPTIONS, task_dir=out)
    captured = capfd.readouterr()
    output = captured.out + captured.err
    assert_no_traceback(output)
    assert disk.failures > 0
    kept = {nid: (out / "Networks" / f"network_{nid}.bin").read_bytes() for nid in (0, 1, 2)}
    assert kept == written[-1], "the output folder does not hold one whole set of networks"
    if recovers:
        assert code == ExitCode.OK, output
        assert "the trained networks: written again" in output
        return
    assert code == ExitCode.NO_SPACE, output
    paragraph = next(line for line in output.splitlines() if "could not be written to" in line)
    assert f"the trained networks could not be written to {out / 'Networks'}" in paragraph
    assert "the disk is full (No space left on device;" in paragraph and "free there" in paragraph
    assert "holds the networks of an earlier round of this run" in paragraph
    assert "Free space on that disk" in paragraph and "--out" in paragraph
    record = _run_json(out)
    assert (record["phase"], record["exit_code"]) == ("failed", 14)
    status = read_status(out / STATUS_FILE_NAME)
    assert (status.phase, status.exit_code) == (RunPhase.FAILED, 14)


def test_record_export_on_a_full_disk_ends_with_exit_14_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from tests.support.recordings import make_record, record_files
    from trainer.commands.cli import main

    record_file, schema_file = record_files(tmp_path, [make_record(20)])
    out = tmp_path / "out"
    disk = Disk(lambda p: "TrainingMaterials" in p.parts, errno.ENOSPC, full=True)
    _fail_writes(monkeypatch, disk)
    result = CliRunner().invoke(
        main,
        ["record", str(record_file), "--schema", str(schema_file), "--out", str(out), "--iterations", "2"],
    )
    assert result.exit_code == ExitCode.NO_SPACE, result.output
    assert "the export of the records could not be written to" in result.output
    assert "the disk is full" in result.output and "Nothing was trained." in result.output
    assert not list(out.rglob("Offline*")), "it trained on a partial export"


# -- whole sessions on a small tmpfs ----------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs at ``tmp_path/disk``: root only (mounting needs it; CI runs the suite as root)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (CI runs this suite as root)")
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (a container without CAP_SYS_ADMIN?): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        if subprocess.run(["umount", str(mount)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def fill(folder: Path, leave: int = 0) -> None:
    """Fill the disk holding ``folder`` until ``leave`` bytes are free (0: completely; a tmpfs counts whole
    pages, so ``leave`` is met to the page)."""
    with open(folder / "filler", "wb") as handle:
        try:
            while (room := shutil.disk_usage(folder).free - leave) > 0:
                handle.write(b"\0" * min(room, 1 << 16))
                handle.flush()
        except OSError as error:
            assert error.errno == errno.ENOSPC and leave == 0, error


@pytest.mark.slow
@pytest.mark.integration
def test_a_socket_session_on_a_disk_that_fills_gets_networks_and_complete(small_disk: Path) -> None:
    settings = replace(SETTINGS, iteration_num=600)
    with LiveGame("socket", small_disk, settings=settings) as session:
        session.begin()
        session.wait_files("*.bin")
        fill(small_disk)
        session.play_until_end()
        code = session.wait_exit()
        output = session.proc.output()
        assert code == ExitCode.OK, output
        assert session.completed and session.rounds
        assert_no_traceback(output)
        assert "cannot write snapshots in" in output and "the disk is full" in output
        record = _run_json(session.task_dir)
        assert (record["phase"], record["exit_code"], record["iteration"]) == ("complete", 0, 600)
        status = read_status(session.task_dir / STATUS_FILE_NAME)
        assert (status.phase, status.exit_code) == (RunPhase.COMPLETE, 0)


@pytest.mark.slow
@pytest.mark.integration
def test_an_offline_run_onto_a_full_disk_ends_with_exit_14_and_its_reason(
    small_disk: Path, tmp_path: Path
) -> None:
    export = _export(tmp_path, 400, hidden=128)  # a denoiser of about 70 KiB
    out = small_disk / "out"
    out.mkdir()
    fill(small_disk, leave=48 * 1024)  # room for the run record and the status, not for a network
    done = subprocess.run(
        [sys.executable, "-m", "trainer", "offline", str(export), "--out", str(out), "--threads", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    output = done.stdout + done.stderr
    assert done.returncode == ExitCode.NO_SPACE, output
    assert_no_traceback(output)
    assert f"the trained networks could not be written to {out / 'Networks'}: the disk is full" in output
    assert "No trained network was written." in output and "Free space on that disk" in output
    assert not list((out / "Networks").glob("network_*.bin")) if (out / "Networks").exists() else True
    record = _run_json(out)
    assert (record["phase"], record["exit_code"]) == ("failed", 14)
    status = read_status(out / STATUS_FILE_NAME)
    assert (status.phase, status.exit_code) == (RunPhase.FAILED, 14)
    watch = subprocess.run(
        [sys.executable, "-m", "trainer", "watch", str(out), "--once"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert watch.returncode == 14, watch.stdout + watch.stderr
