"""Socket runs decided from what the game sends: accept its connection, read its config, and either keep
it (FlowMatching: la-trainer's link adopts the connection and the bytes read) or relay the session to the
engine's own ``train.py`` (every other method).

Over a socket the engine spawns ``train.py ... Socket IP:PORT TEMP_DIR`` and connects once, as a client,
right after (spec §1.3); the first thing it sends is its config, the trainer method inside it (§3). The
engine's default ``-m`` (``learning_core.train_behavior_cloning``) is what flow-matching call sites send
too (§1.6), so ``-m`` cannot tell the methods apart. The engine's own script is a listener itself and
cannot adopt a connection from another process, so for another method this process becomes a relay:

* the script runs as our child with the identical argv except the address, a free loopback port, and
  with our output handles (its lines reach the engine's log as ours);
* everything already read from the game (the config) is replayed to the script first, then bytes are
  copied both ways until both sides have closed; each side's end of stream is passed on to the other;
* we exit with the script's exit code, after it: the engine watches this process (§10 item 7: it must
  not exit before the game has closed the connection), and the script sees the end of the stream when
  the engine or the game goes, or when this process is killed.

Standard library only (with :mod:`protocol.names` and :mod:`trainer.settings.environment`): a half install (:mod:`trainer.dropin.method`) is
decided here too.
"""

from __future__ import annotations

import json
import os
import selectors
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from protocol.argv import SOCKET

__all__ = [
    "ConfigRead",
    "GameGone",
    "listen_error_message",
    "read_game_config",
    "relay_hand_over",
    "relayed_argv",
]

SEND_CONFIG = 1
"""ESignal SendConfig (spec §3): the game's first message."""
_CONFIG_LIMIT = 64 << 20
"""A config larger than this is not the engine's; the trainer's own decoder reports it."""
_POLL_S = 0.1
"""How often a wait here looks at the engine's process between socket readiness checks."""
_CHUNK = 1 << 20
_CAP = 16 << 20
"""Bytes held for one direction before the relay stops reading its source (the destination is slow)."""
_SCRIPT_START_CHECK_S = 0.2


class GameGone(Exception):
    """The engine (or its connection) went away before the config was read."""


@dataclass
class ConfigRead:
    """The accepted connection, every byte read from it so far, and the config's trainer method (None
    when the first message is not a config the method can be read from: the trainer reports that)."""

    connection: socket.socket
    received: bytes
    method: str | None


def _listen(host: str, port: int) -> socket.socket:
    """Bound and listening as the trainer link would be (:class:`trainer.session.transport.tcp.TcpServer`)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    infos.sort(key=lambda info: info[0] != socket.AF_INET)  # the engine connects to IPv4 first
    family, socktype, proto, _, address = infos[0]
    listener = socket.socket(family, socktype, proto)
    try:
        if sys.platform == "win32":  # pragma: no cover - Windows only
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_EXCLUSIVEADDRUSE, 1)  # type: ignore[attr-defined,unused-ignore]
        else:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen(1)
    except OSError:
        listener.close()
        raise
    return listener


def listen_error_message(host: str, port: int, error: OSError) -> str:
    """What to say when ``host:port`` cannot be listened on (the words of the trainer link's own check)."""
    from trainer.session.transport.tcp import listen_refusal

    return listen_refusal(host, port, error)


def _wait_readable(
    sock: socket.socket, engine_alive: Callable[[], bool], what: str, interrupted: Callable[[], bool]
) -> None:
    with selectors.DefaultSelector() as selector:
        selector.register(sock, selectors.EVENT_READ)
        while not selector.select(_POLL_S):
            if interrupted():
                raise KeyboardInterrupt  # SIGINT/SIGTERM while waiting: the trainer's "interrupted"
            if not engine_alive():
                raise GameGone(f"the engine went away while la-trainer waited for {what}")


def _read_exactly(
    conn: socket.socket,
    size: int,
    engine_alive: Callable[[], bool],
    what: str,
    interrupted: Callable[[], bool],
) -> bytes:
    data = bytearray()
    while len(data) < size:
        _wait_readable(conn, engine_alive, what, interrupted)
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise GameGone(f"the game closed the connection before sending {what}")
        data += chunk
    return bytes(data)


def read_game_config(
    host: str,
    port: int,
    *,
    engine_alive: Callable[[], bool],
    interrupted: Callable[[], bool] = lambda: False,
) -> ConfigRead:
    """Listen on ``host:port``, accept the engine's one connection, read its SendConfig message.

    Raises OSError when the address cannot be listened on (:func:`listen_error_message`), :class:`GameGone`
    when the engine goes first, KeyboardInterrupt once ``interrupted()``. No bound: the engine process
    shows that a game is there (a paused editor may connect late).
    """
    from protocol.names import trainer_method

    listener = _listen(host, port)
    try:
        _wait_readable(listener, engine_alive, f"the game to connect to {host}:{port}", interrupted)
        conn, _ = listener.accept()
    finally:
        listener.close()  # one client only (§3)
    try:
        conn.setblocking(True)
        signal = _read_exactly(conn, 1, engine_alive, "its config", interrupted)
        if signal[0] != SEND_CONFIG:
            return ConfigRead(conn, signal, None)
        header = _read_exactly(conn, 4, engine_alive, "its config", interrupted)
        (size,) = struct.unpack("<i", header)
        if not 0 <= size <= _CONFIG_LIMIT:
            return ConfigRead(conn, signal + header, None)
        body = _read_exactly(conn, size, engine_alive, "its config", interrupted)
    except BaseException:
        conn.close()
        raise
    received = signal + header + body
    try:
        obj = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return ConfigRead(conn, received, None)
    settings = obj.get("TrainerSettings") if isinstance(obj, dict) else None
    return ConfigRead(conn, received, trainer_method(settings))


def relayed_argv(argv: Sequence[str], port: int) -> list[str]:
    """The engine's argv with the ``Socket`` address replaced by ``127.0.0.1:<port>``, all else verbatim."""
    out = list(argv)
    for index, item in enumerate(out[:-1]):
        if item == SOCKET:
            out[index + 1] = f"127.0.0.1:{port}"
            return out
    raise ValueError("no Socket address in the command line")


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def relay_hand_over(target: Path, argv: Sequence[str], game: ConfigRead) -> int:
    """Run the engine's ``target`` script for this session and relay the game's connection to it; the
    script's exit code (see the module docstring)."""
    from trainer.settings.environment import ENV_HANDED_OVER

    port = _free_loopback_port()
    command = [sys.executable, str(target), *relayed_argv(argv, port)]
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    # Our output handles: the script's lines go into the pipe the engine reads.
    child = subprocess.Popen(command, env={**os.environ, ENV_HANDED_OVER: "1"}, stdin=subprocess.DEVNULL)
    try:
        pending = bytearray(game.received)
        script = _connect_to_script(port, child, game.connection, pending)
        if script is not None:
            with script:
                _copy_both_ways(game.connection, script, pending, child)
        return child.wait()
    finally:
        game.connection.close()
        if child.poll() is None:
            # Leaving early (an error, a second signal): the script has lost its game with us.
            child.kill()
            child.wait()


def _connect_to_script(
    port: int, child: subprocess.Popen[bytes], game: socket.socket, pending: bytearray
) -> socket.socket | None:
    """Connect to the script once it listens (None when it ended first). What the game sends meanwhile
    (networks and experience follow the config unasked, §3) is kept in ``pending``."""
    game.setblocking(False)
    while child.poll() is None:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=_SCRIPT_START_CHECK_S)
        except OSError:
            pass
        try:
            while chunk := game.recv(_CHUNK):
                pending += chunk
        except OSError:
            pass  # nothing more yet (or the game is gone: the script sees the end of its stream)
        time.sleep(_SCRIPT_START_CHECK_S)
    return None


