"""Fault-suite harnesses (tests/faults): fault injection around the real trainer: games that die, peers that lie, signals mid-step.

Two harnesses, both bounded everywhere:

* **Subprocess** (:func:`run_killed_game`, :func:`spawn_trainer`): the trainer runs as ``scripts/train.py``
  exactly as the engine launches it. To kill "the game" with SIGKILL the game-side emulator runs in its
  own child process (:func:`game_child_main`) which spawns the trainer itself, so the trainer's parent
  really dies. The test process makes itself a child subreaper (Linux ``PR_SET_CHILD_SUBREAPER``) for
  the duration, so the orphaned trainer is re-parented to the test, which can then read its exit status.
* **In-process** (:func:`run_in_process`): the trainer's own ``run_with_link`` (the function that turns
  every failure into an exit code) runs in the test's main thread against a game script on a thread. It
  costs milliseconds per case, so the long tables (every split point, every bad count) use it.

Every case asserts the exit code category from ``trainer/exitcodes.py`` and that nothing was lost:
snapshots and checkpoints already written parse, no temp file is left, engine regions still exist.

Timeouts: the subprocess trainer runs with ``LA_TRAINER_TIMEOUT_SCALE`` = :data:`TIMEOUT_SCALE`, so each
wait of ``trainer.settings.timeouts.Timeouts`` is a few seconds and "ends within 2x its timeout" is cheap to check.
Keep this module free of torch imports: :func:`game_child_main` imports it in a fresh interpreter.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from emulator.drive import Ending, TrainingStalled, begin_training, tick_until_end
from emulator.game import COMPLETED
from emulator.launch import REPO_ROOT
from emulator.session import EngineTask, SessionSettings
from protocol.snapshot import read_snapshot
from trainer.settings.timeouts import Timeouts
from trainer.system.win32 import Prototype

TIMEOUT_SCALE = 0.0025
"""``LA_TRAINER_TIMEOUT_SCALE`` for subprocess trainers: a wait that cannot see the game (attach mode)
gives up after 1.5 s instead of 600 s. Waits on a game whose liveness is seen have no bound."""
SCALED = Timeouts(wait=Timeouts().wait * TIMEOUT_SCALE)
"""The waits of a subprocess trainer under :data:`TIMEOUT_SCALE` (what ``Timeouts.from_env`` gives it)."""
DETECT_S = Timeouts().peer_check_interval
"""How often a subprocess trainer checks that a game it can see is still there: a dead game is noticed
within this (spawned modes, a connected socket), whatever it was waiting for."""
FAST = Timeouts(
    wait=2.0,
    ping_interval=0.05,
    poll_interval=0.0005,
    peer_check_interval=0.05,
)
"""Waits of an in-process trainer link."""
STARTUP_S = 60.0
"""Bound on a subprocess trainer reaching its first wait (python + torch import on a loaded 2-core box)."""
ENGINE_TIMEOUT_S = 60.0
"""The emulated engine's communicator timeout: generous, so only the trainer's bounds are under test."""
TRACEBACK = "Traceback (most recent call last)"

SETTINGS = SessionSettings(
    iteration_num=1_000_000,
    batch_size=16,
    hidden_layer_num=1,
    hidden_layer_size=8,
    iterations_per_snapshot=25,
    sync_every_iterations=40,
    timeout_scale=TIMEOUT_SCALE,
    engine_timeout_s=ENGINE_TIMEOUT_S,
)
"""Training that would run for hours, with a snapshot every 25 iterations and a round every 40."""


def load_factor() -> float:
    """How oversubscribed this machine is now (1.0 on an idle box): the 1-minute load per core.

    Wall-clock bounds in this suite are multiplied by it, so a CI box shared with other jobs does not turn
    scheduling delay into a failure, while an idle box checks the bound as written.
    """
    try:
        load = os.getloadavg()[0]
    except OSError:  # pragma: no cover - not on Linux
        return 1.0
    return max(1.0, load / (os.cpu_count() or 1))


FUZZ_STATS: dict[str, list[int]] = {}
"""Fuzz counters per decoder: [inputs tried, rejected with the documented error, decoded] (test_fuzz.py)."""


def small_task(size: int = 48, seed: int = 0) -> EngineTask:
    """B1 bimodal with ``size`` one-step episodes: tiny regions, tiny networks."""
    return EngineTask.benchmark("bimodal", size=size, seed=seed)


def trainer_env(settings: SessionSettings = SETTINGS, **extra: str) -> dict[str, str]:
    """The environment of a subprocess trainer: fast timeouts, iteration-based sync, one thread."""
    env = dict(os.environ)
    env.update(
        {
            "LA_TRAINER_TIMEOUT_SCALE": repr(settings.timeout_scale),
            "LA_TRAINER_SYNC_EVERY_ITERATIONS": str(settings.sync_every_iterations),
            "LA_TRAINER_SYNC_EVERY_SECONDS": "0",
            "LA_TRAINER_THREADS": "1",
            "LA_TRAINER_CHECKPOINT_EVERY_SECONDS": "0.5",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(settings.env)
    env.update(extra)
    return env


# ---------------------------------------------------------------------------------------------------------
# Facts about what a run left behind


def assert_no_traceback(output: str) -> None:
    assert TRACEBACK not in output, (
        f"a fault must end with one readable paragraph, not a traceback:\n{output}"
    )


def assert_snapshots_intact(folder: Path, sizes: Mapping[str, int]) -> list[Path]:
    """Every snapshot file parses and has its network's size; no temp file; checkpoints load.

    ``sizes``: network asset name → MaxByteNum. Returns the snapshot files found.
    """
    if not folder.exists():
        return []
    temps = [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]
    assert temps == [], f"temporary files left in {folder}: {temps}"
    found = sorted(folder.glob("*.bin"))
    for path in found:
        name = path.name.rsplit("_", 1)[0]
        data = path.read_bytes()
        assert len(data) == sizes[name], f"{path.name} has {len(data)} bytes, expected {sizes[name]}"
        read_snapshot(data)  # raises on any damage
    checkpoints = sorted(folder.glob("la-trainer-checkpoint*.pt"))
    if checkpoints:
        from trainer.training.checkpoint import load_checkpoint  # torch: only in the test process

        for path in checkpoints:
            load_checkpoint(path)
    return found


def network_sizes(task: EngineTask, settings: SessionSettings = SETTINGS) -> dict[str, int]:
    from emulator.session import build_session_config
    from protocol.names import NetworkId

    _, blobs = build_session_config(task, settings, None)
    return {name: len(blob) for name, blob in zip((n.title for n in NetworkId), blobs, strict=True)}


def unlink_regions(names: list[str]) -> None:
    """Remove engine regions a SIGKILLed game could not unlink (test cleanup)."""
    import posix_ipc

    for name in names:
        with contextlib.suppress(posix_ipc.ExistentialError):
            posix_ipc.unlink_shared_memory(name)


# ---------------------------------------------------------------------------------------------------------
# Orphans: the trainer outlives a SIGKILLed game


PR_SET_CHILD_SUBREAPER = 36

PRCTL = Prototype(
    "libc",
    "prctl",
    ctypes.c_int,
    (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong),
)
"""``int prctl(int op, unsigned long arg2, ..., arg5)`` (prctl(2)), declared like every ctypes call
(tests/trainer/test_win32_prototypes.py checks it)."""


def libc_prctl() -> Any:
    """libc's ``prctl`` with :data:`PRCTL` applied (Linux)."""
    return PRCTL.apply(ctypes.CDLL(None, use_errno=True)["prctl"])


