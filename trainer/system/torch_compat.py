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

__all__ = ["total_norm"]

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
