"""The device a run trains on: the engine's ``Device`` setting and our ``device`` option, with the reason
and the fix when CUDA is asked for and not there.
"""

from __future__ import annotations

import torch

from trainer.errors import LaunchError, Unsupported
from trainer.system.console import log

__all__ = ["CUDA_HINT", "check_device_option", "choose_device", "no_cuda_reason"]

CUDA_HINT = (
    "for a GPU: pip install --force-reinstall torch --index-url https://download.pytorch.org/whl/cu126 "
    "(choose the cuXXX your NVIDIA driver supports)"
)
"""How to get a CUDA build of torch: in the CPU-fallback warning and in ``la-trainer doctor``."""


def choose_device(config_device: str, override: str) -> torch.device:
    """``"GPU"`` (the engine's Device, and the ``gpu`` option) uses CUDA when present and falls back to
    CPU with one warning line (spec §4.1). An explicit ``cuda`` or ``cuda:N`` option (``--device``,
    ``LA_TRAINER_DEVICE``, la-trainer.json) names one device: when it is not there the run is refused
    (:class:`LaunchError`, exit 2) instead of training, much slower, on the CPU with exit 0.

    Raises:
        LaunchError: an explicit CUDA device that this machine does not have.
    """
    wanted = (override or config_device or "GPU").strip()
    lowered = wanted.lower()
    explicit = override.strip().lower()
    if explicit == "cuda" or explicit.startswith("cuda:"):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = int(explicit.partition(":")[2] or 0)
        if index >= count:
            why = (
                f"this machine has only cuda:0 to cuda:{count - 1}"
                if count
                else f"CUDA is not available here: {no_cuda_reason()}"
            )
            raise LaunchError(
                f"the device option is {override.strip()!r}, but {why}. Use --device gpu "
                "(CUDA when present, else the CPU) or cpu, or another cuda:N (LA_TRAINER_DEVICE and "
                '"device" in la-trainer.json set it too); la-trainer doctor lists the devices.'
            )
    if lowered in ("gpu", "cuda") or lowered.startswith("cuda:"):
        if torch.cuda.is_available():
            return torch.device("cuda" if lowered in ("gpu", "cuda") else lowered)
        log(
            f"warning: Device is {wanted!r} but CUDA is not available here: {no_cuda_reason()}. "
            "Training on the CPU."
        )
        return torch.device("cpu")
    if lowered == "cpu":
        return torch.device("cpu")
    raise Unsupported(f'Device {wanted!r} is not supported: use "GPU" or "CPU" (or --device cuda:N).')


def check_device_option(override: str) -> None:
    """Refuse an explicit ``cuda`` or ``cuda:N`` device option that this machine does not have, as
    :func:`choose_device` does when a run starts. A server (``la-trainer socket``, ``shm --create``)
    calls it before it listens: otherwise it would accept a game and then refuse every session it serves.
    ``gpu``, ``cpu`` and the engine's Device are not checked (they choose at run time).

    Raises:
        LaunchError: an explicit CUDA device that this machine does not have.
    """
    explicit = override.strip().lower()
    if explicit == "cuda" or explicit.startswith("cuda:"):
        choose_device("CPU", override)  # the one refusal; the device it returns is not needed yet


def no_cuda_reason() -> str:
    """Why torch sees no CUDA device, and the fix."""
    if torch.version.cuda is None:
        # The usual cause on a new machine: pip picked a CPU-only torch (PyPI's on Windows, or a
        # CPU wheel index). Say so, and how to get a CUDA build.
        return f"this torch ({torch.__version__}) is a CPU-only build; {CUDA_HINT}"
    return f"no CUDA device is visible to torch {torch.__version__} (driver? container --gpus?)"
