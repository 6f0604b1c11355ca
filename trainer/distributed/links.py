"""The links each rank's training story runs over: rank 0's real link, which broadcasts what the game
sends, and the other ranks' link, which receives those broadcasts and sends nothing."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from protocol.config import SessionConfig
from protocol.names import CommType
from protocol.replay import ReplayBuffer
from protocol.snapshot import read_snapshot
from trainer.distributed.state import RankContext
from trainer.errors import PeerGone
from trainer.session.run import SyncRounds, encode_networks
from trainer.settings.environment import ENV_ENGINE_PID
from trainer.system.liveness import process_watch

if TYPE_CHECKING:
    from trainer.session.links import TrainerLink
    from trainer.training.job import TrainingJob

__all__ = ["BroadcastLink", "Rank0Link"]


class Rank0Link:
    """Rank 0's link: the real one, whose received config, networks and replay buffer are broadcast to
    the other ranks on the way through, and whose stop flag is the ranks' agreement."""

    def __init__(self, real: TrainerLink, ctx: RankContext) -> None:
        self.real = real
        self.ctx = ctx
        self.config: SessionConfig | None = None
        self.received: dict[int, bytes] = {}
        self.version = 0
        self.engine_pid = _engine_pid()
        self._engine_alive = process_watch(self.engine_pid) if self.engine_pid is not None else None
        ctx.poll_game = self._poll_game
        ctx.state.link = self

    @property
    def comm_type(self) -> CommType:
        return self.real.comm_type

    def _poll_game(self) -> bool:
        """The game's Stop; raises when the game is gone. Under torchrun our parent is torchrun, so the
        real link's parent watch cannot see a crashed engine: the launcher passes the engine's pid."""
        if self._engine_alive is not None and not self._engine_alive():
            raise PeerGone(f"the engine (process {self.engine_pid}) that started this training exited")
        return bool(self.real.stop_requested())

    def receive_config(self) -> SessionConfig:
        self.config = self.ctx.channel.config(self.real.receive_config())
        return self.config

    def receive_network(self, network_id: int) -> bytes:
        assert self.config is not None  # the loop receives the config first (spec §7.1)
        blob = bytes(self.real.receive_network(network_id))
        self.received[network_id] = blob
        return self.ctx.channel.network(self.config, network_id, blob)

    def receive_experience(self) -> ReplayBuffer:
        assert self.config is not None
        return self.ctx.channel.experience(self.config, self.real.receive_experience())

    def send_network(self, network_id: int, data: bytes, version: int) -> None:
        self.real.send_network(network_id, data, version)
        self.version = max(self.version, version)

    def send_complete(self) -> None:
        self.real.send_complete()

    def stop_requested(self) -> bool:
        return self.ctx.state.game_stop

    def ping(self) -> None:
        self.real.ping()

    def finish(self, timeout: float) -> None:
        self.real.finish(timeout)

    def close(self) -> None:
        self.real.close()

    def emergency_complete(self, job: TrainingJob) -> None:
        """From the watchdog: send the current networks as one more round, then Complete (spec §7.1)."""
        received = {nid: read_snapshot(blob) for nid, blob in self.received.items()}
        rounds = SyncRounds(self.real, version=self.version)
        rounds.send(encode_networks(received, job.export()))
        self.version = rounds.version
        self.real.send_complete()
        self.real.finish(self.ctx.timeouts.wait)


def _engine_pid() -> int | None:
    raw = os.environ.get(ENV_ENGINE_PID, "")
    return int(raw) if raw.isdigit() else None


class BroadcastLink:
    """Ranks ≥ 1: receives what rank 0 broadcasts; sends nothing; stops when the ranks agree."""

    comm_type = CommType.UNKNOWN
    """The game's transport is rank 0's business (it names only the trackers' run)."""

    def __init__(self, ctx: RankContext) -> None:
        self.ctx = ctx
        self.config: SessionConfig | None = None

    def receive_config(self) -> SessionConfig:
        self.config = self.ctx.channel.config()
        return self.config

    def receive_network(self, network_id: int) -> bytes:
        assert self.config is not None
        return self.ctx.channel.network(self.config, network_id)

    def receive_experience(self) -> ReplayBuffer:
        assert self.config is not None
        return self.ctx.channel.experience(self.config)

    def send_network(self, network_id: int, data: bytes, version: int) -> None:
        return None  # rank 0 alone syncs networks back

    def send_complete(self) -> None:
        return None

    def stop_requested(self) -> bool:
        return self.ctx.state.game_stop

    def ping(self) -> None:
        return None

    def finish(self, timeout: float) -> None:
        return None

    def close(self) -> None:
        return None
