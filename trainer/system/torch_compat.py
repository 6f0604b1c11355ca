"""The torch APIs the trainer needs that are newer than the torch an engine ships, in one place.

Unreal 5.8's PythonMLPackages installs torch 2.5.1 (Linux, Win64) and 2.1.0 (Mac) into the project's
``Intermediate/PipInstall`` environment (spec §11 item 1). Everything else the trainer calls exists in
those releases (CI runs the suite on the floor declared in ``pyproject.toml``, ``constraints-engine.txt``);
this module owns the exceptions, so a version check lives here and nowhere else.

Rule for every shim: where torch has the native function, the native function is called, so a seeded run
is bitwise what it was before the shim existed; the fallback repeats the native computation step by step,
and ``tests/trainer/test_torch_compat.py`` compares the two bitwise on a torch that has both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import cast

import torch

__all__ = ["mark_non_finite", "mark_non_finite_fallback", "register_generator", "total_norm"]

_FOREACH_DEVICE_TYPES = ("cpu", "cuda")
"""Device types with ``torch._foreach_norm`` kernels in every torch from 2.1 on."""

_NATIVE_TOTAL_NORM = cast(
    "Callable[[list[torch.Tensor]], torch.Tensor] | None", getattr(torch.nn.utils, "get_total_norm", None)
)
"""``torch.nn.utils.get_total_norm`` (added in torch 2.6), None on older releases."""


def total_norm(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The global L2 norm of ``tensors`` seen as one vector (a 0-d tensor on the first tensor's device).

    ``torch.nn.utils.get_total_norm`` where it exists (torch >= 2.6), else :func:`total_norm_fallback`,
    the same computation written out.
    """
    if _NATIVE_TOTAL_NORM is not None:
        return _NATIVE_TOTAL_NORM(list(tensors))
    return total_norm_fallback(tensors)


@torch.no_grad()
def total_norm_fallback(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """What ``get_total_norm(tensors, 2.0)`` computes, and what ``clip_grad_norm_`` computes before it
    clips in torch 2.1-2.5: one float norm per tensor (``_foreach_norm`` per (device, dtype) group where
    the device has the kernel), then the norm of the stacked per-tensor norms.

    Not a float64 sum of squares: rounded to float32 that differs from ``get_total_norm`` in the last bit
    in about a third of random cases, and the norm is logged and checked, so seeded runs would differ.
    """
    tensors = list(tensors)
    if not tensors:
        return torch.tensor(0.0)
    first_device = tensors[0].device
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for tensor in tensors:
        groups.setdefault((tensor.device, tensor.dtype), []).append(tensor)
    norms: list[torch.Tensor] = []
    for (device, _), group in groups.items():
        if device.type in _FOREACH_DEVICE_TYPES and all(type(t) is torch.Tensor for t in group):
            norms.extend(torch._foreach_norm(group, 2.0))
        else:
            norms.extend(torch.linalg.vector_norm(t, 2.0) for t in group)
    result: torch.Tensor = torch.linalg.vector_norm(torch.stack([n.to(first_device) for n in norms]), 2.0)
    return result


_NON_FINITE_CHECK: dict[str, bool] = {}
"""Per device type: whether torch's ``_amp_foreach_non_finite_check_and_unscale_`` runs there (CUDA in
every torch; the CPU from torch 2.3 on). Filled at the first call on that device type."""

_ONES: dict[torch.device, torch.Tensor] = {}
"""The scale 1 of that check, one per device (made at the first, eager, call: a CUDA graph that captures
the check then reads this tensor instead of allocating one)."""


@torch.no_grad()
def mark_non_finite(tensors: Sequence[torch.Tensor], found_inf: torch.Tensor) -> None:
    """Set ``found_inf`` (a 0-d float32 tensor on the tensors' device) to 1 when any element of
    ``tensors`` is NaN or infinite; leave it as it was otherwise (so it stays 1 once set). No host read.

    torch's ``_amp_foreach_non_finite_check_and_unscale_`` with a scale of exactly 1 where it exists (one
    kernel per tensor; the values are multiplied by 1, which changes no bit), else the same test written
    with ``isfinite`` (a few kernels more)."""
    tensors = list(tensors)
    device_type = found_inf.device.type
    if _NON_FINITE_CHECK.get(device_type, True):
        try:
            one = _ONES.get(found_inf.device)
            if one is None:
                one = _ONES[found_inf.device] = torch.ones((), dtype=torch.float32, device=found_inf.device)
            torch._amp_foreach_non_finite_check_and_unscale_(tensors, found_inf, one)
            _NON_FINITE_CHECK[device_type] = True
            return
        except (NotImplementedError, RuntimeError):
            if device_type in _NON_FINITE_CHECK:
                raise  # it ran here before: this is a real failure, not a missing kernel
            _NON_FINITE_CHECK[device_type] = False
    mark_non_finite_fallback(tensors, found_inf)


@torch.no_grad()
def mark_non_finite_fallback(tensors: Sequence[torch.Tensor], found_inf: torch.Tensor) -> None:
    """What :func:`mark_non_finite` does on a torch without the CPU kernel (the engine's Mac torch, 2.1)."""
    for tensor in tensors:
        torch.maximum(found_inf, torch.isfinite(tensor).all().logical_not(), out=found_inf)


def register_generator(graph: object, generator: torch.Generator) -> str | None:
    """Register ``generator`` with a CUDA graph before its capture, so that every replay draws the next
    numbers of its stream; None on success, else why it cannot be done here.

    ``CUDAGraph.register_generator_state`` (torch >= 2.5 for generators other than the default one);
    a torch without it captures only the default generator's draws correctly, so the caller refuses to
    capture a step that draws from its own."""
    register = getattr(graph, "register_generator_state", None)
    if register is None:
        return f"torch {torch.__version__} cannot register a generator with a CUDA graph"
    register(generator)
    return None
