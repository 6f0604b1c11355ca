"""A fused training step for the engine's denoiser MLP: same objective and random draws, fewer kernels.

:func:`trainer.steps.autograd.train_step` is the readable reference (autograd, ``torch.optim.AdamW``). For the
networks the engine builds (spec §6.3: ``Sequence[Sequence[Linear, act, …, Linear], Denormalize]``
with ELU/ReLU/TanH) and a frozen encoder, most of a step's wall time on a CPU is per-op overhead, not
arithmetic: autograd bookkeeping, AdamW's per-parameter loop (about a dozen ops per tensor on CPU, where
torch uses neither the foreach nor the fused kernels by default) and fresh allocations. :class:`FusedStep`
removes that overhead and nothing else:

* **Preallocated buffers.** Every batch-sized tensor is allocated once and written with ``out=``.
* **Hand-written backward.** Per layer two ``mm``, one ``sum`` and the activation's ATen backward kernel
  (``elu_backward``, ``threshold_backward``, ``tanh_backward``: the ones autograd calls).
* **Flat parameters.** Weights, gradients and AdamW moments live in one contiguous buffer each (blocks
  64-byte aligned, so the BLAS sees the same alignment every run); the parameters (and the optimiser's
  state tensors) become views into them, so AdamW is one fused kernel (or nine element-wise ops) on one
  tensor and the gradient norm one reduction.
* **Frozen encoder precomputed.** The encoder and the latent standardisation are deterministic per
  training row, so the standardised latents of every row are computed once (when they fit in
  :data:`PRECOMPUTE_LIMIT_BYTES`) and a batch gathers them. (One table of latents and targets, gathered
  at once, measured slower: the strided halves cost more downstream than the second gather.)
* **One EMA update.** The EMA copies of the parameters are views into one flat buffer too, so the
  EMA step is a single ``lerp_`` over it (the same per-element formula as the per-tensor one).

Random stream: unchanged. The generator is drawn in the reference order: batch rows (``randint``),
``x0`` (``randn``), ``t`` (:meth:`TimeDistribution.sample`), observation noise (``randn``), with the same
shapes and dtypes, so the same seed draws the same numbers as ``BatchSampler.next`` + ``train_step``.

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
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from trainer.data import TensorData
from trainer.errors import Diverged
from trainer.flow import TimeDistribution
from trainer.model import FlowModel
from trainer.nne_torch import (
    CompressedLinearModule,
    DenormalizeModule,
    ELUModule,
    LinearModule,
    ReLUModule,
    SequenceModule,
    TanHModule,
)
from trainer.progress import log
from trainer.steps.base import StepMetrics
from trainer.steps.compiled import FlatLayout, FlatStep, compile_flat_step

__all__ = [
    "PRECOMPUTE_LIMIT_BYTES",
    "FusedStep",
    "MlpLayout",
    "fused_step_unsupported",
    "parse_mlp",
]

PRECOMPUTE_LIMIT_BYTES = 256 * 1024 * 1024
"""Largest table of precomputed standardised latents (N × L float32). Above it the frozen encoder runs
on each batch instead (same values, a few more ops per step), so memory stays bounded on huge buffers."""

_ALIGN = 16
"""Floats per alignment unit of the flat buffers (64 bytes: a cache line, and MKL's preferred alignment,
which keeps its kernel choice, and so its rounding, the same run to run)."""

_PRECOMPUTE_CHUNK = 65536
"""Rows per encoder pass while precomputing latents (bounds the temporary memory)."""

_ACTIVATIONS: dict[type[nn.Module], str] = {ELUModule: "ELU", ReLUModule: "ReLU", TanHModule: "TanH"}


@dataclass(frozen=True, slots=True)
class MlpLayout:
    """The denoiser seen as ``Linear (act Linear)* [Denormalize]``.

    ``linears``: the affine modules in order (``weight`` (Out, In), ``bias`` (Out,)); ``activations``:
    one name per hidden layer (``len(linears) - 1``); ``output_mean``/``output_std``: the final
    Denormalize's buffers (A,), or None when there is none or it is the identity."""

    linears: tuple[LinearModule | CompressedLinearModule, ...]
    activations: tuple[str, ...]
    output_mean: Tensor | None
    output_std: Tensor | None


def _flatten(module: nn.Module) -> Iterator[nn.Module]:
    # Nested Sequences are only grouping (spec §6.2: a Sequence applies its layers in order).
    if isinstance(module, SequenceModule):
        for child in module.nne_children():
            yield from _flatten(child)
    else:
        yield module


