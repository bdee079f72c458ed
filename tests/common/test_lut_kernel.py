"""lmforge's compiled CPU kernel (lmforge.common.lut_kernel) behind the packed layers.

Every output is checked against the dequantized reference ``x @ W_deq^T + b`` computed in float64;
the fallback (no compiler) and the explicit-request errors are checked with the compiler pointed at a
missing file.
"""

from __future__ import annotations

import copy
import os
import pickle
import shutil
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lmforge.common import lut_kernel
from lmforge.common.errors import UserError
from lmforge.common.qlinear import CodebookQuantLinear, UniformQuantLinear, check_kernel, set_kernel
from lmforge.common.quant import CodebookQuantized, UniformQuantized, quantize_rtn

needs_cc = pytest.mark.skipif(shutil.which(lut_kernel.COMPILER) is None,
                              reason=f"no C compiler '{lut_kernel.COMPILER}' to build the kernel")


@pytest.fixture
def no_compiler(monkeypatch, tmp_path):
    """The compiler is a missing file and nothing is cached: the kernel cannot be had."""
    monkeypatch.setenv("LMFORGE_CACHE", str(tmp_path))
    monkeypatch.setattr(lut_kernel, "COMPILER", str(tmp_path / "no-such-cc"))
    lut_kernel._reset()
    yield
    lut_kernel._reset()


def _codebook(bits, out_f, in_f, n_outliers=0, outlier_row=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 2**bits, (out_f, in_f), generator=g, dtype=torch.uint8)
    table = torch.sort(torch.randn(out_f, 2**bits, generator=g), dim=1).values
    if not n_outliers and outlier_row is None:
        return CodebookQuantized(codes, table, bits)
    flat = torch.randperm(out_f * in_f, generator=g)[:n_outliers]
    rows, cols = flat // in_f, flat % in_f
    if outlier_row is not None:  # a whole full-precision row (GANQ's outlier rows)
        keep = rows != outlier_row
        rows = torch.cat([rows[keep], torch.full((in_f,), outlier_row)])
        cols = torch.cat([cols[keep], torch.arange(in_f)])
    vals = 4 * torch.randn(rows.numel(), generator=g)
    return CodebookQuantized(codes, table, bits, rows, cols, vals)


def _ref(x, w, bias):
    y = x.double() @ w.double().T
    return (y if bias is None else y + bias.double()).float()


def _close(y, want):
    scale = max(1.0, float(want.abs().max()))
    torch.testing.assert_close(y, want, rtol=1e-5, atol=2e-5 * scale)


# ---------------------------------------------------------------- codebook (GANQ)


