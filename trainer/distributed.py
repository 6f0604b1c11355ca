"""Data-parallel training over several processes with ``torchrun`` (PyTorch's c10d and DDP, nothing home-made).

Launch: ``torchrun --nproc-per-node N [--nnodes M ...] -m trainer.distributed <engine argv>`` (commands for
every mode: ``docs/scale-out.md``). ``python -m trainer.distributed`` outside torchrun is the ordinary
trainer, or, with ``LA_TRAINER_NPROC_PER_NODE=N``, re-executes itself under torchrun (engine-spawned mode).

Roles. Rank 0 alone talks to the game (shared memory or socket): it runs :func:`trainer.run.run_training`
over the real link, wrapped in :class:`Rank0Link`, which broadcasts what arrives — our options, the
config, the three snapshots, the replay buffer — to the other ranks as uint8 tensors holding the
protocol's own encodings (JSON, snapshot bytes, the socket replay layout; never pickle). Ranks ≥ 1 run the
same story over a :class:`BroadcastLink` whose sends are no-ops, with no task folder (no snapshot,
checkpoint or status file) and a silent stdout. :func:`scale_out_job` turns each rank's job into a
:class:`DistributedTrainingJob`: same start state on every rank (rank 0's model, EMA and, after a resume,
optimiser state), gradients averaged across ranks, and every 8 steps one small all-reduce that agrees on
stop, interrupt and the logged loss, so every rank leaves the loop at the same iteration.

Equivalence (what is guaranteed). World size 1 runs the ordinary code path unchanged (bitwise identical).
With N ranks the global batch stays the config's ``BatchSize`` (it must divide by N) and every rank
trains on B / N rows of it. Gradients are averaged: by DDP for the autograd step (a trained encoder,
distillation, layers the fused step does not cover), by one all-reduce of the flat gradient buffer for
:class:`trainer.steps.fused.FusedStep` (the engine's MLP with a frozen encoder), see
:class:`RankAveraging`. The average of the per-rank mean-loss gradients is the gradient of the mean
loss over the concatenated batch, so given the same rows and noise one N-rank update equals the
1-process update on the whole batch up to float32 summation order (tested on the DDP path: max
|Δparameter| ≤ 1e-6 after three AdamW steps, measured 1.5e-8). Rows: the autograd path takes rank r's
slice of one global draw (:class:`ShardSampler`); the fused path draws B / N rows per rank from the
rank's stream, with replacement, which is distributed as one draw of B rows. Noise and times come from
a per-rank stream (:func:`derive_seed`), so a whole N-rank run is *statistically* equivalent to a
1-process run with the same batch size and seed, not bitwise; the test bounds the final loss difference.
Every agreement also compares a checksum of every rank's weights, which must stay bitwise equal: a step
that did not average its gradients ends the run (:class:`ReplicasDiffer`) instead of training on.

Failures. A rank that raises publishes its message in the rendezvous store; a rank that dies closes
its gloo connections; either way the others' next collective fails and becomes :class:`RankLost`, which
the loop treats like divergence: rank 0 stops, sends the last good networks and Complete (the game sees a
clean end), writes its snapshot and checkpoint, and exits with ``PEER_GONE``. A rank that hangs (or a
collective that never returns, e.g. NCCL after a peer died) is caught by :class:`Watchdog`: after
``LA_TRAINER_DIST_STALL_SECONDS`` without progress, or a few seconds after SIGTERM (torchrun ends the
others when one fails) while stuck, rank 0 sends the networks and Complete from the watchdog thread and
exits. Ranks ≥ 1 follow rank 0's outcome (store key) with its exit code.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import select
import shlex
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import timedelta
from enum import IntEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.rendezvous import rendezvous
from torch.nn.parallel import DistributedDataParallel

from protocol.config import (
    SessionConfig,
    data_config_to_json,
    dump_json,
    parse_json,
    session_from_shared_memory,
    trainer_config_to_json,
)
from protocol.replay import ReplayBuffer, ReplayLayout
from protocol.snapshot import read_snapshot, snapshot_with_model, write_snapshot
from trainer.app import InterruptFlag, engine_main, run_with_link
from trainer.data import Batch, TensorData
from trainer.errors import Diverged, LaunchError, PeerGone, TrainerError, exit_code_for
from trainer.exitcodes import ExitCode
from trainer.job import TrainingJob
from trainer.options import TrainerOptions, load_options
from trainer.progress import log
from trainer.steps.autograd import BatchSampler
from trainer.timeouts import Timeouts

if TYPE_CHECKING:
    from trainer.links import TrainerLink

__all__ = [
    "BroadcastLink",
    "DistEnv",
    "DistributedTrainingJob",
    "FrameKind",
    "Rank0Link",
    "RankAveraging",
    "RankChannel",
    "RankContext",
    "RankLost",
    "ReplicasDiffer",
    "RunState",
    "ScaleOutError",
    "ShardSampler",
    "Watchdog",
    "decode_config",
    "decode_options",
    "derive_seed",
    "encode_config",
    "encode_options",
    "is_collective_failure",
    "local_batch_size",
    "main",
    "run_rank",
    "scale_out_job",
    "select_backend",
    "sync_start_state",
    "torchrun_command",
]

ENV_NPROC = "LA_TRAINER_NPROC_PER_NODE"
"""Outside torchrun: > 1 makes :func:`main` re-execute itself under torchrun with this many processes."""
ENV_TORCHRUN_ARGS = "LA_TRAINER_TORCHRUN_ARGS"
"""Extra torchrun arguments for that re-execution (default ``--standalone``; multi-node: ``--nnodes``...)."""
ENV_BACKEND = "LA_TRAINER_DIST_BACKEND"
"""Override the process-group backend string (default: ``cpu:gloo,cuda:nccl`` with CUDA, else ``gloo``)."""
ENV_TIMEOUT = "LA_TRAINER_DIST_TIMEOUT_SECONDS"
"""Collective timeout, seconds (default 600, at least the setup waits of :class:`Timeouts`)."""
ENV_AGREE = "LA_TRAINER_DIST_AGREE_EVERY"
"""Steps between the ranks' agreements on stop / interrupt / loss (default 8)."""
ENV_ENGINE_PID = "LA_TRAINER_ENGINE_PID"
"""Set by the launcher: the process that started us (the engine); rank 0 stops when it is gone."""
ENV_STALL = "LA_TRAINER_DIST_STALL_SECONDS"
"""Seconds a training step may wait on the other ranks before rank 0 gives up (default 300)."""

