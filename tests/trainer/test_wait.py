"""The one wait policy (trainer/session/transport/wait.py) that every blocking call of every link uses.

Facts: the first truthy predicate result is returned; each poll checks stop, the caller's own ``check``,
interrupt, the deadline (the peer first) and the periodic peer check in that order, each with its own
exception type and message; ``idle`` replaces the spin and the sleep and is never asked to wait past the
deadline or the poll interval; the timeout's advice can be replaced or left out.
"""

from __future__ import annotations

import time

import pytest

from trainer.errors import Interrupted, PeerGone, WaitTimeout
from trainer.exitcodes import ExitCode
from trainer.session.transport.wait import TIMEOUT_HINT, StopRequested, wait_until

# --- the basic rules ----------------------------------------------------------------------------------


def test_wait_until_returns_the_first_truthy_value() -> None:
    calls = iter([0, None, "", 42, 43])
    assert wait_until(lambda: next(calls), timeout=1, what="x", poll_interval=0.001) == 42


def test_wait_until_times_out_naming_what() -> None:
    start = time.monotonic()
    with pytest.raises(WaitTimeout) as info:
        wait_until(lambda: False, timeout=0.05, what="network 1 from the engine", poll_interval=0.001)
    assert 0.05 <= time.monotonic() - start < 1.0
    assert "timed out after 0.05 s waiting for network 1 from the engine" in str(info.value)


def test_wait_until_peer_gone_beats_timeout() -> None:
    with pytest.raises(PeerGone) as info:
        wait_until(
            lambda: False,
            timeout=5,
            what="the config",
            poll_interval=0.001,
            peer_alive=lambda: False,
            peer_check_interval=0.01,
        )
    assert "the engine went away while waiting for the config" in str(info.value)


def test_wait_until_checks_the_peer_before_reporting_a_timeout() -> None:
    # peer_check_interval longer than the timeout: the final check still reports the real cause.
    with pytest.raises(PeerGone):
        wait_until(
            lambda: False,
            timeout=0.02,
            what="x",
            poll_interval=0.001,
            peer_alive=lambda: False,
            peer_check_interval=10,
        )


def test_wait_until_stop_raises_stop_requested_with_exit_code_ok() -> None:
    with pytest.raises(StopRequested) as info:
        wait_until(lambda: False, timeout=5, what="x", poll_interval=0.001, stop=lambda: True)
    assert info.value.exit_code == ExitCode.OK


def test_wait_until_calls_on_poll_before_each_predicate() -> None:
    seen: list[str] = []
    state = {"n": 0}

    def on_poll() -> None:
        seen.append("poll")
        state["n"] += 1

    def predicate() -> bool:
        seen.append("check")
        return state["n"] >= 3

    assert wait_until(predicate, timeout=1, what="x", poll_interval=0.001, on_poll=on_poll) is True
    assert seen == ["poll", "check"] * 3


def test_wait_until_interrupted_raises_interrupted() -> None:
    with pytest.raises(Interrupted) as info:
        wait_until(lambda: False, timeout=5, what="the config", poll_interval=0.001, interrupted=lambda: True)
    assert info.value.exit_code == ExitCode.INTERRUPTED
    assert "the config" in str(info.value)


# --- the hooks a transport adds (the socket link's shape) ------------------------------------------------


ORDER_CASES = [
    ({"stop", "check", "interrupted", "timeout", "peer gone"}, StopRequested),
    ({"check", "interrupted", "timeout", "peer gone"}, RuntimeError),
    ({"interrupted", "timeout", "peer gone"}, Interrupted),
    ({"timeout", "peer gone"}, PeerGone),  # a vanished peer explains the timeout
    ({"timeout"}, WaitTimeout),
    ({"peer gone"}, PeerGone),
]


@pytest.mark.parametrize(("active", "error"), ORDER_CASES)
def test_each_poll_checks_stop_check_interrupt_timeout_peer_in_that_order(
    active: set[str], error: type[Exception]
) -> None:
    seen: list[str] = []

    def check(what: str) -> None:
        seen.append(what)
        if "check" in active:
            raise RuntimeError(f"the caller's own condition while waiting for {what}")

    with pytest.raises(error):
        wait_until(
            lambda: None,
            timeout=0.0 if "timeout" in active else 5.0,
            what="x",
            poll_interval=0.001,
            stop=lambda: "stop" in active,
            check=check,
            interrupted=lambda: "interrupted" in active,
            peer_alive=lambda: "peer gone" not in active,
            peer_check_interval=0.0,
        )
    assert seen == ([] if "stop" in active else ["x"])  # one poll decided it


def test_a_timeout_with_a_live_peer_is_a_timeout() -> None:
    with pytest.raises(WaitTimeout):
        wait_until(lambda: None, timeout=0.0, what="x", poll_interval=0.001, peer_alive=lambda: True)


def test_check_ends_the_wait_with_its_own_error_and_message() -> None:
    def check(what: str) -> None:
        raise PeerGone(f"the engine went away while waiting for {what}: EOF")

    with pytest.raises(PeerGone, match=r"^the engine went away while waiting for the config: EOF$"):
        wait_until(lambda: None, timeout=5, what="the config", poll_interval=0.001, check=check)


def test_idle_replaces_the_spin_and_the_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps: list[float] = []
    monkeypatch.setattr(time, "sleep", sleeps.append)
    idles: list[float] = []
    polls = iter(range(10))

    def ready() -> bool:
        return next(polls) == 5

    assert wait_until(ready, timeout=5.0, what="x", poll_interval=0.05, idle=idles.append) is True
    assert sleeps == []  # no spin, no sleep: idle did all the waiting
    assert len(idles) == 5 and all(0 < s <= 0.05 for s in idles)


def test_idle_is_never_asked_to_wait_past_the_deadline() -> None:
    idles: list[float] = []
    with pytest.raises(WaitTimeout):
        wait_until(lambda: None, timeout=0.03, what="x", poll_interval=10.0, idle=idles.append)
    assert idles and all(0 < s <= 0.03 for s in idles)


def test_the_timeout_hint_is_replaced_or_left_out() -> None:
    with pytest.raises(WaitTimeout) as info:
        wait_until(lambda: None, timeout=0.0, what="x", poll_interval=0.001)
    assert str(info.value) == f"timed out after 0 s waiting for x. {TIMEOUT_HINT}"
    with pytest.raises(WaitTimeout) as info:
        wait_until(lambda: None, timeout=0.0, what="x", poll_interval=0.001, timeout_hint="")
    assert str(info.value) == "timed out after 0 s waiting for x"
