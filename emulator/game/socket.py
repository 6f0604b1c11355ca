"""The engine's socket communicator (spec §1.3, §3, §10 items 7, 8).

The engine is the TCP client; one JSON config object, networks with signal 4, experience with signal 2
(NetworksVersion −1 until a network came back), replies decoded with
:class:`protocol.stream.GameStreamDecoder`.

The socket rules that differ from shared memory's: every wait tests process liveness *first*, so after
the process exits ``HasNetworkOrCompleted`` is false and reads fail even with bytes buffered (§10 item 7):
a trainer that exits right after Complete loses it. ``HasNetworkOrCompleted`` peeks one byte and consumes
at most one leading ping per tick (§10 item 8). The rules all transports share are in
:mod:`emulator.game.common`.
"""

from __future__ import annotations

import contextlib
import select
import socket
import time
from collections.abc import Sequence
from typing import cast

from emulator.game.common import (
    COMPLETED,
    DEFAULT_ENGINE_TIMEOUT_S,
    ENGINE_POLL_S,
    Completed,
    EngineFailure,
    Failure,
    ProcessAlive,
    ReceivedNetwork,
    RoundResult,
    engine_load_snapshot,
    engine_wait,
    receive_round,
)
from protocol.config import SessionConfig, dump_json, socket_config_to_json
from protocol.errors import ProtocolError
from protocol.replay import ReplayBuffer, ReplayLayout
from protocol.stream import (
    NEED_DATA,
    Complete,
    GameStreamDecoder,
    NetworkToGame,
    Ping,
    Signal,
    encode_config,
    encode_network_to_trainer,
    encode_stop,
)

__all__ = ["SocketGame"]


