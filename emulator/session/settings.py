"""What one engine session is set up with: the task, the knobs, and the configs the engine builds.

:class:`EngineTask` is what the game trains on (schemas and a recording), :class:`SessionSettings` the
knobs of one scripted session (engine-side values default to the engine's), and
:func:`build_session_config` the configs and initial networks the engine would send for them.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from emulator.game import DEFAULT_ENGINE_TIMEOUT_S
from emulator.launch import DEFAULT_TASK_NAME, DEFAULT_TRAINER_MODULE, TRAIN_SCRIPT
from emulator.tasks import Demonstrations
from protocol.config import FlowMatchingSettings, FlowMatchingTrainingSettings, SessionConfig, TrainerConfig
from protocol.engine.configs import build_engine_session, format_time_stamp
from protocol.guid import GuidFormat
from protocol.replay import ReplayBuffer

__all__ = ["EngineTask", "SessionSettings", "build_session_config"]


@dataclass(frozen=True, slots=True, eq=False)
class EngineTask:
    """What the game trains on: schema JSON (as the engine writes it) and the replay buffer built from a
    recording (one episode per record, §5.3)."""

    name: str
    observation_schema: Mapping[str, Any]
    action_schema: Mapping[str, Any]
    replay_buffer: ReplayBuffer

    @classmethod
    def from_demonstrations(
        cls,
        name: str,
        observation_schema: Mapping[str, Any],
        action_schema: Mapping[str, Any],
        demos: Demonstrations,
    ) -> EngineTask:
        flat = demos.flatten()
        rb = ReplayBuffer(
            replay_buffer_id=0,
            episode_starts=flat.episode_starts,
            episode_lengths=flat.episode_lengths,
            observations=(flat.observations,),
            actions=(flat.actions,),
        )
        return cls(name, observation_schema, action_schema, rb)

    @classmethod
    def benchmark(cls, name: str = "bimodal", size: int = 500, seed: int = 0) -> EngineTask:
        """A benchmark task (``bimodal``, ``avoid``, ``pendulum``) with a small recording: ``size`` pairs
        for bimodal (one 1-step episode each), ``size`` demonstrations otherwise."""
        module = importlib.import_module(f"emulator.tasks.{name}")
        count_kw = "pair_num" if name == "bimodal" else "demo_num"
        demos = module.make_demonstrations(seed, **{count_kw: size})
        return cls.from_demonstrations(name, module.OBSERVATION_SCHEMA, module.ACTION_SCHEMA, demos)


@dataclass(frozen=True, slots=True)
class SessionSettings:
    """Knobs of one scripted session. Engine-side values default to the engine's; training sizes are
    small so that a whole session takes seconds on two CPU cores."""

    task_name: str = DEFAULT_TASK_NAME
    # -- trainer config (§4.1) and model config (§4.3)
    iteration_num: int = 300
    batch_size: int = 64
    learning_rate: float = 1e-3
    seed: int = 1234
    save_snapshots: bool = True
    iterations_per_snapshot: int = 1000
    device: str = "CPU"
    embed_normalizations_in_weights: bool = False
    hidden_layer_num: int = 1
    hidden_layer_size: int = 32
    activation: str = "ELU"
    action_chunk_size: int = 1
    # -- engine behaviour
    engine_timeout_s: float = DEFAULT_ENGINE_TIMEOUT_S
    """The communicator timeout (§1.6)."""
    tick_s: float = 0.005
    """Game tick: the period of ``HasNetworkOrCompleted`` polls."""
    stop_after_rounds: int | None = None
    """Send Stop (EndTraining) after this many rounds instead of waiting for Complete."""
    config_delay_s: float = 0.0
    """Spawned modes: time between launching the trainer and BeginTraining (0: at once, the strictest)."""
    pause_after_round: tuple[int, float] | None = None
    """``(n, seconds)``: after round ``n`` arrived the game stops ticking for that long, as an editor paused
    at a breakpoint or in a level load does (spec §11 item 6): nothing is taken, sent or answered."""
    take_late_s: float = 0.0
    """The game takes each network of a round this many seconds late (a slow frame between its receives):
    a trainer that sent its rounds itself would wait about this long per network."""
    log: bool = True
    """LogSettings Normal (``-l``); False passes the empty ``""`` item (§1.2)."""
    trainer_module: str = DEFAULT_TRAINER_MODULE
    """``-m``; the engine default is the behaviour-cloning module (§1.6)."""
    attach_guid_format: GuidFormat = GuidFormat.DIGITS_WITH_HYPHENS_IN_BRACES
    """Attach mode: how the user writes the GUID for ``-g`` and ``-LearningAgentsControlsGuid``."""
    regions_until_exit: bool = False
    """Keep the engine's regions until the trainer exited (to check it did not unlink them); False
    releases them at DoneTraining as the engine does."""
    # -- harness bounds
    session_timeout_s: float = 45.0
    """Bound on the whole tick loop (a trainer that never completes fails the session)."""
    exit_timeout_s: float = 15.0
    """Bound on the trainer's exit after Complete/Stop (then it is killed)."""
    complete_grace_s: float = 0.2
    """Socket: after Complete the trainer must still be running this long, waiting for the close
    (the deterministic form of the §10 item 7 race)."""
    attach_wait_s: float = 30.0
    """Attach mode: bound on the trainer creating its controls block."""
    hard_timeout_s: float = 55.0
    """Watchdog: the trainer is killed this long after its launch whatever happens (engine waits that pings
    keep extending are faithful but unbounded; killing the process ends them)."""
    # -- our trainer's knobs (environment)
    sync_every_iterations: int = 50
    timeout_scale: float = 0.25
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment variables for the trainer."""
    echo: bool = False
    """Print the echoed ``Subprocess:`` lines as they arrive (pytest shows them on failure)."""
    script: Path = TRAIN_SCRIPT
    """The ``train.py`` the live modes launch (tests of the harness itself use a stub trainer)."""


def build_session_config(
    task: EngineTask, settings: SessionSettings, temp_directory: str | None
) -> tuple[SessionConfig, tuple[bytes, bytes, bytes]]:
    """The configs the engine would build for ``task`` (§4) and the initial snapshots (§6.3), id order.

    The engine's assembly is :func:`protocol.engine.configs.build_engine_session`; this maps the session's
    knobs onto its trainer config (TimeStamp: now, as the engine stamps it) and model settings.
    """
    trainer = TrainerConfig(
        time_stamp=format_time_stamp(datetime.now()),
        training=FlowMatchingTrainingSettings(
            iteration_num=settings.iteration_num,
            learning_rate=settings.learning_rate,
            batch_size=settings.batch_size,
            seed=settings.seed,
            save_snapshots=settings.save_snapshots,
            iterations_per_snapshot=settings.iterations_per_snapshot,
        ),
        embed_normalizations_in_weights=settings.embed_normalizations_in_weights,
        device=settings.device,
        temp_directory=temp_directory,
    )
    flow_matching = FlowMatchingSettings(
        action_chunk_size=settings.action_chunk_size,
        hidden_layer_num=settings.hidden_layer_num,
        hidden_layer_size=settings.hidden_layer_size,
        activation_function=settings.activation,
    )
    config, snapshots = build_engine_session(
        task.observation_schema,
        task.action_schema,
        task.replay_buffer,
        trainer=trainer,
        flow_matching=flow_matching,
    )
    return config, snapshots
