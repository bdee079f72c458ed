"""Benchmark: zigzag barcode (``lmforge.methods.zigzag.persistence``) of layer zigzags of kNN clique complexes.

Each configuration builds 12 "layers" of ``n`` points in R^16, the clique (flag) complex of each layer's
symmetric kNN graph up to dimension ``clique_dim``, the paper's zigzag ``K0 ⊇ K0∩K1 ⊆ K1 ⊇ ...``
(23 spaces) with ``layer_zigzag``, and times ``zigzag_barcode(spaces, clique_dim - 1)`` (all homology
dimensions the complexes can carry).  Two layer models: ``independent`` (fresh random points per layer,
small intersections: the worst case) and ``drift`` (``X_{l+1} = X_l + 0.3 * noise``, correlated layers as
in a residual stream).  The first configuration is the issue's (200 points, k=5, to dim 2).  Timings are
the median over interleaved runs after one warm-up, in one process (pure Python, one core).

    python benchmarks/zigzag_persistence.py [--out benchmarks/results/zigzag_persistence.json] [--quick]

``--quick`` runs only the first configuration once (a smoke test, not a measurement).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from _timing import save_result, time_interleaved  # noqa: E402
from lmforge.methods.zigzag.persistence import layer_zigzag, zigzag_barcode  # noqa: E402

# (points, k, clique_dim, layer model)
CONFIGS = [
    (200, 5, 2, "independent"),
    (200, 5, 2, "drift"),
    (500, 5, 2, "drift"),
    (500, 5, 3, "drift"),
    (500, 5, 3, "independent"),
    (500, 10, 2, "drift"),
    (500, 10, 3, "drift"),
    (500, 10, 3, "independent"),
]


def knn_clique_complex(X: np.ndarray, k: int, dim: int) -> set[tuple[int, ...]]:
    """Clique complex (up to dimension ``dim``) of the symmetric kNN graph of the rows of ``X``."""
    D = ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)
    np.fill_diagonal(D, np.inf)
    nn = np.argsort(D, axis=1)[:, :k]
    adj: list[set[int]] = [set() for _ in range(len(X))]
    for i, row in enumerate(nn):
        for j in row:
            adj[i].add(int(j))
            adj[int(j)].add(i)
    out: set[tuple[int, ...]] = set()

    def grow(s: tuple[int, ...], cand: set[int]) -> None:
        out.add(s)
        if len(s) <= dim:
            for w in cand:
                if w > s[-1]:
                    grow(s + (w,), cand & adj[w])

    for i in range(len(X)):
        grow((i,), adj[i])
    return out


def make_layers(n: int, k: int, dim: int, model: str, seed: int = 0, n_layers: int = 12):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 16))
    layers = []
    for _ in range(n_layers):
        layers.append(knn_clique_complex(X, k, dim))
        X = X + 0.3 * rng.normal(size=X.shape) if model == "drift" else rng.normal(size=X.shape)
    return layers


def simplex_wise_steps(spaces) -> int:
    """Insertions + deletions of the simplex-wise zigzag (from and back to the empty complex)."""
    steps = len(spaces[0]) + len(spaces[-1])
    for a, b in zip(spaces, spaces[1:]):
        steps += len(a ^ b)
    return steps


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "zigzag_persistence.json"))
    parser.add_argument("--quick", action="store_true", help="first configuration, 1 run (smoke test)")
    args = parser.parse_args(argv)
    configs = CONFIGS[:1] if args.quick else CONFIGS
    runs = 1 if args.quick else 3

    t0 = time.perf_counter()
    rows = []
    for n, k, dim, model in configs:
        layers = make_layers(n, k, dim, model)
        spaces = layer_zigzag(layers)
        bars = zigzag_barcode(spaces, dim - 1)
        times = time_interleaved({"zigzag_barcode": lambda: zigzag_barcode(spaces, dim - 1)}, runs)["zigzag_barcode"]
        row = {
            "points": n,
            "k": k,
            "clique_dim": dim,
            "max_dim": dim - 1,
            "layer_model": model,
            "layers": len(layers),
            "spaces": len(spaces),
            "simplices_per_layer_mean": float(np.mean([len(x) for x in layers])),
            "simplices_in_all_spaces": sum(len(s) for s in spaces),
            "simplex_wise_steps": simplex_wise_steps(spaces),
            "bars_per_dim": {str(p): sum(b.dim == p for b in bars) for p in range(dim)},
            "median_s": statistics.median(times),
            "times_s": times,
        }
        rows.append(row)
        print(f"n={n:4d} k={k:2d} dim<={dim} {model:<11} {row['simplices_per_layer_mean']:8.0f} simplices/layer "
              f"{row['simplex_wise_steps']:7d} steps  bars {row['bars_per_dim']}  {row['median_s']:7.2f} s")
    result = {
        "benchmark": "zigzag_barcode of 12-layer kNN clique-complex zigzags (23 spaces)",
        "runs": runs,
        "quick": args.quick,
        "results": rows,
    }
    return save_result(args.out, result, t0)


if __name__ == "__main__":
    main()
