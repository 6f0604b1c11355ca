"""An in-memory link: the engine's half of a session played by plain values, for tests of the story.

:func:`trainer.session.run.run_training` over a :class:`MemoryLink` needs no process, region, socket or file, so
a whole session of a tiny network costs milliseconds beyond the training steps themselves. The link
hands out the config, the three initial snapshots and the replay buffer it was built with, takes every
sent network at once (an engine that is always ready), and records what the story sent: each network,
each round, Complete, pings, ``finish``'s timeout.

Stop (the engine's ``EndTraining``) is asked for programmatically: :meth:`MemoryLink.request_stop` (from
any thread), ``stop_after_rounds`` (the engine stopping after N rounds), or ``stop_when`` (called on every
poll with the number of earlier polls; the story polls once before each training iteration, so that
number counts the iterations trained so far in this session).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from protocol.config import SessionConfig
from protocol.names import CommType
from protocol.replay import ReplayBuffer
from trainer.errors import LaunchError
from trainer.session.links.base import check_snapshot_size

__all__ = ["MemoryLink", "SentNetwork"]


@dataclass(frozen=True, slots=True)
class SentNetwork:
    """One :meth:`MemoryLink.send_network` call."""

    network_id: int
    version: int
    """The story's round counter (1 for the first round)."""
    data: bytes


class MemoryLink:
    """A :class:`~trainer.session.links.base.TrainerLink` over values in memory.

    Args:
        config: what :meth:`receive_config` returns.
        networks: the initial snapshots, index = network id (the engine's 0, 1, 2).
        replay: what :meth:`receive_experience` returns (once, as the engine sends it once).
        stop_after_rounds: request Stop once this many complete rounds (every network of the config sent
            with one version) have been taken.
        stop_when: called by :meth:`stop_requested` with the number of earlier calls; True requests Stop.
    """

    comm_type = CommType.MEMORY
    """See :attr:`TrainerLink.comm_type <trainer.session.links.base.TrainerLink.comm_type>`."""

    def __init__(
        self,
        config: SessionConfig,
        networks: Sequence[bytes],
        replay: ReplayBuffer,
        *,
        stop_after_rounds: int | None = None,
        stop_when: Callable[[int], bool] | None = None,
    ) -> None:
        self.config = config
        self.networks = tuple(bytes(blob) for blob in networks)
        self.replay = replay
        self._stop_after_rounds = stop_after_rounds
        self._stop_when = stop_when
        self._stop = threading.Event()
        self._lock = threading.Lock()  # pings come from the keep-alive thread
        self._experience_taken = False
        self._network_ids = frozenset(net.id for net in config.model.networks)
        self._ids_by_version: dict[int, set[int]] = {}
        self.complete_rounds = 0
        """Rounds in which every network of the config has been sent."""
        self.sent: list[SentNetwork] = []
        """Every network sent, in order."""
        self.completed = False
        """Complete was sent."""
        self.stop_polls = 0
        """Calls of :meth:`stop_requested` so far."""
        self.pings = 0
        self.finish_timeout: float | None = None
        """The timeout :meth:`finish` was called with (None: not called)."""
        self.closed = False

    @property
    def rounds(self) -> list[dict[int, bytes]]:
        """The sent networks grouped by version, in version order: ``[{network id: snapshot bytes}, ...]``."""
        by_version: dict[int, dict[int, bytes]] = {}
        for item in self.sent:
            by_version.setdefault(item.version, {})[item.network_id] = item.data
        return [by_version[version] for version in sorted(by_version)]

    def request_stop(self) -> None:
        """Stop from now on, as a game's ``EndTraining`` would (thread-safe)."""
        self._stop.set()

    # -- TrainerLink --------------------------------------------------------------------------------------

    def receive_config(self) -> SessionConfig:
        return self.config

    def receive_network(self, network_id: int) -> bytes:
        if not 0 <= network_id < len(self.networks):
            raise LaunchError(f"the memory link holds no network {network_id}")
        return self.networks[network_id]

    def receive_experience(self) -> ReplayBuffer:
        if self._experience_taken:
            raise LaunchError("the memory link holds no further replay buffer (the engine sends it once)")
        self._experience_taken = True
        return self.replay

    def send_network(self, network_id: int, data: bytes, version: int) -> None:
        """Record the snapshot (it must keep its MaxByteNum size, as over every transport)."""
        check_snapshot_size(network_id, data, self.config.network(network_id).max_byte_num)
        self.sent.append(SentNetwork(network_id, version, bytes(data)))
        ids = self._ids_by_version.setdefault(version, set())
        was_complete = ids >= self._network_ids
        ids.add(network_id)
        if not was_complete and ids >= self._network_ids:
            self.complete_rounds += 1
            if self._stop_after_rounds is not None and self.complete_rounds >= self._stop_after_rounds:
                self.request_stop()

    def send_complete(self) -> None:
        self.completed = True

    def stop_requested(self) -> bool:
        polls, self.stop_polls = self.stop_polls, self.stop_polls + 1
        if self._stop_when is not None and not self._stop.is_set() and self._stop_when(polls):
            self.request_stop()
        return self._stop.is_set()

    def ping(self) -> None:
        with self._lock:
            self.pings += 1

    def finish(self, timeout: float) -> None:
        self.finish_timeout = timeout

    def close(self) -> None:
        self.closed = True
