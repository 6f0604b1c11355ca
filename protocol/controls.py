"""The shared-memory control block: ten int32 and both halves of every handshake (spec §2.3, §2.4, §7.1).

Sans-IO: every function works on any writable buffer of at least :data:`CONTROL_BLOCK_BYTES` bytes (a
``bytearray`` in tests, a shared-memory ``memoryview`` in production). Each control is a little-endian int32
at byte offset ``4 * index``, read and written through one precompiled :class:`struct.Struct`.

Handshake rules (the table :data:`HANDSHAKES` below is the single source; the methods of
:class:`TrainerControls` and :class:`GameControls` execute its rows, so the code cannot drift from it):

* Data before signal. A writer stores the data controls (NetworkId, EpisodeNum, …) before the signal
  that publishes them; a reader looks at the signal first, then reads the data. Aligned int32 stores
  are atomic on every supported CPU. x86 (TSO) also keeps their order; ARM64 (Apple silicon) formally
  may not, and neither side issues a barrier ([INF]: the engine uses plain volatile int32, and Python
  cannot emit one). The gap between the two stores is a full interpreter step on our side, so the
  window is tiny but not provably zero; this follows the engine's own design.
* NetworkSignal changes meaning after the first experience (spec §7.1). Before it, the engine sits in
  ``SendNetwork``: NetworkSignal = 1 is the trainer *asking* for a network. After it, the engine sits in
  ``IterateTraining``: NetworkSignal = 1 is the trainer *delivering* one. The trainer tracker therefore
  allows ``request_network`` only before the first experience was seen and ``post_network`` only after:
  a network posted while the engine is still in ``SendNetwork`` would be read as a request and overwritten.
* Sent networks go in order 0, 1, …, N−1 within a round (the engine calls ``ReceiveNetwork(0)``, ``(1)``,
  ``(2)`` and asserts on a NetworkId mismatch), and Complete may only replace the *first* network of a
  round: a Completed answer to ``ReceiveNetwork(1)`` is an error for the engine (spec §7.1). When
  :class:`TrainerControls` is given ``network_num`` it enforces both.
* After any :class:`~protocol.errors.ControlError` the object refuses further use (as h11 does): the
  block's state is no longer known to follow the handshake.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import Final, TypeAlias

from protocol.errors import ControlError
from protocol.ints import INT32_MAX, INT32_MIN

__all__ = [
    "CONTROL_BLOCK_BYTES",
    "CONTROL_NUM",
    "HANDSHAKES",
    "INITIAL_CONTROLS",
    "Actor",
    "Control",
    "ControlBuffer",
    "ExperienceInfo",
    "GameControls",
    "Op",
    "Step",
    "TrainerControls",
    "init_controls",
    "read_controls",
]


class Control(IntEnum):
    """Index of each int32 in the control block (``EControls``; spec §2.3)."""

    EXPERIENCE_EPISODE_NUM = 0
    """Game: number of episodes in the experience just posted."""
    EXPERIENCE_STEP_NUM = 1
    """Game: number of steps in the experience just posted."""
    EXPERIENCE_SIGNAL = 2
    """Game sets 1 when experience is ready; the trainer clears it to 0 once it has copied it."""
    CONFIG_SIGNAL = 3
    """Game sets 1 once the config files are written; the trainer clears it after reading them."""
    NETWORK_SIGNAL = 4
    """Two-way network hand-off: request/deliver (see the module docstring)."""
    COMPLETE_SIGNAL = 5
    """Trainer sets 1 when training is finished; the game clears it."""
    STOP_SIGNAL = 6
    """Game sets 1 to ask the trainer to stop; the trainer clears it and exits."""
    PING_SIGNAL = 7
    """Trainer sets 1 as a keep-alive; a waiting game clears it and resets its timeout clock."""
    NETWORK_ID = 8
    """Id of the network being handed over; −1 when idle."""
    REPLAY_BUFFER_ID = 9
    """Id of the replay buffer just posted; −1 when idle."""


CONTROL_NUM: Final = 10
"""``GetControlNum()``: int32 controls in the block (one row since 5.6)."""
CONTROL_BLOCK_BYTES: Final = 4 * CONTROL_NUM
"""Size of the block in bytes (POSIX rounds the region up to a page; only these 40 bytes are used)."""
INITIAL_CONTROLS: Final = (0, 0, 0, 0, 0, 0, 0, 0, -1, -1)
"""The state the engine writes before use in both modes: all 0, NetworkId = ReplayBufferId = −1."""

_INT32: Final = struct.Struct("<i")
_BLOCK: Final = struct.Struct(f"<{CONTROL_NUM}i")

ControlBuffer: TypeAlias = bytearray | memoryview
"""A writable buffer holding the block: a bytearray in tests, a memoryview of the mapped region in production."""


def _check_buffer(buf: object) -> None:
    if not isinstance(buf, bytearray | memoryview):
        raise ControlError(
            "the control block must be a writable bytearray or memoryview",
            field="buf",
            actual=type(buf).__name__,
        )
    view = memoryview(buf)
    if view.readonly:
        raise ControlError("the control block buffer is read-only", field="buf")
    if view.nbytes < CONTROL_BLOCK_BYTES:
        raise ControlError(
            f"the control block needs {CONTROL_BLOCK_BYTES} bytes ({CONTROL_NUM} int32)",
            field="buf",
            expected=CONTROL_BLOCK_BYTES,
            actual=view.nbytes,
        )


def init_controls(buf: ControlBuffer) -> None:
    """Write :data:`INITIAL_CONTROLS` (what the engine does before every session, spawned or attached)."""
    _check_buffer(buf)
    _BLOCK.pack_into(buf, 0, *INITIAL_CONTROLS)


def read_controls(buf: ControlBuffer) -> tuple[int, ...]:
    """All ten controls, index order (a snapshot for logs and tests; not one atomic read)."""
    _check_buffer(buf)
    return _BLOCK.unpack_from(buf, 0)


# ---------------------------------------------------------------------------------------------------------
# The handshakes as data (spec §2.4). Each row is one step; ``method`` names the method of the acting side
# that executes it. Symbolic values: "i" network id, "E" episodes, "S" steps, "r" replay buffer id.


class Actor(Enum):
    """Who performs a step."""

    GAME = "game"
    TRAINER = "trainer"


class Op(Enum):
    """What a step does with its control."""

    WRITE = "write"
    """Store the value."""
    WAIT = "wait"
    """Poll until the control equals the value (a method returns False/None while it does not)."""
    CHECK = "check"
    """Once the waits hold: the control must equal the value, else ControlError (the engine asserts)."""
    READ = "read"
    """Once the waits hold: read the control into the named variable."""


@dataclass(frozen=True, slots=True)
class Step:
    """One step of a handshake."""

    actor: Actor
    method: str
    op: Op
    control: Control
    value: int | str
    """A literal int32, or the name of a variable supplied by (WRITE/CHECK) or returned to (READ) the caller."""
    note: str = ""


_G, _T = Actor.GAME, Actor.TRAINER
_C = Control

HANDSHAKES: Final[Mapping[str, tuple[Step, ...]]] = {
    # The engine writes shared-memory-<GUID>.json, data-config.json and trainer-config.json first.
    "config": (
        Step(_G, "post_config", Op.WRITE, _C.CONFIG_SIGNAL, 1, "after writing the three config files"),
        Step(_T, "config_ready", Op.WAIT, _C.CONFIG_SIGNAL, 1),
        Step(
            _T, "ack_config", Op.WRITE, _C.CONFIG_SIGNAL, 0, "after reading the files; the game never waits"
        ),
    ),
    # Engine SendNetwork(i): initial weights, engine → trainer; the trainer asks first.
    "request_network": (
        Step(_T, "request_network", Op.WRITE, _C.NETWORK_SIGNAL, 1),
        Step(_G, "network_requested", Op.WAIT, _C.NETWORK_SIGNAL, 1),
        Step(_G, "post_network", Op.WRITE, _C.NETWORK_ID, "i", "after copying the snapshot into region i"),
        Step(_G, "post_network", Op.WRITE, _C.NETWORK_SIGNAL, 0),
        Step(_T, "network_received", Op.WAIT, _C.NETWORK_SIGNAL, 0),
        Step(_T, "network_received", Op.CHECK, _C.NETWORK_ID, "i", "then read region i"),
    ),
    # Engine SendExperience: it waits for the signal to be clear, never for the trainer to consume (§10.9).
    "experience": (
        Step(_G, "can_post_experience", Op.WAIT, _C.EXPERIENCE_SIGNAL, 0),
        Step(_G, "post_experience", Op.WRITE, _C.EXPERIENCE_EPISODE_NUM, "E", "after filling the regions"),
        Step(_G, "post_experience", Op.WRITE, _C.EXPERIENCE_STEP_NUM, "S"),
        Step(_G, "post_experience", Op.WRITE, _C.REPLAY_BUFFER_ID, "r"),
        Step(_G, "post_experience", Op.WRITE, _C.EXPERIENCE_SIGNAL, 1),
        Step(_T, "experience_ready", Op.WAIT, _C.EXPERIENCE_SIGNAL, 1),
        Step(_T, "experience_ready", Op.READ, _C.EXPERIENCE_EPISODE_NUM, "E"),
        Step(_T, "experience_ready", Op.READ, _C.EXPERIENCE_STEP_NUM, "S"),
        Step(_T, "experience_ready", Op.READ, _C.REPLAY_BUFFER_ID, "r"),
        Step(_T, "ack_experience", Op.WRITE, _C.EXPERIENCE_SIGNAL, 0, "after copying the arrays out"),
    ),
    # Engine ReceiveNetwork(i): updated weights, trainer → engine.
    "send_network": (
        Step(_T, "can_send_network", Op.WAIT, _C.NETWORK_SIGNAL, 0),
        Step(
            _T, "post_network", Op.WRITE, _C.NETWORK_ID, "i", "after writing the full snapshot into region i"
        ),
        Step(_T, "post_network", Op.WRITE, _C.NETWORK_SIGNAL, 1),
        Step(_G, "network_ready", Op.WAIT, _C.NETWORK_SIGNAL, 1, "the engine tests CompleteSignal as well"),
        Step(_G, "network_ready", Op.CHECK, _C.NETWORK_ID, "i", "the engine asserts on a mismatch"),
        Step(_G, "release_network", Op.WRITE, _C.NETWORK_ID, -1, "after loading region i"),
        Step(_G, "release_network", Op.WRITE, _C.NETWORK_SIGNAL, 0),
    ),
    "complete": (
        Step(_T, "post_complete", Op.WRITE, _C.COMPLETE_SIGNAL, 1, "in place of the next round's network 0"),
        Step(_G, "take_completed", Op.WAIT, _C.COMPLETE_SIGNAL, 1),
        Step(_G, "take_completed", Op.WRITE, _C.COMPLETE_SIGNAL, 0),
    ),
    # Engine EndTraining: it does not wait.
    "stop": (
        Step(_G, "post_stop", Op.WRITE, _C.STOP_SIGNAL, 1),
        Step(_T, "stop_requested", Op.WAIT, _C.STOP_SIGNAL, 1),
        Step(_T, "clear_stop", Op.WRITE, _C.STOP_SIGNAL, 0, "then exit"),
    ),
    # Keep-alive: only a waiting engine looks (SendNetwork, SendExperience, ReceiveNetwork).
    "ping": (
        Step(_T, "ping", Op.WRITE, _C.PING_SIGNAL, 1),
        Step(_G, "take_ping", Op.WAIT, _C.PING_SIGNAL, 1),
        Step(_G, "take_ping", Op.WRITE, _C.PING_SIGNAL, 0, "and reset the timeout clock"),
    ),
}
"""Every handshake, steps in order (spec §2.4). Methods below run the rows tagged with their name."""


@dataclass(frozen=True, slots=True)
class ExperienceInfo:
    """What the controls say about a posted experience; the arrays are in the replay-buffer regions."""

    episode_num: int
    """E: episodes posted (first E entries of EpisodeStarts/EpisodeLengths are valid)."""
    step_num: int
    """S: steps posted (first S rows of each per-step array are valid)."""
    replay_buffer_id: int
    """Which replay buffer's regions hold the data."""


