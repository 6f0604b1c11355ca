"""Data-parallel training over several processes with ``torchrun`` (PyTorch's c10d and DDP, nothing home-made).

Launch: ``torchrun --nproc-per-node N [--nnodes M ...] -m trainer.distributed <engine argv>`` (commands for
every mode: ``docs/scale-out.md``). ``python -m trainer.distributed`` outside torchrun is the ordinary
trainer, or, with ``LA_TRAINER_NPROC_PER_NODE=N``, re-executes itself under torchrun (engine-spawned mode).

Modules, in the order a run meets them (the entry point, ``python -m trainer.distributed``, is the drop-in's
:mod:`trainer.dropin.scale_out`):
:mod:`~trainer.distributed.environment` (torchrun's variables and ours, seeds, the batch share),
:mod:`~trainer.distributed.rank` (one rank start to end), :mod:`~trainer.distributed.frames` (what rank 0
broadcasts), :mod:`~trainer.distributed.links` (each rank's link), :mod:`~trainer.distributed.job` (the
job on every rank), :mod:`~trainer.distributed.state` (what a rank's threads share),
:mod:`~trainer.distributed.watchdog`, :mod:`~trainer.distributed.errors`.

Roles. Rank 0 alone talks to the game (shared memory or socket): it runs :func:`trainer.session.run.run_training`
over the real link, wrapped in :class:`Rank0Link`, which broadcasts what arrives — our options, the
config, the three snapshots, the replay buffer — to the other ranks as uint8 tensors holding the
protocol's own encodings (JSON, snapshot bytes, the socket replay layout; never pickle). Ranks ≥ 1 run the
same story over a :class:`BroadcastLink` whose sends are no-ops, with no task folder (no snapshot,
checkpoint or status file) and a silent stdout. :func:`scale_out_job` turns each rank's job into a
:class:`DistributedTrainingJob`: same start state on every rank (rank 0's model, EMA and, after a resume,
optimiser state), gradients averaged across ranks, and every 8 steps one small all-reduce that agrees on
stop, interrupt and the logged loss, so every rank leaves the loop at the same iteration.

Equivalence (what is guaranteed). World size 1 runs the ordinary code path unchanged (bitwise identical).
With N ranks the global batch stays the config's ``BatchSize`` (it must divide by N) and every rank
trains on B / N rows of it. Gradients are averaged: by DDP for the autograd step (a trained encoder,
distillation, layers the fused step does not cover), by one all-reduce of the flat gradient buffer for
:class:`trainer.training.steps.fused.FusedStep` (the engine's MLP with a frozen encoder), see
:class:`RankAveraging`. The average of the per-rank mean-loss gradients is the gradient of the mean
loss over the concatenated batch, so given the same rows and noise one N-rank update equals the
1-process update on the whole batch up to float32 summation order (tested on the DDP path: max
|Δparameter| ≤ 1e-6 after three AdamW steps, measured 1.5e-8). Rows: the autograd path takes rank r's
slice of one global draw (:class:`ShardSampler`); the fused path draws B / N rows per rank from the
rank's stream, with replacement, which is distributed as one draw of B rows. Noise and times come from
a per-rank stream (:func:`derive_seed`), so a whole N-rank run is *statistically* equivalent to a
1-process run with the same batch size and seed, not bitwise; the test bounds the final loss difference.
Every agreement also compares a checksum of every rank's weights, which must stay bitwise equal: a step
that did not average its gradients ends the run (:class:`ReplicasDiffer`) instead of training on.

Failures. A rank that raises publishes its message in the rendezvous store; a rank that dies closes
its gloo connections; either way the others' next collective fails and becomes :class:`RankLost`, which
the loop treats like divergence: rank 0 stops, sends the last good networks and Complete (the game sees a
clean end), writes its snapshot and checkpoint, and exits with ``PEER_GONE``. A rank that hangs (or a
collective that never returns, e.g. NCCL after a peer died) is caught by :class:`Watchdog`: after
``LA_TRAINER_DIST_STALL_SECONDS`` without progress, or a few seconds after SIGTERM (torchrun ends the
others when one fails) while stuck, rank 0 sends the networks and Complete from the watchdog thread and
exits. Ranks ≥ 1 follow rank 0's outcome (store key) with its exit code.
"""

from trainer.distributed.environment import (
    DEFAULT_AGREE_EVERY,
    DEFAULT_STALL_S,
    DEFAULT_TIMEOUT_S,
    DistEnv,
    ShardSampler,
    derive_seed,
    local_batch_size,
    select_backend,
)
from trainer.distributed.errors import RankLost, ReplicasDiffer, ScaleOutError, is_collective_failure
from trainer.distributed.frames import (
    CHUNK_BYTES,
    FRAME_HEADER_WORDS,
    FRAME_MAGIC,
    MAX_CONFIG_BYTES,
    MAX_OPTIONS_BYTES,
    MAX_STATE_BYTES,
    FrameKind,
    RankChannel,
    decode_config,
    decode_options,
    encode_config,
    encode_options,
)
from trainer.distributed.job import (
    CHECKSUM_MODULUS,
    DistributedTrainingJob,
    RankAveraging,
    scale_out_job,
    sync_start_state,
)
from trainer.distributed.links import BroadcastLink, Rank0Link
from trainer.distributed.rank import run_rank
from trainer.distributed.state import RankContext, RunState
from trainer.distributed.watchdog import Watchdog

__all__ = [
    "CHECKSUM_MODULUS",
    "CHUNK_BYTES",
    "DEFAULT_AGREE_EVERY",
    "DEFAULT_STALL_S",
    "DEFAULT_TIMEOUT_S",
    "FRAME_HEADER_WORDS",
    "FRAME_MAGIC",
    "MAX_CONFIG_BYTES",
    "MAX_OPTIONS_BYTES",
    "MAX_STATE_BYTES",
    "BroadcastLink",
    "DistEnv",
    "DistributedTrainingJob",
    "FrameKind",
    "Rank0Link",
    "RankAveraging",
    "RankChannel",
    "RankContext",
    "RankLost",
    "ReplicasDiffer",
    "RunState",
    "ScaleOutError",
    "ShardSampler",
    "Watchdog",
    "decode_config",
    "decode_options",
    "derive_seed",
    "encode_config",
    "encode_options",
    "is_collective_failure",
    "local_batch_size",
    "run_rank",
    "scale_out_job",
    "select_backend",
    "sync_start_state",
]
