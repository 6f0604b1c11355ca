"""The emulator's network builder (spec §6.3, §10 items 1-4) and the engine inference path (§6.4)."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emulator.inference import EnginePolicy
from protocol.cityhash import city_hash32, denoiser_compatibility_hash, to_int32
from protocol.engine.chunks import ChunkLayout
from protocol.engine.networks import (
    DENOISER_SEED_SALT,
    ENCODER_SEED_SALT,
    UnsupportedSchemaError,
    build_decoder,
    build_denoiser,
    build_encoder,
    build_flow_matching_networks,
    kaiming_uniform_linear,
    network_rng,
    schema_hash_stand_in,
)
from protocol.errors import ConfigError
from protocol.nne.codec import layers_equal, model_byte_size
from protocol.nne.layers import (
    ELU,
    GELU,
    Array,
    Concat,
    Copy,
    Denormalize,
    Layer,
    Linear,
    ReLU,
    Sequence,
    TanH,
)
from protocol.nne.reference import evaluate
from protocol.schema import parse_schema
from protocol.snapshot import read_snapshot, write_snapshot
from tests.support.schemas import cont

# --------------------------------------------------------------------------------------------------
# Schemas


def _obs_continuous(
    num: int, index: int | None = None, normalization: str = "AutoPerDimension"
) -> dict[str, Any]:
    node: dict[str, Any] = {
        "VectorSize": num,
        "EncodedSize": num,
        "Type": "Continuous",
        "Num": num,
        "Normalization": normalization,
    }
    if index is not None:
        node["Index"] = index
    return node


# And{ Items: Array[3]{ And{ Pos: Continuous(2), Kind: DiscreteExclusive(3) } }, Speed: Continuous(4) }.
# "Speed" comes first in the JSON object but has Index 1: the builder must follow Index, not key order.
NESTED_OBS: dict[str, Any] = {
    "VectorSize": 19,
    "EncodedSize": 19,
    "Type": "And",
    "Elements": {
        "Speed": _obs_continuous(4, index=1, normalization="Manual"),
        "Items": {
            "VectorSize": 15,
            "EncodedSize": 15,
            "Type": "Array",
            "Num": 3,
            "Index": 0,
            "Element": {
                "VectorSize": 5,
                "EncodedSize": 5,
                "Type": "And",
                "Elements": {
                    "Kind": {
                        "VectorSize": 3,
                        "EncodedSize": 3,
                        "Type": "DiscreteExclusive",
                        "Num": 3,
                        "Index": 1,
                    },
                    "Pos": _obs_continuous(2, index=0),
                },
            },
        },
    },
}

# And{ Move: Continuous(2), Look: Continuous(3) } as an action (ModifierSize = 1 + Σ children).
AND_ACTION: dict[str, Any] = {
    "VectorSize": 5,
    "DistributionSize": 10,
    "EncodedSize": 10,
    "ModifierSize": 1 + 5 + 7,
    "Type": "And",
    "Elements": {"Move": cont(2, index=0, role="action"), "Look": cont(3, index=1, role="action")},
}


def _is_identity_denormalize(layer: Layer, size: int) -> bool:
    return (
        isinstance(layer, Denormalize)
        and layer.size == size
        and np.array_equal(layer.mean, np.zeros(size, np.float32))
        and np.array_equal(layer.std, np.ones(size, np.float32))
    )


# --------------------------------------------------------------------------------------------------
# Encoder


def test_nested_encoder_layer_tree() -> None:
    encoder = build_encoder(parse_schema(NESTED_OBS, "observation"), np.random.default_rng(0))
    assert isinstance(encoder, Concat)
    assert encoder.input_sizes == (15, 4)
    assert encoder.output_sizes == (15, 4)
    items, speed = encoder.layers
    assert _is_identity_denormalize(speed, 4)
    assert isinstance(items, Array)
    assert (items.element_num, items.element_input_size, items.element_output_size) == (3, 5, 5)
    inner = items.layer
    assert isinstance(inner, Concat)
    assert inner.input_sizes == (2, 3) and inner.output_sizes == (2, 3)
    assert _is_identity_denormalize(inner.layers[0], 2)
    assert _is_identity_denormalize(inner.layers[1], 3)
    assert (encoder.input_size, encoder.output_size) == (19, 19)


def test_root_continuous_encoder_is_the_denormalize_itself() -> None:
    encoder = build_encoder(parse_schema(_obs_continuous(3), "observation"), np.random.default_rng(0))
    assert _is_identity_denormalize(encoder, 3)


def test_manual_normalization_still_gets_identity_slot() -> None:
    # §10 item 2: mean 0 / std 1 whatever the Normalization option.
    encoder = build_encoder(
        parse_schema(_obs_continuous(2, normalization="Manual"), "observation"), np.random.default_rng(0)
    )
    assert _is_identity_denormalize(encoder, 2)


def test_null_element_is_zero_width_copy() -> None:
    schema = {
        "VectorSize": 2,
        "EncodedSize": 2,
        "Type": "And",
        "Elements": {
            "Nothing": {"VectorSize": 0, "EncodedSize": 0, "Type": "Null", "Index": 0},
            "X": _obs_continuous(2, 1),
        },
    }
    encoder = build_encoder(parse_schema(schema, "observation"), np.random.default_rng(0))
    assert isinstance(encoder, Concat)
    assert encoder.input_sizes == (0, 2)
    assert isinstance(encoder.layers[0], Copy) and encoder.layers[0].size == 0


def test_encoding_node_is_sequence_of_sub_and_mlp_with_final_activation() -> None:
    schema = {
        "VectorSize": 3,
        "EncodedSize": 8,
        "Type": "Encoding",
        "EncodingSize": 8,
        "LayerNum": 2,
        "ActivationFunction": "TanH",
        "Element": _obs_continuous(3),
    }
    encoder = build_encoder(parse_schema(schema, "observation"), np.random.default_rng(0))
    assert isinstance(encoder, Sequence) and len(encoder.layers) == 2
    sub, head = encoder.layers
    assert _is_identity_denormalize(sub, 3)
    assert isinstance(head, Sequence)
    # LayerNum + 1 = 3 linears, each followed by the activation (the last one too).
    kinds = [type(layer) for layer in head.layers]
    assert kinds == [Linear, TanH, Linear, TanH, Linear, TanH]
    sizes = [(layer.input_size, layer.output_size) for layer in head.layers if isinstance(layer, Linear)]
    assert sizes == [(3, 8), (8, 8), (8, 8)]


def test_encoding_node_defaults_to_one_hidden_layer_elu() -> None:
    schema = {
        "VectorSize": 2,
        "EncodedSize": 4,
        "Type": "Encoding",
        "EncodingSize": 4,
        "Element": _obs_continuous(2),
    }
    encoder = build_encoder(parse_schema(schema, "observation", warnings=[]), np.random.default_rng(0))
    assert isinstance(encoder, Sequence)
    head = encoder.layers[1]
    assert isinstance(head, Sequence)
    assert [type(layer) for layer in head.layers] == [Linear, ELU, Linear, ELU]


@pytest.mark.parametrize(
    ("node_type", "extra"),
    [
        ("OrExclusive", {"EncodingSize": 4, "Elements": {"A": _obs_continuous(2, 0)}}),
        (
            "Set",
            {
                "MaxNum": 2,
                "AttentionEncodingSize": 4,
                "AttentionHeadNum": 1,
                "ValueEncodingSize": 4,
                "Element": _obs_continuous(2),
            },
        ),
        ("Sparse", {"Num": 3}),
    ],
)
def test_unsupported_encoder_types_raise(node_type: str, extra: dict[str, Any]) -> None:
    schema = {"VectorSize": 3, "EncodedSize": 4, "Type": node_type, **extra}
    node = parse_schema(schema, "observation")
    with pytest.raises(UnsupportedSchemaError, match=f"cannot build the encoder for its {node_type}") as info:
        build_encoder(node, np.random.default_rng(0))
    assert (info.value.network, info.value.element_type, info.value.path) == (
        "encoder",
        node_type,
        "ObservationSchema",
    )


def test_an_unsupported_element_deep_in_the_schema_is_named_by_its_path() -> None:
    schema = {
        "VectorSize": 5,
        "EncodedSize": 6,
        "Type": "And",
        "Elements": {
            "Speed": _obs_continuous(2, 0),
            "Cells": {"VectorSize": 3, "EncodedSize": 4, "Type": "Sparse", "Num": 3, "Index": 1},
        },
    }
    with pytest.raises(UnsupportedSchemaError) as info:
        build_flow_matching_networks(
            parse_schema(schema, "observation"), parse_schema(cont(2, role="action"), "action")
        )
    assert isinstance(info.value, ConfigError)  # the trainer's exit-code mapping: bad data
    assert (info.value.element_type, info.value.path) == ("Sparse", "ObservationSchema.Elements.Cells")
    assert "ObservationSchema.Elements.Cells" in str(info.value) and "Sparse" in str(info.value)


def test_an_unknown_schema_type_is_refused_by_both_builders() -> None:
    obs = parse_schema({"VectorSize": 2, "EncodedSize": 2, "Type": "Quaternion"}, "observation", warnings=[])
    act = parse_schema(
        {"VectorSize": 2, "DistributionSize": 4, "EncodedSize": 4, "ModifierSize": 5, "Type": "Quaternion"},
        "action",
        warnings=[],
    )
    with pytest.raises(UnsupportedSchemaError, match="Quaternion"):
        build_encoder(obs, np.random.default_rng(0))
    with pytest.raises(UnsupportedSchemaError, match="Quaternion") as info:
        build_decoder(act)
    assert (info.value.network, info.value.path) == ("decoder", "ActionSchema")


def test_an_or_action_with_a_presence_mask_is_refused() -> None:
    schema = {
        "VectorSize": 3,
        "DistributionSize": 4,
        "EncodedSize": 4,
        "ModifierSize": 6,
        "Type": "OrExclusive",
        "Elements": {"A": cont(2, index=0, role="action")},
    }
    with pytest.raises(UnsupportedSchemaError, match="presence mask") as info:
        build_decoder(parse_schema(schema, "action", warnings=[]))
    assert info.value.element_type == "OrExclusive"


# --------------------------------------------------------------------------------------------------
# Decoder


def test_decoder_reads_vector_size_not_encoded_size() -> None:
    # §10 item 4: a Continuous action's EncodedSize is 2·Num, but the decoder works on the action vector.
    decoder = build_decoder(parse_schema(cont(2, role="action"), "action"))
    assert _is_identity_denormalize(decoder, 2)


def test_and_action_decoder_is_concat_of_vector_sizes() -> None:
    decoder = build_decoder(parse_schema(AND_ACTION, "action"))
    assert isinstance(decoder, Concat)
    assert decoder.input_sizes == (2, 3) and decoder.output_sizes == (2, 3)
    assert _is_identity_denormalize(decoder.layers[0], 2)
    assert _is_identity_denormalize(decoder.layers[1], 3)


@pytest.mark.parametrize("chunk", [2, 4, 8])
def test_chunked_decoder_is_leaf_major_as_the_engine_builds_it(chunk: int) -> None:
    # Spec §11 item 5: each leaf a Denormalize(Num·C), the And a Concat of those.
    decoder = build_decoder(parse_schema(AND_ACTION, "action"), chunk)
    assert isinstance(decoder, Concat)
    assert decoder.input_sizes == decoder.output_sizes == (2 * chunk, 3 * chunk)
    assert _is_identity_denormalize(decoder.layers[0], 2 * chunk)
    assert _is_identity_denormalize(decoder.layers[1], 3 * chunk)
    assert decoder.input_size == decoder.output_size == 5 * chunk


def test_chunked_array_decoder_builds_its_element_with_the_chunk() -> None:
    # Array -> Array(Num, element built with C): each array element reads C steps of its own values.
    schema = parse_schema(
        {
            "VectorSize": 6,
            "DistributionSize": 12,
            "EncodedSize": 12,
            "ModifierSize": 13,
            "Type": "Array",
            "Num": 3,
            "Element": cont(2, role="action"),
        },
        "action",
    )
    decoder = build_decoder(schema, 4)
    assert isinstance(decoder, Array)
    assert (decoder.element_num, decoder.element_input_size, decoder.element_output_size) == (3, 8, 8)
    assert _is_identity_denormalize(decoder.layer, 8)


@pytest.mark.parametrize("chunk", [0, -1])
def test_chunk_size_below_one_is_refused(chunk: int) -> None:
    with pytest.raises(ConfigError):
        build_decoder(parse_schema(cont(2, role="action"), "action"), chunk)


# --------------------------------------------------------------------------------------------------
# Denoiser and initialisation


@pytest.mark.parametrize("hidden_layer_num", [0, 1, 3])
@pytest.mark.parametrize(("name", "kind"), [("ELU", ELU), ("ReLU", ReLU), ("TanH", TanH), ("GELU", GELU)])
def test_denoiser_structure(hidden_layer_num: int, name: str, kind: type) -> None:
    denoiser = build_denoiser(6, 4, hidden_layer_num, 16, name, np.random.default_rng(0))
    assert isinstance(denoiser, Sequence) and len(denoiser.layers) == 2
    body, tail = denoiser.layers
    assert _is_identity_denormalize(tail, 4)
    assert isinstance(body, Sequence)
    linears = [layer for layer in body.layers if isinstance(layer, Linear)]
    assert len(linears) == hidden_layer_num + 2
    assert len(body.layers) == 2 * len(linears) - 1  # activation between linears, none after the last
    assert isinstance(body.layers[-1], Linear)
    assert all(isinstance(layer, kind) for layer in body.layers[1::2])
    sizes = [(layer.input_size, layer.output_size) for layer in linears]
    assert sizes == [(6 + 4 + 1, 16)] + [(16, 16)] * hidden_layer_num + [(16, 4)]


def test_unknown_activation_is_refused() -> None:
    with pytest.raises(ConfigError) as info:
        build_denoiser(2, 2, 1, 8, "Swish", np.random.default_rng(0))
    assert info.value.field == "ActivationFunction"


@pytest.mark.parametrize(("field", "args"), [("ActDim", (2, 0, 1, 8)), ("HiddenLayerSize", (2, 2, 1, 0))])
def test_denoiser_sizes_are_checked(field: str, args: tuple[int, int, int, int]) -> None:
    with pytest.raises(ConfigError, match=field):
        build_denoiser(*args, "ELU", np.random.default_rng(0))


@pytest.mark.parametrize(("fan_in", "fan_out"), [(5, 256), (256, 256), (256, 2), (64, 1)])
def test_kaiming_uniform_bounds(fan_in: int, fan_out: int) -> None:
    # §10 item 3: weights U(±1/sqrt(In)), biases U(±1/sqrt(Out)).
    layer = kaiming_uniform_linear(fan_in, fan_out, np.random.default_rng(1))
    assert layer.weights.dtype == np.float32 and layer.bias.dtype == np.float32
    w_bound, b_bound = 1 / np.sqrt(fan_in), 1 / np.sqrt(fan_out)
    assert np.abs(layer.weights).max() <= w_bound
    assert np.abs(layer.bias).max() <= b_bound
    if fan_in * fan_out >= 256:
        assert np.abs(layer.weights).max() > 0.9 * w_bound  # spread over the whole interval
        assert layer.weights.min() < 0 < layer.weights.max()


def test_seed_salts_select_the_streams() -> None:
    a = network_rng(1234, DENOISER_SEED_SALT).random(4)
    b = np.random.default_rng(1234 ^ 0x69315BF9).random(4)
    assert np.array_equal(a, b)
    c = network_rng(1234, ENCODER_SEED_SALT).random(4)
    assert np.array_equal(c, np.random.default_rng(1234 ^ 0x658868DD).random(4))
    assert network_rng(-1, DENOISER_SEED_SALT).random() >= 0  # negative seeds are masked to uint32


# --------------------------------------------------------------------------------------------------
# Snapshots


def _networks(chunk: int = 1, seed: int = 1234) -> Any:
    return build_flow_matching_networks(
        parse_schema(NESTED_OBS, "observation"),
        parse_schema(AND_ACTION, "action"),
        chunk_size=chunk,
        hidden_layer_num=1,
        hidden_layer_size=32,
        activation="ELU",
        seed=seed,
    )


@pytest.mark.parametrize("chunk", [1, 4])
def test_headers(chunk: int) -> None:
    nets = _networks(chunk)
    act_dim = 5 * chunk
    d, e, o = nets.denoiser.header, nets.encoder.header, nets.decoder.header
    assert (d.input_size, d.output_size) == (19 + act_dim + 1, act_dim)
    assert d.compatibility_hash == denoiser_compatibility_hash(19, act_dim)
    assert d.compatibility_hash == to_int32(city_hash32(struct.pack("<iii", 19, act_dim, 1)))
    assert (e.input_size, e.output_size) == (19, 19)
    assert (o.input_size, o.output_size) == (act_dim, act_dim)
    assert e.compatibility_hash == schema_hash_stand_in(parse_schema(NESTED_OBS, "observation"))
    assert o.compatibility_hash == schema_hash_stand_in(parse_schema(AND_ACTION, "action"))


def test_b1_denoiser_hash_golden() -> None:
    # B1: EncodedObsSize 2, ActDim 2 -> the reference CityHash32 of the triple (see test_cityhash).
    from emulator.tasks import bimodal

    nets = build_flow_matching_networks(
        parse_schema(bimodal.OBSERVATION_SCHEMA, "observation"), parse_schema(bimodal.ACTION_SCHEMA, "action")
    )
    assert nets.denoiser.header.compatibility_hash == -2070982371
    assert (nets.denoiser.header.input_size, nets.denoiser.header.output_size) == (5, 2)
    # Engine defaults: HiddenLayerNum 1, HiddenLayerSize 128.
    root = nets.denoiser.model
    assert isinstance(root, Sequence)
    body = root.layers[0]
    assert isinstance(body, Sequence)
    assert [(lin.input_size, lin.output_size) for lin in body.layers if isinstance(lin, Linear)] == [
        (5, 128),
        (128, 128),
        (128, 2),
    ]


def test_snapshot_bytes_size_and_round_trip() -> None:
    nets = _networks(2)
    for snapshot, raw in zip(nets.in_id_order(), nets.to_bytes(), strict=True):
        assert snapshot.header.file_data_size == model_byte_size(snapshot.model)
        assert len(raw) == 24 + model_byte_size(snapshot.model)
        assert raw == write_snapshot(snapshot)
        back = read_snapshot(raw)
        assert back.header == snapshot.header
        assert layers_equal(back.model, snapshot.model)


def test_same_seed_same_bytes_other_seed_other_weights() -> None:
    assert _networks(seed=7).to_bytes() == _networks(seed=7).to_bytes()
    a, b = _networks(seed=7).to_bytes(), _networks(seed=8).to_bytes()
    assert a[0] != b[0] and len(a[0]) == len(b[0])
    assert a[2] == b[2]  # the decoder has no random weights


def test_schema_hash_stand_in_is_stable_and_discriminates() -> None:
    node = parse_schema(NESTED_OBS, "observation")
    assert schema_hash_stand_in(node) == schema_hash_stand_in(parse_schema(NESTED_OBS, "observation"))
    assert schema_hash_stand_in(node) != schema_hash_stand_in(
        parse_schema(_obs_continuous(19), "observation")
    )
    assert -(2**31) <= schema_hash_stand_in(node) < 2**31


# --------------------------------------------------------------------------------------------------
# Inference (t = 0 noise, t = 1 data, explicit Euler)


def _linear(weights: np.ndarray, bias: np.ndarray) -> Linear:
    w = np.asarray(weights, np.float32)
    return Linear(w.shape[0], w.shape[1], np.asarray(bias, np.float32), w)


def _policy(
    obs_dim: int,
    act_dim: int,
    weights: np.ndarray,
    bias: np.ndarray,
    steps: int,
    decoder: Layer | None = None,
) -> EnginePolicy:
    encoder = Denormalize(obs_dim, np.zeros(obs_dim, np.float32), np.ones(obs_dim, np.float32))
    denoiser = Sequence((_linear(weights, bias),))
    dec = decoder or Denormalize(act_dim, np.zeros(act_dim, np.float32), np.ones(act_dim, np.float32))
    return EnginePolicy(encoder, denoiser, dec, steps)


@pytest.mark.parametrize("steps", [1, 2, 4, 8, 16])
def test_constant_velocity_integrates_exactly(steps: int) -> None:
    velocity = np.array([0.5, -1.25, 3.0], np.float32)
    policy = _policy(2, 3, np.zeros((2 + 3 + 1, 3)), velocity, steps)
    x0 = np.array([[0.25, 1.0, -2.0], [0.0, 0.0, 0.0]], np.float32)
    out = policy.with_x0(np.ones((2, 2), np.float32), x0)
    assert np.array_equal(out, x0 + velocity)  # dyadic values and steps: exact in float32


def test_constant_velocity_with_non_dyadic_steps() -> None:
    velocity = np.array([0.3], np.float32)
    policy = _policy(1, 1, np.zeros((3, 1)), velocity, 10)
    out = policy.with_x0(np.zeros((1, 1), np.float32), np.array([[1.0]], np.float32))
    assert out[0, 0] == pytest.approx(1.3, abs=1e-6)


@pytest.mark.parametrize("steps", [1, 2, 8, 100])
def test_time_input_is_k_dt_starting_at_zero(steps: int) -> None:
    # v = t: x1 = x0 + Σ_k dt·(k·dt) = x0 + (N − 1) / (2N). (t = (k+1)·dt would give (N + 1) / (2N).)
    weights = np.zeros((1 + 1 + 1, 1))
    weights[2, 0] = 1.0
    policy = _policy(1, 1, weights, np.zeros(1), steps)
    out = policy.with_x0(np.zeros((1, 1), np.float32), np.zeros((1, 1), np.float32))
    assert out[0, 0] == pytest.approx((steps - 1) / (2 * steps), abs=1e-6)


def test_denoiser_input_order_is_latents_then_x_then_t() -> None:
    # v = latents − x over one step: x1 = x0 + (e − x0) = e, regardless of x0.
    weights = np.zeros((2 + 2 + 1, 2))
    weights[0:2, 0:2] = np.eye(2)
    weights[2:4, 0:2] = -np.eye(2)
    policy = _policy(2, 2, weights, np.zeros(2), 1)
    obs = np.array([[3.0, -4.0]], np.float32)
    out = policy.with_x0(obs, np.array([[100.0, 7.0]], np.float32))
    assert np.array_equal(out, obs)


def test_decoder_is_applied_to_the_final_state() -> None:
    decoder = Denormalize(2, np.array([1.0, -1.0], np.float32), np.array([2.0, 0.5], np.float32))
    policy = _policy(1, 2, np.zeros((1 + 2 + 1, 2)), np.zeros(2), 4, decoder)
    out = policy.with_x0(np.zeros((1, 1), np.float32), np.array([[3.0, 4.0]], np.float32))
    assert np.array_equal(out, np.array([[7.0, 1.0]], np.float32))


def test_act_draws_x0_from_the_rng() -> None:
    nets = _networks()
    policy = EnginePolicy(nets.encoder.model, nets.denoiser.model, nets.decoder.model, 4)
    obs = np.random.default_rng(0).standard_normal((3, 19)).astype(np.float32)
    x0 = np.random.default_rng(42).standard_normal((3, 5), dtype=np.float32)
    assert np.array_equal(policy.act(obs, np.random.default_rng(42)), policy.with_x0(obs, x0))
    assert np.array_equal(policy.bind(np.random.default_rng(42))(obs), policy.with_x0(obs, x0))


def test_chunked_actions_are_read_back_step_major_through_the_chunk_layout() -> None:
    nets = _networks(3)  # And(Move 2, Look 3), chunk 3: the decoder is leaf-major
    layout = ChunkLayout.from_schema(parse_schema(AND_ACTION, "action"), 3)
    policy = EnginePolicy(nets.encoder.model, nets.denoiser.model, nets.decoder.model, 2, layout)
    obs = np.random.default_rng(0).standard_normal((4, 19)).astype(np.float32)
    engine = policy.act(obs, np.random.default_rng(7))
    steps = policy.act_steps(obs, np.random.default_rng(7))
    assert steps.shape == (4, 3, 5)
    np.testing.assert_array_equal(steps[:, 1, :2], engine[:, 2:4])  # Move, step 1
    np.testing.assert_array_equal(steps[:, 1, 2:], engine[:, 9:12])  # Look, step 1
    np.testing.assert_array_equal(policy.bind(np.random.default_rng(7))(obs), steps.reshape(4, 15))
    with pytest.raises(ValueError, match="chunk_layout"):
        EnginePolicy(nets.encoder.model, nets.denoiser.model, nets.decoder.model, 2).act_steps(
            obs, np.random.default_rng(7)
        )


def test_from_snapshots_matches_the_layers() -> None:
    nets = _networks(2)
    denoiser, encoder, decoder = nets.to_bytes()
    a = EnginePolicy.from_snapshots(encoder, denoiser, decoder, 3)
    b = EnginePolicy(nets.encoder.model, nets.denoiser.model, nets.decoder.model, 3)
    obs = np.ones((2, 19), np.float32)
    x0 = np.zeros((2, 10), np.float32)
    assert np.array_equal(a.with_x0(obs, x0), b.with_x0(obs, x0))
    assert (a.obs_dim, a.act_dim) == (19, 10)


def test_bad_shapes_and_steps_are_refused() -> None:
    nets = _networks()
    with pytest.raises(ValueError, match="ode_steps"):
        EnginePolicy(nets.encoder.model, nets.denoiser.model, nets.decoder.model, 0)
    with pytest.raises(ValueError, match="ode_steps"):
        EnginePolicy(nets.encoder.model, nets.denoiser.model, nets.decoder.model, 101)
    with pytest.raises(ValueError, match="denoiser"):
        EnginePolicy(
            nets.encoder.model,
            nets.denoiser.model,
            build_decoder(parse_schema(cont(2, role="action"), "action")),
        )
    policy = EnginePolicy(nets.encoder.model, nets.denoiser.model, nets.decoder.model)
    with pytest.raises(ValueError, match="observations"):
        policy.act(np.zeros((2, 18), np.float32), np.random.default_rng(0))
    with pytest.raises(ValueError, match="x0"):
        policy.with_x0(np.zeros((2, 19), np.float32), np.zeros((2, 4), np.float32))


# --------------------------------------------------------------------------------------------------
# Property: an untrained encoder/decoder of Continuous/And/Array schemas is the identity map


def _schema_tree(role: str) -> Any:
    def leaf(num: int) -> dict[str, Any]:
        return _obs_continuous(num) if role == "observation" else cont(num, role="action")

    def wrap_and(children: list[dict[str, Any]]) -> dict[str, Any]:
        elements = {f"E{i}": {**child, "Index": i} for i, child in enumerate(children)}
        size = sum(child["VectorSize"] for child in children)
        node: dict[str, Any] = {"VectorSize": size, "EncodedSize": sum(c["EncodedSize"] for c in children)}
        if role == "action":
            node["DistributionSize"] = sum(c["DistributionSize"] for c in children)
            node["ModifierSize"] = 1 + sum(c["ModifierSize"] for c in children)
        node.update({"Type": "And", "Elements": elements})
        return node

    def wrap_array(args: tuple[int, dict[str, Any]]) -> dict[str, Any]:
        num, child = args
        node: dict[str, Any] = {
            "VectorSize": num * child["VectorSize"],
            "EncodedSize": num * child["EncodedSize"],
        }
        if role == "action":
            node["DistributionSize"] = num * child["DistributionSize"]
            node["ModifierSize"] = num * child["ModifierSize"]
        node.update({"Type": "Array", "Num": num, "Element": child})
        return node

    return st.recursive(
        st.integers(1, 4).map(leaf),
        lambda inner: (
            st.lists(inner, min_size=1, max_size=3).map(wrap_and)
            | st.tuples(st.integers(1, 3), inner).map(wrap_array)
        ),
        max_leaves=6,
    )


def test_fresh_encoder_and_decoder_are_identity_maps() -> None:
    """Invariant: for any Continuous/And/Array schema the engine-built encoder and decoder are identities."""

    @settings(max_examples=100, deadline=None)
    @given(_schema_tree("observation"), _schema_tree("action"))
    def check(obs_json: dict[str, Any], act_json: dict[str, Any]) -> None:
        obs = parse_schema(obs_json, "observation")
        act = parse_schema(act_json, "action")
        encoder = build_encoder(obs, np.random.default_rng(0))
        decoder = build_decoder(act, 2)
        assert (encoder.input_size, encoder.output_size) == (obs.vector_size, obs.encoded_size)
        assert decoder.input_size == decoder.output_size == 2 * act.vector_size
        x = np.random.default_rng(1).standard_normal((3, obs.vector_size)).astype(np.float32)
        assert np.array_equal(evaluate(encoder, x), x)
        y = np.random.default_rng(2).standard_normal((3, 2 * act.vector_size)).astype(np.float32)
        assert np.array_equal(evaluate(decoder, y), y)

    check()