@contextlib.contextmanager
def child_subreaper() -> Iterator[None]:
    """Orphaned descendants are re-parented to this process while the block runs (Linux only)."""
    prctl = libc_prctl()
    if prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:  # pragma: no cover - old kernels only
        pytest.skip("prctl(PR_SET_CHILD_SUBREAPER) is not available")
    try:
        yield
    finally:
        prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def wait_orphan(pid: int, timeout: float) -> int | None:
    """Exit code of ``pid`` (negative: killed by that signal) once it is our child and has exited.

    None when it still runs after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done, status = 0, 0  # not re-parented to us yet
        if done == pid:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    return None


def kill_orphan(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    wait_orphan(pid, 5.0)


class OutputPipe:
    """A pipe whose read end the test keeps: the trainer's output survives the game that spawned it."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        self._chunks: list[bytes] = []
        self.stamps: list[tuple[float, bytes]] = []
        """(time.monotonic(), chunk) as they arrived (to time messages against the game's death)."""
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.read_fd, 65536)
            except OSError:
                return
            if not chunk:
                return
            self._chunks.append(chunk)
            self.stamps.append((time.monotonic(), chunk))

    def close_write(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.write_fd)

    def text(self, wait: float = 2.0) -> str:
        self._thread.join(wait)
        return b"".join(self._chunks).decode("utf-8", errors="replace")

    def close(self) -> None:
        self.close_write()
        self._thread.join(2.0)
        with contextlib.suppress(OSError):
            os.close(self.read_fd)


