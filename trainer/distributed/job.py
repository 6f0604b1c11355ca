"""The job on every rank: the same start state everywhere, gradients averaged across the ranks, and a
regular agreement on stop, interrupt, the logged loss and the weights' checksum."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from trainer.distributed.environment import ShardSampler, derive_seed
from trainer.distributed.errors import (
    ReplicasDiffer,
    ScaleOutError,
    first_line,
    is_collective_failure,
)
from trainer.distributed.frames import MAX_STATE_BYTES, FrameKind
from trainer.distributed.state import RankContext
from trainer.errors import Diverged, exit_code_for
from trainer.exitcodes import ExitCode
from trainer.system.console import log
from trainer.training.job import TrainingJob

__all__ = [
    "CHECKSUM_MODULUS",
    "DistributedTrainingJob",
    "RankAveraging",
    "scale_out_job",
    "sync_start_state",
    "weights_checksum",
]

_DTYPES = {
    str(dtype): dtype
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32)
}
"""The tensor dtypes a start state may hold, by name (the skeleton is JSON)."""


class _GradientCarrier(nn.Module):
    """Holds the model's trainable parameters (the same objects, not copies) so that DDP owns their
    gradient hooks. Its forward is the identity: calling the DDP wrapper once per step arms DDP's
    reducer, and the backward of the loss, however the model computed it (train_step, distill_step),
    then averages every gradient across ranks in DDP's buckets, overlapped with the backward.

    [INF] Rejected: wrapping ``model.denoiser`` in DDP. It changes state-dict keys (checkpoints), would be
    deep-copied by the distiller's teacher, and the encoder would need a second DDP instance."""

    def __init__(self, params: Sequence[nn.Parameter]) -> None:
        super().__init__()
        self.params = nn.ParameterList(params)

    def forward(self, x: Tensor) -> Tensor:
        return x


class RankAveraging:
    """:class:`trainer.training.steps.base.GradientAveraging` across the ranks of this job.

    Autograd steps (a trained encoder, distillation, layers the fused step does not cover): DDP, armed
    before each step over a :class:`_GradientCarrier`, averages the gradients while the backward runs.
    The fused step (:class:`trainer.training.steps.fused.FusedStep`) has no autograd graph for DDP to hook into;
    its gradients already live in one contiguous buffer, which is what DDP's reducer builds (as buckets)
    before it calls the same c10d all-reduce, so that buffer is all-reduced once, between its backward and
    its AdamW. Each rank's fused step draws its own B / N rows (with replacement, so the union is
    distributed as one draw of B rows). The finiteness check runs again on the averaged gradient, which
    every rank shares, so all ranks diverge together."""

    def __init__(self, params: Sequence[nn.Parameter], device: torch.device, world_size: int) -> None:
        device_ids = [torch.cuda.current_device()] if device.type == "cuda" else None
        self.ddp = DistributedDataParallel(
            _GradientCarrier(params), device_ids=device_ids, find_unused_parameters=False
        )
        self.arm_input = torch.zeros((), device=device)
        self.world_size = world_size

    def arm_autograd(self) -> None:
        self.ddp(self.arm_input)

    def average_flat(self, flat_grads: Tensor) -> None:
        dist.all_reduce(flat_grads)
        flat_grads.div_(self.world_size)
        if not bool(torch.isfinite(flat_grads).all()):
            raise Diverged(
                "the averaged gradient became non-finite; the weights of the last good iteration were kept"
            )


