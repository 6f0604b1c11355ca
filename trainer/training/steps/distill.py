"""Few-step distillation: make the engine's N-step Euler sampler land where the many-step flow lands.

The engine integrates the denoiser with exactly ``N = ODEStepsNum`` explicit Euler steps (spec §6.4):
``x ← x + v([e ‖ x ‖ t])/N`` at ``t_k = k/N``, ``k = 0 … N−1``, from ``x0 ~ N(0, I)``. A flow-matching
network predicts the *instantaneous* velocity, so with few steps the sampler cuts the curved flow's
corners (one step returns the conditional mean). The game only ever evaluates the network at the N grid
times, though, and its time input lets it return something else there: the *average* velocity over the
interval,

    v̄_k(x) = (Φ(x; t_k → t_{k+1}) − x) · N,

where Φ is the exact flow of a teacher (the model at the end of ordinary training). With that velocity
one Euler step from ``x_{t_k}`` lands on the teacher's ``x_{t_{k+1}}``, so N steps reproduce the
teacher's many-step endpoint from the same ``x0``. Same network, sizes and headers; nothing changes on
the engine side.

The recipe (:func:`distill_step`), per minibatch row:

1. draw ``x0 ~ N(0, I)`` and an interval ``k``: the first ``B/N`` rows take ``k = 0``, the others
   ``k ~ U{1 … N−1}``;
2. roll the *student* (the network being trained, no gradient) out with the engine's own Euler steps for
   ``k`` steps: ``x̂_{t_k}``. Training on the student's own states, not the teacher's, means an error
   in an early interval is corrected by the next one instead of compounding (the target is always
   "where the teacher goes from here");
3. integrate the frozen teacher from ``x̂_{t_k}`` over ``[t_k, t_{k+1}]`` with ``S`` midpoint steps
   (second order: a few evaluations per interval are enough);
4. regress the student's velocity at ``(z, x̂_{t_k}, t_k)`` onto ``(x_end − x̂_{t_k})·N``;
5. plus a small weight of the ordinary flow-matching loss at random ``t`` on a quarter of the rows, so
   that the network stays a usable flow at other step counts (the game uses only the configured N, so
   the weight is small: quality at N comes first).

The first interval starts at ``x0`` itself, so its target depends only on (observation, ``x0``), not on
the student: those targets are computed for a whole block of rows every ``pool_reuse``-th iteration and
kept in a :class:`TargetPool` that the other iterations draw from, so each is used ``pool_reuse`` times
on average. That divides the dominant cost for N = 1 (all rows) and N = 2 (half the rows) by that
factor, in arithmetic and in calls (what counts for small networks and on a GPU).

Phases (:class:`Distiller`, :func:`distill_iterations`): the trainer runs ordinary flow matching, then
the last ``n`` of its ``IterationNum`` iterations distil. A distillation iteration costs several flow
matching iterations (the teacher's evaluations, the rollout, an autograd step), so ``n`` is chosen so
that distillation takes ``distill_fraction`` of the run's *time*, not of its iteration count (cost model:
:attr:`DistillSettings.cost`).

Units: ``x`` is the ODE state in the decoder-input space (what the engine integrates); velocities in
decoder-input units unless named "standardized" (see :mod:`trainer.training.model`). Shapes: ``B`` batch, ``A``
action width, ``O`` observation width, ``L`` latent width; times are ``(B, 1)``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor, nn

from trainer.training.data import Batch
from trainer.training.flow import TimeDistribution, flow_matching_loss
from trainer.training.model import FlowModel
from trainer.training.steps.autograd import BatchSampler, apply_gradients, make_optimizer
from trainer.training.steps.base import StepMetrics

__all__ = [
    "EVAL_COST",
    "POOL_LIMIT_BYTES",
    "RECOMMENDED_ITERATIONS",
    "TRAIN_COST",
    "DistillSettings",
    "DistillationStep",
    "Distiller",
    "TargetPool",
    "Teacher",
    "TeacherLike",
    "distill_iterations",
    "distill_step",
    "grid_times",
]

EVAL_COST = 0.3
"""One gradient-free denoiser evaluation of a full minibatch, in flow-matching iterations (the trainer's
:func:`trainer.training.steps.autograd.train_step`: forward, backward, AdamW, EMA). [INF] Measured ≈ 0.24 on CPU for the
engine's MLP (4 Linear layers of width 256, batch 256, one thread, B1 and B2) and rounded up: many
separate evaluations fuse worse than one training step. Used only to size the distillation phase
deterministically (a measured clock would move the phase boundary, and so the weights, from run to run).
A faster flow-matching step (a fused one) makes every ratio here larger in proportion."""
TRAIN_COST = 1.2
"""The distillation step's own forward/backward/AdamW on a minibatch plus the bookkeeping around it, in
flow-matching iterations (same measurement as :data:`EVAL_COST`)."""
RECOMMENDED_ITERATIONS = 20_000
"""Distillation iterations below which the trainer warns that few-step quality will be short of the
many-step flow. Measured on B1 (bimodal; seed 0, engine inference path, on-mode share at N = 1):
1,319 iterations after a 12k-iteration run 0.731; 5,500 after 50k 0.860; 11,000 after 100k 0.898; 22,000
after 100k 0.917 (N = 2: 11,000 after 100k 0.934). The engine's default IterationNum (1,000,000) gives
about 110,000 at the default ``distill_fraction``."""
POOL_LIMIT_BYTES = 64 << 20
"""Bound on the memory of the first-interval target pool (observations, x0, endpoints)."""


@dataclass(frozen=True, slots=True)
class DistillSettings:
    """How to distil for the engine's step count.

    ``ode_steps``: N, the game's ODEStepsNum (1…100). ``teacher_steps``: midpoint steps the teacher takes
    over the whole of [0, 1]; each of the N intervals gets ``ceil(teacher_steps / N)`` (at least 1).
    ``fm_weight``: weight of the ordinary flow-matching loss (0 disables it); ``fm_rows``: the share of the
    minibatch's rows it is computed on (a regulariser, so a quarter of the rows is enough).
    ``pool_reuse``: how many times each first-interval target is used (1: always fresh).
    """

    ode_steps: int
    teacher_steps: int = 8
    fm_weight: float = 0.1
    fm_rows: float = 0.25
    pool_reuse: int = 4
    huber: float = 0.0

    def __post_init__(self) -> None:
        n = self.ode_steps
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 100:
            raise ValueError(
                f"ode_steps must be an int in 1..100 (the engine's ODEStepsNum range), got {n!r}"
            )
        if self.teacher_steps < 1:
            raise ValueError(f"teacher_steps must be >= 1, got {self.teacher_steps}")
        if not (math.isfinite(self.fm_weight) and self.fm_weight >= 0):
            raise ValueError(f"fm_weight must be a finite number >= 0, got {self.fm_weight}")
        if not 0.0 < self.fm_rows <= 1.0:
            raise ValueError(f"fm_rows must be in (0, 1], got {self.fm_rows}")
        if self.pool_reuse < 1:
            raise ValueError(f"pool_reuse must be >= 1, got {self.pool_reuse}")
        if not (math.isfinite(self.huber) and self.huber >= 0):
            raise ValueError(f"huber must be a finite number >= 0, got {self.huber}")

    @property
    def substeps(self) -> int:
        """Teacher midpoint steps per interval."""
        return max(1, math.ceil(self.teacher_steps / self.ode_steps))

    @property
    def evaluations(self) -> float:
        """Expected gradient-free denoiser evaluations per iteration, in full-minibatch units: the first
        interval's rows (1/N) pay the teacher's 2·S once per ``pool_reuse`` uses; the other rows pay 2·S
        plus their rollout (k steps, k ~ U{1 … N−1}, mean N/2)."""
        n = self.ode_steps
        teacher = 2 * self.substeps
        return teacher / (n * self.pool_reuse) + (n - 1) / n * (teacher + n / 2)

    @property
    def cost(self) -> float:
        """One distillation iteration in flow-matching iterations (:data:`TRAIN_COST`, :data:`EVAL_COST`)."""
        fm = self.fm_rows if self.fm_weight > 0 else 0.0
        return TRAIN_COST * (1.0 + fm) + EVAL_COST * self.evaluations


def distill_iterations(total: int, fraction: float, cost: float) -> int:
    """How many of ``total`` iterations distil so that distillation takes ``fraction`` of the run's time
    when one distillation iteration costs ``cost`` flow-matching iterations:
    ``n·cost = fraction·((total − n) + n·cost)``, rounded to the nearest int (0 when ``fraction`` is 0)."""
    if total < 0 or not 0.0 <= fraction < 1.0 or not cost > 0:
        raise ValueError(f"need total >= 0, 0 <= fraction < 1, cost > 0; got {total}, {fraction}, {cost}")
    n = fraction * total / (cost * (1.0 - fraction) + fraction)
    return min(total, round(n))


def grid_times(ode_steps: int) -> Tensor:
    """The engine's N grid times ``t_k = float32(k) · float32(1/N)`` (spec §6.4), a float32 ``(N,)``
    tensor, bit for bit what the game feeds the denoiser's t input."""
    dt = torch.tensor(1.0 / ode_steps, dtype=torch.float32)
    return torch.arange(ode_steps, dtype=torch.float32) * dt


