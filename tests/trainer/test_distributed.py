"""Scale-out with torchrun (the trainer/distributed/ package).

Facts: torchrun's environment is read or refused with the variable named; the global batch divides
evenly or the error says how to fix it; rank r's rows are exactly the r-th slice of one global draw; every
rank frame (options, config, snapshots, replay buffer, start state) round-trips bit for bit at every chunk
size and a bad frame is refused before anything is allocated; the watchdog ends a stuck rank and only a
stuck one. With two real gloo processes under torchrun: one DDP update on two half batches equals the
1-process update on the whole batch (max |Δparameter| ≤ 1e-6); a 2-process run ends where a 1-process run
with the same seed and global batch ends (final loss within 10 %); a game Stop ends every rank at the same
iteration; a rank killed with SIGKILL or frozen with SIGSTOP ends the job with a message naming it, and the
game still receives networks and Complete.

The multi-process tests run this module under torchrun (``python -m torch.distributed.run ... -m
tests.trainer.test_distributed SCENARIO OUT``); see :func:`_harness`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from emulator.session import (
    EngineTask,
    Mode,
    SessionSettings,
    build_session_config,
    free_tcp_port,
    run_engine_session,
)
from protocol.errors import ReplayError
from protocol.replay import ReplayBuffer
from protocol.snapshot import read_snapshot
from trainer import distributed as td
from trainer.distributed import (
    FRAME_MAGIC,
    DistEnv,
    FrameKind,
    RankChannel,
    RankContext,
    ScaleOutError,
    ShardSampler,
    Watchdog,
    decode_config,
    decode_options,
    derive_seed,
    encode_config,
    encode_options,
    is_collective_failure,
    local_batch_size,
    sync_start_state,
)
from trainer.distributed.job import weights_checksum
from trainer.dropin import scale_out as launch
from trainer.dropin.scale_out import main as scale_out_main
from trainer.dropin.torchrun import torchrun_command
from trainer.errors import LaunchError, PeerGone
from trainer.exitcodes import ExitCode
from trainer.session.app import run_with_link
from trainer.session.links import MemoryLink
from trainer.settings import environment as env_names
from trainer.settings.options import TrainerOptions
from trainer.training.data import TensorData
from trainer.training.job import TrainingJob

REPO_ROOT = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")
TINY = SessionSettings(iteration_num=200, batch_size=32, hidden_layer_size=16, learning_rate=1e-3, seed=7)
OPTIONS = TrainerOptions(
    status_file=False,
    threads=1,
    sync_every_iterations=50,
    sync_every_seconds=0.0,
    progress_every_seconds=1000.0,
    ema_decay=0.9,
    checkpoint_every_seconds=0.0,
)
COMPARED_ITERATION = 199
"""The smoothed loss compared is the one after the last step (an agreement step: the 2-process value is
the ranks' average there)."""
LOSS_TOLERANCE = 0.10
"""Relative difference allowed between that loss in a 2-process and in a 1-process run (same seed and
global batch). Measured in docs/scale-out.md: seed-to-seed spread of either about ±2 %."""
KILL_SETTINGS = replace(TINY, iteration_num=100_000, activation="GELU")
"""The killed run: GELU keeps it off the fused step (trainer/training/steps/fused.py runs ELU, ReLU, TanH), so the
loop's steps go through autograd and DDP, and the failure surfaces inside DDP's backward. The stalled and
the compared runs use ELU (the fused step, where TrainingJob runs it)."""
EXACT_TOLERANCE = 1e-6
"""Max |Δparameter| after three DDP updates on half batches versus three updates on the whole batch."""


def make_task() -> EngineTask:
    return EngineTask.benchmark("bimodal", size=96, seed=0)


def make_job(settings: SessionSettings = TINY, options: TrainerOptions = OPTIONS) -> TrainingJob:
    config, blobs = build_session_config(make_task(), settings, None)
    received = {nid: read_snapshot(blob) for nid, blob in enumerate(blobs)}
    return TrainingJob.create(config, received, make_task().replay_buffer, options=options, device=CPU)


# ---------------------------------------------------------------------------------------------------------
# torchrun's environment


def test_outside_torchrun_there_is_no_rank() -> None:
    assert DistEnv.from_environ({}) is None
    assert DistEnv.from_environ({"LOCAL_RANK": "0"}) is None


def test_torchrun_variables_are_read() -> None:
    env = DistEnv.from_environ(
        {
            "RANK": "3",
            "WORLD_SIZE": "4",
            "LOCAL_RANK": "1",
            "LOCAL_WORLD_SIZE": "2",
            "TORCHELASTIC_RESTART_COUNT": "2",
            "TORCHELASTIC_USE_AGENT_STORE": "True",
        }
    )
    assert env == DistEnv(rank=3, world_size=4, local_rank=1, local_world_size=2, restart=2, agent_store=True)
    assert not env.leader and env.key("outcome") == "la-trainer/2/outcome"


def test_a_hand_launch_without_local_variables_is_one_node() -> None:
    env = DistEnv.from_environ({"RANK": "0", "WORLD_SIZE": "2"})
    assert env == DistEnv(rank=0, world_size=2, local_rank=0, local_world_size=2)
    assert env.leader


@pytest.mark.parametrize(
    ("environ", "names"),
    [
        ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK"),
        ({"RANK": "-1", "WORLD_SIZE": "2"}, "RANK"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK is 2 but WORLD_SIZE is 2"),
        ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE"),
        ({"RANK": "0"}, "WORLD_SIZE is not set"),
        ({"WORLD_SIZE": "2"}, "RANK is not set"),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "1.5"}, "LOCAL_RANK"),
    ],
)
def test_bad_torchrun_variables_are_refused_by_name(environ: dict[str, str], names: str) -> None:
    with pytest.raises(LaunchError, match=re.escape(names)):
        DistEnv.from_environ(environ)