@dataclass
class DistributedTrainingJob(TrainingJob):
    """A :class:`TrainingJob` whose steps average their gradients across the ranks (its
    ``gradient_averaging`` is a :class:`RankAveraging`) and which, every ``agree_every`` steps, agrees
    with the other ranks on stop, interrupt and the logged loss."""

    rank_context: RankContext | None = None

    def _context(self) -> RankContext:
        if self.rank_context is None:
            raise ScaleOutError("DistributedTrainingJob used without scale_out_job")
        return self.rank_context

    def advance(self, iteration: int) -> None:
        """The story's step: :meth:`step` (scale-out reads its numbers every step: the averaged gradient's
        check and, every ``agree_every`` steps, the ranks' agreement)."""
        self.step(iteration)

    def step(self, iteration: int) -> float:
        """One DDP step; every ``agree_every``-th step also one small all-reduce on which the ranks agree
        on stop, interrupt and a failure of rank 0's link, and average the smoothed loss (what a
        1-process run would log). Raises :class:`RankLost` when a peer is gone.

        :class:`Diverged` passes through unchanged: train_step checks the gradient norm after DDP averaged
        the gradients, so every rank sees the same norm and diverges at the same step. A rank that
        diverged alone would leave, and the others would see it as a lost rank.
        """
        ctx = self._context()
        state = ctx.state
        with state.stepping():
            try:
                super().step(iteration)
            except RuntimeError as error:
                if is_collective_failure(error):
                    raise ctx.lost(error, iteration) from error
                raise
            state.iterations_done = iteration + 1
            if (iteration + 1) % ctx.agree_every:
                return self.smoothed_loss
            failure: BaseException | None = None
            game_stop = False
            if ctx.poll_game is not None:
                try:
                    game_stop = ctx.poll_game()
                except Exception as error:  # the game is gone: every rank stops, rank 0 re-raises
                    failure = error
            abort = int(exit_code_for(failure)) + 1 if failure is not None else 0
            loss = self.smoothed_loss if math.isfinite(self.smoothed_loss) else 0.0
            flags = [float(game_stop), float(ctx.local_interrupt()), float(abort), loss]
            check = weights_checksum(self.model.trainable_parameters()).to(torch.float64)
            votes = torch.cat(
                (torch.tensor(flags, dtype=torch.float64, device=self.device), check, check * check)
            )
            try:
                dist.all_reduce(votes)
            except RuntimeError as error:
                if is_collective_failure(error):
                    raise ctx.lost(error, iteration) from error
                raise
            stops, interrupts, aborts, loss_sum, check_sum, check_sq = votes.tolist()
        if int(check_sum) ** 2 != ctx.env.world_size * int(check_sq):
            # Every rank applies the same averaged update, so the weights are bitwise equal; a difference
            # means a step did not average its gradients. The sums are shared, so every rank stops here.
            message = (
                f"scale-out: the training processes' weights differ after iteration {iteration + 1}: a step did "
                "not average its gradients (a bug: please report it with the log)"
            )
            state.lost, state.lost_code = message, int(ExitCode.INTERNAL)
            raise ReplicasDiffer(message)
        if aborts > 0:
            if failure is not None:
                raise failure
            raise ScaleOutError(
                "scale-out: rank 0 lost the game and ended the run; this rank stops too",
                ExitCode(int(aborts) - 1),
            )
        state.game_stop = state.game_stop or stops > 0
        state.interrupted = state.interrupted or interrupts > 0
        if math.isfinite(self.smoothed_loss):
            self.smoothed_loss = loss_sum / ctx.env.world_size
        return self.smoothed_loss


CHECKSUM_MODULUS = 1 << 20
"""The weights' checksum is kept below 2**20 so that its square summed over ranks stays an exact integer
in float64 (up to 8192 ranks)."""


def weights_checksum(params: Iterator[nn.Parameter]) -> Tensor:
    """(1,) int64 on the parameters' device: the sum of every weight's float32 bit pattern, mod 2**20
    (no host sync)."""
    total: Tensor | None = None
    for p in params:
        bits = p.detach().contiguous().view(torch.int32).sum(dtype=torch.int64)
        total = bits if total is None else total + bits
    if total is None:
        return torch.zeros(1, dtype=torch.int64)
    return torch.remainder(total, CHECKSUM_MODULUS).reshape(1)


def _state_skeleton(job: TrainingJob) -> tuple[dict[str, Any], list[Tensor]]:
    """JSON description of rank 0's start state and the tensors to broadcast after it, in order."""
    model_state = job.model.state_dict()
    tensors: list[Tensor] = list(model_state.values())
    skeleton: dict[str, Any] = {
        "start_iteration": job.start_iteration,
        "smoothed_loss": job.smoothed_loss if math.isfinite(job.smoothed_loss) else None,
        "total_iterations": job.total_iterations,
        "sample_num": job.sample_num,
        "model": [[name, str(t.dtype), list(t.shape)] for name, t in model_state.items()],
        "optimizer": None,
    }
    optimizer_state = job.optimizer.state_dict()
    if optimizer_state["state"]:  # only after a resume: a fresh AdamW has no state yet
        entries = []
        for index, values in sorted(optimizer_state["state"].items()):
            items = []
            for key, value in sorted(values.items()):
                if isinstance(value, Tensor):
                    items.append(
                        [
                            key,
                            {
                                "dtype": str(value.dtype),
                                "shape": list(value.shape),
                                "device": value.device.type,
                            },
                        ]
                    )
                    tensors.append(value)
                else:
                    items.append([key, value])
            entries.append([index, items])
        skeleton["optimizer"] = {"param_groups": optimizer_state["param_groups"], "state": entries}
    try:
        json.dumps(skeleton)
    except (TypeError, ValueError) as error:
        raise ScaleOutError(f"the start state cannot be shared between ranks as JSON: {error}") from None
    return skeleton, tensors


