"""Schema trees (spec §4.4, §10 item 4): parse, encode, size checks, flat-vector leaves."""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.errors import ConfigError, ProtocolError
from protocol.schema import (
    ACTION_TYPES,
    MAX_LEAVES,
    MAX_SCHEMA_DEPTH,
    OBSERVATION_TYPES,
    Leaf,
    SchemaNode,
    continuous_leaves,
    leaves,
    parse_schema,
    schema_to_json,
)
from tests.support.schemas import (
    ACTION_SCHEMA,
    OBSERVATION_SCHEMA,
    act,
    act_cont,
    indexed,
    obs,
    obs_cont,
)

# --------------------------------------------------------------------------------------------------
# Builders for engine-shaped JSON


# --------------------------------------------------------------------------------------------------
# Realistic trees


def test_observation_schema_parses_in_index_order() -> None:
    node = parse_schema(OBSERVATION_SCHEMA, "observation")
    assert node.type == "And" and node.vector_size == 22 and node.encoded_size == 22
    assert [name for name, _ in node.elements] == ["Enemies", "Speed"]
    enemies = node.elements[0][1]
    assert enemies.type == "Array" and enemies.num == 3 and enemies.index == 0
    assert enemies.element is not None
    assert [name for name, _ in enemies.element.elements] == ["Position", "Kind"]
    speed = node.elements[1][1]
    assert (speed.num, speed.normalization, speed.index) == (1, "AutoShared", 1)
    assert node.distribution_size is None and node.modifier_size is None


def test_observation_leaves_tile_the_vector_depth_first() -> None:
    node = parse_schema(OBSERVATION_SCHEMA, "observation")
    got = [(leaf.offset, leaf.size, leaf.node.type, leaf.path) for leaf in leaves(node)]
    base = "Schema.Elements.Enemies.Element"
    assert got == [
        (0, 3, "Continuous", f"{base}[0].Elements.Position"),
        (3, 4, "DiscreteExclusive", f"{base}[0].Elements.Kind"),
        (7, 3, "Continuous", f"{base}[1].Elements.Position"),
        (10, 4, "DiscreteExclusive", f"{base}[1].Elements.Kind"),
        (14, 3, "Continuous", f"{base}[2].Elements.Position"),
        (17, 4, "DiscreteExclusive", f"{base}[2].Elements.Kind"),
        (21, 1, "Continuous", "Schema.Elements.Speed"),
    ]
    assert {leaf.template_path for leaf in leaves(node)[::2][:3]} == {f"{base}.Elements.Position"}
    assert [offset for offset, _ in continuous_leaves(node)] == [0, 7, 14, 21]


def test_action_schema_parses_with_action_sizes() -> None:
    node = parse_schema(ACTION_SCHEMA, "action")
    assert (node.vector_size, node.distribution_size, node.encoded_size, node.modifier_size) == (6, 9, 9, 12)
    assert [name for name, _ in node.elements] == ["Steer", "Throttle", "Gear"]
    assert [(leaf.offset, leaf.size) for leaf in leaves(node)] == [(0, 1), (1, 2), (3, 3)]
    throttle = node.elements[1][1]
    assert (throttle.distribution_size, throttle.encoded_size, throttle.modifier_size) == (4, 4, 5)


@pytest.mark.parametrize(("obj", "role"), [(OBSERVATION_SCHEMA, "observation"), (ACTION_SCHEMA, "action")])
def test_round_trip(obj: dict[str, Any], role: Any) -> None:
    node = parse_schema(obj, role)
    assert schema_to_json(node) == obj
    assert parse_schema(schema_to_json(node), role) == node


def test_whole_floats_are_integers() -> None:
    obj = copy.deepcopy(OBSERVATION_SCHEMA)
    obj["VectorSize"] = 22.0
    obj["Elements"]["Speed"]["Num"] = 1.0
    assert parse_schema(obj, "observation") == parse_schema(OBSERVATION_SCHEMA, "observation")


# --------------------------------------------------------------------------------------------------
# Every type of the tables


def _minimal(role: str, type_: str) -> dict[str, Any]:
    """A valid node of ``type_`` whose sizes satisfy the enforced rules."""
    spec = (OBSERVATION_TYPES if role == "observation" else ACTION_TYPES)[type_]
    leaf = obs_cont(2) if role == "observation" else act_cont(2)
    vector = 0 if type_ == "Null" else 2
    extra: dict[str, Any] = {}
    if spec.num:
        extra["Num"] = 1 if type_ == "Array" else 2
    if spec.normalization:
        extra["Normalization"] = "Manual"
    if spec.element_names:
        extra["ElementNames"] = ["A", "B"]
    if spec.elements:
        if type_ == "And":
            extra["Elements"] = {"Only": indexed(leaf, 0)}
        else:  # Or: 2 + 1 mask float
            extra["Elements"] = {"Only": indexed(leaf, 0)}
            vector = 3
    if spec.element:
        extra["Element"] = leaf
    for key, kind in spec.params:
        extra[key] = "Zeros" if kind == "str" else 4
    if role == "observation":
        return obs(type_, vector, **extra)
    mod = 1 + 5 if type_ == "And" else 5
    return act(type_, vector, 4, 4, mod, **extra)


