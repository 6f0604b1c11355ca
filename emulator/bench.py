"""``la-trainer bench``: training throughput, replay ingest, startup and sync, each next to its limit.

One run measures everything side by side, so the ratios hold even on a loaded machine (each number is
the median of ``--repeats`` runs, contenders interleaved so that load changes hit all of them alike):

1. **Training** (iterations/s) per configuration of :data:`TRAIN_CONFIGS`, for
   ``ours`` (what :class:`trainer.job.TrainingJob` runs, with the thread count the trainer picks),
   ``autograd`` (:func:`trainer.steps.autograd.train_step`, the readable reference) and ``reference``: the loop a
   public flow-matching example would write (``nn.Sequential``, ``torch.optim.AdamW`` with the same
   hyperparameters and amsgrad, per-step sampling, torch's default threads, no EMA). The roofline is the
   matmul rate (a 1024³ ``torch.mm`` on every core, timed interleaved with the contenders so that it
   sees the same load) divided by the MLP's FLOPs per iteration, ``6·B·Σ In·Out`` (forward
   2·B·Σ In·Out, backward twice that). On CUDA the same contenders also run on the GPU (no CUDA graphs).
2. **Ingest** of a ``--ingest-mb`` replay buffer into a trainer-side process over shared memory and over
   the socket (the real :mod:`trainer.links` links against the emulator's :mod:`emulator.game`
   drivers), against a memcpy of the same bytes and a raw loopback transfer, in the same processes.
   Time = from the engine posting the buffer (shm) or starting to send it (socket) to
   ``receive_experience`` returning in the trainer process (one system-wide monotonic clock). The shm
   trainer pre-faults its copy-out target while it waits (:mod:`trainer.transport.staging`); the engine
   side writes the buffer only after the trainer says it is waiting, so that work races the engine's
   write here as it does in a real session (where the engine also writes into fresh regions, slower
   than the warm ones reused by these repeats, so staging usually finishes there).
3. **Startup** of the real trainer (``scripts/train.py`` spawned as the engine spawns it, shared memory):
   launch → first network request, → training loop start (its log line), → first sync round, which
   follows the first iteration (``LA_TRAINER_SYNC_EVERY_ITERATIONS=1``).
4. **Sync**: one round of networks 0, 1, 2 with the default networks: export + encode (the trainer's
   work) and the hand-over until the engine holds network 2, the engine polling as in ReceiveNetwork
   (every 1 ms) and checking for networks every 0.2 ms (game frame latency excluded).
5. **Peak RSS** of the trainer-side process while it ingests the buffer (``VmHWM``, reset before each
   ingest via ``/proc/self/clear_refs``), absolute and as a multiple of the buffer size.

The worker that plays the trainer side of (2), (4) and (5) is this module run as
``python -m emulator.bench --worker SPEC``; it prints one ``@@bench`` JSON line per result.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import math
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click
import numpy as np

__all__ = [
    "TARGETS",
    "TRAIN_CONFIGS",
    "BenchSettings",
    "Target",
    "TrainConfig",
    "bench_command",
    "format_report",
    "run_bench",
]

_MARK = "@@bench "
"""Prefix of the worker's result lines (everything else it prints is log)."""
_OBS_DIM = 32
_ACT_DIM = 8
_EPISODE_STEPS = 1000
"""Steps per episode of the synthetic replay buffers."""
_TRAIN_ROWS = 100_000
"""Training rows of the synthetic data set (enough that batches come from memory, not cache)."""
_SYNC_STEPS = 20_000
"""Steps of the small buffer the sync measurement trains on."""
_ENGINE_TIMEOUT_S = 120.0
"""The emulated engine's communicator timeout here: the bench measures speed, not the engine's 10 s
patience (a startup over 10 s is reported as such instead of failing the run)."""
_ENGINE_TICK_S = 0.0002
"""The emulated engine's HasNetworkOrCompleted period during the sync measurement (frame latency out)."""


# ---------------------------------------------------------------------------------------------------------
# Configurations and targets


@dataclass(frozen=True, slots=True)
class TrainConfig:
    """One training configuration. ``hidden_layer_num``/``hidden_layer_size`` are the engine's
    FlowMatchingSettings: the denoiser has ``hidden_layer_num + 2`` Linear layers (spec §10 item 1)."""

    name: str
    hidden_layer_num: int
    hidden_layer_size: int
    batch_size: int
    chunk_size: int = 1
    obs_dim: int = _OBS_DIM
    act_dim: int = _ACT_DIM

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
        widths = "→".join(str(x) for x in self.layer_widths)
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
    Target("train.default.ours_over_reference", ">=", 3.0, "default: ours ≥ 3× the reference loop"),
    Target("train.default.ours_over_roofline", ">=", 0.5, "default: ours ≥ 50% of roofline"),
    Target("train.wide.ours_over_roofline", ">=", 0.7, "wide: ours ≥ 70% of roofline"),
    Target("train.chunk8.ours_over_roofline", ">=", 0.7, "chunk8: ours ≥ 70% of roofline"),
    Target("ingest.shm_over_memcpy", ">=", 0.5, "shm ingest ≥ 50% of memcpy"),
    Target("ingest.socket_over_raw", ">=", 0.5, "socket ingest ≥ 50% of raw loopback"),
    Target("startup.first_request_s", "<", 3.0, "launch → first network request < 3 s"),
    Target("sync.shm_round_ms", "<", 5.0, "one sync round < 5 ms (shm)"),
    Target("sync.socket_round_ms", "<", 20.0, "one sync round < 20 ms (socket)"),
    Target("ingest.peak_rss_over_buffer", "<=", 2.5, "peak RSS while ingesting ≤ 2.5× the buffer"),
)


@dataclass(frozen=True, slots=True)
class BenchSettings:
    """What one ``la-trainer bench`` run measures (see the CLI options)."""

    sections: tuple[str, ...] = ("train", "ingest", "startup", "sync")
    configs: tuple[str, ...] = tuple(c.name for c in TRAIN_CONFIGS)
    repeats: int = 5
    train_seconds: float = 1.0
    train_rows: int = _TRAIN_ROWS
    matmul_size: int = 1024
    ingest_mb: float = 1024.0
    sync_rounds: int = 20
    startup_repeats: int = 5
    device: str = "auto"
    threads: int = 0
    transports: tuple[str, ...] = ("shm", "socket")