def parse_mlp(denoiser: nn.Module) -> MlpLayout | str:
    """The denoiser's layout, or a sentence saying why it is not a plain MLP the fused step runs."""
    modules = list(_flatten(denoiser))
    output_mean: Tensor | None = None
    output_std: Tensor | None = None
    final = modules[-1] if modules else None
    if isinstance(final, DenormalizeModule):
        modules.pop()
        if any(True for _ in final.parameters()):
            return "the denoiser's final Denormalize is trainable"
        mean, std = final.mean, final.std
        if not (bool(torch.all(mean == 0)) and bool(torch.all(std == 1))):
            output_mean, output_std = mean, std
    linears: list[LinearModule | CompressedLinearModule] = []
    activations: list[str] = []
    for i, module in enumerate(modules):
        if i % 2 == 0:
            if not isinstance(module, LinearModule | CompressedLinearModule):
                return f"layer {i} of the denoiser MLP is {type(module).__name__}, not a Linear"
            linears.append(module)
        else:
            name = _ACTIVATIONS.get(type(module))
            if name is None:
                kind = type(module).__name__.removesuffix("Module")
                return f"layer {i} of the denoiser MLP is {kind}; the fused step runs ELU, ReLU and TanH"
            activations.append(name)
    if not linears or len(modules) % 2 == 0:
        return "the denoiser is not Linear (activation Linear)* [Denormalize]"
    return MlpLayout(tuple(linears), tuple(activations), output_mean, output_std)


def fused_step_unsupported(model: FlowModel, optimizer: torch.optim.Optimizer) -> str | None:
    """None when :class:`FusedStep` can run this model and optimiser, else the reason (for the log)."""
    if model.placement.encoder_trained or any(p.requires_grad for p in model.encoder.parameters()):
        return "the encoder is trained (EmbedNormalizationsInWeights with Encoding MLPs)"
    layout = parse_mlp(model.denoiser)
    if isinstance(layout, str):
        return layout
    params = [p for lin in layout.linears for p in (lin.weight, lin.bias)]
    if any(p.dtype != torch.float32 for p in params):
        return "the denoiser is not float32"
    if not isinstance(optimizer, torch.optim.AdamW) or len(optimizer.param_groups) != 1:
        return "the optimiser is not a one-group AdamW"
    group = optimizer.param_groups[0]
    if {id(p) for p in group["params"]} != {id(p) for p in params} or len(group["params"]) != len(params):
        return "the optimiser does not update exactly the denoiser's Linear weights and biases"
    if group.get("maximize") or group.get("capturable") or group.get("differentiable"):
        return "the optimiser uses maximize, capturable or differentiable"
    if isinstance(group["betas"][0], Tensor) or isinstance(group["betas"][1], Tensor):
        return "the optimiser's betas are tensors"
    steps = {float(s["step"]) for s in optimizer.state.values() if "step" in s}
    if len(steps) > 1 or (optimizer.state and len(optimizer.state) != len(params)):
        return "the optimiser's state is not the same age for every parameter"
    return None


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class _Flat:
    """Contiguous float32 storage for a list of tensors: ``view(i)`` is tensor i's block."""

    def __init__(self, shapes: list[torch.Size], device: torch.device) -> None:
        self.shapes = shapes
        self.offsets: list[int] = []
        total = 0
        for shape in shapes:
            self.offsets.append(total)
            total += _aligned(math.prod(shape))
        self.size = total

    def new(self, device: torch.device) -> Tensor:
        # Zeros: the padding between blocks stays 0 through every update (0 gradient, 0 moments).
        return torch.zeros(self.size, dtype=torch.float32, device=device)

    def view(self, flat: Tensor, i: int) -> Tensor:
        n = math.prod(self.shapes[i])
        return flat[self.offsets[i] : self.offsets[i] + n].view(self.shapes[i])