def test_backend_is_gloo_without_cuda_and_can_be_overridden() -> None:
    assert td.select_backend(False) == "gloo"
    assert td.select_backend(True, " nccl ") == "nccl"


# ---------------------------------------------------------------------------------------------------------
# Batch and seeds


def test_global_batch_divides_among_ranks() -> None:
    assert local_batch_size(256, 1) == 256
    assert local_batch_size(256, 2) == 128
    assert local_batch_size(256, 256) == 1
    with pytest.raises(LaunchError, match=r"BatchSize 256 does not divide among 3 .* 255 or 258"):
        local_batch_size(256, 3)
    with pytest.raises(LaunchError, match=r"e\.g\. 4 or 4"):
        local_batch_size(2, 4)


@pytest.mark.parametrize(
    ("keys", "golden"),
    [
        ((1234, 0, 0), 3390605987580608350),
        ((1234, 5, 1), 6845520347622188963),
        ((0, 0, 8), 407552363458432063),
        ((2**64 - 1, 0, 1), 8908646417573421857),
    ],
)
def test_seed_streams_are_golden_values(keys: tuple[int, ...], golden: int) -> None:
    """numpy's SeedSequence is a fixed algorithm, so a scale-out run draws the same batches on every
    machine and version: these values were computed once (numpy 2.4.6; numpy 1.26.4, the engine's, gives
    the same) and must never change."""
    assert derive_seed(*keys) == golden


