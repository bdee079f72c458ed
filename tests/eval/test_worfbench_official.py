"""WorfBench scoring under ``--scoring official``: hand-built plans whose expected scores are worked out
from the rules of zjunlp/WorFBench (``node_eval.py``: ``workflow_to_graph_list``, ``eval_workflow``;
``evaluator/graph_evaluator.py``: ``all_topological_sorts``, ``match_node``, ``t_eval_plan``,
``t_eval_nodes``, ``t_eval_graph``), each next to what ``--scoring lmforge`` gives, so every case
fails on a scorer that does not follow that rule.

Steps are distinct texts scored with a one-axis-per-text embedder (cosine 1 for equal texts, else 0),
so the matching is exact and every score is a closed form.
"""

from __future__ import annotations

import json
from fractions import Fraction

import networkx as nx
import numpy as np
import pytest

from lmforge.bench.tasks import Context, get_task
from lmforge.common.errors import UserError
from lmforge.data.workflow import parse_graph_official, render_plan
from lmforge.eval.metrics import graph_f1, node_f1, official_graph_f1, official_node_f1

WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo"]
STEPS = [f"{w} the {w} job" for w in WORDS]
JUNK = ["zulu unrelated thing", "yankee unrelated thing", "xray unrelated thing"]


VOCAB = [*STEPS, *JUNK, "START", "END", "extra words"]


def identity_embed(texts):
    """One fixed axis per known text: cosine 1 for equal strings, 0 otherwise (the same axes on every
    call, as lmforge's scorer embeds predicted and gold steps in separate calls)."""
    out = np.zeros((len(texts), len(VOCAB)))
    for row, t in enumerate(texts):
        out[row, VOCAB.index(t)] = 1.0
    return out


def f1(p, r):
    return 2 * p * r / (p + r)


def chain_edges(n):
    return [["START", 1]] + [[i, i + 1] for i in range(1, n)] + [[n, "END"]]


def official(pred_text, gold_text):
    pred, gold = parse_graph_official(pred_text), parse_graph_official(gold_text)
    if pred is None:
        return 0.0, 0.0
    return (official_node_f1(pred[0], gold[0], gold[1], embed=identity_embed)["f1"],
            official_graph_f1(pred[0], pred[1], gold[0], gold[1], embed=identity_embed)["f1"])


# ------------------------------------------------------------------------------------------ reading


def test_reader_takes_dot_numbering_and_maps_start_end_to_the_ends_of_the_list():
    text = "Node:\n1. alpha the alpha job\n2: bravo the bravo job\nEdges:(START,1) ( 1 , 2 ) (2,END)"
    nodes, edges = parse_graph_official(text)
    assert nodes == ["START", STEPS[0], STEPS[1], "END"]
    assert edges == [(0, 1), (1, 2), (2, 3)]
    # The number needs ": " or ". " after it: "1.text" (no space) is no step; a numbered line outside
    # the Node block is one; (END, x) and (x, START) are no edges.
    nodes, edges = parse_graph_official("Node:\n1.alpha\nNote 7: extra words\nEdge: (START,1) (END,1) (1,START) (1,END)")
    assert nodes == ["START", "extra words", "END"] and edges == [(0, 1), (1, 2)]
    assert parse_graph_official("1: a\nEdge: (START,1) (1,END)") is None  # no "Node" anywhere
    assert parse_graph_official("Node:\n1: a\n2: b") is None  # no edge


def test_dot_numbered_prediction_is_scored():
    gold = render_plan(STEPS[:3], chain_edges(3))
    pred = "Node:\n1. alpha the alpha job\n2. bravo the bravo job\nEdge: (START,1) (1,2) (2,END)"
    node, graph = official(pred, gold)
    # 2 of 3 steps in order: P = 1, R = 2/3. Graph: START, 1, 2 matched and connected by the shared
    # edges (0,1) (1,2); pred END (index 3) matches gold END (4), but (2,3) is no gold edge: P = 3/4, R = 3/5.
    assert node == pytest.approx(f1(1, 2 / 3))
    assert graph == pytest.approx(f1(3 / 4, 3 / 5))
    from lmforge.data.workflow import parse_plan

    assert parse_plan(pred)[0] == []  # lmforge's reader takes only "1:" steps


# ------------------------------------------------------------------------------------------ rules


def test_prediction_with_steps_but_no_edges_scores_zero():
    gold = render_plan(STEPS[:3], chain_edges(3))
    pred = "Node:\n1: alpha the alpha job\n2: bravo the bravo job\n3: charlie the charlie job\n"
    assert official(pred, gold) == (0.0, 0.0)
    # lmforge's reading scored the steps anyway.
    assert node_f1(STEPS[:3], STEPS[:3], chain_edges(3), embed=identity_embed)["f1"] == 1.0


