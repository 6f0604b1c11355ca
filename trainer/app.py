"""Process-level entry points: engine argv → link → training loop → exit code.

This is the only place (with :mod:`trainer.cli`) that turns exceptions into exit codes and messages.
Every failure ends with one readable paragraph on stderr and a documented code (README, "Exit codes").
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Protocol, TextIO

from protocol.argv import LaunchArgs, SharedMemoryArgs, SocketArgs, parse_launch_argv
from protocol.errors import ArgvError, ProtocolError
from trainer.errors import LaunchError, PeerGone, TrainerError, Unsupported, exit_code_for
from trainer.exitcodes import ExitCode
from trainer.handover import (
    ENV_ENGINE_TRAIN_PY,
    FLOW_MATCHING,
    HandOver,
    engine_train_py,
    hand_over,
    socket_hands_over,
)
from trainer.options import TrainerOptions, load_options
from trainer.timeouts import Timeouts

if TYPE_CHECKING:
    # At run time the links (numpy, the transports) are imported only once argv and options are valid.
    from trainer.links import TrainerLink

__all__ = [
    "InterruptFlag",
    "engine_main",
    "open_link_for_launch",
    "run_with_link",
    "serve_sessions",
    "use_utf8_output",
]


class InterruptFlag:
    """Set by SIGINT/SIGTERM; the training loop polls it like the engine's Stop signal.

    The first signal asks for a clean stop (finish the step, save, send, Complete); a second SIGINT
    raises KeyboardInterrupt so a stuck process can still be killed from a terminal.
    """

    def __init__(self) -> None:
        self._event = threading.Event()
        self.signal_name = ""

    def is_set(self) -> bool:
        return self._event.is_set()

    def set(self, name: str = "request") -> None:
        self.signal_name = name
        self._event.set()

    @contextmanager
    def installed(self) -> Iterator[InterruptFlag]:
        if threading.current_thread() is not threading.main_thread():
            yield self
            return

        def handler(signum: int, frame: FrameType | None) -> None:
            name = signal.Signals(signum).name
            if self.is_set() and signum == signal.SIGINT:
                raise KeyboardInterrupt
            self.set(name)
            # A handler's exception would surface wherever the main thread happens to be: never raise.
            _emit(
                f"la-trainer: {name} received: finishing the current step, saving and stopping.", sys.stdout
            )

        previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)


def use_utf8_output() -> None:
    """stdout and stderr in UTF-8 whatever the locale says; text that cannot be encoded is escaped, never
    raised.

    The engine reads the trainer's pipe and decodes it as UTF-8 (``FPlatformProcess::ReadPipe`` converts
    with ``FUTF8ToTCHAR``), while Python writes a Windows pipe in the ANSI code page (cp1252, spec §11
    item 7): a path outside cp1252 in a message raised UnicodeEncodeError there, which silenced every
    later line. Our own messages are ASCII (``tests/trainer/test_ascii_output.py``); this covers what
    they quote (paths, the game's JSON).
    """
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is None:
            continue  # replaced by a test harness or a null device: nothing to do
        try:
            reconfigure(encoding="utf-8", errors="backslashreplace")
        except (OSError, ValueError):
            pass  # a closed stream: _emit copes with that


def _silence_output() -> None:
    """Point stdout and stderr at the null device (their reader is gone; see :func:`_emit`)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            for fd in (1, 2):
                os.dup2(devnull, fd)
        finally:
            os.close(devnull)
    except OSError:
        pass


def _emit(text: str, stream: TextIO | None = None) -> None:
    """One flushed line on stderr (or ``stream``) that never raises.

    The engine reads our output through a pipe (spec §1.1). When the game dies, every write fails with
    EPIPE; then the output is sent to the null device so that neither this message nor the interpreter's
    final flush turns a documented exit code into a crash (exit 1 or 120).
    """
    try:
        print(text, file=stream if stream is not None else sys.stderr, flush=True)
    except (OSError, ValueError):
        _silence_output()


def _record_failure(
    task_dir: Path | None, options: TrainerOptions | None, paragraph: str, code: int, *, phase: str = "failed"
) -> None:
    """Status file: phase "failed" with the exit code, the message and the phase the run was in
    (``la-trainer watch``, and the only trace left when the engine's output pipe is gone). The last
    iteration and loss stay as the run left them. ``options`` None: they were refused (written anyway).
    ``phase``: another final phase (a server stopped while no game was connected: "stopped")."""
    if task_dir is None or (options is not None and not options.status_file):
        return
    from trainer.progress import STATUS_FILE_NAME, RunPhase, Status, read_status, write_status

    path = task_dir / STATUS_FILE_NAME
    try:
        previous = read_status(path)
    except (OSError, ValueError):
        previous = Status(phase=RunPhase.STARTING, started=time.time())
    try:
        write_status(
            path,
            dataclasses.replace(
                previous,
                phase=RunPhase(phase),
                exit_code=code,
                message=f"{paragraph} (phase: {previous.phase.value})",
                pid=os.getpid(),
                host=socket.gethostname(),
                updated=time.time(),
            ),
        )
    except (OSError, ValueError):
        pass  # a status file is a convenience


def _error_paragraph(error: BaseException) -> str:
    if isinstance(error, ArgvError):
        return f"la-trainer: bad command line: {error}"
    if isinstance(error, ProtocolError):
        return f"la-trainer: {type(error).__name__}: {error}"
    if isinstance(error, TrainerError):
        return f"la-trainer: {error}"
    return f"la-trainer: internal error {type(error).__name__}: {error}\n" + "".join(
        traceback.format_exception(type(error), error, error.__traceback__)
    )


def run_with_link(
    open_link: Callable[[InterruptFlag], TrainerLink],
    *,
    options: TrainerOptions,
    task_dir: Path | None,
    training: Callable[[TrainerLink, InterruptFlag], int] | None = None,
    timeouts: Timeouts | None = None,
) -> int:
    """Opens the link, runs the training story, always closes the link; returns the exit code.

    ``training(link, flag)`` replaces the default story (:func:`trainer.run.run_training` with this
    ``options``/``task_dir``/``timeouts``); :mod:`trainer.distributed` passes one that adds the rank
    hooks. ``timeouts``: the keep-alive period and the wait after Complete; None reads
    :meth:`Timeouts.from_env`, as the launchers do for the waits of the links they open.
    """
    timeouts = timeouts if timeouts is not None else Timeouts.from_env(options.wait)
    flag = InterruptFlag()
    link: TrainerLink | None = None
    try:
        with flag.installed():
            # Open the link (map the control block / listen on the port) BEFORE importing torch, and
            # ping while torch loads: the engine posts its config and starts its 10 s wait at once
            # (spec §2.4), and importing torch can take longer than that on a loaded machine.
            link = open_link(flag)
            from trainer.links import KeepAlive

            with KeepAlive(link, timeouts.ping_interval):
                from trainer.run import run_training
            if training is not None:
                return int(training(link, flag))
            result = run_training(link, options=options, task_dir=task_dir, interrupt=flag, timeouts=timeouts)
            return int(result)
    except KeyboardInterrupt:
        _emit("la-trainer: interrupted.")
        return int(ExitCode.INTERRUPTED)
    except HandOver:
        raise  # not a failure: engine_main runs the engine's own train.py (the link is closed below)
    except BaseException as error:
        if isinstance(error, BrokenPipeError):
            # Sockets turn their EPIPE into PeerGone, so this one is our own stdout/stderr: the engine
            # that reads them (spec §1.1) is gone. Nothing can be printed any more.
            _silence_output()
            error = PeerGone(
                "the engine closed the trainer's output pipe (stdout/stderr); the game went away"
            )
        paragraph = _error_paragraph(error)
        code = int(exit_code_for(error))
        _record_failure(task_dir, options, paragraph, code)
        _emit(paragraph)
        return code
    finally:
        _close_link(link)


def _close_link(link: TrainerLink | None) -> None:
    """Closes a run's link on the way out: a failure to clean up is a warning, never the run's outcome
    (which is already decided by then)."""
    if link is None:
        return
    try:
        link.close()
    except Exception as error:
        _emit(f"la-trainer: warning: cleanup failed: {error}")


class ServingLink(Protocol):
    """What :func:`serve_sessions` needs beyond :class:`~trainer.links.TrainerLink` (the attach-mode
    shared-memory link and the socket link)."""

    @property
    def in_session(self) -> bool:
        """A game has come in this session (before that, the link only waits for one)."""
        ...

    def next_session(self) -> None:
        """Forget the finished session and wait for the next game from the initial state."""
        ...


def serve_sessions(
    open_link: Callable[[InterruptFlag], TrainerLink],
    *,
    options: TrainerOptions,
    task_dir_for: Callable[[int], Path | None],
    timeouts: Timeouts | None = None,
    say: Callable[[str], None] | None = None,
    config_first: bool = False,
) -> int:
    """Serve one game session after another on one link (``la-trainer socket``, ``la-trainer shm --create
    --serve``): an editor restarted after a crash, or PIE started again, finds the trainer still there.

    ``task_dir_for(n)`` is session ``n``'s task folder (0 first; each session gets its own status and run
    record). A session that ends in any documented way (complete, stopped, diverged, the game gone or
    refused data) is logged with its exit code and the next one is awaited; the link is reset between
    them (``next_session``). It ends on SIGINT/SIGTERM, with exit code 0 when the signal came while no
    game was there and the interrupted session's code (8) otherwise, or on an error that is not a
    session's (a bug: exit 1, the port lost: exit 2). The link (and what it created) is always closed.
    ``config_first``: ``task_dir_for`` is called once the game's config is in (the socket server: a
    connection that sends none makes no folder, issue 30); the wait for it is the session's, as above.
    """
    from protocol.errors import ProtocolError

    timeouts = timeouts if timeouts is not None else Timeouts.from_env(options.wait)
    emit = say or (lambda line: _emit(line, sys.stdout))
    flag = InterruptFlag()
    link: TrainerLink | None = None
    session = 0
    try:
        with flag.installed():
            link = open_link(flag)
            from trainer.links import KeepAlive

            with KeepAlive(link, timeouts.ping_interval):
                from trainer.run import run_training
            while True:
                task_dir: Path | None = None
                serving: ServingLink = link  # type: ignore[assignment]
                try:
                    if config_first:
                        link.receive_config()  # kept by the link: run_training's call returns it
                    task_dir = task_dir_for(session)
                    code = int(
                        run_training(
                            link, options=options, task_dir=task_dir, interrupt=flag, timeouts=timeouts
                        )
                    )
                except (TrainerError, ProtocolError) as error:
                    if flag.is_set() and not serving.in_session:
                        _record_failure(
                            task_dir,
                            options,
                            f"la-trainer: {flag.signal_name or 'a signal'} stopped the server while no game was connected",
                            int(ExitCode.OK),
                            phase="stopped",
                        )
                        emit(
                            f"la-trainer: {flag.signal_name or 'signal'} received while no game was connected: server stopped."
                        )
                        return int(ExitCode.OK)
                    paragraph = _error_paragraph(error)
                    code = int(exit_code_for(error))
                    _record_failure(task_dir, options, paragraph, code)
                    _emit(paragraph)
                    if isinstance(error, LaunchError) and not serving.in_session:
                        return code  # the transport itself failed (the port, the block): not a session's end
                session += 1
                if flag.is_set():
                    return code
                emit(
                    f"la-trainer: session {session} ended with exit code {code}; serving the next game "
                    "(SIGINT/SIGTERM stop the server)."
                )
                serving.next_session()
    except KeyboardInterrupt:
        _emit("la-trainer: interrupted.")
        return int(ExitCode.INTERRUPTED)
    except BaseException as error:
        if isinstance(error, BrokenPipeError):
            _silence_output()
            error = PeerGone("the trainer's output pipe (stdout/stderr) was closed")
        paragraph = _error_paragraph(error)
        _emit(paragraph)
        return int(exit_code_for(error))
    finally:
        _close_link(link)


def open_link_for_launch(
    args: LaunchArgs,
    timeouts: Timeouts,
    config_dir: Path | None = None,
    interrupt: InterruptFlag | None = None,
    *,
    engine_spawned: bool = False,
    serve: bool = False,
    accepted: tuple[socket.socket, bytes] | None = None,
) -> TrainerLink:
    """The trainer link that the engine's launch arguments describe.

    ``engine_spawned``: the engine started this process (the drop-in ``train.py``), so it is watched
    (:mod:`trainer.transport.liveness`) and waits on it have no bound; otherwise (``la-trainer shm`` and
    ``socket``, attach mode) waits the game's liveness cannot be seen by are bounded by ``Timeouts.wait``.
    ``serve``: a link that serves session after session (:func:`serve_sessions`). ``accepted``: the
    game's socket connection and the bytes read from it, when the drop-in accepted it to read the config
    first (:mod:`trainer.dropin.relay`).
    """
    mode = args.mode
    if isinstance(mode, SharedMemoryArgs):
        from trainer.links import ShmTrainerLink

        if not mode.controls_guid:
            raise LaunchError(
                "SharedMemory mode needs the controls GUID: pass -g {GUID} (the engine passes it when it "
                "spawns the trainer; for -LearningAgentsUseExternalTrainingProcess choose one and add -c)."
            )
        task_dir = Path(mode.task_dir)
        if mode.make_task_dir:
            (task_dir / "Configs").mkdir(parents=True, exist_ok=True)
        elif not task_dir.is_dir():
            raise LaunchError(
                f"Task directory {task_dir} does not exist. The engine creates it before it spawns the trainer; "
                "when launching by hand add -d to create it."
            )
        return ShmTrainerLink(
            config_dir=config_dir or task_dir / "Configs",
            controls_guid=mode.controls_guid,
            create=mode.create_mem,
            timeouts=timeouts,
            watch_parent=engine_spawned and not mode.create_mem,
            interrupted=interrupt.is_set if interrupt is not None else None,
            serve=serve,
        )
    if isinstance(mode, SocketArgs):
        from trainer.links import SocketTrainerLink
        from trainer.transport.liveness import parent_watch

        return SocketTrainerLink(
            host=mode.host,
            port=mode.port,
            timeouts=timeouts,
            # The engine process shows that a game is there before it connects (EOF tells us only once a
            # connection exists), so even the wait for the connection needs no bound.
            peer_alive=parent_watch() if engine_spawned else None,
            interrupted=interrupt.is_set if interrupt is not None else None,
            serve=serve,
            accepted=accepted,
        )
    raise LaunchError(f"Unknown transport in the launch arguments: {mode!r}.")


def engine_main(
    argv: Sequence[str],
    *,
    runner: Callable[..., int] | None = None,
    accepted: tuple[socket.socket, bytes] | None = None,
) -> int:
    """The engine's ``train.py`` (the drop-in, :mod:`trainer.dropin`): its command line, verbatim (spec
    §1.2-1.4).

    ``runner`` (default :func:`run_with_link`) is called as ``runner(open_link, options=, task_dir=)`` once
    the command line and options are valid; :mod:`trainer.distributed` uses it on rank 0. ``accepted``:
    the game's socket connection, already accepted and its config read by the drop-in
    (:func:`trainer.dropin.socket_front`).
    """
    use_utf8_output()
    try:
        args = parse_launch_argv(list(argv))
    except ArgvError as error:
        print(_error_paragraph(error), file=sys.stderr, flush=True)
        return int(ExitCode.USAGE)
    # Runs la-trainer does not train go to the engine's own train.py (trainer.handover): over a socket
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
            print(paragraph, file=sys.stderr, flush=True)
            return int(ExitCode.UNSUPPORTED)
        _emit(
            f"la-trainer: -m {args.trainer_module}: handing the run to the engine's own trainer {target}",
            sys.stdout,
        )
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
            from trainer.runrecord import new_task_folder

            try:
                task_dir = new_task_folder(Path(args.mode.temp_directory), args.task_name)
            except OSError as error:
                print(
                    f"la-trainer: cannot create a task folder under {args.mode.temp_directory}: {error}",
                    file=sys.stderr,
                    flush=True,
                )
                return int(ExitCode.USAGE)
    try:
        # Settings: <IntermediatePath>/la-trainer.json for every run of the project (the task folder is
        # new for each run), then the task folder's own.
        options = load_options(
            task_dir if task_dir is not None and task_dir.is_dir() else None,
            shared_dir=task_dir.parent if task_dir is not None else None,
        )
        # Reads LA_TRAINER_TIMEOUT_SCALE: refused here too.
        timeouts = Timeouts.from_env(options.wait, config_wait=options.config_wait)
    except LaunchError as error:
        # Refused before the link opens (the game has sent nothing): the paragraph on stderr, which the
        # engine copies into its log, and in the status file for la-trainer watch.
        paragraph = _error_paragraph(error)
        _record_failure(task_dir if task_dir is not None and task_dir.is_dir() else None, None, paragraph, 2)
        print(paragraph, file=sys.stderr, flush=True)
        return int(ExitCode.USAGE)

    # Over a socket with la-trainer's -m (the engine default included, spec §1.6) only the config tells
    # the methods apart: read it first and relay another method to the engine's script (trainer.handover).
    socket_front = isinstance(args.mode, SocketArgs) and runner is None and accepted is None and target
    status_dir = task_dir if options.status_file else None

    def open_link(flag: InterruptFlag) -> TrainerLink:
        taken = accepted
        if socket_front and isinstance(args.mode, SocketArgs) and target is not None:
            taken = _read_socket_config(args.mode, status_dir, target, flag)
        link = open_link_for_launch(args, timeouts, interrupt=flag, engine_spawned=True, accepted=taken)
        if spawned_shm:
            _keep_flow_matching(link, status_dir, target, no_target)
        return link

    if runner is not None:
        # Scale-out's rank 0 calls run_with_link itself, whose default reads the same Timeouts.from_env(wait).
        return runner(open_link, options=options, task_dir=task_dir)
    try:
        return run_with_link(open_link, options=options, task_dir=task_dir, timeouts=timeouts)
    except HandOver as handover:
        _emit(f"la-trainer: {handover}", sys.stdout)
        if handover.relay is not None:
            from trainer.dropin.relay import relay_hand_over

            return relay_hand_over(handover.target, list(argv), handover.relay)
        return hand_over(handover.target, list(argv))


def _read_socket_config(
    mode: SocketArgs, task_dir: Path | None, target: Path, flag: InterruptFlag
) -> tuple[socket.socket, bytes]:
    """Socket: accept the game's connection and read its config (before torch is imported), recording
    "waiting for config" meanwhile; FlowMatching gives the connection and the bytes read to the link,
    anything else raises :class:`HandOver` carrying the session to relay (:mod:`trainer.dropin.relay`)."""
    from trainer.dropin.relay import GameGone, listen_error_message, read_game_config
    from trainer.progress import STATUS_FILE_NAME, ProgressReporter, RunPhase
    from trainer.transport.liveness import parent_watch

    status_path = task_dir / STATUS_FILE_NAME if task_dir is not None else None
    try:
        with ProgressReporter(0, status_path=status_path) as reporter:
            reporter.phase(RunPhase.WAITING_FOR_CONFIG)
            read = read_game_config(
                mode.host, mode.port, engine_alive=parent_watch(), interrupted=flag.is_set
            )
    except GameGone as gone:
        raise PeerGone(str(gone)) from None
    except OSError as error:
        raise LaunchError(listen_error_message(mode.host, mode.port, error)) from None
    if read.method is None or read.method == FLOW_MATCHING:
        return read.connection, read.received
    if status_path is not None:
        with contextlib.suppress(OSError):
            status_path.unlink()  # the run is the engine's script's (as in _keep_flow_matching)
    raise HandOver(read.method, target, relay=read)


def _keep_flow_matching(
    link: TrainerLink, task_dir: Path | None, target: Path | None, no_target: str
) -> None:
    """Spawned shared memory: wait for the config and read its TrainerMethod without acknowledging it
    (before torch is imported); anything but FlowMatching raises :class:`HandOver` (or, with no engine
    script to hand over to, :class:`Unsupported`) after closing the link. Closes the link on any error."""
    from trainer.links import ShmTrainerLink
    from trainer.progress import STATUS_FILE_NAME, ProgressReporter, RunPhase

    if not isinstance(link, ShmTrainerLink):
        return
    status_path = task_dir / STATUS_FILE_NAME if task_dir is not None else None
    try:
        # What run_training records first, from the start of the wait (la-trainer watch, the heartbeat).
        with ProgressReporter(0, status_path=status_path) as reporter:
            reporter.phase(RunPhase.WAITING_FOR_CONFIG)
            method = link.peek_trainer_method()
        if method == FLOW_MATCHING:
            return
        if target is None:
            raise Unsupported(
                f"TrainerMethod is {method!r}: la-trainer trains only FlowMatching and cannot hand this run to "
                f"the engine's own train.py ({no_target}). Set {ENV_ENGINE_TRAIN_PY} to the engine's "
                "Plugins/Experimental/LearningCore/Content/Python/train.py (docs/unreal-install.md, 'Other "
                "trainers')."
            )
        link.ping()  # the engine's wait clock restarts: the engine's script starts from a fresh timeout
    except BaseException:
        link.close()
        raise
    link.close()  # unmap only: the engine created the control block
    if status_path is not None:
        # The status said "waiting for config" for a run that is now the engine's script's: left behind,
        # la-trainer watch would follow a run that never trains here (and call it stale, then dead).
        with contextlib.suppress(OSError):
            status_path.unlink()
    raise HandOver(method, target)
