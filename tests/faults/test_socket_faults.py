"""A hostile or broken peer on the socket (spec §3): truncation, absurd lengths, bad signals, silence,
a second client, a trickle.

Facts: every case ends with a clear, categorised error (PEER_GONE for a peer that vanished, PROTOCOL for
bytes that break the framing) within a bound that does not depend on what the peer claims; a connected
peer that falls silent in the middle of a message after its config is a paused game and is waited for
while the connection is open (trainer.settings.timeouts), its close then ends the run at once; no length from the
peer is allocated before it is checked; the listening port is free afterwards.

Before its config is complete a connection is not a game yet (issue 30): what it does wrong closes that
connection only and the wait for a game goes on (tests/faults/test_socket_pending.py); here that is the
truncation inside SendConfig, a silent client and a trickle.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from emulator.launch import EngineLayout, socket_command
from emulator.session import build_session_config, free_tcp_port
from protocol.config import socket_config_to_json
from protocol.replay import ReplayLayout
from protocol.stream import Signal, encode_config, encode_network_to_trainer
from tests.support.faults import (
    FAST,
    SETTINGS,
    assert_no_traceback,
    load_factor,
    run_in_process,
    small_task,
    spawn_trainer,
    wait_for,
)
from trainer.errors import PeerGone, exit_code_for
from trainer.exitcodes import ExitCode
from trainer.session.links import SocketTrainerLink

TASK = small_task(size=4)
SMALL = replace(SETTINGS, hidden_layer_size=4, iteration_num=30)
CONFIG, BLOBS = build_session_config(TASK, SMALL, None)
RAW_CONFIG = json.dumps(socket_config_to_json(CONFIG)).encode()
LAYOUT = ReplayLayout.from_config(CONFIG.replay_buffer(0))
MESSAGES = {
    "SendConfig": b"".join(encode_config(RAW_CONFIG)),
    **{f"SendNetwork {i}": b"".join(encode_network_to_trainer(i, blob)) for i, blob in enumerate(BLOBS)},
    "SendExperience": bytes([Signal.SEND_EXPERIENCE]) + LAYOUT.encode_socket(TASK.replay_buffer, -1),
}
"""What a game sends after connecting, in order (config, networks 0-2, the replay buffer)."""
CASE_BOUND_S = 1.0
"""A truncated stream is reported this fast: EOF is immediate, no wait runs to its timeout."""
ERROR_BOUND_S = 10.0
"""A subprocess trainer's error message after the bytes that break the framing: at once, within process
scheduling on a loaded box."""


def port_is_free(port: int) -> bool:
    """Nobody listens on ``port`` any more: it can be bound and listened on again."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
            probe.listen(1)
        except OSError:
            return False
    return True


def drive_link(link: SocketTrainerLink) -> None:
    """The trainer half up to training: config, networks 0-2, the replay buffer."""
    link.receive_config()
    for network_id in range(3):
        link.receive_network(network_id)
    link.receive_experience()


def error_for_stream(data: bytes, *, close: bool = True) -> BaseException:
    """Send ``data`` (then close) to a fresh link and return what the link raised."""
    link = SocketTrainerLink("127.0.0.1", 0, FAST)
    port = link.port
    try:
        with socket.create_connection(("127.0.0.1", port)) as client:
            client.sendall(data)
            if not close:
                return _drive_expecting_error(link)
        return _drive_expecting_error(link)
    finally:
        link.close()
        assert port_is_free(port), f"port {port} still in use after close"


def _drive_expecting_error(link: SocketTrainerLink) -> BaseException:
    try:
        drive_link(link)
    except Exception as error:
        return error
    raise AssertionError("the whole session decoded from a damaged stream")


def split_points(message: bytes) -> Iterator[int]:
    return iter(range(len(message)))


def test_truncation_at_every_split_point_of_every_message_is_peer_gone() -> None:
    """Invariant: a stream cut at any byte after the config ends with PeerGone, saying 'in the middle of a
    message' for a cut inside one and naming what was awaited for a cut between two, within CASE_BOUND_S.
    (A cut inside the config closes that connection only: test_socket_pending.py, every split point.)"""
    before = b""
    cases = 0
    factor = load_factor()
    for name, message in MESSAGES.items():
        if name == "SendConfig":
            before += message
            continue
        for cut in split_points(message):
            started = time.monotonic()
            error = error_for_stream(before + message[:cut])
            elapsed = time.monotonic() - started
            where = f"{name} cut after {cut} of {len(message)} bytes"
            assert isinstance(error, PeerGone), f"{where}: {error!r}"
            assert exit_code_for(error) is ExitCode.PEER_GONE
            if cut:
                assert "in the middle of a message" in str(error), f"{where}: {error}"
            else:
                assert "waiting for" in str(error), f"{where}: {error}"
            assert elapsed < CASE_BOUND_S * factor, f"{where}: took {elapsed:.2f} s"
            cases += 1
        before += message
    assert cases == sum(len(m) for name, m in MESSAGES.items() if name != "SendConfig")