def test_seed_streams_are_distinct() -> None:
    seeds = {
        derive_seed(seed, start, stream) for seed in (0, 1, 1234) for start in (0, 5) for stream in range(9)
    }
    assert len(seeds) == 3 * 2 * 9
    assert all(0 <= s < 2**64 for s in seeds)
    assert derive_seed(-1, 0, 1) == derive_seed(2**64 - 1, 0, 1)  # negative seeds wrap, never raise


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_rank_batches_are_the_slices_of_one_global_draw(world: int) -> None:
    rows, batch = 50, 12
    data = TensorData(
        obs=torch.arange(rows * 2.0).reshape(rows, 2), x1=torch.arange(rows * 1.0).reshape(rows, 1)
    )
    samplers = [ShardSampler(data, batch, r, world, torch.Generator().manual_seed(9)) for r in range(world)]
    reference = torch.Generator().manual_seed(9)
    for _ in range(3):
        expected = torch.randint(rows, (batch,), generator=reference)
        got = torch.cat([s.next().x1[:, 0] for s in samplers]).long()
        assert torch.equal(got, expected)
        assert all(s.batch_size == batch // world for s in samplers)


def test_an_uneven_shard_is_refused() -> None:
    data = TensorData(obs=torch.zeros(4, 1), x1=torch.zeros(4, 1))
    with pytest.raises(LaunchError, match="does not divide"):
        ShardSampler(data, 10, 0, 3, torch.Generator())


# ---------------------------------------------------------------------------------------------------------
# Payloads and frames


def test_options_round_trip_and_bad_options_are_refused() -> None:
    options = replace(OPTIONS, time_distribution="beta:2,1.5", ode_steps=4, device="cpu", resume=True)
    assert decode_options(encode_options(options)) == options
    with pytest.raises(LaunchError, match="unknown option 'nope'"):
        decode_options(json.dumps({"nope": 1}).encode())
    with pytest.raises(LaunchError, match="threads"):
        decode_options(json.dumps({"threads": "many"}).encode())
    with pytest.raises(ScaleOutError, match="not a JSON object"):
        decode_options(b"[1]")


@pytest.mark.parametrize("temp_directory", [None, "/tmp/LearningCore"])
def test_config_round_trips_with_its_warnings(temp_directory: str | None) -> None:
    config, _ = build_session_config(make_task(), TINY, temp_directory)
    config = replace(config, warnings=("first", "second é"))
    assert decode_config(encode_config(config)) == config
    with pytest.raises(ScaleOutError, match="expected object"):
        decode_config(b'{"Trainer": {}}')


class FakeBroadcast:
    """Both ends of a broadcast in one process: the leader's calls queue copies, the follower's calls
    take them in order, checking shape and dtype as a real broadcast requires."""

    def __init__(self) -> None:
        self.queue: deque[torch.Tensor] = deque()
        self.sizes: list[int] = []

    def leader(self, tensor: torch.Tensor) -> None:
        self.queue.append(tensor.detach().clone())
        self.sizes.append(tensor.numel())

    def follower(self, tensor: torch.Tensor) -> None:
        source = self.queue.popleft()
        assert (source.shape, source.dtype) == (tensor.shape, tensor.dtype)
        tensor.copy_(source)


def channels(chunk: int = td.CHUNK_BYTES) -> tuple[RankChannel, RankChannel, FakeBroadcast]:
    wire = FakeBroadcast()
    return (
        RankChannel(wire.leader, leader=True, chunk_bytes=chunk),
        RankChannel(wire.follower, leader=False, chunk_bytes=chunk),
        wire,
    )


def assert_same_replay(a: ReplayBuffer, b: ReplayBuffer) -> None:
    assert a.replay_buffer_id == b.replay_buffer_id
    assert np.array_equal(a.episode_starts, b.episode_starts)
    assert np.array_equal(a.episode_lengths, b.episode_lengths)
    for x, y in zip(a.observations + a.actions, b.observations + b.actions, strict=True):
        assert x.dtype == y.dtype and np.array_equal(x, y)


@pytest.mark.parametrize("chunk", [1, 7, 4096, td.CHUNK_BYTES])
def test_every_frame_round_trips_at_every_chunk_size(chunk: int) -> None:
    config, blobs = build_session_config(make_task(), TINY, None)
    replay = make_task().replay_buffer
    leader, follower, wire = channels(chunk)
    leader.options(OPTIONS)
    leader.config(config)
    for nid, blob in enumerate(blobs):
        leader.network(config, nid, blob)
    leader.experience(config, replay)
    assert follower.options() == OPTIONS
    received = follower.config()
    assert received == config
    assert [follower.network(received, nid) for nid in range(3)] == list(blobs)
    assert_same_replay(follower.experience(received), replay)
    assert not wire.queue
    # One header per frame, then the payload in pieces of at most `chunk` bytes.
    assert all(size <= max(chunk, td.FRAME_HEADER_WORDS) for size in wire.sizes)


def test_an_empty_payload_is_only_a_header() -> None:
    leader, follower, wire = channels()
    leader.send(FrameKind.STATE, (1, 2, 3), [])
    assert wire.sizes == [td.FRAME_HEADER_WORDS]
    ints, payload = follower.receive(FrameKind.STATE, 0)
    assert ints == (1, 2, 3) and payload.numel() == 0


def header_frame(words: list[int]) -> RankChannel:
    wire = FakeBroadcast()
    wire.leader(torch.tensor(words, dtype=torch.int64))
    return RankChannel(wire.follower, leader=False)


@pytest.mark.parametrize(
    ("words", "match"),
    [
        ([FRAME_MAGIC + 1, FrameKind.OPTIONS, 0, 0, 0, 2], "magic"),
        ([FRAME_MAGIC, FrameKind.CONFIG, 0, 0, 0, 2], "CONFIG frame where OPTIONS"),
        ([FRAME_MAGIC, 99, 0, 0, 0, 2], "a 99 frame where OPTIONS"),
        ([FRAME_MAGIC, FrameKind.OPTIONS, 0, 0, 0, td.MAX_OPTIONS_BYTES + 1], "bound is"),
        ([FRAME_MAGIC, FrameKind.OPTIONS, 0, 0, 0, -1], "announces -1 bytes"),
        ([FRAME_MAGIC, FrameKind.OPTIONS, 0, 0, 0, 2**62], "bound is"),
    ],
)
def test_a_bad_header_is_refused_before_allocating(words: list[int], match: str) -> None:
    with pytest.raises(ScaleOutError, match=match):
        header_frame(words).options()


def test_a_network_frame_is_bounded_by_max_byte_num_and_checked_by_id() -> None:
    config, blobs = build_session_config(make_task(), TINY, None)
    limit = config.network(1).max_byte_num
    with pytest.raises(ScaleOutError, match=f"bound is {limit}"):
        header_frame([FRAME_MAGIC, FrameKind.NETWORK, 1, 0, 0, limit + 1]).network(config, 1)
    leader, follower, _ = channels()
    leader.network(config, 2, blobs[2])
    with pytest.raises(ScaleOutError, match="network 2 where network 1"):
        follower.network(config, 1)


def test_an_experience_frame_must_match_its_counts_and_the_config() -> None:
    config, _ = build_session_config(make_task(), TINY, None)
    replay = make_task().replay_buffer
    e, s = replay.episode_num, replay.step_num
    with pytest.raises(ScaleOutError, match=f"{e} episodes and {s} steps need"):
        header_frame([FRAME_MAGIC, FrameKind.EXPERIENCE, 0, e, s, 5]).experience(config)
    with pytest.raises(ReplayError):  # above MaxEpisodeNum: refused by the layout before any allocation
        header_frame([FRAME_MAGIC, FrameKind.EXPERIENCE, 0, e + 1, s, 5]).experience(config)
    with pytest.raises(ScaleOutError, match="OPTIONS"):
        header_frame([FRAME_MAGIC, FrameKind.OPTIONS, 0, 0, 0, 0]).experience(config)


def test_the_start_state_of_rank_0_reaches_every_rank() -> None:
    """A resumed rank 0 (trained steps, AdamW moments, iteration, loss) and a fresh rank 1 end equal."""
    leader_job, follower_job = make_job(), make_job()
    for iteration in range(3):
        leader_job.step(iteration)
    leader_job.start_iteration = 3
    leader, follower, _ = channels(chunk=1000)
    env0, env1 = DistEnv(0, 2, 0, 2), DistEnv(1, 2, 1, 2)
    sync_start_state(leader_job, RankContext(env0, leader))
    sync_start_state(follower_job, RankContext(env1, follower))
    mine, theirs = leader_job.model.state_dict(), follower_job.model.state_dict()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)
    a, b = leader_job.optimizer.state_dict()["state"], follower_job.optimizer.state_dict()["state"]
    assert a.keys() == b.keys() and all(torch.equal(a[i][k], b[i][k]) for i in a for k in a[i])
    assert follower_job.start_iteration == 3 and follower_job.smoothed_loss == leader_job.smoothed_loss
    # Both continue identically from there (same batch and generator state on both).
    follower_job.generator.set_state(leader_job.generator.get_state())
    follower_job.sampler.generator.set_state(leader_job.sampler.generator.get_state())
    assert leader_job.step(3) == follower_job.step(3)


