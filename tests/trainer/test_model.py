"""The training model's key fact: the exported networks, run the engine's way (numpy reference: encoder →
Euler from N(0, I) → decoder, spec §6.4), give the actions of the torch model's own sampler, for every
normalisation placement, chunk size and a schema with And/Array/Encoding/Continuous/Discrete leaves at
non-unit raw scales (observations ~ 100 + 50·N, actions ~ −3 + 7·N)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from protocol.engine.chunks import ChunkLayout
from protocol.engine.networks import build_decoder, build_denoiser, build_encoder
from protocol.nne.codec import structure_key, write_model
from protocol.nne.layers import ELU, Array, Concat, Copy, Denormalize, Layer, Sequence
from protocol.nne.layout import children
from protocol.nne.reference import evaluate
from protocol.schema import parse_schema
from tests.support.models import (
    ACTION_SCHEMA,
    ACTION_WIDTH,
    DISCRETE,
    OBS_WIDTH,
    cont,
    engine_actions,
    make_model,
    make_networks,
    train,
)
from trainer.errors import BadData, Unsupported
from trainer.training.data import TrainingData
from trainer.training.flow import source_spread
from trainer.training.model import FlowModel, ModelSettings

# --------------------------------------------------------------------------------------------------
# Fixtures shared with test_step.py


# --------------------------------------------------------------------------------------------------
# The key test


@pytest.mark.parametrize(
    ("embed", "latents", "chunk"), list(itertools.product([False, True], [False, True], [1, 3]))
)
def test_exported_networks_on_the_engine_path_match_the_torch_sampler(
    embed: bool, latents: bool, chunk: int
) -> None:
    received = make_networks(chunk)
    model, data = make_model(embed, latents, chunk, ema=0.9 if latents else 0.0, networks=received)
    train(model, data, 25, noise=0.1 if embed else 0.0)
    exported = model.export()

    rng = np.random.default_rng(99)
    obs = data.observations[rng.integers(0, data.row_num, 48)]
    x0 = rng.standard_normal((48, ACTION_WIDTH * chunk)).astype(np.float32)
    for steps in (1, 3, 8):
        expected = model.sample(torch.from_numpy(obs), torch.from_numpy(x0), steps).numpy()
        actual = engine_actions(*exported, obs, x0, steps)
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-4)
    assert np.abs(expected).max() > 1.0  # raw action units, not normalised ones

    # Same structure and byte size as received (spec §6.1). The Encoding MLP is trained in both modes;
    # Embed false sends the decoder back as received and the encoder's leaves as received.
    for sent, got in zip(exported, received, strict=True):
        assert structure_key(sent) == structure_key(got)
        assert len(write_model(sent)) == len(write_model(got))
    placement = model.placement
    assert placement.encoder_trained  # the Encoding element holds Linear layers
    assert placement.fitted_source == latents
    assert write_model(exported.encoder) != write_model(received[1])
    if not embed:
        assert exported.decoder is received[2]
        assert _leaves(exported.encoder) == _leaves(received[1])
        assert (placement.observations, placement.actions) == ("denoiser", "denoiser")
    else:
        assert (placement.observations, placement.actions) == ("encoder", "decoder")
        assert _leaves(exported.encoder) != _leaves(received[1])
    assert placement.notes == ()


def _leaves(layer: Layer) -> list[tuple[list[float], list[float]]]:
    """Every Denormalize's (mean, std), depth first."""
    if isinstance(layer, Denormalize):
        return [(layer.mean.tolist(), layer.std.tolist())]
    return [leaf for child in children(layer) for leaf in _leaves(child)]


