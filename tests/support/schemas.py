"""Shared test builders."""

from __future__ import annotations

from typing import Any


def obs(type_: str, vector: int, encoded: int | None = None, **extra: Any) -> dict[str, Any]:
    node: dict[str, Any] = {
        "VectorSize": vector,
        "EncodedSize": vector if encoded is None else encoded,
        "Type": type_,
    }
    node.update(extra)
    return node


def act(type_: str, vector: int, dist: int, enc: int, mod: int, **extra: Any) -> dict[str, Any]:
    node: dict[str, Any] = {
        "VectorSize": vector,
        "DistributionSize": dist,
        "EncodedSize": enc,
        "ModifierSize": mod,
        "Type": type_,
    }
    node.update(extra)
    return node


def obs_cont(n: int, norm: str = "AutoPerDimension", **extra: Any) -> dict[str, Any]:
    return obs("Continuous", n, Num=n, Normalization=norm, **extra)


def act_cont(n: int, norm: str = "AutoShared", **extra: Any) -> dict[str, Any]:
    return act("Continuous", n, 2 * n, 2 * n, 1 + 2 * n, Num=n, Normalization=norm, **extra)


def indexed(node: dict[str, Any], index: int) -> dict[str, Any]:
    return {**node, "Index": index}


def cont(
    num: int, mode: str = "AutoPerDimension", index: int | None = None, role: str = "observation"
) -> dict[str, Any]:
    """A Continuous leaf of ``num`` values for the observation or the action schema, optionally indexed."""
    node = act_cont(num, mode) if role == "action" else obs_cont(num, mode)
    return node if index is None else indexed(node, index)


# And{ Enemies: Array[3]{ And{ Position: Continuous(3), Kind: DiscreteExclusive(4) } }, Speed: Continuous(1) }
# "Speed" comes first in the JSON but has Index 1: the vector order follows Index, not key order.
ENEMY = obs(
    "And",
    7,
    Elements={
        "Kind": indexed(obs("DiscreteExclusive", 4, Num=4), 1),
        "Position": indexed(obs_cont(3), 0),
    },
)


OBSERVATION_SCHEMA = obs(
    "And",
    22,
    Elements={
        "Speed": indexed(obs_cont(1, "AutoShared"), 1),
        "Enemies": indexed(obs("Array", 21, Num=3, Element=ENEMY), 0),
    },
)


# And{ Steer: Continuous(1), Throttle: Continuous(2), Gear: DiscreteExclusive(3) }; ModifierSize 1 + Σ.
ACTION_SCHEMA = act(
    "And",
    6,
    9,
    9,
    1 + 3 + 5 + 3,
    Elements={
        "Steer": indexed(act_cont(1), 0),
        "Throttle": indexed(act_cont(2, "Manual"), 1),
        "Gear": indexed(act("DiscreteExclusive", 3, 3, 3, 3, Num=3), 2),
    },
)
