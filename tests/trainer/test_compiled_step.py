"""The compiled step is the fused step: same draws, same objective, same gradients.

Facts checked: the pure function ``make_loss_and_grads`` (what gets compiled) returns autograd's loss
and gradients for every activation, with and without an output Denormalize and observation noise; a
FusedStep built with ``compiled=True`` draws the same random numbers as the eager one and agrees with it
to float rounding, and reproduces itself bit for bit under a seed; a compilation failure falls back to
the eager step with one warning and loses no draw; the option is validated."""

from __future__ import annotations

import copy
import itertools
import shutil

import pytest
import torch

import trainer.training.steps.fused as fused_step_module
from tests.support.fused import BATCH, assert_same, engine_model, everything
from trainer.training.flow import TimeDistribution
from trainer.training.steps.autograd import make_optimizer
from trainer.training.steps.compiled import (
    FlatLayout,
    compile_unavailable,
    compile_wanted,
    make_flat_step,
    make_loss_and_grads,
)
from trainer.training.steps.fused import FusedStep


def autograd_loss_and_grads(
    activations: list[str],
    inputs: dict[str, torch.Tensor],
    weights: list[torch.Tensor],
    biases: list[torch.Tensor],
) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """The same objective written with autograd and torch's own activations."""
    w = [x.clone().requires_grad_(True) for x in weights]
    b = [x.clone().requires_grad_(True) for x in biases]
    z = inputs["latents"][inputs["idx"]]
    if inputs["noise"] is not None:
        z = z + inputs["noise"]
    x1 = inputs["x1_all"][inputs["idx"]]
    x0, t = inputs["x0"], inputs["t"]
    xt = (1 - t) * x0 + t * x1
    h = torch.cat((z, (xt - inputs["x_mean"]) / inputs["x_std"], t), 1)
    act = {"ELU": torch.nn.functional.elu, "ReLU": torch.relu, "TanH": torch.tanh}
    for k in range(len(w)):
        h = torch.nn.functional.linear(h, w[k], b[k])
        if k < len(w) - 1:
            h = act[activations[k]](h)
    if inputs["out_mean"] is not None:
        h = inputs["out_mean"] + h * inputs["out_std"]
    u = (x1 - x0 - inputs["v_mean"]) / inputs["v_std"]
    loss = torch.nn.functional.mse_loss(h, u)
    loss.backward()  # type: ignore[no-untyped-call]
    return loss.detach(), [x.grad for x in w], [x.grad for x in b]  # type: ignore[misc]


@pytest.mark.parametrize("activation", ["ELU", "ReLU", "TanH"])
@pytest.mark.parametrize("denormalize", [False, True])
@pytest.mark.parametrize("noise_scale", [0.0, 0.3])
def test_the_hand_written_backward_is_autograds(
    activation: str, denormalize: bool, noise_scale: float
) -> None:
    gen = torch.Generator().manual_seed(17)
    rows, latent, action, hidden, batch = 50, 5, 3, 16, 12
    widths = [latent + action + 1, hidden, hidden, action]
    weights = [torch.randn(o, i, generator=gen) * 0.5 for i, o in itertools.pairwise(widths)]
    biases = [torch.randn(o, generator=gen) * 0.1 for o in widths[1:]]
    inputs: dict[str, torch.Tensor | None] = {
        "latents": torch.randn(rows, latent, generator=gen),
        "x1_all": torch.randn(rows, action, generator=gen) * 2 + 1,
        "idx": torch.randint(rows, (batch,), generator=gen),
        "x0": torch.randn(batch, action, generator=gen),
        "t": torch.rand(batch, 1, generator=gen),
        "noise": noise_scale * torch.randn(batch, latent, generator=gen) if noise_scale > 0 else None,
        "x_mean": torch.randn(action, generator=gen),
        "x_std": torch.rand(action, generator=gen) + 0.5,
        "v_mean": torch.randn(action, generator=gen),
        "v_std": torch.rand(action, generator=gen) + 0.5,
        "out_mean": torch.randn(action, generator=gen) if denormalize else None,
        "out_std": torch.rand(action, generator=gen) + 0.5 if denormalize else None,
    }
    activations = [activation, activation]
    function = make_loss_and_grads(activations)
    loss, grad_w, grad_b = function(
        inputs["latents"],
        inputs["x1_all"],
        inputs["idx"],
        inputs["x0"],
        inputs["t"],
        inputs["noise"],
        weights,
        biases,
        inputs["x_mean"],
        inputs["x_std"],
        inputs["v_mean"],
        inputs["v_std"],
        inputs["out_mean"],
        inputs["out_std"],
    )
    ref_loss, ref_w, ref_b = autograd_loss_and_grads(activations, inputs, weights, biases)  # type: ignore[arg-type]
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    for mine, ref in zip(grad_w + grad_b, ref_w + ref_b, strict=True):
        torch.testing.assert_close(mine, ref, rtol=1e-4, atol=1e-6)


