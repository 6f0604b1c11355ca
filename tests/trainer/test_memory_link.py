"""The in-memory link (trainer/session/links/memory.py), alone and under a whole training story.

Facts: it hands out exactly the config, snapshots and replay buffer it was built with; it records every
network sent, grouped into rounds, and Complete; Stop comes when asked (by a call, after N rounds, or from
a poll callback) and the story then ends without Complete; a run over it follows the sync cadence, keeps
every snapshot's size and header, and two runs with one seed send bitwise the same networks.
"""

from __future__ import annotations

import threading
from dataclasses import replace

import numpy as np
import pytest

from protocol.config import (
    DataConfig,
    FlowMatchingSettings,
    FlowMatchingTrainingSettings,
    ModelConfig,
    NetworkConfig,
    ReplayBufferConfig,
    SchemaEntry,
    SessionConfig,
    StreamConfig,
    TrainerConfig,
)
from protocol.engine.networks import build_flow_matching_networks
from protocol.replay import ReplayBuffer
from protocol.schema import parse_schema
from protocol.snapshot import read_snapshot
from trainer.errors import BadData, LaunchError
from trainer.exitcodes import ExitCode
from trainer.session.links import KeepAlive, MemoryLink, SentNetwork, TrainerLink
from trainer.session.run import run_training
from trainer.settings.options import TrainerOptions
from trainer.settings.timeouts import Timeouts

OBS, ACT = 3, 2
EPISODES, STEPS = 4, 32
HIDDEN = 8


def tiny_session(iterations: int = 20, seed: int = 7) -> tuple[SessionConfig, tuple[bytes, bytes, bytes]]:
    """A config and initial snapshots as the engine builds them (spec §4, §6.3), with a tiny denoiser."""
    observation = parse_schema(
        {
            "VectorSize": OBS,
            "EncodedSize": OBS,
            "Type": "Continuous",
            "Num": OBS,
            "Normalization": "AutoPerDimension",
        },
        "observation",
    )
    action = parse_schema(
        {
            "VectorSize": ACT,
            "DistributionSize": 2 * ACT,
            "EncodedSize": 2 * ACT,
            "ModifierSize": 1 + 2 * ACT,
            "Type": "Continuous",
            "Num": ACT,
            "Normalization": "AutoPerDimension",
        },
        "action",
    )
    snapshots = build_flow_matching_networks(
        observation, action, hidden_layer_size=HIDDEN, seed=seed
    ).to_bytes()
    data = DataConfig(
        replay_buffers=(
            ReplayBufferConfig(
                id=0,
                max_episode_num=EPISODES,
                max_step_num=STEPS,
                has_completions=False,
                has_final_observations=False,
                has_final_memory_states=False,
                observations=(StreamConfig(0, "Observations", 0, OBS),),
                actions=(StreamConfig(0, "Actions", 0, ACT),),
            ),
        ),
        observation_schemas=(SchemaEntry(0, "Default", observation),),
        action_schemas=(SchemaEntry(0, "Default", action),),
    )
    model = ModelConfig(
        networks=(
            NetworkConfig(0, "Denoiser", len(snapshots[0])),
            NetworkConfig(1, "Encoder", len(snapshots[1]), input_schema_id=0),
            NetworkConfig(2, "Decoder", len(snapshots[2]), output_schema_id=0),
        ),
        flow_matching=FlowMatchingSettings(hidden_layer_size=HIDDEN),
    )
    trainer = TrainerConfig(
        training=FlowMatchingTrainingSettings(
            iteration_num=iterations, batch_size=16, learning_rate=1e-3, seed=seed, save_snapshots=False
        ),
        device="CPU",
    )
    return SessionConfig(trainer, data, model), snapshots


def tiny_replay(seed: int = 0) -> ReplayBuffer:
    """Actions a noisy linear function of the observations: something to learn."""
    rng = np.random.default_rng(seed)
    observations = rng.standard_normal((EPISODES * STEPS, OBS)).astype(np.float32)
    actions = (observations[:, :ACT] * 0.5 + 0.05 * rng.standard_normal((EPISODES * STEPS, ACT))).astype(
        np.float32
    )
    return ReplayBuffer(
        replay_buffer_id=0,
        episode_starts=np.arange(0, EPISODES * STEPS, STEPS, dtype=np.int32),
        episode_lengths=np.full(EPISODES, STEPS, dtype=np.int32),
        observations=(observations,),
        actions=(actions,),
    )


def tiny_link(**kwargs: object) -> MemoryLink:
    config, snapshots = tiny_session()
    return MemoryLink(config, snapshots, tiny_replay(), **kwargs)  # type: ignore[arg-type]


OPTIONS = TrainerOptions(
    sync_every_iterations=5,
    sync_every_seconds=0.0,
    progress_every_seconds=3600.0,
    status_file=False,
    threads=1,
    checkpoint_every_seconds=0.0,
)


def run(link: MemoryLink, options: TrainerOptions = OPTIONS, timeouts: Timeouts | None = None) -> ExitCode:
    return run_training(link, options=options, task_dir=None, timeouts=timeouts or Timeouts())


# --- the link alone ---------------------------------------------------------------------------------------


