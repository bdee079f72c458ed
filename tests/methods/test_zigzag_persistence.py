"""Tests of ``lmforge.methods.zigzag.persistence`` (zigzag persistent homology over Z/2).

The main check compares ``zigzag_barcode`` with a brute-force reference written here from the
definition, independent of the implementation (numpy only): homology bases of every space by Gaussian
elimination over Z/2, the matrices of the maps induced by the inclusion arrows, the generalised rank
``rk(b, d)`` = rank of ``lim M|[b,d] -> colim M|[b,d]`` (= number of bars containing ``[b, d]``), and the
multiplicity of ``[b, d]`` by inclusion-exclusion.
"""

from __future__ import annotations

import time
from functools import lru_cache
from itertools import combinations

import numpy as np
import pytest

from lmforge.methods.zigzag.persistence import Bar, closure, layer_zigzag, zigzag_barcode

# --------------------------------------------------------------------------------------------------
# Brute-force reference (no code shared with the implementation)
# --------------------------------------------------------------------------------------------------


def _rref(M: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """Reduced row echelon form over Z/2 and the pivot columns."""
    M = (np.array(M, dtype=np.uint8) & 1).copy()
    rows, cols = M.shape
    pivots: list[int] = []
    r = 0
    for c in range(cols):
        if r == rows:
            break
        nz = np.flatnonzero(M[r:, c])
        if nz.size == 0:
            continue
        k = r + int(nz[0])
        if k != r:
            M[[r, k]] = M[[k, r]]
        hit = np.flatnonzero(M[:, c])
        hit = hit[hit != r]
        if hit.size:
            M[hit] ^= M[r]
        pivots.append(c)
        r += 1
    return M, pivots


def _rank(M: np.ndarray) -> int:
    return 0 if M.size == 0 else len(_rref(M)[1])


def _nullspace(M: np.ndarray, ncols: int) -> np.ndarray:
    """Basis (as columns) of ``{x : M x = 0}`` over Z/2."""
    if M.shape[0] == 0:
        return np.eye(ncols, dtype=np.uint8)
    R, piv = _rref(M)
    free = [c for c in range(ncols) if c not in set(piv)]
    N = np.zeros((ncols, len(free)), dtype=np.uint8)
    for k, f in enumerate(free):
        N[f, k] = 1
        for i, pc in enumerate(piv):
            N[pc, k] = R[i, f]
    return N


class _Homology:
    """``H_p(X; Z/2)``: cycle representatives and the coordinates of a cycle in their basis."""

    def __init__(self, X: set[tuple[int, ...]], p: int):
        self.simplices = sorted(s for s in X if len(s) == p + 1)
        self.index = {s: i for i, s in enumerate(self.simplices)}
        lower = {s: i for i, s in enumerate(sorted(s for s in X if len(s) == p))}
        upper = sorted(s for s in X if len(s) == p + 2)
        n = len(self.simplices)
        d_p = np.zeros((len(lower), n), dtype=np.uint8)
        for j, s in enumerate(self.simplices):
            if p > 0:
                for f in combinations(s, p):
                    d_p[lower[f], j] = 1
        d_up = np.zeros((n, len(upper)), dtype=np.uint8)
        for j, s in enumerate(upper):
            for f in combinations(s, p + 1):
                d_up[self.index[f], j] = 1
        Z = _nullspace(d_p, n)
        B = d_up[:, _rref(d_up)[1]] if d_up.size else np.zeros((n, 0), dtype=np.uint8)
        piv = _rref(np.hstack([B, Z]))[1] if n else []
        self.reps = Z[:, [c - B.shape[1] for c in piv if c >= B.shape[1]]]
        self.basis = np.hstack([B, self.reps])
        self.n_bd = B.shape[1]
        self.dim = self.reps.shape[1]

    def coords(self, cycles: np.ndarray) -> np.ndarray:
        k = self.basis.shape[1]
        R, piv = _rref(np.hstack([self.basis, cycles]))
        assert piv == list(range(k)), "not a cycle of this complex"
        return R[:k, k:][self.n_bd:]


def _induced(h_from: _Homology, h_to: _Homology) -> np.ndarray:
    """Matrix of ``H_p(A) -> H_p(B)`` for ``A ⊆ B`` in the chosen bases."""
    E = np.zeros((len(h_to.simplices), h_from.dim), dtype=np.uint8)
    for i, s in enumerate(h_from.simplices):
        E[h_to.index[s], :] = h_from.reps[i, :]
    return h_to.coords(E)


def reference_barcode(spaces: list[set[tuple[int, ...]]], max_dim: int) -> list[tuple[int, int, int]]:
    N = len(spaces)
    out: list[tuple[int, int, int]] = []
    for p in range(max_dim + 1):
        H = [_Homology(X, p) for X in spaces]
        dims = [h.dim for h in H]
        arrows = []  # (source index, target index, matrix)
        for i in range(N - 1):
            if spaces[i] <= spaces[i + 1]:
                arrows.append((i, i + 1, _induced(H[i], H[i + 1])))
            else:
                assert spaces[i] >= spaces[i + 1]
                arrows.append((i + 1, i, _induced(H[i + 1], H[i])))

        @lru_cache(maxsize=None)
        def rk(b: int, d: int) -> int:
            """Rank of lim -> colim of the module restricted to [b, d]."""
            if b < 0 or d >= N:
                return 0
            off = {}
            D = 0
            for i in range(b, d + 1):
                off[i] = D
                D += dims[i]
            if D == 0:
                return 0
            constraints, relations = [], []
            for i in range(b, d):
                src, dst, A = arrows[i]
                C = np.zeros((dims[dst], D), dtype=np.uint8)  # A x_src + x_dst = 0
                C[:, off[src]:off[src] + dims[src]] = A
                C[:, off[dst]:off[dst] + dims[dst]] ^= np.eye(dims[dst], dtype=np.uint8)
                constraints.append(C)
                R = np.zeros((D, dims[src]), dtype=np.uint8)  # ι_src(e) + ι_dst(A e)
                R[off[src]:off[src] + dims[src], :] = np.eye(dims[src], dtype=np.uint8)
                R[off[dst]:off[dst] + dims[dst], :] ^= A
                relations.append(R)
            lim = _nullspace(np.vstack(constraints) if constraints else np.zeros((0, D), np.uint8), D)
            img = np.zeros((D, lim.shape[1]), dtype=np.uint8)  # each family -> its component at b
            img[off[b]:off[b] + dims[b], :] = lim[off[b]:off[b] + dims[b], :]
            rel = np.hstack(relations) if relations else np.zeros((D, 0), np.uint8)
            return _rank(np.hstack([rel, img])) - _rank(rel)

        for b in range(N):
            for d in range(b, N):
                m = rk(b, d) - rk(b - 1, d) - rk(b, d + 1) + rk(b - 1, d + 1)
                assert m >= 0
                out += [(p, b, d)] * m
    return sorted(out)


def _close(simplices) -> set[tuple[int, ...]]:
    return {f for s in simplices for k in range(1, len(s) + 1) for f in combinations(sorted(s), k)}


def _random_zigzag(rng, n_vertices: int, n_spaces: int, top: int) -> list[set[tuple[int, ...]]]:
    """Random nested sequence of complexes on ``n_vertices`` vertices, simplices up to dimension ``top``.

    Each step either keeps the space, adds the closure of a few random simplices, adds a few simplices
    whose boundary is already there (fills holes), removes the stars of a few simplices, or removes a
    few maximal simplices (opens holes)."""
    universe = [c for k in range(1, top + 2) for c in combinations(range(n_vertices), k)]

    def pick(pool, k):
        return [pool[i] for i in rng.choice(len(pool), size=min(k, len(pool)), replace=False)]

    spaces = [_close(pick(universe, int(rng.integers(0, 10))))]
    for _ in range(n_spaces - 1):
        cur = spaces[-1]
        move = rng.choice(["keep", "add", "fill", "star", "open"], p=[0.08, 0.25, 0.22, 0.2, 0.25])
        nxt = set(cur)
        if move == "add":
            nxt |= _close(pick(universe, int(rng.integers(1, 6))))
        elif move == "fill":
            fillable = [c for c in universe if c not in cur and len(c) > 1
                        and all(f in cur for f in combinations(c, len(c) - 1))]
            nxt |= set(pick(fillable, int(rng.integers(1, 4))))
        elif move == "star" and cur:
            gone = pick(sorted(cur), int(rng.integers(1, 3)))
            nxt = {s for s in cur if not any(set(g) <= set(s) for g in gone)}
        elif move == "open" and cur:
            maximal = sorted(s for s in cur if not any(len(t) == len(s) + 1 and set(s) <= set(t) for t in cur))
            nxt -= set(pick(maximal, int(rng.integers(1, 4))))
        spaces.append(nxt)
    return spaces


def _as_tuples(bars: list[Bar]) -> list[tuple[int, int, int]]:
    return [(b.dim, b.birth, b.death) for b in bars]


# --------------------------------------------------------------------------------------------------
# 1. Against the brute-force reference
# --------------------------------------------------------------------------------------------------


def test_matches_bruteforce_on_random_zigzags():
    rng = np.random.default_rng(20250711)
    n_cases, n_bars, dims_seen = 0, 0, set()
    for case in range(400):
        max_dim = 1 if case % 2 else 2
        top = max_dim + int(rng.integers(1, 3))  # sometimes simplices above max_dim + 1 (must be ignored)
        spaces = _random_zigzag(rng, int(rng.integers(5, 8)), int(rng.integers(4, 8)), top)
        got = _as_tuples(zigzag_barcode(spaces, max_dim))
        want = reference_barcode(spaces, max_dim)
        assert got == want, f"case {case}: spaces={[sorted(s) for s in spaces]}"
        n_cases += 1
        n_bars += len(want)
        dims_seen |= {b[0] for b in want}
    assert n_cases == 400 and dims_seen == {0, 1, 2} and n_bars > 1500


def test_matches_bruteforce_on_random_layer_zigzags():
    """The paper's shape K0 ⊇ K0∩K1 ⊆ K1 ⊇ ... with unrelated random complexes (many re-insertions)."""
    rng = np.random.default_rng(7)
    for case in range(200):
        max_dim = 1 if case % 2 else 2
        n_v = int(rng.integers(5, 8))
        universe = [c for k in range(1, max_dim + 3) for c in combinations(range(n_v), k)]
        layers = [_close([universe[i] for i in rng.choice(len(universe), size=int(rng.integers(2, 12)),
                                                            replace=False)])
                  for _ in range(int(rng.integers(2, 5)))]
        spaces = layer_zigzag(layers)
        assert _as_tuples(zigzag_barcode(spaces, max_dim)) == reference_barcode(spaces, max_dim), case


def test_reference_sanity():
    """The reference itself on a case that is easy by hand: a hollow triangle, H_1 = 1, H_0 = 1."""
    hollow = _close([(0, 1), (1, 2), (0, 2)])
    assert reference_barcode([hollow], 1) == [(0, 0, 0), (1, 0, 0)]
    assert reference_barcode([hollow, _close([(0, 1, 2)]), hollow], 1) == [(0, 0, 2), (1, 0, 0), (1, 2, 2)]


# --------------------------------------------------------------------------------------------------
# 2. The synthetic check: a circle alive in layers 2..9 of 12
# --------------------------------------------------------------------------------------------------


def _knn_flag(X: np.ndarray, k: int, dim: int) -> set[tuple[int, ...]]:
    D = ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)
    np.fill_diagonal(D, np.inf)
    nn = np.argsort(D, axis=1)[:, :k]
    adj = {i: set() for i in range(len(X))}
    for i in range(len(X)):
        for j in nn[i]:
            adj[i].add(int(j))
            adj[int(j)].add(i)
    out: set[tuple[int, ...]] = set()

    def grow(s, cand):
        out.add(s)
        if len(s) <= dim:
            for w in cand:
                if w > s[-1]:
                    grow(s + (w,), cand & adj[w])

    for i in adj:
        grow((i,), adj[i])
    return out