def _activation_forward(name: str, exact: bool) -> Callable[[Tensor, Tensor, Tensor], object]:
    """``(h, out, scratch)``: the activation of ``h`` into ``out`` (``out`` may be ``h``).

    ELU, exact: ATen's ``elu`` (``expm1`` on the negative side), the kernel autograd runs. ELU, fast:
    ``max(h, exp(min(h, 0)) − 1)``: for h > 0 the second term is 0, for h ≤ 0 it is exp(h) − 1 ≥ h, so
    this is ELU with ``exp − 1`` for ``expm1`` (identical for h > 0, within a few ulp below 0; NaN
    propagates). Four kernels, about half the time of ATen's ``elu`` on CPUs where ``expm1`` is not
    vectorised."""
    if name == "ELU" and exact:
        return lambda h, out, scratch: torch.ops.aten.elu.out(h, 1.0, 1.0, 1.0, out=out)
    if name == "ELU":

        def elu(h: Tensor, out: Tensor, scratch: Tensor) -> None:
            torch.clamp_max(h, 0.0, out=scratch).exp_().sub_(1.0)
            torch.maximum(h, scratch, out=out)

        return elu
    if name == "ReLU":
        return lambda h, out, scratch: torch.clamp_min(h, 0.0, out=out)
    return lambda h, out, scratch: torch.tanh(h, out=out)


def _activation_backward(name: str, exact: bool) -> Callable[[Tensor, Tensor, Tensor, Tensor], object]:
    """``(grad, pre-activation h, activation a, out)``: ATen's backward kernels. ELU exact uses the
    input (``exp(h)``, as autograd does); fast uses the result (``a + 1``: no exponential)."""
    if name == "ELU" and exact:
        return lambda g, h, a, out: torch.ops.aten.elu_backward.grad_input(
            g, 1.0, 1.0, 1.0, False, h, grad_input=out
        )
    if name == "ELU":
        return lambda g, h, a, out: torch.ops.aten.elu_backward.grad_input(
            g, 1.0, 1.0, 1.0, True, a, grad_input=out
        )
    if name == "ReLU":
        return lambda g, h, a, out: torch.ops.aten.threshold_backward.grad_input(g, a, 0.0, grad_input=out)
    return lambda g, h, a, out: torch.ops.aten.tanh_backward.grad_input(g, a, grad_input=out)


