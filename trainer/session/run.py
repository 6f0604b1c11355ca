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

from protocol.config import SessionConfig, data_config_to_json, trainer_config_to_json
from protocol.engine.configs import format_time_stamp
from protocol.errors import ProtocolError
from protocol.names import ENGINE_DEFAULT_MODULE, FLOW_MATCHING, FLOW_MATCHING_MODULE, CommType, NetworkId
from protocol.nne.layers import Layer
from protocol.replay import ReplayBuffer
from protocol.snapshot import Snapshot, read_snapshot, snapshot_with_model, write_snapshot
from trainer import __version__
from trainer.errors import BadData, Diverged, PeerGone, TrainingPeerLost, Unsupported, WaitTimeout
from trainer.exitcodes import ExitCode
from trainer.records.progress import STATUS_FILE_NAME, ProgressReporter, RunPhase
from trainer.records.runrecord import RunLog, run_name, task_name_of
from trainer.records.trackers import TRACK_EVERY
from trainer.session.background import CopyWorker
from trainer.session.heldout import HeldOutRound
from trainer.session.points import PendingPoints
from trainer.session.sender import NetworkSender
from trainer.session.snapshots import SnapshotWriter
from trainer.session.transport.wait import StopRequested
from trainer.settings.environment import ENV_ENGINE_TRAIN_PY, ENV_NPROC
from trainer.settings.options import TrainerOptions
from trainer.settings.timeouts import Timeouts
from trainer.system.console import log
from trainer.training.device import choose_device
from trainer.training.threads import (
    ThreadChoice,
    ThreadPolicy,
    ThreadTuner,
    Why,
    candidate_threads,
    choose_threads,
    usable_cores,
)

if TYPE_CHECKING:
    from trainer.session.links import TrainerLink
    from trainer.training.copies import WeightsCopy
    from trainer.training.job import TrainingJob
    from trainer.training.model import FlowModel

__all__ = [
    "LoopEnd",
    "SyncRounds",
    "encode_networks",
    "run_training",
    "socket_refusal",
    "thread_tuner",
]

SUPPORTED_METHODS = (FLOW_MATCHING,)
DEFAULT_TIMEOUTS = Timeouts()
"""The documented defaults, for callers without a run's own :class:`Timeouts` (tests, tools)."""


class InterruptLike(Protocol):
    def is_set(self) -> bool: ...


