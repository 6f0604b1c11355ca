"""Scale-out benchmark: training samples/s of 1 process versus N data-parallel processes, and the
all-reduce cost per iteration (``python benchmarks/scaling.py [--procs 2] [--configs default,large]``).

What runs: the real :class:`~trainer.training.job.TrainingJob` on a synthetic recording (observations 32,
actions 8, 4096 steps), one intra-op thread per process. N = 1 is the ordinary trainer (no process group);
N ≥ 2 is ``torchrun --standalone --nproc-per-node N`` of this file with ``--worker``, each rank made a
:class:`~trainer.distributed.DistributedTrainingJob` by :func:`~trainer.distributed.scale_out_job`
(gradients averaged over gloo on CPU, one agreement all-reduce every 8 steps). Per network:

* strong scaling: the same global batch (what keeps a run equivalent): efficiency
  ``sps(N, B) / (N · sps(1, B))``;
* weak scaling: each rank keeps the whole batch (global batch N·B): ``sps(N, N·B) / (N · sps(1, B))``;
* ``cores_ceiling``: N independent 1-process runs at once, ``Σ sps / (N · sps(1, B))``: what the machine
  gives N processes at all (shared or hyper-threaded cores), the ceiling of either efficiency here;
* ``speedup_over_trainer``: ``sps(N) / sps(trainer)``, where ``trainer`` is one process as the trainer
  really runs, with the intra-op thread count it chooses itself (:func:`trainer.training.threads.choose_threads`: one
  thread for small networks, up to 8 for large ones). This is the question a user asks: is N processes
  faster than the one trainer using the same cores? The efficiencies above divide by a 1-thread process,
  which a large network's trainer never is.

Also measured on the ranks: one all-reduce of the gradient (float32, parameter count) and of the
agreement vector, and the load average. ``--plan`` prints the on-paper estimate for GPUs (NCCL) from the
parameter counts and the bandwidth/latency assumptions below; numbers and discussion: ``docs/scale-out.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # a checkout that is not installed

import numpy as np  # noqa: E402
import torch  # noqa: E402

from emulator.session import EngineTask, SessionSettings, build_session_config  # noqa: E402
from emulator.tasks import (  # noqa: E402
    Demonstrations,
    continuous_action_schema,
    continuous_observation_schema,
)
from protocol.snapshot import read_snapshot  # noqa: E402
from trainer.distributed import DEFAULT_AGREE_EVERY  # noqa: E402
from trainer.settings.options import TrainerOptions  # noqa: E402
from trainer.training.job import TrainingJob  # noqa: E402

__all__ = ["CONFIGS", "BenchConfig", "main", "plan_rows"]

OBS_DIM, ACT_DIM, EPISODES, STEPS = 32, 8, 64, 64


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """A network and batch: ``hidden_layer_num`` hidden layers of ``hidden_layer_size`` (the denoiser MLP
    has ``hidden_layer_num + 2`` Linear layers, as the engine builds it)."""

    name: str
    hidden_layer_num: int
    hidden_layer_size: int
    batch_size: int


CONFIGS = {
    # The engine's defaults (FlowMatchingSettings 1 × 128, BatchSize 256).
    "default": BenchConfig("default", 1, 128, 256),
    # A network where compute dominates on a CPU core.
    "large": BenchConfig("large", 2, 512, 1024),
    # Paper only (--plan): too slow for two CPU cores.
    "xl": BenchConfig("xl", 4, 1024, 4096),
}

# On-paper assumptions for --plan (typical nccl-tests figures for H100/H200-class GPUs; not measured here).
# All-reduce of b bytes over N GPUs: t = latency + 2(N-1)/N · b / bus bandwidth (ring), no overlap assumed.
NVLINK_BUS_GBPS = 350.0
"""Effective NCCL bus bandwidth inside an 8-GPU NVLink/NVSwitch node, GB/s."""
NVLINK_LATENCY_US = 20.0
"""A small all-reduce across the 8 GPUs of one node, µs."""
IB_BUS_GBPS = 40.0
"""Effective bus bandwidth across nodes, one 400 Gb/s InfiniBand/RoCE NIC per GPU, GB/s."""
IB_LATENCY_US = 50.0
"""A small all-reduce across 16 GPUs on 2 nodes, µs."""
AGREE_US = 30.0
"""The agreement all-reduce (4 float64) plus its host read-back, µs (latency bound); once every
``DEFAULT_AGREE_EVERY`` steps."""
GPU_EFFECTIVE_TFLOPS = 30.0
"""Sustained float32 throughput of the MLP step on one GPU (torch keeps TF32 off for matmuls by default)."""
STEP_FLOOR_MS = 0.35
"""Per-step floor on a GPU whatever the batch: ~60 kernel launches (forward, backward, AdamW, EMA) and the
one host sync of train_step. A rank's step never gets shorter than this, however small its share."""