def _copy_both_ways(
    game: socket.socket, script: socket.socket, to_script: bytearray, child: subprocess.Popen[bytes]
) -> None:
    """Relay until both directions have ended, or the script has ended and said all it had to say.

    Non-blocking with a buffer per direction, so that a side that is busy sending (a large experience
    one way, a network the other) never stops the relay from reading it. An end of stream, a reset or
    a failed send ends that direction and is passed on as an end of stream to the other side.
    """
    peer = {game: script, script: game}
    outgoing = {game: bytearray(), script: to_script}  # bytes waiting to be written to the key
    reading = {game, script}
    shut: set[socket.socket] = set()
    gone: set[socket.socket] = set()
    for side in (game, script):
        side.setblocking(False)
    with selectors.DefaultSelector() as selector:
        masks: dict[socket.socket, int] = {}
        while reading or outgoing[game] or outgoing[script]:
            if script not in reading and not outgoing[game] and child.poll() is not None:
                return  # the script is done and everything it sent has reached the game
            for side in (game, script):
                mask = (
                    selectors.EVENT_READ if side in reading and len(outgoing[peer[side]]) < _CAP else 0
                ) | (selectors.EVENT_WRITE if outgoing[side] else 0)
                if mask != masks.get(side, 0):
                    if side in masks:
                        selector.unregister(side)
                        del masks[side]
                    if mask:
                        selector.register(side, mask)
                        masks[side] = mask
            for key, events in selector.select(_POLL_S):
                ready = key.fileobj
                assert isinstance(ready, socket.socket)
                if events & selectors.EVENT_READ:
                    try:
                        chunk = ready.recv(_CHUNK)
                    except (BlockingIOError, InterruptedError):
                        chunk = None
                    except OSError:
                        chunk = b""
                    if chunk:
                        if peer[ready] not in gone:
                            outgoing[peer[ready]] += chunk
                    elif chunk is not None:
                        reading.discard(ready)
                if events & selectors.EVENT_WRITE:
                    try:
                        del outgoing[ready][: ready.send(outgoing[ready])]
                    except (BlockingIOError, InterruptedError):
                        pass
                    except OSError:
                        # That side is gone: nothing more reaches it, and its end is passed on below.
                        gone.add(ready)
                        outgoing[ready].clear()
                        reading.discard(ready)
            for side in (game, script):
                other = peer[side]
                if side not in reading and not outgoing[other] and other not in shut:
                    shut.add(other)
                    try:
                        other.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
