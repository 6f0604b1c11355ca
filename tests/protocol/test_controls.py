"""The control block (spec §2.3, §2.4, §7.1): both halves driven on ONE bytearray, golden bytes after every step.

Expected bytes are built with ``int.to_bytes(4, "little", signed=True)``, independently of the module's
struct formats; a few states are also spelled out in hex.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from protocol.controls import (
    CONTROL_BLOCK_BYTES,
    CONTROL_NUM,
    HANDSHAKES,
    INITIAL_CONTROLS,
    Actor,
    Control,
    ExperienceInfo,
    GameControls,
    Op,
    TrainerControls,
    init_controls,
    read_controls,
)
from protocol.errors import ControlError

INT32_MAX = 2**31 - 1


def block(values: list[int] | tuple[int, ...]) -> bytes:
    return b"".join(v.to_bytes(4, "little", signed=True) for v in values)


class Expect:
    """The expected control values; ``step`` applies changes and compares the whole block's bytes."""

    def __init__(self, buf: bytearray) -> None:
        self.buf = buf
        self.values = list(INITIAL_CONTROLS)

    def __call__(self, **changes: int) -> None:
        for name, value in changes.items():
            self.values[Control[name.upper()]] = value
        assert bytes(self.buf[:CONTROL_BLOCK_BYTES]) == block(self.values)


@pytest.fixture
def session() -> Iterator[tuple[bytearray, TrainerControls, GameControls, Expect]]:
    buf = bytearray(CONTROL_BLOCK_BYTES)
    game = GameControls(buf)
    game.init()
    trainer = TrainerControls(buf, network_num=3)
    yield buf, trainer, game, Expect(buf)


def test_constants() -> None:
    assert CONTROL_NUM == 10
    assert CONTROL_BLOCK_BYTES == 40
    assert [c.value for c in Control] == list(range(10))
    assert int(Control.NETWORK_ID) == 8
    assert int(Control.REPLAY_BUFFER_ID) == 9


def test_initial_state_golden_hex() -> None:
    buf = bytearray(b"\xab" * 40)
    init_controls(buf)
    assert buf.hex() == "00000000" * 8 + "ffffffff" * 2
    assert read_controls(buf) == (0, 0, 0, 0, 0, 0, 0, 0, -1, -1)


def test_full_session(session: tuple[bytearray, TrainerControls, GameControls, Expect]) -> None:
    buf, trainer, game, expect = session
    expect()

    # Config: game raises the signal; trainer sees it, reads files, clears it.
    assert not trainer.config_ready()
    game.post_config()
    expect(config_signal=1)
    assert trainer.config_ready()
    trainer.ack_config()
    expect(config_signal=0)

    # Three initial networks (engine SendNetwork 0, 1, 2).
    for i in range(3):
        assert not game.network_requested()
        trainer.request_network(i)
        expect(network_signal=1)
        assert not trainer.network_received(i)
        assert game.network_requested()
        game.post_network(i)
        expect(network_id=i, network_signal=0)
        assert trainer.network_received(i)
        expect()
    assert buf.hex() == "00000000" * 8 + "02000000" + "ffffffff"

    # Experience: the game posts once; the trainer copies and acknowledges.
    assert trainer.experience_ready() is None
    assert game.can_post_experience()
    game.post_experience(episode_num=5, step_num=1234, replay_buffer_id=0)
    expect(experience_episode_num=5, experience_step_num=1234, replay_buffer_id=0, experience_signal=1)
    assert buf.hex() == "05000000" + "d2040000" + "01000000" + "00000000" * 5 + "02000000" + "00000000"
    assert not game.can_post_experience()
    info = trainer.experience_ready()
    assert info == ExperienceInfo(5, 1234, 0)
    assert trainer.experience_ready() == info  # repeatable until acknowledged
    trainer.ack_experience()
    expect(experience_signal=0)

    # Two sync rounds: networks 0, 1, 2 back to the game.
    for _round in range(2):
        for i in range(3):
            assert not game.has_network_or_completed()
            assert trainer.can_send_network()
            trainer.post_network(i)
            expect(network_id=i, network_signal=1)
            assert not trainer.can_send_network()
            assert game.has_network_or_completed()
            assert not game.take_completed()
            assert game.network_ready(i)
            game.release_network()
            expect(network_id=-1, network_signal=0)

    # A ping while the game waits: the game clears it.
    trainer.ping()
    expect(ping_signal=1)
    assert game.take_ping()
    expect(ping_signal=0)
    assert not game.take_ping()

    # Complete replaces the next round's network 0.
    trainer.post_complete()
    expect(complete_signal=1)
    assert game.has_network_or_completed()
    assert game.take_completed()
    expect(complete_signal=0)
    assert read_controls(buf) == (5, 1234, 0, 0, 0, 0, 0, 0, -1, 0)  # counts stay until the next post
    with pytest.raises(ControlError):
        trainer.post_network(0)  # nothing after Complete


