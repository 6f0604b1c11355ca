"""The engine's process side: directories, the trainer command line, the spawned process (spec §1.1-1.3, §1.6).

What the engine does before and around ``train.py``, reproduced for tests:

* a fake engine tree (:class:`EngineLayout`) whose root is ``FPaths::RootDir()``, the trainer's working
  directory, holding ``Engine/...`` (the NNE CPU python folder, a binaries folder) and
  ``Project/Intermediate/LearningCore`` (the engine's IntermediatePath);
* the task directory ``<Intermediate>/LearningCore/<TaskName><TaskId>/Configs`` with the smallest free
  TaskId (:func:`make_task_dir`, §1.2);
* the argv in the engine's order through :func:`protocol.argv.format_launch_argv`, every path absolute;
  ``-m`` is the engine default ``learning_core.train_behavior_cloning`` (§1.6), so a trainer that
  dispatched on ``-m`` instead of ``TrainerMethod`` would fail here as it would in a real game;
* the child process with stdout/stderr piped and echoed line by line with a ``Subprocess:`` prefix
  (:class:`TrainerProcess`), as the engine echoes them into its log (§1.1).

Everything here is bounded: :meth:`TrainerProcess.wait` takes a timeout and :meth:`TrainerProcess.kill`
ends only the process this object started (by its id), so a test never hangs on a stuck trainer.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from protocol.argv import LaunchArgs, SharedMemoryArgs, SocketArgs, format_launch_argv
from protocol.names import ENGINE_DEFAULT_MODULE, FLOW_MATCHING_MODULE
from trainer.records.runrecord import new_task_folder

__all__ = [
    "DEFAULT_TASK_NAME",
    "DEFAULT_TRAINER_MODULE",
    "ENGINE_STAND_IN_EXIT",
    "ENGINE_TRAIN_PY_STAND_IN",
    "FLOW_MATCHING_TRAINER_MODULE",
    "LOG_PREFIX",
    "REPO_ROOT",
    "TRAIN_SCRIPT",
    "EngineLayout",
    "TrainerProcess",
    "attach_command",
    "engine_command",
    "make_task_dir",
    "offline_command",
    "shared_memory_command",
    "socket_command",
]

REPO_ROOT = Path(__file__).resolve().parents[1]
"""The folder above this package: the repository checkout, or ``site-packages`` in an installed wheel."""


def _train_script() -> Path:
    """The engine drop-in that the emulator launches in place of ``LearningCore/Content/Python/train.py``:
    the file the installed package holds (``trainer/dropin/train.py``), found through the import system
    rather than the repository, so the demo and the bench work from a wheel with no checkout."""
    import importlib.util

    spec = importlib.util.find_spec("trainer.dropin")
    if spec is None or spec.origin is None:  # pragma: no cover - trainer always ships it
        raise RuntimeError("the installed la-trainer has no trainer/dropin package")
    return Path(spec.origin).resolve().parent / "train.py"


TRAIN_SCRIPT = _train_script()
"""The engine drop-in script the emulator launches (:func:`_train_script`)."""

DEFAULT_TASK_NAME = "Training"
"""``FLearningAgentsTrainerProcessSettings::TaskName`` default (§1.6)."""
DEFAULT_TRAINER_MODULE = ENGINE_DEFAULT_MODULE
"""``TrainerFileName`` default (§1.6). The FM trainer does not change it, so this is what a game sends."""
FLOW_MATCHING_TRAINER_MODULE = FLOW_MATCHING_MODULE
"""[INF] The module name a user would presumably set for flow matching (spec Unknown 10)."""

ENGINE_STAND_IN_EXIT = 99
"""The stand-in engine script's exit code (no exit code of la-trainer's)."""
ENGINE_TRAIN_PY_STAND_IN = (
    "import sys\n"
    'print("stand-in for the engine\'s own train.py: it ran", flush=True)\n'
    f"sys.exit({ENGINE_STAND_IN_EXIT})\n"
)
"""What the fake engine tree holds as the engine's ``train.py``: it says it ran and exits 99."""

LOG_PREFIX = "Subprocess: "
"""Prefix the engine puts in front of every echoed trainer output line (§1.1)."""


