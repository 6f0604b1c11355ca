"""What every game half shares: call results, failures, the engine's snapshot load and its wait loop.

The rules are the engine's, not our trainer's, so a test fails where a real game would (spec §2.4, §3,
§7.1, §10 items 6-8):

* Every blocking wait polls every 1 ms and gives up after the communicator timeout (default 10 s),
  adding up its 1 ms sleeps; a ping seen while waiting resets the count (:func:`engine_wait`).
* A spawned trainer that has exited makes every wait fail. Shared memory tests NetworkSignal /
  CompleteSignal *before* process liveness; the socket tests liveness first (§10 item 7).
* A returned snapshot is loaded as the engine loads it (:func:`engine_load_snapshot`, §10 item 6).
* ``ReceiveNetwork(0)`` may answer Completed; Completed in place of network 1 or 2 is an error
  (:func:`receive_round`, §7.1).

Failures raise :class:`EngineFailure` (the engine's non-Success responses). Nothing here waits without a
bound.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Final, TypeAlias, TypeVar

from protocol.errors import SnapshotError
from protocol.guid import new_guid, platform_guid_string
from protocol.snapshot import HEADER_BYTES, SnapshotHeader, read_snapshot_header

__all__ = [
    "COMPLETED",
    "DEFAULT_ENGINE_TIMEOUT_S",
    "ENGINE_POLL_S",
    "Completed",
    "EngineFailure",
    "Failure",
    "ProcessAlive",
    "ReceivedNetwork",
    "RoundResult",
    "engine_load_snapshot",
    "engine_wait",
    "new_platform_guid",
    "receive_round",
]

DEFAULT_ENGINE_TIMEOUT_S: Final = 10.0
"""The communicator Timeout default, seconds (shared memory and socket settings, §1.6)."""
ENGINE_POLL_S: Final = 0.001
"""The engine's sleep between polls in every wait loop, seconds (§2.4, §3)."""

T = TypeVar("T")
ProcessAlive: TypeAlias = Callable[[], bool]
"""The engine's ``IsRunning`` check on the spawned trainer; None in attach mode (no process handle)."""


# ---------------------------------------------------------------------------------------------------------
# Results and failures


class Failure(Enum):
    """Why an engine call did not succeed (the engine's non-Success ``ETrainerResponse`` values, and the
    emulator's finer split of its generic error)."""

    TIMEOUT = "timeout"
    """A wait ran past the communicator timeout without a ping."""
    PROCESS_EXITED = "process exited"
    """The spawned trainer process is no longer running."""
    DISCONNECTED = "disconnected"
    """Socket: the trainer closed or reset the connection."""
    UNEXPECTED = "unexpected"
    """The trainer broke the protocol: wrong NetworkId, bad signal byte, Complete mid-round, ..."""
    BAD_SNAPSHOT = "bad snapshot"
    """A returned snapshot failed the engine's load checks (size, magic, version)."""
    SETUP = "setup"
    """Mapping, connecting or writing the configs failed."""


class EngineFailure(Exception):
    """An engine call failed; ``str()`` says what the engine was doing and why it gave up."""

    def __init__(self, failure: Failure, message: str) -> None:
        super().__init__(f"engine {failure.value}: {message}")
        self.failure = failure
        self.message = message


@dataclass(frozen=True, slots=True)
class Completed:
    """``ETrainerResponse::Completed``: the trainer finished training."""


COMPLETED: Final = Completed()


@dataclass(frozen=True, slots=True, eq=False)
class ReceivedNetwork:
    """One network the engine loaded from the trainer.

    ``data``: the full snapshot bytes (exactly the network's MaxByteNum). ``header``: what the engine
    adopted from it. ``version``: the socket NetworksVersion that came with it (None for shared memory
    and files). ``received_at``: ``time.monotonic()`` when the load finished.
    """

    network_id: int
    data: bytes
    header: SnapshotHeader
    version: int | None
    received_at: float

    @property
    def raw_header(self) -> bytes:
        """The first 24 bytes exactly as received (magic, version, sizes, hash)."""
        return self.data[:HEADER_BYTES]


RoundResult: TypeAlias = tuple[ReceivedNetwork, ...] | Completed
"""A whole sync round (networks 0..N−1 in id order) or Completed."""


