"""BMP against exhaustive search, and its pieces against closed forms.

Measured before these tests were written (VLM-shaped costs of :func:`_vlm_costs`; L = 6..16 layers,
N = 2..4 stages, seeds 0..199: 6600 cases per row; "global" = BMP's pick has the minimum simulated
1F1B makespan over *all* C(L-1, N-1) partitions):

=====  ======================  ============  ==========================
m      candidates run          global        worst excess over optimum
=====  ======================  ============  ==========================
4      all ±1 neighbours (27)  6592 / 6600   1.0 %  (all misses: L=16, N=4)
4      top 3 by variance       5440 / 6600   10.7 %
8      all ±1 neighbours       6600 / 6600   0
8      top 3 by variance       6529 / 6600   3.6 %
16     all ±1 neighbours       6600 / 6600   0
16     top 3 by variance       6558 / 6600   4.1 %
=====  ======================  ============  ==========================

So "BMP equals exhaustive search for <= 16 layers" holds when every ±1 candidate is run (m >= 8 in
every measured case; at m = 4 the optimum is sometimes two layers from the anchor); with only the top 3
by variance it holds in about 99 % of cases at m >= 8. The tests below assert exactly that, on a
subset of the seeds (each row's measured numbers on that subset are in the test).
"""

from __future__ import annotations

import itertools
import math
import random

import pytest

from lmforge.methods.omnibal.bmp import (
    bmp_search,
    equal_split,
    exhaustive_partitions,
    greedy_anchor,
    neighbour_partitions,
    rank_candidates,
    simulated_runner,
)
from lmforge.methods.omnibal.simulate import stage_costs

ALL = 27  # top_k that runs every ±1 candidate (3^(N-1) <= 27 for N <= 4)


def _vlm_costs(n_layers: int, seed: int) -> tuple[list[float], list[float]]:
    """A ViT stack (first third, 3x heavier) then LLM layers; fwd and bwd (2x fwd) each jittered ±20%."""
    rng = random.Random(seed)
    n_vit = max(1, round(n_layers / 3))
    base = [3.0] * n_vit + [1.0] * (n_layers - n_vit)
    fwd = [c * rng.uniform(0.8, 1.2) for c in base]
    bwd = [2 * c * rng.uniform(0.8, 1.2) for c in base]
    return fwd, bwd


def _sweep(n_micro: int, seeds: range, top_k: int) -> tuple[int, int, float]:
    """(cases, cases where BMP's pick is the exhaustive optimum, worst relative excess)."""
    cases = hits = 0
    worst = 0.0
    for seed, n_layers, n_stages in itertools.product(seeds, range(6, 17), range(2, 5)):
        fwd, bwd = _vlm_costs(n_layers, seed * 1000 + n_layers * 10 + n_stages)
        sim = simulated_runner(fwd, bwd, n_micro)
        best = min(sim(p) for p in exhaustive_partitions(n_layers, n_stages))
        res = bmp_search(fwd, bwd, None, n_stages, n_micro, top_k=top_k)
        assert res.chosen_time == min(res.measured.values())
        assert res.chosen_time >= best * (1 - 1e-12)
        cases += 1
        hits += res.chosen_time <= best * (1 + 1e-12)
        worst = max(worst, res.chosen_time / best - 1)
    return cases, hits, worst


def test_bmp_with_all_neighbours_equals_exhaustive() -> None:
    cases, hits, worst = _sweep(8, range(10), ALL)
    assert (cases, hits) == (330, 330) and worst <= 1e-12


def test_bmp_top3_mostly_equals_exhaustive() -> None:
    cases, hits, worst = _sweep(8, range(10), 3)
    assert cases == 330
    assert hits / cases >= 0.97, (hits, cases)  # measured 326 / 330 (0.988); 6529 / 6600 over 200 seeds
    assert worst <= 0.05, worst  # measured 1.0 % here; 3.6 % over 200 seeds


def test_bmp_few_micro_batches_near_exhaustive() -> None:
    cases, hits, worst = _sweep(4, range(10), ALL)
    assert hits / cases >= 0.99, (hits, cases)  # measured 330 / 330 here; 6592 / 6600 over 200 seeds
    assert worst <= 0.02, worst  # measured 0 here; 1.0 % over 200 seeds