# ---------------------------------------------------------------------------------------------------------
# The game in its own process


PHASES = ("before-config", "between-networks", "during-experience", "during-training", "during-sync")
"""Where :func:`game_child_main` dies (SIGKILL on itself), in session order."""


@dataclass(frozen=True)
class GameChildSpec:
    mode: str
    """``shm`` (spawned shared memory), ``socket`` (spawned TCP) or ``attach`` (the test started the trainer
    with ``-c``; the game maps its block with ``controls_guid`` and writes configs into ``task_dir``)."""
    die_at: str
    """One of :data:`PHASES`."""
    work_dir: str
    info_path: str
    out_fd: int | None
    """The trainer's stdout/stderr (a pipe the test holds); None: a pipe the game holds, as the engine."""
    iteration_num: int = SETTINGS.iteration_num
    iterations_per_snapshot: int = SETTINGS.iterations_per_snapshot
    env: dict[str, str] = field(default_factory=dict)
    controls_guid: str | None = None
    task_dir: str | None = None


def _write_json(path: str, obj: object) -> None:
    tmp = path + ".tmp"
    Path(tmp).write_text(json.dumps(obj))
    os.replace(tmp, path)


def _poll(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(0.005)
    raise TimeoutError(f"the game gave up waiting for {what}")


def game_child_main(spec_path: str) -> None:
    """The engine in its own process: spawn the trainer, play up to ``die_at``, SIGKILL itself."""
    from emulator.drive import begin_training
    from emulator.game import ShmGame, SocketGame
    from emulator.launch import EngineLayout, make_task_dir, shared_memory_command, socket_command
    from emulator.session import build_session_config, free_tcp_port

    raw = json.loads(Path(spec_path).read_text())
    spec = GameChildSpec(**raw)
    settings = replace(
        SETTINGS, iteration_num=spec.iteration_num, iterations_per_snapshot=spec.iterations_per_snapshot
    )
    work = Path(spec.work_dir)
    layout = EngineLayout.create(work / "engine")
    task = small_task()
    config, blobs = build_session_config(task, settings, str(layout.intermediate_dir))
    info: dict[str, Any] = {"reached": None, "engine_regions": []}
    env = trainer_env(settings, **spec.env)
    out: Any = spec.out_fd if spec.out_fd is not None else subprocess.PIPE
    game: Any = None
    proc: Any = None
    if spec.mode == "attach":
        assert spec.controls_guid is not None and spec.task_dir is not None
        task_dir = Path(spec.task_dir)
        game = ShmGame.attach(spec.controls_guid, task_dir / "Configs", timeout=ENGINE_TIMEOUT_S)
    elif spec.mode == "shm":
        task_dir = make_task_dir(layout.intermediate_dir)
        game = ShmGame.create(task_dir / "Configs", timeout=ENGINE_TIMEOUT_S)
        argv = shared_memory_command(layout, "Training", task_dir, game.controls_guid)
    else:
        # The trainer numbers socket runs as the engine numbers shared-memory ones
        # (trainer.records.runrecord.new_task_folder): the first one in a fresh folder is Training0.
        task_dir = layout.intermediate_dir / "Training0"
        port = free_tcp_port()
        argv = socket_command(layout, "Training", "127.0.0.1", port)
    if spec.mode != "attach":
        proc = subprocess.Popen(
            argv, cwd=layout.root, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
        )
    if spec.out_fd is not None:
        os.close(spec.out_fd)
    elif proc is not None:
        # The engine reads the pipe and echoes it into its log; when it dies the pipe breaks.
        log = (work / "engine-log.txt").open("wb")
        stream = proc.stdout
        assert stream is not None

        def pump() -> None:
            for line in iter(stream.readline, b""):
                log.write(line)
                log.flush()

        threading.Thread(target=pump, daemon=True).start()
    info.update(trainer_pid=proc.pid if proc is not None else None, task_dir=str(task_dir))
    _write_json(spec.info_path, info)
    status = task_dir / "la-trainer-status.msgpack"
    snapshots = task_dir / "Snapshots"

    def die(phase: str) -> None:
        info["reached"] = phase
        if isinstance(game, ShmGame):
            info["engine_regions"] = [n for n in game.region_names if n != game.controls_region.name]
            if game.controls_region.created:  # spawned mode; in attach mode the block is the trainer's
                info["controls_region"] = game.controls_region.name
        _write_json(spec.info_path, info)
        os.kill(os.getpid(), signal.SIGKILL)

    try:
        if spec.die_at == "before-config":
            # The trainer has written its first status ("waiting for config") once it waits.
            _poll(status.exists, STARTUP_S, "the trainer's status file")
            time.sleep(0.2)
            die(spec.die_at)
        if spec.mode == "socket":
            game = SocketGame.connect(
                "127.0.0.1", port, timeout=STARTUP_S, process_alive=lambda: proc.poll() is None
            )
        elif proc is not None:
            game.process_alive = lambda: proc.poll() is None

        def network_sent(network_id: int) -> None:
            # between-networks: after network 0; during-experience: after the last, before the replay buffer.
            due = {"between-networks": 0, "during-experience": len(blobs) - 1}.get(spec.die_at)
            if network_id == due:
                time.sleep(0.2)
                die(spec.die_at)

        begin_training(game, config, blobs, task.replay_buffer, after_network=network_sent)
        if spec.die_at == "during-training":
            _poll(lambda: snapshots.is_dir() and any(snapshots.glob("*.bin")), STARTUP_S, "a snapshot")
            die(spec.die_at)
        _poll(game.has_network_or_completed, STARTUP_S, "the first round")
        game.receive_network(0)
        die(spec.die_at)  # during-sync: networks 1 and 2 of the round are never taken
    except BaseException as error:
        info["error"] = f"{type(error).__name__}: {error}"
        _write_json(spec.info_path, info)
        raise


@dataclass
class KilledGame:
    """What a :func:`run_killed_game` observed."""

    code: int | None
    """The trainer's exit code (None: it did not exit within the bound and was killed)."""
    output: str
    info: dict[str, Any]
    exit_after_death_s: float
    game_returncode: int | None
    lines: list[tuple[float, str]] = field(default_factory=list)
    """Trainer output lines with their arrival time in seconds after the game's death."""

    def said_after(self, words: str) -> float | None:
        """Seconds after the death when a line containing ``words`` arrived (None: never)."""
        return next((t for t, line in self.lines if words in line), None)

    @property
    def task_dir(self) -> Path:
        return Path(self.info["task_dir"])

    def describe(self) -> str:
        return f"code={self.code} after {self.exit_after_death_s:.2f} s info={self.info}\n{self.output}"


def run_killed_game(
    mode: str,
    die_at: str,
    work_dir: Path,
    *,
    bound_s: float,
    hold_output: bool = True,
    env: Mapping[str, str] | None = None,
) -> KilledGame:
    """Start a game process that SIGKILLs itself at ``die_at``; wait (at most ``bound_s`` after the
    death) for the trainer to exit. The trainer is always gone afterwards.

    Spawned modes (``shm``, ``socket``): the game spawns the trainer, which becomes an orphan of this
    process. ``attach``: this process starts the trainer with ``-c -d`` first, as a user would.
    """
    from emulator.launch import EngineLayout, attach_command
    from protocol.guid import new_guid, os_shm_name

    pipe = OutputPipe() if hold_output and mode != "attach" else None
    info_path = work_dir / "game-info.json"
    attached: Any = None
    guid = task_dir = None
    if mode == "attach":
        layout = EngineLayout.create(work_dir / "attach")
        guid = new_guid(os.urandom(16)).braced_upper()
        task_dir = str(layout.intermediate_dir / "Training0")
        attached = spawn_trainer(
            attach_command("Training", Path(task_dir), guid),
            layout.root,
            trainer_env(SETTINGS, **(env or {})),
        )
        controls = os_shm_name(guid, sys.platform)
        from trainer.session.transport.shm import region_exists

        wait_for(lambda: region_exists(controls), STARTUP_S, "the trainer's controls block", attached)
        time.sleep(0.25)  # as a user starts the game after the trainer printed its instructions
    spec = GameChildSpec(
        mode=mode,
        die_at=die_at,
        work_dir=str(work_dir),
        info_path=str(info_path),
        out_fd=pipe.write_fd if pipe is not None else None,
        env=dict(env or {}),
        controls_guid=guid,
        task_dir=task_dir,
    )
    spec_path = work_dir / "game-spec.json"
    spec_path.write_text(json.dumps(asdict(spec)))
    code: int | None = None
    info: dict[str, Any] = {}
    lines: list[tuple[float, str]] = []
    try:
        with child_subreaper():
            game_log = (work_dir / "game-stdout.txt").open("wb")
            game = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    "import sys; from tests.support.faults import game_child_main; game_child_main(sys.argv[1])",
                    str(spec_path),
                ],
                cwd=REPO_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=game_log,
                stderr=subprocess.STDOUT,
                pass_fds=(pipe.write_fd,) if pipe is not None else (),
            )
            if pipe is not None:
                pipe.close_write()
            try:
                game_code = game.wait(STARTUP_S + 30.0)
            except subprocess.TimeoutExpired:
                game.kill()
                game_code = game.wait(5.0)
            died_at = time.monotonic()
            game_log.close()
            if info_path.exists():
                info = json.loads(info_path.read_text())
            if attached is not None:
                code, stamped = _wait_stamping(attached, bound_s)
                lines = [(t - died_at, line) for t, line in stamped]
            elif info.get("trainer_pid") is not None:
                code = wait_orphan(info["trainer_pid"], bound_s)
                if code is None:
                    kill_orphan(info["trainer_pid"])
            elapsed = time.monotonic() - died_at
    finally:
        if attached is not None:
            attached.close()
    if attached is not None:
        output = attached.output()
        info["trainer_controls_name"] = os_shm_name(guid or "", sys.platform)
    else:
        output = pipe.text() if pipe is not None else ""
        if pipe is not None:
            pipe.close()
            lines = [
                (t - died_at, line)
                for t, chunk in pipe.stamps
                for line in chunk.decode(errors="replace").splitlines()
            ]
        if not output:
            log_path = work_dir / "engine-log.txt"
            output = log_path.read_text(errors="replace") if log_path.exists() else ""
    game_output = (work_dir / "game-stdout.txt").read_text(errors="replace")
    if info.get("reached") != die_at:
        unlink_regions(info.get("engine_regions", []))
        pytest.fail(
            f"the game did not reach {die_at}: {info}\ngame output:\n{game_output}\ntrainer:\n{output}"
        )
    return KilledGame(code, output, info, elapsed, game_code, lines)


