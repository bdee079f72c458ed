"""Benchmark: lmforge's engines on a real checkpoint, SmolLM2-135M-Instruct (``real:smollm2-135m-instruct``).

Three parts, each measured in one run of this script and saved as its own JSON:

- ``generate`` (``real_generate.json``): lmforge's batched KV-cached ``generate`` against one prompt
  at a time through Hugging Face ``model.generate``, fp32, greedy, 16 chat prompts, 32 new tokens with
  EOS disabled (both paths decode the same number of tokens). Median of 3 interleaved runs after a
  warm-up; the tokens of both paths are compared (a speed-up of two different computations means
  nothing).
- ``prefill`` (``real_prefill.json``): tokens per second of one forward over a 1k and a 4k-token
  Paul Graham prompt (the last position's logits only, as a generation prefill computes), fp32; and
  the same 1k prompt in bf16 to record what bf16 does on this CPU (``cpu_has_fast_bf16`` is saved
  beside it: on an AVX2-only CPU torch's bf16 matmul is emulated and much slower).
- ``compress`` (``real_compress.json``): ``lmforge compress``'s methods (GPTQ-3 g64, SparseGPT 50%,
  Wanda 50%) against llm-compressor's, on the same calibration windows of the essays' calibration
  split, each on a fresh copy of the model, the methods alone (no per-layer error report); then the
  held-out perplexity of both results on the essays' evaluation split with one evaluator
  (:func:`lmforge.compression.heldout_perplexity`).

    python benchmarks/real_model.py [--parts generate,prefill,compress] [--windows 64] [--seq-len 512]

SmolLM2's weights are dequantized Q4_1 (see the README's *Real models*): a compression result on it
is on a model whose linears already lie on a 4-bit group-32 grid.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "benchmarks"))

from _timing import save_result, time_interleaved  # noqa: E402
from engines import _NoEos  # noqa: E402

MODEL = "real:smollm2-135m-instruct"
RESULTS = REPO / "benchmarks" / "results"
QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "Write one sentence about the sea.",
    "How many legs does a spider have?",
    "Explain what a compiler does in one sentence.",
    "Give me a synonym for happy.",
    "What is 12 times 7?",
    "Describe a cat in five words.",
    "What colour is the sky on a clear day?",
    "Translate 'good morning' into French.",
    "What is the largest planet in the solar system?",
    "Suggest a name for a pet goldfish.",
    "Why do leaves change colour in autumn?",
    "What does a thermometer measure?",
    "List two uses of a paperclip.",
    "Who wrote Romeo and Juliet?",
]


def _load(dtype: str = "float32"):
    from lmforge.models.load import load

    model, tok = load(MODEL, dtype=dtype)
    return model.eval(), tok


def part_generate(runs: int = 3, new_tokens: int = 32) -> dict:
    from lmforge.common.generation import chat_prompts, encode_prompt, generate

    t0 = time.perf_counter()
    model, tok = _load()
    model.generation_config.eos_token_id = None
    prompts = chat_prompts(tok, [[{"role": "user", "content": q}] for q in QUESTIONS])

    def ours():
        outs = generate(model, _NoEos(tok), prompts, max_new_tokens=new_tokens, batch_size=len(prompts))
        assert all(o.completion_tokens == new_tokens for o in outs)
        return [o.token_ids for o in outs]

    def hf_one_by_one():
        outs = []
        with torch.inference_mode():
            for p in prompts:
                ids = torch.tensor([encode_prompt(tok, p)])
                out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                     min_new_tokens=new_tokens, do_sample=False, pad_token_id=tok.pad_token_id)
                outs.append(out[0, ids.shape[1]:].tolist())
        return outs

    a, b = ours(), hf_one_by_one()
    same_rows = sum(x == y for x, y in zip(a, b))
    same_tokens = sum(sum(u == v for u, v in zip(x, y)) for x, y in zip(a, b)) / (len(a) * new_tokens)
    times = time_interleaved({"ours": ours, "hf": hf_one_by_one}, runs)
    med = {k: statistics.median(v) for k, v in times.items()}
    total = len(prompts) * new_tokens
    result = {
        "benchmark": "batched generate vs one-prompt-at-a-time HF generate, SmolLM2-135M-Instruct fp32",
        "model": MODEL, "dtype": "float32", "prompts": len(prompts), "max_new_tokens": new_tokens,
        "prompt_tokens": [len(encode_prompt(tok, p)) for p in prompts],
        "runs": runs, "identical_rows": same_rows, "identical_token_fraction": same_tokens,
        "ours_seconds": times["ours"], "hf_seconds": times["hf"],
        "ours_tokens_per_s": total / med["ours"], "hf_tokens_per_s": total / med["hf"],
        "speedup": med["hf"] / med["ours"], "threads": torch.get_num_threads(), "torch": torch.__version__,
    }
    print(f"generate: ours {result['ours_tokens_per_s']:.1f} tok/s, HF one by one {result['hf_tokens_per_s']:.1f} "
          f"tok/s, speed-up {result['speedup']:.2f}x, identical rows {same_rows}/{len(prompts)}")
    return save_result(RESULTS / "real_generate.json", result, t0)


def _prefill_seconds(model, ids: torch.Tensor, runs: int) -> list[float]:
    times = []
    with torch.inference_mode():
        model(input_ids=ids[:, :64], use_cache=False, logits_to_keep=1)  # warm-up
        for _ in range(runs):
            t = time.perf_counter()
            model(input_ids=ids, use_cache=False, logits_to_keep=1)
            times.append(time.perf_counter() - t)
    return times


def part_prefill(runs: int = 2) -> dict:
    from lmforge.common.runtime import cpu_has_fast_bf16
    from lmforge.data.essays import haystack

    t0 = time.perf_counter()
    model, tok = _load()
    stream = tok(haystack(), add_special_tokens=False).input_ids
    rows = []
    for n in (1024, 4096):
        ids = torch.tensor([stream[:n]])
        s = _prefill_seconds(model, ids, runs)
        rows.append({"dtype": "float32", "tokens": n, "seconds": s, "tokens_per_s": n / statistics.median(s)})
        print(f"prefill fp32 {n}: {rows[-1]['tokens_per_s']:.0f} tok/s", flush=True)
    model = model.to(torch.bfloat16)
    ids = torch.tensor([stream[:1024]])
    s = _prefill_seconds(model, ids, 1)
    rows.append({"dtype": "bfloat16", "tokens": 1024, "seconds": s, "tokens_per_s": 1024 / statistics.median(s)})
    print(f"prefill bf16 1024: {rows[-1]['tokens_per_s']:.0f} tok/s", flush=True)
    result = {
        "benchmark": "prefill tokens/s of SmolLM2-135M-Instruct on a Paul Graham prompt (last-position logits)",
        "model": MODEL, "rows": rows, "cpu_has_fast_bf16": cpu_has_fast_bf16(),
        "bf16_over_fp32_at_1024": rows[2]["tokens_per_s"] / rows[0]["tokens_per_s"],
        "threads": torch.get_num_threads(), "torch": torch.__version__,
    }
    return save_result(RESULTS / "real_prefill.json", result, t0)


# (method, lmforge flags, llm-compressor kwargs): the same grid and targets on both sides.
COMPRESS_CASES = [
    ("gptq", {"bits": 3, "group_size": 64, "sym": True}, {"bits": 3, "group_size": 64, "sym": True}),
    ("sparsegpt", {"sparsity": 0.5}, {"sparsity": 0.5}),
    ("wanda", {"sparsity": 0.5}, {"sparsity": 0.5}),
]


def part_compress(windows: int, seq_len: int, only: set[str]) -> dict:
    from lmforge.compression import get_method, heldout_perplexity, make_config
    from lmforge.data import essays
    from lmforge.data.calibration import token_windows
    from lmforge.oracle import llmcompressor as oracle

    if not oracle.available():
        sys.exit("llm-compressor is not installed (pip install -e '.[oracle]')")
    t0 = time.perf_counter()
    model, tok = _load()
    calib = token_windows(tok, essays.split("calibration"), windows, seq_len, 0)
    eval_texts = essays.split("evaluation")
    ppl_original, metric = heldout_perplexity(model, tok, eval_texts, seq_len=seq_len)
    print(f"original perplexity {ppl_original:.2f} ({metric})", flush=True)
    rows = []
    for method, flags, kwargs in COMPRESS_CASES:
        if only and method not in only:
            continue
        m = copy.deepcopy(model)
        t = time.perf_counter()
        get_method(method).apply(m, calib, make_config(method, flags=flags), progress=False, layer_errors=False)
        ours_s = time.perf_counter() - t
        ours_ppl, _ = heldout_perplexity(m, tok, eval_texts, seq_len=seq_len)
        m = copy.deepcopy(model)
        t = time.perf_counter()
        oracle.run_llmcompressor(m, tok, method, calib, **kwargs)
        theirs_s = time.perf_counter() - t
        theirs_ppl, _ = heldout_perplexity(m, tok, eval_texts, seq_len=seq_len)
        del m
        rows.append({"method": method, "settings": flags, "lmforge_s": round(ours_s, 2),
                     "llmcompressor_s": round(theirs_s, 2), "time_ratio": round(ours_s / theirs_s, 3),
                     "lmforge_ppl": round(ours_ppl, 3), "llmcompressor_ppl": round(theirs_ppl, 3),
                     "ppl_ratio": round(ours_ppl / theirs_ppl, 4)})
        r = rows[-1]
        print(f"{method:10s} lmforge {ours_s:6.1f} s ppl {ours_ppl:7.2f} | llm-compressor {theirs_s:6.1f} s "
              f"ppl {theirs_ppl:7.2f} | time ratio {r['time_ratio']:.2f} ppl ratio {r['ppl_ratio']:.3f}", flush=True)
    result = {
        "benchmark": "lmforge compress vs llm-compressor on SmolLM2-135M-Instruct, same calibration windows",
        "model": MODEL, "weights_note": "dequantized Q4_1 (every linear on a 4-bit group-32 grid)",
        "calibration": {"windows": windows, "seq_len": seq_len, "source": "Paul Graham essays, calibration split"},
        "perplexity": {"original": round(ppl_original, 3), "metric": metric,
                       "text": "Paul Graham essays, evaluation split (split by essay)"},
        "targets": {"time_ratio_at_most": 1.0, "ppl_ratio_at_most": 1.02},
        "results": rows, "threads": torch.get_num_threads(), "torch": torch.__version__,
    }
    return save_result(RESULTS / "real_compress.json", result, t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="generate,prefill,compress", help="comma-separated: generate, prefill, compress")
    ap.add_argument("--windows", type=int, default=64, help="calibration windows for compress (default 64)")
    ap.add_argument("--seq-len", type=int, default=512, help="tokens per calibration/perplexity window (default 512)")
    ap.add_argument("--only", default="", help="compress: comma-separated methods (default all)")
    args = ap.parse_args()
    os.environ.setdefault("LMFORGE_NO_PROGRESS", "1")
    parts = [p for p in args.parts.split(",") if p]
    unknown = set(parts) - {"generate", "prefill", "compress"}
    if unknown:
        sys.exit(f"unknown part(s): {', '.join(sorted(unknown))}")
    if "generate" in parts:
        part_generate()
    if "prefill" in parts:
        part_prefill()
    if "compress" in parts:
        part_compress(args.windows, args.seq_len, {m for m in args.only.split(",") if m})


if __name__ == "__main__":
    main()
