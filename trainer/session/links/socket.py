"""The trainer's half of a session over a socket (spec §3): we listen, the engine connects once and streams
config, networks and experience; the bytes are framed by :class:`protocol.stream.TrainerStreamDecoder`.

The engine's liveness is watched through the connection (EOF, reset, TCP keep-alive) and, when it spawned
us, the engine process: once connected, every wait lasts as long as the game lives (a paused editor
included, :mod:`trainer.settings.timeouts`). Only a listener nobody has connected to, in a trainer the game did
not spawn, cannot see a game at all: that wait is bounded by ``Timeouts.wait``, announced when it starts.

The server (``la-trainer socket``) serves session after session (``serve``): its wait for a game has no
bound, and :meth:`SocketTrainerLink.next_session` closes the finished session's connection and listens
again on the same port.

A connection is a game once its config is in (issue 30). Until then the link keeps listening and holds up
to :data:`PENDING_LIMIT` connections side by side, reading each as its bytes come; the first that
completes a valid config (parsed and usable to size the stream) is the session, every other one is closed.
A connection that closes, sends bytes that are not a config, or takes longer than
``Timeouts.config_wait`` from its first byte to its complete config is closed and logged, and the wait
goes on: a silent, slow or junk peer never holds up a game (the engine gives up connecting after 10 s,
spec §1.6) and never becomes a session, so it leaves no run folder. A connection that has sent nothing
is not timed: a game connects when its communicator is made and sends its config when it begins
training, possibly minutes later.
"""

from __future__ import annotations

import math
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import TracebackType
from typing import TypeVar

from protocol.config import SessionConfig, parse_json, session_from_socket
from protocol.errors import ProtocolError, StreamError
from protocol.names import CommType
from protocol.replay import ReplayBuffer, ReplayLayout
from protocol.stream import (
    NEED_DATA,
    ConfigMessage,
    ExperienceMessage,
    NetworkToTrainer,
    Stop,
    TrainerStreamDecoder,
    encode_complete,
    encode_network_to_game,
    encode_ping,
)
from trainer.errors import LaunchError, PeerGone
from trainer.session.links.base import check_snapshot_size
from trainer.session.transport.tcp import (
    ACCEPT_HINT,
    TcpConnection,
    TcpServer,
    enable_keepalive,
    wait_any_readable,
)
from trainer.session.transport.wait import StopRequested, WaitRule, after_grace, wait_until
from trainer.settings.timeouts import CONFIG_WAIT_ADVICE, Timeouts
from trainer.system.console import log

__all__ = ["PENDING_LIMIT", "SocketTrainerLink"]

T = TypeVar("T")

_SOCKET_POLL_SLICE = 0.05
"""Seconds per readiness wait on the socket, so peer checks run between them."""
_BODY_BURST_SECONDS = 0.05
"""Longest run of back-to-back receives into a message body before the link looks at events again."""

PENDING_LIMIT = 16
"""Connections held at once while no valid config has come. A newcomer beyond it closes the oldest
pending one: a flood of idle connections cannot lock a game out (the game that connects now sends its
config within milliseconds of beginning training, and wins)."""
_RECEIVES_PER_POLL = 8
"""Receives from one pending connection per poll, so a fast sender cannot starve the others."""
_CLOSED_LINES = 10
"""Closed pending connections logged one line each per wait for a game; further ones are counted."""


@dataclass(eq=False)
class _Pending:
    """A connection that has not sent a valid config yet, with its own decoder."""

    conn: TcpConnection
    source: str
    decoder: TrainerStreamDecoder
    first_byte_at: float | None = None
    config: SessionConfig | None = None


