"""The torch training model: encoder + denoiser with their standardisations, and the export back to layers.

Construction (:meth:`FlowModel.from_networks`) does everything that happens once, in this order:

1. Observation side. ``EmbedNormalizationsInWeights = true``: observation statistics (per schema leaf
   mode, :func:`trainer.data.leaf_statistics`) are written into the encoder's leaf Denormalize layers.
   ``false`` (engine default), or when the encoder's tree cannot take them (:class:`LayoutMismatch`):
   the encoder is kept byte-identical and its outputs (latents) are standardised per dimension with
   statistics measured through it, folded into the denoiser's first Linear at export.
   ``NormalizeLatents = true`` with the encoder written: the latents are standardised as well.
2. Action side. ``Embed = true``: per-step action statistics go into the decoder's leaves, and the
   denoiser works in normalised action space, where the engine's N(0, I) start matches training.
   ``false`` (or a decoder that cannot take them): the decoder is kept byte-identical, the denoiser
   works in the decoder's input space, and its x input and velocity output are standardised per
   dimension, folded into the first Linear and the final Denormalize at export.
   Either way the flow's data points are ``x1 = decoder⁻¹(action chunk)`` through the decoder as it
   will be sent (an element-wise affine map; anything else is :class:`Unsupported`).
3. The encoder is trained only when Embed is true and it has trainable layers (Encoding MLPs);
   otherwise it is frozen (and, with Embed false, sent back as received).

During training the standardisations are applied explicitly (un-folded); :meth:`FlowModel.export`
folds them, so the three exported networks evaluated the engine's way (encoder → Euler from N(0, I)
→ decoder, spec §6.4) give the actions of :meth:`FlowModel.sample`.

Spaces: ``obs`` (B, O) raw observations; ``z`` (B, L) standardised latents; ``x`` (B, A) in the
decoder-input space; ``t`` (B, 1); velocities in decoder-input units unless "standardized".
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor, nn

from protocol.config import SessionConfig
from protocol.nne.layers import Layer
from protocol.schema import SchemaNode
from trainer.data import MIN_STD, TensorData, TrainingData, decoder_inputs, leaf_statistics
from trainer.errors import BadData
from trainer.flow import euler_integrate
from trainer.nne_torch import from_torch, to_torch
from trainer.normalization import (
    LayoutMismatch,
    fold_input_affine,
    has_auto_normalization,
    output_denormalize,
    require_elementwise_affine,
    set_output_denormalize,
    write_decoder_denormalization,
    write_encoder_normalization,
)

__all__ = ["ExportedNetworks", "FlowModel", "ModelSettings", "Placement"]

Floats = npt.NDArray[np.float32]

_LATENT_CHUNK = 65536
"""Rows per encoder pass when measuring latent statistics (bounds the temporary memory)."""


@dataclass(frozen=True, slots=True)
class ModelSettings:
    """The parts of the session config the model depends on, plus the EMA decay (not an engine setting).

    ``ema_decay``: 0 disables the exponential moving average of the weights; otherwise export and
    :meth:`FlowModel.sample` use the average (with the usual warm-up, decay_k = min(decay, (1+k)/(10+k))).
    """

    embed_normalizations: bool = False
    normalize_latents: bool = False
    chunk_size: int = 1
    ema_decay: float = 0.0

    def __post_init__(self) -> None:
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {self.chunk_size}")
        if not 0.0 <= self.ema_decay < 1.0:
            raise ValueError(f"ema_decay must be in [0, 1), got {self.ema_decay}")

    @classmethod
    def from_session(cls, config: SessionConfig, *, ema_decay: float = 0.0) -> ModelSettings:
        return cls(
            embed_normalizations=config.trainer.embed_normalizations_in_weights,
            normalize_latents=config.trainer.training.normalize_latents,
            chunk_size=config.action_chunk_size,
            ema_decay=ema_decay,
        )


@dataclass(frozen=True, slots=True)
class Placement:
    """Where the normalisation ended up (for the log): ``observations`` in the encoder leaves or folded
    into the denoiser; ``actions`` in the decoder leaves or folded into the denoiser; whether latents are
    standardised; whether the encoder is trained. ``notes``: one log line per fallback or special case."""

    observations: Literal["encoder", "denoiser"]
    actions: Literal["decoder", "denoiser"]
    latents_standardized: bool
    encoder_trained: bool
    notes: tuple[str, ...] = ()


class ExportedNetworks(NamedTuple):
    """The three networks to send back, same structure (and byte size) as received."""

    denoiser: Layer
    encoder: Layer
    decoder: Layer


def _f32(values: npt.ArrayLike) -> Floats:
    return np.ascontiguousarray(values, dtype=np.float32)


class FlowModel(nn.Module):
    """Encoder (torch), denoiser (torch) and the fixed affine maps around them.

    Build with :meth:`from_networks`. Buffers (float32, on the model's device): ``latent_mean``/
    ``latent_std`` (L,), ``x_mean``/``x_std`` (A,), ``v_mean``/``v_std`` (A,), ``decoder_scale``/
    ``decoder_shift`` (A,). Identity maps are stored as 0/1 and cost one fused op each.
    """

    latent_mean: Tensor
    latent_std: Tensor
    x_mean: Tensor
    x_std: Tensor
    v_mean: Tensor
    v_std: Tensor
    decoder_scale: Tensor
    decoder_shift: Tensor
    ema_updates: Tensor

    def __init__(
        self,
        *,
        encoder: nn.Module,
        denoiser: nn.Module,
        encoder_template: Layer,
        denoiser_template: Layer,
        decoder_layer: Layer,
        stats: Mapping[str, Floats],
        placement: Placement,
        ema_decay: float,
    ) -> None:
        """Use :meth:`from_networks`. ``encoder_template``/``denoiser_template`` are the layer values the
        torch modules were built from (training space); ``stats`` holds the eight buffers above."""
        super().__init__()
        self.encoder = encoder
        self.denoiser = denoiser
        self.placement = placement
        self._encoder_template = encoder_template
        self._denoiser_template = denoiser_template
        self._decoder_layer = decoder_layer
        for name in ("latent_mean", "latent_std", "x_mean", "x_std", "v_mean", "v_std"):
            self.register_buffer(name, torch.from_numpy(_f32(stats[name])))
        self.register_buffer("decoder_scale", torch.from_numpy(_f32(stats["decoder_scale"])))
        self.register_buffer("decoder_shift", torch.from_numpy(_f32(stats["decoder_shift"])))
        # The fold at export uses exactly the float32 values training used (as float64), so the
        # exported network and the training model differ only by float rounding.
        self._stats = {k: np.asarray(v, dtype=np.float32).astype(np.float64) for k, v in stats.items()}
        if not placement.encoder_trained:
            self.encoder.requires_grad_(False)
        self.ema_decay = float(ema_decay)
        self.register_buffer("ema_updates", torch.zeros((), dtype=torch.int64))
        self._ema_count = 0
        self.ema_encoder: nn.Module | None = None
        self.ema_denoiser: nn.Module | None = None
        if self.ema_decay > 0:
            self.ema_denoiser = copy.deepcopy(denoiser).requires_grad_(False)
            if placement.encoder_trained:
                self.ema_encoder = copy.deepcopy(encoder).requires_grad_(False)
        self._ema_pairs: tuple[list[Tensor], list[Tensor]] | None = None

    # ----------------------------------------------------------------------------------------------
    # Construction

    @classmethod
    def from_networks(
        cls,
        denoiser: Layer,
        encoder: Layer,
        decoder: Layer,
        obs_schema: SchemaNode,
        action_schema: SchemaNode,
        settings: ModelSettings,
        data: TrainingData,
        device: torch.device | str = "cpu",
    ) -> FlowModel:
        """The training model for the three received networks (ids 0, 1, 2) and the training data.

        Raises :class:`BadData` when the network widths disagree with the data or each other and
        :class:`Unsupported` when the decoder is not an element-wise affine map. See the module
        docstring for what is decided here.
        """
        _check_widths(denoiser, encoder, decoder, data, settings.chunk_size)
        notes: list[str] = []
        embed = settings.embed_normalizations

        # 1. Observations: into the encoder leaves, or (Embed false / fallback) latent standardisation.
        obs_placement: Literal["encoder", "denoiser"] = "denoiser"
        encoder_written = encoder
        if embed and not has_auto_normalization(obs_schema):
            notes.append(
                "EmbedNormalizationsInWeights is true but no observation leaf has an Auto* Normalization "
                "(spec section 10 item 5): the encoder gets no statistics"
            )
        if embed:
            try:
                stats = leaf_statistics(data.observations, obs_schema)
                encoder_written = write_encoder_normalization(encoder, obs_schema, stats.mean, stats.std)
                obs_placement = "encoder"
            except LayoutMismatch as error:
                notes.append(
                    f"observation statistics folded into the denoiser instead of the encoder: {error}"
                )
        standardize_latents = obs_placement == "denoiser" or settings.normalize_latents

        # 2. Actions: into the decoder leaves, or (Embed false / fallback) x/velocity standardisation.
        act_placement: Literal["decoder", "denoiser"] = "denoiser"
        decoder_written = decoder
        if embed and not has_auto_normalization(action_schema):
            notes.append(
                "EmbedNormalizationsInWeights is true but no action leaf has an Auto* Normalization "
                "(spec section 10 item 5): the denoiser works in the recorded action units"
            )
        if embed:
            try:
                stats = leaf_statistics(data.step_actions, action_schema)
                decoder_written = write_decoder_denormalization(
                    decoder, action_schema, settings.chunk_size, stats.mean, stats.std
                )
                act_placement = "decoder"
            except LayoutMismatch as error:
                notes.append(f"action statistics folded into the denoiser instead of the decoder: {error}")
        affine = require_elementwise_affine(decoder_written, "decoder")
        x1 = decoder_inputs(data.targets, affine.scale, affine.shift)
        width = x1.shape[1]
        if act_placement == "denoiser":
            x_mean, x_std, v_mean, v_std = _flow_statistics(x1)
        else:
            x_mean, x_std = np.zeros(width), np.ones(width)
            v_mean, v_std = np.zeros(width), np.ones(width)

        # 3. Encoder module; trained only with Embed true and trainable layers.
        encoder_module = to_torch(encoder_written).to(device)
        encoder_trained = embed and any(True for _ in encoder_module.parameters())
        latent_width = encoder_written.output_size
        if standardize_latents:
            latent_mean, latent_std = _latent_statistics(encoder_module, data.observations, device)
        else:
            latent_mean, latent_std = np.zeros(latent_width), np.ones(latent_width)

        stats_map = {
            "latent_mean": _f32(latent_mean),
            "latent_std": _f32(latent_std),
            "x_mean": _f32(x_mean),
            "x_std": _f32(x_std),
            "v_mean": _f32(v_mean),
            "v_std": _f32(v_std),
            "decoder_scale": _f32(affine.scale),
            "decoder_shift": _f32(affine.shift),
        }

        # 4. Denoiser in training space: its MLP sees standardised inputs and predicts a standardised
        # velocity; its final Denormalize is identity during training and receives the velocity
        # de-standardisation at export.
        # [INF] A received denoiser whose final Denormalize is not identity was exported by a trainer
        # that folds statistics (la-trainer with Embed false does so on every export). Its first
        # Linear then holds a fold too, so it is un-folded with the current statistics: continuing
        # training from our own export starts exactly where it stopped (same data ⇒ same statistics),
        # instead of standardising twice. The engine builds Denormalize(0, 1) (spec §6.3), so a fresh
        # network is taken as it is: its Kaiming init expects unit-scale inputs, which is what the
        # standardisation provides. The received output statistics themselves are replaced: export
        # always writes the current ones, so repeated runs never compound them.
        shift_in, scale_in = _input_affine(stats_map)
        received_out = output_denormalize(denoiser)
        denoiser_train = denoiser
        if not _is_identity(received_out.mean, received_out.std):
            if not (np.all(shift_in == 0) and np.all(scale_in == 1)):
                denoiser_train = fold_input_affine(denoiser, -shift_in / scale_in, 1.0 / scale_in)
                notes.append(
                    "the received denoiser carries output statistics (an earlier export); its first Linear "
                    "was un-folded with the current statistics to continue training from it"
                )
        denoiser_train = set_output_denormalize(denoiser_train, np.zeros(width), np.ones(width))
        denoiser_module = to_torch(denoiser_train).to(device)

        placement = Placement(
            observations=obs_placement,
            actions=act_placement,
            latents_standardized=standardize_latents,
            encoder_trained=encoder_trained,
            notes=tuple(notes),
        )
        model = cls(
            encoder=encoder_module,
            denoiser=denoiser_module,
            encoder_template=encoder_written,
            denoiser_template=denoiser_train,
            decoder_layer=decoder_written,
            stats=stats_map,
            placement=placement,
            ema_decay=settings.ema_decay,
        )
        return model.to(device)

    def tensor_data(self, data: TrainingData) -> TensorData:
        """``data`` on the model's device: raw observations and ``x1`` in the decoder-input space."""
        return TensorData.build(
            data, self._stats["decoder_scale"], self._stats["decoder_shift"], self.decoder_scale.device
        )

    # ----------------------------------------------------------------------------------------------
    # Training-time computation

    def encode(self, obs: Tensor) -> Tensor:
        """(B, O) raw observations → (B, L) standardised latents."""
        z: Tensor = self.encoder(obs)
        return (z - self.latent_mean) / self.latent_std

    def velocity_standardized(self, z: Tensor, x_t: Tensor, t: Tensor) -> Tensor:
        """The denoiser MLP's output (B, A): the velocity in standardised units (what the loss compares)."""
        return _standardized_velocity(self.denoiser, z, x_t, t, self.x_mean, self.x_std)

    def standardize_velocity(self, u: Tensor) -> Tensor:
        """A velocity in decoder-input units (B, A) → standardised units."""
        return (u - self.v_mean) / self.v_std

    def forward(self, obs: Tensor, x_t: Tensor, t: Tensor) -> Tensor:
        """The velocity (B, A) in decoder-input units at ``x_t`` (B, A), time ``t`` (B, 1)."""
        return self.velocity_standardized(self.encode(obs), x_t, t) * self.v_std + self.v_mean

    # ----------------------------------------------------------------------------------------------
    # Sampling and export

    @torch.no_grad()
    def sample(self, obs: Tensor, x0: Tensor, steps: int, *, use_ema: bool = True) -> Tensor:
        """Actions (B, A) in raw units, the way the engine computes them (spec §6.4): latents, ``steps``
        Euler steps from ``x0`` (B, A) (the caller's N(0, I) draw), then the decoder's affine map.
        Uses the EMA weights when enabled and ``use_ema``, like :meth:`export`."""
        encoder, denoiser = self._networks(use_ema)
        z = (encoder(obs) - self.latent_mean) / self.latent_std
        batch = obs.shape[0]

        def velocity(x: Tensor, t: float) -> Tensor:
            tt = torch.full((batch, 1), t, dtype=x.dtype, device=x.device)
            v = _standardized_velocity(denoiser, z, x, tt, self.x_mean, self.x_std)
            return v * self.v_std + self.v_mean

        x1 = euler_integrate(velocity, x0, steps)
        return x1 * self.decoder_scale + self.decoder_shift

    def export(self, *, use_ema: bool = True) -> ExportedNetworks:
        """The three networks with every standardisation folded in, same structure as received.

        Denoiser: first Linear folded with the latent and x standardisation, final Denormalize set to
        the velocity de-standardisation. Encoder: the written encoder, with trained weights when it is
        trained (else the exact layer value, so Embed false sends it back byte-identical). Decoder: the
        written decoder (Embed false: the received value)."""
        encoder, denoiser = self._networks(use_ema)
        layer = from_torch(denoiser, self._denoiser_template)
        shift_in, scale_in = _input_affine(self._stats)
        if not (np.all(shift_in == 0) and np.all(scale_in == 1)):
            layer = fold_input_affine(layer, shift_in, scale_in)
        out = output_denormalize(layer)
        v_mean, v_std = self._stats["v_mean"], self._stats["v_std"]
        layer = set_output_denormalize(
            layer,
            out.mean.astype(np.float64) * v_std + v_mean,
            out.std.astype(np.float64) * v_std,
        )
        encoder_layer = (
            from_torch(encoder, self._encoder_template)
            if self.placement.encoder_trained
            else self._encoder_template
        )
        return ExportedNetworks(denoiser=layer, encoder=encoder_layer, decoder=self._decoder_layer)

    def _networks(self, use_ema: bool) -> tuple[nn.Module, nn.Module]:
        if use_ema and self.ema_denoiser is not None:
            encoder = self.ema_encoder if self.ema_encoder is not None else self.encoder
            return encoder, self.ema_denoiser
        return self.encoder, self.denoiser

    # ----------------------------------------------------------------------------------------------
    # EMA

    @torch.no_grad()
    def update_ema(self, pairs: tuple[list[Tensor], list[Tensor]] | None = None) -> None:
        """One EMA step after an optimiser step (no-op when disabled); no host sync.

        ``pairs``: (EMA tensors, live tensors) to move instead of the parameters one by one; the fused
        step passes its flat buffers, of which the parameters and their EMA copies are views."""
        if self.ema_denoiser is None:
            return
        if pairs is None:
            if self._ema_pairs is None:
                live: list[Tensor] = list(self.denoiser.parameters())
                ema: list[Tensor] = list(self.ema_denoiser.parameters())
                if self.ema_encoder is not None:
                    live += list(self.encoder.parameters())
                    ema += list(self.ema_encoder.parameters())
                self._ema_pairs = (ema, live)
            pairs = self._ema_pairs
        n = self._ema_count
        decay = min(self.ema_decay, (1.0 + n) / (10.0 + n))
        torch._foreach_lerp_(pairs[0], pairs[1], 1.0 - decay)
        self._ema_count = n + 1
        self.ema_updates.add_(1)

    def trainable_parameters(self) -> Iterator[nn.Parameter]:
        """The parameters the optimiser updates (denoiser, and the encoder when it is trained)."""
        return (p for p in self.parameters() if p.requires_grad)

    def load_state_dict(
        self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
    ) -> Any:
        result = super().load_state_dict(state_dict, strict=strict, assign=assign)
        self._ema_count = int(self.ema_updates.item())
        self._ema_pairs = None
        return result


# --------------------------------------------------------------------------------------------------
# Helpers


def _standardized_velocity(
    denoiser: Callable[[Tensor], Tensor], z: Tensor, x: Tensor, t: Tensor, x_mean: Tensor, x_std: Tensor
) -> Tensor:
    # Input order [encoded obs ‖ x ‖ t] is the engine's (spec §6.3, §6.4).
    return denoiser(torch.cat((z, (x - x_mean) / x_std, t), dim=1))


def _input_affine(
    stats: Mapping[str, npt.ArrayLike],
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Shift and scale (L + A + 1,) of the denoiser input [z ‖ x ‖ t]; t is never standardised."""
    shift = np.concatenate([np.asarray(stats["latent_mean"]), np.asarray(stats["x_mean"]), [0.0]])
    scale = np.concatenate([np.asarray(stats["latent_std"]), np.asarray(stats["x_std"]), [1.0]])
    return shift.astype(np.float32).astype(np.float64), scale.astype(np.float32).astype(np.float64)


def _is_identity(mean: npt.ArrayLike, std: npt.ArrayLike) -> bool:
    return bool(np.all(np.asarray(mean) == 0) and np.all(np.asarray(std) == 1))


def _flow_statistics(
    x1: Floats,
) -> tuple[
    npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64]
]:
    """Per-dim standardisation of the denoiser's x input and velocity output in the decoder-input space.

    [INF] x: the marginal of x_t = (1 − t)·x0 + t·x1 over x0 ~ N(0, 1), t ~ U[0, 1], in closed form:
    mean μ/2, variance 1/3 + σ²/3 + μ²/12 (μ, σ of x1). Velocity u = x1 − x0: mean μ, variance σ² + 1.
    Closed forms keep the statistics deterministic (no sampling); any affine choice folds exactly, so
    this only sets the conditioning, and both variances are ≥ 1/3, so no MIN_STD guard is needed.
    """
    mu = x1.mean(axis=0, dtype=np.float64)
    var = x1.var(axis=0, dtype=np.float64)
    x_mean = mu / 2.0
    x_std = np.sqrt(1.0 / 3.0 + var / 3.0 + mu * mu / 12.0)
    return x_mean, x_std, mu, np.sqrt(var + 1.0)


@torch.no_grad()
def _latent_statistics(
    encoder: nn.Module, observations: Floats, device: torch.device | str
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Per-dim mean and std (L,) of the encoder's outputs over every training row (float64, combined
    chunk by chunk with Chan's parallel formula); std < MIN_STD → 1."""
    count = 0
    mean: Tensor | None = None
    m2: Tensor | None = None
    for start in range(0, observations.shape[0], _LATENT_CHUNK):
        obs = torch.from_numpy(observations[start : start + _LATENT_CHUNK]).to(device)
        z = encoder(obs).to(torch.float64)
        n = z.shape[0]
        chunk_mean = z.mean(dim=0)
        chunk_m2 = ((z - chunk_mean) ** 2).sum(dim=0)
        if mean is None or m2 is None:
            mean, m2 = chunk_mean, chunk_m2
        else:
            delta = chunk_mean - mean
            total = count + n
            mean = mean + delta * (n / total)
            m2 = m2 + chunk_m2 + delta * delta * (count * n / total)
        count += n
    assert mean is not None and m2 is not None  # TrainingData has at least one row
    std = torch.sqrt(m2 / count)
    std = torch.where(std < MIN_STD, torch.ones_like(std), std)
    return mean.cpu().numpy(), std.cpu().numpy()


def _check_widths(
    denoiser: Layer, encoder: Layer, decoder: Layer, data: TrainingData, chunk_size: int
) -> None:
    obs_width = data.observations.shape[1]
    act_width = data.targets.shape[1]
    problems = []
    if data.chunk_size != chunk_size:
        problems.append(f"the data was chunked by {data.chunk_size} but ActionChunkSize is {chunk_size}")
    if encoder.input_size != obs_width:
        problems.append(f"the encoder reads {encoder.input_size} values but observations have {obs_width}")
    if decoder.input_size != act_width or decoder.output_size != act_width:
        problems.append(
            f"the decoder maps {decoder.input_size} -> {decoder.output_size} values but an action chunk has "
            f"{act_width} (ActionChunkSize*ActionVectorSize)"
        )
    expected_in = encoder.output_size + act_width + 1
    if denoiser.input_size != expected_in or denoiser.output_size != act_width:
        problems.append(
            f"the denoiser maps {denoiser.input_size} -> {denoiser.output_size} values but "
            f"[latents | x | t] -> velocity needs {expected_in} -> {act_width} (spec section 6.3)"
        )
    if problems:
        raise BadData("the received networks do not fit the data: " + "; ".join(problems) + ".")
