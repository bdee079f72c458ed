"""Zigzag persistent homology over Z/2 (for "Zigzag persistence of LLM layers", Gardinazzi et al., ICML 2025).

What is computed
----------------
Given simplicial complexes ``S_0, ..., S_{N-1}`` with each consecutive pair nested (``S_i ⊆ S_{i+1}``,
an *ascending* arrow, or ``S_i ⊇ S_{i+1}``, a *descending* arrow), the zigzag module
``H_p(S_0) <-> H_p(S_1) <-> ... <-> H_p(S_{N-1})`` (unreduced homology, coefficients Z/2, maps induced
by the inclusions) decomposes uniquely into interval modules. :func:`zigzag_barcode` returns these
intervals for ``p = 0..max_dim`` as :class:`Bar` objects ``(dim, birth, death)``: the class exists at
every space index ``birth <= i <= death`` (closed interval of *space* indices).  Only simplices of
dimension ``<= max_dim + 1`` influence ``H_0..H_max_dim``; higher ones are ignored.

:func:`layer_zigzag` builds the paper's filtration ``K_0 ⊇ K_0∩K_1 ⊆ K_1 ⊇ K_1∩K_2 ⊆ ... ⊆ K_{L-1}``
(``2L-1`` spaces, layer ``l`` at index ``2l``, the intersection of layers ``l`` and ``l+1`` at index ``2l+1``).

Algorithm (FastZigzag, Dey & Hou, "Fast Computation of Zigzag Persistence", ESA 2022)
------------------------------------------------------------------------------------
1. *Simplex-wise zigzag F.* ``X_0 = ∅``; insert the simplices of ``S_0`` (faces before cofaces,
   i.e. by increasing dimension), reaching ``X_{a_0} = S_0``; for each arrow ``S_i -> S_{i+1}`` insert
   ``S_{i+1} \\ S_i`` by increasing dimension, or delete ``S_i \\ S_{i+1}`` by *decreasing* dimension
   (cofaces before faces), one simplex per step, reaching ``X_{a_{i+1}} = S_{i+1}``; finally delete
   everything (by decreasing dimension) down to ``X_m = ∅``.  Event ``j`` (``1 <= j <= m``) is the
   step ``X_{j-1} <-> X_j``.  The module on spaces is the restriction of the module on ``X`` to the
   indices ``a_0 <= a_1 <= ... <= a_{N-1}`` (within one block all arrows point the same way, so the
   composite is the inclusion ``S_i <-> S_{i+1}``).
2. *Copies.* Every insertion creates a new cell (a "copy" of the simplex; a simplex inserted, deleted
   and inserted again gives two cells) whose boundary is the sum of the cells of its faces alive at that
   moment.  The cells form a Delta-complex ``K`` (not necessarily a simplicial complex).
3. *Up-down filtration U and coning.* Moving all insertions before all deletions (keeping the
   relative order of insertions and of deletions) gives ``U: ∅ ⊂ ... ⊂ K ⊃ ... ⊃ ∅``.  Its deletions
   are replaced by insertions of cones: the standard filtration ``G`` is
   ``ω`` (a new vertex, column 0), then the cells of ``K`` in insertion order (columns ``1..n``), then
   the cones ``ω·c`` of the cells in *reverse* deletion order (columns ``n+1..2n``;
   ``∂(ω·c) = c + Σ ω·f`` over the cells ``f`` of the codimension-1 faces of ``c``;
   ``∂(ω·v) = v + ω`` for a vertex ``v``).
   ``G`` ends at the cone ``ω·K``, which is contractible: ``ω`` is the only essential class and every
   other column is paired.
4. *Standard persistence of G* by Z/2 column reduction with the clearing/twist optimisation
   (Chen & Kerber 2011), in pure Python with ints as bit sets (no compiled dependency).  Speed-up
   that does not change the result: the pivot of a reduced column ``R_j`` is the smallest pivot over
   the coset ``D e_j + span{D e_k : k < j}``, so a column may start from any vector of that coset.
   For the cone ``ω·c`` of a cell ``c`` of dimension ``p >= 1`` we start, when one is at hand, from a
   small ``p``-cycle ``z ∋ c`` of ``K`` whose other cells are deleted after ``c`` (their cones come
   earlier in G): ``z = D(Σ_{x∈z} ω·x)`` because ``∂z = 0``.  Two kinds are looked for: the boundary
   of a simplex ``s ∪ {w}`` all of whose ``p``-faces are alive just before ``c`` (a copy of ``s``) is
   deleted (cells alive at one time form a genuine simplicial complex, so this is a cycle of ``K``), and
   a "pillow" ``c + c'`` with ``c'`` the next copy of the same simplex on the very same face cells.
   Without this, those columns (creators of the down-filtration, i.e. cycles of ``K``) dominate the
   running time.
5. *Reading F's bars from G's pairs* (Dey & Hou 2022; the proof goes through U and the diamond
   principle of Carlsson & de Silva; the same mapping is used by their reference implementation
   ``fzz``).  For a pair (creator column ``b``, killer column ``d``), with ``add(c)`` / ``del(c)`` the
   event index of the insertion / deletion of cell ``c`` in F:

   * ``b, d`` both cells of ``K`` (``b = σ``, ``d = τ``): ``H_dim σ`` bar born at event ``add(σ)``,
     killed at event ``add(τ)``;
   * ``b = σ`` a cell, ``d = ω·δ`` a cone: if ``add(σ) < del(δ)``, an ``H_dim σ`` bar born at ``add(σ)``
     and killed at ``del(δ)``; otherwise an ``H_{dim σ - 1}`` bar born at ``del(δ)`` and killed at
     ``add(σ)`` (the dimension shift of the Mayer-Vietoris diamond);
   * ``b = ω·β``, ``d = ω·δ`` both cones: an ``H_dim β`` bar born at ``del(δ)`` and killed at ``del(β)``.

   A bar born at event ``s`` and killed at event ``t`` is the interval ``[s, t-1]`` of X-indices.

Index conventions (simplex-wise events -> space indices)
--------------------------------------------------------
An X-interval ``[s, t]`` restricts to the space interval ``{i : s <= a_i <= t}``:
``birth = min{i : a_i >= s}``, ``death = max{i : a_i <= t}``; it is dropped when empty (a class that
lives only strictly between two spaces, inside one block of insertions or deletions).  Spelled out, for
the arrow between ``S_i`` and ``S_{i+1}``:

* a class *born by an insertion* on the ascending arrow ``S_i ⊆ S_{i+1}`` is born at ``i+1``;
* a class *born by a deletion* on the descending arrow ``S_i ⊇ S_{i+1}`` (e.g. deleting the 2-simplex
  of a filled triangle creates an H_1 class) is born at ``i+1`` as well: it exists in ``S_{i+1}`` and is
  not in the image of / does not come from ``S_i``;
* a class *killed by a deletion* on a descending arrow (e.g. deleting a vertex that is its own
  component) was last alive at ``i``: ``death = i``;
* a class *killed by an insertion* on an ascending arrow (e.g. filling a triangle boundary, or an edge
  merging two components) was last alive at ``i``: ``death = i``;
* classes present in ``S_0`` have ``birth = 0``; classes alive in ``S_{N-1}`` have ``death = N-1``.

Libraries checked, none used
----------------------------
gudhi 3.13 (installed) has no zigzag persistence in its Python interface; dionysus 2 (which has
``ZigzagPersistence`` and a fast-zigzag example) does not build here; pyfzz (Python binding of ``fzz``)
has no installable distribution; oineus has no zigzag.  Hence this pure-Python implementation; only the
*ideas* of Dey & Hou (and the bar mapping of their paper, cross-checked against the ``fzz`` source)
are used, no code.  Correctness is tested against a brute-force linear-algebra computation of the
interval multiplicities (generalised ranks lim -> colim) in ``tests/methods/test_zigzag_persistence.py``.

NOTE (deviations)
-----------------
* Homology is *unreduced* (an H_0 class per component; the empty complex has no homology).
* Bars are closed intervals of space indices, ``death`` inclusive (a class alive at the end has
  ``death = N-1``, never ``inf``); bars that exist only between two consecutive spaces (inside one
  block of simplex-wise steps) are dropped, as they are not part of the space-indexed module.
* The standard persistence step is a pure-Python bit-set reduction (the reference implementation
  uses PHAT in C++), with the small-cycle starting columns of step 4 (not in the paper; they change
  the work, not the pairs).  Speed: see ``benchmarks/zigzag_persistence.py``.
"""

