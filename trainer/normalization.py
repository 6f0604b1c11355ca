"""Where normalisation lives in the networks the engine runs (numpy, on layer values).

The engine applies no normalisation of its own around the flow-matching networks: the encoder's and
decoder's leaf Denormalize layers are the slots for it, and the denoiser's first Linear and final
Denormalize can absorb any affine map exactly (spec §6.3, §10 items 1–2, 5). This module:

* writes observation statistics into the encoder leaves and action statistics into the decoder leaves
  (``EmbedNormalizationsInWeights = true``): :func:`write_encoder_normalization`,
  :func:`write_decoder_denormalization`;
* reads the element-wise affine map a decoder implements: :func:`elementwise_affine`;
* folds affine maps into the denoiser: :func:`fold_input_affine`, :func:`set_output_denormalize`.

Every function returns new layer values (layers are frozen); the input is never modified. A network
whose tree does not have the shape the engine builds raises :class:`LayoutMismatch`, and the caller
falls back to folding the statistics into the denoiser instead.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from protocol.nne.layers import (
    Array,
    Concat,
    Copy,
    Denormalize,
    Layer,
    Linear,
    Normalize,
    Sequence,
)
from protocol.schema import SchemaNode
from trainer.data import AUTO_NORMALIZATIONS
from trainer.errors import Unsupported

__all__ = [
    "ElementwiseAffine",
    "LayoutMismatch",
    "elementwise_affine",
    "fold_input_affine",
    "has_auto_normalization",
    "output_denormalize",
    "require_elementwise_affine",
    "set_output_denormalize",
    "write_decoder_denormalization",
    "write_encoder_normalization",
]

Doubles = npt.NDArray[np.float64]


class LayoutMismatch(Unsupported):
    """A network's layer tree does not have the shape the engine builds for its schema (spec §6.3)."""


class ElementwiseAffine(NamedTuple):
    """``y = x·scale + shift`` per element; both ``(W,)`` float64."""

    scale: Doubles
    shift: Doubles


# --------------------------------------------------------------------------------------------------
# Encoder / decoder leaves


def write_encoder_normalization(
    encoder: Layer, obs_schema: SchemaNode, mean: npt.ArrayLike, std: npt.ArrayLike
) -> Layer:
    """The encoder with observation statistics ``mean``/``std`` (O,) written into its leaf Denormalize
    layers as ``mean' = −μ/σ``, ``std' = 1/σ``, so that each leaf computes ``(x − μ)/σ`` (spec §6.3).

    The schema and layer trees are walked in parallel: And ↔ Concat (elements in Index order), Array ↔
    Array (one shared sub-layer; all elements must carry equal statistics, see
    :func:`trainer.data.leaf_statistics`), Encoding ↔ Sequence[element layer, MLP], Continuous leaf ↔
    Denormalize; a root Continuous IS the Denormalize (spec §10 item 2). Only leaves whose mode is Auto*
    are written; Manual and discrete leaves keep the values received. A subtree holding no Auto leaf is
    kept as received whatever its layers are (Or/Set/Conv encoders included). Raises
    :class:`LayoutMismatch` when a subtree with Auto leaves does not have the expected shape.
    """
    m, s = _stats(mean, std, obs_schema.vector_size, "observation")
    inv = 1.0 / s
    return _write(encoder, obs_schema, 0, -m * inv, inv, "observation", "Encoder")


