"""Benchmark anchor: SmolLM2-135M-Instruct decode in llama.cpp (what a CPU user would pick) beside lmforge.

One run, one JSON (``benchmarks/results/llamacpp_anchor.json``): greedy decoding of ``--new-tokens``
tokens at batch 1 from the same chat prompt (the same token ids), 2 threads,

- lmforge / PyTorch on the dense model converted from the packaged GGUF, float32 and bfloat16, with
  a KV cache (the ``decode`` part of ``benchmarks/int4_matmul.py``);
- lmforge's packed models on its compiled kernel (``kernel="native"``): RTN-4 groups of 64 of that
  dense model, computing in float32 and as a bfloat16 model, and 3-bit per-row codebooks (per-channel
  min-max grids written as codebooks: the GANQ format, not GANQ's codebooks), as in
  ``benchmarks/int4_matmul.py``'s decode part (``--no-packed`` skips them);
- llama.cpp through llama-cpp-python on the packaged GGUF file itself (Q4_1 linears, Q8_0
  embedding), in a separate interpreter given by ``--llama-python`` (a venv where llama-cpp-python
  is installed; it builds llama.cpp from source with CMake at install, so lmforge never depends on
  it, and no test does).

The runs alternate (torch, llama.cpp, torch, ...) so both see the same machine load; medians are
reported as tokens per second and as ratios to lmforge's dense float32 decode from the same run. The
token sequences are compared too: llama.cpp's Q4_1 kernels quantize activations to 8 bits, so its
greedy tokens may differ from the dequantized float model's.

    python benchmarks/llamacpp_anchor.py --llama-python /path/to/venv/bin/python [--runs 3] [--new-tokens 32] [--no-packed]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "benchmarks"))

from _timing import save_result  # noqa: E402

# Runs in the llama-cpp-python interpreter: loads the GGUF once, then for each line of token ids on
# stdin decodes greedily and prints {"tokens": [...], "seconds": s} (the decode loop only; the prompt
# prefill is timed apart, as in the torch path).
LLAMA_WORKER = r"""
import json, sys, time
import numpy as np
from llama_cpp import Llama
path, threads, new = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
llm = Llama(model_path=path, n_threads=threads, n_threads_batch=threads, n_ctx=512, n_batch=512, verbose=False)
n_vocab = llm.n_vocab()
def last_logits():  # the last evaluated token's logits (llm.scores is filled only with logits_all)
    return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    ids = json.loads(line)
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(ids)
    t1 = time.perf_counter()
    toks = []
    for _ in range(new):
        nxt = int(np.argmax(last_logits()))
        toks.append(nxt)
        llm.eval([nxt])
    t2 = time.perf_counter()
    print(json.dumps({"tokens": toks, "prefill_seconds": t1 - t0, "seconds": t2 - t1}), flush=True)
