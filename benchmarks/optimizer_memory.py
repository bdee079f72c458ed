"""Benchmark: optimizer-state bytes and step time of the projected optimizers vs torch AdamW.

``lmforge.methods.grad_transforms`` (Torroba-Hennigen, Lang, Guo, Kim, ICML 2025): Adam whose
moments live in the r-dimensional projected space (GaLore SVD, Gaussian sketch, Haar-orthogonal,
two-sided Kronecker). Measured on zoo-sized Linear stacks (4 layers of each shape, fp32, CPU, one
thread): state bytes read from the optimizer's state tensors, and the median ``step()`` time over
interleaved runs (gradients fixed; projectors frozen after the first step) beside torch AdamW in
the same process, plus the one-off refresh cost (building the projector from a gradient).
Analytically for Llama-7B-shaped layers (11008x4096, 4096x11008, 4096x4096): moments
``2·r·max(m, n)`` vs ``2·m·n``, projector ``r·min(m, n)``.
Goal: projected moments ≤ r/min(m, n) of AdamW's (``goal_met``).

    python benchmarks/optimizer_memory.py [--out benchmarks/results/optimizer_memory.json] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from torch import nn  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from _timing import save_result, time_interleaved  # noqa: E402
from lmforge.methods.grad_transforms.apply import build_optimizer, state_bytes  # noqa: E402
from lmforge.methods.grad_transforms.config import GradTransformConfig  # noqa: E402
from lmforge.methods.grad_transforms.projectors import choose_side, make_projector  # noqa: E402

SHAPES = [(128, 512), (512, 128), (256, 256)]  # (out, in) of nn.Linear
LAYERS = 4
KINDS = ("galore", "sketch", "orthogonal", "kron")
RANKS = (8, 32)
BIG = {"mlp up/gate (11008x4096)": (11008, 4096), "mlp down (4096x11008)": (4096, 11008),
       "attention (4096x4096)": (4096, 4096)}
BIG_RANKS = (128, 256, 512)


def _stack(shape: tuple[int, int]) -> nn.Module:
    torch.manual_seed(0)
    return nn.ModuleList([nn.Linear(shape[1], shape[0], bias=False) for _ in range(LAYERS)])


def _fill_grads(model: nn.Module) -> None:
    g = torch.Generator().manual_seed(1)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g)


def measure(shape: tuple[int, int], rank: int, runs: int) -> dict:
    m, n = shape
    models = {"adamw": _stack(shape)}
    opts = {"adamw": torch.optim.AdamW(models["adamw"].parameters(), lr=1e-3)}
    for kind in KINDS:
        models[kind] = _stack(shape)
        opts[kind] = build_optimizer(models[kind], GradTransformConfig(kind=kind, rank=rank, refresh=10**9), lr=1e-3)
    for name, model in models.items():
        _fill_grads(model)
    times = time_interleaved({k: opts[k].step for k in opts}, runs)  # warm-up step builds the projectors
    base_bytes = state_bytes(opts["adamw"])
    base_t = statistics.median(times["adamw"])
    g = torch.randn(m, n)
    out = {"shape": f"{m}x{n}", "layers": LAYERS, "rank": rank, "adamw_state_bytes": base_bytes,
           "adamw_step_ms": 1e3 * base_t, "methods": {}}
    for kind in KINDS:
        side = "both" if kind == "kron" else choose_side(shape, "std")
        t_ref = []
        for _ in range(max(3, runs // 4)):
            t0 = time.perf_counter()
            make_projector(kind, g, rank, side, seed=0)
            t_ref.append(time.perf_counter() - t0)
        moments = state_bytes(opts[kind], include_projectors=False)
        total = state_bytes(opts[kind])
        bound = rank / min(m, n) if kind != "kron" else rank * rank / (m * n)
        out["methods"][kind] = {
            "moment_bytes": moments, "state_bytes_with_projectors": total,
            "moment_ratio_vs_adamw": moments / base_bytes, "total_ratio_vs_adamw": total / base_bytes,
            "goal_ratio": bound, "goal_met": moments <= bound * base_bytes + 1e-9,
            "step_ms": 1e3 * statistics.median(times[kind]),
            "step_time_ratio_vs_adamw": statistics.median(times[kind]) / base_t,
            "refresh_ms_per_layer": 1e3 * statistics.median(t_ref),
        }
    return out


def analytic(bytes_per: int = 4) -> list[dict]:
    rows = []
    for label, (m, n) in BIG.items():
        adamw = 2 * m * n * bytes_per
        for r in BIG_RANKS:
            moments = 2 * r * max(m, n) * bytes_per  # "std": the smaller side is reduced
            proj = r * min(m, n) * bytes_per
            rows.append({"layer": label, "shape": f"{m}x{n}", "rank": r, "adamw_bytes": adamw,
                         "galore_moment_bytes": moments, "galore_projector_bytes": proj,
                         "moment_ratio": moments / adamw, "total_ratio": (moments + proj) / adamw,
                         "goal_ratio": r / min(m, n), "goal_met": moments <= r / min(m, n) * adamw})
    return rows


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "optimizer_memory.json"))
    parser.add_argument("--quick", action="store_true", help="one shape, one rank, few runs (smoke test)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    shapes = SHAPES[:1] if args.quick else SHAPES
    ranks = RANKS[:1] if args.quick else RANKS
    runs = 3 if args.quick else 30
    results = []
    for shape in shapes:
        for r in ranks:
            res = measure(shape, r, runs)
            results.append(res)
            line = ", ".join(f"{k} {v['moment_ratio_vs_adamw']:.4f}x mem {v['step_time_ratio_vs_adamw']:.2f}x time"
                             for k, v in res["methods"].items())
            print(f"{res['shape']} r={r}: AdamW {res['adamw_state_bytes']} B {res['adamw_step_ms']:.2f} ms; {line}")
    big = analytic()
    for row in big:
        print(f"{row['layer']} r={row['rank']}: moments {row['moment_ratio']:.4f}x of AdamW "
              f"(+projector: {row['total_ratio']:.4f}x)")
    result = {"benchmark": "optimizer_memory", "runs": runs, "quick": args.quick, "threads": 1,
              "results": results, "analytic_7b_fp32": big,
              "all_goals_met": all(v["goal_met"] for r in results for v in r["methods"].values())
              and all(r["goal_met"] for r in big)}
    return save_result(args.out, result, t0)


if __name__ == "__main__":
    main()
