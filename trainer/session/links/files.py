"""The trainer's half of an offline session over the engine's ``TrainingMaterials`` export (spec §5.5).

The export is input only: trained networks never overwrite the exported initial ones (a second run must
start from the same weights as the first), they go to an output folder, by default a new numbered
folder beside the engine's own task folders (:func:`default_output_parent`).
"""

from __future__ import annotations

import os
from pathlib import Path

from protocol.config import SessionConfig
from protocol.names import CommType, network_label
from protocol.replay import ReplayBuffer
from trainer.errors import LaunchError, NoSpace
from trainer.session.links.base import check_snapshot_size
from trainer.session.transport.files import (
    NETWORKS_DIR,
    TRAINER_CONFIG,
    TRAINING_MATERIALS_DIR,
    TrainingMaterials,
    find_training_materials,
    network_path,
    read_training_materials,
    write_network_files,
)
from trainer.system.console import log
from trainer.system.diskspace import OptionalWrite, no_space_paragraph

__all__ = ["OFFLINE_TASK_NAME", "FileTrainerLink", "default_output_parent"]

OFFLINE_TASK_NAME = "Offline"
"""Task name of offline runs: output folders ``Offline<N>``, run names ``Offline_FlowMatching_Files_...``."""


def default_output_parent(export: Path) -> Path:
    """Where offline outputs go by default: the engine's IntermediatePath when the export sits in its
    ``TrainingMaterials`` folder (``<Project>/Intermediate/LearningCore``, beside the engine's own
    ``Training<N>`` task folders, where ``la-trainer watch`` and ``report`` look), else the export's parent."""
    parent = export.parent
    return parent.parent if parent.name == TRAINING_MATERIALS_DIR else parent


class FileTrainerLink:
    """Offline link over a ``TrainingMaterials`` export: everything is read from files.

    Trained networks are written as ``<output_dir>/Networks/network_<id>.bin`` (atomically): the same
    files, sizes and headers the engine exported. ``output_dir`` must not be an export (the engine's
    initial networks stay intact). Stop never comes; Complete has nowhere to go; :meth:`finish` names the
    files written.
    """

    comm_type = CommType.FILES
    """See :attr:`TrainerLink.comm_type <trainer.session.links.base.TrainerLink.comm_type>`."""

    def __init__(self, folder: str | os.PathLike[str], *, output_dir: str | os.PathLike[str]) -> None:
        self._folder = find_training_materials(folder)
        self._output_dir = Path(output_dir)
        out = self._output_dir.resolve()
        export = self._folder.resolve()
        # Inside the export, or inside the engine's TrainingMaterials folder that holds the exports: the
        # export is never written to (README), and the engine's next export goes there.
        materials = export.parent if export.parent.name == TRAINING_MATERIALS_DIR else export
        if out == export or (out / TRAINER_CONFIG).exists():
            raise LaunchError(
                f"the output folder {str(self._output_dir)!r} is an engine export; training into it would "
                "overwrite the exported initial networks. Choose another folder with --out (or leave --out "
                "out for a new one)."
            )
        if out.is_relative_to(materials):
            raise LaunchError(
                f"the output folder {str(self._output_dir)!r} (--out) is inside {str(materials)!r}, the engine's "
                "export, which is never written to (every run starts from its initial networks). Choose a "
                "folder outside it with --out, or leave --out out for a new Offline<N> beside the engine's "
                "task folders."
            )
        self._materials: TrainingMaterials | None = None
        self._next_replay = 0
        self._written: dict[int, Path] = {}
        self._round: dict[int, bytes] = {}
        self._round_version: int | None = None
        self._unwritten: OSError | None = None
        """The newest round's networks could not be written (a full disk): its error."""
        self._disk = OptionalWrite("the trained networks", "at the next sync round")

    @property
    def folder(self) -> Path:
        """The export folder in use (the newest stamp when given ``TrainingMaterials``)."""
        return self._folder

    @property
    def output_dir(self) -> Path:
        return self._output_dir

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
        """Keep the network until its round is whole, then write the round's networks as one set
        (:func:`~trainer.session.transport.files.write_network_files`): the output folder never mixes
        two rounds. A full disk keeps the previous set and is a warning; :meth:`send_complete` ends the
        run if the last round is the one that could not be written."""
        config = self._loaded().config
        check_snapshot_size(network_id, data, config.network(network_id).max_byte_num)
        if version != self._round_version:
            self._round, self._round_version = {}, version
        self._round[network_id] = data
        if set(self._round) < {net.id for net in config.model.networks}:
            return
        try:
            write_network_files(self._output_dir, self._round)
        except OSError as error:
            if not self._disk.failed(self._output_dir / NETWORKS_DIR, error):
                raise
            self._unwritten = error
            return
        self._disk.written()
        self._unwritten = None
        self._written = {nid: network_path(self._output_dir, nid) for nid in sorted(self._round)}

    def send_complete(self) -> None:
        """Nothing to signal offline; but the last round's networks are this run's product: if a full disk
        kept them from being written, the run ends here (exit 14), naming the folder and what it holds.

        Raises:
            NoSpace: the final networks could not be written.
        """
        if self._unwritten is None:
            return
        folder = self._output_dir / NETWORKS_DIR
        kept = (
            f"{folder} holds the networks of an earlier round of this run."
            if self._written
            else "No trained network was written."
        )
        raise NoSpace(
            no_space_paragraph("the trained networks", folder, self._unwritten, kept)
        ) from self._unwritten

    def stop_requested(self) -> bool:
        return False

    def ping(self) -> None:
        """Nobody waits on us offline."""

    def finish(self, timeout: float) -> None:
        """Nothing to wait for offline: say where the trained networks are."""
        for network_id, path in sorted(self._written.items()):
            log(f"la-trainer: trained {network_label(network_id)}: {path}")

    def close(self) -> None:
        """Nothing is held open (files are read whole and written atomically)."""
