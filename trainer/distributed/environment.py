"""Where this process stands in the job (torchrun's environment and our own variables), the seeds of its
random streams, and its share of every batch."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from trainer.errors import LaunchError
from trainer.training.data import Batch, TensorData
from trainer.training.steps.autograd import BatchSampler

__all__ = [
    "DEFAULT_AGREE_EVERY",
    "DEFAULT_STALL_S",
    "DEFAULT_TIMEOUT_S",
    "STORE_PREFIX",
    "DistEnv",
    "ShardSampler",
    "derive_seed",
    "env_int",
    "float_env",
    "local_batch_size",
    "select_backend",
]

DEFAULT_TIMEOUT_S = 86_400.0
"""A day. The other ranks wait in a collective while rank 0 waits for the game, and rank 0 waits for as long
as the game lives (a paused editor, a game that begins training minutes after spawning us,
:mod:`trainer.settings.timeouts`), so this bound is only a last resort against a hung rank. A rank that dies is
noticed at once (its gloo connections close), a rank stuck in a step by the :class:`Watchdog`."""
DEFAULT_AGREE_EVERY = 8
DEFAULT_STALL_S = 300.0
"""[INF] Must exceed rank 0's longest pause between steps (a sync round waits up to Timeouts.send per
network, a checkpoint or snapshot write takes seconds), which the other ranks spend waiting in a step."""

STORE_PREFIX = "la-trainer"
"""First part of every key this job writes in the rendezvous store (:meth:`DistEnv.key`)."""


def env_int(environ: Mapping[str, str], name: str, minimum: int) -> int | None:
    """An integer >= ``minimum`` from the variable ``name`` of ``environ`` (None when unset)."""
    raw = environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise LaunchError(f"environment variable {name} must be an integer, got {raw!r}.") from None
    if value < minimum:
        raise LaunchError(f"environment variable {name} must be >= {minimum}, got {value}.")
    return value


def float_env(name: str, default: float) -> float:
    """A positive number of seconds from the environment variable ``name`` (``default`` when unset)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise LaunchError(f"environment variable {name} must be a number of seconds, got {raw!r}.") from None
    if not value > 0:
        raise LaunchError(f"environment variable {name} must be > 0, got {raw!r}.")
    return value


@dataclass(frozen=True, slots=True)
class DistEnv:
    """Where this process stands in the job, from torchrun's environment variables."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    restart: int = 0
    """TORCHELASTIC_RESTART_COUNT: store keys are per attempt, so a restarted group never reads old ones."""
    agent_store: bool = False
    """torchrun's agent hosts the rendezvous store (it outlives rank 0)."""

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> DistEnv | None:
        """None when neither ``RANK`` nor ``WORLD_SIZE`` is set (not under torchrun). Without
        ``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` (a hand launch) one node is assumed."""
        rank = env_int(environ, "RANK", 0)
        world = env_int(environ, "WORLD_SIZE", 1)
        if rank is None and world is None:
            return None
        if rank is None or world is None:
            missing = "RANK" if rank is None else "WORLD_SIZE"
            raise LaunchError(
                f"{missing} is not set but the other torchrun variable is: launch with torchrun."
            )
        if rank >= world:
            raise LaunchError(
                f"RANK is {rank} but WORLD_SIZE is {world}: a rank must be below the world size."
            )
        local_rank = env_int(environ, "LOCAL_RANK", 0)
        local_world = env_int(environ, "LOCAL_WORLD_SIZE", 1)
        return cls(
            rank=rank,
            world_size=world,
            local_rank=rank if local_rank is None else local_rank,
            local_world_size=world if local_world is None else local_world,
            restart=env_int(environ, "TORCHELASTIC_RESTART_COUNT", 0) or 0,
            agent_store=environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
        )

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def key(self, name: str) -> str:
        return f"{STORE_PREFIX}/{self.restart}/{name}"


def select_backend(cuda: bool, override: str = "") -> str:
    """gloo for CPU tensors, NCCL for CUDA ones: one group serves both (frames travel on the CPU)."""
    if override.strip():
        return override.strip()
    return "cpu:gloo,cuda:nccl" if cuda and dist.is_nccl_available() else "gloo"


def derive_seed(seed: int, *keys: int) -> int:
    """A 64-bit seed for the stream named by ``keys`` (e.g. ``(start_iteration, 1 + rank)``), from numpy's
    SeedSequence so that nearby seeds and ranks give independent streams."""
    sequence = np.random.SeedSequence(entropy=seed % 2**64, spawn_key=tuple(k % 2**32 for k in keys))
    return int(sequence.generate_state(1, dtype=np.uint64)[0])


def local_batch_size(global_batch: int, world_size: int) -> int:
    """Rows per rank; the config's BatchSize stays the global batch, so it must divide evenly."""
    if global_batch % world_size:
        lower = global_batch - global_batch % world_size
        raise LaunchError(
            f"BatchSize {global_batch} does not divide among {world_size} training processes. Use a BatchSize "
            f"that is a multiple of {world_size} (e.g. {max(lower, world_size)} or {lower + world_size}) or "
            "another process count: each process trains on an equal share of every batch."
        )
    return global_batch // world_size


class ShardSampler(BatchSampler):
    """Rank ``rank``'s share of each global batch: every rank draws the same global index (B,) from
    ``generator`` (seeded identically everywhere) and keeps rows ``[rank·b, (rank+1)·b)``, b = B / N."""

    def __init__(
        self, data: TensorData, global_batch: int, rank: int, world_size: int, generator: torch.Generator
    ) -> None:
        super().__init__(data, local_batch_size(global_batch, world_size), generator)
        self.global_batch = global_batch
        self.rows = slice(rank * self.batch_size, (rank + 1) * self.batch_size)

    def next(self) -> Batch:
        index = torch.randint(
            self.data.row_num, (self.global_batch,), generator=self.generator, device=self.data.obs.device
        )[self.rows]
        return Batch(obs=self.data.obs.index_select(0, index), x1=self.data.x1.index_select(0, index))
