"""A scripted engine session against a real trainer process, recorded for assertions (spec §7.1).

:func:`run_engine_session` plays what ``ULearningAgentsFlowMatchingTrainer`` does in a game:

1. (spawned modes) create the engine's resources, build the command line, spawn the drop-in ``trainer/dropin/train.py``;
   (attach mode) start the trainer as a user would (``-c -d``), wait for its controls block, map it;
   (file mode) export ``TrainingMaterials`` and run the offline trainer;
2. ``BeginTraining``: configs, networks 0, 1, 2 (denoiser, encoder, decoder), the replay buffer once;
3. every tick: ``HasNetworkOrCompleted`` → ``ReceiveNetwork(0..2)``; record each round;
4. Completed → ``DoneTraining`` (socket: close); or, with ``stop_after_rounds``, ``EndTraining`` (Stop,
   then DoneTraining) after that many rounds;
5. wait (bounded) for the trainer to exit by itself; check what it left in ``/dev/shm``.

Every failure (an :class:`~emulator.game.EngineFailure`, a harness timeout, a trainer that exits
too early) is caught and stored in :attr:`SessionRecord.failure`; :meth:`SessionRecord.check` turns it
into an assertion message with the trainer's log tail. The trainer process is always killed on the way
out if it is still running, so a session never leaves a process or hangs.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from emulator.drive import Ending, TrainingStalled, begin_training, tick_until_end
from emulator.game import EngineFailure, FileExport, ReceivedNetwork, ShmGame, SocketGame
from emulator.launch import (
    REPO_ROOT,
    EngineLayout,
    TrainerProcess,
    attach_command,
    make_task_dir,
    offline_command,
    shared_memory_command,
    socket_command,
)
from emulator.session.host import free_tcp_port, leaked_shm_entries, shm_entries
from emulator.session.results import Mode, RoundRecord, SessionRecord
from emulator.session.settings import EngineTask, SessionSettings, build_session_config
from protocol.config import SessionConfig
from protocol.controls import Control
from protocol.guid import format_guid, new_guid, os_shm_name, platform_guid_string
from protocol.snapshot import read_snapshot_header
from trainer.session.transport.shm import region_exists

__all__ = ["run_engine_session"]

_ATTACH_SETTLE_S = 0.25
"""Attach mode: after the trainer's controls block appears, the harness waits this long before mapping
it, as a user starts the game after the trainer printed its instructions (both sides initialise the
block; a game that attached within microseconds of its creation would race the trainer's own setup)."""


class _HarnessFailure(Exception):
    """The session broke a harness bound or an engine rule checked outside the drivers."""


def _trainer_env(settings: SessionSettings) -> dict[str, str]:
    env = dict(os.environ)
    env["LA_TRAINER_SYNC_EVERY_ITERATIONS"] = str(settings.sync_every_iterations)
    # Iterations only: a wall-clock cadence would make the round count depend on the machine's speed.
    env["LA_TRAINER_SYNC_EVERY_SECONDS"] = "0"
    env["LA_TRAINER_TIMEOUT_SCALE"] = repr(settings.timeout_scale)
    env.update(settings.env)
    return env


def _echo(settings: SessionSettings) -> Any:
    return (lambda line: print(line, flush=True)) if settings.echo else None


# ---------------------------------------------------------------------------------------------------------
# The session


class _Session:
    def __init__(self, mode: Mode, task: EngineTask, work_dir: Path, settings: SessionSettings) -> None:
        self.mode = mode
        self.task = task
        self.settings = settings
        self.layout = EngineLayout.create(work_dir / "engine")
        self.record = SessionRecord(mode=mode, settings=settings)
        self.t0 = time.monotonic()
        self.proc: TrainerProcess | None = None
        self.game: ShmGame | SocketGame | None = None
        self.ended_at: float | None = None
        self._watchdog: threading.Timer | None = None
        self._watchdog_fired = False

    def now(self) -> float:
        return time.monotonic() - self.t0

    # -- entry -------------------------------------------------------------------------------------------
    def run(self) -> SessionRecord:
        record = self.record
        shm_before = shm_entries()
        config, snapshots = build_session_config(self.task, self.settings, str(self.layout.intermediate_dir))
        record.config, record.sent = config, snapshots
        record.sent_headers = tuple(read_snapshot_header(s) for s in snapshots)
        try:
            if self.mode is Mode.FILE:
                self._run_file(config, snapshots)
            else:
                self._run_live(config, snapshots)
        except (EngineFailure, TrainingStalled, _HarnessFailure) as exc:
            record.failure = str(exc)
        except Exception as exc:  # a bug in the harness or a peer we did not foresee: still clean up
            record.failure = f"{type(exc).__name__}: {exc}"
        finally:
            self._finish(shm_before)
        if self._watchdog_fired:
            record.failure = (
                f"watchdog: the trainer was killed {self.settings.hard_timeout_s:g} s after its launch"
                + (f" ({record.failure})" if record.failure else "")
            )
        return record

    def _spawn(self, argv: list[str], cwd: Path) -> TrainerProcess:
        self.record.argv = argv
        proc = TrainerProcess(argv, cwd=cwd, env=_trainer_env(self.settings), echo=_echo(self.settings))
        self.proc = proc
        self._watchdog = threading.Timer(self.settings.hard_timeout_s, self._fire_watchdog)
        self._watchdog.daemon = True
        self._watchdog.start()
        return proc

    def _fire_watchdog(self) -> None:
        if self.proc is not None and self.proc.alive():
            self._watchdog_fired = True
            self.proc.kill(grace=2.0)

    # -- live transports -----------------------------------------------------------------------------
    def _run_live(self, config: SessionConfig, snapshots: tuple[bytes, ...]) -> None:
        s = self.settings
        record = self.record
        game: ShmGame | SocketGame
        if self.mode is Mode.SHM:
            task_dir = make_task_dir(self.layout.intermediate_dir, s.task_name)
            game = ShmGame.create(task_dir / "Configs", timeout=s.engine_timeout_s)
            self.game = game
            record.task_dir, record.controls_guid = task_dir, game.controls_guid
            argv = shared_memory_command(
                self.layout,
                s.task_name,
                task_dir,
                game.controls_guid,
                log=s.log,
                trainer_module=s.trainer_module,
                script=s.script,
            )
            proc = self._spawn(argv, self.layout.root)
            game.process_alive = proc.alive
            time.sleep(s.config_delay_s)
        elif self.mode is Mode.ATTACH:
            game = self._attach()
        else:
            port = free_tcp_port()
            argv = socket_command(
                self.layout,
                s.task_name,
                "127.0.0.1",
                port,
                log=s.log,
                trainer_module=s.trainer_module,
                script=s.script,
            )
            proc = self._spawn(argv, self.layout.root)
            time.sleep(s.config_delay_s)
            game = SocketGame.connect("127.0.0.1", port, timeout=s.engine_timeout_s, process_alive=proc.alive)
            self.game = game
        self._play(game, config, snapshots)

    def _attach(self) -> ShmGame:
        s = self.settings
        record = self.record
        task_dir = self.layout.intermediate_dir / f"{s.task_name}0"  # created by the trainer (-d)
        guid = new_guid(os.urandom(16))
        user_text = format_guid(guid, s.attach_guid_format)
        region_name = os_shm_name(platform_guid_string(guid, sys.platform), sys.platform)
        record.task_dir, record.controls_guid, record.trainer_controls_name = task_dir, user_text, region_name
        proc = self._spawn(
            attach_command(s.task_name, task_dir, user_text, log=s.log, script=s.script), self.layout.root
        )
        deadline = time.monotonic() + s.attach_wait_s
        while not region_exists(region_name):
            if not proc.alive():
                raise _HarnessFailure(
                    f"the trainer exited with code {proc.returncode} before creating its controls block {region_name}"
                )
            if time.monotonic() > deadline:
                raise _HarnessFailure(
                    f"the trainer did not create its controls block {region_name} within {s.attach_wait_s:g} s"
                )
            time.sleep(0.01)
        time.sleep(_ATTACH_SETTLE_S)
        # The engine has no process handle in attach mode: no liveness checks in its waits (§2.4).
        game = ShmGame.attach(user_text, task_dir / "Configs", timeout=s.engine_timeout_s)
        self.game = game
        return game

    def _note(self, what: str) -> None:
        self.record.engine_events.append((self.now(), what))

    def _play(self, game: ShmGame | SocketGame, config: SessionConfig, snapshots: tuple[bytes, ...]) -> None:
        """BeginTraining, then the tick loop until Completed or Stop (§7.1), recorded."""
        s = self.settings
        record = self.record
        proc = self.proc
        assert proc is not None  # every live mode spawned it first

        def network_sent(network_id: int) -> None:
            record.network_send_order.append(network_id)
            self._note(f"network {network_id} sent")
            if isinstance(game, ShmGame) and network_id == 0:
                record.config_signal_after_first_request = game.control(Control.CONFIG_SIGNAL)

        def round_received(networks: tuple[ReceivedNetwork, ...]) -> None:
            record.rounds.append(RoundRecord(len(record.rounds), self.now(), networks))
            self._note(f"round {len(record.rounds)} received")
            if isinstance(game, ShmGame) and len(record.rounds) == 1:
                record.experience_signal_at_first_round = game.control(Control.EXPERIENCE_SIGNAL)
            if s.pause_after_round is not None and s.pause_after_round[0] == len(record.rounds):
                self._note(f"paused for {s.pause_after_round[1]:g} s")
                time.sleep(s.pause_after_round[1])
                self._note("resumed")

        game.take_late_s = s.take_late_s
        begin_training(game, config, snapshots, self.task.replay_buffer, after_network=network_sent)
        self._note("experience sent")
        ended = tick_until_end(
            game,
            tick_s=s.tick_s,
            on_round=round_received,
            stop_after_rounds=s.stop_after_rounds,
            timeout_s=s.session_timeout_s,
            trainer=proc,
        )
        self.ended_at = ended.at
        if ended.how is Ending.COMPLETED:
            record.completed = True
            self._note("Completed")
        else:
            record.stop_sent = True
            self._note("Stop sent")
        self._end(game, proc)

    def _end(self, game: ShmGame | SocketGame, proc: TrainerProcess) -> None:
        """DoneTraining, then the trainer's own exit (bounded)."""
        s = self.settings
        record = self.record
        if isinstance(game, SocketGame) and record.completed:
            # The trainer must keep the connection until the engine closes it (§10 item 7): within the
            # grace period it may neither exit nor hang up.
            grace_end = time.monotonic() + s.complete_grace_s
            record.exited_before_close = False
            while time.monotonic() < grace_end:
                if not proc.alive() or game.peer_hung_up():
                    record.exited_before_close = True
                    break
                time.sleep(0.005)
        if isinstance(game, SocketGame) or not s.regions_until_exit:
            game.done()
            self._note("DoneTraining")
        code = proc.wait(s.exit_timeout_s)
        record.exit_code = code
        if code is None:
            raise _HarnessFailure(
                f"the trainer did not exit within {s.exit_timeout_s:g} s after the session ended"
            )
        if self.ended_at is not None and proc.exited_at is not None:
            record.exit_after_end_s = proc.exited_at - self.ended_at
        self._note(f"trainer exited with code {code}")
        if isinstance(game, ShmGame):
            if s.regions_until_exit:
                record.regions_present_at_exit = {
                    name: region_exists(name)
                    for name in game.region_names
                    if name != game.controls_region.name
                }
            if record.trainer_controls_name is not None:
                record.trainer_controls_left = region_exists(record.trainer_controls_name)
        if record.exited_before_close:
            raise _HarnessFailure(
                "the trainer exited (or hung up) after Complete before the engine closed the connection; a "
                "real engine ignores a Complete once the process has exited (§10 item 7)"
            )

    # -- offline ------------------------------------------------------------------------------------------
    def _run_file(self, config: SessionConfig, snapshots: tuple[bytes, ...]) -> None:
        s = self.settings
        record = self.record
        folder = FileExport(self.layout.intermediate_dir).write(
            config, dict(enumerate(snapshots)), self.task.replay_buffer
        )
        record.export_dir = folder
        out = self.layout.intermediate_dir / "Offline0"  # what the trainer would choose by default
        proc = self._spawn(offline_command(folder, out), REPO_ROOT)
        # Offline, nothing waits on the trainer but the user: only the watchdog's bound applies.
        code = proc.wait(s.hard_timeout_s)
        record.exit_code = code
        if code is None or self._watchdog_fired:
            raise _HarnessFailure(f"the offline trainer did not finish within {s.hard_timeout_s:g} s")
        if code != 0:
            raise _HarnessFailure(f"the offline trainer exited with code {code}")
        assert record.config is not None
        networks = FileExport.read_networks(out, record.config)
        record.rounds.append(RoundRecord(0, self.now(), networks))
        record.completed = True

    # -- cleanup ------------------------------------------------------------------------------------------
    def _finish(self, shm_before: set[str]) -> None:
        record = self.record
        if self._watchdog is not None:
            self._watchdog.cancel()
        proc = self.proc
        if proc is not None:
            if proc.alive():
                proc.kill()
            record.log = proc.log
        game = self.game
        engine_names: tuple[str, ...] = ()
        if isinstance(game, ShmGame):
            engine_names = game.region_names
            record.engine_regions = engine_names
        if game is not None:
            record.engine_events = sorted(
                record.engine_events + [(t - self.t0, f"engine: {w}") for t, w in game.events]
            )
            with contextlib.suppress(Exception):
                game.close()
        record.leaked_shm = leaked_shm_entries(shm_before, {name.lstrip("/") for name in engine_names})
        record.elapsed_s = self.now()


def run_engine_session(
    mode: Mode | str,
    task: EngineTask,
    work_dir: str | os.PathLike[str],
    settings: SessionSettings | None = None,
) -> SessionRecord:
    """Play one engine session in ``mode`` against a real trainer process and return the record.

    ``work_dir`` receives the fake engine tree (task directories, exports). Never raises for session
    failures: see :attr:`SessionRecord.failure` and :meth:`SessionRecord.check`.
    """
    return _Session(Mode(mode), task, Path(work_dir), settings or SessionSettings()).run()
