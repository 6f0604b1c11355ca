"""TCP keep-alive on the trainer's accepted connection: a connected socket is how the trainer sees the game
alive (its waits have no bound), so a machine that vanishes without closing must still be noticed."""

from __future__ import annotations

import socket
import threading

import pytest

from trainer.session.transport.tcp import (
    KEEPALIVE_IDLE_S,
    KEEPALIVE_INTERVAL_S,
    KEEPALIVE_PROBES,
    TcpServer,
    enable_keepalive,
)


def test_enable_keepalive_sets_what_the_os_offers() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        applied = enable_keepalive(sock)
        assert "SO_KEEPALIVE" in applied
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) != 0
        if hasattr(socket, "TCP_KEEPIDLE"):
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == KEEPALIVE_IDLE_S
        if hasattr(socket, "TCP_KEEPINTVL"):
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == KEEPALIVE_INTERVAL_S
        if hasattr(socket, "TCP_KEEPCNT"):
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == KEEPALIVE_PROBES


@pytest.mark.skipif(not hasattr(socket, "TCP_KEEPIDLE"), reason="Linux socket options")
def test_the_accepted_connection_has_keepalive() -> None:
    server = TcpServer("127.0.0.1", 0)
    client = threading.Thread(target=lambda: socket.create_connection(("127.0.0.1", server.port)).close())
    client.start()
    try:
        conn = server.accept(10.0)
        try:
            assert conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) != 0
            assert conn.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == KEEPALIVE_IDLE_S
        finally:
            conn.close()
    finally:
        client.join(10.0)
        server.close()