CASES = [("observation", t) for t in OBSERVATION_TYPES] + [("action", t) for t in ACTION_TYPES]


@pytest.mark.parametrize(("role", "type_"), CASES)
def test_every_type_parses_and_round_trips(role: Any, type_: str) -> None:
    obj = _minimal(role, type_)
    warnings: list[str] = []
    node = parse_schema(obj, role, warnings=warnings)
    assert warnings == []
    assert node.type == type_ and node.role == role
    assert schema_to_json(node) == obj
    covered = sum(leaf.size for leaf in leaves(node))
    assert covered == node.vector_size


def test_params_keep_engine_fields() -> None:
    node = parse_schema(_minimal("observation", "Set"), "observation")
    assert node.param("MaxNum") == 4 and node.param("AttentionHeadNum") == 4 and node.param("Nope") is None
    enc = parse_schema(_minimal("action", "Encoding"), "action")
    assert enc.params == (("EncodingSize", 4), ("EncodingDepth", 4), ("ActivationFunction", "Zeros"))


# --------------------------------------------------------------------------------------------------
# Inferred layouts: used only when the sizes agree


def test_or_leaves_put_the_mask_last() -> None:
    obj = obs(
        "OrExclusive",
        2 + 3 + 2,
        EncodingSize=8,
        Elements={"B": indexed(obs_cont(3), 1), "A": indexed(obs_cont(2), 0)},
    )
    node = parse_schema(obj, "observation")
    got = [(leaf.offset, leaf.size, leaf.path) for leaf in leaves(node)]
    assert got == [(0, 2, "Schema.Elements.A"), (2, 3, "Schema.Elements.B"), (5, 2, "Schema.Mask")]
    assert leaves(node)[-1].node is node


def test_or_with_another_layout_is_one_opaque_leaf() -> None:
    # max(children) + n = 5: a layout we do not assume, so the node is not split.
    obj = obs(
        "OrExclusive",
        5,
        EncodingSize=8,
        Elements={"A": indexed(obs_cont(2), 0), "B": indexed(obs_cont(3), 1)},
    )
    node = parse_schema(obj, "observation")
    assert leaves(node) == [Leaf(0, 5, node, "Schema")]


def test_set_and_encoding_leaves() -> None:
    params = {"MaxNum": 2, "AttentionEncodingSize": 4, "AttentionHeadNum": 1, "ValueEncodingSize": 4}
    node = parse_schema(obs("Set", 2 * 3 + 2, Element=obs_cont(3), **params), "observation")
    assert [(leaf.offset, leaf.size) for leaf in leaves(node)] == [(0, 3), (3, 3), (6, 2)]
    enc = parse_schema(obs("Encoding", 3, 16, EncodingSize=16, Element=obs_cont(3)), "observation")
    assert [(leaf.offset, leaf.size, leaf.node.type) for leaf in leaves(enc)] == [(0, 3, "Continuous")]


def test_array_of_null_has_no_leaves() -> None:
    node = parse_schema(obs("Array", 0, Num=2**31 - 1, Element=obs("Null", 0)), "observation")
    assert leaves(node) == []


def test_leaf_count_is_bounded_before_expanding() -> None:
    inner = obs("Array", 2**16, Num=2**16, Element=obs_cont(1))
    node = parse_schema(obs("Array", 2**31 - 2**16, Num=2**15 - 1, Element=inner), "observation")
    with pytest.raises(ConfigError) as info:
        leaves(node)
    assert info.value.actual == (2**15 - 1) * 2**16


def test_leaf_limit_is_inclusive(monkeypatch: pytest.MonkeyPatch) -> None:
    import protocol.schema

    monkeypatch.setattr(protocol.schema, "MAX_LEAVES", 100)
    assert len(leaves(parse_schema(_array(100, obs_cont(1)), "observation"))) == 100
    with pytest.raises(ConfigError):
        leaves(parse_schema(_array(101, obs_cont(1)), "observation"))
    assert MAX_LEAVES == 1 << 20


# --------------------------------------------------------------------------------------------------
# Size checks name the JSON path

PATH = "Schemas.Observations[0].Schema"


def _error(obj: object, role: Any = "observation") -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_schema(obj, role, PATH)
    return info.value