@needs_cc
@pytest.mark.parametrize("tokens", [1, 3, lut_kernel.GEMV_MAX_TOKENS + 5], ids=["batch1", "batch3", "many"])
@pytest.mark.parametrize("shape", [(37, 133), (130, 1000), (5, 16)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("bits", [1, 2, 3, 4])
def test_codebook_kernel_equals_the_dequantized_reference(bits, shape, tokens):
    out_f, in_f = shape
    q = _codebook(bits, out_f, in_f, n_outliers=7, outlier_row=out_f // 2, seed=bits)
    bias = torch.randn(out_f)
    m = CodebookQuantLinear.from_quantized(q, bias, kernel="native", block_rows=16)
    w = q.dequantize()
    assert torch.equal(m.dequantize_weight(), w)
    x = torch.randn(tokens, 2, in_f)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the compiled kernel really ran: no fallback warning
        y = m(x)
    assert m._native is not None and y.shape == (tokens, 2, out_f)
    _close(y, _ref(x, w, bias))
    # outliers and bias both matter (an implementation that drops either fails above)
    plain = CodebookQuantLinear.from_quantized(CodebookQuantized(q.codes, q.codebook, bits), kernel="native")
    assert (plain(x) - y).abs().max() > 1e-2


@needs_cc
def test_codebook_dequant_rows_are_bit_exact_and_threads_agree(monkeypatch):
    q = _codebook(3, 96, 250, seed=3)
    m = CodebookQuantLinear.from_quantized(q, kernel="native")
    x = torch.randn(1, 250)
    y1 = m(x)
    nat = m._native[1]
    assert torch.equal(nat.dequant(0, 96), q.dequantize())
    assert torch.equal(nat.dequant(10, 23), q.dequantize()[10:23])
    # two threads split the rows: each row is still summed by one thread in the same order
    monkeypatch.setattr(lut_kernel, "PARALLEL_MIN_MACS", 0)
    n = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert torch.equal(m(x), y1)
    finally:
        torch.set_num_threads(n)


@needs_cc
def test_codebook_auto_uses_the_kernel_and_follows_in_place_edits():
    q = _codebook(4, 24, 70, n_outliers=3, seed=5)
    m = CodebookQuantLinear.from_quantized(q)  # kernel="auto"
    x = torch.randn(1, 70)
    _close(m(x), _ref(x, q.dequantize(), None))
    assert m._native is not None
    with torch.no_grad():
        m.codebook.mul_(2.0)
        m.outlier_vals.mul_(2.0)
    _close(m(x), _ref(x, 2 * q.dequantize(), None))
    # a reassigned buffer and a dtype move drop the compiled view of the old tensors
    with torch.no_grad():
        m.codebook = m.codebook * 1.5
        m.outlier_vals = m.outlier_vals * 1.5
    _close(m(x), _ref(x, 3 * q.dequantize(), None))
    m.to(torch.float64)
    assert m._native is None and m.codebook.dtype == torch.float64
    _close(m(x), _ref(x, 3 * q.dequantize(), None))
    m.to(torch.float32)
    # bfloat16 in, bfloat16 out (accumulated in float32)
    yb = m(x.bfloat16())
    assert yb.dtype == torch.bfloat16
    torch.testing.assert_close(yb.float(), _ref(x.bfloat16().float(), 3 * q.dequantize(), None), rtol=8e-3, atol=1e-2)
    # a module that asked for its dense weight keeps it under auto
    cached = CodebookQuantLinear.from_quantized(q, cache_weight=True)
    cached(x)
    assert cached._native is None and cached._cache is not None


@needs_cc
def test_modules_with_a_kernel_view_deepcopy_pickle_and_keep_autograd():
    q = _codebook(3, 16, 40, n_outliers=2)
    m = CodebookQuantLinear.from_quantized(q, torch.randn(16))
    x = torch.randn(2, 40)
    y = m(x)
    assert m._native is not None
    for clone in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        assert clone._native is None
        assert torch.equal(clone(x), y)
    # an input that needs a gradient takes the PyTorch path (the kernel has no backward)
    xg = x.clone().requires_grad_(True)
    m(xg).sum().backward()
    torch.testing.assert_close(xg.grad, q.dequantize().sum(0).expand(2, 40), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- uniform (GPTQ / AWQ / RTN)


@needs_cc
@pytest.mark.parametrize("tokens", [1, 4, lut_kernel.GEMV_MAX_TOKENS + 1], ids=["batch1", "batch4", "many"])
@pytest.mark.parametrize(
    "bits,group,shape",
    [(4, 64, (37, 576)), (4, 128, (20, 1000)), (4, 256, (9, 640)), (4, 40, (12, 200)), (4, 0, (7, 77)),
     (4, 32, (64, 96)), (2, 64, (21, 300)), (3, 0, (13, 133)), (3, 30, (10, 95))],
    ids=lambda v: str(v),
)
def test_uniform_kernel_equals_the_dequantized_reference(bits, group, shape, tokens):
    out_f, in_f = shape
    g = torch.Generator().manual_seed(bits * 1000 + group)
    w = torch.randn(out_f, in_f, generator=g) * 0.05
    w[:, : max(group, 8)] += 0.3  # one-sign groups: zero points far from the centre
    q = quantize_rtn(w, bits, group, sym=False)
    bias = torch.randn(out_f, generator=g)
    m = UniformQuantLinear.from_quantized(q, bias, kernel="native")
    x = torch.randn(tokens, in_f, generator=g)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = m(x)
    assert m._native is not None
    _close(y, _ref(x, q.dequantize(), bias))
    assert torch.equal(m._native[1].dequant(0, out_f), q.dequantize())


@needs_cc
def test_uniform_layers_the_kernel_cannot_run_warn_once_and_stay_exact():
    w = torch.randn(24, 64) * 0.05
    cases = [quantize_rtn(w, 8, 32, False),  # 8-bit codes
             quantize_rtn(w, 3, 32, False)]  # 3-bit groups that split a 10-code word
    q = quantize_rtn(w, 4, 32, False)
    perm = torch.randperm(64)
    cases.append(UniformQuantized(q.codes, q.scales, q.zeros, 4, 32, False, g_idx=q.group_index()[perm].int()))
    x = torch.randn(2, 64)
    for qq in cases:
        m = UniformQuantLinear.from_quantized(qq, kernel="native")
        assert m.native_reason() is not None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            y1, y2 = m(x), m(x)
        assert len([c for c in caught if "native kernel unavailable" in str(c.message)]) == 1
        _close(y1, _ref(x, qq.dequantize(), None))
        assert torch.equal(y1, y2)
        auto = UniformQuantLinear.from_quantized(qq)  # auto falls back silently
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            _close(auto(x), _ref(x, qq.dequantize(), None))


# ---------------------------------------------------------------- no compiler, explicit requests


def test_without_a_compiler_auto_falls_back_with_one_warning_and_the_same_result(no_compiler):
    q = _codebook(4, 32, 70, n_outliers=4)
    uq = quantize_rtn(torch.randn(48, 32) * 0.05, 4, 16, False)
    model = nn.Sequential(CodebookQuantLinear.from_quantized(q, torch.randn(32)), nn.ReLU(),
                          UniformQuantLinear.from_quantized(uq))
    ref = copy.deepcopy(model)
    set_kernel(ref, "dequant")
    x = torch.randn(1, 70)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ys = [model(x) for _ in range(3)]
    lines = [str(c.message) for c in caught]
    assert len(lines) == 1 and "compiled kernel is unavailable" in lines[0] and "\n" not in lines[0], lines
    assert "no-such-cc" in lines[0]
    assert all(torch.equal(y, ref(x)) for y in ys)
    assert not lut_kernel.available() and lut_kernel.features()["path"] is None


def test_an_explicit_request_without_the_kernel_is_a_user_error(no_compiler):
    model = nn.Sequential(CodebookQuantLinear.from_quantized(_codebook(3, 8, 20)))
    for call in (lambda: check_kernel("native"), lambda: set_kernel(model, "native")):
        with pytest.raises(UserError, match="--kernel native: lmforge's compiled kernel is unavailable") as err:
            call()
        assert "\n" not in str(err.value)
    assert model[0].kernel == "auto"  # nothing changed
    check_kernel("auto")  # auto never needs the kernel


@needs_cc
def test_set_kernel_covers_both_layer_kinds_and_the_build_is_cached(monkeypatch):
    q = _codebook(3, 8, 20)
    uq = quantize_rtn(torch.randn(16, 64) * 0.05, 4, 32, False)
    model = nn.Sequential(CodebookQuantLinear.from_quantized(q), UniformQuantLinear.from_quantized(uq))
    assert set_kernel(model, "native") == 2 and [m.kernel for m in model] == ["native", "native"]
    assert set_kernel(model, "int4") == 2 and [m.kernel for m in model] == ["auto", "int4"]  # no int4 for codebooks
    assert set_kernel(model, "dequant") == 2 and [m.kernel for m in model] == ["dequant", "dequant"]
    with pytest.raises(ValueError, match="kernel"):
        CodebookQuantLinear(8, 8, bits=4, kernel="int4")
    path = lut_kernel.library_path()
    assert path is not None and path.exists() and path.parent.name == "kernels"
    assert not list(path.parent.glob(".lut_gemv-*"))  # no temporary file left behind
    # a new process (here: forgotten state) loads the cached library instead of compiling again
    calls = []
    real_run = lut_kernel.subprocess.run
    monkeypatch.setattr(lut_kernel.subprocess, "run", lambda cmd, **k: calls.append(cmd) or real_run(cmd, **k))
    lut_kernel._reset()
    assert lut_kernel.library_path() == path
    assert all("--version" in c for c in calls)  # only the compiler's identity was asked for


@needs_cc
def test_the_portable_c_build_without_avx512_equals_the_reference(monkeypatch, tmp_path):
    """The plain-C loops (what a CPU without AVX-512 runs): built here without -march=native."""
    monkeypatch.setenv("LMFORGE_CACHE", str(tmp_path))
    monkeypatch.setattr(lut_kernel, "_FLAG_SETS", (("-O2",),))  # the compiler's baseline target
    lut_kernel._reset()
    try:
        assert lut_kernel.available() and not lut_kernel.features()["avx512"]
        q = _codebook(3, 21, 95, n_outliers=5, outlier_row=4, seed=9)
        bias = torch.randn(21)
        m = CodebookQuantLinear.from_quantized(q, bias, kernel="native")
        w = torch.randn(18, 200) * 0.05
        uq = quantize_rtn(w, 4, 40, False)
        u = UniformQuantLinear.from_quantized(uq, bias[:18], kernel="native")
        for tokens in (1, 3, lut_kernel.GEMV_MAX_TOKENS + 2):
            x = torch.randn(tokens, 95)
            _close(m(x), _ref(x, q.dequantize(), bias))
            xu = torch.randn(tokens, 200)
            _close(u(xu), _ref(xu, uq.dequantize(), bias[:18]))
        assert m._native is not None and u._native is not None
        assert torch.equal(u._native[1].dequant(0, 18), uq.dequantize())
    finally:
        lut_kernel._reset()


# ---------------------------------------------------------------- review: memory safety and semantics


@needs_cc
def test_out_of_range_outlier_indices_are_refused_not_written_out_of_bounds():
    """Negative outlier rows/cols wrap in PyTorch indexing (so _codes_at accepts them) but index the
    C kernel's raw pointers before y / x: the view must refuse them as the PyTorch path does."""
    q = _codebook(4, 8, 40, n_outliers=3, seed=2)
    for bad in ("rows", "cols"):
        m = CodebookQuantLinear.from_quantized(q, kernel="native")
        with torch.no_grad():
            (m.outlier_rows if bad == "rows" else m.outlier_cols)[1] = -1
        with pytest.raises((ValueError, IndexError, RuntimeError)):
            m(torch.randn(1, 40))
        assert m._native is None


@needs_cc
def test_reassigned_buffers_of_the_wrong_shape_never_reach_the_kernel():
    """A buffer reassigned with too few elements (scales, zeros, bias, codebook) would be read past its
    end by the C kernel: the view checks every shape against the layer and refuses."""
    uq = quantize_rtn(torch.randn(16, 128) * 0.05, 4, 32, False)
    x = torch.randn(1, 128)
    for name, value in (("scales", torch.ones(16, 1)), ("zeros", torch.zeros(16, 1)), ("bias", torch.zeros(1))):
        u = UniformQuantLinear.from_quantized(uq, torch.zeros(16), kernel="native")
        u(x)
        setattr(u, name, nn.Parameter(value, requires_grad=False) if name == "bias" else value)
        with pytest.raises((ValueError, RuntimeError)):
            u(x)
        assert u._native is None
    c = CodebookQuantLinear.from_quantized(_codebook(4, 8, 40), kernel="native")
    c.codebook = torch.randn(8, 3)  # 3 entries repeat to 15 < 16 floats a row
    with pytest.raises((ValueError, RuntimeError)):
        c(torch.randn(1, 40))
    assert c._native is None


@needs_cc
def test_a_data_swap_rebuilds_the_view():
    """``buf.data = t`` (what accelerate/offloading do) keeps the tensor object and its _version: the view
    must still follow the new storage."""
    q = _codebook(3, 12, 50, seed=4)
    m = CodebookQuantLinear.from_quantized(q, kernel="native")
    x = torch.randn(1, 50)
    m(x)
    m.codebook.data = m.codebook.data * 2
    _close(m(x), _ref(x, 2 * q.dequantize(), None))
    uq = quantize_rtn(torch.randn(16, 64) * 0.05, 4, 32, False)
    u = UniformQuantLinear.from_quantized(uq, kernel="native")
    u(x[:, :1].expand(1, 64).contiguous())
    u.scales.data = u.scales.data * 3
    xu = torch.randn(2, 64)
    _close(u(xu), _ref(xu, 3 * uq.dequantize(), None))


@needs_cc
@pytest.mark.parametrize("tokens", [1, lut_kernel.GEMV_MAX_TOKENS + 3])
def test_a_trainable_bias_keeps_its_gradient(tokens):
    """The GEMV adds the bias in C (no autograd): a bias that requires grad takes the PyTorch path."""
    q = _codebook(4, 10, 30, seed=6)
    bias = torch.randn(10)
    m = CodebookQuantLinear.from_quantized(q, bias)
    m.bias.requires_grad_(True)
    uq = quantize_rtn(torch.randn(10, 64) * 0.05, 4, 32, False)
    u = UniformQuantLinear.from_quantized(uq, bias)
    u.bias.requires_grad_(True)
    for mod, in_f in ((m, 30), (u, 64)):
        x = torch.randn(tokens, in_f)
        mod(x).sum().backward()
        assert mod.bias.grad is not None
        torch.testing.assert_close(mod.bias.grad, torch.full((10,), float(tokens)))


@needs_cc
def test_float64_inputs_keep_float64_precision():
    """F.linear on float64 computes in float64; the kernel computes in float32, so float64 inputs take the
    PyTorch path (same dtype, float64-accurate)."""
    q = _codebook(4, 6, 40, seed=7)
    m = CodebookQuantLinear.from_quantized(q)
    x = torch.randn(1, 40, dtype=torch.float64) * 1e3
    y = m(x)
    want = x @ q.dequantize().double().T
    assert y.dtype == torch.float64
    torch.testing.assert_close(y, want, rtol=1e-12, atol=1e-9)


@needs_cc
def test_a_corrupt_cached_library_is_rebuilt_not_a_permanent_fallback(monkeypatch, tmp_path):
    monkeypatch.setenv("LMFORGE_CACHE", str(tmp_path))
    lut_kernel._reset()
    try:
        path = lut_kernel._build(lut_kernel.COMPILER)  # built, not loaded (a loaded file is never rewritten)
        bad = path.with_name("bad")
        bad.write_bytes(b"\x7fELF truncated")  # e.g. a disk that filled up under an older, non-atomic writer
        bad.replace(path)
        assert lut_kernel.available(), lut_kernel.unavailable_reason()
        assert lut_kernel.library_path() == path and path.stat().st_size > 1000
    finally:
        lut_kernel._reset()


@needs_cc
def test_a_failed_or_timed_out_build_leaves_no_file_and_an_unwritable_cache_still_builds(monkeypatch, tmp_path):
    monkeypatch.setenv("LMFORGE_CACHE", str(tmp_path))
    real_run = lut_kernel.subprocess.run

    def timeout(cmd, **kw):
        if "--version" in cmd:
            return real_run(cmd, **kw)
        raise lut_kernel.subprocess.TimeoutExpired(cmd, 300)

    monkeypatch.setattr(lut_kernel.subprocess, "run", timeout)
    lut_kernel._reset()
    try:
        assert not lut_kernel.available() and "timed out" in lut_kernel.unavailable_reason()
        assert list((tmp_path / "kernels").iterdir()) == []  # no temporary file left behind
        monkeypatch.setattr(lut_kernel.subprocess, "run", real_run)
        lut_kernel._reset()
        (tmp_path / "kernels").chmod(0o555)  # an existing, read-only cache folder
        if not os.access(tmp_path / "kernels", os.W_OK):  # (root writes anyway)
            assert lut_kernel.available(), lut_kernel.unavailable_reason()
            assert lut_kernel.library_path().parent != tmp_path / "kernels"
    finally:
        (tmp_path / "kernels").chmod(0o755)
        lut_kernel._reset()


@needs_cc
@pytest.mark.parametrize("bits", [1, 2, 3, 4])
def test_tails_sweep_against_the_dequantized_reference(bits, monkeypatch):
    """Row counts below and around the 4-row block, in_features around a code word, a 16-word chunk
    and a group (1, per - 1, per + 1, 16 per +- 1, ...), one and two threads (the row split with fewer
    blocks than threads): an off-by-one in any tail mask reads a padding code or a neighbour's word."""
    per = 32 // bits
    ins = sorted({1, per - 1 or 1, per + 1, 16 * per - 1, 16 * per + 1, 33 * per + 3})
    g = torch.Generator().manual_seed(bits)
    n = torch.get_num_threads()
    for threads in (1, 2):
        monkeypatch.setattr(lut_kernel, "PARALLEL_MIN_MACS", 0 if threads == 2 else 1 << 62)
        torch.set_num_threads(threads)
        try:
            for in_f in ins:
                for out_f in (1, 2, 3, 5, 6):
                    q = _codebook(bits, out_f, in_f, n_outliers=2, seed=in_f + out_f)
                    bias = torch.randn(out_f, generator=g)
                    groups = [0] + [k * per for k in (1, 3, 16, 32) if k * per < in_f]
                    us = [quantize_rtn(torch.randn(out_f, in_f, generator=g) * 0.05 + 0.1, bits, gs, sym=False)
                          for gs in groups]
                    for tokens in (1, 2):
                        x = torch.randn(tokens, in_f, generator=g)
                        m = CodebookQuantLinear.from_quantized(q, bias, kernel="native")
                        _close(m(x), _ref(x, q.dequantize(), bias))
                        for uq in us:
                            u = UniformQuantLinear.from_quantized(uq, bias, kernel="native")
                            _close(u(x), _ref(x, uq.dequantize(), bias))
                            assert torch.equal(u._native[1].dequant(0, out_f), uq.dequantize())
                        # the C dequantization writes the codebook values (the caller adds outliers)
                        plain = CodebookQuantized(q.codes, q.codebook, bits).dequantize()
                        assert torch.equal(m._native[1].dequant(0, out_f), plain)
        finally:
            torch.set_num_threads(n)


@needs_cc
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tokens", [1, lut_kernel.GEMV_MAX_TOKENS + 4])
def test_half_inputs_return_their_dtype_like_the_pytorch_path(dtype, tokens):
    q = _codebook(3, 24, 90, n_outliers=4, seed=11)
    bias = torch.randn(24)
    uq = quantize_rtn(torch.randn(24, 96) * 0.05, 4, 32, False)
    for mk, in_f in ((lambda k: CodebookQuantLinear.from_quantized(q, bias, kernel=k), 90),
                     (lambda k: UniformQuantLinear.from_quantized(uq, bias, kernel=k), 96)):
        x = torch.randn(2, tokens, in_f).to(dtype)
        nat, ref = mk("native"), mk("dequant")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            y = nat(x)
        assert nat._native is not None and y.dtype == dtype and y.shape == (2, tokens, 24)
        want = ref(x)
        assert want.dtype == dtype
        torch.testing.assert_close(y.float(), want.float(), rtol=2e-2, atol=5e-2)
