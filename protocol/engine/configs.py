"""The configs and initial networks the engine builds when a game starts training on a recording.

``BeginTraining(Recording, ...)`` (spec §5.3, §7.1) turns the game's settings, its two schemas and the
recording into the three config objects of §4 and the three initial snapshots of §6.3. This module does
the same from the schema JSON objects (as the engine and its recorder write them, §4.4, §5.1), a replay
buffer and the settings, so the game-side emulator and ``la-trainer record`` send a trainer exactly what
an engine would:

* data config (§4.2): one replay buffer whose MaxEpisodeNum / MaxStepNum are the recording's counts (the
  buffer is always full), one observation and one action stream, schema id 0 named ``"Default"``;
* model config (§4.3): networks 0, 1, 2 (denoiser, encoder, decoder) with MaxByteNum = their snapshot
  sizes, the encoder reading observation schema 0 and the decoder writing action schema 0;
* trainer config (§4.1): as given. Its ``TimeStamp`` comes from the caller (see
  :func:`format_time_stamp`): this package reads no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import NamedTuple

from protocol.config import (
    DataConfig,
    FlowMatchingSettings,
    ModelConfig,
    NetworkConfig,
    ReplayBufferConfig,
    SchemaEntry,
    SessionConfig,
    StreamConfig,
    TrainerConfig,
)
from protocol.engine.networks import build_flow_matching_networks
from protocol.names import NetworkId
from protocol.replay import ReplayBuffer
from protocol.schema import parse_schema

__all__ = [
    "SCHEMA_NAME",
    "EngineSession",
    "build_engine_session",
    "format_time_stamp",
]

SCHEMA_NAME = "Default"
"""Name of the one observation and the one action schema entry (§4.2)."""


class EngineSession(NamedTuple):
    """What the engine sends before the replay buffer: the configs and the initial snapshots."""

    config: SessionConfig
    snapshots: tuple[bytes, bytes, bytes]
    """Snapshot bytes of networks 0, 1, 2 (denoiser, encoder, decoder)."""


def format_time_stamp(now: datetime) -> str:
    """The flow-matching trainer config's ``TimeStamp`` for ``now``: ``%Y-%m-%d_%H-%M-<ms>`` (§10 item 11)."""
    return f"{now:%Y-%m-%d_%H-%M}-{now.microsecond // 1000:03d}"


def build_engine_session(
    observation_schema: Mapping[str, object],
    action_schema: Mapping[str, object],
    replay_buffer: ReplayBuffer,
    *,
    trainer: TrainerConfig | None = None,
    flow_matching: FlowMatchingSettings | None = None,
) -> EngineSession:
    """The configs and initial snapshots the engine builds for a recording (§4, §6.3).

    ``observation_schema`` / ``action_schema``: schema JSON objects (§4.4). ``trainer``: the trainer
    config to send (engine defaults when None, with an empty TimeStamp); its ``Seed`` also seeds the
    initial weights. ``flow_matching``: the model's settings (engine defaults when None).

    Raises:
        ConfigError: a schema is malformed or its sizes disagree with the layers it implies.
        protocol.engine.networks.UnsupportedSchemaError: a schema element the builder cannot build.
    """
    trainer = trainer if trainer is not None else TrainerConfig()
    flow_matching = flow_matching if flow_matching is not None else FlowMatchingSettings()
    obs_node = parse_schema(dict(observation_schema), "observation", "Schemas.Observations[0].Schema")
    act_node = parse_schema(dict(action_schema), "action", "Schemas.Actions[0].Schema")
    snapshots = build_flow_matching_networks(
        obs_node,
        act_node,
        flow_matching.action_chunk_size,
        flow_matching.hidden_layer_num,
        flow_matching.hidden_layer_size,
        flow_matching.activation_function,
        trainer.training.seed,
    ).to_bytes()
    data = DataConfig(
        replay_buffers=(
            ReplayBufferConfig(
                id=replay_buffer.replay_buffer_id,
                max_episode_num=replay_buffer.episode_num,
                max_step_num=replay_buffer.step_num,
                has_completions=False,
                has_final_observations=False,
                has_final_memory_states=False,
                observations=(StreamConfig(0, "Observations", 0, obs_node.vector_size),),
                actions=(StreamConfig(0, "Actions", 0, act_node.vector_size),),
            ),
        ),
        observation_schemas=(SchemaEntry(0, SCHEMA_NAME, obs_node),),
        action_schemas=(SchemaEntry(0, SCHEMA_NAME, act_node),),
    )
    model = ModelConfig(
        networks=(
            # The engine sends its network assets' short names (§4.3); the roles' titles stand in.
            NetworkConfig(int(NetworkId.DENOISER), NetworkId.DENOISER.title, len(snapshots[0])),
            NetworkConfig(
                int(NetworkId.ENCODER), NetworkId.ENCODER.title, len(snapshots[1]), input_schema_id=0
            ),
            NetworkConfig(
                int(NetworkId.DECODER), NetworkId.DECODER.title, len(snapshots[2]), output_schema_id=0
            ),
        ),
        flow_matching=flow_matching,
    )
    return EngineSession(SessionConfig(trainer, data, model), snapshots)