def test_a_rank_that_built_another_job_is_refused() -> None:
    leader, follower, _ = channels()
    sync_start_state(make_job(), RankContext(DistEnv(0, 2, 0, 2), leader))
    other = make_job(options=replace(OPTIONS, iteration_num=7))
    with pytest.raises(ScaleOutError, match="total_iterations: 7 vs 200"):
        sync_start_state(other, RankContext(DistEnv(1, 2, 1, 2), follower))


def test_the_weights_checksum_sees_one_flipped_bit() -> None:
    job = make_job()
    params = list(job.model.trainable_parameters())
    before = weights_checksum(iter(params))
    assert before.shape == (1,) and 0 <= int(before) < td.CHECKSUM_MODULUS
    assert torch.equal(weights_checksum(iter(params)), before)  # no state, same answer
    with torch.no_grad():
        flat = params[0].view(-1)
        flat[0] = torch.tensor(flat[0].item()).view(torch.int32).add(1).view(torch.float32)
    assert not torch.equal(weights_checksum(iter(params)), before)


def test_collective_failures_are_told_from_bugs() -> None:
    gloo = "[../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:20901."
    assert is_collective_failure(RuntimeError(gloo))
    assert is_collective_failure(RuntimeError("Timed out waiting 30000ms for recv operation to complete"))
    assert not is_collective_failure(RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x3 and 2x2)"))
    assert not is_collective_failure(ValueError("gloo"))


GLOO_RESET = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:750: "
    "Connection reset by peer. This is typically caused by a remote worker hanging. GLHF!"
)


def test_a_lost_rank_is_named_when_it_said_why() -> None:
    ctx = RankContext(DistEnv(0, 3, 0, 3), RankChannel(lambda t: None, leader=True), store=FakeStore())
    ctx.publish("failed/2", 9, "the loss became non-finite")
    lost = ctx.lost(RuntimeError(GLOO_RESET), 41)
    assert str(lost) == (
        "scale-out: rank 2 of 3 failed (exit code 9): the loss became non-finite; training stopped at iteration 41"
    )
    assert lost.exit_code == ExitCode.PEER_GONE and ctx.state.lost == str(lost)


def test_a_vanished_rank_is_reported_with_the_gist_of_the_error() -> None:
    ctx = RankContext(DistEnv(0, 2, 0, 2), RankChannel(lambda t: None, leader=True), store=FakeStore())
    lost = ctx.lost(RuntimeError(GLOO_RESET), 25)
    assert str(lost) == (
        "scale-out: another training process stopped answering (Read error [127.0.0.1]:750: Connection reset "
        "by peer); training stopped at iteration 25"
    )


