"""Readers for the fields of the engine's JSON documents (configs and schema trees, spec §4).

Each reader checks one value's type and range and raises :class:`~protocol.errors.ConfigError` naming
the field's path (and the file it came from), the expected and the actual value, so every config and
schema error reads the same way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from protocol.errors import ConfigError
from protocol.ints import INT32_MAX

__all__ = [
    "json_bool",
    "json_float",
    "json_int",
    "json_list",
    "json_object",
    "json_str",
    "require",
    "where",
]


def where(path: str, source: str) -> str:
    return f"{source}: {path}" if source else path


def json_int(value: object, path: str, *, lo: int = 0, hi: int = INT32_MAX, source: str = "") -> int:
    """An integer field. The engine writes numbers as doubles (§4), so 3 and 3.0 are accepted, 3.5 is not."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(
            f"{where(path, source)} must be an integer", field=path, expected="integer", actual=value
        )
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise ConfigError(
                f"{where(path, source)} must be an integer", field=path, expected="integer", actual=value
            )
        value = int(value)
    if value < lo or value > hi:
        raise ConfigError(
            f"{where(path, source)} is {value}, outside {lo}..{hi}",
            field=path,
            expected=f"{lo}..{hi}",
            actual=value,
        )
    return value


def json_float(value: object, path: str, *, lo: float = -math.inf, source: str = "") -> float:
    """A finite number >= ``lo``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(
            f"{where(path, source)} must be a finite number", field=path, expected="number", actual=value
        )
    if value < lo:
        raise ConfigError(
            f"{where(path, source)} is {value}, below {lo}", field=path, expected=f">= {lo}", actual=value
        )
    return float(value)


def json_bool(value: object, path: str, *, source: str = "") -> bool:
    if not isinstance(value, bool):
        raise ConfigError(
            f"{where(path, source)} must be true or false", field=path, expected="boolean", actual=value
        )
    return value


def json_str(value: object, path: str, *, source: str = "") -> str:
    if not isinstance(value, str):
        raise ConfigError(
            f"{where(path, source)} must be a string", field=path, expected="string", actual=value
        )
    return value


def json_object(value: object, path: str, *, source: str = "") -> Mapping[str, object]:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise ConfigError(
            f"{where(path, source)} must be a JSON object",
            field=path,
            expected="object",
            actual=type(value).__name__,
        )
    return value


def json_list(value: object, path: str, *, source: str = "") -> list[object]:
    if not isinstance(value, list | tuple):
        raise ConfigError(
            f"{where(path, source)} must be a JSON array",
            field=path,
            expected="array",
            actual=type(value).__name__,
        )
    return list(value)


def require(obj: Mapping[str, object], key: str, path: str, *, source: str = "") -> object:
    if key not in obj:
        full = f"{path}.{key}" if path else key
        raise ConfigError(
            f"{where(full, source)} is missing", field=full, expected="present", actual="missing"
        )
    return obj[key]