def write_decoder_denormalization(
    decoder: Layer,
    action_schema: SchemaNode,
    chunk_size: int,
    mean: npt.ArrayLike,
    std: npt.ArrayLike,
) -> Layer:
    """The decoder with per-step action statistics ``mean``/``std`` (Av,) written into its leaf
    Denormalize layers as ``mean' = μ``, ``std' = σ``, mapping normalised actions back to raw units.

    The decoder reads a whole chunk, ``C·Av`` values (spec §5.4). With ``chunk_size > 1`` the layouts
    accepted are: ``Array(C, Av, Av, per-step decoder)``; a Concat of C per-step decoders; a Concat of
    the action root's top-level elements repeated C times; or a single Denormalize(C·Av) for a
    Continuous root. [INF] spec Unknowns 6: the engine's chunked decoder layout is not documented, so
    every plausible one is recognised and anything else raises :class:`LayoutMismatch`.
    Per-step tree: And/Or ↔ Concat, Array ↔ Array, Encoding adds no layer, Continuous ↔ Denormalize
    (spec §10 item 2).
    """
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    width = action_schema.vector_size
    m, s = _stats(mean, std, width, "action")
    if decoder.input_size != chunk_size * width:
        raise LayoutMismatch(
            f"the decoder reads {decoder.input_size} values but ActionChunkSize·ActionVectorSize is "
            f"{chunk_size}·{width}"
        )
    if chunk_size == 1:
        return _write(decoder, action_schema, 0, m, s, "action", "Decoder")
    if (
        isinstance(decoder, Array)
        and decoder.element_num == chunk_size
        and decoder.element_input_size == width
    ):
        return dataclasses.replace(
            decoder, layer=_write(decoder.layer, action_schema, 0, m, s, "action", "Decoder.Step")
        )
    if isinstance(decoder, Concat):
        if len(decoder.layers) == chunk_size and all(w == width for w in decoder.input_sizes):
            try:
                steps = tuple(
                    _write(sub, action_schema, 0, m, s, "action", f"Decoder.Step[{k}]")
                    for k, sub in enumerate(decoder.layers)
                )
                return dataclasses.replace(decoder, layers=steps)
            except LayoutMismatch:
                pass  # e.g. a one-element And: the children may be its elements instead (next layout)
        top = [child for _, child in action_schema.elements] if action_schema.type == "And" else []
        if top and len(decoder.layers) == chunk_size * len(top):
            written = []
            for i, sub in enumerate(decoder.layers):
                k, j = divmod(i, len(top))
                offset = sum(child.vector_size for child in top[:j])
                written.append(_write(sub, top[j], offset, m, s, "action", f"Decoder.Step[{k}][{j}]"))
            return dataclasses.replace(decoder, layers=tuple(written))
    if isinstance(decoder, Denormalize) and action_schema.type == "Continuous":
        if action_schema.normalization not in AUTO_NORMALIZATIONS:
            return decoder
        return _denormalize(decoder, np.tile(m, chunk_size), np.tile(s, chunk_size))
    if not has_auto_normalization(action_schema):
        return decoder
    raise LayoutMismatch(
        f"the decoder's root is a {_type_name(decoder)} that does not match a chunk of {chunk_size} "
        f"actions of the action schema ({action_schema.type}, VectorSize {width})"
    )


def _stats(mean: npt.ArrayLike, std: npt.ArrayLike, width: int, role: str) -> tuple[Doubles, Doubles]:
    m = np.asarray(mean, dtype=np.float64).reshape(-1)
    s = np.asarray(std, dtype=np.float64).reshape(-1)
    if m.shape != (width,) or s.shape != (width,):
        raise ValueError(f"{role} statistics must be ({width},), got {m.shape} and {s.shape}")
    if not (np.isfinite(m).all() and np.isfinite(s).all()) or (s <= 0).any():
        raise ValueError(f"{role} statistics must be finite with std > 0")
    return m, s


def _write(
    layer: Layer, node: SchemaNode, offset: int, mean: Doubles, std: Doubles, role: str, path: str
) -> Layer:
    """``layer`` (the network for ``node``'s slice ``[offset, offset + VectorSize)``) with the Auto leaves
    inside written from ``mean``/``std`` (values already in Denormalize form)."""
    if not has_auto_normalization(node):
        if layer.input_size != node.vector_size:
            raise LayoutMismatch(
                f"{path} is a {_type_name(layer)} reading {layer.input_size} values but the schema node "
                f"({node.type}) has VectorSize {node.vector_size}"
            )
        return layer  # nothing to write here: keep the layers as received
    t = node.type
    if t == "Continuous":
        if not isinstance(layer, Denormalize) or layer.size != node.vector_size:
            raise _mismatch(path, layer, f"Denormalize({node.vector_size})", node)
        end = offset + node.vector_size
        return _denormalize(layer, mean[offset:end], std[offset:end])
    if t == "And" or (role == "action" and t in ("OrExclusive", "OrInclusive")):
        # Or action vectors are assumed to be the plain concatenation (decoder Or → Concat, §10 item 2);
        # when they are not, the Concat widths below disagree and the caller falls back to folding.
        children = [child for _, child in node.elements]
        widths = tuple(child.vector_size for child in children)
        if not isinstance(layer, Concat) or layer.input_sizes != widths:
            raise _mismatch(path, layer, f"Concat with input sizes {widths}", node)
        written = []
        for (name, child), sub in zip(node.elements, layer.layers, strict=True):
            written.append(_write(sub, child, offset, mean, std, role, f"{path}.{name}"))
            offset += child.vector_size
        return dataclasses.replace(layer, layers=tuple(written))
    if t == "Array" and node.element is not None and node.num is not None:
        element = node.element
        size = element.vector_size
        if not isinstance(layer, Array) or layer.element_num != node.num or layer.element_input_size != size:
            raise _mismatch(path, layer, f"Array({node.num}, {size}, …)", node)
        first = slice(offset, offset + size)
        for k in range(1, node.num):
            other = slice(offset + k * size, offset + (k + 1) * size)
            if not (np.array_equal(mean[first], mean[other]) and np.array_equal(std[first], std[other])):
                raise ValueError(
                    f"{path}: Array elements 0 and {k} have different statistics, but the engine shares "
                    "one sub-layer between all elements (pool them, see trainer.data.leaf_statistics)"
                )
        return dataclasses.replace(
            layer, layer=_write(layer.layer, element, offset, mean, std, role, f"{path}.Element")
        )
    if t == "Encoding" and node.element is not None:
        if role == "action":
            # The decoder builds no layer for an Encoding element (spec §10 item 2).
            return _write(layer, node.element, offset, mean, std, role, f"{path}.Element")
        if not isinstance(layer, Sequence) or layer.layers[0].input_size != node.element.vector_size:
            raise _mismatch(path, layer, "Sequence[element encoder, MLP]", node)
        first_layer = _write(layer.layers[0], node.element, offset, mean, std, role, f"{path}.Element")
        return dataclasses.replace(layer, layers=(first_layer, *layer.layers[1:]))
    raise LayoutMismatch(
        f"{path}: cannot write normalisation inside a {node.type} {role} node (its layer is a "
        f"{_type_name(layer)}); the statistics will be folded into the denoiser instead"
    )


