"""Training data: tensor shapes and dim names, action chunks, normalisation statistics, batches.

Dim names used across the trainer (and in every docstring):

====  ==========================================================================================
B     batch size (``BatchSize``, spec §4.1)
N     training rows: one per step of every episode (each starts one action chunk)
S     replay-buffer steps (rows of the replay arrays, including steps outside any episode)
O     observation vector width (the observation schema's VectorSize)
L     latent width: the encoder's output (the observation schema's EncodedSize)
Av    per-step action width (ActionVectorSize, the replay buffer's action columns, spec §4.2)
C     ActionChunkSize (spec §4.3)
A     denoiser action width, ``A = C·Av`` (spec §5.4, §6.3). :class:`TrainingData` keeps a chunk
      step-major, ``[a_t ‖ a_t+1 ‖ …]``, as the replay buffer gives it; the flow's data points ``x1``
      (:class:`TensorData`) are in the decoder's layout, leaf-major (:mod:`protocol.engine.chunks`)
====  ==========================================================================================

The boundary from the protocol's replay buffer to training data is :meth:`TrainingData.from_replay`,
the one place where the recording is checked (episodes, finiteness); :meth:`TensorData.build` moves the
result to the training device, and a :class:`Batch` is what one optimisation step consumes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor

from protocol.replay import ReplayBuffer, check_finite, validate_episodes
from protocol.schema import SchemaNode, leaves
from trainer.errors import BadData

__all__ = [
    "AUTO_NORMALIZATIONS",
    "MIN_STD",
    "ActionChunks",
    "Batch",
    "LeafStatistics",
    "TensorData",
    "TrainingData",
    "build_action_chunks",
    "decoder_inputs",
    "leaf_statistics",
    "observation_noise_std",
]

Floats = npt.NDArray[np.float32]
Doubles = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]

MIN_STD = 1e-6
"""A standard deviation below this is replaced by 1: the feature is constant in the data, and dividing
by ~0 would turn float noise into huge inputs (design.md "Normalisation placement")."""

AUTO_NORMALIZATIONS = ("AutoShared", "AutoPerDimension", "AutoDimensionAverage")
"""The Continuous Normalization modes that take statistics from the data (spec §4.4); "Manual" does not."""


# --------------------------------------------------------------------------------------------------
# Action chunks (spec §5.4 [INF])


class ActionChunks(NamedTuple):
    """``rows`` (N,): the replay step each chunk starts at (= the observation row it is conditioned on);
    ``actions`` (N, A): the chunk, ``C`` consecutive per-step actions, step-major."""

    rows: Ints
    actions: Floats


def build_action_chunks(
    starts: npt.ArrayLike, lengths: npt.ArrayLike, actions: Floats, chunk_size: int
) -> ActionChunks:
    """Every step of every episode starts a chunk of ``chunk_size`` consecutive actions of that episode.

    ``starts``/``lengths`` are ``(E,)`` episode starts and lengths into the ``(S, Av)`` ``actions``,
    already checked (:func:`protocol.replay.validate_episodes`, which :meth:`TrainingData.from_replay`
    runs).

    [INF] The engine does not say how a chunk is padded past the episode end (spec §5.4, Unknowns 6).
    We repeat the episode's LAST action: the engine's policy keeps acting after the demonstration ends,
    a repeated final action is what "hold the last command" means, and it never mixes two episodes
    (the next rows of the buffer belong to another recording). Episodes shorter than ``C`` are padded
    the same way. Steps outside every episode are ignored; zero-length episodes contribute nothing.
    """
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    starts64 = np.asarray(starts, dtype=np.int64).reshape(-1)
    lengths64 = np.asarray(lengths, dtype=np.int64).reshape(-1)
    width = actions.shape[1]
    n = int(lengths64.sum())
    episode = np.repeat(np.arange(starts64.size), lengths64)  # (N,) episode of each row
    first = np.cumsum(lengths64) - lengths64  # (E,) first output row of each episode
    position = np.arange(n, dtype=np.int64) - first[episode]  # (N,) step within the episode
    row_start = starts64[episode]
    rows = row_start + position
    last = (lengths64[episode] - 1)[:, None]
    steps = row_start[:, None] + np.minimum(position[:, None] + np.arange(chunk_size), last)  # (N, C)
    chunks = actions[steps].reshape(n, chunk_size * width).astype(np.float32, copy=False)
    return ActionChunks(rows=rows, actions=chunks)


@dataclass(frozen=True, slots=True, eq=False)
class TrainingData:
    """The training set in replay units, built once: ``observations`` (N, O) float32 and ``targets``
    (N, A) float32, the raw action chunks the decoder should output. ``action_width`` is Av."""

    observations: Floats
    targets: Floats
    chunk_size: int
    action_width: int

    def __post_init__(self) -> None:
        if self.observations.ndim != 2 or self.targets.ndim != 2:
            raise ValueError("observations and targets must be 2-D")
        if self.observations.shape[0] != self.targets.shape[0]:
            raise ValueError(
                f"observations have {self.observations.shape[0]} rows but targets {self.targets.shape[0]}"
            )
        if self.targets.shape[1] != self.chunk_size * self.action_width:
            raise ValueError(
                f"targets have {self.targets.shape[1]} columns, expected C*Av = "
                f"{self.chunk_size}*{self.action_width}"
            )

    @property
    def row_num(self) -> int:
        """N."""
        return int(self.observations.shape[0])

    @property
    def step_actions(self) -> Floats:
        """(N, Av): the action of each row's own step, i.e. the first step of every chunk (a view).
        Action statistics come from these, so the padding repeats do not weight episode ends."""
        return self.targets[:, : self.action_width]

    @classmethod
    def from_replay(
        cls, replay: ReplayBuffer, chunk_size: int, episodes: npt.ArrayLike | None = None
    ) -> TrainingData:
        """The boundary from the engine's recording to training data, and the one place it is checked:
        episode starts and lengths (:func:`protocol.replay.validate_episodes`), then every float stream
        finite (:func:`protocol.replay.check_finite`, rows outside any episode included: a recording
        holding NaN or Inf is broken, whichever rows training would read). Flow matching trains on
        observation and action stream 0.

        ``episodes``: indices into the episode arrays to take (the held-out split, :mod:`trainer.training.heldout`);
        None: every episode. The whole buffer is checked either way.

        Raises :class:`ReplayError` for inconsistent episodes, and :class:`BadData` (exit code
        BAD_DATA) when a float holds NaN/Inf or no episode has a step.
        """
        validate_episodes(replay.episode_starts, replay.episode_lengths, replay.step_num)
        problems = check_finite(replay)
        if problems:
            raise BadData("the replay buffer holds non-finite values: " + "; ".join(problems))
        observations, actions = replay.observations[0], replay.actions[0]
        starts, lengths = replay.episode_starts, replay.episode_lengths
        if episodes is not None:
            chosen = np.asarray(episodes, dtype=np.int64).reshape(-1)
            starts, lengths = starts[chosen], lengths[chosen]
        chunks = build_action_chunks(starts, lengths, actions, chunk_size)
        if chunks.rows.size == 0:
            raise BadData("the replay buffer has no episode with at least one step: nothing to train on.")
        obs = np.ascontiguousarray(observations[chunks.rows], dtype=np.float32)
        return cls(obs, chunks.actions, chunk_size, int(actions.shape[1]))

    @classmethod
    def from_arrays(
        cls,
        starts: npt.ArrayLike,
        lengths: npt.ArrayLike,
        observations: Floats,
        actions: Floats,
        chunk_size: int,
    ) -> TrainingData:
        """:meth:`from_replay` on a one-stream replay buffer of these arrays: episode starts/lengths (E,),
        ``(S, O)`` observations and ``(S, Av)`` actions, float32 (for tools and tests that hold arrays)."""
        replay = ReplayBuffer(
            replay_buffer_id=0,
            episode_starts=np.asarray(starts, dtype=np.int32).reshape(-1),
            episode_lengths=np.asarray(lengths, dtype=np.int32).reshape(-1),
            observations=(observations,),
            actions=(actions,),
        )
        return cls.from_replay(replay, chunk_size)


# --------------------------------------------------------------------------------------------------
# Normalisation statistics (design.md "Normalisation placement")


class LeafStatistics(NamedTuple):
    """Per-column ``mean`` and ``std`` (D,) float64; identity columns hold 0 and 1."""

    mean: Doubles
    std: Doubles


def leaf_statistics(values: npt.NDArray[np.floating], schema: SchemaNode) -> LeafStatistics:
    """Statistics of ``values`` (N, D) following each schema leaf's Normalization mode.

    * Continuous ``Manual`` (and unknown mode strings, [INF]: §10 did not verify the option names, and
      "no statistics" is the choice that can never make an input worse): identity (0, 1).
    * ``AutoShared``: one mean and one std over all the leaf's values.
    * ``AutoPerDimension``: mean and std per dimension.
    * ``AutoDimensionAverage``: mean per dimension; std = the per-dimension stds averaged over the leaf.
    * Discrete, masks and every other leaf type: identity (one-hot values are already in [0, 1]).
    * std < :data:`MIN_STD` → 1 (constant feature).

    Leaves of repeated Array/Set elements are pooled (same ``Leaf.template_path``): the engine builds ONE
    sub-layer for all elements (spec §6.3), so they must share one set of statistics.
    Population statistics (ddof 0), accumulated in float64 with a two-pass variance.
    """
    if values.ndim != 2 or values.shape[1] != schema.vector_size:
        raise BadData(
            f"the data has shape {values.shape} but the {schema.role} schema's VectorSize is "
            f"{schema.vector_size}"
        )
    width = schema.vector_size
    mean = np.zeros(width, dtype=np.float64)
    std = np.ones(width, dtype=np.float64)
    groups: dict[str, list[tuple[int, int]]] = {}
    modes: dict[str, str] = {}
    for leaf in leaves(schema):
        mode = leaf.node.normalization if leaf.node.type == "Continuous" else None
        if mode not in AUTO_NORMALIZATIONS:
            continue
        groups.setdefault(leaf.template_path, []).append((leaf.offset, leaf.size))
        modes[leaf.template_path] = mode
    for key, slices in groups.items():
        m, s = _pooled_statistics(values, slices, modes[key])
        for offset, size in slices:
            mean[offset : offset + size] = m
            std[offset : offset + size] = s
    return LeafStatistics(mean, std)


def _pooled_statistics(
    values: npt.NDArray[np.floating], slices: list[tuple[int, int]], mode: str
) -> tuple[Doubles, Doubles]:
    size = slices[0][1]
    count = values.shape[0] * len(slices)
    total = np.zeros(size, dtype=np.float64)
    for offset, _ in slices:
        total += values[:, offset : offset + size].sum(axis=0, dtype=np.float64)
    per_dim_mean = total / count
    centre = np.full(size, per_dim_mean.mean()) if mode == "AutoShared" else per_dim_mean
    squares = np.zeros(size, dtype=np.float64)
    for offset, _ in slices:
        deviation = values[:, offset : offset + size].astype(np.float64) - centre
        squares += np.einsum("ij,ij->j", deviation, deviation)
    if mode == "AutoShared":
        s = np.full(size, np.sqrt(squares.sum() / (count * size)))
    elif mode == "AutoDimensionAverage":
        s = np.full(size, np.sqrt(squares / count).mean())
    else:
        s = np.sqrt(squares / count)
    return centre, np.where(s < MIN_STD, 1.0, s)


def observation_noise_std(
    values: npt.NDArray[np.floating], schema: SchemaNode, stats: LeafStatistics
) -> Doubles:
    """Per-column scale (O,) of the training-time observation noise (``ObservationNoiseScale``): the
    standard deviation that one unit of noise has in each observation column, in raw units.

    [INF] The engine applies the noise to the normalised observations (spec §4.1), so one unit is one
    standard deviation of the feature: the leaf's own statistics for an ``Auto*`` leaf, the
    per-dimension data std for a ``Manual`` Continuous leaf (its values are normalised by the user, so
    the data still says what a unit is; std < :data:`MIN_STD` → 1). Discrete, mask and every other
    non-Continuous column gets 0: flipping a one-hot by Gaussian noise makes an input the game never
    produces.
    """
    if values.ndim != 2 or values.shape[1] != schema.vector_size:
        raise BadData(
            f"the data has shape {values.shape} but the observation schema's VectorSize is "
            f"{schema.vector_size}"
        )
    scale = np.zeros(schema.vector_size, dtype=np.float64)
    for leaf in leaves(schema):
        if leaf.node.type != "Continuous":
            continue
        columns = slice(leaf.offset, leaf.offset + leaf.size)
        if leaf.node.normalization in AUTO_NORMALIZATIONS:
            scale[columns] = stats.std[columns]
        else:
            s = values[:, columns].astype(np.float64).std(axis=0)
            scale[columns] = np.where(s < MIN_STD, 1.0, s)
    return scale


# --------------------------------------------------------------------------------------------------
# Tensors


def decoder_inputs(targets: Floats, decoder_scale: npt.ArrayLike, decoder_shift: npt.ArrayLike) -> Floats:
    """``x1`` (N, A) float32: the decoder input that reproduces each raw action chunk of ``targets``
    (N, A) through the decoder's element-wise affine map ``a = x·scale + shift``, i.e.
    ``x1 = (a − shift)/scale``. Dims where the scale is 0 output a constant whatever ``x`` is; their
    ``x1`` is 0."""
    scale = np.asarray(decoder_scale, dtype=np.float64).reshape(-1)
    shift = np.asarray(decoder_shift, dtype=np.float64).reshape(-1)
    width = targets.shape[1]
    if scale.shape != (width,) or shift.shape != (width,):
        raise ValueError(f"decoder scale/shift must be ({width},), got {scale.shape} and {shift.shape}")
    safe = np.where(scale == 0.0, 1.0, scale)
    x1 = np.where(scale == 0.0, 0.0, (targets - shift) / safe).astype(np.float32)
    if not np.isfinite(x1).all():
        raise BadData("the decoder's normalisation maps some recorded actions to non-finite values.")
    return x1


@dataclass(frozen=True, slots=True, eq=False)
class TensorData:
    """The training set on the training device, in the spaces the model consumes:
    ``obs`` (N, O) raw observations and ``x1`` (N, A) data points of the flow (decoder-input space)."""

    obs: Tensor
    x1: Tensor

    def __post_init__(self) -> None:
        _check_pair(self.obs, self.x1, "TensorData")

    @classmethod
    def build(
        cls,
        data: TrainingData,
        decoder_scale: npt.ArrayLike,
        decoder_shift: npt.ArrayLike,
        device: torch.device | str,
        order: npt.ArrayLike | None = None,
    ) -> TensorData:
        """Move ``data`` to ``device`` with ``x1 = decoder_inputs(targets[:, order], scale, shift)``, so
        that the engine's decoder turns a perfectly sampled ``x1`` back into the demonstrated action
        chunk. ``order`` (A,): the decoder's chunk layout (:attr:`protocol.engine.chunks.ChunkLayout.
        source`); None: step-major (the engine's layout for C = 1 or a one-leaf action schema)."""
        targets = data.targets if order is None else data.targets[:, np.asarray(order, dtype=np.int64)]
        x1 = decoder_inputs(targets, decoder_scale, decoder_shift)
        return cls(
            obs=torch.from_numpy(data.observations).to(device),
            x1=torch.from_numpy(x1).to(device),
        )

    @property
    def row_num(self) -> int:
        return int(self.obs.shape[0])


@dataclass(frozen=True, slots=True, eq=False)
class Batch:
    """One minibatch: ``obs`` (B, O) raw observations, ``x1`` (B, A) flow data points; same device,
    floating dtype."""

    obs: Tensor
    x1: Tensor

    def __post_init__(self) -> None:
        _check_pair(self.obs, self.x1, "Batch")

    @property
    def size(self) -> int:
        """B."""
        return int(self.obs.shape[0])


def _check_pair(obs: Tensor, x1: Tensor, what: str) -> None:
    if obs.dim() != 2 or x1.dim() != 2:
        raise ValueError(
            f"{what}: obs must be (B, O) and x1 (B, A); got {tuple(obs.shape)}, {tuple(x1.shape)}"
        )
    if obs.shape[0] != x1.shape[0]:
        raise ValueError(f"{what}: obs has {obs.shape[0]} rows but x1 has {x1.shape[0]}")
    if obs.device != x1.device:
        raise ValueError(f"{what}: obs is on {obs.device} but x1 on {x1.device}")
    if not (obs.is_floating_point() and x1.is_floating_point()):
        raise ValueError(f"{what}: obs and x1 must be floating point, got {obs.dtype} and {x1.dtype}")
