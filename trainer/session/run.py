"""The training story, top to bottom (CleanRL style): connect, receive, train, sync, snapshot, finish.

Transport-agnostic: everything the engine sends or receives goes through a :class:`trainer.session.links.
TrainerLink`. Each section below is short and in execution order; the maths lives in flow/model/steps,
the bytes in protocol/, the replay buffer's checks at the data boundary (:meth:`trainer.training.data.
TrainingData.from_replay`).
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch

from protocol.config import data_config_to_json, trainer_config_to_json
from protocol.engine.configs import format_time_stamp
from protocol.errors import ProtocolError
from protocol.nne.layers import Layer
from protocol.snapshot import Snapshot, read_snapshot, snapshot_with_model, write_snapshot
from trainer import __version__
from trainer.dropin.handover import FLOW_MATCHING, socket_refusal
from trainer.errors import BadData, Diverged, LaunchError, PeerGone, Unsupported, WaitTimeout
from trainer.exitcodes import ExitCode
from trainer.records.progress import STATUS_FILE_NAME, ProgressReporter, RunPhase, log
from trainer.records.runrecord import RunLog, run_name, task_name_of
from trainer.records.trackers import TRACK_EVERY
from trainer.session.snapshots import SnapshotWriter
from trainer.session.transport.wait import StopRequested
from trainer.settings.options import TrainerOptions
from trainer.settings.timeouts import Timeouts
from trainer.training.heldout import HeldOutRound
from trainer.training.threads import (
    ThreadChoice,
    ThreadPolicy,
    ThreadTuner,
    Why,
    candidate_threads,
    usable_cores,
)

if TYPE_CHECKING:
    from trainer.session.links import TrainerLink
    from trainer.training.job import TrainingJob

__all__ = [
    "NETWORK_IDS",
    "THREADS_WORK_THRESHOLD",
    "LoopEnd",
    "SyncRounds",
    "choose_device",
    "choose_threads",
    "encode_networks",
    "run_training",
    "thread_tuner",
]

NETWORK_IDS = (0, 1, 2)
"""Denoiser, encoder, decoder: the engine's AddNetwork order (spec §4.3)."""
NETWORK_ROLES = {0: "denoiser", 1: "encoder", 2: "decoder"}
SUPPORTED_METHODS = (FLOW_MATCHING,)
DEFAULT_TIMEOUTS = Timeouts()
"""The documented defaults, for callers without a run's own :class:`Timeouts` (tests, tools)."""


class InterruptLike(Protocol):
    def is_set(self) -> bool: ...


def choose_device(config_device: str, override: str) -> torch.device:
    """``"GPU"`` (the engine's Device, and the ``gpu`` option) uses CUDA when present and falls back to
    CPU with one warning line (spec §4.1). An explicit ``cuda`` or ``cuda:N`` option (``--device``,
    ``LA_TRAINER_DEVICE``, la-trainer.json) names one device: when it is not there the run is refused
    (:class:`LaunchError`, exit 2) instead of training, much slower, on the CPU with exit 0.

    Raises:
        LaunchError: an explicit CUDA device that this machine does not have.
    """
    wanted = (override or config_device or "GPU").strip()
    lowered = wanted.lower()
    explicit = override.strip().lower()
    if explicit == "cuda" or explicit.startswith("cuda:"):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = int(explicit.partition(":")[2] or 0)
        if index >= count:
            why = (
                f"this machine has only cuda:0 to cuda:{count - 1}"
                if count
                else f"CUDA is not available here: {_no_cuda_reason()}"
            )
            raise LaunchError(
                f"the device option is {override.strip()!r}, but {why}. Use --device gpu "
                "(CUDA when present, else the CPU) or cpu, or another cuda:N (LA_TRAINER_DEVICE and "
                '"device" in la-trainer.json set it too); la-trainer doctor lists the devices.'
            )
    if lowered in ("gpu", "cuda") or lowered.startswith("cuda:"):
        if torch.cuda.is_available():
            return torch.device("cuda" if lowered in ("gpu", "cuda") else lowered)
        log(
            f"warning: Device is {wanted!r} but CUDA is not available here: {_no_cuda_reason()}. "
            "Training on the CPU."
        )
        return torch.device("cpu")
    if lowered == "cpu":
        return torch.device("cpu")
    raise Unsupported(f'Device {wanted!r} is not supported: use "GPU" or "CPU" (or --device cuda:N).')


