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
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from protocol.argv import LaunchArgs, SharedMemoryArgs, SocketArgs
from protocol.errors import ArgvError, ProtocolError
from trainer.errors import Interrupted, InterruptedAgain, LaunchError, PeerGone, TrainerError, exit_code_for
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
    """Set by SIGINT/SIGTERM/SIGHUP; the training loop polls it like the engine's Stop signal.

    One rule for every run, served or not (README "Exit codes"):

    * The first signal asks for a clean stop: finish the step, save, send, Complete; exit 8. SIGHUP (the
      terminal closed) is SIGTERM's twin. While no game is connected there is nothing to save: the
      trainer stops, exit 0 (``no_game``, set once the link is open).
    * A repeated SIGTERM/SIGHUP changes nothing (the stop is under way).
    * A second SIGINT before the state is saved is held until the save is over (:meth:`save_ended`),
      then the trainer stops at once without sending: exit 8, the state is saved. A third SIGINT (a stuck
      process) stops it at once: exit 13 (NOT_SAVED) when the save had not ended, so that 8 always means
      "saved". A second SIGINT after the save stops it at once, exit 8.
    * Once the run has ended after a signal, further signals are ignored while the process exits: its
      state is saved, and a late SIGTERM must not turn exit 8 into a kill (143).
    """

    def __init__(self) -> None:
        self._event = threading.Event()
        self.signal_name = ""
        self.no_game: Callable[[], bool] = lambda: False
        """True while no game is connected (set once the link is open, :func:`_no_game`): a signal then
        has no step to finish and nothing to save, and its line says so."""
        self.state_saved = False
        """This run's final save ended with its state on disk (:meth:`save_ended`); a server clears it
        for each session."""
        self._held = False
        """A second SIGINT waits for the save (:meth:`save_ended`)."""
        self._signalled = False
        self._repeat_said = False

    def is_set(self) -> bool:
        return self._event.is_set()

    def set(self, name: str = "request") -> None:
        self.signal_name = name
        self._event.set()

    def save_ended(self, saved: bool) -> None:
        """The story's final save (snapshot and checkpoint) is over; ``saved``: the state is on disk. A
        second SIGINT held for it stops the trainer now (:class:`trainer.errors.InterruptedAgain`)."""
        self.state_saved = saved
        if self._held:
            self._held = False
            log("la-trainer: the state is saved; stopping now, as the second Ctrl-C asked, without sending.")
            raise InterruptedAgain(saved=saved)

    @contextmanager
    def installed(self) -> Iterator[InterruptFlag]:
        if threading.current_thread() is not threading.main_thread():
            yield self
            return

        def handler(signum: int, frame: FrameType | None) -> None:
            name = signal.Signals(signum).name
            # A handler's exception surfaces wherever the main thread happens to be: only a repeated
            # SIGINT raises, and only where the rules above say the trainer stops at once.
            if not self.is_set():
                self._signalled = True
                self.set(name)
                if self.no_game():
                    log(f"la-trainer: {name} received while no game is connected: stopping.")
                else:
                    log(f"la-trainer: {name} received: finishing the current step, saving and stopping.")
                return
            if signum != signal.SIGINT:
                if not self._repeat_said:  # once: a supervisor may send a storm of them
                    self._repeat_said = True
                    log(f"la-trainer: {name} received again: the trainer is already stopping.")
                return
            if self.state_saved or self._held or self.no_game():
                raise InterruptedAgain(saved=self.state_saved)
            self._held = True
            log(
                "la-trainer: SIGINT again: stopping as soon as the state is saved (seconds); Ctrl-C once more "
                "stops at once, without saving it."
            )

        previous = {sig: signal.signal(sig, handler) for sig in _STOP_SIGNALS}
        try:
            yield self
        finally:
            for sig, old in previous.items():
                # After a signal the process is on its way out with its state saved: a late signal must
                # not kill it (143) before it exits with its code, nor interrupt its cleanup.
                signal.signal(sig, signal.SIG_IGN if self._signalled else old)


_STOP_SIGNALS: tuple[signal.Signals, ...] = tuple(
    sig for sig in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if sig is not None
)
"""SIGINT (Ctrl-C), SIGTERM (docker stop, systemd, kill) and, where it exists, SIGHUP (the terminal or
SSH session closed), all a request to stop cleanly."""


