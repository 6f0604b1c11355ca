"""TCP for the socket transport: the trainer is the server, the engine the one client (spec §1.3, §3).

Framing lives in :mod:`protocol.stream`; this module only moves bytes. Receives go into buffers the
caller preallocated (``recv_into``), so a multi-megabyte replay buffer is never rebuilt by
concatenation, and sends hand the encoder's parts to ``sendmsg`` without joining them.

Threads: one thread receives (the training story) while another may send (the keep-alive ping); sends
must be serialised by the caller (:class:`trainer.session.links.SocketTrainerLink` holds the lock) so a ping
never lands inside a network message.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import math
import os
import select
import socket
import sys
import time
from collections.abc import Callable, Sequence
from types import TracebackType

from trainer.errors import Interrupted, LaunchError, PeerGone, WaitTimeout
from trainer.session.transport.wait import wait_until
from trainer.system.console import warn

__all__ = [
    "ACCEPT_HINT",
    "KEEPALIVE_IDLE_S",
    "KEEPALIVE_INTERVAL_S",
    "KEEPALIVE_PROBES",
    "TcpConnection",
    "TcpServer",
    "connect_with_retry",
    "enable_keepalive",
    "is_loopback",
    "listen_refusal",
    "wait_any_readable",
]

Buffer = bytes | bytearray | memoryview

ACCEPT_HINT = (
    "Check that the game uses the same address and port (-LearningAgentsIpAddress, -LearningAgentsPort) "
    "and that it was started"
)
"""What a timed-out accept suggests by default."""

_ACCEPT_SLICE = 0.05
"""Seconds per select() while accepting, so the peer check and timeout are honoured promptly."""

_CONNECT_RETRY = 0.001
"""Seconds between connection attempts; the engine retries about every 1 ms (spec §1.3)."""

_MAX_SENDMSG_PARTS = 512
"""Parts per sendmsg call; well under every platform's IOV_MAX (1024 on Linux and macOS)."""

_SEND_SLICE = 0.5
"""Seconds one send waits for buffer space before the sender checks the peer and its bound again."""

_CLOSE_SLICE = 0.5
"""Seconds per receive while waiting for the peer to close, so its liveness is checked between them."""

KEEPALIVE_IDLE_S = 10
"""TCP keep-alive on the trainer's connection: seconds of silence before the first probe."""
KEEPALIVE_INTERVAL_S = 5
"""Seconds between unanswered probes."""
KEEPALIVE_PROBES = 6
"""Unanswered probes before the kernel reports the connection dead: a machine that vanished (power,
network) is noticed within about ``IDLE + INTERVAL * PROBES`` = 40 s of silence. A paused game's kernel
still answers probes, so a paused editor is never mistaken for a dead one."""