def test_stop_variant(session: tuple[bytearray, TrainerControls, GameControls, Expect]) -> None:
    buf, trainer, game, expect = session
    game.post_config()
    assert trainer.config_ready()
    trainer.ack_config()
    trainer.request_network(0)
    expect(network_signal=1)
    # The user ends training while the trainer waits for network 0.
    assert not trainer.stop_requested()
    game.post_stop()
    expect(stop_signal=1)
    assert buf.hex()[6 * 8 : 7 * 8] == "01000000"
    assert trainer.stop_requested()
    trainer.clear_stop()
    expect(stop_signal=0)
    with pytest.raises(ControlError, match="network_received"):
        trainer.network_received(0)
    with pytest.raises(ControlError):
        game.post_config()  # the game's session ended with Stop


def test_ping_touches_only_its_control() -> None:
    buf = bytearray(CONTROL_BLOCK_BYTES)
    init_controls(buf)
    trainer = TrainerControls(buf)
    trainer.ping()
    trainer.ping()
    assert read_controls(buf) == (0, 0, 0, 0, 0, 0, 0, 1, -1, -1)


def _configured() -> tuple[bytearray, TrainerControls, GameControls]:
    buf = bytearray(CONTROL_BLOCK_BYTES)
    game = GameControls(buf)
    game.init()
    trainer = TrainerControls(buf, network_num=3)
    game.post_config()
    assert trainer.config_ready()
    trainer.ack_config()
    return buf, trainer, game


def _training() -> tuple[bytearray, TrainerControls, GameControls]:
    buf, trainer, game = _configured()
    game.post_experience(1, 1, 0)
    assert trainer.experience_ready() is not None
    return buf, trainer, game


OUT_OF_ORDER = [
    ("ack_config before config_ready", lambda t, g: t.ack_config(), "fresh"),
    ("request_network before config", lambda t, g: t.request_network(0), "fresh"),
    ("network_received without request", lambda t, g: t.network_received(0), "configured"),
    ("post_network before experience", lambda t, g: t.post_network(0), "configured"),
    ("ack_experience without experience", lambda t, g: t.ack_experience(), "configured"),
    ("request_network after experience", lambda t, g: t.request_network(0), "training"),
    ("clear_stop without stop", lambda t, g: t.clear_stop(), "configured"),
    ("post_network out of round order", lambda t, g: t.post_network(1), "training"),
    ("game post_network without request", lambda t, g: g.post_network(0), "configured"),
    ("game release_network without network", lambda t, g: g.release_network(), "training"),
]


@pytest.mark.parametrize(("name", "call", "stage"), OUT_OF_ORDER, ids=[c[0] for c in OUT_OF_ORDER])
def test_out_of_order_calls(name: str, call: object, stage: str) -> None:
    if stage == "fresh":
        buf = bytearray(CONTROL_BLOCK_BYTES)
        init_controls(buf)
        trainer, game = TrainerControls(buf, network_num=3), GameControls(buf)
        game.init()
    elif stage == "configured":
        buf, trainer, game = _configured()
    else:
        buf, trainer, game = _training()
    before = bytes(buf)
    with pytest.raises(ControlError, match="out of order"):
        call(trainer, game)  # type: ignore[operator]
    assert bytes(buf) == before  # a refused call writes nothing


def test_request_twice_and_wrong_id() -> None:
    _buf, trainer, _game = _configured()
    trainer.request_network(0)
    with pytest.raises(ControlError, match="network 0 was requested"):
        trainer.request_network(1)
    _buf, trainer, _game = _configured()
    trainer.request_network(0)
    with pytest.raises(ControlError, match="not 1"):
        trainer.network_received(1)


def test_complete_only_at_a_round_boundary() -> None:
    _buf, trainer, game = _training()
    trainer.post_network(0)
    assert game.network_ready(0)
    game.release_network()
    with pytest.raises(ControlError, match="round is incomplete"):
        trainer.post_complete()


def test_complete_waits_for_the_last_network_to_be_taken() -> None:
    _buf, trainer, _game = _training()
    for i in range(3):
        if i:
            _game.release_network()
        trainer.post_network(i)
        assert _game.network_ready(i)
    with pytest.raises(ControlError, match="NetworkSignal is 1"):
        trainer.post_complete()


def test_post_network_refused_while_the_game_holds_the_previous() -> None:
    _buf, trainer, _game = _training()
    trainer.post_network(0)
    with pytest.raises(ControlError, match="NetworkSignal is 1"):
        trainer.post_network(1)


def test_without_network_num_any_order_is_allowed() -> None:
    buf = bytearray(CONTROL_BLOCK_BYTES)
    game = GameControls(buf)
    game.init()
    trainer = TrainerControls(buf)
    game.post_config()
    assert trainer.config_ready()
    trainer.ack_config()
    game.post_experience(0, 0, 0)
    assert trainer.experience_ready() == ExperienceInfo(0, 0, 0)
    trainer.post_network(2)
    assert read_controls(buf)[Control.NETWORK_ID] == 2