DEFAULT_TIMEOUT_S = 600.0
DEFAULT_AGREE_EVERY = 8
DEFAULT_STALL_S = 300.0
"""[INF] Must exceed rank 0's longest pause between steps (a sync round waits up to Timeouts.send per
network, a checkpoint or snapshot write takes seconds), which the other ranks spend waiting in a step."""
SIGNAL_GRACE_S = 5.0
"""After SIGTERM/SIGINT, how long a rank stuck in a collective gets before the watchdog ends it (torchrun
sends SIGKILL 30 s after SIGTERM)."""
PEER_GRACE_S = 1.0
"""How long a published failure of another rank waits for the main thread to notice it by itself."""
WATCH_PERIOD_S = 0.2

FRAME_MAGIC = 0x4C41_5452_4E44_5031  # "LATRNDP1": rank frames of this version
FRAME_HEADER_WORDS = 6
"""int64 header: magic, kind, a, b, c, payload bytes."""
CHUNK_BYTES = 64 * 1024 * 1024
"""Payloads travel in broadcasts of at most this many bytes (bounds the staging copy and gloo's buffers)."""
MAX_OPTIONS_BYTES = 1 << 20
MAX_CONFIG_BYTES = 256 * 1024 * 1024
"""As ``trainer.links.CONFIG_FILE_LIMIT``: real configs are kilobytes."""
MAX_STATE_BYTES = 64 * 1024 * 1024
"""JSON skeleton of the start state (tensor names, shapes); the tensors follow as their own broadcasts."""

_STORE_PREFIX = "la-trainer"
_DTYPES = {
    str(dtype): dtype
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32)
}
_COLLECTIVE_MARKERS = (
    "gloo",
    "nccl",
    "c10d",
    "connection closed by peer",
    "connection reset",
    "broken pipe",
    "timed out",
    "processgroup",
)


# --------------------------------------------------------------------------------------------------
# Errors


class ScaleOutError(TrainerError):
    """A scale-out failure outside the training steps (launch, rank frames, start-state sync)."""

    def __init__(self, message: str, exit_code: ExitCode = ExitCode.INTERNAL) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class ReplicasDiffer(Diverged):
    """The ranks' weights drifted apart (a bug). A :class:`Diverged` for the same reason as
    :class:`RankLost`."""

    exit_code = ExitCode.INTERNAL


class RankLost(Diverged):
    """Another rank failed or vanished during training.

    A :class:`Diverged` on purpose: the loop's divergence path is exactly what a lost rank needs (stop now,
    keep the last good weights, send them and Complete, write the snapshot and checkpoint). Its exit code
    is replaced by ``PEER_GONE`` in :func:`run_rank`.
    """

    exit_code = ExitCode.PEER_GONE


def is_collective_failure(error: BaseException) -> bool:
    """True for the errors a collective raises when a peer died or timed out (gloo raises a plain
    RuntimeError "Connection closed by peer"; newer c10d raises ``DistError`` subclasses)."""
    dist_error = getattr(dist, "DistError", None)
    if dist_error is not None and isinstance(error, dist_error):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(marker in text for marker in _COLLECTIVE_MARKERS)


def _first_line(error: BaseException) -> str:
    """The gist of an error on one line: gloo's "[.../pair.cc:537] Read error ...: Connection reset by
    peer. This is typically caused by ..." becomes "Read error ...: Connection reset by peer"."""
    lines = str(error).strip().splitlines()
    text = re.sub(r"^\[[^\]]*\.(?:cc|cpp|h)(?::\d+)?\]\s*", "", lines[0]) if lines else type(error).__name__
    return text.split(". This is typically")[0].rstrip(".")


# --------------------------------------------------------------------------------------------------
# Environment, seeds, batch


def _env_int(environ: Mapping[str, str], name: str, minimum: int) -> int | None:
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
        rank = _env_int(environ, "RANK", 0)
        world = _env_int(environ, "WORLD_SIZE", 1)
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
        local_rank = _env_int(environ, "LOCAL_RANK", 0)
        local_world = _env_int(environ, "LOCAL_WORLD_SIZE", 1)
        return cls(
            rank=rank,
            world_size=world,
            local_rank=rank if local_rank is None else local_rank,
            local_world_size=world if local_world is None else local_world,
            restart=_env_int(environ, "TORCHELASTIC_RESTART_COUNT", 0) or 0,
            agent_store=environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
        )

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def key(self, name: str) -> str:
        return f"{_STORE_PREFIX}/{self.restart}/{name}"


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


# --------------------------------------------------------------------------------------------------
# Payload codecs (pure: bytes in, values out)


def encode_options(options: TrainerOptions) -> bytes:
    return json.dumps({f.name: getattr(options, f.name) for f in fields(options)}).encode("utf-8")


def decode_options(raw: bytes) -> TrainerOptions:
    """Rank 0's options, validated by the ordinary loader (unknown keys and wrong types refused)."""
    obj = parse_json(raw, "options from rank 0")
    if not isinstance(obj, dict):
        raise ScaleOutError("the options from rank 0 are not a JSON object")
    return load_options(None, overrides=obj, environ={})


def encode_config(config: SessionConfig) -> bytes:
    """The engine's own JSON for the config (trainer + data/model objects) and rank 0's warnings."""
    return dump_json(
        {
            "Trainer": trainer_config_to_json(config.trainer),
            "Data": data_config_to_json(config.data, config.model),
            "Warnings": list(config.warnings),
        }
    )


def decode_config(raw: bytes) -> SessionConfig:
    """Parsed with the shared-memory assembly (the same checks rank 0 ran); warnings are rank 0's."""
    obj = parse_json(raw, "config from rank 0")
    if not isinstance(obj, dict) or set(obj) != {"Trainer", "Data", "Warnings"}:
        raise ScaleOutError("the config from rank 0 is not the expected object")
    config = session_from_shared_memory(obj["Trainer"], obj["Data"])
    warnings = obj["Warnings"]
    if not isinstance(warnings, list) or not all(isinstance(w, str) for w in warnings):
        raise ScaleOutError("the config warnings from rank 0 are not a list of strings")
    return replace(config, warnings=tuple(warnings))


# --------------------------------------------------------------------------------------------------
# Frames: rank 0 → every rank


