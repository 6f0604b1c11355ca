"""Runs la-trainer does not train go, untouched, to the engine's own ``train.py``.

The engine spawns one ``train.py`` for BehaviorCloning, PPO and FlowMatching; only ``TrainerMethod`` in the
trainer config tells them apart (spec §1.6, §11 item 3). Once the engine runs la-trainer in place of its
script (``la-trainer install-engine``, ``-LearningAgentsEnginePath``), its other trainers must keep working.
This module owns the hand-over: every decision to hand a run over and the hand-over itself; the
mechanisms it uses are the pinger (:mod:`trainer.dropin.pinger`), the socket relay
(:mod:`trainer.dropin.relay`) and, for a half install or scale-out, reading the method from the config
file (:mod:`trainer.dropin.method`).

* **Shared memory** (spawned): before torch is imported, the trainer waits for ConfigSignal and reads
  ``TrainerMethod`` without acknowledging (:func:`keep_flow_matching`, :meth:`trainer.session.links.ShmTrainerLink.peek_trainer_method`). For
  anything but FlowMatching it pings (the engine's wait clock restarts), unmaps the control block (the
  engine created it: never unlinked), removes the status file it had started, and runs the engine's
  ``train.py`` with the same interpreter and the identical argv. The script needs its own Python, torch and
  module before its first handshake, longer than the engine's 10 s on a loaded machine: a small pinger
  process (:mod:`trainer.dropin.pinger`, ``--handover``) keeps the engine's clock running until the script
  asks for a network itself (or the engine, the script or a bound is gone). POSIX: ``os.execve``, so the process id and the output pipe the engine holds stay the
  same. Windows has no exec that keeps the process (``os.execv`` starts a new one and ends this one, which
  the engine would see as a dead trainer): the script runs as our child with our output handles, and we
  return its exit code; the engine's Terminate ends the whole tree. The engine does not wait for the
  config acknowledgement (spec §2.4), so the original sees the session as from its start.
* **Socket**: the engine connects once, right after spawning us, and the method arrives only inside the
  config on that connection. A ``-m`` that is neither the engine's default
  (``learning_core.train_behavior_cloning``, which flow-matching call sites send too, spec §1.6) nor the
  flow-matching one is handed over before anything is opened. For those two the drop-in accepts the
  connection and reads the config first (:mod:`trainer.dropin.relay`): another method is relayed to the
  engine's script (which cannot adopt our connection: it runs as our child on a loopback port, and we copy
  the bytes both ways); FlowMatching stays with la-trainer's link, which adopts the connection. Where that
  cannot happen (no engine script found, a scale-out job, ``la-trainer socket``) a config that is not
  FlowMatching fails fast, naming the method and what to do (:func:`trainer.session.run.socket_refusal`).

Where the engine's ``train.py`` is: ``LA_TRAINER_ENGINE_TRAIN_PY`` (the install-engine shim sets it from
its record), else beside the NNE plugin the engine names with ``--nne-cpu-path``
(``<EngineDir>/Plugins/Experimental/NNERuntimeBasicCpu/Content/Python`` ->
``<EngineDir>/Plugins/Experimental/LearningCore/Content/Python/train.py``; the engine discovers that path
from the plugin itself, so it points at the real engine even under ``-LearningAgentsEnginePath``). A target
that is la-trainer itself (a copy of the drop-in over the engine's file, recognised by
:data:`DROPIN_MARKER`) or a second hand-over in a row (:data:`ENV_HANDED_OVER`) is never run: the run is
refused with exit code 7 instead of looping.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from protocol.names import ENGINE_DEFAULT_MODULE, FLOW_MATCHING, FLOW_MATCHING_MODULE
from trainer.errors import LaunchError, PeerGone, TrainerError, Unsupported
from trainer.exitcodes import ExitCode
from trainer.settings.environment import ENV_ENGINE_TRAIN_PY, ENV_HANDED_OVER
from trainer.system.console import log, log_error

if TYPE_CHECKING:
    from protocol.argv import SocketArgs
    from trainer.dropin.relay import ConfigRead
    from trainer.session.app import InterruptFlag
    from trainer.session.links import TrainerLink

__all__ = [
    "DROPIN_MARKER",
    "HandOver",
    "cannot_hand_over",
    "engine_train_py",
    "hand_over",
    "hand_over_early",
    "is_la_trainer_script",
    "keep_flow_matching",
    "read_socket_config",
    "socket_hands_over",
]

DROPIN_MARKER = "la-trainer drop-in for the engine's train.py"
"""Text in every ``train.py`` la-trainer ships or writes (the packaged drop-in, ``scripts/train.py``, the
install-engine shim): such a file is never taken for the engine's original."""

