"""FP8 casts, the FP8 linear's autograd and the counters, against closed forms and naive computations."""

from __future__ import annotations

import pytest
import torch

from lmforge.methods.unit_scaling.fp8 import (E4M3_MAX, E5M2_MAX, FP8Counters, cast_e4m3, cast_e5m2, count_cast,
                                              fp8_linear)


def _all_finite(dtype: torch.dtype) -> torch.Tensor:
    vals = torch.arange(256, dtype=torch.uint8).view(dtype).float()
    return vals[torch.isfinite(vals)]


def test_format_maxima_are_the_paper_formats():
    assert E4M3_MAX == 448.0
    assert E5M2_MAX == 57344.0


@pytest.mark.parametrize("cast,dtype", [(cast_e4m3, torch.float8_e4m3fn), (cast_e5m2, torch.float8_e5m2)])
def test_every_representable_value_round_trips_exactly(cast, dtype):
    vals = _all_finite(dtype)
    assert vals.numel() > 200
    assert torch.equal(cast(vals), vals)


def test_saturation_instead_of_nan():
    x = torch.tensor([449.0, 1e6, -1e9, float("inf"), -float("inf")])
    assert cast_e4m3(x).tolist() == [448.0, 448.0, -448.0, 448.0, -448.0]
    y = torch.tensor([6e4, 1e9, -1e12])
    assert cast_e5m2(y).tolist() == [57344.0, 57344.0, -57344.0]
    # The raw PyTorch cast is what the clamp guards against: E5M2 has inf, so out of range becomes inf
    # (and e4m3fn, which has no inf, gives NaN on some PyTorch versions/backends).
    assert torch.isinf(torch.tensor([1e6]).to(torch.float8_e5m2).float()).all()


def test_round_to_nearest_even_closed_forms():
    # E4M3 has 3 mantissa bits: spacing 1/8 in [1, 2). 1 + 1/16 is a tie -> even (1.0);
    # 1 + 3/16 is a tie between 1.125 (odd) and 1.25 (even) -> 1.25; 1 + 1/16 + 1e-3 -> 1.125.
    x = torch.tensor([1 + 1 / 16, 1 + 3 / 16, 1 + 1 / 16 + 1e-3, 300.0])
    assert cast_e4m3(x).tolist() == [1.0, 1.25, 1.125, 288.0]  # 300 in [256, 512): spacing 32
    # E5M2: 2 mantissa bits, spacing 1/4 in [1, 2).
    assert cast_e5m2(torch.tensor([1.1, 1.2, 1 + 1 / 8])).tolist() == [1.0, 1.25, 1.0]


def test_underflow_closed_form_and_counting():
    # Smallest subnormals: E4M3 2^-9, E5M2 2^-16; anything below half of that rounds to 0.
    x = torch.tensor([2.0 ** -9, 2.0 ** -11, -(2.0 ** -12), 0.0, 1.0, 500.0])
    xq = cast_e4m3(x)
    assert xq.tolist() == [2.0 ** -9, 0.0, -0.0, 0.0, 1.0, 448.0]
    assert count_cast(x, xq, E4M3_MAX) == (2, 1, 6)  # zero itself is not an underflow
    g = torch.tensor([2.0 ** -16, 2.0 ** -18, 1e5])
    assert count_cast(g, cast_e5m2(g), E5M2_MAX) == (1, 1, 3)


def test_fp8_linear_forward_and_backward_against_naive():
    torch.manual_seed(0)
    x = (torch.randn(3, 5, 16) * 3).requires_grad_()
    w = torch.randn(8, 16).requires_grad_()
    alpha = 16 ** -0.5
    y = fp8_linear(x, w, alpha)
    naive = (cast_e4m3(x.detach()) @ cast_e4m3(w.detach()).t()) * alpha
    assert torch.allclose(y, naive, atol=1e-5)
    assert not torch.allclose(y, (x.detach() @ w.detach().t()) * alpha, atol=1e-3)  # the cast matters
    g = torch.randn(3, 5, 8) * 0.37
    y.backward(g)
    gq = cast_e5m2(g)
    assert not torch.equal(gq, g)
    ex_x = (gq @ cast_e4m3(w.detach())) * alpha
    ex_w = (gq.reshape(-1, 8).t() @ cast_e4m3(x.detach()).reshape(-1, 16)) * alpha
    assert torch.allclose(x.grad, ex_x, atol=1e-5)
    assert torch.allclose(w.grad, ex_w, atol=1e-4)


def test_static_grad_scale_rescues_tiny_gradients():
    torch.manual_seed(1)
    x = torch.randn(4, 8).requires_grad_()
    w = torch.randn(4, 8)
    g = torch.randn(4, 4) * 1e-7  # far below E5M2's smallest subnormal 2^-16 = 1.5e-5
    fp8_linear(x, w, 1.0).backward(g)
    assert torch.count_nonzero(x.grad) == 0
    x.grad = None
    s = 2.0 ** 20
    fp8_linear(x, w, 1.0, grad_scale=s).backward(g)
    expected = (cast_e5m2(g * s) / s) @ cast_e4m3(w)
    assert torch.allclose(x.grad, expected, rtol=1e-5, atol=0)
    assert torch.count_nonzero(x.grad) == x.numel()


def test_counters_match_naive_counts():
    torch.manual_seed(2)
    c = FP8Counters()
    x = (torch.randn(6, 32) * 1e-3).requires_grad_()  # many E4M3 underflows
    w = torch.randn(10, 32) * 300  # some overflows
    g = torch.randn(6, 10) * 1e-4
    fp8_linear(x, w, 0.1, c, "lin").backward(g)
    rec = c.stats["lin"]
    xd = x.detach()
    assert rec["activation"] == [int(((xd != 0) & (cast_e4m3(xd) == 0)).sum()), 0, xd.numel()]
    assert rec["weight"] == [0, int((w.abs() > 448).sum()), w.numel()]
    assert rec["gradient"][0] == int(((g != 0) & (cast_e5m2(g) == 0)).sum())
    assert rec["activation"][0] > 0 and rec["weight"][1] > 0
    tot = c.totals()
    assert tot["total"] == xd.numel() + w.numel() + g.numel()
    c.enabled = False
    fp8_linear(x, w, 0.1, c, "lin")
    assert c.totals()["total"] == tot["total"]


@pytest.mark.gpu
def test_scaled_mm_path_matches_simulation_on_cuda():
    if not torch.cuda.is_available() or not hasattr(torch, "_scaled_mm"):
        pytest.skip("needs CUDA with torch._scaled_mm")
    torch.manual_seed(0)
    x = torch.randn(32, 64, device="cuda")
    w = torch.randn(48, 64, device="cuda")
    y = fp8_linear(x, w, 0.125)
    ref = (cast_e4m3(x.cpu()) @ cast_e4m3(w.cpu()).t()) * 0.125
    assert torch.allclose(y.cpu(), ref, rtol=1e-3, atol=1e-3)
