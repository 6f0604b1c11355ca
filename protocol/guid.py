"""The engine's FGuid: its string forms and the OS shared-memory object names built from them (spec §2.1).

An FGuid is four uint32 ``A, B, C, D``. Every shared-memory region is named by the GUID string the engine
prints with ``GetPlatformGuidString()``: ``DigitsWithHyphensInBraces`` (upper case) on Windows and Linux,
``Short`` (22 characters of URL-safe base64) on macOS, whose POSIX shm names are limited to 31 characters
(PSHMNAMLEN). That exact string appears after ``-g`` and in ``shared-memory-<GUID>.json``.

How A..D map onto each string form, as the engine's ``FGuid::AppendString`` and ``FGuid::ParseExact``
write them (Engine/Source/Runtime/Core/Private/Misc/Guid.cpp, UE5 line; read through the public code
index, not copied):

=============================== ====== ==========================================================
format                          length  layout
=============================== ====== ==========================================================
Digits / DigitsLower             32    ``%08X%08X%08X%08X`` of A, B, C, D
DigitsWithHyphens(Lower)         36    ``%08X-%04X-%04X-%04X-%04X%08X`` of A, B>>16, B&0xFFFF,
                                       C>>16, C&0xFFFF, D
DigitsWithHyphensInBraces        38    the same inside ``{}``
DigitsWithHyphensInParentheses   38    the same inside ``()``
HexValuesInBraces                68    ``{0x%08X,0x%04X,0x%04X,{0x%02X,...x8}}`` of A, B>>16,
                                       B&0xFFFF, then the 4 bytes of C and the 4 bytes of D,
                                       most significant first
UniqueObjectGuid                 35    ``%08X-%08X-%08X-%08X`` of A, B, C, D
Short                            22    URL-safe base64 (``-`` and ``_``), padding removed, of the
                                       16 bytes A, B, C, D each in network (big-endian) order
Base36Encoded                    25    the 128-bit number A:B:C:D (A most significant) in base 36,
                                       digits ``0-9A-Z``, zero-padded to 25
=============================== ====== ==========================================================

``FGuid::Parse`` picks the format from the length alone (38 → braces if the first character is ``{``,
otherwise parentheses) and accepts hex digits of either case (``FChar::IsHexDigit``).

[INF] Short byte order: the UE5 Guid.cpp (the revision that includes ``Misc/ByteSwap.h``) encodes
``NETWORK_ORDER32(A)``..``NETWORK_ORDER32(D)``; UE4 revisions encoded host order (little-endian). We follow
the UE5 revision for 5.8. Only conversions between forms depend on it: the OS object name is the
string itself, byte for byte, so a wrong guess here cannot break opening a region by its string.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from enum import Enum
from typing import Final, Literal

from protocol.errors import GuidError

__all__ = [
    "ACCEPTED_FORMATS_TEXT",
    "PSHMNAMLEN",
    "Guid",
    "GuidFormat",
    "Platform",
    "format_guid",
    "new_guid",
    "os_shm_name",
    "parse_guid",
    "platform_guid_string",
]

Platform = Literal["linux", "darwin", "win32"]
"""``sys.platform`` values of the three platforms the engine's shared memory supports."""

PSHMNAMLEN: Final = 31
"""macOS limit on a POSIX shared-memory name, leading ``/`` included (the reason Mac uses Short GUIDs)."""

_UINT32_MAX: Final = 0xFFFF_FFFF
_WINDOWS_GLOBAL_PREFIX: Final = "Global\\"


class GuidFormat(Enum):
    """The engine's ``EGuidFormats`` (spellings as in ``Misc/Guid.h``)."""

    DIGITS = "Digits"
    """32 upper-case hex digits."""
    DIGITS_LOWER = "DigitsLower"
    """32 lower-case hex digits."""
    DIGITS_WITH_HYPHENS = "DigitsWithHyphens"
    """8-4-4-4-12 upper-case hex digits."""
    DIGITS_WITH_HYPHENS_LOWER = "DigitsWithHyphensLower"
    """8-4-4-4-12 lower-case hex digits (RFC 4122 text form)."""
    DIGITS_WITH_HYPHENS_IN_BRACES = "DigitsWithHyphensInBraces"
    """``{8-4-4-4-12}``, upper case: the Windows/Linux platform string."""
    DIGITS_WITH_HYPHENS_IN_PARENTHESES = "DigitsWithHyphensInParentheses"
    """``(8-4-4-4-12)``, upper case."""
    HEX_VALUES_IN_BRACES = "HexValuesInBraces"
    """``{0xAAAAAAAA,0xBBBB,0xBBBB,{0xCC,0xCC,0xCC,0xCC,0xDD,0xDD,0xDD,0xDD}}``."""
    UNIQUE_OBJECT_GUID = "UniqueObjectGuid"
    """``AAAAAAAA-BBBBBBBB-CCCCCCCC-DDDDDDDD``."""
    SHORT = "Short"
    """22 characters of URL-safe base64: the macOS platform string."""
    BASE36_ENCODED = "Base36Encoded"
    """25 characters ``0-9A-Z`` (safe on case-insensitive file systems)."""


