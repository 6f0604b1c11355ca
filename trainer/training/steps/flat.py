"""Flat parameter storage for the fused step (:mod:`trainer.training.steps.fused`), and AdamW on it.

The denoiser's weights, their gradients, the AdamW moments and the EMA copies each live in one
contiguous float32 buffer, one block per parameter (blocks 64-byte aligned, so the BLAS sees the same
alignment every run). The parameters and the optimiser's state tensors become views into these buffers,
so ``model.state_dict()`` and ``optimizer.state_dict()`` stay valid and current and the torch optimiser
may take over at any step, while AdamW is one fused kernel (or nine element-wise ops) on one tensor, the
gradient norm one reduction and the EMA update one ``lerp_``.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch
from torch import Tensor, nn

from trainer.training.model import FlowModel

__all__ = ["FlatAdamW", "FlatBlocks", "ema_counterparts"]

_ALIGN = 16
"""Floats per alignment unit of the flat buffers (64 bytes: a cache line, and MKL's preferred alignment,
which keeps its kernel choice, and so its rounding, the same run to run)."""


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class FlatBlocks:
    """Contiguous float32 storage for a list of tensors: ``view(i)`` is tensor i's block."""

    def __init__(self, shapes: list[torch.Size]) -> None:
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


class FlatAdamW:
    """The flat buffers of an AdamW optimiser's parameters (all its groups, in order), adopted from the
    parameters and the optimiser.

    ``params``, ``grads``, ``exp_avg``, ``exp_avg_sq``, ``max_exp_avg_sq``: one block per parameter of
    ``parameters`` (the optimiser's order) in each, laid out by ``blocks``; ``steps``: each parameter's
    AdamW step (the optimiser's state tensors are views into these). ``ema``: the EMA copies of the
    parameters, flat too, when the EMA covers exactly these parameters (:func:`ema_counterparts`; else
    None and the model's per-tensor update runs); ``ema_pairs`` is what ``FlowModel.update_ema`` takes.
    Gradients live in ``grads``, so ``p.grad`` stays None.

    ``fused``: AdamW with torch's fused kernel (same formulas, its own evaluation order: results within
    an ulp or so of the single-tensor path per step); False: torch's single-tensor formulas in the same
    order, the same arithmetic per element."""

    def __init__(
        self,
        model: FlowModel,
        optimizer: torch.optim.AdamW,
        parameters: list[nn.Parameter],
        device: torch.device,
        *,
        fused: bool,
    ) -> None:
        self.optimizer = optimizer
        self.parameters = parameters
        self.fused = fused
        self.blocks = FlatBlocks([p.shape for p in parameters])
        self.params = self.blocks.new(device)
        self.grads = self.blocks.new(device)
        self.exp_avg = self.blocks.new(device)
        self.exp_avg_sq = self.blocks.new(device)
        self.max_exp_avg_sq = self.blocks.new(device)
        self._denom = self.blocks.new(device)
        # Each parameter group of the optimiser is a contiguous run of ``parameters`` (make_optimizer keeps
        # the order), so of the flat buffers: the span from its first block to the next group's first.
        first = [0]
        for group in optimizer.param_groups[:-1]:
            first.append(first[-1] + len(group["params"]))
        if first[-1] + len(optimizer.param_groups[-1]["params"]) != len(parameters):
            raise ValueError("the optimiser's groups must hold exactly the given parameters, in order")
        bounds = [self.blocks.offsets[i] for i in first] + [self.blocks.size]
        self._spans = [slice(a, b) for a, b in itertools.pairwise(bounds)]
        self.steps = torch.zeros(len(parameters), dtype=torch.float32, device=device)
        self._step0 = self.steps[0]  # every parameter has the same age (checked before building)
        self._step_count = 0
        self._ema_params: list[Tensor] | None = ema_counterparts(model, parameters)
        self.ema: Tensor | None = None if self._ema_params is None else self.blocks.new(device)
        self.ema_pairs = None if self.ema is None else ([self.ema], [self.params])
        self.adopt()

    @torch.no_grad()
    def adopt(self) -> None:
        """Copy the parameters' values and the optimiser's state into the flat buffers and make both
        views of them. Runs at build time and again whenever someone replaced them (``optimizer.
        load_state_dict`` installs new state tensors; a resume may load weights), so the fused step
        always continues from what the model and the optimiser hold."""
        optimizer = self.optimizer
        amsgrad = bool(optimizer.param_groups[0]["amsgrad"])
        blocks = self.blocks
        # Read everything first: some of it may already be views into the buffers rewritten below (only
        # the optimiser state was replaced, say), and zeroing a buffer must not erase its own source.
        values = [p.detach().clone() for p in self.parameters]
        states = [
            {
                k: v.detach().clone() if isinstance(v, Tensor) else v
                for k, v in optimizer.state.get(p, {}).items()
            }
            for p in self.parameters
        ]
        ema_params = self._ema_params or []  # empty unless the EMA is flat (then ema exists)
        ema_values = [e.detach().clone() for e in ema_params]
        self.exp_avg.zero_()
        self.exp_avg_sq.zero_()
        self.max_exp_avg_sq.zero_()
        self.steps.zero_()
        for i, (value, state) in enumerate(zip(values, states, strict=True)):
            blocks.view(self.params, i).copy_(value)
            if state:
                blocks.view(self.exp_avg, i).copy_(state["exp_avg"])
                blocks.view(self.exp_avg_sq, i).copy_(state["exp_avg_sq"])
                if amsgrad and "max_exp_avg_sq" in state:
                    blocks.view(self.max_exp_avg_sq, i).copy_(state["max_exp_avg_sq"])
                self.steps[i] = float(state["step"])
        for i, p in enumerate(self.parameters):
            p.data = blocks.view(self.params, i)
            p.grad = None
            new_state: dict[str, Tensor] = {
                "step": self.steps[i],
                "exp_avg": blocks.view(self.exp_avg, i),
                "exp_avg_sq": blocks.view(self.exp_avg_sq, i),
            }
            if amsgrad:
                new_state["max_exp_avg_sq"] = blocks.view(self.max_exp_avg_sq, i)
            optimizer.state[p] = new_state
        for i, (e, value) in enumerate(zip(ema_params, ema_values, strict=True)):
            assert self.ema is not None
            view = blocks.view(self.ema, i)
            view.copy_(value)
            e.data = view
        self._step_count = int(self.steps[0].item()) if self.parameters else 0
        self._owned = (self.parameters[0].data_ptr(), optimizer.state[self.parameters[0]]["exp_avg"])
        self._ema_owned = None if self._ema_params is None else self._ema_params[0].data_ptr()

    def adopted(self) -> bool:
        """Whether the parameters and the optimiser state are still this object's views (cheap)."""
        first = self.parameters[0]
        state = self.optimizer.state.get(first)
        return (
            first.data_ptr() == self._owned[0]
            and state is not None
            and state.get("exp_avg") is self._owned[1]
            and (self._ema_params is None or self._ema_params[0].data_ptr() == self._ema_owned)
        )

    def step(self) -> None:
        """One AdamW update (decoupled weight decay, optional amsgrad) of ``params`` from ``grads``, each
        parameter group's run of the flat buffers with that group's current settings (its own ``lr``;
        :func:`trainer.training.steps.autograd.make_optimizer` groups by per-layer rate)."""
        self.count()
        self.apply()

    def count(self) -> None:
        """The host half of :meth:`step`: the step count the single-tensor formulas use (the fused kernel
        reads the device's ``steps`` instead)."""
        self._step_count += 1

    @property
    def step_count(self) -> int:
        """Updates counted on the host (:meth:`count`), skipped ones included until :meth:`recount`."""
        return self._step_count

    def recount(self, applied: int) -> None:
        """Set the host count to the updates the device applied (after steps it skipped)."""
        self._step_count = applied

    def apply(
        self,
        *,
        keep: Tensor | None = None,
        found_inf: Tensor | None = None,
        lrs: list[Tensor] | None = None,
    ) -> None:
        """The device half of :meth:`step` (what a CUDA graph captures).

        ``found_inf`` (0-d float32 on the device, fused kernel only): 1 skips the update there, and
        ``keep`` (``1 - found_inf``) is what ``steps`` advances by, so a skipped update leaves weights,
        moments and step count as they were without a host read. ``lrs``: each group's rate as a 0-d
        device tensor (updated in place by the caller; float64 on a CPU, where the kernel reads it as a
        double, so the update is bitwise the one with the group's number; float32 on CUDA, as its kernel
        reads it) instead of the group's number, which a graph would freeze."""
        if found_inf is not None and not self.fused:
            raise ValueError("skipping an update on the device needs the fused AdamW kernel")
        step = float(self._step_count)
        if keep is None:
            self.steps.add_(1.0)
        else:
            self.steps.add_(keep)
        # Read each step: load_state_dict replaces the group dicts, a schedule changes their lr.
        for i, (group, span) in enumerate(zip(self.optimizer.param_groups, self._spans, strict=True)):
            self._update(group, span, step, found_inf, None if lrs is None else lrs[i])

    def _update(
        self,
        group: dict[str, Any],
        span: slice,
        step: float,
        found_inf: Tensor | None,
        lr_tensor: Tensor | None,
    ) -> None:
        lr = float(group["lr"])
        beta1, beta2 = (float(b) for b in group["betas"])
        eps = float(group["eps"])
        weight_decay = float(group["weight_decay"])
        param, grad = self.params[span], self.grads[span]
        exp_avg, exp_avg_sq, max_exp_avg_sq = (
            self.exp_avg[span],
            self.exp_avg_sq[span],
            self.max_exp_avg_sq[span],
        )
        if self.fused:
            torch._fused_adamw_(
                [param],
                [grad],
                [exp_avg],
                [exp_avg_sq],
                [max_exp_avg_sq],
                [self._step0],
                lr=lr if lr_tensor is None else lr_tensor,
                beta1=beta1,
                beta2=beta2,
                weight_decay=weight_decay,
                eps=eps,
                amsgrad=bool(group["amsgrad"]),
                maximize=False,
                found_inf=found_inf,
            )
            return
        if lr_tensor is not None:
            raise ValueError("a device learning rate needs the fused AdamW kernel")
        if weight_decay != 0:
            param.mul_(1 - lr * weight_decay)
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        bias_correction1 = 1 - beta1**step
        bias_correction2 = 1 - beta2**step
        step_size = lr / bias_correction1
        bias_correction2_sqrt = bias_correction2**0.5
        denom = self._denom[span]
        if group["amsgrad"]:
            torch.maximum(max_exp_avg_sq, exp_avg_sq, out=max_exp_avg_sq)
            torch.sqrt(max_exp_avg_sq, out=denom)
        else:
            torch.sqrt(exp_avg_sq, out=denom)
        denom.div_(bias_correction2_sqrt).add_(eps)
        param.addcdiv_(exp_avg, denom, value=-step_size)


def ema_counterparts(model: FlowModel, params: list[nn.Parameter]) -> list[Tensor] | None:
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
