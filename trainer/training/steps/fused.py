"""A fused training step for the engine's denoiser MLP: same objective and random draws, fewer kernels.

:func:`trainer.training.steps.autograd.train_step` is the readable reference (autograd, ``torch.optim.AdamW``). For the
networks the engine builds (spec §6.3: ``Sequence[Sequence[Linear, act, …, Linear], Denormalize]``
with ELU/ReLU/TanH) and a frozen encoder, most of a step's wall time on a CPU is per-op overhead, not
arithmetic: autograd bookkeeping, AdamW's per-parameter loop (about a dozen ops per tensor on CPU, where
torch uses neither the foreach nor the fused kernels by default) and fresh allocations. :class:`FusedStep`
removes that overhead and nothing else:

* **Preallocated buffers.** Every batch-sized tensor is allocated once and written with ``out=``.
* **Hand-written backward.** Per layer two ``mm``, one ``sum`` and the activation's ATen backward kernel
  (``elu_backward``, ``threshold_backward``, ``tanh_backward``: the ones autograd calls).
* **Flat parameters** (:mod:`trainer.training.steps.flat`). Weights, gradients and AdamW moments live in one
  contiguous buffer each (blocks 64-byte aligned, so the BLAS sees the same alignment every run); the
  parameters (and the optimiser's state tensors) become views into them, so AdamW is one fused kernel
  (or nine element-wise ops) on one tensor and the gradient norm one reduction.
* **Frozen encoder precomputed.** The encoder and the latent standardisation are deterministic per
  training row, so the standardised latents of every row are computed once (when they fit in
  :data:`PRECOMPUTE_LIMIT_BYTES`) and a batch gathers them. (One table of latents and targets, gathered
  at once, measured slower: the strided halves cost more downstream than the second gather.)
* **One EMA update.** The EMA copies of the parameters are views into one flat buffer too, so the
  EMA step is a single ``lerp_`` over it (the same per-element formula as the per-tensor one).
* **No host read per step** (a :class:`~trainer.training.steps.base.DeferredStep`, issue 32): the
  finiteness check runs on the device (``_amp_foreach_non_finite_check_and_unscale_`` at scale 1 over
  the gradients and the loss, a sticky flag), the fused AdamW skips its update on that flag
  (``found_inf``; the step count advances by its complement), the EMA's weight is masked to 0 by it, and
  the loss is smoothed in a device buffer. :meth:`FusedStep.launch` takes a step, :meth:`FusedStep.read`
  reads once (raising :class:`Diverged` for the first step skipped since the last read); on a CPU each
  of these is bitwise the host version's (tests/trainer/test_host_reads.py, benchmarks/seeded_sessions.py).
  With ``device_state`` the learning rates and the EMA weight are device tensors too, for a CUDA graph
  (:mod:`trainer.training.steps.graphed`). Exact mode keeps the reference's host check (its AdamW has no
  device-side skip).

Random stream: unchanged. The generator is drawn in the reference order: batch rows (``randint``),
``x0`` (``randn``), ``t`` (:meth:`TimeDistribution.sample`), observation noise (magnitudes ``rand``,
then ``randn``, :meth:`FlowModel.observation_noise`), with the same shapes and dtypes, so the same seed
draws the same numbers as ``BatchSampler.next`` + ``train_step``. The flow path (linear, or the
fitted-source path of ``NormalizeLatents``) is computed with the same operations in the same order as
:meth:`FlowModel.flow_path`.

Two modes (``exact``):

* ``exact=True`` runs the kernels autograd and torch's AdamW run on CPU: ELU with ``expm1`` and its
  input-based backward, weight gradients as ``mm(g.T, a)`` (what autograd computes for ``F.linear``), the
  single-tensor AdamW formulas element for element. For the engine's networks (an element-wise encoder)
  every step is then bitwise the reference step (the tests check it); the loss and gradient norm are
  reported from one flat reduction, which can differ from the reference's in the last bit.
* ``exact=False`` (the trainer's choice) computes ELU as ``max(h, exp(min(h, 0)) − 1)`` (``expm1`` is
  not vectorised on CPU and ATen's ``elu`` costs about twice these four kernels), its backward from the
  result (``a + 1``, no second exponential), and AdamW with torch's fused kernel. Same functions; results
  agree with the reference to float rounding (a few ulp per step), so training is the same in
  distribution.

Either way, a fixed seed gives bitwise-identical results run to run (same shapes, thread count and
alignment; the latents precomputed from a non-element-wise encoder differ from per-batch ones only in
rounding, consistently).

Anything else (a trained encoder, other layer types, a GELU, non-float32, another optimiser) is left to
the reference step: :func:`fused_step_unsupported` says why, :meth:`FusedStep.build` returns None.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from trainer.errors import Diverged
from trainer.system.console import log
from trainer.system.torch_compat import mark_non_finite
from trainer.training.data import TensorData
from trainer.training.flow import TimeDistribution, source_spread, stratified_draws
from trainer.training.model import FlowModel
from trainer.training.steps.base import LOSS_SMOOTHING, StepMetrics
from trainer.training.steps.compiled import FlatLayout, FlatStep, compile_flat_step
from trainer.training.steps.flat import FlatAdamW
from trainer.training.steps.mlp import MlpLayout, activation_backward, activation_forward, parse_mlp

__all__ = ["PRECOMPUTE_LIMIT_BYTES", "FusedStep", "fused_step_unsupported"]

PRECOMPUTE_LIMIT_BYTES = 256 * 1024 * 1024
"""Largest table of precomputed standardised latents (N × L float32). Above it the frozen encoder runs
on each batch instead (same values, a few more ops per step), so memory stays bounded on huge buffers."""

_PRECOMPUTE_CHUNK = 65536
"""Rows per encoder pass while precomputing latents (bounds the temporary memory)."""


def fused_step_unsupported(model: FlowModel, optimizer: torch.optim.Optimizer) -> str | None:
    """None when :class:`FusedStep` can run this model and optimiser, else the reason (for the log)."""
    if model.placement.encoder_trained or any(p.requires_grad for p in model.encoder.parameters()):
        return "the encoder is trained (it has weights: Encoding MLPs)"
    if not model.noise_on_latents:
        return "the encoder is not an element-wise map (observation noise goes before it)"
    layout = parse_mlp(model.denoiser)
    if isinstance(layout, str):
        return layout
    params = [p for lin in layout.linears for p in (lin.weight, lin.bias)]
    if any(p.dtype != torch.float32 for p in params):
        return "the denoiser is not float32"
    if not isinstance(optimizer, torch.optim.AdamW):
        return "the optimiser is not an AdamW"
    groups = optimizer.param_groups
    grouped = [p for group in groups for p in group["params"]]
    if {id(p) for p in grouped} != {id(p) for p in params} or len(grouped) != len(params):
        return "the optimiser does not update exactly the denoiser's Linear weights and biases"
    shared = ("betas", "eps", "weight_decay", "amsgrad")
    if any(group[key] != groups[0][key] for group in groups for key in shared):
        return "the optimiser's groups differ in more than their learning rate"
    group = groups[0]
    if group.get("maximize") or group.get("capturable") or group.get("differentiable"):
        return "the optimiser uses maximize, capturable or differentiable"
    if isinstance(group["betas"][0], Tensor) or isinstance(group["betas"][1], Tensor):
        return "the optimiser's betas are tensors"
    steps = {float(s["step"]) for s in optimizer.state.values() if "step" in s}
    if len(steps) > 1 or (optimizer.state and len(optimizer.state) != len(params)):
        return "the optimiser's state is not the same age for every parameter"
    return None


class FusedStep:
    """Batch sampling + one optimisation step, fused; a drop-in for ``BatchSampler.next`` + ``train_step``.

    Build with :meth:`build`. After building, the denoiser's parameters, the AdamW state tensors and the
    EMA copies are views into the flat buffers of :attr:`flat` (:class:`trainer.training.steps.flat.FlatAdamW`):
    ``model.state_dict()`` and ``optimizer.state_dict()`` stay valid and current, and the torch optimiser
    may take over at any step; gradients live in ``flat.grads``, so ``p.grad`` stays None.
    """

    def __init__(
        self,
        model: FlowModel,
        optimizer: torch.optim.AdamW,
        layout: MlpLayout,
        data: TensorData,
        batch_size: int,
        generator: torch.Generator,
        time_distribution: TimeDistribution,
        obs_noise_scale: float,
        exact: bool,
        compiled: bool = False,
        average_gradients: Callable[[Tensor], None] | None = None,
        draws_per_row: int = 1,
        device_state: bool = False,
    ) -> None:
        """Use :meth:`build`, which checks support first."""
        device = data.obs.device
        self.model = model
        self.optimizer = optimizer
        self.generator = generator
        self.time_distribution = time_distribution
        self.obs_noise_scale = float(obs_noise_scale)
        self.exact = exact
        self.batch_size = batch_size
        self.average_gradients = average_gradients
        self.row_num = data.row_num
        self.device = device
        self.draws_per_row = draws_per_row
        # Every sample-sized buffer holds batch_size rows x draws_per_row (x0, t) draws.
        b = batch_size * draws_per_row

        # Latents: precomputed per row when they fit, else encoded per batch (same values).
        latent_width = int(model.latent_mean.shape[0])
        action_width = int(data.x1.shape[1])
        self._obs = data.obs
        self._x1 = data.x1
        self._latents: Tensor | None = None
        if data.row_num * latent_width * 4 <= PRECOMPUTE_LIMIT_BYTES:
            self._latents = _encode_all(model, data.obs)

        # Flat parameters, gradients, AdamW moments and EMA, in the optimiser's parameter order. One fused
        # AdamW kernel where torch has it for this device (CPU since 2.4, CUDA).
        params: list[nn.Parameter] = [p for group in optimizer.param_groups for p in group["params"]]
        fused_adamw = not exact and hasattr(torch, "_fused_adamw_") and device.type in ("cpu", "cuda")
        self.flat = FlatAdamW(model, optimizer, params, device, fused=fused_adamw)
        flat, blocks = self.flat, self.flat.blocks
        index = {id(p): i for i, p in enumerate(params)}

        # The MLP: weights/biases and their gradient blocks, activation buffers per layer.
        self._layers: list[tuple[Tensor, Tensor, Tensor, Tensor]] = []
        for lin in layout.linears:
            wi, bi = index[id(lin.weight)], index[id(lin.bias)]
            self._layers.append(
                (
                    blocks.view(flat.params, wi),
                    blocks.view(flat.params, bi),
                    blocks.view(flat.grads, wi),
                    blocks.view(flat.grads, bi),
                )
            )
        # Transposed views, made once (they stay valid: the flat buffers are never replaced).
        self._weights_t = [layer[0].t() for layer in self._layers]
        widths = [int(lin.weight.shape[0]) for lin in layout.linears]
        in_width = int(layout.linears[0].weight.shape[1])
        if in_width != latent_width + action_width + 1 or widths[-1] != action_width:
            raise ValueError(
                f"the denoiser maps {in_width} -> {widths[-1]} but [latents | x | t] -> velocity is "
                f"{latent_width + action_width + 1} -> {action_width}"
            )
        self._forward = [activation_forward(a, exact) for a in layout.activations]
        self._backward = [activation_backward(a, exact) for a in layout.activations]
        self._out_mean = layout.output_mean
        self._out_std = layout.output_std

        def empty(*shape: int) -> Tensor:
            return torch.empty(shape, dtype=torch.float32, device=device)

        self._idx = torch.empty(b, dtype=torch.int64, device=device)
        self._z = empty(b, latent_width)
        self._x1b = empty(b, action_width)
        self._x0 = empty(b, action_width)
        self._t = empty(b, 1)
        self._target = empty(b, action_width)
        self._xt = empty(b, action_width)
        self._xs = empty(b, action_width)
        self._noise = empty(b, latent_width) if self.obs_noise_scale > 0 else None
        self._magnitude = empty(b, 1) if self.obs_noise_scale > 0 else None
        self._fitted = model.fitted_source
        if self._fitted:
            self._a = empty(b, action_width)
            self._s = empty(b, action_width)
            self._one_minus_t = empty(b, 1)
        self._inp = empty(b, in_width)
        self._pre = [empty(b, w) for w in widths]  # pre-activations h_k (the last one is the output)
        if exact:
            self._act = [empty(b, w) for w in widths[:-1]]  # activations a_k
            self._scratch = [empty(b, w) for w in widths[:-1]]
        else:
            # The fast backward reads only the activation's result, so a_k overwrites h_k in place and one
            # scratch per width serves every layer: a smaller working set (same values, same kernels).
            self._act = self._pre[:-1]
            shared = {w: empty(b, w) for w in set(widths[:-1])}
            self._scratch = [shared[w] for w in widths[:-1]]
        self._pred = empty(b, action_width) if self._out_mean is not None else self._pre[-1]
        self._u = empty(b, action_width)
        self._diff = empty(b, action_width)
        self._grad_pre = [empty(b, w) for w in widths]  # dL/dh_k
        self._grad_pre_t = [g.t() for g in self._grad_pre]
        # dL/da_k; the fast mode's result-based backward turns it into dL/dh_k in place (same buffer).
        self._grad_act = [empty(b, w) for w in widths[:-1]] if exact else self._grad_pre[:-1]
        self._uniform_time = time_distribution.kind == "uniform"
        # The arithmetic after the draws as one compiled function (trainer.training.steps.compiled), when asked for
        # and possible: it gathers from the precomputed latents, and exact mode keeps ATen's kernels.
        self._compiled: FlatStep | None = None
        if compiled and not exact and self._latents is not None and not self._fitted:
            flat_layout = FlatLayout(
                blocks=tuple(
                    (off, tuple(shape)) for off, shape in zip(blocks.offsets, blocks.shapes, strict=True)
                ),
                layers=tuple((index[id(lin.weight)], index[id(lin.bias)]) for lin in layout.linears),
                size=blocks.size,
            )
            self._compiled = compile_flat_step(layout.activations, flat_layout)

        # What the step leaves on the device instead of reading it (DeferredStep): this step's sum of
        # squared errors, the smoothed sum, the sticky non-finite flag and its complement, the EMA's
        # masked weight. With device_state the learning rates and the EMA's 1 - decay are device tensors
        # too, written by prepare() when they change (a CUDA graph reads them there).
        self._divisor = b * action_width
        self._loss_sum = torch.zeros((), dtype=torch.float32, device=device)
        self._smoothed = torch.zeros((), dtype=torch.float32, device=device)
        self._smoothed_next = torch.zeros((), dtype=torch.float32, device=device)
        self._skipped = torch.zeros((), dtype=torch.bool, device=device)
        self._found_inf = torch.zeros((), dtype=torch.float32, device=device)
        self._keep = torch.ones((), dtype=torch.float32, device=device)
        self._one = torch.ones((), dtype=torch.float32, device=device)
        ema_on = model.ema_denoiser is not None and self.flat.fused
        self._ema_weight = torch.zeros((), dtype=torch.float32, device=device) if ema_on else None
        self._ema_base = (
            torch.zeros((), dtype=torch.float32, device=device) if ema_on and device_state else None
        )
        self._ema_value = math.nan
        self.device_state = device_state and self.flat.fused
        # float64 on a CPU (its kernel reads the rate as a double: bitwise the number's update), float32
        # on CUDA (its kernel reads a float).
        lr_dtype = torch.float64 if device.type == "cpu" else torch.float32
        groups = len(optimizer.param_groups)
        self._lrs = (
            [torch.zeros((), dtype=lr_dtype, device=device) for _ in range(groups)]
            if self.device_state
            else None
        )
        self._lr_values = [math.nan] * groups
        self._launched = _Launches()
        """Iterations launched since the last read (a divergence names the first one skipped)."""
        self._applied = self.flat.step_count
        """AdamW updates the device had applied at the last read."""
        self._smoothing_started = False
        self._smooth = False
        self._smoothed_value = math.nan

    @property
    def compiling(self) -> bool:
        """Whether the step runs (or will, once compiled) through the compiled function."""
        return self._compiled is not None

    @classmethod
    def build(
        cls,
        model: FlowModel,
        optimizer: torch.optim.Optimizer,
        data: TensorData,
        batch_size: int,
        generator: torch.Generator,
        time_distribution: TimeDistribution,
        obs_noise_scale: float,
        *,
        exact: bool = False,
        compiled: bool = False,
        average_gradients: Callable[[Tensor], None] | None = None,
        draws_per_row: int = 1,
        device_state: bool = False,
    ) -> FusedStep | None:
        """The fused step for this job, or None when :func:`fused_step_unsupported` finds a reason.

        ``exact``: run the kernels autograd and torch's AdamW run (ELU with ``expm1``, its input-based
        backward, the single-tensor AdamW), so that for the engine's networks every step is bitwise the
        reference step's. False (the default, the trainer's choice): ``exp − 1`` ELU, result-based ELU
        backward and the fused AdamW kernel, equal to the reference to float rounding and faster.

        ``compiled``: run the arithmetic after the draws as one ``torch.compile``-d function
        (:mod:`trainer.training.steps.compiled`; ignored with ``exact``). The first step compiles; if that fails the
        step falls back to the eager kernels with one warning line.

        ``average_gradients``: called on the flat gradient buffer after the finiteness check, before
        AdamW (scale-out replaces it by the processes' average there,
        :meth:`~trainer.training.steps.base.GradientAveraging.average_flat`).

        ``draws_per_row`` K > 1: each of the ``batch_size`` rows is trained on K (x0, t) draws, stratified
        in t and antithetic in x0 (:func:`trainer.training.flow.stratified_draws`), instead of one independent
        draw: a different random stream from K = 1's (rows ``randint``, then those draws, then the
        observation noise per sample).

        ``device_state``: the learning rates and the EMA's ``1 - decay`` live in device tensors that the
        host half of a step writes when they change, so that a CUDA graph of the device half stays
        right (:mod:`trainer.training.steps.graphed`); on a CPU bitwise the same steps as without."""
        if isinstance(draws_per_row, bool) or not isinstance(draws_per_row, int) or draws_per_row < 1:
            raise ValueError(f"draws_per_row must be a positive int, got {draws_per_row!r}")
        if fused_step_unsupported(model, optimizer) is not None:
            return None
        layout = parse_mlp(model.denoiser)
        if isinstance(layout, str) or not isinstance(optimizer, torch.optim.AdamW):
            return None
        if data.obs.dtype != torch.float32 or data.x1.dtype != torch.float32:
            return None
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        return cls(
            model,
            optimizer,
            layout,
            data,
            batch_size,
            generator,
            time_distribution,
            obs_noise_scale,
            exact,
            compiled,
            average_gradients,
            draws_per_row,
            device_state,
        )

    # ----------------------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, iteration: int = 0) -> StepMetrics:
        """Draw a batch and take one step, then read its metrics: :meth:`launch` and :meth:`read`. Same
        contract as :func:`trainer.training.steps.autograd.train_step`: raises :class:`Diverged` with
        the weights, the moments and the EMA untouched when the loss or the gradients are not finite. One
        host read per step; the training loop launches instead and reads rarely."""
        self.launch(iteration)
        return self.read()

    @torch.no_grad()
    def launch(self, iteration: int = 0) -> None:
        """One step without a host read (:class:`~trainer.training.steps.base.DeferredStep`): the host
        half (adoption check, counters, the learning rates and the EMA weight), then the device half
        :meth:`device_step`, which a CUDA graph captures (:mod:`trainer.training.steps.graphed`)."""
        self.prepare(iteration)
        self.device_step()

    def prepare(self, iteration: int) -> None:
        """The host half of a step, before :meth:`device_step` runs (or its graph replays)."""
        if not self.flat.adopted():
            if fused_step_unsupported(self.model, self.optimizer) is not None:
                raise RuntimeError("the model or optimiser changed into one the fused step cannot run")
            if self._launched:
                self.read()  # the state about to be replaced may hold an unreported divergence
            self.flat.adopt()
            self._applied = self.flat.step_count
        self._launched.add(iteration)
        self._smooth = self._smoothing_started
        self._smoothing_started = True
        self.flat.count()
        if self._ema_weight is not None:
            weight = self.model.take_ema_weight()
            if self._ema_base is None:
                self._ema_value = weight
            elif weight != self._ema_value:  # changes during the warm-up only
                self._ema_base.fill_(weight)
                self._ema_value = weight
        if self._lrs is not None:
            for i, group in enumerate(self.optimizer.param_groups):
                lr = float(group["lr"])
                if lr != self._lr_values[i]:
                    self._lrs[i].fill_(lr)
                    self._lr_values[i] = lr

    def device_step(self) -> None:
        """The device half: draws, forward, backward, the finiteness check, AdamW, the EMA and the
        smoothed loss, in that order, with no host read. With ``device_state`` every number that changes
        between steps is read from a device tensor (a CUDA graph may capture it)."""
        model = self.model
        g = self.generator
        b = self.batch_size

        # 1. The draws, in the reference order (module docstring); the gathers use no random numbers.
        if self.draws_per_row > 1:
            k = self.draws_per_row
            rows = torch.randint(self.row_num, (b,), generator=g, device=self.device)
            idx = self._idx.copy_(rows.repeat_interleave(k))
            draws = stratified_draws(self.time_distribution, b, k, self._x0.shape[1], g, self.device)
            x0 = self._x0.copy_(draws.x0)
            t = self._t.copy_(draws.t)
        else:
            idx = torch.randint(self.row_num, (b,), generator=g, out=self._idx)
            x0 = torch.randn(self._x0.shape, generator=g, out=self._x0)
            if self._uniform_time:
                t = torch.rand(self._t.shape, generator=g, out=self._t)
            else:
                t = self.time_distribution.sample(b, g, self.device, torch.float32)
        start, gain = model.spread
        if gain > 0:  # FlowModel.flow_path's widened late-time source (no random draws)
            x0.mul_(source_spread(t, start, gain))
        noise = None
        if self._noise is not None and self._magnitude is not None:
            # FlowModel.observation_noise, in place: ε·(m·scale)·noise_std.
            magnitude = torch.rand(self._magnitude.shape, generator=g, out=self._magnitude)
            noise = torch.randn(self._noise.shape, generator=g, out=self._noise)
            noise.mul_(magnitude.mul_(self.obs_noise_scale)).mul_(model.noise_std)
        compiled = self._compiled is not None and self._compiled_loss(idx, x0, t, noise)
        if not compiled:
            self._eager_loss_and_grads(idx, x0, t, noise)

        # 5. Check on the device (sticky until read), average across processes (scale-out), AdamW and
        # the EMA, each skipped there when the check failed.
        if self.flat.fused:
            mark_non_finite((self.flat.grads, self._loss_sum), self._found_inf)
            torch.sub(self._one, self._found_inf, out=self._keep)
        else:
            self._check_on_host()  # the single-tensor formulas (exact mode) cannot skip on the device
        if self.average_gradients is not None:
            self.average_gradients(self.flat.grads)
        if not self.flat.fused:
            self.flat.apply()
            model.update_ema(self.flat.ema_pairs)
        else:
            self.flat.apply(keep=self._keep, found_inf=self._found_inf, lrs=self._lrs)
            if self._ema_weight is not None:
                base = self._ema_value if self._ema_base is None else self._ema_base
                torch.mul(self._keep, base, out=self._ema_weight)
                model.apply_ema(self.flat.ema_pairs or model.ema_pairs(), self._ema_weight)
        # A skipped step leaves the smoothed loss as it was: after a divergence it holds the last good
        # step's, for the read that reports it (the same bits as an in-place lerp otherwise).
        if self._smooth:
            torch.lerp(self._smoothed, self._loss_sum, 1.0 - LOSS_SMOOTHING, out=self._smoothed_next)
        else:
            self._smoothed_next.copy_(self._loss_sum)
        torch.gt(self._found_inf, 0.0, out=self._skipped)
        torch.where(self._skipped, self._smoothed, self._smoothed_next, out=self._smoothed)

    def smooth_from(self, value: float) -> None:
        """Continue the smoothed loss from ``value`` (mean squared error) instead of the next step's."""
        if math.isfinite(value):
            self._smoothed.fill_(value * self._divisor)
            self._smoothing_started = True
            self._smoothed_value = value

    @property
    def smoothed_loss(self) -> float:
        """The smoothed loss as of the last :meth:`read` (NaN before the first)."""
        return self._smoothed_value

    def probe(self) -> Tensor:
        """The smoothed loss now, a new 0-d float32 tensor on the device (no host read)."""
        return torch.div(self._smoothed, self._divisor)

    def read(self) -> StepMetrics:
        """One host read: the latest step's loss and gradient norm and the smoothed loss; raises
        :class:`Diverged` naming the first step skipped since the last read (the smoothed loss is then the
        last good step's), and clears the flag."""
        launched, self._launched = self._launched, _Launches()
        # vector_norm accumulates float32 in double on CPU, as the reference's norm does.
        values = torch.stack(
            (
                self._loss_sum,
                torch.linalg.vector_norm(self.flat.grads),
                self._smoothed,
                self._found_inf,
                self.flat.steps[0],
            )
        ).tolist()
        loss_total, norm_value, smoothed_total, found, applied = values
        loss_value = loss_total / self._divisor
        if found == 0.0:
            self._smoothed_value = smoothed_total / self._divisor
            self._applied = int(applied)
            return StepMetrics(loss=loss_value, grad_norm=norm_value)
        # Every step since the first bad one was skipped on the device: uncount them, then report.
        good = int(applied) - self._applied
        skipped = len(launched) - good
        self.flat.recount(int(applied))
        self.model.forget_ema_updates(skipped if self._ema_weight is not None else 0)
        self._applied = int(applied)
        self._found_inf.zero_()
        if (
            good > 0
        ):  # the buffer kept the last good step's smoothed loss (device_step); training goes on from it
            self._smoothed_value = smoothed_total / self._divisor
        first = launched.nth(min(max(good, 0), len(launched) - 1)) if launched else -1
        late = f" (found on the device {skipped - 1} steps later)" if skipped > 1 else ""
        raise Diverged(
            f"the loss became non-finite at iteration {first}{late} (loss {loss_value}, gradient norm "
            f"{norm_value}); the weights of the last good iteration were kept",
            iteration=first,
        )

    def _check_on_host(self) -> None:
        """Exact mode: the reference's check, with its host read, before anything changes."""
        loss_total, norm_value = torch.stack(
            (self._loss_sum, torch.linalg.vector_norm(self.flat.grads))
        ).tolist()
        if not (math.isfinite(loss_total) and math.isfinite(norm_value)):
            iteration = self._launched.pop() if self._launched else -1
            self.flat.recount(self.flat.step_count - 1)
            raise Diverged(
                f"the loss became non-finite at iteration {iteration} (loss {loss_total / self._divisor}, "
                f"gradient norm {norm_value}); the weights of the last good iteration were kept",
                iteration=iteration,
            )

    def _compiled_loss(self, idx: Tensor, x0: Tensor, t: Tensor, noise: Tensor | None) -> bool:
        """The sum of squared errors into ``_loss_sum`` and the gradients into the flat buffer, through
        the compiled function; False (and the compiled function dropped, with one warning) when it cannot
        compile or run, so the caller runs the eager stages on the same draws."""
        model = self.model
        assert self._compiled is not None and self._latents is not None
        try:
            metrics, grads = self._compiled(
                self._latents,
                self._x1,
                idx,
                x0,
                t,
                noise,
                self.flat.params,
                model.x_mean,
                model.x_std,
                model.v_mean,
                model.v_std,
                self._out_mean,
                self._out_std,
            )
        except Exception as error:  # inductor raises many types (compiler missing, codegen, lowering)
            self._compiled = None
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            log(f"la-trainer: warning: torch.compile failed ({first[:200]}); using the eager fused step")
            return False
        self.flat.grads.copy_(grads)
        torch.mul(metrics[0], self._divisor, out=self._loss_sum)  # the mean, back to a sum
        return True

    def _eager_loss_and_grads(self, idx: Tensor, x0: Tensor, t: Tensor, noise: Tensor | None) -> None:
        """Stages 1–4 with preallocated buffers: the sum of squared errors into ``_loss_sum`` (0-d),
        gradients into the flat buffer."""
        model = self.model
        z = self._z
        if self._latents is not None:
            torch.index_select(self._latents, 0, idx, out=z)
        else:
            obs = torch.index_select(self._obs, 0, idx)
            torch.sub(model.encoder(obs), model.latent_mean, out=z)
            z.div_(model.latent_std)
        x1 = torch.index_select(self._x1, 0, idx, out=self._x1b)
        if self._fitted:
            # trainer.training.flow.interpolate_fitted: a = (1 - t)·σ, s = a + t, x_t = (a·x0 + t·x1)/s,
            # target = (x1 - x0)·σ/(s·s), the same operations in the same order.
            one_minus_t = torch.sub(1.0, t, out=self._one_minus_t)
            a = torch.mul(one_minus_t, model.source_std, out=self._a)
            s = torch.add(a, t, out=self._s)
            xt = torch.addcmul(torch.mul(a, x0, out=self._xt), t, x1, out=self._xt).div_(s)
            target = torch.sub(x1, x0, out=self._target).mul_(model.source_std).div_(s.mul_(s))
        else:
            target = torch.sub(x1, x0, out=self._target)
            xt = torch.addcmul(x0, t, target, out=self._xt)
        if noise is not None:
            z.add_(noise)
        xs = torch.sub(xt, model.x_mean, out=self._xs).div_(model.x_std)
        torch.cat((z, xs, t), 1, out=self._inp)

        # 2. Forward through the MLP (F.linear is addmm(bias, x, W.T) on CPU and CUDA alike).
        a = self._inp
        last = len(self._layers) - 1
        for k, (_, bias, _, _) in enumerate(self._layers):
            h = torch.addmm(bias, a, self._weights_t[k], out=self._pre[k])
            if k < last:
                self._forward[k](h, self._act[k], self._scratch[k])
                a = self._act[k]
        pred = self._pre[-1]
        if self._out_mean is not None and self._out_std is not None:
            pred = torch.addcmul(self._out_mean, pred, self._out_std, out=self._pred)

        # 3. Loss and its gradient (mse_loss and mse_loss_backward: 2/n · (pred − u)).
        u = torch.sub(target, model.v_mean, out=self._u).div_(model.v_std)
        diff = torch.sub(pred, u, out=self._diff)
        n = diff.numel()
        flat_diff = diff.view(-1)
        torch.dot(flat_diff, flat_diff, out=self._loss_sum)
        grad = torch.mul(diff, 2.0 / n, out=self._grad_pre[-1])
        if self._out_std is not None:
            grad.mul_(self._out_std)

        # 4. Backward: weight, bias and input gradients per layer, into the flat gradient buffer.
        for k in range(last, -1, -1):
            weight, _, grad_w, grad_b = self._layers[k]
            gk = self._grad_pre[k]
            prev = self._inp if k == 0 else self._act[k - 1]
            torch.mm(self._grad_pre_t[k], prev, out=grad_w)
            torch.sum(gk, 0, out=grad_b)
            if k > 0:
                torch.mm(gk, weight, out=self._grad_act[k - 1])
                self._backward[k - 1](self._grad_act[k - 1], self._pre[k - 1], prev, self._grad_pre[k - 1])