def _connected(X: set[tuple[int, ...]]) -> bool:
    verts = {s[0] for s in X if len(s) == 1}
    parent = {v: v for v in verts}

    def find(v):
        while parent[v] != v:
            v = parent[v]
        return v

    for s in X:
        if len(s) == 2:
            parent[find(s[0])] = find(s[1])
    return len({find(v) for v in verts}) == 1


def test_circle_in_layers_2_to_9_knn():
    """kNN(k=3) clique complexes: 24 points on a circle in layers 2..9, on a segment (no wrap-around edge)
    in layers 0, 1, 10, 11.  Exactly one long H_1 bar, from index 4 (layer 2) to 18 (layer 9)."""
    rng = np.random.default_rng(0)
    n = 24
    layers = []
    for layer in range(12):
        t = 2 * np.pi * np.arange(n) / n
        if 2 <= layer <= 9:
            r = 1 + 0.01 * rng.normal(size=n)
            ang = t + 0.01 * rng.normal(size=n)
            X = np.stack([r * np.cos(ang), r * np.sin(ang)], 1)
        else:
            X = np.stack([t + 0.01 * rng.normal(size=n), 0.01 * rng.normal(size=n)], 1)
        layers.append(_knn_flag(X, 3, 2))
    spaces = layer_zigzag(layers)
    assert len(spaces) == 23 and all(_connected(s) for s in spaces)
    bars = zigzag_barcode(spaces, 1)
    h1 = [b for b in bars if b.dim == 1]
    assert Bar(1, 4, 18) in h1
    assert [b for b in h1 if b.death - b.birth >= 8] == [Bar(1, 4, 18)]
    assert [b for b in bars if b.dim == 0] == [Bar(0, 0, 22)]
    assert _as_tuples(bars) == reference_barcode(spaces, 1)


