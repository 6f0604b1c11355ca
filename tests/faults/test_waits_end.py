"""Every wait of the links ends on the game's Stop and on SIGINT/SIGTERM (the app's interrupt flag).

Each case puts a real link (against the emulator's game half) into one of its waits, with a bound far
longer than the test (``Timeouts.wait``), and then either the game sends Stop or the flag is set. The wait
must end with :class:`StopRequested` / :class:`Interrupted` (``finish`` returns: the run is over either
way); a wait that ignores both would still be waiting when the join gives up. Sends let a signal finish
the message first and give up after ``Timeouts.signal_grace``.

Today's ``la-trainer demo --quick --time-limit 2`` hang was the ``finish`` case: the game sent Stop
instead of taking Complete, and the trainer waited for Complete as long as the game process lived.
"""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from emulator.drive import begin_training
from emulator.game import ShmGame, SocketGame
from tests.support.configs import sample_replay
from tests.support.links import NETWORK_IDS, PLATFORM, config, initial_networks, trained
from trainer.errors import Interrupted
from trainer.session.links import ShmTrainerLink, SocketTrainerLink
from trainer.session.transport.tcp import TcpConnection
from trainer.session.transport.wait import StopRequested
from trainer.settings.timeouts import Timeouts

posix_ipc = pytest.importorskip("posix_ipc")

SLOW = Timeouts(wait=600, poll_interval=0.0005, peer_check_interval=0.05, signal_grace=0.2)
"""A bound no case may reach: only Stop or the flag can end the waits within the join."""
JOIN_S = 30.0
"""How long a case may take before the wait counts as ignoring Stop and the flag (a hang)."""
GAME_S = 10.0


