"""Shared test builders."""

from __future__ import annotations

import numpy as np
import torch

from emulator.tasks import continuous_action_schema, continuous_observation_schema
from protocol.engine.networks import build_flow_matching_networks
from protocol.schema import parse_schema
from trainer.training.data import TrainingData
from trainer.training.model import FlowModel, ModelSettings

OBS = parse_schema(continuous_observation_schema(6), "observation")


ACT = parse_schema(continuous_action_schema(2), "action")


BATCH = 32


def engine_model(
    *, chunk: int = 1, activation: str = "ELU", layers: int = 1, ema: float = 0.99, seed: int = 5
) -> tuple[FlowModel, TrainingData]:
    """The engine's networks for a Continuous(6) → Continuous(2) task (encoder = one Denormalize) on data
    at raw scales far from unit (observations ~ 40 + 9·N, actions ~ −2 + 3·N)."""
    rng = np.random.default_rng(seed)
    steps = 300
    obs = (40.0 + 9.0 * rng.standard_normal((steps, 6))).astype(np.float32)
    act = (-2.0 + 3.0 * np.tanh(obs[:, :2] - 40.0) + rng.standard_normal((steps, 2))).astype(np.float32)
    data = TrainingData.from_arrays([0, 120, 200], [120, 80, 100], obs, act, chunk)
    nets = build_flow_matching_networks(OBS, ACT, chunk, layers, 24, activation, seed)
    model = FlowModel.from_networks(
        nets.denoiser.model,
        nets.encoder.model,
        nets.decoder.model,
        OBS,
        ACT,
        ModelSettings(chunk_size=chunk, ema_decay=ema),
        data,
    )
    return model, data


def everything(model: FlowModel, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Weights, buffers, EMA and every AdamW state tensor, cloned."""
    out = {k: v.detach().clone() for k, v in model.state_dict().items()}
    params = optimizer.param_groups[0]["params"]
    for i, p in enumerate(params):
        for key, value in optimizer.state[p].items():
            out[f"adam.{i}.{key}"] = torch.as_tensor(value).clone()
    return out


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], *, exact: bool) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if exact:
            assert torch.equal(a[key], b[key]), key
        else:
            torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=2e-6, msg=key)
