"""The engine's offline export: the ``TrainingMaterials/<YYYYmmddHHMMSS>/`` folder (spec §5.5).

No process and no waits. What goes into the folder is :func:`protocol.engine.export.encode_training_materials`
(shared with ``la-trainer record``); :meth:`FileExport.write` adds what is the engine's own: the folder
under its IntermediatePath, TempDirectory, and the engine's way of writing each file.
:meth:`FileExport.read_networks` loads the trained networks back with the engine's snapshot checks.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from emulator.game.common import EngineFailure, Failure, ReceivedNetwork, engine_load_snapshot
from protocol.config import SessionConfig
from protocol.engine.export import (
    ALL_EXPORT_FLAGS,
    TRAINING_MATERIALS_DIR,
    ExportFlags,
    encode_training_materials,
    export_folder_name,
    network_file,
)
from protocol.replay import ReplayBuffer

__all__ = ["FileExport"]


class FileExport:
    """The engine's FileTrainer export into ``<intermediate_dir>/TrainingMaterials/<YYYYmmddHHMMSS>/``."""

    def __init__(self, intermediate_dir: str | os.PathLike[str]) -> None:
        self.intermediate_dir = Path(intermediate_dir)

    @staticmethod
    def _write(path: Path, data: bytes) -> None:
        # §5.5: "<name>.tmp" first, then renamed over the final name. The engine's naming, not the
        # trainer's atomic writer: a trainer watching the folder sees exactly what a game leaves there.
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)

    def write(
        self,
        session: SessionConfig,
        networks: Mapping[int, bytes],
        replay_buffer: ReplayBuffer,
        *,
        flags: frozenset[ExportFlags] = ALL_EXPORT_FLAGS,
        now: datetime | None = None,
    ) -> Path:
        """Write the chosen parts and return the export folder.

        ``trainer-config.json`` carries TempDirectory (the intermediate dir unless the session names
        one); the data config has no model keys; the replay file holds only starts, lengths,
        observations and actions (§5.5).
        """
        folder = self.intermediate_dir / TRAINING_MATERIALS_DIR / export_folder_name(now or datetime.now())
        folder.mkdir(parents=True, exist_ok=True)
        if session.trainer.temp_directory is None:
            trainer = replace(session.trainer, temp_directory=str(self.intermediate_dir.resolve()))
            session = replace(session, trainer=trainer)
        for name, data in encode_training_materials(session, networks, replay_buffer, flags=flags).items():
            self._write(folder / name, data)
        return folder

    @staticmethod
    def read_networks(folder: str | os.PathLike[str], session: SessionConfig) -> tuple[ReceivedNetwork, ...]:
        """Load ``Networks/network_<id>.bin`` back with the engine's snapshot checks (sizes from the model
        config), in id order; what an import of offline results would see."""
        out = []
        for net in sorted(session.model.networks, key=lambda n: n.id):
            path = Path(folder) / network_file(net.id)
            try:
                data = path.read_bytes()
            except OSError as exc:
                raise EngineFailure(Failure.BAD_SNAPSHOT, f"reading {path}: {exc}") from None
            header = engine_load_snapshot(data, net.max_byte_num, net.id)
            out.append(ReceivedNetwork(net.id, data, header, None, time.monotonic()))
        return tuple(out)
