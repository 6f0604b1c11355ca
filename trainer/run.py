"""The training story, top to bottom (CleanRL style): connect, receive, train, sync, snapshot, finish.

Transport-agnostic: everything the engine sends or receives goes through a :class:`trainer.links`
link. Each section below is short and in execution order; the maths lives in flow/model/step, the bytes
in protocol/.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch

from protocol.config import SessionConfig
from protocol.errors import ProtocolError
from protocol.replay import ReplayBuffer, check_finite
from protocol.snapshot import Snapshot, read_snapshot, snapshot_with_model, write_snapshot
from trainer import __version__
from trainer.errors import BadData, Diverged, PeerGone, Unsupported, WaitTimeout
from trainer.exitcodes import ExitCode
from trainer.options import TrainerOptions
from trainer.progress import STATUS_FILE_NAME, ProgressReporter, log
from trainer.snapshots import SnapshotWriter
from trainer.trackers import TRACK_EVERY, Trackers
from trainer.transport.wait import StopRequested

if TYPE_CHECKING:
    from trainer.job import TrainingJob

__all__ = ["NETWORK_IDS", "TrainerLinkLike", "choose_device", "run_training"]

NETWORK_IDS = (0, 1, 2)
"""Denoiser, encoder, decoder: the engine's AddNetwork order (spec §4.3)."""
NETWORK_ROLES = {0: "denoiser", 1: "encoder", 2: "decoder"}
SUPPORTED_METHODS = ("FlowMatching",)


class TrainerLinkLike(Protocol):
    def receive_config(self) -> SessionConfig: ...
    def receive_network(self, network_id: int) -> bytes: ...
    def receive_experience(self) -> ReplayBuffer: ...
    def send_network(self, network_id: int, data: bytes, version: int) -> None: ...
    def send_complete(self) -> None: ...
    def stop_requested(self) -> bool: ...
    def ping(self) -> None: ...
    def finish(self, timeout: float) -> None: ...
    def close(self) -> None: ...


class InterruptLike(Protocol):
    def is_set(self) -> bool: ...


def choose_device(config_device: str, override: str) -> torch.device:
    """``"GPU"`` uses CUDA when present and falls back to CPU with one warning line (spec §4.1)."""
    wanted = (override or config_device or "GPU").strip()
    lowered = wanted.lower()
    if lowered in ("gpu", "cuda") or lowered.startswith("cuda:"):
        if torch.cuda.is_available():
            return torch.device("cuda" if lowered in ("gpu", "cuda") else lowered)
        log(f"warning: Device is {wanted!r} but CUDA is not available here; training on the CPU.")
        return torch.device("cpu")
    if lowered == "cpu":
        return torch.device("cpu")
    raise Unsupported(f'Device {wanted!r} is not supported: use "GPU" or "CPU" (or --device cuda:N).')


THREADS_WORK_THRESHOLD = 16_000_000
"""Multiply-adds per forward pass (batch × denoiser parameters) from which a step uses several threads.

Measured with ``la-trainer bench --sections train`` (2 cores, two idle runs, 1 thread vs 2): the default
network (batch 256 × 23k parameters ≈ 6 M) runs faster on one (1,402 vs 1,364 and 1,338 vs 1,262 it/s);
the chunk-8 2×512 one (≈ 21 M) as fast or faster on two (639 vs 633, 641 vs 798); the 3-layer 256-wide
one at batch 1024 (≈ 80 M) much faster on two (168 vs 256, 177 vs 287)."""


def _choose_threads(options: TrainerOptions, work: int) -> int:
    """Small networks run faster on one thread: intra-op threading costs more than it saves there.
    ``work``: batch size × the denoiser's parameter count (the multiply-adds of one forward pass)."""
    if options.threads > 0:
        return options.threads
    cores = os.cpu_count() or 1
    return 1 if work < THREADS_WORK_THRESHOLD else min(cores, 8)


