"""The fused step's arithmetic as one ``torch.compile``-d function: fewer kernels, less Python per step.

:class:`trainer.training.steps.fused.FusedStep` already removed autograd and the optimiser's per-tensor loop; what
is left on a CPU for the engine's default network (41 → 128 → 128 → 8, batch 256) is about forty
element-wise kernels and their Python calls around five small matmuls. Inductor fuses the element-wise
work (gathers, the flow sample, normalisation, activations and their backward, the loss) into a few
generated C++ loops and calls the BLAS for the matmuls, so one step costs the matmuls plus a little.

What stays outside, on purpose:

* **The random draws** (batch rows, ``x0``, ``t``, observation noise): drawn eagerly from the job's
  generator in the reference order, so a seed draws the same numbers with and without compilation.
* **The finiteness check**: on the two metrics the function returns (the mean loss and the gradient
  norm, its squares summed in float64 as the eager step's ``vector_norm`` does on a CPU, so a large but
  finite gradient is not mistaken for a divergence).
* **AdamW and the EMA**: torch's fused AdamW kernel and ``_foreach_lerp_`` are already one kernel each
  (inductor's own AdamW loop measured slower here).

The compiled function (:func:`make_flat_step`) takes the flat parameter buffer and returns the flat
gradient and both metrics: one tensor in and two out instead of lists, so the per-call guards and the
wrapper stay small. Measured (``la-trainer bench``, ``benchmarks/results/bench.txt``): 0.93× / 1.06× /
0.97× of the eager fused step for the default / wide / chunk8 networks, within this VM's noise.

The function is specialised to one network layout, batch size and dtype (``dynamic=False``): nothing
changes shape during a run, so it compiles once. Compiling needs a C++ compiler (CPU) or Triton (CUDA)
and takes seconds to tens of seconds (6–25 s here), so it is an option (``compile``, off by default:
see :func:`compile_wanted` for what it measured); any failure to compile falls back to the eager fused
step with one warning line (same draws, same objective, float rounding apart).
"""

from __future__ import annotations

import importlib.util
import math
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn import functional

__all__ = [
    "FlatLayout",
    "FlatStep",
    "LossAndGrads",
    "compile_flat_step",
    "compile_unavailable",
    "compile_wanted",
    "make_flat_step",
    "make_loss_and_grads",
]

LossAndGrads = Callable[..., tuple[Tensor, list[Tensor], list[Tensor]]]
"""``(latents, x1_all, idx, x0, t, noise, weights, biases, x_mean, x_std, v_mean, v_std, out_mean,
out_std) → (loss (0-d), weight gradients, bias gradients)`` in layer order."""


def compile_unavailable(device: torch.device) -> str | None:
    """Why ``torch.compile`` cannot run here, or None. Checked before trying, so that the common case
    (no compiler on a game machine) costs one log line and no failed compilation."""
    if not hasattr(torch, "compile"):
        return "this torch has no torch.compile"
    if device.type == "cpu":
        if not any(shutil.which(name) for name in ("g++", "c++", "clang++")):
            return "no C++ compiler (g++, c++ or clang++) on PATH for inductor's CPU code"
        return None
    if device.type == "cuda":
        if importlib.util.find_spec("triton") is None:
            return "Triton is not installed (inductor's GPU code needs it)"
        return None
    return f"torch.compile is not used on device type {device.type!r}"


def compile_wanted(setting: str, device: torch.device) -> tuple[bool, str]:
    """(compile?, why) for the ``compile`` option, ``"on"`` or ``"off"``.

    Off by default: on this project's 2-core CPU machine the compiled step measured within noise of the
    eager fused step (``la-trainer bench``, row "ours, torch.compile-d": 0.93× to 1.06×): what remains of a
    default step there is the eight small matmuls and per-call overhead, not the element-wise kernels
    compilation fuses. It is kept as an option for machines where kernel launches dominate (CUDA), where
    the bench reports it too."""
    mode = setting.strip().lower()
    if mode not in ("on", "off"):
        raise ValueError(f"must be 'on' or 'off', got {setting!r}")
    if mode == "off":
        return False, "compile is off"
    reason = compile_unavailable(device)
    if reason is not None:
        return False, reason
    return True, "compile=on"


def _activation(name: str, h: Tensor) -> Tensor:
    if name == "ELU":
        return functional.elu(h)
    if name == "ReLU":
        return torch.clamp_min(h, 0.0)
    return torch.tanh(h)


def _activation_backward(name: str, grad: Tensor, a: Tensor) -> Tensor:
    """dL/dh from dL/da and the activation's result ``a`` (ATen's result-based backward formulas:
    ELU ``a > 0 ? g : g·(a + 1)``, ReLU ``a > 0 ? g : 0``, tanh ``g·(1 − a²)``)."""
    if name == "ELU":
        return torch.where(a > 0, grad, grad * (a + 1.0))
    if name == "ReLU":
        return torch.where(a > 0, grad, torch.zeros_like(grad))
    return grad * (1.0 - a * a)