class _Half:
    """Runs the rows of :data:`HANDSHAKES` for one actor on one buffer."""

    _actor: Actor

    def __init__(self, buf: ControlBuffer) -> None:
        _check_buffer(buf)
        self._buf = buf
        self._failed: ControlError | None = None

    # -- raw access ------------------------------------------------------------------------------------
    def _get(self, control: Control) -> int:
        value: int = _INT32.unpack_from(self._buf, 4 * control)[0]
        return value

    def _set(self, control: Control, value: int) -> None:
        _INT32.pack_into(self._buf, 4 * control, value)

    # -- error discipline ------------------------------------------------------------------------------
    def _usable(self) -> None:
        if self._failed is not None:
            raise ControlError(
                f"this {self._actor.value} control object failed earlier and refuses further use: "
                f"{self._failed.message}",
                field="state",
            )

    def _fail(self, error: ControlError) -> ControlError:
        self._failed = error
        return error

    def _int_arg(self, name: str, value: object, low: int = 0) -> int:
        try:
            return _check_int32(name, value, low)
        except ControlError as exc:
            raise self._fail(exc) from None

    # -- table execution -------------------------------------------------------------------------------
    def _steps(self, handshake: str, method: str) -> tuple[Step, ...]:
        return tuple(s for s in HANDSHAKES[handshake] if s.method == method and s.actor is self._actor)

    @staticmethod
    def _resolve(step: Step, variables: Mapping[str, int]) -> int:
        return step.value if isinstance(step.value, int) else variables[step.value]

    def _waits_hold(self, handshake: str, method: str) -> bool:
        """Every WAIT row of ``method`` holds now (signals are read before any data)."""
        return all(self._get(s.control) == s.value for s in self._steps(handshake, method) if s.op is Op.WAIT)

    def _run(self, handshake: str, method: str, **variables: int) -> dict[str, int] | None:
        """Run ``method``'s rows in order: None if a WAIT does not hold yet, else the READ values."""
        read: dict[str, int] = {}
        for step in self._steps(handshake, method):
            if step.op is Op.WAIT:
                if self._get(step.control) != step.value:
                    return None
            elif step.op is Op.WRITE:
                self._set(step.control, self._resolve(step, variables))
            elif step.op is Op.CHECK:
                expected = self._resolve(step, variables)
                actual = self._get(step.control)
                if actual != expected:
                    raise self._fail(
                        ControlError(
                            f"{step.control.name} is {actual} but the {handshake} handshake expects {expected}",
                            field=step.control.name,
                            expected=expected,
                            actual=actual,
                        )
                    )
            else:
                read[str(step.value)] = self._get(step.control)
        return read