# ---------------------------------------------------------------------------------------------------------
# Small helpers


def _median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else math.nan


def _ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Trainer log lines (job creation) go to stderr, so stdout keeps only the table or result lines."""
    with contextlib.redirect_stdout(sys.stderr):
        yield


def _load() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover - not on every platform
        return []


def _synthetic_replay(step_num: int, seed: int = 0) -> Any:
    """A replay buffer of ``step_num`` steps (observation 32, action 8, float32), episodes of 1000 steps.
    Values tile a block of 2^16 normal rows: ingest only moves bytes, and training needs no structure."""
    from protocol.replay import ReplayBuffer

    rng = np.random.default_rng(seed)
    block = min(step_num, 65536)
    obs = np.resize(rng.standard_normal((block, _OBS_DIM), dtype=np.float32), (step_num, _OBS_DIM))
    act = np.resize(rng.standard_normal((block, _ACT_DIM), dtype=np.float32), (step_num, _ACT_DIM))
    lengths = np.full(-(-step_num // _EPISODE_STEPS), _EPISODE_STEPS, dtype=np.int32)
    lengths[-1] = step_num - _EPISODE_STEPS * (lengths.size - 1)
    starts = np.zeros_like(lengths)
    np.cumsum(lengths[:-1], out=starts[1:])
    return ReplayBuffer(0, starts, lengths, (obs,), (act,))


def _session(replay: Any, cfg: TrainConfig, iteration_num: int = 1_000_000) -> tuple[Any, tuple[bytes, ...]]:
    """(SessionConfig, snapshots) the engine would send for ``cfg`` and ``replay``."""
    from emulator.session import EngineTask, SessionSettings, build_session_config
    from emulator.tasks import continuous_action_schema, continuous_observation_schema

    task = EngineTask(
        "bench", continuous_observation_schema(cfg.obs_dim), continuous_action_schema(cfg.act_dim), replay
    )
    settings = SessionSettings(
        iteration_num=iteration_num,
        batch_size=cfg.batch_size,
        learning_rate=1e-4,
        hidden_layer_num=cfg.hidden_layer_num,
        hidden_layer_size=cfg.hidden_layer_size,
        action_chunk_size=cfg.chunk_size,
        save_snapshots=False,
    )
    return build_session_config(task, settings, None)


def _make_job(cfg: TrainConfig, rows: int, device: Any, seed: int = 0, compile_step: bool = False) -> Any:
    """A real :class:`TrainingJob` for ``cfg`` on synthetic data (what the trainer builds)."""
    from protocol.snapshot import read_snapshot
    from trainer.job import TrainingJob
    from trainer.options import TrainerOptions

    replay = _synthetic_replay(rows, seed)
    config, snapshots = _session(replay, cfg)
    received = {i: read_snapshot(blob) for i, blob in enumerate(snapshots)}
    options = TrainerOptions(compile="on" if compile_step else "off")
    with _quiet():
        return TrainingJob.create(config, received, replay, options=options, device=device)


# ---------------------------------------------------------------------------------------------------------
# 1. Training throughput


def _trainer_threads(cfg: TrainConfig, override: int) -> int:
    """The intra-op thread count the trainer would use for ``cfg`` (its own heuristic)."""
    from trainer.options import TrainerOptions
    from trainer.run import _choose_threads  # the trainer's private choice: measure what it does

    params = sum(a * b + b for a, b in itertools.pairwise(cfg.layer_widths))
    return _choose_threads(TrainerOptions(threads=override), cfg.batch_size * params)


def _our_step(job: Any) -> Callable[[int], None]:
    """The production step: :meth:`TrainingJob.step` (the fused step where it applies, see
    :mod:`trainer.steps.fused`), loss smoothing included."""

    def step(i: int) -> None:
        job.step(i)

    return step


def _autograd_step(job: Any) -> Callable[[int], None]:
    from trainer.steps.autograd import train_step

    noise = job.config.trainer.training.observation_noise_scale

    def step(i: int) -> None:
        train_step(
            job.model, job.optimizer, job.sampler.next(), job.generator, job.time_distribution, noise, i
        )

    return step


def _reference_loop(cfg: TrainConfig, rows: int, device: Any, seed: int = 0) -> Callable[[int], None]:
    """Flow matching the way public examples write it: standardise once, nn.Sequential, AdamW,
    per-step sampling, ``(1 − t)·x0 + t·x1``, MSE to ``x1 − x0``, zero_grad/backward/step."""
    import torch
    from torch import nn

    gen = torch.Generator().manual_seed(seed)
    obs = torch.randn(rows, cfg.obs_dim, generator=gen).to(device)
    x1_all = torch.randn(rows, cfg.chunk_size * cfg.act_dim, generator=gen).to(device)
    widths = cfg.layer_widths
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(widths)):
        layers.append(nn.Linear(a, b))
        if i < len(widths) - 2:
            layers.append(nn.ELU())
    net = nn.Sequential(*layers).to(device)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4, weight_decay=1e-4, amsgrad=True)
    batch = cfg.batch_size

    def step(i: int) -> None:
        idx = torch.randint(0, rows, (batch,), device=device)
        o, x1 = obs[idx], x1_all[idx]
        x0 = torch.randn_like(x1)
        t = torch.rand(batch, 1, device=device)
        xt = (1 - t) * x0 + t * x1
        pred = net(torch.cat([o, xt, t], dim=-1))
        loss = nn.functional.mse_loss(pred, x1 - x0)
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()

    return step


def _gemm_floor(cfg: TrainConfig, device: Any) -> Callable[[int], None]:
    """Only the matmuls of one fused step (forward ``addmm`` per layer, backward weight and input
    gradients), same shapes and layouts, on buffers that stay in cache: what a step would cost if
    everything else were free."""
    import torch

    widths = cfg.layer_widths
    b = cfg.batch_size
    weights = [torch.randn(o, i, device=device) * 0.1 for i, o in itertools.pairwise(widths)]
    biases = [torch.zeros(o, device=device) for o in widths[1:]]
    acts = [torch.randn(b, w, device=device) for w in widths]
    grads = [torch.randn(b, w, device=device) for w in widths]
    grad_w = [torch.empty_like(w) for w in weights]
    grad_in = [torch.empty(b, w, device=device) for w in widths]

    def step(i: int) -> None:
        for k, w in enumerate(weights):
            torch.addmm(biases[k], acts[k], w.t(), out=acts[k + 1])
        for k in range(len(weights) - 1, -1, -1):
            torch.mm(grads[k + 1].t(), acts[k], out=grad_w[k])
            if k > 0:
                torch.mm(grads[k + 1], weights[k], out=grad_in[k])

    return step


def _matmul_gflops(threads: int, repeats: int, device: Any, size: int = 1024) -> float:
    import torch

    previous = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(threads)
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)
    out = torch.empty(size, size, device=device)
    rates = []
    try:
        torch.mm(a, b, out=out)
        for _ in range(max(repeats, 1)):
            n = 3 if device.type == "cpu" else 50
            _sync(device)
            start = time.perf_counter()
            for _ in range(n):
                torch.mm(a, b, out=out)
            _sync(device)
            rates.append(2.0 * size**3 * n / (time.perf_counter() - start) / 1e9)
    finally:
        torch.set_num_threads(previous)
    return _median(rates)


def _sync(device: Any) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def _time_contenders(
    contenders: Mapping[str, tuple[Callable[[int], None], int]],
    repeats: int,
    seconds: float,
    device: Any,
) -> dict[str, dict[str, Any]]:
    """Median iterations/s of each ``(step, threads)``; runs interleaved, order rotated per repeat."""
    import torch

    previous = torch.get_num_threads()
    names = list(contenders)
    counts: dict[str, int] = {}
    counter = {name: 0 for name in names}

    def run(name: str, n: int) -> tuple[float, float]:
        """(wall seconds, CPU seconds of this process: every thread, spinning ones included)."""
        step, threads = contenders[name]
        if device.type == "cpu":
            torch.set_num_threads(threads)
        _sync(device)
        cpu, start = time.process_time(), time.perf_counter()
        for _ in range(n):
            step(counter[name])
            counter[name] += 1
        _sync(device)
        return time.perf_counter() - start, time.process_time() - cpu

    rates: dict[str, list[float]] = {name: [] for name in names}
    cpu_rates: dict[str, list[float]] = {name: [] for name in names}
    try:
        for name in names:  # warm-up and calibration: about `seconds` per timed run
            run(name, 2)
            elapsed, _ = run(name, 3)
            counts[name] = max(1, int(seconds * 3 / max(elapsed, 1e-9)))
        for r in range(repeats):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                wall, cpu = run(name, counts[name])
                rates[name].append(counts[name] / wall)
                cpu_rates[name].append(counts[name] / max(cpu, 1e-9))
    finally:
        torch.set_num_threads(previous)
    # CPU-time rates (iterations per CPU-second) are what a loaded machine still measures fairly for
    # one-thread contenders; wall-clock rates are the headline on a quiet one.
    return {
        name: {
            "it_per_s": _median(v),
            "cpu_it_per_s": _median(cpu_rates[name]),
            "runs": [round(x, 2) for x in v],
            "iterations_per_run": counts[name],
        }
        for name, v in rates.items()
    }


def measure_training(cfg: TrainConfig, settings: BenchSettings, device: Any) -> dict[str, Any]:
    """Section 1 for one configuration; the roofline comes from a matmul timed alongside."""
    import torch

    cores = os.cpu_count() or 1
    ours_threads = _trainer_threads(cfg, settings.threads) if device.type == "cpu" else 1
    job_ours = _make_job(cfg, settings.train_rows, device)
    job_autograd = _make_job(cfg, settings.train_rows, device)
    contenders: dict[str, tuple[Callable[[int], None], int]] = {
        "ours": (_our_step(job_ours), ours_threads),
        "autograd": (_autograd_step(job_autograd), ours_threads),
        "reference": (_reference_loop(cfg, settings.train_rows, device), torch.get_num_threads()),
    }
    other = cores if ours_threads == 1 else 1
    if device.type == "cpu" and other != ours_threads:
        contenders[f"ours_{other}_threads"] = (_our_step(_make_job(cfg, settings.train_rows, device)), other)
    from trainer.steps.compiled import compile_unavailable

    if compile_unavailable(device) is None:
        # The fused step torch.compile-d (trainer.steps.compiled, option compile=on); the first call compiles
        # during the warm-up, so the timed runs see the compiled code only.
        contenders["ours_compiled"] = (
            _our_step(_make_job(cfg, settings.train_rows, device, compile_step=True)),
            ours_threads,
        )
    # Only the step's matmuls: the floor for any implementation that keeps the maths (same threads).
    contenders["gemm_floor"] = (_gemm_floor(cfg, device), ours_threads)
    if device.type == "cpu" and torch.get_num_threads() > 1:
        # The same reference on one thread: separates what threading costs from what the step saves.
        contenders["reference_1_thread"] = (_reference_loop(cfg, settings.train_rows, device), 1)
    # The roofline's matmul runs interleaved with the contenders, so it sees the same machine load.
    size = settings.matmul_size
    a, b = torch.randn(size, size, device=device), torch.randn(size, size, device=device)
    out = torch.empty(size, size, device=device)

    def matmul(i: int) -> None:
        torch.mm(a, b, out=out)

    contenders["matmul"] = (matmul, cores)
    timed = _time_contenders(contenders, settings.repeats, settings.train_seconds, device)
    matmul_rate = timed.pop("matmul")
    gflops = matmul_rate["it_per_s"] * 2.0 * size**3 / 1e9
    roofline = gflops * 1e9 / cfg.flops_per_iteration
    ours = timed["ours"]["it_per_s"]
    return {
        "config": asdict(cfg)
        | {"description": cfg.describe(), "flops_per_iteration": cfg.flops_per_iteration},
        "threads": {"ours": ours_threads, "reference": torch.get_num_threads()},
        "contenders": timed,
        "matmul_gflops": gflops,
        "roofline_it_per_s": roofline,
        "ours_over_reference": _ratio(ours, timed["reference"]["it_per_s"]),
        "ours_over_autograd": _ratio(ours, timed["autograd"]["it_per_s"]),
        "ours_over_roofline": _ratio(ours, roofline),
        "reference_over_roofline": _ratio(timed["reference"]["it_per_s"], roofline),
    }


def measure_train_section(settings: BenchSettings, device: Any) -> dict[str, Any]:
    import torch

    cores = os.cpu_count() or 1
    size = settings.matmul_size
    gflops_all = _matmul_gflops(torch.get_num_threads(), settings.repeats, device, size)
    gflops_one = _matmul_gflops(1, settings.repeats, device, size) if device.type == "cpu" else gflops_all
    out: dict[str, Any] = {
        "device": str(device),
        "cores": cores,
        "matmul_gflops": gflops_all,
        "matmul_gflops_1_thread": gflops_one,
        "matmul_size": size,
    }
    for cfg in TRAIN_CONFIGS:
        if cfg.name in settings.configs:
            out[cfg.name] = measure_training(cfg, settings, device)
    return out


# ---------------------------------------------------------------------------------------------------------
# 2, 4, 5. The trainer-side worker (ingest, peak RSS, sync) and the engine side that drives it


def _rss_kib(field_name: str) -> int:
    """VmRSS / VmHWM of this process in KiB (Linux); falls back to ru_maxrss for the peak."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak // 1024 if sys.platform == "darwin" else peak)