from __future__ import annotations

import operator
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from itertools import combinations
from typing import Iterable, Sequence

__all__ = ["Bar", "Simplex", "closure", "layer_zigzag", "zigzag_barcode"]

Simplex = tuple[int, ...]  # sorted vertex ids


@dataclass(frozen=True, order=True)
class Bar:
    """One interval of a zigzag barcode: an ``H_dim`` class alive at space indices ``birth..death``."""

    dim: int
    birth: int  # first index of the zigzag where the class exists
    death: int  # last index where it exists (inclusive); alive at the end: death = len(spaces) - 1


def _as_simplex(s: Sequence[int]) -> Simplex:
    try:
        verts = sorted(operator.index(v) for v in s)
    except TypeError as e:
        raise TypeError(f"a simplex must be a sequence of integer vertex ids, got {s!r}") from e
    if not verts:
        raise ValueError("the empty simplex is not allowed")
    for u, v in zip(verts, verts[1:]):
        if u == v:
            raise ValueError(f"simplex {s!r} repeats vertex {u}")
    return tuple(verts)


def closure(simplices: Iterable[Sequence[int]]) -> set[Simplex]:
    """All nonempty faces of the given simplices (the simplices included), as sorted tuples."""
    out: set[Simplex] = set()
    for s in simplices:
        t = _as_simplex(s)
        if t in out:  # ``out`` is closed, so all faces of t are already there
            continue
        for k in range(1, len(t) + 1):
            out.update(combinations(t, k))
    return out