_NNE_SUFFIX = ("Plugins", "Experimental", "NNERuntimeBasicCpu", "Content", "Python")
_ENGINE_SCRIPT = ("Plugins", "Experimental", "LearningCore", "Content", "Python", "train.py")
_MARKER_SCAN_BYTES = 65536


class HandOver(TrainerError):
    """Raised before anything was acknowledged: the run belongs to the engine's own ``train.py``."""

    exit_code = ExitCode.UNSUPPORTED

    def __init__(self, method: str, target: Path, *, relay: ConfigRead | None = None) -> None:
        super().__init__(goes_to(f"TrainerMethod is {method!r}", target))
        self.method = method
        self.target = target
        self.relay = relay
        """A socket session (its connection and the bytes read): relayed to the script, not exec'd."""


def is_la_trainer_script(path: Path) -> bool:
    """True when ``path`` is one of our own ``train.py`` files (it carries :data:`DROPIN_MARKER`)."""
    try:
        with open(path, "rb") as handle:
            return DROPIN_MARKER.encode() in handle.read(_MARKER_SCAN_BYTES)
    except OSError:
        return False


def engine_train_py(
    nne_cpu_path: str | None, own_script: str | os.PathLike[str], environ: Mapping[str, str] | None = None
) -> tuple[Path | None, str]:
    """The engine's original ``train.py`` and an empty string, or None and why there is none."""
    env = os.environ if environ is None else environ
    if env.get(ENV_HANDED_OVER):
        return None, f"{ENV_HANDED_OVER} is set: this process was itself started by a hand-over"
    candidates: list[Path] = []
    explicit = env.get(ENV_ENGINE_TRAIN_PY, "")
    if explicit:
        candidates.append(Path(explicit))
    if nne_cpu_path:
        nne = Path(nne_cpu_path)
        if len(nne.parts) > len(_NNE_SUFFIX) and nne.parts[-len(_NNE_SUFFIX) :] == _NNE_SUFFIX:
            candidates.append(nne.parents[len(_NNE_SUFFIX) - 1].joinpath(*_ENGINE_SCRIPT))
    if not candidates:
        return None, f"no --nne-cpu-path from the engine and {ENV_ENGINE_TRAIN_PY} is not set"
    why = []
    own = Path(own_script)
    for candidate in candidates:
        if not candidate.is_file():
            why.append(f"{candidate} does not exist")
        elif is_la_trainer_script(candidate) or (own.exists() and _same_file(candidate, own)):
            why.append(f"{candidate} is la-trainer itself, not the engine's script")
        else:
            return candidate, ""
    return None, "; ".join(why)


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def socket_hands_over(trainer_module: str | None) -> bool:
    """Socket mode: whether ``-m`` names a trainer that is not ours (decided before we bind)."""
    module = (trainer_module or "").strip()
    return module not in ("", ENGINE_DEFAULT_MODULE, FLOW_MATCHING_MODULE)


