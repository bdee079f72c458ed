"""Benchmark: batch-1 decode matmuls from packed quantized weights against dense F.linear.

For each layer shape (out x in) one input row ``x`` (the decode step of one sequence) is multiplied
by the layer's weight: dense float32 ``F.linear`` (the baseline), the same through an ``nn.Linear``
module call (what a model pays per layer), dense bfloat16 ``F.linear``; ``UniformQuantLinear`` 4-bit,
groups of 128 (RTN codes) through the PyTorch dequantize path and through lmforge's compiled kernel
(``kernel="native"``, :mod:`lmforge.common.lut_kernel`); ``CodebookQuantLinear`` 4-bit and 3-bit
(random GANQ-style codebooks) through the PyTorch LUT / bucket-sum and gather paths and through the
compiled LUT GEMV, the 4-bit one also forced onto 1 and onto all threads. Every path is checked
against its own dense reference first (a benchmark of a wrong computation means nothing). The paths run
interleaved (A B C ... A B C ...) after one warm-up each, in one process; the median wall time is
reported with the bytes holding the weight, both also as ratios to dense float32.

A second part (``tokens``) times the compiled 4-bit codebook and uniform layers at 4096 x 4096 and
576 x 576 for 1..32 tokens through their GEMV and through their dequantize-a-block-then-``F.linear``
path (where ``GEMV_MAX_TOKENS`` comes from), beside dense float32. A third part (``call_cost``)
splits a small layer's warm per-call time into the C kernel, the ctypes crossing, the output
allocation and the module's Python dispatch, beside ``F.linear`` and an ``nn.Linear`` call.
End-to-end SmolLM2 decode rows are in ``benchmarks/int4_matmul.py``.

    python benchmarks/lut_matmul.py [--out benchmarks/results/lut_matmul.json] [--threads 2] [--quick]

``--quick`` runs only the smallest shape (192 x 576) once (a smoke test, not a measurement).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from _timing import save_result, time_interleaved  # noqa: E402
from lmforge.common import lut_kernel  # noqa: E402
from lmforge.common.qlinear import CodebookQuantLinear, UniformQuantLinear, weight_bytes  # noqa: E402
from lmforge.common.quant import CodebookQuantized, quantize_rtn  # noqa: E402

# (out, in): a Llama-7B attention projection, then SmolLM2-135M's q/o, k/v, gate/up and down.
SHAPES = [(4096, 4096), (576, 576), (192, 576), (1536, 576), (576, 1536)]


def codebook_layer(w: torch.Tensor, bits: int, method: str, seed: int, kernel: str) -> CodebookQuantLinear:
    """A codebook layer with random codes and per-row sorted codebooks spread like ``w``'s rows."""
    g = torch.Generator().manual_seed(seed)
    out_f, in_f = w.shape
    codes = torch.randint(0, 2**bits, (out_f, in_f), generator=g, dtype=torch.uint8)
    table = torch.sort(torch.randn(out_f, 2**bits, generator=g), dim=1).values * w.std(dim=1, keepdim=True)
    return CodebookQuantLinear.from_quantized(CodebookQuantized(codes, table, bits), method=method, kernel=kernel)


class _Threads:
    """Run a compiled-kernel call on a fixed number of threads (1, or torch's) whatever its size."""

    def __init__(self, fn, one: bool) -> None:
        self.fn, self.one = fn, one

    def __call__(self):
        old = lut_kernel.PARALLEL_MIN_MACS
        lut_kernel.PARALLEL_MIN_MACS = 1 << 62 if self.one else 0
        try:
            return self.fn()
        finally:
            lut_kernel.PARALLEL_MIN_MACS = old


