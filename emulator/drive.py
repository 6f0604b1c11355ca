"""The engine's training story over a live game half, written once (spec §7.1).

What ``ULearningAgentsFlowMatchingTrainer`` does with its communicator, for every caller that plays a
live session (the session harness, the demo, the speed bench, the fault and link tests):

1. ``BeginTraining`` (:func:`begin_training`): the configs (shared memory: files + ConfigSignal; socket:
   one message), networks 0..N−1 in id order (shared memory: each on the trainer's request), then the
   replay buffer once.
2. Every tick (:func:`tick_until_end`): ``HasNetworkOrCompleted`` → ``ReceiveNetwork(0..N−1)``, one sync
   round, or Completed in place of network 0. The loop returns at Completed, or after ``EndTraining``
   (Stop) when ``stop_after_rounds`` rounds arrived or ``on_tick`` asks for it.
3. ``DoneTraining`` (``game.done()``) is the caller's: what happens between the end of the ticks and the
   release (the socket's grace check of §10 item 7, waiting for the trainer's exit, keeping the regions
   to inspect them) differs per caller.

API
---
``begin_training(game, config, snapshots, replay_buffer, *, after_configs=None, after_network=None)``
    ``after_configs()`` runs once the configs are out, before network 0 (the demo copies the files);
    ``after_network(network_id)`` after each network was handed over (recording; fault tests kill the
    game there).
``tick_until_end(game, *, tick_s, on_round=None, on_tick=None, stop_after_rounds=None, timeout_s=None,
trainer=None) -> Ended``
    ``on_round(networks)`` sees each round as it arrives. ``on_tick()`` runs once per tick after the round
    check and may answer :attr:`TickAction.STOP` (send Stop and return) or :attr:`TickAction.LEAVE`
    (return without Stop: the session goes on without the loop). ``timeout_s`` bounds the whole loop;
    ``trainer`` (the spawned process) turns a trainer that exited without Complete into a failure instead
    of a wait for networks that never come. A loop that cannot end raises :class:`TrainingStalled`.

Both take any :class:`Communicator` (:class:`~emulator.game.ShmGame`, :class:`~emulator.game.SocketGame`,
or a scripted fake in tests). Engine failures (:class:`~emulator.game.EngineFailure`) pass through.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from emulator.game.common import Completed, ReceivedNetwork, RoundResult
from emulator.game.socket import SocketGame
from emulator.launch import TrainerProcess
from protocol.config import SessionConfig
from protocol.replay import ReplayBuffer

__all__ = [
    "Communicator",
    "Ended",
    "Ending",
    "Stall",
    "TickAction",
    "TrainingStalled",
    "begin_training",
    "tick_until_end",
]


class Communicator(Protocol):
    """The engine calls the story makes on a live game half (``FLearningAgentsCommunicator``'s)."""

    def begin(self, session: SessionConfig) -> None: ...
    def send_network(self, network_id: int, data: bytes) -> None: ...
    def send_experience(self, rb: ReplayBuffer) -> None: ...
    def has_network_or_completed(self) -> bool: ...
    def receive_round(self) -> RoundResult: ...
    def stop(self) -> None: ...


class Ending(Enum):
    """How the tick loop ended."""

    COMPLETED = "completed"
    """The trainer sent Complete (in place of network 0 of a round); DoneTraining is next."""
    STOPPED = "stopped"
    """The game sent Stop (EndTraining): ``stop_after_rounds`` reached, or ``on_tick`` asked for it."""
    LEFT = "left"
    """``on_tick`` ended the loop without Stop; the session goes on without it."""


class TickAction(Enum):
    """What ``on_tick`` may ask of the loop (None: carry on ticking)."""

    STOP = "stop"
    """Send Stop (EndTraining) and return :attr:`Ending.STOPPED`."""
    LEAVE = "leave"
    """Return :attr:`Ending.LEFT` without sending anything."""


class Stall(Enum):
    """Why the tick loop could never end by itself."""

    PEER_CLOSED = "peer closed"
    """Socket: the trainer closed the connection without Complete."""
    TRAINER_EXITED = "trainer exited"
    """The spawned trainer exited without Complete."""
    TIMED_OUT = "timed out"
    """No Complete within ``timeout_s``."""


class TrainingStalled(Exception):
    """The tick loop could not end: ``why`` says what happened, ``rounds`` how many rounds had arrived.

    ``str()`` says why a real engine would wait forever there."""

    def __init__(self, why: Stall, rounds: int, message: str) -> None:
        super().__init__(message)
        self.why = why
        self.rounds = rounds


@dataclass(frozen=True, slots=True, eq=False)
class Ended:
    """The end of the tick loop: how, the rounds taken, the last of them, ``time.monotonic()`` then."""

    how: Ending
    rounds: int
    last_round: tuple[ReceivedNetwork, ...] | None
    at: float


def begin_training(
    game: Communicator,
    config: SessionConfig,
    snapshots: Sequence[bytes],
    replay_buffer: ReplayBuffer,
    *,
    after_configs: Callable[[], None] | None = None,
    after_network: Callable[[int], None] | None = None,
) -> None:
    """``BeginTraining``: configs, networks 0..N−1 (``snapshots`` in id order), the replay buffer once."""
    game.begin(config)
    if after_configs is not None:
        after_configs()
    for network_id, data in enumerate(snapshots):
        game.send_network(network_id, data)
        if after_network is not None:
            after_network(network_id)
    game.send_experience(replay_buffer)


def tick_until_end(
    game: Communicator,
    *,
    tick_s: float,
    on_round: Callable[[tuple[ReceivedNetwork, ...]], None] | None = None,
    on_tick: Callable[[], TickAction | None] | None = None,
    stop_after_rounds: int | None = None,
    timeout_s: float | None = None,
    trainer: TrainerProcess | None = None,
) -> Ended:
    """Tick every ``tick_s`` seconds until Completed, Stop or ``on_tick``'s leave (module docstring)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    rounds = 0
    last: tuple[ReceivedNetwork, ...] | None = None
    while True:
        if game.has_network_or_completed():
            result = game.receive_round()
            if isinstance(result, Completed):
                return Ended(Ending.COMPLETED, rounds, last, time.monotonic())
            rounds += 1
            last = result
            if on_round is not None:
                on_round(result)
            if stop_after_rounds is not None and rounds >= stop_after_rounds:
                game.stop()
                return Ended(Ending.STOPPED, rounds, last, time.monotonic())
        elif isinstance(game, SocketGame) and game.peer_closed:
            raise TrainingStalled(
                Stall.PEER_CLOSED,
                rounds,
                "the trainer closed the connection without sending Complete; the engine's tick peek sees "
                "no data and would wait for networks forever",
            )
        elif trainer is not None and not trainer.alive() and not game.has_network_or_completed():
            # Shared memory would still take a pending Complete (re-checked here); the socket ignores it
            # once the process is gone (§10 item 7).
            raise TrainingStalled(
                Stall.TRAINER_EXITED,
                rounds,
                f"the trainer exited with code {trainer.returncode} without completing; the engine would "
                "wait for networks that never come"
                + (
                    " (a Complete sent just before exiting is ignored over the socket, §10 item 7)"
                    if isinstance(game, SocketGame)
                    else ""
                ),
            )
        if on_tick is not None:
            action = on_tick()
            if action is TickAction.STOP:
                game.stop()
                return Ended(Ending.STOPPED, rounds, last, time.monotonic())
            if action is TickAction.LEAVE:
                return Ended(Ending.LEFT, rounds, last, time.monotonic())
        if deadline is not None and time.monotonic() > deadline:
            raise TrainingStalled(
                Stall.TIMED_OUT, rounds, f"no Complete within {timeout_s:g} s ({rounds} rounds)"
            )
        time.sleep(tick_s)
