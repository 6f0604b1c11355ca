"""trainer.system.torch_compat: the fallbacks for torch APIs newer than the engine's torch (spec §11 item 1).

Facts: the fallback is bitwise the native ``get_total_norm`` where torch has it (so seeded runs do not
change), and bitwise what ``clip_grad_norm_`` reports on every torch (the engine's 2.5.1 included, where
it is the only reference there is).
"""

from __future__ import annotations

import math

import pytest
import torch

from trainer.system.torch_compat import total_norm, total_norm_fallback

SHAPES_AND_SCALES = (((129, 64), 1e-3), ((64,), 3.0), ((64, 8), 1e4), ((8,), 0.5), ((1,), 0.0))


def _grads(seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator) * scale for shape, scale in SHAPES_AND_SCALES]


@pytest.mark.parametrize("seed", range(20))
def test_fallback_is_bitwise_what_clip_grad_norm_reports(seed: int) -> None:
    grads = _grads(seed)
    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    for param, grad in zip(params, grads, strict=True):
        param.grad = grad.clone()
    reported = torch.nn.utils.clip_grad_norm_(params, max_norm=math.inf)
    fallback = total_norm_fallback(grads)
    assert fallback.dtype == torch.float32 and fallback.shape == ()
    assert torch.equal(fallback, reported)
    for param, grad in zip(params, grads, strict=True):
        assert torch.equal(param.grad, grad)  # an infinite max_norm leaves the gradients alone


@pytest.mark.parametrize("seed", range(20))
def test_fallback_is_bitwise_the_native_function_where_torch_has_it(seed: int) -> None:
    native = getattr(torch.nn.utils, "get_total_norm", None)
    if native is None:
        pytest.skip(f"torch {torch.__version__} has no get_total_norm: the clip_grad_norm_ test covers it")
    grads = _grads(seed)
    assert torch.equal(total_norm_fallback(grads), native(grads))
    assert torch.equal(total_norm(grads), native(grads))


def test_closed_form_and_edge_cases() -> None:
    # One vector (3, 4) and one (12,): the norm of the concatenation is 13.
    three_four = torch.tensor([3.0, 4.0])
    twelve = torch.tensor([12.0])
    assert total_norm([three_four, twelve]).item() == 13.0
    assert total_norm_fallback([three_four, twelve]).item() == 13.0
    assert total_norm_fallback([]).item() == 0.0
    mixed = total_norm_fallback([three_four.double(), twelve])  # two dtype groups, one result
    assert mixed.item() == 13.0
    assert math.isinf(total_norm_fallback([torch.tensor([math.inf, 1.0])]).item())
    assert math.isnan(total_norm_fallback([torch.tensor([math.nan])]).item())