def socket_refusal(method: str) -> Unsupported:
    """The error for a socket run whose config is not FlowMatching and that la-trainer could not relay to
    the engine's own script (:mod:`trainer.dropin.handover`): what happened and what to do."""
    return Unsupported(
        f"TrainerMethod is {method!r}, but la-trainer trains only FlowMatching, and this socket session could "
        "not be relayed to the engine's own train.py (it was not found, or the run is a scale-out job "
        f"under {ENV_NPROC}, or a `la-trainer socket` server). Set {ENV_ENGINE_TRAIN_PY} to the "
        "engine's Plugins/Experimental/LearningCore/Content/Python/train.py, or give that call site a "
        f"TrainerFileName other than {ENGINE_DEFAULT_MODULE} and {FLOW_MATCHING_MODULE} (e.g. "
        "learning_core.train_ppo; la-trainer then hands it over before listening, also under scale-out), or "
        "run the engine's trainer for it (set its process settings' EditorEngineRelativePath/"
        "NonEditorEngineRelativePath back to the engine). See docs/unreal-install.md, 'Other trainers'."
    )


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
    option, scale-out's per-rank share; on CUDA the CPU only feeds the GPU; one usable core), else left
    as set."""
    candidates = candidate_threads(usable_cores())
    if device.type != "cpu" or options.threads > 0 or scale_out or len(candidates) == 1:
        return ThreadTuner.fixed(first)

    def announce(iteration: int, choice: ThreadChoice) -> None:
        if choice.why is Why.START or choice.threads != choice.previous:
            log(f"la-trainer: threads: {choice.describe()} at iteration {iteration}")
        reporter.threads(choice.threads, choice.describe())
        runlog.threads(iteration, choice.to_json())

    return ThreadTuner(first, ThreadPolicy(candidates, threads=first), announce)


def encode_networks(received: Mapping[int, Snapshot], layers: Mapping[int, Layer]) -> dict[int, bytes]:
    """Networks 0, 1, 2 as snapshot bytes: each trained layer tree in its received snapshot's header
    (same size, spec §6.1). For a sync round and for the snapshot files alike."""
    blobs = {}
    for nid in map(int, NetworkId):
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
        for nid in map(int, NetworkId):
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
    """Non-finite loss: the last good weights go back, exit code DIVERGED."""
    RANK_LOST = "a scale-out training process was lost"
    """Another rank failed or vanished (:class:`trainer.errors.TrainingPeerLost`): ends as DIVERGED does,
    recorded as what it is, exit code PEER_GONE (the game's side of it is the same: that job's peer is gone)."""

    @property
    def exit_code(self) -> ExitCode:
        if self is LoopEnd.INTERRUPTED:
            return ExitCode.INTERRUPTED
        if self is LoopEnd.DIVERGED:
            return ExitCode.DIVERGED
        if self is LoopEnd.RANK_LOST:
            return ExitCode.PEER_GONE
        return ExitCode.OK

    @property
    def phase(self) -> RunPhase:
        """The final phase the status file records for this end."""
        return {
            LoopEnd.DONE: RunPhase.COMPLETE,
            LoopEnd.STOPPED: RunPhase.STOPPED,
            LoopEnd.INTERRUPTED: RunPhase.INTERRUPTED,
            LoopEnd.DIVERGED: RunPhase.DIVERGED,
            LoopEnd.RANK_LOST: RunPhase.RANK_LOST,
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
    option_sources: Mapping[str, str] | None = None,
    task_name: str | None = None,
) -> ExitCode:
    """The whole run. Returns OK, INTERRUPTED, DIVERGED or PEER_GONE (a lost scale-out rank); raises on
    every other failure.

    ``option_sources``: where each option came from
    (:meth:`trainer.settings.options.LoadedOptions.every_source`), kept in the run record. ``task_name``:
    the first part of the run name; None: the engine's TaskName from its task folder ``<TaskName><N>``
    (:func:`trainer.records.runrecord.task_name_of`). A folder the user named (``offline --out res2``)
    passes its whole name: its digits are not a task number.

    ``prepare_job``: replaces the job once it is built, while the engine is still pinged (scale-out makes
    it one rank of a data-parallel job there, :func:`trainer.distributed.scale_out_job`). ``timeouts``:
    the keep-alive period while we are busy (``ping_interval``) and the bound of the wait for the engine
    after Complete where the link cannot see the game (``wait``). The status file (``trainer.records.progress``) and the run record
    (``trainer.records.runrecord``) follow the run to its end, whichever way it ends."""
    status_path = task_dir / STATUS_FILE_NAME if (task_dir is not None and options.status_file) else None
    runlog = RunLog()
    # Offline (the engine's export) there is no game to send networks to: no sync count on the lines.
    syncs = link.comm_type != CommType.FILES
    with ProgressReporter(
        0, every_s=options.progress_every_seconds, status_path=status_path, syncs=syncs
    ) as reporter:
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
                option_sources=option_sources,
                task_name=task_name,
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


@dataclass
class _Run:
    """What the story's sections after the job is built share (sections 5 and 6)."""

    link: TrainerLink
    reporter: ProgressReporter
    runlog: RunLog
    options: TrainerOptions
    config: SessionConfig
    received: dict[int, Snapshot]
    job: TrainingJob
    device: torch.device
    tuner: ThreadTuner
    sync: SyncRounds
    writer: SnapshotWriter | None
    heldout: HeldOutRound

    @property
    def offline(self) -> bool:
        """The engine's export (no game: no waiting for it, no sync rounds to speak of)."""
        return self.link.comm_type == CommType.FILES


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
    option_sources: Mapping[str, str] | None,
    task_name: str | None,
) -> ExitCode:
    from trainer.session.links import KeepAlive

    # 1. Config (spec §2.4 / §3): everything else is sized from it.
    config = _receive_config(link, reporter)
    # 2. The three initial networks, in the engine's order (spec §2.4, §7.1).
    received = _receive_networks(link, reporter, config)
    # 3. The replay buffer, sent once (spec §5.3); checked where it becomes training data (step 4).
    reporter.phase(RunPhase.RECEIVING_EXPERIENCE)
    replay = link.receive_experience()
    # 4. Build the job while pinging: the engine may be waiting on us (spec §2.4).
    with KeepAlive(link, timeouts.ping_interval):
        job, device, tuner = _build_job(
            config, received, replay, options, task_dir, prepare_job, reporter=reporter, runlog=runlog
        )
    run = _start_training(
        link,
        reporter,
        runlog,
        options,
        task_dir,
        config,
        received,
        job,
        device,
        tuner,
        option_sources=option_sources,
        task_name=task_name,
    )
    # 5. Train: step, report, sync, snapshot; stop when asked.
    end, iteration = _train(run, interrupt)
    # 6. Finish: final networks, snapshots, Complete (spec §7.2 step 5), then wait for the engine.
    return _finish(run, end, iteration, timeouts, interrupt)


