"""The engine's flow-matching inference path, in numpy (spec §6.4).

For each agent the engine computes::

    e = Encoder(observation)
    x = sample of N(0, I)^ActDim                    # t = 0 is pure noise
    dt = 1 / ODEStepsNum
    for k in 0 .. N-1:  t = k·dt;  v = Denoiser([e ‖ x ‖ t]);  x = x + dt·v     # explicit Euler
    action = Decoder(x)                             # t = 1 is data

Time convention: **t = 0 noise, t = 1 data**. Every layer is evaluated with the reference evaluator
(:func:`protocol.nne.reference.evaluate`), which follows the engine's operator definitions, so a policy
scored here is scored as the game would run it. Arithmetic is float32 throughout, as in the engine.

With ``ActionChunkSize`` C > 1 the decoder's output is a chunk in the engine's leaf-major layout
(:mod:`protocol.engine.chunks`); given the action schema's :class:`~protocol.engine.chunks.ChunkLayout`,
:meth:`EnginePolicy.act_steps` reads it back into C per-step action vectors, and the bound policy the
tasks play returns those step-major. (The engine's own inference does not yet write a chunk back into
per-step actions, spec §11 item 5; the game side here plays the steps in order.)
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from protocol.engine.chunks import ChunkLayout
from protocol.nne.layers import Layer
from protocol.nne.reference import evaluate
from protocol.snapshot import read_snapshot

__all__ = ["DEFAULT_ODE_STEPS", "MAX_ODE_STEPS", "EnginePolicy", "FloatArray"]

FloatArray = npt.NDArray[np.float32]

DEFAULT_ODE_STEPS = 8
"""The engine policy's default ``ODEStepsNum`` (spec §4.3)."""
MAX_ODE_STEPS = 100
"""The engine clamps ``ODEStepsNum`` to 1..100 (spec §4.3)."""


class EnginePolicy:
    """Encoder -> ``ode_steps`` Euler steps of the denoiser from N(0, I) -> decoder.

    Shapes: observations ``(B, ObsVectorSize)``; the ODE state ``(B, ActDim)``; actions
    ``(B, decoder output)`` (= ActDim for the engine's decoders). All float32. ``chunk_layout``: where
    each step of a chunk sits in the decoder's output (None: step-major, which is the engine's layout for
    C = 1 and for a one-leaf action schema).
    """

    def __init__(
        self,
        encoder: Layer,
        denoiser: Layer,
        decoder: Layer,
        ode_steps: int = DEFAULT_ODE_STEPS,
        chunk_layout: ChunkLayout | None = None,
    ) -> None:
        if not isinstance(ode_steps, int) or not 1 <= ode_steps <= MAX_ODE_STEPS:
            raise ValueError(f"ode_steps must be an integer in 1..{MAX_ODE_STEPS}, got {ode_steps!r}")
        act_dim = decoder.input_size
        expected_in = encoder.output_size + act_dim + 1
        if denoiser.input_size != expected_in:
            raise ValueError(
                f"the denoiser reads {denoiser.input_size} floats but encoder output {encoder.output_size} "
                f"+ ActDim {act_dim} + 1 = {expected_in}"
            )
        if denoiser.output_size != act_dim:
            raise ValueError(
                f"the denoiser writes {denoiser.output_size} floats but the decoder reads {act_dim}"
            )
        if chunk_layout is not None and chunk_layout.width != decoder.output_size:
            raise ValueError(
                f"the chunk layout is {chunk_layout.width} wide but the decoder writes {decoder.output_size}"
            )
        self.encoder = encoder
        self.denoiser = denoiser
        self.decoder = decoder
        self.ode_steps = ode_steps
        self.chunk_layout = chunk_layout

    @classmethod
    def from_snapshots(
        cls,
        encoder: bytes | bytearray | memoryview,
        denoiser: bytes | bytearray | memoryview,
        decoder: bytes | bytearray | memoryview,
        ode_steps: int = DEFAULT_ODE_STEPS,
        chunk_layout: ChunkLayout | None = None,
    ) -> EnginePolicy:
        """From snapshot bytes, in constructor order (encoder, denoiser, decoder): note that this is *not*
        the network id order (0 denoiser, 1 encoder, 2 decoder)."""
        return cls(
            read_snapshot(encoder).model,
            read_snapshot(denoiser).model,
            read_snapshot(decoder).model,
            ode_steps,
            chunk_layout,
        )

    @property
    def obs_dim(self) -> int:
        """Observation vector width (encoder input)."""
        return self.encoder.input_size

    @property
    def act_dim(self) -> int:
        """Width of the ODE state x (= ActionVectorSize × ActionChunkSize)."""
        return self.decoder.input_size

    def _observations(self, obs: npt.ArrayLike) -> FloatArray:
        array = np.asarray(obs, dtype=np.float32)
        if array.ndim != 2 or array.shape[1] != self.obs_dim:
            raise ValueError(f"observations must have shape (B, {self.obs_dim}), got {array.shape}")
        return array

    def with_x0(self, obs: npt.ArrayLike, x0: npt.ArrayLike) -> FloatArray:
        """Deterministic sampling from a given start ``x0`` ``(B, ActDim)`` at t = 0."""
        observations = self._observations(obs)
        x = np.array(x0, dtype=np.float32, copy=True)
        if x.shape != (observations.shape[0], self.act_dim):
            raise ValueError(f"x0 must have shape ({observations.shape[0]}, {self.act_dim}), got {x.shape}")
        latents = evaluate(self.encoder, observations)
        dt = np.float32(1.0 / self.ode_steps)
        t_column = np.empty((observations.shape[0], 1), np.float32)
        for k in range(self.ode_steps):
            t_column.fill(np.float32(k) * dt)
            velocity = evaluate(self.denoiser, np.concatenate([latents, x, t_column], axis=1))
            x = x + dt * velocity
        return evaluate(self.decoder, x)

    def act(self, obs: npt.ArrayLike, rng: np.random.Generator) -> FloatArray:
        """Sample actions for a batch of observations; the start noise comes from ``rng``."""
        observations = self._observations(obs)
        x0 = rng.standard_normal((observations.shape[0], self.act_dim), dtype=np.float32)
        return self.with_x0(observations, x0)

    def act_steps(self, obs: npt.ArrayLike, rng: np.random.Generator) -> FloatArray:
        """:meth:`act` read back into per-step actions ``(B, C, ActionVectorSize)``, step 0 first, through
        the policy's ``chunk_layout`` (required: without it the steps cannot be told apart)."""
        if self.chunk_layout is None:
            raise ValueError("act_steps needs the policy's chunk_layout (ChunkLayout.from_schema)")
        return self.chunk_layout.to_steps(self.act(obs, rng))

    def bind(self, rng: np.random.Generator) -> Callable[[FloatArray], FloatArray]:
        """``obs -> actions`` with ``rng`` captured: the policy callable the benchmark tasks take. A chunk
        comes back step-major, ``(B, C·ActionVectorSize)`` = ``[a_0 ‖ a_1 ‖ …]``."""

        def policy(obs: FloatArray) -> FloatArray:
            if self.chunk_layout is None:
                return self.act(obs, rng)
            steps = self.act_steps(obs, rng)
            return steps.reshape(steps.shape[0], -1)

        return policy
