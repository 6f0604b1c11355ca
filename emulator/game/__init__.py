"""The engine's half of every handshake, over the real transports (spec §2, §3, §5.5, §7.1, §10 items 6-9).

One game half per transport plays the game side of a flow-matching session against a trainer process:

* :class:`ShmGame` (:mod:`emulator.game.shm`): shared memory, spawned or attach mode (§2);
* :class:`SocketGame` (:mod:`emulator.game.socket`): the engine as the TCP client (§3);
* :class:`FileExport` (:mod:`emulator.game.files`): the offline ``TrainingMaterials`` folder (§5.5).

What they share (call results, :class:`EngineFailure`, the engine's snapshot load check and wait loop) is
in :mod:`emulator.game.common`. The engine's training story over a live half (BeginTraining, then the tick
loop) is :mod:`emulator.drive`. This module only re-exports the public names.
"""

from emulator.game.common import (
    COMPLETED,
    DEFAULT_ENGINE_TIMEOUT_S,
    ENGINE_POLL_S,
    Completed,
    EngineFailure,
    Failure,
    ReceivedNetwork,
    RoundResult,
    engine_load_snapshot,
)
from emulator.game.files import FileExport
from emulator.game.shm import ShmGame
from emulator.game.socket import SocketGame

__all__ = [
    "COMPLETED",
    "DEFAULT_ENGINE_TIMEOUT_S",
    "ENGINE_POLL_S",
    "Completed",
    "EngineFailure",
    "Failure",
    "FileExport",
    "ReceivedNetwork",
    "RoundResult",
    "ShmGame",
    "SocketGame",
    "engine_load_snapshot",
]
