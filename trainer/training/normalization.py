"""Where normalisation lives in the networks the engine runs (numpy, on layer values).

The engine applies no normalisation of its own around the flow-matching networks: the encoder's and
decoder's leaf Denormalize layers are the slots for it, and the denoiser's first Linear and final
Denormalize can absorb any affine map exactly (spec §6.3, §10 items 1–2, 5). This module:

* writes observation statistics into the encoder leaves and action statistics into the decoder leaves
  (``EmbedNormalizationsInWeights = true``, and for training in either mode):
  :func:`write_encoder_normalization`, :func:`write_decoder_denormalization`;
* moves the observation statistics back out of a trained encoder into the layers after its leaves
  (``EmbedNormalizationsInWeights = false``): :func:`move_encoder_normalization_out`;
* reads the element-wise affine map a decoder implements: :func:`elementwise_affine`;
* folds affine maps into the denoiser: :func:`fold_input_affine`, :func:`set_output_denormalize`.

Every function returns new layer values (layers are frozen); the input is never modified. A network
whose tree does not have the shape the engine builds raises :class:`LayoutMismatch`, and the caller
falls back to folding the statistics into the denoiser instead (with a log note).
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
from trainer.errors import Unsupported
from trainer.training.data import AUTO_NORMALIZATIONS

__all__ = [
    "ElementwiseAffine",
    "LayoutMismatch",
    "elementwise_affine",
    "fold_input_affine",
    "has_auto_normalization",
    "move_encoder_normalization_in",
    "move_encoder_normalization_out",
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
    :func:`trainer.training.data.leaf_statistics`), Encoding ↔ Sequence[element layer, MLP], Continuous leaf ↔
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

    The decoder reads a whole chunk, ``C·Av`` values, in the layout the engine builds (spec §11 item 5,
    :mod:`protocol.engine.chunks`): each leaf a ``Denormalize(Num·C)`` holding C steps of that leaf, so
    its statistics are the leaf's per-step ones repeated C times. Tree: And/Or ↔ Concat (widths ·C),
    Array ↔ Array (element built with C), Encoding adds no layer, Continuous ↔ Denormalize(Num·C) (a root
    Continuous IS the Denormalize, spec §10 item 2). Any other tree raises :class:`LayoutMismatch`.
    """
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    width = action_schema.vector_size
    m, s = _stats(mean, std, width, "action")
    if decoder.input_size != chunk_size * width:
        raise LayoutMismatch(
            f"the decoder reads {decoder.input_size} values but ActionChunkSize*ActionVectorSize is "
            f"{chunk_size}*{width}"
        )
    return _write(decoder, action_schema, 0, m, s, "action", "Decoder", chunk_size)


def move_encoder_normalization_out(trained: Layer, received: Layer) -> tuple[Layer, ElementwiseAffine]:
    """The encoder ``trained`` (trained with observation statistics in its leaves, see
    :func:`write_encoder_normalization`) with every leaf Denormalize put back to its ``received`` value,
    and the statistics moved into the layers after them, so that the function is unchanged:

    * a leaf under an Encoding: into the first Linear of the Encoding's MLP (exact:
      ``W' = diag(scale)·W``, ``b' = b + shift·W``);
    * a leaf that feeds the encoder's output directly: returned as the element-wise map ``affine`` with
      ``trained(x) == moved(x)·affine.scale + affine.shift``, for the caller to fold into the denoiser's
      first Linear.

    ``EmbedNormalizationsInWeights = false`` keeps the engine's normalisation slots as received
    (spec §10 item 5: embedding is what the flag turns on) while every weight is still trained with
    standardised inputs. ``trained`` and ``received`` must be the same tree (the written copy of it);
    raises :class:`LayoutMismatch` where the statistics cannot move (a received leaf with std 0, a leaf
    followed by something other than a Linear).
    """
    return _move(trained, received, "Encoder", outward=True)