@pytest.mark.parametrize(
    ("data", "field"),
    [
        (MESSAGES["SendConfig"] + struct.pack("<Bi", Signal.SEND_NETWORK, 7), "NetworkId"),
        (MESSAGES["SendConfig"] + struct.pack("<Bi", Signal.SEND_NETWORK, -1), "NetworkId"),
        (
            MESSAGES["SendConfig"] + struct.pack("<B4i", Signal.SEND_EXPERIENCE, -1, 0, 2**31 - 1, 4),
            "EpisodeNum",
        ),
        (MESSAGES["SendConfig"] + struct.pack("<B4i", Signal.SEND_EXPERIENCE, -1, 0, 4, -5), "StepNum"),
        (MESSAGES["SendConfig"] + struct.pack("<B4i", Signal.SEND_EXPERIENCE, -1, 9, 4, 4), "ReplayBufferId"),
        # After the config: before it, the same bytes close that connection only (test_socket_pending.py).
        (MESSAGES["SendConfig"] + bytes([0]), "signal"),
        (MESSAGES["SendConfig"] + bytes([8]), "signal"),
        (MESSAGES["SendConfig"] + bytes([255]), "signal"),
        (MESSAGES["SendConfig"] + bytes([Signal.RECV_NETWORK]), "signal"),  # trainer->game, from the game
        (MESSAGES["SendConfig"] + bytes([Signal.RECV_PING]), "signal"),
    ],
    ids=[
        "network-unknown-id",
        "network-negative-id",
        "experience-2^31-1-episodes",
        "experience-negative-steps",
        "experience-unknown-buffer",
        "signal-0",
        "signal-8",
        "signal-255",
        "signal-recv-network",
        "signal-recv-ping",
    ],
)
def test_bad_lengths_and_signals_are_protocol_errors_before_any_allocation(data: bytes, field: str) -> None:
    started = time.monotonic()
    error = error_for_stream(data, close=False)  # the peer stays connected: the bytes alone must fail
    assert exit_code_for(error) is ExitCode.PROTOCOL, repr(error)
    assert field.lower() in str(error).lower(), str(error)
    assert time.monotonic() - started < CASE_BOUND_S * load_factor()


# -- whole runs (exit codes from run_with_link) -------------------------------------------------------------


def socket_run(game: Callable[[int], None], capfd: pytest.CaptureFixture[str], **options: Any) -> Any:
    from tests.support.faults import in_process_options

    ports: list[int] = []

    def open_link(flag: Any) -> SocketTrainerLink:
        link = SocketTrainerLink("127.0.0.1", 0, FAST, interrupted=flag.is_set)
        ports.append(link.port)
        return link

    run = run_in_process(
        open_link, lambda get: game(get().port), capfd, task_dir=None, options=in_process_options(**options)
    )
    assert port_is_free(ports[0]), "the trainer's port is still taken after it exited"
    return run


def test_a_silent_client_alone_is_not_a_game(capfd: pytest.CaptureFixture[str]) -> None:
    """The new rule (issue 30): a connection that sends nothing is not a game yet, so it does not lift the
    bound of an unseen wait: ``--once`` gives up at ``wait`` (TIMEOUT, the advice to change it) with no
    session, and closes the client. (Before, the connection counted as a live game: the run waited for as
    long as the client stayed connected.) That it holds up no game is test_socket_pending.py's."""
    silence = 3 * FAST.wait
    seen: list[bytes] = []

    def silent(port: int) -> None:
        with socket.create_connection(("127.0.0.1", port)) as client:
            client.settimeout(silence)
            try:
                seen.append(client.recv(1))  # b"": the trainer closed it
            except OSError as error:
                seen.append(type(error).__name__.encode())

    started = time.monotonic()
    run = socket_run(silent, capfd)
    elapsed = time.monotonic() - started
    assert run.code == int(ExitCode.TIMEOUT), run.output
    assert "send its config" in run.output and "--wait SECONDS" in run.output, run.output
    assert FAST.wait <= elapsed < (FAST.wait + CASE_BOUND_S) * load_factor(), elapsed
    assert seen in ([b""], [b"ConnectionResetError"]), seen
    assert_no_traceback(run.output)