def synthetic_task(seed: int = 0) -> EngineTask:
    rng = np.random.default_rng(seed)
    episodes = []
    for _ in range(EPISODES):
        obs = rng.standard_normal((STEPS, OBS_DIM)).astype(np.float32)
        act = np.tanh(obs[:, :ACT_DIM] + 0.3 * rng.standard_normal((STEPS, ACT_DIM))).astype(np.float32)
        episodes.append((obs, act))
    return EngineTask.from_demonstrations(
        "synthetic",
        continuous_observation_schema(OBS_DIM),
        continuous_action_schema(ACT_DIM),
        Demonstrations(tuple(episodes)),
    )


def make_job(config: BenchConfig, batch: int) -> TrainingJob:
    settings = SessionSettings(
        iteration_num=10_000_000,
        batch_size=batch,
        hidden_layer_num=config.hidden_layer_num,
        hidden_layer_size=config.hidden_layer_size,
        learning_rate=1e-4,
    )
    task = synthetic_task()
    session, blobs = build_session_config(task, settings, None)
    received = {nid: read_snapshot(blob) for nid, blob in enumerate(blobs)}
    options = TrainerOptions(status_file=False, threads=1, checkpoint_every_seconds=0.0)
    return TrainingJob.create(
        session, received, task.replay_buffer, options=options, device=torch.device("cpu")
    )


def parameter_count(config: BenchConfig) -> int:
    job = make_job(config, 8)
    return sum(p.numel() for p in job.model.trainable_parameters())


def time_steps(job: TrainingJob, warmup: int, steps: int) -> float:
    """Seconds for ``steps`` steps after ``warmup`` untimed ones."""
    for i in range(warmup):
        job.step(i)
    started = time.perf_counter()
    for i in range(warmup, warmup + steps):
        job.step(i)
    return time.perf_counter() - started


def trainer_threads(config: BenchConfig) -> int:
    """The intra-op thread count the trainer itself chooses for this network and batch."""
    from trainer.training.threads import choose_threads

    return choose_threads(TrainerOptions().threads, config.batch_size * parameter_count(config))


def single(config: BenchConfig, warmup: int, steps: int, threads: int = 1) -> dict[str, Any]:
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        job = make_job(config, config.batch_size)
        elapsed = time_steps(job, warmup, steps)
    finally:
        torch.set_num_threads(previous)
    return {
        "procs": 1,
        "threads": threads,
        "global_batch": config.batch_size,
        "samples_per_s": config.batch_size * steps / elapsed,
    }


def worker(config: BenchConfig, global_batch: int, warmup: int, steps: int) -> None:
    """One rank under torchrun; rank 0 prints ``RESULT {json}``."""
    import torch.distributed as dist

    from trainer.distributed import DistEnv, RankChannel, RankContext, scale_out_job

    env = DistEnv.from_environ(os.environ)
    assert env is not None
    dist.init_process_group("gloo", rank=env.rank, world_size=env.world_size)
    torch.set_num_threads(1)
    ctx = RankContext(env, RankChannel(lambda t: dist.broadcast(t, src=0), leader=env.leader))
    job = scale_out_job(make_job(config, global_batch), ctx)
    elapsed = time_steps(job, warmup, steps)
    params = sum(p.numel() for p in job.model.trainable_parameters())
    grad = torch.zeros(params)
    dist.barrier()
    started = time.perf_counter()
    for _ in range(20):
        dist.all_reduce(grad)
    grad_ms = (time.perf_counter() - started) / 20 * 1e3
    votes = torch.zeros(4, dtype=torch.float64)
    started = time.perf_counter()
    for _ in range(100):
        dist.all_reduce(votes)
        votes.tolist()
    agree_us = (time.perf_counter() - started) / 100 * 1e6
    if env.leader:
        result = {
            "procs": env.world_size,
            "global_batch": global_batch,
            "samples_per_s": global_batch * steps / elapsed,
            "grad_allreduce_ms": grad_ms,
            "agree_allreduce_us": agree_us,
            "params": params,
        }
        print("RESULT " + json.dumps(result), flush=True)
    dist.destroy_process_group()


def distributed(
    config: BenchConfig, procs: int, global_batch: int, warmup: int, steps: int
) -> dict[str, Any]:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(procs),
        str(Path(__file__).resolve()),
        "--worker",
        config.name,
        "--global-batch",
        str(global_batch),
        "--warmup",
        str(warmup),
        "--steps",
        str(steps),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=False)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[len("RESULT ") :])
            return result
    raise RuntimeError(f"torchrun failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")


def independent(config: BenchConfig, procs: int, warmup: int, steps: int) -> float:
    """Aggregate samples/s of ``procs`` independent 1-process runs at once: what the machine's cores can
    give N processes at all (the ceiling of any data-parallel efficiency on it)."""
    command = [sys.executable, str(Path(__file__).resolve()), "--single", config.name]
    command += ["--warmup", str(warmup), "--steps", str(steps)]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    running = [
        subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(procs)
    ]
    total = 0.0
    for proc in running:
        out, _ = proc.communicate()
        line = next(line for line in out.splitlines() if line.startswith("RESULT "))
        total += float(json.loads(line[len("RESULT ") :])["samples_per_s"])
    return total


