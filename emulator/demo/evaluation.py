"""Step 3 of the demo: score networks as the game would run them (spec §6.4, benchmark B2).

The last networks the game received run through the engine's inference path (encoder → ``ODEStepsNum``
Euler steps of the denoiser from N(0, I) → decoder, :class:`emulator.inference.EnginePolicy`) in
closed-loop rollouts from the benchmark's fixed start positions.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from emulator.demo.figure import Trajectories
from emulator.demo.plan import EVALUATION_SEED, DemoPlan
from emulator.inference import EnginePolicy
from emulator.tasks import avoid, task_rng

__all__ = ["Evaluation", "evaluate_networks", "evaluation_starts"]

_POLICY_NOISE_STREAM = 0xD3_0000
"""Stream id (plus the step count) of the policy's N(0, I) start noise; distinct from the task's own
streams so the noise never coincides with start positions or demonstrations."""


@dataclass(frozen=True, slots=True, eq=False)
class Evaluation:
    """Closed-loop B2 metrics of one policy, and its trajectories when they were recorded."""

    ode_steps: int
    metrics: dict[str, float]
    trajectories: Trajectories | None
    seconds: float


def evaluation_starts(seed: int, rollout_num: int) -> npt.NDArray[np.float64]:
    """The start positions :func:`emulator.tasks.avoid.evaluate_policy` uses, ``(N, 2)``.

    Needed to record trajectories of the very episodes the metrics count (``evaluate_policy`` keeps no
    trajectories). The stream constant is the task module's; a test pins the equality.
    """
    return avoid.sample_starts(rollout_num, task_rng(seed, avoid._EVAL_START_STREAM))


def evaluate_networks(
    networks: Sequence[bytes], plan: DemoPlan, ode_steps: int, *, record: bool = False
) -> Evaluation:
    """Score snapshots (network-id order: denoiser, encoder, decoder) as the game would run them:
    ``plan.rollout_num`` closed-loop episodes from the benchmark's fixed start positions, each call
    returning a chunk of which ``plan.execute`` steps are executed."""
    denoiser, encoder, decoder = networks[:3]
    policy = EnginePolicy.from_snapshots(encoder, denoiser, decoder, ode_steps)
    rng = task_rng(EVALUATION_SEED, _POLICY_NOISE_STREAM + ode_steps)

    def chunk_fn(idx: npt.NDArray[np.intp], obs: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        return policy.act(obs, rng)

    started = time.perf_counter()
    result = avoid.rollout(
        chunk_fn, evaluation_starts(EVALUATION_SEED, plan.rollout_num), plan.execute, record=record
    )
    seconds = time.perf_counter() - started
    trajectories = Trajectories.from_rollouts(result, plan.plot_num) if record else None
    return Evaluation(ode_steps, result.metrics(), trajectories, seconds)