def test_embed_true_puts_the_statistics_in_the_encoder_and_decoder_leaves() -> None:
    model, data = make_model(True, False, 1)
    exported = model.export()
    encoder, decoder = exported.encoder, exported.decoder
    assert isinstance(encoder, Concat) and isinstance(decoder, Concat)
    pos = encoder.layers[0]
    assert isinstance(pos, Denormalize)
    mu, sigma = data.observations[:, :2].mean(0), data.observations[:, :2].std(0)
    np.testing.assert_allclose(pos.mean, -mu / sigma, rtol=1e-4)
    np.testing.assert_allclose(pos.std, 1 / sigma, rtol=1e-4)
    move = decoder.layers[0]
    assert isinstance(move, Denormalize)
    np.testing.assert_allclose(move.mean, data.step_actions[:, :2].mean(0), rtol=1e-4)
    np.testing.assert_allclose(move.std, data.step_actions[:, :2].std(0), rtol=1e-4)
    # the denoiser trains in normalised action space: x1 has zero mean and unit std (chunk 1)
    x1 = model.tensor_data(data).x1.double()
    torch.testing.assert_close(x1.mean(0), torch.zeros(3, dtype=torch.float64), rtol=0, atol=1e-5)
    torch.testing.assert_close(
        x1.std(0, unbiased=False), torch.ones(3, dtype=torch.float64), rtol=0, atol=1e-5
    )


def test_embed_false_standardises_latents_x_and_velocity_in_the_denoiser() -> None:
    model, data = make_model(False, False, 1)
    z = model.encode(torch.from_numpy(data.observations)).double()
    # every latent column has mean 0 and std 1 (constant ones keep std 1, none here)
    torch.testing.assert_close(z.mean(0), torch.zeros(19, dtype=torch.float64), rtol=0, atol=1e-4)
    torch.testing.assert_close(
        z.std(0, unbiased=False), torch.ones(19, dtype=torch.float64), rtol=0, atol=1e-4
    )
    x1 = data.targets.astype(np.float64)  # decoder is identity: x1 = raw actions
    mu, var = x1.mean(0), x1.var(0)
    np.testing.assert_allclose(model.v_mean.numpy(), mu, rtol=1e-5)
    np.testing.assert_allclose(model.v_std.numpy(), np.sqrt(var + 1), rtol=1e-5)
    np.testing.assert_allclose(model.x_mean.numpy(), mu / 2, rtol=1e-5)
    np.testing.assert_allclose(model.x_std.numpy(), np.sqrt(1 / 3 + var / 3 + mu**2 / 12), rtol=1e-5)


def test_reimporting_an_export_continues_from_the_same_function() -> None:
    model, data = make_model(False, False, 1)
    train(model, data, 20)
    first = model.export()
    again, _ = make_model(False, False, 1, networks=(first.denoiser, first.encoder, first.decoder))
    assert any("un-folded" in note for note in again.placement.notes)
    second = again.export()
    rng = np.random.default_rng(5)
    e = evaluate(first.encoder, data.observations[:32])
    # the Encoding MLP held the observation statistics; they were un-folded and moved out again
    np.testing.assert_allclose(evaluate(second.encoder, data.observations[:32]), e, rtol=1e-4, atol=1e-4)
    x = np.hstack([e, rng.standard_normal((32, 3)) * 7 - 3, rng.random((32, 1))]).astype(np.float32)
    np.testing.assert_allclose(
        evaluate(second.denoiser, x), evaluate(first.denoiser, x), rtol=1e-4, atol=1e-4
    )


@pytest.mark.parametrize("embed", [False, True])
def test_chunk_targets_are_leaf_major_and_decode_back_into_the_recorded_steps(embed: bool) -> None:
    # And(move 2, turn 1) with chunk 3: the engine's decoder is Concat(Denormalize(6), Denormalize(3)).
    model, data = make_model(embed, False, 3)
    x1 = model.tensor_data(data).x1.numpy()
    decoded = evaluate(model.export().decoder, x1)
    layout = ChunkLayout.from_schema(ACTION_SCHEMA, 3)
    assert not layout.is_identity
    steps = layout.to_steps(decoded)
    np.testing.assert_allclose(steps, data.targets.reshape(-1, 3, ACTION_WIDTH), rtol=1e-5, atol=1e-4)