"""


@torch.inference_mode()
def torch_decode(model, ids: torch.Tensor, new_tokens: int) -> tuple[list[int], float, float]:
    """Greedy decode with a KV cache: (tokens, prefill seconds, decode seconds)."""
    from transformers import DynamicCache

    t0 = time.perf_counter()
    out = model(input_ids=ids, past_key_values=DynamicCache(config=model.config), use_cache=True)
    t1 = time.perf_counter()
    toks = []
    for _ in range(new_tokens):
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        toks.append(int(nxt))
        out = model(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
    return toks, t1 - t0, time.perf_counter() - t1


def _prefix(a: list[int], b: list[int]) -> int:
    """Length of the common prefix of two token lists."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-python", required=True, help="a Python with llama-cpp-python installed")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "llamacpp_anchor.json"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--llama-env", action="append", default=[], metavar="KEY=VALUE",
                        help="set (KEY=VALUE) or unset (KEY=) a variable for the llama.cpp worker only, on top of "
                             "the default OMP_WAIT_POLICY= (unset: llama.cpp's ggml threads are OpenMP threads and "
                             "would otherwise inherit lmforge's PASSIVE, which a llama.cpp user does not set)")
    parser.add_argument("--no-packed", action="store_true",
                        help="skip lmforge's packed models on its compiled kernel (dense rows and llama.cpp only)")
    args = parser.parse_args(argv)
    if not Path(args.llama_python).is_file():
        raise SystemExit(f"--llama-python {args.llama_python} is not a file (a Python with llama-cpp-python)")
    llama_env: dict[str, str | None] = {"OMP_WAIT_POLICY": None}
    for kv in args.llama_env:
        key, _, val = kv.partition("=")
        llama_env[key] = val or None
    if not args.no_packed:
        from lmforge.common import lut_kernel

        if not lut_kernel.available():
            raise SystemExit(f"the compiled kernel is unavailable ({lut_kernel.unavailable_reason()}); "
                             "rerun with --no-packed")
    t_start = time.perf_counter()
    torch.set_num_threads(args.threads)

    from lmforge.models.load import load
    from lmforge.models.real import get_real, real_file

    spec = get_real("smollm2-135m-instruct")
    gguf = real_file(spec)
    model, tok = load("real:smollm2-135m-instruct", dtype="float32")
    model.eval()
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    ids = tok.apply_chat_template([{"role": "user", "content": "Write a short story about a cat."}],
                                  add_generation_prompt=True, tokenize=True, return_dict=False)
    ids_t = torch.tensor([ids])

    worker_env = dict(os.environ)
    for key, val in llama_env.items():
        if val is None:
            worker_env.pop(key, None)
        else:
            worker_env[key] = val
    worker = subprocess.Popen([args.llama_python, "-c", LLAMA_WORKER, str(gguf), str(args.threads),
                               str(args.new_tokens)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env=worker_env)
    assert worker.stdin is not None and worker.stdout is not None
    if json.loads(worker.stdout.readline()).get("ready") is not True:
        raise RuntimeError("the llama.cpp worker did not start")

    def llama_run() -> tuple[list[int], float, float]:
        worker.stdin.write(json.dumps(ids) + "\n")
        worker.stdin.flush()
        r = json.loads(worker.stdout.readline())
        return r["tokens"], r["prefill_seconds"], r["seconds"]

    paths = {"lmforge_dense_fp32": lambda: torch_decode(model, ids_t, args.new_tokens),
             "lmforge_dense_bf16": lambda: torch_decode(bf16, ids_t, args.new_tokens),
             "llamacpp_q4_1_gguf": llama_run}
    own_path_tokens: dict[str, list[int]] = {}
    if not args.no_packed:
        # lmforge's packed models on its compiled kernel (as int4_matmul.py's decode part): RTN-4 g64 of
        # the dense model (computing in float32, and a bfloat16 model), and 3-bit per-row codebooks.
        from int4_matmul import GROUP, _codebook_grid, packed_copy
        from lmforge.common.qlinear import set_kernel
        from lmforge.common.quant import quantize_rtn

        rtn4 = packed_copy(model, lambda w: quantize_rtn(w, 4, GROUP, sym=False))
        rtn4_bf16 = copy.deepcopy(rtn4).to(torch.bfloat16)
        cb3 = packed_copy(model, lambda w: _codebook_grid(w, 3))
        packed = {f"lmforge_rtn4_g{GROUP}_compiled_fp32": rtn4, f"lmforge_rtn4_g{GROUP}_compiled_bf16": rtn4_bf16,
                  "lmforge_codebook3_compiled_fp32": cb3}
        for name, m in packed.items():
            # A quantized model may leave the dense model's tokens; its own PyTorch path (untimed) is
            # the reference the compiled kernel must match.
            set_kernel(m, "dequant")
            own_path_tokens[name] = torch_decode(m, ids_t, args.new_tokens)[0]
            set_kernel(m, "native")
            paths[name] = lambda m=m: torch_decode(m, ids_t, args.new_tokens)
    for fn in paths.values():  # warm-up
        fn()
    res: dict[str, list[tuple[list[int], float, float]]] = {k: [] for k in paths}
    for _ in range(args.runs):
        for name, fn in paths.items():
            res[name].append(fn())
    worker.stdin.close()
    worker.wait(timeout=60)

    base = statistics.median(r[2] for r in res["lmforge_dense_fp32"])
    ref_tokens = res["lmforge_dense_fp32"][0][0]
    rows = []
    for name, rs in res.items():
        dec = statistics.median(r[2] for r in rs)
        rows.append({"path": name, "decode_tokens_per_s": args.new_tokens / dec,
                     "prefill_tokens_per_s": len(ids) / statistics.median(r[1] for r in rs),
                     "decode_speedup_vs_lmforge_fp32": base / dec,
                     "same_tokens_as_lmforge_fp32": rs[0][0] == ref_tokens,
                     "tokens_matching_lmforge_fp32": sum(a == b for a, b in zip(rs[0][0], ref_tokens)),
                     "common_prefix_with_lmforge_fp32": _prefix(rs[0][0], ref_tokens),
                     "same_tokens_as_own_pytorch_path": (rs[0][0] == own_path_tokens[name]
                                                         if name in own_path_tokens else None)})
    version = subprocess.run([args.llama_python, "-c", "import llama_cpp; print(llama_cpp.__version__)"],
                             capture_output=True, text=True, check=True).stdout.strip()
    result = {"model": "real:smollm2-135m-instruct", "gguf": gguf.name, "llama_cpp_python": version,
              "threads": args.threads,
              "llama_worker_env": llama_env,
              "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "prompt_tokens": len(ids), "new_tokens": args.new_tokens, "runs": args.runs,
              "packed_models": None if args.no_packed else
              "decoder linears packed (210), tied head dense; codebook3 = per-row min-max grids as codebooks",
              "rows": rows}
    result = save_result(args.out, result, t_start)
    for r in rows:
        print(f"{r['path']:34s} decode {r['decode_tokens_per_s']:6.1f} tok/s ({r['decode_speedup_vs_lmforge_fp32']:.2f}x "
              f"fp32), prefill {r['prefill_tokens_per_s']:7.1f} tok/s, tokens equal to fp32: "
              f"{r['tokens_matching_lmforge_fp32']}/{args.new_tokens}, own PyTorch path: {r['same_tokens_as_own_pytorch_path']}")
    return result


if __name__ == "__main__":
    main()
