"""Where each step of an action chunk sits in the engine's chunked decoder (spec §5.4, §11 item 5).

With ``ActionChunkSize`` C > 1 the engine builds the decoder leaf-major
(``MakeDenormalizerNetworkModelBuilderElementFromSchema`` in LearningAgentsFlowMatching.cpp): every
action leaf becomes one ``Denormalize(Num·C)``, an And (or Or) a Concat of its children, an Array an
Array of ``Num`` elements each built with C, and an Encoding adds no layer. So the decoder's input, and
the denoiser's action width ``A = C·Av``, is laid out leaf by leaf, in the order of
:func:`protocol.schema.leaves` (depth first, Array elements repeated in order), one block of ``C·Num``
values per leaf::

    [ leaf 0: step 0 ‖ step 1 ‖ … ‖ step C−1 ] [ leaf 1: step 0 ‖ … ] …

[INF] Inside a leaf's block the source does not say how the C steps' values are ordered (the engine's
inference cannot yet write a chunk back into per-step actions: "a hacky way of predicting action
chunks", with ActionChunkSize 1 at recording and inference). We take **step-major inside the leaf**: C
consecutive groups of the leaf's Num values, step 0 first. It is the order that keeps each step's
values of a leaf together, like a per-step action vector, and for a one-leaf action schema (a single
Continuous, the common case) the whole chunk is then the plain concatenation of the C action vectors.

A chunk as the replay buffer gives it is step-major, ``[a_t ‖ a_t+1 ‖ … ‖ a_t+C−1]`` (each ``a`` one
per-step action vector, width Av). :class:`ChunkLayout` maps between the two.

Pure numpy, like the rest of :mod:`protocol`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from protocol.errors import ConfigError
from protocol.schema import SchemaNode, leaves

__all__ = ["DECODER_LEAF_TYPES", "ChunkLayout"]

DECODER_LEAF_TYPES = frozenset(
    {
        "Continuous",
        "DiscreteExclusive",
        "DiscreteInclusive",
        "NamedDiscreteExclusive",
        "NamedDiscreteInclusive",
    }
)
"""Action node types the engine's decoder builds one ``Denormalize(Num·C)`` for."""

Indices = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True, eq=False)
class ChunkLayout:
    """The engine's chunk layout for one action schema and chunk size.

    ``source`` (A,): position ``p`` of the engine's (leaf-major) chunk holds column ``source[p]`` of the
    step-major chunk, i.e. step ``source[p] // Av``, per-step column ``source[p] % Av``. A permutation of
    ``range(A)``; the identity when C = 1 or the action schema is one leaf.
    """

    chunk_size: int
    action_width: int
    source: Indices

    def __post_init__(self) -> None:
        width = self.chunk_size * self.action_width
        if self.source.shape != (width,) or not np.array_equal(np.sort(self.source), np.arange(width)):
            raise ValueError(f"source must be a permutation of range({width})")

    @classmethod
    def from_schema(cls, action_schema: SchemaNode, chunk_size: int) -> ChunkLayout:
        """The layout the engine's decoder builder gives ``action_schema`` with ``chunk_size`` C.

        Raises :class:`ConfigError` for C < 1, and for C > 1 when a leaf of the schema is not one the
        engine builds a ``Denormalize(Num·C)`` for (an Or/Set presence mask, an opaque or unknown node):
        the engine's builder stops on those (``checkNoEntry`` / a size check), so no layout exists.
        """
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise ConfigError(
                "ActionChunkSize must be at least 1",
                field="FlowMatchingSettings.ActionChunkSize",
                expected=">= 1",
                actual=chunk_size,
            )
        width = action_schema.vector_size
        if chunk_size == 1:
            return cls(1, width, np.arange(width, dtype=np.int64))
        blocks: list[Indices] = []
        for leaf in leaves(action_schema, "ActionSchema"):
            if leaf.node.type not in DECODER_LEAF_TYPES or leaf.path.endswith(".Mask"):
                raise ConfigError(
                    f"{leaf.path}: the engine builds no chunked decoder layer for a {leaf.node.type} "
                    "action element (its decoder builder accepts Continuous and Discrete leaves under "
                    "And, mask-free Or, Array and Encoding)",
                    field=leaf.path,
                    actual=leaf.node.type,
                )
            columns = leaf.offset + np.arange(leaf.size, dtype=np.int64)
            # [INF] step-major inside the leaf (module docstring).
            blocks.extend(step * width + columns for step in range(chunk_size))
        source = np.concatenate(blocks) if blocks else np.zeros(0, dtype=np.int64)
        return cls(chunk_size, width, source)

    @property
    def width(self) -> int:
        """A = C·Av."""
        return self.chunk_size * self.action_width

    @property
    def is_identity(self) -> bool:
        """Whether the engine's layout is the step-major chunk itself."""
        return bool(np.array_equal(self.source, np.arange(self.width)))

    def to_engine(self, step_major: npt.NDArray[np.floating]) -> npt.NDArray[np.floating]:
        """``(..., A)`` step-major chunks → the engine's layout (a copy)."""
        self._check(step_major)
        return step_major[..., self.source]

    def to_steps(self, engine: npt.NDArray[np.floating]) -> npt.NDArray[np.floating]:
        """``(..., A)`` chunks in the engine's layout (the decoder's output) → ``(..., C, Av)`` per-step
        action vectors, step 0 first."""
        self._check(engine)
        step_major = np.empty_like(engine)
        step_major[..., self.source] = engine
        return step_major.reshape(*engine.shape[:-1], self.chunk_size, self.action_width)

    def step_positions(self, step: int) -> Indices:
        """Positions in the engine's layout of step ``step``'s Av values, in per-step column order."""
        if not 0 <= step < self.chunk_size:
            raise ValueError(f"step must be in 0..{self.chunk_size - 1}, got {step}")
        inverse = np.empty_like(self.source)
        inverse[self.source] = np.arange(self.width)
        return inverse[step * self.action_width : (step + 1) * self.action_width]

    def _check(self, values: npt.NDArray[np.floating]) -> None:
        if values.shape[-1:] != (self.width,):
            raise ValueError(f"expected (..., {self.width}) chunks, got shape {values.shape}")