def _reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux ``clear_refs`` value 5); False where unsupported."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _emit(kind: str, **values: Any) -> None:
    print(_MARK + json.dumps({"kind": kind, **values}), flush=True)


def _memcpy_baseline(nbytes: int, repeats: int) -> None:
    """memcpy of ``nbytes`` in this process: into fresh memory (page faults included, as an ingest must
    allocate) and into already-touched memory (bandwidth alone)."""
    src = np.empty(nbytes, dtype=np.uint8)
    src.fill(1)
    for _ in range(repeats):
        dst = np.empty(nbytes, dtype=np.uint8)
        start = time.perf_counter()
        np.copyto(dst, src)
        fresh = time.perf_counter() - start
        start = time.perf_counter()
        np.copyto(dst, src)
        warm = time.perf_counter() - start
        _emit("memcpy", nbytes=nbytes, fresh_s=fresh, warm_s=warm)
        del dst
    del src


def _raw_receive(server: socket.socket, nbytes: int, repeats: int) -> None:
    """Accept one plain connection and receive ``repeats`` × ``nbytes`` into fresh buffers."""
    conn, _ = server.accept()
    with conn:
        for _ in range(repeats):
            buf = np.empty(nbytes, dtype=np.uint8)
            view = buf.data
            got = 0
            while got < nbytes:
                n = conn.recv_into(view[got:])
                if n == 0:
                    raise ConnectionError("raw loopback sender closed early")
                got += n
            _emit("raw", transport="socket", done=time.monotonic())
            del view, buf


