"""A silent, slow or junk socket peer does not hold up a game (issue 30 item 2).

Facts, each checked against the real link over loopback:

* the listener keeps listening until a connection has sent a valid config: a game that connects while
  another client is connected (silent, or trickling its bytes) is served at once, within the engine's
  10 s connect timeout, and the other client is closed then;
* a connection whose config is not complete ``Timeouts.config_wait`` after its first byte is closed (the
  clock starts at the first byte: a game connects when its communicator is made and sends its config when
  it begins training, so silence is not timed); the bound is announced, with how to change it;
* whatever a connection does wrong before its config (a cut at any byte of SendConfig, an absurd length,
  a bad signal, Stop, a config that does not parse) closes that connection with a line saying why, and
  the next connection is served;
* at most :data:`~trainer.session.links.socket.PENDING_LIMIT` connections are held: a newer one closes the oldest;
* a SendConfig header that claims 64 MiB allocates 64 KiB until the bytes come (the buffer grows);
* the server (``la-trainer socket``) makes a session's ``External<N>`` folder only once a valid config has
  come: junk connections leave none.
"""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from emulator.drive import begin_training
from emulator.game import SocketGame
from emulator.launch import REPO_ROOT, TrainerProcess
from emulator.session import build_session_config, free_tcp_port
from protocol.config import SessionConfig, socket_config_to_json
from protocol.stream import DEFAULT_MAX_CONFIG_BYTES, NEED_DATA, ConfigMessage, Signal, TrainerStreamDecoder
from tests.support.faults import FAST, SETTINGS, STARTUP_S, load_factor, small_task, trainer_env
from trainer.exitcodes import ExitCode
from trainer.session.links import SocketTrainerLink
from trainer.session.links import socket as socket_link
from trainer.session.links.socket import PENDING_LIMIT
from trainer.settings.options import OptionError, TrainerOptions, load_options
from trainer.settings.timeouts import CONFIG_WAIT_ADVICE, DEFAULT_CONFIG_WAIT_S, Timeouts

TASK = small_task(size=4)
CONFIG, BLOBS = build_session_config(TASK, replace(SETTINGS, hidden_layer_size=4, iteration_num=30), None)
RAW_CONFIG = json.dumps(socket_config_to_json(CONFIG)).encode()
SEND_CONFIG = struct.pack("<Bi", Signal.SEND_CONFIG, len(RAW_CONFIG)) + RAW_CONFIG
LONG = replace(FAST, wait=600.0)
"""No case may reach the wait's own bound: only what the connections do ends it."""
SERVED_S = 2.0
"""From a game's connection to its config returned by the link, on an idle box (the engine gives up
connecting after 10 s, spec §1.6)."""
GAME_S = 30.0


class Listening:
    """A link waiting for a game's config on a thread, its log lines captured."""

    def __init__(self, timeouts: Timeouts = LONG) -> None:
        self.said: list[str] = []
        self.flag = threading.Event()
        self.link = SocketTrainerLink(
            "127.0.0.1", 0, timeouts, interrupted=self.flag.is_set, output=self.said.append
        )
        self.port = self.link.port
        self.result: list[SessionConfig | BaseException] = []
        self.returned_at = 0.0
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        try:
            self.result.append(self.link.receive_config())
        except BaseException as error:
            self.result.append(error)
        self.returned_at = time.monotonic()

    def join(self, timeout: float) -> SessionConfig:
        self._thread.join(timeout * load_factor())
        assert not self._thread.is_alive(), f"no game was served within {timeout:g} s: {self.said}"
        [result] = self.result
        assert isinstance(result, SessionConfig), repr(result)
        return result

    def wait_said(self, words: str, timeout: float = 5.0, count: int = 1) -> str:
        deadline = time.monotonic() + timeout * load_factor()
        while sum(words in line for line in self.said) < count:
            assert time.monotonic() < deadline, f"never said {words!r}: {self.said}"
            time.sleep(0.005)
        return [line for line in self.said if words in line][count - 1]

    def close(self) -> None:
        self.flag.set()
        self._thread.join(10.0)
        self.link.close()


