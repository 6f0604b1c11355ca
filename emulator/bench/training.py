"""Section 1 of ``la-trainer bench``: training iterations/s against a reference loop and the roofline.

Per configuration of :data:`~emulator.bench.config.TRAIN_CONFIGS`, the contenders are ``ours`` (what
:class:`trainer.training.job.TrainingJob` runs, with the thread count the trainer picks), ``autograd``
(:func:`trainer.training.steps.autograd.train_step`, the readable reference) and ``reference``: the loop a public
flow-matching example would write (``nn.Sequential``, ``torch.optim.AdamW`` with the same hyperparameters
and amsgrad, per-step sampling, no EMA), timed at torch's default thread count and on one thread: the
headline ``ours_over_reference`` takes the reference at the faster of the two in the same run (the
ratio at the default count stays in ``ours_over_reference_default_threads``). The roofline is the matmul rate (an
N³ ``torch.mm`` on every core, timed interleaved with the contenders so that it sees the same load)
divided by the MLP's FLOPs per iteration, ``6·B·Σ In·Out``. On CUDA the same contenders also run on the
GPU (no CUDA graphs). Each rate is the median of ``--repeats`` runs, contenders interleaved so that load
changes hit all of them alike.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from emulator.bench.config import TRAIN_CONFIGS, BenchSettings, TrainConfig
from emulator.bench.stats import median, ratio
from emulator.bench.workload import make_job, quiet

if TYPE_CHECKING:
    import torch

    from trainer.training.job import TrainingJob

__all__ = ["measure_train_section", "measure_training"]


def _trainer_threads(cfg: TrainConfig, override: int) -> int:
    """The intra-op thread count the trainer would use for ``cfg`` (its own heuristic)."""
    from trainer.training.threads import choose_threads  # the trainer's own choice: measure what it does

    params = sum(a * b + b for a, b in itertools.pairwise(cfg.layer_widths))
    return choose_threads(override, cfg.batch_size * params)


def _our_step(job: TrainingJob) -> Callable[[int], None]:
    """The production step: :meth:`TrainingJob.advance`, as the training loop calls it (the fused step
    where it applies, see :mod:`trainer.training.steps.fused`; on CUDA replayed as a CUDA graph,
    :mod:`trainer.training.steps.graphed`), loss smoothing included, no host read per step; the job's
    numbers are read once per timed run, as the loop reads them every thousand steps or so."""

    first = [True]

    def step(i: int) -> None:
        if first:
            first.clear()
            with quiet():  # the first step picks (and may compile) the step and logs it: not on stdout
                job.advance(i)
            return
        job.advance(i)

    return step


def _autograd_step(job: TrainingJob) -> Callable[[int], None]:
    from trainer.training.steps.autograd import train_step

    noise = job.config.trainer.training.observation_noise_scale

    def step(i: int) -> None:
        train_step(
            job.model, job.optimizer, job.sampler.next(), job.generator, job.time_distribution, noise, i
        )

    return step


def _reference_loop(
    cfg: TrainConfig, rows: int, device: torch.device, seed: int = 0
) -> Callable[[int], None]:
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


def _gemm_floor(cfg: TrainConfig, device: torch.device) -> Callable[[int], None]:
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


def _matmul_gflops(threads: int, repeats: int, device: torch.device, size: int = 1024) -> float:
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
    return median(rates)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def _time_contenders(
    contenders: Mapping[str, tuple[Callable[[int], None], int]],
    repeats: int,
    seconds: float,
    device: torch.device,
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
            "it_per_s": median(v),
            "cpu_it_per_s": median(cpu_rates[name]),
            "runs": [round(x, 2) for x in v],
            "iterations_per_run": counts[name],
        }
        for name, v in rates.items()
    }


def measure_training(cfg: TrainConfig, settings: BenchSettings, device: torch.device) -> dict[str, Any]:
    """Section 1 for one configuration; the roofline comes from a matmul timed alongside."""
    import torch

    cores = os.cpu_count() or 1
    ours_threads = _trainer_threads(cfg, settings.threads) if device.type == "cpu" else 1
    job_ours = make_job(cfg, settings.train_rows, device)
    job_autograd = make_job(cfg, settings.train_rows, device)
    contenders: dict[str, tuple[Callable[[int], None], int]] = {
        "ours": (_our_step(job_ours), ours_threads),
        "autograd": (_autograd_step(job_autograd), ours_threads),
        "reference": (_reference_loop(cfg, settings.train_rows, device), torch.get_num_threads()),
    }
    other = cores if ours_threads == 1 else 1
    if device.type == "cpu" and other != ours_threads:
        contenders[f"ours_{other}_threads"] = (_our_step(make_job(cfg, settings.train_rows, device)), other)
    from trainer.training.steps.compiled import compile_unavailable

    if compile_unavailable(device) is None:
        # The fused step torch.compile-d (trainer.training.steps.compiled, option compile=on); the first call compiles
        # during the warm-up, so the timed runs see the compiled code only.
        contenders["ours_compiled"] = (
            _our_step(make_job(cfg, settings.train_rows, device, compile_step=True)),
            ours_threads,
        )
    if device.type == "cuda":
        # The same step without the CUDA graph: what the graph buys.
        eager = make_job(cfg, settings.train_rows, device)
        eager.cuda_graph = False
        contenders["ours_eager"] = (_our_step(eager), ours_threads)
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
    # The headline compares ours with the reference at the reference's best thread count in this run:
    # ours runs at the thread count the trainer chooses (1 for small networks, where threading costs more
    # than it saves), and the reference loop may also be faster on one thread than at torch's default.
    reference_threads = {"reference": torch.get_num_threads()}
    if "reference_1_thread" in timed:
        reference_threads["reference_1_thread"] = 1
    best = max(reference_threads, key=lambda name: timed[name]["it_per_s"])
    best_rate = timed[best]["it_per_s"]
    return {
        "config": asdict(cfg)
        | {"description": cfg.describe(), "flops_per_iteration": cfg.flops_per_iteration},
        "threads": {
            "ours": ours_threads,
            "reference": torch.get_num_threads(),
            "reference_best": reference_threads[best],
        },
        "contenders": timed,
        "matmul_gflops": gflops,
        "roofline_it_per_s": roofline,
        "reference_best_it_per_s": best_rate,
        "ours_over_reference": ratio(ours, best_rate),
        "ours_over_reference_default_threads": ratio(ours, timed["reference"]["it_per_s"]),
        "ours_over_autograd": ratio(ours, timed["autograd"]["it_per_s"]),
        "ours_over_roofline": ratio(ours, roofline),
        "reference_over_roofline": ratio(best_rate, roofline),
    }


def measure_train_section(settings: BenchSettings, device: torch.device) -> dict[str, Any]:
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
