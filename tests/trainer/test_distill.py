"""Few-step distillation (trainer.training.steps.distill): the distilled N-step Euler sampler lands where the teacher's
many-step flow lands; a distilled 1- and 2-step sampler keeps two modes that the plain one collapses; runs
are reproducible from the seed; the phase is sized by time and switched on by the option, exports keep the
received structure, and the trainer process distils when LA_TRAINER_ODE_STEPS is set."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from emulator.session import (
    EngineTask,
    Mode,
    SessionSettings,
    build_session_config,
    run_engine_session,
)
from protocol.engine.networks import build_decoder, build_denoiser, build_encoder
from protocol.nne.codec import structure_key, write_model
from protocol.schema import parse_schema
from protocol.snapshot import read_snapshot
from tests.support.models import engine_actions
from trainer.settings.options import TrainerOptions
from trainer.training.data import TrainingData
from trainer.training.flow import TimeDistribution, euler_integrate
from trainer.training.job import TrainingJob
from trainer.training.model import FlowModel, ModelSettings
from trainer.training.nne_torch import LinearModule
from trainer.training.steps import Phase
from trainer.training.steps.autograd import BatchSampler, make_optimizer, train_step
from trainer.training.steps.distill import (
    EVAL_COST,
    POOL_LIMIT_BYTES,
    TRAIN_COST,
    DistillationStep,
    Distiller,
    DistillSettings,
    TargetPool,
    Teacher,
    TeacherLike,
    distill_iterations,
    grid_times,
)

OBS_SCHEMA = parse_schema(
    {"Type": "Continuous", "VectorSize": 1, "EncodedSize": 1, "Num": 1, "Normalization": "AutoPerDimension"},
    "observation",
)
ACTION_SCHEMA = parse_schema(
    {
        "Type": "Continuous",
        "VectorSize": 1,
        "EncodedSize": 2,
        "DistributionSize": 2,
        "ModifierSize": 3,
        "Num": 1,
        "Normalization": "AutoPerDimension",
    },
    "action",
)


def two_mode_data(n: int = 4000, seed: int = 0) -> TrainingData:
    """o ~ U[−1, 1]; a = ±1 (p = ½) + 0.05·N: the conditional mean 0 is never a valid action (B1, 1-D)."""
    rng = np.random.default_rng(seed)
    obs = rng.uniform(-1, 1, (n, 1)).astype(np.float32)
    actions = (rng.choice([-1.0, 1.0], (n, 1)) + 0.05 * rng.standard_normal((n, 1))).astype(np.float32)
    return TrainingData.from_arrays([0], [n], obs, actions, 1)


def toy_model(data: TrainingData, hidden: int = 64, ema: float = 0.0, seed: int = 2) -> FlowModel:
    denoiser = build_denoiser(1, 1, 1, hidden, "ELU", np.random.default_rng(seed))
    encoder = build_encoder(OBS_SCHEMA, np.random.default_rng(1))
    decoder = build_decoder(ACTION_SCHEMA, 1)
    settings = ModelSettings(embed_normalizations=False, ema_decay=ema)
    return FlowModel.from_networks(denoiser, encoder, decoder, OBS_SCHEMA, ACTION_SCHEMA, settings, data)


def fm_train(model: FlowModel, data: TrainingData, steps: int, seed: int = 0) -> None:
    generator = torch.Generator().manual_seed(seed)
    sampler = BatchSampler(model.tensor_data(data), 64, generator)
    optimizer = make_optimizer(model, 3e-3, 1e-4)
    for i in range(steps):
        train_step(model, optimizer, sampler.next(), generator, TimeDistribution.uniform(), 0.0, i)


def distil(
    model: FlowModel,
    data: TrainingData,
    settings: DistillSettings,
    steps: int,
    seed: int = 0,
    lr: float = 3e-3,
    teacher: TeacherLike | None = None,
) -> Distiller:
    generator = torch.Generator().manual_seed(seed)
    sampler = BatchSampler(model.tensor_data(data), 128, generator)
    distiller = Distiller(
        model,
        settings,
        learning_rate=lr,
        weight_decay=0.0,
        time_dist=TimeDistribution.uniform(),
        obs_noise_scale=0.0,
        teacher=teacher,
    )
    for i in range(steps):
        distiller.step(sampler.next(), generator, i)
    return distiller


def engine_samples(model: FlowModel, obs: np.ndarray, x0: np.ndarray, steps: int) -> np.ndarray:
    """Actions the game computes with ``steps`` Euler steps from the exported networks (numpy reference)."""
    exported = model.export()
    return engine_actions(exported.denoiser, exported.encoder, exported.decoder, obs, x0, steps)


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    # Small networks: one thread is faster, and bitwise comparisons need a fixed reduction order.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def curved_model(data: TrainingData, ema: float = 0.0) -> FlowModel:
    """A fixed random network (output ×3) as a deterministic, clearly curved, observation-dependent flow."""
    model = toy_model(data, hidden=32, ema=ema, seed=7)
    last = [m for m in model.denoiser.modules() if isinstance(m, LinearModule)][-1]
    with torch.no_grad():
        last.weight.mul_(3.0)
        last.bias.mul_(3.0)
    return model


# --------------------------------------------------------------------------------------------------
# The sampler facts


def test_distilled_one_step_euler_lands_on_the_teachers_many_step_endpoint() -> None:
    # From the same x0, the student's single engine Euler step (exported networks, numpy reference) must
    # reach the teacher's 256-step endpoint, which the teacher's own single step misses by far.
    data = two_mode_data(1000)
    model = curved_model(data)
    teacher = Teacher(model)
    obs = np.linspace(-0.95, 0.95, 256, dtype=np.float32)[:, None]
    x0 = np.random.default_rng(5).standard_normal((256, 1)).astype(np.float32)
    z = teacher.encode(torch.from_numpy(obs))

    def teacher_endpoint(steps: int) -> np.ndarray:
        def velocity(x: torch.Tensor, t: float) -> torch.Tensor:
            return teacher.velocity(z, x, torch.full((256, 1), t))

        return euler_integrate(velocity, torch.from_numpy(x0), steps).numpy()

    exact = teacher_endpoint(256)
    one_step_miss = float(np.sqrt(np.mean((teacher_endpoint(1) - exact) ** 2)))
    assert one_step_miss > 0.3  # the toy is really curved
    distil(model, data, DistillSettings(1, teacher_steps=8, fm_weight=0.0), 100, lr=5e-3)
    miss = float(np.sqrt(np.mean((engine_samples(model, obs, x0, 1) - exact) ** 2)))
    assert miss < 0.1 * one_step_miss, (miss, one_step_miss)


class ExactTwoModeTeacher:
    """The exact flow-matching velocity of x1 ~ ½N(−1, σ²) + ½N(1, σ²) with x0 ~ N(0, 1) (what a perfectly
    trained FM model predicts, whatever the observation), integrated with midpoint steps.

    Given the mode m, x_t ~ N(t·m, s²) with s² = (1 − t)² + t²σ², and E[x1 − x0 | x_t, m] =
    m + (tσ² − (1 − t))·(x_t − t·m)/s²; the velocity averages that over the modes' posterior weights."""

    sigma = 0.05

    def encode(self, obs: torch.Tensor) -> torch.Tensor:
        return obs

    def velocity(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        # Two modes ±1: the posterior weight of +1 is sigmoid(2xt/s²), so Σ w_m·m = tanh(xt/s²).
        var = (1 - t) ** 2 + (t * self.sigma) ** 2
        mean_mode = torch.tanh(x * t / var)
        return mean_mode + (t * self.sigma**2 - (1 - t)) * (x - mean_mode * t) / var

    def flow(
        self, z: torch.Tensor, x: torch.Tensor, t: torch.Tensor, span: float, steps: int
    ) -> torch.Tensor:
        h = span / steps
        for _ in range(steps):
            x = x + h * self.velocity(x + 0.5 * h * self.velocity(x, t), t + 0.5 * h)
            t = t + h
        return x


def exact_euler(teacher: ExactTwoModeTeacher, x0: np.ndarray, steps: int) -> np.ndarray:
    """The exact FM field integrated the engine's way (``steps`` Euler steps): the undistilled ideal."""
    x = torch.from_numpy(x0)
    for k in range(steps):
        x = x + teacher.velocity(x, torch.full_like(x, k / steps)) / steps
    return x.numpy()


@pytest.mark.parametrize("steps", [1, 2])
def test_distilled_few_step_sampler_is_bimodal_where_the_plain_one_collapses(steps: int) -> None:
    # o ~ U[−1, 1]; a = ±1 + 0.05·N: 1-D bimodal toy (B1's failure mode). The plain sampler is the exact
    # FM velocity (the best an undistilled model can do) run with `steps` Euler steps.
    teacher = ExactTwoModeTeacher()
    obs = np.linspace(-0.9, 0.9, 2000, dtype=np.float32)[:, None]
    x0 = np.random.default_rng(11).standard_normal((2000, 1)).astype(np.float32)

    def on_mode(a: np.ndarray) -> tuple[float, float]:
        near = (np.abs(a - 1) < 0.25) | (np.abs(a + 1) < 0.25)  # 5σ
        return float(near.mean()), float((a > 0).mean())

    plain_near, _ = on_mode(exact_euler(teacher, x0, steps))
    many_near, _ = on_mode(exact_euler(teacher, x0, 200))
    assert many_near > 0.95  # the flow itself is bimodal …
    assert plain_near < (0.01 if steps == 1 else 0.5)  # … but 1 step is the mean 0, 2 steps blur

    data = two_mode_data(2000)
    student = toy_model(data, hidden=64)
    distil(
        student, data, DistillSettings(steps, teacher_steps=8, fm_weight=0.0), 400, lr=5e-3, teacher=teacher
    )
    near, positive = on_mode(engine_samples(student, obs, x0, steps))
    # A sharp two-valued map of x0 takes a 1-D MLP a few hundred steps. Seed-robust margin: over ten seed
    # sets (data, student init, distillation draws and x0 seeds k, 2 + k, k, 11 + 100k; k = 0..9) the
    # 400-step student measured near 0.872-0.921 (N = 1) and 0.859-0.920 (N = 2), positive 0.484-0.535.
    # (At 250 steps N = 2 ranged 0.674-0.892, so a 0.8 bound there held at some seeds only.)
    assert near > 0.8, near
    assert 0.4 < positive < 0.6, positive  # both modes, in about equal shares


def test_distillation_is_reproducible_from_the_seed() -> None:
    data = two_mode_data(500)

    def run(seed: int) -> dict[str, torch.Tensor]:
        student = toy_model(data, hidden=16, ema=0.9)
        fm_train(student, data, 3)
        distil(student, data, DistillSettings(2), 10, seed=seed)
        return {k: v.clone() for k, v in student.state_dict().items()}

    first, second, other = run(3), run(3), run(4)
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert not all(torch.equal(first[k], other[k]) for k in first)


# --------------------------------------------------------------------------------------------------
# Pieces


def test_grid_times_are_the_engines_float32_times() -> None:
    for n in (1, 2, 3, 7, 8, 100):
        dt = np.float32(1.0 / n)
        expected = np.array([np.float32(k) * dt for k in range(n)], dtype=np.float32)
        assert np.array_equal(grid_times(n).numpy(), expected)


def test_teacher_midpoint_flow_is_second_order_accurate() -> None:
    # Φ(x; 0.25 → 0.75) of a curved flow: 8 midpoint steps are far closer to the converged value than 16
    # Euler steps (same 16 evaluations), and halving h divides the midpoint error by about 4 (≥ 2 asserted).
    teacher = Teacher(curved_model(two_mode_data(500)))
    z = teacher.encode(torch.linspace(-0.9, 0.9, 64)[:, None])
    x = torch.randn((64, 1), generator=torch.Generator().manual_seed(0))
    t0 = torch.full((64, 1), 0.25)

    def euler(steps: int) -> torch.Tensor:
        y = x
        for k in range(steps):
            y = y + (0.5 / steps) * teacher.velocity(z, y, t0 + 0.5 * k / steps)
        return y

    reference = teacher.flow(z, x, t0, 0.5, 256)
    mid8 = float((teacher.flow(z, x, t0, 0.5, 8) - reference).abs().mean())
    mid16 = float((teacher.flow(z, x, t0, 0.5, 16) - reference).abs().mean())
    eul16 = float((euler(16) - reference).abs().mean())
    assert mid8 < 0.2 * eul16, (mid8, eul16)
    assert mid16 < 0.5 * mid8, (mid8, mid16)


def test_teacher_is_a_frozen_copy_of_the_ema_networks_and_the_student_starts_from_them() -> None:
    data = two_mode_data(500)
    model = toy_model(data, hidden=16, ema=0.5)
    fm_train(model, data, 5)
    assert model.ema_denoiser is not None
    ema = [p.clone() for p in model.ema_denoiser.parameters()]
    assert not all(torch.equal(a, b) for a, b in zip(ema, model.denoiser.parameters(), strict=True))
    distiller = Distiller(
        model,
        DistillSettings(2),
        learning_rate=1e-3,
        weight_decay=0.0,
        time_dist=TimeDistribution.uniform(),
        obs_noise_scale=0.0,
    )
    teacher = distiller.teacher
    assert isinstance(teacher, Teacher)
    for a, b, c in zip(teacher.denoiser.parameters(), model.denoiser.parameters(), ema, strict=True):
        assert torch.equal(a, c) and torch.equal(b, c)  # teacher = student = the EMA weights
        assert a.data_ptr() != b.data_ptr() and not a.requires_grad
    generator = torch.Generator().manual_seed(0)
    distiller.step(BatchSampler(model.tensor_data(data), 32, generator).next(), generator, 0)
    for a, c in zip(teacher.denoiser.parameters(), ema, strict=True):
        assert torch.equal(a, c)  # the teacher does not move


def test_distillation_takes_its_fraction_of_the_time() -> None:
    for total, fraction, cost in [(12_000, 0.25, 5.5), (1000, 0.5, 2.0), (300, 0.1, 9.25), (10, 0.25, 1.0)]:
        n = distill_iterations(total, fraction, cost)
        time_share = n * cost / ((total - n) + n * cost)
        assert abs(time_share - fraction) < cost / total + 1e-9, (total, fraction, cost, n)
    assert distill_iterations(12_000, 0.0, 4.0) == 0
    assert distill_iterations(0, 0.25, 4.0) == 0
    # cost 1 (free distillation) is the iteration share itself
    assert distill_iterations(1000, 0.25, 1.0) == 250
    for bad in [(-1, 0.25, 2.0), (10, 1.0, 2.0), (10, -0.1, 2.0), (10, 0.25, 0.0)]:
        with pytest.raises(ValueError):
            distill_iterations(*bad)


def test_cost_model_counts_evaluations() -> None:
    # N = 2, 16 teacher midpoint steps over [0, 1]: 8 per interval = 16 evaluations per row. Half the rows
    # are on the first interval and pay them once per 4 uses; the other half pay them plus 1 rollout step.
    s = DistillSettings(2, teacher_steps=16, fm_weight=0.1, fm_rows=0.25, pool_reuse=4)
    assert s.substeps == 8
    assert s.evaluations == pytest.approx(0.5 * 16 / 4 + 0.5 * (16 + 1))
    assert s.cost == pytest.approx(TRAIN_COST * 1.25 + EVAL_COST * s.evaluations)
    # N = 1: every row is on the first interval; no FM rows when fm_weight is 0.
    one = DistillSettings(1, teacher_steps=8, fm_weight=0.0, pool_reuse=1)
    assert one.evaluations == 16 and one.cost == pytest.approx(TRAIN_COST + EVAL_COST * 16)
    assert DistillSettings(100, teacher_steps=16).substeps == 1
    assert DistillSettings(3, teacher_steps=16).substeps == 6
    for bad in [
        {"ode_steps": 0},
        {"ode_steps": 101},
        {"ode_steps": True},
        {"ode_steps": 2, "teacher_steps": 0},
        {"ode_steps": 2, "fm_weight": -0.1},
        {"ode_steps": 2, "fm_weight": math.nan},
        {"ode_steps": 2, "fm_rows": 0.0},
        {"ode_steps": 2, "fm_rows": 1.5},
        {"ode_steps": 2, "pool_reuse": 0},
    ]:
        with pytest.raises(ValueError):
            DistillSettings(**bad)  # type: ignore[arg-type]


def test_target_pool_is_a_ring_that_keeps_the_newest_rows() -> None:
    pool = TargetPool(5, 2, 1, torch.device("cpu"), torch.float32)
    with pytest.raises(ValueError):
        pool.sample(1, torch.Generator())
    rows = torch.arange(8, dtype=torch.float32)
    pool.add(rows[:3, None].repeat(1, 2), rows[:3, None], -rows[:3, None])
    assert pool.size == 3
    obs, x0, end = pool.sample(200, torch.Generator().manual_seed(0))
    assert set(x0.squeeze(1).tolist()) == {0.0, 1.0, 2.0}  # only what was added, all of it
    assert torch.equal(obs[:, 0], x0[:, 0]) and torch.equal(end, -x0)  # rows stay paired
    pool.add(rows[3:, None].repeat(1, 2), rows[3:, None], -rows[3:, None])  # 3 + 5 > 5: oldest go
    assert pool.size == 5
    _, x0, _ = pool.sample(400, torch.Generator().manual_seed(1))
    assert set(x0.squeeze(1).tolist()) == {3.0, 4.0, 5.0, 6.0, 7.0}
    pool.add(rows[:, None].repeat(1, 2), rows[:, None], -rows[:, None])  # more rows than capacity
    _, x0, _ = pool.sample(400, torch.Generator().manual_seed(2))
    assert set(x0.squeeze(1).tolist()) == {3.0, 4.0, 5.0, 6.0, 7.0}
    huge = TargetPool(10**9, 1000, 8, torch.device("cpu"), torch.float32)
    assert huge.capacity * 4 * (1000 + 16) <= POOL_LIMIT_BYTES


# --------------------------------------------------------------------------------------------------
# The trainer: TrainingJob and the process

SMALL = SessionSettings(
    iteration_num=80, batch_size=64, hidden_layer_num=1, hidden_layer_size=32, device="CPU", seed=9
)


def small_job(task: EngineTask, options: TrainerOptions) -> tuple[TrainingJob, tuple[bytes, ...]]:
    config, snapshots = build_session_config(task, SMALL, None)
    received = {nid: read_snapshot(blob) for nid, blob in enumerate(snapshots)}
    job = TrainingJob.create(
        config, received, task.replay_buffer, options=options, device=torch.device("cpu")
    )
    return job, snapshots


@pytest.fixture(scope="module")
def small_task() -> EngineTask:
    return EngineTask.benchmark("bimodal", size=300, seed=0)


def test_training_job_switches_to_distillation_at_the_boundary(small_task: EngineTask) -> None:
    options = TrainerOptions(ode_steps=2, distill_fraction=0.5, ema_decay=0.9)
    job, _ = small_job(small_task, options)
    total = SMALL.iteration_num
    expected = total - distill_iterations(total, 0.5, DistillSettings(2).cost)
    assert job.distill_start == expected and 0 < expected < total - 5
    received = job.export()
    for i in range(expected):
        job.step(i)
    assert job.phase is Phase.FLOW_MATCHING
    job.step(expected)
    assert job.phase is Phase.DISTILLATION and isinstance(job.training_step, DistillationStep)
    for i in range(expected + 1, total):
        job.step(i)
    assert math.isfinite(job.smoothed_loss)
    exported = job.export()
    for nid in (0, 1, 2):
        assert structure_key(exported[nid]) == structure_key(received[nid])
    # Without the option the job never distils.
    plain, _ = small_job(small_task, TrainerOptions())
    assert plain.distill_start is None


def test_trainer_process_distils_when_the_environment_asks(small_task: EngineTask, tmp_path: Path) -> None:
    settings = dataclasses.replace(
        SMALL,
        sync_every_iterations=40,
        timeout_scale=0.25,
        session_timeout_s=40.0,
        exit_timeout_s=12.0,
        env={"LA_TRAINER_ODE_STEPS": "2", "LA_TRAINER_DISTILL_FRACTION": "0.5", "LA_TRAINER_THREADS": "1"},
    )
    record = run_engine_session(Mode.SHM, small_task, tmp_path, settings)
    record.check()
    assert record.completed
    assert any("distilling for 2 Euler step(s)" in line for line in record.log), record.log_tail()
    # A short run warns that few-step quality needs more distillation iterations.
    assert any(
        "distillation iterations are fewer than the 20000" in line and "IterationNum" in line
        for line in record.log
    ), record.log_tail()
    # The process's final networks are exactly the in-process job's (same seed, same iterations).
    options = TrainerOptions(ode_steps=2, distill_fraction=0.5)
    job, snapshots = small_job(small_task, options)
    for i in range(SMALL.iteration_num):
        job.step(i)
    final = [read_snapshot(blob) for blob in record.final_networks]
    for nid, layer in job.export().items():
        assert len(record.final_networks[nid]) == len(snapshots[nid])  # same sizes and headers
        assert write_model(final[nid].model) == write_model(layer)


@pytest.mark.parametrize(("iterations", "warns"), [(181_980, True), (182_000, False)])
def test_the_job_warns_when_distillation_gets_too_few_iterations(
    small_task: EngineTask, iterations: int, warns: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    # N = 1 at the default fraction 0.25 distils 19,998 of 181,980 and 20,000 of 182,000 iterations.
    job, _ = small_job(small_task, TrainerOptions(ode_steps=1, iteration_num=iterations))
    assert job.distill_start is not None
    assert (iterations - job.distill_start < 20_000) == warns
    assert ("distillation iterations are fewer than the 20000" in capsys.readouterr().out) == warns
