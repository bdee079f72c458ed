"""Benchmark: zigzag descriptors of 500 prompts x 12 layers on the CPU (target: under 60 s).

Two workloads, each timed stage by stage (wall clock, one run unless ``--runs``):

* ``llama``: a random 11-block Llama (width 192, agent-small's width and tokenizer, seed 0), so 12
  hidden states; 500 of the zoo's built-in documents cut to 64 tokens. Stages: point clouds
  (:func:`layer_point_clouds`, last token, RMS rows), kNN clique complexes, zigzag barcode, descriptors.
* ``random``: 12 independent Gaussian clouds of 500 x 192 (RMS rows): every layer's complex differs
  from the next, the zigzag's worst case for this size.

Complexes: k = 4 (the paper's), up to dimension p + 1 = 2 (H_1 descriptors). The JSON records seconds
per stage, simplices per layer and in the whole zigzag, bar counts, and the scores.

    python benchmarks/zigzag_descriptors.py [--out benchmarks/results/zigzag_descriptors.json] [--k 4]
        [--runs 1] [--quick]

``--quick`` uses 100 prompts (a smoke test, not a measurement).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from lmforge.common.io import atomic_write_json  # noqa: E402
from lmforge.methods.zigzag.descriptors import (  # noqa: E402
    describe_bars,
    knn_clique_complex,
    layer_point_clouds,
    lives_in_a_layer,
    normalize_cloud,
)
from lmforge.methods.zigzag.persistence import layer_zigzag, zigzag_barcode  # noqa: E402

N_CLOUDS = 12
WIDTH = 192
P = 1


def build_model(tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=WIDTH,
        intermediate_size=512,
        num_hidden_layers=N_CLOUDS - 1,  # + the embeddings = 12 hidden states
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def pipeline(clouds, k: int) -> tuple[dict, dict]:
    """Complexes, zigzag, descriptors (the steps of ``zigzag_descriptors``), timed one by one."""
    complexes, t_cx = timed(lambda: [knn_clique_complex(c, k, P + 1) for c in clouds])
    spaces, t_zz_build = timed(lambda: layer_zigzag(complexes))
    bars, t_zz = timed(lambda: zigzag_barcode(spaces, max_dim=P))
    desc, t_desc = timed(
        lambda: describe_bars([b for b in bars if lives_in_a_layer(b)], len(clouds), P, k=k)
    )
    seconds = {"complexes": t_cx, "zigzag": t_zz_build + t_zz, "descriptors": t_desc}
    info = {
        "simplices_per_layer": [len(c) for c in complexes],
        "edges_per_layer": [sum(1 for s in c if len(s) == 2) for c in complexes],
        "triangles_per_layer": [sum(1 for s in c if len(s) == 3) for c in complexes],
        "zigzag_spaces": len(spaces),
        "zigzag_simplices_total": sum(len(s) for s in spaces),
        "bars": len(bars),
        "bars_h1_in_layers": len([b for b in desc.bars if b.dim == P]),
        "betti_1": desc.betti.tolist(),
        "score_r": desc.zbar.round(4).tolist(),
    }
    return seconds, info


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "zigzag_descriptors.json"))
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="100 prompts (smoke test)")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ["LMFORGE_NO_PROGRESS"] = "1"
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))

    from lmforge.data.calibration import builtin_texts
    from lmforge.models import load

    n_prompts = 100 if args.quick else 500
    _, tokenizer = load("zoo:agent-small")
    model = build_model(tokenizer)
    prompts = builtin_texts(0, n=n_prompts)

    workloads: dict[str, dict] = {}
    for name in ("llama", "random"):
        runs: list[dict] = []
        info: dict = {}
        for _ in range(args.runs):
            if name == "llama":
                clouds, t_clouds = timed(
                    lambda: layer_point_clouds(model, tokenizer, prompts, batch_size=16, max_length=64)
                )
            else:
                rng = np.random.default_rng(0)
                clouds, t_clouds = timed(
                    lambda: [normalize_cloud(rng.normal(size=(n_prompts, WIDTH))) for _ in range(N_CLOUDS)]
                )
            assert len(clouds) == N_CLOUDS and clouds[0].shape == (n_prompts, WIDTH)
            seconds, info = pipeline(clouds, args.k)
            seconds = {"clouds": t_clouds, **seconds}
            seconds["total"] = sum(seconds.values())
            runs.append(seconds)
        median = {stage: statistics.median(r[stage] for r in runs) for stage in runs[0]}
        workloads[name] = {"seconds_median": median, "seconds_runs": runs, **info}
        print(f"{name:7s} " + "  ".join(f"{s} {t:6.2f}s" for s, t in median.items()))

    result = {
        "benchmark": "zigzag descriptors, 500 prompts x 12 layers (point clouds, complexes, zigzag, descriptors)",
        "prompts": n_prompts,
        "layers": N_CLOUDS,
        "width": WIDTH,
        "k": args.k,
        "p": P,
        "max_simplex_dim": P + 1,
        "runs": args.runs,
        "quick": args.quick,
        "target_total_s": 60,
        "workloads": workloads,
        "llama_model": {
            "hidden_size": WIDTH,
            "blocks": N_CLOUDS - 1,
            "intermediate_size": 512,
            "init": "random, seed 0",
        },
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
    }
    atomic_write_json(args.out, result)
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