def _check_int32(name: str, value: object, low: int = INT32_MIN) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= INT32_MAX:
        raise ControlError(
            f"{name} must be an int32 >= {low}", field=name, expected=f"{low}..{INT32_MAX}", actual=value
        )
    return value


class _TrainerPhase(Enum):
    AWAIT_CONFIG = "waiting for the config"
    CONFIG_SEEN = "config seen, not yet acknowledged"
    INITIAL = "receiving the initial networks"
    TRAINING = "training (experience seen)"
    COMPLETED = "completed"
    STOPPED = "stopped"


class TrainerControls(_Half):
    """The trainer's half of every handshake. Non-blocking: transports poll these methods in a sleep loop.

    ``network_num`` (optional) is the number of networks; with it, sent networks must go 0..N−1 in order
    and Complete is allowed only at a round boundary (spec §7.1). ``ping`` changes nothing but the ping
    control, so a keep-alive thread may call it while another thread runs the handshakes.
    """

    _actor = Actor.TRAINER

    def __init__(self, buf: ControlBuffer, *, network_num: int | None = None) -> None:
        super().__init__(buf)
        if network_num is not None:
            _check_int32("network_num", network_num, low=1)
        self._network_num = network_num
        self._phase = _TrainerPhase.AWAIT_CONFIG
        self._requested: int | None = None  # id asked for and not yet received
        self._experience: ExperienceInfo | None = None  # seen and not yet acknowledged
        self._next_send = 0  # next id in the round (only enforced with network_num)
        self._stop_seen = False

    @property
    def phase(self) -> str:
        """Where the session stands, in words (for logs)."""
        return self._phase.value

    def _misuse(self, what: str, why: str) -> ControlError:
        return self._fail(
            ControlError(f"{what} is out of order: {why} (phase: {self._phase.value})", field=what)
        )

    def _require(self, what: str, *phases: _TrainerPhase) -> None:
        self._usable()
        if self._phase not in phases:
            allowed = ", ".join(p.value for p in phases)
            raise self._misuse(what, f"it is allowed only while {allowed}")

    # -- config ----------------------------------------------------------------------------------------
    def config_ready(self) -> bool:
        """True once the game has written the config files (ConfigSignal == 1)."""
        self._require("config_ready", _TrainerPhase.AWAIT_CONFIG, _TrainerPhase.CONFIG_SEEN)
        if self._run("config", "config_ready") is None:
            return False
        self._phase = _TrainerPhase.CONFIG_SEEN
        return True

    def ack_config(self) -> None:
        """Clear ConfigSignal after reading the files (the game does not wait for this)."""
        self._require("ack_config", _TrainerPhase.CONFIG_SEEN)
        self._run("config", "ack_config")
        self._phase = _TrainerPhase.INITIAL

    # -- initial networks (engine SendNetwork) ---------------------------------------------------------
    def request_network(self, network_id: int) -> None:
        """Ask for network ``network_id`` (NetworkSignal = 1); poll :meth:`network_received` next."""
        self._require("request_network", _TrainerPhase.INITIAL)
        self._int_arg("network_id", network_id)
        if self._requested is not None:
            raise self._misuse(
                "request_network", f"network {self._requested} was requested and not yet received"
            )
        self._run("request_network", "request_network")
        self._requested = network_id

    def network_received(self, network_id: int) -> bool:
        """True once the game has copied network ``network_id`` into its region (NetworkSignal back to 0).

        Raises ControlError if the game announced another NetworkId.
        """
        self._require("network_received", _TrainerPhase.INITIAL)
        if self._requested is None:
            raise self._misuse("network_received", "no network was requested")
        if self._requested != network_id:
            raise self._misuse(
                "network_received", f"network {self._requested} was requested, not {network_id}"
            )
        if self._run("request_network", "network_received", i=network_id) is None:
            return False
        self._requested = None
        return True

    # -- experience ------------------------------------------------------------------------------------
    def experience_ready(self) -> ExperienceInfo | None:
        """The posted experience's counts once ExperienceSignal == 1, else None. Repeatable until acked."""
        self._require("experience_ready", _TrainerPhase.INITIAL, _TrainerPhase.TRAINING)
        if self._requested is not None:
            raise self._misuse(
                "experience_ready", f"network {self._requested} was requested and not yet received"
            )
        if self._experience is not None:
            return self._experience
        read = self._run("experience", "experience_ready")
        if read is None:
            return None
        info = ExperienceInfo(episode_num=read["E"], step_num=read["S"], replay_buffer_id=read["r"])
        for name, value in (
            ("EXPERIENCE_EPISODE_NUM", info.episode_num),
            ("EXPERIENCE_STEP_NUM", info.step_num),
            ("REPLAY_BUFFER_ID", info.replay_buffer_id),
        ):
            if value < 0:
                raise self._fail(
                    ControlError(
                        f"{name} is {value} with ExperienceSignal set",
                        field=name,
                        expected=">= 0",
                        actual=value,
                    )
                )
        self._experience = info
        # From here on NetworkSignal = 1 means "network delivered" (module docstring).
        self._phase = _TrainerPhase.TRAINING
        return info

    def ack_experience(self) -> None:
        """Clear ExperienceSignal after copying the arrays out of the regions."""
        self._require("ack_experience", _TrainerPhase.TRAINING)
        if self._experience is None:
            raise self._misuse("ack_experience", "no experience is pending")
        self._run("experience", "ack_experience")
        self._experience = None

    # -- sending networks (engine ReceiveNetwork) ------------------------------------------------------
    def can_send_network(self) -> bool:
        """True when the game has taken the previous network (NetworkSignal == 0)."""
        self._usable()
        return self._waits_hold("send_network", "can_send_network")

    def post_network(self, network_id: int) -> None:
        """Publish network ``network_id``, already written in full into its region (NetworkId, then signal).

        Allowed once the experience was seen, acknowledged or not (the engine does not wait for the ack,
        §10.9), and only while :meth:`can_send_network` is true.
        """
        self._require("post_network", _TrainerPhase.TRAINING)
        self._int_arg("network_id", network_id)
        if self._network_num is not None:
            if network_id != self._next_send:
                raise self._misuse(
                    "post_network",
                    f"network {self._next_send} is next in the round (the engine asserts on order)",
                )
        if not self._waits_hold("send_network", "can_send_network"):
            raise self._misuse(
                "post_network", "NetworkSignal is 1: the game has not taken the previous network"
            )
        self._run("send_network", "post_network", i=network_id)
        if self._network_num is not None:
            self._next_send = (network_id + 1) % self._network_num

    def post_complete(self) -> None:
        """Tell the game training is finished (CompleteSignal = 1); this replaces the next round."""
        self._require("post_complete", _TrainerPhase.INITIAL, _TrainerPhase.TRAINING)
        if self._requested is not None:
            raise self._misuse(
                "post_complete", f"network {self._requested} was requested and not yet received"
            )
        if self._next_send != 0:
            raise self._misuse(
                "post_complete",
                f"the round is incomplete (network {self._next_send} is next); the engine treats a Complete "
                "in place of any network but the first as an error",
            )
        if not self._waits_hold("send_network", "can_send_network"):
            raise self._misuse("post_complete", "NetworkSignal is 1: the game has not taken the last network")
        self._run("complete", "post_complete")
        self._phase = _TrainerPhase.COMPLETED

    # -- stop and ping ---------------------------------------------------------------------------------
    def stop_requested(self) -> bool:
        """True when the game asked the trainer to stop (StopSignal == 1)."""
        self._usable()
        if self._run("stop", "stop_requested") is None:
            return False
        self._stop_seen = True
        return True

    def clear_stop(self) -> None:
        """Clear StopSignal (after seeing it); the session is over, further handshakes are refused."""
        self._usable()
        if not self._stop_seen:
            raise self._misuse("clear_stop", "stop_requested() has not returned True")
        self._run("stop", "clear_stop")
        self._phase = _TrainerPhase.STOPPED

    def ping(self) -> None:
        """Keep-alive (PingSignal = 1): resets the clock of a game that is waiting on the trainer."""
        self._usable()
        self._run("ping", "ping")


