"""Shared test builders."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

from protocol.engine.networks import build_decoder, build_denoiser, build_encoder
from protocol.nne.layers import Layer
from protocol.nne.reference import evaluate
from protocol.schema import SchemaNode, parse_schema
from tests.support.schemas import cont
from trainer.training.data import TrainingData
from trainer.training.flow import TimeDistribution
from trainer.training.model import FlowModel, ModelSettings
from trainer.training.steps.autograd import BatchSampler, make_optimizer, train_step


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """These networks are tiny: one intra-op thread is faster, and on a shared 2-core machine a second
    spinning thread makes them many times slower."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


OBS_WIDTH = 17


ACTION_WIDTH = 3


DISCRETE = slice(8, 11)


def make_replay(seed: int = 0, steps: int = 240) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(starts, lengths, observations (S, 17), actions (S, 3)) with a zero-length, a 1-step and a gap."""
    rng = np.random.default_rng(seed)
    obs = (100.0 + 50.0 * rng.standard_normal((steps, OBS_WIDTH))).astype(np.float32)
    obs[:, DISCRETE] = np.eye(3, dtype=np.float32)[rng.integers(0, 3, steps)]
    signal = np.tanh((obs[:, [0, 1, 12]] - 100.0) / 50.0)
    actions = (-3.0 + 7.0 * (0.7 * signal + 0.3 * rng.standard_normal((steps, ACTION_WIDTH)))).astype(
        np.float32
    )
    lengths = [60, 0, 1, 37, 80, 52]
    starts = [0, 60, 60, 63, 100, 180]  # steps 61-62 in no episode
    assert starts[-1] + lengths[-1] <= steps
    return np.array(starts), np.array(lengths), obs, actions


def make_networks(chunk: int, hidden: int = 32, seed: int = 0) -> tuple[Layer, Layer, Layer]:
    """(denoiser, encoder, decoder) as the engine builds them (protocol.engine.networks)."""
    encoder = build_encoder(OBS_SCHEMA, np.random.default_rng(seed))
    decoder = build_decoder(ACTION_SCHEMA, chunk)
    denoiser = build_denoiser(
        encoder.output_size, decoder.input_size, 1, hidden, "ELU", np.random.default_rng(seed + 1)
    )
    return denoiser, encoder, decoder


def make_model(
    embed: bool,
    latents: bool,
    chunk: int,
    ema: float = 0.0,
    networks: tuple[Layer, Layer, Layer] | None = None,
) -> tuple[FlowModel, TrainingData]:
    starts, lengths, obs, actions = make_replay()
    data = TrainingData.from_arrays(starts, lengths, obs, actions, chunk)
    denoiser, encoder, decoder = networks or make_networks(chunk)
    settings = ModelSettings(
        embed_normalizations=embed, normalize_latents=latents, chunk_size=chunk, ema_decay=ema
    )
    return FlowModel.from_networks(
        denoiser, encoder, decoder, OBS_SCHEMA, ACTION_SCHEMA, settings, data
    ), data


def train(
    model: FlowModel, data: TrainingData, steps: int, seed: int = 0, lr: float = 3e-3, noise: float = 0.0
) -> list[float]:
    generator = torch.Generator().manual_seed(seed)
    sampler = BatchSampler(model.tensor_data(data), 64, generator)
    optimizer = make_optimizer(model, lr, 1e-4)
    return [
        train_step(model, optimizer, sampler.next(), generator, TimeDistribution.uniform(), noise, i).loss
        for i in range(steps)
    ]


def engine_actions(
    denoiser: Layer, encoder: Layer, decoder: Layer, obs: np.ndarray, x0: np.ndarray, steps: int
) -> np.ndarray:
    """Spec §6.4 with the numpy reference: e = Encoder(obs); x ← x + dt·Denoiser([e ‖ x ‖ t]); Decoder(x)."""
    e = evaluate(encoder, obs)
    x = x0.astype(np.float32)
    dt = np.float32(1.0 / steps)
    for k in range(steps):
        t = np.full((obs.shape[0], 1), np.float32(k) * dt, dtype=np.float32)
        x = (x + dt * evaluate(denoiser, np.hstack([e, x, t]))).astype(np.float32)
    return evaluate(decoder, x)


OBS_SCHEMA: SchemaNode = parse_schema(
    {
        "Type": "And",
        "VectorSize": 17,
        "EncodedSize": 19,
        "Elements": {
            "pos": cont(2, "AutoPerDimension", 0),
            "items": {
                "Type": "Array",
                "VectorSize": 6,
                "EncodedSize": 6,
                "Num": 3,
                "Element": cont(2, "AutoShared"),
                "Index": 1,
            },
            "kind": {"Type": "DiscreteExclusive", "VectorSize": 3, "EncodedSize": 3, "Num": 3, "Index": 2},
            "gain": cont(3, "AutoDimensionAverage", 3),
            "raw": cont(1, "Manual", 4),
            "enc": {
                "Type": "Encoding",
                "VectorSize": 2,
                "EncodedSize": 4,
                "EncodingSize": 4,
                "Element": cont(2, "AutoPerDimension"),
                "Index": 5,
            },
        },
    },
    "observation",
)


ACTION_SCHEMA: SchemaNode = parse_schema(
    {
        "Type": "And",
        "VectorSize": 3,
        "EncodedSize": 6,
        "DistributionSize": 6,
        "ModifierSize": 9,
        "Elements": {
            "move": cont(2, "AutoPerDimension", 0, "action"),
            "turn": cont(1, "AutoShared", 1, "action"),
        },
    },
    "action",
)
