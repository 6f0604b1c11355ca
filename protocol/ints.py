"""The engine's integer widths: every count, size, id and version on the wire is an int32 (spec §2-§6)."""

from __future__ import annotations

from typing import Final

__all__ = ["INT32_MAX", "INT32_MIN"]

INT32_MIN: Final = -(2**31)
"""Smallest int32 (the engine's signed counters, e.g. NetworksVersion, start at -1)."""
INT32_MAX: Final = 2**31 - 1
"""Largest int32: the bound on every count and byte size the engine writes."""
