"""A scripted engine session against a real trainer process, recorded for assertions (spec §7.1).

:func:`run_engine_session` plays what ``ULearningAgentsFlowMatchingTrainer`` does in a game:

1. (spawned modes) create the engine's resources, build the command line, spawn ``scripts/train.py``;
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
import importlib
import os
import socket
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Any

from emulator.drive import Ending, TrainingStalled, begin_training, tick_until_end
from emulator.game import (
    DEFAULT_ENGINE_TIMEOUT_S,
    EngineFailure,
    FileExport,
    ReceivedNetwork,
    ShmGame,
    SocketGame,
)
from emulator.inference import DEFAULT_ODE_STEPS, EnginePolicy
from emulator.launch import (
    DEFAULT_TASK_NAME,
    DEFAULT_TRAINER_MODULE,
    REPO_ROOT,
    TRAIN_SCRIPT,
    EngineLayout,
    TrainerProcess,
    attach_command,
    make_task_dir,
    offline_command,
    shared_memory_command,
    socket_command,
)
from emulator.tasks import Demonstrations
from protocol.config import FlowMatchingSettings, FlowMatchingTrainingSettings, SessionConfig, TrainerConfig
from protocol.controls import Control
from protocol.engine.configs import build_engine_session, format_time_stamp
from protocol.guid import GuidFormat, format_guid, new_guid, os_shm_name, platform_guid_string
from protocol.replay import ReplayBuffer
from protocol.snapshot import SnapshotHeader, read_snapshot_header
from trainer.transport.shm import region_exists

__all__ = [
    "EngineTask",
    "Mode",
    "RoundRecord",
    "SessionRecord",
    "SessionSettings",
    "build_session_config",
    "free_tcp_port",
    "run_engine_session",
    "shm_entries",
]

_DEV_SHM = Path("/dev/shm")
_TRANSIENT_RECHECK_S = 0.3
"""A new /dev/shm entry must survive this long to count as a leak (other test processes on the same
machine create and remove their own regions meanwhile)."""
_ATTACH_SETTLE_S = 0.25
"""Attach mode: after the trainer's controls block appears, the harness waits this long before mapping
it, as a user starts the game after the trainer printed its instructions (both sides initialise the
block; a game that attached within microseconds of its creation would race the trainer's own setup)."""


class Mode(str, Enum):
    """The four ways an engine reaches a trainer."""

    SHM = "shm"
    """Spawned process over shared memory (§1.2, §2)."""
    ATTACH = "attach"
    """Trainer started first with ``-c -d``; the engine attaches to its controls block (§2.5)."""
    SOCKET = "socket"
    """Spawned process over TCP; the engine is the client (§1.3, §3)."""
    FILE = "file"
    """Offline: TrainingMaterials export, ``la-trainer offline``, networks read back (§5.5)."""


@dataclass(frozen=True, slots=True, eq=False)
class EngineTask:
    """What the game trains on: schema JSON (as the engine writes it) and the replay buffer built from a
    recording (one episode per record, §5.3)."""

    name: str
    observation_schema: Mapping[str, Any]
    action_schema: Mapping[str, Any]
    replay_buffer: ReplayBuffer

    @classmethod
    def from_demonstrations(
        cls,
        name: str,
        observation_schema: Mapping[str, Any],
        action_schema: Mapping[str, Any],
        demos: Demonstrations,
    ) -> EngineTask:
        flat = demos.flatten()
        rb = ReplayBuffer(
            replay_buffer_id=0,
            episode_starts=flat.episode_starts,
            episode_lengths=flat.episode_lengths,
            observations=(flat.observations,),
            actions=(flat.actions,),
        )
        return cls(name, observation_schema, action_schema, rb)

    @classmethod
    def benchmark(cls, name: str = "bimodal", size: int = 500, seed: int = 0) -> EngineTask:
        """A benchmark task (``bimodal``, ``avoid``, ``pendulum``) with a small recording: ``size`` pairs
        for bimodal (one 1-step episode each), ``size`` demonstrations otherwise."""
        module = importlib.import_module(f"emulator.tasks.{name}")
        count_kw = "pair_num" if name == "bimodal" else "demo_num"
        demos = module.make_demonstrations(seed, **{count_kw: size})
        return cls.from_demonstrations(name, module.OBSERVATION_SCHEMA, module.ACTION_SCHEMA, demos)


@dataclass(frozen=True, slots=True)
class SessionSettings:
    """Knobs of one scripted session. Engine-side values default to the engine's; training sizes are
    small so that a whole session takes seconds on two CPU cores."""

    task_name: str = DEFAULT_TASK_NAME
    # -- trainer config (§4.1) and model config (§4.3)
    iteration_num: int = 300
    batch_size: int = 64
    learning_rate: float = 1e-3
    seed: int = 1234
    save_snapshots: bool = True
    iterations_per_snapshot: int = 1000
    device: str = "CPU"
    embed_normalizations_in_weights: bool = False
    hidden_layer_num: int = 1
    hidden_layer_size: int = 32
    activation: str = "ELU"
    action_chunk_size: int = 1
    # -- engine behaviour
    engine_timeout_s: float = DEFAULT_ENGINE_TIMEOUT_S
    """The communicator timeout (§1.6)."""
    tick_s: float = 0.005
    """Game tick: the period of ``HasNetworkOrCompleted`` polls."""
    stop_after_rounds: int | None = None
    """Send Stop (EndTraining) after this many rounds instead of waiting for Complete."""
    config_delay_s: float = 0.0
    """Spawned modes: time between launching the trainer and BeginTraining (0: at once, the strictest)."""
    log: bool = True
    """LogSettings Normal (``-l``); False passes the empty ``""`` item (§1.2)."""
    trainer_module: str = DEFAULT_TRAINER_MODULE
    """``-m``; the engine default is the behaviour-cloning module (§1.6)."""
    attach_guid_format: GuidFormat = GuidFormat.DIGITS_WITH_HYPHENS_IN_BRACES
    """Attach mode: how the user writes the GUID for ``-g`` and ``-LearningAgentsControlsGuid``."""
    regions_until_exit: bool = False
    """Keep the engine's regions until the trainer exited (to check it did not unlink them); False
    releases them at DoneTraining as the engine does."""
    # -- harness bounds
    session_timeout_s: float = 45.0
    """Bound on the whole tick loop (a trainer that never completes fails the session)."""
    exit_timeout_s: float = 15.0
    """Bound on the trainer's exit after Complete/Stop (then it is killed)."""
    complete_grace_s: float = 0.2
    """Socket: after Complete the trainer must still be running this long, waiting for the close
    (the deterministic form of the §10 item 7 race)."""
    attach_wait_s: float = 30.0
    """Attach mode: bound on the trainer creating its controls block."""
    hard_timeout_s: float = 55.0
    """Watchdog: the trainer is killed this long after its launch whatever happens (engine waits that pings
    keep extending are faithful but unbounded; killing the process ends them)."""
    # -- our trainer's knobs (environment)
    sync_every_iterations: int = 50
    timeout_scale: float = 0.25
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment variables for the trainer."""
    echo: bool = False
    """Print the echoed ``Subprocess:`` lines as they arrive (pytest shows them on failure)."""
    script: Path = TRAIN_SCRIPT
    """The ``train.py`` the live modes launch (tests of the harness itself use a stub trainer)."""


@dataclass(frozen=True, slots=True, eq=False)
class RoundRecord:
    """One sync round the engine took: networks 0..N−1 and when (seconds since the session start)."""

    index: int
    at_s: float
    networks: tuple[ReceivedNetwork, ...]


@dataclass(eq=False)
class SessionRecord:
    """What happened, for assertions. Times are seconds since the session started."""

    mode: Mode
    settings: SessionSettings
    config: SessionConfig | None = None
    argv: list[str] = field(default_factory=list)
    task_dir: Path | None = None
    controls_guid: str | None = None
    export_dir: Path | None = None
    sent: tuple[bytes, ...] = ()
    """Initial snapshots in id order."""
    sent_headers: tuple[SnapshotHeader, ...] = ()
    network_send_order: list[int] = field(default_factory=list)
    """Ids the engine handed over, in order (shared memory: each only after the trainer's request)."""
    config_signal_after_first_request: int | None = None
    """Shared memory: ConfigSignal once the trainer asked for network 0 (it must have cleared it)."""
    experience_signal_at_first_round: int | None = None
    """Shared memory: ExperienceSignal when the first round arrived (the trainer must have consumed it)."""
    rounds: list[RoundRecord] = field(default_factory=list)
    completed: bool = False
    stop_sent: bool = False
    exited_before_close: bool | None = None
    """Socket after Complete: the trainer exited or hung up before the engine closed the connection
    (§10 item 7)."""
    exit_code: int | None = None
    exit_after_end_s: float | None = None
    """Seconds from Completed/Stop to the observed trainer exit."""
    engine_regions: tuple[str, ...] = ()
    regions_present_at_exit: dict[str, bool] | None = None
    """With ``regions_until_exit``: whether each engine region still existed after the trainer exited."""
    trainer_controls_name: str | None = None
    trainer_controls_left: bool | None = None
    """Attach mode: the trainer-created controls block still exists after the trainer exited."""
    leaked_shm: tuple[str, ...] = ()
    """/dev/shm entries that appeared during the session, were not the engine's, and outlived the trainer."""
    engine_events: list[tuple[float, str]] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    failure: str | None = None
    elapsed_s: float = 0.0

    # -- views -------------------------------------------------------------------------------------------
    @property
    def final_networks(self) -> tuple[bytes, ...]:
        """The latest snapshots in id order (the initial ones if no round arrived)."""
        return tuple(n.data for n in self.rounds[-1].networks) if self.rounds else self.sent

    def policy(self, ode_steps: int = DEFAULT_ODE_STEPS) -> EnginePolicy:
        """The final networks as the engine would run them (encoder = id 1, denoiser = 0, decoder = 2)."""
        denoiser, encoder, decoder = self.final_networks[:3]
        return EnginePolicy.from_snapshots(encoder, denoiser, decoder, ode_steps)

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log[-lines:])

    def describe(self) -> str:
        """A multi-line account for assertion messages."""
        events = "\n".join(f"  {t:8.3f} s  {what}" for t, what in self.engine_events[-30:])
        return (
            f"mode={self.mode.value} failure={self.failure!r} exit_code={self.exit_code} "
            f"completed={self.completed} stop_sent={self.stop_sent} rounds={len(self.rounds)}\n"
            f"argv: {self.argv}\nengine events (last 30):\n{events}\ntrainer output (last 60 lines):\n"
            f"{self.log_tail()}"
        )

    def check(self) -> None:
        """Raise AssertionError with :meth:`describe` if the session failed."""
        if self.failure is not None:
            raise AssertionError(f"engine session failed: {self.failure}\n{self.describe()}")


class _HarnessFailure(Exception):
    """The session broke a harness bound or an engine rule checked outside the drivers."""


# ---------------------------------------------------------------------------------------------------------
# Building the engine's configs and networks


def build_session_config(
    task: EngineTask, settings: SessionSettings, temp_directory: str | None
) -> tuple[SessionConfig, tuple[bytes, bytes, bytes]]:
    """The configs the engine would build for ``task`` (§4) and the initial snapshots (§6.3), id order.

    The engine's assembly is :func:`protocol.engine.configs.build_engine_session`; this maps the session's
    knobs onto its trainer config (TimeStamp: now, as the engine stamps it) and model settings.
    """
    trainer = TrainerConfig(
        time_stamp=format_time_stamp(datetime.now()),
        training=FlowMatchingTrainingSettings(
            iteration_num=settings.iteration_num,
            learning_rate=settings.learning_rate,
            batch_size=settings.batch_size,
            seed=settings.seed,
            save_snapshots=settings.save_snapshots,
            iterations_per_snapshot=settings.iterations_per_snapshot,
        ),
        embed_normalizations_in_weights=settings.embed_normalizations_in_weights,
        device=settings.device,
        temp_directory=temp_directory,
    )
    flow_matching = FlowMatchingSettings(
        action_chunk_size=settings.action_chunk_size,
        hidden_layer_num=settings.hidden_layer_num,
        hidden_layer_size=settings.hidden_layer_size,
        activation_function=settings.activation,
    )
    config, snapshots = build_engine_session(
        task.observation_schema,
        task.action_schema,
        task.replay_buffer,
        trainer=trainer,
        flow_matching=flow_matching,
    )
    return config, snapshots


# ---------------------------------------------------------------------------------------------------------
# Small OS helpers


def free_tcp_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (bind to 0, read it, release it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def shm_entries() -> set[str]:
    """Names in ``/dev/shm`` that could be protocol regions (empty where it does not exist).

    POSIX semaphores (``sem.*``, e.g. Python multiprocessing's) live in the same folder but are never
    protocol regions; other processes on the machine create them at any time, so they are ignored.
    """
    try:
        return {name for name in os.listdir(_DEV_SHM) if not name.startswith("sem.")}
    except OSError:
        return set()


def _mapped_shm_names() -> set[str]:
    """Names under /dev/shm that some live process has mapped (from /proc/<pid>/maps; Linux only)."""
    names: set[str] = set()
    marker = str(_DEV_SHM) + "/"
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text(errors="replace")
        except OSError:
            continue  # the process ended or is not ours to read
        for line in text.splitlines():
            at = line.find(marker)
            if at >= 0:
                names.add(line[at + len(marker) :].removesuffix(" (deleted)"))
    return names


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
        proc = self._spawn(offline_command(folder), REPO_ROOT)
        # Offline, nothing waits on the trainer but the user: only the watchdog's bound applies.
        code = proc.wait(s.hard_timeout_s)
        record.exit_code = code
        if code is None or self._watchdog_fired:
            raise _HarnessFailure(f"the offline trainer did not finish within {s.hard_timeout_s:g} s")
        if code != 0:
            raise _HarnessFailure(f"the offline trainer exited with code {code}")
        assert record.config is not None
        networks = FileExport.read_networks(folder, record.config)
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
            record.engine_events = sorted(
                record.engine_events + [(t - self.t0, f"engine: {w}") for t, w in game.events]
            )
        elif isinstance(game, SocketGame):
            record.engine_events = sorted(
                record.engine_events + [(t - self.t0, f"engine: {w}") for t, w in game.events]
            )
        if game is not None:
            with contextlib.suppress(Exception):
                game.close()
        ours = {name.lstrip("/") for name in engine_names}
        new = shm_entries() - shm_before - ours
        if new:
            # Other processes on this machine (parallel test runs) create regions too. The trainer has
            # exited, so a region it leaked is mapped by nobody and stays; others' come and go or are mapped.
            time.sleep(_TRANSIENT_RECHECK_S)
            new &= shm_entries()
            new -= _mapped_shm_names()
        record.leaked_shm = tuple(sorted(new))
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
