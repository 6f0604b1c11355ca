"""Issue 32, item 3: the captured step (trainer/training/steps/graphed.py).

On a CPU (every run of the suite): the device-state form of the fused step, the one a CUDA graph
captures (learning rates and the EMA weight in device tensors written in place, the finiteness check and
the skip on the device), trains bitwise as the fused step with host numbers does, through a learning-rate
change, the EMA warm-up, several parameter groups and either time density; the chooser takes the graph
on CUDA only; the finiteness check's fallback (torches without the CPU kernel) is bitwise the kernel's.

On a GPU (skipped here with the reason; the first session with a device runs them, and
``benchmarks/gpu_check.py`` reports the same facts with timings): the graph replays bitwise the eager
device-state steps, it is actually captured, and a whole run on CUDA reads the device rarely.
"""

from __future__ import annotations

import copy
import math
import threading
from pathlib import Path

import pytest
import torch

from emulator.bench.config import TRAIN_CONFIGS
from emulator.bench.workload import make_job
from emulator.session import EngineTask, SessionSettings, build_session_config
from tests.support.fused import BATCH, assert_same, engine_model, everything
from tests.support.host_reads import count_host_reads
from trainer.exitcodes import ExitCode
from trainer.session.app import run_with_link
from trainer.session.links import MemoryLink
from trainer.settings.options import TrainerOptions
from trainer.system.torch_compat import mark_non_finite, mark_non_finite_fallback
from trainer.training.flow import TimeDistribution
from trainer.training.job import TrainingJob
from trainer.training.steps import Phase, choose_step, fused_step
from trainer.training.steps.autograd import make_optimizer, set_learning_rate
from trainer.training.steps.fused import FusedStep
from trainer.training.steps.graphed import GraphedStep, graph_unavailable

NO_GPU = "no CUDA device here: the first session with a GPU runs it (benchmarks/gpu_check.py)"
cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)


def _fused(model: object, data: object, *, device_state: bool, time: TimeDistribution, noise: float) -> tuple:
    generator = torch.Generator().manual_seed(21)
    optimizer = make_optimizer(model, 3e-3, 1e-3, "fan_in")  # type: ignore[arg-type]
    step = FusedStep.build(
        model,  # type: ignore[arg-type]
        optimizer,
        model.tensor_data(data),  # type: ignore[attr-defined]
        BATCH,
        generator,
        time,
        noise,
        device_state=device_state,
    )
    assert step is not None and step.device_state is device_state
    return step, optimizer, generator


@pytest.mark.parametrize(
    ("time", "noise", "layers"),
    [(TimeDistribution.logit_normal(0.0, 1.0), 0.1, 1), (TimeDistribution.uniform(), 0.0, 2)],
)
def test_the_device_state_step_is_bitwise_the_host_number_step_on_cpu(
    time: TimeDistribution, noise: float, layers: int
) -> None:
    base, data = engine_model(layers=layers, ema=0.99)
    host_model, device_model = copy.deepcopy(base), copy.deepcopy(base)
    host, host_opt, host_gen = _fused(host_model, data, device_state=False, time=time, noise=noise)
    dev, dev_opt, dev_gen = _fused(device_model, data, device_state=True, time=time, noise=noise)
    assert len(host_opt.param_groups) > 1  # fan_in: one learning rate tensor per group
    for i in range(60):
        if i == 30:  # a rate change mid-run: the device tensors follow in place
            set_learning_rate(host_opt, 1e-3)
            set_learning_rate(dev_opt, 1e-3)
        host.launch(i)
        dev.launch(i)
    host_metrics, dev_metrics = host.read(), dev.read()
    assert_same(everything(host_model, host_opt), everything(device_model, dev_opt), exact=True)
    assert torch.equal(host_gen.get_state(), dev_gen.get_state())
    assert host_metrics == dev_metrics and host.smoothed_loss == dev.smoothed_loss
    assert int(device_model.ema_updates) == 60  # the warm-up schedule ran on the host all along