@dataclass
class _Syncer:
    """Sends networks 0, 1, 2 back (spec §7.1: a full round, in order, back to back)."""

    link: TrainerLinkLike
    received: Mapping[int, Snapshot]
    version: int = 0
    rounds: int = 0

    def encode(self, layers: Mapping[int, object]) -> dict[int, bytes]:
        blobs = {}
        for nid in NETWORK_IDS:
            snapshot = snapshot_with_model(self.received[nid], layers[nid])  # type: ignore[arg-type]
            blobs[nid] = write_snapshot(snapshot)
            # read_snapshot checked that the received bytes were exactly this long, so the header's size
            # is the received size: no need to re-encode the received snapshot every round.
            if len(blobs[nid]) != self.received[nid].header.snapshot_size:
                raise AssertionError("snapshot size changed")  # snapshot_with_model guarantees this
        return blobs

    def send(self, blobs: Mapping[int, bytes]) -> None:
        self.version += 1
        for nid in NETWORK_IDS:
            try:
                self.link.send_network(nid, blobs[nid], self.version)
            except (PeerGone, WaitTimeout) as error:
                # Same category (exit code), with the phase named: a user reading the log must see that
                # the game went away while taking networks back, not while sending experience.
                raise type(error)(f"during sync round {self.version} (network {nid}): {error}") from error
        self.rounds += 1


def _banner(device: torch.device, threads: int) -> None:
    log(
        f"la-trainer {__version__} | python {platform.python_version()} | torch {torch.__version__} | "
        f"device {device} | threads {threads} | pid {os.getpid()}"
    )


