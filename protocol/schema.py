"""Observation and action schema trees, as the engine writes them into the data config (spec §4.4, §10 item 4).

Every node carries ``VectorSize`` (floats it occupies in the flat observation/action vector) and
``EncodedSize`` (width of its encoder output); action nodes also carry ``DistributionSize`` and
``ModifierSize``. The remaining fields depend on ``Type`` and are listed in one table per role
(:data:`OBSERVATION_TYPES`, :data:`ACTION_TYPES`), which drives both the parser and the encoder.

Size checks. Only rules the engine source states (spec §10 item 4) or that follow from the vector being
a concatenation are enforced; a false rejection would stop a user with a valid engine, while a missed
check costs little because the flow-matching trainer treats the vectors as opaque floats:

* Null: VectorSize 0.
* Continuous observation: VectorSize = EncodedSize = Num. Continuous action: VectorSize = Num,
  DistributionSize = EncodedSize = 2·Num, ModifierSize = 1 + 2·Num (§10 item 4).
* Discrete*: VectorSize = Num; NamedDiscrete*: VectorSize = len(ElementNames) (one-hot / multi-hot).
* And: VectorSize = Σ children (depth-first concatenation, §4.4); action And: ModifierSize = 1 + Σ children.
* Array: VectorSize = Num · element VectorSize.

Not enforced, only used where they hold (see :func:`leaves`): the Or / Set presence masks, Encoding
(VectorSize = element VectorSize), Conv*, Sparse and every EncodedSize / DistributionSize of a
container. [INF] the spec marks these layouts as inferred.

Unknown ``Type`` strings and unknown keys are accepted with a warning (forward compatibility with later
engines): the node keeps its sizes and any integer/string fields, and is treated as an opaque leaf.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, NamedTuple, TypeAlias

from protocol.errors import ConfigError
from protocol.ints import INT32_MAX
from protocol.json_fields import json_int, json_list, json_object, json_str, require, where

__all__ = [
    "ACTION_NORMALIZATIONS",
    "ACTION_TYPES",
    "MAX_LEAVES",
    "MAX_SCHEMA_DEPTH",
    "OBSERVATION_NORMALIZATIONS",
    "OBSERVATION_TYPES",
    "Leaf",
    "Role",
    "SchemaNode",
    "TypeSpec",
    "continuous_leaves",
    "leaves",
    "parse_schema",
    "schema_to_json",
]

Role: TypeAlias = Literal["observation", "action"]
ParamValue: TypeAlias = int | str


MAX_SCHEMA_DEPTH = 64
"""Deepest schema node accepted (root = 1). Real schemas are a handful of levels; the bound keeps the
recursive parser and :func:`leaves` far from Python's recursion limit on hostile input."""

MAX_LEAVES = 1 << 20
"""Most leaves :func:`leaves` returns (ConfigError beyond). Real vectors hold a few hundred floats."""

OBSERVATION_NORMALIZATIONS = ("Manual", "AutoShared", "AutoPerDimension", "AutoDimensionAverage")
ACTION_NORMALIZATIONS = ("Manual", "AutoShared", "AutoPerDimension")


# --------------------------------------------------------------------------------------------------
# Per-type field tables


@dataclass(frozen=True, slots=True)
class TypeSpec:
    """Which fields a node ``Type`` carries besides the common sizes (spec §4.4).

    ``params`` lists the remaining fields in engine order with their kind: ``"int"`` (non-negative
    int32), ``"str"`` or ``"scalar"`` (int or string; used where the spec does not say which).
    """

    num: bool = False
    normalization: bool = False
    element_names: bool = False
    elements: bool = False
    element: bool = False
    params: tuple[tuple[str, Literal["int", "str", "scalar"]], ...] = ()


_ATTENTION: tuple[tuple[str, Literal["int", "str", "scalar"]], ...] = (
    ("AttentionEncodingSize", "int"),
    ("AttentionHeadNum", "int"),
    ("ValueEncodingSize", "int"),
)