class FusedStep:
    """Batch sampling + one optimisation step, fused; a drop-in for ``BatchSampler.next`` + ``train_step``.

    Build with :meth:`build`. After building, the denoiser's parameters and the AdamW state tensors are
    views into this object's flat buffers ``flat_params``, ``flat_exp_avg``, ``flat_exp_avg_sq``,
    ``flat_max_exp_avg_sq`` (``model.state_dict()`` and ``optimizer.state_dict()`` stay valid and current,
    and the torch optimiser may take over at any step); gradients live in ``flat_grads``, so ``p.grad``
    stays None.
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
        b = batch_size

        # Latents: precomputed per row when they fit, else encoded per batch (same values).
        latent_width = int(model.latent_mean.shape[0])
        action_width = int(data.x1.shape[1])
        self._obs = data.obs
        self._x1 = data.x1
        self._latents: Tensor | None = None
        if data.row_num * latent_width * 4 <= PRECOMPUTE_LIMIT_BYTES:
            self._latents = _encode_all(model, data.obs)

        # Flat parameters, gradients and AdamW moments, in the optimiser's parameter order.
        params: list[nn.Parameter] = list(optimizer.param_groups[0]["params"])
        self._params = params
        self._flat = _Flat([p.shape for p in params], device)
        self.flat_params = self._flat.new(device)
        self.flat_grads = self._flat.new(device)
        self.flat_exp_avg = self._flat.new(device)
        self.flat_exp_avg_sq = self._flat.new(device)
        self.flat_max_exp_avg_sq = self._flat.new(device)
        self._denom = self._flat.new(device)
        self.steps = torch.zeros(len(params), dtype=torch.float32, device=device)
        self._step0 = self.steps[0]  # every parameter has the same age (checked at build)
        self._step_count = 0
        # The EMA copies of the parameters, flat too, when the EMA covers exactly the parameters
        # trained here (else the model's per-tensor update runs).
        self._ema_params: list[Tensor] | None = _ema_counterparts(model, params)
        self.flat_ema: Tensor | None = None if self._ema_params is None else self._flat.new(device)
        self._ema_flat_pairs = None if self.flat_ema is None else ([self.flat_ema], [self.flat_params])
        self._adopt()
        index = {id(p): i for i, p in enumerate(params)}

        # The MLP: weights/biases and their gradient blocks, activation buffers per layer.
        self._layers: list[tuple[Tensor, Tensor, Tensor, Tensor]] = []
        for lin in layout.linears:
            wi, bi = index[id(lin.weight)], index[id(lin.bias)]
            self._layers.append(
                (
                    self._flat.view(self.flat_params, wi),
                    self._flat.view(self.flat_params, bi),
                    self._flat.view(self.flat_grads, wi),
                    self._flat.view(self.flat_grads, bi),
                )
            )
        # Transposed views, made once (they stay valid: the flat buffers are never replaced).
        self._weights_t = [layer[0].t() for layer in self._layers]
        widths = [int(lin.weight.shape[0]) for lin in layout.linears]
        in_width = int(layout.linears[0].weight.shape[1])
        if in_width != latent_width + action_width + 1 or widths[-1] != action_width:
            raise ValueError(
                f"the denoiser maps {in_width} → {widths[-1]} but [latents ‖ x ‖ t] → velocity is "
                f"{latent_width + action_width + 1} → {action_width}"
            )
        self._forward = [_activation_forward(a, exact) for a in layout.activations]
        self._backward = [_activation_backward(a, exact) for a in layout.activations]
        # One fused AdamW kernel where torch has it for this device (CPU since 2.4, CUDA): same formulas,
        # its own evaluation order (results within an ulp or so of the single-tensor path per step).
        self._fused = not exact and hasattr(torch, "_fused_adamw_") and device.type in ("cpu", "cuda")
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
        # The arithmetic after the draws as one compiled function (trainer.steps.compiled), when asked for
        # and possible: it gathers from the precomputed latents, and exact mode keeps ATen's kernels.
        self._compiled: FlatStep | None = None
        if compiled and not exact and self._latents is not None:
            flat_layout = FlatLayout(
                blocks=tuple(
                    (off, tuple(shape))
                    for off, shape in zip(self._flat.offsets, self._flat.shapes, strict=True)
                ),
                layers=tuple((index[id(lin.weight)], index[id(lin.bias)]) for lin in layout.linears),
                size=self._flat.size,
            )
            self._compiled = compile_flat_step(layout.activations, self.obs_noise_scale, flat_layout)

    @torch.no_grad()
    def _adopt(self) -> None:
        """Copy the parameters' values and the optimiser's state into the flat buffers and make both
        views of them. Runs at build time and again whenever someone replaced them (``optimizer.
        load_state_dict`` installs new state tensors; a resume may load weights), so the fused step
        always continues from what the model and the optimiser hold."""
        optimizer = self.optimizer
        amsgrad = bool(optimizer.param_groups[0]["amsgrad"])
        flat = self._flat
        # Read everything first: some of it may already be views into the buffers rewritten below (only
        # the optimiser state was replaced, say), and zeroing a buffer must not erase its own source.
        values = [p.detach().clone() for p in self._params]
        states = [
            {
                k: v.detach().clone() if isinstance(v, Tensor) else v
                for k, v in optimizer.state.get(p, {}).items()
            }
            for p in self._params
        ]
        ema_params = self._ema_params or []  # empty unless the EMA is flat (then flat_ema exists)
        ema_values = [e.detach().clone() for e in ema_params]
        self.flat_exp_avg.zero_()
        self.flat_exp_avg_sq.zero_()
        self.flat_max_exp_avg_sq.zero_()
        self.steps.zero_()
        for i, (value, state) in enumerate(zip(values, states, strict=True)):
            flat.view(self.flat_params, i).copy_(value)
            if state:
                flat.view(self.flat_exp_avg, i).copy_(state["exp_avg"])
                flat.view(self.flat_exp_avg_sq, i).copy_(state["exp_avg_sq"])
                if amsgrad and "max_exp_avg_sq" in state:
                    flat.view(self.flat_max_exp_avg_sq, i).copy_(state["max_exp_avg_sq"])
                self.steps[i] = float(state["step"])
        for i, p in enumerate(self._params):
            p.data = flat.view(self.flat_params, i)
            p.grad = None
            new_state: dict[str, Tensor] = {
                "step": self.steps[i],
                "exp_avg": flat.view(self.flat_exp_avg, i),
                "exp_avg_sq": flat.view(self.flat_exp_avg_sq, i),
            }
            if amsgrad:
                new_state["max_exp_avg_sq"] = flat.view(self.flat_max_exp_avg_sq, i)
            optimizer.state[p] = new_state
        for i, (e, value) in enumerate(zip(ema_params, ema_values, strict=True)):
            assert self.flat_ema is not None
            view = flat.view(self.flat_ema, i)
            view.copy_(value)
            e.data = view
        self._step_count = int(self.steps[0].item()) if self._params else 0
        self._owned = (self._params[0].data_ptr(), optimizer.state[self._params[0]]["exp_avg"])
        self._ema_owned = None if self._ema_params is None else self._ema_params[0].data_ptr()

    @property
    def compiling(self) -> bool:
        """Whether the step runs (or will, once compiled) through the compiled function."""
        return self._compiled is not None

    def _adopted(self) -> bool:
        """Whether the parameters and the optimiser state are still this object's views (cheap)."""
        first = self._params[0]
        state = self.optimizer.state.get(first)
        return (
            first.data_ptr() == self._owned[0]
            and state is not None
            and state.get("exp_avg") is self._owned[1]
            and (self._ema_params is None or self._ema_params[0].data_ptr() == self._ema_owned)
        )

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
    ) -> FusedStep | None:
        """The fused step for this job, or None when :func:`fused_step_unsupported` finds a reason.

        ``exact``: run the kernels autograd and torch's AdamW run (ELU with ``expm1``, its input-based
        backward, the single-tensor AdamW), so that for the engine's networks every step is bitwise the
        reference step's. False (the default, the trainer's choice): ``exp − 1`` ELU, result-based ELU
        backward and the fused AdamW kernel, equal to the reference to float rounding and faster.

        ``compiled``: run the arithmetic after the draws as one ``torch.compile``-d function
        (:mod:`trainer.steps.compiled`; ignored with ``exact``). The first step compiles; if that fails the
        step falls back to the eager kernels with one warning line.

        ``average_gradients``: called on the flat gradient buffer after the finiteness check, before
        AdamW (scale-out replaces it by the processes' average there,
        :meth:`~trainer.steps.base.GradientAveraging.average_flat`)."""
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
        )

    # ----------------------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, iteration: int = 0) -> StepMetrics:
        """Draw a batch and take one step. Same contract as :func:`trainer.steps.autograd.train_step`: raises
        :class:`Diverged` before touching the weights, the moments or the EMA when the loss or the
        gradient norm is not finite. One host sync per step (the two metrics)."""
        model = self.model
        g = self.generator
        b = self.batch_size
        if not self._adopted():
            if fused_step_unsupported(model, self.optimizer) is not None:
                raise RuntimeError("the model or optimiser changed into one the fused step cannot run")
            self._adopt()

        # 1. The draws, in the reference order (module docstring); the gathers use no random numbers.
        idx = torch.randint(self.row_num, (b,), generator=g, out=self._idx)
        x0 = torch.randn(self._x0.shape, generator=g, out=self._x0)
        if self._uniform_time:
            t = torch.rand(self._t.shape, generator=g, out=self._t)
        else:
            t = self.time_distribution.sample(b, g, self.device, torch.float32)
        noise = None
        if self._noise is not None:
            noise = torch.randn(self._noise.shape, generator=g, out=self._noise)
        metrics = self._compiled_metrics(idx, x0, t, noise) if self._compiled is not None else None
        if metrics is None:
            loss, divisor = self._eager_loss_and_grads(idx, x0, t, noise)
            # vector_norm accumulates float32 in double on CPU, as the reference's norm does: no overflow
            # of the squares for gradients that are large but finite.
            grad_norm = torch.linalg.vector_norm(self.flat_grads)
            loss_total, norm_value = torch.stack((loss, grad_norm)).tolist()
            loss_value = loss_total / divisor
        else:
            loss_value, norm_value = metrics.tolist()

        # 5. Check, average across processes (scale-out), then AdamW and the EMA.
        if not (math.isfinite(loss_value) and math.isfinite(norm_value)):
            raise Diverged(
                f"the loss became non-finite at iteration {iteration} (loss {loss_value}, gradient norm "
                f"{norm_value}); the weights of the last good iteration were kept"
            )
        if self.average_gradients is not None:
            self.average_gradients(self.flat_grads)
        self._adamw()
        model.update_ema(self._ema_flat_pairs)
        return StepMetrics(loss=loss_value, grad_norm=norm_value)

    def _compiled_metrics(self, idx: Tensor, x0: Tensor, t: Tensor, noise: Tensor | None) -> Tensor | None:
        """(mean loss, gradient norm) as float64, gradients into the flat buffer, through the compiled
        function; None (and the compiled function dropped, with one warning) when it cannot compile or
        run, so the caller runs the eager stages on the same draws."""
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
                self.flat_params,
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
            return None
        self.flat_grads.copy_(grads)
        return metrics

    def _eager_loss_and_grads(
        self, idx: Tensor, x0: Tensor, t: Tensor, noise: Tensor | None
    ) -> tuple[Tensor, int]:
        """Stages 1–4 with preallocated buffers: (sum of squared errors (0-d), element count), gradients
        into the flat buffer."""
        model = self.model
        z = self._z
        if self._latents is not None:
            torch.index_select(self._latents, 0, idx, out=z)
        else:
            obs = torch.index_select(self._obs, 0, idx)
            torch.sub(model.encoder(obs), model.latent_mean, out=z)
            z.div_(model.latent_std)
        x1 = torch.index_select(self._x1, 0, idx, out=self._x1b)
        target = torch.sub(x1, x0, out=self._target)
        xt = torch.addcmul(x0, t, target, out=self._xt)
        if noise is not None:
            z.add_(noise.mul_(self.obs_noise_scale))
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
        loss_sum = torch.dot(flat_diff, flat_diff)
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
        return loss_sum, n

    def _adamw(self) -> None:
        """AdamW (decoupled weight decay, optional amsgrad) on the flat buffers: torch's fused kernel, or
        (exact) torch's single-tensor formulas in the same order, the same arithmetic per element."""
        group = self.optimizer.param_groups[0]  # read each step: load_state_dict replaces the dict
        lr = float(group["lr"])
        beta1, beta2 = (float(b) for b in group["betas"])
        eps = float(group["eps"])
        weight_decay = float(group["weight_decay"])
        self._step_count += 1
        step = float(self._step_count)
        self.steps.add_(1.0)
        param, grad = self.flat_params, self.flat_grads
        if self._fused:
            torch._fused_adamw_(
                [param],
                [grad],
                [self.flat_exp_avg],
                [self.flat_exp_avg_sq],
                [self.flat_max_exp_avg_sq],
                [self._step0],
                lr=lr,
                beta1=beta1,
                beta2=beta2,
                weight_decay=weight_decay,
                eps=eps,
                amsgrad=bool(group["amsgrad"]),
                maximize=False,
            )
            return
        if weight_decay != 0:
            param.mul_(1 - lr * weight_decay)
        self.flat_exp_avg.lerp_(grad, 1 - beta1)
        self.flat_exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        bias_correction1 = 1 - beta1**step
        bias_correction2 = 1 - beta2**step
        step_size = lr / bias_correction1
        bias_correction2_sqrt = bias_correction2**0.5
        denom = self._denom
        if group["amsgrad"]:
            torch.maximum(self.flat_max_exp_avg_sq, self.flat_exp_avg_sq, out=self.flat_max_exp_avg_sq)
            torch.sqrt(self.flat_max_exp_avg_sq, out=denom)
        else:
            torch.sqrt(self.flat_exp_avg_sq, out=denom)
        denom.div_(bias_correction2_sqrt).add_(eps)
        param.addcdiv_(self.flat_exp_avg, denom, value=-step_size)


