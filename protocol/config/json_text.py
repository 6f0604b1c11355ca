"""The engine's JSON as text: decoding with its limits, and encoding as the engine writes it (spec §3, §4, §5.5).

:func:`parse_json` turns bytes from a file or the socket into a JSON value, refusing what the engine
never writes. The two encoders produce the engine's own text (tab-indented, non-ASCII characters kept):
:func:`dump_json` as UTF-8, as the socket carries it, and :func:`engine_json_bytes` as the engine's file
writer stores it.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Callable

from protocol.errors import ConfigError

__all__ = ["MAX_JSON_DEPTH", "dump_json", "engine_json_bytes", "parse_json"]

MAX_JSON_DEPTH = 256
"""Deepest array/object nesting accepted by :func:`parse_json`; engine configs nest about a dozen levels."""


def parse_json(raw: bytes | bytearray | memoryview, source: str) -> object:
    """Decode one JSON document; ConfigError names ``source`` and the position of the fault.

    The caller bounds ``len(raw)``. Beyond plain ``json.loads`` this rejects:
    NaN/Infinity literals (not JSON, and the engine never writes them; a NaN learning rate would only fail
    later and obscurely), duplicate keys (ambiguous: which one did the engine mean?), and nesting deeper
    than :data:`MAX_JSON_DEPTH`.
    [INF] Text encoding: the socket sends UTF-8 (§3). Files may come from a UE string writer that emits
    UTF-16 with a BOM when a path holds non-ASCII characters, so a UTF-8 or UTF-16 BOM is honoured.
    """
    data = bytes(raw)
    try:
        if data.startswith(codecs.BOM_UTF8):
            text = data[len(codecs.BOM_UTF8) :].decode("utf-8")
        elif data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
            text = data.decode("utf-16")
        else:
            text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{source}: not valid text at byte {exc.start}: {exc.reason}",
            field=source,
            expected="UTF-8 JSON",
            actual=data[exc.start : exc.start + 8],
        ) from None
    try:
        value = json.loads(
            text, parse_constant=_reject_constant(source), object_pairs_hook=_no_duplicates(source)
        )
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{source}: invalid JSON at line {exc.lineno} column {exc.colno} (character {exc.pos}): {exc.msg}",
            field=source,
            expected="JSON",
            actual=text[exc.pos : exc.pos + 16],
        ) from None
    except RecursionError:
        raise ConfigError(
            f"{source}: JSON nests deeper than {MAX_JSON_DEPTH} levels",
            field=source,
            expected=f"<= {MAX_JSON_DEPTH}",
        ) from None
    except ValueError as exc:  # e.g. an integer literal beyond Python's digit limit
        raise ConfigError(f"{source}: invalid JSON: {exc}", field=source, expected="JSON") from None
    _check_depth(value, source)
    return value


def _reject_constant(source: str) -> Callable[[str], object]:
    def reject(name: str) -> object:
        raise ConfigError(
            f"{source}: {name} is not a JSON number (the engine never writes it)",
            field=source,
            expected="finite number",
            actual=name,
        )

    return reject


def _no_duplicates(source: str) -> Callable[[list[tuple[str, object]]], dict[str, object]]:
    def build(pairs: list[tuple[str, object]]) -> dict[str, object]:
        out: dict[str, object] = {}
        for key, value in pairs:
            if key in out:
                raise ConfigError(f"{source}: duplicate key {key!r} in one object", field=key, actual=key)
            out[key] = value
        return out

    return build


def _check_depth(value: object, source: str) -> None:
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > MAX_JSON_DEPTH:
                raise ConfigError(
                    f"{source}: JSON nests deeper than {MAX_JSON_DEPTH} levels",
                    field=source,
                    expected=f"<= {MAX_JSON_DEPTH}",
                    actual=depth,
                )
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)


def _engine_json_text(obj: object) -> str:
    # UE's JSON writer pretty-prints with tabs and keeps non-ASCII characters; it never writes NaN or
    # Infinity, so an encoder output holding one is a bug to report here, not a file to write.
    return json.dumps(obj, indent="\t", ensure_ascii=False, allow_nan=False)


def dump_json(obj: object) -> bytes:
    """An encoder's output as UTF-8 JSON bytes: what the engine sends over the socket (§3)."""
    return _engine_json_text(obj).encode("utf-8")


def engine_json_bytes(obj: object) -> bytes:
    """An encoder's output as the engine's file writer stores it (``trainer-config.json`` etc., §2.6, §5.5).

    [INF] ``FFileHelper::SaveStringToFile`` (AutoDetect) writes plain 8-bit text when every character is
    ASCII, else UTF-16LE with a BOM. Paths with non-ASCII characters therefore produce UTF-16 files, which
    :func:`parse_json` reads.
    """
    text = _engine_json_text(obj)
    if text.isascii():
        return text.encode("ascii")
    return codecs.BOM_UTF16_LE + text.encode("utf-16-le")