OBSERVATION_TYPES: Mapping[str, TypeSpec] = {
    "Null": TypeSpec(),
    "Continuous": TypeSpec(num=True, normalization=True),
    "DiscreteExclusive": TypeSpec(num=True),
    "DiscreteInclusive": TypeSpec(num=True),
    "NamedDiscreteExclusive": TypeSpec(element_names=True),
    "NamedDiscreteInclusive": TypeSpec(element_names=True),
    "And": TypeSpec(elements=True),
    "OrExclusive": TypeSpec(elements=True, params=(("EncodingSize", "int"),)),
    "OrInclusive": TypeSpec(elements=True, params=_ATTENTION),
    "Array": TypeSpec(num=True, element=True),
    "Set": TypeSpec(element=True, params=(("MaxNum", "int"), *_ATTENTION)),
    "Encoding": TypeSpec(element=True, params=(("EncodingSize", "int"),)),
    # [INF] PaddingMode may be an enum name or its number; the spec does not say, so both are accepted.
    "Conv1d": TypeSpec(
        element=True,
        params=(
            ("InputLength", "int"),
            ("InChannels", "int"),
            ("OutChannels", "int"),
            ("KernelSize", "int"),
            ("Padding", "int"),
            ("PaddingMode", "scalar"),
        ),
    ),
    "Conv2d": TypeSpec(
        element=True,
        params=(
            ("InputHeight", "int"),
            ("InputWidth", "int"),
            ("InChannels", "int"),
            ("OutChannels", "int"),
            ("KernelSize", "int"),
            ("Stride", "int"),
            ("Padding", "int"),
            ("PaddingMode", "scalar"),
        ),
    ),
    "Sparse": TypeSpec(num=True),
    "NamedSparse": TypeSpec(element_names=True),
}
"""Observation node types of spec §4.4 and their fields."""

ACTION_TYPES: Mapping[str, TypeSpec] = {
    "Null": TypeSpec(),
    "Continuous": TypeSpec(num=True, normalization=True),
    "DiscreteExclusive": TypeSpec(num=True),
    "DiscreteInclusive": TypeSpec(num=True),
    "NamedDiscreteExclusive": TypeSpec(element_names=True),
    "NamedDiscreteInclusive": TypeSpec(element_names=True),
    "And": TypeSpec(elements=True),
    "OrExclusive": TypeSpec(elements=True),
    "OrInclusive": TypeSpec(elements=True),
    "Array": TypeSpec(num=True, element=True),
    "Encoding": TypeSpec(
        element=True,
        params=(("EncodingSize", "int"), ("EncodingDepth", "int"), ("ActivationFunction", "str")),
    ),
}
"""Action node types of spec §4.4 and their fields."""

_TYPES: Mapping[str, Mapping[str, TypeSpec]] = {"observation": OBSERVATION_TYPES, "action": ACTION_TYPES}
_NORMALIZATIONS: Mapping[str, tuple[str, ...]] = {
    "observation": OBSERVATION_NORMALIZATIONS,
    "action": ACTION_NORMALIZATIONS,
}
_COMMON_KEYS = {
    "observation": ("VectorSize", "EncodedSize", "Type", "Index"),
    "action": ("VectorSize", "DistributionSize", "EncodedSize", "ModifierSize", "Type", "Index"),
}


# --------------------------------------------------------------------------------------------------
# The value


@dataclass(frozen=True, slots=True)
class SchemaNode:
    """One node of an observation or action schema tree (spec §4.4).

    Sizes are counts of float32 values. ``elements`` holds the And/Or children as ``(name, node)`` in
    ``Index`` order; ``element`` the single child of Array/Set/Encoding/Conv*. ``params`` holds every
    other field as ``(json key, value)`` in engine order, then any unknown int/str fields in input order.
    """

    role: Role
    type: str
    vector_size: int
    encoded_size: int
    distribution_size: int | None = None
    modifier_size: int | None = None
    num: int | None = None
    normalization: str | None = None
    element_names: tuple[str, ...] = ()
    elements: tuple[tuple[str, SchemaNode], ...] = ()
    element: SchemaNode | None = None
    index: int | None = None
    params: tuple[tuple[str, ParamValue], ...] = ()

    def param(self, key: str) -> ParamValue | None:
        """The value of the extra field ``key`` (e.g. ``"EncodingSize"``), or None when absent."""
        for k, v in self.params:
            if k == key:
                return v
        return None


class Leaf(NamedTuple):
    """One leaf's slice ``[offset, offset + size)`` of the flat vector.

    ``node`` is the leaf node; for the presence mask of an Or/Set it is the Or/Set node itself and
    ``path`` ends in ``.Mask``. Repeated Array/Set elements have ``.Element[i]`` in their path.
    """

    offset: int
    size: int
    node: SchemaNode
    path: str

    @property
    def template_path(self) -> str:
        """``path`` without the repetition indices: the leaves of all elements of one Array share it (and
        share the one sub-layer the engine builds for them, so they share normalisation statistics)."""
        return _ELEMENT_INDEX.sub(".Element", self.path)


_ELEMENT_INDEX = re.compile(r"\.Element\[\d+\]")


# --------------------------------------------------------------------------------------------------
# Parser