def _receive_config(link: TrainerLink, reporter: ProgressReporter) -> SessionConfig:
    """Section 1: the engine's config, refused when its method is not one la-trainer trains."""
    if link.comm_type == CommType.FILES:
        reporter.phase(RunPhase.READING_EXPORT, "la-trainer: reading the exported training materials ...")
    else:
        reporter.phase(RunPhase.WAITING_FOR_CONFIG, "la-trainer: waiting for the game's config ...")
    config = link.receive_config()
    for warning in config.warnings:
        log(f"warning: config: {warning}")
    method = config.trainer.trainer_method
    if method not in SUPPORTED_METHODS:
        if link.comm_type == CommType.SOCKET:
            raise socket_refusal(
                method
            )  # the game is connected to us: no hand-over (trainer.dropin.handover)
        raise Unsupported(
            f"TrainerMethod is {method!r} but la-trainer trains only {', '.join(SUPPORTED_METHODS)}. "
            "Engine-spawned shared-memory runs of other methods go to the engine's own train.py "
            "(docs/unreal-install.md, 'Other trainers'); run this one with the engine's trainer."
        )
    return config


def _receive_networks(
    link: TrainerLink, reporter: ProgressReporter, config: SessionConfig
) -> dict[int, Snapshot]:
    """Section 2: networks 0, 1, 2 as snapshots, each exactly its config's MaxByteNum long."""
    reporter.phase(RunPhase.RECEIVING_NETWORKS)
    received: dict[int, Snapshot] = {}
    for network in NetworkId:
        nid = int(network)
        blob = link.receive_network(nid)
        expected = config.network(nid).max_byte_num
        if len(blob) != expected:
            raise BadData(
                f"{network.describe()} has {len(blob)} bytes but the model config's MaxByteNum is {expected}"
            )
        try:
            received[nid] = read_snapshot(blob)
        except ProtocolError as error:
            raise BadData(f"{network.describe()} from the game is not a valid snapshot: {error}") from error
    return received


def _build_job(
    config: SessionConfig,
    received: dict[int, Snapshot],
    replay: ReplayBuffer,
    options: TrainerOptions,
    task_dir: Path | None,
    prepare_job: Callable[[TrainingJob], TrainingJob] | None,
    *,
    reporter: ProgressReporter,
    runlog: RunLog,
) -> tuple[TrainingJob, torch.device, ThreadTuner]:
    """Section 4: the device, the job (resumed from a checkpoint when asked), the CPU threads it runs
    with, and the banner that says all three."""
    from trainer.training.job import TrainingJob

    device = choose_device(config.trainer.device, options.device)
    # Checkpoints live beside the snapshots (<task_dir>/Snapshots) whether or not the config saves
    # snapshots: a crash must not lose hours of training (trainer.training.checkpoint).
    checkpoint_dir = task_dir / "Snapshots" if task_dir is not None else None
    job = TrainingJob.create(
        config, received, replay, options=options, device=device, checkpoint_dir=checkpoint_dir
    )
    # Threads from the denoiser's size, set before prepare_job: scale-out divides them among the
    # ranks of a node (trainer.distributed caps each rank's share), so it must see our choice.
    params = sum(p.numel() for p in job.model.denoiser.parameters())
    threads = choose_threads(options.threads, config.trainer.training.batch_size * params)
    if device.type == "cpu":
        torch.set_num_threads(threads)
    if prepare_job is not None:
        job = prepare_job(job)
    tuner = thread_tuner(
        options, device, threads, scale_out=prepare_job is not None, reporter=reporter, runlog=runlog
    )
    shown = torch.get_num_threads() if device.type == "cpu" else threads
    _banner(device, f"measured, from {shown}" if tuner.measuring else str(shown))
    return job, device, tuner