def _facets(s: Simplex) -> list[Simplex]:
    """The codimension-1 faces of ``s`` (none for a vertex)."""
    if len(s) == 1:
        return []
    return [s[:k] + s[k + 1:] for k in range(len(s))]


def _normalize_space(space: Iterable[Sequence[int]], idx: int) -> set[Simplex]:
    out = {_as_simplex(s) for s in space}
    for s in out:
        for f in _facets(s):
            if f not in out:
                raise ValueError(f"spaces[{idx}] is not closed under faces: {f} (a face of {s}) is missing")
    return out


def layer_zigzag(complexes: Sequence[Iterable[Sequence[int]]]) -> list[set[Simplex]]:
    """``[K0, K0∩K1, K1, K1∩K2, ..., K_{L-1}]`` (``2L-1`` spaces; layer ``l`` at index ``2l``).

    This is the paper's filtration ``K0 ⊇ K0∩K1 ⊆ K1 ⊇ ...``.  Simplices are normalised to sorted tuples;
    that each ``K_l`` is closed under faces is checked by :func:`zigzag_barcode`.
    """
    ks = [{_as_simplex(s) for s in k} for k in complexes]
    out: list[set[Simplex]] = []
    for l, k in enumerate(ks):
        if l:
            out.append(ks[l - 1] & k)
        out.append(k)
    return out


def _strip(x: int) -> tuple[int, int]:
    """``(shift, x >> shift)`` with the trailing zero bits of ``x`` removed (compact storage)."""
    if not x:
        return 0, 0
    shift = (x & -x).bit_length() - 1
    return shift, x >> shift


