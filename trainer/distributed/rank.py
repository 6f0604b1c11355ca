"""One rank of the job, start to end: process group, rank context and watchdog, then rank 0's story with
the game or the other ranks' story over the broadcasts, then the published outcome."""

from __future__ import annotations

import contextlib
import io
import os
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.distributed.rendezvous import rendezvous

from trainer.distributed.environment import (
    DEFAULT_AGREE_EVERY,
    DEFAULT_STALL_S,
    DEFAULT_TIMEOUT_S,
    DistEnv,
    env_int,
    float_env,
    select_backend,
)
from trainer.distributed.errors import first_line, is_collective_failure
from trainer.distributed.frames import RankChannel
from trainer.distributed.job import scale_out_job
from trainer.distributed.links import BroadcastLink, Rank0Link
from trainer.distributed.state import PEER_GRACE_S, ConsensusInterrupt, RankContext
from trainer.distributed.watchdog import Watchdog
from trainer.errors import exit_code_for
from trainer.exitcodes import ExitCode
from trainer.session.app import InterruptFlag, run_with_link
from trainer.settings.environment import ENV_AGREE, ENV_BACKEND, ENV_STALL, ENV_TIMEOUT
from trainer.settings.options import TrainerOptions
from trainer.settings.timeouts import Timeouts
from trainer.system.console import log, log_error

if TYPE_CHECKING:
    from trainer.session.links import TrainerLink

__all__ = ["run_rank"]


def _training(
    ctx: RankContext, options: TrainerOptions, task_dir: Path | None
) -> Callable[[Any, InterruptFlag], int]:
    """The story each rank runs inside :func:`trainer.session.app.run_with_link`."""

    def train(link: Any, flag: InterruptFlag) -> int:
        from trainer.session.run import run_training

        ctx.local_interrupt = flag.is_set
        try:
            result = run_training(
                link,
                options=options,
                task_dir=task_dir,
                interrupt=ConsensusInterrupt(ctx.state),
                prepare_job=lambda job: scale_out_job(job, ctx),
                timeouts=ctx.timeouts,
            )
        except BaseException as error:
            if not ctx.env.leader and not ctx.state.lost:
                # Tell rank 0 why, before this process ends and its collectives fail.
                ctx.publish(f"failed/{ctx.env.rank}", int(exit_code_for(error)), first_line(error))
                ctx.state.failure_published = True
            raise
        if ctx.state.lost:
            where = "; the game got the last good networks and Complete" if ctx.env.leader else ""
            log_error(f"la-trainer: {ctx.state.lost}{where}.")
            return ctx.state.lost_code
        return int(result)

    return train


def _leader_runner(ctx: RankContext) -> Callable[..., int]:
    """What :func:`trainer.dropin.engine.engine_main` calls on rank 0 once argv and options are valid."""

    def runner(
        open_link: Callable[[InterruptFlag], TrainerLink], *, options: TrainerOptions, task_dir: Path | None
    ) -> int:
        if options.device.lower().startswith("cuda:"):
            # Each rank trains on its own GPU (cuda:LOCAL_RANK, set at start); a fixed index would put
            # every rank on one GPU, which NCCL refuses.
            log(
                f"la-trainer: warning: scale-out ignores the device override {options.device!r}; using cuda:LOCAL_RANK"
            )
            options = replace(options, device="cuda")
        ctx.channel.options(options)
        return run_with_link(
            lambda flag: Rank0Link(open_link(flag), ctx),
            options=options,
            task_dir=task_dir,
            training=_training(ctx, options, task_dir),
        )

    return runner


def _follower_main(ctx: RankContext) -> int:
    options = ctx.channel.options()
    return run_with_link(
        lambda flag: BroadcastLink(ctx),
        options=replace(options, status_file=False),
        task_dir=None,
        training=_training(ctx, options, None),
    )


def run_rank(
    env: DistEnv,
    leader: Callable[[Callable[..., int]], int],
    *,
    init_method: str = "env://",
) -> int:
    """One rank of the job, start to end; returns its exit code.

    ``leader(runner)`` runs rank 0's side: production passes ``lambda r: engine_main(argv, runner=r)``;
    tests call ``runner(open_link, options=..., task_dir=...)`` with an in-memory game link.
    """
    timeouts = Timeouts.from_env()
    # The other ranks wait in their first broadcast until rank 0 has the game's data, and in collectives
    # while rank 0 waits for a paused game: the bound is a last resort (DEFAULT_TIMEOUT_S).
    timeout = timedelta(seconds=float_env(ENV_TIMEOUT, DEFAULT_TIMEOUT_S))
    stall = float_env(ENV_STALL, DEFAULT_STALL_S)
    agree_every = env_int(os.environ, ENV_AGREE, 1) or DEFAULT_AGREE_EVERY
    cuda = torch.cuda.is_available()
    if cuda and env.local_rank < torch.cuda.device_count():
        torch.cuda.set_device(env.local_rank)
    store, _, _ = next(
        iter(rendezvous(init_method, rank=env.rank, world_size=env.world_size, timeout=timeout))
    )
    backend = select_backend(cuda, os.environ.get(ENV_BACKEND, ""))
    dist.init_process_group(backend, store=store, rank=env.rank, world_size=env.world_size, timeout=timeout)
    ctx = RankContext(
        env=env,
        channel=RankChannel(lambda t: dist.broadcast(t, src=0), leader=env.leader),
        store=store,
        agree_every=agree_every,
        timeouts=timeouts,
    )
    if not env.leader:
        # Rank 0 alone logs (the engine copies our stdout into its log); errors still go to stderr.
        sys.stdout = io.TextIOWrapper(open(os.devnull, "wb"), write_through=True)
    watchdog = Watchdog(ctx, stall).start()
    code = int(ExitCode.INTERNAL)
    try:
        code = leader(_leader_runner(ctx)) if env.leader else _follower_main(ctx)
    except Exception as error:  # outside run_with_link: the options frame, a collective at the start
        code, why = int(exit_code_for(error)), str(error)
        if is_collective_failure(error):
            code, why = int(ExitCode.PEER_GONE), ctx.peer_failure() or first_line(error)
            ended = None if env.leader else ctx.wait_read("outcome", PEER_GRACE_S)
            if ended is not None:  # rank 0 could not start (bad command line, no game): follow it
                code, why = ended[0], f"rank 0 ended (exit code {ended[0]}): {ended[1]}"
        log_error(f"la-trainer[rank {env.rank}]: scale-out could not start: {why}")
    finally:
        watchdog.stop()
        if env.leader:
            message = ctx.state.lost or ("finished" if code == 0 else "it ended with an error (see its log)")
            ctx.publish("outcome", code, message)
            if not env.agent_store:
                _wait_for_ranks(ctx, 10.0)  # we host the store: let the others read the outcome first
        else:
            if code != 0 and not ctx.state.failure_published and not ctx.state.lost:
                ctx.publish(f"failed/{env.rank}", code, "see its log")
            ctx.publish(f"done/{env.rank}", code, "")
        if not ctx.state.lost:
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
    return code


def _wait_for_ranks(ctx: RankContext, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    pending = set(range(1, ctx.env.world_size))
    while pending and time.monotonic() < deadline:
        for rank in list(pending):
            if ctx.read_or_none(f"done/{rank}") is not None:
                pending.discard(rank)
        time.sleep(0.05)