def _wait_stamping(proc: Any, timeout: float) -> tuple[int | None, list[tuple[float, str]]]:
    """Wait for ``proc`` (a TrainerProcess), noting when each output line was first seen."""
    stamped: list[tuple[float, str]] = []
    deadline = time.monotonic() + timeout
    while True:
        log = proc.output().splitlines()
        now = time.monotonic()
        stamped += [(now, line) for line in log[len(stamped) :]]
        code = proc.poll()
        if code is not None or now > deadline:
            break
        time.sleep(0.02)
    code = proc.wait(2.0)
    log = proc.output().splitlines()
    now = time.monotonic()
    stamped += [(now, line) for line in log[len(stamped) :]]
    return code, stamped


# ---------------------------------------------------------------------------------------------------------
# The trainer as the test's own child (attach mode, socket faults, signals)


def spawn_trainer(argv: list[str], cwd: Path, env: Mapping[str, str] | None = None) -> Any:
    """A :class:`emulator.launch.TrainerProcess` (output captured, killed on close)."""
    from emulator.launch import TrainerProcess

    return TrainerProcess(argv, cwd=cwd, env=dict(env) if env is not None else trainer_env())


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, proc: Any = None) -> Any:
    """Poll ``predicate`` (bounded); fail early with the trainer's log if ``proc`` exits meanwhile."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        if proc is not None and not proc.alive():
            pytest.fail(
                f"the trainer exited ({proc.returncode}) while the test waited for {what}:\n{proc.output()}"
            )
        time.sleep(0.005)
    pytest.fail(f"timed out after {timeout:g} s waiting for {what}" + (f":\n{proc.output()}" if proc else ""))


# ---------------------------------------------------------------------------------------------------------
# In-process: run_with_link in this thread, the game on another


@dataclass
class InProcessRun:
    code: int
    output: str
    game_error: BaseException | None
    link: Any = None


def run_in_process(
    open_link: Callable[[Any], Any],
    game: Callable[[Callable[[], Any]], None],
    capfd: pytest.CaptureFixture[str],
    *,
    task_dir: Path | None,
    options: Any = None,
    join_s: float = 90.0,
) -> InProcessRun:
    """``run_with_link`` (exit code and all) against ``game(link_getter)`` on a daemon thread.

    ``game`` receives a function returning the link once it exists (socket games need its port).
    """
    from trainer.session.app import run_with_link

    holder: list[Any] = []
    errors: list[BaseException] = []

    def link_getter() -> Any:
        return _poll(lambda: holder[0] if holder else None, 10.0, "the trainer's link")

    def target() -> None:
        try:
            game(link_getter)
        except BaseException as error:
            errors.append(error)

    def opener(flag: Any) -> Any:
        link = open_link(flag)
        holder.append(link)
        return link

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    code = run_with_link(opener, options=options or in_process_options(), task_dir=task_dir)
    thread.join(join_s)
    assert not thread.is_alive(), "the game thread hung"
    captured = capfd.readouterr()
    return InProcessRun(
        code, captured.out + captured.err, errors[0] if errors else None, holder[0] if holder else None
    )


def in_process_options(**changes: Any) -> Any:
    from trainer.settings.options import TrainerOptions

    base = TrainerOptions(
        sync_every_iterations=10,
        sync_every_seconds=0.0,
        progress_every_seconds=60.0,
        threads=1,
        checkpoint_every_seconds=0.0,
        ema_decay=0.9,
    )
    return replace(base, **changes)


# ---------------------------------------------------------------------------------------------------------
# A live session with the game in this process and the trainer as its child


class LiveGame:
    """An engine-spawned trainer (``shm`` or ``socket``) driven step by step from the test.

    ``layout``: reuse an engine tree (a second run gets the next TaskId, as in a game). Call
    :meth:`begin` (configs, networks 0-2, the replay buffer), then drive rounds; :meth:`close` always.
    """

    def __init__(
        self,
        mode: str,
        work_dir: Path,
        *,
        settings: SessionSettings = SETTINGS,
        env: Mapping[str, str] | None = None,
        layout: Any = None,
        task: EngineTask | None = None,
    ) -> None:
        from emulator.game import ShmGame, SocketGame
        from emulator.launch import EngineLayout, make_task_dir, shared_memory_command, socket_command
        from emulator.session import build_session_config, free_tcp_port

        self.mode = mode
        self.settings = settings
        self.task = task or small_task()
        self.layout = layout or EngineLayout.create(work_dir / "engine")
        self.config, self.blobs = build_session_config(self.task, settings, str(self.layout.intermediate_dir))
        self.rounds: list[Any] = []
        self.completed = False
        self.game: Any = None
        if mode == "shm":
            self.task_dir = make_task_dir(self.layout.intermediate_dir)
            self.game = ShmGame.create(self.task_dir / "Configs", timeout=ENGINE_TIMEOUT_S)
            argv = shared_memory_command(self.layout, "Training", self.task_dir, self.game.controls_guid)
        else:
            self.task_dir = self.layout.intermediate_dir / "Training0"  # numbered, as in run_killed_game
            port = free_tcp_port()
            argv = socket_command(self.layout, "Training", "127.0.0.1", port)
        self.proc = spawn_trainer(argv, self.layout.root, trainer_env(settings, **(env or {})))
        if mode == "shm":
            self.game.process_alive = self.proc.alive
        else:
            self.game = SocketGame.connect(
                "127.0.0.1", port, timeout=STARTUP_S, process_alive=self.proc.alive
            )

    @property
    def snapshots(self) -> Path:
        return self.task_dir / "Snapshots"

    def begin(self) -> None:
        """BeginTraining: configs, networks 0-2, the replay buffer."""
        begin_training(self.game, self.config, self.blobs, self.task.replay_buffer)

    def wait_files(self, pattern: str, count: int = 1) -> list[Path]:
        found: list[Path] = wait_for(
            lambda: found if len(found := sorted(self.snapshots.glob(pattern))) >= count else None,
            STARTUP_S,
            f"{count} file(s) {pattern} in {self.snapshots}",
            self.proc,
        )
        return found

    def play_until_end(self, timeout: float = 60.0) -> None:
        """Tick as the engine does until Completed (then DoneTraining), or fail after ``timeout``."""
        try:
            ended = tick_until_end(
                self.game, tick_s=0.005, on_round=self.rounds.append, timeout_s=timeout, trainer=self.proc
            )
        except TrainingStalled as stall:
            pytest.fail(f"{stall}:\n{self.proc.output()}")
        assert ended.how is Ending.COMPLETED, ended
        self.completed = True
        self.game.done()

    def wait_exit(self, timeout: float = 30.0) -> int:
        code = self.proc.wait(timeout)
        assert code is not None, f"the trainer did not exit within {timeout:g} s:\n{self.proc.output()}"
        return int(code)

    def close(self) -> None:
        self.proc.close()
        if self.game is not None:
            with contextlib.suppress(Exception):
                self.game.close()

    def __enter__(self) -> LiveGame:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------------------
# In-process sessions over shared memory


TINY = replace(SETTINGS, iteration_num=60, iterations_per_snapshot=20)
"""In-process runs: 60 iterations, a snapshot every 20, a round every 10 (in_process_options)."""


@dataclass
class ShmRun:
    run: InProcessRun
    game: Any
    task_dir: Path
    config: Any
    blobs: tuple[bytes, ...]
    regions_present: dict[str, bool] = field(default_factory=dict)
    """Each engine region: still in /dev/shm after the trainer returned (checked before the game closes)."""

    @property
    def code(self) -> int:
        return self.run.code

    @property
    def output(self) -> str:
        return self.run.output


def shm_in_process(
    tmp_path: Path,
    script: Callable[[Any, Any, tuple[bytes, ...]], None],
    capfd: pytest.CaptureFixture[str],
    *,
    settings: SessionSettings = TINY,
    task: EngineTask | None = None,
    options: Any = None,
    timeouts: Timeouts = FAST,
    guid: str | None = None,
    create: bool = False,
    task_name: str = "Training0",
) -> ShmRun:
    """``script(game, config, blobs)`` plays the engine (an emulator ShmGame, controls created by this
    process) against ``run_with_link`` over a ShmTrainerLink in this thread. ``guid`` replaces the GUID the
    trainer is given; ``create`` makes it create the block (attach mode; the game then attaches)."""
    from emulator.game import ShmGame
    from emulator.session import build_session_config
    from trainer.session.links import ShmTrainerLink

    task = task or small_task()
    config, blobs = build_session_config(task, settings, str(tmp_path))
    task_dir = tmp_path / task_name
    (task_dir / "Configs").mkdir(parents=True, exist_ok=True)
    games: list[Any] = []
    if not create:
        games.append(ShmGame.create(task_dir / "Configs", timeout=10.0))
    given = guid if guid is not None else games[0].controls_guid if games else ""

    def open_link(flag: Any) -> Any:
        return ShmTrainerLink(
            task_dir / "Configs",
            given,
            create=create,
            timeouts=timeouts,
            watch_parent=False,
            interrupted=flag.is_set,
        )

    def play(link_getter: Callable[[], Any]) -> None:
        if create:
            link = link_getter()
            games.append(ShmGame.attach(link.guid_string, task_dir / "Configs", timeout=10.0))
        script(games[0], config, blobs)

    from trainer.session.transport.shm import region_exists

    present: dict[str, bool] = {}
    try:
        run = run_in_process(open_link, play, capfd, task_dir=task_dir, options=options)
        for game in games:
            present.update({name: region_exists(name) for name in game.region_names})
    finally:
        for game in games:
            with contextlib.suppress(Exception):
                game.close()
    return ShmRun(run, games[0] if games else None, task_dir, config, blobs, present)


def send_all(game: Any, config: Any, blobs: tuple[bytes, ...], replay: Any = None) -> None:
    """BeginTraining with the fault suite's default recording (the small task's unless ``replay``)."""
    begin_training(game, config, blobs, replay if replay is not None else small_task().replay_buffer)


def play_rounds(game: Any, timeout: float = 90.0) -> list[Any]:
    """Tick until Completed; returns the rounds (the last item is the Completed marker)."""
    got: list[Any] = []
    ended = tick_until_end(game, tick_s=0.001, on_round=got.append, timeout_s=timeout)
    assert ended.how is Ending.COMPLETED, ended
    return [*got, COMPLETED]
