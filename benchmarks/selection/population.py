"""Step cost of K candidate recipes trained as ONE batched model (stacked weights (K, in, out)) against K
separate trainer steps, one torch thread. Prototype for timing only (issue 33, phase 1).

  (a) sep-fused : the trainer's own TrainingJob.step (its fused step), K jobs stepped in turn
  (b) bmm-autograd : stacked weights, torch.baddbmm forward, autograd backward, torch.optim.AdamW(amsgrad,
      foreach) over the stacked tensors, foreach EMA lerp with a per-candidate decay
  (c) bmm-fused : the same maths with preallocated buffers, a hand-written backward (bmm) and one
      torch._fused_adamw_ call per learning-rate group (what a population FusedStep would do)
  (d) vmap : torch.func.vmap(grad(functional_call)) over stacked parameters, AdamW as in (b)
Each candidate has its own time density (a per-candidate quantile of U), spread gain and EMA decay.

  python -m benchmarks.selection.population --out benchmarks/results/selection/population.jsonl
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import time
from collections.abc import Callable
from typing import Any, cast

import torch
from torch import Tensor, nn

Shape = tuple[int, int, int, int]

SHAPES: dict[str, Shape] = {  # task: (input width = latents + A + 1, A, hidden, layers(HiddenLayerNum + 2))
    "b1": (5, 2, 128, 3),
    "b2": (19, 16, 128, 3),
    "demo": (19, 16, 256, 4),
}


def sizes(inp: int, out: int, hid: int, layers: int) -> list[tuple[int, int]]:
    return [(inp if i == 0 else hid, out if i == layers - 1 else hid) for i in range(layers)]


class Population:
    """K stacked MLPs (engine layout), per-candidate t-density parameters (logit-normal loc, scale) and
    spread gain; shared batch rows."""

    def __init__(
        self, k: int, inp: int, out: int, hid: int, layers: int, batch: int = 256, seed: int = 0
    ) -> None:
        g = torch.Generator().manual_seed(seed)
        self.k, self.batch, self.out = k, batch, out
        self.ws: list[Tensor] = []
        self.bs: list[Tensor] = []
        for fi, fo in sizes(inp, out, hid, layers):
            self.ws.append(((torch.rand((k, fi, fo), generator=g) * 2 - 1) / math.sqrt(fi)).requires_grad_())
            self.bs.append(((torch.rand((k, 1, fo), generator=g) * 2 - 1) / math.sqrt(fo)).requires_grad_())
        self.loc = torch.linspace(-0.5, 0.5, k).view(k, 1, 1)
        self.gain = torch.linspace(0, 6, k).view(k, 1, 1)
        self.decay = torch.linspace(0.99, 0.999, k).view(k, 1, 1)
        self.params = [p for pair in zip(self.ws, self.bs, strict=False) for p in pair]
        self.ema = [p.detach().clone() for p in self.params]
        self.g = g
        n = 20_000
        self.obs = torch.randn((n, inp - out - 1), generator=g)
        self.x1 = torch.randn((n, out), generator=g)

    def draws(self) -> tuple[Tensor, Tensor]:
        k, b = self.k, self.batch
        idx = torch.randint(self.obs.shape[0], (b,), generator=self.g)
        obs, x1 = self.obs[idx].expand(k, b, -1), self.x1[idx].expand(k, b, -1)
        x0 = torch.randn((k, b, self.out), generator=self.g)
        t = torch.sigmoid(self.loc + torch.randn((k, b, 1), generator=self.g))
        s = torch.sqrt(1 + (self.gain * (t - 0.7).clamp_min(0) / 0.3) ** 2)
        x0 = x0 * s
        xt = x0 + t * (x1 - x0)
        return torch.cat((obs, xt, t), 2), x1 - x0

    def forward(self, x: Tensor, params: list[Tensor] | None = None) -> Tensor:
        ws, bs = (self.ws, self.bs) if params is None else (params[0::2], params[1::2])
        h = x
        for i, (w, b) in enumerate(zip(ws, bs, strict=False)):
            h = torch.baddbmm(b, h, w)
            if i < len(ws) - 1:
                h = torch.nn.functional.elu(h)
        return h

    @torch.no_grad()
    def update_ema(self) -> None:
        w = 1 - self.decay
        for e, p in zip(self.ema, self.params, strict=False):
            e.lerp_(p, w.view(-1, *([1] * (p.dim() - 1))))


def time_it(fn: Callable[[], object], n: int, warm: int = 50, chunks: int = 10) -> float:
    """Milliseconds per call: the fastest of ``chunks`` blocks of n/chunks calls (the least disturbed by
    other processes on a shared machine)."""
    for _ in range(warm):
        fn()
    best = math.inf
    per = max(1, n // chunks)
    for _ in range(chunks):
        t0 = time.perf_counter()
        for _ in range(per):
            fn()
        best = min(best, (time.perf_counter() - t0) / per * 1000)
    return best


def bmm_autograd(k: int, shape: Shape, n: int) -> float:
    pop = Population(k, *shape)
    opt = torch.optim.AdamW(
        [
            {"params": pop.params[:2], "lr": 1e-3 * shape[2] / shape[0]},
            {"params": pop.params[2:], "lr": 1e-3},
        ],
        weight_decay=1e-4,
        amsgrad=True,
        foreach=True,
    )

    def step() -> None:
        x, target = pop.draws()
        loss = ((pop.forward(x) - target) ** 2).mean(dim=(1, 2)).sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        pop.update_ema()

    return time_it(step, n)


def vmap_step(k: int, shape: Shape, n: int) -> float:
    from torch.func import functional_call, grad, vmap

    inp, out, hid, layers = shape
    net = nn.Sequential(
        *[
            m
            for i, (fi, fo) in enumerate(sizes(inp, out, hid, layers))
            for m in ([nn.Linear(fi, fo)] + ([nn.ELU()] if i < layers - 1 else []))
        ]
    )
    pop = Population(k, *shape)
    names = [n_ for n_, _ in net.named_parameters()]
    stacked = {n_: torch.randn((k, *p.shape)) * 0.05 for n_, p in net.named_parameters()}
    for v in stacked.values():
        v.requires_grad_()
    opt = torch.optim.AdamW(list(stacked.values()), lr=1e-3, weight_decay=1e-4, amsgrad=True, foreach=True)

    def loss_fn(params: dict[str, Tensor], x: Tensor, target: Tensor) -> Tensor:
        return cast(Tensor, ((functional_call(net, params, (x,)) - target) ** 2).mean())

    gfn = vmap(grad(loss_fn))

    def step() -> None:
        x, target = pop.draws()
        grads = gfn(stacked, x, target)
        for n_ in names:
            stacked[n_].grad = grads[n_]
        opt.step()

    return time_it(step, n)


class FusedPopulation:
    """Preallocated buffers, hand-written bmm backward, flat parameters, fused AdamW (amsgrad)."""

    def __init__(self, k: int, inp: int, out: int, hid: int, layers: int) -> None:
        self.pop = Population(k, inp, out, hid, layers)
        self.k = k
        shapes = [p.shape for p in self.pop.params]
        total = sum(math.prod(s) for s in shapes)
        self.flat = torch.cat([p.detach().reshape(-1) for p in self.pop.params])
        self.gflat = torch.zeros(total)
        self.m, self.v, self.vmax = torch.zeros(total), torch.zeros(total), torch.zeros(total)
        self.eflat = self.flat.clone()
        views, gviews, off = [], [], 0
        for s in shapes:
            sz = math.prod(s)
            views.append(self.flat[off : off + sz].view(s))
            gviews.append(self.gflat[off : off + sz].view(s))
            off += sz
        self.w, self.b = views[0::2], views[1::2]
        self.gw, self.gb = gviews[0::2], gviews[1::2]
        first = math.prod(shapes[0]) + math.prod(shapes[1])
        self.groups = [(slice(0, first), 1e-3 * hid / inp), (slice(first, total), 1e-3)]
        self.step_t = [torch.zeros(()) for _ in self.groups]
        # per-candidate EMA decay as a flat weight vector
        dec = []
        for s in shapes:
            dec.append((1 - self.pop.decay.view(k, 1)).expand(k, math.prod(s[1:])).reshape(-1))
        self.ema_w = torch.cat(dec)

    def step(self) -> None:
        x, target = self.pop.draws()
        acts = [x]
        h = x
        n = len(self.w)
        for i in range(n):
            h = torch.baddbmm(self.b[i], h, self.w[i])
            if i < n - 1:
                h = torch.where(h > 0, h, torch.expm1(h.clamp_max(0)))
            acts.append(h)
        g = (h - target) * (2.0 / (target.shape[1] * target.shape[2]))
        for i in range(n - 1, -1, -1):
            torch.bmm(acts[i].transpose(1, 2), g, out=self.gw[i])
            torch.sum(g, dim=1, keepdim=True, out=self.gb[i])
            if i > 0:
                g = torch.bmm(g, self.w[i].transpose(1, 2))
                a = acts[i]
                g = g * torch.where(a > 0, torch.ones_like(a), a + 1)
        for (sl, lr), st in zip(self.groups, self.step_t, strict=False):
            torch._fused_adamw_(
                [self.flat[sl]],
                [self.gflat[sl]],
                [self.m[sl]],
                [self.v[sl]],
                [self.vmax[sl]],
                [st],
                lr=lr,
                beta1=0.9,
                beta2=0.999,
                weight_decay=1e-4,
                eps=1e-8,
                amsgrad=True,
                maximize=False,
            )
        self.eflat.lerp_(self.flat, self.ema_w)


def matmul_floor(k: int, shape: Shape, n: int) -> float:
    """Only the matrix products of one step (forward baddbmm, backward two bmm per layer): what batching
    cannot remove."""
    inp, out, hid, layers = shape
    sz = sizes(inp, out, hid, layers)
    ws = [torch.randn((k, fi, fo)) * 0.1 for fi, fo in sz]
    bs = [torch.zeros((k, 1, fo)) for _, fo in sz]
    x = torch.randn((k, 256, inp))
    gws = [torch.empty_like(w) for w in ws]

    def step() -> None:
        acts = [x]
        h = x
        for w, b in zip(ws, bs, strict=False):
            h = torch.baddbmm(b, h, w)
            acts.append(h)
        g = h
        for i in range(len(ws) - 1, -1, -1):
            torch.bmm(acts[i].transpose(1, 2), g, out=gws[i])
            if i > 0:
                g = torch.bmm(g, ws[i].transpose(1, 2))

    return time_it(step, n)


def sep_fused(task: str, n: int) -> float:
    from benchmarks.selection.runner import ALL
    from benchmarks.time_to_quality.run import make_job
    from benchmarks.time_to_quality.variants import DEFAULT

    job, _ = make_job(ALL[task], 100, DEFAULT, 1e-3, 10**6)
    i = [0]

    def step() -> None:
        with contextlib.redirect_stdout(io.StringIO()):
            job.step(i[0])
        i[0] += 1

    return time_it(step, n)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--ks", nargs="+", type=int, default=[1, 2, 3, 4, 8])
    ap.add_argument("--tasks", nargs="+", default=["b1", "b2", "demo"])
    ap.add_argument("--methods", nargs="+", default=["bmm-fused", "matmul-floor", "bmm-autograd", "vmap"])
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    rows: list[dict[str, Any]] = []
    for task in a.tasks:
        shape = SHAPES[task]
        base = sep_fused(task, a.n)
        rows.append({"task": task, "method": "sep-fused", "k": 1, "ms": base})
        print(task, "sep-fused K=1", f"{base:.3f} ms", flush=True)
        for k in a.ks:
            methods: tuple[tuple[str, Callable[..., float]], ...] = (
                ("bmm-fused", lambda k=k, shape=shape: time_it(FusedPopulation(k, *shape).step, a.n)),
                ("matmul-floor", lambda k=k, shape=shape: matmul_floor(k, shape, a.n)),
                ("bmm-autograd", lambda k=k, shape=shape: bmm_autograd(k, shape, a.n)),
                ("vmap", lambda k=k, shape=shape: vmap_step(k, shape, a.n // 2)),
            )
            for name, fn in methods:
                if name not in a.methods:
                    continue
                ms = fn()
                rows.append({"task": task, "method": name, "k": k, "ms": ms})
                print(task, name, f"K={k}", f"{ms:.3f} ms  (K separate fused: {k * base:.3f} ms)", flush=True)
    with open(a.out, "a") as f:
        for r in rows:
            f.write(
                json.dumps(
                    {
                        **r,
                        "torch": torch.__version__,
                        "threads": 1,
                        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                    }
                )
                + "\n"
            )


if __name__ == "__main__":
    main()
