"""Benchmark: uniform 4-bit layers through PyTorch's CPU int4 kernel and lmforge's compiled kernel
against dense matmuls, and SmolLM2 decode with packed layers.

Two parts in one run, saved in one JSON (``benchmarks/results/int4_matmul.json``):

- ``matmul``: batch-1 (one decode token) ``x @ W^T`` for 4096 x 4096 and SmolLM2-135M's shapes
  (576 -> 576, 576 -> 192, 576 -> 1536, 1536 -> 576), 4-bit RTN codes in groups of 64: dense float32
  and bfloat16 ``F.linear``; ``UniformQuantLinear`` through the dequantize path (float32), through the
  int4 kernel (``kernel="int4"``: bfloat16 activations, float32 in and out; and a bfloat16 input) and
  through lmforge's compiled kernel (``kernel="native"``: float32, and a bfloat16 input).
  Each path is first checked against its own dense reference. Paths run interleaved after a warm-up;
  medians are reported as time ratios to dense float32 (speed-up = 1 / ratio).
- ``decode``: greedy decoding of ``--new-tokens`` tokens, batch 1, with a KV cache, on
  ``real:smollm2-135m-instruct``: dense float32, dense bfloat16; the same model with every decoder
  linear RTN-4 g64 packed (``lmforge.compression.pack_model``) through the dequantize path, the int4
  kernel and the compiled kernel; and with every decoder linear packed as a GANQ-format codebook layer
  (``CodebookQuantLinear``, 4 and 3 bits) through the compiled kernel. NOTE: the codebook models are
  for speed only: their per-row codebooks are the row's uniform min-max grid (per-channel RTN written
  as a codebook), not GANQ's optimized codebooks (running GANQ on all 210 layers would take minutes
  and the kernel's speed does not depend on the codebook values). Tokens per second, median of
  interleaved runs.

    python benchmarks/int4_matmul.py [--threads 2] [--parts matmul,decode] [--quick]

``--quick`` runs the smallest shape once and no decode (a smoke test, not a measurement).
llama-cpp-python is not an anchor row here: see ``benchmarks/llamacpp_anchor.py``.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "benchmarks"))

from _timing import save_result, time_interleaved  # noqa: E402
from lmforge.common import int4_cpu, lut_kernel  # noqa: E402
from lmforge.common.qlinear import UniformQuantLinear, weight_bytes  # noqa: E402
from lmforge.common.quant import quantize_rtn  # noqa: E402

SHAPES = [(4096, 4096), (576, 576), (192, 576), (1536, 576), (576, 1536)]  # (out, in)
GROUP = 64


def bench_shape(out_f: int, in_f: int, runs: int) -> list[dict]:
    torch.manual_seed(0)
    w = torch.randn(out_f, in_f) * 0.02
    x = torch.randn(1, in_f)
    q = quantize_rtn(w, 4, GROUP, sym=False)
    wq = q.dequantize()
    deq = UniformQuantLinear.from_quantized(q, kernel="dequant")
    i4 = UniformQuantLinear.from_quantized(q, kernel="int4")
    nat = UniformQuantLinear.from_quantized(q, kernel="native")
    w_bf16, x_bf16 = w.bfloat16(), x.bfloat16()
    fns = {
        "dense_fp32": lambda: F.linear(x, w),
        "dense_bf16": lambda: F.linear(x_bf16, w_bf16),
        "uniform4_dequant_fp32": lambda: deq(x),
        "uniform4_int4_fp32_io": lambda: i4(x),
        "uniform4_int4_bf16": lambda: i4(x_bf16),
        "uniform4_native_fp32": lambda: nat(x),
        "uniform4_native_bf16": lambda: nat(x_bf16),
    }
    ref = F.linear(x, wq)
    scale = float(ref.abs().max())
    errors = {
        "dense_fp32": 0.0,
        "dense_bf16": float((F.linear(x_bf16, w_bf16).float() - x @ w.T).abs().max()),
        "uniform4_dequant_fp32": float((deq(x) - ref).abs().max()),
        "uniform4_int4_fp32_io": float((i4(x) - F.linear(x_bf16.float(), wq)).abs().max()),
        "uniform4_int4_bf16": float((i4(x_bf16).float() - F.linear(x_bf16.float(), wq)).abs().max()),
        "uniform4_native_fp32": float((nat(x) - (x.double() @ wq.double().T).float()).abs().max()),
        "uniform4_native_bf16": float((nat(x_bf16).float() - F.linear(x_bf16.float(), wq)).abs().max()),
    }
    assert nat._native is not None  # the compiled kernel ran
    assert errors["uniform4_native_fp32"] < 1e-4 * scale and errors["uniform4_native_bf16"] < 1e-2 * scale, errors
    assert errors["uniform4_dequant_fp32"] < 1e-4 * scale, errors
    assert errors["uniform4_int4_fp32_io"] < 1e-2 * scale and errors["uniform4_int4_bf16"] < 1e-2 * scale, errors
    with torch.inference_mode():
        times = time_interleaved(fns, runs)
    nbytes = {"dense_fp32": w.numel() * 4, "dense_bf16": w.numel() * 2}
    nbytes |= {"uniform4_dequant_fp32": weight_bytes(deq), "uniform4_int4_fp32_io": i4._int4_packed().nbytes(),
               "uniform4_int4_bf16": i4._int4_packed().nbytes(),
               "uniform4_native_fp32": weight_bytes(nat), "uniform4_native_bf16": weight_bytes(nat)}
    base = statistics.median(times["dense_fp32"])
    return [{"shape": [out_f, in_f], "path": name, "median_us": statistics.median(ts) * 1e6,
             "time_vs_dense_fp32": statistics.median(ts) / base, "speedup_vs_dense_fp32": base / statistics.median(ts),
             "weight_bytes": nbytes[name],
             "max_abs_err_vs_own_reference": errors[name]} for name, ts in times.items()]


@torch.inference_mode()
def _decode(model, ids: torch.Tensor, new_tokens: int) -> list[int]:
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    out = model(input_ids=ids, past_key_values=cache, use_cache=True)
    toks = []
    for _ in range(new_tokens):
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        toks.append(int(nxt))
        out = model(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
    return toks


def _codebook_grid(w: torch.Tensor, bits: int):
    """Per-channel min-max RTN written as a per-row codebook (speed-only stand-in for GANQ's codebooks)."""
    from lmforge.common.quant import CodebookQuantized

    k = 2**bits
    lo, hi = w.min(dim=1, keepdim=True).values, w.max(dim=1, keepdim=True).values
    step = ((hi - lo) / (k - 1)).clamp_min(1e-12)
    codes = torch.round((w - lo) / step).clamp(0, k - 1).to(torch.uint8)
    return CodebookQuantized(codes, lo + step * torch.arange(k, dtype=w.dtype), bits)


def packed_copy(model: torch.nn.Module, quantize) -> torch.nn.Module:
    """A copy of ``model`` whose every decoder linear is packed from ``quantize(weight)`` (the tied
    head and the embeddings stay dense)."""
    from lmforge.common.calibration import get_decoder_layers, linear_modules
    from lmforge.common.compress import CompressionResult, get_weight
    from lmforge.compression import pack_model

    m = copy.deepcopy(model)
    result = CompressionResult(method="speed", config={})
    for i, layer in enumerate(get_decoder_layers(m)):
        for name, mod in linear_modules(layer).items():
            result.quantized[f"model.layers.{i}.{name}"] = quantize(get_weight(mod))
    pack_model(m, result)
    return m


def part_decode(runs: int, new_tokens: int) -> dict:
    from lmforge.common.qlinear import CodebookQuantLinear, set_kernel
    from lmforge.models.load import load

    model, tok = load("real:smollm2-135m-instruct", dtype="float32")
    model.eval()
    ids = torch.tensor([tok.apply_chat_template([{"role": "user", "content": "Write a short story about a cat."}],
                                                add_generation_prompt=True, tokenize=True, return_dict=False)])

    packed = packed_copy(model, lambda w: quantize_rtn(w, 4, GROUP, sym=False))
    cb4 = packed_copy(model, lambda w: _codebook_grid(w, 4))
    cb3 = packed_copy(model, lambda w: _codebook_grid(w, 3))
    mods = [m for m in packed.modules() if isinstance(m, UniformQuantLinear)]
    reasons = {r for m in mods if (r := m.int4_reason())}
    native_reasons = {r for m in [*mods, *cb4.modules()] if hasattr(m, "native_reason") and (r := m.native_reason())}
    n_cb = sum(isinstance(m, CodebookQuantLinear) for m in cb4.modules())

    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    packed_bf16 = copy.deepcopy(packed).to(torch.bfloat16)

    def run(m: torch.nn.Module, kernel: str):
        set_kernel(m, kernel)
        return _decode(m, ids, new_tokens)

    fns = {
        "dense_fp32": lambda: _decode(model, ids, new_tokens),
        "dense_bf16": lambda: _decode(bf16, ids, new_tokens),
        "rtn4_g64_dequant_fp32": lambda: run(packed, "dequant"),
        "rtn4_g64_int4_fp32_io": lambda: run(packed, "int4"),
        "rtn4_g64_int4_bf16_model": lambda: run(packed_bf16, "int4"),
        "rtn4_g64_native_fp32": lambda: run(packed, "native"),
        "rtn4_g64_native_bf16_model": lambda: run(packed_bf16, "native"),
        "codebook4_native_fp32": lambda: run(cb4, "native"),
        "codebook3_native_fp32": lambda: run(cb3, "native"),
    }
    tokens = {name: fn() for name, fn in fns.items()}
    # Each codebook model's own PyTorch path (not timed: 10x slower), for the same-tokens check.
    torch_tokens = {"codebook4_native_fp32": run(cb4, "dequant"), "codebook3_native_fp32": run(cb3, "dequant")}
    times = time_interleaved(fns, runs)
    base = statistics.median(times["dense_fp32"])
    own_ref = {n: torch_tokens.get(n, tokens["rtn4_g64_dequant_fp32"] if n.startswith("rtn4") else None) for n in fns}
    return {
        "model": "real:smollm2-135m-instruct", "prompt_tokens": int(ids.shape[1]), "new_tokens": new_tokens,
        "runs": runs, "int4_unsupported_layers": sorted(reasons), "native_unsupported_layers": sorted(native_reasons),
        "n_packed_linears": len(mods), "n_codebook_linears": n_cb,
        "codebook_models": "per-row min-max grids (per-channel RTN as a codebook), speed only; not GANQ's codebooks",
        "rows": [{"path": n, "tokens_per_s": new_tokens / statistics.median(ts),
                  "speedup_vs_dense_fp32": base / statistics.median(ts),
                  "speedup_vs_dense_bf16": statistics.median(times["dense_bf16"]) / statistics.median(ts),
                  "same_tokens_as_dense_fp32": tokens[n] == tokens["dense_fp32"],
                  "same_tokens_as_own_pytorch_path": None if own_ref[n] is None else tokens[n] == own_ref[n]}
                 for n, ts in times.items()],
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "int4_matmul.json"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--parts", default="matmul,decode")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--quick", action="store_true", help="smallest shape, 1 run, no decode (smoke test)")
    args = parser.parse_args(argv)
    if not int4_cpu.available():
        raise SystemExit(f"torch {torch.__version__} has no CPU int4 kernel")
    if not lut_kernel.available():
        raise SystemExit(f"lmforge's compiled kernel is unavailable: {lut_kernel.unavailable_reason()}")
    torch.set_num_threads(args.threads)
    parts = set(args.parts.split(","))
    t0 = time.perf_counter()
    result: dict = {"benchmark": "uniform 4-bit through PyTorch's CPU int4 kernel vs dense", "group_size": GROUP,
                    "torch": torch.__version__, "threads": torch.get_num_threads(), "quick": args.quick,
                    "cpu_capability": torch.backends.cpu.get_cpu_capability(), "native_kernel": lut_kernel.features(),
                    "gemv_max_tokens": lut_kernel.GEMV_MAX_TOKENS, "parallel_min_macs": lut_kernel.PARALLEL_MIN_MACS}
    if "matmul" in parts:
        shapes = SHAPES[2:3] if args.quick else SHAPES
        rows = [r for o, i in shapes for r in bench_shape(o, i, 1 if args.quick else (25 if o * i >= 1 << 22 else 200))]
        for r in rows:
            print(f"{r['shape']!s:>14} {r['path']:<24} {r['median_us']:>9.1f} us  x{r['time_vs_dense_fp32']:.2f} of fp32")
        result["matmul"] = rows
    if "decode" in parts and not args.quick:
        result["decode"] = part_decode(runs=3, new_tokens=args.new_tokens)
        for r in result["decode"]["rows"]:
            print(f"{r['path']:<28} {r['tokens_per_s']:7.1f} tok/s  x{r['speedup_vs_dense_fp32']:.2f}")
    return save_result(args.out, result, t0)


if __name__ == "__main__":
    main()
