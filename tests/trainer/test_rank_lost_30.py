"""A lost scale-out rank is recorded as a lost rank, not as a divergence (issue 30 item 4).

Facts: when another training process of a scale-out job fails mid-run (the collective raises
:class:`trainer.distributed.errors.RankLost`), the run still ends as a divergence does (the last good
networks and Complete go to the game), but the exit code is PEER_GONE (5), the status file and run.json say
"rank lost", and no line of it tells the user to look at the learning rate or calls the run diverged.

The run is a whole training story over the in-memory link (as tests/integration/test_run_status.py does);
the rank's failure is raised from the job's step (``advance``) at iteration 25, where a real collective
raises it.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from emulator.session import EngineTask, SessionSettings, build_session_config
from trainer.commands.watch import watch
from trainer.distributed.errors import RankLost
from trainer.exitcodes import ExitCode
from trainer.records.progress import STATUS_FILE_NAME, RunPhase, read_status
from trainer.records.runrecord import find_run_folders
from trainer.session.app import InterruptFlag, run_with_link
from trainer.session.links import MemoryLink
from trainer.session.run import run_training
from trainer.settings.options import TrainerOptions
from trainer.training.job import TrainingJob

OPTIONS = TrainerOptions(
    sync_every_iterations=10, sync_every_seconds=0.0, threads=1, checkpoint_every_seconds=0.0, ema_decay=0.9
)
LOST = "scale-out: rank 1 of 2 failed (exit code -9): see its log; training stopped at iteration 25"


def _lose_a_rank_at_25(job: TrainingJob) -> TrainingJob:
    advance = job.advance  # the story's step (a scale-out rank's is its step and collectives)

    def failing(iteration: int) -> None:
        if iteration == 25:
            raise RankLost(LOST)
        advance(iteration)

    job.advance = failing  # type: ignore[method-assign]
    return job


def test_a_lost_rank_is_recorded_as_such_and_the_game_still_gets_complete(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    task = EngineTask.benchmark("bimodal", size=64, seed=0)
    config, blobs = build_session_config(task, SessionSettings(iteration_num=200, batch_size=32), None)
    game = MemoryLink(config, list(blobs), task.replay_buffer)
    folder = tmp_path / "Training0"

    def training(link: MemoryLink, flag: InterruptFlag) -> int:
        return int(
            run_training(
                link, options=OPTIONS, task_dir=folder, interrupt=flag, prepare_job=_lose_a_rank_at_25
            )
        )

    code = run_with_link(lambda flag: game, options=OPTIONS, task_dir=folder, training=training)  # type: ignore[arg-type]
    output = capsys.readouterr()
    log = output.out + output.err
    assert code == ExitCode.PEER_GONE, log
    assert game.completed and game.rounds, "the game got no networks or no Complete"
    assert "a scale-out training process was lost (exit code 5) after 25 iterations" in log
    assert "diverged" not in log.lower()
    status = read_status(folder / STATUS_FILE_NAME)
    assert (status.phase, status.exit_code, status.iteration) == (RunPhase.RANK_LOST, 5, 25)
    (record,) = find_run_folders(folder)
    run = json.loads((record / "run.json").read_text(encoding="utf-8"))
    assert (run["phase"], run["exit_code"], run["iteration"]) == ("rank lost", 5, 25)
    out = io.StringIO()
    assert watch(folder, once=True, stream=out, tty=False) == 5
    assert "rank lost with exit code 5" in out.getvalue()


def test_the_readme_sends_a_lost_rank_to_the_scale_out_page_not_to_the_learning_rate() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    row = next(line for line in readme.splitlines() if line.startswith("| exit code 5 (rank lost)"))
    assert "scale-out.md" in row and "LearningRate" not in row
