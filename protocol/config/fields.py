"""The field-table machinery shared by the config parsers and encoders (spec §4).

A config object's scalar keys are listed once, as a :data:`FieldTable` of (JSON key, attribute, reader);
:func:`read_fields` parses them (a missing key takes the dataclass default and adds a warning) and
:func:`write_fields` encodes them back. A :class:`ParseContext` carries the source name and the
warnings through one parse.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from protocol.errors import ConfigError
from protocol.ints import INT32_MAX
from protocol.json_fields import json_bool, json_float, json_int, json_str, where

__all__ = [
    "FieldReader",
    "FieldTable",
    "ParseContext",
    "bool_reader",
    "check_unique",
    "float_reader",
    "int_reader",
    "join_path",
    "read_fields",
    "str_reader",
    "write_fields",
]


@dataclass(slots=True)
class ParseContext:
    """Where a parse is (``source``: the file or message) and the warnings it collects on the way."""

    source: str
    warnings: list[str]

    def where(self, path: str) -> str:
        return where(path, self.source)

    def missing(self, path: str, default: object) -> None:
        self.warnings.append(f"{self.where(path)} is missing; using the engine default {default!r}")

    def missing_object(self, path: str) -> None:
        self.warnings.append(f"{self.where(path)} is missing; using the engine defaults for all its keys")

    def unknown(self, obj: Mapping[str, object], known: tuple[str, ...] | set[str], path: str) -> None:
        for key in obj:
            if key not in known:
                self.warnings.append(f"{self.where(join_path(path, key))} is not a known key; ignored")


def join_path(path: str, key: str) -> str:
    """``path.key``, or ``key`` at the top level."""
    return f"{path}.{key}" if path else key


FieldReader = Callable[[object, str, str], Any]
"""Reads one JSON value: (value, key path, source) -> the attribute's value; ConfigError if it is bad."""


def int_reader(lo: int = 0, hi: int = INT32_MAX) -> FieldReader:
    """An integer in ``lo..hi`` (3 and 3.0 accepted, 3.5 refused: the engine writes doubles, §4)."""
    return lambda value, path, source: json_int(value, path, lo=lo, hi=hi, source=source)


def float_reader(lo: float = 0.0) -> FieldReader:
    """A finite number >= ``lo``."""
    return lambda value, path, source: json_float(value, path, lo=lo, source=source)


def bool_reader(value: object, path: str, source: str) -> bool:
    return json_bool(value, path, source=source)


def str_reader(value: object, path: str, source: str) -> str:
    return json_str(value, path, source=source)


FieldTable = tuple[tuple[str, str, FieldReader], ...]
"""(JSON key, dataclass attribute, reader) per scalar key of one config object, in the engine's order."""

_T = TypeVar("_T")


def read_fields(
    obj: Mapping[str, object], table: FieldTable, cls: type[_T], path: str, ctx: ParseContext
) -> dict[str, object]:
    """Read the keys of ``table``; missing ones take ``cls``'s default and add a warning."""
    defaults = {f.name: f.default for f in fields(cls)}  # type: ignore[arg-type]
    out: dict[str, object] = {}
    for key, attr, reader in table:
        key_path = join_path(path, key)
        if key in obj:
            out[attr] = reader(obj[key], key_path, ctx.source)
        else:
            ctx.missing(key_path, defaults[attr])
            out[attr] = defaults[attr]
    return out


def write_fields(value: object, table: FieldTable) -> dict[str, object]:
    """The keys of ``table`` with ``value``'s attributes, as the engine writes them."""
    return {key: _number(getattr(value, attr)) for key, attr, _ in table}


def _number(value: object) -> object:
    """Whole floats as integers, as the engine's double writer prints them (§4)."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value


def check_unique(ids: list[int], path: str, ctx: ParseContext) -> None:
    """ConfigError when ``ids`` (the Id values of one JSON array at ``path``) repeat."""
    if len(set(ids)) != len(ids):
        raise ConfigError(
            f"{ctx.where(path)} has duplicate Id values", field=path, expected="unique", actual=ids
        )