def _no_cuda_reason() -> str:
    """Why torch sees no CUDA device, and the fix."""
    if torch.version.cuda is None:
        # The usual cause on a new machine: pip picked a CPU-only torch (PyPI's on Windows, or a
        # CPU wheel index). Say so, and how to get a CUDA build.
        from trainer.commands.doctor import CUDA_HINT

        return f"this torch ({torch.__version__}) is a CPU-only build; {CUDA_HINT}"
    return f"no CUDA device is visible to torch {torch.__version__} (driver? container --gpus?)"


THREADS_WORK_THRESHOLD = 16_000_000
"""Multiply-adds per forward pass (batch × denoiser parameters) from which a step uses several threads.

Measured with ``la-trainer bench --sections train`` (2 cores, two idle runs, 1 thread vs 2): the default
network (batch 256 × 23k parameters ≈ 6 M) runs faster on one (1,402 vs 1,364 and 1,338 vs 1,262 it/s);
the chunk-8 2×512 one (≈ 21 M) as fast or faster on two (639 vs 633, 641 vs 798); the 3-layer 256-wide
one at batch 1024 (≈ 80 M) much faster on two (168 vs 256, 177 vs 287)."""


def choose_threads(options: TrainerOptions, work: int) -> int:
    """The run's first intra-op CPU thread count: the ``threads`` option, else one for small networks
    (intra-op threading costs more than it saves there) and up to 8 from :data:`THREADS_WORK_THRESHOLD`
    on. Where nothing fixes the count, a CPU run then measures it (:mod:`trainer.training.threads`); this is the
    count it measures first. ``work``: batch size × the denoiser's parameter count (the multiply-adds of
    one forward pass)."""
    if options.threads > 0:
        return options.threads
    return 1 if work < THREADS_WORK_THRESHOLD else candidate_threads(usable_cores())[-1]


def thread_tuner(
    options: TrainerOptions,
    device: torch.device,
    first: int,
    *,
    scale_out: bool,
    reporter: ProgressReporter,
    runlog: RunLog,
) -> ThreadTuner:
    """The run's thread count from here on: measured on a CPU run that nothing fixes (the ``threads``
    option, scale-out's per-rank share; on CUDA the CPU only feeds the GPU), else left as set."""
    if device.type != "cpu" or options.threads > 0 or scale_out:
        return ThreadTuner.fixed(first)

    def announce(iteration: int, choice: ThreadChoice) -> None:
        if choice.why is Why.START or choice.threads != choice.previous:
            log(f"la-trainer: threads: {choice.describe()} at iteration {iteration}")
        reporter.threads(choice.threads, choice.describe())
        runlog.threads(iteration, choice.to_json())

    return ThreadTuner(first, ThreadPolicy(candidate_threads(usable_cores()), threads=first), announce)


def encode_networks(received: Mapping[int, Snapshot], layers: Mapping[int, Layer]) -> dict[int, bytes]:
    """Networks 0, 1, 2 as snapshot bytes: each trained layer tree in its received snapshot's header
    (same size, spec §6.1). For a sync round and for the snapshot files alike."""
    blobs = {}
    for nid in NETWORK_IDS:
        blobs[nid] = write_snapshot(snapshot_with_model(received[nid], layers[nid]))
        # read_snapshot checked that the received bytes were exactly this long, so the header's size is
        # the received size: no need to re-encode the received snapshot every round.
        if len(blobs[nid]) != received[nid].header.snapshot_size:
            raise AssertionError("snapshot size changed")  # snapshot_with_model guarantees this
    return blobs


@dataclass
class SyncRounds:
    """Sends networks 0, 1, 2 back to the engine (spec §7.1: a full round, in order, back to back);
    numbers the rounds' versions and counts them."""

    link: TrainerLink
    version: int = 0
    rounds: int = 0

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


