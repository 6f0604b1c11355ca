"""A plain flow-matching trainer (~80 lines of maths), the reference of issue 33's four-mode check, with
switches that add one of la-trainer's default's ingredients at a time.

Plain: MLP [o | x | t] -> 128 ELU -> 128 ELU -> A (three Linear layers = HiddenLayerNum 1), torch default
init, Adam lr 1e-3, batch 256, t ~ U[0, 1), x_t = (1 - t) x0 + t x1, MSE to x1 - x0, no EMA, raw units,
8 Euler steps from N(0, I).  Switches: --norm (standardise obs and actions per dimension, as the trainer
does with AutoPerDimension), --time logit_normal:0,1 / ..., --ema 0.999, --fan-in (first layer's rate x
fan_out/fan_in), --amsgrad, --wd W (AdamW), --engine-init (U(+-1/sqrt(fan_in)) weights, U(+-1/sqrt(fan_out))
bias).  One JSON line per run (issue 33's: benchmarks/results/selection/plain.jsonl).

  python -m benchmarks.selection.plain --task four --seeds 100 101 --norm --fan-in --name plain+norm+fanin \
      --out benchmarks/results/selection/plain.jsonl
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from emulator.tasks import (
    Demonstrations,
    FloatArray,
    Policy,
    bimodal,
    fourmode,
)

TASKS: dict[str, tuple[Callable[[int], Demonstrations], Callable[[Policy, int], dict[str, float]]]] = {
    "four": (fourmode.make_demonstrations, fourmode.evaluate_policy),
    "fourpi": (
        lambda s: fourmode.make_demonstrations(s, turn=np.pi),
        lambda p, s: fourmode.evaluate_policy(p, s, turn=np.pi),
    ),
    "b1": (lambda s: bimodal.make_demonstrations(s), lambda p, s: bimodal.evaluate_policy(p, s)),
}


def sample_t(n: int, kind: str, g: torch.Generator) -> Tensor:
    if kind == "uniform":
        return torch.rand((n, 1), generator=g)
    a, b = (float(v) for v in kind.split(":")[1].split(","))
    return torch.sigmoid(a + b * torch.randn((n, 1), generator=g))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", default="four")
    ap.add_argument("--seeds", nargs="+", type=int, default=[100])
    ap.add_argument("--iterations", type=int, default=10_000)
    ap.add_argument("--every", type=int, default=1000)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--norm", action="store_true")
    ap.add_argument("--time", default="uniform")
    ap.add_argument("--ema", type=float, default=0.0)
    ap.add_argument("--fan-in", action="store_true")
    ap.add_argument("--amsgrad", action="store_true")
    ap.add_argument("--wd", type=float, default=0.0)
    ap.add_argument("--engine-init", action="store_true")
    ap.add_argument("--name", default="plain")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    make, evaluate = TASKS[a.task]
    for seed in a.seeds:
        eval_seed = 2000 if seed >= 100 else 1000
        demos = make(seed)
        obs = torch.from_numpy(np.concatenate([o for o, _ in demos.episodes]))
        act = torch.from_numpy(np.concatenate([x for _, x in demos.episodes]))
        om, os_ = (obs.mean(0), obs.std(0)) if a.norm else (torch.zeros(2), torch.ones(2))
        am, as_ = (act.mean(0), act.std(0)) if a.norm else (torch.zeros(2), torch.ones(2))
        on, an = (obs - om) / os_, (act - am) / as_
        torch.manual_seed(1234 + seed)
        net = nn.Sequential(nn.Linear(5, 128), nn.ELU(), nn.Linear(128, 128), nn.ELU(), nn.Linear(128, 2))
        if a.engine_init:
            with torch.no_grad():
                for layer in net:
                    if isinstance(layer, nn.Linear):
                        layer.weight.uniform_(
                            -1 / math.sqrt(layer.in_features), 1 / math.sqrt(layer.in_features)
                        )
                        layer.bias.uniform_(
                            -1 / math.sqrt(layer.out_features), 1 / math.sqrt(layer.out_features)
                        )
        first = [net[0].weight, net[0].bias]
        rest = [p for p in net.parameters() if all(p is not q for q in first)]
        groups = [{"params": first, "lr": a.lr * (128 / 5 if a.fan_in else 1)}, {"params": rest, "lr": a.lr}]
        opt = (
            torch.optim.AdamW(groups, lr=a.lr, weight_decay=a.wd, amsgrad=a.amsgrad)
            if a.wd > 0
            else torch.optim.Adam(groups, lr=a.lr, amsgrad=a.amsgrad)
        )
        ema = copy.deepcopy(net).requires_grad_(False) if a.ema > 0 else None
        g = torch.Generator().manual_seed(1234 + seed)
        evals: list[dict[str, Any]] = []
        secs = 0.0
        for it in range(1, a.iterations + 1):
            t0 = time.perf_counter()
            i = torch.randint(on.shape[0], (256,), generator=g)
            o, x1 = on[i], an[i]
            x0 = torch.randn(x1.shape, generator=g)
            t = sample_t(256, a.time, g)
            v = net(torch.cat((o, (1 - t) * x0 + t * x1, t), 1))
            loss = ((v - (x1 - x0)) ** 2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if ema is not None:
                with torch.no_grad():
                    d = min(a.ema, (1 + it) / (10 + it))
                    for pe, p in zip(ema.parameters(), net.parameters(), strict=False):
                        pe.lerp_(p, 1 - d)
            secs += time.perf_counter() - t0
            if it % a.every == 0 or it == a.iterations:
                model = ema if ema is not None else net
                rng = np.random.default_rng([eval_seed, seed, 8])

                @torch.no_grad()
                def policy(
                    ob: FloatArray,
                    model: nn.Module = model,
                    rng: np.random.Generator = rng,
                    om: Tensor = om,
                    os_: Tensor = os_,
                    as_: Tensor = as_,
                    am: Tensor = am,
                ) -> FloatArray:
                    o = (torch.from_numpy(ob) - om) / os_
                    x = torch.from_numpy(rng.standard_normal((ob.shape[0], 2)).astype(np.float32))
                    for k in range(8):
                        x = x + model(torch.cat((o, x, torch.full((ob.shape[0], 1), k / 8)), 1)) / 8
                    return (x * as_ + am).numpy()

                m = evaluate(policy, eval_seed)
                evals.append(
                    {"it": it, "train_s": round(secs, 3), "metrics": {k: float(v) for k, v in m.items()}}
                )
        row = {"task": a.task, "seed": seed, "variant": a.name, "args": vars(a), "evals": evals}
        print(
            a.task,
            seed,
            a.name,
            " ".join(f"{e['it']}:{e['metrics']['on_mode']:.3f}" for e in evals),
            flush=True,
        )
        with open(a.out, "a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