def bench_shape(out_f: int, in_f: int, runs: int) -> list[dict]:
    torch.manual_seed(0)
    w = torch.randn(out_f, in_f) * 0.02
    x = torch.randn(1, in_f)
    w_bf16, x_bf16 = w.to(torch.bfloat16), x.to(torch.bfloat16)
    lin = torch.nn.Linear(in_f, out_f, bias=False).requires_grad_(False)
    with torch.no_grad():
        lin.weight.copy_(w)
    q = quantize_rtn(w, 4, 128, sym=False)
    layers = {
        "uniform_4bit_g128_dequant": UniformQuantLinear.from_quantized(q, kernel="dequant"),
        "uniform_4bit_g128_native": UniformQuantLinear.from_quantized(q, kernel="native"),
        "codebook_4bit_lut": codebook_layer(w, 4, "lut", 1, "dequant"),
        "codebook_4bit_gather": codebook_layer(w, 4, "gather", 1, "dequant"),
        "codebook_4bit_native": codebook_layer(w, 4, "auto", 1, "native"),
        "codebook_3bit_lut": codebook_layer(w, 3, "lut", 2, "dequant"),
        "codebook_3bit_gather": codebook_layer(w, 3, "gather", 2, "dequant"),
        "codebook_3bit_native": codebook_layer(w, 3, "auto", 2, "native"),
    }
    cb4 = layers["codebook_4bit_native"]
    fns = {
        "dense_fp32": lambda: F.linear(x, w),
        "dense_fp32_nn_linear": lambda: lin(x),
        "dense_bf16": lambda: F.linear(x_bf16, w_bf16),
        **{name: (lambda m=m: m(x)) for name, m in layers.items()},
        "codebook_4bit_native_1thread": _Threads(lambda: cb4(x), one=True),
        "codebook_4bit_native_all_threads": _Threads(lambda: cb4(x), one=False),
    }
    nbytes = {"dense_fp32": w.numel() * 4, "dense_fp32_nn_linear": w.numel() * 4, "dense_bf16": w.numel() * 2}
    nbytes.update({n: weight_bytes(m) for n, m in layers.items()})
    nbytes["codebook_4bit_native_1thread"] = nbytes["codebook_4bit_native_all_threads"] = nbytes["codebook_4bit_native"]
    # Correctness first: each path against F.linear with the weight it stands for (float64).
    errors = {"dense_fp32": 0.0, "dense_fp32_nn_linear": float((lin(x) - x @ w.T).abs().max()),
              "dense_bf16": float((F.linear(x_bf16, w_bf16).float() - x @ w.T).abs().max())}
    extra = {}
    with torch.inference_mode():
        for name, m in layers.items():
            ref = (x.double() @ m.dequantize_weight().double().T).float()
            errors[name] = float((m(x) - ref).abs().max())
            assert errors[name] < 1e-4 * max(1.0, float(ref.abs().max())), (name, errors[name])
            if name.endswith("_native"):
                assert m._native is not None, name  # the compiled kernel ran, not a fallback
                extra[name] = m._native[1].extra_bytes
        for name in ("codebook_4bit_native_1thread", "codebook_4bit_native_all_threads"):
            errors[name] = float((fns[name]() - F.linear(x, cb4.dequantize_weight())).abs().max())
        times = time_interleaved(fns, runs)
    base_t = statistics.median(times["dense_fp32"])
    rows = []
    for name, ts in times.items():
        med = statistics.median(ts)
        rows.append(
            {
                "shape": [out_f, in_f],
                "method": name,
                "median_ms": med * 1e3,
                "times_ms": [t * 1e3 for t in ts],
                "weight_bytes": nbytes[name],
                "kernel_extra_bytes": extra.get(name, 0),
                "time_vs_dense_fp32": med / base_t,
                "speedup_vs_dense_fp32": base_t / med,
                "bytes_vs_dense_fp32": nbytes[name] / nbytes["dense_fp32"],
                "max_abs_err_vs_own_reference": errors[name],
            }
        )
    return rows


class _TokenPath:
    """A compiled-kernel module call forced onto its GEMV (``gemv``) or its dequantize-a-block-then-
    ``F.linear`` path (``blocked``) whatever the token count."""

    def __init__(self, m, x, path: str) -> None:
        self.m, self.x, self.limit = m, x, (1 << 30) if path == "gemv" else 0

    def __call__(self):
        old = lut_kernel.GEMV_MAX_TOKENS
        lut_kernel.GEMV_MAX_TOKENS = self.limit
        try:
            return self.m(self.x)
        finally:
            lut_kernel.GEMV_MAX_TOKENS = old