def _worker(spec: Mapping[str, Any]) -> None:
    """The trainer side, one process for every transport (one torch import): memcpy baseline, then per
    transport link → config → networks → (socket: raw loopback) → ingest repeats → small buffer → job →
    sync rounds → Complete. Results are ``@@bench`` lines on stdout, tagged with the transport."""
    start = time.perf_counter()
    import torch  # the real trainer has torch loaded before the replay buffer arrives

    _emit("imported", torch_s=time.perf_counter() - start)
    torch.set_num_threads(1)
    _memcpy_baseline(int(spec["nbytes"]), int(spec["repeats"]))
    for transport in spec["transports"]:
        _worker_session(transport, spec)


def _worker_session(transport: str, spec: Mapping[str, Any]) -> None:
    import torch

    from protocol.snapshot import read_snapshot
    from trainer.job import TrainingJob
    from trainer.links import ShmTrainerLink, SocketTrainerLink
    from trainer.options import TrainerOptions
    from trainer.run import _Syncer  # the loop's own export+encode+send (measure what it does)

    repeats, nbytes = int(spec["repeats"]), int(spec["nbytes"])
    raw_server: socket.socket | None = None
    link: Any
    if transport == "shm":
        link = ShmTrainerLink(spec["shm_config_dir"], spec["shm_guid"])
        _emit("ready", transport=transport)
    else:
        link = SocketTrainerLink("127.0.0.1", 0)
        raw_server = socket.create_server(("127.0.0.1", 0))
        _emit("ready", transport=transport, port=link.port, raw_port=raw_server.getsockname()[1])
    try:
        config = link.receive_config()
        received = {nid: read_snapshot(link.receive_network(nid)) for nid in (0, 1, 2)}
        if raw_server is not None:
            _raw_receive(raw_server, nbytes, repeats)
        _emit("baselines-done", transport=transport)
        for _ in range(repeats):
            gc.collect()
            resettable = _reset_peak_rss()
            before = _rss_kib("VmRSS")
            _emit("waiting", transport=transport)  # the engine posts only now: the clock starts there
            replay = link.receive_experience()
            done = time.monotonic()
            peak = _rss_kib("VmHWM")
            _emit(
                "ingest",
                transport=transport,
                done=done,
                rss_before_kib=before,
                peak_kib=peak,
                reset=resettable,
            )
            del replay
        small = link.receive_experience()
        with _quiet():
            job = TrainingJob.create(
                config, received, small, options=TrainerOptions(), device=torch.device("cpu")
            )
        job.step(0)
        syncer = _Syncer(link, received)
        for r in range(int(spec["sync_rounds"])):
            start = time.monotonic()
            blobs = syncer.encode(job.export())
            encoded = time.monotonic()
            syncer.send(blobs)
            _emit("sync", transport=transport, start=start, encoded=encoded, sent=time.monotonic())
            job.step(r + 1)
            time.sleep(0.005)  # let the engine finish the round before the next one starts
        link.send_complete()
        link.finish(10.0)
    finally:
        link.close()
        if raw_server is not None:
            raw_server.close()