class FrameKind(IntEnum):
    """What a frame carries; ``a``, ``b``, ``c`` are the header's three integers."""

    OPTIONS = 1
    """:func:`encode_options` JSON."""
    CONFIG = 2
    """:func:`encode_config` JSON."""
    NETWORK = 3
    """a = network id; the snapshot bytes as received."""
    EXPERIENCE = 4
    """a = replay buffer id, b = EpisodeNum, c = StepNum; the socket SendExperience body (spec §3)."""
    STATE = 5
    """JSON skeleton of the start state; its tensors follow as separate broadcasts."""


Broadcast = Callable[[Tensor], None]
"""In-place broadcast of one tensor from rank 0 (``dist.broadcast(t, src=0)``; tests use a fake)."""


class RankChannel:
    """Frames from rank 0 to all ranks over a broadcast: a 6-word int64 header, then the payload in
    :data:`CHUNK_BYTES` pieces. Receivers check magic, kind and a bound before allocating."""

    def __init__(self, broadcast: Broadcast, *, leader: bool, chunk_bytes: int = CHUNK_BYTES) -> None:
        if chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
        self.broadcast = broadcast
        self.leader = leader
        self.chunk_bytes = chunk_bytes

    # -- generic ------------------------------------------------------------------------------------
    def send(self, kind: FrameKind, ints: tuple[int, int, int], parts: Sequence[bytes | memoryview]) -> None:
        views = [memoryview(p).cast("B") for p in parts]
        nbytes = sum(v.nbytes for v in views)
        header = torch.tensor([FRAME_MAGIC, int(kind), *ints, nbytes], dtype=torch.int64)
        self.broadcast(header)
        if nbytes == 0:
            return
        staging = torch.empty(min(self.chunk_bytes, nbytes), dtype=torch.uint8)
        target = staging.numpy()
        filled = 0
        for view in views:
            source = np.frombuffer(view, dtype=np.uint8)
            pos = 0
            while pos < source.size:
                take = min(target.size - filled, source.size - pos)
                target[filled : filled + take] = source[pos : pos + take]
                filled, pos = filled + take, pos + take
                if filled == target.size:
                    self.broadcast(staging)
                    filled = 0
        if filled:
            self.broadcast(staging[:filled])

    def receive(self, kind: FrameKind, limit: int) -> tuple[tuple[int, int, int], Tensor]:
        """The frame's three integers and its payload (uint8, CPU). ``limit``: most payload bytes."""
        ints, nbytes = self._header(kind)
        if not 0 <= nbytes <= limit:
            raise ScaleOutError(f"rank 0's {kind.name} frame announces {nbytes} bytes; the bound is {limit}")
        return ints, self._payload(nbytes)

    def _header(self, kind: FrameKind) -> tuple[tuple[int, int, int], int]:
        header = torch.zeros(FRAME_HEADER_WORDS, dtype=torch.int64)
        self.broadcast(header)
        magic, got, a, b, c, nbytes = (int(v) for v in header.tolist())
        if magic != FRAME_MAGIC:
            raise ScaleOutError(
                f"rank 0 sent a frame with magic {magic:#x}, expected {FRAME_MAGIC:#x}: every rank must run "
                "the same la-trainer version"
            )
        if got != kind:
            name = FrameKind(got).name if got in FrameKind._value2member_map_ else str(got)
            raise ScaleOutError(f"rank 0 sent a {name} frame where {kind.name} was expected")
        return (a, b, c), nbytes

    def _payload(self, nbytes: int) -> Tensor:
        payload = torch.empty(nbytes, dtype=torch.uint8)
        for start in range(0, nbytes, self.chunk_bytes):
            self.broadcast(payload[start : start + self.chunk_bytes])
        return payload

    def tensor(self, value: Tensor) -> None:
        """Broadcast one tensor in place (rank 0's value wins)."""
        self.broadcast(value)

    # -- typed frames -------------------------------------------------------------------------------
    def options(self, options: TrainerOptions | None = None) -> TrainerOptions:
        if self.leader:
            assert options is not None  # the leader passes what it loaded
            self.send(FrameKind.OPTIONS, (0, 0, 0), [encode_options(options)])
            return options
        _, payload = self.receive(FrameKind.OPTIONS, MAX_OPTIONS_BYTES)
        return decode_options(payload.numpy().tobytes())

    def config(self, config: SessionConfig | None = None) -> SessionConfig:
        if self.leader:
            assert config is not None
            self.send(FrameKind.CONFIG, (0, 0, 0), [encode_config(config)])
            return config
        _, payload = self.receive(FrameKind.CONFIG, MAX_CONFIG_BYTES)
        return decode_config(payload.numpy().tobytes())

    def network(self, config: SessionConfig, network_id: int, blob: bytes | None = None) -> bytes:
        if self.leader:
            assert blob is not None
            self.send(FrameKind.NETWORK, (network_id, 0, 0), [blob])
            return blob
        limit = config.network(network_id).max_byte_num
        (got_id, _, _), payload = self.receive(FrameKind.NETWORK, limit)
        if got_id != network_id:
            raise ScaleOutError(f"rank 0 sent network {got_id} where network {network_id} was expected")
        return payload.numpy().tobytes()

    def experience(self, config: SessionConfig, replay: ReplayBuffer | None = None) -> ReplayBuffer:
        """The socket body layout: zero-copy on rank 0 (views of its arrays), one buffer elsewhere."""
        if self.leader:
            assert replay is not None
            layout = ReplayLayout.from_config(config.replay_buffer(replay.replay_buffer_id))
            body = layout.encode_socket_parts(replay, 0)[1:]  # without the 16-byte header
            ints = (replay.replay_buffer_id, replay.episode_num, replay.step_num)
            self.send(FrameKind.EXPERIENCE, ints, body)
            return replay
        (rb_id, episodes, steps), nbytes = self._header(FrameKind.EXPERIENCE)
        # The bound is the layout's size for the announced counts, which socket_body_size checks against
        # the config's MaxEpisodeNum / MaxStepNum before anything is allocated.
        layout = ReplayLayout.from_config(config.replay_buffer(rb_id))
        need = layout.socket_body_size(episodes, steps)
        if nbytes != need:
            raise ScaleOutError(
                f"rank 0's replay buffer holds {nbytes} bytes but {episodes} episodes and {steps} steps need {need}"
            )
        return layout.decode_socket_body(self._payload(nbytes).numpy().data, episodes, steps, rb_id)


# --------------------------------------------------------------------------------------------------
# Shared run state (main thread, links, watchdog)