def _reduce(n_cols: int, columns_by_dim: list[list[int]], column, split: int) -> list[tuple[int, int]]:
    """Persistence pairs (creator, killer) of a filtration given as a Z/2 boundary matrix.

    ``columns_by_dim[q]`` lists the column indices of dimension ``q`` in increasing order (the
    filtration order).  ``column(j)`` gives the row indices of column ``j`` of the boundary matrix ``D``,
    or of any other vector of the coset ``D e_j + span{D e_k : k < j}``: the pivot ("low") of the
    reduced column ``R_j`` is the smallest low over that coset, so the pairs do not depend on the choice.

    Standard column reduction with clearing (twist; Chen & Kerber 2011): dimensions are processed from
    the top down, and a column that is the pivot of a reduced column one dimension up reduces to zero
    and is skipped.  Columns are Python ints used as bit sets, in two blocks (rows ``< split`` and rows
    ``>= split``) that are stored with their trailing zeros stripped: the reduced columns here are
    narrow within each block, which keeps memory small while XOR stays a single C-level operation.
    """
    cleared = bytearray(n_cols)
    pairs: list[tuple[int, int]] = []
    for q in range(len(columns_by_dim) - 1, 0, -1):
        pivots: dict[int, tuple[int, int, int, int]] = {}
        for j in columns_by_dim[q]:
            if cleared[j]:
                continue
            lo = hi = 0
            for r in column(j):
                if r < split:
                    lo ^= 1 << r
                else:
                    hi ^= 1 << (r - split)
            while True:
                if hi:
                    low = split + hi.bit_length() - 1
                elif lo:
                    low = lo.bit_length() - 1
                else:
                    low = -1
                    break
                piv = pivots.get(low)
                if piv is None:
                    break
                ls, lb, hs, hb = piv
                if lb:
                    lo ^= lb << ls
                if hb:
                    hi ^= hb << hs
            if low >= 0:
                pivots[low] = _strip(lo) + _strip(hi)
                cleared[low] = 1
                pairs.append((low, j))
    return pairs