ACCEPTED_FORMATS_TEXT: Final = (
    "32 hex digits (Digits), 8-4-4-4-12 hex digits (DigitsWithHyphens), the same in {} or (), "
    "{0x00000000,0x0000,0x0000,{0x00,0x00,0x00,0x00,0x00,0x00,0x00,0x00}} (HexValuesInBraces), "
    "00000000-00000000-00000000-00000000 (UniqueObjectGuid), 22 URL-safe base64 characters (Short) "
    "or 25 characters 0-9A-Z (Base36Encoded)"
)
"""The sentence a :class:`GuidError` uses to list what :func:`parse_guid` accepts."""


@dataclass(frozen=True, slots=True, order=True)
class Guid:
    """The engine's FGuid: four uint32 in the order the engine stores and prints them."""

    a: int
    b: int
    c: int
    d: int

    def __post_init__(self) -> None:
        for name in ("a", "b", "c", "d"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _UINT32_MAX:
                raise GuidError(
                    f"Guid.{name} must be a uint32", field=f"Guid.{name}", expected="0..2**32-1", actual=value
                )

    @property
    def is_valid(self) -> bool:
        """The engine's ``FGuid::IsValid``: any component non-zero (unallocated regions carry all zeros)."""
        return (self.a | self.b | self.c | self.d) != 0

    def to_int(self) -> int:
        """The 128-bit number ``A:B:C:D`` (A most significant), as Base36Encoded uses it."""
        return (self.a << 96) | (self.b << 64) | (self.c << 32) | self.d

    @classmethod
    def from_int(cls, value: int) -> Guid:
        """Inverse of :meth:`to_int`; ``value`` must fit in 128 bits."""
        if not 0 <= value < 1 << 128:
            raise GuidError("a GUID is a 128-bit number", field="value", expected="0..2**128-1", actual=value)
        return cls(value >> 96, (value >> 64) & _UINT32_MAX, (value >> 32) & _UINT32_MAX, value & _UINT32_MAX)

    def to_bytes(self) -> bytes:
        """The 16 bytes Short encodes: A, B, C, D each big-endian ([INF] UE5 order, see module doc)."""
        return self.to_int().to_bytes(16, "big")

    def braced_upper(self) -> str:
        """``{XXXXXXXX-XXXX-XXXX-XXXX-XXXXXXXXXXXX}``: the engine's platform string on Windows and Linux."""
        return format_guid(self, GuidFormat.DIGITS_WITH_HYPHENS_IN_BRACES)

    def short(self) -> str:
        """22 URL-safe base64 characters: the engine's platform string on macOS."""
        return format_guid(self, GuidFormat.SHORT)

    def __str__(self) -> str:
        return self.braced_upper()


def _hyphenated(g: Guid) -> str:
    return f"{g.a:08X}-{g.b >> 16:04X}-{g.b & 0xFFFF:04X}-{g.c >> 16:04X}-{g.c & 0xFFFF:04X}{g.d:08X}"


def _hex_values(g: Guid) -> str:
    tail = ",".join(f"0x{byte:02X}" for byte in (g.c.to_bytes(4, "big") + g.d.to_bytes(4, "big")))
    return f"{{0x{g.a:08X},0x{g.b >> 16:04X},0x{g.b & 0xFFFF:04X},{{{tail}}}}}"


_BASE36_ALPHABET: Final = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _base36(g: Guid) -> str:
    value = g.to_int()
    digits = []
    for _ in range(25):  # 36**25 > 2**128, so 25 digits always suffice (the engine pads to 25 too)
        value, remainder = divmod(value, 36)
        digits.append(_BASE36_ALPHABET[remainder])
    return "".join(reversed(digits))


def format_guid(g: Guid, fmt: GuidFormat) -> str:
    """``g`` written the way the engine's ``FGuid::ToString(fmt)`` writes it."""
    if fmt is GuidFormat.DIGITS:
        return f"{g.a:08X}{g.b:08X}{g.c:08X}{g.d:08X}"
    if fmt is GuidFormat.DIGITS_LOWER:
        return f"{g.a:08x}{g.b:08x}{g.c:08x}{g.d:08x}"
    if fmt is GuidFormat.DIGITS_WITH_HYPHENS:
        return _hyphenated(g)
    if fmt is GuidFormat.DIGITS_WITH_HYPHENS_LOWER:
        return _hyphenated(g).lower()
    if fmt is GuidFormat.DIGITS_WITH_HYPHENS_IN_BRACES:
        return "{" + _hyphenated(g) + "}"
    if fmt is GuidFormat.DIGITS_WITH_HYPHENS_IN_PARENTHESES:
        return "(" + _hyphenated(g) + ")"
    if fmt is GuidFormat.HEX_VALUES_IN_BRACES:
        return _hex_values(g)
    if fmt is GuidFormat.UNIQUE_OBJECT_GUID:
        return f"{g.a:08X}-{g.b:08X}-{g.c:08X}-{g.d:08X}"
    if fmt is GuidFormat.SHORT:
        # 16 bytes → 24 base64 characters ending in "=="; the engine drops the padding (22 characters).
        return base64.urlsafe_b64encode(g.to_bytes()).decode("ascii")[:22]
    if fmt is GuidFormat.BASE36_ENCODED:
        return _base36(g)
    raise GuidError(f"unknown GUID format {fmt!r}", field="fmt")  # pragma: no cover - exhaustive enum


# Parsers, one per length, exactly as FGuid::Parse dispatches. Hex digits are matched with explicit ASCII
# classes: Python's int() would also accept "_", "+", whitespace and non-ASCII digits, the engine does not.
_H = "[0-9A-Fa-f]"
_HYPHENATED = rf"({_H}{{8}})-({_H}{{4}})-({_H}{{4}})-({_H}{{4}})-({_H}{{4}})({_H}{{8}})"
_RE_DIGITS = re.compile(rf"({_H}{{8}})({_H}{{8}})({_H}{{8}})({_H}{{8}})")
_RE_HYPHENS = re.compile(_HYPHENATED)
_RE_BRACES = re.compile(r"\{" + _HYPHENATED + r"\}")
_RE_PARENTHESES = re.compile(r"\(" + _HYPHENATED + r"\)")
# The engine checks a lower-case "x" after each "0" (FGuid::ParseExact compares against TCHAR('x')).
_RE_HEX_VALUES = re.compile(
    rf"\{{0x({_H}{{8}}),0x({_H}{{4}}),0x({_H}{{4}}),\{{" + ",".join([rf"0x({_H}{{2}})"] * 8) + r"\}\}"
)
_RE_UNIQUE_OBJECT = re.compile(rf"({_H}{{8}})-({_H}{{8}})-({_H}{{8}})-({_H}{{8}})")
# The engine maps "-"→"+" and "_"→"/" and decodes with the standard alphabet, so "+" and "/" are
# accepted too; "=" padding makes the decoded size differ from 16 and is refused.
_RE_SHORT = re.compile(r"[A-Za-z0-9+/_-]{22}")
_URLSAFE_TO_STANDARD: Final = str.maketrans("-_", "+/")
# Base36: the engine accepts only "0-9" and upper-case "A-Z".
_RE_BASE36 = re.compile(r"[0-9A-Z]{25}")


def _from_hex_groups(groups: tuple[str | None, ...]) -> Guid:
    digits = "".join(group or "" for group in groups)
    return Guid(int(digits[0:8], 16), int(digits[8:16], 16), int(digits[16:24], 16), int(digits[24:32], 16))


def _fail(text: str, why: str) -> GuidError:
    shown = text if len(text) <= 80 else text[:77] + "..."
    return GuidError(
        f"GUID {shown!r} is not in a format FGuid::Parse accepts: {why}; accepted: {ACCEPTED_FORMATS_TEXT}",
        field="guid",
        actual=shown,
    )


def _parse_short(text: str) -> Guid:
    if _RE_SHORT.fullmatch(text) is None:
        raise _fail(text, "a 22-character Short GUID uses only A-Z a-z 0-9 - _")
    # The regex admitted only alphabet characters, so the non-strict decoder cannot skip any.
    raw = binascii.a2b_base64((text.translate(_URLSAFE_TO_STANDARD) + "==").encode("ascii"))
    # The 22nd character carries 2 unused low bits; like the engine's decoder we ignore them.
    return Guid.from_int(int.from_bytes(raw, "big"))


def _parse_base36(text: str) -> Guid:
    if _RE_BASE36.fullmatch(text) is None:
        raise _fail(text, "a 25-character Base36Encoded GUID uses only 0-9 and upper-case A-Z")
    value = int(text, 36)
    if value >> 128:
        # [INF] The engine's FUInt128 arithmetic wraps silently here; no engine ever prints such a string,
        # so it is far more likely a typo than a GUID, and wrapping would alias another region's name.
        raise _fail(text, "the Base36 value exceeds 128 bits")
    return Guid.from_int(value)


def parse_guid(text: str) -> Guid:
    """Parse ``text`` in any format the engine's ``FGuid::Parse`` accepts (chosen by length, as it does).

    Raises :class:`GuidError` naming the accepted formats when nothing matches.
    """
    if not isinstance(text, str):
        raise GuidError("a GUID must be a string", field="guid", expected="str", actual=type(text).__name__)
    n = len(text)
    match: re.Match[str] | None
    if n == 32:
        match = _RE_DIGITS.fullmatch(text)
    elif n == 36:
        match = _RE_HYPHENS.fullmatch(text)
    elif n == 38:
        match = (_RE_BRACES if text.startswith("{") else _RE_PARENTHESES).fullmatch(text)
    elif n == 68:
        match = _RE_HEX_VALUES.fullmatch(text)
    elif n == 35:
        match = _RE_UNIQUE_OBJECT.fullmatch(text)
    elif n == 22:
        return _parse_short(text)
    elif n == 25:
        return _parse_base36(text)
    else:
        raise _fail(text, f"no format has {n} characters (lengths 22, 25, 32, 35, 36, 38, 68)")
    if match is None:
        raise _fail(text, f"it has the length of a {n}-character format but not its separators or hex digits")
    return _from_hex_groups(match.groups())


def new_guid(random_bytes: bytes) -> Guid:
    """A fresh random GUID from 16 caller-supplied random bytes (pure: the caller owns the randomness).

    The version/variant bits of an RFC 4122 version-4 UUID are set, so ``braced_upper()`` equals the 5.6/5.7
    Python's ``'{' + str(uuid.uuid4()).upper() + '}'`` for the same bytes (spec §2.1).
    """
    if not isinstance(random_bytes, bytes | bytearray | memoryview) or len(random_bytes) != 16:
        raise GuidError(
            "new_guid needs exactly 16 random bytes",
            field="random_bytes",
            expected=16,
            actual=len(random_bytes) if isinstance(random_bytes, bytes | bytearray | memoryview) else None,
        )
    raw = bytearray(random_bytes)
    raw[6] = (raw[6] & 0x0F) | 0x40  # version 4
    raw[8] = (raw[8] & 0x3F) | 0x80  # variant RFC 4122
    return Guid.from_int(int.from_bytes(raw, "big"))


def _check_platform(platform: str) -> Platform:
    if platform == "linux":
        return "linux"
    if platform == "darwin":
        return "darwin"
    if platform == "win32":
        return "win32"
    raise GuidError(
        f"unsupported platform {platform!r}: the engine's shared memory exists on linux, darwin and win32",
        field="platform",
        expected=("linux", "darwin", "win32"),
        actual=platform,
    )


def platform_guid_string(g: Guid, platform: str) -> str:
    """The string the engine's ``GetPlatformGuidString()`` prints for ``g`` on ``platform`` (spec §2.1).

    Attach mode: the engine parses ``-LearningAgentsControlsGuid`` with ``FGuid::Parse`` and names the region
    with this string, so a trainer creating the controls block must normalise the user's ``-g`` through
    ``platform_guid_string(parse_guid(text), sys.platform)`` rather than use the text as typed.
    """
    if _check_platform(platform) == "darwin":
        return g.short()
    return g.braced_upper()


def os_shm_name(guid_string: str, platform: str) -> str:
    """The OS object name of the region the engine named ``guid_string`` (spec §2.1, 5.8 rule).

    POSIX (linux, darwin): ``"/" + guid_string`` (``shm_open``; names are case-sensitive). Windows: the
    string as is when it parses as a braced GUID (``DigitsWithHyphensInBraces``), else ``"Global\\" +
    guid_string`` (``CreateFileMappingW``/``OpenFileMappingW`` tag name).
    """
    checked = _check_platform(platform)
    if not isinstance(guid_string, str) or not guid_string or "\x00" in guid_string:
        raise GuidError(
            "a shared-memory GUID string must be a non-empty string without NUL",
            field="guid_string",
            actual=guid_string,
        )
    if checked == "win32":
        if len(guid_string) == 38 and _RE_BRACES.fullmatch(guid_string) is not None:
            return guid_string
        return _WINDOWS_GLOBAL_PREFIX + guid_string
    if "/" in guid_string:
        # POSIX allows a slash only in first position; the engine's strings (braced hex, URL-safe base64)
        # never contain one, so a slash means the string was mangled.
        raise GuidError(
            "a POSIX shared-memory name cannot contain '/' after the leading one",
            field="guid_string",
            actual=guid_string,
        )
    name = "/" + guid_string
    if checked == "darwin" and len(name) > PSHMNAMLEN:
        raise GuidError(
            f"shared-memory name {name!r} is {len(name)} characters; macOS allows {PSHMNAMLEN} "
            "(the engine uses 22-character Short GUIDs on Mac)",
            field="guid_string",
            expected=f"<= {PSHMNAMLEN} characters with the slash",
            actual=len(name),
        )
    return name