def sync_start_state(job: TrainingJob, ctx: RankContext) -> None:
    """Every rank starts from rank 0's model, EMA, optimiser state, iteration and loss.

    [INF] Done always, not only after a resume: the latent statistics are measured per rank, and on
    different GPUs they may differ in the last bit; training must start from one state."""
    channel = ctx.channel
    if ctx.env.leader:
        skeleton, tensors = _state_skeleton(job)
        channel.send(FrameKind.STATE, (0, 0, 0), [json.dumps(skeleton).encode()])
        for tensor in tensors:
            channel.tensor(tensor)
        return
    _, payload = channel.receive(FrameKind.STATE, MAX_STATE_BYTES)
    skeleton = json.loads(payload.numpy().tobytes())
    mine, _ = _state_skeleton(job)
    for key in ("total_iterations", "sample_num", "model"):
        if skeleton[key] != mine[key]:
            raise ScaleOutError(
                f"rank {ctx.env.rank} built a different job than rank 0 ({key}: {mine[key]!r:.200} vs "
                f"{skeleton[key]!r:.200}); every rank must run the same la-trainer and torch versions"
            )
    model_state = job.model.state_dict()
    for tensor in model_state.values():
        channel.tensor(tensor)  # state_dict() tensors share storage with the model: updated in place
    job.model.load_state_dict(model_state)  # refreshes the EMA step counter from its buffer
    if skeleton["optimizer"] is not None:
        state: dict[int, dict[str, Any]] = {}
        for index, items in skeleton["optimizer"]["state"]:
            entry: dict[str, Any] = {}
            for key, value in items:
                if isinstance(value, dict) and set(value) == {"dtype", "shape", "device"}:
                    dtype = _DTYPES.get(value["dtype"])
                    if dtype is None:
                        raise ScaleOutError(f"optimizer state dtype {value['dtype']} is not supported")
                    device = job.device if value["device"] != "cpu" else torch.device("cpu")
                    tensor = torch.empty(value["shape"], dtype=dtype, device=device)
                    channel.tensor(tensor)
                    entry[key] = tensor
                else:
                    entry[key] = value
            state[int(index)] = entry
        job.optimizer.load_state_dict({"state": state, "param_groups": skeleton["optimizer"]["param_groups"]})
    job.start_iteration = int(skeleton["start_iteration"])
    loss = skeleton["smoothed_loss"]
    job.smoothed_loss = math.nan if loss is None else float(loss)


def scale_out_job(job: TrainingJob, ctx: RankContext) -> DistributedTrainingJob:
    """Make ``job`` one rank of the data-parallel job (collective: every rank calls it once).

    Start state from rank 0; a :class:`ShardSampler` over the global batch (index stream seeded with
    ``derive_seed(seed, start, 0)`` on every rank); flow noise and times from
    ``derive_seed(seed, start, 1 + rank)``; DDP over the trainable parameters; CPU threads split among the
    node's ranks.
    """
    env = ctx.env
    if (
        job.device.type == "cuda"
        and torch.cuda.is_available()
        and env.local_rank >= torch.cuda.device_count()
    ):
        raise ScaleOutError(
            f"{env.local_world_size} processes on this node but only {torch.cuda.device_count()} GPU(s): "
            "use --nproc-per-node <= the GPU count (NCCL needs one GPU per process)",
            ExitCode.USAGE,
        )
    try:
        sync_start_state(job, ctx)
        averaging = RankAveraging(list(job.model.trainable_parameters()), job.device, env.world_size)
    except RuntimeError as error:
        if is_collective_failure(error):
            who = ctx.peer_failure() or f"another training process stopped answering ({first_line(error)})"
            raise ScaleOutError(f"scale-out: {who} while the ranks prepared", ExitCode.PEER_GONE) from error
        raise
    training = job.config.trainer.training
    start = job.start_iteration
    index_generator = torch.Generator(device=job.device)
    index_generator.manual_seed(derive_seed(training.seed, start, 0))
    job.generator.manual_seed(derive_seed(training.seed, start, 1 + env.rank))
    sampler = ShardSampler(job.tensors, training.batch_size, env.rank, env.world_size, index_generator)
    values = {f.name: getattr(job, f.name) for f in fields(job) if f.init}
    # Held-out measurements (trainer.training.heldout) on rank 0 only: every rank holds the same split (seeded by
    # the config), the others would only repeat rank 0's numbers. They read the weights, never the
    # training stream, so the ranks stay in step; the others wait in their next collective meanwhile.
    heldout = job.heldout if env.leader else None
    scaled = DistributedTrainingJob(
        **{**values, "sampler": sampler, "gradient_averaging": averaging, "heldout": heldout},
        rank_context=ctx,
    )
    for f in fields(job):
        if not f.init:
            setattr(scaled, f.name, getattr(job, f.name))
    if job.device.type == "cpu":
        share = max(1, (os.cpu_count() or 1) // max(1, env.local_world_size))
        torch.set_num_threads(min(torch.get_num_threads(), share))
    ctx.state.job = scaled
    ctx.state.iterations_done = start
    if env.leader:
        log(
            f"la-trainer: scale-out: {env.world_size} processes, global batch {training.batch_size} = "
            f"{env.world_size} x {sampler.batch_size}, backend {dist.get_backend()}"
        )
    return scaled