def make_loss_and_grads(activations: Sequence[str]) -> LossAndGrads:
    """The step's arithmetic, un-compiled: the same formulas as :meth:`FusedStep.step` stages 1–4 after
    the draws, as a pure function (no ``out=``, no in-place: inductor plans the buffers). ``noise``: the
    observation noise on the latents, already scaled (:meth:`FlowModel.observation_noise`); the linear
    path only (the fused step does not compile the fitted-source path of ``NormalizeLatents``)."""
    names = tuple(activations)

    def loss_and_grads(
        latents: Tensor,
        x1_all: Tensor,
        idx: Tensor,
        x0: Tensor,
        t: Tensor,
        noise: Tensor | None,
        weights: list[Tensor],
        biases: list[Tensor],
        x_mean: Tensor,
        x_std: Tensor,
        v_mean: Tensor,
        v_std: Tensor,
        out_mean: Tensor | None,
        out_std: Tensor | None,
    ) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        z = torch.index_select(latents, 0, idx)
        if noise is not None:
            z = z + noise
        x1 = torch.index_select(x1_all, 0, idx)
        target = x1 - x0
        xt = x0 + t * target
        inputs = [torch.cat((z, (xt - x_mean) / x_std, t), 1)]
        pre: list[Tensor] = []
        last = len(weights) - 1
        for k in range(last + 1):
            h = torch.addmm(biases[k], inputs[k], weights[k].t())
            pre.append(h)
            if k < last:
                inputs.append(_activation(names[k], h))
        pred = pre[last]
        if out_mean is not None and out_std is not None:
            pred = out_mean + pred * out_std
        diff = pred - (target - v_mean) / v_std
        n = diff.numel()
        loss = (diff * diff).sum() / n
        grad = diff * (2.0 / n)
        if out_std is not None:
            grad = grad * out_std
        grad_w: list[Tensor] = [grad] * (last + 1)
        grad_b: list[Tensor] = [grad] * (last + 1)
        for k in range(last, -1, -1):
            grad_w[k] = torch.mm(grad.t(), inputs[k])
            grad_b[k] = grad.sum(0)
            if k > 0:
                grad = _activation_backward(names[k - 1], torch.mm(grad, weights[k]), inputs[k])
        return loss, grad_w, grad_b

    return loss_and_grads


@dataclass(frozen=True, slots=True)
class FlatLayout:
    """Where each parameter lives in the fused step's flat buffer (:class:`trainer.training.steps.flat.FlatBlocks`).

    ``blocks``: (offset, shape) per parameter, in the optimiser's order; ``layers``: (weight block,
    bias block) per Linear, in network order; ``size``: the buffer's length (blocks are padded for
    alignment; the padding's gradient is 0)."""

    blocks: tuple[tuple[int, tuple[int, ...]], ...]
    layers: tuple[tuple[int, int], ...]
    size: int

    def __post_init__(self) -> None:
        at = 0
        for offset, shape in sorted(self.blocks):
            if offset < at:
                raise ValueError(
                    f"flat layout blocks overlap at offset {offset} (previous block ends at {at})"
                )
            at = offset + math.prod(shape)
        if at > self.size:
            raise ValueError(f"flat layout blocks end at {at}, past the buffer's size {self.size}")


FlatStep = Callable[..., tuple[Tensor, Tensor]]
"""``(latents, x1_all, idx, x0, t, noise, flat_params, x_mean, x_std, v_mean, v_std, out_mean, out_std)
→ (metrics, flat_grads)``: ``metrics`` float64 (mean loss, gradient norm), ``flat_grads`` laid out as
``flat_params``."""


def make_flat_step(activations: Sequence[str], layout: FlatLayout) -> FlatStep:
    """:func:`make_loss_and_grads` on the flat parameter buffer, returning the flat gradient and both
    metrics. One tensor in and two out (instead of lists) keeps the compiled call's guards and wrapper
    small, and the norm joins the compiled kernels: the squares are summed in float64, as the eager
    step's ``vector_norm`` accumulates them on a CPU, so a large but finite gradient cannot overflow
    into a false divergence."""
    loss_and_grads = make_loss_and_grads(activations)
    blocks, layers, size = layout.blocks, layout.layers, layout.size
    ends = [offset + math.prod(shape) for offset, shape in blocks]
    # Assembled in memory order: each block's gradient, then zeros up to the next block (or the end).
    by_offset = sorted(range(len(blocks)), key=lambda i: blocks[i][0])
    starts = [blocks[i][0] for i in by_offset[1:]] + [size]
    zeros_before = blocks[by_offset[0]][0] if blocks else size

    def flat_step(
        latents: Tensor,
        x1_all: Tensor,
        idx: Tensor,
        x0: Tensor,
        t: Tensor,
        noise: Tensor | None,
        flat_params: Tensor,
        *statistics: Tensor | None,
    ) -> tuple[Tensor, Tensor]:
        # statistics: x_mean, x_std, v_mean, v_std, out_mean, out_std, as make_loss_and_grads takes them.
        params = [
            flat_params[offset:end].view(shape) for (offset, shape), end in zip(blocks, ends, strict=True)
        ]
        weights = [params[w] for w, _ in layers]
        biases = [params[b] for _, b in layers]
        loss, grad_w, grad_b = loss_and_grads(
            latents, x1_all, idx, x0, t, noise, weights, biases, *statistics
        )
        grads: list[Tensor] = [flat_params] * len(blocks)
        for k, (w, b) in enumerate(layers):
            grads[w], grads[b] = grad_w[k], grad_b[k]
        pieces: list[Tensor] = [flat_params.new_zeros(zeros_before)] if zeros_before else []
        for i, stop in zip(by_offset, starts, strict=True):
            pieces.append(grads[i].reshape(-1))
            if stop > ends[i]:
                pieces.append(flat_params.new_zeros(stop - ends[i]))
        flat_grads = torch.cat(pieces)
        norm = flat_grads.double().square().sum().sqrt()
        return torch.stack((loss.double(), norm)), flat_grads

    return flat_step


def compile_flat_step(activations: Sequence[str], layout: FlatLayout) -> FlatStep:
    """:func:`make_flat_step`, compiled (lazily: the first call compiles)."""
    function = make_flat_step(activations, layout)
    return torch.compile(function, dynamic=False, fullgraph=True)
