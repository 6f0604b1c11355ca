"""The protocol package's error hierarchy.

Every decoder in :mod:`protocol` raises a subclass of :class:`ProtocolError` and nothing else for bad
input (a fuzz invariant the tests check). Errors carry structured fields so that callers can print one
readable sentence naming the field, the expected and the actual value, and so that tests can assert on
the category rather than on message text.

``ProtocolError`` subclasses ``ValueError`` (as msgpack's exceptions do) so that generic callers that
already catch ``ValueError`` for bad data keep working.
"""

from __future__ import annotations

__all__ = [
    "ArgvError",
    "ConfigError",
    "ControlError",
    "GuidError",
    "NNEError",
    "ProtocolError",
    "RecordError",
    "ReplayError",
    "SnapshotError",
    "StreamError",
]

_UNSET = object()


class ProtocolError(ValueError):
    """Bad bytes or values from a peer or a file.

    ``field`` names what was wrong (``"Actions[0]"``, ``"snapshot.magic"``), ``expected`` and ``actual``
    hold the values compared. ``str(error)`` is a complete sentence on its own.
    """

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        expected: object = _UNSET,
        actual: object = _UNSET,
    ) -> None:
        self.message = message
        self.field = field
        self.expected = None if expected is _UNSET else expected
        self.actual = None if actual is _UNSET else actual
        parts = [message]
        details = []
        if field is not None and field not in message:
            details.append(f"field {field}")
        if expected is not _UNSET:
            details.append(f"expected {expected!r}")
        if actual is not _UNSET:
            details.append(f"got {actual!r}")
        if details:
            parts.append("(" + ", ".join(details) + ")")
        super().__init__(" ".join(parts))


class ArgvError(ProtocolError):
    """The engine's (or a user's) launch command line does not follow the train.py grammar."""


class GuidError(ProtocolError):
    """A GUID string is in none of the formats the engine's FGuid::Parse accepts."""


class ConfigError(ProtocolError):
    """A config JSON file or object is malformed, misses a key, or disagrees with itself."""


class ControlError(ProtocolError):
    """The shared-memory control block holds a value that breaks the handshake (e.g. NetworkId)."""


class StreamError(ProtocolError):
    """The socket byte stream holds an unknown signal, a bad length or an unexpected message."""


class ReplayError(ProtocolError):
    """A replay buffer's counts, episode starts/lengths or array shapes are inconsistent."""


class SnapshotError(ProtocolError):
    """A network snapshot has a bad header (magic, version, sizes) or is truncated."""


class NNEError(SnapshotError):
    """The NNERuntimeBasicCpu model blob inside a snapshot is malformed."""


class RecordError(ProtocolError):
    """A ``.record`` file is malformed."""