@dataclass(frozen=True, slots=True)
class EngineLayout:
    """A fake engine installation and project, all absolute paths (§1.1, §1.2, §1.5).

    ``root``: ``FPaths::RootDir()``, the trainer's working directory. ``intermediate_dir``: the engine's
    IntermediatePath ``<Project>/Intermediate/LearningCore`` (socket temp directory, ``TempDirectory``,
    parent of task directories and of ``TrainingMaterials``).
    """

    root: Path
    engine_dir: Path
    project_dir: Path
    intermediate_dir: Path
    nne_cpu_path: Path
    custom_trainer_path: Path

    @classmethod
    def create(cls, base: str | os.PathLike[str]) -> EngineLayout:
        """Create the folders under ``base`` (which must exist or be creatable)."""
        root = Path(base).resolve()
        engine_dir = root / "Engine"
        project_dir = root / "Project"
        layout = cls(
            root=root,
            engine_dir=engine_dir,
            project_dir=project_dir,
            intermediate_dir=project_dir / "Intermediate" / "LearningCore",
            nne_cpu_path=engine_dir
            / "Plugins"
            / "Experimental"
            / "NNERuntimeBasicCpu"
            / "Content"
            / "Python",
            # [INF] CustomTrainerPath defaults to an empty path, which the engine's absolute-path
            # conversion turns into some existing directory, probably the binaries folder (§1.2).
            custom_trainer_path=engine_dir / "Binaries" / "Linux",
        )
        for path in (layout.intermediate_dir, layout.nne_cpu_path, layout.custom_trainer_path):
            path.mkdir(parents=True, exist_ok=True)
        # The engine's own train.py, beside the NNE plugin where la-trainer looks for it (trainer.dropin.handover):
        # a stand-in that fails loudly, so a flow-matching session handed over by mistake cannot pass.
        layout.engine_train_py.parent.mkdir(parents=True, exist_ok=True)
        if not layout.engine_train_py.exists():
            layout.engine_train_py.write_text(ENGINE_TRAIN_PY_STAND_IN, encoding="utf-8")
        return layout

    @property
    def engine_train_py(self) -> Path:
        """``<EngineDir>/Plugins/Experimental/LearningCore/Content/Python/train.py``: the engine's own script
        (spec §1.1), a stand-in here (:data:`ENGINE_TRAIN_PY_STAND_IN`; hand-over tests replace it)."""
        return (
            self.engine_dir / "Plugins" / "Experimental" / "LearningCore" / "Content" / "Python" / "train.py"
        )


def make_task_dir(intermediate_dir: str | os.PathLike[str], task_name: str = DEFAULT_TASK_NAME) -> Path:
    """Create ``<intermediate_dir>/<TaskName><TaskId>/Configs`` for the smallest free TaskId ≥ 0 (§1.2).

    Returns the task directory (the parent of ``Configs``). "Free" means the ``Configs`` folder does not
    exist yet, as in the engine; TaskName and TaskId are joined without a separator (``Training0``).
    """
    # One owner of the engine's numbering: the trainer numbers its socket and offline task folders the
    # same way, in the same folder, so that the two never take the same number.
    return new_task_folder(Path(intermediate_dir), task_name)


def engine_command(
    layout: EngineLayout,
    task_name: str,
    mode: SharedMemoryArgs | SocketArgs,
    *,
    log: bool = True,
    trainer_module: str = DEFAULT_TRAINER_MODULE,
    python: str = sys.executable,
    script: Path = TRAIN_SCRIPT,
) -> list[str]:
    """``[python, train.py, <argv in the engine's 5.8 order>]`` for a spawned trainer (§1.2, §1.3).

    ``log=False`` models LogSettings Silent: an empty ``""`` item stands where ``-l`` would go.
    """
    args = LaunchArgs(
        task_name=task_name,
        trainer_path=str(layout.custom_trainer_path),
        trainer_module=trainer_module,
        log=log,
        nne_cpu_path=str(layout.nne_cpu_path),
        mode=mode,
    )
    return [python, str(script), *format_launch_argv(args)]


def shared_memory_command(
    layout: EngineLayout,
    task_name: str,
    task_dir: Path,
    controls_guid: str,
    *,
    log: bool = True,
    trainer_module: str = DEFAULT_TRAINER_MODULE,
    script: Path = TRAIN_SCRIPT,
) -> list[str]:
    """The spawned shared-memory command line (§1.2): ``... SharedMemory "<task dir>" -g "<GUID>"``."""
    mode = SharedMemoryArgs(task_dir=str(Path(task_dir).resolve()), controls_guid=controls_guid)
    return engine_command(layout, task_name, mode, log=log, trainer_module=trainer_module, script=script)


def socket_command(
    layout: EngineLayout,
    task_name: str,
    host: str,
    port: int,
    *,
    log: bool = True,
    trainer_module: str = DEFAULT_TRAINER_MODULE,
    script: Path = TRAIN_SCRIPT,
) -> list[str]:
    """The spawned socket command line (§1.3): ``... Socket "<ip>:<port>" "<abs IntermediatePath>"``."""
    mode = SocketArgs(host=host, port=port, temp_directory=str(layout.intermediate_dir))
    return engine_command(layout, task_name, mode, log=log, trainer_module=trainer_module, script=script)