@pytest.fixture
def listening() -> Iterator[Listening]:
    server = Listening()
    try:
        yield server
    finally:
        server.close()


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5.0)


def closed_by_trainer(client: socket.socket, timeout: float = 5.0) -> bool:
    """The trainer closed ``client``'s connection (EOF, or a reset when it left bytes unread)."""
    client.settimeout(timeout * load_factor())
    try:
        return client.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def game_config_served(server: Listening) -> float:
    """Connect as the game and send its config; seconds until the link returned it."""
    started = time.monotonic()
    game = connect(server.port)
    try:
        game.sendall(SEND_CONFIG)
        config = server.join(SERVED_S)
        assert config.model.networks == CONFIG.model.networks
        return server.returned_at - started
    finally:
        game.close()


# -- a silent or slow peer holds up no game ----------------------------------------------------------------


def test_a_game_is_served_while_a_silent_client_stays_connected(listening: Listening) -> None:
    """Issue 30's case: a client connects and says nothing (past config_wait: silence is not timed); a
    game that connects meanwhile is served at once, and the silent client is closed then."""
    with connect(listening.port) as silent:
        time.sleep(0.3)
        assert not closed_by_trainer(silent, 0.2), "a connection that sent nothing was closed"
        assert game_config_served(listening) < SERVED_S * load_factor()
        assert closed_by_trainer(silent), "the other pending connection was left open"
    assert "closed 1 other pending connection" in listening.wait_said("a game's config came from")


def test_a_game_is_served_while_a_client_trickles_its_config(listening: Listening) -> None:
    """A client sending one byte every 0.1 s (issue 30 measured one a second holding the server ~40 s)."""
    stop = threading.Event()

    def trickle(client: socket.socket) -> None:
        for byte in SEND_CONFIG:
            if stop.is_set():
                return
            try:
                client.sendall(bytes([byte]))
            except OSError:
                return
            time.sleep(0.1)

    with connect(listening.port) as slow:
        thread = threading.Thread(target=trickle, args=(slow,), daemon=True)
        thread.start()
        time.sleep(0.5)
        try:
            assert game_config_served(listening) < SERVED_S * load_factor()
        finally:
            stop.set()
            thread.join(5.0)
        assert closed_by_trainer(slow)


def test_a_trickle_is_closed_config_wait_after_its_first_byte() -> None:
    config_wait = 0.6
    server = Listening(replace(LONG, config_wait=config_wait))
    try:
        with connect(server.port) as slow:
            time.sleep(config_wait * 2)  # silence first: not timed
            assert not closed_by_trainer(slow, 0.1)
            slow.sendall(SEND_CONFIG[:3])
            first = time.monotonic()
            assert closed_by_trainer(slow, config_wait + 5.0)
            took = time.monotonic() - first
        assert config_wait <= took < config_wait + 1.0 * load_factor(), took
        line = server.wait_said("closed the connection from 127.0.0.1")
        assert f"not complete {config_wait:g} s after its first byte" in line and "--config-wait" in line
        assert game_config_served(server) < SERVED_S * load_factor()  # still listening
    finally:
        server.close()


# -- junk before a config closes that connection only --------------------------------------------------------


