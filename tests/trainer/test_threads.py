"""The thread policy's decisions (trainer.training.threads), fed simulated step times: no timed assertion anywhere.

A simulated machine gives each step's duration from the thread count and the simulated clock, shaped like
the measurements of issue 28 on 2 cores (benchmarks/results/busy-machine.jsonl): idle, two threads are
faster than one; beside a CPU-bound process, one thread keeps its speed and two collapse (a parallel
region waits for a descheduled thread).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from trainer.training.threads import (
    ThreadChoice,
    ThreadPolicy,
    ThreadSettings,
    ThreadTuner,
    Why,
    candidate_threads,
)

IDLE = {1: 360.0, 2: 515.0}
BUSY = {1: 350.0, 2: 4.4}


def machine(
    busy_from: float = float("inf"), busy_until: float = float("inf")
) -> Callable[[int, float], float]:
    """Step seconds at ``threads`` at simulated time ``now``."""

    def step_seconds(threads: int, now: float) -> float:
        rates = BUSY if busy_from <= now < busy_until else IDLE
        return 1.0 / rates[threads]

    return step_seconds


def simulate(
    policy: ThreadPolicy, step_seconds: Callable[[int, float], float], until: float
) -> tuple[list[tuple[float, int]], list[ThreadChoice], int]:
    """Run steps until simulated time ``until``: (time, threads) of every change, choices, steps."""
    now, steps = 0.0, 0
    changes = [(0.0, policy.threads)]
    choices = []
    while now < until:
        seconds = step_seconds(policy.threads, now)
        now += seconds
        steps += 1
        choice = policy.record(seconds)
        if choice is not None:
            choices.append(choice)
        if policy.threads != changes[-1][1]:
            changes.append((now, policy.threads))
    return changes, choices, steps


def threads_at(changes: list[tuple[float, int]], when: float) -> int:
    return [threads for at, threads in changes if at <= when][-1]


@pytest.mark.parametrize(
    ("cores", "expected"),
    [(1, (1,)), (2, (1, 2)), (3, (1, 2, 3)), (6, (1, 2, 4, 6)), (8, (1, 2, 4, 8)), (64, (1, 2, 4, 8))],
)
def test_candidates_are_powers_of_two_up_to_the_usable_cores_and_eight(
    cores: int, expected: tuple[int, ...]
) -> None:
    assert candidate_threads(cores) == expected


def test_the_first_probe_measures_every_candidate_and_keeps_the_fastest() -> None:
    policy = ThreadPolicy((1, 2), threads=2)
    changes, choices, _ = simulate(policy, machine(), until=3.0)
    assert [c.why for c in choices] == [Why.START]
    first = choices[0]
    assert first.threads == 2 and first.previous == 2
    assert first.rates == pytest.approx(IDLE)  # the warm-up step after a switch is not counted
    assert threads_at(changes, 3.0) == 2


def test_beside_a_busy_process_one_thread_wins_within_one_probe() -> None:
    policy = ThreadPolicy((1, 2), threads=2)
    _, choices, _ = simulate(policy, machine(busy_from=0.0), until=3.0)
    assert choices[0].threads == 1
    # The collapsed candidate costs its window of step time, not a number of steps.
    settings = ThreadSettings()
    assert choices[0].rates[2] == pytest.approx(BUSY[2])
    assert settings.probe_seconds < 1.0


def test_fewer_threads_win_within_the_tolerance() -> None:
    close = {1: 1000.0, 2: 1040.0}
    policy = ThreadPolicy((1, 2), threads=2)
    _, choices, _ = simulate(policy, lambda threads, now: 1.0 / close[threads], until=2.0)
    assert choices[0].threads == 1  # 4 % faster is not worth a second core taken from the editor
    apart = {1: 1000.0, 2: 1100.0}
    policy = ThreadPolicy((1, 2), threads=1)
    _, choices, _ = simulate(policy, lambda threads, now: 1.0 / apart[threads], until=2.0)
    assert choices[0].threads == 2


def test_load_that_arrives_is_met_by_a_new_probe_within_a_window() -> None:
    settings = ThreadSettings()
    policy = ThreadPolicy((1, 2), settings, threads=2)
    changes, choices, _ = simulate(policy, machine(busy_from=10.0), until=30.0)
    assert threads_at(changes, 9.9) == 2
    slower = [c for c in choices if c.why is Why.SLOWER]
    assert slower and slower[0].threads == 1
    # Two threads beside the busy process run at ~1 % speed: the window that sees it is short in step
    # time, yet it takes a wall-clock window to fill. Switched within one window and one probe.
    switched = next(at for at, threads in changes if at > 10.0 and threads == 1)
    assert switched - 10.0 <= settings.window_seconds + 2 * settings.probe_seconds + 1.0
    assert threads_at(changes, 29.0) == 1


def test_load_that_leaves_is_found_by_the_periodic_check() -> None:
    settings = ThreadSettings()
    policy = ThreadPolicy((1, 2), settings, threads=2)
    changes, choices, _ = simulate(policy, machine(busy_from=0.0, busy_until=20.0), until=200.0)
    assert threads_at(changes, 19.0) == 1
    # One thread keeps its rate when the load leaves, so no window looks different: the recheck finds
    # the second core again.
    back = next(at for at, threads in changes if at > 20.0 and threads == 2)
    assert back - 20.0 <= settings.recheck_seconds + settings.window_seconds + 2 * settings.probe_seconds
    assert any(c.why is Why.RECHECK and c.threads == 2 for c in choices)


def test_a_faster_window_starts_a_probe() -> None:
    rates = {1: 100.0, 2: 50.0}
    policy = ThreadPolicy((1, 2), threads=1)
    speed = {"factor": 1.0}
    now = 0.0
    choices = []
    while now < 12.0:
        if now > 5.0:
            speed["factor"] = 2.0  # everything runs twice as fast (the machine's clock went up)
        seconds = 1.0 / (rates[policy.threads] * speed["factor"])
        now += seconds
        choice = policy.record(seconds)
        if choice is not None:
            choices.append(choice)
    assert [c.why for c in choices][:2] == [Why.START, Why.FASTER]


def test_throughput_on_a_machine_whose_load_comes_and_goes_is_near_the_best_fixed_count() -> None:
    """Busy from 30 s to 150 s of a 300 s run: the policy keeps at least 90 % of the steps an oracle
    (the best count at every moment) makes; a fixed two threads makes about a third of them."""
    step_seconds = machine(busy_from=30.0, busy_until=150.0)
    _, _, steps = simulate(ThreadPolicy((1, 2), threads=2), step_seconds, until=300.0)
    oracle = 30.0 * IDLE[2] + 120.0 * BUSY[1] + 150.0 * IDLE[2]
    fixed_two = 30.0 * IDLE[2] + 120.0 * BUSY[2] + 150.0 * IDLE[2]
    assert steps >= 0.9 * oracle
    assert fixed_two < 0.7 * oracle


def test_one_candidate_never_switches() -> None:
    policy = ThreadPolicy((1,))
    changes, choices, _ = simulate(policy, machine(busy_from=5.0), until=100.0)
    assert changes == [(0.0, 1)]
    assert all(c.threads == 1 for c in choices)


def test_a_first_count_outside_the_candidates_starts_at_the_first_candidate() -> None:
    assert ThreadPolicy((1, 2, 4), threads=6).threads == 1
    with pytest.raises(ValueError, match="thread candidates"):
        ThreadPolicy((0, 1))


def test_the_tuner_applies_each_count_and_announces_each_choice_with_its_iteration() -> None:
    applied: list[int] = []
    announced: list[tuple[int, ThreadChoice]] = []
    settings = dataclasses.replace(ThreadSettings(), probe_seconds=0.01)
    tuner = ThreadTuner(
        2, ThreadPolicy((1, 2), settings, threads=2), lambda i, c: announced.append((i, c)), applied.append
    )
    assert applied == [2] and tuner.measuring
    iteration = 0
    while not announced:
        iteration += 1
        tuner.after_step(1.0 / BUSY[tuner.threads], iteration)
    assert applied == [2, 1]  # probed 2 (the first count), then 1, kept 1
    ((at, choice),) = announced
    assert at == iteration and choice.threads == 1 and tuner.latest is choice
    assert choice.describe().startswith("1 thread (start of training; it/s: 1 thread 350, 2 threads 4")
    assert choice.to_json() == {"threads": 1, "why": "start", "previous": 2, "rates": {"1": 350.0, "2": 4.4}}


def test_a_fixed_tuner_never_touches_torch() -> None:
    tuner = ThreadTuner.fixed(3)
    tuner.after_step(1.0, 1)
    assert tuner.threads == 3 and not tuner.measuring and tuner.latest is None


def test_a_count_at_under_half_the_best_rate_is_cut_after_a_few_steps() -> None:
    rates = {1: 1000.0, 2: 100.0}
    settings = ThreadSettings()
    policy = ThreadPolicy((1, 2), settings, threads=1)
    changes, choices, _ = simulate(policy, lambda threads, now: 1.0 / rates[threads], until=1.0)
    assert choices[0].threads == 1
    entered, left = (at for at, threads in changes[1:3])
    steps_at_two = round((left - entered) * rates[2])
    # The warm-up step after the switch, then the counted ones (the switch back happens on the last).
    assert steps_at_two == settings.warmup_steps + settings.abandon_steps
    assert left - entered < settings.probe_seconds / 4


def test_a_new_probe_takes_the_window_that_started_it_as_the_current_counts_measurement() -> None:
    settings = ThreadSettings()
    policy = ThreadPolicy((1, 2), settings, threads=2)
    _, choices, _ = simulate(policy, machine(busy_from=10.0), until=20.0)
    slower = next(c for c in choices if c.why is Why.SLOWER)
    assert slower.previous == 2 and slower.threads == 1
    # Two threads were measured by the window that saw the load arrive (below drop x the chosen rate),
    # not probed again: the probe ran one thread only.
    assert slower.rates[2] < settings.drop * IDLE[2]
    assert set(slower.rates) == {1, 2} and slower.rates[1] == pytest.approx(BUSY[1])