def test_a_follower_that_lost_rank_0_takes_its_exit_code() -> None:
    ctx = RankContext(DistEnv(1, 2, 1, 2), RankChannel(lambda t: None, leader=False), store=FakeStore())
    ctx.store.set(ctx.env.key("outcome"), b"0\nfinished")
    assert "rank 0 ended (exit code 0): finished" in str(ctx.lost(RuntimeError(GLOO_RESET), 3))
    assert ctx.state.lost_code == 0


# ---------------------------------------------------------------------------------------------------------
# Entry point


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        env_names.ENV_NPROC,
        env_names.ENV_TORCHRUN_ARGS,
    ):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_outside_torchrun_main_is_the_ordinary_trainer(clean_env: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []

    def fake_engine_main(argv: list[str], **kwargs: Any) -> int:
        calls.append(list(argv))
        return 3

    clean_env.setattr(launch, "engine_main", fake_engine_main)
    assert scale_out_main(["Training", "Socket", "127.0.0.1:1", "/tmp"]) == 3
    clean_env.setenv("RANK", "0")
    clean_env.setenv("WORLD_SIZE", "1")
    assert scale_out_main(["x"]) == 3
    assert calls == [["Training", "Socket", "127.0.0.1:1", "/tmp"], ["x"]]


class Exec(Exception):
    pass


def test_nproc_reexecutes_under_torchrun(clean_env: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def fake_execve(path: str, argv: list[str], env: dict[str, str]) -> None:
        seen.update(path=path, argv=argv, env=env)
        raise Exec

    clean_env.setattr(os, "execve", fake_execve)
    clean_env.setenv(env_names.ENV_NPROC, "2")
    with pytest.raises(Exec):
        scale_out_main(["Training", "-l", "SharedMemory", "/task", "-g", "{G}"])
    assert seen["argv"] == [
        sys.executable,
        "-m",
        "trainer.dropin.torchrun",  # torchrun, ending with the ranks' documented exit code
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "trainer.distributed",
        "Training",
        "-l",
        "SharedMemory",
        "/task",
        "-g",
        "{G}",
    ]
    assert seen["env"]["PYTHONPATH"].split(os.pathsep)[0] == str(REPO_ROOT)
    assert seen["env"][env_names.ENV_ENGINE_PID] == str(os.getppid())  # the engine that spawned the wrapper
    clean_env.setenv(env_names.ENV_TORCHRUN_ARGS, "--nnodes 2 --node-rank 0 --master-addr 10.0.0.1")
    with pytest.raises(Exec):
        scale_out_main(["Training"])
    assert seen["argv"][3:9] == ["--nnodes", "2", "--node-rank", "0", "--master-addr", "10.0.0.1"]
    assert torchrun_command(["a"], 4)[3:6] == ["--standalone", "--nproc-per-node", "4"]


@pytest.mark.parametrize(
    ("name", "value"), [("RANK", "x"), (env_names.ENV_NPROC, "two"), (env_names.ENV_STALL, "-1")]
)
def test_bad_launch_environment_is_a_usage_error(
    clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], name: str, value: str
) -> None:
    clean_env.setenv("RANK", "0")
    clean_env.setenv("WORLD_SIZE", "2")
    clean_env.setenv(name, value)
    assert scale_out_main(["Training"]) == ExitCode.USAGE
    assert name in capsys.readouterr().err


class StopAfter:
    """A real link's stop flag: False, then True."""

    def __init__(self, polls: int) -> None:
        self.polls = polls

    def stop_requested(self) -> bool:
        self.polls -= 1
        return self.polls < 0


@pytest.mark.skipif(os.name != "posix", reason="the engine pid is watched on POSIX only")
def test_rank_0_watches_the_engine_that_started_torchrun(clean_env: pytest.MonkeyPatch) -> None:
    ctx = RankContext(DistEnv(0, 2, 0, 2), RankChannel(lambda t: None, leader=True))
    clean_env.setenv(env_names.ENV_ENGINE_PID, str(os.getpid()))
    td.Rank0Link(StopAfter(1), ctx)
    assert ctx.poll_game is not None
    assert ctx.poll_game() is False and ctx.poll_game() is True
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    clean_env.setenv(env_names.ENV_ENGINE_PID, str(dead.pid))
    td.Rank0Link(StopAfter(5), ctx)
    with pytest.raises(
        PeerGone, match=f"the engine \\(process {dead.pid}\\) that started this training exited"
    ):
        ctx.poll_game()


# ---------------------------------------------------------------------------------------------------------
# Watchdog (in-process: a fake store, a recorded exit)


class FakeStore:
    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}

    def set(self, key: str, value: bytes) -> None:
        self.values[key] = value

    def check(self, keys: list[str]) -> bool:
        return all(k in self.values for k in keys)

    def get(self, key: str) -> bytes:
        return self.values[key]


class FakeLeaderLink:
    def __init__(self) -> None:
        self.completed = threading.Event()

    def emergency_complete(self, job: object) -> None:
        self.completed.set()