def engine_load_snapshot(data: bytes, expected_size: int, network_id: int) -> SnapshotHeader:
    """Load a returned snapshot as the engine does (§10 item 6) and return the header it adopts.

    The transport insists on ``expected_size`` (the network's current snapshot size); the loader checks
    size > 24, magic and version, then slices FileData by FileDataSize. [INF] A FileDataSize that does not
    fill the buffer exactly is refused here: the engine would adopt it and then fail on the *next*
    receive, because the snapshot byte size changed; failing now names the culprit.
    """
    where = f"network {network_id}"
    if len(data) != expected_size:
        raise EngineFailure(
            Failure.BAD_SNAPSHOT,
            f"{where} arrived with {len(data)} bytes but its snapshot size (MaxByteNum) is {expected_size}",
        )
    if len(data) <= HEADER_BYTES:
        raise EngineFailure(
            Failure.BAD_SNAPSHOT, f"{where} has {len(data)} bytes, not more than the 24-byte header"
        )
    try:
        header = read_snapshot_header(data)
    except SnapshotError as exc:
        raise EngineFailure(Failure.BAD_SNAPSHOT, f"{where}: {exc}") from None
    if header.snapshot_size != len(data):
        raise EngineFailure(
            Failure.BAD_SNAPSHOT,
            f"{where} header says FileDataSize {header.file_data_size} (snapshot {header.snapshot_size} bytes) "
            f"but the snapshot is {len(data)} bytes; the engine's next receive of this network would fail",
        )
    return header


# ---------------------------------------------------------------------------------------------------------
# The engine's wait loop and sync round


def engine_wait(
    poll: Callable[[], T | None],
    *,
    timeout: float,
    what: str,
    take_ping: Callable[[], bool],
    process_alive: ProcessAlive | None,
    liveness_first: bool,
) -> T:
    """Poll every 1 ms until ``poll`` returns a value (not None/False), as the engine's waits do (§2.4).

    The clock counts time slept and restarts when ``take_ping`` reports a ping. ``liveness_first``: check
    the process before looking for data (socket, §10 item 7) rather than after (shared memory).

    [INF] "Adds up the time it sleeps" (§2.4) is read as the usual engine pattern of adding the requested
    sleep (1 ms) per poll, not the measured one: on a loaded machine the engine's timeout then stretches
    in wall time exactly as the engine's would, instead of failing a trainer that is merely starved of CPU
    by the test run itself.
    """
    slept = 0.0
    while True:
        if liveness_first and process_alive is not None and not process_alive():
            raise EngineFailure(
                Failure.PROCESS_EXITED, f"the trainer process exited while the engine was {what}"
            )
        result = poll()
        if result is not None and result is not False:
            return result
        if take_ping():
            slept = 0.0
        if not liveness_first and process_alive is not None and not process_alive():
            raise EngineFailure(
                Failure.PROCESS_EXITED, f"the trainer process exited while the engine was {what}"
            )
        if slept >= timeout:
            raise EngineFailure(
                Failure.TIMEOUT, f"no answer within the {timeout:g} s communicator timeout while {what}"
            )
        time.sleep(ENGINE_POLL_S)
        slept += ENGINE_POLL_S


def receive_round(
    receive_network: Callable[[int], ReceivedNetwork | Completed],
    network_ids: Iterable[int],
    late_s: float = 0.0,
) -> RoundResult:
    """One sync round: ``ReceiveNetwork(i)`` for each id in order (0..N−1), or Completed in place of
    network 0 (§7.1); Completed in place of any other network is an error. ``late_s``: the game takes
    each network this long after it turned to it (a slow frame between the receives)."""
    got: list[ReceivedNetwork] = []
    for network_id in network_ids:
        if late_s > 0:
            time.sleep(late_s)
        answer = receive_network(network_id)
        if isinstance(answer, Completed):
            if network_id != 0:
                # §7.1: only ReceiveNetwork(0) may answer Completed; any other non-Success ends training
                # with an error.
                raise EngineFailure(
                    Failure.UNEXPECTED,
                    f"the trainer signalled Complete in place of network {network_id}; only the first network "
                    "of a round may be replaced by Complete",
                )
            return answer
        got.append(answer)
    return tuple(got)


def new_platform_guid(platform: str) -> str:
    """A fresh random GUID in the platform's string form (the engine's ``FGuid::NewGuid``)."""
    return platform_guid_string(new_guid(os.urandom(16)), platform)