@dataclass
class RunState:
    """What the main thread, the links and the watchdog share. ``lock`` guards the step/finish hand-off."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    in_step: bool = False
    step_started: float = 0.0
    iterations_done: int = 0
    finishing: bool = False
    """The watchdog took over the ending; the main thread must not touch the link any more."""
    game_stop: bool = False
    interrupted: bool = False
    lost: str = ""
    lost_code: int = int(ExitCode.PEER_GONE)
    failure_published: bool = False
    job: DistributedTrainingJob | None = None
    link: Rank0Link | None = None

    @contextlib.contextmanager
    def stepping(self) -> Iterator[None]:
        with self.lock:
            self.in_step = True
            self.step_started = time.monotonic()
        try:
            yield
        finally:
            with self.lock:
                self.in_step = False
                claimed = self.finishing
            if claimed:
                threading.Event().wait()  # the watchdog is ending the process (os._exit)


class _ConsensusInterrupt:
    """The loop's interrupt flag on every rank: set only when the ranks agreed (after a step)."""

    def __init__(self, state: RunState) -> None:
        self._state = state

    def is_set(self) -> bool:
        return self._state.interrupted


@dataclass
class RankContext:
    """One rank's view of the job: who it is, how it talks to the others, what it shares."""

    env: DistEnv
    channel: RankChannel
    state: RunState = field(default_factory=RunState)
    store: Any = None
    """The rendezvous store (c10d ``Store``) for published failures; None in tests without one."""
    local_interrupt: Callable[[], bool] = lambda: False
    agree_every: int = DEFAULT_AGREE_EVERY
    """Steps between agreements (stop, interrupt, rank 0's link failure, loss): a Stop or a signal is
    acted on within this many steps; one all-reduce per step would double the collectives."""
    poll_game: Callable[[], bool] | None = None
    """Rank 0: the real link's ``stop_requested`` (may raise when the game is gone)."""
    timeouts: Timeouts = field(default_factory=Timeouts)
    """The run's waits (``Timeouts.from_env()`` in :func:`run_rank`): keep-alive period, close."""

    def publish(self, name: str, code: int, message: str) -> None:
        if self.store is None:
            return
        with contextlib.suppress(Exception):
            self.store.set(self.env.key(name), f"{code}\n{message}".encode())

    def read(self, name: str) -> tuple[int, str] | None:
        """A published ``(code, message)``, or None; raises when the store itself is gone."""
        if self.store is None or not self.store.check([self.env.key(name)]):
            return None
        code, _, message = bytes(self.store.get(self.env.key(name))).decode(errors="replace").partition("\n")
        return int(code), message

    def peer_failure(self) -> str | None:
        """``"rank r failed: ..."`` for the first rank that published a failure (None: none did)."""
        for rank in range(self.env.world_size):
            if rank == self.env.rank:
                continue
            try:
                found = self.read(f"failed/{rank}")
            except Exception:
                return None
            if found is not None:
                return f"rank {rank} of {self.env.world_size} failed (exit code {found[0]}): {found[1]}"
        return None

    def lost(self, error: BaseException, iteration: int) -> RankLost:
        """The training-time failure of a collective, with the best explanation available."""
        deadline = time.monotonic() + PEER_GRACE_S
        who = self.peer_failure()
        while who is None and time.monotonic() < deadline:
            time.sleep(0.05)  # a failing rank publishes just before it exits; give it a moment
            who = self.peer_failure()
        if who is None:
            leader_end = None if self.env.leader else _wait_read(self, "outcome", PEER_GRACE_S)
            if leader_end is not None:
                # Rank 0 ended first (e.g. the game stopped it during a sync): follow its exit code.
                self.state.lost_code = leader_end[0]
                who = f"rank 0 ended (exit code {leader_end[0]}): {leader_end[1]}"
            else:
                who = f"another training process stopped answering ({_first_line(error)})"
        message = f"scale-out: {who}; training stopped at iteration {iteration}"
        self.state.lost = message
        return RankLost(message)


def _safe_read(ctx: RankContext, name: str) -> tuple[int, str] | None:
    try:
        return ctx.read(name)
    except Exception:
        return None


def _wait_read(ctx: RankContext, name: str, timeout: float) -> tuple[int, str] | None:
    deadline = time.monotonic() + timeout
    found = _safe_read(ctx, name)
    while found is None and time.monotonic() < deadline:
        time.sleep(0.05)
        found = _safe_read(ctx, name)
    return found


# --------------------------------------------------------------------------------------------------
# The job on every rank


class _GradientCarrier(nn.Module):
    """Holds the model's trainable parameters (the same objects, not copies) so that DDP owns their
    gradient hooks. Its forward is the identity: calling the DDP wrapper once per step arms DDP's
    reducer, and the backward of the loss, however the model computed it (train_step, distill_step),
    then averages every gradient across ranks in DDP's buckets, overlapped with the backward.

    [INF] Rejected: wrapping ``model.denoiser`` in DDP. It changes state-dict keys (checkpoints), would be
    deep-copied by the distiller's teacher, and the encoder would need a second DDP instance."""

    def __init__(self, params: Sequence[nn.Parameter]) -> None:
        super().__init__()
        self.params = nn.ParameterList(params)

    def forward(self, x: Tensor) -> Tensor:
        return x


class RankAveraging:
    """:class:`trainer.steps.base.GradientAveraging` across the ranks of this job.

    Autograd steps (a trained encoder, distillation, layers the fused step does not cover): DDP, armed
    before each step over a :class:`_GradientCarrier`, averages the gradients while the backward runs.
    The fused step (:class:`trainer.steps.fused.FusedStep`) has no autograd graph for DDP to hook into;
    its gradients already live in one contiguous buffer, which is what DDP's reducer builds (as buckets)
    before it calls the same c10d all-reduce, so that buffer is all-reduced once, between its backward and
    its AdamW. Each rank's fused step draws its own B / N rows (with replacement, so the union is
    distributed as one draw of B rows). The finiteness check runs again on the averaged gradient, which
    every rank shares, so all ranks diverge together."""

    def __init__(self, params: Sequence[nn.Parameter], device: torch.device, world_size: int) -> None:
        device_ids = [torch.cuda.current_device()] if device.type == "cuda" else None
        self.ddp = DistributedDataParallel(
            _GradientCarrier(params), device_ids=device_ids, find_unused_parameters=False
        )
        self.arm_input = torch.zeros((), device=device)
        self.world_size = world_size

    def arm_autograd(self) -> None:
        self.ddp(self.arm_input)

    def average_flat(self, flat_grads: Tensor) -> None:
        dist.all_reduce(flat_grads)
        flat_grads.div_(self.world_size)
        if not bool(torch.isfinite(flat_grads).all()):
            raise Diverged(
                "the averaged gradient became non-finite; the weights of the last good iteration were kept"
            )