@pytest.fixture
def watch() -> Iterator[Any]:
    started: list[Watchdog] = []

    def make(rank: int, stall: float) -> tuple[Watchdog, RankContext, list[int], threading.Event]:
        ctx = RankContext(
            DistEnv(rank, 2, rank, 2), RankChannel(lambda t: None, leader=rank == 0), store=FakeStore()
        )
        codes: list[int] = []
        exited = threading.Event()

        def exit_process(code: int) -> None:
            codes.append(code)
            exited.set()

        dog = Watchdog(ctx, stall, exit_process=exit_process)
        dog._thread.start()  # without start(): no wakeup fd in a pytest worker thread
        started.append(dog)
        return dog, ctx, codes, exited

    yield make
    for dog in started:
        dog._stop.set()
        dog._thread.join(2.0)


def stuck_leader(ctx: RankContext) -> FakeLeaderLink:
    link = FakeLeaderLink()
    ctx.state.link = link  # type: ignore[assignment]
    ctx.state.job = object()  # type: ignore[assignment]
    ctx.state.in_step, ctx.state.step_started = True, time.monotonic()
    return link


def test_a_stalled_step_makes_rank_0_complete_and_exit(watch: Any) -> None:
    _, ctx, codes, exited = watch(0, 0.4)
    link = stuck_leader(ctx)
    assert exited.wait(5.0) and link.completed.is_set()
    assert codes == [ExitCode.PEER_GONE] and ctx.state.finishing
    assert ctx.read("outcome") == (
        ExitCode.PEER_GONE,
        "scale-out: no answer from the other training processes for 0 s; training stopped at iteration 0",
    )


def test_a_published_failure_ends_a_stuck_rank_0_after_a_grace(watch: Any) -> None:
    _, ctx, codes, exited = watch(0, 60.0)
    link = stuck_leader(ctx)
    ctx.store.set(ctx.env.key("failed/1"), b"9\nCUDA out of memory")
    assert exited.wait(5.0) and link.completed.is_set() and codes == [ExitCode.PEER_GONE]
    _, message = ctx.read("outcome") or (0, "")
    assert "rank 1 of 2 failed (exit code 9): CUDA out of memory" in message


def test_rank_0_between_steps_is_left_alone(watch: Any) -> None:
    _, ctx, codes, exited = watch(0, 0.2)
    link = stuck_leader(ctx)
    ctx.state.in_step = False  # e.g. sending a sync round or writing a checkpoint
    assert not exited.wait(1.0) and not link.completed.is_set() and codes == []


def test_a_follower_follows_rank_0s_outcome(watch: Any) -> None:
    _, ctx, codes, exited = watch(1, 60.0)
    ctx.store.set(ctx.env.key("outcome"), b"4\nwaiting for the config timed out")
    assert exited.wait(5.0) and codes == [4]
    assert ctx.read("done/1") == (4, "")


def test_a_follower_whose_store_is_gone_exits(watch: Any) -> None:
    _, ctx, codes, exited = watch(1, 60.0)

    def gone(keys: list[str]) -> bool:
        raise RuntimeError("Connection reset by peer")

    ctx.store.check = gone
    assert exited.wait(5.0) and codes[0] == ExitCode.PEER_GONE


# ---------------------------------------------------------------------------------------------------------
# Two real processes under torchrun


def harness_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1", **(extra or {})}