def _ema_counterparts(model: FlowModel, params: list[nn.Parameter]) -> list[Tensor] | None:
    """The EMA denoiser's parameter for each of ``params`` (in order), or None when the EMA is off, also
    covers the encoder, or holds parameters that are not trained here (their per-tensor update runs)."""
    if model.ema_denoiser is None or model.ema_encoder is not None:
        return None
    names = {id(p): name for name, p in model.denoiser.named_parameters()}
    ema = dict(model.ema_denoiser.named_parameters())
    if len(names) != len(params) or len(ema) != len(params) or any(id(p) not in names for p in params):
        return None
    counterparts = [ema.get(names[id(p)]) for p in params]
    if any(
        e is None or e.shape != p.shape or e.dtype != p.dtype
        for e, p in zip(counterparts, params, strict=True)
    ):
        return None
    return [e for e in counterparts if e is not None]


@torch.no_grad()
def _encode_all(model: FlowModel, obs: Tensor) -> Tensor:
    """Standardised latents (N, L) of every row, chunk by chunk (row-wise identical to encoding a batch)."""
    chunks = [
        model.encode(obs[start : start + _PRECOMPUTE_CHUNK])
        for start in range(0, obs.shape[0], _PRECOMPUTE_CHUNK)
    ]
    return torch.cat(chunks).contiguous()
