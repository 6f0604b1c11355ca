"""The engine's ``train.py``, as la-trainer ships it: one entry for every way the engine or a user starts it.

``trainer/dropin/train.py`` is a file the engine can run (install-engine points the engine at it through
a small shim, ``scripts/train.py`` is a thin shim over it in a checkout), and :func:`main` decides:

* under torchrun (``RANK``/``WORLD_SIZE`` set): this process is one rank of the scale-out trainer
  (:mod:`trainer.distributed`; rank 0 alone talks to the game);
* with ``LA_TRAINER_NPROC_PER_NODE=N`` (N > 1) outside torchrun: re-execute under torchrun with N
  processes (the engine spawned one process; its id and output pipe stay the same on POSIX);
* otherwise the ordinary trainer (:func:`trainer.dropin.engine.engine_main`), which hands runs it does not
  train to the engine's own ``train.py`` (:mod:`trainer.dropin.handover`).

Before scale-out, and when this Python cannot load what FlowMatching needs (a half install),
:func:`decide_before_training` settles what it can first: bad launch inputs end with their documented exit
code (not torchrun's 1), other methods are handed over from this process, a FlowMatching run that cannot
train says what is missing and how to fix it.

The checks read the environment only: torch is imported after the link is open (spec §2.4). Everything
here and in the modules it imports first is standard library (with :mod:`protocol`'s argv and names,
:mod:`trainer.settings.environment` and :mod:`trainer.system.console`): a half install must get this far.

Modules: :mod:`~trainer.dropin.train` (the file the engine runs), :mod:`~trainer.dropin.engine` (one
process), :mod:`~trainer.dropin.scale_out` (``python -m trainer.distributed``: under torchrun, or launching
it), :mod:`~trainer.dropin.torchrun` (torchrun with the ranks' exit codes), :mod:`~trainer.dropin.handover`
(runs la-trainer does not train), with :mod:`~trainer.dropin.method`, :mod:`~trainer.dropin.relay` and
:mod:`~trainer.dropin.pinger` under it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from trainer.settings.environment import ENV_NPROC
from trainer.system.console import log, log_error

if TYPE_CHECKING:
    from protocol.argv import LaunchArgs
    from trainer.dropin.relay import ConfigRead

__all__ = [
    "decide_before_training",
    "main",
    "scale_out_requested",
    "socket_front",
]

_TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE")
"""What torchrun sets in every process it starts (``trainer.distributed.DistEnv`` reads them)."""


def scale_out_requested(environ: Mapping[str, str]) -> bool:
    """True under torchrun, or when :data:`ENV_NPROC` asks for more than one process (its value is checked
    by :mod:`trainer.distributed`, which reports a bad one with exit code 2)."""
    if any(name in environ for name in _TORCHRUN_VARIABLES):
        return True
    raw = environ.get(ENV_NPROC, "").strip()
    return bool(raw) and raw != "1"


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
            from trainer.dropin.torchrun import reexec_under_torchrun

            return reexec_under_torchrun(args, nproc)
    if scale_out_requested(os.environ):
        from trainer.dropin.scale_out import main as scale_out

        return scale_out(args)
    from trainer.dropin.engine import engine_main

    return engine_main(args)


def _nproc(environ: Mapping[str, str]) -> int | None:
    """:data:`ENV_NPROC` as a process count (1 when unset); None, after saying why, when it is not one."""
    raw = environ.get(ENV_NPROC, "").strip()
    if not raw:
        return 1
    if not raw.isdigit() or int(raw) < 1:
        log_error(f"la-trainer: environment variable {ENV_NPROC} must be a whole number >= 1, got {raw!r}.")
        return None
    return int(raw)


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
    from protocol.names import FLOW_MATCHING
    from trainer.dropin.handover import hand_over_early, socket_hands_over
    from trainer.exitcodes import ExitCode

    try:
        launch = parse_launch_argv(list(argv))
    except ArgvError as error:
        log_error(f"la-trainer: bad command line: {error}", ascii_only=True)
        return int(ExitCode.USAGE)
    mode = launch.mode
    if isinstance(mode, SocketArgs) and socket_hands_over(launch.trainer_module):
        return hand_over_early(launch.nne_cpu_path, argv, f"-m {launch.trainer_module}")
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
            log_error(
                "la-trainer: the engine went away before it posted the training config.", ascii_only=True
            )
            return int(ExitCode.PEER_GONE)
        if method != FLOW_MATCHING:
            return hand_over_early(launch.nne_cpu_path, argv, f"TrainerMethod is {method!r}")
    if missing:
        log_error(
            f"la-trainer: this run cannot train: the engine's Python ({sys.executable}) cannot load "
            f"{'; '.join(missing)}, which la-trainer needs for FlowMatching. Fix: run `la-trainer "
            "install-engine <Project>` again (it installs la-trainer's own dependencies for this Python; "
            "torch and numpy come from the engine's PythonMLPackages plugin: open the project in the editor "
            "once if they are missing). Other trainers (BehaviorCloning, PPO) are not affected.",
            ascii_only=True,
        )
        return int(ExitCode.USAGE)
    return None


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
            # settings (trainer.dropin.engine.engine_main)
            options = load_options(None, shared_dir=Path(mode.temp_directory))
        else:
            options = load_options(None)
        Timeouts.from_env(options.wait)
    except LaunchError as error:
        log_error(f"la-trainer: {error}", ascii_only=True)
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
    everything at hand the trainer does the same in its own link's place (:func:`trainer.dropin.engine.engine_main`),
    recording its status meanwhile.
    """
    from protocol.argv import SocketArgs, parse_launch_argv
    from protocol.errors import ArgvError
    from protocol.names import FLOW_MATCHING
    from trainer.dropin.handover import engine_train_py, socket_hands_over
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
        log_error(f"la-trainer: {listen_error_message(mode.host, mode.port, error)}", ascii_only=True)
        return int(ExitCode.USAGE)
    except GameGone as gone:
        log_error(f"la-trainer: {gone}.", ascii_only=True)
        return int(ExitCode.PEER_GONE)
    except KeyboardInterrupt:
        log_error("la-trainer: interrupted.", ascii_only=True)
        return int(ExitCode.INTERRUPTED)
    if read.method is None or read.method == FLOW_MATCHING:
        return read
    log(
        f"la-trainer: TrainerMethod is {read.method!r}: la-trainer trains only FlowMatching, so the session "
        f"is relayed to the engine's own trainer {target}",
        ascii_only=True,
    )
    return relay_hand_over(target, argv, read)