def test_embed_false_sends_a_weightless_encoder_back_byte_identical() -> None:
    obs_schema = parse_schema(cont(3, "AutoPerDimension"), "observation")
    action_schema = parse_schema(cont(2, "AutoPerDimension", role="action"), "action")
    rng = np.random.default_rng(4)
    obs = (50 + 20 * rng.standard_normal((80, 3))).astype(np.float32)
    data = TrainingData.from_arrays([0], [80], obs, rng.standard_normal((80, 2)).astype(np.float32), 1)
    encoder, decoder = build_encoder(obs_schema, rng), build_decoder(action_schema, 1)
    denoiser = build_denoiser(3, 2, 0, 8, "ELU", rng)
    model = FlowModel.from_networks(
        denoiser, encoder, decoder, obs_schema, action_schema, ModelSettings(), data
    )
    assert not model.placement.encoder_trained
    train(model, data, 5)
    exported = model.export()
    assert write_model(exported.encoder) == write_model(encoder)
    assert write_model(exported.decoder) == write_model(decoder)


def test_embed_false_moves_the_statistics_into_the_encoding_mlp() -> None:
    received = make_networks(1)
    model, data = make_model(False, False, 1, networks=received)
    train(model, data, 10)
    exported = model.export()
    # the Encoding (last element) is Sequence[Denormalize leaf, MLP]: the leaf as received, the MLP's first
    # Linear holds the statistics; its output over the data is what training's encoder computes
    enc_sent, enc_received = exported.encoder.layers[5], received[1].layers[5]  # type: ignore[attr-defined]
    assert _leaves(enc_sent) == _leaves(enc_received)
    trained = model.encoder(torch.from_numpy(data.observations)).detach().numpy()[:, -4:]
    np.testing.assert_allclose(evaluate(enc_sent, data.observations[:, -2:]), trained, rtol=1e-4, atol=1e-5)


def test_normalize_latents_fits_the_source_to_the_data() -> None:
    model, data = make_model(False, True, 3)
    x1 = model.tensor_data(data).x1.double()
    torch.testing.assert_close(model.source_std.double(), x1.std(0, unbiased=False), rtol=1e-5, atol=0)
    assert model.source_std.min() > 3.0  # raw action units (Embed false): far from N(0, 1)
    plain, _ = make_model(False, False, 3)
    assert torch.equal(plain.source_std, torch.ones(9)) and not plain.fitted_source
    # the training pair is the fitted-source path (trainer.training.flow.interpolate_fitted)
    g = torch.Generator().manual_seed(0)
    x0, t = torch.randn((16, 9), generator=g), torch.rand((16, 1), generator=g)
    path = model.flow_path(x0, model.tensor_data(data).x1[:16], t)
    s = (1 - t) * model.source_std + t
    torch.testing.assert_close(path.x_t * s, (1 - t) * model.source_std * x0 + t * x1[:16].float())


def test_the_late_time_spread_widens_the_source_of_the_training_path() -> None:
    model, data = make_model(True, False, 1)
    assert model.spread == (0.0, 0.0)
    model.spread = (0.6, 5.0)
    g = torch.Generator().manual_seed(3)
    x0, t = torch.randn((64, 3), generator=g), torch.rand((64, 1), generator=g)
    x1 = model.tensor_data(data).x1[:64]
    path = model.flow_path(x0, x1, t)
    widened = x0 * source_spread(t, 0.6, 5.0)
    torch.testing.assert_close(path.target, x1 - widened)
    torch.testing.assert_close(path.x_t, (1 - t) * widened + t * x1)
    early = (t < 0.6).squeeze(1)
    torch.testing.assert_close(path.target[early], (x1 - x0)[early])
    with pytest.raises(ValueError):
        ModelSettings(spread_start=1.0)


