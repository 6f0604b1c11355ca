"""TCP transport: one client, bounded waits, EOF as PeerGone, large sends without joining (spec §1.3, §3)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from trainer.errors import LaunchError, PeerGone, WaitTimeout
from trainer.session.transport.tcp import TcpConnection, TcpServer, connect_with_retry, is_loopback

HOST = "127.0.0.1"


def in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    """Run ``fn`` on a daemon thread; the list receives its result or exception."""
    out: list[object] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as error:
            out.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


@pytest.fixture
def pair() -> Iterator[tuple[TcpConnection, TcpConnection]]:
    """(trainer side, engine side) of one accepted connection."""
    server = TcpServer(HOST, 0)
    client = connect_with_retry(HOST, server.port, timeout=5)
    conn = server.accept(timeout=5)
    yield conn, client
    conn.close()
    client.close()
    server.close()


def test_port_in_use_fails_at_bind_without_waiting() -> None:
    with TcpServer(HOST, 0) as first:
        start = time.monotonic()
        with pytest.raises(LaunchError) as info:
            TcpServer(HOST, first.port)
        assert time.monotonic() - start < 1.0
        message = str(info.value)
        assert f"port {first.port} on {HOST} is already in use" in message


@pytest.mark.parametrize("port", [-1, 65536])
def test_port_out_of_range(port: int) -> None:
    with pytest.raises(LaunchError):
        TcpServer(HOST, port)


def test_accept_times_out() -> None:
    with TcpServer(HOST, 0) as server:
        start = time.monotonic()
        with pytest.raises(WaitTimeout) as info:
            server.accept(timeout=0.2)
        assert 0.2 <= time.monotonic() - start < 2.0
        assert str(server.port) in str(info.value)


def test_accept_notices_a_dead_peer() -> None:
    with TcpServer(HOST, 0) as server, pytest.raises(PeerGone):
        server.accept(timeout=5, peer_alive=lambda: False)


def test_accepted_socket_has_nodelay(pair: tuple[TcpConnection, TcpConnection]) -> None:
    conn, _ = pair
    assert conn.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


def test_second_client_is_refused() -> None:
    with TcpServer(HOST, 0) as server:
        first = connect_with_retry(HOST, server.port, timeout=5)
        conn = server.accept(timeout=5)
        with pytest.raises(OSError):
            second = socket.create_connection((HOST, server.port), timeout=2)
            # If the kernel completed the handshake before we closed the listener, it is reset now.
            second.settimeout(2)
            if second.recv(1) == b"":
                raise ConnectionResetError("closed")
        conn.close()
        first.close()


def test_second_client_queued_before_accept_is_reset() -> None:
    with TcpServer(HOST, 0) as server:
        first = connect_with_retry(HOST, server.port, timeout=5)
        second = socket.create_connection((HOST, server.port), timeout=2)
        conn = server.accept(timeout=5)
        second.settimeout(2)
        try:
            data = second.recv(1)
        except ConnectionResetError:
            data = b""
        assert data == b""
        second.close()
        conn.close()
        first.close()


def test_peer_eof_is_peer_gone(pair: tuple[TcpConnection, TcpConnection]) -> None:
    conn, client = pair
    client.close()
    with pytest.raises(PeerGone) as info:
        conn.recv_into(bytearray(8), timeout=2, what="the config")
    assert "the config" in str(info.value)


def test_recv_timeout(pair: tuple[TcpConnection, TcpConnection]) -> None:
    conn, _ = pair
    with pytest.raises(WaitTimeout):
        conn.recv_into(bytearray(8), timeout=0.05)


def test_recv_into_returns_partial_counts_and_recv_exactly_loops(
    pair: tuple[TcpConnection, TcpConnection],
) -> None:
    conn, client = pair
    pieces = [b"a" * 3, b"b" * 1000, b"c" * 7]

    def send_slowly() -> None:
        for piece in pieces:
            client.send_parts([piece])
            time.sleep(0.02)

    thread, out = in_thread(send_slowly)
    buffer = bytearray(len(b"".join(pieces)))
    conn.recv_exactly_into(memoryview(buffer), timeout=5)
    thread.join(5)
    assert out == [None]
    assert bytes(buffer) == b"".join(pieces)


def test_recv_exactly_times_out_with_progress(pair: tuple[TcpConnection, TcpConnection]) -> None:
    conn, client = pair
    client.send_parts([b"xyz"])
    with pytest.raises(WaitTimeout) as info:
        conn.recv_exactly_into(bytearray(10), timeout=0.1)
    assert "3 of 10 bytes" in str(info.value)


def test_send_parts_large_message_arrives_in_order(pair: tuple[TcpConnection, TcpConnection]) -> None:
    conn, client = pair
    # Larger than any socket buffer, so sendmsg writes partially and the loop must resume mid-part.
    parts: list[bytes | memoryview] = [
        b"\x03",
        bytes(range(256)) * 4096,
        memoryview(bytearray(b"\x07" * 3_000_001)),
        b"",
        b"end",
    ]
    expected = b"".join(bytes(p) for p in parts)
    thread, out = in_thread(lambda: conn.send_parts(parts))
    received = bytearray(len(expected))
    client.recv_exactly_into(received, timeout=10)
    thread.join(10)
    assert out == [None]
    assert bytes(received) == expected


def test_send_to_closed_peer_is_peer_gone(pair: tuple[TcpConnection, TcpConnection]) -> None:
    conn, client = pair
    client.close()
    with pytest.raises(PeerGone):
        for _ in range(100):  # the first writes may still succeed into the kernel buffer
            conn.send_parts([bytes(65536)])
            time.sleep(0.005)


def test_wait_closed(pair: tuple[TcpConnection, TcpConnection]) -> None:
    conn, client = pair
    seen: list[bytes] = []
    assert conn.wait_closed(0.05, lambda view: seen.append(bytes(view))) is False
    client.send_parts([b"\x07"])
    client.close()
    assert conn.wait_closed(2, lambda view: seen.append(bytes(view))) is True
    assert seen == [b"\x07"]


def test_connect_with_retry_waits_for_a_late_server() -> None:
    probe = socket.socket()
    probe.bind((HOST, 0))
    port = probe.getsockname()[1]
    probe.close()

    def late_server() -> TcpConnection:
        time.sleep(0.1)
        with TcpServer(HOST, port) as server:
            return server.accept(timeout=5)

    thread, out = in_thread(late_server)
    client = connect_with_retry(HOST, port, timeout=5)
    thread.join(5)
    assert isinstance(out[0], TcpConnection)
    out[0].close()
    client.close()


def test_connect_with_retry_times_out() -> None:
    probe = socket.socket()
    probe.bind((HOST, 0))
    port = probe.getsockname()[1]
    probe.close()
    with pytest.raises(WaitTimeout):
        connect_with_retry(HOST, port, timeout=0.1)


def test_non_loopback_bind_warns(capfd: pytest.CaptureFixture[str]) -> None:
    with TcpServer("0.0.0.0", 0):
        pass
    assert "neither encrypted nor authenticated" in capfd.readouterr().err


def test_loopback_bind_is_quiet(capfd: pytest.CaptureFixture[str]) -> None:
    with TcpServer(HOST, 0):
        pass
    assert capfd.readouterr().err == ""


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.3.4.5", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("10.0.0.1", False),
        ("game.example", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_recv_into_nowait_takes_what_is_there_and_never_waits(
    pair: tuple[TcpConnection, TcpConnection],
) -> None:
    trainer, engine = pair
    buf = bytearray(64)
    start = time.monotonic()
    assert trainer.recv_into_nowait(memoryview(buf)) == 0  # nothing sent yet: no wait, no error
    assert time.monotonic() - start < 0.5
    engine.send_parts([b"abcdef"])
    deadline = time.monotonic() + 5
    got = 0
    while got < 6 and time.monotonic() < deadline:
        got += trainer.recv_into_nowait(memoryview(buf)[got:])
    assert bytes(buf[:6]) == b"abcdef"
    assert trainer.recv_into_nowait(memoryview(buf)[:0]) == 0  # an empty view reads nothing
    engine.close()
    with pytest.raises(PeerGone, match="closed the connection"):
        for _ in range(1000):  # the FIN may take a moment to arrive on loopback
            trainer.recv_into_nowait(memoryview(buf))
            time.sleep(0.005)
