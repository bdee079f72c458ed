"""Benchmark: wall time of lmforge's GPTQ, AWQ, SparseGPT and Wanda over llm-compressor's, same model,
same calibration data, same process.

The model is a random-init Llama of about 60M parameters (hidden 768, 8 layers, MLP 2048, vocab 8000)
so that the core math, not llm-compressor's fixed ~5 s import-and-setup cost, dominates; calibration
is 32 random windows of 256 tokens (weights and data are random: this measures time, not quality).
llm-compressor is imported and run once on a 1-layer model before timing (warm-up), then each method
runs once per library on a fresh copy of the model; the ratio is ours / theirs (< 1: lmforge faster).

    python benchmarks/compress_vs_llmcompressor.py [--out benchmarks/results/compress_vs_llmcompressor.json] [--quick]
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from lmforge.common.io import atomic_write_json  # noqa: E402
from lmforge.compression import get_method, make_config  # noqa: E402

# (method, lmforge settings, llm-compressor settings): the same grid and targets on both sides.
CASES = [
    ("gptq", {"bits": 4, "group_size": 128, "sym": True}, {"bits": 4, "group_size": 128, "sym": True}),
    ("awq", {"bits": 4, "group_size": 128, "sym": True}, {"bits": 4, "group_size": 128, "sym": True}),
    # llm-compressor's AWQ has no clipping search and uses duo scaling: the same algorithm on our side.
    ("awq", {"bits": 4, "group_size": 128, "sym": True, "clip": False, "duo_scaling": True},
     {"bits": 4, "group_size": 128, "sym": True}),
    ("sparsegpt", {"sparsity": 0.5}, {"sparsity": 0.5}),
    ("wanda", {"sparsity": 0.5}, {"sparsity": 0.5}),
]
# lmforge also reports each layer's exact output error (llm-compressor has no such report); these
# rows time the methods alone (`--no-layer-errors`).
NO_REPORT = ("gptq", "sparsegpt", "wanda")


def build(hidden: int, layers: int, mlp: int, vocab: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    from lmforge.models.tokenizer import train_tokenizer
    from lmforge.data.corpus import tokenizer_training_texts

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=mlp, num_hidden_layers=layers,
                      num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64,
                      max_position_embeddings=512, tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg).eval()
    tok = train_tokenizer(tokenizer_training_texts(0, 50), vocab)
    return model, tok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/compress_vs_llmcompressor.json"))
    ap.add_argument("--quick", action="store_true", help="a 2-layer hidden-256 model (smoke test)")
    ap.add_argument("--only", default="", help="comma-separated methods to (re)measure; their rows replace "
                    "the same rows of an existing --out file, the others are kept")
    args = ap.parse_args()
    os.environ.setdefault("LMFORGE_NO_PROGRESS", "1")
    from lmforge.oracle import llmcompressor as oracle

    if not oracle.available():
        sys.exit("llm-compressor is not installed (pip install -e '.[oracle]')")
    shape = (256, 2, 768, 2048) if args.quick else (768, 8, 2048, 8000)
    model, tok = build(*shape)
    n_params = sum(p.numel() for p in model.parameters())
    g = torch.Generator().manual_seed(1)
    calib = [torch.randint(4, shape[3], (1, 256), generator=g) for _ in range(8 if args.quick else 32)]

    warm, _ = build(256, 1, 768, 2048)
    warm_calib = [torch.randint(4, 2048, (1, 64), generator=g) for _ in range(2)]
    oracle.run_llmcompressor(warm, tok, "gptq", warm_calib, bits=4, group_size=128)

    only = {m for m in args.only.split(",") if m}
    rows = []
    cases = [(m, f, t, True) for m, f, t in CASES]
    cases += [(m, f, t, False) for m, f, t in CASES if m in NO_REPORT]
    for method, ours_flags, theirs_kwargs, errors in cases:
        if only and method not in only:
            continue
        m = copy.deepcopy(model)
        t0 = time.perf_counter()
        get_method(method).apply(m, calib, make_config(method, flags=ours_flags), progress=False, layer_errors=errors)
        ours = time.perf_counter() - t0
        m = copy.deepcopy(model)
        t0 = time.perf_counter()
        oracle.run_llmcompressor(m, tok, method, calib, **theirs_kwargs)
        theirs = time.perf_counter() - t0
        label = method + ("" if ours_flags.get("clip", True) else " (no clip, duo scaling)")
        label += "" if errors else " (no error report)"
        rows.append({"method": label, "lmforge_s": round(ours, 2), "llmcompressor_s": round(theirs, 2),
                     "ratio": round(ours / theirs, 3)})
        print(f"{label:34s} lmforge {ours:7.2f} s   llm-compressor {theirs:7.2f} s   ratio {ours / theirs:5.2f}x", flush=True)
    if only and Path(args.out).is_file():
        import json

        measured = {r["method"] for r in rows}
        old = json.loads(Path(args.out).read_text())["results"]
        rows = [r for r in old if r["method"] not in measured] + rows
        order = [m for m, _, _ in CASES]
        rows.sort(key=lambda r: (order.index(r["method"].split(" ")[0]), r["method"]))
    atomic_write_json(args.out, {
        "benchmark": "compress_vs_llmcompressor",
        "model": {"hidden": shape[0], "layers": shape[1], "mlp": shape[2], "vocab": shape[3], "params": n_params},
        "calibration": {"windows": len(calib), "tokens_per_window": 256},
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
        "quick": args.quick,
        "results": rows,
    })
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