def test_continuous_vector_size_must_equal_num() -> None:
    obj = copy.deepcopy(OBSERVATION_SCHEMA)
    obj["Elements"]["Speed"]["VectorSize"] = 2
    err = _error(obj)
    assert err.field == f"{PATH}.Elements.Speed.VectorSize"
    assert (err.expected, err.actual) == (1, 2)
    assert f"{PATH}.Elements.Speed.VectorSize is 2" in str(err)


def test_continuous_observation_encoded_size_equals_num() -> None:
    err = _error(obs("Continuous", 2, 3, Num=2, Normalization="Manual"))
    assert err.field == f"{PATH}.EncodedSize"


@pytest.mark.parametrize(
    ("key", "value"), [("EncodedSize", 2), ("DistributionSize", 3), ("ModifierSize", 4), ("VectorSize", 3)]
)
def test_continuous_action_sizes(key: str, value: int) -> None:
    obj = act_cont(2)
    obj[key] = value
    assert _error(obj, "action").field == f"{PATH}.{key}"


def test_and_vector_size_is_the_sum() -> None:
    obj = copy.deepcopy(OBSERVATION_SCHEMA)
    obj["VectorSize"] = 23
    err = _error(obj)
    assert (err.field, err.expected, err.actual) == (f"{PATH}.VectorSize", 22, 23)


def test_action_and_modifier_size_adds_one() -> None:
    obj = copy.deepcopy(ACTION_SCHEMA)
    obj["ModifierSize"] = 11
    assert _error(obj, "action").field == f"{PATH}.ModifierSize"


def test_array_vector_size_is_num_times_element() -> None:
    obj = copy.deepcopy(OBSERVATION_SCHEMA)
    obj["Elements"]["Enemies"]["Num"] = 2
    err = _error(obj)
    assert (err.field, err.expected, err.actual) == (f"{PATH}.Elements.Enemies.VectorSize", 14, 21)


@pytest.mark.parametrize(
    "node",
    [
        obs("DiscreteInclusive", 3, Num=4),
        obs("NamedDiscreteExclusive", 3, ElementNames=["a", "b"]),
        obs("Null", 1),
    ],
)
def test_discrete_and_null_sizes(node: dict[str, Any]) -> None:
    assert _error(node).field == f"{PATH}.VectorSize"


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        (3, True),
        (3.0, True),
        (3.5, False),
        (True, False),
        ("3", False),
        (-1, False),
        (2**31, False),
        (None, False),
    ],
)
def test_integer_fields(value: object, ok: bool) -> None:
    obj = obs("DiscreteExclusive", 3, Num=value)
    if ok:
        assert parse_schema(obj, "observation").num == 3
    else:
        err = _error(obj)
        assert err.field == f"{PATH}.Num" and err.actual == value


@pytest.mark.parametrize("missing", ["Type", "VectorSize", "EncodedSize", "Num"])
def test_missing_keys_name_the_path(missing: str) -> None:
    obj = obs_cont(2)
    del obj[missing]
    err = _error(obj)
    assert err.field == f"{PATH}.{missing}" and "missing" in str(err)


def test_action_nodes_need_action_sizes() -> None:
    assert _error(obs_cont(2), "action").field == f"{PATH}.DistributionSize"


def test_and_children_need_an_index() -> None:
    obj = obs("And", 2, Elements={"A": obs_cont(2)})
    assert _error(obj).field == f"{PATH}.Elements.A.Index"


def test_and_indices_must_be_a_permutation() -> None:
    obj = obs("And", 4, Elements={"A": indexed(obs_cont(2), 0), "B": indexed(obs_cont(2), 0)})
    err = _error(obj)
    assert err.field == f"{PATH}.Elements" and err.actual == [0, 0]


def test_depth_is_bounded() -> None:
    node: dict[str, Any] = obs_cont(1)
    for _ in range(MAX_SCHEMA_DEPTH):
        node = obs("Encoding", 1, 1, EncodingSize=1, Element=node)
    err = _error(node)
    assert "deeper" in str(err)


def test_not_an_object() -> None:
    assert _error([1, 2]).field == PATH


# --------------------------------------------------------------------------------------------------
# Forward compatibility: warnings, never silent drops


def test_unknown_type_is_an_opaque_leaf_with_a_warning() -> None:
    warnings: list[str] = []
    node = parse_schema(obs("Attention", 5, 7, Heads=2, Sub={"x": 1}), "observation", PATH, warnings)
    assert node.type == "Attention" and node.vector_size == 5
    assert node.param("Heads") == 2
    assert leaves(node) == [Leaf(0, 5, node, "Schema")]
    assert any("'Attention' is not a known observation schema type" in w for w in warnings)
    assert any(f"{PATH}.Sub" in w and "ignored" in w for w in warnings)
    assert schema_to_json(node) == obs("Attention", 5, 7, Heads=2)