def parse_schema(
    obj: object,
    role: Role,
    path: str = "Schema",
    warnings: list[str] | None = None,
    *,
    source: str = "",
) -> SchemaNode:
    """Parse one schema node (and its subtree) from decoded JSON.

    ``path`` names the node in error messages (``"Schemas.Observations[0].Schema"``); warnings for
    unknown keys/types/normalisation names are appended to ``warnings`` when given. Raises
    :class:`ConfigError` naming the JSON path for missing keys, wrong types and inconsistent sizes.
    """
    if role not in _TYPES:
        raise ConfigError(f"unknown schema role {role!r}", field="role", expected=tuple(_TYPES), actual=role)
    sink: list[str] = warnings if warnings is not None else []
    return _parse_node(obj, role, path, sink, source, 1)


def _parse_node(
    obj: object, role: Role, path: str, warnings: list[str], source: str, depth: int
) -> SchemaNode:
    if depth > MAX_SCHEMA_DEPTH:
        raise ConfigError(
            f"{where(path, source)} nests deeper than {MAX_SCHEMA_DEPTH} schema levels",
            field=path,
            expected=f"<= {MAX_SCHEMA_DEPTH}",
            actual=depth,
        )
    node = json_object(obj, path, source=source)

    def req_int(key: str) -> int:
        return json_int(require(node, key, path, source=source), f"{path}.{key}", source=source)

    type_name = json_str(require(node, "Type", path, source=source), f"{path}.Type", source=source)
    vector_size = req_int("VectorSize")
    encoded_size = req_int("EncodedSize")
    distribution_size = req_int("DistributionSize") if role == "action" else None
    modifier_size = req_int("ModifierSize") if role == "action" else None
    index = req_int("Index") if "Index" in node else None

    spec = _TYPES[role].get(type_name)
    known = set(_COMMON_KEYS[role])
    if spec is None:
        warnings.append(
            f"{where(path, source)}.Type {type_name!r} is not a known {role} schema type; "
            f"treating it as an opaque leaf of VectorSize {vector_size}"
        )
        spec = TypeSpec()

    num: int | None = None
    if spec.num:
        known.add("Num")
        num = req_int("Num")

    normalization: str | None = None
    if spec.normalization:
        known.add("Normalization")
        if "Normalization" in node:
            normalization = json_str(node["Normalization"], f"{path}.Normalization", source=source)
            if normalization not in _NORMALIZATIONS[role]:
                # §10: the option strings were not verified, so an unknown one is kept, not rejected.
                warnings.append(
                    f"{where(path, source)}.Normalization {normalization!r} is not one of "
                    f"{', '.join(_NORMALIZATIONS[role])}; it is kept as given"
                )
        else:
            warnings.append(
                f"{where(path, source)}.Normalization is missing; the leaf has no normalisation mode"
            )

    element_names: tuple[str, ...] = ()
    if spec.element_names:
        known.add("ElementNames")
        names_path = f"{path}.ElementNames"
        raw = json_list(require(node, "ElementNames", path, source=source), names_path, source=source)
        element_names = tuple(json_str(v, f"{names_path}[{i}]", source=source) for i, v in enumerate(raw))

    params: list[tuple[str, ParamValue]] = []
    for key, kind in spec.params:
        known.add(key)
        value = require(node, key, path, source=source)
        params.append((key, _param_value(value, kind, f"{path}.{key}", source)))

    elements: tuple[tuple[str, SchemaNode], ...] = ()
    if spec.elements:
        known.add("Elements")
        elements = _parse_elements(node, role, path, warnings, source, depth)

    element: SchemaNode | None = None
    if spec.element:
        known.add("Element")
        element = _parse_node(
            require(node, "Element", path, source=source),
            role,
            f"{path}.Element",
            warnings,
            source,
            depth + 1,
        )

    for key, value in node.items():
        if key in known:
            continue
        if isinstance(value, str) or (isinstance(value, int | float) and _is_int(value)):
            params.append((key, value if isinstance(value, str) else int(value)))
            warnings.append(f"{where(path, source)}.{key} is not a known field of {type_name}; kept as given")
        else:
            warnings.append(f"{where(path, source)}.{key} is not a known field of {type_name}; ignored")

    result = SchemaNode(
        role=role,
        type=type_name,
        vector_size=vector_size,
        encoded_size=encoded_size,
        distribution_size=distribution_size,
        modifier_size=modifier_size,
        num=num,
        normalization=normalization,
        element_names=element_names,
        elements=elements,
        element=element,
        index=index,
        params=tuple(params),
    )
    _check_sizes(result, path, source)
    return result