@dataclass
class DistributedTrainingJob(TrainingJob):
    """A :class:`TrainingJob` whose steps average their gradients across the ranks (its
    ``gradient_averaging`` is a :class:`RankAveraging`) and which, every ``agree_every`` steps, agrees
    with the other ranks on stop, interrupt and the logged loss."""

    rank_context: RankContext | None = None

    def _context(self) -> RankContext:
        if self.rank_context is None:
            raise ScaleOutError("DistributedTrainingJob used without scale_out_job")
        return self.rank_context

    def step(self, iteration: int) -> float:
        """One DDP step; every ``agree_every``-th step also one small all-reduce on which the ranks agree
        on stop, interrupt and a failure of rank 0's link, and average the smoothed loss (what a
        1-process run would log). Raises :class:`RankLost` when a peer is gone.

        :class:`Diverged` passes through unchanged: train_step checks the gradient norm after DDP averaged
        the gradients, so every rank sees the same norm and diverges at the same step. A rank that
        diverged alone would leave, and the others would see it as a lost rank.
        """
        ctx = self._context()
        state = ctx.state
        with state.stepping():
            try:
                super().step(iteration)
            except RuntimeError as error:
                if is_collective_failure(error):
                    raise ctx.lost(error, iteration) from error
                raise
            state.iterations_done = iteration + 1
            if (iteration + 1) % ctx.agree_every:
                return self.smoothed_loss
            failure: BaseException | None = None
            game_stop = False
            if ctx.poll_game is not None:
                try:
                    game_stop = ctx.poll_game()
                except Exception as error:  # the game is gone: every rank stops, rank 0 re-raises
                    failure = error
            abort = int(exit_code_for(failure)) + 1 if failure is not None else 0
            loss = self.smoothed_loss if math.isfinite(self.smoothed_loss) else 0.0
            flags = [float(game_stop), float(ctx.local_interrupt()), float(abort), loss]
            check = _weights_checksum(self.model.trainable_parameters()).to(torch.float64)
            votes = torch.cat(
                (torch.tensor(flags, dtype=torch.float64, device=self.device), check, check * check)
            )
            try:
                dist.all_reduce(votes)
            except RuntimeError as error:
                if is_collective_failure(error):
                    raise ctx.lost(error, iteration) from error
                raise
            stops, interrupts, aborts, loss_sum, check_sum, check_sq = votes.tolist()
        if int(check_sum) ** 2 != ctx.env.world_size * int(check_sq):
            # Every rank applies the same averaged update, so the weights are bitwise equal; a difference
            # means a step did not average its gradients. The sums are shared, so every rank stops here.
            message = (
                f"scale-out: the training processes' weights differ after iteration {iteration + 1}: a step did "
                "not average its gradients (a bug: please report it with the log)"
            )
            state.lost, state.lost_code = message, int(ExitCode.INTERNAL)
            raise ReplicasDiffer(message)
        if aborts > 0:
            if failure is not None:
                raise failure
            raise ScaleOutError(
                "scale-out: rank 0 lost the game and ended the run; this rank stops too",
                ExitCode(int(aborts) - 1),
            )
        state.game_stop = state.game_stop or stops > 0
        state.interrupted = state.interrupted or interrupts > 0
        if math.isfinite(self.smoothed_loss):
            self.smoothed_loss = loss_sum / ctx.env.world_size
        return self.smoothed_loss


CHECKSUM_MODULUS = 1 << 20
"""The weights' checksum is kept below 2**20 so that its square summed over ranks stays an exact integer
in float64 (up to 8192 ranks)."""


def _weights_checksum(params: Iterator[nn.Parameter]) -> Tensor:
    """(1,) int64 on the parameters' device: the sum of every weight's float32 bit pattern, mod 2**20
    (no host sync)."""
    total: Tensor | None = None
    for p in params:
        bits = p.detach().contiguous().view(torch.int32).sum(dtype=torch.int64)
        total = bits if total is None else total + bits
    if total is None:
        return torch.zeros(1, dtype=torch.int64)
    return torch.remainder(total, CHECKSUM_MODULUS).reshape(1)


def _state_skeleton(job: TrainingJob) -> tuple[dict[str, Any], list[Tensor]]:
    """JSON description of rank 0's start state and the tensors to broadcast after it, in order."""
    model_state = job.model.state_dict()
    tensors: list[Tensor] = list(model_state.values())
    skeleton: dict[str, Any] = {
        "start_iteration": job.start_iteration,
        "smoothed_loss": job.smoothed_loss if math.isfinite(job.smoothed_loss) else None,
        "total_iterations": job.total_iterations,
        "sample_num": job.sample_num,
        "model": [[name, str(t.dtype), list(t.shape)] for name, t in model_state.items()],
        "optimizer": None,
    }
    optimizer_state = job.optimizer.state_dict()
    if optimizer_state["state"]:  # only after a resume: a fresh AdamW has no state yet
        entries = []
        for index, values in sorted(optimizer_state["state"].items()):
            items = []
            for key, value in sorted(values.items()):
                if isinstance(value, Tensor):
                    items.append(
                        [
                            key,
                            {
                                "dtype": str(value.dtype),
                                "shape": list(value.shape),
                                "device": value.device.type,
                            },
                        ]
                    )
                    tensors.append(value)
                else:
                    items.append([key, value])
            entries.append([index, items])
        skeleton["optimizer"] = {"param_groups": optimizer_state["param_groups"], "state": entries}
    try:
        json.dumps(skeleton)
    except (TypeError, ValueError) as error:
        raise ScaleOutError(f"the start state cannot be shared between ranks as JSON: {error}") from None
    return skeleton, tensors


