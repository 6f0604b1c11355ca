"""The CPU thread count of a training run, measured while it trains and kept fast on a busy machine.

The engine spawns the trainer on the machine where the editor runs the game, and the game's load comes
and goes (Play In Editor starts and stops). A fixed intra-op thread count cannot serve both: more
threads than free cores make every parallel region wait for a descheduled thread (26x slower beside
one CPU-bound process on 2 cores, issue 28), fewer than free cores leave speed unused on an idle one.
So the count is measured, not guessed:

* **Probe**: each candidate count (:func:`candidate_threads`: 1, 2, 4, ... up to the usable cores, at
  most 8) trains for :attr:`ThreadSettings.probe_seconds` of step time; the run keeps the fewest threads
  within :attr:`ThreadSettings.tolerance` of the fastest (fewer threads leave more to the editor).
  Training goes on during a probe: no step is wasted, and a count that runs at under half the best rate
  so far is cut after a few steps (beside a busy process an oversubscribed count runs at a few per cent).
* **Watch**: the chosen count's rate is measured over windows of :attr:`ThreadSettings.window_seconds`;
  a window below ``drop`` or above ``1 / drop`` times the rate it was chosen at starts a new probe (load
  arrived or left), and so does every :attr:`ThreadSettings.recheck_seconds` (load that left does not
  always raise the rate of the count chosen under it). That window is the current count's measurement:
  a new probe tries only the other counts.

Only the time inside training steps counts (sync rounds, held-out measurements and snapshot writes
would look like a slow machine). The ``threads`` option fixes the count and turns all of this off, as
do a CUDA device (the CPU only feeds the GPU) and scale-out (ranks step in lock-step, each a share of
the node's cores). The choice can change the last bits of a large network's weights between runs
(a matrix product's sums split differently); set ``threads`` for bit-identical reruns.

:class:`ThreadPolicy` holds the decisions and nothing else (a test feeds it rates); :class:`ThreadTuner`
applies them to torch and reports them (log, status file, run record).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

__all__ = [
    "MAX_AUTO_THREADS",
    "THREADS_WORK_THRESHOLD",
    "ThreadChoice",
    "ThreadPolicy",
    "ThreadSettings",
    "ThreadTuner",
    "Why",
    "candidate_threads",
    "choose_threads",
    "usable_cores",
]

MAX_AUTO_THREADS = 8
"""The automatic count never exceeds this: past it a step of the engine's networks gains nothing
measurable and the editor loses cores."""


def usable_cores() -> int:
    """Cores this process may run on: its CPU affinity where the OS has one (``taskset``, a container's
    cpuset), else every core."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS and Windows have no sched_getaffinity
        return max(1, os.cpu_count() or 1)


def candidate_threads(cores: int) -> tuple[int, ...]:
    """The counts a probe tries: powers of two below ``min(cores, MAX_AUTO_THREADS)``, and that bound."""
    top = max(1, min(cores, MAX_AUTO_THREADS))
    counts = [1]
    while counts[-1] * 2 < top:
        counts.append(counts[-1] * 2)
    if counts[-1] != top:
        counts.append(top)
    return tuple(counts)


THREADS_WORK_THRESHOLD = 16_000_000
"""Multiply-adds per forward pass (batch × denoiser parameters) from which a step uses several threads.

Measured with ``la-trainer bench --sections train`` (2 cores, two idle runs, 1 thread vs 2): the default
network (batch 256 × 23k parameters ≈ 6 M) runs faster on one (1,402 vs 1,364 and 1,338 vs 1,262 it/s);
the chunk-8 2×512 one (≈ 21 M) as fast or faster on two (639 vs 633, 641 vs 798); the 3-layer 256-wide
one at batch 1024 (≈ 80 M) much faster on two (168 vs 256, 177 vs 287)."""