class LoopEnd(Enum):
    """Why the training loop (section 5) ended; section 6 finishes accordingly. The value is the log's
    wording."""

    DONE = "every iteration ran"
    STOPPED = "the game asked to stop"
    """Between steps or while a sync round waited (spec §2.4): snapshot and checkpoint, no Complete."""
    INTERRUPTED = "interrupted"
    """SIGINT/SIGTERM: finish as usual (networks, Complete), exit code INTERRUPTED."""
    DIVERGED = "diverged"
    """Non-finite loss (or a lost scale-out rank): the last good weights go back, exit code DIVERGED."""

    @property
    def exit_code(self) -> ExitCode:
        if self is LoopEnd.INTERRUPTED:
            return ExitCode.INTERRUPTED
        if self is LoopEnd.DIVERGED:
            return ExitCode.DIVERGED
        return ExitCode.OK

    @property
    def phase(self) -> RunPhase:
        """The final phase the status file records for this end."""
        return {
            LoopEnd.DONE: RunPhase.COMPLETE,
            LoopEnd.STOPPED: RunPhase.STOPPED,
            LoopEnd.INTERRUPTED: RunPhase.INTERRUPTED,
            LoopEnd.DIVERGED: RunPhase.DIVERGED,
        }[self]


def _banner(device: torch.device, threads: str) -> None:
    log(
        f"la-trainer {__version__} | python {platform.python_version()} | torch {torch.__version__} | "
        f"device {device} | threads {threads} | pid {os.getpid()}"
    )


def run_training(
    link: TrainerLink,
    *,
    options: TrainerOptions,
    task_dir: Path | None,
    interrupt: InterruptLike | None = None,
    prepare_job: Callable[[TrainingJob], TrainingJob] | None = None,
    timeouts: Timeouts = DEFAULT_TIMEOUTS,
) -> ExitCode:
    """The whole run. Returns OK, INTERRUPTED or DIVERGED; raises on every other failure.

    ``prepare_job``: replaces the job once it is built, while the engine is still pinged (scale-out makes
    it one rank of a data-parallel job there, :func:`trainer.distributed.scale_out_job`). ``timeouts``:
    the keep-alive period while we are busy (``ping_interval``) and the bound of the wait for the engine
    after Complete where the link cannot see the game (``wait``). The status file (``trainer.records.progress``) and the run record
    (``trainer.records.runrecord``) follow the run to its end, whichever way it ends."""
    status_path = task_dir / STATUS_FILE_NAME if (task_dir is not None and options.status_file) else None
    runlog = RunLog()
    with ProgressReporter(0, every_s=options.progress_every_seconds, status_path=status_path) as reporter:
        try:
            return _story(
                link,
                reporter,
                runlog,
                options=options,
                task_dir=task_dir,
                interrupt=interrupt,
                prepare_job=prepare_job,
                timeouts=timeouts,
            )
        except BaseException as error:
            runlog.abort(error)
            raise


def _learning_rate(job: TrainingJob) -> float:
    """The optimiser's current base learning rate (what the metrics log and trackers report): a group's
    rate divided by its per-layer multiplier (``layer_lr``), so the number is the config's LearningRate
    whichever layer's group comes first."""
    group = job.optimizer.param_groups[0]
    return float(group["lr"]) / float(group.get("lr_scale", 1.0))


def _phase_key(job: TrainingJob) -> str:
    """``flow_matching`` or ``distillation``: the loss series a point belongs to."""
    return job.phase.name.lower() if job.phase is not None else "flow_matching"


