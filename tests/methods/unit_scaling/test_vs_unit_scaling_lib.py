"""µS against Graphcore's ``unit-scaling`` 0.3.5 (u-µP): where the rules agree and where they differ.

* Linear: both init N(0, 1) and scale the output by 1/sqrt(fan_in); the input gradient agrees too
  (u-µP's "to_output_scale" constraint). The weight gradient differs: µS applies α inside the GEMM,
  so it is the true gradient α·gᵀx, while u-µP scales it by 1/sqrt(batch) instead.
* Residual: u-µP's residual_split/residual_add with ratio t give skip 1/sqrt(1+t²) and branch
  t/sqrt(1+t²); with t = sqrt(τ/(1-τ)) that is µS's sqrt(1-τ), sqrt(τ) in the forward pass and for
  the gradient reaching x. The gradient reaching the branch's own parameters differs: µS scales it by
  sqrt(τ) (a plain product), u-µP leaves it unscaled (its scale_fwd has an identity backward).
* FP8: u-µP's FPFormat(4, 3) is E4M3 with max 240 (the "fnuz" layout), not float8_e4m3fn's 448, and it
  rounds stochastically by default. With round-to-nearest they agree on the shared normal range away
  from ties.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lmforge.methods.unit_scaling.fp8 import E4M3_MAX, E5M2_MAX, cast_e4m3
from lmforge.methods.unit_scaling.model import MuSLinear

us = pytest.importorskip("unit_scaling")
U = pytest.importorskip("unit_scaling.functional")
formats = pytest.importorskip("unit_scaling.formats")


def test_linear_forward_and_input_grad_agree_weight_grad_differs_by_closed_form():
    torch.manual_seed(0)
    fan_in, fan_out, batch = 96, 40, 24
    ours = MuSLinear(fan_in, fan_out)
    w = ours.weight.detach().clone().requires_grad_()
    x1 = torch.randn(batch, fan_in, requires_grad=True)
    x2 = x1.detach().clone().requires_grad_()
    y1 = ours(x1)
    y2 = U.linear(x2, w, None)
    assert torch.allclose(y1, y2, atol=1e-5)
    g = torch.randn(batch, fan_out)
    y1.backward(g)
    y2.backward(g)
    assert torch.allclose(x1.grad, x2.grad, atol=1e-5)
    # ours: (1/sqrt(fan_in)) gᵀx;  u-µP: (1/sqrt(batch)) gᵀx.
    ratio = math.sqrt(fan_in) / math.sqrt(batch)
    assert torch.allclose(w.grad, ours.weight.grad * ratio, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(w.grad, ours.weight.grad, atol=1e-2)


def test_both_linears_init_unit_variance():
    torch.manual_seed(0)
    theirs = us.Linear(256, 256, bias=False)
    ours = MuSLinear(256, 256)
    for w in (theirs.weight.detach(), ours.weight.detach()):
        assert abs(float(w.std()) - 1.0) < 0.02


def test_residual_rules_agree_forward_and_on_x_but_not_on_branch_parameters():
    torch.manual_seed(0)
    tau = 0.4
    t = math.sqrt(tau / (1 - tau))
    d = 32
    lin = torch.nn.Linear(d, d, bias=False)
    x = torch.randn(16, d)

    def branch(h):
        return F.layer_norm(lin(h), (d,))

    xa = x.clone().requires_grad_()
    ours = math.sqrt(1 - tau) * xa + math.sqrt(tau) * branch(xa)
    xb = x.clone().requires_grad_()
    r, s = U.residual_split(xb, tau=t)
    theirs = U.residual_add(branch(r), s, tau=t)
    assert torch.allclose(ours, theirs, atol=1e-6)

    g = torch.randn(16, d)
    ours.backward(g)
    gw_ours = lin.weight.grad.clone()
    lin.weight.grad = None
    theirs.backward(g)
    gw_theirs = lin.weight.grad.clone()
    assert torch.allclose(xa.grad, xb.grad, atol=1e-5)
    assert torch.allclose(gw_ours, math.sqrt(tau) * gw_theirs, atol=1e-5)


def test_fp8_format_maxima_differ_as_documented():
    e4 = formats.FPFormat(4, 3)
    e5 = formats.FPFormat(5, 2)
    assert e4.max_absolute_value == 240.0 and E4M3_MAX == 448.0
    assert e5.max_absolute_value == E5M2_MAX == 57344.0
    assert e4.rounding == "stochastic"
    x = torch.tensor([300.0, -1000.0])
    assert formats.FPFormat(4, 3, rounding="nearest").quantise(x).tolist() == [240.0, -240.0]
    assert cast_e4m3(x).tolist() == [288.0, -448.0]


def test_nearest_rounding_agrees_on_the_shared_normal_range():
    torch.manual_seed(0)
    e4 = formats.FPFormat(4, 3, rounding="nearest")
    mag = torch.exp2(torch.empty(20000).uniform_(-6, math.log2(240)))
    x = mag * torch.where(torch.rand(20000) < 0.5, -1.0, 1.0)
    # Drop exact ties (u-µP's bit trick rounds ties toward zero, torch to even): for E4M3 a tie has
    # its low 20 float32 mantissa bits equal to 1 << 19.
    low = x.view(torch.int32) & ((1 << 20) - 1)
    x = x[low != (1 << 19)]
    assert torch.equal(e4.quantise(x), cast_e4m3(x))


def test_stochastic_rounding_is_unbiased_where_ours_is_deterministic():
    torch.manual_seed(0)
    e4 = formats.FPFormat(4, 3)  # default: stochastic
    v = 1 + 2.0 ** -5  # a quarter of the way from 1.0 to 1.125
    q = e4.quantise(torch.full((4000,), v))
    assert set(q.unique().tolist()) == {1.0, 1.125}
    assert abs(float(q.mean()) - v) < 0.005
    assert cast_e4m3(torch.full((4000,), v)).unique().tolist() == [1.0]