def test_it_is_a_trainer_link() -> None:
    link: TrainerLink = tiny_link()  # mypy checks the protocol; the name is what run names show
    assert link.comm_type == "Memory"


def test_it_hands_out_what_it_was_built_with_once() -> None:
    config, snapshots = tiny_session()
    replay = tiny_replay()
    link = MemoryLink(config, snapshots, replay)
    assert link.receive_config() is config
    assert [link.receive_network(nid) for nid in (0, 1, 2)] == list(snapshots)
    assert link.receive_experience() is replay
    with pytest.raises(LaunchError, match="no further replay buffer"):
        link.receive_experience()
    with pytest.raises(LaunchError, match="no network 3"):
        link.receive_network(3)


def test_it_records_sends_rounds_complete_pings_finish_and_close() -> None:
    link = tiny_link()
    blobs = [link.receive_network(nid) for nid in (0, 1, 2)]
    for version in (1, 2):
        for nid in (0, 1, 2):
            link.send_network(nid, blobs[nid], version)
    link.send_complete()
    link.ping()
    link.finish(12.5)
    link.close()
    link.close()
    assert link.sent[:3] == [SentNetwork(nid, 1, blobs[nid]) for nid in (0, 1, 2)]
    assert link.rounds == [dict(enumerate(blobs))] * 2
    assert (link.completed, link.pings, link.finish_timeout, link.closed) == (True, 1, 12.5, True)


def test_a_snapshot_of_another_size_is_refused_as_over_every_transport() -> None:
    link = tiny_link()
    with pytest.raises(BadData, match="MaxByteNum"):
        link.send_network(0, link.receive_network(0) + b"\0", 1)
    assert link.sent == []


def test_stop_after_rounds_counts_only_complete_rounds() -> None:
    link = tiny_link(stop_after_rounds=1)
    blobs = [link.receive_network(nid) for nid in (0, 1, 2)]
    link.send_network(0, blobs[0], 1)
    link.send_network(1, blobs[1], 1)
    link.send_network(1, blobs[1], 1)  # again: still not a complete round
    assert not link.stop_requested() and link.complete_rounds == 0
    link.send_network(2, blobs[2], 1)
    assert link.complete_rounds == 1
    assert link.stop_requested() and link.stop_requested()  # and it stays


def test_stop_when_sees_the_number_of_earlier_polls() -> None:
    seen: list[int] = []

    def stop_when(polls: int) -> bool:
        seen.append(polls)
        return polls == 2

    link = tiny_link(stop_when=stop_when)
    assert [link.stop_requested() for _ in range(4)] == [False, False, True, True]
    assert seen == [0, 1, 2] and link.stop_polls == 4


def test_request_stop_from_another_thread_and_pings_from_a_keepalive() -> None:
    link = tiny_link()
    with KeepAlive(link, 0.001):
        thread = threading.Thread(target=link.request_stop)
        thread.start()
        thread.join()
    assert link.stop_requested() and link.pings >= 1


# --- a whole story over it --------------------------------------------------------------------------------


def test_a_whole_run_syncs_on_cadence_then_sends_the_final_round_and_complete() -> None:
    link = tiny_link()
    assert run(link, timeouts=Timeouts(wait=4.5)) == ExitCode.OK
    # Rounds at iterations 5, 10, 15 (none at 20: the final round replaces it), then the final round.
    assert [sorted(r) for r in link.rounds] == [[0, 1, 2]] * 4
    assert [item.version for item in link.sent] == [1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4]
    assert link.completed and link.finish_timeout == 4.5 and link.stop_polls == 20
    received = {nid: read_snapshot(link.networks[nid]) for nid in (0, 1, 2)}
    for round_ in link.rounds:
        for nid, blob in round_.items():
            assert len(blob) == len(link.networks[nid])
            assert read_snapshot(blob).header == received[nid].header
    assert link.rounds[-1][0] != link.networks[0]  # the denoiser trained


def test_the_same_seed_sends_bitwise_the_same_networks() -> None:
    first, second = tiny_link(), tiny_link()
    assert run(first) == run(second) == ExitCode.OK
    assert first.sent == second.sent


def test_stop_after_rounds_ends_the_run_without_complete() -> None:
    link = tiny_link(stop_after_rounds=2)
    assert run(link) == ExitCode.OK
    assert not link.completed and link.finish_timeout is None
    # Rounds go out from the sender's thread while training goes on (trainer.session.sender): the Stop
    # the second round triggers is seen by the loop a poll or a few later, and the round offered at
    # iteration 15 before the Stop came may have gone out too; every round is whole.
    assert len(link.rounds) == link.complete_rounds in (2, 3)
    assert 11 <= link.stop_polls < 20


def test_stop_before_the_first_sync_sends_nothing() -> None:
    link = tiny_link(stop_when=lambda polls: polls == 3)
    assert run(link) == ExitCode.OK
    assert link.sent == [] and not link.completed


def test_an_iteration_override_shortens_the_run() -> None:
    link = tiny_link()
    assert run(link, replace(OPTIONS, iteration_num=6)) == ExitCode.OK
    assert len(link.rounds) == 2 and link.stop_polls == 6 and link.completed