class Ranks:
    """Two ranks of the harness launched by hand (no torchrun agent: one process fewer to start, and the
    hand-launch path of docs/scale-out.md): RANK, WORLD_SIZE, MASTER_ADDR/PORT as a launcher sets them."""

    def __init__(self, scenario: str, out: Path, extra: dict[str, str] | None = None) -> None:
        port = free_tcp_port()
        self.procs = [
            subprocess.Popen(
                [sys.executable, "-m", "tests.trainer.test_distributed", scenario, str(out)],
                cwd=REPO_ROOT,
                env=harness_env(
                    {
                        "RANK": str(rank),
                        "WORLD_SIZE": "2",
                        "LOCAL_RANK": str(rank),
                        "LOCAL_WORLD_SIZE": "2",
                        "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": str(port),
                        **(extra or {}),
                    }
                ),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for rank in range(2)
        ]

    def wait(self, timeout: float = 150.0) -> tuple[list[int], str, str]:
        """Exit codes, rank 0's stdout, both stderrs; kills whatever is left after ``timeout``."""
        deadline = time.monotonic() + timeout
        outputs = []
        for proc in self.procs:
            try:
                outputs.append(proc.communicate(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                proc.kill()
                outputs.append(proc.communicate())
        codes = [proc.returncode for proc in self.procs]
        return codes, outputs[0][0], outputs[0][1] + outputs[1][1]

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()


def events(out: Path) -> list[dict[str, Any]]:
    path = out / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow
def test_two_processes_match_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    codes, out, err = Ranks("train", tmp_path).wait()
    assert codes == [0, 0], out[-3000:] + err[-3000:]
    exact = json.loads((tmp_path / "exact.json").read_text())
    assert exact["max_abs_diff"] <= EXACT_TOLERANCE, exact
    assert exact["changed"] > 1e-4  # the updates did move the weights
    got = events(tmp_path)
    assert [e["event"] for e in got][-4:] == ["network", "network", "network", "complete"]
    assert len([e for e in got if e["event"] == "network"]) == 3 * (TINY.iteration_num // 50)
    assert out.count("la-trainer: done after") == 1  # rank 1 prints nothing
    # The 1-process run with the same seed and global batch, in this process.
    game = RecordingLink(TINY, tmp_path / "single")
    (tmp_path / "single").mkdir()
    with record_loss(TrainingJob, tmp_path / "single"):
        assert run_with_link(lambda flag: game, options=OPTIONS, task_dir=None) == 0
    single = float((tmp_path / "single" / "loss.txt").read_text())
    double = float((tmp_path / "loss.txt").read_text())
    assert abs(double - single) <= LOSS_TOLERANCE * single, (single, double)


@pytest.mark.slow
def test_a_killed_rank_ends_the_job_and_the_game_gets_complete(tmp_path: Path) -> None:
    codes, _, err = Ranks("kill", tmp_path).wait()
    assert codes == [ExitCode.PEER_GONE, -signal.SIGKILL], err[-3000:]
    got = [e["event"] for e in events(tmp_path)]
    assert got[-4:] == ["network", "network", "network", "complete"], got
    assert re.search(
        r"la-trainer: scale-out: another training process stopped answering \(.*(reset|closed).*\); "
        r"training stopped at iteration 25; the game got the last good networks and Complete\.",
        err,
    ), err[-3000:]


@pytest.mark.slow
def test_a_frozen_rank_is_caught_by_the_watchdog(tmp_path: Path) -> None:
    ranks = Ranks("stall", tmp_path, {env_names.ENV_STALL: "3"})
    try:
        deadline = time.monotonic() + 120.0
        while ranks.procs[0].poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        ranks.kill()  # rank 1 is stopped (SIGSTOP) and would never exit by itself
    codes, _, err = ranks.wait(30.0)
    assert codes[0] == ExitCode.PEER_GONE, err[-3000:]
    got = [e["event"] for e in events(tmp_path)]
    assert got[-4:] == ["network", "network", "network", "complete"], got
    assert (
        "la-trainer: scale-out: no answer from the other training processes for 3 s; training stopped at "
        "iteration 25. Sending the networks of iteration 25 and Complete." in err
    ), err[-3000:]


WRAPPER = """import sys
sys.path.insert(0, {root!r})
from trainer.dropin.scale_out import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
@pytest.mark.integration
def test_the_engine_spawns_two_processes_through_the_launcher_and_stops_them(tmp_path: Path) -> None:
    """Spawned socket mode: the engine runs a train.py that calls trainer.dropin.scale_out.main (``python -m trainer.distributed``) with
    LA_TRAINER_NPROC_PER_NODE=2; the game's Stop after two rounds ends both ranks at once, exit code 0."""
    wrapper = tmp_path / "train.py"
    wrapper.write_text(WRAPPER.format(root=str(REPO_ROOT)))
    settings = replace(
        TINY,
        iteration_num=1_000_000,
        stop_after_rounds=2,
        sync_every_iterations=20,
        engine_timeout_s=90.0,
        session_timeout_s=120.0,
        exit_timeout_s=60.0,
        hard_timeout_s=170.0,
        timeout_scale=1.0,
        script=wrapper,
        env={env_names.ENV_NPROC: "2", "OMP_NUM_THREADS": "1"},
    )
    record = run_engine_session(Mode.SOCKET, make_task(), tmp_path / "engine", settings)
    record.check()
    assert record.exit_code == 0, record.describe()
    assert record.stop_sent and len(record.rounds) == 2
    assert any("scale-out: 2 processes, global batch 32 = 2 x 16" in line for line in record.log)
    assert sum("la-trainer: waiting for the game's config" in line for line in record.log) == 1


# ---------------------------------------------------------------------------------------------------------
# Harness: runs under torchrun (python -m tests.trainer.test_distributed SCENARIO OUT)


class RecordingLink(MemoryLink):
    """The game, in memory (:class:`trainer.session.links.MemoryLink` for the task), that also appends every
    network and Complete it receives to ``events.jsonl`` as they arrive: a rank that exits abruptly
    leaves them for the test to read."""

    def __init__(self, settings: SessionSettings, out: Path | None) -> None:
        task = make_task()
        config, blobs = build_session_config(task, settings, None)
        super().__init__(config, blobs, task.replay_buffer)
        self.out = out

    def _record(self, **event: Any) -> None:
        if self.out is not None:
            with (self.out / "events.jsonl").open("a") as handle:
                handle.write(json.dumps(event) + "\n")

    def send_network(self, network_id: int, data: bytes, version: int) -> None:
        super().send_network(network_id, data, version)
        self._record(event="network", id=network_id, version=version)

    def send_complete(self) -> None:
        super().send_complete()
        self._record(event="complete")


@contextlib.contextmanager
def record_loss(cls: type[TrainingJob], out: Path) -> Iterator[None]:
    """Write the smoothed loss after ``cls.advance`` (the story's step) at :data:`COMPARED_ITERATION` to
    out/loss.txt (read back from the device there: ``settle``)."""
    original = cls.advance

    def advance(self: TrainingJob, iteration: int) -> None:
        original(self, iteration)
        if iteration == COMPARED_ITERATION:
            (out / "loss.txt").write_text(repr(self.settle()))

    cls.advance = advance  # type: ignore[method-assign]
    try:
        yield
    finally:
        cls.advance = original  # type: ignore[method-assign]


def _exact_check(env: DistEnv, out: Path) -> None:
    """Three DDP updates on two half batches versus three 1-process updates on the whole batches."""
    import torch.distributed as dist
    from torch.distributed import PrefixStore  # type: ignore[attr-defined]
    from torch.distributed.rendezvous import rendezvous

    from trainer.training.flow import flow_matching_loss, interpolate

    store, _, _ = next(iter(rendezvous("env://", rank=env.rank, world_size=env.world_size)))
    dist.init_process_group(
        "gloo", store=PrefixStore("exact", store), rank=env.rank, world_size=env.world_size
    )
    ctx = RankContext(env, RankChannel(lambda t: dist.broadcast(t, src=0), leader=env.leader))
    job = td.scale_out_job(make_job(), ctx)
    reference = make_job()
    before = torch.cat([p.detach().flatten().clone() for p in reference.model.trainable_parameters()])
    draws = torch.Generator().manual_seed(3)
    batch, half = 32, 16
    rows = slice(env.rank * half, (env.rank + 1) * half)
    for _ in range(3):
        index = torch.randint(job.tensors.row_num, (batch,), generator=draws)
        x0 = torch.randn((batch, job.tensors.x1.shape[1]), generator=draws)
        t = torch.rand((batch, 1), generator=draws)
        for model_job, part in ((job, rows), (reference, slice(0, batch))):
            if model_job is job:
                assert job.gradient_averaging is not None
                job.gradient_averaging.arm_autograd()
            obs, x1 = model_job.tensors.obs[index[part]], model_job.tensors.x1[index[part]]
            path = interpolate(x0[part], x1, t[part])
            model = model_job.model
            pred = model.velocity_standardized(model.encode(obs), path.x_t, t[part])
            loss = flow_matching_loss(pred, model.standardize_velocity(path.target))
            model_job.optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            model_job.optimizer.step()
    mine = torch.cat([p.detach().flatten() for p in job.model.trainable_parameters()])
    theirs = torch.cat([p.detach().flatten() for p in reference.model.trainable_parameters()])
    if env.leader:
        result = {
            "max_abs_diff": float((mine - theirs).abs().max()),
            "changed": float((theirs - before).abs().max()),
        }
        (out / "exact.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def _harness(scenario: str, out: Path) -> int:
    env = DistEnv.from_environ(os.environ)
    assert env is not None
    (out / f"pid{env.rank}").write_text(str(os.getpid()))
    if scenario == "train":
        _exact_check(env, out)
    if scenario in ("kill", "stall") and env.rank == 1:
        original = td.DistributedTrainingJob.step
        sig = signal.SIGKILL if scenario == "kill" else signal.SIGSTOP

        def faulty(self: td.DistributedTrainingJob, iteration: int) -> float:
            if iteration == 25:
                os.kill(os.getpid(), sig)
            return original(self, iteration)

        td.DistributedTrainingJob.step = faulty  # type: ignore[method-assign]
    seed = int(os.environ.get("HARNESS_SEED", TINY.seed))  # docs/scale-out.md: the seed sweep
    settings = {"train": TINY, "kill": KILL_SETTINGS}.get(scenario, replace(TINY, iteration_num=100_000))
    settings = replace(settings, seed=seed)
    options = OPTIONS if scenario == "train" else replace(OPTIONS, sync_every_iterations=10)

    def leader(runner: Any) -> int:
        game = RecordingLink(settings, out)
        return int(runner(lambda flag: game, options=options, task_dir=out / "task"))

    with record_loss(td.DistributedTrainingJob, out) if env.leader else contextlib.nullcontext():
        code = td.run_rank(env, leader)
    (out / f"rank{env.rank}.json").write_text(json.dumps({"code": code}))
    return code


if __name__ == "__main__":
    sys.exit(_harness(sys.argv[1], Path(sys.argv[2])))
