"""Benchmark tasks B1-B4 (docs/benchmarks.md; B4 = B3 through an Encoding): schemas, demonstrations,
experts, metrics, worlds."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from emulator.tasks import (
    TASK_NAMES,
    Demonstrations,
    FloatArray,
    avoid,
    bimodal,
    get_task,
    pendulum,
    sensors,
)
from protocol.engine.networks import build_encoder
from protocol.schema import parse_schema

# --------------------------------------------------------------------------------------------------
# Common


@pytest.mark.parametrize("name", TASK_NAMES)
def test_schemas_parse_with_engine_sizes(name: str) -> None:
    task = get_task(name)
    warnings: list[str] = []
    obs = parse_schema(dict(task.observation_schema), "observation", warnings=warnings)
    act = parse_schema(dict(task.action_schema), "action", warnings=warnings)
    assert warnings == []
    if name == "sensors":  # B4: an Encoding of one Continuous leaf (checked below)
        assert obs.type == "Encoding" and obs.element is not None
        assert obs.encoded_size == sensors.ENCODING_SIZE and obs.vector_size == task.obs_dim
        obs = obs.element
    assert obs.type == act.type == "Continuous"
    assert obs.vector_size == obs.encoded_size == obs.num == task.obs_dim
    # §10 item 4: DistributionSize = EncodedSize = 2·Num, ModifierSize = 1 + 2·Num.
    n = task.act_dim
    assert (act.vector_size, act.distribution_size, act.encoded_size, act.modifier_size) == (
        n,
        2 * n,
        2 * n,
        1 + 2 * n,
    )
    assert obs.normalization == act.normalization == "AutoPerDimension"


def test_b1_schema_literal() -> None:
    assert bimodal.OBSERVATION_SCHEMA == {
        "VectorSize": 2,
        "EncodedSize": 2,
        "Type": "Continuous",
        "Num": 2,
        "Normalization": "AutoPerDimension",
    }
    assert bimodal.ACTION_SCHEMA == {
        "VectorSize": 2,
        "DistributionSize": 4,
        "EncodedSize": 4,
        "ModifierSize": 5,
        "Type": "Continuous",
        "Num": 2,
        "Normalization": "AutoPerDimension",
    }


def test_get_task_unknown() -> None:
    with pytest.raises(KeyError):
        get_task("cartpole")


def test_flatten_lays_out_the_replay_buffer() -> None:
    demos = Demonstrations(
        (
            (np.zeros((3, 2), np.float32), np.ones((3, 1), np.float32)),
            (np.full((1, 2), 5, np.float32), np.full((1, 1), 6, np.float32)),
            (np.full((2, 2), 7, np.float32), np.full((2, 1), 8, np.float32)),
        )
    )
    flat = demos.flatten()
    assert flat.episode_starts.tolist() == [0, 3, 4]
    assert flat.episode_lengths.tolist() == [3, 1, 2]
    assert flat.episode_starts.dtype == flat.episode_lengths.dtype == np.int32
    assert flat.observations.shape == (6, 2) and flat.actions.shape == (6, 1)
    assert flat.observations[3].tolist() == [5, 5] and flat.actions[5, 0] == 8
    assert (demos.episode_num, demos.step_num, demos.obs_dim, demos.act_dim) == (3, 6, 2, 1)


@pytest.mark.parametrize(
    "episodes",
    [
        (),
        ((np.zeros((2, 2), np.float32), np.zeros((3, 1), np.float32)),),
        ((np.zeros((2, 2), np.float64), np.zeros((2, 1), np.float32)),),
        (
            (np.zeros((2, 2), np.float32), np.zeros((2, 1), np.float32)),
            (np.zeros((2, 3), np.float32), np.zeros((2, 1), np.float32)),
        ),
        ((np.zeros((0, 2), np.float32), np.zeros((0, 1), np.float32)),),
    ],
)
def test_demonstrations_reject_inconsistent_episodes(episodes: Any) -> None:
    with pytest.raises(ValueError):
        Demonstrations(episodes)


@pytest.mark.parametrize("name", TASK_NAMES)
def test_demonstrations_are_deterministic_per_seed(name: str) -> None:
    task = get_task(name)
    a, b, c = (task.make_demonstrations(seed).flatten() for seed in (3, 3, 4))
    assert a.observations.tobytes() == b.observations.tobytes()
    assert a.actions.tobytes() == b.actions.tobytes()
    assert a.observations.tobytes() != c.observations.tobytes()
    assert a.observations.dtype == a.actions.dtype == np.float32
    assert a.observations.shape[1] == task.obs_dim and a.actions.shape[1] == task.act_dim


# --------------------------------------------------------------------------------------------------
# B4 sensors (B3 through an Encoding)


def test_b4_is_b3_with_distractors_and_an_encoder_with_weights() -> None:
    b3, b4 = pendulum.make_demonstrations(2, 4).flatten(), sensors.make_demonstrations(2, 4).flatten()
    assert np.array_equal(b4.observations[:, :3], b3.observations)
    assert np.array_equal(b4.actions, b3.actions)
    noise = b4.observations[:, 3:]
    assert noise.shape[1] == sensors.DISTRACTOR_NUM and abs(float(noise.std()) - 1.0) < 0.05
    obs = parse_schema(sensors.OBSERVATION_SCHEMA, "observation")
    encoder = build_encoder(obs, np.random.default_rng(0))
    assert encoder.input_size == 16 and encoder.output_size == sensors.ENCODING_SIZE
    flat = parse_schema(sensors.FLAT_OBSERVATION_SCHEMA, "observation")
    assert flat.type == "Continuous" and flat.vector_size == 16


def test_b4_scores_the_expert_as_b3_does_whatever_the_distractors() -> None:
    def expert(obs: np.ndarray) -> np.ndarray:
        return pendulum.expert_policy(obs[:, :3])

    b4 = sensors.evaluate_policy(expert, seed=1, episode_num=8)
    b3 = pendulum.evaluate_policy(pendulum.expert_policy, seed=1, episode_num=8)
    assert b4["score"] == pytest.approx(1.0) and b4["return"] == b3["return"]


# --------------------------------------------------------------------------------------------------
# B1 bimodal


def test_b1_demonstrations() -> None:
    demos = bimodal.make_demonstrations(0)
    flat = demos.flatten()
    assert demos.episode_num == demos.step_num == 20_000  # one 1-step episode per pair
    assert np.array_equal(flat.episode_lengths, np.ones(20_000, np.int32))
    assert np.abs(flat.observations).max() <= 1.0
    centres = bimodal.mode_centres(flat.observations)
    plus = np.linalg.norm(flat.actions - centres, axis=1) < 0.2
    minus = np.linalg.norm(flat.actions + centres, axis=1) < 0.2
    assert (plus | minus).mean() > 0.999  # 4σ
    assert abs(plus.mean() - 0.5) < 0.02
    assert abs(float(np.mean(flat.actions))) < 0.02  # the conditional mean is 0


def test_b1_true_distribution_scores_like_the_data() -> None:
    rng = np.random.default_rng(11)
    metrics = bimodal.evaluate_policy(lambda obs: bimodal.sample_actions(obs, rng), seed=0)
    assert metrics["on_mode"] > 0.99
    assert metrics["both_modes_covered"] > 0.99
    assert metrics["balance_err"] < 0.08  # sampling floor ≈ 0.05 at 64 samples
    assert metrics["mmd"] < 0.1  # floor ≈ 0.05
    assert metrics["ms_per_call"] >= 0


def test_b1_mean_predictor_fails() -> None:
    metrics = bimodal.evaluate_policy(lambda obs: np.zeros((obs.shape[0], 2), np.float32), seed=0)
    assert metrics["on_mode"] == 0.0
    assert metrics["both_modes_covered"] == 0.0
    assert math.isnan(metrics["balance_err"])  # no on-mode sample: the benchmark table's "–"
    assert metrics["mmd"] == pytest.approx(2.99, abs=0.05)


def test_b1_single_mode_collapse() -> None:
    rng = np.random.default_rng(12)

    def plus_only(obs: FloatArray) -> FloatArray:
        return (bimodal.mode_centres(obs) + 0.05 * rng.standard_normal((obs.shape[0], 2))).astype(np.float32)

    metrics = bimodal.evaluate_policy(plus_only, seed=0)
    assert metrics["on_mode"] > 0.99
    assert metrics["both_modes_covered"] == 0.0
    assert metrics["balance_err"] == 0.5
    assert 0.95 < metrics["mmd"] < 1.2  # benchmark: ≈ 1.08


def test_b1_metric_definitions_on_hand_made_samples() -> None:
    obs = np.array([[0.0, 0.0], [0.5, 0.0]], np.float32)  # θ = 0 -> centres ±(1, 0); θ = π/2 -> ±(0, 1)
    samples = np.array(
        [
            [[1.0, 0.0], [1.1, 0.0], [-1.0, 0.15], [0.0, 0.0]],  # + + − off
            [[0.0, 1.0], [0.0, 1.0], [0.0, 1.0], [0.0, 1.3]],  # + + + off
        ]
    )
    metrics = bimodal.evaluate_samples(obs, samples, samples)
    assert metrics["on_mode"] == pytest.approx(6 / 8)
    assert metrics["both_modes_covered"] == pytest.approx(0.5)
    assert metrics["balance_err"] == pytest.approx((abs(2 / 3 - 0.5) + 0.5) / 2)
    assert metrics["mmd"] == pytest.approx(0.0, abs=1e-12)  # identical sets


def test_b1_policy_shape_is_checked() -> None:
    with pytest.raises(ValueError, match="shape"):
        bimodal.evaluate_policy(
            lambda obs: np.zeros((obs.shape[0], 3), np.float32), seed=0, obs_num=2, sample_num=2
        )


# --------------------------------------------------------------------------------------------------
# B2 avoid


def test_b2_expert_covers_all_six_modes() -> None:
    metrics = avoid.evaluate_expert(seed=0)
    assert metrics["success"] > 0.95
    assert metrics["entropy"] > 0.9
    assert all(metrics[f"mode/{name}"] > 0 for name in avoid.MODE_NAMES)
    assert sum(metrics[f"mode/{name}"] for name in avoid.MODE_NAMES) == pytest.approx(
        200 * metrics["success"]
    )


def test_b2_demonstrations() -> None:
    demos = avoid.make_demonstrations(0)
    assert demos.episode_num == 200
    assert 4_500 < demos.step_num < 7_500  # benchmark: ≈ 6 000
    for obs, act in demos.episodes:
        assert obs.shape[0] <= avoid.MAX_STEPS
        assert np.linalg.norm(act, axis=1).max() <= 1.0 + 1e-6
        assert abs(obs[0, 0]) <= 0.05 and obs[0, 1] == 0.0
        # Every demo succeeds: its last step reaches the goal line.
        assert obs[-1, 1] + avoid.MAX_SPEED * act[-1, 1] >= avoid.GOAL_Y - 1e-6
        # Observations follow the actions (x_{t+1} = x_t + 0.05·a_t).
        np.testing.assert_allclose(obs[1:], obs[:-1] + avoid.MAX_SPEED * act[:-1], atol=1e-6)


def test_b2_straight_up_hits_the_first_obstacle() -> None:
    metrics = avoid.evaluate_policy(
        lambda obs: np.tile(np.array([[0.0, 1.0]], np.float32), (obs.shape[0], 1)), seed=0
    )
    assert metrics["success"] == 0.0
    assert metrics["collision"] == 1.0
    assert metrics["entropy"] == 0.0


def test_b2_action_norm_is_clipped() -> None:
    # 10× the allowed speed to the right: still 0.05 per step, so after 60 steps x = x0 + 3.0.
    starts = np.array([[0.0, 0.0]])
    result = avoid.rollout(
        lambda idx, obs: np.tile(np.array([[10.0, 0.0]], np.float32), (obs.shape[0], 1)), starts, record=True
    )
    assert result.steps[0] == avoid.MAX_STEPS and not result.success[0] and not result.collided[0]
    assert result.observations[0][-1, 0] == pytest.approx(0.05 * 59)


@pytest.mark.parametrize(("chunk", "execute", "calls"), [(1, 1, 60), (8, 4, 15), (8, 8, 8), (3, 2, 30)])
def test_b2_chunks_execute_the_first_steps(chunk: int, execute: int, calls: int) -> None:
    seen: list[int] = []

    def sideways(obs: FloatArray) -> FloatArray:
        seen.append(obs.shape[0])
        step = np.tile(np.array([1.0, 0.0], np.float32), chunk)
        return np.tile(step, (obs.shape[0], 1))

    metrics = avoid.evaluate_policy(sideways, seed=0, rollout_num=5, execute=execute)
    assert metrics["policy_calls"] == calls
    assert seen == [5] * calls


def test_b2_chunk_steps_are_executed_in_order() -> None:
    # Chunk [up, right]: executing 2 steps per call moves up then right, so the path is a staircase.
    chunk = np.array([0.0, 1.0, 1.0, 0.0], np.float32)
    result = avoid.rollout(
        lambda idx, obs: np.tile(chunk, (obs.shape[0], 1)), np.array([[0.5, 0.0]]), execute=2, record=True
    )
    obs = result.observations[0]
    np.testing.assert_allclose(obs[1], [0.5, 0.05], atol=1e-7)
    np.testing.assert_allclose(obs[2], [0.55, 0.05], atol=1e-7)


def test_b2_policy_sees_only_live_agents() -> None:
    seen: list[int] = []

    def up(obs: FloatArray) -> FloatArray:
        seen.append(obs.shape[0])
        return np.tile(np.array([[0.0, 1.0]], np.float32), (obs.shape[0], 1))

    avoid.evaluate_policy(up, seed=0, rollout_num=7)
    assert seen[0] == 7 and seen[-1] >= 1 and len(seen) < avoid.MAX_STEPS
    assert seen == sorted(seen, reverse=True)


def test_b2_execute_longer_than_chunk_is_refused() -> None:
    with pytest.raises(ValueError, match="execute"):
        avoid.evaluate_policy(
            lambda obs: np.zeros((obs.shape[0], 4), np.float32), seed=0, rollout_num=2, execute=3
        )


def test_b2_non_finite_actions_stand_still() -> None:
    metrics = avoid.evaluate_policy(
        lambda obs: np.full((obs.shape[0], 2), np.nan, np.float32), seed=0, rollout_num=3
    )
    assert (
        metrics["success"] == 0.0 and metrics["collision"] == 0.0 and metrics["mean_steps"] == avoid.MAX_STEPS
    )


def test_b2_mode_classification() -> None:
    # Go left around the first disc to x = -0.42, then straight up through the left gap: mode L-left.
    waypoints = [(-0.25, 0.35), (-0.42, 0.55), (-0.42, 1.2)]
    target = [0]

    def scripted(idx: Any, obs: FloatArray) -> FloatArray:
        pos = obs[0].astype(np.float64)
        while np.linalg.norm(np.array(waypoints[target[0]]) - pos) < 0.05 and target[0] < 2:
            target[0] += 1
        step = (np.array(waypoints[target[0]]) - pos) / 0.05
        return np.asarray(step[None], dtype=np.float32)

    result = avoid.rollout(scripted, np.array([[0.0, 0.0]]))
    assert result.success[0]
    assert (result.side[0], result.gap[0]) == (0, 0)
    assert result.metrics()["mode/L-left"] == 1.0
    assert result.metrics()["entropy"] == 0.0


# --------------------------------------------------------------------------------------------------
# B3 pendulum


def test_b3_one_step_matches_pendulum_v1() -> None:
    # θ = π/2, ω = 0, u = 2: ω' = (15·sin θ + 3·2)·0.05 = 1.05, θ' = π/2 + 1.05·0.05;
    # reward = −(θ² + 0.1ω² + 0.001u²) from the state before the step.
    episodes = pendulum.run_episodes(
        lambda obs: np.full((1, 1), 2.0, np.float32), [np.pi / 2], [0.0], steps=2
    )
    np.testing.assert_allclose(episodes.observations[0, 0], [0.0, 1.0, 0.0], atol=1e-7)
    th1 = np.pi / 2 + 1.05 * 0.05
    np.testing.assert_allclose(episodes.observations[0, 1], [np.cos(th1), np.sin(th1), 1.05 / 8], rtol=1e-6)
    first_cost = (np.pi / 2) ** 2 + 0.004
    second_cost = th1**2 + 0.1 * 1.05**2 + 0.004
    assert episodes.returns[0] == pytest.approx(-(first_cost + second_cost))


def test_b3_torque_and_speed_are_clipped() -> None:
    episodes = pendulum.run_episodes(lambda obs: np.full((1, 1), 50.0, np.float32), [0.0], [7.9], steps=3)
    assert np.all(episodes.actions == 2.0)
    assert np.abs(episodes.observations[0, :, 2]).max() <= 1.0  # ω/8 with |ω| <= 8


def test_b3_expert_swings_up() -> None:
    # Benchmark: mean return ≈ −137 over 100 fixed seeds, 100 % upright. The mean over 100 random starts
    # varies by ±12 between start sets (measured −135 … −162 over ten sets), hence the ±25 tolerance.
    metrics = pendulum.evaluate_policy(pendulum.expert_policy, seed=0)
    assert metrics["return"] == pytest.approx(-137, abs=25)
    assert metrics["upright"] == 1.0
    assert metrics["score"] == pytest.approx(1.0)
    assert metrics["random_return"] < -1000  # benchmark: ≈ −1363


def test_b3_zero_torque_scores_near_random() -> None:
    metrics = pendulum.evaluate_policy(lambda obs: np.zeros((obs.shape[0], 1), np.float32), seed=0)
    assert abs(metrics["score"]) < 0.2
    assert metrics["upright"] < 0.1


def test_b3_demonstrations() -> None:
    demos = pendulum.make_demonstrations(0)
    assert demos.episode_num == 100 and demos.step_num == 100 * 200
    flat = demos.flatten()
    assert np.abs(flat.actions).max() <= 2.0
    np.testing.assert_allclose(flat.observations[:, 0] ** 2 + flat.observations[:, 1] ** 2, 1.0, rtol=1e-5)
    # The expert acts on its observations only: replaying them reproduces the recorded torques.
    np.testing.assert_array_equal(pendulum.expert_policy(flat.observations), flat.actions)


# --------------------------------------------------------------------------------------------------
# The engine inference path drives every task


@pytest.mark.parametrize(("name", "chunk"), [("bimodal", 1), ("avoid", 4), ("pendulum", 2)])
def test_engine_policy_runs_on_every_task(name: str, chunk: int) -> None:
    from emulator.inference import EnginePolicy
    from protocol.engine.networks import build_flow_matching_networks

    task = get_task(name)
    nets = build_flow_matching_networks(
        parse_schema(dict(task.observation_schema), "observation"),
        parse_schema(dict(task.action_schema), "action"),
        chunk_size=chunk,
        hidden_layer_size=16,
        seed=1,
    )
    policy = EnginePolicy(nets.encoder.model, nets.denoiser.model, nets.decoder.model, ode_steps=2)
    act = policy.bind(np.random.default_rng(0))
    if name == "bimodal":
        metrics = bimodal.evaluate_policy(act, seed=0, obs_num=4, sample_num=4)
    elif name == "avoid":
        metrics = avoid.evaluate_policy(act, seed=0, rollout_num=3, execute=2)
    else:

        def first_step(obs: FloatArray) -> FloatArray:
            return act(obs)[:, :1]  # chunk of 2 torques: apply the first

        metrics = pendulum.evaluate_policy(first_step, seed=0, episode_num=2)
    assert all(isinstance(v, float) for v in metrics.values())
