"""The denoiser seen as a plain MLP, ``Linear (act Linear)* [Denormalize]``, and the activations' kernels
the fused step (:mod:`trainer.training.steps.fused`) runs on preallocated buffers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from trainer.training.nne_torch import (
    CompressedLinearModule,
    DenormalizeModule,
    ELUModule,
    LinearModule,
    ReLUModule,
    SequenceModule,
    TanHModule,
)

__all__ = ["MlpLayout", "activation_backward", "activation_forward", "parse_mlp"]

_ACTIVATIONS: dict[type[nn.Module], str] = {ELUModule: "ELU", ReLUModule: "ReLU", TanHModule: "TanH"}
"""The activations the fused step runs, by module type: the ones the engine's MLP builder emits."""


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


def activation_forward(name: str, exact: bool) -> Callable[[Tensor, Tensor, Tensor], object]:
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


def activation_backward(name: str, exact: bool) -> Callable[[Tensor, Tensor, Tensor, Tensor], object]:
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