def sync_start_state(job: TrainingJob, ctx: RankContext) -> None:
    """Every rank starts from rank 0's model, EMA, optimiser state, iteration and loss.

    [INF] Done always, not only after a resume: the latent statistics are measured per rank, and on
    different GPUs they may differ in the last bit; training must start from one state."""
    channel = ctx.channel
    if ctx.env.leader:
        skeleton, tensors = _state_skeleton(job)
        channel.send(FrameKind.STATE, (0, 0, 0), [json.dumps(skeleton).encode()])
        for tensor in tensors:
            channel.tensor(tensor)
        return
    _, payload = channel.receive(FrameKind.STATE, MAX_STATE_BYTES)
    skeleton = json.loads(payload.numpy().tobytes())
    mine, _ = _state_skeleton(job)
    for key in ("total_iterations", "sample_num", "model"):
        if skeleton[key] != mine[key]:
            raise ScaleOutError(
                f"rank {ctx.env.rank} built a different job than rank 0 ({key}: {mine[key]!r:.200} vs "
                f"{skeleton[key]!r:.200}); every rank must run the same la-trainer and torch versions"
            )
    model_state = job.model.state_dict()
    for tensor in model_state.values():
        channel.tensor(tensor)  # state_dict() tensors share storage with the model: updated in place
    job.model.load_state_dict(model_state)  # refreshes the EMA step counter from its buffer
    if skeleton["optimizer"] is not None:
        state: dict[int, dict[str, Any]] = {}
        for index, items in skeleton["optimizer"]["state"]:
            entry: dict[str, Any] = {}
            for key, value in items:
                if isinstance(value, dict) and set(value) == {"dtype", "shape", "device"}:
                    dtype = _DTYPES.get(value["dtype"])
                    if dtype is None:
                        raise ScaleOutError(f"optimizer state dtype {value['dtype']} is not supported")
                    device = job.device if value["device"] != "cpu" else torch.device("cpu")
                    tensor = torch.empty(value["shape"], dtype=dtype, device=device)
                    channel.tensor(tensor)
                    entry[key] = tensor
                else:
                    entry[key] = value
            state[int(index)] = entry
        job.optimizer.load_state_dict({"state": state, "param_groups": skeleton["optimizer"]["param_groups"]})
    job.start_iteration = int(skeleton["start_iteration"])
    loss = skeleton["smoothed_loss"]
    job.smoothed_loss = math.nan if loss is None else float(loss)


def scale_out_job(job: TrainingJob, ctx: RankContext) -> DistributedTrainingJob:
    """Make ``job`` one rank of the data-parallel job (collective: every rank calls it once).

    Start state from rank 0; a :class:`ShardSampler` over the global batch (index stream seeded with
    ``derive_seed(seed, start, 0)`` on every rank); flow noise and times from
    ``derive_seed(seed, start, 1 + rank)``; DDP over the trainable parameters; CPU threads split among the
    node's ranks.
    """
    env = ctx.env
    if (
        job.device.type == "cuda"
        and torch.cuda.is_available()
        and env.local_rank >= torch.cuda.device_count()
    ):
        raise ScaleOutError(
            f"{env.local_world_size} processes on this node but only {torch.cuda.device_count()} GPU(s): "
            "use --nproc-per-node <= the GPU count (NCCL needs one GPU per process)",
            ExitCode.USAGE,
        )
    try:
        sync_start_state(job, ctx)
        averaging = RankAveraging(list(job.model.trainable_parameters()), job.device, env.world_size)
    except RuntimeError as error:
        if is_collective_failure(error):
            who = ctx.peer_failure() or f"another training process stopped answering ({_first_line(error)})"
            raise ScaleOutError(f"scale-out: {who} while the ranks prepared", ExitCode.PEER_GONE) from error
        raise
    training = job.config.trainer.training
    start = job.start_iteration
    index_generator = torch.Generator(device=job.device)
    index_generator.manual_seed(derive_seed(training.seed, start, 0))
    job.generator.manual_seed(derive_seed(training.seed, start, 1 + env.rank))
    sampler = ShardSampler(job.tensors, training.batch_size, env.rank, env.world_size, index_generator)
    values = {f.name: getattr(job, f.name) for f in fields(job) if f.init}
    scaled = DistributedTrainingJob(
        **{**values, "sampler": sampler, "gradient_averaging": averaging}, rank_context=ctx
    )
    for f in fields(job):
        if not f.init:
            setattr(scaled, f.name, getattr(job, f.name))
    if job.device.type == "cpu":
        share = max(1, (os.cpu_count() or 1) // max(1, env.local_world_size))
        torch.set_num_threads(min(torch.get_num_threads(), share))
    ctx.state.job = scaled
    ctx.state.iterations_done = start
    if env.leader:
        log(
            f"la-trainer: scale-out: {env.world_size} processes, global batch {training.batch_size} = "
            f"{env.world_size} × {sampler.batch_size}, backend {dist.get_backend()}"
        )
    return scaled


# --------------------------------------------------------------------------------------------------
# Links


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
        ctx.poll_game = self._poll_game
        ctx.state.link = self

    @property
    def comm_type(self) -> str:
        return self.real.comm_type

    def _poll_game(self) -> bool:
        """The game's Stop; raises when the game is gone. Under torchrun our parent is torchrun, so the
        real link's parent watch cannot see a crashed engine: the launcher passes the engine's pid."""
        if self.engine_pid is not None and not _process_alive(self.engine_pid):
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
        layers = job.export()
        blobs = {
            nid: write_snapshot(snapshot_with_model(read_snapshot(self.received[nid]), layers[nid]))
            for nid in sorted(self.received)
        }
        self.version += 1
        for nid, blob in blobs.items():
            self.real.send_network(nid, blob, self.version)
        self.real.send_complete()
        self.real.finish(self.ctx.timeouts.close)


def _engine_pid() -> int | None:
    raw = os.environ.get(ENV_ENGINE_PID, "")
    return int(raw) if raw.isdigit() and os.name == "posix" else None


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # POSIX only: signal 0 checks existence (on Windows it would send CTRL_C)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class BroadcastLink:
    """Ranks ≥ 1: receives what rank 0 broadcasts; sends nothing; stops when the ranks agree."""

    comm_type = "Unknown"
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


# --------------------------------------------------------------------------------------------------
# Watchdog


class Watchdog:
    """A daemon thread that ends a rank whose main thread is stuck in a collective.

    Rank 0, while a step waits on the others: a published failure of another rank (after
    :data:`PEER_GRACE_S`), SIGTERM/SIGINT (after :data:`SIGNAL_GRACE_S`), or ``stall_s`` without progress
    → send the current networks and Complete to the game, publish the outcome, ``os._exit(PEER_GONE)``.
    Ranks ≥ 1: rank 0's published outcome, a lost store, or a signal while stuck → exit with rank 0's code.
    Signals are seen through :func:`signal.set_wakeup_fd`, because a Python handler cannot run while the
    main thread is inside a blocking C++ call.
    """

    def __init__(
        self, ctx: RankContext, stall_s: float, *, exit_process: Callable[[int], None] = os._exit
    ) -> None:
        self.ctx = ctx
        self.stall_s = stall_s
        self._exit = exit_process
        self._failure_seen_at: float | None = None
        self._stop = threading.Event()
        self._signal_at: float | None = None
        self._reader: socket.socket | None = None
        self._writer: socket.socket | None = None
        self._previous_fd: int | None = None
        self._thread = threading.Thread(
            target=self._run, name=f"la-trainer-watchdog-{ctx.env.rank}", daemon=True
        )

    def start(self) -> Watchdog:
        if threading.current_thread() is threading.main_thread():
            self._reader, self._writer = socket.socketpair()
            self._reader.setblocking(False)
            self._writer.setblocking(False)
            self._previous_fd = signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)
        if self._writer is not None and threading.current_thread() is threading.main_thread():
            signal.set_wakeup_fd(self._previous_fd if self._previous_fd is not None else -1)
        for sock in (self._reader, self._writer):
            if sock is not None:
                sock.close()

    def _signals(self) -> None:
        if self._reader is None:
            return
        with contextlib.suppress(OSError):
            ready, _, _ = select.select([self._reader], [], [], 0)
            if ready and self._reader.recv(64) and self._signal_at is None:
                self._signal_at = time.monotonic()

    def _run(self) -> None:
        next_store_poll = 0.0
        while not self._stop.wait(WATCH_PERIOD_S):
            self._signals()
            now = time.monotonic()
            poll_store = now >= next_store_poll
            if poll_store:
                next_store_poll = now + 0.5
            reason = self._leader_reason(now, poll_store) if self.ctx.env.leader else None
            if reason is not None:
                self._end_leader(reason)
            elif not self.ctx.env.leader:
                self._check_follower(now, poll_store)

    def _stuck_for(self, now: float) -> float:
        state = self.ctx.state
        return now - state.step_started if state.in_step else 0.0

    def _leader_reason(self, now: float, poll_store: bool) -> str | None:
        stuck = self._stuck_for(now)
        if stuck <= 0:
            return None
        if poll_store and stuck > PEER_GRACE_S:  # a healthy step is milliseconds: no store traffic then
            who = self.ctx.peer_failure()
            if who is None:
                self._failure_seen_at = None
            elif self._failure_seen_at is None:
                # Give the main thread the first chance: its own path also writes the snapshot and checkpoint.
                self._failure_seen_at = now
            elif now - self._failure_seen_at > PEER_GRACE_S:
                return who
        if self._signal_at is not None and now - self._signal_at > SIGNAL_GRACE_S and stuck > SIGNAL_GRACE_S:
            return "a stop signal arrived while the ranks were waiting on each other"
        if stuck > self.stall_s:
            return f"no answer from the other training processes for {self.stall_s:.0f} s"
        return None

    def _end_leader(self, reason: str) -> None:
        state = self.ctx.state
        with state.lock:
            if state.finishing or not state.in_step or state.job is None:
                return
            state.finishing = True
        done = state.iterations_done
        message = f"scale-out: {reason}; training stopped at iteration {done}"
        code = int(ExitCode.PEER_GONE)
        print(
            f"la-trainer: {message}. Sending the networks of iteration {done} and Complete.",
            file=sys.stderr,
            flush=True,
        )
        try:
            if state.link is not None:
                state.link.emergency_complete(state.job)
        except BaseException as error:  # the process ends below whatever happens
            print(f"la-trainer: could not send the final networks: {error}", file=sys.stderr, flush=True)
        self.ctx.publish("outcome", code, message)
        self._flush_and_exit(code)

    def _check_follower(self, now: float, poll_store: bool) -> None:
        if poll_store:
            try:
                outcome = self.ctx.read("outcome")
            except Exception:
                outcome = (int(ExitCode.PEER_GONE), "the rendezvous store is gone (rank 0 or torchrun ended)")
            if outcome is not None:
                if self._stop.wait(PEER_GRACE_S):
                    return  # the main thread finished by itself
                code, text = outcome
                print(
                    f"la-trainer[rank {self.ctx.env.rank}]: rank 0 ended (exit code {code}): {text}; ending this rank.",
                    file=sys.stderr,
                    flush=True,
                )
                self._flush_and_exit(code)
        if (
            self._signal_at is not None
            and now - self._signal_at > SIGNAL_GRACE_S
            and self._stuck_for(now) > SIGNAL_GRACE_S
        ):
            print(
                f"la-trainer[rank {self.ctx.env.rank}]: stop signal while waiting on the other ranks; exiting.",
                file=sys.stderr,
                flush=True,
            )
            self._flush_and_exit(int(ExitCode.INTERRUPTED))

    def _flush_and_exit(self, code: int) -> None:
        self.ctx.publish(f"done/{self.ctx.env.rank}", code, "")
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        self._exit(code)


