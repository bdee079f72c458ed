"""Benchmark: bytes moved by projected data parallelism against plain data parallelism.

Two gloo processes on this machine train SmolLM2-135M-Instruct (``real:smollm2-135m-instruct``,
fp32) for a few steps on windows of the essays' calibration split, in three modes:

- ``dp``: plain data parallelism, every gradient all-reduced, torch AdamW;
- ``shared``: gradient transformation with one random projector (``sketch``, r = 128 by default),
  the r-sized projected gradients all-reduced (:mod:`lmforge.methods.grad_transforms.distributed`);
- ``specific``: worker-specific projectors, each worker's r-sized update all-gathered.

Per mode it records the payload bytes this worker put into collectives (split into the projected
layers' r-sized tensors and the full-size rest: embeddings/LM head and norms), the bytes the
loopback interface carried for both processes (``/proc/net/dev``, headers included; None where
unreadable), and the median step time. Ratios are against ``dp`` in the same run.

    python benchmarks/distributed_bytes.py [--rank 128] [--steps 3] [--seq-len 128] [--model real:...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "benchmarks"))

from _timing import save_result  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
MODES = ("dp", "shared", "specific")


def _worker(rank: int, world: int, init: str, out: str, args: dict) -> None:
    torch.set_num_threads(1)
    from lmforge.data import essays
    from lmforge.data.calibration import token_windows
    from lmforge.methods.grad_transforms.config import GradTransformConfig
    from lmforge.methods.grad_transforms.distributed import (
        CommStats,
        build_worker_optimizer,
        loopback_tx_bytes,
        data_parallel_step,
        distributed_step,
    )
    from lmforge.models.load import load

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    model0, tok = load(args["model"])
    windows = token_windows(tok, essays.split("calibration"), world * args["steps"], args["seq_len"], seed=0)
    state0 = {k: v.clone() for k, v in model0.state_dict().items()}
    cfg = GradTransformConfig(kind="sketch", rank=args["rank"], refresh=200, seed=0)
    result: dict = {}
    for mode in MODES:
        model0.load_state_dict(state0)
        model = model0.train()
        if mode == "dp":
            opt, stats = torch.optim.AdamW(model.parameters(), lr=1e-5), CommStats()
        else:
            opt = build_worker_optimizer(model, cfg, 1e-5, worker_specific=mode == "specific")
            stats = opt.comm_stats
        times, lo = [], []
        for t in range(args["steps"]):
            opt.zero_grad()
            ids = windows[t * world + rank]
            model(input_ids=ids, labels=ids).loss.backward()
            dist.barrier()
            lo0, t0 = loopback_tx_bytes(), time.perf_counter()
            if mode == "dp":
                data_parallel_step(opt, stats)
            else:
                distributed_step(opt)
            times.append(time.perf_counter() - t0)
            dist.barrier()
            lo1 = loopback_tx_bytes()
            lo.append(None if lo0 is None or lo1 is None else lo1 - lo0)
        result[mode] = {**stats.as_dict(), "per_step_payload_bytes": stats.per_step,
                        "loopback_bytes_per_step": lo, "step_s": times, "median_step_s": statistics.median(times)}
        del opt
    if rank == 0:
        torch.save(result, os.path.join(out, "result.pt"))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="real:smollm2-135m-instruct")
    ap.add_argument("--rank", type=int, default=128)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seq-len", type=int, default=128)
    args = ap.parse_args()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(2, f"file://{tmp}/rendezvous", tmp, vars(args)), nprocs=2, join=True)
        res = torch.load(Path(tmp) / "result.pt")
    dp = res["dp"]
    summary = {}
    for mode in ("shared", "specific"):
        r = res[mode]
        lo_dp, lo_m = dp["loopback_bytes_per_step"], r["loopback_bytes_per_step"]
        summary[mode] = {
            "payload_ratio_vs_dp": r["total_bytes"] / dp["total_bytes"],
            # The projected layers alone: their r-sized tensors against their full gradients in DP.
            "projected_layers_ratio_vs_dp": r["low_bytes"] / (dp["total_bytes"] - r["full_bytes"]),
            "loopback_ratio_vs_dp": (sum(lo_m) / sum(lo_dp)) if None not in lo_dp + lo_m else None,
            "step_time_ratio_vs_dp": r["median_step_s"] / dp["median_step_s"],
        }
    out = {"model": args.model, "rank": args.rank, "steps": args.steps, "seq_len": args.seq_len,
           "world": 2, "backend": "gloo", "modes": res, "summary": summary}
    save_result(RESULTS / "distributed_bytes.json", out, t0)
    for mode, s in summary.items():
        print(mode, {k: round(v, 4) if v is not None else None for k, v in s.items()})


if __name__ == "__main__":
    main()
