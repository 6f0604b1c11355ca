"""Rank frames: what rank 0 broadcasts to every rank (options, config, snapshots, replay buffer, start
state), and the payload codecs, which are the protocol's own encodings (JSON, snapshot bytes, the socket
replay layout; never pickle)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from enum import IntEnum

import numpy as np
import torch
from torch import Tensor

from protocol.config import (
    SessionConfig,
    data_config_to_json,
    dump_json,
    parse_json,
    session_from_shared_memory,
    trainer_config_to_json,
)
from protocol.replay import ReplayBuffer, ReplayLayout
from trainer.distributed.errors import ScaleOutError
from trainer.settings.options import TrainerOptions, load_options, options_json

__all__ = [
    "CHUNK_BYTES",
    "FRAME_HEADER_WORDS",
    "FRAME_MAGIC",
    "MAX_CONFIG_BYTES",
    "MAX_OPTIONS_BYTES",
    "MAX_STATE_BYTES",
    "Broadcast",
    "FrameKind",
    "RankChannel",
    "decode_config",
    "decode_options",
    "encode_config",
    "encode_options",
]

FRAME_MAGIC = 0x4C41_5452_4E44_5031  # "LATRNDP1": rank frames of this version
FRAME_HEADER_WORDS = 6
"""int64 header: magic, kind, a, b, c, payload bytes."""
CHUNK_BYTES = 64 * 1024 * 1024
"""Payloads travel in broadcasts of at most this many bytes (bounds the staging copy and gloo's buffers)."""
MAX_OPTIONS_BYTES = 1 << 20
MAX_CONFIG_BYTES = 256 * 1024 * 1024
"""As ``trainer.session.transport.files.CONFIG_FILE_LIMIT``: real configs are kilobytes."""
MAX_STATE_BYTES = 64 * 1024 * 1024
"""JSON skeleton of the start state (tensor names, shapes); the tensors follow as their own broadcasts."""


# --------------------------------------------------------------------------------------------------
# Payload codecs (pure: bytes in, values out)


def encode_options(options: TrainerOptions) -> bytes:
    return json.dumps(options_json(options)).encode("utf-8")


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
