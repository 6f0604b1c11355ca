"""The engine's ``train.py``, as la-trainer ships it: one entry for every way the engine or a user starts it.

``trainer/dropin/train.py`` is a file the engine can run (install-engine points the engine at it through
a small shim, ``scripts/train.py`` is a thin shim over it in a checkout), and :func:`main` decides:

* under torchrun (``RANK``/``WORLD_SIZE`` set): this process is one rank of the scale-out trainer
  (:mod:`trainer.distributed`; rank 0 alone talks to the game);
* with ``LA_TRAINER_NPROC_PER_NODE=N`` (N > 1) outside torchrun: re-execute under torchrun with N
  processes (the engine spawned one process; its id and output pipe stay the same on POSIX);
* otherwise the ordinary trainer (:func:`trainer.session.app.engine_main`), which hands runs it does not train
  to the engine's own ``train.py`` (:mod:`trainer.dropin.handover`).

Before scale-out, and when this Python cannot load what FlowMatching needs (a half install),
:func:`decide_before_training` settles what it can first: bad launch inputs end with their documented exit
code (not torchrun's 1), other methods are handed over from this process, a FlowMatching run that cannot
train says what is missing and how to fix it.

The checks read the environment only: torch is imported after the link is open (spec §2.4).
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from protocol.argv import LaunchArgs
    from trainer.dropin.relay import ConfigRead

__all__ = [
    "ENV_ENGINE_PID",
    "ENV_NPROC",
    "ENV_TORCHRUN_ARGS",
    "decide_before_training",
    "main",
    "reexec_under_torchrun",
    "scale_out_requested",
    "socket_front",
    "torchrun_command",
]

ENV_NPROC = "LA_TRAINER_NPROC_PER_NODE"
"""Outside torchrun: > 1 makes the drop-in re-execute itself under torchrun with this many processes."""
ENV_TORCHRUN_ARGS = "LA_TRAINER_TORCHRUN_ARGS"
"""Extra torchrun arguments for that re-execution (default ``--standalone``; multi-node: ``--nnodes``...)."""
ENV_ENGINE_PID = "LA_TRAINER_ENGINE_PID"
"""Set by the re-execution: the process that started us (the engine); rank 0 stops when it is gone."""

_TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE")
"""What torchrun sets in every process it starts (``trainer.distributed.DistEnv`` reads them)."""


def scale_out_requested(environ: Mapping[str, str]) -> bool:
    """True under torchrun, or when :data:`ENV_NPROC` asks for more than one process (its value is checked
    by :mod:`trainer.distributed`, which reports a bad one with exit code 2)."""
    if any(name in environ for name in _TORCHRUN_VARIABLES):
        return True
    raw = environ.get(ENV_NPROC, "").strip()
    return bool(raw) and raw != "1"


def torchrun_command(argv: Sequence[str], nproc: int, extra: Sequence[str] = ()) -> list[str]:
    """``python -m trainer.dropin.torchrun [EXTRA | --standalone] --nproc-per-node N -m trainer.distributed
    ARGV``: torchrun's own arguments, run by :mod:`trainer.dropin.torchrun`, which ends with the ranks'
    documented exit code (torchrun alone ends every failure with 1 and a traceback)."""
    launch = list(extra) if extra else ["--standalone"]
    torchrun = [sys.executable, "-m", "trainer.dropin.torchrun", *launch, "--nproc-per-node", str(nproc)]
    return [*torchrun, "-m", "trainer.distributed", *argv]


def reexec_under_torchrun(argv: Sequence[str], nproc: int) -> int:
    """Engine-spawned scale-out: become torchrun with ``nproc`` processes, before torch is imported here.

    POSIX: ``os.execve``, so the engine's process handle and output pipe still name this process. Windows
    has no such exec: torchrun runs as our child and we return its exit code. Either way a small pinger
    (:mod:`trainer.dropin.pinger`) keeps a waiting engine's clock running until rank 0 holds the control
    block (shared memory; over a socket the engine retries its connection for its own timeout).
    """
    command = torchrun_command(argv, nproc, shlex.split(os.environ.get(ENV_TORCHRUN_ARGS, "")))
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # the package root: trainer/dropin/__init__.py
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env[ENV_ENGINE_PID] = str(os.getppid())
    from trainer.dropin.pinger import start_pinger

    pinger = start_pinger(argv, env, lock=True, engine_pid=os.getppid())
    sys.stdout.flush()
    if os.name == "nt":  # pragma: no cover - no exec on Windows
        import subprocess

        try:
            return subprocess.call(command, env=env)
        finally:
            if pinger is not None:
                pinger.kill()
    os.execve(sys.executable, command, env)
    raise AssertionError("os.execve returned")  # pragma: no cover


def main(argv: Sequence[str] | None = None) -> int:
    """The engine's command line (spec §1.2-1.4) in, an exit code out (README, "Exit codes")."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not any(name in os.environ for name in _TORCHRUN_VARIABLES):
        nproc = _nproc(os.environ)
        if nproc is None:
            return 2  # ExitCode.USAGE, said on stderr (trainer.exitcodes is not imported this early)
        decided = decide_before_training(args, nproc)
        if decided is not None:
            return decided
        if nproc > 1:
            return reexec_under_torchrun(args, nproc)
    if scale_out_requested(os.environ):
        from trainer.distributed.launch import main as scale_out

        return scale_out(args)
    from trainer.session.app import engine_main

    return engine_main(args)


