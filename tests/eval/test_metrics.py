"""WorfBench node F1 against closed forms and a brute-force reference."""

from __future__ import annotations

import itertools
import random

import numpy as np

from lmforge.data import workflow
from lmforge.eval.metrics import lis_length, node_f1, trigram_embed


def chain(n):
    return [f"step number {chr(97 + i)} of the plan {chr(97 + i) * 3}" for i in range(n)], \
        [["START", 1]] + [[i, i + 1] for i in range(1, n)] + [[n, "END"]]


def test_identical_plan_scores_one():
    nodes, edges = chain(5)
    assert node_f1(nodes, nodes, edges)["f1"] == 1.0


def test_reversed_chain_scores_one_over_n():
    for n in (2, 3, 5, 8):
        nodes, edges = chain(n)
        assert abs(node_f1(nodes[::-1], nodes, edges)["f1"] - 1 / n) < 1e-12


def test_parallel_branches_accept_any_topological_order():
    rec = {"nodes": ["alpha task one", "beta task two", "gamma task three"],
           "edges": [["START", 1], ["START", 2], [1, 3], [2, 3], [3, "END"]]}
    swapped = ["beta task two", "alpha task one", "gamma task three"]
    assert node_f1(swapped, rec["nodes"], rec["edges"])["f1"] == 1.0
    wrong = ["gamma task three", "alpha task one", "beta task two"]
    assert node_f1(wrong, rec["nodes"], rec["edges"])["f1"] < 1.0


def test_missing_and_extra_nodes_give_closed_form_precision_recall():
    nodes, edges = chain(4)
    res = node_f1(nodes[:2] + ["completely unrelated xyz"], nodes, edges)
    assert abs(res["precision"] - 2 / 3) < 1e-12 and abs(res["recall"] - 2 / 4) < 1e-12


def test_lis_matches_brute_force():
    rng = random.Random(0)
    for _ in range(200):
        seq = [rng.randrange(10) for _ in range(rng.randrange(0, 9))]
        brute = max((len(c) for r in range(len(seq) + 1) for c in itertools.combinations(seq, r)
                     if all(a < b for a, b in zip(c, c[1:]))), default=0)
        assert lis_length(seq) == brute


def test_trigram_embedder_is_deterministic_and_normalised():
    a = trigram_embed(["book the flight to Rome", "book the flight to Rome", "xyz"])
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0)
    assert a[0] @ a[1] > 0.999 and a[0] @ a[2] < 0.2


def test_generated_plans_score_perfectly_against_themselves():
    for rec in workflow.generate(random.Random(4), 30):
        nodes, _ = workflow.parse_plan(workflow.answer(rec))
        assert node_f1(nodes, rec["nodes"], rec["edges"])["f1"] == 1.0