def test_subsequence_count_starts_at_one_without_any_match():
    gold = render_plan(STEPS[:4], chain_edges(4))
    pred = render_plan(JUNK[:2], chain_edges(2))
    node, graph = official(pred, gold)
    # No step matches, yet the dp starts at 1: P = 1/2, R = 1/4.
    assert node == pytest.approx(f1(1 / 2, 1 / 4)) == pytest.approx(1 / 3)
    # Graph: only START and END match, not joined by a shared edge: 1/4 of pred, 1/6 of gold.
    assert graph == pytest.approx(f1(1 / 4, 1 / 6)) == pytest.approx(1 / 5)
    assert node_f1(JUNK[:2], STEPS[:4], chain_edges(4), embed=identity_embed)["f1"] == 0.0


@pytest.mark.parametrize("n, expected", [
    (7, Fraction(6, 7)),  # 9 nodes with START/END: topological orders, START/END dropped: P = R = 6/7
    (8, Fraction(7, 9)),  # 10 nodes: listed as is, START/END kept: P = 7/8, R = 7/10
    (9, Fraction(4, 5)),  # 11 nodes: P = 8/9, R = 8/11
])
def test_gold_of_eight_or_more_steps_keeps_start_and_end(n, expected):
    gold_steps = STEPS[:n]
    pred_steps = list(gold_steps)
    pred_steps[4] = JUNK[0]  # one wrong step
    node, _ = official(render_plan(pred_steps, chain_edges(n)), render_plan(gold_steps, chain_edges(n)))
    assert node == pytest.approx(float(expected))
    old = node_f1(pred_steps, gold_steps, chain_edges(n), embed=identity_embed)["f1"]
    assert old == pytest.approx((n - 1) / n)
    if n >= 8:
        assert node < old - 0.05


def two_branch_edges(a, b):
    """Two parallel chains, steps 1..a and a+1..a+b."""
    first = list(range(1, a + 1))
    second = list(range(a + 1, a + b + 1))
    out = []
    for br in (first, second):
        out += [["START", br[0]]] + [[x, y] for x, y in zip(br, br[1:])] + [[br[-1], "END"]]
    return out


def test_gold_of_eight_steps_uses_only_its_listed_order():
    edges = two_branch_edges(4, 4)
    gold = render_plan(STEPS[:8], edges)
    # Branch two before branch one: a valid order of the gold DAG, but not the listed one, so the
    # longest increasing run is one branch: P = 4/8, R = 4/10 (START/END kept).
    order = [5, 6, 7, 8, 1, 2, 3, 4]
    pred_edges = two_branch_edges(4, 4)
    relabel = {old: new for new, old in enumerate(order, 1)}
    pred_edges = [[relabel.get(a, a), relabel.get(b, b)] for a, b in pred_edges]
    pred = render_plan([STEPS[i - 1] for i in order], pred_edges)
    node, _ = official(pred, gold)
    assert node == pytest.approx(f1(4 / 8, 4 / 10)) == pytest.approx(4 / 9)


def lis(seq):
    best = 0
    for mask in range(1 << len(seq)):
        sub = [x for i, x in enumerate(seq) if mask >> i & 1]
        if all(a < b for a, b in zip(sub, sub[1:])):
            best = max(best, len(sub))
    return best


def test_small_gold_takes_networkx_first_twenty_orders_over_start_steps_end():
    # Three parallel 2-step branches: 90 orders. networkx enumerates them over START (0), the steps
    # and END (7) and WorfBench keeps the first 20; the listed order is not among them.
    edges = [["START", 1], [1, 2], ["START", 3], [3, 4], ["START", 5], [5, 6], [2, "END"], [4, "END"], [6, "END"]]
    gold = render_plan(STEPS[:6], edges)
    g = nx.DiGraph()
    g.add_nodes_from(range(8))
    g.add_edges_from((0 if a == "START" else a, 7 if b == "END" else b) for a, b in edges)
    first20 = []
    for order in nx.all_topological_sorts(g):
        first20.append([i for i in order if i not in (0, 7)])
        if len(first20) == 20:
            break
    assert [1, 2, 3, 4, 5, 6] not in first20
    listed = render_plan(STEPS[:6], edges)
    # Naive reference: every predicted step matches its own gold step, so the count is the longest
    # increasing run of gold positions, over the 20 orders.
    expected = max(f1(c / 6, c / 6) for c in (lis([o.index(s) for s in range(1, 7)]) for o in first20))
    node, _ = official(listed, gold)
    assert node == pytest.approx(expected) and node < 1.0
    # The first enumerated order (START's last branch first) scores 1.
    top = first20[0]
    relabel = {old: new for new, old in enumerate(top, 1)}
    pred = render_plan([STEPS[i - 1] for i in top], [[relabel.get(a, a), relabel.get(b, b)] for a, b in edges])
    assert official(pred, gold)[0] == 1.0


