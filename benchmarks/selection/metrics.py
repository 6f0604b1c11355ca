"""Candidate selection metrics for issue 33, measured on held-out episodes through the engine's sampler
(explicit Euler at 8 steps from fixed N(0, I) draws, EMA weights = what export sends), in demonstrated-std
units per action dimension. Every draw comes from a generator seeded by (training seed, draw index) only,
so every recipe of one seed is measured on the same rows and the same noise (common random numbers),
and nothing depends on the run's time density or path."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from trainer.training.data import MIN_STD, TrainingData
from trainer.training.flow import flow_matching_loss, interpolate
from trainer.training.model import FlowModel

RADII = (0.1, 0.175, 0.25, 0.35, 0.5)
BANDWIDTHS = (0.1, 0.25, 0.5)
STEPS = 8


def _subset(n: int, limit: int, g: torch.Generator) -> torch.Tensor:
    if n <= limit:
        return torch.arange(n)
    return torch.randperm(n, generator=g)[:limit].sort().values


class Selector:
    def __init__(
        self,
        model: FlowModel,
        heldout: TrainingData,
        seed: int,
        draw: int,
        rows: int = 1024,
        k: int = 16,
        fl_rows: int = 4096,
        fl_draws: int = 4,
    ) -> None:
        t = model.tensor_data(heldout)
        g = torch.Generator().manual_seed(1_000_003 * (seed + 17) + 7919 * draw + 33)
        n = t.row_num
        self.k = k
        idx = _subset(n, rows, g)
        self.obs = t.obs[idx]
        x1 = t.x1[idx].double()
        demo = x1 * model.decoder_scale.double() + model.decoder_shift.double()
        std = demo.std(dim=0, unbiased=False)
        self.scale = torch.where(std < MIN_STD, torch.ones_like(std), std)
        self.demo = demo / self.scale
        o = self.obs.double()
        ostd = o.std(dim=0, unbiased=False)
        on = (o - o.mean(0)) / torch.where(ostd < MIN_STD, torch.ones_like(ostd), ostd)
        dist = torch.cdist(on, on)
        dist.fill_diagonal_(-1.0)
        self.nb10 = dist.topk(min(10, n), dim=1, largest=False).indices
        self.width = int(x1.shape[1])
        self.x0 = torch.randn((idx.numel() * k, self.width), generator=g)
        # flow loss draws: uniform t and grid t, plain linear path
        fidx = _subset(n, fl_rows, g)
        fo = t.obs[fidx].repeat_interleave(fl_draws, 0)
        fx1 = t.x1[fidx].repeat_interleave(fl_draws, 0)
        self.fl_u = (fo, fx1, torch.rand((fo.shape[0], 1), generator=g), torch.randn(fx1.shape, generator=g))
        grid = (torch.arange(fo.shape[0]) % STEPS).float().unsqueeze(1) / STEPS
        self.fl_g = (fo, fx1, grid, torch.randn(fx1.shape, generator=g))
        self.rows = int(idx.numel())

    @torch.no_grad()
    def _fl(self, model: FlowModel, draws: tuple[Tensor, Tensor, Tensor, Tensor]) -> float:
        obs, x1, tt, x0 = draws
        enc, den = model.sampling_networks()
        p = interpolate(x0, x1, tt)
        z = (enc(obs) - model.latent_mean) / model.latent_std
        x = (p.x_t - model.x_mean) / model.x_std
        pred = den(torch.cat((z, x, tt), dim=1))
        return float(flow_matching_loss(pred, model.standardize_velocity(p.target)))

    @torch.no_grad()
    def _fl_late(self, model: FlowModel, draws: tuple[Tensor, Tensor, Tensor, Tensor]) -> float:
        obs, x1, tt, x0 = draws
        keep = tt[:, 0] >= 0.5
        return self._fl(model, (obs[keep], x1[keep], tt[keep], x0[keep]))

    @torch.no_grad()
    def evaluate(self, model: FlowModel) -> dict[str, float]:
        k, w = self.k, self.width
        obs = self.obs.repeat_interleave(k, 0)
        y = model.sample(obs, self.x0, STEPS).double() / self.scale
        y = y.reshape(self.rows, k, w)
        out: dict[str, float] = {}
        d_self = (y - self.demo[:, None, :]).norm(dim=2) / math.sqrt(w)  # (S, K)
        near5 = self.demo[self.nb10[:, :5]]
        near10 = self.demo[self.nb10]
        to5 = (torch.cdist(y, near5) / math.sqrt(w)).min(dim=2).values  # (S, K)
        to10 = (torch.cdist(y, near10) / math.sqrt(w)).min(dim=2).values
        f1s: list[float] = []
        covs: list[float] = []
        precs: list[float] = []
        for r in RADII:
            for kk in (4, k):
                cov = float((d_self[:, :kk].min(dim=1).values <= r).double().mean())
                prec = float((to5[:, :kk] <= r).double().mean())
                out[f"cov{kk}@{r}"] = cov
                out[f"prec{kk}@{r}"] = prec
                out[f"f1_{kk}@{r}"] = 2 * cov * prec / (cov + prec) if cov + prec > 0 else 0.0
                out[f"prod{kk}@{r}"] = cov * prec
            out[f"prec10nb@{r}"] = float((to10 <= r).double().mean())
            covs.append(out[f"cov{k}@{r}"])
            precs.append(out[f"prec{k}@{r}"])
            f1s.append(out[f"f1_{k}@{r}"])
        out["cov_avg"] = sum(covs) / len(covs)
        out["prec_avg"] = sum(precs) / len(precs)
        out["f1_avg"] = sum(f1s) / len(f1s)
        out["f1c_avg"] = 2 * out["cov_avg"] * out["prec_avg"] / max(out["cov_avg"] + out["prec_avg"], 1e-12)
        # energy score (K samples, unbiased spread), in RMS units
        to_obs = d_self.mean(dim=1)
        pair = torch.cdist(y, y) / math.sqrt(w)
        spread = pair.sum(dim=(1, 2)) / (k * (k - 1))
        out["es16"] = float((to_obs - 0.5 * spread).mean())
        d4 = d_self[:, :4].mean(dim=1)
        sp4 = (torch.cdist(y[:, :4], y[:, :4]) / math.sqrt(w)).sum(dim=(1, 2)) / 12
        out["es4"] = float((d4 - 0.5 * sp4).mean())
        # energy score with exponent beta (strictly proper for 0 < beta < 2; small beta weighs fine-scale
        # sharpness more), against the row's own demonstrated action
        for beta in (0.25, 0.5):
            own = d_self.pow(beta).mean(dim=1)
            offd = pair.masked_fill(torch.eye(k, dtype=torch.bool), 0).pow(beta)
            out[f"es16b{beta}"] = float((own - 0.5 * offd.sum(dim=(1, 2)) / (k * (k - 1))).mean())
        # kernel score (proper for a Gaussian kernel) against the row's own demonstrated action:
        # 0.5 E k(Y, Y') - E k(Y, a), RMS distances, bandwidth h
        ks_total = 0.0
        for h in (0.05, 0.1, 0.25, 0.5):
            kyy_ = torch.exp(-pair.pow(2) / (2 * h * h)).masked_fill(torch.eye(k, dtype=torch.bool), 0)
            kya = torch.exp(-d_self.pow(2) / (2 * h * h)).mean(dim=1)
            val = float((0.5 * kyy_.sum(dim=(1, 2)) / (k * (k - 1)) - kya).mean())
            out[f"ks@{h}"] = val
            ks_total += val
        out["ks_multi"] = ks_total
        # conditional MMD against the 10 nearest held-out rows' demonstrated actions (constant term dropped)
        dyr = torch.cdist(y, near10) / math.sqrt(w)
        eye = torch.eye(k, dtype=torch.bool)
        for h in BANDWIDTHS:
            kyy = torch.exp(-pair.pow(2) / (2 * h * h)).masked_fill(eye, 0).sum(dim=(1, 2)) / (k * (k - 1))
            kyr = torch.exp(-dyr.pow(2) / (2 * h * h)).mean(dim=(1, 2))
            out[f"mmd@{h}"] = float((kyy - 2 * kyr).mean())
        out["fl_uniform"] = self._fl(model, self.fl_u)
        out["fl_grid"] = self._fl(model, self.fl_g)
        out["fl_uniform_late"] = self._fl_late(model, self.fl_u)
        return out