def test_a_cut_at_every_byte_of_the_config_closes_that_connection_only(
    listening: Listening, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every split point of SendConfig, one connection each, against one waiting link: each is closed
    with the reason, and the game after them is served."""
    monkeypatch.setattr(socket_link, "_CLOSED_LINES", len(SEND_CONFIG) + 1)  # a line for every case
    for cut in range(len(SEND_CONFIG)):
        with connect(listening.port) as junk:
            junk.sendall(SEND_CONFIG[:cut])
            junk.shutdown(socket.SHUT_WR)
            assert closed_by_trainer(junk), f"cut at {cut}: still open"
        line = listening.wait_said("closed the connection from", count=cut + 1)
        why = "without sending anything" if cut == 0 else "in the middle of its config message"
        assert why in line, f"cut at {cut}: {line}"
    assert game_config_served(listening) < SERVED_S * load_factor()


JUNK = {
    "config-2^31-1": (struct.pack("<Bi", Signal.SEND_CONFIG, 2**31 - 1), "ConfigByteNum"),
    "config-max+1": (struct.pack("<Bi", Signal.SEND_CONFIG, DEFAULT_MAX_CONFIG_BYTES + 1), "ConfigByteNum"),
    "config-negative": (struct.pack("<Bi", Signal.SEND_CONFIG, -1), "ConfigByteNum"),
    "config-int32-min": (struct.pack("<Bi", Signal.SEND_CONFIG, -(2**31)), "ConfigByteNum"),
    "signal-0": (bytes([0]), "signal"),
    "signal-8": (bytes([8]), "signal"),
    "signal-255": (bytes([255]), "signal"),
    "signal-recv-network": (bytes([Signal.RECV_NETWORK]), "signal"),
    "signal-recv-ping": (bytes([Signal.RECV_PING]), "signal"),
    "network-before-config": (struct.pack("<Bi", Signal.SEND_NETWORK, 0), "SendNetwork"),
    "stop-before-config": (bytes([Signal.SEND_STOP]), "Stop before any config"),
    "json-garbage": (struct.pack("<Bi", Signal.SEND_CONFIG, 5) + b"{oops", "socket config"),
    "not-a-config-object": (struct.pack("<Bi", Signal.SEND_CONFIG, 2) + b"[]", "socket config"),
    "http": (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "signal"),
}


@pytest.mark.parametrize(("data", "words"), list(JUNK.values()), ids=list(JUNK))
def test_junk_before_a_config_closes_that_connection_and_the_next_game_is_served(
    listening: Listening, data: bytes, words: str
) -> None:
    """The peer stays connected after its bytes: the bytes alone must get it closed, promptly."""
    with connect(listening.port) as junk:
        junk.sendall(data)
        started = time.monotonic()
        assert closed_by_trainer(junk)
        assert time.monotonic() - started < 1.0 * load_factor()
    line = listening.wait_said("closed the connection from")
    assert words.lower() in line.lower(), line
    assert game_config_served(listening) < SERVED_S * load_factor()


def test_pending_connections_are_bounded_and_the_newest_is_served(listening: Listening) -> None:
    extra = 3
    clients = [connect(listening.port) for _ in range(PENDING_LIMIT + extra)]
    try:
        for index in range(extra):
            assert closed_by_trainer(clients[index]), f"client {index} was kept beyond the limit"
        listening.wait_said(f"{PENDING_LIMIT} connections were pending", count=extra)
        assert not closed_by_trainer(clients[extra], 0.1)
        assert game_config_served(listening) < SERVED_S * load_factor()
        assert all(closed_by_trainer(client) for client in clients[extra:])
    finally:
        for client in clients:
            client.close()


def test_closed_connections_are_logged_up_to_a_limit(listening: Listening) -> None:
    for _ in range(socket_link._CLOSED_LINES + 5):
        with connect(listening.port) as junk:
            junk.sendall(bytes([0]))
            assert closed_by_trainer(junk)
    listening.wait_said("they are not logged")
    time.sleep(0.1)
    assert sum("closed the connection from" in line for line in listening.said) == socket_link._CLOSED_LINES
    assert game_config_served(listening) < SERVED_S * load_factor()


def test_the_wait_with_pending_connections_ends_on_the_signal(listening: Listening) -> None:
    with connect(listening.port) as silent, connect(listening.port) as slow:
        slow.sendall(SEND_CONFIG[:7])
        time.sleep(0.2)
        listening.flag.set()
        listening._thread.join(5.0 * load_factor())
        assert not listening._thread.is_alive(), "the wait ignored the signal"
        [error] = listening.result
        assert type(error).__name__ == "Interrupted", repr(error)
        assert closed_by_trainer(silent) and closed_by_trainer(slow)


def test_the_winner_keeps_what_it_sent_after_its_config() -> None:
    """The game sends networks right after its config, unasked (§3): bytes that came with the config in
    one receive stay with the session."""
    server = Listening()
    try:
        with connect(server.port) as game:
            game.sendall(SEND_CONFIG + struct.pack("<Bi", Signal.SEND_NETWORK, 0) + BLOBS[0])
            server.join(SERVED_S)
            assert server.link.receive_network(0) == BLOBS[0]
    finally:
        server.close()


# -- the config buffer grows as bytes arrive ------------------------------------------------------------------


def test_a_config_header_claiming_64_mib_allocates_no_64_mib() -> None:
    """Issue 30: ``protocol/stream.py`` allocated the whole claimed size on the 5-byte header."""
    decoder = TrainerStreamDecoder()
    tracemalloc.start()
    try:
        decoder.feed(struct.pack("<Bi", Signal.SEND_CONFIG, DEFAULT_MAX_CONFIG_BYTES))
        assert decoder.next_event() is NEED_DATA
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert decoder.body_size == DEFAULT_MAX_CONFIG_BYTES  # what the header claims, still checked
    assert decoder.body_allocated <= 64 * 1024
    assert peak < 1 << 20, f"{peak} bytes allocated for a header"


@pytest.mark.parametrize("zero_copy", [False, True], ids=["feed", "get_buffer"])
@pytest.mark.parametrize("chunk", [1, 7, 4096, 65536, 200_000])
def test_a_growing_config_body_decodes_whatever_the_chunks(chunk: int, zero_copy: bool) -> None:
    raw = json.dumps({"pad": "x" * 300_000, "n": list(range(1000))}).encode()  # > 64 KiB: it must grow
    stream = struct.pack("<Bi", Signal.SEND_CONFIG, len(raw)) + raw + bytes([Signal.SEND_STOP])
    decoder = TrainerStreamDecoder()
    events: list[object] = []
    allocated: list[int] = []
    for start in range(0, len(stream), chunk):
        piece = memoryview(stream)[start : start + chunk]
        if zero_copy:
            while piece:
                view = decoder.get_buffer(-1)
                n = min(len(view), len(piece))
                view[:n] = piece[:n]
                decoder.buffer_updated(n)
                piece = piece[n:]
                allocated.append(decoder.body_allocated)
        else:
            decoder.feed(piece)
            allocated.append(decoder.body_allocated)
        while (event := decoder.next_event()) is not NEED_DATA:
            events.append(event)
    assert isinstance(events[0], ConfigMessage) and events[0].raw_json == raw
    assert len(events) == 2
    # Never more than twice what had arrived (or the first 64 KiB): it grew with the bytes.
    assert max(allocated) <= max(2 * len(raw), 64 * 1024)


# -- the bound: announced and configurable --------------------------------------------------------------------


def test_the_config_wait_is_announced_once_with_how_to_change_it(listening: Listening) -> None:
    line = listening.wait_said("must finish it within")
    assert f"within {LONG.config_wait:g} s" in line and CONFIG_WAIT_ADVICE in line
    game_config_served(listening)
    assert sum("must finish it within" in line for line in listening.said) == 1


def test_the_config_wait_option_from_every_source(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert TrainerOptions().config_wait == DEFAULT_CONFIG_WAIT_S == Timeouts().config_wait
    assert Timeouts.from_env(config_wait=0).config_wait == float("inf")
    assert Timeouts.from_env(config_wait=5).config_wait == 5.0
    monkeypatch.setenv("LA_TRAINER_CONFIG_WAIT", "7")
    assert load_options(None).config_wait == 7.0
    monkeypatch.delenv("LA_TRAINER_CONFIG_WAIT")
    (tmp_path / "la-trainer.json").write_text('{"config_wait": 9}')
    assert load_options(tmp_path).config_wait == 9.0
    with pytest.raises(OptionError, match="config_wait"):
        TrainerOptions(config_wait=-1.0)
    monkeypatch.setenv("LA_TRAINER_TIMEOUT_SCALE", "0.5")
    assert Timeouts.from_env(config_wait=8).config_wait == 4.0


def test_the_socket_command_refuses_a_bad_config_wait(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "trainer", "socket", "--once", "--port", "1", "--config-wait", "-3"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == int(ExitCode.USAGE), run.stdout + run.stderr
    assert "--config-wait" in run.stderr and "Traceback" not in run.stderr, run.stderr


# -- the server: a session's folder comes with a valid config ---------------------------------------------------


def _wait_line(proc: TrainerProcess, words: str, timeout: float, count: int = 1) -> None:
    deadline = time.monotonic() + timeout * load_factor()
    while sum(words in line for line in proc.log) < count:
        assert proc.alive(), f"the trainer exited ({proc.returncode}):\n{proc.output()}"
        assert time.monotonic() < deadline, f"never said {words!r}:\n{proc.output()}"
        time.sleep(0.02)


def _junk_connections(port: int) -> None:
    sends: list[Callable[[socket.socket], None]] = [
        lambda s: None,  # connects and closes, sending nothing (a port scan)
        lambda s: s.sendall(bytes([255])),
        lambda s: s.sendall(SEND_CONFIG[:40]),
        lambda s: s.sendall(struct.pack("<Bi", Signal.SEND_CONFIG, 2) + b"[]"),
    ]
    for send in sends:
        with connect(port) as junk:
            send(junk)
            junk.shutdown(socket.SHUT_WR)
            assert closed_by_trainer(junk, 10.0)


@pytest.mark.integration
@pytest.mark.slow
def test_the_server_makes_no_run_folder_for_junk_connections(tmp_path: Path) -> None:
    from tests.support.served_game import play

    runs = tmp_path / "runs"
    port = free_tcp_port()
    argv = [sys.executable, "-m", "trainer", "socket", "--port", str(port), "--temp-dir", str(runs)]
    with TrainerProcess(argv, cwd=REPO_ROOT, env=trainer_env()) as trainer:
        _wait_line(trainer, "serving session after session", STARTUP_S)
        _junk_connections(port)
        _wait_line(trainer, "closed the connection from", 10.0, count=4)
        assert sorted(p.name for p in runs.iterdir()) == [], "a folder before any game"
        assert play("socket", str(port), str(tmp_path), iterations=30, die_after_rounds=None) == "completed"
        _wait_line(trainer, "session 1 ended with exit code 0", GAME_S)
        _wait_line(trainer, "serving session after session", GAME_S, count=2)
        _junk_connections(port)
        _wait_line(trainer, "closed the connection from", 10.0, count=8)
        code = trainer.kill(grace=30.0 * load_factor())  # SIGTERM: the server stops
        output = trainer.output()
    assert code == int(ExitCode.OK), f"exit {code}:\n{output}"
    assert sorted(p.name for p in runs.iterdir()) == ["External0"], output
    assert (runs / "External0" / "runs").is_dir(), "the game's session has no run record"
    assert "Traceback" not in output, output


def test_a_game_that_begins_training_late_is_served_by_the_once_trainer(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Silence after connecting is not timed (a game connects when its communicator is made and sends its
    config when it begins training): a game silent for longer than config_wait is served."""
    from tests.support.faults import in_process_options, run_in_process

    config_wait = 0.3

    def game(get: Callable[[], Any]) -> None:
        from emulator.drive import Ending, tick_until_end

        late = SocketGame.connect("127.0.0.1", get().port, timeout=10.0)
        try:
            time.sleep(4 * config_wait)  # BeginTraining comes later
            begin_training(late, CONFIG, BLOBS, TASK.replay_buffer)
            assert tick_until_end(late, tick_s=0.001, timeout_s=GAME_S).how is Ending.COMPLETED
        finally:
            late.done()

    timeouts = replace(FAST, wait=60.0, config_wait=config_wait)
    run = run_in_process(
        lambda flag: SocketTrainerLink("127.0.0.1", 0, timeouts, interrupted=flag.is_set),
        game,
        capfd,
        task_dir=None,
        options=in_process_options(),
    )
    assert run.game_error is None, run.game_error
    assert run.code == int(ExitCode.OK), run.output