def test_circle_in_layers_2_to_9_hexagon():
    """Hand-built: filled hexagon in layers 0 and 11, broken (a path) in layers 1 and 10, hollow hexagon
    in layers 2..9 (plus a pendant vertex): exactly one H_1 bar [4, 18] and one H_0 bar [0, 22]."""
    hexagon = [(i, (i + 1) % 6) for i in range(6)]
    path = hexagon[:-1]
    filled = [(0, 1, 2), (0, 2, 3), (0, 3, 4), (0, 4, 5)]
    spoke = [(0, 6)]
    layers = [_close(filled + spoke), _close(path + spoke)] + [_close(hexagon + spoke)] * 8 + \
             [_close(path + spoke), _close(filled + spoke)]
    bars = zigzag_barcode(layer_zigzag(layers), 1)
    assert bars == [Bar(0, 0, 22), Bar(1, 4, 18)]
    # Filled (instead of broken) right next to the hollow layers: the hollow hexagon is then also in the
    # intersections K1∩K2 and K9∩K10, so the bar is [3, 19]: born on the descending arrow K1 ⊇ K1∩K2
    # (deleting triangles creates it) and killed on the ascending arrow K9∩K10 ⊆ K10 (filling it).
    layers2 = [_close(path + spoke), _close(filled + spoke)] + [_close(hexagon + spoke)] * 8 + \
              [_close(filled + spoke), _close(path + spoke)]
    assert zigzag_barcode(layer_zigzag(layers2), 1) == [Bar(0, 0, 22), Bar(1, 3, 19)]