def run_training(
    link: TrainerLinkLike,
    *,
    options: TrainerOptions,
    task_dir: Path | None,
    interrupt: InterruptLike | None = None,
    prepare_job: Callable[[TrainingJob], TrainingJob] | None = None,
) -> ExitCode:
    """The whole run. Returns OK, INTERRUPTED or DIVERGED; raises on every other failure.

    ``prepare_job``: replaces the job once it is built, while the engine is still pinged (scale-out makes
    it one rank of a data-parallel job there, :func:`trainer.distributed.scale_out_job`)."""
    from trainer.job import TrainingJob
    from trainer.links import KeepAlive

    status_path = task_dir / STATUS_FILE_NAME if (task_dir is not None and options.status_file) else None
    reporter = ProgressReporter(0, every_s=options.progress_every_seconds, status_path=status_path)

    # 1. Config (spec §2.4 / §3): everything else is sized from it.
    reporter.phase("waiting for config", "la-trainer: waiting for the game's config ...")
    config = link.receive_config()
    for warning in config.warnings:
        log(f"warning: config: {warning}")
    method = config.trainer.trainer_method
    if method not in SUPPORTED_METHODS:
        raise Unsupported(
            f"TrainerMethod is {method!r} but la-trainer trains only {', '.join(SUPPORTED_METHODS)}. "
            "Use the engine's own train.py for other methods."
        )

    # 2. The three initial networks, in the engine's order (spec §2.4, §7.1).
    received: dict[int, Snapshot] = {}
    for nid in NETWORK_IDS:
        blob = link.receive_network(nid)
        expected = config.network(nid).max_byte_num
        if len(blob) != expected:
            raise BadData(
                f"network {nid} ({NETWORK_ROLES[nid]}) has {len(blob)} bytes but the model config's MaxByteNum "
                f"is {expected}"
            )
        try:
            received[nid] = read_snapshot(blob)
        except ProtocolError as error:
            raise BadData(
                f"network {nid} ({NETWORK_ROLES[nid]}) from the game is not a valid snapshot: {error}"
            ) from error

    # 3. The replay buffer, sent once (spec §5.3).
    reporter.phase("receiving experience")
    replay = link.receive_experience()
    problems = check_finite(replay)
    if problems:
        raise BadData("the replay buffer holds non-finite values: " + "; ".join(problems))

    # 4. Build the job while pinging: the engine may be waiting on us (spec §2.4).
    with KeepAlive(link, 1.0):
        device = choose_device(config.trainer.device, options.device)
        settings = config.model.flow_matching
        batch = config.trainer.training.batch_size
        # Checkpoints live beside the snapshots (<task_dir>/Snapshots) whether or not the config saves
        # snapshots: a crash must not lose hours of training (trainer.checkpoint).
        checkpoint_dir = task_dir / "Snapshots" if task_dir is not None else None
        job = TrainingJob.create(
            config, received, replay, options=options, device=device, checkpoint_dir=checkpoint_dir
        )
        # Threads from the denoiser's size, set before prepare_job: scale-out divides them among the
        # ranks of a node (trainer.distributed caps each rank's share), so it must see our choice.
        params = sum(p.numel() for p in job.model.denoiser.parameters())
        threads = _choose_threads(options, batch * params)
        if device.type == "cpu":
            torch.set_num_threads(threads)
        if prepare_job is not None:
            job = prepare_job(job)
        _banner(device, torch.get_num_threads() if device.type == "cpu" else threads)
    total = job.total_iterations
    reporter.start(total, job.start_iteration)
    reporter.phase("training")  # before the first progress line: a failure now is a training failure
    log(
        f"la-trainer: training {total} iterations on {job.sample_num} samples "
        f"(observation {job.observation_dim}, action {job.action_dim}, chunk {settings.action_chunk_size})"
    )

    syncer = _Syncer(link, received)
    writer = (
        SnapshotWriter.for_run(task_dir, config, options) if config.trainer.training.save_snapshots else None
    )
    trackers = Trackers.for_run(config.trainer, task_dir, getattr(link, "comm_type", "Unknown"))
    every_iterations = options.sync_every_iterations
    every_seconds = options.sync_every_seconds
    snapshot_every = config.trainer.training.iterations_per_snapshot

    # 5. Train: step, report, sync, snapshot; stop when asked.
    outcome = ExitCode.OK
    last_sync = time.monotonic()
    iteration = job.start_iteration
    stopped_by = ""
    try:
        while iteration < total:
            if link.stop_requested():
                stopped_by = "the game asked to stop"
                break
            if interrupt is not None and interrupt.is_set():
                stopped_by = "interrupted"
                outcome = ExitCode.INTERRUPTED
                break
            loss = job.step(iteration)
            iteration += 1
            reporter.update(iteration, loss)
            if iteration % TRACK_EVERY == 0:
                trackers.scalars(iteration, {"loss": loss, "sync_rounds": float(syncer.rounds)})
            now = time.monotonic()
            due = (every_iterations > 0 and iteration % every_iterations == 0) or (
                every_seconds > 0 and now - last_sync >= every_seconds
            )
            if due and iteration < total:
                syncer.send(syncer.encode(job.export()))
                reporter.syncs = syncer.rounds
                last_sync = now
            if writer is not None and snapshot_every > 0 and iteration % snapshot_every == 0:
                writer.write(iteration, syncer.encode(job.export()))
            job.maybe_checkpoint(iteration, writer)
    except Diverged as error:
        log(f"la-trainer: {error}. Sending the last good weights.")
        outcome = ExitCode.DIVERGED
    except StopRequested:
        # Stop arrived while a sync round waited on the game (spec §2.4: the engine does not wait for the
        # rest of the round): end as for a Stop seen between steps, keeping what was trained.
        stopped_by = "the game asked to stop"
    except (PeerGone, WaitTimeout):
        # The game went away mid-run: keep what was trained so `--resume` can continue it, then let the
        # error name the phase and set the exit code as usual.
        job.maybe_checkpoint(iteration, writer, force=True)
        raise

    finally:
        if iteration % TRACK_EVERY and iteration > job.start_iteration:
            trackers.scalars(iteration, {"loss": job.smoothed_loss, "sync_rounds": float(syncer.rounds)})
        trackers.close()

    # 6. Finish: final networks, snapshots, Complete (spec §7.2 step 5), then wait for the engine.
    reporter.update(iteration, job.smoothed_loss, force=True)
    if stopped_by == "the game asked to stop":
        log(f"la-trainer: stopped at iteration {iteration}: {stopped_by}.")
        final = syncer.encode(job.export())
        if writer is not None:
            writer.write(iteration, final)
        job.maybe_checkpoint(iteration, writer, force=True)
        reporter.phase("stopped")
        return ExitCode.OK
    final = syncer.encode(job.export())
    with KeepAlive(link, 1.0):
        if writer is not None:
            writer.write(iteration, final)
        job.maybe_checkpoint(iteration, writer, force=True)
    syncer.send(final)
    link.send_complete()
    reporter.syncs = syncer.rounds
    reporter.phase("complete", f"la-trainer: done after {iteration} iterations, {syncer.rounds} sync rounds.")
    link.finish(30.0)
    return outcome