def choose_threads(threads: int, work: int) -> int:
    """The run's first intra-op CPU thread count: ``threads`` (the option; 0: automatic), else one for small networks
    (intra-op threading costs more than it saves there) and up to 8 from :data:`THREADS_WORK_THRESHOLD`
    on. Where nothing fixes the count, a CPU run then measures it (this module); this is the
    count it measures first. ``work``: batch size × the denoiser's parameter count (the multiply-adds of
    one forward pass)."""
    if threads > 0:
        return threads
    return 1 if work < THREADS_WORK_THRESHOLD else candidate_threads(usable_cores())[-1]


class Why(str, Enum):
    """Why a probe ran; the value is the log's wording."""

    START = "start of training"
    SLOWER = "the rate fell"
    FASTER = "the rate rose"
    RECHECK = "periodic check"


@dataclass(frozen=True, slots=True)
class ThreadSettings:
    """The policy's knobs (seconds are seconds of training-step time)."""

    probe_seconds: float = 0.4
    """Step time each candidate trains for during a probe."""
    window_seconds: float = 2.0
    """Step time of one watched window between probes."""
    drop: float = 0.7
    """A watched window outside ``[drop, 1 / drop]`` times the chosen rate starts a probe."""
    recheck_seconds: float = 60.0
    """Step time after which a probe runs anyway."""
    tolerance: float = 0.05
    """Fewer threads win when their rate is within this share of the fastest."""
    warmup_steps: int = 1
    """Steps not counted after each change of the count (the team's threads wake or start)."""
    abandon_steps: int = 3
    abandon_ratio: float = 0.5
    """A probed count slower than ``abandon_ratio`` times the best rate of the probe so far after
    ``abandon_steps`` counted steps is cut short: beside a busy process a collapsed count would otherwise
    cost its whole window at a few per cent of the speed."""


@dataclass(frozen=True, slots=True)
class ThreadChoice:
    """The outcome of one probe."""

    threads: int
    why: Why
    rates: Mapping[int, float]
    """Iterations per second of step time, per candidate count."""
    previous: int
    """The count before the probe."""

    def describe(self) -> str:
        """``2 threads (start of training; it/s: 1 thread 358, 2 threads 515)``."""
        measured = ", ".join(f"{_count(n)} {rate:,.0f}" for n, rate in sorted(self.rates.items()))
        return f"{_count(self.threads)} ({self.why.value}; it/s: {measured})"

    def to_json(self) -> dict[str, object]:
        return {
            "threads": self.threads,
            "why": self.why.name.lower(),
            "previous": self.previous,
            "rates": {str(n): round(rate, 1) for n, rate in sorted(self.rates.items())},
        }


def _count(n: int) -> str:
    return f"{n} thread" if n == 1 else f"{n} threads"