def _is_int(value: int | float) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, float):
        return math.isfinite(value) and value.is_integer() and abs(value) <= INT32_MAX
    return abs(value) <= INT32_MAX


def _param_value(value: object, kind: str, path: str, source: str) -> ParamValue:
    if kind == "int":
        return json_int(value, path, source=source)
    if kind == "str":
        return json_str(value, path, source=source)
    if isinstance(value, str):
        return value
    return json_int(value, path, lo=-INT32_MAX - 1, source=source)


def _parse_elements(
    node: Mapping[str, object], role: Role, path: str, warnings: list[str], source: str, depth: int
) -> tuple[tuple[str, SchemaNode], ...]:
    elements_path = f"{path}.Elements"
    raw = json_object(require(node, "Elements", path, source=source), elements_path, source=source)
    children: list[tuple[int, str, SchemaNode]] = []
    for name, sub in raw.items():
        child_path = f"{elements_path}.{name}"
        child = _parse_node(sub, role, child_path, warnings, source, depth + 1)
        if child.index is None:
            # The engine writes Index on every And/Or child (§4.4); without it the vector order is unknown.
            raise ConfigError(
                f"{where(child_path, source)}.Index is missing",
                field=f"{child_path}.Index",
                expected="present",
                actual="missing",
            )
        children.append((child.index, name, child))
    indices = sorted(i for i, _, _ in children)
    if indices != list(range(len(children))):
        raise ConfigError(
            f"{where(elements_path, source)} Index values must be 0..{len(children) - 1} once each",
            field=elements_path,
            expected=list(range(len(children))),
            actual=[i for i, _, _ in children],
        )
    children.sort(key=lambda item: item[0])
    return tuple((name, child) for _, name, child in children)


def _mismatch(path: str, source: str, key: str, actual: int, expected: int, why: str) -> ConfigError:
    return ConfigError(
        f"{where(path, source)}.{key} is {actual} but {why} gives {expected}",
        field=f"{path}.{key}",
        expected=expected,
        actual=actual,
    )


def _check_sizes(node: SchemaNode, path: str, source: str) -> None:
    """Enforce the size rules listed in the module docstring."""
    t = node.type
    if t == "Null" and node.vector_size != 0:
        raise _mismatch(path, source, "VectorSize", node.vector_size, 0, "a Null node")
    if t == "Continuous":
        n = node.num or 0  # always set by the parser for this type
        if node.vector_size != n:
            raise _mismatch(path, source, "VectorSize", node.vector_size, n, "Num")
        if node.role == "observation":
            if node.encoded_size != n:
                raise _mismatch(
                    path, source, "EncodedSize", node.encoded_size, n, "Num (spec section 10 item 4)"
                )
        else:
            if node.distribution_size != 2 * n:
                raise _mismatch(path, source, "DistributionSize", node.distribution_size or 0, 2 * n, "2*Num")
            if node.encoded_size != 2 * n:
                raise _mismatch(
                    path, source, "EncodedSize", node.encoded_size, 2 * n, "2*Num (spec section 10 item 4)"
                )
            if node.modifier_size != 1 + 2 * n:
                raise _mismatch(path, source, "ModifierSize", node.modifier_size or 0, 1 + 2 * n, "1 + 2*Num")
    if t in ("DiscreteExclusive", "DiscreteInclusive") and node.vector_size != node.num:
        raise _mismatch(path, source, "VectorSize", node.vector_size, node.num or 0, "Num")
    if t in ("NamedDiscreteExclusive", "NamedDiscreteInclusive") and node.vector_size != len(
        node.element_names
    ):
        raise _mismatch(
            path,
            source,
            "VectorSize",
            node.vector_size,
            len(node.element_names),
            "the number of ElementNames",
        )
    if t == "And":
        total = sum(child.vector_size for _, child in node.elements)
        if node.vector_size != total:
            raise _mismatch(path, source, "VectorSize", node.vector_size, total, "the sum of the Elements")
        if node.role == "action":
            modifiers = 1 + sum(child.modifier_size or 0 for _, child in node.elements)
            if node.modifier_size != modifiers:
                raise _mismatch(
                    path,
                    source,
                    "ModifierSize",
                    node.modifier_size or 0,
                    modifiers,
                    "1 + the sum of the Elements",
                )
    if t == "Array" and node.element is not None and node.num is not None:
        total = node.num * node.element.vector_size
        if node.vector_size != total:
            raise _mismatch(path, source, "VectorSize", node.vector_size, total, "Num x Element.VectorSize")