def attach_command(
    task_name: str, task_dir: Path, controls_guid: str, *, log: bool = True, script: Path = TRAIN_SCRIPT
) -> list[str]:
    """What a user runs before starting the game in attach mode (§2.5):
    ``train.py <task> SharedMemory <TASK_DIR> -g <GUID> -c -d`` (the trainer creates the controls block
    and the task directory; the configs are then read from ``<TASK_DIR>/Configs``)."""
    args = LaunchArgs(
        task_name=task_name,
        trainer_path=None,
        trainer_module=None,
        log=log,
        nne_cpu_path=None,
        mode=SharedMemoryArgs(
            task_dir=str(Path(task_dir).resolve()),
            controls_guid=controls_guid,
            create_mem=True,
            make_task_dir=True,
        ),
    )
    # A user types no empty placeholder for a silent log; drop the one format_launch_argv writes.
    return [sys.executable, str(script), *(item for item in format_launch_argv(args) if item)]


def offline_command(materials: Path, out: Path) -> list[str]:
    """``python -m trainer offline <TrainingMaterials/<stamp>> --out <out>``: the trained networks go to
    ``<out>/Networks`` (the export keeps its initial ones)."""
    return [sys.executable, "-m", "trainer", "offline", str(materials), "--out", str(out)]


class TrainerProcess:
    """The trainer child process, its output echoed with the engine's ``Subprocess:`` prefix (§1.1).

    stdout and stderr share one pipe (the engine echoes both into one log); a reader thread splits it
    into lines as they arrive. ``log`` holds the prefixed lines; ``echo`` (e.g. ``print``) also sees each.
    The process is started in its own session so that a SIGINT aimed at the test runner does not reach
    it; :meth:`kill` signals only this process id.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        cwd: str | os.PathLike[str],
        env: Mapping[str, str] | None = None,
        echo: Callable[[str], None] | None = None,
    ) -> None:
        self.argv = list(argv)
        self.started_at = time.monotonic()
        self._log: list[str] = []
        self._lock = threading.Lock()
        self._echo = echo
        self._exited_at: float | None = None
        self._proc = subprocess.Popen(
            self.argv,
            cwd=os.fspath(cwd),
            env=dict(env) if env is not None else None,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._reader = threading.Thread(
            target=self._read_output, name=f"trainer-{self._proc.pid}-output", daemon=True
        )
        self._reader.start()

    # -- output ----------------------------------------------------------------------------------------
    def _read_output(self) -> None:
        stream = self._proc.stdout
        if stream is None:  # pragma: no cover - stdout is always a pipe here
            return
        for raw in iter(stream.readline, b""):
            line = LOG_PREFIX + raw.decode("utf-8", errors="replace").rstrip("\r\n")
            with self._lock:
                self._log.append(line)
            if self._echo is not None:
                self._echo(line)
        stream.close()

    @property
    def log(self) -> list[str]:
        """The echoed lines so far, each starting with ``Subprocess: ``."""
        with self._lock:
            return list(self._log)

    def output(self) -> str:
        """The trainer's output so far without the prefix, one line per line."""
        return "\n".join(line[len(LOG_PREFIX) :] for line in self.log)

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` echoed lines (for failure messages)."""
        return "\n".join(self.log[-lines:])

    # -- state -----------------------------------------------------------------------------------------
    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        """The exit status once the process has exited (negative: killed by that signal), else None."""
        return self.poll()

    def poll(self) -> int | None:
        code = self._proc.poll()
        if code is not None and self._exited_at is None:
            self._exited_at = time.monotonic()
        return code

    def alive(self) -> bool:
        """True while the process runs (the engine's ``IsRunning`` check before each wait, §2.4)."""
        return self.poll() is None

    @property
    def exited_at(self) -> float | None:
        """``time.monotonic()`` when an exit was first observed (by poll/alive/wait), else None."""
        return self._exited_at

    def wait(self, timeout: float) -> int | None:
        """Wait at most ``timeout`` seconds; the exit status, or None if it is still running."""
        try:
            self._proc.wait(timeout=max(timeout, 0.0))
        except subprocess.TimeoutExpired:
            return None
        code = self.poll()
        self._join_reader(2.0)
        return code

    def _join_reader(self, timeout: float) -> None:
        # The pipe reaches EOF once the process and any children holding it are gone.
        self._reader.join(timeout)

    def kill(self, grace: float = 3.0) -> int | None:
        """SIGTERM, then SIGKILL after ``grace`` seconds; return the exit status (None if it survived)."""
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.terminate()
            if self.wait(grace) is None:
                with contextlib.suppress(ProcessLookupError):
                    self._proc.kill()
                self.wait(grace)
        self._join_reader(1.0)
        return self.poll()

    def close(self) -> None:
        """Kill the process if it still runs and release the pipe (idempotent; for finalizers)."""
        self.kill()
        if self._proc.stdout is not None and not self._reader.is_alive():
            with contextlib.suppress(OSError):
                self._proc.stdout.close()

    def __enter__(self) -> TrainerProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TrainerProcess(pid={self.pid}, returncode={self.returncode})"
