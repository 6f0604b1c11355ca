"""B4: B3's pendulum seen through a structured observation, the check that encoders with weights train.

The world, expert and metrics are B3's (:mod:`emulator.tasks.pendulum`). The observation is B3's three
values (cos θ, sin θ, ω/8) followed by :data:`DISTRACTOR_NUM` distractor channels, N(0, 1) noise drawn
afresh every step, that carry nothing the expert uses: the game's sensors report more than the task
needs. It comes in two schemas over the same vector:

* :data:`OBSERVATION_SCHEMA`: an ``Encoding`` (EncodingSize :data:`ENCODING_SIZE`) of one Continuous
  leaf, so the engine builds an encoder MLP (spec §6.3: ``Sequence[leaf, MLP]``) whose
  :data:`ENCODING_SIZE` outputs are all the denoiser sees. A frozen, randomly initialised encoder mixes
  the three useful values into noise-dominated features it cannot unmix (fewer outputs than inputs), so
  the policy loses what it needs; a trained one learns to keep them.
* :data:`FLAT_OBSERVATION_SCHEMA`: the same vector as one Continuous leaf (the encoder is an identity
  slot), the reference score a trained encoder should reach.

Evaluation (:func:`evaluate_policy`) draws the distractors from their own stream of the evaluation seed,
so every policy sees the same ones.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from emulator.tasks import (
    Demonstrations,
    FloatArray,
    Policy,
    TaskSpec,
    continuous_observation_schema,
    pendulum,
    task_rng,
)

__all__ = [
    "ACTION_SCHEMA",
    "DEMO_NUM",
    "DISTRACTOR_NUM",
    "ENCODING_SIZE",
    "EVAL_EPISODE_NUM",
    "FLAT_OBSERVATION_SCHEMA",
    "OBSERVATION_SCHEMA",
    "OBS_DIM",
    "TASK",
    "evaluate_policy",
    "make_demonstrations",
    "with_distractors",
]

DISTRACTOR_NUM = 13
"""Noise channels after B3's three values (16 observation floats in all)."""
OBS_DIM = pendulum.OBS_DIM + DISTRACTOR_NUM
ENCODING_SIZE = 8
"""The Encoding's output width: fewer than the 16 inputs, so a random map cannot keep them all."""
DEMO_NUM = pendulum.DEMO_NUM
EVAL_EPISODE_NUM = pendulum.EVAL_EPISODE_NUM

FLAT_OBSERVATION_SCHEMA: dict[str, Any] = continuous_observation_schema(OBS_DIM)
OBSERVATION_SCHEMA: dict[str, Any] = {
    "VectorSize": OBS_DIM,
    "EncodedSize": ENCODING_SIZE,
    "Type": "Encoding",
    "EncodingSize": ENCODING_SIZE,
    "Element": continuous_observation_schema(OBS_DIM),
}
ACTION_SCHEMA = pendulum.ACTION_SCHEMA

_DEMO_DISTRACTOR_STREAM = 0xB4_0001
_EVAL_DISTRACTOR_STREAM = 0xB4_0002


def with_distractors(obs: FloatArray, rng: np.random.Generator) -> FloatArray:
    """B3 observations ``(..., 3)`` followed by fresh N(0, 1) distractors: ``(..., 16)`` float32."""
    noise = rng.standard_normal((*obs.shape[:-1], DISTRACTOR_NUM)).astype(np.float32)
    return np.concatenate([obs, noise], axis=-1)


def make_demonstrations(seed: int = 0, demo_num: int = DEMO_NUM) -> Demonstrations:
    """B3's expert episodes of seed ``seed`` with distractors appended to every observation."""
    rng = task_rng(seed, _DEMO_DISTRACTOR_STREAM)
    demos = pendulum.make_demonstrations(seed, demo_num)
    return Demonstrations(tuple((with_distractors(obs, rng), act) for obs, act in demos.episodes))


def evaluate_policy(policy: Policy, seed: int = 0, episode_num: int = EVAL_EPISODE_NUM) -> dict[str, float]:
    """B3's metrics (score, upright, return, ...) of ``policy``, which sees the 16-float observation."""
    rng = task_rng(seed, _EVAL_DISTRACTOR_STREAM)

    def sensed(obs: FloatArray) -> FloatArray:
        return policy(with_distractors(obs, rng))

    return pendulum.evaluate_policy(sensed, seed, episode_num)


TASK = TaskSpec(
    name="sensors",
    observation_schema=OBSERVATION_SCHEMA,
    action_schema=ACTION_SCHEMA,
    make_demonstrations=make_demonstrations,
    evaluate_policy=evaluate_policy,
)