# --------------------------------------------------------------------------------------------------
# Encoder


def schema_to_json(node: SchemaNode) -> dict[str, object]:
    """The JSON object the engine writes for ``node`` (inverse of :func:`parse_schema`)."""
    out: dict[str, object] = {"VectorSize": node.vector_size}
    if node.role == "action":
        out["DistributionSize"] = node.distribution_size
    out["EncodedSize"] = node.encoded_size
    if node.role == "action":
        out["ModifierSize"] = node.modifier_size
    out["Type"] = node.type
    if node.num is not None:
        out["Num"] = node.num
    if node.normalization is not None:
        out["Normalization"] = node.normalization
    spec = _TYPES[node.role].get(node.type, TypeSpec())
    if spec.element_names:
        out["ElementNames"] = list(node.element_names)
    for key, value in node.params:
        out[key] = value
    if spec.elements:
        out["Elements"] = {name: schema_to_json(child) for name, child in node.elements}
    if node.element is not None:
        out["Element"] = schema_to_json(node.element)
    if node.index is not None:
        out["Index"] = node.index
    return out


# --------------------------------------------------------------------------------------------------
# Flat-vector layout


def leaves(node: SchemaNode, path: str = "Schema", offset: int = 0) -> list[Leaf]:
    """Every leaf's slice of the flat vector, depth-first (spec §4.4).

    And children go in ``Index`` order; Array elements are repeated ``Num`` times. Zero-size leaves are
    left out, so the result never has more entries than ``VectorSize`` and the slices tile
    ``[offset, offset + VectorSize)`` exactly.

    [INF] Or*: the sub-vectors of all elements followed by a presence mask (one float per element), and
    Set: ``MaxNum`` element vectors followed by a ``MaxNum`` mask; Encoding: the element's own vector.
    These layouts are inferred (§4.4), so they are used only when the node's VectorSize agrees with
    them; otherwise (and for Conv*, Sparse, NamedSparse and unknown types) the node is one opaque leaf.
    Raises ConfigError when the tree expands to more than :data:`MAX_LEAVES` leaves.
    """
    out: list[Leaf] = []
    _collect(node, path, offset, out)
    return out


def _collect(node: SchemaNode, path: str, offset: int, out: list[Leaf]) -> None:
    if node.vector_size == 0:
        return
    t = node.type
    if t == "And":
        for name, child in node.elements:
            _collect(child, f"{path}.Elements.{name}", offset, out)
            offset += child.vector_size
        return
    if t == "Array" and node.element is not None and node.num is not None:
        _repeat(node.element, node.num, path, offset, out)
        return
    if t in ("OrExclusive", "OrInclusive"):
        n = len(node.elements)
        if node.vector_size == sum(child.vector_size for _, child in node.elements) + n:
            for name, child in node.elements:
                _collect(child, f"{path}.Elements.{name}", offset, out)
                offset += child.vector_size
            out.append(Leaf(offset, n, node, f"{path}.Mask"))
            return
    if t == "Set" and node.element is not None:
        max_num = node.param("MaxNum")
        if isinstance(max_num, int) and node.vector_size == max_num * (node.element.vector_size + 1):
            _repeat(node.element, max_num, path, offset, out)
            out.append(Leaf(offset + max_num * node.element.vector_size, max_num, node, f"{path}.Mask"))
            return
    if t == "Encoding" and node.element is not None and node.element.vector_size == node.vector_size:
        _collect(node.element, f"{path}.Element", offset, out)
        return
    out.append(Leaf(offset, node.vector_size, node, path))


def _repeat(element: SchemaNode, count: int, path: str, offset: int, out: list[Leaf]) -> None:
    if element.vector_size == 0:
        return
    # Arrays are the one place where the leaf count multiplies; a hostile Num (up to 2^31 - 1) must not
    # turn into billions of Leaf objects, so the total is bounded before anything is repeated.
    per_element = len(leaves(element, path))
    if per_element * count > MAX_LEAVES - len(out):
        raise ConfigError(
            f"{path} expands to {per_element * count} leaves, more than {MAX_LEAVES}",
            field=path,
            expected=f"<= {MAX_LEAVES} leaves",
            actual=per_element * count,
        )
    for i in range(count):
        _collect(element, f"{path}.Element[{i}]", offset + i * element.vector_size, out)


def continuous_leaves(node: SchemaNode) -> list[tuple[int, SchemaNode]]:
    """``(offset, node)`` of every Continuous leaf, in vector order (the leaves normalisation applies to)."""
    return [(leaf.offset, leaf.node) for leaf in leaves(node) if leaf.node.type == "Continuous"]