# --------------------------------------------------------------------------------------------------
# The teacher


class TeacherLike(Protocol):
    """What distillation needs from a teacher: its latents and its flow map (see :class:`Teacher`)."""

    def encode(self, obs: Tensor) -> Tensor: ...
    def flow(self, z: Tensor, x: Tensor, t: Tensor, span: float, steps: int) -> Tensor: ...


class Teacher:
    """A frozen copy of the model's sampling networks (the EMA ones when enabled) with the model's
    standardisations. Built once, at the end of ordinary training."""

    def __init__(self, model: FlowModel) -> None:
        encoder, denoiser = model.sampling_networks()
        self.encoder: nn.Module = copy.deepcopy(encoder).requires_grad_(False)
        self.denoiser: nn.Module = copy.deepcopy(denoiser).requires_grad_(False)
        self.model = model  # for the standardisation buffers, which training never changes

    @torch.no_grad()
    def encode(self, obs: Tensor) -> Tensor:
        """(B, O) raw observations → (B, L) standardised latents."""
        m = self.model
        latents: Tensor = self.encoder(obs)
        return (latents - m.latent_mean) / m.latent_std

    @torch.no_grad()
    def velocity(self, z: Tensor, x: Tensor, t: Tensor) -> Tensor:
        """Velocity (B, A) in decoder-input units at ``x`` (B, A), ``t`` (B, 1)."""
        m = self.model
        v: Tensor = self.denoiser(torch.cat((z, (x - m.x_mean) / m.x_std, t), dim=1))
        return v * m.v_std + m.v_mean

    @torch.no_grad()
    def flow(self, z: Tensor, x: Tensor, t: Tensor, span: float, steps: int) -> Tensor:
        """Φ(x; t → t + span) with ``steps`` explicit midpoint steps (2 evaluations each); ``t`` (B, 1)
        may differ per row."""
        h = span / steps
        for _ in range(steps):
            half = x + (0.5 * h) * self.velocity(z, x, t)
            x = x + h * self.velocity(z, half, t + 0.5 * h)
            t = t + h
        return x