def _start_training(
    link: TrainerLink,
    reporter: ProgressReporter,
    runlog: RunLog,
    options: TrainerOptions,
    task_dir: Path | None,
    config: SessionConfig,
    received: dict[int, Snapshot],
    job: TrainingJob,
    device: torch.device,
    tuner: ThreadTuner,
    *,
    option_sources: Mapping[str, str] | None,
    task_name: str | None,
) -> _Run:
    """Between sections 4 and 5: training begins (status, one log line), and the run's snapshot writer,
    record and trackers open under the engine's run name (spec §7.2; trainer.records.runrecord), or
    ``task_name``'s, with where each option came from (``option_sources``) when known."""
    total = job.total_iterations
    settings = config.model.flow_matching
    batch = config.trainer.training.batch_size
    params = sum(p.numel() for p in job.model.denoiser.parameters())
    reporter.start(total, job.start_iteration)
    reporter.phase(RunPhase.TRAINING)  # before the first progress line: a failure now is a training failure
    log(
        f"la-trainer: training {total} iterations on {job.sample_num} samples "
        f"(observation {job.observation_dim}, action {job.action_dim}, chunk {settings.action_chunk_size}); "
        f"denoiser {settings.hidden_layer_num} hidden layer(s) of {settings.hidden_layer_size}, "
        f"{params:,} parameters, batch {batch}"
    )
    sync = SyncRounds(link)
    writer = (
        SnapshotWriter.for_run(task_dir, config, options) if config.trainer.training.save_snapshots else None
    )
    stamp = config.trainer.time_stamp or format_time_stamp(datetime.now())
    runlog.open(
        task_dir=task_dir,
        name=run_name(
            task_name or task_name_of(task_dir), config.trainer.trainer_method, link.comm_type, stamp
        ),
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
        option_sources=option_sources,
    )
    if runlog.folder is not None:
        reporter.run_dir(runlog.folder)
    _show_recipe(job, runlog, reporter)
    heldout = HeldOutRound(job, runlog, reporter)
    return _Run(link, reporter, runlog, options, config, received, job, device, tuner, sync, writer, heldout)


@dataclass
class _Behind:
    """What runs behind the training loop on threads of its own, from copies of the weights: the sync
    rounds (:class:`NetworkSender`, the newest copy wins) and the snapshot files (:class:`CopyWorker`,
    every one written, in order). Errors there surface on the training thread (:meth:`check`)."""

    sender: NetworkSender
    snapshots: CopyWorker[list[Path]] | None

    @classmethod
    def start(cls, run: _Run, snapshot_every: int) -> _Behind:
        from trainer.training.copies import ShadowModel, exported_layers

        cpu = torch.device("cpu")
        shadow = ShadowModel(run.job.model, cpu)  # the sender's own (export needs the host anyway)
        sender = NetworkSender(
            lambda weights: encode_networks(run.received, shadow.export(weights)), run.sync.send
        )
        writer = run.writer if snapshot_every > 0 else None
        if writer is None:
            return cls(sender, None)

        def write(model: FlowModel, weights: WeightsCopy) -> list[Path]:
            return writer.write(weights.iteration, encode_networks(run.received, exported_layers(model)))

        shadow_model = ShadowModel(run.job.model, cpu)
        return cls(sender, CopyWorker("la-trainer-snapshots", shadow_model, write, keep_results=False))

    def check(self) -> None:
        """Raise what failed behind the loop (cheap; every iteration)."""
        self.sender.check()
        if self.snapshots is not None:
            self.snapshots.check()

    def finish(self, end: LoopEnd) -> None:
        """The loop is done: the round in flight ends (the copy offered last goes out only when every
        iteration ran: after a Stop or a signal no round starts), queued snapshots are written; failures
        raised."""
        self.sender.close(drop=end is not LoopEnd.DONE)
        self.sender.check()
        if self.snapshots is not None:
            self.snapshots.drain()
            self.snapshots.check()

    def round_failure(self) -> BaseException | None:
        """After the loop saw the game gone: what the round in flight saw (it names the sync round, the
        phase the game died in), once the sender ended; None when no round was going out."""
        self.sender.close(drop=True)
        return self.sender.take_error()

    def close(self) -> None:
        """Stop both threads (after whatever ended the loop). Idempotent."""
        self.sender.close(drop=True)
        if self.snapshots is not None:
            self.snapshots.close()


