"""The engine's offline export: the ``TrainingMaterials/<YYYYmmddHHMMSS>/`` folder (spec §5.5).

No process and no waits: :meth:`FileExport.write` writes what the engine's FileTrainer writes, and
:meth:`FileExport.read_networks` loads the trained networks back with the engine's snapshot checks.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Final

from emulator.game.common import (
    EngineFailure,
    Failure,
    ReceivedNetwork,
    engine_json_bytes,
    engine_load_snapshot,
)
from protocol.config import SessionConfig, data_config_to_json, model_config_to_json, trainer_config_to_json
from protocol.replay import ReplayBuffer, ReplayLayout

__all__ = ["ExportFlags", "FileExport"]


class ExportFlags(Enum):
    """``ETrainerExportFlags``: which parts an export writes."""

    REPLAY_BUFFERS = "ReplayBuffers"
    NETWORKS = "Networks"
    TRAINER_CONFIG = "TrainerConfig"


_ALL_EXPORT_FLAGS: Final = frozenset(ExportFlags)


class FileExport:
    """The engine's FileTrainer export into ``<intermediate_dir>/TrainingMaterials/<YYYYmmddHHMMSS>/``."""

    def __init__(self, intermediate_dir: str | os.PathLike[str]) -> None:
        self.intermediate_dir = Path(intermediate_dir)

    @staticmethod
    def _write(path: Path, data: bytes) -> None:
        # §5.5: "<name>.tmp" first, then renamed over the final name.
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
        flags: frozenset[ExportFlags] = _ALL_EXPORT_FLAGS,
        now: datetime | None = None,
    ) -> Path:
        """Write the chosen parts and return the export folder.

        ``trainer-config.json`` carries TempDirectory (the intermediate dir); the data config has no
        model keys; the replay file holds only starts, lengths, observations and actions (§5.5).
        """
        stamp = (now or datetime.now()).strftime("%Y%m%d%H%M%S")
        folder = self.intermediate_dir / "TrainingMaterials" / stamp
        folder.mkdir(parents=True, exist_ok=True)
        if ExportFlags.TRAINER_CONFIG in flags:
            trainer = session.trainer
            if trainer.temp_directory is None:
                trainer = replace(trainer, temp_directory=str(self.intermediate_dir.resolve()))
            self._write(
                folder / "trainer-config.json", engine_json_bytes(trainer_config_to_json(trainer, True))
            )
        if ExportFlags.REPLAY_BUFFERS in flags:
            self._write(
                folder / "ReplayBuffers" / "data-config.json",
                engine_json_bytes(data_config_to_json(session.data)),
            )
            layout = ReplayLayout.from_config(session.replay_buffer(replay_buffer.replay_buffer_id))
            self._write(
                folder / "ReplayBuffers" / f"replaybuffer_{replay_buffer.replay_buffer_id}.bin",
                layout.encode_file(replay_buffer),
            )
        if ExportFlags.NETWORKS in flags:
            self._write(
                folder / "Networks" / "model-config.json",
                engine_json_bytes(model_config_to_json(session.model)),
            )
            for network_id, data in sorted(networks.items()):
                self._write(folder / "Networks" / f"network_{network_id}.bin", bytes(data))
        return folder

    @staticmethod
    def read_networks(folder: str | os.PathLike[str], session: SessionConfig) -> tuple[ReceivedNetwork, ...]:
        """Load ``Networks/network_<id>.bin`` back with the engine's snapshot checks (sizes from the model
        config), in id order; what an import of offline results would see."""
        out = []
        for net in sorted(session.model.networks, key=lambda n: n.id):
            path = Path(folder) / "Networks" / f"network_{net.id}.bin"
            try:
                data = path.read_bytes()
            except OSError as exc:
                raise EngineFailure(Failure.BAD_SNAPSHOT, f"reading {path}: {exc}") from None
            header = engine_load_snapshot(data, net.max_byte_num, net.id)
            out.append(ReceivedNetwork(net.id, data, header, None, time.monotonic()))
        return tuple(out)