def test_observation_noise_covers_continuous_columns_with_a_random_magnitude_per_row() -> None:
    # Encoding in the schema: the encoder is trained, so the noise goes on the observations (O columns)
    model, data = make_model(True, False, 1)
    assert not model.noise_on_latents and model.noise_std.shape == (OBS_WIDTH,)
    assert torch.all(model.noise_std[DISCRETE] == 0) and torch.all(model.noise_std[: DISCRETE.start] > 0)
    obs_std = torch.from_numpy(data.observations).double().std(0, unbiased=False)
    torch.testing.assert_close(model.noise_std[:2].double(), obs_std[:2], rtol=1e-4, atol=0)
    # per row: m ~ U[0, scale), so the row RMS of noise/noise_std spreads over [0, scale)
    scale, rows = 0.5, 4000
    noise = model.observation_noise(rows, scale, torch.Generator().manual_seed(1))
    live = model.noise_std > 0
    rms = (noise[:, live] / model.noise_std[live]).pow(2).mean(1).sqrt()
    assert torch.all(noise[:, ~live] == 0)
    # a fixed magnitude would put no row below 0.1·scale (rms ~ scale·chi_k/sqrt(k), k = 14 columns)
    assert 0.05 < (rms < 0.1 * scale).double().mean().item() < 0.2
    assert abs(rms.mean().item() - scale / 2) < 0.1 * scale


def test_observation_noise_of_a_flat_encoder_goes_on_the_latents_in_standardised_units() -> None:
    obs_schema = parse_schema(
        {
            "Type": "And",
            "VectorSize": 5,
            "EncodedSize": 5,
            "Elements": {
                "a": cont(2, "AutoPerDimension", 0),
                "k": {"Type": "DiscreteExclusive", "VectorSize": 3, "EncodedSize": 3, "Num": 3, "Index": 1},
            },
        },
        "observation",
    )
    action_schema = parse_schema(cont(1, "AutoShared", role="action"), "action")
    rng = np.random.default_rng(3)
    obs = np.hstack([40 + 9 * rng.standard_normal((60, 2)), np.eye(3)[rng.integers(0, 3, 60)]])
    data = TrainingData.from_arrays(
        [0], [60], obs.astype(np.float32), rng.standard_normal((60, 1)).astype(np.float32), 1
    )
    for embed in (False, True):
        model = FlowModel.from_networks(
            build_denoiser(5, 1, 0, 8, "ELU", rng),
            build_encoder(obs_schema, rng),
            build_decoder(action_schema, 1),
            obs_schema,
            action_schema,
            ModelSettings(embed_normalizations=embed),
            data,
        )
        assert model.noise_on_latents
        torch.testing.assert_close(model.noise_std, torch.tensor([1.0, 1.0, 0, 0, 0]), rtol=1e-5, atol=1e-6)


def test_layout_fallbacks_fold_into_the_denoiser_and_still_match_the_engine_path() -> None:
    denoiser, encoder, _ = make_networks(1)
    odd_encoder = Sequence((encoder, Copy(19)))  # not the schema's tree: cannot take the statistics
    odd_decoder = Sequence((Denormalize(3, np.zeros(3, np.float32), np.full(3, 2.0, np.float32)),))
    model, data = make_model(True, True, 1, networks=(denoiser, odd_encoder, odd_decoder))
    assert (model.placement.observations, model.placement.actions) == ("denoiser", "denoiser")
    assert len(model.placement.notes) == 2
    train(model, data, 10)
    exported = model.export()
    obs, x0 = data.observations[:16], np.random.default_rng(2).standard_normal((16, 3)).astype(np.float32)
    expected = model.sample(torch.from_numpy(obs), torch.from_numpy(x0), 4).numpy()
    np.testing.assert_allclose(engine_actions(*exported, obs, x0, 4), expected, rtol=1e-5, atol=1e-4)
    # the decoder's own scale (2) is inverted for the targets
    torch.testing.assert_close(model.tensor_data(data).x1, torch.from_numpy(data.targets / 2.0))


