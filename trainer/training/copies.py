"""Copies of the networks the game gets, taken between steps without waiting, used on another thread.

The training loop must not wait for anything but its own steps: not for the game to take a network
(:mod:`trainer.session.sender`), not for the held-out measurement (:mod:`trainer.session.heldout`). Both
need the networks of one iteration while training goes on, so the loop takes a :class:`WeightsCopy`
(:func:`take_copy`: a device-side clone of every tensor the exported networks are made of; no host read,
so on a GPU it is queued behind the step like any kernel) and hands it to the thread that needs it. That
thread keeps a :class:`ShadowModel`, a private copy of the whole model, loads each copy into it (this is
where it waits for the device) and exports or measures the shadow as it would the model: the same
tensors through the same code, so the bytes and numbers are those of the model at that iteration.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import Tensor

from protocol.names import NetworkId
from protocol.nne.layers import Layer
from trainer.training.model import FlowModel
from trainer.training.steps.base import Phase

__all__ = ["ShadowModel", "WeightsCopy", "exported_layers", "take_copy"]


def exported_layers(model: FlowModel) -> dict[int, Layer]:
    """Networks 0 (denoiser), 1 (encoder), 2 (decoder) of ``model`` with every fold applied."""
    exported = model.export()
    return {
        int(NetworkId.DENOISER): exported.denoiser,
        int(NetworkId.ENCODER): exported.encoder,
        int(NetworkId.DECODER): exported.decoder,
    }


def _sampling_tensors(model: FlowModel) -> list[Tensor]:
    """Every tensor of the networks the game gets (:meth:`FlowModel.sampling_networks`: the EMA copies
    when on), parameters and buffers, in a fixed order."""
    encoder, denoiser = model.sampling_networks()
    return [*encoder.state_dict().values(), *denoiser.state_dict().values()]


@dataclass(frozen=True, slots=True, eq=False)
class WeightsCopy:
    """The sampling networks' tensors at ``iteration`` (device-side clones), and the training phase then
    (None before the first step). ``ready``: on CUDA, the event
    after the clones (a consumer on another thread waits on it, not on the whole device)."""

    iteration: int
    phase: Phase | None
    tensors: tuple[Tensor, ...]
    ready: torch.cuda.Event | None


@torch.no_grad()
def take_copy(model: FlowModel, iteration: int, phase: Phase | None = None) -> WeightsCopy:
    """Clone the sampling networks' tensors now, on the training thread, between steps: device copies,
    no host read (a few small kernels on a GPU; a memcpy of some hundred kilobytes on a CPU)."""
    tensors = tuple(t.detach().clone() for t in _sampling_tensors(model))
    ready = None
    if tensors and tensors[0].is_cuda:
        ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
        ready.record()
    return WeightsCopy(iteration, phase, tensors, ready)


class ShadowModel:
    """A private copy of ``model`` on ``device`` for one consumer thread: :meth:`load` a
    :class:`WeightsCopy` into it, then export or measure :attr:`model` as the live one. Build it on the
    training thread (it copies the model once); use it from one thread only."""

    def __init__(self, model: FlowModel, device: torch.device | None = None) -> None:
        shadow = copy.deepcopy(model)
        if device is not None:
            shadow = shadow.to(device)
        shadow.requires_grad_(False)
        self.model: FlowModel = shadow
        self._targets = _sampling_tensors(shadow)

    @torch.no_grad()
    def load(self, weights: WeightsCopy) -> FlowModel:
        """The shadow with ``weights``' values (waits for them on CUDA: on this thread only)."""
        if weights.ready is not None:
            weights.ready.synchronize()
        if len(weights.tensors) != len(self._targets):
            raise ValueError("the copy was taken from a model of another structure")
        for target, value in zip(self._targets, weights.tensors, strict=True):
            target.copy_(value)
        return self.model

    def export(self, weights: WeightsCopy) -> dict[int, Layer]:
        """Networks 0, 1, 2 as :func:`exported_layers` makes them from the model at that iteration."""
        return exported_layers(self.load(weights))