# --------------------------------------------------------------------------------------------------
# 3. Hand cases
# --------------------------------------------------------------------------------------------------


def test_vertex_appears_and_disappears():
    assert zigzag_barcode([set(), {(0,)}, set()], 1) == [Bar(0, 1, 1)]
    assert zigzag_barcode([{(0,)}, {(0,), (1,)}, {(0,)}], 0) == [Bar(0, 0, 2), Bar(0, 1, 1)]
    # Classes living only between two spaces (inside one block of insertions) are not bars of the module.
    assert zigzag_barcode([set(), _close([(0, 1), (1, 2)]), set()], 1) == [Bar(0, 1, 1)]


def test_merge_on_ascending_split_on_descending():
    two = {(0,), (1,)}
    joined = two | {(0, 1)}
    # H0: 2 -> 1 <- 2.  The merge kills a class on the ascending arrow (last alive at 0); the split
    # creates one on the descending arrow (born at 2).
    assert zigzag_barcode([two, joined, two], 0) == [Bar(0, 0, 0), Bar(0, 0, 2), Bar(0, 2, 2)]
    # Descending first: 1 <- 2 -> 1 (split born at 1, merge kills it: last alive at 1).
    assert zigzag_barcode([joined, two, joined], 0) == [Bar(0, 0, 2), Bar(0, 1, 1)]


def test_triangle_filled_and_emptied():
    hollow = _close([(0, 1), (1, 2), (0, 2)])
    full = _close([(0, 1, 2)])
    # H1 dies on an insertion (the 2-simplex fills it): last alive at 0.
    assert zigzag_barcode([hollow, full], 1) == [Bar(0, 0, 1), Bar(1, 0, 0)]
    # H1 born on a deletion (the 2-simplex is removed): born at 1.
    assert zigzag_barcode([full, hollow], 1) == [Bar(0, 0, 1), Bar(1, 1, 1)]
    assert zigzag_barcode([hollow, full, hollow, full], 1) == [Bar(0, 0, 3), Bar(1, 0, 0), Bar(1, 2, 2)]
    # max_dim=0 ignores H1; max_dim=1 ignores a hollow tetrahedron's H2.
    assert zigzag_barcode([hollow, full], 0) == [Bar(0, 0, 1)]
    sphere = _close(combinations(range(4), 3))
    assert zigzag_barcode([sphere], 1) == [Bar(0, 0, 0)]
    assert zigzag_barcode([sphere, _close([(0, 1, 2, 3)]), sphere], 2) == \
        [Bar(0, 0, 2), Bar(2, 0, 0), Bar(2, 2, 2)]