class _WorkerProcess:
    """The worker subprocess; a thread collects its ``@@bench`` lines."""

    def __init__(self, spec: Mapping[str, Any]) -> None:
        from emulator.launch import REPO_ROOT

        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "emulator.bench", "--worker", json.dumps(spec)],
            cwd=str(REPO_ROOT),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.results: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self._stderr: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None  # a pipe by construction
        for line in self.proc.stdout:
            if line.startswith(_MARK):
                with self._cond:
                    self.results.append(json.loads(line[len(_MARK) :]))
                    self._cond.notify_all()

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None  # a pipe by construction
        for line in self.proc.stderr:
            self._stderr.append(line)

    def of(self, kind: str, transport: str | None = None) -> list[dict[str, Any]]:
        """The results of ``kind`` (for ``transport``: those tagged with it)."""
        with self._cond:
            return [r for r in self.results if r["kind"] == kind and r.get("transport") == transport]

    def wait_for(
        self, kind: str, count: int = 1, transport: str | None = None, timeout: float = 300.0
    ) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = [r for r in self.results if r["kind"] == kind and r.get("transport") == transport]
                if len(found) >= count:
                    return found
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"bench worker: no {count} {kind!r} result(s) (exit {self.proc.poll()}):\n"
                        + "".join(self._stderr[-30:])
                    )
                self._cond.wait(0.1)

    def close(self) -> None:
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