def test_vit_heavy_claim_shape() -> None:
    """8 ViT layers 3x heavier than 16 LLM layers, N = 4: BMP's slowest stage <= anchor's <= equal split's.

    Per-layer fwd+bwd: ViT 9, LLM 3, total 120. Equal split (6, 12, 18): stages 54, 30, 18, 18.
    Anchor (3, 7, 14): 27, 36, 27, 30. BMP picks (3, 6, 13): 27, 27, 33, 33.
    """
    fwd = [3.0] * 8 + [1.0] * 16
    bwd = [2 * f for f in fwd]
    res = bmp_search(fwd, bwd, None, 4, 8)
    per = [f + b for f, b in zip(fwd, bwd)]
    assert res.equal_split == (6, 12, 18) and res.anchor == (3, 7, 14) and res.chosen == (3, 6, 13)
    slowest = {k: max(stage_costs(per, b)) for k, b in
               [("bmp", res.chosen), ("anchor", res.anchor), ("equal", res.equal_split)]}
    assert slowest == {"bmp": 33.0, "anchor": 36.0, "equal": 54.0}
    sim = simulated_runner(fwd, bwd, 8)
    assert res.chosen_time < sim(res.anchor) < sim(res.equal_split)


def test_vit_heavy_claim_shape_jittered() -> None:
    """Same shape, ±20 % jitter, 100 seeds, m = 8. Measured over seeds 1..200: BMP's makespan <= the
    anchor's <= the equal split's in 200/200, the anchor's slowest stage <= the equal split's in 200/200,
    BMP's slowest stage <= the anchor's in 185/200 (BMP picks by makespan, which a slightly slower
    stage placed early can lower; worst such excess 8.3 %)."""
    below = 0
    for seed in range(1, 101):
        rng = random.Random(seed)
        base = [3.0] * 8 + [1.0] * 16
        fwd = [c * rng.uniform(0.8, 1.2) for c in base]
        bwd = [2 * c * rng.uniform(0.8, 1.2) for c in base]
        per = [f + b for f, b in zip(fwd, bwd)]
        res = bmp_search(fwd, bwd, None, 4, 8)
        sim = simulated_runner(fwd, bwd, 8)
        assert res.chosen_time <= sim(res.anchor) * (1 + 1e-12) <= sim(res.equal_split) * (1 + 2e-12)
        s_bmp, s_anchor, s_equal = (max(stage_costs(per, b)) for b in (res.chosen, res.anchor, res.equal_split))
        assert s_anchor <= s_equal and s_bmp <= s_equal
        assert s_bmp <= 1.1 * s_anchor
        below += s_bmp <= s_anchor
    assert below >= 85, below  # measured 91 / 100 on these seeds (worst excess 8.3 %)


def test_equal_split() -> None:
    assert equal_split(10, 4) == [3, 6, 8]  # sizes 3, 3, 2, 2: the extra layers go to the earliest stages
    assert equal_split(12, 4) == [3, 6, 9]
    assert equal_split(5, 5) == [1, 2, 3, 4]
    assert equal_split(7, 1) == []
    with pytest.raises(ValueError):
        equal_split(3, 4)


def test_greedy_anchor() -> None:
    assert greedy_anchor([1.0] * 8, 4) == [2, 4, 6]
    assert greedy_anchor([1.0, 1.0, 1.0, 1.0, 4.0], 2) == [4]  # total 8: prefix 4 is exactly 8/2
    assert greedy_anchor([1.0, 2.0, 1.0, 2.0], 2) == [2]  # prefix 3 is exactly 6/2
    assert greedy_anchor([2.0, 2.0, 1.0, 1.0], 2) == [1]  # total 6, target 3: prefixes 2 and 4 tie -> earlier
    # both targets snap to cut 1 (prefix 100); repair makes the stages non-empty
    assert greedy_anchor([100.0, 1.0, 1.0, 1.0], 3) == [1, 2]
    assert greedy_anchor([1.0, 1.0, 1.0, 100.0], 3) == [2, 3]
    rng = random.Random(3)
    for _ in range(300):
        n = rng.randint(1, 20)
        k = rng.randint(1, n)
        cuts = greedy_anchor([rng.uniform(0, 5) for _ in range(n)], k)
        assert len(cuts) == k - 1 and all(1 <= c <= n - 1 for c in cuts)
        assert all(a < b for a, b in zip(cuts, cuts[1:]))


