"""Benchmark: batch-1 decode matmuls from packed quantized weights against dense F.linear.

For each layer shape (out x in) one input row ``x`` (the decode step of one sequence) is multiplied
by the layer's weight eight ways: dense float32 and bfloat16 ``F.linear``; ``UniformQuantLinear``
4-bit, groups of 128 (RTN codes); ``CodebookQuantLinear`` 4-bit and 3-bit (random GANQ-style
codebooks), each through the LUT / bucket-sum path and the gather-then-matmul path. Every path is
checked against its own dense reference first (a benchmark of a wrong computation means nothing).
The paths run interleaved (A B C ... A B C ...) after one warm-up each, in one process; the median
wall time is reported with the bytes holding the weight, both also as ratios to dense float32.

    python benchmarks/lut_matmul.py [--out benchmarks/results/lut_matmul.json] [--threads 2] [--quick]

``--quick`` runs only the smallest shape once (a smoke test, not a measurement).
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
from lmforge.common.qlinear import CodebookQuantLinear, UniformQuantLinear, weight_bytes  # noqa: E402
from lmforge.common.quant import CodebookQuantized, quantize_rtn  # noqa: E402

# (out, in): a small projection, a Llama-7B attention projection, a Llama-7B MLP up-projection.
SHAPES = [(1024, 1024), (4096, 4096), (11008, 4096)]


def codebook_layer(w: torch.Tensor, bits: int, method: str, seed: int) -> CodebookQuantLinear:
    """A codebook layer with random codes and per-row sorted codebooks spread like ``w``'s rows."""
    g = torch.Generator().manual_seed(seed)
    out_f, in_f = w.shape
    codes = torch.randint(0, 2**bits, (out_f, in_f), generator=g, dtype=torch.uint8)
    table = torch.sort(torch.randn(out_f, 2**bits, generator=g), dim=1).values * w.std(dim=1, keepdim=True)
    return CodebookQuantLinear.from_quantized(CodebookQuantized(codes, table, bits), method=method)


def bench_shape(out_f: int, in_f: int, runs: int) -> list[dict]:
    torch.manual_seed(0)
    w = torch.randn(out_f, in_f) * 0.02
    x = torch.randn(1, in_f)
    w_bf16, x_bf16 = w.to(torch.bfloat16), x.to(torch.bfloat16)
    uniform = UniformQuantLinear.from_quantized(quantize_rtn(w, 4, 128, sym=False))
    layers = {
        "uniform_4bit_g128": uniform,
        "codebook_4bit_lut": codebook_layer(w, 4, "lut", 1),
        "codebook_4bit_gather": codebook_layer(w, 4, "gather", 1),
        "codebook_3bit_lut": codebook_layer(w, 3, "lut", 2),
        "codebook_3bit_gather": codebook_layer(w, 3, "gather", 2),
    }
    fns = {
        "dense_fp32": lambda: F.linear(x, w),
        "dense_bf16": lambda: F.linear(x_bf16, w_bf16),
        **{name: (lambda m=m: m(x)) for name, m in layers.items()},
    }
    nbytes = {"dense_fp32": w.numel() * 4, "dense_bf16": w.numel() * 2}
    nbytes.update({n: weight_bytes(m) for n, m in layers.items()})
    # Correctness first: each path against F.linear with the weight it stands for.
    errors = {"dense_fp32": 0.0, "dense_bf16": float((F.linear(x_bf16, w_bf16).float() - x @ w.T).abs().max())}
    with torch.inference_mode():
        for name, m in layers.items():
            ref = F.linear(x, m.dequantize_weight())
            errors[name] = float((m(x) - ref).abs().max())
            assert errors[name] < 1e-4 * max(1.0, float(ref.abs().max())), (name, errors[name])
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
                "time_vs_dense_fp32": med / base_t,
                "bytes_vs_dense_fp32": nbytes[name] / nbytes["dense_fp32"],
                "max_abs_err_vs_own_reference": errors[name],
            }
        )
    return rows


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "lut_matmul.json"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="smallest shape, 1 run (smoke test)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    shapes = SHAPES[:1] if args.quick else SHAPES
    runs = 1 if args.quick else 7

    t0 = time.perf_counter()
    rows = [r for out_f, in_f in shapes for r in bench_shape(out_f, in_f, runs)]
    print(f"{'shape (out x in)':>18} {'method':<22} {'median ms':>10} {'x fp32':>7} {'weight MiB':>11} {'x fp32':>7}")
    for r in rows:
        shape = f"{r['shape'][0]} x {r['shape'][1]}"
        print(
            f"{shape:>18} {r['method']:<22} {r['median_ms']:>10.3f} {r['time_vs_dense_fp32']:>7.2f} "
            f"{r['weight_bytes'] / 2**20:>11.2f} {r['bytes_vs_dense_fp32']:>7.3f}"
        )
    result = {
        "benchmark": "batch-1 matmul from packed quantized weights vs dense F.linear",
        "input": "one token (1 x in), float32 (bfloat16 for dense_bf16)",
        "shapes_out_x_in": [list(s) for s in shapes],
        "runs": runs,
        "quick": args.quick,
        "results": rows,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }
    return save_result(args.out, result, t0)


if __name__ == "__main__":
    main()
