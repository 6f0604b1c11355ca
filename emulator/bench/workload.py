"""The bench's synthetic workload: a replay buffer, the session the engine would send for it, and the
:class:`~trainer.training.job.TrainingJob` the trainer would build from both.

Torch and the trainer are imported inside the functions: the IPC worker imports this package and times
its own ``import torch`` (:mod:`emulator.bench.worker`), and ``la-trainer bench --help`` stays quick.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from emulator.bench.config import ACT_DIM, EPISODE_STEPS, OBS_DIM, TrainConfig

if TYPE_CHECKING:
    import torch

    from protocol.config import SessionConfig
    from protocol.replay import ReplayBuffer
    from trainer.training.job import TrainingJob

__all__ = ["make_job", "quiet", "session_for", "synthetic_replay"]


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Trainer log lines (job creation) go to stderr, so stdout keeps only the table or result lines."""
    with contextlib.redirect_stdout(sys.stderr):
        yield


def synthetic_replay(step_num: int, seed: int = 0) -> ReplayBuffer:
    """A replay buffer of ``step_num`` steps (observation 32, action 8, float32), episodes of 1000 steps.
    Values tile a block of 2^16 normal rows: ingest only moves bytes, and training needs no structure."""
    from protocol.replay import ReplayBuffer

    rng = np.random.default_rng(seed)
    block = min(step_num, 65536)
    obs = np.resize(rng.standard_normal((block, OBS_DIM), dtype=np.float32), (step_num, OBS_DIM))
    act = np.resize(rng.standard_normal((block, ACT_DIM), dtype=np.float32), (step_num, ACT_DIM))
    lengths = np.full(-(-step_num // EPISODE_STEPS), EPISODE_STEPS, dtype=np.int32)
    lengths[-1] = step_num - EPISODE_STEPS * (lengths.size - 1)
    starts = np.zeros_like(lengths)
    np.cumsum(lengths[:-1], out=starts[1:])
    return ReplayBuffer(0, starts, lengths, (obs,), (act,))


def session_for(
    replay: ReplayBuffer, cfg: TrainConfig, iteration_num: int = 1_000_000
) -> tuple[SessionConfig, tuple[bytes, ...]]:
    """(SessionConfig, snapshots) the engine would send for ``cfg`` and ``replay``."""
    from emulator.session import EngineTask, SessionSettings, build_session_config
    from emulator.tasks import continuous_action_schema, continuous_observation_schema

    task = EngineTask(
        "bench", continuous_observation_schema(cfg.obs_dim), continuous_action_schema(cfg.act_dim), replay
    )
    settings = SessionSettings(
        iteration_num=iteration_num,
        batch_size=cfg.batch_size,
        learning_rate=1e-4,
        hidden_layer_num=cfg.hidden_layer_num,
        hidden_layer_size=cfg.hidden_layer_size,
        action_chunk_size=cfg.chunk_size,
        save_snapshots=False,
    )
    return build_session_config(task, settings, None)


def make_job(
    cfg: TrainConfig, rows: int, device: torch.device, seed: int = 0, compile_step: bool = False
) -> TrainingJob:
    """A real :class:`TrainingJob` for ``cfg`` on synthetic data (what the trainer builds)."""
    from protocol.snapshot import read_snapshot
    from trainer.settings.options import TrainerOptions
    from trainer.training.job import TrainingJob

    replay = synthetic_replay(rows, seed)
    config, snapshots = session_for(replay, cfg)
    received = {i: read_snapshot(blob) for i, blob in enumerate(snapshots)}
    # Nothing held out: the bench times steps, and a held-out split would only print its lines.
    options = TrainerOptions(compile="on" if compile_step else "off", heldout_share=0.0)
    with quiet():
        return TrainingJob.create(config, received, replay, options=options, device=device)
