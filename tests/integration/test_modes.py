"""The real trainer process against the game-side emulator, in all four modes (spec §1.2-1.3, §2, §3, §5.5, §7.1).

Each session is what a game does: configs, networks 0, 1, 2, the replay buffer once, then a sync round
whenever ``HasNetworkOrCompleted`` says so, until Complete (or Stop, in the stop variants). The facts
checked are the engine's: the hand-offs happen in order, every returned snapshot keeps its size and
header, the trainer exits by itself with code 0 (over the socket only after the engine closed the
connection), and nothing is left in ``/dev/shm`` that the trainer created, while the engine's own
regions survive the trainer.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from emulator.session import EngineTask, Mode, SessionRecord, run_engine_session
from protocol.guid import GuidFormat
from tests.support.sessions import SETTINGS, STOP_SETTINGS, assert_same_layout, assert_trained

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SESSION_BUDGET_S = 60.0


def check_live_session(record: SessionRecord) -> None:
    """Facts every live session must show, whatever the transport and however it ended."""
    record.check()
    assert record.exit_code == 0, record.describe()
    assert record.network_send_order == [0, 1, 2]
    if record.mode in (Mode.SHM, Mode.ATTACH):
        # The trainer cleared ConfigSignal before asking for network 0, and ExperienceSignal before training.
        assert record.config_signal_after_first_request == 0
        assert record.experience_signal_at_first_round == 0
    assert len(record.rounds) >= 2, record.describe()
    assert_same_layout(record)
    assert record.leaked_shm == (), f"left in /dev/shm by the trainer: {record.leaked_shm}"
    if record.mode is Mode.ATTACH:
        assert record.trainer_controls_left is False, (
            "the trainer did not unlink the controls block it created"
        )
    assert record.elapsed_s < SESSION_BUDGET_S


@pytest.mark.parametrize("mode", [Mode.SHM, Mode.ATTACH, Mode.SOCKET])
def test_session_runs_to_complete(mode: Mode, bimodal_task: EngineTask, tmp_path: Path) -> None:
    # Spawned shared memory keeps the engine's regions until the trainer exited, to see that the trainer
    # did not unlink them (§2.1: Python never unlinks what the engine created); the others release them
    # at DoneTraining as the engine does, so the trainer must cope with them disappearing.
    settings = replace(SETTINGS, regions_until_exit=mode is Mode.SHM)
    record = run_engine_session(mode, bimodal_task, tmp_path, settings)
    check_live_session(record)
    assert record.completed and not record.stop_sent
    assert_trained(record)
    if mode is Mode.SHM:
        assert record.regions_present_at_exit, record.describe()
        gone = [name for name, present in record.regions_present_at_exit.items() if not present]
        assert gone == [], f"engine regions unlinked by the trainer: {gone}"
    if mode is Mode.SOCKET:
        assert record.exited_before_close is False
        versions = [rnd.networks[0].version or 0 for rnd in record.rounds]
        assert all(rnd.networks[0].version is not None for rnd in record.rounds)
        assert versions == sorted(versions), f"NetworksVersion went backwards: {versions}"
        assert all(n.version == rnd.networks[0].version for rnd in record.rounds for n in rnd.networks)


@pytest.mark.parametrize("mode", [Mode.SHM, Mode.ATTACH, Mode.SOCKET])
def test_session_stops_promptly_on_stop(mode: Mode, bimodal_task: EngineTask, tmp_path: Path) -> None:
    record = run_engine_session(mode, bimodal_task, tmp_path, STOP_SETTINGS)
    check_live_session(record)
    assert record.stop_sent and not record.completed
    assert len(record.rounds) == 2
    assert record.exit_after_end_s is not None and record.exit_after_end_s < 10.0, record.describe()


def test_nested_schema_silent_log_and_lower_case_guid_in_attach_mode(
    nested_task: EngineTask, tmp_path: Path
) -> None:
    """An And observation schema (encoder = Concat), the engine's empty log placeholder, and a ``-g`` the
    user typed in lower case: the trainer must name its block as the engine does (``/{UPPER}``, §2.1)."""
    settings = replace(SETTINGS, log=False, attach_guid_format=GuidFormat.DIGITS_WITH_HYPHENS_LOWER)
    record = run_engine_session(Mode.ATTACH, nested_task, tmp_path, settings)
    check_live_session(record)
    assert record.completed
    assert record.controls_guid is not None and record.controls_guid == record.controls_guid.lower()
    assert_trained(record)


def test_silent_log_socket_session_with_engine_default_module(
    nested_task: EngineTask, tmp_path: Path
) -> None:
    """``""`` in place of ``-l`` and ``-m learning_core.train_behavior_cloning`` (the engine's defaults,
    §1.2, §1.6): the trainer must dispatch on TrainerMethod and ignore the empty item."""
    record = run_engine_session(Mode.SOCKET, nested_task, tmp_path, replace(SETTINGS, log=False))
    assert "" in record.argv
    check_live_session(record)
    assert record.completed and record.exited_before_close is False


def test_final_networks_run_through_the_engine_inference_path(
    bimodal_task: EngineTask, tmp_path: Path
) -> None:
    """Also: a project path with non-ASCII characters, so the engine writes trainer-config.json as UTF-16
    with a BOM ([INF] its AutoDetect file encoding) and the argv carries non-ASCII paths."""
    record = run_engine_session(Mode.SHM, bimodal_task, tmp_path / "Projekt Überall", SETTINGS)
    check_live_session(record)
    assert record.task_dir is not None
    assert (record.task_dir / "Configs" / "trainer-config.json").read_bytes().startswith(b"\xff\xfe")
    policy = record.policy(ode_steps=4)
    actions = policy.act(np.zeros((8, 2), dtype=np.float32), np.random.default_rng(0))
    assert actions.shape == (8, 2) and np.isfinite(actions).all()


def test_offline_training_writes_networks_back(bimodal_task: EngineTask, tmp_path: Path) -> None:
    record = run_engine_session(Mode.FILE, bimodal_task, tmp_path, SETTINGS)
    record.check()
    assert record.exit_code == 0
    assert record.export_dir is not None
    assert not list(record.export_dir.rglob("*.tmp")), "temporary files left in the export"
    assert len(record.rounds) == 1
    assert_same_layout(record)
    assert_trained(record)
    assert record.leaked_shm == ()
    assert record.elapsed_s < SESSION_BUDGET_S
