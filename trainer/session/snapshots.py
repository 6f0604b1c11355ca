"""Snapshot files on disk: ``<task_dir>/Snapshots/<NetworkName>_<iteration>.bin`` (spec §7.2).

Each file holds exactly the bytes sent to the engine for that network (24-byte header + model), written
atomically (temp file, fsync, rename) so that a crash or a signal never leaves a partial file behind.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from protocol.config import SessionConfig
from trainer.settings.options import TrainerOptions
from trainer.system.atomic import atomic_write_all
from trainer.system.diskspace import OptionalWrite

__all__ = ["SnapshotWriter", "safe_file_name"]

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def safe_file_name(name: str) -> str:
    """A network asset name as a file-name component (the engine's names are short FNames)."""
    cleaned = _UNSAFE.sub("_", name).strip("._")
    return cleaned or "Network"


@dataclass
class SnapshotWriter:
    """Writes one file per network per snapshot iteration into ``folder``."""

    folder: Path
    names: Mapping[int, str]
    disk: OptionalWrite = field(default_factory=lambda: OptionalWrite("snapshots", "at the next snapshot"))

    @classmethod
    def for_run(
        cls, task_dir: Path | None, config: SessionConfig, options: TrainerOptions
    ) -> SnapshotWriter | None:
        """The run's writer into ``<task_dir>/Snapshots``, named after the config's networks (None without a
        task directory). ``options`` is not read (kept until the story stops passing it)."""
        if task_dir is None:
            return None
        names = {net.id: safe_file_name(net.name or f"Network{net.id}") for net in config.model.networks}
        # Two networks with the same asset name would overwrite each other: suffix the id.
        if len(set(names.values())) != len(names):
            names = {nid: f"{name}{nid}" for nid, name in names.items()}
        return cls(task_dir / "Snapshots", names)

    def path(self, network_id: int, iteration: int) -> Path:
        """``<folder>/<NetworkName>_<iteration>.bin``."""
        return self.folder / f"{self.names[network_id]}_{iteration}.bin"

    def write(self, iteration: int, blobs: Mapping[int, bytes]) -> list[Path]:
        """Write each network's snapshot bytes for ``iteration`` atomically, as one set; returns the paths in
        id order. A full disk writes none of them (no snapshot of that iteration, not part of one) and is a
        warning, once per outage (:class:`trainer.system.diskspace.OptionalWrite`): returns []."""
        files = {self.path(network_id, iteration): data for network_id, data in sorted(blobs.items())}
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            atomic_write_all(files)
        except OSError as error:
            if not self.disk.failed(self.folder, error):
                raise
            return []
        self.disk.written()
        return list(files)
