"""What ``la-trainer bench`` measures: the training configurations, the targets and the run's settings."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

__all__ = [
    "ACT_DIM",
    "ENGINE_TICK_S",
    "ENGINE_TIMEOUT_S",
    "EPISODE_STEPS",
    "OBS_DIM",
    "SECTIONS",
    "SYNC_STEPS",
    "TARGETS",
    "TRAIN_CONFIGS",
    "TRAIN_ROWS",
    "TRANSPORTS",
    "BenchSettings",
    "Target",
    "TrainConfig",
]

OBS_DIM = 32
ACT_DIM = 8
EPISODE_STEPS = 1000
"""Steps per episode of the synthetic replay buffers."""
TRAIN_ROWS = 100_000
"""Training rows of the synthetic data set (enough that batches come from memory, not cache)."""
SYNC_STEPS = 20_000
"""Steps of the small buffer the sync measurement trains on."""
ENGINE_TIMEOUT_S = 120.0
"""The emulated engine's communicator timeout here: the bench measures speed, not the engine's 10 s
patience (a startup over 10 s is reported as such instead of failing the run)."""
ENGINE_TICK_S = 0.0002
"""The emulated engine's HasNetworkOrCompleted period during the sync measurement (frame latency out)."""
SECTIONS = ("train", "ingest", "startup", "sync")
"""The bench's sections, in the order they run."""
TRANSPORTS = ("shm", "socket")
"""The transports ingest and sync are measured over."""


@dataclass(frozen=True, slots=True)
class TrainConfig:
    """One training configuration. ``hidden_layer_num``/``hidden_layer_size`` are the engine's
    FlowMatchingSettings: the denoiser has ``hidden_layer_num + 2`` Linear layers (spec §10 item 1)."""

    name: str
    hidden_layer_num: int
    hidden_layer_size: int
    batch_size: int
    chunk_size: int = 1
    obs_dim: int = OBS_DIM
    act_dim: int = ACT_DIM

    @property
    def layer_widths(self) -> tuple[int, ...]:
        """(In, H, …, H, Out) of the denoiser MLP; In = L + C·Av + 1 (the encoder is one Denormalize)."""
        in_width = self.obs_dim + self.chunk_size * self.act_dim + 1
        hidden = (self.hidden_layer_size,) * (self.hidden_layer_num + 1)
        return (in_width, *hidden, self.chunk_size * self.act_dim)

    @property
    def flops_per_iteration(self) -> int:
        """6·B·Σ In·Out: forward 2·B·Σ In·Out, backward twice that (the usual convention; our backward
        skips the first layer's input gradient, so it is an upper bound on the work)."""
        w = self.layer_widths
        return 6 * self.batch_size * sum(a * b for a, b in itertools.pairwise(w))

    def describe(self) -> str:
        widths = "->".join(str(x) for x in self.layer_widths)
        return (
            f"{self.name}: HiddenLayerNum {self.hidden_layer_num}, HiddenLayerSize {self.hidden_layer_size}, "
            f"{self.hidden_layer_num + 2} Linear layers {widths}, batch {self.batch_size}, "
            f"ActionChunkSize {self.chunk_size}"
        )


TRAIN_CONFIGS: tuple[TrainConfig, ...] = (
    # The engine defaults (spec §4.1, §4.3): observation 32, action 8.
    TrainConfig("default", hidden_layer_num=1, hidden_layer_size=128, batch_size=256),
    # "3×256": 3 Linear layers of width 256 (HiddenLayerNum 1, HiddenLayerSize 256) at batch 1024.
    TrainConfig("wide", hidden_layer_num=1, hidden_layer_size=256, batch_size=1024),
    # "2×512" with ActionChunkSize 8: 2 Linear layers of width 512 (HiddenLayerNum 0), A = 8·8 = 64.
    TrainConfig("chunk8", hidden_layer_num=0, hidden_layer_size=512, batch_size=256, chunk_size=8),
)


@dataclass(frozen=True, slots=True)
class Target:
    """One goal of the performance issue: ``key`` into the flat results, ``op`` ">=" or "<=", bound."""

    key: str
    op: str
    bound: float
    text: str


TARGETS: tuple[Target, ...] = (
    Target("train.default.ours_over_reference", ">=", 3.0, "default: ours >= 3x the reference loop"),
    Target("train.default.ours_over_roofline", ">=", 0.5, "default: ours >= 50% of roofline"),
    Target("train.wide.ours_over_roofline", ">=", 0.7, "wide: ours >= 70% of roofline"),
    Target("train.chunk8.ours_over_roofline", ">=", 0.7, "chunk8: ours >= 70% of roofline"),
    Target("ingest.shm_over_memcpy", ">=", 0.5, "shm ingest >= 50% of memcpy"),
    Target("ingest.socket_over_raw", ">=", 0.5, "socket ingest >= 50% of raw loopback"),
    Target("startup.first_request_s", "<", 3.0, "launch -> first network request < 3 s"),
    Target("sync.shm_round_ms", "<", 5.0, "one sync round < 5 ms (shm)"),
    Target("sync.socket_round_ms", "<", 20.0, "one sync round < 20 ms (socket)"),
    Target("ingest.peak_rss_over_buffer", "<=", 2.5, "peak RSS while ingesting <= 2.5x the buffer"),
)


@dataclass(frozen=True, slots=True)
class BenchSettings:
    """What one ``la-trainer bench`` run measures (see the CLI options)."""

    sections: tuple[str, ...] = SECTIONS
    configs: tuple[str, ...] = tuple(c.name for c in TRAIN_CONFIGS)
    repeats: int = 5
    train_seconds: float = 1.0
    train_rows: int = TRAIN_ROWS
    matmul_size: int = 1024
    ingest_mb: float = 1024.0
    sync_rounds: int = 20
    startup_repeats: int = 5
    device: str = "auto"
    threads: int = 0
    transports: tuple[str, ...] = TRANSPORTS