def test_unknown_scalar_field_is_kept_and_reported() -> None:
    warnings: list[str] = []
    node = parse_schema(obs_cont(2, Scale=3.0), "observation", PATH, warnings)
    assert node.param("Scale") == 3
    assert warnings == [f"{PATH}.Scale is not a known field of Continuous; kept as given"]
    assert schema_to_json(node)["Scale"] == 3


def test_normalization_unknown_or_missing_is_a_warning() -> None:
    warnings: list[str] = []
    assert parse_schema(obs_cont(2, "ZScore"), "observation", PATH, warnings).normalization == "ZScore"
    no_norm = obs_cont(2)
    del no_norm["Normalization"]
    assert parse_schema(no_norm, "observation", PATH, warnings).normalization is None
    assert len(warnings) == 2 and "ZScore" in warnings[0] and "missing" in warnings[1]
    # AutoDimensionAverage exists for observations only (§4.4).
    action_warnings: list[str] = []
    parse_schema(act_cont(1, "AutoDimensionAverage"), "action", PATH, action_warnings)
    assert len(action_warnings) == 1


def test_schema_nodes_are_values() -> None:
    a = parse_schema(OBSERVATION_SCHEMA, "observation")
    b = parse_schema(copy.deepcopy(OBSERVATION_SCHEMA), "observation")
    assert a == b and hash(a) == hash(b)
    assert isinstance(a, SchemaNode)


# --------------------------------------------------------------------------------------------------
# Fuzz

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 40),
    st.floats(allow_nan=True),
    st.sampled_from(["Continuous", "And"]),
)
_KEY_NAMES = "VectorSize EncodedSize DistributionSize ModifierSize Type Num Index Elements Element"
_keys = st.sampled_from([*_KEY_NAMES.split(), "Normalization", "ElementNames", "MaxNum", "EncodingSize", "x"])
_json = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_keys, inner, max_size=6),
    max_leaves=30,
)
_types = st.sampled_from(sorted(set(OBSERVATION_TYPES) | set(ACTION_TYPES)))
_node = st.fixed_dictionaries(
    {"Type": _types, "VectorSize": st.integers(0, 6), "EncodedSize": st.integers(0, 6)},
    optional={
        "Num": st.integers(0, 3),
        "Elements": st.dictionaries(st.text(max_size=2), _json, max_size=3),
        "Element": _json,
    },
)


@settings(max_examples=300, deadline=None)
@given(obj=st.one_of(_json, _node), role=st.sampled_from(["observation", "action"]))
def test_fuzz_parse_schema(obj: object, role: Any) -> None:
    """Any JSON value either parses into a node whose leaves tile its vector, or raises ConfigError."""
    try:
        node = parse_schema(obj, role, warnings=[])
    except ProtocolError as exc:
        assert isinstance(exc, ConfigError)
        return
    total = 0
    for leaf in leaves(node):
        assert leaf.offset == total
        total += leaf.size
    assert total == node.vector_size
    assert parse_schema(schema_to_json(node), role, warnings=[]) == node


def _and(children: list[dict[str, Any]]) -> dict[str, Any]:
    elements = {f"e{i}": indexed(child, i) for i, child in enumerate(children)}
    return obs(
        "And",
        sum(c["VectorSize"] for c in children),
        sum(c["EncodedSize"] for c in children),
        Elements=elements,
    )


def _array(num: int, element: dict[str, Any]) -> dict[str, Any]:
    return obs("Array", num * element["VectorSize"], num * element["EncodedSize"], Num=num, Element=element)


_valid_leaf = st.one_of(
    st.integers(0, 4).map(obs_cont),
    st.integers(0, 4).map(lambda n: obs("DiscreteExclusive", n, Num=n)),
    st.just(obs("Null", 0)),
)
_valid_tree = st.recursive(
    _valid_leaf,
    lambda inner: (
        st.lists(inner, max_size=4).map(_and) | st.tuples(st.integers(0, 3), inner).map(lambda t: _array(*t))
    ),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(obj=_valid_tree)
def test_valid_trees_round_trip_and_tile(obj: dict[str, Any]) -> None:
    """Every well-formed tree parses without warnings, encodes back to the same JSON, and its leaves tile it."""
    warnings: list[str] = []
    node = parse_schema(obj, "observation", warnings=warnings)
    assert warnings == [] and schema_to_json(node) == obj
    offsets = [(leaf.offset, leaf.size) for leaf in leaves(node)]
    assert sum(size for _, size in offsets) == node.vector_size
    assert all(a + s == b for (a, s), (b, _) in itertools.pairwise(offsets))
