"""The engine's ``train.py`` in one process: the engine's command line → the hand-over of runs la-trainer
does not train (:mod:`trainer.dropin.handover`) → the session (:func:`trainer.session.app.run_with_link`)
→ the exit code.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from protocol.argv import SharedMemoryArgs, SocketArgs, parse_launch_argv
from protocol.errors import ArgvError
from trainer.dropin.handover import (
    HandOver,
    engine_train_py,
    hand_over,
    keep_flow_matching,
    read_socket_config,
    socket_hands_over,
)
from trainer.errors import LaunchError
from trainer.exitcodes import ExitCode
from trainer.session.app import (
    InterruptFlag,
    error_paragraph,
    open_link_for_launch,
    record_failure,
    run_with_link,
)
from trainer.settings.environment import ENV_ENGINE_TRAIN_PY
from trainer.settings.options import load_options_traced
from trainer.settings.timeouts import Timeouts
from trainer.system.console import log, log_error, use_utf8_output

if TYPE_CHECKING:
    from trainer.session.links import TrainerLink

__all__ = ["engine_main"]


def engine_main(
    argv: Sequence[str],
    *,
    runner: Callable[..., int] | None = None,
    accepted: tuple[socket.socket, bytes] | None = None,
) -> int:
    """The engine's ``train.py`` (the drop-in, :mod:`trainer.dropin`): its command line, verbatim (spec
    §1.2-1.4).

    ``runner`` (default :func:`run_with_link`) is called as ``runner(open_link, options=, task_dir=)`` once
    the command line and options are valid; scale-out (:mod:`trainer.dropin.scale_out`) uses it on rank 0. ``accepted``:
    the game's socket connection, already accepted and its config read by the drop-in
    (:func:`trainer.dropin.socket_front`).
    """
    use_utf8_output()
    try:
        args = parse_launch_argv(list(argv))
    except ArgvError as error:
        log_error(error_paragraph(error))
        return int(ExitCode.USAGE)
    # Runs la-trainer does not train go to the engine's own train.py (trainer.dropin.handover): over a socket
    # decided from -m before anything is bound; over spawned shared memory from TrainerMethod, before the
    # config is acknowledged (in open_link below). Not under torchrun (runner): one script per rank there.
    spawned_shm = isinstance(args.mode, SharedMemoryArgs) and not args.mode.create_mem and runner is None
    target, no_target = (
        engine_train_py(args.nne_cpu_path, sys.argv[0])
        if spawned_shm or isinstance(args.mode, SocketArgs)
        else (None, "")
    )
    if isinstance(args.mode, SocketArgs) and runner is None and socket_hands_over(args.trainer_module):
        if target is None:
            paragraph = (
                f"la-trainer: -m {args.trainer_module} is not a flow-matching trainer and the engine's own "
                f"train.py was not found to hand the run to ({no_target}); set {ENV_ENGINE_TRAIN_PY} to it "
                "(docs/unreal-install.md, 'Other trainers')."
            )
            log_error(paragraph)
            return int(ExitCode.UNSUPPORTED)
        log(f"la-trainer: -m {args.trainer_module}: handing the run to the engine's own trainer {target}")
        return hand_over(target, list(argv))
    task_dir: Path | None
    if isinstance(args.mode, SharedMemoryArgs):
        task_dir = Path(args.mode.task_dir)
    else:
        # Socket mode has no task directory: each run gets <temp_directory>/<TaskName><N>, numbered as
        # the engine numbers its shared-memory runs (the engine passes its Intermediate/LearningCore as
        # temp dir), so runs never share a status file, snapshots or a run record.
        task_dir = None
        if args.mode.temp_directory:
            from trainer.records.runrecord import new_task_folder

            try:
                task_dir = new_task_folder(Path(args.mode.temp_directory), args.task_name)
            except OSError as error:
                log_error(
                    f"la-trainer: cannot create a task folder under {args.mode.temp_directory}: {error}"
                )
                return int(ExitCode.USAGE)
    try:
        # Settings: <IntermediatePath>/la-trainer.json for every run of the project (the task folder is
        # new for each run), then the task folder's own.
        loaded = load_options_traced(
            task_dir if task_dir is not None and task_dir.is_dir() else None,
            shared_dir=task_dir.parent if task_dir is not None else None,
        )
        options = loaded.options
        # Reads LA_TRAINER_TIMEOUT_SCALE: refused here too.
        timeouts = Timeouts.from_env(options.wait, config_wait=options.config_wait)
    except LaunchError as error:
        # Refused before the link opens (the game has sent nothing): the paragraph on stderr, which the
        # engine copies into its log, and in the status file for la-trainer watch.
        paragraph = error_paragraph(error)
        record_failure(task_dir if task_dir is not None and task_dir.is_dir() else None, None, paragraph, 2)
        log_error(paragraph)
        return int(ExitCode.USAGE)
    if loaded.settings_line():
        log(loaded.settings_line())

    # Over a socket with la-trainer's -m (the engine default included, spec §1.6) only the config tells
    # the methods apart: read it first and relay another method to the engine's script (trainer.dropin.handover).
    socket_front = isinstance(args.mode, SocketArgs) and runner is None and accepted is None and target
    status_dir = task_dir if options.status_file else None

    def open_link(flag: InterruptFlag) -> TrainerLink:
        taken = accepted
        if socket_front and isinstance(args.mode, SocketArgs) and target is not None:
            taken = read_socket_config(args.mode, status_dir, target, flag)
        link = open_link_for_launch(args, timeouts, interrupt=flag, engine_spawned=True, accepted=taken)
        if spawned_shm:
            keep_flow_matching(link, status_dir, target, no_target)
        return link

    if runner is not None:
        # Scale-out's rank 0 calls run_with_link itself, whose default reads the same Timeouts.from_env(wait).
        return runner(open_link, options=options, task_dir=task_dir)
    try:
        return run_with_link(
            open_link,
            options=options,
            task_dir=task_dir,
            timeouts=timeouts,
            passthrough=(HandOver,),
            option_sources=loaded.every_source(),
        )
    except HandOver as handover:
        log(f"la-trainer: {handover}")
        if handover.relay is not None:
            from trainer.dropin.relay import relay_hand_over

            return relay_hand_over(handover.target, list(argv), handover.relay)
        return hand_over(handover.target, list(argv))
