"""The three flow-matching networks, built as the engine builds them before training (spec §6.3, §10 items 1-4).

The game-side emulator sends these as the initial networks 0 (denoiser), 1 (encoder), 2 (decoder), and
``la-trainer record`` exports them for a recording, so the trainer sees the layer structure, sizes and
headers a real engine would send:

* **Denoiser** (velocity field): input ``[encoded obs (EncodedObsSize) ‖ x_t (ActDim) ‖ t (1)]``, output
  ``ActDim``. ``Sequence[Sequence[MLP], Denormalize(ActDim, 0, 1)]`` where the nested MLP has
  ``HiddenLayerNum + 2`` Linear layers with the activation between them and none after the last (§10 item 1).
* **Encoder**: the generic schema encoder: Continuous/Discrete leaves -> ``Denormalize(size, 0, 1)`` (an
  identity with a slot for normalisation), And -> Concat, Array -> Array, Encoding -> Sequence[sub, MLP],
  Null -> ``Copy(0)``. A root leaf *is* the Denormalize layer, with no wrapper (§10 item 2).
* **Decoder**: per action leaf ``Denormalize(VectorSize·C, 0, 1)``, And -> Concat, Array -> Array, Encoding
  adds no layer (§10 item 2); C = ActionChunkSize, so a chunk is leaf-major (§11 item 5,
  :mod:`protocol.engine.chunks`). Its input is the action's VectorSize·C (not EncodedSize, which is 2·Num
  for a Continuous action, §10 item 4).

Initialisation is the builder default, KaimingUniform (§10 item 3): weights ~ U(±1/sqrt(InputSize)), biases
~ U(±1/sqrt(OutputSize)), float32. Seeds are the trainer Seed XOR a per-network constant (§6.3) fed to
``numpy.random.default_rng``; the engine's own random stream is different, so the weights are *not*
bit-exact with the engine, only the structure, sizes and byte counts are (which is all a trainer may rely
on, §6.3).

What is built, per schema node type (spec §4.4 lists them all):

============================================  =====================================  ==================
node type                                     encoder                                decoder
============================================  =====================================  ==================
Null                                          Copy(0)                                Copy(0)
Continuous, (Named)Discrete{Ex,In}clusive     Denormalize                            Denormalize
And                                           Concat                                 Concat
Array                                         Array                                  Array
Encoding                                      Sequence[element, MLP]                 the element's
OrExclusive, OrInclusive                      refused                                Concat if mask-free
Set, Conv1d, Conv2d, Sparse, NamedSparse      refused                                (not action types)
a type this module does not know              refused                                refused
============================================  =====================================  ==================

A refused node raises :class:`UnsupportedSchemaError` (a :class:`~protocol.errors.ConfigError`) naming
the node's type, its path in the schema and the network. The engine builds Or/Set/Conv encoders from
Aggregate*/Conv* layers whose wiring the spec leaves [INF]; a builder that guessed it would produce
networks the engine never sends and test the trainer (or train a user's policy) against a guess.

Pure numpy: no torch here, so the game side that uses it stands apart from the trainer it tests.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from protocol.cityhash import city_hash32, denoiser_compatibility_hash, to_int32
from protocol.errors import ConfigError
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
from protocol.schema import SchemaNode, schema_to_json
from protocol.snapshot import Snapshot, make_snapshot, write_snapshot

__all__ = [
    "ACTIVATIONS",
    "DECODER_SEED_SALT",
    "DENOISER_SEED_SALT",
    "ENCODER_SEED_SALT",
    "FlowMatchingNetworks",
    "UnsupportedSchemaError",
    "activation_layer",
    "build_decoder",
    "build_denoiser",
    "build_encoder",
    "build_flow_matching_networks",
    "identity_denormalize",
    "kaiming_uniform_linear",
    "mlp",
    "network_rng",
    "schema_hash_stand_in",
]

ENCODER_SEED_SALT = 0x658868DD
"""Encoder init seed = trainer Seed XOR this (spec §6.3, §10)."""
DENOISER_SEED_SALT = 0x69315BF9
"""Denoiser init seed = trainer Seed XOR this."""
DECODER_SEED_SALT = 0x22312BF9
"""Decoder init seed = trainer Seed XOR this (the decoder has no random weights today, but the engine
derives a seed for it all the same)."""

ACTIVATIONS: Mapping[str, Callable[[int], Layer]] = {"ELU": ELU, "ReLU": ReLU, "TanH": TanH, "GELU": GELU}
"""``ActivationFunction`` strings of the model config (§4.3) -> the NNE activation layer."""

# Observation leaf types whose encoder is one Denormalize over the leaf's vector.
_OBS_LEAVES = frozenset(
    {
        "Continuous",
        "DiscreteExclusive",
        "DiscreteInclusive",
        "NamedDiscreteExclusive",
        "NamedDiscreteInclusive",
    }
)
_ACTION_LEAVES = _OBS_LEAVES


class UnsupportedSchemaError(ConfigError):
    """A schema node this builder cannot turn into the engine's layers (see the module's table).

    ``element_type`` is the node's ``Type``, ``path`` where it sits in the schema (e.g.
    ``ObservationSchema.Elements.Targets``) and ``network`` the network being built (``"encoder"`` or
    ``"decoder"``).
    """

    def __init__(self, network: str, element_type: str, path: str, reason: str) -> None:
        super().__init__(
            f"{path}: cannot build the {network} for its {element_type} schema element: {reason}", field=path
        )
        self.network = network
        self.element_type = element_type
        self.path = path


_GUESSED_SEMANTICS = (
    "the engine's layers for it are not documented (spec section 6.3 [INF]), so none is guessed"
)
_MASKED_OR = (
    "its vector holds a presence mask besides its elements' vectors, which a Concat of the elements' "
    "decoders cannot read, and the engine's layout for it is not documented (spec section 4.4 [INF])"
)

# [INF] The 5.8 observation Encoding JSON carries only EncodingSize (§4.4), yet the engine builds its
# MLP with a layer count and an activation. We read them when present (under the action schema's key
# names or "LayerNum") and otherwise use the defaults of the engine's Blueprint API (one hidden layer, ELU).
_DEFAULT_ENCODING_LAYER_NUM = 1
_DEFAULT_ENCODING_ACTIVATION = "ELU"


def network_rng(seed: int, salt: int) -> np.random.Generator:
    """The generator for one network's initial weights: ``default_rng((Seed XOR salt) mod 2^32)``.

    Not the engine's random stream (so not bit-exact), but deterministic per (seed, network).
    """
    return np.random.default_rng((seed ^ salt) & 0xFFFFFFFF)


def activation_layer(name: str, size: int) -> Layer:
    """The activation layer for a model-config ``ActivationFunction`` name (ELU, ReLU, TanH, GELU)."""
    factory = ACTIVATIONS.get(name)
    if factory is None:
        raise ConfigError(
            f"unknown activation function {name!r}",
            field="ActivationFunction",
            expected=tuple(ACTIVATIONS),
            actual=name,
        )
    return factory(size)


def kaiming_uniform_linear(input_size: int, output_size: int, rng: np.random.Generator) -> Linear:
    """A Linear layer with the engine builder's default init (§10 item 3).

    weights ``(input_size, output_size)`` ~ U(±1/sqrt(input_size)); bias ``(output_size,)`` ~
    U(±1/sqrt(output_size)) (fan-out for the bias, unlike PyTorch). Weights are drawn before the bias.
    """
    w_bound = 1.0 / np.sqrt(max(input_size, 1))
    b_bound = 1.0 / np.sqrt(max(output_size, 1))
    weights = rng.uniform(-w_bound, w_bound, size=(input_size, output_size)).astype(np.float32)
    bias = rng.uniform(-b_bound, b_bound, size=(output_size,)).astype(np.float32)
    return Linear(input_size, output_size, bias, weights)


def mlp(
    input_size: int,
    output_size: int,
    hidden_size: int,
    layer_num: int,
    activation: str,
    rng: np.random.Generator,
    *,
    activation_on_final_layer: bool = False,
) -> Sequence:
    """The builder's MLP helper: a Sequence of ``layer_num`` Linear layers (in -> H, H -> H, ..., H -> out)
    with ``activation`` after each one except, unless ``activation_on_final_layer``, the last.

    ``layer_num`` counts every Linear layer, input and output included (§6.3).
    """
    if layer_num < 1:
        raise ConfigError(
            "an MLP needs at least one Linear layer", field="LayerNum", expected=">= 1", actual=layer_num
        )
    layers: list[Layer] = []
    for i in range(layer_num):
        fan_in = input_size if i == 0 else hidden_size
        fan_out = output_size if i == layer_num - 1 else hidden_size
        layers.append(kaiming_uniform_linear(fan_in, fan_out, rng))
        if i < layer_num - 1 or activation_on_final_layer:
            layers.append(activation_layer(activation, fan_out))
    return Sequence(tuple(layers))


def identity_denormalize(size: int) -> Denormalize:
    """``Denormalize(size, mean 0, std 1)``: the identity slot that later holds normalisation (§6.3)."""
    return Denormalize(size, np.zeros(size, np.float32), np.ones(size, np.float32))


def _check_built(
    layer: Layer, node: SchemaNode, output_size: int, path: str, what: str, chunk: int = 1
) -> Layer:
    # The engine checks every built element against the schema sizes (UE_LEARNING_CHECKF); so do we, so
    # that an inconsistent schema fails here and not as a wrong-width layer deep inside the trainer.
    if layer.input_size != node.vector_size * chunk:
        times = f" x ActionChunkSize {chunk}" if chunk > 1 else ""
        raise ConfigError(
            f"{path}: the {what} reads {layer.input_size} floats but the schema's VectorSize{times} is "
            f"{node.vector_size * chunk}",
            field=f"{path}.VectorSize",
            expected=layer.input_size,
            actual=node.vector_size,
        )
    if layer.output_size != output_size:
        raise ConfigError(
            f"{path}: the {what} writes {layer.output_size} floats but the schema says {output_size}",
            field=path,
            expected=layer.output_size,
            actual=output_size,
        )
    return layer


def _int_param(node: SchemaNode, keys: tuple[str, ...], default: int, path: str) -> int:
    for key in keys:
        value = node.param(key)
        if value is not None:
            if not isinstance(value, int) or value < 0:
                raise ConfigError(
                    f"{path}.{key} must be a non-negative integer", field=f"{path}.{key}", actual=value
                )
            return value
    return default


def _str_param(node: SchemaNode, key: str, default: str) -> str:
    value = node.param(key)
    return value if isinstance(value, str) else default


def _encoder(node: SchemaNode, rng: np.random.Generator, path: str) -> Layer:
    t = node.type
    layer: Layer
    if t == "Null":
        # The engine's encoder builder makes a zero-width Copy for Null (a placeholder in Concat).
        layer = Copy(0)
    elif t in _OBS_LEAVES:
        # [INF] for Discrete*: the spec documents only Continuous (VectorSize = EncodedSize = Num); a
        # one-hot / multi-hot is passed through the same identity slot.
        layer = identity_denormalize(node.vector_size)
    elif t == "And":
        subs = tuple(_encoder(child, rng, f"{path}.Elements.{name}") for name, child in node.elements)
        layer = Concat(
            tuple(child.vector_size for _, child in node.elements),
            tuple(child.encoded_size for _, child in node.elements),
            subs,
        )
    elif t == "Array" and node.element is not None and node.num is not None:
        element = node.element
        layer = Array(
            node.num, element.vector_size, element.encoded_size, _encoder(element, rng, f"{path}.Element")
        )
    elif t == "Encoding" and node.element is not None:
        encoding_size = _int_param(node, ("EncodingSize",), node.encoded_size, path)
        layer_num = _int_param(node, ("LayerNum", "EncodingDepth"), _DEFAULT_ENCODING_LAYER_NUM, path)
        activation = _str_param(node, "ActivationFunction", _DEFAULT_ENCODING_ACTIVATION)
        sub = _encoder(node.element, rng, f"{path}.Element")
        head = mlp(
            node.element.encoded_size,
            encoding_size,
            encoding_size,
            layer_num + 1,  # the engine adds 1 for the input layer
            activation,
            rng,
            activation_on_final_layer=True,
        )
        layer = Sequence((sub, head))
    else:
        raise UnsupportedSchemaError("encoder", t, path, _GUESSED_SEMANTICS)
    return _check_built(layer, node, node.encoded_size, path, "encoder")


def build_encoder(obs_schema: SchemaNode, rng: np.random.Generator) -> Layer:
    """The observation encoder for ``obs_schema`` (input ObsVectorSize, output EncodedSize), spec §6.3.

    Raises :class:`UnsupportedSchemaError` for Or*/Set/Conv*/Sparse nodes and nodes of unknown types,
    and :class:`ConfigError` when the schema's sizes disagree with the layers they imply.
    """
    return _encoder(obs_schema, rng, "ObservationSchema")


def _decoder(node: SchemaNode, path: str, chunk: int) -> Layer:
    # The engine's MakeDenormalizerNetworkModelBuilderElementFromSchema: every leaf reads Num·C values,
    # containers pass C down, so a chunk is laid out leaf-major (protocol.engine.chunks).
    t = node.type
    layer: Layer
    if t == "Null":
        layer = Copy(0)
    elif t in _ACTION_LEAVES:
        layer = identity_denormalize(node.vector_size * chunk)
    elif t == "And" or (t in ("OrExclusive", "OrInclusive") and _or_without_mask(node)):
        # §10 item 2: And (and Or) elements become a Concat of the children's decoders. [INF] An Or whose
        # vector also holds a presence mask cannot be a plain Concat of its children, so only a mask-free
        # Or layout is built; the others are refused below.
        subs = tuple(_decoder(child, f"{path}.Elements.{name}", chunk) for name, child in node.elements)
        sizes = tuple(child.vector_size * chunk for _, child in node.elements)
        layer = Concat(sizes, sizes, subs)
    elif t == "Array" and node.element is not None and node.num is not None:
        element = node.element
        width = element.vector_size * chunk
        layer = Array(node.num, width, width, _decoder(element, f"{path}.Element", chunk))
    elif t == "Encoding" and node.element is not None:
        # §10 item 2: an Encoding element adds no decoder layer.
        layer = _decoder(node.element, f"{path}.Element", chunk)
    elif t in ("OrExclusive", "OrInclusive"):
        raise UnsupportedSchemaError("decoder", t, path, _MASKED_OR)
    else:
        raise UnsupportedSchemaError("decoder", t, path, _GUESSED_SEMANTICS)
    width = node.vector_size * chunk
    return _check_built(layer, node, width, path, "decoder", chunk)


def _or_without_mask(node: SchemaNode) -> bool:
    return node.vector_size == sum(child.vector_size for _, child in node.elements)


def build_decoder(action_schema: SchemaNode, chunk_size: int = 1) -> Layer:
    """The action decoder: ActDim -> ActDim with ``ActDim = ActionVectorSize × chunk_size`` (spec §6.3).

    Built as the engine builds it (spec §11 item 5): each action leaf is a ``Denormalize(Num·C)``, an And
    (or mask-free Or) a Concat of its children, an Array an ``Array(Num, element built with C)``, an
    Encoding adds no layer. With ``chunk_size > 1`` its input is therefore leaf-major;
    :class:`protocol.engine.chunks.ChunkLayout` says where each step's values sit.

    Raises :class:`UnsupportedSchemaError` for nodes it cannot build (see the module's table).
    """
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ConfigError(
            "ActionChunkSize must be at least 1",
            field="FlowMatchingSettings.ActionChunkSize",
            expected=">= 1",
            actual=chunk_size,
        )
    return _decoder(action_schema, "ActionSchema", chunk_size)


def build_denoiser(
    encoded_obs_size: int,
    act_dim: int,
    hidden_layer_num: int,
    hidden_layer_size: int,
    activation: str,
    rng: np.random.Generator,
) -> Layer:
    """The velocity network (spec §6.3, §10 item 1).

    ``Sequence[Sequence[Linear(In, H), act, (Linear(H, H), act) × HiddenLayerNum, Linear(H, ActDim)],
    Denormalize(ActDim, 0, 1)]`` with ``In = encoded_obs_size + act_dim + 1`` ([latents ‖ x_t ‖ t]).
    """
    for name, value, low in (
        ("EncodedObsSize", encoded_obs_size, 0),
        ("ActDim", act_dim, 1),
        ("FlowMatchingSettings.HiddenLayerNum", hidden_layer_num, 0),
        ("FlowMatchingSettings.HiddenLayerSize", hidden_layer_size, 1),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ConfigError(
                f"{name} must be an integer >= {low}", field=name, expected=f">= {low}", actual=value
            )
    body = mlp(
        encoded_obs_size + act_dim + 1, act_dim, hidden_layer_size, hidden_layer_num + 2, activation, rng
    )
    return Sequence((body, identity_denormalize(act_dim)))


def schema_hash_stand_in(schema: SchemaNode) -> int:
    """A deterministic stand-in for the engine's schema compatibility hash (signed int32).

    [INF] The engine's ``GetSchemaObjectsCompatibilityHash`` (spec Unknown 5) is not reproduced; the
    emulator uses CityHash32 of the canonical schema JSON (keys sorted, no spaces, UTF-8). Trainers must
    keep whatever hash they received (§6.1), so any stable value exercises that path equally well.
    """
    canonical = json.dumps(schema_to_json(schema), sort_keys=True, separators=(",", ":"))
    return to_int32(city_hash32(canonical.encode("utf-8")))


@dataclass(frozen=True, slots=True, eq=False)
class FlowMatchingNetworks:
    """The three initial snapshots, as the engine sends them (network ids 0, 1, 2)."""

    denoiser: Snapshot
    encoder: Snapshot
    decoder: Snapshot

    def in_id_order(self) -> tuple[Snapshot, Snapshot, Snapshot]:
        """(denoiser, encoder, decoder): network ids 0, 1, 2 (§4.3)."""
        return (self.denoiser, self.encoder, self.decoder)

    def to_bytes(self) -> tuple[bytes, bytes, bytes]:
        """The snapshot bytes for network ids 0, 1, 2."""
        return (write_snapshot(self.denoiser), write_snapshot(self.encoder), write_snapshot(self.decoder))


def build_flow_matching_networks(
    obs_schema: SchemaNode,
    action_schema: SchemaNode,
    chunk_size: int = 1,
    hidden_layer_num: int = 1,
    hidden_layer_size: int = 128,
    activation: str = "ELU",
    seed: int = 1234,
) -> FlowMatchingNetworks:
    """Build denoiser, encoder and decoder snapshots as the engine does (defaults: the engine's, §4.1, §4.3).

    Headers: denoiser In = EncodedObsSize + ActDim + 1, Out = ActDim, hash = CityHash32 of
    [EncodedObsSize, ActDim, 1]; encoder In = obs VectorSize, Out = obs EncodedSize, hash = the schema
    stand-in; decoder In = Out = ActDim, hash = the action schema stand-in. FileDataSize is the model's
    encoded size, so each snapshot is 24 + FileDataSize bytes.
    """
    encoder = build_encoder(obs_schema, network_rng(seed, ENCODER_SEED_SALT))
    decoder = build_decoder(action_schema, chunk_size)
    act_dim = decoder.input_size
    encoded_obs_size = encoder.output_size
    denoiser = build_denoiser(
        encoded_obs_size,
        act_dim,
        hidden_layer_num,
        hidden_layer_size,
        activation,
        network_rng(seed, DENOISER_SEED_SALT),
    )
    return FlowMatchingNetworks(
        denoiser=make_snapshot(denoiser, denoiser_compatibility_hash(encoded_obs_size, act_dim)),
        encoder=make_snapshot(encoder, schema_hash_stand_in(obs_schema)),
        decoder=make_snapshot(decoder, schema_hash_stand_in(action_schema)),
    )
