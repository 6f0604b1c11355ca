"""What the engine calls things, written once: the trainer method, the three networks, the transports.

* :data:`FLOW_MATCHING`: the ``TrainerMethod`` la-trainer trains (spec §4.1), and the engine's default
  when a trainer config has no such key; :func:`trainer_method` reads it from a decoded config object.
* :data:`ENGINE_DEFAULT_MODULE`, :data:`FLOW_MATCHING_MODULE`: the ``-m`` module names that may start a
  flow-matching run (spec §1.6).
* :class:`NetworkId`: networks 0, 1, 2 of a flow-matching run, in the engine's ``AddNetwork`` order
  (spec §4.3), with the role each plays.
* :class:`CommType`: the transport's name in run names (spec §7.2).

Pure: names in, names out.
"""

from __future__ import annotations

from enum import Enum, IntEnum
from typing import Final

from protocol.argv import SHARED_MEMORY as _SHARED_MEMORY_COMMAND
from protocol.argv import SOCKET as _SOCKET_COMMAND

__all__ = [
    "ENGINE_DEFAULT_MODULE",
    "FLOW_MATCHING",
    "FLOW_MATCHING_MODULE",
    "CommType",
    "NetworkId",
    "network_label",
    "trainer_method",
]

FLOW_MATCHING: Final = "FlowMatching"
"""The one ``TrainerMethod`` la-trainer trains (also the engine's default when the key is absent)."""
ENGINE_DEFAULT_MODULE: Final = "learning_core.train_behavior_cloning"
"""``TrainerFileName``'s engine default (spec §1.6): what a flow-matching call site sends unless changed."""
FLOW_MATCHING_MODULE: Final = "learning_core.train_flow_matching"
"""[INF] The flow-matching module name (spec Unknown 10); a user may set it on flow-matching call sites."""


class NetworkId(IntEnum):
    """The networks of a flow-matching run, by the id the engine gives them (its ``AddNetwork`` order,
    spec §4.3): every config, snapshot, sync round and file names them by this number."""

    DENOISER = 0
    """The velocity field: [encoded observation, x, t] in, velocity out (spec §6.3)."""
    ENCODER = 1
    """Observations in, the latents the denoiser is conditioned on out."""
    DECODER = 2
    """The denoiser's action space in, the game's actions out (the action statistics live here)."""

    @property
    def role(self) -> str:
        """``"denoiser"``, ``"encoder"``, ``"decoder"``: the word messages and file names use."""
        return self.name.lower()

    @property
    def title(self) -> str:
        """``"Denoiser"``, ``"Encoder"``, ``"Decoder"``: the name written where the engine writes a
        network asset's short name (spec §4.3)."""
        return self.name.capitalize()

    def describe(self) -> str:
        """``"network 1 (encoder)"``: how a message names it (:func:`network_label`)."""
        return network_label(int(self))


def network_label(network_id: int) -> str:
    """``"network 1 (encoder)"``; an id that is not a :class:`NetworkId` reads ``"network 7 (network)"``.
    Also a key of the trainer's checkpoint fingerprint, so its spelling is part of the checkpoint format."""
    role = NetworkId(network_id).role if network_id in NetworkId._value2member_map_ else "network"
    return f"network {network_id} ({role})"


class CommType(str, Enum):
    """The transport of a run, as the run name spells it (``<Task>_<Method>_<CommType>_<TimeStamp>``, spec
    §7.2). The value is that spelling (``str()`` and f-strings give it too)."""

    SHARED_MEMORY = _SHARED_MEMORY_COMMAND
    """Shared memory (spec §2): the engine spawns the trainer, or attach mode (the launch's subcommand)."""
    SOCKET = _SOCKET_COMMAND
    """TCP (spec §3; the launch's subcommand)."""
    FILES = "Files"
    """The engine's ``TrainingMaterials`` export, read offline (spec §5.5): no game to wait for or sync with."""
    MEMORY = "Memory"
    """Values in memory, for tests of the training story (no engine)."""
    UNKNOWN = "Unknown"
    """A scale-out rank other than 0, which never sees the engine's transport."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


def trainer_method(settings: object) -> str | None:
    """``TrainerMethod`` of a decoded trainer config object (``trainer-config.json``, or the socket
    config's ``"TrainerSettings"``): :data:`FLOW_MATCHING` when the key is absent (the engine's default);
    None when ``settings`` is not a JSON object or the method is not a string."""
    if not isinstance(settings, dict):
        return None
    method = settings.get("TrainerMethod", FLOW_MATCHING)
    return method if isinstance(method, str) else None