def test_fzz_readme_sample():
    """The sample filtration of Dey & Hou's fzz README (published input and output; closed intervals of
    the simplex-wise complexes K_0 = ∅ .. K_14 = ∅), fed as 15 spaces."""
    ops = [("i", (0,)), ("i", (1,)), ("i", (2,)), ("i", (0, 1)), ("i", (0, 2)), ("i", (1, 2)), ("i", (0, 1, 2)),
           ("d", (0, 1, 2)), ("d", (1, 2)), ("d", (0, 1)), ("d", (0, 2)), ("d", (0,)), ("d", (1,)), ("d", (2,))]
    cur: set[tuple[int, ...]] = set()
    spaces = [set()]
    for op, s in ops:
        (cur.add if op == "i" else cur.remove)(s)
        spaces.append(set(cur))
    expected = [(0, 2, 3), (0, 3, 4), (1, 6, 6), (0, 1, 13), (0, 11, 11), (0, 10, 12), (1, 8, 8)]
    assert _as_tuples(zigzag_barcode(spaces, 1)) == sorted(expected)


def test_trivial_inputs_and_normalisation():
    assert zigzag_barcode([], 1) == []
    assert zigzag_barcode([set(), set()], 2) == []
    # Unsorted vertex lists, lists instead of tuples, numpy ints, equal consecutive spaces.
    sp = [[[1, 0], [0], [1]], [(0, 1), (np.int64(0),), (1,)], [[2], [1], [0], [0, 1]]]
    assert zigzag_barcode(sp, 1) == [Bar(0, 0, 2), Bar(0, 2, 2)]


def test_closure_and_layer_zigzag():
    assert closure([[2, 0, 1]]) == {(0,), (1,), (2,), (0, 1), (0, 2), (1, 2), (0, 1, 2)}
    assert closure([(3,), (1, 3)]) == {(1,), (3,), (1, 3)}
    assert closure([]) == set()
    K = [closure([(0, 1)]), closure([(1, 2)]), closure([(0, 1), (1, 2)])]
    assert layer_zigzag(K) == [K[0], {(1,)}, K[1], K[1], K[2]]
    assert layer_zigzag([K[0]]) == [K[0]]
    assert layer_zigzag([]) == []
    with pytest.raises(ValueError):
        closure([(1, 1)])


# --------------------------------------------------------------------------------------------------
# 4. Errors
# --------------------------------------------------------------------------------------------------


def test_not_nested_raises_naming_index():
    a, b = {(0,)}, {(1,)}
    with pytest.raises(ValueError, match=r"spaces\[1\] and spaces\[2\] are not nested"):
        zigzag_barcode([set(), a, b], 0)
    with pytest.raises(ValueError, match=r"spaces\[0\] and spaces\[1\]"):
        zigzag_barcode([closure([(0, 1)]), closure([(1, 2)])], 1)


def test_not_closed_raises():
    with pytest.raises(ValueError, match=r"spaces\[1\] is not closed under faces"):
        zigzag_barcode([{(0,)}, {(0,), (0, 1)}], 1)
    with pytest.raises(ValueError, match="not closed"):
        zigzag_barcode(layer_zigzag([{(0,), (1,), (2,), (0, 1, 2)}]), 1)
    with pytest.raises(ValueError):
        zigzag_barcode([{(0,)}], -1)


# --------------------------------------------------------------------------------------------------
# Speed (printed, not asserted)
# --------------------------------------------------------------------------------------------------


def test_speed_knn_layers_printed(capsys):
    rng = np.random.default_rng(1)
    layers = [_knn_flag(rng.normal(size=(200, 16)), 5, 2) for _ in range(12)]
    spaces = layer_zigzag(layers)
    t0 = time.perf_counter()
    bars = zigzag_barcode(spaces, 1)
    dt = time.perf_counter() - t0
    with capsys.disabled():
        print(f"\n[zigzag speed] 12 layers kNN(k=5) clique complexes of 200 random points (independent per "
              f"layer) to dim 2 -> {len(spaces)} spaces, {np.mean([len(k) for k in layers]):.0f} simplices/layer, "
              f"H0+H1: {len(bars)} bars in {dt:.2f} s")