class SocketTrainerLink:
    """Socket link: we listen, the engine connects once and streams config, networks and experience.

    Binding happens in the constructor, so a port in use fails before any waiting. The connection is
    accepted by :meth:`receive_config`. Messages are decoded as they arrive and kept until asked for:
    the engine sends networks 0, 1, 2 and the experience without being asked, and Stop at any time.

    ``peer_alive`` (:func:`~trainer.system.liveness.parent_watch` when the engine spawned us) and
    ``interrupted`` are polled during waits, as in :class:`~trainer.session.links.shm.ShmTrainerLink`; with
    ``peer_alive`` even the wait for the connection has no bound. ``serve``: a server that waits for
    each game without a bound and serves the next one after :meth:`next_session`.
    """

    comm_type = CommType.SOCKET
    """See :attr:`TrainerLink.comm_type <trainer.session.links.base.TrainerLink.comm_type>`."""

    def __init__(
        self,
        host: str,
        port: int,
        timeouts: Timeouts | None = None,
        *,
        peer_alive: Callable[[], bool] | None = None,
        interrupted: Callable[[], bool] | None = None,
        serve: bool = False,
        output: Callable[[str], None] = log,
        accepted: tuple[socket.socket, bytes] | None = None,
    ) -> None:
        self._timeouts = timeouts or Timeouts()
        self._interrupted = interrupted
        self._serve = serve
        self._say = output
        # accepted: the game's connection and the bytes already read from it, taken over from the
        # drop-in, which read the config first to decide whether this run is ours (trainer.dropin.relay).
        self._server: TcpServer | None = (
            TcpServer(host, port, backlog=PENDING_LIMIT) if accepted is None else None
        )
        self._host = host
        # The next session listens on the same port (port 0 too).
        self._bound_port = self._server.port if self._server is not None else port
        self._peer_alive_check = peer_alive
        # Before a connection only a spawning engine's process shows that a game is there; once connected,
        # the connection does (the rule becomes visible in receive_config).
        self._rule = self._accept_rule()
        self._conn: TcpConnection | None = None
        self._decoder = TrainerStreamDecoder()
        self._send_lock = threading.Lock()
        # Training polls for Stop while the sync rounds go out from the sender's thread
        # (trainer.session.sender), which reads too when a send fails: one reader at a time.
        self._receive_lock = threading.Lock()
        self._config_message: ConfigMessage | None = None
        self._config: SessionConfig | None = None
        self._networks: dict[int, bytes] = {}
        self._experiences: deque[ReplayBuffer] = deque()
        self.networks_version: int | None = None
        """NetworksVersion echoed in the last experience message (−1 before any network arrived)."""
        self._stop = False
        self._eof = False
        self._eof_detail = ""
        self._truncated = False
        self._closed = False
        self._config_wait_announced = False
        if accepted is not None:
            enable_keepalive(accepted[0])  # as TcpServer.accept does: a vanished machine is noticed
            self._conn = TcpConnection(accepted[0], peer="the game")
            self._rule = WaitRule(self._timeouts, visible=True, output=self._say)  # the connection shows it
            self._decoder.feed(accepted[1])

    def _accept_rule(self) -> WaitRule:
        if self._serve:
            # A server waits for its next client without a bound; the signals end it.
            return WaitRule(
                replace(self._timeouts, wait=math.inf),
                visible=False,
                why_unseen="serving",
                output=self._say,
                serving=True,
            )
        return WaitRule(
            self._timeouts,
            visible=self._peer_alive_check is not None,
            why_unseen="no game has connected yet and the trainer was not started by one",
            output=self._say,
        )

    @property
    def in_session(self) -> bool:
        """A game has connected in this session (before that, the link only listens)."""
        return self._conn is not None

    @property
    def wait_bound(self) -> float:
        """Seconds the link's next wait on the game may last: ``math.inf`` where it sees the game alive,
        else ``Timeouts.wait`` (:class:`~trainer.session.transport.wait.WaitRule`)."""
        return self._rule.bound

    @property
    def port(self) -> int:
        """The port we listen on (useful with port 0)."""
        if self._server is None:
            raise LaunchError("the socket link is no longer listening")
        return self._server.port

    # -- receiving -------------------------------------------------------------------------------------

    def _connection(self) -> TcpConnection:
        if self._conn is None:
            raise PeerGone("the game is not connected")
        return self._conn

    def _receive_once(self, conn: TcpConnection) -> None:
        """One recv straight into the decoder's buffer (zero copy for bodies), then, while a large body is
        arriving, more receives into it back to back (bounded by :data:`_BODY_BURST_SECONDS`, so stop,
        interrupt and peer checks still run); EOF is remembered."""
        decoder = self._decoder
        try:
            view = decoder.get_buffer(-1)
            decoder.buffer_updated(conn.recv_into(view, 0.0))
            # A 1 GiB replay buffer arrives in ~16k receives; going round the event pump for each (two
            # polls, the event drain, the clock) cost half the loopback rate (la-trainer bench).
            deadline = time.monotonic() + _BODY_BURST_SECONDS
            while decoder.body_remaining > 0:
                n = conn.recv_into_nowait(decoder.get_buffer(-1))
                decoder.buffer_updated(n)
                if n == 0 or time.monotonic() >= deadline:
                    break
        except PeerGone as error:
            decoder.buffer_updated(0)
            self._eof = True
            self._eof_detail = str(error)
            try:
                decoder.eof()
            except StreamError as truncated:
                # The engine vanished in the middle of a message: a peer failure, not bad framing.
                self._truncated = True
                self._eof_detail = f"the game closed the connection in the middle of a message ({truncated})"

    def _drain_events(self) -> None:
        if self._truncated:
            return  # the decoder refuses further use after reporting the truncation
        while True:
            event = self._decoder.next_event()
            if event is NEED_DATA:
                return
            if isinstance(event, Stop):
                self._stop = True
            elif isinstance(event, ConfigMessage):
                self._config_message = event
            elif isinstance(event, NetworkToTrainer):
                if event.network_id in self._networks:
                    raise StreamError(
                        f"network {event.network_id} arrived twice before the trainer used it",
                        field="NetworkId",
                        actual=event.network_id,
                    )
                self._networks[event.network_id] = bytes(event.data)
            elif isinstance(event, ExperienceMessage):
                self.networks_version = event.networks_version
                # The decoder allocated this body for this message alone: the arrays already own it.
                self._experiences.append(event.replay)

    def _wait(self, ready: Callable[[], T | None], what: str) -> T:
        """Receive and decode until ``ready()`` returns something (:func:`wait_until`, socket rules)."""
        conn = self._connection()

        def idle(seconds: float) -> None:
            # Block on readiness instead of sleeping: data (or EOF) ends the idle time at once.
            if conn.poll_readable(seconds):
                self._receive_once(conn)

        return wait_until(
            ready,
            timeout=self._rule.start(what),
            what=what,
            notice=self._rule.notice(what),
            notice_after=self._timeouts.notice_after,
            poll_interval=_SOCKET_POLL_SLICE,
            on_poll=self._drain_events,
            check=self._check_stream,
            interrupted=self._interrupted,
            peer_alive=self._peer_alive_check,
            peer_check_interval=self._timeouts.peer_check_interval,
            idle=idle,
            # Connected: no bound, and address and port are right, so the generic advice would mislead.
            timeout_hint="",
        )

    def _check_stream(self, what: str) -> None:
        """What only the stream can end a wait with: the game's Stop, then its EOF."""
        if self._stop:
            raise StopRequested(f"the game asked the trainer to stop while it was waiting for {what}")
        if self._eof:
            raise PeerGone(f"the engine went away while waiting for {what}: {self._eof_detail}")

    def receive_config(self) -> SessionConfig:
        """The engine's SendConfig message (§3): listening, the first connection to send a valid config is
        the session (:meth:`_admit`); a connection taken over from the drop-in is read for it."""
        if self._config is not None:
            return self._config
        if self._conn is None:
            server = self._server
            if server is None:
                raise LaunchError("the socket link is closed")
            what = f"the game to connect to {server.host}:{server.port} and send its config"
            if self._serve:
                self._say(
                    f"la-trainer: serving session after session on {server.host}:{server.port}: waiting for a "
                    "game with no bound (SIGINT/SIGTERM stop the server; --once: one session only)."
                )
            winner = self._admit(server, what)
            # The game's connection is the session: no second client (§3).
            self._server = None
            server.close()
            self._conn, self._decoder = winner.conn, winner.decoder
            # The connection shows the game lives.
            self._rule = WaitRule(self._timeouts, visible=True, output=self._say)
            assert winner.config is not None  # _admit returns only a connection whose config is valid
            self._config = winner.config
            return winner.config
        message = self._wait(lambda: self._config_message, "the game's config message")
        config = session_from_socket(parse_json(message.raw_json, "socket config"))
        _configure(self._decoder, config)
        self._config = config
        return config

    def _admit(self, server: TcpServer, what: str) -> _Pending:
        """Listen, holding every connection until one sends a valid config; return that one (its decoder
        configured, the bytes after its config still in it) and close the others (module docstring).

        The wait is the listener's (:class:`~trainer.session.transport.wait.WaitRule`): no bound where the game is
        seen or when serving, else ``Timeouts.wait``; SIGINT/SIGTERM and ``peer_alive`` end it."""
        config_wait = self._timeouts.config_wait
        if not self._config_wait_announced:
            self._config_wait_announced = True
            bound = f"{config_wait:g} s" if math.isfinite(config_wait) else "no bound"
            self._say(
                f"la-trainer: a connection is a game once its config has come; one that has begun its config "
                f"message must finish it within {bound} or it is closed, while others are served "
                f"({CONFIG_WAIT_ADVICE})."
            )
        pending: list[_Pending] = []
        closed = [0]

        def close(candidate: _Pending, why: str) -> None:
            pending.remove(candidate)
            candidate.conn.close()
            closed[0] += 1
            if closed[0] <= _CLOSED_LINES:
                self._say(
                    f"la-trainer: closed the connection from {candidate.source}: {why}; still waiting for a game."
                )
            elif closed[0] == _CLOSED_LINES + 1:
                self._say("la-trainer: more connections were closed before a game came; they are not logged.")

        def poll() -> _Pending | None:
            while (conn := server.accept_ready()) is not None:
                if len(pending) >= PENDING_LIMIT:
                    close(pending[0], f"{PENDING_LIMIT} connections were pending and a newer one came")
                pending.append(_Pending(conn, conn.peer.removeprefix("the game at "), TrainerStreamDecoder()))
            now = time.monotonic()
            for candidate in list(pending):
                why = self._read_pending(candidate, now)
                if candidate.config is not None:
                    return candidate
                if why is None and candidate.first_byte_at is not None:
                    if now - candidate.first_byte_at > config_wait:
                        why = (
                            f"its config message was not complete {config_wait:g} s after its first byte "
                            f"({CONFIG_WAIT_ADVICE})"
                        )
                if why is not None:
                    close(candidate, why)
            return None

        def idle(seconds: float) -> None:
            wait_any_readable([server.listener, *(c.conn.sock for c in pending)], seconds)

        winner: _Pending | None = None
        try:
            winner = wait_until(
                poll,
                timeout=self._rule.start(what),
                what=what,
                poll_interval=_SOCKET_POLL_SLICE,
                peer_alive=self._peer_alive_check,
                peer_check_interval=self._timeouts.peer_check_interval,
                interrupted=self._interrupted,
                idle=idle,
                timeout_hint=ACCEPT_HINT if self._rule.visible else f"{ACCEPT_HINT}. {self._rule.hint}",
                notice=self._rule.notice(what),
                notice_after=self._timeouts.notice_after,
            )
            return winner
        finally:
            others = [c for c in pending if c is not winner]
            for candidate in others:
                candidate.conn.close()
            if winner is not None and others:
                self._say(
                    f"la-trainer: a game's config came from {winner.source}: closed {len(others)} other "
                    "pending connection(s)."
                )

    @staticmethod
    def _read_pending(candidate: _Pending, now: float) -> str | None:
        """Receive what has arrived on a pending connection and decode it; sets ``candidate.config`` once a
        valid config is in. Returns why the connection must be closed, or None."""
        conn, decoder = candidate.conn, candidate.decoder
        try:
            for _ in range(_RECEIVES_PER_POLL):
                if not conn.poll_readable(0.0):
                    return None
                decoder.buffer_updated(conn.recv_into(decoder.get_buffer(-1), 0.0))
                if candidate.first_byte_at is None:
                    candidate.first_byte_at = now
                event = decoder.next_event()
                if isinstance(event, Stop):
                    return "it sent Stop before any config"
                if isinstance(event, ConfigMessage):
                    config = session_from_socket(parse_json(event.raw_json, "socket config"))
                    _configure(decoder, config)
                    candidate.config = config
                    return None
        except PeerGone:
            if candidate.first_byte_at is None:
                return "it closed the connection without sending anything"
            return "it closed the connection in the middle of its config message"
        except ProtocolError as error:
            # A bad signal, an absurd length, a config that does not parse or cannot size the stream:
            # not a game this trainer can serve. Said in full: a real game's refused config is explained.
            return f"what it sent is not a config la-trainer can use ({error})"
        except OSError as error:  # e.g. ETIMEDOUT: keep-alive found its machine gone
            return f"the connection failed ({error.strerror or error})"
        return None

    def receive_network(self, network_id: int) -> bytes:
        """The engine's SendNetwork for ``network_id`` (it sends 0, 1, 2 unasked after the config)."""
        self._require_config("receive_network")
        self._wait(lambda: network_id in self._networks, f"network {network_id} from the game")
        return self._networks.pop(network_id)

    def receive_experience(self) -> ReplayBuffer:
        """The engine's SendExperience; its arrays live in a buffer allocated for it alone."""
        self._require_config("receive_experience")
        self._wait(lambda: bool(self._experiences), "the replay buffer from the game")
        return self._experiences.popleft()

    def _require_config(self, what: str) -> SessionConfig:
        if self._config is None:
            raise StreamError(f"{what} needs the config first (call receive_config)", field=what)
        return self._config

    # -- sending ---------------------------------------------------------------------------------------

    def _send(self, parts: list[bytes | memoryview] | list[bytes]) -> None:
        conn = self._connection()
        # One lock for every writer: the keep-alive thread's ping must never land inside a message.
        with self._send_lock:
            try:
                # A signal lets the message finish (a half-sent network would break the stream) unless
                # the game stops reading for Timeouts.signal_grace (paused, stuck).
                conn.send_parts(
                    parts,
                    peer_alive=self._peer_alive_check,
                    interrupted=after_grace(self._interrupted, self._timeouts.signal_grace),
                )
            except PeerGone:
                # The engine may send Stop and close its socket while our network is still going out
                # (spec §2.4: after Stop it does not wait for the round). If a Stop is among what arrived,
                # this is the stop the game asked for, not a lost game.
                if self._stop_arrived(conn):
                    raise StopRequested(
                        "the game asked the trainer to stop while a network was being sent"
                    ) from None
                raise

    def _stop_arrived(self, conn: TcpConnection) -> bool:
        """Whether a Stop is among the bytes received so far (read without blocking; never raises)."""
        try:
            with self._receive_lock:
                while not self._eof and conn.poll_readable(0.0):
                    self._receive_once(conn)
                self._drain_events()
        except (OSError, PeerGone, StreamError):
            pass
        return self._stop

    def send_network(self, network_id: int, data: bytes, version: int) -> None:
        """RecvNetwork: id, version, snapshot; the snapshot goes out as a view, not joined (§3)."""
        config = self._require_config("send_network")
        check_snapshot_size(network_id, data, config.network(network_id).max_byte_num)
        self._send(encode_network_to_game(network_id, version, data))

    def send_complete(self) -> None:
        """RecvComplete; follow with :meth:`finish` (the engine closes the connection, §10 item 7)."""
        self._send([encode_complete()])

    def ping(self) -> None:
        """RecvPing, unless a message is being sent right now (its bytes keep the engine's clock alive)."""
        conn = self._conn
        if conn is None or self._closed:
            return
        if not self._send_lock.acquire(blocking=False):
            return
        try:
            conn.send_parts([encode_ping()], interrupted=self._interrupted)
        finally:
            self._send_lock.release()

    # -- stop, finish, close ---------------------------------------------------------------------------

    def stop_requested(self) -> bool:
        """Non-blocking: read whatever has arrived; True once SendStop was seen.

        Raises:
            PeerGone: the engine closed the connection without sending Stop (it crashed or quit).
        """
        if self._stop:
            return True
        conn = self._conn
        if conn is None or self._closed:
            return False
        with self._receive_lock:
            while not self._eof and conn.poll_readable(0.0):
                self._receive_once(conn)
            self._drain_events()
        if self._stop:
            return True
        if self._eof:
            raise PeerGone(f"the engine went away during training: {self._eof_detail}")
        return False

    def finish(self, timeout: float) -> None:
        """Wait for the engine to close the connection after Complete, for as long as the connection is
        open (it shows the game lives: a game paused right after Complete still gets it); ``timeout`` is
        not needed here.

        With a spawned trainer the engine stops reading the socket as soon as our process exits, even
        with Complete still buffered, so exiting first can lose the Complete (spec §10 item 7). After
        Complete the engine closes the connection itself (DoneTraining), so this ends on its own.
        """
        conn = self._conn
        if conn is None or self._closed or self._eof:
            return
        conn.wait_closed(math.inf, peer_alive=self._peer_alive_check, interrupted=self._interrupted)

    def next_session(self) -> None:
        """Serving: close this session's connection, forget what it sent and listen again on the same
        port for the next game (the listener was closed while a game was connected, so a second game
        was refused rather than left waiting, §3)."""
        if self._closed:
            raise LaunchError("the socket link is closed")
        with self._send_lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
        self._decoder = TrainerStreamDecoder()
        self._config_message = None
        self._config = None
        self._networks.clear()
        self._experiences.clear()
        self.networks_version = None
        self._stop = self._eof = self._truncated = False
        self._eof_detail = ""
        if self._server is None:
            self._server = self._listen_again()
        self._rule = self._accept_rule()

    def _listen_again(self) -> TcpServer:
        # Our side of the finished connection may sit in TIME_WAIT for a moment where the platform
        # refuses a rebind (SO_EXCLUSIVEADDRUSE on Windows): retry briefly before giving up.
        deadline = time.monotonic() + 5.0
        while True:
            try:
                return TcpServer(self._host, self._bound_port, backlog=PENDING_LIMIT)
            except LaunchError as error:
                if time.monotonic() >= deadline or (self._interrupted is not None and self._interrupted()):
                    raise LaunchError(f"cannot listen again for the next game: {error}") from None
                time.sleep(0.1)

    def close(self) -> None:
        """Close the connection and the listener. Idempotent."""
        if self._closed:
            return
        self._closed = True
        # Take the send lock so a keep-alive ping is not cut in half, but do not wait long: a ping stuck
        # in a full socket buffer would otherwise hold close() for the whole send timeout.
        locked = self._send_lock.acquire(timeout=1.0)
        try:
            conn, self._conn = self._conn, None
        finally:
            if locked:
                self._send_lock.release()
        server, self._server = self._server, None
        if conn is not None:
            conn.close()
        if server is not None:
            server.close()

    def __enter__(self) -> SocketTrainerLink:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _configure(decoder: TrainerStreamDecoder, config: SessionConfig) -> None:
    """Give the decoder the sizes the config declares (snapshot bytes, replay layouts), §3."""
    decoder.configure(
        {net.id: net.max_byte_num for net in config.model.networks},
        {rb.id: ReplayLayout.from_config(rb) for rb in config.data.replay_buffers},
    )