def test_neighbour_partitions() -> None:
    cands = neighbour_partitions([4, 8, 12], 16)
    assert len(cands) == 27 and (4, 8, 12) in cands
    rng = random.Random(4)
    for _ in range(200):
        n = rng.randint(2, 14)
        k = rng.randint(2, min(n, 5))
        anchor = sorted(rng.sample(range(1, n), k - 1))
        got = neighbour_partitions(anchor, n)
        want = [p for p in exhaustive_partitions(n, k) if all(abs(a - b) <= 1 for a, b in zip(p, anchor))]
        assert got == want and tuple(anchor) in got and len(got) <= 3 ** (k - 1)


def test_exhaustive_partitions() -> None:
    for n, k in [(6, 2), (10, 3), (16, 4), (5, 5)]:
        parts = exhaustive_partitions(n, k)
        assert len(parts) == len(set(parts)) == math.comb(n - 1, k - 1)


def test_rank_candidates() -> None:
    fwd, bwd = [1.0] * 6, [2.0] * 6  # 3 per layer, 18 in all
    cut_bytes = [10.0, 50.0, 5.0, 40.0, 20.0]  # crossing the cut before layer c costs cut_bytes[c-1]
    ranked = rank_candidates(fwd, bwd, cut_bytes, [(1,), (2,), (3,), (4,), (5,)])
    # variances: (3,) 0; (2,) and (4,) 9; (1,) and (5,) 36. Ties: fewer bytes first
    assert [c.boundaries for c in ranked] == [(3,), (4,), (2,), (1,), (5,)]
    two = ranked[2]
    assert (two.stage_times, two.variance, two.comm, two.slowest) == ((6.0, 12.0), 9.0, 50.0, 12.0)
    same_bytes = rank_candidates(fwd, bwd, [10.0, 40.0, 5.0, 40.0, 20.0], [(4,), (2,)])
    assert [c.boundaries for c in same_bytes] == [(2,), (4,)]  # full tie: lexicographic boundaries
    three = rank_candidates(fwd, bwd, cut_bytes, [(1, 3), (2, 4), (2, 3)])
    # variance 0, 6, 6; (1, 3) crosses 10 + 5 bytes, (2, 3) 50 + 5
    assert [c.boundaries for c in three] == [(2, 4), (1, 3), (2, 3)]
    # a length-L list (every layer's output size) is accepted: the last entry is unused
    assert rank_candidates(fwd, bwd, cut_bytes + [1e9], [(5,)])[0].comm == 20.0
    assert rank_candidates(fwd, bwd, None, [(5,)])[0].comm == 0.0
    with pytest.raises(ValueError):
        rank_candidates(fwd, bwd, [1.0], [(2,)])


def test_bmp_search_runs_top_k_and_picks_fastest() -> None:
    fwd, bwd = _vlm_costs(12, 7)
    calls: list[tuple[int, ...]] = []
    fake = {}

    def runner(b):
        calls.append(tuple(b))
        return fake.setdefault(tuple(b), 10.0 - len(fake))  # later-run candidates are "faster"

    res = bmp_search(fwd, bwd, None, 4, 8, top_k=3, runner=runner)
    assert calls == [c.boundaries for c in res.candidates[:3]]
    assert res.chosen == calls[2] and res.chosen_time == 8.0 and res.measured == fake
    tie = bmp_search(fwd, bwd, None, 4, 8, top_k=3, runner=lambda b: 1.0)
    assert tie.chosen == tie.candidates[0].boundaries  # ties go to the better-ranked candidate
    assert tie.anchor in [c.boundaries for c in tie.candidates]


def test_bandwidth_makes_cuts_cost_time() -> None:
    fwd, bwd = [1.0] * 4, [2.0] * 4
    free = simulated_runner(fwd, bwd, 4)
    slow = simulated_runner(fwd, bwd, 4, [0.0, 3e9, 0.0], bandwidth=1e9)  # 3 s across the cut before layer 2
    assert free((2,)) == (4 + 1) * 6.0
    assert slow((2,)) > free((2,)) and slow((1,)) == free((1,))