class _GamePhase(Enum):
    UNINITIALISED = "before init()"
    RUNNING = "running"
    DONE = "done (completed or stopped)"


class GameControls(_Half):
    """The engine's half of every handshake, for the game-side emulator. Non-blocking; the caller loops."""

    _actor = Actor.GAME

    def __init__(self, buf: ControlBuffer) -> None:
        super().__init__(buf)
        self._phase = _GamePhase.UNINITIALISED
        self._ready: int | None = None  # network seen by network_ready and not yet released

    def _misuse(self, what: str, why: str) -> ControlError:
        return self._fail(
            ControlError(f"{what} is out of order: {why} (phase: {self._phase.value})", field=what)
        )

    def _running(self, what: str) -> None:
        self._usable()
        if self._phase is not _GamePhase.RUNNING:
            raise self._misuse(what, "it needs a running session (init() first, nothing after complete/stop)")

    def init(self) -> None:
        """Zero the block and set NetworkId = ReplayBufferId = −1, as the engine does before every session."""
        self._usable()
        init_controls(self._buf)
        self._phase = _GamePhase.RUNNING
        self._ready = None

    def post_config(self) -> None:
        """ConfigSignal = 1 (call after writing the config files)."""
        self._running("post_config")
        self._run("config", "post_config")

    def network_requested(self) -> bool:
        """The trainer asks for a network (NetworkSignal == 1), as ``SendNetwork`` waits for."""
        self._running("network_requested")
        return self._waits_hold("request_network", "network_requested")

    def post_network(self, network_id: int) -> None:
        """Answer a request: region ``network_id`` holds the snapshot; NetworkId, then NetworkSignal = 0."""
        self._running("post_network")
        self._int_arg("network_id", network_id)
        if not self._waits_hold("request_network", "network_requested"):
            raise self._misuse("post_network", "the trainer has not requested a network (NetworkSignal is 0)")
        self._run("request_network", "post_network", i=network_id)

    def can_post_experience(self) -> bool:
        """The previous experience was consumed (ExperienceSignal == 0)."""
        self._running("can_post_experience")
        return self._waits_hold("experience", "can_post_experience")

    def post_experience(self, episode_num: int, step_num: int, replay_buffer_id: int) -> None:
        """Publish an experience already written into the regions: E, S, id, then ExperienceSignal = 1."""
        self._running("post_experience")
        values = {
            "E": self._int_arg("episode_num", episode_num),
            "S": self._int_arg("step_num", step_num),
            "r": self._int_arg("replay_buffer_id", replay_buffer_id),
        }
        if not self._waits_hold("experience", "can_post_experience"):
            raise self._misuse("post_experience", "ExperienceSignal is still 1")
        self._run("experience", "post_experience", **values)

    def has_network_or_completed(self) -> bool:
        """``HasNetworkOrCompleted``: NetworkSignal == 1 or CompleteSignal == 1 (polled once per tick)."""
        self._running("has_network_or_completed")
        return self._waits_hold("send_network", "network_ready") or self._waits_hold(
            "complete", "take_completed"
        )

    def take_completed(self) -> bool:
        """If CompleteSignal == 1: clear it, end the session and return True."""
        self._running("take_completed")
        if self._run("complete", "take_completed") is None:
            return False
        self._phase = _GamePhase.DONE
        return True

    def network_ready(self, network_id: int) -> bool:
        """NetworkSignal == 1 with NetworkId == ``network_id`` (ControlError on another id: the engine asserts)."""
        self._running("network_ready")
        self._int_arg("network_id", network_id)
        if self._run("send_network", "network_ready", i=network_id) is None:
            return False
        self._ready = network_id
        return True

    def release_network(self) -> None:
        """After loading the network: NetworkId = −1, then NetworkSignal = 0."""
        self._running("release_network")
        if self._ready is None:
            raise self._misuse("release_network", "network_ready() has not returned True")
        self._run("send_network", "release_network")
        self._ready = None

    def take_ping(self) -> bool:
        """If PingSignal == 1: clear it and return True (the engine then resets its timeout clock)."""
        self._usable()
        return self._run("ping", "take_ping") is not None

    def post_stop(self) -> None:
        """``EndTraining``: StopSignal = 1 without waiting; the session is over."""
        self._running("post_stop")
        self._run("stop", "post_stop")
        self._phase = _GamePhase.DONE