def measure_ipc(settings: BenchSettings, work: Path) -> tuple[dict[str, dict[str, Any]], float]:
    """Sections 2, 4 and 5 for every transport: the engine side runs here, the trainer side in one
    worker process. Returns ``{transport: results}`` and the worker's ``import torch`` seconds."""
    from emulator.game import ShmGame

    default = TRAIN_CONFIGS[0]
    step_bytes = 4 * (_OBS_DIM + _ACT_DIM)
    steps = max(_EPISODE_STEPS, int(settings.ingest_mb * 2**20) // step_bytes)
    big = _synthetic_replay(steps)
    small = _synthetic_replay(min(_SYNC_STEPS, steps), seed=1)
    nbytes = int(
        sum(a.nbytes for a in (big.episode_starts, big.episode_lengths, *big.observations, *big.actions))
    )
    config, snapshots = _session(big, default)
    spec: dict[str, Any] = {
        "transports": list(settings.transports),
        "repeats": settings.repeats,
        "nbytes": nbytes,
        "sync_rounds": settings.sync_rounds,
    }
    shm_game: Any = None
    if "shm" in settings.transports:
        config_dir = work / f"shm-{os.getpid()}" / "Configs"
        shm_game = ShmGame.create(config_dir, timeout=_ENGINE_TIMEOUT_S)
        spec |= {"shm_config_dir": str(config_dir), "shm_guid": shm_game.controls_guid}
    worker = _WorkerProcess(spec)
    out: dict[str, dict[str, Any]] = {}
    try:
        torch_import_s = float(worker.wait_for("imported")[0]["torch_s"])
        memcpy = worker.wait_for("memcpy", settings.repeats)
        for transport in settings.transports:
            rounds, posted, raw_start = _drive(
                transport, worker, shm_game, settings, big, small, config, snapshots
            )
            out[transport] = _transport_results(
                memcpy,
                worker.of("raw", transport),
                worker.of("ingest", transport),
                worker.of("sync", transport),
                posted,
                raw_start,
                rounds,
                nbytes,
            )
    finally:
        if shm_game is not None:
            with contextlib.suppress(Exception):
                shm_game.close()
        worker.close()
    return out, torch_import_s


def _drive(
    transport: str,
    worker: _WorkerProcess,
    shm_game: Any,
    settings: BenchSettings,
    big: Any,
    small: Any,
    config: Any,
    snapshots: tuple[bytes, ...],
) -> tuple[list[tuple[float, float]], list[float], list[float]]:
    """The engine's side of one transport's session; returns (rounds, ingest posts, raw starts)."""
    from emulator.game import Completed, SocketGame

    alive = lambda: worker.proc.poll() is None  # noqa: E731 - the engine's IsRunning
    ready = worker.wait_for("ready", transport=transport)[0]
    game: Any
    if transport == "shm":
        game = shm_game
        game.process_alive = alive
    else:
        game = SocketGame.connect(
            "127.0.0.1", int(ready["port"]), timeout=_ENGINE_TIMEOUT_S, process_alive=alive
        )
    posted: list[float] = []
    raw_start: list[float] = []
    rounds: list[tuple[float, float]] = []
    try:
        game.begin(config)
        for nid, blob in enumerate(snapshots):
            game.send_network(nid, blob)
        if transport == "socket":
            payload = np.ones(int(worker.wait_for("memcpy")[0]["nbytes"]), dtype=np.uint8)
            with socket.create_connection(("127.0.0.1", int(ready["raw_port"]))) as raw:
                for r in range(settings.repeats):
                    raw_start.append(time.monotonic())
                    raw.sendall(payload.data)
                    worker.wait_for("raw", r + 1, transport)
            del payload
        worker.wait_for("baselines-done", transport=transport)
        for r in range(settings.repeats):
            worker.wait_for("waiting", r + 1, transport)
            if transport == "shm":
                game.send_experience(big)  # writes every region, then posts E, S (the engine's work)
                posted.append(time.monotonic())
            else:
                posted.append(time.monotonic())
                game.send_experience(big)
            worker.wait_for("ingest", r + 1, transport)
        game.send_experience(small)
        deadline = time.monotonic() + 300.0
        while time.monotonic() < deadline:
            if game.has_network_or_completed():
                result = game.receive_round()
                if isinstance(result, Completed):
                    break
                rounds.append((result[0].received_at, result[-1].received_at))
            else:
                time.sleep(_ENGINE_TICK_S)
        game.done()
    finally:
        if transport != "shm":
            with contextlib.suppress(Exception):
                game.close()
    return rounds, posted, raw_start


def _transport_results(
    memcpy: list[dict[str, Any]],
    raw: list[dict[str, Any]],
    ingest: list[dict[str, Any]],
    syncs: list[dict[str, Any]],
    posted: list[float],
    raw_start: list[float],
    rounds: list[tuple[float, float]],
    nbytes: int,
) -> dict[str, Any]:
    by = {"memcpy": memcpy, "raw": raw, "ingest": ingest}
    ingest_s = [r["done"] - p for r, p in zip(ingest, posted, strict=False)]
    raw_s = [r["done"] - s for r, s in zip(raw, raw_start, strict=False)]
    round_ms = [(end - s["start"]) * 1e3 for s, (_, end) in zip(syncs, rounds, strict=False)]
    encode_ms = [(s["encoded"] - s["start"]) * 1e3 for s in syncs]
    handover_ms = [(end - s["encoded"]) * 1e3 for s, (_, end) in zip(syncs, rounds, strict=False)]
    peaks = [r["peak_kib"] * 1024 for r in ingest]
    befores = [r["rss_before_kib"] * 1024 for r in ingest]
    gb = nbytes / 1e9
    out: dict[str, Any] = {
        "bytes": nbytes,
        "ingest_s": _median(ingest_s),
        "ingest_gb_per_s": _ratio(gb, _median(ingest_s)),
        "memcpy_fresh_gb_per_s": _ratio(gb, _median([r["fresh_s"] for r in by["memcpy"]])),
        "memcpy_warm_gb_per_s": _ratio(gb, _median([r["warm_s"] for r in by["memcpy"]])),
        "peak_rss_bytes": _median(peaks),
        "rss_before_bytes": _median(befores),
        "peak_rss_over_buffer": _ratio(_median(peaks), nbytes),
        "peak_rss_reset": all(r.get("reset", False) for r in by["ingest"]),
        "sync_round_ms": _median(round_ms),
        "sync_export_encode_ms": _median(encode_ms),
        "sync_handover_ms": _median(handover_ms),
        "sync_rounds": len(round_ms),
        "runs": {"ingest_s": ingest_s, "raw_s": raw_s, "sync_round_ms": [round(x, 3) for x in round_ms]},
    }
    if raw_s:
        out["raw_gb_per_s"] = _ratio(gb, _median(raw_s))
    return out


# ---------------------------------------------------------------------------------------------------------
# 3. Startup


def _startup_once(work: Path, replay: Any, config: Any, snapshots: tuple[bytes, ...]) -> dict[str, float]:
    from emulator.game import Completed, ShmGame
    from emulator.launch import EngineLayout, TrainerProcess, make_task_dir, shared_memory_command

    layout = EngineLayout.create(work)
    task_dir = make_task_dir(layout.intermediate_dir)
    game = ShmGame.create(task_dir / "Configs", timeout=_ENGINE_TIMEOUT_S)
    lines: list[tuple[float, str]] = []
    env = dict(os.environ)
    env |= {"LA_TRAINER_SYNC_EVERY_ITERATIONS": "1", "LA_TRAINER_SYNC_EVERY_SECONDS": "0"}
    argv = shared_memory_command(layout, "Training", task_dir, game.controls_guid)
    launched = time.monotonic()
    proc = TrainerProcess(
        argv, cwd=layout.root, env=env, echo=lambda line: lines.append((time.monotonic(), line))
    )
    game.process_alive = proc.alive
    out: dict[str, float] = {}
    try:
        game.begin(config)
        game.send_network(0, snapshots[0])  # returns once the trainer asked for network 0
        out["first_request_s"] = time.monotonic() - launched
        game.send_network(1, snapshots[1])
        game.send_network(2, snapshots[2])
        game.send_experience(replay)
        deadline = time.monotonic() + 120.0
        while time.monotonic() < deadline:
            if game.has_network_or_completed():
                result = game.receive_round()
                if not isinstance(result, Completed):
                    out["first_round_s"] = result[-1].received_at - launched
                break
            time.sleep(_ENGINE_TICK_S)
        game.stop()
        proc.wait(30.0)
        for at, line in lines:
            if "la-trainer: training" in line:
                out["training_start_s"] = at - launched
                break
    finally:
        proc.close()
        game.close()
    return out


def measure_startup(settings: BenchSettings, work: Path, torch_import_s: float = math.nan) -> dict[str, Any]:
    """Section 3: the real trainer, spawned over shared memory, ``startup_repeats`` times. For context,
    ``import torch`` in a fresh interpreter (the IPC worker's, when it ran; else timed here)."""
    default = TRAIN_CONFIGS[0]
    replay = _synthetic_replay(_SYNC_STEPS)
    config, snapshots = _session(replay, default)
    runs = [
        _startup_once(work / f"startup{i}", replay, config, snapshots)
        for i in range(settings.startup_repeats)
    ]
    torch_import = [] if math.isnan(torch_import_s) else [torch_import_s]
    while not torch_import:
        code = "import time; t = time.perf_counter(); import torch; print(time.perf_counter() - t)"
        done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
        torch_import.append(float(done.stdout.strip().splitlines()[-1]))
    keys = ("first_request_s", "training_start_s", "first_round_s")
    return {k: _median([r[k] for r in runs if k in r]) for k in keys} | {
        "import_torch_s": _median(torch_import),
        "runs": runs,
    }


# ---------------------------------------------------------------------------------------------------------
# The whole run, the table and the targets


def run_bench(settings: BenchSettings, progress: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Every selected section; returns the JSON-ready results."""
    import torch

    results: dict[str, Any] = {
        "meta": {
            "settings": asdict(settings),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "machine": platform.machine(),
            "cores": os.cpu_count(),
            "load_before": _load(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
    }
    cpu = torch.device("cpu")
    seconds: dict[str, float] = {}
    clock = time.monotonic()
    if "train" in settings.sections:
        progress("training throughput (CPU) ...")
        results["train"] = measure_train_section(settings, cpu)
        if settings.device in ("auto", "cuda") and torch.cuda.is_available():
            progress("training throughput (CUDA) ...")
            results["train_cuda"] = measure_train_section(settings, torch.device("cuda"))
        seconds["train"], clock = time.monotonic() - clock, time.monotonic()
    with tempfile.TemporaryDirectory(prefix="la-trainer-bench-") as tmp:
        work = Path(tmp)
        transports: dict[str, dict[str, Any]] = {}
        torch_import_s = math.nan
        if "ingest" in settings.sections or "sync" in settings.sections:
            progress(f"ingest {settings.ingest_mb:g} MB and sync over {', '.join(settings.transports)} ...")
            transports, torch_import_s = measure_ipc(settings, work)
            seconds["ipc"], clock = time.monotonic() - clock, time.monotonic()
        if transports:
            results["ingest"] = {
                t: {k: v for k, v in r.items() if not k.startswith("sync")} for t, r in transports.items()
            }
            results["sync"] = {
                t: {k: v for k, v in r.items() if k.startswith("sync")} for t, r in transports.items()
            }
        if "startup" in settings.sections:
            progress("startup ...")
            results["startup"] = measure_startup(settings, work, torch_import_s)
            seconds["startup"] = time.monotonic() - clock
    results["meta"]["load_after"] = _load()
    results["meta"]["section_seconds"] = seconds
    results["summary"] = _summary(results)
    results["targets"] = [_check(t, results["summary"]) for t in TARGETS]
    return results


def _summary(results: Mapping[str, Any]) -> dict[str, float]:
    """The flat numbers the targets read (``section.key``)."""
    out: dict[str, float] = {}
    for name, value in results.get("train", {}).items():
        if isinstance(value, dict) and "contenders" in value:
            for key in ("ours_over_reference", "ours_over_roofline", "ours_over_autograd"):
                out[f"train.{name}.{key}"] = value[key]
            ref1 = value["contenders"].get("reference_1_thread")
            if ref1 is not None:
                out[f"train.{name}.ours_over_reference_1_thread"] = _ratio(
                    value["contenders"]["ours"]["it_per_s"], ref1["it_per_s"]
                )
            out[f"train.{name}.ours_it_per_s"] = value["contenders"]["ours"]["it_per_s"]
    ingest = results.get("ingest", {})
    if "shm" in ingest:
        shm = ingest["shm"]
        out["ingest.shm_over_memcpy"] = _ratio(shm["ingest_gb_per_s"], shm["memcpy_warm_gb_per_s"])
        out["ingest.shm_over_memcpy_fresh"] = _ratio(shm["ingest_gb_per_s"], shm["memcpy_fresh_gb_per_s"])
        out["ingest.peak_rss_over_buffer"] = shm["peak_rss_over_buffer"]
    if "socket" in ingest:
        sock = ingest["socket"]
        out["ingest.socket_over_raw"] = _ratio(sock["ingest_gb_per_s"], sock.get("raw_gb_per_s", math.nan))
        out["ingest.socket_peak_rss_over_buffer"] = sock["peak_rss_over_buffer"]
        if "ingest.peak_rss_over_buffer" in out:
            out["ingest.peak_rss_over_buffer"] = max(
                out["ingest.peak_rss_over_buffer"], sock["peak_rss_over_buffer"]
            )
    for transport, sync in results.get("sync", {}).items():
        out[f"sync.{transport}_round_ms"] = sync["sync_round_ms"]
    startup = results.get("startup", {})
    for key in ("first_request_s", "training_start_s", "first_round_s"):
        if key in startup:
            out[f"startup.{key}"] = startup[key]
    return out


def _check(target: Target, summary: Mapping[str, float]) -> dict[str, Any]:
    value = summary.get(target.key, math.nan)
    if math.isnan(value):
        met: bool | None = None
    elif target.op == ">=":
        met = value >= target.bound
    elif target.op == "<":
        met = value < target.bound
    else:
        met = value <= target.bound
    return {
        "key": target.key,
        "target": f"{target.op} {target.bound:g}",
        "value": value,
        "met": met,
        "text": target.text,
    }


def _fmt(value: Any, unit: str = "", digits: int = 0) -> str:
    if not isinstance(value, int | float) or math.isnan(value):
        return "—"
    return f"{value:,.{digits}f}{unit}"


def format_report(results: Mapping[str, Any]) -> str:
    """The human-readable tables."""
    lines: list[str] = []
    meta = results["meta"]
    lines.append(
        f"la-trainer bench | python {meta['python']} | torch {meta['torch']} | {meta['cores']} cores | "
        f"load {meta['load_before']} → {meta.get('load_after')} | median of {meta['settings']['repeats']}"
    )
    for section in ("train", "train_cuda"):
        train = results.get(section)
        if not train:
            continue
        lines.append("")
        lines.append(
            f"Training iterations/s on {train['device']} (matmul {train['matmul_gflops']:.1f} GFLOP/s all "
            f"threads, {train['matmul_gflops_1_thread']:.1f} on 1)"
        )
        lines.append(
            f"  {'config':<8} {'ours':>8} {'thr':>3} {'autograd':>9} {'reference':>10} {'roofline':>9} "
            f"{'ours/ref':>8} {'ours/roof':>9} {'ref/roof':>8}"
        )
        for name, value in train.items():
            if not (isinstance(value, dict) and "contenders" in value):
                continue
            c = value["contenders"]
            lines.append(
                f"  {name:<8} {_fmt(c['ours']['it_per_s']):>8} {value['threads']['ours']:>3} "
                f"{_fmt(c['autograd']['it_per_s']):>9} {_fmt(c['reference']['it_per_s']):>10} "
                f"{_fmt(value['roofline_it_per_s']):>9} {_fmt(value['ours_over_reference'], '×', 2):>8} "
                f"{_fmt(100 * value['ours_over_roofline'], '%', 0):>9} "
                f"{_fmt(100 * value['reference_over_roofline'], '%', 0):>8}"
            )
            extra = [k for k in c if k.startswith("ours_") and k.endswith("_threads")]
            for k in extra:
                lines.append(
                    f"  {'':<8} {_fmt(c[k]['it_per_s']):>8} {k.split('_')[1]:>3}   (ours, other thread count)"
                )
            if "ours_compiled" in c:
                lines.append(
                    f"  {'':<8} {_fmt(c['ours_compiled']['it_per_s']):>8} {value['threads']['ours']:>3}"
                    "   (ours, torch.compile-d: option compile=on)"
                )
            if "gemm_floor" in c:
                floor = c["gemm_floor"]["it_per_s"]
                lines.append(
                    f"  {'':<8} {_fmt(floor):>8} {value['threads']['ours']:>3}   (the step's matmuls alone; "
                    f"ours reaches {_fmt(100 * _ratio(c['ours']['it_per_s'], floor), '%', 0)} of it)"
                )
            if "reference_1_thread" in c:
                lines.append(
                    f"  {'':<8} {'':>8} {'':>3} {'':>9} {_fmt(c['reference_1_thread']['it_per_s']):>10}"
                    "   (reference on 1 thread)"
                )
            lines.append(
                f"  {'':<8} {_fmt(c['ours'].get('cpu_it_per_s')):>8} {'':>3} "
                f"{_fmt(c['autograd'].get('cpu_it_per_s')):>9} {_fmt(c['reference'].get('cpu_it_per_s')):>10}"
                "   (per CPU-second, all threads counted)"
            )
        for value in train.values():
            if isinstance(value, dict) and "config" in value:
                lines.append(f"  {value['config']['description']}")
    ingest = results.get("ingest")
    if ingest:
        lines.append("")
        lines.append("Replay-buffer ingest (trainer-side process)")
        lines.append(
            f"  {'transport':<9} {'MB':>7} {'ingest GB/s':>11} {'memcpy GB/s':>17} {'raw GB/s':>8} "
            f"{'ratio':>6} {'peak RSS MB':>11} {'×buffer':>7}"
        )
        for transport, r in ingest.items():
            memcpy = (
                f"{_fmt(r['memcpy_warm_gb_per_s'], '', 2)} ({_fmt(r['memcpy_fresh_gb_per_s'], '', 2)} new)"
            )
            base = r.get("raw_gb_per_s", r["memcpy_warm_gb_per_s"])
            lines.append(
                f"  {transport:<9} {r['bytes'] / 2**20:>7.0f} {_fmt(r['ingest_gb_per_s'], '', 2):>11} {memcpy:>17} "
                f"{_fmt(r.get('raw_gb_per_s'), '', 2):>8} {_fmt(_ratio(r['ingest_gb_per_s'], base), '', 2):>6} "
                f"{_fmt(r['peak_rss_bytes'] / 2**20):>11} {_fmt(r['peak_rss_over_buffer'], '', 2):>7}"
            )
    sync = results.get("sync")
    if sync:
        lines.append("")
        lines.append("Sync round (networks 0, 1, 2; default networks): median ms")
        for transport, r in sync.items():
            lines.append(
                f"  {transport:<9} round {_fmt(r['sync_round_ms'], '', 2):>7} = export+encode "
                f"{_fmt(r['sync_export_encode_ms'], '', 2)} + hand-over {_fmt(r['sync_handover_ms'], '', 2)}"
                f"  ({r['sync_rounds']} rounds)"
            )
    startup = results.get("startup")
    if startup:
        lines.append("")
        lines.append(
            f"Startup (spawned over shared memory): first network request {_fmt(startup['first_request_s'], ' s', 2)}"
            f", training loop {_fmt(startup['training_start_s'], ' s', 2)}, first round after iteration 1 "
            f"{_fmt(startup['first_round_s'], ' s', 2)}; `import torch` alone "
            f"{_fmt(startup['import_torch_s'], ' s', 2)}"
        )
    lines.append("")
    lines.append("Targets")
    for t in results.get("targets", []):
        mark = {True: "met", False: "MISSED", None: "not measured"}[t["met"]]
        lines.append(f"  {mark:<12} {t['text']:<45} value {_fmt(t['value'], '', 3)} (target {t['target']})")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------
# CLI


def _names(text: str, allowed: tuple[str, ...], what: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in allowed]
    if unknown:
        raise click.BadParameter(f"unknown {what} {', '.join(unknown)}; choose from {', '.join(allowed)}")
    return names


@click.command("bench")
@click.option("--sections", default="train,ingest,startup,sync", show_default=True, help="What to measure.")
@click.option(
    "--configs",
    default=",".join(c.name for c in TRAIN_CONFIGS),
    show_default=True,
    help="Training configurations.",
)
@click.option(
    "--repeats", default=5, show_default=True, type=click.IntRange(1, 1000), help="Runs per median."
)
@click.option(
    "--train-seconds", default=1.0, show_default=True, type=float, help="Seconds per timed training run."
)
@click.option(
    "--train-rows",
    default=_TRAIN_ROWS,
    show_default=True,
    type=click.IntRange(1000),
    help="Rows of the synthetic training set.",
)
@click.option(
    "--matmul-size",
    default=1024,
    show_default=True,
    type=click.IntRange(16, 16384),
    help="N of the N×N×N matmul that sets the roofline.",
)
@click.option(
    "--ingest-mb",
    default=1024.0,
    show_default=True,
    type=float,
    help="Replay buffer size for the ingest runs (MiB).",
)
@click.option(
    "--sync-rounds",
    default=20,
    show_default=True,
    type=click.IntRange(1, 10_000),
    help="Sync rounds per transport.",
)
@click.option(
    "--startup-repeats", default=5, show_default=True, type=click.IntRange(1, 100), help="Trainer launches."
)
@click.option("--transports", default="shm,socket", show_default=True, help="Transports for ingest and sync.")
@click.option(
    "--device",
    default="auto",
    show_default=True,
    type=click.Choice(["auto", "cpu", "cuda"]),
    help="Also time CUDA when present (auto).",
)
@click.option(
    "--threads", default=0, show_default=True, type=int, help="Threads for 'ours' (0: the trainer's choice)."
)
@click.option(
    "--json",
    "json_path",
    default="la-trainer-bench.json",
    show_default=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write the results.",
)
def bench_command(
    sections: str,
    configs: str,
    repeats: int,
    train_seconds: float,
    train_rows: int,
    matmul_size: int,
    ingest_mb: float,
    sync_rounds: int,
    startup_repeats: int,
    transports: str,
    device: str,
    threads: int,
    json_path: Path,
) -> None:
    """Measure training throughput, replay ingest, startup and sync against their limits.

    \b
    Examples:
      la-trainer bench                                  # everything, 1 GiB ingest, median of 5
      la-trainer bench --sections train --configs default
      la-trainer bench --ingest-mb 64 --repeats 3 --json /tmp/bench.json
    """
    settings = BenchSettings(
        sections=_names(sections, ("train", "ingest", "startup", "sync"), "section"),
        configs=_names(configs, tuple(c.name for c in TRAIN_CONFIGS), "config"),
        repeats=repeats,
        train_seconds=train_seconds,
        train_rows=train_rows,
        matmul_size=matmul_size,
        ingest_mb=ingest_mb,
        sync_rounds=sync_rounds,
        startup_repeats=startup_repeats,
        device=device,
        threads=threads,
        transports=_names(transports, ("shm", "socket"), "transport"),
    )
    results = run_bench(settings, progress=lambda s: click.echo(s, err=True))
    click.echo(format_report(results))
    json_path.write_text(json.dumps(results, indent=2, default=str), encoding="utf-8")
    click.echo(f"\nwrote {json_path}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        _worker(json.loads(sys.argv[2]))
    else:
        bench_command()
