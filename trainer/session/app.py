"""The process around a session: launch arguments → link → training story → exit code, signals, and
serving one game after another.

This is where exceptions become exit codes and messages (with :mod:`trainer.commands.cli` for its own
commands): every failure ends with one readable paragraph on stderr and a documented code (README, "Exit
codes"), and the status file records it. The engine's own entry, its ``train.py`` (which adds the
hand-over of other methods), is :func:`trainer.dropin.engine.engine_main`.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Protocol

from protocol.argv import LaunchArgs, SharedMemoryArgs, SocketArgs
from protocol.errors import ArgvError, ProtocolError
from trainer.errors import LaunchError, PeerGone, TrainerError, exit_code_for
from trainer.exitcodes import ExitCode
from trainer.settings.options import TrainerOptions
from trainer.settings.timeouts import Timeouts
from trainer.system.console import log, log_error, silence_output

if TYPE_CHECKING:
    # At run time the links (numpy, the transports) are imported only once argv and options are valid.
    from trainer.session.links import TrainerLink

__all__ = [
    "InterruptFlag",
    "error_paragraph",
    "open_link_for_launch",
    "record_failure",
    "run_with_link",
    "serve_sessions",
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
            log(f"la-trainer: {name} received: finishing the current step, saving and stopping.")

        previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)


def record_failure(
    task_dir: Path | None, options: TrainerOptions | None, paragraph: str, code: int, *, phase: str = "failed"
) -> None:
    """Status file: phase "failed" with the exit code, the message and the phase the run was in
    (``la-trainer watch``, and the only trace left when the engine's output pipe is gone). The last
    iteration and loss stay as the run left them. ``options`` None: they were refused (written anyway).
    ``phase``: another final phase (a server stopped while no game was connected: "stopped")."""
    if task_dir is None or (options is not None and not options.status_file):
        return
    from trainer.records.progress import STATUS_FILE_NAME, RunPhase, Status, read_status, write_status

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


def error_paragraph(error: BaseException) -> str:
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
    passthrough: tuple[type[BaseException], ...] = (),
) -> int:
    """Opens the link, runs the training story, always closes the link; returns the exit code.

    ``training(link, flag)`` replaces the default story (:func:`trainer.session.run.run_training` with this
    ``options``/``task_dir``/``timeouts``); :mod:`trainer.distributed` passes one that adds the rank
    hooks. ``timeouts``: the keep-alive period and the wait after Complete; None reads
    :meth:`Timeouts.from_env`, as the launchers do for the waits of the links they open.
    ``passthrough``: exceptions that are not the run's failure but the caller's decision (the drop-in's
    hand-over to the engine's own trainer, :class:`trainer.dropin.handover.HandOver`): the link is closed
    and they are raised on, unrecorded.
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
            from trainer.session.links import KeepAlive

            with KeepAlive(link, timeouts.ping_interval):
                from trainer.session.run import run_training
            if training is not None:
                return int(training(link, flag))
            result = run_training(link, options=options, task_dir=task_dir, interrupt=flag, timeouts=timeouts)
            return int(result)
    except KeyboardInterrupt:
        log_error("la-trainer: interrupted.")
        return int(ExitCode.INTERRUPTED)
    except BaseException as error:
        if isinstance(error, passthrough):
            raise  # not a failure: the caller's (the link is closed below)
        if isinstance(error, BrokenPipeError):
            # Sockets turn their EPIPE into PeerGone, so this one is our own stdout/stderr: the engine
            # that reads them (spec §1.1) is gone. Nothing can be printed any more.
            silence_output()
            error = PeerGone(
                "the engine closed the trainer's output pipe (stdout/stderr); the game went away"
            )
        paragraph = error_paragraph(error)
        code = int(exit_code_for(error))
        record_failure(task_dir, options, paragraph, code)
        log_error(paragraph)
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
        log_error(f"la-trainer: warning: cleanup failed: {error}")


class ServingLink(Protocol):
    """What :func:`serve_sessions` needs beyond :class:`~trainer.session.links.TrainerLink` (the attach-mode
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
    timeouts = timeouts if timeouts is not None else Timeouts.from_env(options.wait)
    emit = say or log
    flag = InterruptFlag()
    link: TrainerLink | None = None
    session = 0
    try:
        with flag.installed():
            link = open_link(flag)
            from trainer.session.links import KeepAlive

            with KeepAlive(link, timeouts.ping_interval):
                from trainer.session.run import run_training
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
                        record_failure(
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
                    paragraph = error_paragraph(error)
                    code = int(exit_code_for(error))
                    record_failure(task_dir, options, paragraph, code)
                    log_error(paragraph)
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
        log_error("la-trainer: interrupted.")
        return int(ExitCode.INTERRUPTED)
    except BaseException as error:
        if isinstance(error, BrokenPipeError):
            silence_output()
            error = PeerGone("the trainer's output pipe (stdout/stderr) was closed")
        paragraph = error_paragraph(error)
        log_error(paragraph)
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
    (:mod:`trainer.system.liveness`) and waits on it have no bound; otherwise (``la-trainer shm`` and
    ``socket``, attach mode) waits the game's liveness cannot be seen by are bounded by ``Timeouts.wait``.
    ``serve``: a link that serves session after session (:func:`serve_sessions`). ``accepted``: the
    game's socket connection and the bytes read from it, when the drop-in accepted it to read the config
    first (:mod:`trainer.dropin.relay`).
    """
    mode = args.mode
    if isinstance(mode, SharedMemoryArgs):
        from trainer.session.links import ShmTrainerLink

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
        from trainer.session.links import SocketTrainerLink
        from trainer.system.liveness import parent_watch

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
