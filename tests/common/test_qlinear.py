"""Tests for the packed quantized linear layers, their matmuls, weight_bytes and swap_linear."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lmforge.common.errors import UserError
from lmforge.common.qlinear import (
    CodebookQuantLinear,
    UniformQuantLinear,
    dequant_matmul,
    lut_matmul,
    swap_linear,
    weight_bytes,
)
from lmforge.common.quant import CodebookQuantized, UniformQuantized, pack_codes, quantize_rtn

# float32 summation order (blocks, LUT buckets, the compiled kernel's zero-point split
# s * (sum x (q - c) - (z - c) sum x)) differs from one F.linear. NOTE: an absolute 1e-5 was below the
# noise: on 70-column rows float32 F.linear itself is 1.2e-5 from the float64 result and the compiled
# kernel 2.2e-5 (2-bit, one group a row, 3000 random inputs), so auto (now the compiled kernel) failed
# about one run in eight. 1e-4 keeps a 4x margin over that noise and stays far below the effect of a
# wrong code or scale (about |s x|, 0.1 and up here).
ATOL = 1e-4
RTOL = 1e-5


def _uniform(bits: int, group_size: int, sym: bool, act_order: bool, out_f: int = 40, in_f: int = 70, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out_f, in_f, generator=g)
    q = quantize_rtn(w, bits, group_size, sym)
    if act_order:
        # act-order: the groups are assigned to columns in a permuted order
        perm = torch.randperm(in_f, generator=g)
        g_idx = q.group_index()[perm].to(torch.int32)
        q = UniformQuantized(q.codes, q.scales, q.zeros, bits, q.group_size, sym, g_idx=g_idx)
    return q


def _codebook(bits: int, out_f: int = 50, in_f: int = 77, n_outliers: int = 3, seed: int = 0) -> CodebookQuantized:
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 2**bits, (out_f, in_f), generator=g, dtype=torch.uint8)
    table = torch.randn(out_f, 2**bits, generator=g)
    if not n_outliers:
        return CodebookQuantized(codes, table, bits)
    flat = torch.randperm(out_f * in_f, generator=g)[:n_outliers]
    vals = 5 * torch.randn(n_outliers, generator=g)
    return CodebookQuantized(codes, table, bits, flat // in_f, flat % in_f, vals)


# ---------------------------------------------------------------- UniformQuantLinear


@pytest.mark.parametrize("act_order", [False, True], ids=["plain", "g_idx"])
@pytest.mark.parametrize("sym", [False, True], ids=["asym", "sym"])
@pytest.mark.parametrize("group_size", [0, 32])
@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("kernel", ["auto", "dequant"])  # auto: the compiled kernel where it runs the layer
def test_uniform_forward_matches_dequantized_linear(kernel, bits, group_size, sym, act_order):
    q = _uniform(bits, group_size, sym, act_order)
    bias = torch.randn(40)
    m = UniformQuantLinear.from_quantized(q, bias, kernel=kernel)
    # codes really are packed: 32 // bits codes per int32 word
    assert m.qweight.dtype == torch.int32
    assert m.qweight.shape == (40, math.ceil(70 / (32 // bits)))
    assert torch.equal(m.qweight, pack_codes(q.codes, bits))
    assert (m.g_idx is not None) == act_order
    # the weight the module computes with is bit for bit the quantized weight
    assert torch.equal(m.dequantize_weight(), q.dequantize())
    x = torch.randn(3, 5, 70)
    want = F.linear(x, q.dequantize(), bias)
    torch.testing.assert_close(m(x), want, rtol=RTOL, atol=ATOL)
    # several blocks of rows (the last one partial) give the same result
    m.block_rows = 7
    torch.testing.assert_close(m(x), want, rtol=RTOL, atol=ATOL)


def test_uniform_act_order_is_not_plain_grouping():
    """The g_idx path must use g_idx: ignoring it would give a different weight."""
    q = _uniform(4, 32, False, act_order=True)
    plain = UniformQuantized(q.codes, q.scales, q.zeros, 4, 32, False)
    assert not torch.equal(q.dequantize(), plain.dequantize())
    m = UniformQuantLinear.from_quantized(q)
    assert torch.equal(m.dequantize_weight(), q.dequantize())


def test_uniform_to_quantized_round_trip_and_state_dict():
    q = _uniform(3, 32, True, act_order=True)
    m = UniformQuantLinear.from_quantized(q, torch.randn(40))
    back = m.to_quantized()
    assert torch.equal(back.codes, q.codes) and back.codes.dtype == torch.uint8
    assert torch.equal(back.scales, q.scales) and torch.equal(back.zeros, q.zeros)
    assert torch.equal(back.g_idx.long(), q.g_idx.long())
    assert (back.bits, back.group_size, back.sym) == (3, 32, True)
    assert set(m.state_dict()) == {"qweight", "scales", "zeros", "g_idx", "bias"}
    # an empty module of the same shape takes the state dict strictly and computes the same
    empty = UniformQuantLinear(70, 40, bits=3, group_size=32, sym=True, bias=True, act_order=True)
    empty.load_state_dict(m.state_dict())
    x = torch.randn(2, 70)
    assert torch.equal(empty(x), m(x))
    assert set(UniformQuantLinear(70, 40, bits=4).state_dict()) == {"qweight", "scales", "zeros"}


@pytest.mark.parametrize("kernel", ["auto", "dequant"])
def test_uniform_bfloat16_input_runs_in_input_dtype(kernel):
    q = _uniform(4, 32, False, False)
    bias = torch.randn(40)
    m = UniformQuantLinear.from_quantized(q, bias, kernel=kernel)
    x = torch.randn(4, 70).to(torch.bfloat16)
    y = m(x)
    assert y.dtype == torch.bfloat16
    if kernel == "dequant":  # the weight cast to bfloat16, a bfloat16 matmul
        want = F.linear(x, q.dequantize().to(torch.bfloat16), bias.to(torch.bfloat16))
        torch.testing.assert_close(y, want, rtol=2e-2, atol=2e-2)
    else:  # auto, 4 tokens: the compiled GEMV accumulates in float32 and rounds the output once
        want = F.linear(x.float(), q.dequantize(), bias)
        torch.testing.assert_close(y.float(), want, rtol=8e-3, atol=1e-2)


def test_uniform_cache_is_opt_in_and_invalidated():
    q = _uniform(4, 32, False, False)
    m = UniformQuantLinear.from_quantized(q)
    x = torch.randn(2, 70)
    m(x)
    assert m._cache is None  # nothing kept by default
    cached = UniformQuantLinear.from_quantized(q, cache_weight=True)
    torch.testing.assert_close(cached(x), m(x), rtol=RTOL, atol=ATOL)
    assert cached._cache is not None
    # new weights (a state dict copied in place) must not be served from the stale cache
    other = UniformQuantLinear.from_quantized(_uniform(4, 32, False, False, seed=1))
    cached.load_state_dict(other.state_dict())
    torch.testing.assert_close(cached(x), other(x), rtol=RTOL, atol=ATOL)


def test_dequant_matmul_function():
    q = _uniform(4, 32, False, True)
    qw = pack_codes(q.codes, 4)
    x = torch.randn(1, 70)
    bias = torch.randn(40)
    y = dequant_matmul(
        x, qw, q.scales, q.zeros, bits=4, in_features=70, group_size=32, g_idx=q.g_idx, bias=bias, block_rows=16
    )
    torch.testing.assert_close(y, F.linear(x, q.dequantize(), bias), rtol=RTOL, atol=ATOL)
    with pytest.raises(ValueError, match="69 features"):
        dequant_matmul(torch.randn(1, 69), qw, q.scales, q.zeros, bits=4, in_features=70, group_size=32)


def test_from_quantized_rejects_bad_shapes():
    q = _uniform(4, 32, False, False)
    bad = UniformQuantized(q.codes, q.scales[:, :2], q.zeros[:, :2], 4, 32, False)
    with pytest.raises(ValueError, match="scales/zeros"):
        UniformQuantLinear.from_quantized(bad)
    with pytest.raises(ValueError, match="bias"):
        UniformQuantLinear.from_quantized(q, torch.zeros(3))


# ---------------------------------------------------------------- codebooks


@pytest.mark.parametrize("method", ["auto", "lut", "gather"])
@pytest.mark.parametrize("bits", [3, 4])
def test_codebook_linear_matches_gather_reference_with_outliers(bits, method):
    q = _codebook(bits, n_outliers=5)
    bias = torch.randn(50)
    # auto: the compiled kernel where there is one; lut/gather: the PyTorch path with that method.
    kernel = "auto" if method == "auto" else "dequant"
    m = CodebookQuantLinear.from_quantized(q, bias, method=method, block_rows=16, kernel=kernel)
    assert m.n_outliers == 5
    w = q.dequantize()
    # the reference: codebook gather, outliers written over it
    ref_w = q.codebook.gather(1, q.codes.long())
    ref_w[q.outlier_rows, q.outlier_cols] = q.outlier_vals
    assert torch.equal(w, ref_w) and torch.equal(m.dequantize_weight(), ref_w)
    for x in (torch.randn(1, 77), torch.randn(3, 4, 77)):
        torch.testing.assert_close(m(x), F.linear(x, ref_w, bias), rtol=RTOL, atol=ATOL)
    # the outliers matter: without them the output differs
    plain = CodebookQuantLinear.from_quantized(CodebookQuantized(q.codes, q.codebook, bits), bias, method=method,
                                               kernel=kernel)
    assert (plain(torch.ones(1, 77)) - m(torch.ones(1, 77))).abs().max() > 1e-2


def test_codebook_round_trip_and_state_dict():
    q = _codebook(4, n_outliers=4)
    m = CodebookQuantLinear.from_quantized(q)
    back = m.to_quantized()
    assert torch.equal(back.codes, q.codes) and torch.equal(back.codebook, q.codebook)
    assert torch.equal(back.outlier_rows.long(), q.outlier_rows.long())
    assert torch.equal(back.outlier_cols.long(), q.outlier_cols.long())
    assert torch.equal(back.outlier_vals, q.outlier_vals)
    assert set(m.state_dict()) == {"qweight", "codebook", "outlier_rows", "outlier_cols", "outlier_vals"}
    no_out = CodebookQuantLinear.from_quantized(_codebook(4, n_outliers=0))
    assert set(no_out.state_dict()) == {"qweight", "codebook"}
    assert no_out.to_quantized().n_outliers == 0


@pytest.mark.parametrize("tokens", [1, 5], ids=["batch1", "batch5"])
@pytest.mark.parametrize("bits", [2, 3, 4])
def test_lut_matmul_exact_vs_gather(bits, tokens):
    g = torch.Generator().manual_seed(bits)
    codes = torch.randint(0, 2**bits, (96, 130), generator=g, dtype=torch.uint8)
    table = torch.randn(96, 2**bits, generator=g)
    x = torch.randn(tokens, 130, generator=g)
    want = x @ table.gather(1, codes.long()).T
    for method in ("lut", "gather", "auto"):
        got = lut_matmul(x, codes, table, method=method, block_rows=32)
        torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)
    # leading dimensions and a bias
    bias = torch.randn(96, generator=g)
    got = lut_matmul(x.view(tokens, 1, 130), codes, table, bias=bias, method="lut")
    torch.testing.assert_close(got, (want + bias).view(tokens, 1, 96), rtol=RTOL, atol=ATOL)


def test_lut_matmul_outliers_and_errors():
    q = _codebook(4, n_outliers=6)
    x = torch.randn(2, 77)
    got = lut_matmul(
        x,
        q.codes,
        q.codebook,
        outlier_rows=q.outlier_rows,
        outlier_cols=q.outlier_cols,
        outlier_vals=q.outlier_vals,
        method="lut",
    )
    torch.testing.assert_close(got, x @ q.dequantize().T, rtol=RTOL, atol=ATOL)
    with pytest.raises(ValueError, match="method"):
        lut_matmul(x, q.codes, q.codebook, method="fast")
    with pytest.raises(ValueError, match="rows"):
        lut_matmul(x, q.codes, q.codebook[:3])


# ---------------------------------------------------------------- weight_bytes / swap_linear


def test_weight_bytes_counts_packed_storage():
    q = _uniform(4, 32, False, True)  # 40 x 70, 3 groups, g_idx
    m = UniformQuantLinear.from_quantized(q, torch.zeros(40))
    words = math.ceil(70 / 8)
    assert weight_bytes(m) == 40 * words * 4 + 2 * 40 * 3 * 4 + 70 * 4  # bias excluded
    cb = CodebookQuantLinear.from_quantized(_codebook(3, n_outliers=5))  # 50 x 77, 10 codes a word
    assert weight_bytes(cb) == 50 * math.ceil(77 / 10) * 4 + 50 * 8 * 4 + 5 * (4 + 4 + 4)
    lin = nn.Linear(70, 40)
    assert weight_bytes(lin) == 40 * 70 * 4
    model = nn.Sequential(lin, nn.ReLU(), m)
    assert weight_bytes(model) == weight_bytes(lin) + weight_bytes(m)


def test_swap_linear_replaces_linear_and_conv1d():
    from transformers.pytorch_utils import Conv1D

    torch.manual_seed(0)
    model = nn.Module()
    model.block = nn.Module()
    model.block.lin = nn.Linear(64, 24)
    model.block.conv = Conv1D(24, 64)  # nf=24 outputs, nx=64 inputs; weight stored (64, 24)
    x = torch.randn(3, 64)
    for name in ("block.lin", "block.conv"):
        old = model.get_submodule(name)
        w = old.weight.detach().t() if name.endswith("conv") else old.weight.detach()
        q = quantize_rtn(w, 8, 0, False)
        new = UniformQuantLinear.from_quantized(q, old.bias.detach())
        returned = swap_linear(model, name, new)
        assert returned is old and model.get_submodule(name) is new
        assert new.source_type == ("Conv1D" if name.endswith("conv") else "Linear")
        torch.testing.assert_close(new(x), F.linear(x, q.dequantize(), old.bias), rtol=RTOL, atol=ATOL)
        # 8-bit codes are close to the original layer: same semantics y = x W^T + b
        torch.testing.assert_close(new(x), old(x), rtol=0, atol=0.05)
    # swapping a quantized layer again keeps the original source type
    again = UniformQuantLinear.from_quantized(quantize_rtn(torch.randn(24, 64), 4, 0, False))
    swap_linear(model, "block.conv", again)
    assert again.source_type == "Conv1D"


def test_swap_linear_errors():
    model = nn.Sequential(nn.Linear(8, 4), nn.ReLU())
    new = UniformQuantLinear(8, 4, bits=4)
    with pytest.raises(UserError, match="no module named 'missing'"):
        swap_linear(model, "missing", new)
    with pytest.raises(UserError, match="not a linear layer"):
        swap_linear(model, "1", new)
    with pytest.raises(ValueError, match="new module"):
        swap_linear(model, "0", UniformQuantLinear(8, 5, bits=4))
    swap_linear(model, "0", new)
    assert model[0] is new
