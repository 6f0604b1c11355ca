"""The same-network MSE regression baseline of the quality benchmark (``docs/benchmarks.md``).

What it is: the denoiser's MLP (``HiddenLayerNum + 2`` Linear layers of width ``HiddenLayerSize`` with the
activation between them, engine KaimingUniform init from :mod:`protocol.engine.networks`) trained in
this process as a plain regressor ``observation -> action chunk`` with a mean-squared-error loss.

What it shares with the flow-matching trainer, so that the comparison isolates the objective:

* network: the same MLP body; only the input width differs (``ObsDim`` instead of
  ``EncodedObsSize + ActDim + 1``, there is no x_t and no t);
* data: the same action chunks (:func:`trainer.training.data.build_action_chunks`: every step starts a chunk, the
  episode's last action is repeated past its end) and the same per-dimension standardisation of
  observations and of per-step actions (population statistics, std < 1e-6 -> 1, ``AutoPerDimension``);
* optimisation: AdamW with amsgrad, the same learning rate, weight decay, batch size and iteration count;
  minibatches drawn uniformly with replacement; an EMA of the weights with the trainer's warm-up
  ``decay_k = min(decay, (1 + k)/(10 + k))``.

The trained network is exported as NNE layers,
``Sequence[Denormalize(obs standardise), MLP, Denormalize(action de-standardise)]``, and evaluated with the
same numpy evaluator (:func:`protocol.nne.reference.evaluate`) as the flow-matching policy, so the
wall-clock per policy call of both rows is measured on the same path.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from emulator.tasks import Demonstrations
from protocol.engine.networks import DENOISER_SEED_SALT, mlp, network_rng
from protocol.nne.layers import Denormalize, Layer, Linear, Sequence
from protocol.nne.reference import evaluate
from trainer.training.data import build_action_chunks

__all__ = ["MIN_STD", "MsePolicy", "MseResult", "MseSettings", "train_mse_policy"]

FloatArray = npt.NDArray[np.float32]

MIN_STD = 1e-6
"""A standard deviation below this is replaced by 1 (a constant feature), as in :mod:`trainer.training.data`."""

_TORCH_ACTIVATIONS: dict[str, type[nn.Module]] = {"ELU": nn.ELU, "ReLU": nn.ReLU, "TanH": nn.Tanh}


@dataclass(frozen=True, slots=True)
class MseSettings:
    """Training settings; each one mirrors the engine setting (or trainer option) of the same meaning.

    ``hidden_layer_num``/``hidden_layer_size``/``activation``: FlowMatchingSettings (the MLP has
    ``hidden_layer_num + 2`` Linear layers). ``chunk_size``: ActionChunkSize (the output is
    ``chunk_size · ActDim`` wide). ``ema_decay``: 0 disables the average. ``threads``: torch intra-op
    threads for the duration of the training (0 leaves torch's setting alone).
    """

    iterations: int = 12_000
    batch_size: int = 256
    learning_rate: float = 1e-3
    weight_decay: float = 1e-4
    hidden_layer_num: int = 1
    hidden_layer_size: int = 256
    activation: str = "ELU"
    chunk_size: int = 1
    ema_decay: float = 0.999
    seed: int = 1234
    threads: int = 1

    def __post_init__(self) -> None:
        for name in ("iterations", "batch_size", "hidden_layer_size", "chunk_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden_layer_num < 0:
            raise ValueError(f"hidden_layer_num must be >= 0, got {self.hidden_layer_num}")
        if self.activation not in _TORCH_ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {', '.join(_TORCH_ACTIVATIONS)}, got {self.activation!r}"
            )
        if not 0.0 <= self.ema_decay < 1.0:
            raise ValueError(f"ema_decay must be in [0, 1), got {self.ema_decay}")


@dataclass(frozen=True, slots=True, eq=False)
class MseResult:
    """A trained baseline: ``network`` (NNE layers, ObsDim -> chunk_size·ActDim), the wall-clock of the
    optimisation loop ``train_s`` (seconds, setup excluded), the last raw minibatch loss (standardised
    units) and the iteration count."""

    network: Layer
    train_s: float
    final_loss: float
    iterations: int


class MsePolicy:
    """The baseline as a batched policy: observations ``(B, ObsDim)`` -> actions ``(B, chunk·ActDim)``,
    float32, through the numpy reference evaluator. Deterministic (no sampling noise)."""

    def __init__(self, network: Layer) -> None:
        self.network = network

    def __call__(self, obs: npt.ArrayLike) -> FloatArray:
        return evaluate(self.network, np.asarray(obs, dtype=np.float32))


def _standardisation(
    values: npt.NDArray[np.float32],
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Per-column mean and population std (float64), std < MIN_STD -> 1."""
    v = values.astype(np.float64)
    mean = v.mean(axis=0)
    std = v.std(axis=0)
    return mean, np.where(std < MIN_STD, 1.0, std)


def _torch_mlp(body: Sequence, activation: str) -> nn.Sequential:
    """A torch copy of the NNE MLP ``body`` (Linear weights are (in, out) in NNE, (out, in) in torch)."""
    modules: list[nn.Module] = []
    for layer in body.layers:
        if isinstance(layer, Linear):
            linear = nn.Linear(layer.input_size, layer.output_size)
            with torch.no_grad():
                linear.weight.copy_(torch.from_numpy(np.ascontiguousarray(layer.weights.T)))
                linear.bias.copy_(torch.from_numpy(layer.bias))
            modules.append(linear)
        else:
            modules.append(_TORCH_ACTIVATIONS[activation]())
    return nn.Sequential(*modules)


def _export_mlp(module: nn.Sequential, template: Sequence) -> Sequence:
    """The NNE MLP with ``module``'s trained weights (activation layers taken from ``template``)."""
    layers: list[Layer] = []
    for torch_layer, nne_layer in zip(module, template.layers, strict=True):
        if isinstance(nne_layer, Linear):
            assert isinstance(torch_layer, nn.Linear)  # built pairwise by _torch_mlp
            weights = torch_layer.weight.detach().cpu().numpy().T.astype(np.float32)
            bias = torch_layer.bias.detach().cpu().numpy().astype(np.float32)
            layers.append(
                Linear(nne_layer.input_size, nne_layer.output_size, bias, np.ascontiguousarray(weights))
            )
        else:
            layers.append(nne_layer)
    return Sequence(tuple(layers))


def train_mse_policy(demos: Demonstrations, settings: MseSettings) -> MseResult:
    """Train the baseline on ``demos`` (seeded: the same demos and settings give the same network on CPU)."""
    flat = demos.flatten()
    chunks = build_action_chunks(flat.episode_starts, flat.episode_lengths, flat.actions, settings.chunk_size)
    obs = flat.observations[chunks.rows]
    # Per-step action statistics shared by every step of a chunk, as the decoder's Array(chunk) does.
    obs_mean, obs_std = _standardisation(obs)
    act_mean, act_std = _standardisation(flat.actions[chunks.rows])
    chunk_mean = np.tile(act_mean, settings.chunk_size)
    chunk_std = np.tile(act_std, settings.chunk_size)
    x = torch.from_numpy(((obs - obs_mean) / obs_std).astype(np.float32))
    y = torch.from_numpy(((chunks.actions - chunk_mean) / chunk_std).astype(np.float32))

    out_dim = int(y.shape[1])
    template = mlp(
        int(x.shape[1]),
        out_dim,
        settings.hidden_layer_size,
        settings.hidden_layer_num + 2,
        settings.activation,
        network_rng(settings.seed, DENOISER_SEED_SALT),
    )
    previous_threads = torch.get_num_threads()
    if settings.threads > 0:
        torch.set_num_threads(settings.threads)
    try:
        model = _torch_mlp(template, settings.activation)
        ema = _torch_mlp(template, settings.activation).requires_grad_(False)
        live_params: list[torch.Tensor] = list(model.parameters())
        ema_params: list[torch.Tensor] = list(ema.parameters())
        optimizer = torch.optim.AdamW(
            live_params, lr=settings.learning_rate, weight_decay=settings.weight_decay, amsgrad=True
        )
        generator = torch.Generator().manual_seed(settings.seed)
        rows = int(x.shape[0])
        loss_value = float("nan")
        started = time.perf_counter()
        for k in range(settings.iterations):
            index = torch.randint(rows, (settings.batch_size,), generator=generator)
            loss = nn.functional.mse_loss(model(x.index_select(0, index)), y.index_select(0, index))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            if settings.ema_decay > 0:
                decay = min(settings.ema_decay, (1.0 + k) / (10.0 + k))
                torch._foreach_lerp_(ema_params, live_params, 1.0 - decay)
            if k == settings.iterations - 1:
                loss_value = float(loss.detach())
        train_s = time.perf_counter() - started
        trained = ema if settings.ema_decay > 0 else model
        body = _export_mlp(trained, template)
    finally:
        torch.set_num_threads(previous_threads)

    obs_in = int(x.shape[1])
    network = Sequence(
        (
            Denormalize(obs_in, (-obs_mean / obs_std).astype(np.float32), (1.0 / obs_std).astype(np.float32)),
            body,
            Denormalize(out_dim, chunk_mean.astype(np.float32), chunk_std.astype(np.float32)),
        )
    )
    return MseResult(network=network, train_s=train_s, final_loss=loss_value, iterations=settings.iterations)