# --------------------------------------------------------------------------------------------------
# One rank, start to end


def _float_env(name: str, default: float) -> float:
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


def _collective_timeout(t: Timeouts) -> float:
    """[INF] Long enough for the other ranks to wait out rank 0's whole setup with the game (their first
    broadcast waits until the game sent everything), at least :data:`DEFAULT_TIMEOUT_S`."""
    setup = t.connect + t.config + 3 * t.network + t.experience + 60.0
    return _float_env(ENV_TIMEOUT, max(DEFAULT_TIMEOUT_S, setup))


def _training(
    ctx: RankContext, options: TrainerOptions, task_dir: Path | None
) -> Callable[[Any, InterruptFlag], int]:
    """The story each rank runs inside :func:`trainer.app.run_with_link`."""

    def train(link: Any, flag: InterruptFlag) -> int:
        from trainer.run import run_training

        ctx.local_interrupt = flag.is_set
        try:
            result = run_training(
                link,
                options=options,
                task_dir=task_dir,
                interrupt=_ConsensusInterrupt(ctx.state),
                prepare_job=lambda job: scale_out_job(job, ctx),
                timeouts=ctx.timeouts,
            )
        except BaseException as error:
            if not ctx.env.leader and not ctx.state.lost:
                # Tell rank 0 why, before this process ends and its collectives fail.
                ctx.publish(f"failed/{ctx.env.rank}", int(exit_code_for(error)), _first_line(error))
                ctx.state.failure_published = True
            raise
        if ctx.state.lost:
            where = "; the game got the last good networks and Complete" if ctx.env.leader else ""
            print(f"la-trainer: {ctx.state.lost}{where}.", file=sys.stderr, flush=True)
            return ctx.state.lost_code
        return int(result)

    return train


