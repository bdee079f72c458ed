"""Benchmark: bf16 calibration forwards against float32 ones, on SmolLM2-135M-Instruct.

``lmforge compress --calib-dtype bfloat16`` runs every decoder layer's calibration forward (the
Hessian collection and the replay that feeds the next layer) under bf16 autocast, Hessians still
accumulated in float32/float64 (:func:`lmforge.common.calibration.calibration_dtype`), as GPU GPTQ
runs on half-precision activations. This measures, in one process, on the same calibration windows
of the essays' calibration split: the method's wall time and the held-out perplexity (essays'
evaluation split, evaluated in bfloat16 as `lmforge compress --eval-dtype auto` does on this CPU) of
each result, for GPTQ (3 bits, group 128) and SparseGPT (50%). The default stays float32 unless bf16 keeps perplexity within 1%
on every case (the rule, fixed before the run).

    python benchmarks/calib_dtype.py [--windows 32] [--seq-len 512]
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "benchmarks"))

from _timing import save_result  # noqa: E402

MODEL = "real:smollm2-135m-instruct"
RESULTS = REPO / "benchmarks" / "results"
CASES = [("gptq", {"bits": 3, "group_size": 128}), ("sparsegpt", {"sparsity": 0.5})]
PPL_TOLERANCE = 0.01  # bf16 may become the default only if every case's perplexity is within 1%


def main() -> None:
    from lmforge.common.calibration import calibration_dtype
    from lmforge.compression import get_method, heldout_perplexity, make_config
    from lmforge.data import essays
    from lmforge.data.calibration import token_windows
    from lmforge.models.load import load

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--windows", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=512)
    args = ap.parse_args()
    t0 = time.perf_counter()
    model, tok = load(MODEL)
    calib = token_windows(tok, essays.split("calibration"), args.windows, args.seq_len, 0)
    eval_texts = essays.split("evaluation")
    def ppl(m) -> tuple[float, str]:
        return heldout_perplexity(copy.deepcopy(m).to(torch.bfloat16), tok, eval_texts, seq_len=args.seq_len)

    ppl0, metric = ppl(model)
    rows = []
    for method, flags in CASES:
        row: dict = {"method": method, "settings": flags}
        for name, dtype in (("float32", None), ("bfloat16", torch.bfloat16)):
            m = copy.deepcopy(model)
            t = time.perf_counter()
            with calibration_dtype(dtype):
                get_method(method).apply(m, calib, make_config(method, flags=flags), progress=False,
                                         layer_errors=False)
            row[f"{name}_s"] = round(time.perf_counter() - t, 2)
            row[f"{name}_ppl"] = round(ppl(m)[0], 3)
            del m
        row["speedup"] = round(row["float32_s"] / row["bfloat16_s"], 3)
        row["ppl_ratio"] = round(row["bfloat16_ppl"] / row["float32_ppl"], 4)
        rows.append(row)
        print(row, flush=True)
    holds = all(abs(r["ppl_ratio"] - 1) <= PPL_TOLERANCE for r in rows)
    save_result(RESULTS / "calib_dtype.json", {
        "benchmark": "calibration forwards in bf16 autocast vs float32, same windows, SmolLM2-135M-Instruct",
        "model": MODEL, "windows": args.windows, "seq_len": args.seq_len, "threads": torch.get_num_threads(),
        "original_ppl": round(ppl0, 3), "metric": metric, "eval_dtype": "bfloat16", "rows": rows, "ppl_tolerance": PPL_TOLERANCE,
        "bf16_keeps_ppl": holds}, t0)


if __name__ == "__main__":
    main()