@dataclass
class ThreadPolicy:
    """Decides the thread count from measured steps. Feed it every step with :meth:`record`; read
    :attr:`threads` after each call (it changes during a probe) and apply it."""

    candidates: Sequence[int]
    settings: ThreadSettings = field(default_factory=ThreadSettings)
    threads: int = 0
    """The count the next step should run with (0: the first candidate)."""
    _queue: list[int] = field(default_factory=list, init=False)
    _rates: dict[int, float] = field(default_factory=dict, init=False)
    _why: Why | None = field(default=Why.START, init=False)
    _previous: int = field(default=0, init=False)
    _skip: int = field(default=0, init=False)
    _steps: int = field(default=0, init=False)
    _seconds: float = field(default=0.0, init=False)
    _reference: float = field(default=0.0, init=False)
    _since_probe: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        if not self.candidates or min(self.candidates) < 1:
            raise ValueError(f"thread candidates must be counts >= 1, got {list(self.candidates)}")
        if self.threads not in self.candidates:
            self.threads = self.candidates[0]
        self._start_probe(Why.START)

    def record(self, seconds: float) -> ThreadChoice | None:
        """One training step took ``seconds`` at :attr:`threads`. Returns the choice when a probe ends."""
        if self._skip > 0:
            self._skip -= 1
            return None
        self._steps += 1
        self._seconds += seconds
        if self._why is not None:
            return self._probe_step()
        self._since_probe += seconds
        if self._seconds < self.settings.window_seconds:
            return None
        rate = self._take_rate()
        why = self._reason_to_probe(rate)
        if why is None:
            return None
        # The window just measured the current count: it is that count's probe, the others follow.
        self._start_probe(why)
        self._rates[self.threads] = rate
        return self._next_candidate()

    def _reason_to_probe(self, rate: float) -> Why | None:
        drop = self.settings.drop
        if rate < drop * self._reference:
            return Why.SLOWER
        if rate * drop > self._reference:
            return Why.FASTER
        if self._since_probe >= self.settings.recheck_seconds:
            return Why.RECHECK
        return None

    def _probe_step(self) -> ThreadChoice | None:
        settings = self.settings
        if self._seconds < settings.probe_seconds:
            best = max(self._rates.values(), default=0.0)
            hopeless = self._steps >= settings.abandon_steps and self._steps < (
                settings.abandon_ratio * best * self._seconds
            )
            if not hopeless:
                return None
        self._rates[self.threads] = self._take_rate()
        return self._next_candidate()

    def _next_candidate(self) -> ThreadChoice | None:
        """Probe the next count, or end the probe with its choice."""
        if self._queue:
            self._use(self._queue.pop(0))
            return None
        best = max(self._rates.values())
        chosen = min(n for n, rate in self._rates.items() if rate >= (1 - self.settings.tolerance) * best)
        choice = ThreadChoice(chosen, self._why or Why.START, dict(self._rates), self._previous)
        self._why = None
        self._reference = self._rates[chosen]
        self._since_probe = 0.0
        self._use(chosen)
        return choice

    def _start_probe(self, why: Why) -> None:
        """Measure the current count first (no switch needed), then the others in ascending order."""
        self._why = why
        self._previous = self.threads
        self._rates = {}
        self._queue = [n for n in self.candidates if n != self.threads]
        self._steps, self._seconds = 0, 0.0

    def _use(self, threads: int) -> None:
        if threads != self.threads:
            self.threads = threads
            self._skip = self.settings.warmup_steps
        self._steps, self._seconds = 0, 0.0

    def _take_rate(self) -> float:
        rate = self._steps / self._seconds if self._seconds > 0 else 0.0
        self._steps, self._seconds = 0, 0.0
        return rate


class ThreadTuner:
    """Applies a run's thread count to torch: fixed (``threads`` option, CUDA, scale-out) or measured
    by a :class:`ThreadPolicy`. ``announce`` gets each probe's outcome (the story logs a change and
    records every outcome, with the iteration it ended at); :attr:`latest` is the last one."""

    def __init__(
        self,
        threads: int,
        policy: ThreadPolicy | None,
        announce: Callable[[int, ThreadChoice], None] | None = None,
        set_threads: Callable[[int], None] | None = None,
    ) -> None:
        if set_threads is None:
            import torch

            set_threads = torch.set_num_threads
        self.policy = policy
        self.threads = threads
        self.latest: ThreadChoice | None = None
        self._announce = announce
        self._set_threads = set_threads
        if policy is not None:
            self._apply(policy.threads)

    @classmethod
    def fixed(cls, threads: int) -> ThreadTuner:
        """A count nobody measures (the caller has set it already)."""
        return cls(threads, None, set_threads=lambda _: None)

    @property
    def measuring(self) -> bool:
        return self.policy is not None

    def after_step(self, seconds: float, iteration: int) -> None:
        """The training step that ended at ``iteration`` took ``seconds`` of wall time."""
        policy = self.policy
        if policy is None:
            return
        choice = policy.record(seconds)
        if policy.threads != self.threads:
            self._apply(policy.threads)
        if choice is not None:
            self.latest = choice
            if self._announce is not None:
                self._announce(iteration, choice)

    def _apply(self, threads: int) -> None:
        self._set_threads(threads)
        self.threads = threads
