"""PyTorch's CPU int4 kernel behind UniformQuantLinear: its output is the dequantized reference."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from lmforge.common import int4_cpu
from lmforge.common.qlinear import UniformQuantLinear
from lmforge.common.quant import quantize_rtn

pytestmark = pytest.mark.skipif(not int4_cpu.available(), reason="this torch build has no CPU int4 kernel")


def _layer(out_f: int, in_f: int, group: int, seed: int = 0, sym: bool = False):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out_f, in_f, generator=g) * 0.05
    w[:, :group] += 0.2  # a one-sign group: zero points away from 8
    q = quantize_rtn(w, 4, group, sym)
    return q, torch.randn(5, in_f, generator=g)


@pytest.mark.parametrize("shape,group", [((48, 64), 32), ((192, 576), 64), ((32, 256), 128), ((16, 512), 256)])
def test_float32_kernel_equals_the_dequantized_reference(shape, group) -> None:
    q, x = _layer(*shape, group)
    assert int4_cpu.unsupported_reason(*shape, 4, group, False, "cpu") is None
    packed = int4_cpu.pack_int4(q.codes, q.scales, q.zeros, group)
    ref = (x.double() @ q.dequantize().double().T).float()
    y = int4_cpu.int4_matmul(x, packed, compute_dtype=None)
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)


def test_module_paths_agree(monkeypatch) -> None:
    from lmforge.common import lut_kernel

    calls = []
    real = int4_cpu.int4_matmul
    monkeypatch.setattr(int4_cpu, "int4_matmul", lambda *a, **k: calls.append(1) or real(*a, **k))
    q, x = _layer(64, 128, 64, seed=1, sym=True)
    bias = torch.randn(64)
    mods = {k: UniformQuantLinear.from_quantized(q, bias, kernel=k) for k in ("auto", "int4", "dequant")}
    w = q.dequantize()
    ref = F.linear(x, w, bias)
    # float32 input: auto is exact to the dequantized weight (compiled kernel or dequantize path);
    # int4 computes with bfloat16 activations.
    torch.testing.assert_close(mods["auto"](x), ref, rtol=1e-5, atol=1e-5)
    assert not calls and mods["auto"].int4_reason() is None
    ref_bf16_x = F.linear(x.bfloat16().float(), w, bias)
    torch.testing.assert_close(mods["int4"](x), ref_bf16_x, rtol=1e-2, atol=1e-2)
    assert mods["int4"](x).dtype == torch.float32 and len(calls) == 2
    # bfloat16 input of many tokens: auto takes the int4 kernel (its scales and zeros in bfloat16, as the
    # kernel needs); of a few tokens, the compiled GEMV where there is one (faster on small layers).
    xb = torch.randn(lut_kernel.GEMV_MAX_TOKENS + 3, 128, generator=torch.Generator().manual_seed(2)).bfloat16()
    yb = mods["auto"](xb)
    assert len(calls) == 3
    assert yb.dtype == torch.bfloat16
    # NOTE: the int4 kernel rounds scales and zero offsets to bfloat16 (2^-9 relative each) and its output
    # to bfloat16 (half an ulp: 0.016 at |y| ~ 4 here), so an element near 0 can be 0.013 off in absolute
    # terms (seen with an unseeded input); a wrong kernel is off by O(1). atol 3e-2 keeps that margin.
    torch.testing.assert_close(yb.float(), F.linear(xb.float(), w, bias), rtol=1e-2, atol=3e-2)
    mods["auto"](xb[:2])
    assert len(calls) == (3 if lut_kernel.available() else 4)
    n = len(calls)
    # The packed weight follows in-place edits of the codes (no stale cache).
    with torch.no_grad():
        mods["auto"].scales.mul_(2.0)
    torch.testing.assert_close(mods["auto"](xb).float(), F.linear(xb.float(), 2 * w, bias), rtol=2e-2, atol=2e-2)
    assert len(calls) == n + 1
    # A module asked to cache its dense weight keeps doing so under auto (what ACBench's _dense_cache relies on).
    cached = UniformQuantLinear.from_quantized(q, bias, cache_weight=True)
    cached(xb)
    assert len(calls) == n + 1


@pytest.mark.parametrize(
    "args,needle",
    [((64, 96, 4, 64, False, "cpu"), "divisible by the group size"), ((40, 128, 4, 64, False, "cpu"), "by 16"),
     ((64, 128, 3, 64, False, "cpu"), "4-bit"), ((64, 128, 4, 0, False, "cpu"), "group size"),
     ((64, 128, 4, 64, True, "cpu"), "act-order"), ((64, 128, 4, 16, False, "cpu"), "group size")],
)
def test_layers_the_kernel_cannot_run_are_named(args, needle) -> None:
    assert needle in int4_cpu.unsupported_reason(*args)


def test_forced_kernel_on_a_layer_that_does_not_fit_warns_once_and_is_exact() -> None:
    q = quantize_rtn(torch.randn(64, 96) * 0.05, 4, 0, False)  # per-channel: no kernel
    mod = UniformQuantLinear.from_quantized(q, kernel="int4")
    x = torch.randn(3, 96)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y1, y2 = mod(x), mod(x)
    assert len([w for w in caught if "int4 kernel unavailable" in str(w.message)]) == 1
    torch.testing.assert_close(y1, F.linear(x, q.dequantize()), rtol=1e-5, atol=1e-5)
    assert torch.equal(y1, y2)
    with pytest.raises(ValueError, match="kernel"):
        UniformQuantLinear(8, 16, bits=4, kernel="fast")


def test_kernel_choice_is_checked_and_set_on_every_uniform_layer(monkeypatch) -> None:
    from torch import nn

    from lmforge.common.errors import UserError
    from lmforge.common.qlinear import check_kernel, set_kernel

    q = quantize_rtn(torch.randn(32, 64) * 0.05, 4, 32, False)
    model = nn.Sequential(UniformQuantLinear.from_quantized(q), nn.ReLU(), UniformQuantLinear.from_quantized(q))
    assert set_kernel(model, "dequant") == 2 and {m.kernel for m in model if hasattr(m, "kernel")} == {"dequant"}
    with pytest.raises(UserError, match="--kernel must be one of"):
        check_kernel("fast")
    monkeypatch.setattr(int4_cpu, "available", lambda: False)
    with pytest.raises(UserError, match="no CPU int4 matmul"):
        set_kernel(model, "int4")
    assert {m.kernel for m in model if hasattr(m, "kernel")} == {"dequant"}  # nothing changed
    check_kernel("auto")  # auto never needs the kernel