def test_embed_without_auto_leaves_writes_nothing_and_says_so() -> None:
    obs_schema = parse_schema(cont(2, "Manual"), "observation")
    action_schema = parse_schema(cont(1, "Manual", role="action"), "action")
    rng = np.random.default_rng(0)
    data = TrainingData.from_arrays(
        [0],
        [50],
        rng.standard_normal((50, 2)).astype(np.float32),
        rng.standard_normal((50, 1)).astype(np.float32),
        1,
    )
    encoder = build_encoder(obs_schema, rng)
    decoder = build_decoder(action_schema, 1)
    denoiser = build_denoiser(2, 1, 0, 8, "ReLU", rng)
    model = FlowModel.from_networks(
        denoiser, encoder, decoder, obs_schema, action_schema, ModelSettings(embed_normalizations=True), data
    )
    assert len(model.placement.notes) == 2 and "section 10 item 5" in model.placement.notes[0]
    exported = model.export()
    assert write_model(exported.encoder) == write_model(encoder)
    assert write_model(exported.decoder) == write_model(decoder)


def test_a_decoder_that_is_not_elementwise_affine_is_unsupported() -> None:
    denoiser, encoder, _ = make_networks(1)
    ident = Denormalize(3, np.zeros(3, np.float32), np.ones(3, np.float32))
    affine_decoder = Sequence((Copy(3), Array(1, 3, 3, Sequence((ident,)))))
    model, _ = make_model(False, False, 1, networks=(denoiser, encoder, affine_decoder))
    assert model.placement.actions == "denoiser"
    with pytest.raises(Unsupported, match="contains a ELU"):
        make_model(False, False, 1, networks=(denoiser, encoder, Sequence((Copy(3), ELU(3)))))


def test_network_widths_that_do_not_fit_the_data_are_bad_data() -> None:
    denoiser, encoder, decoder = make_networks(1)
    with pytest.raises(BadData, match="denoiser"):
        make_model(False, False, 1, networks=(make_networks(3)[0], encoder, decoder))
    with pytest.raises(BadData, match="decoder"):
        make_model(False, False, 1, networks=(denoiser, encoder, make_networks(3)[2]))


def test_ema_warm_up_and_export_choice() -> None:
    model, data = make_model(True, False, 1, ema=0.99)
    assert model.ema_denoiser is not None and model.ema_encoder is not None
    before = [p.detach().clone() for p in model.denoiser.parameters()]
    train(model, data, 1)
    # first update: decay min(0.99, 1/10) = 0.1, so ema = 0.1·init + 0.9·live
    for init, param, ema in zip(
        before, model.denoiser.parameters(), model.ema_denoiser.parameters(), strict=True
    ):
        torch.testing.assert_close(ema, 0.1 * init + 0.9 * param.detach(), rtol=0, atol=1e-6)
    train(model, data, 5)
    assert int(model.ema_updates) == 6
    live = model.export(use_ema=False).denoiser
    averaged = model.export().denoiser
    assert write_model(live) != write_model(averaged)
    # the count survives a state_dict round trip (checkpoints)
    clone, _ = make_model(True, False, 1, ema=0.99)
    clone.load_state_dict(model.state_dict())
    assert clone._ema_count == 6
    assert write_model(clone.export().denoiser) == write_model(averaged)


def test_model_settings_validation_and_from_session() -> None:
    with pytest.raises(ValueError):
        ModelSettings(chunk_size=0)
    with pytest.raises(ValueError):
        ModelSettings(ema_decay=1.0)

    class Training:
        normalize_latents = True

    class Trainer:
        embed_normalizations_in_weights = True
        training = Training()

    class Session:
        trainer = Trainer()
        action_chunk_size = 4

    settings = ModelSettings.from_session(Session(), ema_decay=0.5)  # type: ignore[arg-type]
    assert settings == ModelSettings(True, True, 4, 0.5)