def has_auto_normalization(node: SchemaNode) -> bool:
    """Whether ``node`` or any node below it is a Continuous leaf with an Auto* Normalization mode."""
    if node.type == "Continuous":
        return node.normalization in AUTO_NORMALIZATIONS
    if any(has_auto_normalization(child) for _, child in node.elements):
        return True
    return node.element is not None and has_auto_normalization(node.element)


def _denormalize(layer: Denormalize, mean: Doubles, std: Doubles) -> Denormalize:
    return dataclasses.replace(layer, mean=mean.astype(np.float32), std=std.astype(np.float32))


def _mismatch(path: str, layer: Layer, expected: str, node: SchemaNode) -> LayoutMismatch:
    return LayoutMismatch(
        f"{path}: expected {expected} for the {node.type} schema node (VectorSize {node.vector_size}) "
        f"but found a {_type_name(layer)} reading {layer.input_size} values"
    )


def _type_name(layer: Layer) -> str:
    return type(layer).__name__


# --------------------------------------------------------------------------------------------------
# Element-wise affine maps


def elementwise_affine(layer: Layer) -> ElementwiseAffine | None:
    """The per-element affine map ``y = x·scale + shift`` that ``layer`` computes, or None when it is not
    one (exact, derived from the tree: Sequence composes, Concat concatenates, Array tiles, Normalize,
    Denormalize and Copy are the only leaves allowed)."""
    result = _affine(layer)
    return result if isinstance(result, ElementwiseAffine) else None


def require_elementwise_affine(layer: Layer, what: str) -> ElementwiseAffine:
    """:func:`elementwise_affine` or :class:`Unsupported` naming the first layer that is not element-wise
    affine (e.g. a decoder with an Encoding MLP)."""
    result = _affine(layer)
    if isinstance(result, ElementwiseAffine):
        return result
    raise Unsupported(
        f"the {what} network contains a {result} layer, so it is not an element-wise affine map; "
        "la-trainer needs the flow-matching decoder to be made of Denormalize/Normalize/Copy layers "
        "(in Sequence, Concat or Array containers) to map recorded actions to the denoiser's space."
    )


def _affine(layer: Layer) -> ElementwiseAffine | str:
    """The map, or the name of the first offending layer type."""
    if isinstance(layer, Denormalize):
        return ElementwiseAffine(layer.std.astype(np.float64), layer.mean.astype(np.float64))
    if isinstance(layer, Normalize):
        std = layer.std.astype(np.float64)
        if (std == 0).any():
            return "Normalize (with a zero std)"
        return ElementwiseAffine(1.0 / std, -layer.mean.astype(np.float64) / std)
    if isinstance(layer, Copy):
        return ElementwiseAffine(np.ones(layer.size), np.zeros(layer.size))
    if isinstance(layer, Sequence):
        scale = np.ones(layer.input_size)
        shift = np.zeros(layer.input_size)
        for sub in layer.layers:
            inner = _affine(sub)
            if isinstance(inner, str):
                return inner
            scale, shift = scale * inner.scale, shift * inner.scale + inner.shift
        return ElementwiseAffine(scale, shift)
    if isinstance(layer, Concat):
        parts = [_affine(sub) for sub in layer.layers]
        for part in parts:
            if isinstance(part, str):
                return part
        if layer.input_sizes != layer.output_sizes:
            return "Concat (changing widths)"
        pieces = [p for p in parts if isinstance(p, ElementwiseAffine)]
        return ElementwiseAffine(
            np.concatenate([p.scale for p in pieces] or [np.zeros(0)]),
            np.concatenate([p.shift for p in pieces] or [np.zeros(0)]),
        )
    if isinstance(layer, Array):
        inner = _affine(layer.layer)
        if isinstance(inner, str):
            return inner
        if layer.element_input_size != layer.element_output_size:
            return "Array (changing widths)"
        return ElementwiseAffine(
            np.tile(inner.scale, layer.element_num), np.tile(inner.shift, layer.element_num)
        )
    return _type_name(layer)