def test_the_flat_step_lays_gradients_out_like_the_parameters_and_sums_the_norm_in_double() -> None:
    gen = torch.Generator().manual_seed(5)
    rows, latent, action, hidden, batch = 40, 3, 2, 6, 10
    widths = [latent + action + 1, hidden, action]
    shapes = [(hidden, widths[0]), (hidden,), (action, hidden), (action,)]
    # Blocks padded to 16 floats, in an order that is not the network's (the optimiser's order rules).
    order = [2, 0, 3, 1]
    offsets, at = {}, 0
    for i in order:
        offsets[i] = at
        at += -(-torch.Size(shapes[i]).numel() // 16) * 16
    layout = FlatLayout(
        blocks=tuple((offsets[i], shapes[i]) for i in range(4)), layers=((0, 1), (2, 3)), size=at
    )
    flat = torch.zeros(at)
    params = [flat[o : o + torch.Size(sh).numel()].view(sh) for o, sh in layout.blocks]
    for p in params:
        p.copy_(torch.randn(p.shape, generator=gen))
    args = (
        torch.randn(rows, latent, generator=gen),
        torch.randn(rows, action, generator=gen),
        torch.randint(rows, (batch,), generator=gen),
        torch.randn(batch, action, generator=gen),
        torch.rand(batch, 1, generator=gen),
        None,
    )
    stats = (torch.zeros(action), torch.ones(action), torch.zeros(action), torch.ones(action), None, None)
    metrics, grads = make_flat_step(["TanH"], layout)(*args, flat, *stats)
    loss, grad_w, grad_b = make_loss_and_grads(["TanH"])(
        *args, [params[0], params[2]], [params[1], params[3]], *stats
    )
    assert grads.shape == flat.shape
    for (offset, shape), expected in zip(
        layout.blocks, [grad_w[0], grad_b[0], grad_w[1], grad_b[1]], strict=True
    ):
        assert torch.equal(grads[offset : offset + torch.Size(shape).numel()].view(shape), expected)
    used = torch.zeros(at, dtype=torch.bool)
    for offset, shape in layout.blocks:
        used[offset : offset + torch.Size(shape).numel()] = True
    assert torch.count_nonzero(grads[~used]) == 0 and int((~used).sum()) > 0  # padding stays 0
    assert metrics.dtype == torch.float64
    assert metrics[0].item() == pytest.approx(loss.item(), rel=1e-6)
    assert metrics[1].item() == pytest.approx(torch.linalg.vector_norm(grads.double()).item(), rel=1e-12)
    with pytest.raises(ValueError, match="overlap"):
        FlatLayout(blocks=((0, (4,)), (2, (4,))), layers=((0, 1),), size=8)
    with pytest.raises(ValueError, match="past the buffer's size 7"):
        FlatLayout(blocks=((0, (4,)), (4, (4,))), layers=((0, 1),), size=7)
    # Squares summed in float64: a finite gradient whose float32 square overflows keeps a finite norm.
    huge = torch.full((4,), 3e30)
    assert torch.isinf((huge * huge).sum()) and torch.isfinite(huge.double().square().sum().sqrt())


def run_fused(
    model: object, data: object, steps: int, *, compiled: bool
) -> tuple[FusedStep, torch.Generator]:
    generator = torch.Generator().manual_seed(13)
    optimizer = make_optimizer(model, 3e-3, 1e-3)  # type: ignore[arg-type]
    fused = FusedStep.build(
        model,  # type: ignore[arg-type]
        optimizer,
        model.tensor_data(data),  # type: ignore[attr-defined]
        BATCH,
        generator,
        TimeDistribution.logit_normal(0.0, 1.0),
        0.1,
        compiled=compiled,
    )
    assert fused is not None
    for i in range(steps):
        fused.step(i)
    return fused, generator


@pytest.mark.slow
@pytest.mark.skipif(
    compile_unavailable(torch.device("cpu")) is not None, reason="no C++ compiler for inductor"
)
def test_compiled_step_matches_the_eager_step_and_reproduces_itself(
    capsys: pytest.CaptureFixture[str],
) -> None:
    base, data = engine_model(layers=2)
    eager_model, compiled_model, again_model = copy.deepcopy(base), copy.deepcopy(base), copy.deepcopy(base)
    eager, eager_gen = run_fused(eager_model, data, 25, compiled=False)
    compiled, compiled_gen = run_fused(compiled_model, data, 25, compiled=True)
    again, _ = run_fused(again_model, data, 25, compiled=True)
    assert compiled.compiling and again.compiling  # no fallback happened
    captured = capsys.readouterr()
    assert "torch.compile failed" not in captured.out + captured.err
    assert torch.equal(eager_gen.get_state(), compiled_gen.get_state())  # the same draws, in order
    assert_same(
        everything(eager_model, eager.optimizer), everything(compiled_model, compiled.optimizer), exact=False
    )
    assert_same(
        everything(compiled_model, compiled.optimizer), everything(again_model, again.optimizer), exact=True
    )


def test_a_failed_compilation_falls_back_to_the_eager_step_without_losing_a_draw(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(activations: object, layout: object) -> object:
        def fail(*args: object) -> None:
            raise RuntimeError("InductorError: no working C++ compiler\nmore detail")

        return fail

    monkeypatch.setattr(fused_step_module, "compile_flat_step", broken)
    base, data = engine_model()
    eager_model, fallback_model = copy.deepcopy(base), copy.deepcopy(base)
    eager, eager_gen = run_fused(eager_model, data, 12, compiled=False)
    fallback, fallback_gen = run_fused(fallback_model, data, 12, compiled=True)
    assert not fallback.compiling
    captured = capsys.readouterr()
    err = captured.out + captured.err
    assert err.count("torch.compile failed (InductorError: no working C++ compiler)") == 1
    assert torch.equal(eager_gen.get_state(), fallback_gen.get_state())
    assert_same(
        everything(eager_model, eager.optimizer), everything(fallback_model, fallback.optimizer), exact=True
    )


def test_the_compile_option_is_validated_and_explains_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    assert compile_wanted("off", cpu) == (False, "compile is off")
    with pytest.raises(ValueError, match="must be 'on' or 'off', got 'auto'"):
        compile_wanted("auto", cpu)
    with pytest.raises(ValueError, match="got ''"):
        compile_wanted("", cpu)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    wanted, why = compile_wanted(" ON ", cpu)
    assert not wanted
    assert "no C++ compiler" in why
    assert "not used on device type 'meta'" in str(compile_unavailable(torch.device("meta")))