def move_encoder_normalization_in(written: Layer, received: Layer) -> tuple[Layer, ElementwiseAffine]:
    """The inverse of :func:`move_encoder_normalization_out`: ``written`` (the received encoder with the
    statistics written into its leaves) with the first Linear after each leaf un-folded, so that an
    Encoding computes exactly what it computed in ``received``. For an encoder that an earlier export of
    ours (Embed false) sent with the statistics already moved into its Encoding MLPs. Returns the
    encoder and the same ``affine`` as :func:`move_encoder_normalization_out` for the leaves that feed
    the output directly (``written(x) == received(x)·affine.scale + affine.shift`` there)."""
    return _move(written, received, "Encoder", outward=False)


def _identity(width: int) -> ElementwiseAffine:
    return ElementwiseAffine(np.ones(width), np.zeros(width))


def _is_identity_affine(affine: ElementwiseAffine) -> bool:
    return bool(np.all(affine.scale == 1.0) and np.all(affine.shift == 0.0))


def _move(trained: Layer, received: Layer, path: str, *, outward: bool) -> tuple[Layer, ElementwiseAffine]:
    """(layer, affine) with ``affine`` mapping the received leaves' outputs to the trained ones
    (``trained = received·scale + shift``) on what the subtree hands on. ``outward``: the layer has the
    received leaves and the next Linear absorbs ``affine``; else the trained leaves and the next Linear
    absorbs its inverse."""
    if type(trained) is not type(received) or trained.input_size != received.input_size:
        raise LayoutMismatch(f"{path}: the trained and received encoders differ in structure")
    if isinstance(trained, Denormalize):
        assert isinstance(received, Denormalize)
        a_t, b_t = trained.std.astype(np.float64), trained.mean.astype(np.float64)
        a_r, b_r = received.std.astype(np.float64), received.mean.astype(np.float64)
        leaf = received if outward else trained
        if np.array_equal(a_t, a_r) and np.array_equal(b_t, b_r):
            return leaf, _identity(received.size)
        if (a_r == 0).any():
            raise LayoutMismatch(f"{path}: a received Denormalize has std 0; its statistics cannot move")
        # trained(x) = x·a_t + b_t = (x·a_r + b_r)·(a_t/a_r) + (b_t − b_r·a_t/a_r)
        scale = a_t / a_r
        return leaf, ElementwiseAffine(scale, b_t - b_r * scale)
    if isinstance(trained, Concat):
        assert isinstance(received, Concat)
        parts = [
            _move(t, r, f"{path}[{i}]", outward=outward)
            for i, (t, r) in enumerate(zip(trained.layers, received.layers, strict=True))
        ]
        return dataclasses.replace(trained, layers=tuple(layer for layer, _ in parts)), ElementwiseAffine(
            np.concatenate([a.scale for _, a in parts] or [np.zeros(0)]),
            np.concatenate([a.shift for _, a in parts] or [np.zeros(0)]),
        )
    if isinstance(trained, Array):
        assert isinstance(received, Array)
        sub, inner = _move(trained.layer, received.layer, f"{path}.Element", outward=outward)
        return dataclasses.replace(trained, layer=sub), ElementwiseAffine(
            np.tile(inner.scale, trained.element_num), np.tile(inner.shift, trained.element_num)
        )
    if isinstance(trained, Sequence):
        assert isinstance(received, Sequence)
        # Only a Sequence's first child holds leaves (the engine's Encoding: Sequence[element, MLP]);
        # whatever it hands on is absorbed by the layers after it.
        first, affine = _move(trained.layers[0], received.layers[0], f"{path}[0]", outward=outward)
        if len(trained.layers) == 1:
            return dataclasses.replace(trained, layers=(first,)), affine
        if not outward and not _is_identity_affine(affine):
            affine = ElementwiseAffine(1.0 / affine.scale, -affine.shift / affine.scale)
        rest = []
        for i, layer in enumerate(trained.layers[1:], start=1):
            absorbed, affine = _absorb(layer, affine, f"{path}[{i}]")
            rest.append(absorbed)
        return dataclasses.replace(trained, layers=(first, *rest)), affine
    return trained, _identity(trained.output_size)  # no leaves inside: trained weights as they are


