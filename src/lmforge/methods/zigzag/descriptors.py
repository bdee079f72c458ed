"""Zigzag-persistence descriptors of a model's layers (Gardinazzi, Viswanathan et al., ICML 2025).

Recipe ("Persistent Topological Features in Large Language Models", arXiv 2410.11042; official code
github.com/RitAreaSciencePark/ZigZagLLMs, whose ``src/zigzag/zigzag_DL.py`` also sits in
github.com/YuriGardinazzi/conferenceProject):

1. **Point clouds** (:func:`layer_point_clouds`): one point per prompt and layer, the last-token
   (or mean-pooled) hidden state, normalised row by row (:func:`normalize_cloud`).
2. **Complexes** (:func:`knn_clique_complex`): per layer, the kNN graph of the cloud
   (``sklearn.neighbors.kneighbors_graph``, Euclidean, self excluded), symmetrised by union, and its
   clique complex up to dimension ``p + 1`` (``gudhi.SimplexTree.expansion``).
3. **Zigzag** (:func:`zigzag_of_layers`): K0 ⊇ K0∩K1 ⊆ K1 ⊇ ... ⊆ K_{L-1} (zigzag indices
   0..2(L-1), layer l at 2l, odd indices are intersections), its barcode from
   :mod:`lmforge.methods.zigzag.persistence` (our own engine: no zigzag library is installed or
   installable here; the official code uses ``dionysus`` for bookkeeping and FastZigZag's
   ``pyfzz`` for the barcode), less the bars that live in no layer.
4. **Descriptors** (:func:`describe_bars`): the effective persistence image PÎ_p (intersections
   folded into layers), the Betti numbers β_p per layer, the births' relative frequency B_p, the
   inter-layer persistence Z_p and its weighted average Z̄_p, whose p = 1 profile is the pruning
   score r(ℓ) (:func:`zigzag_layer_scores`).

Index conventions here. A :class:`~lmforge.methods.zigzag.persistence.Bar` has zigzag indices with an
*inclusive* death (its last index alive). A bar born at zigzag index ``b`` and last alive at ``d``
is, in layers, born at ``ceil(b / 2)`` and last alive at ``floor(d / 2)``: a bar born in the
intersection K_{l-1}∩K_l first shows in layer l (its image in K_{l-1} is zero, or it would have
been born earlier), and one last alive in that intersection was last seen in layer l-1.
``PÎ[b, d]`` counts the p-bars born in layer ``b`` and last alive in layer ``d`` (``b <= d``).

Libraries: scikit-learn 1.9 (``kneighbors_graph``) and gudhi 3.13 (``SimplexTree.insert_batch``,
``expansion``, ``get_simplices``), as installed. gudhi has no zigzag persistence in Python, dionysus 2
does not build here and pyfzz has no installable distribution (see ``persistence.py``).

What was checked in the official code (commit 405c669 of ZigZagLLMs; same files in conferenceProject):

* ``src/zigzag/zigzag_DL.py`` ``ZIGZAG.generate_simplex_tree``: ``kneighbors_graph(reps,
  n_neighbors=knn)`` with sklearn's defaults (``mode="connectivity"``, Minkowski p=2 = Euclidean,
  ``include_self=False``); every directed kNN edge is inserted into a ``gudhi.SimplexTree`` (so the
  graph is symmetrised by union), then ``S.expansion(dim)`` and ``S.get_skeleton(dim)``; no
  normalisation of the clouds. ``compute_layers_with_intersection`` builds K0, K0∩K1, K1, ...;
  ``utils/fclaux.py`` ``ranges`` gives each simplex 1-based insertion and (last + 2) deletion times,
  so every simplex is deleted after the last space and every bar is finite.
* ``src/zigzag/run_fast_zigzag.py``: the insert/delete events are sorted by time (deletions before
  insertions, higher dimensions deleted first, lower inserted first), ``pyfzz.compute_zigzag`` gives
  ``(birth, death, dim)`` in event indices, mapped to times ``layers_res[birth - 1]`` (1-based index
  of the first space alive) and ``layers_res[death]`` (1-based index of the first space dead, i.e.
  exclusive). "We do not merge points that are born and died in the same layer" drops the bars with
  equal birth and death *time*, which exist between two events of one time step and in no space:
  our engine, working on whole spaces, never reports them.
* ``src/plots/post_process.py`` (``start_ind=1``, ``num_layers`` = 2 x number of clouds, as in
  ``src/benchmark/benchmark.py`` and ``src/plots/plots.ipynb``): ``find_eff_pis`` folds a 0-based
  birth ``i`` to ``ceil(i/2)`` and a 0-based exclusive death ``j`` to ``ceil(j/2)`` into an
  (L+1) x (L+1) array indexed ``[death, birth]`` and drops the bars whose folded birth and death
  coincide: exactly those alive only in intersections. That is the notes' PÎ(b/2, d/2) =
  PI(b,d) + PI(b-1,d) + PI(b,d-1) + PI(b-1,d-1) at even b and exclusive d. Our ``PÎ[b, d]`` (L x L,
  [birth, last layer alive]) is the official array's ``[1:, :-1].T`` (its row 0 and column L are
  always empty). ``find_betti_layers`` = bars alive at even zigzag indices. ``find_ph_sim``:
  ``psim[l1, l2]`` = number of bars born at or before min(l1, l2) and dying (exclusive) after
  max(l1, l2), i.e. alive in every layer between them (with inclusive deaths: ``d >= max``).
* Inter-layer persistence: ``inter_layer_persistance`` in ``src/plots/Rebuttal.ipynb`` and
  ``Appendix.ipynb`` (conferenceProject) divides row l1 of psim by β(l1) (0 where β(l1) = 0):
  Z[l1, l2] = psim[l1, l2] / β(l1). Its ``weighed_inter_layer_persistance`` averages a *row* with
  weights |l1 - l2|^α (1e-10 on the diagonal for α < 0). The pruning code, ``similarity_persistance``
  in ``src/benchmark/benchmark.py`` (``p_column_knn`` in ``plots.ipynb``), computes
  r(l) = mean_j psim[l, j] / β(j), i.e. the α = 0 average of Z over its *first* index (the column
  l): Z̄(l) = Σ_i ω Z[i, l] / Σ_i ω. The two readings differ (β of the other layer vs of l).
  NOTE: :func:`average_inter_layer_persistence` defaults to the pruning reading (``over="first"``),
  so that :func:`zigzag_layer_scores` is the score the published pruning used; ``over="second"`` is
  the notebooks' row average. The pruning code has no guard for β(j) = 0 (numpy gives nan); we
  count such terms as 0, as the notebooks and ``post_process.div`` do.
* Births' relative frequency: ``pi_hist`` in the same notebooks sums ``pis * |i - j|^α`` over
  ``axis=1`` of the ``[death, birth]`` array cut to L x L, divides by the row's weight sum, and
  normalises to 1. NOTE: summed that way it is a histogram over the *death* layer, and the cut drops
  the bars alive at the last layer. We follow the definition, B_p(ℓ) ∝ Σ_d ω(ℓ, d) PÎ[ℓ, d] over
  the bars *born* in ℓ (all of them), with ω the bar's length in layers to the power α (the
  notebook's |i - j| for [death exclusive, birth]), normalised to sum 1. At α = 0 it is the
  fraction of p-bars born in layer ℓ.
* Clouds: ``src/representation/rep-extraction/extract.py`` + ``utils/helpers.py``
  ``get_target_layers(option="norm2")`` and ``intrinsic_dimension/extract_activations.py``: the
  official points are the outputs of every block's ``post_attention_layernorm`` (RMSNorm, gain
  included) plus the final ``model.norm``, at the last token (``seq_len - 1`` from the attention
  mask) or the mask-weighted mean, prompts tokenised with ``add_special_tokens=False``, batch size 1.
  NOTE: we take ``output_hidden_states`` (embeddings, every block's output, and the final-norm
  output, which is the official last cloud) and normalise each row ourselves; ``"rms"`` (x divided
  by its root mean square) is the parameter-free part of RMSNorm, and gives the same kNN graphs as
  ``"l2"`` (the two differ by the constant factor sqrt(width)). ``"layer"`` (centre, then divide by
  the standard deviation) is the analogue for LayerNorm models (Pythia). The official clouds sit
  mid-block (after attention, before the MLP), ours between blocks: cloud j is the input of block j.
* k: the ICML paper's 16 x 500-prompt splits use k = 4 (``csv/split_sst/*/knn4`` in
  ``Rebuttal.ipynb``), most of the repository's CSVs and the README's example k = 5; default 4.
  ``dim=4`` there (simplices up to dimension 4) for every homology dimension; NOTE: we build the
  clique complex only up to dimension p + 1, which is all H_p needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from lmforge.common.errors import UserError
from lmforge.methods.zigzag.persistence import Bar, Simplex, layer_zigzag, zigzag_barcode

__all__ = [
    "ZigzagDescriptors",
    "average_inter_layer_persistence",
    "betti_numbers",
    "births_frequency",
    "describe_bars",
    "effective_persistence_image",
    "inter_layer_persistence",
    "knn_clique_complex",
    "layer_point_clouds",
    "lives_in_a_layer",
    "normalize_cloud",
    "persistence_counts",
    "plot_descriptors",
    "zigzag_descriptors",
    "zigzag_layer_scores",
    "zigzag_of_layers",
]

DEFAULT_K = 4
_NORMALIZATIONS = ("rms", "l2", "layer", "none")


# ------------------------------------------------------------------------------- point clouds


def normalize_cloud(cloud: Any, method: str = "rms", *, eps: float = 1e-6) -> np.ndarray:
    """Row-wise normalisation of an (N, d) cloud, as float32.

    ``"rms"``: each row divided by its root mean square (RMSNorm without its gain; the official clouds
    are RMSNorm outputs). ``"l2"``: unit rows (the same kNN graph as ``"rms"``). ``"layer"``: each row
    centred and divided by its standard deviation (LayerNorm without its affine part). ``"none"``:
    unchanged. ``eps`` keeps an all-zero row finite.
    """
    if method not in _NORMALIZATIONS:
        raise UserError(f"unknown normalisation {method!r}; expected one of {', '.join(_NORMALIZATIONS)}")
    x = np.asarray(cloud, dtype=np.float64)
    if x.ndim != 2:
        raise UserError(f"a point cloud must be a 2-D (points x features) array, got shape {x.shape}")
    if method == "rms":
        x = x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + eps)
    elif method == "l2":
        x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), eps)
    elif method == "layer":
        x = x - x.mean(axis=1, keepdims=True)
        x = x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + eps)
    return x.astype(np.float32)


def layer_point_clouds(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    *,
    pooling: Literal["last", "mean"] = "last",
    batch_size: int = 16,
    max_length: int | None = None,
    normalize: str = "rms",
    add_special_tokens: bool = False,
) -> list[np.ndarray]:
    """One point cloud per hidden state: ``L + 1`` float32 arrays of shape (len(prompts), width).

    Cloud 0 is the embedding output, cloud j the output of block j - 1, the last one the final norm's
    output (``output_hidden_states=True``). Each prompt's point is its last real token's state
    (``pooling="last"``) or the mean over its real tokens (``"mean"``). Prompts are tokenised one by
    one (``add_special_tokens=False``, as the official extraction), cut to their first ``max_length``
    tokens, and run in length-sorted, right-padded batches under ``torch.inference_mode()``: the
    attention mask keeps padding out of every real position, and the pooled position comes from the
    mask, so a batch gives the same points as one prompt at a time. Rows are then normalised with
    :func:`normalize_cloud` (``normalize="none"`` keeps the raw states).
    """
    import torch

    from lmforge.common.batching import inference, run_in_batches
    from lmforge.common.generation import model_device

    if pooling not in ("last", "mean"):
        raise UserError(f"unknown pooling {pooling!r}; expected 'last' or 'mean'")
    if normalize not in _NORMALIZATIONS:
        raise UserError(f"unknown normalisation {normalize!r}; expected one of {', '.join(_NORMALIZATIONS)}")
    if isinstance(prompts, str) or not prompts:
        raise UserError("prompts must be a non-empty list of strings")
    if batch_size < 1:
        raise UserError(f"batch_size must be at least 1, got {batch_size}")
    if max_length is not None and max_length < 1:
        raise UserError(f"max_length must be at least 1, got {max_length}")

    encoded: list[list[int]] = []
    for i, text in enumerate(prompts):
        if not isinstance(text, str):
            raise UserError(f"prompt {i} is not a string ({type(text).__name__})")
        ids = list(tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])
        if max_length is not None:
            ids = ids[:max_length]
        if not ids:
            raise UserError(f"prompt {i} has no tokens")
        encoded.append(ids)

    pad_id = next((t for t in (tokenizer.pad_token_id, tokenizer.eos_token_id) if t is not None), 0)
    device = model_device(model)

    def run(batch: list[int]) -> list[np.ndarray]:
        width = max(len(encoded[i]) for i in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, i in enumerate(batch):  # right padding: real tokens keep positions 0..n-1
            ids[row, : len(encoded[i])] = torch.tensor(encoded[i], dtype=torch.long)
            mask[row, : len(encoded[i])] = 1
        try:
            out = model(
                input_ids=ids.to(device), attention_mask=mask.to(device), output_hidden_states=True, use_cache=False
            )
        except TypeError as exc:
            if "output_hidden_states" not in str(exc):
                raise
            name = type(model).__name__
            raise UserError(f"{name} does not accept output_hidden_states; zigzag descriptors need them") from None
        states = getattr(out, "hidden_states", None)
        if not states:
            raise UserError(f"{type(model).__name__} returns no hidden states; zigzag descriptors need them")
        m = mask.to(states[0].device)
        pooled = []
        for h in states:  # (B, T, d)
            h = h.float()
            if pooling == "last":
                pooled.append(h[torch.arange(h.shape[0], device=h.device), m.sum(1) - 1])
            else:
                pooled.append((h * m.unsqueeze(-1)).sum(1) / m.sum(1, keepdim=True))
        stacked = torch.stack(pooled, dim=1).cpu().numpy()  # (B, L+1, d)
        return [stacked[row] for row in range(len(batch))]

    with inference(model):
        points = run_in_batches([len(e) for e in encoded], batch_size, run)
    per_prompt = np.stack(points)  # (N, L+1, d)
    return [normalize_cloud(per_prompt[:, j, :], normalize) for j in range(per_prompt.shape[1])]


# ------------------------------------------------------------------------------- complexes


def knn_clique_complex(cloud: Any, k: int, max_dim: int) -> list[Simplex]:
    """The clique complex, up to dimension ``max_dim``, of the symmetrised kNN graph of ``cloud``.

    An edge joins two points when either is among the other's ``k`` nearest (Euclidean, a point is not
    its own neighbour): ``sklearn.neighbors.kneighbors_graph`` with its defaults, made symmetric by
    union, as the official code's insertion of every kNN edge into a ``gudhi.SimplexTree`` does.
    The cliques come from ``SimplexTree.expansion(max_dim)``. Simplices are sorted vertex tuples,
    vertices numbered by row, sorted by dimension and then lexicographically.
    """
    import gudhi
    from scipy.sparse import triu
    from sklearn.neighbors import kneighbors_graph

    x = np.asarray(cloud, dtype=np.float64)
    if x.ndim != 2:
        raise UserError(f"a point cloud must be a 2-D (points x features) array, got shape {x.shape}")
    n = x.shape[0]
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise UserError(f"k must be a positive integer, got {k!r}")
    if k >= n:
        raise UserError(f"k larger than the number of prompts: k={k} needs at least {k + 1} points, got {n}")
    if isinstance(max_dim, bool) or not isinstance(max_dim, (int, np.integer)) or max_dim < 0:
        raise UserError(f"max_dim must be a non-negative integer, got {max_dim!r}")

    g = kneighbors_graph(x, n_neighbors=int(k), mode="connectivity", include_self=False)
    edges = triu(g + g.T, k=1).tocoo()  # union of both directions, each edge once (u < v)
    st = gudhi.SimplexTree()
    st.insert_batch(np.arange(n, dtype=np.int64).reshape(1, n), np.zeros(n))
    if max_dim >= 1 and edges.nnz:
        st.insert_batch(np.vstack([edges.row, edges.col]).astype(np.int64), np.zeros(edges.nnz))
        st.expansion(int(max_dim))
    simplices = [tuple(s) for s, _ in st.get_simplices()]
    simplices.sort(key=lambda s: (len(s), s))
    return simplices


def _check_clouds(clouds: Sequence[Any]) -> list[np.ndarray]:
    if isinstance(clouds, np.ndarray) and clouds.ndim == 3:
        clouds = list(clouds)
    if len(clouds) == 0:
        raise UserError("no point clouds given")
    arrays = [np.asarray(c) for c in clouds]
    for j, c in enumerate(arrays):
        if c.ndim != 2:
            raise UserError(f"point cloud {j} must be 2-D (points x features), got shape {c.shape}")
    sizes = {c.shape[0] for c in arrays}
    if len(sizes) != 1:
        raise UserError(f"every layer needs the same prompts; point counts differ: {sorted(sizes)}")
    return arrays


def _check_p(p: int) -> int:
    if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or p < 0:
        raise UserError(f"p (the homology dimension) must be a non-negative integer, got {p!r}")
    return int(p)


def lives_in_a_layer(bar: Bar) -> bool:
    """Whether a zigzag bar is alive in at least one layer (an even index); the others live only in
    intersections and are dropped, as the official ``find_eff_pis`` does."""
    return -(-bar.birth // 2) <= bar.death // 2


def zigzag_of_layers(clouds: Sequence[Any], k: int = DEFAULT_K, p: int = 1) -> list[Bar]:
    """The zigzag barcode (dimensions 0..p) of the layers' kNN clique complexes.

    Complexes up to dimension ``p + 1`` (:func:`knn_clique_complex`), the zigzag K0 ⊇ K0∩K1 ⊆ K1 ...
    (:func:`~lmforge.methods.zigzag.persistence.layer_zigzag`), its barcode
    (:func:`~lmforge.methods.zigzag.persistence.zigzag_barcode`), less the bars alive in no layer
    (born and dead within one intersection). Bars keep zigzag indices (layer l at 2l, inclusive death).
    """
    p = _check_p(p)
    arrays = _check_clouds(clouds)
    complexes = [knn_clique_complex(c, k, p + 1) for c in arrays]
    bars = zigzag_barcode(layer_zigzag(complexes), max_dim=p)
    return sorted(b for b in bars if b.dim <= p and lives_in_a_layer(b))


# ------------------------------------------------------------------------------- descriptors


def effective_persistence_image(bars: Sequence[Bar], n_layers: int, p: int) -> np.ndarray:
    """PÎ_p as an (L, L) float array: ``[b, d]`` counts the p-bars born in layer b and last alive in
    layer d (zigzag birth ``i`` -> layer ``ceil(i/2)``, inclusive zigzag death ``j`` -> ``floor(j/2)``).

    Bars of other dimensions, and bars alive in no layer, are ignored. The official array
    (``post_process.find_eff_pis``: [exclusive death, birth], (L+1) x (L+1)) is ``PÎ.T`` padded with
    an empty first row and last column.
    """
    p = _check_p(p)
    if n_layers < 1:
        raise UserError(f"n_layers must be at least 1, got {n_layers}")
    last = 2 * (n_layers - 1)
    pi = np.zeros((n_layers, n_layers), dtype=np.float64)
    for bar in bars:
        if bar.dim != p:
            continue
        if not 0 <= bar.birth <= bar.death <= last:
            raise UserError(f"{bar} does not fit a zigzag of {n_layers} layers (indices 0..{last})")
        if lives_in_a_layer(bar):
            pi[-(-bar.birth // 2), bar.death // 2] += 1
    return pi


def persistence_counts(pi: np.ndarray) -> np.ndarray:
    """``psim[l1, l2]``: the number of bars alive in every layer from min(l1, l2) to max(l1, l2)
    (born at or before the first, last alive at or after the second); symmetric, with the Betti
    numbers on its diagonal. The official ``find_ph_sim``."""
    pi = np.asarray(pi, dtype=np.float64)
    # s[a, b] = sum over births <= a and deaths >= b
    s = np.cumsum(np.cumsum(pi[:, ::-1], axis=1)[:, ::-1], axis=0)
    upper = np.triu(s)
    return upper + np.triu(s, 1).T


def betti_numbers(pi: np.ndarray) -> np.ndarray:
    """β_p per layer: the bars alive in it (the official ``find_betti_layers``)."""
    return np.diag(persistence_counts(pi)).copy()


def _layer_weights(n: int, alpha: float) -> np.ndarray:
    """ω[i, j] = |i - j|^α, with 1e-10 on the diagonal when α < 0 (the official notebooks)."""
    dist = np.abs(np.subtract.outer(np.arange(n), np.arange(n))).astype(np.float64)
    if alpha < 0:
        np.fill_diagonal(dist, 1.0)
        w = dist**alpha
        np.fill_diagonal(w, 1e-10)
        return w
    return dist**alpha  # 0**0 == 1: α = 0 weighs every layer alike


def births_frequency(pi: np.ndarray, alpha: float = 0.0) -> np.ndarray:
    """B_p(ℓ): the ω-weighted share of p-bars born in layer ℓ, ω = (bar length in layers)^α; sums to
    1 (all zeros when there is no bar). At α = 0, the fraction of bars born in ℓ."""
    pi = np.asarray(pi, dtype=np.float64)
    n = pi.shape[0]
    length = np.subtract.outer(np.arange(n), np.arange(n)).T + 1.0  # d - b + 1 at [b, d]
    w = np.maximum(length, 1.0) ** float(alpha)  # entries below the diagonal hold no bar
    per_birth = (pi * w).sum(axis=1)
    total = per_birth.sum()
    return per_birth / total if total > 0 else per_birth


def inter_layer_persistence(pi: np.ndarray) -> np.ndarray:
    """Z_p[l1, l2] = psim[l1, l2] / β_p(l1): the share of l1's p-holes still alive, without a break,
    at l2 (0 where β_p(l1) = 0). Z[l, l] = 1 wherever layer l has a hole."""
    psim = persistence_counts(pi)
    beta = np.diag(psim)
    z = np.zeros_like(psim)
    has = beta > 0
    z[has] = psim[has] / beta[has, None]
    return z


def average_inter_layer_persistence(
    z: np.ndarray, alpha: float = 0.0, *, over: Literal["first", "second"] = "first"
) -> np.ndarray:
    """Z̄_p(ℓ): the ω-weighted mean of Z_p over the other layer, ω = |ℓ - ℓ_i|^α.

    ``over="first"`` (default): Z̄(ℓ) = Σ_i ω Z[ℓ_i, ℓ] / Σ_i ω, which at α = 0 is the official
    pruning score mean_j psim[ℓ, j] / β(j) (``benchmark.py``). ``over="second"``: Z̄(ℓ) =
    Σ_i ω Z[ℓ, ℓ_i] / Σ_i ω, the official notebooks' ``weighed_inter_layer_persistance`` (each term
    divided by β(ℓ)).
    """
    z = np.asarray(z, dtype=np.float64)
    if over not in ("first", "second"):
        raise UserError(f"over must be 'first' or 'second', got {over!r}")
    w = _layer_weights(z.shape[0], float(alpha))
    m = z.T if over == "first" else z
    return (m * w).sum(axis=1) / w.sum(axis=1)


@dataclass(frozen=True, eq=False)
class ZigzagDescriptors:
    """Everything the zigzag analysis of one model and prompt set gives, for homology dimension p.

    ``bars``: the zigzag barcode (dimensions 0..p, zigzag indices, inclusive deaths), bars alive in no
    layer dropped. ``pi``: PÎ_p, (L, L), [birth layer, last layer alive]. ``betti``: β_p per layer.
    ``births``: B_p. ``z``: Z_p, (L, L). ``zbar``: Z̄_p (``over`` says which average; at p = 1 and
    the defaults it is the pruning score r).
    """

    p: int
    k: int | None
    alpha: float
    over: str
    bars: list[Bar]
    pi: np.ndarray
    betti: np.ndarray
    births: np.ndarray
    z: np.ndarray
    zbar: np.ndarray

    @property
    def n_layers(self) -> int:
        return int(self.pi.shape[0])


def describe_bars(
    bars: Sequence[Bar],
    n_layers: int,
    p: int = 1,
    *,
    alpha: float = 0.0,
    over: Literal["first", "second"] = "first",
    k: int | None = None,
) -> ZigzagDescriptors:
    """All descriptors of a zigzag barcode of ``n_layers`` layers (``k`` is only recorded)."""
    p = _check_p(p)
    pi = effective_persistence_image(bars, n_layers, p)
    z = inter_layer_persistence(pi)
    return ZigzagDescriptors(
        p=p,
        k=k,
        alpha=float(alpha),
        over=over,
        bars=sorted(b for b in bars if b.dim <= p and lives_in_a_layer(b)),
        pi=pi,
        betti=betti_numbers(pi),
        births=births_frequency(pi, alpha),
        z=z,
        zbar=average_inter_layer_persistence(z, alpha, over=over),
    )


def zigzag_descriptors(
    clouds: Sequence[Any],
    *,
    k: int = DEFAULT_K,
    p: int = 1,
    alpha: float = 0.0,
    over: Literal["first", "second"] = "first",
) -> ZigzagDescriptors:
    """:func:`zigzag_of_layers` then :func:`describe_bars`, for clouds already normalised."""
    bars = zigzag_of_layers(clouds, k, p)
    return describe_bars(bars, len(clouds), p, alpha=alpha, over=over, k=k)


def zigzag_layer_scores(
    clouds: Sequence[Any], *, k: int = DEFAULT_K, p: int = 1, alpha: float = 0.0
) -> np.ndarray:
    """The pruning score r(ℓ) = Z̄_p(ℓ) (p = 1 in the paper) of every cloud given, in order.

    The official pruning removes every layer with r >= thr * max r (thr 0.9 or 0.8), never the last
    cloud (the final norm). With clouds from :func:`layer_point_clouds`, cloud j is block j's input.
    """
    return zigzag_descriptors(clouds, k=k, p=p, alpha=alpha).zbar


# ------------------------------------------------------------------------------- plots


def plot_descriptors(result: ZigzagDescriptors, out_dir: str | Path) -> list[Path]:
    """Four PNGs in ``out_dir``: PÎ_p (log10(1 + count)), B_p, Z_p, and Z̄_p (matplotlib Agg, no pyplot)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    p, n = result.p, result.n_layers
    layers = np.arange(n)
    paths: list[Path] = []

    def save(fig: Figure, name: str) -> None:
        FigureCanvasAgg(fig)
        fig.tight_layout()
        path = out / name
        fig.savefig(path, dpi=110, format="png")
        paths.append(path)

    fig = Figure(figsize=(5.2, 4.4))
    ax = fig.add_subplot(1, 1, 1)
    im = ax.imshow(np.log10(1.0 + result.pi.T), origin="lower", cmap="viridis")
    ax.set_xlabel("birth layer")
    ax.set_ylabel("last layer alive")
    ax.set_title(f"effective persistence image, H{p}")
    fig.colorbar(im, ax=ax, label=f"log10(1 + number of {p}-bars)")
    save(fig, f"zigzag_pi_h{p}.png")

    fig = Figure(figsize=(5.6, 3.6))
    ax = fig.add_subplot(1, 1, 1)
    ax.plot(layers, result.births, marker="o")
    ax.axhline(1.0 / n, color="black", linestyle="--", linewidth=1, label="uniform")
    ax.set_xlabel("layer")
    ax.set_ylabel(f"B{p}")
    ax.set_title(f"births' relative frequency, H{p}, alpha={result.alpha:g}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, f"zigzag_births_h{p}.png")

    fig = Figure(figsize=(5.2, 4.4))
    ax = fig.add_subplot(1, 1, 1)
    im = ax.imshow(result.z, origin="lower", cmap="viridis", vmin=0.0, vmax=1.0)
    ax.set_xlabel("layer l2")
    ax.set_ylabel("layer l1")
    ax.set_title(f"inter-layer persistence Z{p}(l1, l2)")
    fig.colorbar(im, ax=ax, label="share of l1's holes alive through l2")
    save(fig, f"zigzag_z_h{p}.png")

    fig = Figure(figsize=(5.6, 3.6))
    ax = fig.add_subplot(1, 1, 1)
    ax.plot(layers, result.zbar, marker="o")
    ax.set_xlabel("layer")
    ax.set_ylabel(f"mean Z{p}")
    ax.set_title(f"average inter-layer persistence, H{p}, alpha={result.alpha:g}")
    ax.grid(True, alpha=0.3)
    save(fig, f"zigzag_zbar_h{p}.png")
    return paths
