"""GUID strings and shared-memory names (spec §2.1): every FGuid::Parse format, both ways, and the OS names.

Golden strings follow the engine's FGuid::AppendString layouts for A=0x01234567, B=0x89ABCDEF,
C=0xFEDCBA98, D=0x76543210 (written out by hand from the format strings; Short and Base36 were checked
against Python's own base64 and int(..., 36), which share no code with protocol.guid's formatting).
"""

from __future__ import annotations

import base64
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.errors import GuidError, ProtocolError
from protocol.guid import (
    PSHMNAMLEN,
    Guid,
    GuidFormat,
    format_guid,
    new_guid,
    os_shm_name,
    parse_guid,
    platform_guid_string,
)

G = Guid(0x01234567, 0x89ABCDEF, 0xFEDCBA98, 0x76543210)

GOLDEN: list[tuple[GuidFormat, str]] = [
    (GuidFormat.DIGITS, "0123456789ABCDEFFEDCBA9876543210"),
    (GuidFormat.DIGITS_LOWER, "0123456789abcdeffedcba9876543210"),
    (GuidFormat.DIGITS_WITH_HYPHENS, "01234567-89AB-CDEF-FEDC-BA9876543210"),
    (GuidFormat.DIGITS_WITH_HYPHENS_LOWER, "01234567-89ab-cdef-fedc-ba9876543210"),
    (GuidFormat.DIGITS_WITH_HYPHENS_IN_BRACES, "{01234567-89AB-CDEF-FEDC-BA9876543210}"),
    (GuidFormat.DIGITS_WITH_HYPHENS_IN_PARENTHESES, "(01234567-89AB-CDEF-FEDC-BA9876543210)"),
    (GuidFormat.HEX_VALUES_IN_BRACES, "{0x01234567,0x89AB,0xCDEF,{0xFE,0xDC,0xBA,0x98,0x76,0x54,0x32,0x10}}"),
    (GuidFormat.UNIQUE_OBJECT_GUID, "01234567-89ABCDEF-FEDCBA98-76543210"),
    (GuidFormat.SHORT, "ASNFZ4mrze_-3LqYdlQyEA"),
    (GuidFormat.BASE36_ENCODED, "02FAPL4N1AZS9FHGHWZ46ARYO"),
]

uint32 = st.integers(min_value=0, max_value=2**32 - 1)
guids = st.builds(Guid, uint32, uint32, uint32, uint32)


@pytest.mark.parametrize(("fmt", "text"), GOLDEN, ids=[f.value for f, _ in GOLDEN])
def test_golden_format_and_parse(fmt: GuidFormat, text: str) -> None:
    assert format_guid(G, fmt) == text
    assert parse_guid(text) == G


def test_golden_lengths_match_the_engine_dispatch() -> None:
    # FGuid::Parse chooses the format by length alone: 32, 36, 38, 68, 35, 22, 25.
    lengths = {fmt: len(text) for fmt, text in GOLDEN}
    assert lengths[GuidFormat.DIGITS] == 32
    assert lengths[GuidFormat.DIGITS_WITH_HYPHENS] == 36
    assert lengths[GuidFormat.DIGITS_WITH_HYPHENS_IN_BRACES] == 38
    assert lengths[GuidFormat.HEX_VALUES_IN_BRACES] == 68
    assert lengths[GuidFormat.UNIQUE_OBJECT_GUID] == 35
    assert lengths[GuidFormat.SHORT] == 22
    assert lengths[GuidFormat.BASE36_ENCODED] == 25


def test_short_and_base36_agree_with_independent_codecs() -> None:
    raw = bytes.fromhex("0123456789ABCDEFFEDCBA9876543210")  # A, B, C, D big-endian (UE5 NETWORK_ORDER32)
    assert G.short() == base64.urlsafe_b64encode(raw).decode().rstrip("=")
    assert int(format_guid(G, GuidFormat.BASE36_ENCODED), 36) == int.from_bytes(raw, "big")