def _handover_pinger(argv: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[bytes] | None:
    """The hand-over pinger for a spawned shared-memory ``argv`` (None otherwise, or when it cannot run)."""
    try:
        from trainer.dropin.pinger import start_pinger
    except ImportError:  # pragma: no cover - a partial install: the hand-over goes on without it
        return None
    return start_pinger(argv, env, engine_pid=os.getppid())


def hand_over(target: Path, argv: Sequence[str], *, platform: str | None = None) -> int:
    """Run ``target`` with the engine's ``argv`` (verbatim) and this interpreter, in place of this process.

    POSIX: does not return (``os.execve``). Windows: returns the child's exit code.
    """
    command = [sys.executable, str(target), *argv]
    env = {**os.environ, ENV_HANDED_OVER: "1"}
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    # The engine's clock was reset once before we got here, but the script needs its own Python, torch
    # and module before its first handshake, which can take longer than the engine's 10 s: a pinger
    # keeps the clock running until the script has taken over (trainer.dropin.pinger, --handover).
    pinger = _handover_pinger(argv, env)
    if (platform or sys.platform) == "win32":
        # Our output handles, explicitly: the child writes into the pipe the engine reads.
        try:
            return subprocess.call(command, env=env, stdin=subprocess.DEVNULL, stdout=1, stderr=2)
        finally:
            if pinger is not None:
                pinger.kill()
    # POSIX: the pinger stays our child across the exec; it ends by itself once the script took over or
    # when this process (then the script) is gone.
    os.execve(sys.executable, command, env)
    raise AssertionError("os.execve returned")  # pragma: no cover


def goes_to(why: str, target: Path) -> str:
    """The sentence that announces a hand-over: ``why`` the run is not ours, and where it goes."""
    return f"{why}: la-trainer trains only FlowMatching, so the run goes to the engine's own trainer {target}"


def cannot_hand_over(why: str, no_target: str) -> str:
    """The sentence for a run that is not ours with no engine script to hand it to (exit code 7): ``why``,
    ``no_target`` (why no script was found, :func:`engine_train_py`) and the fix."""
    return (
        f"{why}: la-trainer trains only FlowMatching and cannot hand this run to the engine's own train.py "
        f"({no_target}). Set {ENV_ENGINE_TRAIN_PY} to the engine's Plugins/Experimental/LearningCore/Content/"
        "Python/train.py (docs/unreal-install.md, 'Other trainers')."
    )


def hand_over_early(nne_cpu_path: str | None, argv: Sequence[str], why: str) -> int:
    """The drop-in's hand-over, decided before the trainer proper runs (a half install, scale-out): the run
    goes to the engine's own ``train.py`` (:func:`hand_over`), or exit 7 with the reason when there is
    none to hand it to."""
    target, no_target = engine_train_py(nne_cpu_path, sys.argv[0])
    if target is None:
        log_error(f"la-trainer: {cannot_hand_over(why, no_target)}", ascii_only=True)
        return int(ExitCode.UNSUPPORTED)
    log(f"la-trainer: {goes_to(why, target)}", ascii_only=True)
    return hand_over(target, list(argv))


def read_socket_config(
    mode: SocketArgs, task_dir: Path | None, target: Path, flag: InterruptFlag
) -> tuple[socket.socket, bytes]:
    """Socket: accept the game's connection and read its config (before torch is imported), recording
    "waiting for config" meanwhile; FlowMatching gives the connection and the bytes read to the link,
    anything else raises :class:`HandOver` carrying the session to relay (:mod:`trainer.dropin.relay`)."""
    from trainer.dropin.relay import GameGone, listen_error_message, read_game_config
    from trainer.records.progress import STATUS_FILE_NAME, ProgressReporter, RunPhase
    from trainer.system.liveness import parent_watch

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
    _forget_status(status_path)
    raise HandOver(read.method, target, relay=read)


def keep_flow_matching(link: TrainerLink, task_dir: Path | None, target: Path | None, no_target: str) -> None:
    """Spawned shared memory: wait for the config and read its TrainerMethod without acknowledging it
    (before torch is imported); anything but FlowMatching raises :class:`HandOver` (or, with no engine
    script to hand over to, :class:`Unsupported`) after closing the link. Closes the link on any error."""
    from trainer.records.progress import STATUS_FILE_NAME, ProgressReporter, RunPhase
    from trainer.session.links import ShmTrainerLink

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
            raise Unsupported(cannot_hand_over(f"TrainerMethod is {method!r}", no_target))
        link.ping()  # the engine's wait clock restarts: the engine's script starts from a fresh timeout
    except BaseException:
        link.close()
        raise
    link.close()  # unmap only: the engine created the control block
    _forget_status(status_path)
    raise HandOver(method, target)


def _forget_status(status_path: Path | None) -> None:
    """The status said "waiting for config" for a run that is now the engine's script's: left behind,
    la-trainer watch would follow a run that never trains here (and call it stale, then dead)."""
    if status_path is not None:
        with contextlib.suppress(OSError):
            status_path.unlink()
