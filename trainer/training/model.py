"""The torch training model: encoder + denoiser with their standardisations, and the export back to layers.

Construction (:meth:`FlowModel.from_networks`) does everything that happens once, in this order:

1. Observation side. Observation statistics (per schema leaf mode, :func:`trainer.training.data.leaf_statistics`)
   are written into a training copy of the encoder's leaf Denormalize layers, in both Embed modes, so
   every weight after them (the denoiser, an Encoding MLP) trains on standardised inputs. At export,
   ``EmbedNormalizationsInWeights = true`` sends them in the encoder's leaves; ``false`` (engine
   default) puts the leaves back as received and moves the statistics into the first Linear after them
   (an Encoding MLP's, or the denoiser's), exactly
   (:func:`trainer.training.normalization.move_encoder_normalization_out`). An encoder whose tree cannot take
   them (:class:`LayoutMismatch`) trains on raw observations. With Embed false, and for such an
   encoder, the latents (the encoder's output) are also standardised per dimension with statistics
   measured through it at the start, folded into the denoiser's first Linear at export (conditioning
   only, exact; it reaches the Manual and discrete columns too). With Embed true the encoder's leaves
   are what the engine applies, and nothing is added.
2. Action side. ``Embed = true``: per-step action statistics go into the decoder's leaves, and the
   denoiser works in normalised action space, where the engine's N(0, I) start matches training.
   ``false`` (or a decoder that cannot take them): the decoder is kept byte-identical, the denoiser
   works in the decoder's input space, and its x input and velocity output are standardised per
   dimension, folded into the first Linear and the final Denormalize at export.
   Either way the flow's data points are ``x1 = decoder⁻¹(action chunk)`` through the decoder as it
   will be sent (an element-wise affine map; anything else is :class:`Unsupported`), with the chunk in
   the decoder's leaf-major layout (:mod:`protocol.engine.chunks`).
3. ``NormalizeLatents = true``: the flow's source is a Gaussian fitted per dimension to ``x1`` (std σ;
   its mean drops out exactly), trained in the engine's coordinates so that the engine's N(0, I)
   start and Euler grid integrate it (:func:`trainer.training.flow.interpolate_fitted`). Our own late-time
   source spread (options ``spread_start``/``spread_gain``, :func:`trainer.training.flow.source_spread`) widens
   the source at late times on either path.
4. Every network with weights is trained with the policy: the denoiser always, the encoder whenever it
   has any (Encoding MLPs), in both Embed modes. The decoder has none (Denormalize leaves only).
5. ``ObservationNoiseScale``: the per-column noise scale of the standardised observations
   (:func:`trainer.training.data.observation_noise_std`: continuous columns only), expressed where the step adds
   it: on the standardised latents when the encoder is an element-wise map (every flat schema), else on
   the observations before the encoder.

During training the standardisations are applied explicitly (un-folded); :meth:`FlowModel.export`
folds them, so the three exported networks evaluated the engine's way (encoder → Euler from N(0, I)
→ decoder, spec §6.4) give the actions of :meth:`FlowModel.sample`.

Spaces: ``obs`` (B, O) raw observations; ``z`` (B, L) standardised latents; ``x`` (B, A) in the
decoder-input space (the engine's ODE state); ``t`` (B, 1); velocities in decoder-input units unless
"standardized".
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
from protocol.engine.chunks import ChunkLayout
from protocol.errors import ConfigError
from protocol.nne.layers import Layer
from protocol.schema import SchemaNode
from trainer.errors import BadData, Unsupported
from trainer.training.data import (
    MIN_STD,
    LeafStatistics,
    TensorData,
    TrainingData,
    decoder_inputs,
    leaf_statistics,
    observation_noise_std,
)
from trainer.training.flow import PathSample, euler_integrate, interpolate, interpolate_fitted, source_spread
from trainer.training.nne_torch import from_torch, to_torch
from trainer.training.normalization import (
    ElementwiseAffine,
    LayoutMismatch,
    elementwise_affine,
    fold_input_affine,
    has_auto_normalization,
    move_encoder_normalization_in,
    move_encoder_normalization_out,
    output_denormalize,
    require_elementwise_affine,
    set_output_denormalize,
    write_decoder_denormalization,
    write_encoder_normalization,
)
from trainer.training.standardization import Standardization, flow_statistics, latent_statistics

__all__ = ["ExportedNetworks", "FlowModel", "ModelSettings", "Placement"]

Floats = npt.NDArray[np.float32]
Doubles = npt.NDArray[np.float64]


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
    spread_start: float = 0.0
    spread_gain: float = 0.0
    """The late-time source spread of the training path (:func:`trainer.training.flow.source_spread`); gain 0: off."""

    def __post_init__(self) -> None:
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {self.chunk_size}")
        if not 0.0 <= self.ema_decay < 1.0:
            raise ValueError(f"ema_decay must be in [0, 1), got {self.ema_decay}")
        if not 0.0 <= self.spread_start < 1.0 or not self.spread_gain >= 0.0:
            raise ValueError(
                f"spread_start must be in [0, 1) and spread_gain >= 0, got {self.spread_start}, {self.spread_gain}"
            )

    @classmethod
    def from_session(
        cls,
        config: SessionConfig,
        *,
        ema_decay: float = 0.0,
        spread_start: float = 0.0,
        spread_gain: float = 0.0,
    ) -> ModelSettings:
        return cls(
            embed_normalizations=config.trainer.embed_normalizations_in_weights,
            normalize_latents=config.trainer.training.normalize_latents,
            chunk_size=config.action_chunk_size,
            ema_decay=ema_decay,
            spread_start=spread_start,
            spread_gain=spread_gain,
        )


@dataclass(frozen=True, slots=True)
class Placement:
    """Where the normalisation ended up (for the log): ``observations`` in the encoder leaves, or folded
    into the layers after them (the denoiser's first Linear, an Encoding MLP's); ``actions`` in the
    decoder leaves or folded into the denoiser; whether the flow starts from a fitted Gaussian
    (``NormalizeLatents``); whether the encoder is trained. ``notes``: one log line per fallback or
    special case."""

    observations: Literal["encoder", "denoiser"]
    actions: Literal["decoder", "denoiser"]
    fitted_source: bool
    encoder_trained: bool
    notes: tuple[str, ...] = ()


class ExportedNetworks(NamedTuple):
    """The three networks to send back, same structure (and byte size) as received."""

    denoiser: Layer
    encoder: Layer
    decoder: Layer


class FlowModel(nn.Module):
    """Encoder (torch), denoiser (torch) and the fixed affine maps around them.

    Build with :meth:`from_networks`. Buffers (float32, on the model's device): ``latent_mean``/
    ``latent_std`` (L,), ``x_mean``/``x_std`` (A,), ``v_mean``/``v_std`` (A,), ``decoder_scale``/
    ``decoder_shift`` (A,), ``source_std`` (A,) (σ of the fitted source, 1 without ``NormalizeLatents``)
    and ``noise_std`` (L, or O when :attr:`noise_on_latents` is False): the scale of one unit of
    observation noise. Identity maps are stored as 0/1 and cost one fused op each.
    """

    latent_mean: Tensor
    latent_std: Tensor
    x_mean: Tensor
    x_std: Tensor
    v_mean: Tensor
    v_std: Tensor
    decoder_scale: Tensor
    decoder_shift: Tensor
    source_std: Tensor
    noise_std: Tensor
    ema_updates: Tensor

    def __init__(
        self,
        *,
        encoder: nn.Module,
        denoiser: nn.Module,
        encoder_template: Layer,
        denoiser_template: Layer,
        decoder_layer: Layer,
        received_encoder: Layer | None,
        stats: Standardization,
        chunk_order: npt.NDArray[np.int64],
        noise_on_latents: bool,
        placement: Placement,
        ema_decay: float,
        spread: tuple[float, float] = (0.0, 0.0),
    ) -> None:
        """Use :meth:`from_networks`. ``encoder_template``/``denoiser_template`` are the layer values the
        torch modules were built from (training space); ``received_encoder``: the encoder to put the
        leaves of back at export (Embed false), None to send the training-space leaves; ``stats`` holds
        the buffers above (:class:`~trainer.training.standardization.Standardization`); ``chunk_order``: the decoder's chunk layout (``ChunkLayout.source``)."""
        super().__init__()
        self.encoder = encoder
        self.denoiser = denoiser
        self.placement = placement
        self.fitted_source = placement.fitted_source
        self.noise_on_latents = noise_on_latents
        self.spread = spread
        """(start, gain) of the late-time source spread; gain 0: the plain path."""
        self._encoder_template = encoder_template
        self._denoiser_template = denoiser_template
        self._decoder_layer = decoder_layer
        self._received_encoder = received_encoder
        self._chunk_order = np.asarray(chunk_order, dtype=np.int64)
        for name, values in stats.buffers():
            self.register_buffer(name, torch.from_numpy(values))
        # The fold at export uses exactly the float32 values training used (as float64), so the
        # exported network and the training model differ only by float rounding.
        self._stats = stats.stored()
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
        :class:`Unsupported` when the decoder is not an element-wise affine map (or the action schema
        has no chunked layout). See the module docstring for what is decided here.
        """
        _check_widths(denoiser, encoder, decoder, data, settings.chunk_size)
        notes: list[str] = []
        try:
            layout = ChunkLayout.from_schema(action_schema, settings.chunk_size)
        except ConfigError as error:
            raise Unsupported(f"ActionChunkSize {settings.chunk_size}: {error}") from None
        # 1.-2. Observations, then actions (module docstring).
        obs = _ObservationSide.build(
            encoder, denoiser, obs_schema, settings.embed_normalizations, data, notes
        )
        act = _ActionSide.build(decoder, action_schema, settings, data, layout, notes)
        # 3. NormalizeLatents: the source Gaussian fitted to x1 (per dimension; the mean drops out).
        source_std, x_mean, x_std, v_mean, v_std = _path_statistics(act, settings.normalize_latents)
        # 4. Encoder module, trained whenever it has weights; latent standardisation measured through it.
        encoder_module = to_torch(obs.encoder).to(device)
        encoder_trained = any(True for _ in encoder_module.parameters())
        if obs.standardize_latents:
            latent_mean, latent_std = latent_statistics(encoder_module, data.observations, device)
        else:
            latent_width = obs.encoder.output_size
            latent_mean, latent_std = np.zeros(latent_width), np.ones(latent_width)
        # 5. Observation noise, where the step adds it.
        noise_on_latents, noise_std = _noise_scale(obs, obs_schema, data, encoder_trained, latent_std)
        stats = Standardization(
            latent_mean=latent_mean,
            latent_std=latent_std,
            x_mean=x_mean,
            x_std=x_std,
            v_mean=v_mean,
            v_std=v_std,
            decoder_scale=act.affine.scale,
            decoder_shift=act.affine.shift,
            source_std=source_std,
            noise_std=noise_std,
        )
        # 6. Denoiser in training space.
        denoiser_train = _training_denoiser(denoiser, stats, obs, act.width, notes)
        denoiser_module = to_torch(denoiser_train).to(device)
        placement = Placement(
            observations=obs.placement,
            actions=act.placement,
            fitted_source=settings.normalize_latents,
            encoder_trained=encoder_trained,
            notes=tuple(notes),
        )
        model = cls(
            encoder=encoder_module,
            denoiser=denoiser_module,
            encoder_template=obs.encoder,
            denoiser_template=denoiser_train,
            decoder_layer=act.decoder,
            received_encoder=encoder if obs.handed_on is not None else None,
            stats=stats,
            chunk_order=layout.source,
            noise_on_latents=noise_on_latents,
            placement=placement,
            ema_decay=settings.ema_decay,
            spread=(settings.spread_start, settings.spread_gain),
        )
        return model.to(device)

    def tensor_data(self, data: TrainingData) -> TensorData:
        """``data`` on the model's device: raw observations and ``x1`` in the decoder-input space (the
        chunk in the decoder's layout)."""
        return TensorData.build(
            data,
            self._stats.decoder_scale,
            self._stats.decoder_shift,
            self.decoder_scale.device,
            order=self._chunk_order,
        )

    # ----------------------------------------------------------------------------------------------
    # Training-time computation

    def encode(self, obs: Tensor, noise: Tensor | None = None) -> Tensor:
        """(B, O) raw observations → (B, L) standardised latents. ``noise`` (from
        :meth:`observation_noise`) is added where it belongs: before the encoder, or to the latents."""
        if noise is not None and not self.noise_on_latents:
            obs = obs + noise
        z: Tensor = self.encoder(obs)
        z = (z - self.latent_mean) / self.latent_std
        if noise is not None and self.noise_on_latents:
            z = z + noise
        return z

    def observation_noise(self, batch: int, scale: float, generator: torch.Generator) -> Tensor:
        """Training-time observation noise for ``batch`` rows (``ObservationNoiseScale`` = ``scale``):
        per row a magnitude ``m ~ U[0, scale)``, per column ``m·ε·noise_std`` with ``ε ~ N(0, 1)``.

        [INF] The engine's other trainers draw a random noise magnitude per row; a uniform magnitude
        up to the setting trains on clean and on fully noisy observations alike, so the policy is
        robust without being trained only on blurred inputs. Draws: the magnitudes ``(B, 1)`` first,
        then ``ε`` ``(B, W)``, from ``generator`` (the fused step draws the same, in the same order)."""
        device, dtype = self.noise_std.device, self.noise_std.dtype
        magnitude = torch.rand((batch, 1), generator=generator, device=device, dtype=dtype) * scale
        epsilon = torch.randn(
            (batch, self.noise_std.shape[0]), generator=generator, device=device, dtype=dtype
        )
        return epsilon * magnitude * self.noise_std

    def flow_path(self, x0: Tensor, x1: Tensor, t: Tensor) -> PathSample:
        """The training pair (``x_t``, target velocity) in the engine's coordinates: the linear path from
        ``x0`` (B, A), or, with ``NormalizeLatents``, the fitted-source path
        (:func:`trainer.training.flow.interpolate_fitted`); either from the late-time widened source
        ``source_spread(t)·x0`` when :attr:`spread` is on (:func:`trainer.training.flow.source_spread`)."""
        start, gain = self.spread
        if gain > 0:
            x0 = x0 * source_spread(t, start, gain)
        if self.fitted_source:
            return interpolate_fitted(x0, x1, t, self.source_std)
        return interpolate(x0, x1, t)

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
        """Actions (B, A) in raw units and the decoder's chunk layout, the way the engine computes them
        (spec §6.4): latents, ``steps`` Euler steps from ``x0`` (B, A) (the caller's N(0, I) draw), then
        the decoder's affine map. Uses the EMA weights when enabled and ``use_ema``, like :meth:`export`."""
        encoder, denoiser = self.sampling_networks(use_ema)
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

        Encoder: the training-space encoder with its trained weights (if any); with Embed false its
        leaves are put back as received and their statistics moved into the layers after them
        (:func:`trainer.training.normalization.move_encoder_normalization_out`), so an encoder without weights
        goes back byte-identical. Denoiser: first Linear folded with the latent and x standardisation
        (and what the encoder handed on), final Denormalize set to the velocity de-standardisation.
        Decoder: the written decoder (Embed false: the received value)."""
        encoder, denoiser = self.sampling_networks(use_ema)
        encoder_layer = (
            from_torch(encoder, self._encoder_template)
            if self.placement.encoder_trained
            else self._encoder_template
        )
        handed_on = None
        if self._received_encoder is not None:
            encoder_layer, handed_on = move_encoder_normalization_out(encoder_layer, self._received_encoder)
        layer = from_torch(denoiser, self._denoiser_template)
        shift_in, scale_in = self._stats.exported_latents(handed_on).input_affine()
        if not (np.all(shift_in == 0) and np.all(scale_in == 1)):
            layer = fold_input_affine(layer, shift_in, scale_in)
        out = output_denormalize(layer)
        v_mean, v_std = self._stats.v_mean, self._stats.v_std
        layer = set_output_denormalize(
            layer,
            out.mean.astype(np.float64) * v_std + v_mean,
            out.std.astype(np.float64) * v_std,
        )
        return ExportedNetworks(denoiser=layer, encoder=encoder_layer, decoder=self._decoder_layer)

    def sampling_networks(self, use_ema: bool = True) -> tuple[nn.Module, nn.Module]:
        """(encoder, denoiser) as the game gets them: the EMA copies when enabled (the encoder's only when
        it is trained). One owner for sampling, export, the held-out measurement and the distillation
        teacher."""
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
        self.apply_ema(pairs or self.ema_pairs(), self.take_ema_weight())

    def ema_pairs(self) -> tuple[list[Tensor], list[Tensor]]:
        """(EMA tensors, live tensors) of the per-parameter update, in the same order (empty lists when
        the EMA is off)."""
        if self._ema_pairs is None:
            live: list[Tensor] = []
            ema: list[Tensor] = []
            if self.ema_denoiser is not None:
                live += list(self.denoiser.parameters())
                ema += list(self.ema_denoiser.parameters())
                if self.ema_encoder is not None:
                    live += list(self.encoder.parameters())
                    ema += list(self.ema_encoder.parameters())
            self._ema_pairs = (ema, live)
        return self._ema_pairs

    def take_ema_weight(self) -> float:
        """The host half of one EMA update: ``1 - decay`` for it, counted (the warm-up schedule: the
        ``n``-th update decays by ``min(ema_decay, (1 + n) / (10 + n))``). With :meth:`apply_ema` it is
        :meth:`update_ema`; a step replayed as a CUDA graph calls this half on the host every step and
        captures the other."""
        n = self._ema_count
        decay = min(self.ema_decay, (1.0 + n) / (10.0 + n))
        self._ema_count = n + 1
        return 1.0 - decay

    @torch.no_grad()
    def apply_ema(self, pairs: tuple[list[Tensor], list[Tensor]], weight: float | Tensor) -> None:
        """The device half of one EMA update: each EMA tensor moves toward its live one by ``weight``
        (``lerp_``) and ``ema_updates`` counts it. ``weight``: ``1 - decay`` from :meth:`take_ema_weight`,
        or that value as a 0-d float32 tensor on the device (bitwise the same update: ``lerp_`` rounds
        a number weight to float32 too), which a caller may set to 0 to skip a step on the device."""
        if isinstance(weight, Tensor):
            for ema, live in zip(pairs[0], pairs[1], strict=True):
                ema.lerp_(live, weight)
        else:
            torch._foreach_lerp_(pairs[0], pairs[1], weight)
        self.ema_updates.add_(1)

    @torch.no_grad()
    def forget_ema_updates(self, count: int) -> None:
        """Uncount ``count`` EMA updates that a step skipped on the device (weight 0): the warm-up
        schedule and ``ema_updates`` continue as if they had not been taken."""
        if count > 0:
            self._ema_count = max(0, self._ema_count - count)
            self.ema_updates.sub_(count)

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
# The steps of FlowModel.from_networks, in its order


@dataclass(frozen=True, slots=True, eq=False)
class _ObservationSide:
    """Step 1: the encoder to train (observation statistics written into a training copy of its leaves,
    both Embed modes) and what that decided."""

    encoder: Layer
    """The training-space encoder (the received one when its tree cannot take the statistics)."""
    handed_on: ElementwiseAffine | None
    """Embed false: what the export will hand on to the denoiser when it moves the statistics out."""
    placement: Literal["encoder", "denoiser"]
    earlier_export: bool
    """The received denoiser carries output statistics: an earlier export of ours (step 6 un-folds it)."""
    standardize_latents: bool
    """Latents are standardised where nothing else normalises them for the denoiser: Embed false (the
    statistics then leave the encoder at export; Manual and discrete columns get theirs here) and an
    encoder that could not take the statistics. With Embed true the encoder's leaves do it."""
    statistics: LeafStatistics

    @classmethod
    def build(
        cls,
        encoder: Layer,
        denoiser: Layer,
        obs_schema: SchemaNode,
        embed: bool,
        data: TrainingData,
        notes: list[str],
    ) -> _ObservationSide:
        # [INF] A received denoiser whose final Denormalize is not identity was exported by a trainer
        # that folds statistics (la-trainer with Embed false does so on every export): the encoder came
        # with it, so its Encoding MLPs hold the observation statistics already and are un-folded.
        received_out = output_denormalize(denoiser)
        earlier_export = not _is_identity(received_out.mean, received_out.std)
        obs_stats = leaf_statistics(data.observations, obs_schema)
        if embed and not has_auto_normalization(obs_schema):
            notes.append(
                "EmbedNormalizationsInWeights is true but no observation leaf has an Auto* Normalization "
                "(spec section 10 item 5): the encoder gets no statistics"
            )
        encoder_train = encoder
        handed_on: ElementwiseAffine | None = None
        try:
            written = write_encoder_normalization(encoder, obs_schema, obs_stats.mean, obs_stats.std)
            if embed:
                encoder_train = written
            else:
                if earlier_export:
                    written, _ = move_encoder_normalization_in(written, encoder)
                # what the export will hand on to the denoiser (and a check that it can move them out)
                _, handed_on = move_encoder_normalization_out(written, encoder)
                encoder_train = written
            obs_in_encoder = True
        except LayoutMismatch as error:
            obs_in_encoder = False
            notes.append(f"the encoder trains on raw observations (statistics not written): {error}")
        return cls(
            encoder=encoder_train,
            handed_on=handed_on,
            placement="encoder" if embed and obs_in_encoder else "denoiser",
            earlier_export=earlier_export,
            standardize_latents=not (embed and obs_in_encoder),
            statistics=obs_stats,
        )


@dataclass(frozen=True, slots=True, eq=False)
class _ActionSide:
    """Step 2: the decoder as it will be sent (Embed true: action statistics in its leaves) and the flow's
    data points ``x1 = decoder⁻¹(action chunk)`` (N, A) in the decoder's chunk layout."""

    decoder: Layer
    placement: Literal["decoder", "denoiser"]
    affine: ElementwiseAffine
    x1: Floats

    @property
    def width(self) -> int:
        return int(self.x1.shape[1])

    @classmethod
    def build(
        cls,
        decoder: Layer,
        action_schema: SchemaNode,
        settings: ModelSettings,
        data: TrainingData,
        layout: ChunkLayout,
        notes: list[str],
    ) -> _ActionSide:
        embed = settings.embed_normalizations
        placement: Literal["decoder", "denoiser"] = "denoiser"
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
                placement = "decoder"
            except LayoutMismatch as error:
                notes.append(f"action statistics folded into the denoiser instead of the decoder: {error}")
        affine = require_elementwise_affine(decoder_written, "decoder")
        x1 = decoder_inputs(data.targets[:, layout.source], affine.scale, affine.shift)
        return cls(decoder=decoder_written, placement=placement, affine=affine, x1=x1)


def _path_statistics(
    act: _ActionSide, normalize_latents: bool
) -> tuple[Doubles, Doubles, Doubles, Doubles, Doubles]:
    """Step 3: (source std, x mean, x std, velocity mean, velocity std), each (A,): the fitted source's σ
    (1 without ``NormalizeLatents``) and, when the actions live in the denoiser's space, the x/velocity
    standardisation of the path (:func:`~trainer.training.standardization.flow_statistics`)."""
    width = act.width
    if normalize_latents:
        source_std = act.x1.std(axis=0, dtype=np.float64)
        source_std = np.where(source_std < MIN_STD, 1.0, source_std)
    else:
        source_std = np.ones(width)
    if act.placement == "denoiser":
        x_mean, x_std, v_mean, v_std = flow_statistics(act.x1, source_std if normalize_latents else None)
    else:
        x_mean, x_std = np.zeros(width), np.ones(width)
        v_mean, v_std = np.zeros(width), np.ones(width)
    return source_std, x_mean, x_std, v_mean, v_std


def _noise_scale(
    obs: _ObservationSide,
    obs_schema: SchemaNode,
    data: TrainingData,
    encoder_trained: bool,
    latent_std: Doubles,
) -> tuple[bool, Doubles]:
    """Step 5: (on the latents?, the scale of one unit of noise). On the latents when the encoder is an
    element-wise map (its columns are the observation's), else on the observations themselves."""
    noise_obs = observation_noise_std(data.observations, obs_schema, obs.statistics)
    encoder_map = None if encoder_trained else elementwise_affine(obs.encoder)
    noise_on_latents = encoder_map is not None and obs.encoder.output_size == noise_obs.size
    if encoder_map is not None and noise_on_latents:
        return noise_on_latents, noise_obs * np.abs(encoder_map.scale) / latent_std
    return noise_on_latents, noise_obs


def _training_denoiser(
    denoiser: Layer, stats: Standardization, obs: _ObservationSide, width: int, notes: list[str]
) -> Layer:
    """Step 6: the denoiser in training space: its MLP sees standardised inputs and predicts a
    standardised velocity; its final Denormalize is identity during training and receives the velocity
    de-standardisation at export.

    [INF] An earlier export of ours (step 1) has its first Linear folded too, so it is un-folded with the
    current statistics: continuing training from our own export starts exactly where it stopped (same
    data => same statistics), instead of standardising twice. The engine builds Denormalize(0, 1) (spec
    §6.3), so a fresh network is taken as it is: its Kaiming init expects unit-scale inputs, which is
    what the standardisation provides. The received output statistics themselves are replaced: export
    always writes the current ones, so runs never compound them."""
    shift_in, scale_in = stats.stored().exported_latents(obs.handed_on).input_affine()
    denoiser_train = denoiser
    if obs.earlier_export and not (np.all(shift_in == 0) and np.all(scale_in == 1)):
        denoiser_train = fold_input_affine(denoiser, -shift_in / scale_in, 1.0 / scale_in)
        notes.append(
            "the received denoiser carries output statistics (an earlier export); its first Linear "
            "was un-folded with the current statistics to continue training from it"
        )
    return set_output_denormalize(denoiser_train, np.zeros(width), np.ones(width))


# --------------------------------------------------------------------------------------------------
# Helpers


def _standardized_velocity(
    denoiser: Callable[[Tensor], Tensor], z: Tensor, x: Tensor, t: Tensor, x_mean: Tensor, x_std: Tensor
) -> Tensor:
    # Input order [encoded obs ‖ x ‖ t] is the engine's (spec §6.3, §6.4).
    return denoiser(torch.cat((z, (x - x_mean) / x_std, t), dim=1))


def _is_identity(mean: npt.ArrayLike, std: npt.ArrayLike) -> bool:
    return bool(np.all(np.asarray(mean) == 0) and np.all(np.asarray(std) == 1))


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