def _show_recipe(job: TrainingJob, runlog: RunLog, reporter: ProgressReporter) -> None:
    """The recipe (:mod:`trainer.training.recipes`) in the status file and the run record: at the start,
    and after each of the pilot's looks (written once each)."""
    from trainer.training.recipes import pilot_plan

    summary = job.recipe_record()
    looks = job.take_recipe_looks()
    if not looks:
        runlog.recipe(None, None, {}, summary)
    for look in looks:
        runlog.recipe(look.iteration, look.record(), look.tracker_values(), summary)
    name = summary["name"]
    pilot = job.pilot is not None and job.pilot.active
    if pilot:
        reporter.recipe(f"{name} (pilot)", looks[-1].describe() if looks else pilot_plan())
    else:
        reporter.recipe(name, looks[-1].describe() if looks else job.recipe_why)


def _train(run: _Run, interrupt: InterruptLike | None) -> tuple[LoopEnd, int]:
    """Section 5: step, report, sync, snapshot until every iteration ran or something ends the loop; why it
    ended and the iterations done.

    Nothing here waits for the device or the game (issue 32): a step leaves its loss on the device and
    is read back only for a progress line or a batch of metrics points (:mod:`trainer.session.points`),
    so a divergence is found at that read (the weights kept are those before the step that diverged);
    sync rounds go out from the sender's thread (:mod:`trainer.session.sender`) and the held-out
    measurement runs on its own (:mod:`trainer.session.heldout`), each from a copy of the weights."""
    from trainer.training.copies import take_copy

    job, link, reporter, sync = run.job, run.link, run.reporter, run.sync
    total = job.total_iterations
    every_iterations = run.options.sync_every_iterations
    every_seconds = run.options.sync_every_seconds
    snapshot_every = run.config.trainer.training.iterations_per_snapshot
    end = LoopEnd.DONE
    last_sync = time.monotonic()
    iteration = job.start_iteration
    points = PendingPoints(run.runlog)
    behind = _Behind.start(run, snapshot_every)
    try:
        while iteration < total:
            if link.stop_requested():
                end = LoopEnd.STOPPED
                break
            if interrupt is not None and interrupt.is_set():
                end = LoopEnd.INTERRUPTED
                break
            behind.check()
            run.heldout.collect()
            started = time.perf_counter()
            job.advance(iteration)
            iteration += 1
            if job.recipe_looks:
                _show_recipe(job, run.runlog, reporter)
            run.tuner.after_step(time.perf_counter() - started, iteration)
            if iteration % TRACK_EVERY == 0:
                points.add(iteration, _phase_key(job), job.loss_probe(), _learning_rate(job), sync.rounds)
            if reporter.line_due() or len(points) >= points.flush_every:
                job.settle()  # the one host read: raises Diverged for a step that was skipped
                points.flush()
            reporter.syncs = sync.rounds
            reporter.update(iteration, job.smoothed_loss)
            if run.heldout.due(iteration):
                run.heldout.request(iteration)
            now = time.monotonic()
            due = (every_iterations > 0 and iteration % every_iterations == 0) or (
                every_seconds > 0 and now - last_sync >= every_seconds
            )
            if due and iteration < total:
                behind.sender.offer(take_copy(job.model, iteration, job.phase))
                last_sync = now
            if behind.snapshots is not None and iteration % snapshot_every == 0:
                behind.snapshots.put(take_copy(job.model, iteration, job.phase))
            job.maybe_checkpoint(iteration)
        job.settle()
        behind.finish(end)
    except Diverged as error:
        log(f"la-trainer: {error}. Sending the last good weights.")
        end = LoopEnd.RANK_LOST if isinstance(error, TrainingPeerLost) else LoopEnd.DIVERGED
        if error.iteration is not None and job.start_iteration <= error.iteration < iteration:
            iteration = error.iteration  # the weights kept are those after this many steps
    except StopRequested:
        # Stop arrived while a sync round waited on the game (spec §2.4: the engine does not wait for the
        # rest of the round): end as for a Stop seen between steps, keeping what was trained.
        end = LoopEnd.STOPPED
        iteration = _settled(job, iteration)
    except (PeerGone, WaitTimeout) as error:
        # The game went away mid-run: keep what was trained so `--resume` can continue it, then let the
        # error name the phase and set the exit code as usual (a round that was waiting on the game
        # names it best: the sync round).
        iteration = _settled(job, iteration)
        job.maybe_checkpoint(iteration, force=True)
        in_round = behind.round_failure()
        if isinstance(in_round, (PeerGone, WaitTimeout)) and in_round is not error:
            raise in_round from error
        raise

    finally:
        behind.close()
        points.flush(up_to=iteration)
        if iteration % TRACK_EVERY and iteration > job.start_iteration:
            run.runlog.point(iteration, _phase_key(job), job.smoothed_loss, _learning_rate(job), sync.rounds)
    if end is LoopEnd.DONE and behind.sender.stopped:
        end = LoopEnd.STOPPED  # a Stop the sender saw while its round waited (spec §2.4)
    reporter.syncs = sync.rounds
    return end, iteration