def _leader_runner(ctx: RankContext) -> Callable[..., int]:
    """What :func:`trainer.app.engine_main` calls on rank 0 once argv and options are valid."""

    def runner(
        open_link: Callable[[InterruptFlag], TrainerLink], *, options: TrainerOptions, task_dir: Path | None
    ) -> int:
        if options.device.lower().startswith("cuda:"):
            # Each rank trains on its own GPU (cuda:LOCAL_RANK, set at start); a fixed index would put
            # every rank on one GPU, which NCCL refuses.
            log(
                f"la-trainer: warning: scale-out ignores the device override {options.device!r}; using cuda:LOCAL_RANK"
            )
            options = replace(options, device="cuda")
        ctx.channel.options(options)
        return run_with_link(
            lambda flag: Rank0Link(open_link(flag), ctx),
            options=options,
            task_dir=task_dir,
            training=_training(ctx, options, task_dir),
        )

    return runner


def _follower_main(ctx: RankContext) -> int:
    options = ctx.channel.options()
    return run_with_link(
        lambda flag: BroadcastLink(ctx),
        options=replace(options, status_file=False),
        task_dir=None,
        training=_training(ctx, options, None),
    )


def run_rank(
    env: DistEnv,
    leader: Callable[[Callable[..., int]], int],
    *,
    init_method: str = "env://",
) -> int:
    """One rank of the job, start to end; returns its exit code.

    ``leader(runner)`` runs rank 0's side: production passes ``lambda r: engine_main(argv, runner=r)``;
    tests call ``runner(open_link, options=..., task_dir=...)`` with an in-memory game link.
    """
    timeouts = Timeouts.from_env()
    timeout = timedelta(seconds=_collective_timeout(timeouts))
    stall = _float_env(ENV_STALL, DEFAULT_STALL_S)
    agree_every = _env_int(os.environ, ENV_AGREE, 1) or DEFAULT_AGREE_EVERY
    cuda = torch.cuda.is_available()
    if cuda and env.local_rank < torch.cuda.device_count():
        torch.cuda.set_device(env.local_rank)
    store, _, _ = next(
        iter(rendezvous(init_method, rank=env.rank, world_size=env.world_size, timeout=timeout))
    )
    backend = select_backend(cuda, os.environ.get(ENV_BACKEND, ""))
    dist.init_process_group(backend, store=store, rank=env.rank, world_size=env.world_size, timeout=timeout)
    ctx = RankContext(
        env=env,
        channel=RankChannel(lambda t: dist.broadcast(t, src=0), leader=env.leader),
        store=store,
        agree_every=agree_every,
        timeouts=timeouts,
    )
    if not env.leader:
        # Rank 0 alone logs (the engine copies our stdout into its log); errors still go to stderr.
        sys.stdout = io.TextIOWrapper(open(os.devnull, "wb"), write_through=True)
    watchdog = Watchdog(ctx, stall).start()
    code = int(ExitCode.INTERNAL)
    try:
        code = leader(_leader_runner(ctx)) if env.leader else _follower_main(ctx)
    except Exception as error:  # outside run_with_link: the options frame, a collective at the start
        code, why = int(exit_code_for(error)), str(error)
        if is_collective_failure(error):
            code, why = int(ExitCode.PEER_GONE), ctx.peer_failure() or _first_line(error)
            ended = None if env.leader else _wait_read(ctx, "outcome", PEER_GRACE_S)
            if ended is not None:  # rank 0 could not start (bad command line, no game): follow it
                code, why = ended[0], f"rank 0 ended (exit code {ended[0]}): {ended[1]}"
        print(f"la-trainer[rank {env.rank}]: scale-out could not start: {why}", file=sys.stderr, flush=True)
    finally:
        watchdog.stop()
        if env.leader:
            message = ctx.state.lost or ("finished" if code == 0 else "it ended with an error (see its log)")
            ctx.publish("outcome", code, message)
            if not env.agent_store:
                _wait_for_ranks(ctx, 10.0)  # we host the store: let the others read the outcome first
        else:
            if code != 0 and not ctx.state.failure_published and not ctx.state.lost:
                ctx.publish(f"failed/{env.rank}", code, "see its log")
            ctx.publish(f"done/{env.rank}", code, "")
        if not ctx.state.lost:
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
    return code


def _wait_for_ranks(ctx: RankContext, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    pending = set(range(1, ctx.env.world_size))
    while pending and time.monotonic() < deadline:
        for rank in list(pending):
            if _safe_read(ctx, f"done/{rank}") is not None:
                pending.discard(rank)
        time.sleep(0.05)


# --------------------------------------------------------------------------------------------------
# Entry point


def torchrun_command(argv: Sequence[str], nproc: int, extra: Sequence[str] = ()) -> list[str]:
    """``python -m torch.distributed.run [EXTRA | --standalone] --nproc-per-node N -m trainer.distributed
    ARGV``."""
    launch = list(extra) if extra else ["--standalone"]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *launch,
        "--nproc-per-node",
        str(nproc),
        "-m",
        "trainer.distributed",
        *argv,
    ]


def _exec_torchrun(argv: Sequence[str], nproc: int) -> int:
    """Engine-spawned mode: replace this process by torchrun (same pid, so the engine still watches it)."""
    command = torchrun_command(argv, nproc, shlex.split(os.environ.get(ENV_TORCHRUN_ARGS, "")))
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env[ENV_ENGINE_PID] = str(os.getppid())
    sys.stdout.flush()
    if os.name == "nt":  # pragma: no cover - no exec on Windows
        import subprocess

        return subprocess.call(command, env=env)
    os.execve(sys.executable, command, env)
    return int(ExitCode.INTERNAL)  # pragma: no cover - execve does not return


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m trainer.distributed <engine argv>`` (under torchrun, or launching it)."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        env = DistEnv.from_environ(os.environ)
        nproc = _env_int(os.environ, ENV_NPROC, 1)
        if env is not None and env.world_size > 1:
            _float_env(ENV_STALL, DEFAULT_STALL_S)
            _float_env(ENV_TIMEOUT, DEFAULT_TIMEOUT_S)
            _env_int(os.environ, ENV_AGREE, 1)
    except LaunchError as error:
        print(f"la-trainer: {error}", file=sys.stderr, flush=True)
        return int(ExitCode.USAGE)
    if env is None:
        return _exec_torchrun(args, nproc) if nproc is not None and nproc > 1 else engine_main(args)
    if env.world_size == 1:
        return engine_main(args)  # one process: the ordinary path, bit for bit
    return run_rank(env, lambda runner: engine_main(args, runner=runner))


if __name__ == "__main__":
    sys.exit(main())
