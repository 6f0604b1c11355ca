"""What one engine session recorded, for assertions: its mode, the rounds taken, how it ended."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from emulator.game import ReceivedNetwork
from emulator.inference import DEFAULT_ODE_STEPS, EnginePolicy
from emulator.session.settings import SessionSettings
from protocol.config import SessionConfig
from protocol.snapshot import SnapshotHeader

__all__ = ["Mode", "RoundRecord", "SessionRecord"]


class Mode(str, Enum):
    """The four ways an engine reaches a trainer."""

    SHM = "shm"
    """Spawned process over shared memory (§1.2, §2)."""
    ATTACH = "attach"
    """Trainer started first with ``-c -d``; the engine attaches to its controls block (§2.5)."""
    SOCKET = "socket"
    """Spawned process over TCP; the engine is the client (§1.3, §3)."""
    FILE = "file"
    """Offline: TrainingMaterials export, ``la-trainer offline``, networks read back (§5.5)."""


@dataclass(frozen=True, slots=True, eq=False)
class RoundRecord:
    """One sync round the engine took: networks 0..N−1 and when (seconds since the session start)."""

    index: int
    at_s: float
    networks: tuple[ReceivedNetwork, ...]


@dataclass(eq=False)
class SessionRecord:
    """What happened, for assertions. Times are seconds since the session started."""

    mode: Mode
    settings: SessionSettings
    config: SessionConfig | None = None
    argv: list[str] = field(default_factory=list)
    task_dir: Path | None = None
    controls_guid: str | None = None
    export_dir: Path | None = None
    sent: tuple[bytes, ...] = ()
    """Initial snapshots in id order."""
    sent_headers: tuple[SnapshotHeader, ...] = ()
    network_send_order: list[int] = field(default_factory=list)
    """Ids the engine handed over, in order (shared memory: each only after the trainer's request)."""
    config_signal_after_first_request: int | None = None
    """Shared memory: ConfigSignal once the trainer asked for network 0 (it must have cleared it)."""
    experience_signal_at_first_round: int | None = None
    """Shared memory: ExperienceSignal when the first round arrived (the trainer must have consumed it)."""
    rounds: list[RoundRecord] = field(default_factory=list)
    completed: bool = False
    stop_sent: bool = False
    exited_before_close: bool | None = None
    """Socket after Complete: the trainer exited or hung up before the engine closed the connection
    (§10 item 7)."""
    exit_code: int | None = None
    exit_after_end_s: float | None = None
    """Seconds from Completed/Stop to the observed trainer exit."""
    engine_regions: tuple[str, ...] = ()
    regions_present_at_exit: dict[str, bool] | None = None
    """With ``regions_until_exit``: whether each engine region still existed after the trainer exited."""
    trainer_controls_name: str | None = None
    trainer_controls_left: bool | None = None
    """Attach mode: the trainer-created controls block still exists after the trainer exited."""
    leaked_shm: tuple[str, ...] = ()
    """/dev/shm entries that appeared during the session, were not the engine's, and outlived the trainer."""
    engine_events: list[tuple[float, str]] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    failure: str | None = None
    elapsed_s: float = 0.0

    # -- views -------------------------------------------------------------------------------------------
    @property
    def final_networks(self) -> tuple[bytes, ...]:
        """The latest snapshots in id order (the initial ones if no round arrived)."""
        return tuple(n.data for n in self.rounds[-1].networks) if self.rounds else self.sent

    def policy(self, ode_steps: int = DEFAULT_ODE_STEPS) -> EnginePolicy:
        """The final networks as the engine would run them (encoder = id 1, denoiser = 0, decoder = 2)."""
        denoiser, encoder, decoder = self.final_networks[:3]
        return EnginePolicy.from_snapshots(encoder, denoiser, decoder, ode_steps)

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log[-lines:])

    def describe(self) -> str:
        """A multi-line account for assertion messages."""
        events = "\n".join(f"  {t:8.3f} s  {what}" for t, what in self.engine_events[-30:])
        return (
            f"mode={self.mode.value} failure={self.failure!r} exit_code={self.exit_code} "
            f"completed={self.completed} stop_sent={self.stop_sent} rounds={len(self.rounds)}\n"
            f"argv: {self.argv}\nengine events (last 30):\n{events}\ntrainer output (last 60 lines):\n"
            f"{self.log_tail()}"
        )

    def check(self) -> None:
        """Raise AssertionError with :meth:`describe` if the session failed."""
        if self.failure is not None:
            raise AssertionError(f"engine session failed: {self.failure}\n{self.describe()}")