def _ends(enter: Callable[[], object], end: Callable[[], None]) -> BaseException | None:
    """Run ``enter`` (a wait) on a thread, call ``end`` once it is waiting; the wait's exception or None."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            enter()
            outcome.append(None)
        except BaseException as error:
            outcome.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(0.3)  # inside its wait by now (nothing in these cases can end it)
    assert thread.is_alive() and not outcome, f"the wait ended before Stop or the signal: {outcome}"
    end()
    thread.join(JOIN_S)
    assert not thread.is_alive(), "the wait ignored Stop / the signal"
    return outcome[0]


def _thread(target: Callable[[], object]) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


# =========================================================================================================
# Shared memory: spawned (the game's liveness is visible, so no wait has a bound) and attach mode


@pytest.fixture(params=["spawned", "attach"])
def shm_pair(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[ShmTrainerLink, ShmGame, threading.Event]]:
    flag = threading.Event()
    config_dir = tmp_path / "Task0" / "Configs"
    if request.param == "spawned":
        game = ShmGame.create(config_dir, timeout=GAME_S, platform=PLATFORM)
        link = ShmTrainerLink(
            config_dir,
            game.controls_guid,
            timeouts=SLOW,
            platform=PLATFORM,
            watch_parent=True,
            interrupted=flag.is_set,
        )
    else:
        guid = "{" + str(uuid.uuid4()).upper() + "}"
        link = ShmTrainerLink(
            config_dir, guid, create=True, timeouts=SLOW, platform=PLATFORM, interrupted=flag.is_set
        )
        game = ShmGame.attach(guid, config_dir, timeout=GAME_S, platform=PLATFORM)
    try:
        yield link, game, flag
    finally:
        link.close()
        game.close()


def _shm_to(point: str, link: ShmTrainerLink, game: ShmGame) -> Callable[[], object]:
    """Bring the session to ``point`` and return the call that waits there."""
    if point == "config":
        return link.receive_config
    if point == "network":
        game.begin(config())
        link.receive_config()
        return lambda: link.receive_network(0)
    if point == "experience":

        def script() -> None:
            game.begin(config())
            for nid, blob in enumerate(initial_networks()):
                game.send_network(nid, blob)

        game_thread = _thread(script)
        link.receive_config()
        for nid in NETWORK_IDS:
            link.receive_network(nid)
        game_thread.join(GAME_S)
        return link.receive_experience
    game_thread = _thread(lambda: begin_training(game, config(), initial_networks(), sample_replay()))
    link.receive_config()
    for nid in NETWORK_IDS:
        link.receive_network(nid)
    link.receive_experience()
    game_thread.join(GAME_S)
    if point == "send":
        link.send_network(0, trained(0)[0], 1)  # the game does not take it: NetworkSignal stays 1
        return lambda: link.send_network(1, trained(0)[1], 1)
    if point == "complete":
        link.send_network(0, trained(0)[0], 1)
        return link.send_complete
    assert point == "finish"
    link.send_complete()  # no network pending: CompleteSignal = 1 at once; the game never takes it
    return lambda: link.finish(600)


SHM_POINTS = ["config", "network", "experience", "send", "complete", "finish"]


@pytest.mark.parametrize("point", SHM_POINTS)
def test_shm_wait_ends_on_stop(point: str, shm_pair: tuple[ShmTrainerLink, ShmGame, threading.Event]) -> None:
    link, game, _ = shm_pair
    enter = _shm_to(point, link, game)
    error = _ends(enter, game.stop)
    if point == "finish":
        assert error is None  # the run is over: Stop instead of taking Complete just ends the wait
    else:
        assert isinstance(error, StopRequested), error


@pytest.mark.parametrize("point", SHM_POINTS)
def test_shm_wait_ends_on_a_signal(
    point: str, shm_pair: tuple[ShmTrainerLink, ShmGame, threading.Event]
) -> None:
    link, game, flag = shm_pair
    enter = _shm_to(point, link, game)
    error = _ends(enter, flag.set)
    if point == "finish":
        assert error is None
    else:
        assert isinstance(error, Interrupted), error


# =========================================================================================================
# Socket


@pytest.fixture
def socket_pair() -> Iterator[tuple[SocketTrainerLink, list[SocketGame], threading.Event]]:
    flag = threading.Event()
    link = SocketTrainerLink("127.0.0.1", 0, SLOW, interrupted=flag.is_set)
    games: list[SocketGame] = []
    try:
        yield link, games, flag
    finally:
        link.close()
        for game in games:
            game.close()


def _socket_to(point: str, link: SocketTrainerLink, games: list[SocketGame]) -> Callable[[], object]:
    if point == "connect":
        return link.receive_config

    def connect() -> SocketGame:
        game = SocketGame.connect("127.0.0.1", link.port, timeout=GAME_S)
        games.append(game)
        return game

    if point == "config":
        _thread(connect)
        return link.receive_config
    if point == "network":
        _thread(lambda: connect().begin(config()))
        link.receive_config()
        return lambda: link.receive_network(0)
    if point == "experience":

        def script() -> None:
            game = connect()
            game.begin(config())
            for nid, blob in enumerate(initial_networks()):
                game.send_network(nid, blob)

        _thread(script)
        link.receive_config()
        for nid in NETWORK_IDS:
            link.receive_network(nid)
        return link.receive_experience
    assert point == "finish"
    game_thread = _thread(lambda: begin_training(connect(), config(), initial_networks(), sample_replay()))
    link.receive_config()
    for nid in NETWORK_IDS:
        link.receive_network(nid)
    link.receive_experience()
    game_thread.join(GAME_S)
    link.send_complete()  # the game never closes the connection
    return lambda: link.finish(600)


# Not "config": Stop before any config closes that connection only, it is not a game yet (issue 30;
# tests/faults/test_socket_pending.py); the wait for a game goes on, and ends on the signal below.
@pytest.mark.parametrize("point", ["network", "experience"])
def test_socket_wait_ends_on_stop(
    point: str, socket_pair: tuple[SocketTrainerLink, list[SocketGame], threading.Event]
) -> None:
    link, games, _ = socket_pair
    enter = _socket_to(point, link, games)
    error = _ends(enter, lambda: games[0].stop())
    assert isinstance(error, StopRequested), error


@pytest.mark.parametrize("point", ["connect", "config", "network", "experience", "finish"])
def test_socket_wait_ends_on_a_signal(
    point: str, socket_pair: tuple[SocketTrainerLink, list[SocketGame], threading.Event]
) -> None:
    link, games, flag = socket_pair
    enter = _socket_to(point, link, games)
    error = _ends(enter, flag.set)
    if point == "finish":
        assert error is None
    else:
        assert isinstance(error, Interrupted), error


def test_socket_send_to_a_game_that_stopped_reading_ends_on_a_signal() -> None:
    """A paused game reads nothing: the send blocks once the buffers are full, and a signal ends it after
    the grace (the message was meant to finish, but not at any price)."""
    flag = threading.Event()
    ours, theirs = socket.socketpair()
    try:
        conn = TcpConnection(ours)
        chunk = bytes(1 << 20)
        parts: list[Any] = [chunk] * 64  # far more than the socket buffers of a pair hold

        def enter() -> None:
            conn.send_parts(parts, interrupted=flag.is_set)

        error = _ends(enter, flag.set)
        assert isinstance(error, Interrupted), error
    finally:
        ours.close()
        theirs.close()