def _story(
    link: TrainerLink,
    reporter: ProgressReporter,
    runlog: RunLog,
    *,
    options: TrainerOptions,
    task_dir: Path | None,
    interrupt: InterruptLike | None,
    prepare_job: Callable[[TrainingJob], TrainingJob] | None,
    timeouts: Timeouts,
) -> ExitCode:
    from trainer.session.links import KeepAlive
    from trainer.training.job import TrainingJob

    # Offline (the engine's export) there is no game: no waiting for it, no sync rounds to speak of.
    offline = link.comm_type == "Files"

    # 1. Config (spec §2.4 / §3): everything else is sized from it.
    if offline:
        reporter.phase(RunPhase.READING_EXPORT, "la-trainer: reading the exported training materials ...")
    else:
        reporter.phase(RunPhase.WAITING_FOR_CONFIG, "la-trainer: waiting for the game's config ...")
    config = link.receive_config()
    for warning in config.warnings:
        log(f"warning: config: {warning}")
    method = config.trainer.trainer_method
    if method not in SUPPORTED_METHODS:
        if link.comm_type == "Socket":
            raise socket_refusal(
                method
            )  # the game is connected to us: no hand-over (trainer.dropin.handover)
        raise Unsupported(
            f"TrainerMethod is {method!r} but la-trainer trains only {', '.join(SUPPORTED_METHODS)}. "
            "Engine-spawned shared-memory runs of other methods go to the engine's own train.py "
            "(docs/unreal-install.md, 'Other trainers'); run this one with the engine's trainer."
        )

    # 2. The three initial networks, in the engine's order (spec §2.4, §7.1).
    reporter.phase(RunPhase.RECEIVING_NETWORKS)
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

    # 3. The replay buffer, sent once (spec §5.3); checked where it becomes training data (step 4).
    reporter.phase(RunPhase.RECEIVING_EXPERIENCE)
    replay = link.receive_experience()

    # 4. Build the job while pinging: the engine may be waiting on us (spec §2.4).
    with KeepAlive(link, timeouts.ping_interval):
        device = choose_device(config.trainer.device, options.device)
        settings = config.model.flow_matching
        batch = config.trainer.training.batch_size
        # Checkpoints live beside the snapshots (<task_dir>/Snapshots) whether or not the config saves
        # snapshots: a crash must not lose hours of training (trainer.training.checkpoint).
        checkpoint_dir = task_dir / "Snapshots" if task_dir is not None else None
        job = TrainingJob.create(
            config, received, replay, options=options, device=device, checkpoint_dir=checkpoint_dir
        )
        # Threads from the denoiser's size, set before prepare_job: scale-out divides them among the
        # ranks of a node (trainer.distributed caps each rank's share), so it must see our choice.
        params = sum(p.numel() for p in job.model.denoiser.parameters())
        threads = choose_threads(options, batch * params)
        if device.type == "cpu":
            torch.set_num_threads(threads)
        if prepare_job is not None:
            job = prepare_job(job)
        tuner = thread_tuner(
            options, device, threads, scale_out=prepare_job is not None, reporter=reporter, runlog=runlog
        )
        shown = torch.get_num_threads() if device.type == "cpu" else threads
        _banner(device, f"measured, from {shown}" if tuner.measuring else str(shown))
    total = job.total_iterations
    reporter.start(total, job.start_iteration)
    reporter.phase(RunPhase.TRAINING)  # before the first progress line: a failure now is a training failure
    log(
        f"la-trainer: training {total} iterations on {job.sample_num} samples "
        f"(observation {job.observation_dim}, action {job.action_dim}, chunk {settings.action_chunk_size})"
    )

    sync = SyncRounds(link)
    writer = (
        SnapshotWriter.for_run(task_dir, config, options) if config.trainer.training.save_snapshots else None
    )
    # The run's record and trackers, under the engine's run name (spec §7.2; trainer.records.runrecord).
    stamp = config.trainer.time_stamp or format_time_stamp(datetime.now())
    runlog.open(
        task_dir=task_dir,
        name=run_name(task_name_of(task_dir), config.trainer.trainer_method, link.comm_type, stamp),
        options=options,
        config=config.trainer,
        engine_config={
            **data_config_to_json(config.data, config.model),
            "TrainerSettings": trainer_config_to_json(config.trainer),
        },
        info={
            "comm_type": link.comm_type,
            "trainer_version": __version__,
            "python": platform.python_version(),
            "torch": torch.__version__,
            "device": str(device),
            "iterations": total,
            "first_iteration": job.start_iteration,
        },
        first_iteration=job.start_iteration,
    )
    if runlog.folder is not None:
        reporter.run_dir(runlog.folder)
    every_iterations = options.sync_every_iterations
    every_seconds = options.sync_every_seconds
    snapshot_every = config.trainer.training.iterations_per_snapshot
    heldout = HeldOutRound(job, runlog, reporter)

    # 5. Train: step, report, sync, snapshot; stop when asked.
    end = LoopEnd.DONE
    last_sync = time.monotonic()
    iteration = job.start_iteration
    try:
        while iteration < total:
            if link.stop_requested():
                end = LoopEnd.STOPPED
                break
            if interrupt is not None and interrupt.is_set():
                end = LoopEnd.INTERRUPTED
                break
            started = time.perf_counter()
            loss = job.step(iteration)
            iteration += 1
            tuner.after_step(time.perf_counter() - started, iteration)
            reporter.update(iteration, loss)
            if iteration % TRACK_EVERY == 0:
                runlog.point(iteration, _phase_key(job), loss, _learning_rate(job), sync.rounds)
            if heldout.due(iteration):
                heldout.measure(iteration)
            now = time.monotonic()
            due = (every_iterations > 0 and iteration % every_iterations == 0) or (
                every_seconds > 0 and now - last_sync >= every_seconds
            )
            if due and iteration < total:
                sync.send(encode_networks(received, job.export()))
                reporter.syncs = sync.rounds
                last_sync = now
            if writer is not None and snapshot_every > 0 and iteration % snapshot_every == 0:
                writer.write(iteration, encode_networks(received, job.export()))
            job.maybe_checkpoint(iteration)
    except Diverged as error:
        log(f"la-trainer: {error}. Sending the last good weights.")
        end = LoopEnd.DIVERGED
    except StopRequested:
        # Stop arrived while a sync round waited on the game (spec §2.4: the engine does not wait for the
        # rest of the round): end as for a Stop seen between steps, keeping what was trained.
        end = LoopEnd.STOPPED
    except (PeerGone, WaitTimeout):
        # The game went away mid-run: keep what was trained so `--resume` can continue it, then let the
        # error name the phase and set the exit code as usual.
        job.maybe_checkpoint(iteration, force=True)
        raise

    finally:
        if iteration % TRACK_EVERY and iteration > job.start_iteration:
            runlog.point(iteration, _phase_key(job), job.smoothed_loss, _learning_rate(job), sync.rounds)

    # 6. Finish: final networks, snapshots, Complete (spec §7.2 step 5), then wait for the engine.
    heldout.at_end(iteration, diverged=end is LoopEnd.DIVERGED)
    reporter.update(iteration, job.smoothed_loss, force=True)
    reporter.phase(RunPhase.FINISHING)
    final = encode_networks(received, heldout.final_networks(job.export()))
    kept = runlog.networks(final)
    heldout.keep_best(lambda layers: encode_networks(received, layers))
    if end is LoopEnd.STOPPED:
        # Spec §2.4: after a Stop the engine tears its side down at once; exit cleanly without sending.
        if writer is not None:
            writer.write(iteration, final)
        job.maybe_checkpoint(iteration, force=True)
        runlog.finish(
            phase=end.phase.value,
            exit_code=end.exit_code,
            iteration=iteration,
            loss=job.smoothed_loss,
            outputs=kept,
        )
        reporter.finish(
            end.phase, end.exit_code, f"la-trainer: stopped at iteration {iteration}: {end.value}."
        )
        return end.exit_code
    with KeepAlive(link, timeouts.ping_interval):
        if writer is not None:
            writer.write(iteration, final)
        job.maybe_checkpoint(iteration, force=True)
    sync.send(final)
    link.send_complete()
    reporter.syncs = sync.rounds
    runlog.finish(
        phase=end.phase.value,
        exit_code=end.exit_code,
        iteration=iteration,
        loss=job.smoothed_loss,
        outputs=kept,
    )
    rounds = "" if offline else f", {sync.rounds} sync rounds"
    ending = "done" if end is LoopEnd.DONE else f"{end.value} (exit code {int(end.exit_code)})"
    reporter.finish(end.phase, end.exit_code, f"la-trainer: {ending} after {iteration} iterations{rounds}.")
    link.finish(timeouts.wait)  # offline: names the network files it wrote
    return end.exit_code
