"""``--resume`` through the whole trainer (run_with_link, in-process): continue, fall back, refuse.

Facts: a resumed run starts at the checkpoint's iteration and ends at the new IterationNum with Complete;
a corrupt newest checkpoint falls back to the previous one with a note; other networks or config are
refused with RESUME_REFUSED and one line per difference, and the refused checkpoint is left untouched.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from emulator.game import Completed
from tests.support.faults import TINY, in_process_options, play_rounds, send_all, shm_in_process
from trainer.exitcodes import ExitCode
from trainer.training.checkpoint import CHECKPOINT_NAME, PREVIOUS_CHECKPOINT_NAME, load_checkpoint

RESUME = in_process_options(resume=True)


def complete_session(game: Any, config: Any, blobs: Any) -> None:
    send_all(game, config, blobs)
    assert isinstance(play_rounds(game)[-1], Completed)


def first_run(tmp_path: Path, capfd: pytest.CaptureFixture[str], iterations: int = 30) -> Path:
    result = shm_in_process(
        tmp_path, complete_session, capfd, settings=replace(TINY, iteration_num=iterations)
    )
    assert result.code == int(ExitCode.OK), result.output
    return result.task_dir / "Snapshots"


def test_resume_continues_to_the_new_iteration_count(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    snapshots = first_run(tmp_path, capfd)
    result = shm_in_process(
        tmp_path, complete_session, capfd, settings=replace(TINY, iteration_num=50), options=RESUME
    )
    assert result.run.game_error is None, result.run.game_error
    assert result.code == int(ExitCode.OK), result.output
    assert "resumed from the checkpoint of iteration 30" in result.output
    assert load_checkpoint(snapshots / CHECKPOINT_NAME).iteration == 50
    assert load_checkpoint(snapshots / PREVIOUS_CHECKPOINT_NAME).iteration == 30


def test_a_corrupt_newest_checkpoint_falls_back_to_the_previous(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    snapshots = first_run(tmp_path, capfd, iterations=20)
    result = shm_in_process(
        tmp_path, complete_session, capfd, settings=replace(TINY, iteration_num=30), options=RESUME
    )
    assert result.code == int(ExitCode.OK), result.output
    current = snapshots / CHECKPOINT_NAME
    data = bytearray(current.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = bytes(64)  # a torn page in the middle of the newest
    current.write_bytes(bytes(data))
    result = shm_in_process(
        tmp_path, complete_session, capfd, settings=replace(TINY, iteration_num=40), options=RESUME
    )
    assert result.code == int(ExitCode.OK), result.output
    assert "resumed from the checkpoint of iteration 20" in result.output
    assert CHECKPOINT_NAME in result.output  # the note says which file was skipped and why


@pytest.mark.parametrize(
    ("change", "line"),
    [
        ({"hidden_layer_size": 16}, "FlowMatchingSettings.HiddenLayerSize: checkpoint 8, now 16"),
        ({"activation": "TanH"}, 'FlowMatchingSettings.ActivationFunction: checkpoint "ELU", now "TanH"'),
        (
            {"embed_normalizations_in_weights": True},
            "EmbedNormalizationsInWeights: checkpoint false, now true",
        ),
    ],
    ids=["hidden-size", "activation", "embed"],
)
def test_resume_refuses_other_networks_or_config_with_a_diff(
    change: dict[str, Any], line: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    snapshots = first_run(tmp_path, capfd, iterations=10)
    before = (snapshots / CHECKPOINT_NAME).read_bytes()

    def script(game: Any, config: Any, blobs: Any) -> None:
        send_all(game, config, blobs)

    result = shm_in_process(tmp_path, script, capfd, settings=replace(TINY, **change), options=RESUME)
    assert result.code == int(ExitCode.RESUME_REFUSED), result.output
    assert line in result.output
    assert "iteration 10" in result.output
    assert (snapshots / CHECKPOINT_NAME).read_bytes() == before, "a refused checkpoint was modified"


def test_la_trainer_offline_resume_flag(tmp_path: Path) -> None:
    """The CLI's ``--resume`` (ML-Agents style) on an engine export: the second run continues the first."""
    from click.testing import CliRunner

    from emulator.game import FileExport
    from emulator.session import build_session_config
    from tests.support.faults import small_task
    from trainer.commands.cli import main

    config, blobs = build_session_config(small_task(), TINY, str(tmp_path))
    folder = FileExport(tmp_path).write(config, dict(enumerate(blobs)), small_task().replay_buffer)
    runner = CliRunner()
    common = ["offline", str(folder), "--threads", "1"]
    first = runner.invoke(main, [*common, "--iterations", "20"])
    assert first.exit_code == 0, first.output
    second = runner.invoke(main, [*common, "--iterations", "35", "--resume"])
    assert second.exit_code == 0, second.output
    assert "resumed from the checkpoint of iteration 20" in second.output
    # Each offline run trains into a new Offline<N> beside the export (which is never written to); the
    # second one resumed from the first's folder and checkpoints in its own.
    assert load_checkpoint(tmp_path / "Offline1" / "Snapshots" / CHECKPOINT_NAME).iteration == 35
    assert not (folder / "Snapshots").exists()
    fresh = runner.invoke(main, [*common, "--iterations", "5", "--no-resume"])
    assert fresh.exit_code == 0 and "resumed" not in fresh.output