class SocketGame:
    """The engine's socket communicator (§3): a TCP client to the trainer's listening socket.

    Build with :meth:`connect`, then :meth:`begin`. ``networks_version`` is the engine's NetworksVersion:
    −1 until a network came back, then the version of the latest one (§8).
    """

    def __init__(
        self,
        sock: socket.socket,
        *,
        timeout: float,
        process_alive: ProcessAlive | None,
    ) -> None:
        self.sock = sock
        self.timeout = timeout
        self.process_alive = process_alive
        self.networks_version = -1
        self.session: SessionConfig | None = None
        self.network_sizes: dict[int, int] = {}
        self._decoder: GameStreamDecoder | None = None
        self.pings_taken = 0
        """Pings consumed (by the tick peek or inside a receive)."""
        self.closed_at: float | None = None
        self.peer_closed = False
        """The tick peek saw the trainer close the connection (the engine itself would wait forever)."""
        self.events: list[tuple[float, str]] = []
        self.take_late_s = 0.0
        """Seconds the game takes each network late (a slow frame; :func:`emulator.game.common.receive_round`)."""
        # Sends block at most the communicator timeout; receives poll first, so recv never blocks.
        sock.settimeout(timeout)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    @classmethod
    def connect(
        cls,
        host: str,
        port: int,
        *,
        timeout: float = DEFAULT_ENGINE_TIMEOUT_S,
        process_alive: ProcessAlive | None = None,
    ) -> SocketGame:
        """Connect as the engine does: retry about every 1 ms until ``timeout`` seconds (§1.3)."""
        slept = 0.0
        last: OSError | None = None
        while True:
            try:
                sock = socket.create_connection((host, port), timeout=max(timeout - slept, ENGINE_POLL_S))
            except OSError as exc:
                last = exc
            else:
                game = cls(sock, timeout=timeout, process_alive=process_alive)
                game._note(f"connected to {host}:{port}")
                return game
            if slept >= timeout:
                raise EngineFailure(
                    Failure.SETUP,
                    f"could not connect to the trainer at {host}:{port} within {timeout:g} s ({last})",
                )
            time.sleep(ENGINE_POLL_S)
            slept += ENGINE_POLL_S  # the same accounting as every engine wait (see engine_wait)

    # -- helpers -----------------------------------------------------------------------------------------
    def _note(self, what: str) -> None:
        self.events.append((time.monotonic(), what))

    def _alive(self) -> bool:
        return self.process_alive is None or self.process_alive()

    def _readable(self) -> bool:
        if self.closed_at is not None:
            return False
        poller = select.poll()
        poller.register(self.sock, select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR)
        return bool(poller.poll(0))

    def peer_hung_up(self) -> bool:
        """The trainer closed its end of the connection (FIN or reset), even with unread bytes before it.

        Not an engine call: the harness uses it to tell "still waiting for the close" from "gone" while
        Complete is pending (§10 item 7), without consuming anything.
        """
        if self.closed_at is not None:
            return False
        poller = select.poll()
        poller.register(self.sock, getattr(select, "POLLRDHUP", 0) | select.POLLHUP | select.POLLERR)
        return bool(poller.poll(0))

    def _send(self, parts: Sequence[bytes | memoryview], what: str) -> None:
        try:
            for part in parts:
                self.sock.sendall(part)
        except TimeoutError:
            raise EngineFailure(
                Failure.TIMEOUT, f"sending {what}: the trainer did not read for {self.timeout:g} s"
            ) from None
        except OSError as exc:
            raise EngineFailure(Failure.DISCONNECTED, f"sending {what}: {exc}") from None

    # -- BeginTraining ------------------------------------------------------------------------------------
    def begin(self, session: SessionConfig, *, raw_config: bytes | None = None) -> None:
        """Send the config: one JSON object, data + model keys + TrainerSettings, no TempDirectory (§3).

        ``raw_config`` replaces the encoded JSON (fault injection for tests).
        """
        if self.session is not None:
            raise EngineFailure(Failure.SETUP, "begin() was already called")
        self.session = session
        self.network_sizes = {net.id: net.max_byte_num for net in session.model.networks}
        self._decoder = GameStreamDecoder(self.network_sizes)
        raw = raw_config
        if raw is None:
            raw = dump_json(socket_config_to_json(session))
        self._send(encode_config(raw), "the config")
        self._note(f"config sent ({len(raw)} bytes)")

    def send_network(self, network_id: int, data: bytes) -> None:
        """SendNetwork: byte 4, int32 id, the snapshot (exactly MaxByteNum)."""
        size = self.network_sizes.get(network_id)
        if size is None or len(data) != size:
            raise EngineFailure(
                Failure.SETUP, f"network {network_id} snapshot is {len(data)} bytes, MaxByteNum {size}"
            )
        self._send(encode_network_to_trainer(network_id, data), f"network {network_id}")
        self._note(f"network {network_id} sent")

    def send_experience(self, rb: ReplayBuffer) -> None:
        """SendExperience: byte 2, NetworksVersion, ReplayBufferId, E, S, then the arrays (§3)."""
        if self.session is None:
            raise EngineFailure(Failure.SETUP, "send_experience() before begin()")
        layout = ReplayLayout.from_config(self.session.replay_buffer(rb.replay_buffer_id))
        parts = [bytes((Signal.SEND_EXPERIENCE,)), *layout.encode_socket_parts(rb, self.networks_version)]
        self._send(parts, "the experience")
        self._note(
            f"experience sent: E={rb.episode_num} S={rb.step_num} NetworksVersion={self.networks_version}"
        )

    # -- IterateTraining ----------------------------------------------------------------------------------
    def has_network_or_completed(self) -> bool:
        """Peek one byte (§3). False once the spawned process exited, even with Complete pending
        (§10 item 7). A leading ping is consumed and the answer is False for this tick (§10 item 8).

        [INF] Whether the engine peeks again after consuming a ping is not known; answering False keeps
        the stricter reading, under which pings sent faster than the tick rate delay networks.
        [INF] A closed connection peeks as "nothing": the engine learns of it in its next blocking call.
        """
        if not self._alive() or not self._readable():
            return False
        try:
            head = self.sock.recv(1, socket.MSG_PEEK)
        except OSError:
            return False
        if not head:
            if not self.peer_closed:
                self.peer_closed = True
                self._note("the trainer closed the connection")
            return False
        if head[0] == Signal.RECV_PING:
            self.sock.recv(1)
            self.pings_taken += 1
            return False
        return True

    def _pump(self) -> NetworkToGame | Complete | Ping | None:
        """Read what is available of the current message (never past it) and return a finished event."""
        decoder = self._decoder
        assert decoder is not None  # begin() first: a programming error in the test, not peer data
        while self._readable():
            view = decoder.get_buffer(-1)
            try:
                n = self.sock.recv_into(view)
            except OSError as exc:
                decoder.buffer_updated(0)
                raise EngineFailure(Failure.DISCONNECTED, f"the connection failed: {exc}") from None
            decoder.buffer_updated(n)
            if n == 0:
                try:
                    decoder.eof()
                except ProtocolError as exc:
                    raise EngineFailure(
                        Failure.DISCONNECTED, f"the trainer closed the connection: {exc}"
                    ) from None
                raise EngineFailure(Failure.DISCONNECTED, "the trainer closed the connection")
            try:
                event = decoder.next_event()
            except ProtocolError as exc:
                raise EngineFailure(Failure.UNEXPECTED, str(exc)) from None
            if event is not NEED_DATA:
                return event
        return None

    def receive_network(self, network_id: int) -> ReceivedNetwork | Completed:
        """``ReceiveNetwork(i)``: wait for a signal byte; Ping resets the clock, Complete ends, RecvNetwork
        must carry id ``i`` and exactly MaxByteNum bytes (§3). Reads fail once the process exited."""
        pinged = False

        def poll() -> NetworkToGame | Complete | None:
            nonlocal pinged
            event = self._pump()
            if isinstance(event, Ping):
                self.pings_taken += 1
                pinged = True
                return None
            return event

        def take_ping() -> bool:
            nonlocal pinged
            was, pinged = pinged, False
            return was

        event = cast(
            "NetworkToGame | Complete",
            engine_wait(
                poll,
                timeout=self.timeout,
                what=f"waiting for network {network_id}",
                take_ping=take_ping,
                process_alive=self.process_alive,
                liveness_first=True,
            ),
        )
        if isinstance(event, Complete):
            self._note("Complete received")
            return COMPLETED
        if event.network_id != network_id:
            raise EngineFailure(
                Failure.UNEXPECTED,
                f"expected network {network_id} but the trainer sent network {event.network_id}",
            )
        data = bytes(event.data)
        header = engine_load_snapshot(data, self.network_sizes[network_id], network_id)
        self.networks_version = event.version
        self._note(f"network {network_id} received (version {event.version})")
        return ReceivedNetwork(network_id, data, header, event.version, time.monotonic())

    def receive_round(self) -> RoundResult:
        """Networks 0..N−1 in order, or Completed in place of network 0 (§7.1)."""
        return receive_round(self.receive_network, sorted(self.network_sizes), self.take_late_s)

    # -- EndTraining / DoneTraining -----------------------------------------------------------------------
    def stop(self) -> None:
        """``EndTraining``: the single byte 6 (§3)."""
        self._send([encode_stop()], "Stop")
        self._note("Stop sent")

    def done(self) -> None:
        """``DoneTraining`` → Terminate: close the connection (no Stop after Completed, §10 item 7).

        The engine does not drain the socket first; unread trainer bytes make the close a reset, which a
        trainer must survive as well.
        """
        if self.closed_at is None:
            with contextlib.suppress(OSError):
                self.sock.close()
            self.closed_at = time.monotonic()
            self._note("connection closed")

    def close(self) -> None:
        self.done()