def test_platform_strings() -> None:
    assert G.braced_upper() == "{01234567-89AB-CDEF-FEDC-BA9876543210}"
    assert str(G) == G.braced_upper()
    assert platform_guid_string(G, "linux") == G.braced_upper()
    assert platform_guid_string(G, "win32") == G.braced_upper()
    assert platform_guid_string(G, "darwin") == "ASNFZ4mrze_-3LqYdlQyEA"


@pytest.mark.parametrize(
    "text",
    [
        "0123456789abcdefFEDCBA9876543210",
        "{01234567-89ab-cdef-fedc-ba9876543210}",
        "(01234567-89Ab-cDeF-fedc-BA9876543210)",
        "{0x01234567,0x89ab,0xcdef,{0xfe,0xdc,0xba,0x98,0x76,0x54,0x32,0x10}}",
        "01234567-89abcdef-fedcba98-76543210",
    ],
)
def test_hex_digits_of_either_case(text: str) -> None:
    assert parse_guid(text) == G


def test_short_accepts_the_standard_base64_characters_too() -> None:
    # The engine maps '-'→'+' and '_'→'/' and decodes with the standard alphabet, so both spellings parse.
    assert parse_guid("ASNFZ4mrze/+3LqYdlQyEA") == G


@given(guids)
@settings(max_examples=200)
def test_every_format_round_trips(g: Guid) -> None:
    """Every GUID written in every format parses back to itself."""
    for fmt in GuidFormat:
        assert parse_guid(format_guid(g, fmt)) == g


@given(st.binary(min_size=16, max_size=16))
@settings(max_examples=100)
def test_new_guid_matches_the_python_uuid4_form(raw: bytes) -> None:
    """new_guid(b).braced_upper() is what the 5.6/5.7 Python writes for uuid4 with the same bytes."""
    g = new_guid(raw)
    expected = uuid.UUID(bytes=raw, version=4)
    assert g.braced_upper() == "{" + str(expected).upper() + "}"
    assert g.to_bytes() == expected.bytes
    assert parse_guid(g.short()) == g


def test_new_guid_is_pure() -> None:
    assert new_guid(bytes(16)) == new_guid(bytes(16))
    assert new_guid(bytes(16)).braced_upper() == "{00000000-0000-4000-8000-000000000000}"


@pytest.mark.parametrize("raw", [b"", bytes(15), bytes(17)])
def test_new_guid_needs_16_bytes(raw: bytes) -> None:
    with pytest.raises(GuidError, match="16"):
        new_guid(raw)


BAD = [
    "",
    "{01234567-89AB-CDEF-FEDC-BA9876543210",  # 37 chars: no format
    "0123456789ABCDEFFEDCBA987654321G",  # Digits with a non-hex digit
    "01234567_89AB-CDEF-FEDC-BA9876543210",  # wrong separator
    "[01234567-89AB-CDEF-FEDC-BA9876543210]",  # 38 chars, neither braces nor parentheses
    "{01234567-89AB-CDEF-FEDC-BA9876543210)",  # mismatched closer
    "{0X01234567,0x89AB,0xCDEF,{0xFE,0xDC,0xBA,0x98,0x76,0x54,0x32,0x10}}",  # the engine wants lower-case x
    "01234567-89ABCDEF-FEDCBA98+76543210",
    "ASNFZ4mrze_-3LqYdlQy==",  # padding: decodes to 14 bytes, not 16
    "ASNFZ4mrze_-3LqYdlQy.A",  # not base64
    "02fapl4n1azs9fhghwz46aryo",  # Base36 is upper case only in the engine
    "ZZZZZZZZZZZZZZZZZZZZZZZZZ",  # Base36 value above 2**128
    "0123456789ABCDEFFEDCBA987654321\u0663",  # a non-ASCII digit
    " 0123456789ABCDEFFEDCBA987654321",  # whitespace is not trimmed, as in the engine
]


@pytest.mark.parametrize("text", BAD)
def test_rejects_with_the_accepted_formats_named(text: str) -> None:
    with pytest.raises(GuidError) as info:
        parse_guid(text)
    assert "accepted" in str(info.value)
    assert "HexValuesInBraces" in str(info.value)