def bench_tokens(runs: int, token_counts=(1, 4, 8, 16, 32)) -> list[dict]:
    """The compiled 4-bit codebook and uniform (g128) layers at 4096 x 4096 and 576 x 576 by token
    count: the GEMV against the block path (where ``GEMV_MAX_TOKENS`` comes from), and dense fp32."""
    rows = []
    for out_f, in_f in ((4096, 4096), (576, 576)):
        torch.manual_seed(0)
        w = torch.randn(out_f, in_f) * 0.02
        layers = {"codebook4": codebook_layer(w, 4, "auto", 1, "native"),
                  "uniform4_g128": UniformQuantLinear.from_quantized(quantize_rtn(w, 4, 128, sym=False),
                                                                     kernel="native")}
        for t in token_counts:
            x = torch.randn(t, in_f)
            fns = {"dense_fp32": lambda x=x: F.linear(x, w)}
            for name, m in layers.items():
                ref = (x.double() @ m.dequantize_weight().double().T).float()
                for path in ("gemv", "blocked"):
                    fn = _TokenPath(m, x, path)
                    assert float((fn() - ref).abs().max()) < 1e-4 * max(1.0, float(ref.abs().max())), (name, path)
                    fns[f"{name}_{path}"] = fn
            with torch.inference_mode():
                times = time_interleaved(fns, runs if out_f < 4096 else max(3, runs // 5))
            base = statistics.median(times["dense_fp32"])
            rows += [{"shape": [out_f, in_f], "tokens": t, "path": n, "median_ms": statistics.median(ts) * 1e3,
                      "time_vs_dense_fp32": statistics.median(ts) / base} for n, ts in times.items()]
    return rows


def bench_call_cost(repeat: int = 50, runs: int = 200) -> list[dict]:
    """Where a small layer's time goes (warm caches: each sample is ``repeat`` back-to-back calls).

    For SmolLM2's k/v (192 x 576) and q/o (576 x 576) shapes, the uniform 4-bit g128 compiled layer:
    dense ``F.linear`` and an ``nn.Linear`` module call (the baselines), the packed module call, its
    compiled view's ``run`` (dtype/shape checks, output allocation, the C call), the bare ctypes call
    into preallocated memory (the C kernel plus the ctypes crossing), a no-argument ctypes call (the
    crossing alone) and ``torch.empty`` of the output."""
    rows = []
    for out_f, in_f in ((192, 576), (576, 576)):
        torch.manual_seed(0)
        w = torch.randn(out_f, in_f) * 0.02
        x = torch.randn(1, in_f)
        lin = torch.nn.Linear(in_f, out_f, bias=False).requires_grad_(False)
        with torch.no_grad():
            lin.weight.copy_(w)
        m = UniformQuantLinear.from_quantized(quantize_rtn(w, 4, 128, sym=False), kernel="native")
        with torch.inference_mode():
            m(x)
            nat = m._native[1]
            assert nat is not None
            y = torch.empty(1, out_f)
            gemv, addr, xp, yp, noop = nat.lib.gemv, nat.addr, x.data_ptr(), y.data_ptr(), nat.lib.dll.lut_abi
            gemv(addr, xp, yp, 1, 1)
            ref = (x.double() @ m.dequantize_weight().double().T).float()
            assert float((y - ref).abs().max()) < 1e-4 * max(1.0, float(ref.abs().max()))

            def rep(fn):
                def go():
                    for _ in range(repeat):
                        fn()
                return go

            fns = {"dense_fp32_F.linear": rep(lambda: F.linear(x, w)), "dense_fp32_nn_linear": rep(lambda: lin(x)),
                   "uniform4_g128_module": rep(lambda: m(x)), "uniform4_g128_view_run": rep(lambda: nat.run(x)),
                   "uniform4_g128_ctypes_gemv": rep(lambda: gemv(addr, xp, yp, 1, 1)),
                   "ctypes_noop_call": rep(lambda: noop()), "torch_empty_output": rep(lambda: torch.empty(1, out_f))}
            times = time_interleaved(fns, runs)
        base = statistics.median(times["dense_fp32_F.linear"])
        rows += [{"shape": [out_f, in_f], "path": n, "median_us_per_call": statistics.median(ts) / repeat * 1e6,
                  "time_vs_dense_fp32": statistics.median(ts) / base} for n, ts in times.items()]
    return rows


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "lut_matmul.json"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="smallest shape, 1 run (smoke test)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    shapes = SHAPES[2:3] if args.quick else SHAPES
    runs = 1 if args.quick else 200
    if not lut_kernel.available():
        raise SystemExit(f"lmforge's compiled kernel is unavailable: {lut_kernel.unavailable_reason()}")

    t0 = time.perf_counter()
    rows = [r for out_f, in_f in shapes
            for r in bench_shape(out_f, in_f, runs if out_f * in_f < 1 << 22 else max(1, runs // 4))]
    print(f"{'shape (out x in)':>18} {'method':<34} {'median ms':>10} {'x fp32':>7} {'weight MiB':>11} {'x fp32':>7}")
    for r in rows:
        shape = f"{r['shape'][0]} x {r['shape'][1]}"
        print(
            f"{shape:>18} {r['method']:<34} {r['median_ms']:>10.4f} {r['time_vs_dense_fp32']:>7.2f} "
            f"{r['weight_bytes'] / 2**20:>11.3f} {r['bytes_vs_dense_fp32']:>7.3f}"
        )
    tokens = [] if args.quick else bench_tokens(runs=50)
    for r in tokens:
        print(f"{r['shape']!s:>12} tokens {r['tokens']:>3} {r['path']:<22} {r['median_ms']:>9.3f} ms  "
              f"x{r['time_vs_dense_fp32']:.2f} of fp32")
    call_cost = [] if args.quick else bench_call_cost()
    for r in call_cost:
        print(f"{r['shape']!s:>12} {r['path']:<28} {r['median_us_per_call']:>7.2f} us/call  x{r['time_vs_dense_fp32']:.2f} of fp32")
    result = {
        "benchmark": "batch-1 matmul from packed quantized weights vs dense F.linear",
        "input": "one token (1 x in), float32 (bfloat16 for dense_bf16)",
        "shapes_out_x_in": [list(s) for s in shapes],
        "runs": runs,
        "runs_4096x4096": runs // 4,
        "quick": args.quick,
        "results": rows,
        "tokens": tokens,
        "call_cost": call_cost,
        "native_kernel": lut_kernel.features(),
        "gemv_max_tokens": lut_kernel.GEMV_MAX_TOKENS,
        "parallel_min_macs": lut_kernel.PARALLEL_MIN_MACS,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }
    return save_result(args.out, result, t0)


if __name__ == "__main__":
    main()