def test_a_trickle_is_closed_at_config_wait_and_a_game_meanwhile_is_served(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """The new rule (issue 30): a peer that trickles its config (one byte every 0.2 s) is closed
    ``config_wait`` after its first byte, and a game that connects while it trickles is served at once,
    its session complete. (Before, the trickle held the one accepted connection: the game was refused.)"""
    from emulator.drive import Ending, begin_training, tick_until_end
    from emulator.game import SocketGame

    config_wait = 1.0
    closed: list[float] = []

    def trickle(port: int) -> None:
        with socket.create_connection(("127.0.0.1", port)) as client:
            first = time.monotonic()
            try:
                for byte in MESSAGES["SendConfig"]:
                    client.sendall(bytes([byte]))
                    time.sleep(0.2)
            except OSError:
                closed.append(time.monotonic() - first)

    def game(port: int) -> None:
        slow = threading.Thread(target=trickle, args=(port,), daemon=True)
        slow.start()
        time.sleep(0.3)
        first = SocketGame.connect("127.0.0.1", port, timeout=10.0)
        try:
            begin_training(first, CONFIG, BLOBS, TASK.replay_buffer)
            assert tick_until_end(first, tick_s=0.001, timeout_s=20.0).how is Ending.COMPLETED
        finally:
            first.done()
        slow.join(config_wait + 10.0)

    ports: list[int] = []

    def open_link(flag: Any) -> SocketTrainerLink:
        link = SocketTrainerLink(
            "127.0.0.1", 0, replace(FAST, config_wait=config_wait), interrupted=flag.is_set
        )
        ports.append(link.port)
        return link

    from tests.support.faults import in_process_options

    run = run_in_process(
        open_link, lambda get: game(get().port), capfd, task_dir=None, options=in_process_options()
    )
    assert run.game_error is None, run.game_error
    assert run.code == int(ExitCode.OK), run.output
    # The game's config came first: the trickler was closed with the other pending connections then, or
    # at its own deadline if the session took longer; never later than that deadline.
    assert closed and closed[0] < (config_wait + CASE_BOUND_S) * load_factor(), closed
    assert port_is_free(ports[0])


def test_a_second_client_is_refused_and_the_first_session_completes(
    capfd: pytest.CaptureFixture[str],
) -> None:
    from emulator.drive import Ending, begin_training, tick_until_end
    from emulator.game import SocketGame

    second: list[str] = []

    def game(port: int) -> None:
        first = SocketGame.connect("127.0.0.1", port, timeout=10.0)

        def intrude() -> None:
            time.sleep(0.05)  # the trainer has accepted the first client and closed its listener
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=2.0) as intruder:
                    intruder.sendall(MESSAGES["SendConfig"])
                    intruder.settimeout(2.0)
                    second.append("eof" if intruder.recv(1) == b"" else "data")
            except OSError as error:
                second.append(type(error).__name__)

        try:
            begin_training(first, CONFIG, BLOBS, TASK.replay_buffer, after_configs=intrude)
            assert tick_until_end(first, tick_s=0.001, timeout_s=20.0).how is Ending.COMPLETED
        finally:
            first.done()

    run = socket_run(game, capfd)
    assert run.game_error is None, run.game_error
    assert run.code == int(ExitCode.OK), run.output
    assert second and second[0] in ("ConnectionRefusedError", "ConnectionResetError", "eof"), second


@pytest.mark.integration
@pytest.mark.slow
def test_real_trainer_rejects_a_2_31_config_length_and_frees_its_port(tmp_path: Path) -> None:
    layout = EngineLayout.create(tmp_path / "engine")
    port = free_tcp_port()
    proc = spawn_trainer(socket_command(layout, "Training", "127.0.0.1", port), layout.root)
    try:
        deadline = time.monotonic() + 60.0
        client = None
        while client is None and time.monotonic() < deadline and proc.alive():
            try:
                client = socket.create_connection(("127.0.0.1", port), timeout=1.0)
            except OSError:
                time.sleep(0.01)
        assert client is not None, proc.output()
        with client:
            client.sendall(struct.pack("<Bi", Signal.SEND_CONFIG, 2**31 - 1))
            started = time.monotonic()
            wait_for(lambda: "ConfigByteNum" in proc.output(), ERROR_BOUND_S * load_factor(), "the error")
            assert time.monotonic() - started < ERROR_BOUND_S * load_factor()
            code = proc.wait(60.0)  # interpreter and torch teardown: slow only on a loaded box
        output = proc.output()
        assert code == int(ExitCode.PROTOCOL), output
        assert "ConfigByteNum" in output
        assert_no_traceback(output)
        assert port_is_free(port)
    finally:
        proc.close()


def test_a_peer_that_stops_mid_message_is_waited_for_until_it_closes() -> None:
    """Sanity of the table above: a game that stops mid-message after its config is a paused game,
    waited for past the unseen-wait bound; its close is PeerGone, never a hang. (Inside the config the
    peer is not a game yet: test_socket_pending.py.)"""
    link = SocketTrainerLink("127.0.0.1", 0, replace(FAST, wait=0.5))
    try:
        with socket.create_connection(("127.0.0.1", link.port)) as client:
            client.sendall(MESSAGES["SendConfig"] + MESSAGES["SendNetwork 0"][:10])
            link.receive_config()
            closer = threading.Timer(1.5, client.close)
            started = time.monotonic()  # before the timer starts: its 1.5 s cannot begin earlier
            closer.start()
            try:
                with pytest.raises(PeerGone, match="network 0"):
                    link.receive_network(0)
            finally:
                closer.cancel()
            assert 1.5 <= time.monotonic() - started < 1.5 + CASE_BOUND_S * load_factor()
    finally:
        link.close()