def _settled(job: TrainingJob, iteration: int) -> int:
    """Read the unread steps where the loop ends another way (a Stop, the game gone) before the final
    checkpoint: a divergence found then is logged, and the iteration count goes back to the step it names
    (the weights are those after it); else ``iteration``."""
    try:
        job.settle()
    except Diverged as error:
        log(f"la-trainer: {error}.")
        if error.iteration is not None and job.start_iteration <= error.iteration < iteration:
            return error.iteration
    return iteration


def _finish(
    run: _Run, end: LoopEnd, iteration: int, timeouts: Timeouts, interrupt: InterruptLike | None = None
) -> ExitCode:
    """Section 6: the final networks (the held-out best with ``heldout_send_best``), their snapshot and
    checkpoint, then, unless the game asked to stop, the last sync round and Complete (spec §7.2 step 5)
    and the wait for the engine to take them."""
    job, reporter, writer = run.job, run.reporter, run.writer
    run.heldout.at_end(iteration, diverged=end in (LoopEnd.DIVERGED, LoopEnd.RANK_LOST))
    reporter.update(iteration, job.smoothed_loss, force=True)
    reporter.phase(RunPhase.FINISHING)
    final = encode_networks(run.received, run.heldout.final_networks(job.export()))
    kept = run.runlog.networks(final)
    run.heldout.keep_best(lambda layers: encode_networks(run.received, layers))
    if end is LoopEnd.STOPPED:
        # Spec §2.4: after a Stop the engine tears its side down at once; exit cleanly without sending.
        if writer is not None:
            writer.write(iteration, final)
        job.maybe_checkpoint(iteration, force=True)
        _save_ended(interrupt, saved=not job.checkpoint_failed)
        _record_end(run, end, iteration, kept)
        reporter.finish(
            end.phase, end.exit_code, f"la-trainer: stopped at iteration {iteration}: {end.value}."
        )
        return end.exit_code
    from trainer.session.links import KeepAlive

    with KeepAlive(run.link, timeouts.ping_interval):
        if writer is not None:
            writer.write(iteration, final)
        job.maybe_checkpoint(iteration, force=True)
    _save_ended(interrupt, saved=not job.checkpoint_failed)
    run.sync.send(final)
    run.link.send_complete()
    reporter.syncs = run.sync.rounds
    _record_end(run, end, iteration, kept)
    rounds = "" if run.offline else f", {run.sync.rounds} sync rounds"
    ending = "done" if end is LoopEnd.DONE else f"{end.value} (exit code {int(end.exit_code)})"
    reporter.finish(end.phase, end.exit_code, f"la-trainer: {ending} after {iteration} iterations{rounds}.")
    run.link.finish(timeouts.wait)  # offline: names the network files it wrote
    return end.exit_code


def _save_ended(interrupt: InterruptLike | None, *, saved: bool) -> None:
    """Tell the process's signal handling that the final save is over (``saved``: the state is on disk):
    a second Ctrl-C that waited for it stops the trainer now (:meth:`trainer.session.app.InterruptFlag.
    save_ended`; other interrupt flags, scale-out's, have no such wait)."""
    ended = getattr(interrupt, "save_ended", None)
    if ended is not None:
        ended(saved)


def _record_end(run: _Run, end: LoopEnd, iteration: int, kept: list[Path]) -> None:
    """The run record's last word: the final phase, exit code, iteration, loss and the networks kept."""
    run.runlog.finish(
        phase=end.phase.value,
        exit_code=end.exit_code,
        iteration=iteration,
        loss=run.job.smoothed_loss,
        outputs=kept,
    )