def _no_game(link: TrainerLink) -> Callable[[], bool]:
    """Whether no game is connected to ``link`` yet: a link that waits for games (:class:`ServingLink`:
    attach-mode shared memory, the socket) before one came in; never for the others (offline, spawned)."""
    if isinstance(link, ServingLink):
        return lambda: not link.in_session
    return lambda: False


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
    option_sources: Mapping[str, str] | None = None,
    task_name: str | None = None,
) -> int:
    """Opens the link, runs the training story, always closes the link; returns the exit code.

    ``option_sources`` (where each option came from, for the run record) and ``task_name`` (the run name's
    first part): as :func:`trainer.session.run.run_training` takes them.

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
            flag.no_game = _no_game(link)
            from trainer.session.links import KeepAlive

            with KeepAlive(link, timeouts.ping_interval):
                from trainer.session.run import run_training
            if training is not None:
                return int(training(link, flag))
            result = run_training(
                link,
                options=options,
                task_dir=task_dir,
                interrupt=flag,
                timeouts=timeouts,
                option_sources=option_sources,
                task_name=task_name,
            )
            return int(result)
    except KeyboardInterrupt as error:
        if flag.no_game():
            return _stopped_without_a_game(flag, task_dir, options)
        return _interrupted_again(error, task_dir, options)
    except BaseException as error:
        if isinstance(error, passthrough):
            raise  # not a failure: the caller's (the link is closed below)
        if isinstance(error, Interrupted) and flag.no_game():
            # Stopped while it waited for a game, as a server stopped between games: nothing was trained,
            # so there is nothing to save and nothing interrupted (exit 0, README "Exit codes").
            return _stopped_without_a_game(flag, task_dir, options)
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


def _stopped_without_a_game(flag: InterruptFlag, task_dir: Path | None, options: TrainerOptions) -> int:
    """A signal while no game was connected: nothing to save, exit 0, the status file says "stopped"."""
    line = (
        f"la-trainer: {flag.signal_name or 'a signal'} stopped the trainer while no game was connected; "
        "nothing to save."
    )
    record_failure(task_dir, options, line, int(ExitCode.OK), phase="stopped")
    log(line)
    return int(ExitCode.OK)


def _interrupted_again(error: KeyboardInterrupt, task_dir: Path | None, options: TrainerOptions) -> int:
    """A repeated Ctrl-C ended the run (:class:`InterruptFlag`): exit 8 when the state was saved, 13
    (NOT_SAVED) when it was not, with the status file saying which."""
    if not isinstance(error, InterruptedAgain):  # not our handler's (a default one, a relay's)
        log_error("la-trainer: interrupted.")
        return int(ExitCode.INTERRUPTED)
    code = int(exit_code_for(error))
    if code == ExitCode.INTERRUPTED:
        line = "la-trainer: interrupted; the state was saved (--resume continues from it)."
        phase = "interrupted"
    else:
        line = (
            "la-trainer: interrupted again before the state was saved: this run's last steps are not in "
            "its checkpoint (--resume continues from the one before, if any)."
        )
        phase = "failed"
    record_failure(task_dir, options, line, code, phase=phase)
    log_error(line)
    return code


def _close_link(link: TrainerLink | None) -> None:
    """Closes a run's link on the way out: a failure to clean up is a warning, never the run's outcome
    (which is already decided by then)."""
    if link is None:
        return
    try:
        link.close()
    except Exception as error:
        log_error(f"la-trainer: warning: cleanup failed: {error}")


@runtime_checkable
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
    option_sources: Mapping[str, str] | None = None,
    task_name: str | None = None,
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
    task_dir: Path | None = None
    try:
        with flag.installed():
            link = open_link(flag)
            flag.no_game = _no_game(link)
            from trainer.session.links import KeepAlive

            with KeepAlive(link, timeouts.ping_interval):
                from trainer.session.run import run_training
            while True:
                task_dir = None
                serving: ServingLink = link  # type: ignore[assignment]
                flag.state_saved = False  # this session's state: not saved yet
                try:
                    if config_first:
                        link.receive_config()  # kept by the link: run_training's call returns it
                    task_dir = task_dir_for(session)
                    code = int(
                        run_training(
                            link,
                            options=options,
                            task_dir=task_dir,
                            interrupt=flag,
                            timeouts=timeouts,
                            option_sources=option_sources,
                            task_name=task_name,
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
    except KeyboardInterrupt as error:
        if flag.no_game():
            emit(
                f"la-trainer: {flag.signal_name or 'signal'} received while no game was connected: server stopped."
            )
            return int(ExitCode.OK)
        return _interrupted_again(error, task_dir, options)
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