# --------------------------------------------------------------------------------------------------
# First-interval targets


class TargetPool:
    """A ring of first-interval examples ``(obs (O,), x0 (A,), x_end (A,))``: the teacher's
    ``Φ(x0; 0 → 1/N)`` does not depend on the student, so each one can serve several iterations.

    ``capacity`` rows (bounded by :data:`POOL_LIMIT_BYTES`); :meth:`add` overwrites the oldest;
    :meth:`sample` draws uniformly with replacement from what has been added. :meth:`due` says when to
    compute fresh targets: every ``reuse``-th request, and whenever the pool holds fewer rows than asked
    for (at the start)."""

    def __init__(
        self,
        capacity: int,
        obs_width: int,
        width: int,
        device: torch.device,
        dtype: torch.dtype,
        reuse: int = 4,
    ) -> None:
        if reuse < 1:
            raise ValueError(f"reuse must be >= 1, got {reuse}")
        self.reuse = reuse
        self._requests = 0
        row_bytes = 4 * (obs_width + 2 * width)
        self.capacity = max(1, min(capacity, POOL_LIMIT_BYTES // row_bytes))
        self.obs = torch.empty((self.capacity, obs_width), device=device, dtype=dtype)
        self.x0 = torch.empty((self.capacity, width), device=device, dtype=dtype)
        self.x_end = torch.empty((self.capacity, width), device=device, dtype=dtype)
        self.size = 0
        self._next = 0

    def add(self, obs: Tensor, x0: Tensor, x_end: Tensor) -> None:
        for start in range(0, obs.shape[0], self.capacity):  # more rows than capacity: keep the newest
            chunk = slice(start, start + self.capacity)
            rows = obs[chunk].shape[0]
            index = (torch.arange(rows, device=obs.device) + self._next) % self.capacity
            self.obs.index_copy_(0, index, obs[chunk])
            self.x0.index_copy_(0, index, x0[chunk])
            self.x_end.index_copy_(0, index, x_end[chunk])
            self._next = (self._next + rows) % self.capacity
            self.size = min(self.capacity, self.size + rows)

    def due(self, rows: int) -> bool:
        """Whether this request for ``rows`` targets should compute fresh ones (counts the request)."""
        fresh = self.size < rows or self._requests % self.reuse == 0
        self._requests += 1
        return fresh

    def sample(self, n: int, generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
        if self.size == 0:
            raise ValueError("the target pool is empty")
        index = torch.randint(self.size, (n,), generator=generator, device=self.obs.device)
        return self.obs[index], self.x0[index], self.x_end[index]


# --------------------------------------------------------------------------------------------------
# The step


def _student_velocity(model: FlowModel, z: Tensor, x: Tensor, t: Tensor) -> Tensor:
    return model.velocity_standardized(z, x, t) * model.v_std + model.v_mean


def _distill_loss(pred: Tensor, target: Tensor, huber: float) -> Tensor:
    """Mean squared error (``huber`` 0) or the pseudo-Huber loss ``sqrt(d² + c²) − c`` with ``c = huber``."""
    if huber <= 0:
        return flow_matching_loss(pred, target)
    d = pred - target
    return (torch.sqrt(d * d + huber * huber) - huber).mean()


def distill_step(
    model: FlowModel,
    teacher: TeacherLike,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    generator: torch.Generator,
    settings: DistillSettings,
    time_dist: TimeDistribution,
    obs_noise_scale: float,
    iteration: int = 0,
    pool: TargetPool | None = None,
) -> StepMetrics:
    """One distillation step on ``batch`` (module docstring, steps 1–5); every random draw comes from
    ``generator``, in a fixed order, so a seed reproduces the run.

    ``pool``: first-interval targets to reuse (None: always fresh). When :meth:`TargetPool.due`, the
    ``B/N`` first-interval rows get fresh teacher targets, which join the pool; otherwise they are drawn
    from the pool (observations included). ``obs_noise_scale`` applies to the student's inputs only (the
    teacher's targets stay those of the clean observation). Raises :class:`Diverged` before the optimiser
    step. Returns the total loss (standardised velocity units)."""
    obs, x1 = batch.obs, batch.x1
    rows, width = x1.shape
    n = settings.ode_steps
    device, dtype = x1.device, x1.dtype
    dt = torch.tensor(1.0 / n, dtype=dtype, device=device)  # float32, as the engine's dt
    first = max(1, round(rows / n)) if n > 1 else rows  # rows on the first interval (k = 0)
    fresh = pool is None or pool.due(first)

    x0 = torch.randn((rows, width), generator=generator, device=device, dtype=dtype)
    k = torch.zeros((rows, 1), dtype=torch.int64, device=device)
    if n > 1:
        k[first:] = torch.randint(1, n, (rows - first, 1), generator=generator, device=device)

    with torch.no_grad():
        # 1. First interval: fresh teacher targets from x0 (kept for later), or targets from the pool.
        if fresh:
            t0 = torch.zeros((first, 1), dtype=dtype, device=device)
            end = teacher.flow(teacher.encode(obs[:first]), x0[:first], t0, 1.0 / n, settings.substeps)
            parts_obs, parts_x, parts_end = [obs[:first]], [x0[:first]], [end]
            if pool is not None:
                pool.add(obs[:first], x0[:first], end)
        else:
            assert pool is not None  # only a pool can make a request not fresh
            p_obs, p_x0, p_end = pool.sample(first, generator)
            parts_obs, parts_x, parts_end = [p_obs], [p_x0], [p_end]
        # 2.–3. Later intervals: the student's own Euler rollout to x̂_{t_k}, then the teacher from there.
        if first < rows:
            later_obs, x, later_k = obs[first:], x0[first:], k[first:]
            z_student = model.encode(later_obs)
            for j in range(n - 1):
                moving = (later_k > j).squeeze(1).nonzero().squeeze(1)
                if moving.numel() == 0:
                    break
                t_j = torch.full((moving.numel(), 1), float(j), dtype=dtype, device=device) * dt
                x_m = x.index_select(0, moving)
                v = _student_velocity(model, z_student.index_select(0, moving), x_m, t_j)
                x = x.index_copy(0, moving, x_m + dt * v)
            t_k = later_k.to(dtype) * dt
            later_end = teacher.flow(teacher.encode(later_obs), x, t_k, 1.0 / n, settings.substeps)
            parts_obs.append(later_obs)
            parts_x.append(x)
            parts_end.append(later_end)
        obs_all = torch.cat(parts_obs)
        x_k = torch.cat(parts_x)
        t_all = k.to(dtype) * dt  # rows keep their order: [first interval ‖ later intervals]
        # 4. The interval's average velocity, in the loss's standardised units.
        target = model.standardize_velocity((torch.cat(parts_end) - x_k) / dt)

    noisy = obs_noise_scale > 0
    z = model.encode(obs_all, model.observation_noise(rows, obs_noise_scale, generator) if noisy else None)
    fm_rows = max(1, round(settings.fm_rows * rows)) if settings.fm_weight > 0 else 0
    if fm_rows:
        # 5. Ordinary flow matching at random t on the batch's own rows, in the same forward pass.
        noise = torch.randn((fm_rows, width), generator=generator, device=device, dtype=dtype)
        t_fm = time_dist.sample(fm_rows, generator, device, dtype)
        path = model.flow_path(noise, x1[:fm_rows], t_fm)
        z_fm = model.encode(
            obs[:fm_rows], model.observation_noise(fm_rows, obs_noise_scale, generator) if noisy else None
        )
        pred = model.velocity_standardized(
            torch.cat((z, z_fm)), torch.cat((x_k, path.x_t)), torch.cat((t_all, t_fm))
        )
        loss = _distill_loss(pred[:rows], target, settings.huber) + settings.fm_weight * flow_matching_loss(
            pred[rows:], model.standardize_velocity(path.target)
        )
    else:
        loss = _distill_loss(model.velocity_standardized(z, x_k, t_all), target, settings.huber)
    return apply_gradients(loss, optimizer, iteration, "distillation loss")


# --------------------------------------------------------------------------------------------------
# The phase


class Distiller:
    """Phase 2 of a run: holds the teacher, the target pool, a fresh optimiser and its own EMA schedule.

    Built at the phase boundary from the model as ordinary training left it:

    * teacher = frozen copy of the sampling (EMA) networks;
    * student = the live networks, reset to the same (EMA) weights, so distillation starts from the
      better of the two copies;
    * a fresh AdamW (same learning rate, per-layer rule and weight decay): the flow-matching moments
      describe another loss's gradients;
    * the EMA warm-up restarts (decay_k = min(decay, (1 + k)/(10 + k)) counted from the boundary): with the
      full decay from the first step, the exported average would still be mostly the teacher after a
      phase of a few hundred iterations.
    """

    def __init__(
        self,
        model: FlowModel,
        settings: DistillSettings,
        *,
        learning_rate: float,
        weight_decay: float,
        time_dist: TimeDistribution,
        obs_noise_scale: float,
        layer_lr: str = "same",
        teacher: TeacherLike | None = None,
        pool_capacity: int = 16_384,
    ) -> None:
        """``teacher``: None (the trainer) freezes the model as it is now; tests pass an exact one.
        ``pool_capacity``: rows of the first-interval target pool (0: no pool)."""
        self.model = model
        self.settings = settings
        self.time_dist = time_dist
        self.obs_noise_scale = obs_noise_scale
        self.teacher: TeacherLike = teacher if teacher is not None else Teacher(model)
        self.pool_capacity = pool_capacity
        self.pool: TargetPool | None = None
        with torch.no_grad():
            for live, ema in self._ema_pairs():
                live.copy_(ema)
        self.optimizer = make_optimizer(model, learning_rate, weight_decay, layer_lr)
        self.ema_count = 0

    def _ema_pairs(self) -> Iterator[tuple[Tensor, Tensor]]:
        """(live, ema) parameter pairs; none when the EMA is disabled."""
        model = self.model
        if model.ema_denoiser is None:
            return iter(())
        pairs = list(zip(model.denoiser.parameters(), model.ema_denoiser.parameters(), strict=True))
        if model.ema_encoder is not None:
            pairs += zip(model.encoder.parameters(), model.ema_encoder.parameters(), strict=True)
        return iter(pairs)

    def step(self, batch: Batch, generator: torch.Generator, iteration: int) -> StepMetrics:
        """One distillation iteration, then the EMA update."""
        if self.pool is None and self.pool_capacity > 0 and self.settings.pool_reuse > 1:
            self.pool = TargetPool(
                self.pool_capacity,
                batch.obs.shape[1],
                batch.x1.shape[1],
                batch.x1.device,
                batch.x1.dtype,
                self.settings.pool_reuse,
            )
        metrics = distill_step(
            self.model,
            self.teacher,
            self.optimizer,
            batch,
            generator,
            self.settings,
            self.time_dist,
            self.obs_noise_scale,
            iteration,
            self.pool,
        )
        self._update_ema()
        return metrics

    @torch.no_grad()
    def _update_ema(self) -> None:
        pairs = list(self._ema_pairs())
        if not pairs:
            return
        n = self.ema_count
        decay = min(self.model.ema_decay, (1.0 + n) / (10.0 + n))
        torch._foreach_lerp_([e for _, e in pairs], [p for p, _ in pairs], 1.0 - decay)
        self.ema_count = n + 1


class DistillationStep:
    """The distillation phase as a :class:`~trainer.training.steps.base.TrainingStep`: :meth:`Distiller.step` on
    the sampler's minibatches. ``before_backward`` as for :class:`~trainer.training.steps.autograd.AutogradStep`."""

    def __init__(
        self,
        distiller: Distiller,
        sampler: BatchSampler,
        generator: torch.Generator,
        before_backward: Callable[[], None] | None = None,
    ) -> None:
        self.distiller = distiller
        self.sampler = sampler
        self.generator = generator
        self.before_backward = before_backward

    def step(self, iteration: int) -> StepMetrics:
        if self.before_backward is not None:
            self.before_backward()
        return self.distiller.step(self.sampler.next(), self.generator, iteration)
