"""Normalisation placement facts: written leaves compute (x − μ)/σ and x·σ + μ, folds are exact (numpy
reference before/after on random inputs), element-wise affine maps are read exactly, and layouts the
engine does not build are refused with LayoutMismatch."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from protocol.engine.chunks import ChunkLayout
from protocol.engine.networks import build_decoder
from protocol.nne.layers import (
    ELU,
    Array,
    Concat,
    Copy,
    Denormalize,
    Layer,
    Linear,
    Normalize,
    Sequence,
)
from protocol.nne.reference import evaluate
from protocol.schema import parse_schema
from tests.support.schemas import cont
from trainer.errors import Unsupported
from trainer.training.normalization import (
    LayoutMismatch,
    elementwise_affine,
    fold_input_affine,
    output_denormalize,
    require_elementwise_affine,
    set_output_denormalize,
    write_decoder_denormalization,
    write_encoder_normalization,
)

RNG = np.random.default_rng(1234)


def ident(size: int) -> Denormalize:
    return Denormalize(size, np.zeros(size, np.float32), np.ones(size, np.float32))


def denorm(mean: list[float], std: list[float]) -> Denormalize:
    return Denormalize(len(mean), np.array(mean, np.float32), np.array(std, np.float32))


def linear(n_in: int, n_out: int) -> Linear:
    bound = 1 / np.sqrt(n_in)
    return Linear(
        n_in,
        n_out,
        RNG.uniform(-bound, bound, n_out).astype(np.float32),
        RNG.uniform(-bound, bound, (n_in, n_out)).astype(np.float32),
    )


def discrete(num: int, index: int) -> dict[str, Any]:
    return {"Type": "DiscreteExclusive", "VectorSize": num, "EncodedSize": num, "Num": num, "Index": index}


OBS_SCHEMA = parse_schema(
    {
        "Type": "And",
        "VectorSize": 12,
        "EncodedSize": 14,
        "Elements": {
            "pos": cont(2, "AutoPerDimension", 0),
            "items": {
                "Type": "Array",
                "VectorSize": 4,
                "EncodedSize": 4,
                "Num": 2,
                "Element": cont(2, "AutoShared"),
                "Index": 1,
            },
            "kind": discrete(3, 2),
            "raw": cont(1, "Manual", 3),
            "enc": {
                "Type": "Encoding",
                "VectorSize": 2,
                "EncodedSize": 4,
                "EncodingSize": 4,
                "Element": cont(2, "AutoDimensionAverage"),
                "Index": 4,
            },
        },
    },
    "observation",
)


def obs_encoder() -> Layer:
    return Concat(
        (2, 4, 3, 1, 2),
        (2, 4, 3, 1, 4),
        (
            ident(2),
            Array(2, 2, 2, ident(2)),
            ident(3),
            ident(1),
            Sequence((ident(2), Sequence((linear(2, 4), ELU(4))))),
        ),
    )


def obs_stats() -> tuple[np.ndarray, np.ndarray]:
    mean = np.array([100, -50, 7, 8, 7, 8, 0, 0, 0, 0, 3, 4], dtype=np.float64)
    std = np.array([50, 2, 5, 5, 5, 5, 1, 1, 1, 1, 4, 4], dtype=np.float64)
    return mean, std


# --------------------------------------------------------------------------------------------------
# Encoder


def test_written_encoder_standardises_every_auto_leaf_and_keeps_the_rest() -> None:
    encoder = obs_encoder()
    mean, std = obs_stats()
    written = write_encoder_normalization(encoder, OBS_SCHEMA, mean, std)
    x = (mean + std * RNG.standard_normal((64, 12))).astype(np.float32)
    before = evaluate(encoder, x)
    after = evaluate(written, x)
    z = (x - mean) / std
    # output columns: pos 0-1, items 2-5, kind 6-8, raw 9, enc 10-13 (inputs: the same up to 9, enc 10-11)
    np.testing.assert_allclose(after[:, :6], z[:, :6], rtol=0, atol=1e-5)  # pos, items (Auto)
    np.testing.assert_array_equal(after[:, 6:10], before[:, 6:10])  # kind (discrete), raw (Manual)
    np.testing.assert_array_equal(after[:, 6:10], x[:, 6:10])
    # the Encoding MLP now sees standardised inputs: same as the original fed with z
    expected_enc = evaluate(encoder.layers[4], z[:, 10:12].astype(np.float32))  # type: ignore[union-attr]
    np.testing.assert_allclose(after[:, 10:], expected_enc, rtol=0, atol=1e-5)
    # the stored values are −μ/σ and 1/σ (spec §6.3), the input is untouched
    pos = written.layers[0]  # type: ignore[union-attr]
    assert isinstance(pos, Denormalize)
    np.testing.assert_allclose(pos.mean, [-2.0, 25.0], rtol=1e-6)
    np.testing.assert_allclose(pos.std, [0.02, 0.5], rtol=1e-6)
    assert encoder.layers[0].mean.tolist() == [0.0, 0.0]  # type: ignore[union-attr]
    # the trainable MLP is carried over unchanged
    assert written.layers[4].layers[1] is encoder.layers[4].layers[1]  # type: ignore[union-attr]


def test_root_continuous_is_the_denormalize() -> None:
    schema = parse_schema(cont(3, "AutoPerDimension"), "observation")
    written = write_encoder_normalization(ident(3), schema, [1.0, 2.0, 3.0], [2.0, 4.0, 8.0])
    x = RNG.standard_normal((5, 3)).astype(np.float32)
    np.testing.assert_allclose(evaluate(written, x), (x - [1, 2, 3]) / [2, 4, 8], rtol=0, atol=1e-6)


def test_array_elements_with_different_statistics_are_refused() -> None:
    mean, std = obs_stats()
    mean[4] = 70.0
    with pytest.raises(ValueError, match="Array elements 0 and 1"):
        write_encoder_normalization(obs_encoder(), OBS_SCHEMA, mean, std)


@pytest.mark.parametrize(
    ("encoder", "message"),
    [
        (
            Concat(
                (2, 4, 3, 1, 2),
                (2, 4, 3, 1, 2),
                (linear(2, 2), Array(2, 2, 2, ident(2)), ident(3), ident(1), ident(2)),
            ),
            "pos",
        ),
        (
            Concat((6, 3, 1, 2), (6, 3, 1, 2), (ident(6), ident(3), ident(1), ident(2))),
            "Concat with input sizes",
        ),
        (
            Concat((2, 4, 3, 1, 2), (2, 4, 3, 1, 2), (ident(2), ident(4), ident(3), ident(1), ident(2))),
            "items",
        ),
        (ident(12), "And"),
    ],
)
def test_unexpected_encoder_layouts_raise_layout_mismatch(encoder: Layer, message: str) -> None:
    mean, std = obs_stats()
    with pytest.raises(LayoutMismatch, match=message):
        write_encoder_normalization(encoder, OBS_SCHEMA, mean, std)
    assert issubclass(LayoutMismatch, Unsupported)


def test_a_subtree_without_auto_leaves_is_kept_whatever_its_layers() -> None:
    schema = parse_schema(
        {
            "Type": "And",
            "VectorSize": 3,
            "EncodedSize": 3,
            "Elements": {"a": cont(1, "AutoShared", 0), "b": cont(2, "Manual", 1)},
        },
        "observation",
    )
    exotic = Sequence((linear(2, 2), ELU(2)))
    encoder = Concat((1, 2), (1, 2), (ident(1), exotic))
    written = write_encoder_normalization(encoder, schema, [5.0, 0.0, 0.0], [2.0, 1.0, 1.0])
    assert written.layers[1] is exotic  # type: ignore[union-attr]


def test_statistics_must_match_the_schema_width_and_be_positive() -> None:
    with pytest.raises(ValueError):
        write_encoder_normalization(obs_encoder(), OBS_SCHEMA, np.zeros(11), np.ones(11))
    mean, std = obs_stats()
    std[0] = 0.0
    with pytest.raises(ValueError):
        write_encoder_normalization(obs_encoder(), OBS_SCHEMA, mean, std)


# --------------------------------------------------------------------------------------------------
# Decoder

ACT_SCHEMA = parse_schema(
    {
        "Type": "And",
        "VectorSize": 3,
        "EncodedSize": 6,
        "DistributionSize": 6,
        "ModifierSize": 1 + 3 + 5,
        "Elements": {
            "move": cont(2, "AutoPerDimension", 0, "action"),
            "turn": cont(1, "AutoShared", 1, "action"),
        },
    },
    "action",
)
ACT_MEAN = np.array([-3.0, 1.0, 10.0])
ACT_STD = np.array([7.0, 0.5, 2.0])


@pytest.mark.parametrize("chunk", [1, 2, 3])
def test_written_engine_decoder_maps_normalised_chunks_to_raw_actions(chunk: int) -> None:
    # The engine's layout (spec §11 item 5): leaf-major, each leaf a Denormalize(Num·C).
    decoder = build_decoder(ACT_SCHEMA, chunk)
    written = write_decoder_denormalization(decoder, ACT_SCHEMA, chunk, ACT_MEAN, ACT_STD)
    layout = ChunkLayout.from_schema(ACT_SCHEMA, chunk)
    x = RNG.standard_normal((16, 3 * chunk)).astype(np.float32)
    expected = x * layout.to_engine(np.tile(ACT_STD, chunk)) + layout.to_engine(np.tile(ACT_MEAN, chunk))
    np.testing.assert_allclose(evaluate(written, x), expected, rtol=0, atol=1e-5)
    assert type(written) is type(decoder)


def test_written_engine_decoder_of_an_array_shares_the_element_statistics() -> None:
    schema = parse_schema(
        {
            "Type": "Array",
            "VectorSize": 4,
            "EncodedSize": 8,
            "DistributionSize": 8,
            "ModifierSize": 9,
            "Num": 2,
            "Element": cont(2, "AutoPerDimension", role="action"),
        },
        "action",
    )
    written = write_decoder_denormalization(
        build_decoder(schema, 3), schema, 3, [1.0, 2.0, 1.0, 2.0], [3.0, 4.0, 3.0, 4.0]
    )
    assert isinstance(written, Array) and isinstance(written.layer, Denormalize)
    assert written.layer.mean.tolist() == [1, 2] * 3 and written.layer.std.tolist() == [3, 4] * 3


def test_flat_chunked_decoder_for_a_continuous_root() -> None:
    schema = parse_schema(cont(2, "AutoPerDimension", role="action"), "action")
    written = write_decoder_denormalization(ident(6), schema, 3, [1.0, 2.0], [3.0, 4.0])
    assert isinstance(written, Denormalize)
    assert written.mean.tolist() == [1, 2, 1, 2, 1, 2] and written.std.tolist() == [3, 4, 3, 4, 3, 4]


def test_decoder_encoding_adds_no_layer_and_manual_leaves_keep_their_values() -> None:
    schema = parse_schema(
        {
            "Type": "And",
            "VectorSize": 3,
            "EncodedSize": 6,
            "DistributionSize": 6,
            "ModifierSize": 1 + 3 + 5,
            "Elements": {
                "a": {
                    "Type": "Encoding",
                    "VectorSize": 2,
                    "EncodedSize": 4,
                    "DistributionSize": 4,
                    "ModifierSize": 5,
                    "EncodingSize": 8,
                    "EncodingDepth": 1,
                    "ActivationFunction": "ELU",
                    "Element": cont(2, "AutoShared", role="action"),
                    "Index": 0,
                },
                "b": cont(1, "Manual", 1, "action"),
            },
        },
        "action",
    )
    kept = denorm([5.0], [9.0])
    written = write_decoder_denormalization(
        Concat((2, 1), (2, 1), (ident(2), kept)), schema, 1, ACT_MEAN, ACT_STD
    )
    assert written.layers[0].mean.tolist() == [-3.0, 1.0]  # type: ignore[union-attr]
    assert written.layers[1] is kept  # type: ignore[union-attr]


def test_null_observation_leaves_keep_their_zero_width_layer() -> None:
    schema = parse_schema(
        {
            "Type": "And",
            "VectorSize": 1,
            "EncodedSize": 1,
            "Elements": {
                "a": cont(1, "AutoShared", 0),
                "n": {"Type": "Null", "VectorSize": 0, "EncodedSize": 0, "Index": 1},
            },
        },
        "observation",
    )
    placeholder = Copy(0)
    written = write_encoder_normalization(
        Concat((1, 0), (1, 0), (ident(1), placeholder)), schema, [3.0], [2.0]
    )
    assert isinstance(written, Concat) and written.layers[1] is placeholder
    np.testing.assert_allclose(evaluate(written, np.array([[5.0]], np.float32)), [[1.0]], rtol=1e-6)


@pytest.mark.parametrize(
    ("chunk", "decoder"),
    [
        (3, Array(3, 3, 3, Concat((2, 1), (2, 1), (ident(2), ident(1))))),  # step-major: not the engine's
        (3, Concat((4, 5), (4, 5), (ident(4), ident(5)))),
        (2, ident(6)),  # wrong width
        (1, Sequence((linear(3, 3),))),
    ],
    ids=["step-major-array", "wrong-concat", "one-denormalize", "linear"],
)
def test_unexpected_decoder_layouts_raise_layout_mismatch(chunk: int, decoder: Layer) -> None:
    with pytest.raises(LayoutMismatch):
        write_decoder_denormalization(decoder, ACT_SCHEMA, chunk, ACT_MEAN, ACT_STD)


# --------------------------------------------------------------------------------------------------
# Element-wise affine maps


def check_affine(layer: Layer) -> None:
    affine = elementwise_affine(layer)
    assert affine is not None
    x = RNG.standard_normal((8, layer.input_size)).astype(np.float32)
    np.testing.assert_allclose(evaluate(layer, x), x * affine.scale + affine.shift, rtol=1e-6, atol=1e-5)


def test_affine_maps_compose_concatenate_and_tile() -> None:
    check_affine(denorm([1.0, -2.0], [3.0, 0.5]))
    check_affine(Normalize(2, np.array([1.0, -2.0], np.float32), np.array([3.0, 0.5], np.float32)))
    check_affine(Copy(3))
    check_affine(
        Sequence(
            (
                denorm([1.0, 2.0], [2.0, 3.0]),
                Normalize(2, np.array([4.0, 5.0], np.float32), np.array([0.5, 2.0], np.float32)),
                Copy(2),
            )
        )
    )
    check_affine(Concat((2, 1), (2, 1), (denorm([1.0, 2.0], [2.0, 3.0]), Copy(1))))
    check_affine(Array(3, 2, 2, Sequence((denorm([1.0, 2.0], [2.0, 3.0]), denorm([-1.0, 0.0], [4.0, 1.0])))))
    affine = elementwise_affine(Array(2, 1, 1, denorm([5.0], [2.0])))
    assert affine is not None and affine.scale.tolist() == [2.0, 2.0] and affine.shift.tolist() == [5.0, 5.0]


@pytest.mark.parametrize(
    ("layer", "name"),
    [
        (Sequence((ident(3), linear(3, 3))), "Linear"),
        (Concat((2, 1), (2, 1), (ident(2), ELU(1))), "ELU"),
        (Array(2, 2, 2, Sequence((ident(2), ELU(2)))), "ELU"),
        (Normalize(1, np.zeros(1, np.float32), np.zeros(1, np.float32)), "Normalize"),
    ],
)
def test_non_affine_decoders_are_unsupported_naming_the_layer(layer: Layer, name: str) -> None:
    assert elementwise_affine(layer) is None
    with pytest.raises(Unsupported, match=f"contains a {name}"):
        require_elementwise_affine(layer, "decoder")


# --------------------------------------------------------------------------------------------------
# Denoiser folds


def denoiser(n_in: int, hidden: int, n_out: int) -> Sequence:
    body = Sequence(
        (linear(n_in, hidden), ELU(hidden), linear(hidden, hidden), ELU(hidden), linear(hidden, n_out))
    )
    return Sequence((body, ident(n_out)))


def first_linear(layer: Layer) -> Linear:
    while isinstance(layer, Sequence):
        layer = layer.layers[0]
    assert isinstance(layer, Linear)
    return layer


def test_fold_input_affine_is_exact() -> None:
    net = denoiser(6, 16, 3)
    shift = np.array([100.0, -3.0, 0.5, 20.0, 0.0, 0.0])
    scale = np.array([50.0, 7.0, 0.1, 3.0, 1.0, 2.0])
    folded = fold_input_affine(net, shift, scale)
    x = (shift + scale * RNG.standard_normal((128, 6))).astype(np.float32)
    z = ((x - shift) / scale).astype(np.float32)
    np.testing.assert_allclose(evaluate(folded, x), evaluate(net, z), rtol=0, atol=1e-5)
    # only the first Linear changed
    assert isinstance(folded, Sequence)
    assert folded.layers[0].layers[2] is net.layers[0].layers[2]  # type: ignore[union-attr]
    assert folded.layers[1] is net.layers[1]


def test_fold_then_inverse_fold_restores_the_weights() -> None:
    net = denoiser(4, 8, 2)
    shift, scale = np.array([1.0, 2.0, 3.0, 0.0]), np.array([2.0, 4.0, 0.5, 1.0])
    back = fold_input_affine(fold_input_affine(net, shift, scale), -shift / scale, 1.0 / scale)
    first, orig = first_linear(back), first_linear(net)
    np.testing.assert_allclose(first.weights, orig.weights, rtol=1e-6)
    np.testing.assert_allclose(first.bias, orig.bias, rtol=0, atol=1e-6)


def test_fold_refuses_bad_shapes_zero_scales_and_non_linear_first_layers() -> None:
    net = denoiser(4, 8, 2)
    with pytest.raises(ValueError):
        fold_input_affine(net, np.zeros(3), np.ones(3))
    with pytest.raises(ValueError):
        fold_input_affine(net, np.zeros(4), np.array([1.0, 0.0, 1.0, 1.0]))
    with pytest.raises(LayoutMismatch, match="first layer"):
        fold_input_affine(Sequence((Sequence((ELU(4), linear(4, 2))), ident(2))), np.zeros(4), np.ones(4))


def test_set_output_denormalize_writes_the_final_layer() -> None:
    net = denoiser(4, 8, 2)
    out = set_output_denormalize(net, [1.0, -2.0], [3.0, 0.5])
    x = RNG.standard_normal((10, 4)).astype(np.float32)
    np.testing.assert_allclose(
        evaluate(out, x), evaluate(net, x) * [3.0, 0.5] + [1.0, -2.0], rtol=0, atol=1e-5
    )
    assert output_denormalize(out).mean.tolist() == [1.0, -2.0]
    with pytest.raises(ValueError):
        set_output_denormalize(net, [1.0], [1.0])
    with pytest.raises(LayoutMismatch, match="ending in a Sequence"):
        output_denormalize(Sequence((net.layers[0],)))
    with pytest.raises(LayoutMismatch):
        output_denormalize(linear(2, 2))
