"""The game is SIGKILLed at each phase of a session; the trainer must notice, say where, and exit cleanly.

Fact per case: the trainer exits by itself, with the documented exit code PEER_GONE within a liveness
check of the death: spawned, because its parent changed or the socket closed; attach, because the game's
process no longer maps the trainer's control block (trainer.session.transport.mappers; those waits have no bound:
a paused game is alive); one readable paragraph naming the
phase, the engine's regions still in /dev/shm (the creator unlinks, spec §2.1: a trainer never does),
its own control block (attach mode) unlinked, and every snapshot or checkpoint it wrote intact.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.faults import (
    DETECT_S,
    KilledGame,
    assert_no_traceback,
    assert_snapshots_intact,
    load_factor,
    network_sizes,
    run_killed_game,
    small_task,
    unlink_regions,
)
from trainer.exitcodes import ExitCode
from trainer.records.progress import STATUS_FILE_NAME, read_status
from trainer.session.transport.shm import region_exists

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DETECT_SLACK_S = 1.5
"""Beyond 2x the timeout for the failure message: the peer check period (0.5 s) and scheduling."""
TEARDOWN_S = 15.0
"""Process exit after the message (interpreter and torch shutdown take seconds on a loaded 2-core box);
the decision is timed by the message, this only shows the process does go away."""
NO_SYNC = {"LA_TRAINER_SYNC_EVERY_ITERATIONS": "100000000"}
"""During training with no round due: only the between-steps peer check can notice the death."""

SEEN_S = 2 * DETECT_S
"""A game the trainer can see (spawned, a connected socket) is waited for without a bound; its death is
noticed by the next liveness check, whatever the trainer was waiting for (trainer.settings.timeouts)."""

# phase -> (how long the trainer may take to notice, words its message must contain)
SPAWNED = {
    "before-config": (SEEN_S, "config"),
    "between-networks": (SEEN_S, "network 1"),
    "during-experience": (SEEN_S, "replay buffer"),
    "during-training": (SEEN_S, "during training"),
    "during-sync": (SEEN_S, "sync round"),
}


def check_common(run: KilledGame, expected: ExitCode, timeout: float, words: str) -> None:
    assert run.game_returncode == -9, run.describe()
    assert run.code == int(expected), f"expected {expected.name}: {run.describe()}"
    said = run.said_after(words)
    assert said is not None, f"the message does not name the phase ({words!r}): {run.describe()}"
    factor = load_factor()
    bound = (2 * timeout + DETECT_SLACK_S) * factor
    assert said <= bound, f"noticed after {said:.2f} s (bound {bound:.1f} s): {run.describe()}"
    assert run.exit_after_death_s <= bound + TEARDOWN_S * factor, run.describe()
    assert_no_traceback(run.output)
    snapshots = run.task_dir / "Snapshots"
    found = assert_snapshots_intact(snapshots, network_sizes(small_task()))
    if run.info["reached"] in ("during-training", "during-sync"):
        assert found, "the snapshots written before the game died are gone"


def check_killed_engines_regions_unlinked(run: KilledGame) -> None:
    """Spawned mode: the killed engine never unlinks its regions (spec 2.1: the creator does), so the
    trainer it spawned unlinks those it maps once it sees its parent gone (issue 24 item 8): the control
    block always; the network and replay regions from the config on (before it, it never knew them)."""
    engine = run.info["engine_regions"]
    names = engine + ([run.info["controls_region"]] if "controls_region" in run.info else [])
    try:
        assert "controls_region" in run.info, run.describe()
        left = sorted(name for name in names if region_exists(name))
        expected = sorted(engine) if run.info["reached"] == "before-config" else []
        assert left == expected, f"regions of the killed engine left in /dev/shm: {left}"
    finally:
        unlink_regions(names)


def check_engine_regions_untouched(run: KilledGame) -> None:
    names = run.info["engine_regions"] + (
        [run.info["controls_region"]] if "controls_region" in run.info else []
    )
    try:
        gone = [name for name in names if not region_exists(name)]
        assert gone == [], f"the trainer unlinked engine regions: {gone}"
    finally:
        unlink_regions(names)


@pytest.mark.parametrize("phase", list(SPAWNED))
def test_spawned_shared_memory(phase: str, tmp_path: Path) -> None:
    env = NO_SYNC if phase == "during-training" else None
    run = run_killed_game(
        "shm", phase, tmp_path, bound_s=(2 * SPAWNED[phase][0] + TEARDOWN_S + 5) * load_factor(), env=env
    )
    try:
        check_common(run, ExitCode.PEER_GONE, *SPAWNED[phase])
    finally:
        check_killed_engines_regions_unlinked(run)


@pytest.mark.parametrize(
    ("phase", "timeout", "words"),
    [
        ("before-config", SEEN_S, "connect"),
        ("between-networks", SEEN_S, "network 1"),
        ("during-training", SEEN_S, "during training"),
    ],
)
def test_spawned_socket(phase: str, timeout: float, words: str, tmp_path: Path) -> None:
    env = NO_SYNC if phase == "during-training" else None
    run = run_killed_game(
        "socket", phase, tmp_path, bound_s=(2 * timeout + TEARDOWN_S + 5) * load_factor(), env=env
    )
    check_common(run, ExitCode.PEER_GONE, timeout, words)


def test_broken_output_pipe_still_exits_peer_gone(tmp_path: Path) -> None:
    """The engine holds the trainer's stdout pipe (spec §1.1); when it dies every print fails (EPIPE)."""
    run = run_killed_game(
        "shm",
        "during-training",
        tmp_path,
        bound_s=(2 * SEEN_S + TEARDOWN_S + 5) * load_factor(),
        hold_output=False,
        env=NO_SYNC,
    )
    try:
        assert run.code == int(ExitCode.PEER_GONE), run.describe()
        assert run.exit_after_death_s <= (2 * SEEN_S + DETECT_SLACK_S + TEARDOWN_S) * load_factor()
        assert_snapshots_intact(run.task_dir / "Snapshots", network_sizes(small_task()))
        # With no output left, the status file is what tells the user where and why it ended.
        status = read_status(run.task_dir / STATUS_FILE_NAME)
        assert status.phase == "failed", status
        assert "went away during training" in status.message and "(phase: training)" in status.message, status
    finally:
        check_killed_engines_regions_unlinked(run)


@pytest.mark.parametrize(
    ("phase", "words"),
    [
        ("between-networks", "network 1"),
        ("during-training", "during training"),
        ("during-sync", "sync round"),
    ],
)
def test_attach_mode(phase: str, words: str, tmp_path: Path) -> None:
    """The game maps the trainer's control block: its death is seen (Linux), not waited out. The
    trainer's bound is scaled down to SCALED.wait here, so the exit code tells which check ended it."""
    env = NO_SYNC if phase == "during-training" else None
    run = run_killed_game(
        "attach", phase, tmp_path, bound_s=(2 * SEEN_S + TEARDOWN_S + 5) * load_factor(), env=env
    )
    try:
        check_common(run, ExitCode.PEER_GONE, SEEN_S, words)
        assert "maps the control block" in run.output, run.describe()  # it said which check runs
        assert not region_exists(run.info["trainer_controls_name"]), "the trainer left its control block"
    finally:
        check_engine_regions_untouched(run)