def allreduce_us(nbytes: float, ranks: int, bus_gbps: float, latency_us: float) -> float:
    if ranks < 2:
        return 0.0
    return latency_us + 2 * (ranks - 1) / ranks * nbytes / (bus_gbps * 1e3)


def plan_rows(configs: list[BenchConfig]) -> list[dict[str, Any]]:
    """Expected cost per iteration on GPUs and the scaling efficiency it implies (strong scaling: the
    config's global batch split N ways; weak: each GPU keeps the whole batch), from each network's
    parameter count and the assumptions above. 6·P FLOP per sample (forward 2·P, backward 4·P)."""
    rows = []
    for config in configs:
        params = parameter_count(config)
        nbytes = 4.0 * params
        compute_ms = 6.0 * params * config.batch_size / (GPU_EFFECTIVE_TFLOPS * 1e9)
        one = max(STEP_FLOOR_MS, compute_ms)
        for label, ranks, bus, latency in (
            ("8 GPUs, 1 node (NVLink)", 8, NVLINK_BUS_GBPS, NVLINK_LATENCY_US),
            ("16 GPUs, 2 nodes (IB)", 16, IB_BUS_GBPS, IB_LATENCY_US),
        ):
            comm_ms = (allreduce_us(nbytes, ranks, bus, latency) + AGREE_US / DEFAULT_AGREE_EVERY) / 1e3
            strong = max(STEP_FLOOR_MS, compute_ms / ranks) + comm_ms
            weak = one + comm_ms
            rows.append(
                {
                    "config": config.name,
                    "params": params,
                    "batch": config.batch_size,
                    "grad_MB": round(nbytes / 1e6, 3),
                    "setup": label,
                    "allreduce_per_iteration_us": round(comm_ms * 1e3, 1),
                    "step_1gpu_ms": round(one, 3),
                    "strong_efficiency": round(one / (ranks * strong), 2),
                    "weak_efficiency": round(one / weak, 2),
                }
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--procs", type=int, default=2, help="data-parallel processes to compare with 1")
    parser.add_argument("--configs", default="default,large", help="comma-separated: default, large, xl")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--plan", action="store_true", help="print the GPU estimate on paper and exit")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--global-batch", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--single", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.single:
        print("RESULT " + json.dumps(single(CONFIGS[args.single], args.warmup, args.steps)), flush=True)
        return 0
    if args.worker:
        worker(CONFIGS[args.worker], args.global_batch, args.warmup, args.steps)
        return 0
    configs = [CONFIGS[name.strip()] for name in args.configs.split(",") if name.strip()]
    if args.plan:
        for row in plan_rows(configs):
            print(json.dumps(row))
        return 0
    results = []
    for config in configs:
        # The 1-process baseline before and after the N-process runs, averaged: on a shared machine the
        # background load drifts, and the load average is reported with every row.
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan
        threads = trainer_threads(config)
        before = single(config, args.warmup, args.steps)
        trainer_before = single(config, args.warmup, args.steps, threads)
        strong = distributed(config, args.procs, config.batch_size, args.warmup, args.steps)
        weak = distributed(config, args.procs, config.batch_size * args.procs, args.warmup, args.steps)
        after = single(config, args.warmup, args.steps)
        trainer_after = single(config, args.warmup, args.steps, threads)
        base = {"samples_per_s": (before["samples_per_s"] + after["samples_per_s"]) / 2}
        trainer_sps = (trainer_before["samples_per_s"] + trainer_after["samples_per_s"]) / 2
        ceiling = independent(config, args.procs, args.warmup, args.steps) / (
            args.procs * base["samples_per_s"]
        )
        for regime, run in (("strong", strong), ("weak", weak)):
            efficiency = run["samples_per_s"] / (args.procs * base["samples_per_s"])
            row = {
                "config": config.name,
                "regime": regime,
                "params": run["params"],
                "batch_1proc": config.batch_size,
                "global_batch": run["global_batch"],
                "sps_1proc": round(base["samples_per_s"]),
                f"sps_{args.procs}proc": round(run["samples_per_s"]),
                "efficiency": round(efficiency, 3),
                "trainer_threads": threads,
                "sps_trainer": round(trainer_sps),
                # Weak scaling trains N·B per step; per sample it compares like with like.
                "speedup_over_trainer": round(run["samples_per_s"] / trainer_sps, 3),
                "cores_ceiling": round(ceiling, 3),
                "grad_allreduce_ms": round(run["grad_allreduce_ms"], 3),
                "agree_allreduce_us": round(run["agree_allreduce_us"], 1),
                "load_average": round(load, 2),
            }
            results.append(row)
            print(json.dumps(row), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