# --------------------------------------------------------------------------------------------------
# The denoiser (spec §10 item 1: root = Sequence[MLP Sequence, Denormalize(ActDim)])


def fold_input_affine(denoiser: Layer, shift: npt.ArrayLike, scale: npt.ArrayLike) -> Layer:
    """A denoiser ``f'`` with ``f'(x) == f((x − shift)/scale)`` exactly, made by rewriting its FIRST Linear
    (the first leaf reached through nested Sequences): ``W' = W / scale[:, None]``,
    ``b' = b − (shift/scale) @ W`` (computed in float64, stored float32). ``shift``/``scale`` are (In,).
    """
    path = _first_linear_path(denoiser)
    first = _at(denoiser, path)
    assert isinstance(first, Linear)  # guaranteed by _first_linear_path
    sh = np.asarray(shift, dtype=np.float64).reshape(-1)
    sc = np.asarray(scale, dtype=np.float64).reshape(-1)
    if sh.shape != (first.input_size,) or sc.shape != (first.input_size,):
        raise ValueError(f"shift/scale must be ({first.input_size},), got {sh.shape} and {sc.shape}")
    if not (np.isfinite(sh).all() and np.isfinite(sc).all()) or (sc == 0).any():
        raise ValueError("shift must be finite and scale finite and non-zero")
    w = first.weights.astype(np.float64)
    folded = dataclasses.replace(
        first,
        weights=(w / sc[:, None]).astype(np.float32),
        bias=(first.bias.astype(np.float64) - (sh / sc) @ w).astype(np.float32),
    )
    return _replace_at(denoiser, path, folded)


def output_denormalize(denoiser: Layer) -> Denormalize:
    """The denoiser's final Denormalize (the last child of its root Sequence, spec §10 item 1)."""
    if not isinstance(denoiser, Sequence) or not isinstance(denoiser.layers[-1], Denormalize):
        raise LayoutMismatch(
            f"the denoiser's root should be a Sequence ending in a Denormalize (spec §10 item 1) but it is a "
            f"{_type_name(denoiser)}"
            + (f" ending in a {_type_name(denoiser.layers[-1])}" if isinstance(denoiser, Sequence) else "")
        )
    return denoiser.layers[-1]


def set_output_denormalize(denoiser: Layer, mean: npt.ArrayLike, std: npt.ArrayLike) -> Layer:
    """The denoiser with its final Denormalize set to ``mean``/``std`` (ActDim,)."""
    last = output_denormalize(denoiser)
    assert isinstance(denoiser, Sequence)  # checked by output_denormalize
    m = np.asarray(mean, dtype=np.float64).reshape(-1)
    s = np.asarray(std, dtype=np.float64).reshape(-1)
    if m.shape != (last.size,) or s.shape != (last.size,):
        raise ValueError(f"mean/std must be ({last.size},), got {m.shape} and {s.shape}")
    return dataclasses.replace(denoiser, layers=(*denoiser.layers[:-1], _denormalize(last, m, s)))


def _first_linear_path(denoiser: Layer) -> tuple[int, ...]:
    path: list[int] = []
    layer = denoiser
    while isinstance(layer, Sequence):
        path.append(0)
        layer = layer.layers[0]
    if not isinstance(layer, Linear):
        raise LayoutMismatch(
            f"the denoiser's first layer should be a Linear (spec §6.3) but it is a {_type_name(layer)}"
        )
    return tuple(path)


def _at(layer: Layer, path: tuple[int, ...]) -> Layer:
    for i in path:
        assert isinstance(layer, Sequence)
        layer = layer.layers[i]
    return layer


def _replace_at(layer: Layer, path: tuple[int, ...], new: Layer) -> Layer:
    if not path:
        return new
    assert isinstance(layer, Sequence)
    i = path[0]
    children = list(layer.layers)
    children[i] = _replace_at(children[i], path[1:], new)
    return dataclasses.replace(layer, layers=tuple(children))