_HAVE_READV = hasattr(os, "readv")
"""POSIX: a receive without the poll that a timeout-mode socket's ``recv_into`` makes first."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (127.0.0.0/8, ::1 or ``localhost``)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class TcpConnection:
    """A connected stream socket with bounded waits; EOF becomes :class:`PeerGone`."""

    def __init__(
        self, sock: socket.socket, *, send_timeout: float = math.inf, peer: str = "the engine"
    ) -> None:
        # Timeout mode (not blocking, not non-blocking): each send waits for buffer space at most one
        # slice, so a long send (a paused game reads nothing) checks the peer between slices; receives
        # first poll with their own timeout, so they never block inside recv, and the descriptor is
        # non-blocking underneath, which recv_into_nowait relies on.
        sock.settimeout(_SEND_SLICE)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock: socket.socket | None = sock
        self._send_timeout = send_timeout
        self.peer = peer

    @property
    def sock(self) -> socket.socket:
        if self._sock is None:
            raise PeerGone(f"the connection to {self.peer} is closed")
        return self._sock

    @property
    def closed(self) -> bool:
        return self._sock is None

    def send_parts(
        self,
        parts: Sequence[Buffer],
        *,
        peer_alive: Callable[[], bool] | None = None,
        interrupted: Callable[[], bool] | None = None,
    ) -> None:
        """Send every part in order, as one stream segment sequence, without joining them.

        A peer that does not read (a paused game) is waited for up to ``send_timeout`` seconds (default:
        no bound), checking ``peer_alive`` and ``interrupted`` between slices of :data:`_SEND_SLICE`
        seconds.

        Raises:
            PeerGone: the engine closed or reset the connection, or ``peer_alive`` returned False.
            WaitTimeout: the engine did not read for ``send_timeout`` seconds.
            Interrupted: ``interrupted`` returned True while the engine was not reading.
        """
        sock = self.sock
        views = [memoryview(p).cast("B") for p in parts if len(p)]
        deadline = time.monotonic() + self._send_timeout
        try:
            while views:
                try:
                    if hasattr(sock, "sendmsg"):
                        sent = sock.sendmsg(views[:_MAX_SENDMSG_PARTS])
                    else:  # pragma: no cover - Windows has no sendmsg
                        sent = sock.send(views[0])
                except TimeoutError:
                    # Nothing was sent in this slice: the peer's window is closed (it is not reading).
                    if time.monotonic() >= deadline:
                        raise
                    if peer_alive is not None and not peer_alive():
                        raise PeerGone(f"{self.peer} went away while we were sending to it") from None
                    if interrupted is not None and interrupted():
                        raise Interrupted(
                            f"interrupted while sending to {self.peer} (it stopped reading)"
                        ) from None
                    continue
                # Drop fully sent parts and trim the first partly sent one (partial writes happen
                # whenever the kernel buffer is smaller than the message).
                while sent and views:
                    head = views[0]
                    if sent >= len(head):
                        sent -= len(head)
                        views.pop(0)
                    else:
                        views[0] = head[sent:]
                        sent = 0
        except TimeoutError:
            raise WaitTimeout(
                f"timed out after {self._send_timeout:g} s sending to {self.peer} "
                "(it stopped reading from the connection)"
            ) from None
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError) as error:
            raise PeerGone(f"{self.peer} closed the connection while we were sending ({error})") from None

    def poll_readable(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for data or EOF; True when a receive would not block."""
        return _wait_readable(self.sock, timeout)

    def recv_into(self, view: memoryview | bytearray, timeout: float, *, what: str = "data") -> int:
        """Receive at least 1 and at most ``len(view)`` bytes into ``view``; return the count.

        Raises:
            PeerGone: the engine closed the connection (EOF) or reset it.
            WaitTimeout: nothing arrived within ``timeout`` seconds.
        """
        if len(view) == 0:
            raise ValueError("recv_into needs a non-empty buffer")
        if not self.poll_readable(timeout):
            raise WaitTimeout(f"timed out after {timeout:g} s waiting for {what} from {self.peer}")
        return self._received(lambda: self.sock.recv_into(view), what)

    def _received(self, receive: Callable[[], int], what: str) -> int:
        """``receive()``'s byte count; a reset or an EOF (0 bytes) becomes :class:`PeerGone`."""
        try:
            n = receive()
        except (ConnectionResetError, ConnectionAbortedError) as error:
            raise PeerGone(f"{self.peer} reset the connection while we were waiting for {what}") from error
        if n == 0:
            raise PeerGone(f"{self.peer} closed the connection while we were waiting for {what}")
        return n

    def recv_into_nowait(self, view: memoryview, *, what: str = "data") -> int:
        """Receive what is already there, at most ``len(view)`` bytes, without waiting; 0 when nothing is.

        One ``readv`` on the descriptor (the socket is non-blocking underneath its timeout mode): no
        poll first, which is what makes back-to-back receives of a large body cheap. Where ``readv`` does
        not exist (Windows) it returns 0 and callers fall back to :meth:`recv_into`.

        Raises:
            PeerGone: the engine closed the connection (EOF) or reset it.
        """
        if not _HAVE_READV or len(view) == 0:
            return 0
        try:
            return self._received(lambda: os.readv(self.sock.fileno(), [view]), what)
        except (BlockingIOError, InterruptedError):
            return 0

    def recv_exactly_into(self, view: memoryview | bytearray, timeout: float, *, what: str = "data") -> None:
        """Fill all of ``view``, looping over partial receives; ``timeout`` bounds the whole call."""
        target = memoryview(view).cast("B")
        deadline = time.monotonic() + timeout
        filled = 0
        while filled < len(target):
            remaining = deadline - time.monotonic()
            try:
                filled += self.recv_into(target[filled:], remaining, what=what)
            except WaitTimeout:
                raise WaitTimeout(
                    f"timed out after {timeout:g} s waiting for {what} from {self.peer} "
                    f"({filled} of {len(target)} bytes arrived)"
                ) from None

    def wait_closed(
        self,
        timeout: float,
        on_data: Callable[[memoryview], None] | None = None,
        *,
        peer_alive: Callable[[], bool] | None = None,
        interrupted: Callable[[], bool] | None = None,
    ) -> bool:
        """Wait up to ``timeout`` s (``math.inf``: no bound) for the peer to close; pass any bytes that
        arrive to ``on_data``.

        Returns True when EOF or a reset was seen, or ``peer_alive`` returned False (checked every
        :data:`_CLOSE_SLICE` seconds); False on timeout or once ``interrupted`` returns True (SIGINT or
        SIGTERM: the user wants the process gone). Used after Complete: the engine closes the socket
        itself, and exiting first would make its pending reads fail (spec §10 item 7).
        """
        deadline = time.monotonic() + timeout
        scratch = bytearray(65536)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (interrupted is not None and interrupted()):
                return False
            if peer_alive is not None and not peer_alive():
                return True
            try:
                n = self.recv_into(scratch, min(remaining, _CLOSE_SLICE), what="the connection to close")
            except PeerGone:
                return True
            except WaitTimeout:
                continue
            if on_data is not None:
                on_data(memoryview(scratch)[:n])

    def close(self) -> None:
        """Shut the connection down and close it. Idempotent."""
        sock, self._sock = self._sock, None
        if sock is None:
            return
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()

    def __enter__(self) -> TcpConnection:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def listen_refusal(host: str, port: int, error: OSError) -> str:
    """Why ``host:port`` cannot be listened on, and the fix on each side: the trainer's own ``--port`` (or
    ``--host``), and the game's setting where the two must match. The one wording of the trainer link and
    the drop-in's relay."""
    both = (
        "the trainer's --port (la-trainer socket; a trainer the editor starts takes the game's port) and the "
        "same Port in the game's socket settings (-LearningAgentsPort on its command line)"
    )
    if error.errno in (errno.EADDRINUSE, getattr(errno, "WSAEADDRINUSE", -1)):
        return (
            f"port {port} on {host} is already in use (another trainer or game?). Stop the other process, or "
            f"choose another port for both sides: {both}."
        )
    if error.errno == errno.EACCES and 0 < port < 1024:
        return (
            f"cannot listen on {host}:{port}: {error.strerror or error} (ports below 1024 need administrator "
            f"rights). Choose a port from 1024 up, such as the default 48491, for both sides: {both}."
        )
    if error.errno == errno.EADDRNOTAVAIL:
        return (
            f"cannot listen on {host}:{port}: {host} is not an address of this machine. Give --host one of its "
            "addresses, 0.0.0.0 for all of them or 127.0.0.1 for this machine only."
        )
    return f"cannot listen on {host}:{port}: {error.strerror or error}"


