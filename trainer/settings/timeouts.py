"""Waits and cadences: the one settings object every wait of the trainer reads.

The rule (docs/unreal-install.md, "Waits"): **wait as long as the game is provably alive**. An editor
paused at a breakpoint, in a level load or a long hitch stops ticking but keeps its process, its
shared-memory regions and its socket (spec §11 item 6), and the engine's own trainers wait for it without
a bound. So a wait has no bound where the game's liveness can be seen, and a dead game still ends the run
within :attr:`Timeouts.peer_check_interval` of being noticed:

* spawned by the engine (shared memory or socket): the engine process (:mod:`trainer.system.liveness`);
* a connected socket: the connection itself (EOF, reset; TCP keep-alive for a machine that vanished,
  :mod:`trainer.session.transport.tcp`);
* shared memory: the engine unlinks its regions when it ends (spec §2.1).

Only where liveness cannot be seen is a wait bounded, by :attr:`Timeouts.wait`, announced when the wait
starts: attach mode (``-c``: we created the control block, nothing tells a dead game from a slow one) and
a listener nobody has connected to yet (``la-trainer socket``). The bound comes from ``--wait SECONDS``,
``la-trainer.json`` ``"wait"`` or ``LA_TRAINER_WAIT`` (0 = forever).

A socket connection is a game only once its config has come: until then it is one of several pending
connections (:class:`trainer.session.links.socket.SocketTrainerLink`), and one that has begun its config message
must finish it within :attr:`Timeouts.config_wait` (``--config-wait``, ``"config_wait"``,
``LA_TRAINER_CONFIG_WAIT``; 0 = no bound), so a peer that trickles bytes is closed instead of held.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from trainer.settings.environment import ENV_TIMEOUT_SCALE, environment_number

__all__ = ["CONFIG_WAIT_ADVICE", "DEFAULT_CONFIG_WAIT_S", "DEFAULT_WAIT_S", "WAIT_ADVICE", "Timeouts"]

DEFAULT_WAIT_S = 600.0
"""Default bound of a wait whose peer's liveness cannot be seen (seconds). Long enough to start an editor
and load a level after starting an attach-mode trainer, or to sit at a breakpoint for a while; a trainer
left waiting costs an idle process, and it writes its checkpoint before it gives up."""

WAIT_ADVICE = 'change it with --wait SECONDS, "wait" in la-trainer.json or LA_TRAINER_WAIT (0: no bound)'
"""How to change the bound; every announcement and timeout message ends with it."""

DEFAULT_CONFIG_WAIT_S = 60.0
"""Default bound from a socket connection's first byte to its complete config message (seconds). The
clock starts at the first byte, not at the connection: a game connects when its communicator is made and
sends its config when it begins training, which may be many minutes later (spec §1.3, §3), and that
silence never counts. Once begun, the engine writes the whole config back to back (signal, length,
kilobytes of JSON): milliseconds on a LAN, under a second for a megabyte at 10 Mbit/s, so 60 s cuts off
only a peer that trickles (issue 30 measured one byte a second) while costing a real game nothing."""

CONFIG_WAIT_ADVICE = (
    'change it with --config-wait SECONDS, "config_wait" in la-trainer.json or LA_TRAINER_CONFIG_WAIT '
    "(0: no bound)"
)
"""How to change :attr:`Timeouts.config_wait`; its announcement and every connection it closes say so."""


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Every wait and cadence of the trainer, in seconds."""

    wait: float = DEFAULT_WAIT_S
    """Bound of a wait whose peer's liveness cannot be seen (attach mode, a listener before any
    connection); ``math.inf``: no bound. Waits on a game that is provably alive have no bound at all."""
    notice_after: float = 15.0
    """A wait on the game that lasts this long says so once in the log (the game may be paused), then
    again at doubling intervals, so a long pause fills the engine's output pipe with a few lines only."""
    ping_interval: float = 1.0
    """Keep-alive period while we are busy and the engine may be waiting (its timeout is 10 s, reset by
    a ping, spec §2.4)."""
    poll_interval: float = 0.0005
    """Sleep between polls of the control block (the engine polls every 1 ms)."""
    peer_check_interval: float = 0.5
    """How often a wait checks that the game is still there (a dead game ends the run within this)."""
    signal_grace: float = 10.0
    """A send under way when SIGINT/SIGTERM arrives keeps waiting this long for the game to take it (the
    round finishes, so the engine is not left blocked in ReceiveNetwork, spec §7.1); then it gives up,
    so a paused or stuck game never keeps a signalled trainer alive. The engine's own wait is 10 s."""

    config_wait: float = DEFAULT_CONFIG_WAIT_S
    """Bound from a socket connection's first byte to its complete config message; a connection that
    misses it is closed and the others are still served (``math.inf``: no bound). A connection that has
    sent nothing is not bounded by it: it may be a game that has not begun training yet."""

    def __post_init__(self) -> None:
        if not self.wait > 0:
            raise ValueError(f"Timeouts.wait must be > 0 seconds or math.inf, got {self.wait!r}")
        if not self.config_wait > 0:
            raise ValueError(
                f"Timeouts.config_wait must be > 0 seconds or math.inf, got {self.config_wait!r}"
            )

    def bound(self, liveness_visible: bool) -> float:
        """The bound of one wait: none (``math.inf``) when the game's liveness can be seen, else
        :attr:`wait`."""
        return math.inf if liveness_visible else self.wait

    @classmethod
    def from_env(cls, wait: float | None = None, *, config_wait: float | None = None) -> Timeouts:
        """Defaults with the ``wait`` option (seconds, 0 = no bound; None: :data:`DEFAULT_WAIT_S`) and the
        ``config_wait`` option (the same form; None: :data:`DEFAULT_CONFIG_WAIT_S`), both bounds then
        scaled by ``LA_TRAINER_TIMEOUT_SCALE`` (tests: a small scale makes them fail fast)."""
        if wait is not None and (math.isnan(wait) or wait < 0):
            raise ValueError(f"wait must be >= 0 seconds (0: no bound), got {wait!r}")
        if config_wait is not None and (math.isnan(config_wait) or config_wait < 0):
            raise ValueError(f"config_wait must be >= 0 seconds (0: no bound), got {config_wait!r}")
        base = cls() if wait is None else cls(wait=math.inf if wait == 0 else float(wait))
        if config_wait is not None:
            base = replace(base, config_wait=math.inf if config_wait == 0 else float(config_wait))
        scale = environment_number(
            ENV_TIMEOUT_SCALE,
            1.0,
            "a number > 0 (the factor on every bounded wait)",
            lambda v: v > 0,
        )
        if scale == 1.0:
            return base
        return replace(base, wait=base.wait * scale, config_wait=base.config_wait * scale)
