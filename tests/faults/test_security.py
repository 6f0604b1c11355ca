"""What a peer can make the trainer do: bind where told, warn when exposed, allocate only bounded sizes,
and never unpickle or evaluate anything it received.

Facts: the listener binds exactly the given address (the engine default 127.0.0.1) and warns, once,
that the link is unencrypted and unauthenticated when the address is not loopback; a header claiming
2^31-1 bytes allocates nothing near that (tracemalloc); no module of ``protocol`` or ``trainer`` imports
pickle/marshal/shelve, calls eval/exec, or calls ``torch.load`` without ``weights_only=True``.
"""

from __future__ import annotations

import ast
import struct
import tracemalloc
from pathlib import Path

import pytest

from emulator.launch import REPO_ROOT
from protocol.errors import ProtocolError
from protocol.snapshot import HEADER, SNAPSHOT_MAGIC, SNAPSHOT_VERSION, read_snapshot
from protocol.stream import Signal, TrainerStreamDecoder
from tests.support.faults import FAST
from trainer.session.links import SocketTrainerLink
from trainer.session.transport.tcp import TcpServer

WARNING = "neither encrypted nor authenticated"
ALLOCATION_BOUND = 1 << 20
"""Peak bytes a rejected 2^31-1 length may cost (the decoders' own scratch buffers are far below it)."""


def test_listens_on_loopback_by_default_without_a_warning(capfd: pytest.CaptureFixture[str]) -> None:
    link = SocketTrainerLink("127.0.0.1", 0, FAST)
    try:
        assert link._server is not None
        assert link._server._sock is not None
        assert link._server._sock.getsockname()[0] == "127.0.0.1"
    finally:
        link.close()
    assert WARNING not in capfd.readouterr().err


def test_a_non_loopback_address_is_bound_as_given_and_warned_about(capfd: pytest.CaptureFixture[str]) -> None:
    server = TcpServer("0.0.0.0", 0)
    try:
        assert server._sock is not None and server._sock.getsockname()[0] == "0.0.0.0"
    finally:
        server.close()
    err = capfd.readouterr().err
    assert WARNING in err and "0.0.0.0" in err
    assert err.count(WARNING) == 1


def _peak(call: object) -> int:
    tracemalloc.start()
    try:
        try:
            call()  # type: ignore[operator]
        except ProtocolError:
            pass
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize(
    "header",
    [
        struct.pack("<Bi", Signal.SEND_CONFIG, 2**31 - 1),
        struct.pack("<Bi", Signal.SEND_CONFIG, 64 * 1024 * 1024),
    ],
    ids=["2^31-1", "exactly-the-limit"],
)
def test_a_huge_config_length_allocates_nothing_up_front(header: bytes) -> None:
    """The body buffer is allocated only for a length within the limit; 2^31-1 is refused outright."""

    def decode() -> None:
        decoder = TrainerStreamDecoder(max_config_bytes=1024)
        decoder.feed(header)
        decoder.next_event()

    assert _peak(decode) < ALLOCATION_BOUND


def test_a_snapshot_claiming_2_31_bytes_of_model_allocates_nothing_up_front() -> None:
    blob = HEADER.pack(SNAPSHOT_MAGIC, SNAPSHOT_VERSION, 3, 3, 0, 2**31 - 1 - 24) + bytes(64)
    assert _peak(lambda: read_snapshot(blob)) < ALLOCATION_BOUND


# -- source facts -------------------------------------------------------------------------------------------

FORBIDDEN_MODULES = {"pickle", "cPickle", "marshal", "shelve", "dill", "cloudpickle", "yaml"}
FORBIDDEN_CALLS = {"eval", "exec", "compile", "__import__"}


def _sources() -> list[Path]:
    return sorted((REPO_ROOT / "protocol").rglob("*.py")) + sorted((REPO_ROOT / "trainer").rglob("*.py"))


def _violations(path: Path, root: Path = REPO_ROOT) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name.split(".")[0] in FORBIDDEN_MODULES]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in FORBIDDEN_MODULES:
            found.append(f"from {node.module} import ...")
        elif isinstance(node, ast.Call):
            func = node.func
            name = (
                func.id
                if isinstance(func, ast.Name)
                else func.attr
                if isinstance(func, ast.Attribute)
                else ""
            )
            if isinstance(func, ast.Name) and name in FORBIDDEN_CALLS:
                found.append(f"{name}() at line {node.lineno}")
            if (
                name == "load"
                and isinstance(func, ast.Attribute)
                and getattr(func.value, "id", "") == "torch"
            ):
                weights_only = [k for k in node.keywords if k.arg == "weights_only"]
                if not (
                    weights_only
                    and isinstance(weights_only[0].value, ast.Constant)
                    and weights_only[0].value.value is True
                ):
                    found.append(f"torch.load without weights_only=True at line {node.lineno}")
    return [f"{path.relative_to(root)}: {v}" for v in found]


def test_nothing_received_is_unpickled_or_evaluated() -> None:
    sources = _sources()
    assert len(sources) > 20
    violations = [v for path in sources for v in _violations(path)]
    assert violations == [], "\n".join(violations)


def test_the_source_scan_catches_what_it_looks_for(tmp_path: Path) -> None:
    sample = tmp_path / "probe.py"
    sample.write_text(
        "import pickle\nimport torch\nx = torch.load('f')\ny = eval('1')\nz = torch.load('f', weights_only=True)\n"
    )
    assert len(_violations(sample, tmp_path)) == 3, _violations(sample, tmp_path)