def _absorb(layer: Layer, affine: ElementwiseAffine, path: str) -> tuple[Layer, ElementwiseAffine]:
    """``layer'`` with ``layer'(y) == layer(y·scale + shift)`` and the affine map left on its output."""
    if _is_identity_affine(affine):
        return layer, _identity(layer.output_size)
    if isinstance(layer, Linear):
        w = layer.weights.astype(np.float64)
        moved = dataclasses.replace(
            layer,
            weights=(affine.scale[:, None] * w).astype(np.float32),
            bias=(layer.bias.astype(np.float64) + affine.shift @ w).astype(np.float32),
        )
        return moved, _identity(layer.output_size)
    if isinstance(layer, Sequence):
        children = []
        for i, child in enumerate(layer.layers):
            absorbed, affine = _absorb(child, affine, f"{path}[{i}]")
            children.append(absorbed)
        return dataclasses.replace(layer, layers=tuple(children)), affine
    raise LayoutMismatch(
        f"{path}: a {_type_name(layer)} follows normalised leaves; only a Linear can take their statistics"
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
    layer: Layer,
    node: SchemaNode,
    offset: int,
    mean: Doubles,
    std: Doubles,
    role: str,
    path: str,
    chunk: int = 1,
) -> Layer:
    """``layer`` (the network for ``node``'s slice ``[offset, offset + VectorSize)`` of a per-step vector,
    reading ``chunk`` steps of it leaf-major) with the Auto leaves inside written from ``mean``/``std``
    (per-step values, already in Denormalize form)."""
    if not has_auto_normalization(node):
        if layer.input_size != node.vector_size * chunk:
            raise LayoutMismatch(
                f"{path} is a {_type_name(layer)} reading {layer.input_size} values but the schema node "
                f"({node.type}) has VectorSize {node.vector_size}"
                + (f" x {chunk} steps" if chunk > 1 else "")
            )
        return layer  # nothing to write here: keep the layers as received
    t = node.type
    if t == "Continuous":
        size = node.vector_size * chunk
        if not isinstance(layer, Denormalize) or layer.size != size:
            raise _mismatch(path, layer, f"Denormalize({size})", node)
        end = offset + node.vector_size
        # C steps of this leaf, step-major inside the leaf (protocol.engine.chunks [INF]).
        return _denormalize(layer, np.tile(mean[offset:end], chunk), np.tile(std[offset:end], chunk))
    if t == "And" or (role == "action" and t in ("OrExclusive", "OrInclusive")):
        # Or action vectors are assumed to be the plain concatenation (decoder Or → Concat, §10 item 2);
        # when they are not, the Concat widths below disagree and the caller falls back to folding.
        children = [child for _, child in node.elements]
        widths = tuple(child.vector_size * chunk for child in children)
        if not isinstance(layer, Concat) or layer.input_sizes != widths:
            raise _mismatch(path, layer, f"Concat with input sizes {widths}", node)
        written = []
        for (name, child), sub in zip(node.elements, layer.layers, strict=True):
            written.append(_write(sub, child, offset, mean, std, role, f"{path}.{name}", chunk))
            offset += child.vector_size
        return dataclasses.replace(layer, layers=tuple(written))
    if t == "Array" and node.element is not None and node.num is not None:
        element = node.element
        size = element.vector_size
        if (
            not isinstance(layer, Array)
            or layer.element_num != node.num
            or layer.element_input_size != size * chunk
        ):
            raise _mismatch(path, layer, f"Array({node.num}, {size * chunk}, ...)", node)
        first = slice(offset, offset + size)
        for k in range(1, node.num):
            other = slice(offset + k * size, offset + (k + 1) * size)
            if not (np.array_equal(mean[first], mean[other]) and np.array_equal(std[first], std[other])):
                raise ValueError(
                    f"{path}: Array elements 0 and {k} have different statistics, but the engine shares "
                    "one sub-layer between all elements (pool them, see trainer.training.data.leaf_statistics)"
                )
        return dataclasses.replace(
            layer, layer=_write(layer.layer, element, offset, mean, std, role, f"{path}.Element", chunk)
        )
    if t == "Encoding" and node.element is not None:
        if role == "action":
            # The decoder builds no layer for an Encoding element (spec §10 item 2).
            return _write(layer, node.element, offset, mean, std, role, f"{path}.Element", chunk)
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
            f"the denoiser's root should be a Sequence ending in a Denormalize (spec section 10 item 1) but it is a "
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
            f"the denoiser's first layer should be a Linear (spec section 6.3) but it is a {_type_name(layer)}"
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