def test_network_id_mismatch_on_the_trainer_side() -> None:
    _buf, trainer, game = _configured()
    trainer.request_network(0)
    game.post_network(1)  # the engine answered with the wrong id
    with pytest.raises(ControlError) as info:
        trainer.network_received(0)
    assert info.value.field == "NETWORK_ID"
    assert (info.value.expected, info.value.actual) == (0, 1)
    assert "expects 0" in str(info.value)
    # h11 rule: the object refuses every further call, even harmless ones.
    with pytest.raises(ControlError, match="refuses further use"):
        trainer.ping()
    with pytest.raises(ControlError, match="refuses further use"):
        trainer.stop_requested()


def test_network_id_mismatch_on_the_game_side() -> None:
    _buf, trainer, game = _training()
    trainer.post_network(0)
    with pytest.raises(ControlError) as info:
        game.network_ready(1)
    assert (info.value.expected, info.value.actual) == (1, 0)
    with pytest.raises(ControlError, match="refuses further use"):
        game.take_ping()


@pytest.mark.parametrize("size", [0, 39])
def test_buffer_too_small(size: int) -> None:
    with pytest.raises(ControlError, match="40 bytes") as info:
        TrainerControls(bytearray(size))
    assert (info.value.expected, info.value.actual) == (40, size)
    with pytest.raises(ControlError):
        GameControls(bytearray(size))
    with pytest.raises(ControlError):
        init_controls(bytearray(size))
    with pytest.raises(ControlError):
        read_controls(bytearray(size))


def test_read_only_and_non_buffer_objects_are_refused() -> None:
    with pytest.raises(ControlError, match="read-only"):
        TrainerControls(memoryview(bytes(40)))
    with pytest.raises(ControlError):
        TrainerControls(bytes(40))  # type: ignore[arg-type]


def test_works_on_a_view_of_a_larger_region() -> None:
    page = bytearray(4096)  # POSIX rounds the region up to a page
    view = memoryview(page)
    game = GameControls(view)
    game.init()
    assert bytes(page[:40]) == block(INITIAL_CONTROLS)
    assert not any(page[40:])


def test_int32_limits() -> None:
    buf, trainer, game = _configured()
    game.post_experience(INT32_MAX, INT32_MAX, INT32_MAX)
    assert buf[:8].hex() == "ffffff7f" * 2
    assert trainer.experience_ready() == ExperienceInfo(INT32_MAX, INT32_MAX, INT32_MAX)
    for bad in (2**31, -1, True):
        _b, _t, g2 = _configured()
        with pytest.raises(ControlError):
            g2.post_experience(bad, 0, 0)


def test_negative_counts_from_the_peer_are_refused() -> None:
    buf, trainer, _game = _configured()
    buf[0:4] = (-5).to_bytes(4, "little", signed=True)
    buf[8:12] = (1).to_bytes(4, "little", signed=True)  # ExperienceSignal
    with pytest.raises(ControlError, match="EXPERIENCE_EPISODE_NUM is -5"):
        trainer.experience_ready()


def test_game_needs_init_first() -> None:
    game = GameControls(bytearray(CONTROL_BLOCK_BYTES))
    with pytest.raises(ControlError, match="init"):
        game.post_config()


# -- the table itself -----------------------------------------------------------------------------------

SIGNALS = {
    Control.EXPERIENCE_SIGNAL,
    Control.CONFIG_SIGNAL,
    Control.NETWORK_SIGNAL,
    Control.COMPLETE_SIGNAL,
    Control.STOP_SIGNAL,
    Control.PING_SIGNAL,
}


def test_table_writes_data_before_signal() -> None:
    """Within every method, no data control is written after a signal control (spec §2.4)."""
    for steps in HANDSHAKES.values():
        methods = {s.method for s in steps}
        for method in methods:
            writes = [s.control for s in steps if s.method == method and s.op is Op.WRITE]
            seen_signal = False
            for control in writes:
                if control in SIGNALS:
                    seen_signal = True
                else:
                    assert not seen_signal, (method, writes)


def test_table_waits_come_before_checks_and_reads() -> None:
    for steps in HANDSHAKES.values():
        for method in {s.method for s in steps}:
            ops = [s.op for s in steps if s.method == method]
            if Op.WAIT in ops:
                assert ops.index(Op.WAIT) == 0, (method, ops)


def test_every_table_method_exists_on_its_side() -> None:
    for steps in HANDSHAKES.values():
        for step in steps:
            cls = TrainerControls if step.actor is Actor.TRAINER else GameControls
            assert callable(getattr(cls, step.method)), step


def test_table_names_the_spec_handshakes() -> None:
    assert set(HANDSHAKES) == {
        "config",
        "request_network",
        "experience",
        "send_network",
        "complete",
        "stop",
        "ping",
    }