class _Launches:
    """The iterations launched since the last read, kept as runs of consecutive numbers: constant memory
    however many steps a caller launches without reading (a benchmark), the first skipped one found."""

    def __init__(self) -> None:
        self._runs: list[list[int]] = []  # [first iteration, count]
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, iteration: int) -> None:
        runs = self._runs
        if runs and runs[-1][0] + runs[-1][1] == iteration:
            runs[-1][1] += 1
        else:
            runs.append([iteration, 1])
        self._count += 1

    def nth(self, k: int) -> int:
        """The ``k``-th iteration launched (0: the first)."""
        for first, count in self._runs:
            if k < count:
                return first + k
            k -= count
        raise IndexError(k)

    def pop(self) -> int:
        """Forget the last launch; its iteration."""
        run = self._runs[-1]
        run[1] -= 1
        self._count -= 1
        if run[1] == 0:
            self._runs.pop()
        return run[0] + run[1]


@torch.no_grad()
def _encode_all(model: FlowModel, obs: Tensor) -> Tensor:
    """Standardised latents (N, L) of every row, chunk by chunk (row-wise identical to encoding a batch)."""
    chunks = [
        model.encode(obs[start : start + _PRECOMPUTE_CHUNK])
        for start in range(0, obs.shape[0], _PRECOMPUTE_CHUNK)
    ]
    return torch.cat(chunks).contiguous()