def test_graph_f1_compares_raw_edge_indices():
    gold_edges = chain_edges(3)
    gold = render_plan(STEPS[:3], gold_edges)
    # The gold chain written with the steps numbered in reverse: the same graph, relabelled. Its
    # edges (START,3) (3,2) (2,1) (1,END) are (0,3) (3,2) (2,1) (1,4): no raw gold pair, so the largest
    # component is one node: P = R = 1/5.
    pred_nodes = STEPS[:3][::-1]
    relabelled = [["START", 3], [3, 2], [2, 1], [1, "END"]]
    _, graph = official(render_plan(pred_nodes, relabelled), gold)
    assert graph == pytest.approx(1 / 5)
    assert graph_f1(pred_nodes, relabelled, STEPS[:3], gold_edges, embed=identity_embed)["f1"] == 1.0
    # The reversed plan numbered 1..3 in its own order: edges (0,1) (1,2) (2,3) (3,4) equal the gold
    # pairs by number, so all five nodes join: P = R = 1, though every step edge is reversed.
    _, graph = official(render_plan(pred_nodes, chain_edges(3)), gold)
    assert graph == 1.0
    assert graph_f1(pred_nodes, chain_edges(3), STEPS[:3], gold_edges, embed=identity_embed)["f1"] == pytest.approx(1 / 5)


# ------------------------------------------------------------------------------------------ the task


def write_gold(tmp_path, gold_text):
    rec = {"source": "os", "id": "os_1", "target": "graph", "category": "eval",
           "conversations": [{"role": "system", "content": "Plan."}, {"role": "user", "content": "Do it."},
                             {"role": "assistant", "content": gold_text}]}
    path = tmp_path / "worfbench.json"
    path.write_text(json.dumps([rec]))
    return path


def test_task_scores_officially_by_default_and_lmforge_on_request(tmp_path):
    task = get_task("worfbench")
    gold = render_plan(STEPS[:9], chain_edges(9))
    path = write_gold(tmp_path, gold)
    (item,) = task.items(path, Context(tokenizer=None, fmt="plain"))
    assert item.stop == ()  # WorfBench cuts nothing; its own prompt has blank lines
    assert Context(tokenizer=None, fmt="plain").scoring == "official"
    # A chat model's kind of answer: a preamble, ". " numbering, a blank line, "Edges:" and steps
    # 1..8 right with step 9 missing (its edges dropped with it).
    answer = ("Here is the workflow for the task.\n\nNode:\n"
              + "\n".join(f"{i}. {s}" for i, s in enumerate(STEPS[:8], 1))
              + "\n\nEdges: (START,1) " + " ".join(f"({i},{i + 1})" for i in range(1, 8)) + " (8,END)")
    ctx = Context(tokenizer=None, fmt="plain", embed=identity_embed)
    got = task.score(item, answer, ctx)
    # Node: gold of 11 listed nodes (START/END kept), 8 in order: P = 1, R = 8/11.
    assert got["node_f1"] == pytest.approx(f1(1, 8 / 11))
    # Graph: pred START..8 (0..8) matched and chained by shared pairs (0,1)..(7,8); pred END is index 9,
    # gold 9 is step 9, so the pred END matches gold END (10) and (8,9) is no gold pair: 9 of 10 pred
    # nodes, 9 of 11 gold nodes.
    assert got["graph_f1"] == pytest.approx(f1(9 / 10, 9 / 11))
    # lmforge's reader takes no ". " steps: 0.
    assert task.score(item, answer, Context(tokenizer=None, fmt="plain", embed=identity_embed, scoring="lmforge")) == {
        "node_f1": 0.0, "graph_f1": 0.0}
    # A prediction with no edge: 0 officially.
    no_edges = "Node:\n" + "\n".join(f"{i}: {s}" for i, s in enumerate(STEPS[:9], 1))
    assert task.score(item, no_edges, ctx) == {"node_f1": 0.0, "graph_f1": 0.0}


def test_zoo_format_keeps_its_blank_line_stop(tmp_path):
    path = write_gold(tmp_path, render_plan(STEPS[:2], chain_edges(2)))
    (item,) = get_task("worfbench").items(path, Context(tokenizer=None, fmt="zoo"))
    assert item.stop == ("\n\n",)


def test_gold_without_official_edges_is_a_one_line_error(tmp_path):
    path = write_gold(tmp_path, "Node:\n1: a\n2: b\nEdge: START->1->2->END")
    with pytest.raises(UserError, match="no edge in the gold plan") as err:
        get_task("worfbench").items(path, Context(tokenizer=None, fmt="plain"))
    assert "\n" not in str(err.value)
    # lmforge's scoring does not read the edges this way and keeps loading.
    assert get_task("worfbench").items(path, Context(tokenizer=None, fmt="plain", scoring="lmforge"))