class TcpServer:
    """Listens on ``host:port`` and accepts exactly one client (the engine).

    Binding happens in the constructor so a port in use fails at launch, before any waiting.
    ``backlog``: connections the kernel queues before they are accepted (the socket link holds several
    pending connections until one sends a valid config, :meth:`accept_ready`).
    """

    def __init__(self, host: str, port: int, *, send_timeout: float = math.inf, backlog: int = 1) -> None:
        if not 0 <= port <= 65535:
            raise LaunchError(f"port {port} is out of range (0-65535)")
        self.host = host
        self._send_timeout = send_timeout
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except socket.gaierror as error:
            raise LaunchError(
                f"cannot resolve the listen address {host!r} ({error.strerror or error}). Give --host an address "
                "of this machine: 0.0.0.0 for all of them, 127.0.0.1 for this machine only."
            ) from None
        # Prefer IPv4: "localhost" may resolve to ::1 first while the engine connects to the IPv4 address.
        infos.sort(key=lambda info: info[0] != socket.AF_INET)
        family, socktype, proto, _, address = infos[0]
        sock = socket.socket(family, socktype, proto)
        try:
            if sys.platform == "win32":  # pragma: no cover - untested
                # On Windows SO_REUSEADDR lets a second process steal a bound port; forbid that.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_EXCLUSIVEADDRUSE, 1)  # type: ignore[attr-defined,unused-ignore]
            else:
                # Rebinding right after a previous run whose connection sits in TIME_WAIT.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen(backlog)
        except OSError as error:
            sock.close()
            raise LaunchError(listen_refusal(host, port, error)) from None
        self._sock: socket.socket | None = sock
        self.port: int = sock.getsockname()[1]
        """The bound port (useful with port 0 in tests)."""
        if not is_loopback(host):
            warn(
                f"listening on {host}:{port}, which is reachable from other machines. The training "
                "link is neither encrypted nor authenticated: anyone who connects first can feed the "
                "trainer data and receive its networks. Use 127.0.0.1 unless the game runs elsewhere."
            )

    def accept(
        self,
        timeout: float,
        *,
        peer_alive: Callable[[], bool] | None = None,
        interrupted: Callable[[], bool] | None = None,
        timeout_hint: str = ACCEPT_HINT,
        notice: Callable[[float], None] | None = None,
        notice_after: float = math.inf,
    ) -> TcpConnection:
        """Wait up to ``timeout`` s (``math.inf``: no bound) for the engine to connect; afterwards no one
        else can connect. The wait is :func:`~trainer.session.transport.wait.wait_until` with the listener's
        readiness as its idle; ``timeout_hint``, ``notice`` and ``notice_after`` are passed to it.

        The listening socket is closed as soon as one client is accepted, so a second client is
        refused (or reset, if it was already queued) instead of waiting forever for a reply.

        Raises:
            WaitTimeout: nobody connected in time.
            PeerGone: ``peer_alive`` returned False (a spawning engine exited before connecting).
            Interrupted: ``interrupted`` returned True (SIGINT/SIGTERM while waiting).
        """
        listener = self._sock
        if listener is None:
            raise LaunchError("the server is closed")
        listener.setblocking(False)

        def try_accept() -> tuple[socket.socket, str] | None:
            try:
                conn, address = listener.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return None  # nobody yet, or the client gave up between the poll and the accept
            return conn, str(address[0])

        conn, host = wait_until(
            try_accept,
            timeout=timeout,
            what=f"the game to connect to {self.host}:{self.port}",
            poll_interval=_ACCEPT_SLICE,
            peer_alive=peer_alive,
            peer_check_interval=_ACCEPT_SLICE,
            interrupted=interrupted,
            idle=lambda seconds: _wait_readable(listener, seconds),  # returns early once a client knocks
            timeout_hint=timeout_hint,
            notice=notice,
            notice_after=notice_after,
        )
        self.close()
        # The connection is how we see that the game lives (waits on it have no bound), so a machine
        # that vanishes without closing it must still be noticed: keep-alive.
        enable_keepalive(conn)
        return TcpConnection(conn, send_timeout=self._send_timeout, peer=f"the game at {host}")

    @property
    def listener(self) -> socket.socket:
        """The listening socket (to wait for readiness beside other sockets, :func:`wait_any_readable`)."""
        if self._sock is None:
            raise LaunchError("the server is closed")
        return self._sock

    def accept_ready(self) -> TcpConnection | None:
        """One client the kernel has already queued, as a connection with keep-alive on, or None: never
        waits, and keeps listening (unlike :meth:`accept`), so several clients can be pending at once."""
        listener = self.listener
        listener.setblocking(False)
        try:
            conn, address = listener.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return None  # nobody queued, or the client gave up between the poll and the accept
        enable_keepalive(conn)  # as accept() does: a silent peer's vanished machine is noticed
        return TcpConnection(conn, send_timeout=self._send_timeout, peer=f"the game at {address[0]}")

    def close(self) -> None:
        """Stop listening (clients still queued are reset). Idempotent."""
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def __enter__(self) -> TcpServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def connect_with_retry(host: str, port: int, timeout: float, *, send_timeout: float = 30.0) -> TcpConnection:
    """Connect as the engine does: retry about every 1 ms until ``timeout`` s (emulator, tests).

    Raises:
        WaitTimeout: no server accepted within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    last_error: OSError | None = None
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise WaitTimeout(
                f"timed out after {timeout:g} s connecting to the trainer at {host}:{port} ({last_error})"
            )
        try:
            sock = socket.create_connection((host, port), timeout=max(remaining, 0.001))
        except (ConnectionRefusedError, ConnectionResetError, TimeoutError) as error:
            last_error = error
            time.sleep(_CONNECT_RETRY)
            continue
        return TcpConnection(sock, send_timeout=send_timeout, peer=f"the trainer at {host}:{port}")


def _wait_readable(sock: socket.socket, timeout: float) -> bool:
    # poll() where it exists: select() fails on descriptors above FD_SETSIZE (1024). An infinite
    # timeout blocks until the socket is readable (neither call takes math.inf).
    blocking = math.isinf(timeout)
    timeout = max(timeout, 0.0)
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(sock, select.POLLIN | select.POLLPRI)
        return bool(poller.poll(None if blocking else timeout * 1000.0))
    readable, _, _ = select.select([sock], [], [], None if blocking else timeout)  # pragma: no cover
    return bool(readable)


def wait_any_readable(socks: Sequence[socket.socket], timeout: float) -> None:
    """Wait up to ``timeout`` seconds (at least 0, finite) until one of ``socks`` is readable (data, EOF
    or, for a listener, a queued client); returns early then, and never raises for a closed peer."""
    timeout = max(timeout, 0.0)
    if not socks:
        time.sleep(timeout)
        return
    if hasattr(select, "poll"):  # select() fails on descriptors above FD_SETSIZE (see _wait_readable)
        poller = select.poll()
        for sock in socks:
            poller.register(sock, select.POLLIN | select.POLLPRI)
        poller.poll(timeout * 1000.0)
        return
    select.select(list(socks), [], [], timeout)  # pragma: no cover - Windows (at most 512 sockets)


def enable_keepalive(sock: socket.socket, *, platform: str | None = None) -> list[str]:
    """Turn on TCP keep-alive with :data:`KEEPALIVE_IDLE_S`, :data:`KEEPALIVE_INTERVAL_S` and
    :data:`KEEPALIVE_PROBES` where the OS lets us tune them; returns the options that were set.

    Linux has all three socket options; macOS has the idle time (``TCP_KEEPALIVE``) and, from Python
    3.10 on recent releases, the other two; Windows 10 1709+ has all three (older Windows: the idle
    time and interval through ``SIO_KEEPALIVE_VALS``). An option the OS refuses is skipped: keep-alive
    with the system's defaults (two hours of silence on most systems) is still better than none.
    """
    applied: list[str] = []
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        applied.append("SO_KEEPALIVE")
    except OSError:
        return applied
    tuning = (
        ("TCP_KEEPIDLE", KEEPALIVE_IDLE_S),
        ("TCP_KEEPALIVE", KEEPALIVE_IDLE_S),  # macOS's name for the idle time
        ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
        ("TCP_KEEPCNT", KEEPALIVE_PROBES),
    )
    for name, value in tuning:
        option = getattr(socket, name, None)
        if option is None or (name == "TCP_KEEPALIVE" and "TCP_KEEPIDLE" in applied):
            continue
        try:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)
            applied.append(name)
        except OSError:
            continue
    if "TCP_KEEPIDLE" not in applied and (platform or sys.platform) == "win32":  # pragma: no cover
        ioctl = getattr(sock, "ioctl", None)
        vals = getattr(socket, "SIO_KEEPALIVE_VALS", None)
        if ioctl is not None and vals is not None:
            with contextlib.suppress(OSError):
                ioctl(vals, (1, KEEPALIVE_IDLE_S * 1000, KEEPALIVE_INTERVAL_S * 1000))
                applied.append("SIO_KEEPALIVE_VALS")
    return applied