def zigzag_barcode(spaces: Sequence[Iterable[Sequence[int]]], max_dim: int) -> list[Bar]:
    """Interval decomposition of ``H_p`` (``p = 0..max_dim``, Z/2) of a zigzag of simplicial complexes.

    ``spaces`` are simplicial complexes (each closed under faces; checked) in zigzag order, each
    consecutive pair nested (``spaces[i] ⊆ spaces[i+1]`` or ``spaces[i] ⊇ spaces[i+1]``; equal is
    allowed); otherwise ``ValueError`` naming ``i``.  Returns the bars sorted by (dim, birth, death),
    with multiplicity.  See the module docstring for the algorithm and the index conventions.
    """
    max_dim = operator.index(max_dim)
    if max_dim < 0:
        raise ValueError(f"max_dim must be >= 0, got {max_dim}")
    norm = [_normalize_space(sp, i) for i, sp in enumerate(spaces)]
    for i in range(len(norm) - 1):
        if not (norm[i] <= norm[i + 1] or norm[i] >= norm[i + 1]):
            raise ValueError(f"spaces[{i}] and spaces[{i + 1}] are not nested (neither contains the other); "
                             f"the zigzag is not defined at arrow {i}")
    if not norm:
        return []
    top = max_dim + 2  # number of vertices of the largest simplex that matters (dimension max_dim + 1)
    norm = [{s for s in sp if len(s) <= top} for sp in norm]

    # 1-2. Simplex-wise zigzag F as cells with insertion/deletion event indices.
    live: dict[Simplex, int] = {}  # simplex -> its currently alive cell
    cell_bnd: list[list[int]] = []  # cells of the codim-1 faces of each cell
    cell_dim: list[int] = []
    add_ev: list[int] = []  # event index of the insertion of each cell
    del_ev: list[int] = []  # event index of its deletion (filled in later)
    del_order: list[int] = []  # cells in deletion order
    ev = 0

    cell_simplex: list[Simplex] = []
    adj: dict[int, set[int]] = {}  # 1-skeleton of the live complex
    shortcut: dict[int, list[int]] = {}  # cell -> a small cycle through it (see step 4)

    def insert(simplices) -> None:
        nonlocal ev
        for s in sorted(simplices, key=lambda s: (len(s), s)):  # faces before cofaces
            ev += 1
            c = len(cell_dim)
            cell_bnd.append([live[f] for f in _facets(s)])
            live[s] = c
            cell_simplex.append(s)
            cell_dim.append(len(s) - 1)
            add_ev.append(ev)
            del_ev.append(-1)
            if len(s) == 1:
                adj[s[0]] = set()
            elif len(s) == 2:
                adj[s[0]].add(s[1])
                adj[s[1]].add(s[0])

    def delete(simplices) -> None:
        nonlocal ev
        for s in sorted(simplices, key=lambda s: (-len(s), s)):  # cofaces before faces
            ev += 1
            c = live.pop(s)
            del_ev[c] = ev
            del_order.append(c)
            if len(s) == 1:
                del adj[s[0]]
                continue
            if len(s) == 2:
                adj[s[0]].discard(s[1])
                adj[s[1]].discard(s[0])
            # A boundary of a simplex s ∪ {w} in the live complex, through s (see step 4).
            common = set.intersection(*(adj[v] for v in s)).difference(s) if len(s) > 2 else \
                adj[s[0]] & adj[s[1]]
            for w in sorted(common):
                others = [live.get(tuple(sorted(s[:k] + s[k + 1:] + (w,)))) for k in range(len(s))]
                if None not in others:
                    shortcut[c] = [c] + others
                    break

    insert(norm[0])
    a = [ev]  # a[i]: X-index at which the simplex-wise zigzag equals spaces[i]
    for i in range(len(norm) - 1):
        if norm[i] <= norm[i + 1]:
            insert(norm[i + 1] - norm[i])
        else:
            delete(norm[i] - norm[i + 1])
        a.append(ev)
    delete(list(live))
    n = len(cell_dim)
    if n == 0:
        return []
    # Pillows: a cell and the next copy of its simplex with the very same face cells form a cycle.
    last_copy: dict[Simplex, int] = {}
    for c in range(n):
        s = cell_simplex[c]
        prev = last_copy.get(s)
        if prev is not None and len(s) > 1 and cell_bnd[prev] == cell_bnd[c]:
            shortcut[prev] = [prev, c]
        last_copy[s] = c

    # 3. Coned standard filtration G: column 0 = ω, 1..n = cells, n+1..2n = cones (reverse deletion order).
    cone_col = [0] * n
    for m, c in enumerate(reversed(del_order)):
        cone_col[c] = n + 1 + m

    def boundary(j: int) -> list[int]:
        if j <= n:
            return [f + 1 for f in cell_bnd[j - 1]]
        c = del_order[2 * n - j]
        z = shortcut.get(c)
        if z is not None:
            return [x + 1 for x in z]
        fs = cell_bnd[c]
        return [c + 1] + [cone_col[f] for f in fs] if fs else [c + 1, 0]

    columns_by_dim: list[list[int]] = [[] for _ in range(top + 1)]
    columns_by_dim[0].append(0)
    for c in range(n):
        columns_by_dim[cell_dim[c]].append(c + 1)
    for m in range(n):
        c = del_order[n - 1 - m]
        columns_by_dim[cell_dim[c] + 1].append(n + 1 + m)

    # 4. Standard persistence of G.
    pairs = _reduce(2 * n + 1, columns_by_dim, boundary, n + 1)
    if len(pairs) != n:  # G is a cone: only ω is essential
        raise AssertionError(f"internal error: {len(pairs)} persistence pairs for a cone with {2 * n + 1} cells")

    # 5. Pairs of G -> bars of F (event indices) -> bars on spaces.
    bars: list[Bar] = []
    for b, d in pairs:
        if b == 0:  # ω is the oldest vertex, never a pivot
            raise AssertionError("internal error: the cone vertex was paired")
        if d <= n:  # both cells of K
            p, s, t = cell_dim[b - 1], add_ev[b - 1], add_ev[d - 1]
        elif b <= n:  # cell, then cone
            sigma, delta = b - 1, del_order[2 * n - d]
            p, s, t = cell_dim[sigma], add_ev[sigma], del_ev[delta]
            if t < s:
                p, s, t = p - 1, t, s
        else:  # both cones
            beta, delta = del_order[2 * n - b], del_order[2 * n - d]
            p, s, t = cell_dim[beta], del_ev[delta], del_ev[beta]
        if p > max_dim:
            continue
        if p < 0 or s >= t:
            raise AssertionError(f"internal error: pair ({b}, {d}) maps to dim {p}, events {s}..{t}")
        birth = bisect_left(a, s)
        death = bisect_right(a, t - 1) - 1
        if birth <= death:
            bars.append(Bar(p, birth, death))
    bars.sort()
    return bars
