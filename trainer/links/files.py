"""The trainer's half of an offline session over the engine's ``TrainingMaterials`` export (spec §5.5)."""

from __future__ import annotations

import os
from pathlib import Path

from protocol.config import SessionConfig
from protocol.replay import ReplayBuffer
from trainer.errors import LaunchError
from trainer.links.base import check_snapshot_size
from trainer.transport.files import (
    TrainingMaterials,
    find_training_materials,
    read_training_materials,
    write_network_files,
)

__all__ = ["FileTrainerLink"]


class FileTrainerLink:
    """Offline link over a ``TrainingMaterials`` export: everything is read from files.

    Trained networks are written as ``Networks/network_<id>.bin`` (atomically) into ``output_dir``,
    which defaults to the export folder itself, replacing the exported initial networks: the same
    files the engine would import back. Stop never comes; Complete has nowhere to go.
    """

    comm_type = "Files"
    """See :attr:`TrainerLink.comm_type <trainer.links.base.TrainerLink.comm_type>`."""

    def __init__(
        self, folder: str | os.PathLike[str], *, output_dir: str | os.PathLike[str] | None = None
    ) -> None:
        self._folder = find_training_materials(folder)
        self._output_dir = Path(output_dir) if output_dir is not None else self._folder
        self._materials: TrainingMaterials | None = None
        self._next_replay = 0

    @property
    def folder(self) -> Path:
        """The export folder in use (the newest stamp when given ``TrainingMaterials``)."""
        return self._folder

    def _loaded(self) -> TrainingMaterials:
        if self._materials is None:
            self._materials = read_training_materials(self._folder)
        return self._materials

    def receive_config(self) -> SessionConfig:
        return self._loaded().config

    def receive_network(self, network_id: int) -> bytes:
        networks = self._loaded().networks
        if network_id not in networks:
            raise LaunchError(f"the export {self._folder} has no network {network_id}")
        return networks[network_id]

    def receive_experience(self) -> ReplayBuffer:
        buffers = self._loaded().replay_buffers
        if self._next_replay >= len(buffers):
            raise LaunchError(f"the export {self._folder} holds no further replay buffer")
        rb = buffers[self._next_replay]
        self._next_replay += 1
        return rb

    def send_network(self, network_id: int, data: bytes, version: int) -> None:
        config = self._loaded().config
        check_snapshot_size(network_id, data, config.network(network_id).max_byte_num)
        write_network_files(self._output_dir, {network_id: data})

    def send_complete(self) -> None:
        """Nothing to signal offline."""

    def stop_requested(self) -> bool:
        return False

    def ping(self) -> None:
        """Nobody waits on us offline."""

    def finish(self, timeout: float) -> None:
        """Nothing to wait for offline."""

    def close(self) -> None:
        """Nothing is held open (files are read whole and written atomically)."""