def test_a_skipped_step_leaves_the_device_state_step_where_it_was() -> None:
    model, data = engine_model()
    dev, optimizer, _ = _fused(model, data, device_state=True, time=TimeDistribution.uniform(), noise=0.0)
    for i in range(4):
        dev.launch(i)
    dev.read()
    before = everything(model, optimizer)
    dev._x1[:, 0] = math.inf
    dev.launch(4)
    with pytest.raises(Exception, match="iteration 4"):
        dev.read()
    assert_same(before, everything(model, optimizer), exact=True)


def test_the_graph_is_chosen_on_cuda_only() -> None:
    assert graph_unavailable(torch.device("cpu")) is not None
    job = make_job(TRAIN_CONFIGS[0], 2000, torch.device("cpu"))
    step = choose_step(Phase.FLOW_MATCHING, job._step_inputs(), 0)
    assert isinstance(step, FusedStep) and not step.device_state
    model, data = engine_model()
    host, _, _ = _fused(model, data, device_state=False, time=TimeDistribution.uniform(), noise=0.0)
    with pytest.raises(ValueError, match="device_state"):
        GraphedStep(host)


@pytest.mark.parametrize("bad", [None, math.nan, math.inf, -math.inf])
def test_the_finiteness_check_fallback_is_the_kernel_bit_for_bit(bad: float | None) -> None:
    grads = torch.randn(1000)
    loss = torch.tensor(2.5)
    if bad is not None:
        grads[417] = bad
    found_native, found_fallback = torch.zeros(()), torch.zeros(())
    kept = grads.clone()
    mark_non_finite([grads, loss], found_native)
    mark_non_finite_fallback([grads, loss], found_fallback)
    assert torch.equal(found_native, found_fallback) and float(found_native) == (bad is not None)
    assert torch.equal(grads, kept) or (bad is not None and math.isnan(bad))  # the scale 1 changes no bit
    mark_non_finite([torch.ones(3)], found_native)
    assert float(found_native) == (bad is not None)  # once set it stays set (the skip is sticky)


# -- on a GPU ----------------------------------------------------------------------------------------------


def _cuda_job(graph: bool) -> TrainingJob:
    job = make_job(TRAIN_CONFIGS[0], 20_000, torch.device("cuda"))
    job.cuda_graph = graph
    return job


@cuda_only
def test_the_cuda_graph_replays_bitwise_the_eager_steps() -> None:
    graphed, eager = _cuda_job(True), _cuda_job(True)
    # The eager side runs the same device-state step the graph captured, without the graph.
    eager.training_step, eager.phase = _device_state(eager), Phase.FLOW_MATCHING
    for i in range(200):
        graphed.advance(i)
        eager.advance(i)
    assert isinstance(graphed.training_step, GraphedStep) and graphed.training_step.captured
    assert graphed.settle() == eager.settle()
    eager_state = eager.model.state_dict()
    for key, value in graphed.model.state_dict().items():
        assert torch.equal(value, eager_state[key]), key
    assert torch.equal(graphed.generator.get_state(), eager.generator.get_state())


def _device_state(job: TrainingJob) -> FusedStep:
    inputs = job._step_inputs()
    step = fused_step(inputs, device_state=True)
    assert step is not None
    return step


@cuda_only
def test_a_cuda_run_reads_the_device_at_most_once_per_hundred_iterations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    iterations = 5000
    task = EngineTask.benchmark("bimodal", size=200, seed=0)
    config, blobs = build_session_config(
        task, SessionSettings(iteration_num=iterations, batch_size=256, device="GPU"), None
    )
    options = TrainerOptions(sync_every_iterations=100, sync_every_seconds=0.0, device="cuda")
    link = MemoryLink(config, list(blobs), task.replay_buffer)
    thread = threading.current_thread().name
    window: dict[str, int] = {}
    advance = TrainingJob.advance

    def counted(self: TrainingJob, iteration: int) -> None:
        window.setdefault("first", reads.on(thread))
        advance(self, iteration)
        window["last"] = reads.on(thread)

    monkeypatch.setattr(TrainingJob, "advance", counted)
    with count_host_reads() as reads:
        assert (
            run_with_link(lambda flag: link, options=options, task_dir=tmp_path / "Training0") == ExitCode.OK
        )
    assert window["last"] - window["first"] <= iterations / 100, reads.by_call