@given(st.text(max_size=70))
@settings(max_examples=300)
def test_parse_fuzz(text: str) -> None:
    """Any text either parses to a Guid that re-parses from its Digits form, or raises GuidError; nothing else."""
    try:
        g = parse_guid(text)
    except GuidError:
        return
    assert parse_guid(format_guid(g, GuidFormat.DIGITS)) == g


@given(st.sampled_from([t for _, t in GOLDEN]), st.integers(min_value=0, max_value=67), st.characters())
@settings(max_examples=300)
def test_single_character_mutations_parse_or_raise_guid_error(text: str, index: int, char: str) -> None:
    """Replacing one character of a valid string gives a Guid or a GuidError, never another exception."""
    i = index % len(text)
    mutated = text[:i] + char + text[i + 1 :]
    try:
        parse_guid(mutated)
    except GuidError:
        pass


@pytest.mark.parametrize("bad", [-1, 2**32, True, 1.0])
def test_guid_components_are_uint32(bad: object) -> None:
    with pytest.raises(GuidError):
        Guid(bad, 0, 0, 0)  # type: ignore[arg-type]


def test_is_valid_like_the_engine() -> None:
    assert not Guid(0, 0, 0, 0).is_valid
    assert Guid(0, 0, 0, 1).is_valid
    assert parse_guid("{00000000-0000-0000-0000-000000000000}") == Guid(0, 0, 0, 0)


def test_guid_error_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        parse_guid("nope")
    with pytest.raises(ValueError):
        parse_guid("nope")


# -- OS object names ------------------------------------------------------------------------------------


def test_posix_names_prefix_a_slash() -> None:
    assert os_shm_name(G.braced_upper(), "linux") == "/{01234567-89AB-CDEF-FEDC-BA9876543210}"
    assert os_shm_name(G.short(), "darwin") == "/ASNFZ4mrze_-3LqYdlQyEA"


@given(guids)
@settings(max_examples=100)
def test_mac_short_names_fit_pshmnamlen(g: Guid) -> None:
    """A Short GUID with its slash is 23 characters, within macOS's 31."""
    name = os_shm_name(platform_guid_string(g, "darwin"), "darwin")
    assert len(name) == 23 <= PSHMNAMLEN


def test_mac_rejects_names_longer_than_pshmnamlen() -> None:
    with pytest.raises(GuidError, match="31"):
        os_shm_name(G.braced_upper(), "darwin")


def test_windows_5_8_rule() -> None:
    # A string that parses as a braced GUID is used as is; anything else gets the Global\ prefix.
    assert os_shm_name(G.braced_upper(), "win32") == "{01234567-89AB-CDEF-FEDC-BA9876543210}"
    assert (
        os_shm_name("{01234567-89ab-cdef-fedc-ba9876543210}", "win32")
        == "{01234567-89ab-cdef-fedc-ba9876543210}"
    )
    assert os_shm_name(G.short(), "win32") == "Global\\ASNFZ4mrze_-3LqYdlQyEA"
    assert (
        os_shm_name("01234567-89AB-CDEF-FEDC-BA9876543210", "win32")
        == "Global\\01234567-89AB-CDEF-FEDC-BA9876543210"
    )
    assert os_shm_name("(01234567-89AB-CDEF-FEDC-BA9876543210)", "win32").startswith("Global\\")


@pytest.mark.parametrize(
    ("name", "platform"), [("", "linux"), ("a/b", "linux"), ("a\x00b", "win32"), ("x", "freebsd")]
)
def test_bad_names_and_platforms(name: str, platform: str) -> None:
    with pytest.raises(GuidError):
        os_shm_name(name, platform)


def test_unknown_platform_for_platform_string() -> None:
    with pytest.raises(GuidError, match="linux, darwin and win32"):
        platform_guid_string(G, "cygwin")


def test_attach_mode_normalisation() -> None:
    # The engine parses -LearningAgentsControlsGuid and names the region with its platform string, so the
    # user's spelling must be normalised before the trainer creates the region.
    typed = "01234567-89ab-cdef-fedc-ba9876543210"
    assert platform_guid_string(parse_guid(typed), "linux") == "{01234567-89AB-CDEF-FEDC-BA9876543210}"