def _nproc(environ: Mapping[str, str]) -> int | None:
    """:data:`ENV_NPROC` as a process count (1 when unset); None, after saying why, when it is not one."""
    raw = environ.get(ENV_NPROC, "").strip()
    if not raw:
        return 1
    if not raw.isdigit() or int(raw) < 1:
        print(
            f"la-trainer: environment variable {ENV_NPROC} must be a whole number >= 1, got {raw!r}.",
            file=sys.stderr,
            flush=True,
        )
        return None
    return int(raw)


def _say(text: str) -> None:
    """One line on stderr, ASCII whatever the pipe's encoding (the engine decodes UTF-8; a Windows pipe
    would be written in the ANSI code page): what cannot be shown is escaped, never raised."""
    try:
        sys.stderr.write(text.encode("ascii", "backslashreplace").decode("ascii") + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass  # no reader left


def decide_before_training(argv: Sequence[str], nproc: int) -> int | None:
    """What the drop-in settles before the trainer proper runs; an exit code, or None to go on.

    With everything FlowMatching needs at hand and one process, nothing: the trainer decides through its
    link. Otherwise (a half install, :func:`trainer.dropin.method.missing_requirements`; or scale-out,
    ``nproc`` > 1, where the ranks' exit codes would come out of torchrun as 1):

    * the command line, the task folder, the control block and the settings are checked here, each
      failure one line and its documented exit code (scale-out: before torchrun starts);
    * a spawned shared-memory run waits for its config file and a method other than FlowMatching goes to
      the engine's own ``train.py`` from this process (never through torchrun); a socket run whose ``-m``
      is not la-trainer's goes there at once;
    * a FlowMatching run that cannot load what it needs ends with one line naming it and the fix.
    """
    from trainer.dropin.method import missing_requirements

    missing = missing_requirements()
    if not missing and nproc == 1:
        return None
    from protocol.argv import SharedMemoryArgs, SocketArgs, parse_launch_argv
    from protocol.errors import ArgvError
    from trainer.dropin.handover import FLOW_MATCHING, socket_hands_over
    from trainer.exitcodes import ExitCode

    try:
        launch = parse_launch_argv(list(argv))
    except ArgvError as error:
        _say(f"la-trainer: bad command line: {error}")
        return int(ExitCode.USAGE)
    mode = launch.mode
    if isinstance(mode, SocketArgs) and socket_hands_over(launch.trainer_module):
        return _hand_over_early(launch.nne_cpu_path, argv, f"-m {launch.trainer_module}")
    refused = _check_launch_inputs(launch)
    if refused is not None:
        return refused
    if isinstance(mode, SocketArgs) and missing and nproc == 1:
        front = socket_front(argv)
        if isinstance(front, int):
            return front  # handed over (or the game went first)
        if front is not None:
            front.connection.close()  # a FlowMatching config: said below
    if isinstance(mode, SharedMemoryArgs) and not mode.create_mem and mode.controls_guid:
        from trainer.dropin.method import engine_watch, wait_for_method

        method = wait_for_method(Path(mode.task_dir) / "Configs", engine_alive=engine_watch())
        if method is None:
            _say("la-trainer: the engine went away before it posted the training config.")
            return int(ExitCode.PEER_GONE)
        if method != FLOW_MATCHING:
            return _hand_over_early(launch.nne_cpu_path, argv, f"TrainerMethod is {method!r}")
    if missing:
        _say(
            f"la-trainer: this run cannot train: the engine's Python ({sys.executable}) cannot load "
            f"{'; '.join(missing)}, which la-trainer needs for FlowMatching. Fix: run `la-trainer "
            "install-engine <Project>` again (it installs la-trainer's own dependencies for this Python; "
            "torch and numpy come from the engine's PythonMLPackages plugin: open the project in the editor "
            "once if they are missing). Other trainers (BehaviorCloning, PPO) are not affected."
        )
        return int(ExitCode.USAGE)
    return None


def _hand_over_early(nne_cpu_path: str | None, argv: Sequence[str], why: str) -> int:
    """The run goes to the engine's own ``train.py`` (:func:`trainer.dropin.handover.hand_over`), or exit 7 with
    the reason when there is none to hand it to."""
    from trainer.dropin.handover import ENV_ENGINE_TRAIN_PY, engine_train_py, hand_over
    from trainer.exitcodes import ExitCode

    target, no_target = engine_train_py(nne_cpu_path, sys.argv[0])
    if target is None:
        _say(
            f"la-trainer: {why}: la-trainer trains only FlowMatching and cannot hand this run to the "
            f"engine's own train.py ({no_target}). Set {ENV_ENGINE_TRAIN_PY} to the engine's "
            "Plugins/Experimental/LearningCore/Content/Python/train.py (docs/unreal-install.md, 'Other "
            "trainers')."
        )
        return int(ExitCode.UNSUPPORTED)
    print(
        f"la-trainer: {why}: la-trainer trains only FlowMatching, so the run goes to the engine's own "
        f"trainer {target}".encode("ascii", "backslashreplace").decode("ascii"),
        flush=True,
    )
    return hand_over(target, list(argv))


def _check_launch_inputs(launch: LaunchArgs) -> int | None:
    """The launch inputs the trainer would refuse, checked without opening anything: the task folder, the
    engine's control block (spawned shared memory), the settings files and LA_TRAINER_* values. An exit
    code after one line, or None."""
    from protocol.argv import SharedMemoryArgs, SocketArgs
    from trainer.errors import LaunchError
    from trainer.exitcodes import ExitCode
    from trainer.settings.options import load_options
    from trainer.settings.timeouts import Timeouts

    mode = launch.mode
    task_dir: Path | None = None
    try:
        if isinstance(mode, SharedMemoryArgs):
            task_dir = Path(mode.task_dir)
            if not mode.make_task_dir and not task_dir.is_dir():
                raise LaunchError(
                    f"Task directory {task_dir} does not exist. The engine creates it before it spawns the "
                    "trainer; when launching by hand add -d to create it."
                )
            if mode.controls_guid and not mode.create_mem:
                _check_control_block(mode.controls_guid)
        if task_dir is not None and task_dir.is_dir():
            options = load_options(task_dir, shared_dir=task_dir.parent)
        elif isinstance(mode, SocketArgs) and mode.temp_directory:
            # A socket run's task folder is made later, inside the temp folder, which holds the project's
            # settings (trainer.session.app.engine_main)
            options = load_options(None, shared_dir=Path(mode.temp_directory))
        else:
            options = load_options(None)
        Timeouts.from_env(options.wait)
    except LaunchError as error:
        _say(f"la-trainer: {error}")
        return int(ExitCode.USAGE)
    return None


def _check_control_block(controls_guid: str) -> None:
    """LaunchError when the engine's control block does not exist (the link's own check, made early)."""
    from protocol.errors import ProtocolError
    from protocol.guid import os_shm_name
    from trainer.errors import LaunchError

    try:
        name = os_shm_name(controls_guid, sys.platform)
    except ProtocolError as error:
        raise LaunchError(f"-g {controls_guid}: {error}") from None
    try:
        from trainer.session.transport.shm import region_exists
    except ImportError:
        return  # posix_ipc is missing: said as a missing requirement
    if not region_exists(name):
        raise LaunchError(
            f"the engine's control block {name!r} (-g {controls_guid}) does not exist: the game that "
            "spawned the trainer is gone, or the GUID is not the one it created."
        )


def socket_front(argv: Sequence[str]) -> int | ConfigRead | None:
    """A half install's socket run with la-trainer's ``-m`` (the engine default, which flow-matching call
    sites send too, or the flow-matching module): accept the game's connection and read its config
    first (:mod:`trainer.dropin.relay`). Another method is relayed to the engine's own ``train.py`` (its
    exit code is returned); a FlowMatching config comes back with its connection. None when there is
    nothing to decide here (another transport, a bad command line, no engine script to hand to). With
    everything at hand the trainer does the same in its own link's place (:func:`trainer.session.app.engine_main`),
    recording its status meanwhile.
    """
    from protocol.argv import SocketArgs, parse_launch_argv
    from protocol.errors import ArgvError
    from trainer.dropin.handover import FLOW_MATCHING, engine_train_py, socket_hands_over
    from trainer.dropin.method import engine_watch
    from trainer.dropin.relay import GameGone, listen_error_message, read_game_config, relay_hand_over
    from trainer.exitcodes import ExitCode

    try:
        launch = parse_launch_argv(list(argv))
    except ArgvError:
        return None
    mode = launch.mode
    if not isinstance(mode, SocketArgs) or socket_hands_over(launch.trainer_module):
        return None  # another transport, or an -m that is handed over before anything is bound
    target, _ = engine_train_py(launch.nne_cpu_path, sys.argv[0])
    if target is None:
        return None
    refused = _check_launch_inputs(launch)  # what the trainer would refuse, before a game connects
    if refused is not None:
        return refused
    try:
        read = read_game_config(mode.host, mode.port, engine_alive=engine_watch())
    except OSError as error:
        _say(f"la-trainer: {listen_error_message(mode.host, mode.port, error)}")
        return int(ExitCode.USAGE)
    except GameGone as gone:
        _say(f"la-trainer: {gone}.")
        return int(ExitCode.PEER_GONE)
    except KeyboardInterrupt:
        _say("la-trainer: interrupted.")
        return int(ExitCode.INTERRUPTED)
    if read.method is None or read.method == FLOW_MATCHING:
        return read
    print(
        f"la-trainer: TrainerMethod is {read.method!r}: la-trainer trains only FlowMatching, so the session "
        f"is relayed to the engine's own trainer {target}".encode("ascii", "backslashreplace").decode(
            "ascii"
        ),
        flush=True,
    )
    return relay_hand_over(target, argv, read)
