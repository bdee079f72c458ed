"""Benchmark: uniform 4-bit layers through PyTorch's CPU int4 kernel against dense matmuls, and SmolLM2 decode.

Two parts in one run, saved in one JSON (``benchmarks/results/int4_matmul.json``):

- ``matmul``: batch-1 (one decode token) ``x @ W^T`` for 4096 x 4096 and SmolLM2-135M's shapes
  (576 -> 576, 576 -> 192, 576 -> 1536, 1536 -> 576), 4-bit RTN codes in groups of 64: dense float32
  and bfloat16 ``F.linear``; ``UniformQuantLinear`` through the dequantize path (float32) and through
  the int4 kernel (``kernel="int4"``: bfloat16 activations, float32 in and out; and a bfloat16 input).
  Each path is first checked against its own dense reference. Paths run interleaved after a warm-up;
  medians are reported as time ratios to dense float32 (speed-up = 1 / ratio).
- ``decode``: greedy decoding of ``--new-tokens`` tokens, batch 1, with a KV cache, on
  ``real:smollm2-135m-instruct``: dense float32, dense bfloat16, and the same model with every decoder
  linear RTN-4 g64 packed (``lmforge.compression.pack_model``), through the dequantize path and
  through the int4 kernel. Tokens per second, median of interleaved runs.

    python benchmarks/int4_matmul.py [--threads 2] [--parts matmul,decode] [--quick]

``--quick`` runs the smallest shape once and no decode (a smoke test, not a measurement).
llama-cpp-python is not an anchor row: it builds llama.cpp from source at install (a CMake build of
several minutes that this benchmark does not depend on); see the README.
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
from lmforge.common import int4_cpu  # noqa: E402
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
    w_bf16, x_bf16 = w.bfloat16(), x.bfloat16()
    fns = {
        "dense_fp32": lambda: F.linear(x, w),
        "dense_bf16": lambda: F.linear(x_bf16, w_bf16),
        "uniform4_dequant_fp32": lambda: deq(x),
        "uniform4_int4_fp32_io": lambda: i4(x),
        "uniform4_int4_bf16": lambda: i4(x_bf16),
    }
    ref = F.linear(x, wq)
    scale = float(ref.abs().max())
    errors = {
        "dense_fp32": 0.0,
        "dense_bf16": float((F.linear(x_bf16, w_bf16).float() - x @ w.T).abs().max()),
        "uniform4_dequant_fp32": float((deq(x) - ref).abs().max()),
        "uniform4_int4_fp32_io": float((i4(x) - F.linear(x_bf16.float(), wq)).abs().max()),
        "uniform4_int4_bf16": float((i4(x_bf16).float() - F.linear(x_bf16.float(), wq)).abs().max()),
    }
    assert errors["uniform4_dequant_fp32"] < 1e-4 * scale, errors
    assert errors["uniform4_int4_fp32_io"] < 1e-2 * scale and errors["uniform4_int4_bf16"] < 1e-2 * scale, errors
    with torch.inference_mode():
        times = time_interleaved(fns, runs)
    nbytes = {"dense_fp32": w.numel() * 4, "dense_bf16": w.numel() * 2}
    nbytes |= {"uniform4_dequant_fp32": weight_bytes(deq), "uniform4_int4_fp32_io": i4._int4_packed().nbytes(),
               "uniform4_int4_bf16": i4._int4_packed().nbytes()}
    base = statistics.median(times["dense_fp32"])
    return [{"shape": [out_f, in_f], "path": name, "median_us": statistics.median(ts) * 1e6,
             "time_vs_dense_fp32": statistics.median(ts) / base, "weight_bytes": nbytes[name],
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


def part_decode(runs: int, new_tokens: int) -> dict:
    from lmforge.common.compress import CompressionResult, get_weight
    from lmforge.common.calibration import get_decoder_layers, linear_modules
    from lmforge.compression import pack_model
    from lmforge.models.load import load

    model, tok = load("real:smollm2-135m-instruct", dtype="float32")
    model.eval()
    ids = torch.tensor([tok.apply_chat_template([{"role": "user", "content": "Write a short story about a cat."}],
                                                add_generation_prompt=True, tokenize=True, return_dict=False)])
    packed = copy.deepcopy(model)
    result = CompressionResult(method="rtn", config={"bits": 4, "group_size": GROUP})
    prefix = "model.layers"
    for i, layer in enumerate(get_decoder_layers(packed)):
        for name, mod in linear_modules(layer).items():
            result.quantized[f"{prefix}.{i}.{name}"] = quantize_rtn(get_weight(mod), 4, GROUP, sym=False)
    pack_model(packed, result)
    mods = [m for m in packed.modules() if isinstance(m, UniformQuantLinear)]
    reasons = {r for m in mods if (r := m.int4_reason())}

    def set_kernel(k: str) -> None:
        for m in mods:
            m.kernel = k

    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    packed_bf16 = copy.deepcopy(packed).to(torch.bfloat16)
    for m in packed_bf16.modules():
        if isinstance(m, UniformQuantLinear):
            m.kernel = "auto"

    def run_packed(kernel: str):
        set_kernel(kernel)
        return _decode(packed, ids, new_tokens)

    fns = {
        "dense_fp32": lambda: _decode(model, ids, new_tokens),
        "dense_bf16": lambda: _decode(bf16, ids, new_tokens),
        "rtn4_g64_dequant_fp32": lambda: run_packed("dequant"),
        "rtn4_g64_int4_fp32_io": lambda: run_packed("int4"),
        "rtn4_g64_int4_bf16_model": lambda: _decode(packed_bf16, ids, new_tokens),
    }
    tokens = {name: fn() for name, fn in fns.items()}
    times = time_interleaved(fns, runs)
    base = statistics.median(times["dense_fp32"])
    return {
        "model": "real:smollm2-135m-instruct", "prompt_tokens": int(ids.shape[1]), "new_tokens": new_tokens,
        "runs": runs, "int4_unsupported_layers": sorted(reasons), "n_packed_linears": len(mods),
        "rows": [{"path": n, "tokens_per_s": new_tokens / statistics.median(ts),
                  "speedup_vs_dense_fp32": base / statistics.median(ts),
                  "same_tokens_as_dense_fp32": tokens[n] == tokens["dense_fp32"],
                  "same_tokens_as_rtn4_dequant": tokens[n] == tokens["rtn4_g64_dequant_fp32"]}
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
    torch.set_num_threads(args.threads)
    parts = set(args.parts.split(","))
    t0 = time.perf_counter()
    result: dict = {"benchmark": "uniform 4-bit through PyTorch's CPU int4 kernel vs dense", "group_size": GROUP,
                    "torch": torch.__version__, "threads": torch.get_num_threads(), "quick": args.quick,
                    "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    if "matmul" in parts:
        shapes = SHAPES[2:3] if args.quick else SHAPES
        rows = [r for o, i in shapes for r in bench_shape(o, i, 1 if args.quick else 25)]
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
