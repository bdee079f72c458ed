"""Citation recall/precision/F1 against gold supporting sentences: hand-computed cases, a naive
re-implementation on random cases, and the LongBench-Cite-style reader."""

from __future__ import annotations

import json
import random

import pytest

from lmforge.common.errors import UserError
from lmforge.methods.selfcite.format import (
    Citation,
    Statement,
    postprocess,
    split_sentences,
)
from lmforge.methods.selfcite.metrics import (
    GoldStatement,
    read_longbench_cite,
    score_dataset,
    score_response,
)


def st(text: str, *spans: tuple[int, int]) -> Statement:
    return Statement(text, [Citation(s, e, -1, -1, "") for s, e in spans])


def gold(text: str, *support: int) -> GoldStatement:
    return GoldStatement(text, frozenset(support))


def _doc(n: int):
    return split_sentences("".join(f"S{i}. " for i in range(n)))


# ----------------------------------------------------------------------------------- hand-computed


@pytest.mark.parametrize("spans, support, want_recall, want_precision", [
    ([(2, 3)], {2, 3}, 1.0, 1.0),              # fully supported, relevant
    ([(2, 2)], {2, 5}, 0.5, 1.0),              # partially supported
    ([(7, 8)], {2}, 0.0, 0.0),                 # no support, irrelevant
    ([(0, 0), (5, 6)], {5}, 1.0, 0.5),         # supported by the union; one of two citations relevant
    ([(0, 0), (4, 4)], {4, 9}, 0.5, 0.5),
    ([], {1}, 0.0, 0.0),                       # needs a citation, has none: 1 - 1
    ([], set(), 1.0, 0.0),                     # needs none, has none: 1 - 0; no citations -> P = 0
    ([(3, 3)], set(), 0.0, 0.0),               # cites, but nothing supports it
])
def test_single_statement(spans, support, want_recall, want_precision):
    r = score_response([st("x", *spans)], [gold("x", *support)])
    assert r.recall == want_recall and r.precision == want_precision
    total = want_recall + want_precision
    want_f1 = 0.0 if total == 0 else 2 * want_recall * want_precision / total
    assert r.f1 == pytest.approx(want_f1)


def test_response_hand_computed():
    preds = [st("A", (2, 3)), st("B", (0, 0), (5, 5)), st("C"), st("D")]
    golds = [gold("A", 2, 3), gold("B", 5, 6), gold("C"), gold("D", 1)]
    r = score_response(preds, golds)
    # recall (1 + 0.5 + 1 + 0) / 4; precision over 3 citations (1 + 0 + 1) / 3
    assert r.recall == 0.625 and r.precision == pytest.approx(2 / 3)
    assert r.f1 == pytest.approx(2 * 0.625 * (2 / 3) / (0.625 + 2 / 3))
    assert (r.n_statements, r.n_citations, r.unmatched) == (4, 3, 0)
    assert [s.relevance for s in r.statements] == [(1,), (0, 1), (), ()]


def test_no_statements_scores_zero():
    r = score_response([], [gold("A", 1)])
    assert (r.recall, r.precision, r.f1) == (0.0, 0.0, 0.0)


def test_only_three_citations_count_through_postprocess():
    post = postprocess("<statement>X.<cite>[0-0][2-2][4-4][6-6]</cite></statement>", _doc(10))
    # [6-6] is the 4th merged citation: dropped, so a gold {6} is not reached ...
    r = score_response(post, [gold("X.", 6)])
    assert (r.recall, r.precision, r.n_citations) == (0.0, 0.0, 3)
    # ... and {0, 6} is half reached; precision 1 of the 3 kept citations.
    r = score_response(post, [gold("X.", 0, 6)])
    assert r.recall == 0.5 and r.precision == pytest.approx(1 / 3)


def test_unmatched_statements_score_as_needing_no_citation():
    r = score_response([st("A", (1, 1)), st("B"), st("C", (4, 4))], [gold("A", 1)])
    assert r.unmatched == 2
    # A: 1; B (no citation, empty gold): 1; C (cites, empty gold): 0.  Precision: A's 1, C's 0.
    assert r.recall == pytest.approx(2 / 3) and r.precision == 0.5


def test_text_matcher():
    preds = [st("  The  second\nclaim ", (5, 5)), st("First claim", (1, 1)), st("Extra", (9, 9))]
    golds = [gold("first CLAIM", 1), gold("The second claim", 5, 6)]
    r = score_response(preds, golds, matcher="text")
    assert [s.support for s in r.statements] == [0.5, 1.0, 0.0] and r.unmatched == 1
    # By order the same predictions pair differently.
    r = score_response(preds, golds, matcher="order")
    assert [s.support for s in r.statements] == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError):
        score_response(preds, golds, matcher="fuzzy")


def test_only_the_first_40_statements_count():
    preds = [st(f"s{i}", (i, i)) for i in range(41)]
    golds = [gold(f"s{i}", i) for i in range(40)] + [gold("s40", 999)]
    r = score_response(preds, golds)
    assert r.n_statements == 40 and r.recall == 1.0 and r.precision == 1.0
    r = score_response(preds, golds, max_statements=None)
    assert r.n_statements == 41 and r.precision == pytest.approx(40 / 41)


def test_dataset_averages_per_response_values():
    a = ([st("A", (1, 1))], [gold("A", 1)])                      # P = R = 1
    b = ([st("B", (5, 5), (7, 7), (9, 9))], [gold("B", 1)])      # P = R = 0
    d = score_dataset([a, b])
    # Means of per-response values (pooled precision would be 1/4).
    assert d["precision"] == 0.5 and d["recall"] == 0.5 and d["f1"] == 0.5
    assert (d["n"], d["statements"], d["citations"], d["unmatched"]) == (2, 2, 4, 0)
    assert score_dataset([])["recall"] == 0.0


def _naive(preds, golds, limit=40):
    """Independent re-implementation: explicit loops, sentence-by-sentence membership."""
    preds = preds[:limit]
    recall_terms, prec_terms = [], []
    for i, p in enumerate(preds):
        g = sorted(golds[i].support) if i < len(golds) else []
        ranges = [(c.start, c.end) for c in p.citations]
        if not ranges:
            recall_terms.append(0.0 if g else 1.0)
        else:
            inside = 0
            for x in g:
                for s, e in ranges:
                    if s <= x <= e:
                        inside += 1
                        break
            recall_terms.append(0.0 if not g or inside == 0 else (1.0 if inside == len(g) else 0.5))
        for s, e in ranges:
            prec_terms.append(1 if any(s <= x <= e for x in g) else 0)
    rec = sum(recall_terms) / len(recall_terms) if recall_terms else 0.0
    pre = sum(prec_terms) / len(prec_terms) if prec_terms else 0.0
    return rec, pre, (0.0 if rec + pre == 0 else 2 * rec * pre / (rec + pre))


def test_agrees_with_a_naive_implementation_on_random_cases():
    rng = random.Random(11)
    sents = _doc(20)
    items = []
    for _ in range(300):
        parts = []
        for _ in range(rng.randint(0, 6)):
            starts = [rng.randint(0, 22) for _ in range(rng.randint(0, 5))]
            spans = "".join(f"[{a}-{a + rng.randint(-1, 3)}]" for a in starts)
            filler = rng.choice(["", "Filler words here. ", "ok "])
            parts.append(filler + f"<statement>C.<cite>{spans}</cite></statement>")
        post = postprocess("".join(parts), sents)
        golds = [gold("g", *rng.sample(range(20), rng.choice([0, 1, 1, 2, 3])))
                 for _ in range(len(post.statements) + rng.randint(-2, 1))]
        limit = rng.choice([40, 2])
        r = score_response(post, golds, max_statements=limit)
        assert (r.recall, r.precision, r.f1) == _naive(post.statements, golds, limit)
        items.append((post, golds))
    d = score_dataset(items)
    per = [_naive(p.statements, g) for p, g in items]
    assert d["n"] == 300
    assert d["recall"] == pytest.approx(sum(x[0] for x in per) / 300)
    assert d["precision"] == pytest.approx(sum(x[1] for x in per) / 300)
    assert d["f1"] == pytest.approx(sum(x[2] for x in per) / 300)


# -------------------------------------------------------------------------------------------- reader


def _cit(s, e):
    return {"start_sentence_idx": s, "end_sentence_idx": e, "start_char_idx": 0, "end_char_idx": 3, "cite": "abc"}


def test_reader_json_and_jsonl(tmp_path):
    preds = [
        {"idx": 1, "dataset": "hotpotqa", "statements": [
            {"statement": "A", "citation": [_cit(1, 2)]}, {"statement": "B", "citation": []},
            {"statement": "x", "citation": None}]},
        {"idx": 2, "prediction": "<statement>C<cite>[0-0][5-5]</cite></statement>"},
        {"idx": 3, "statements": []},
        {"no": "idx"},
    ]
    golds = [{"idx": 2, "statements": [{"statement": "C", "support": [5]}]},
             {"idx": 1, "statements": [{"statement": "A", "support": [2]}, {"statement": "B", "support": []}]},
             {"idx": 9, "statements": []}]
    (tmp_path / "p.json").write_text(json.dumps(preds))
    (tmp_path / "g.jsonl").write_text("\n".join(json.dumps(g) for g in golds) + "\n\n")
    data = read_longbench_cite(tmp_path / "p.json", tmp_path / "g.jsonl")
    assert [r.idx for r in data.records] == [1, 2]
    assert data.missing_gold == [3] and data.missing_prediction == [9] and data.no_idx == 1
    r1, r2 = data.records
    assert r1.dataset == "hotpotqa" and [s.text for s in r1.statements] == ["A", "B"]
    assert [(c.start, c.end, c.cite) for c in r1.statements[0].citations] == [(1, 2, "abc")]
    assert [(c.start, c.end) for c in r2.statements[0].citations] == [(0, 0), (5, 5)]
    assert r1.gold == [gold("A", 2), gold("B")]
    d = score_dataset(data.pairs())
    # r1: A fully (1), B needs none (1); P: [1-2] relevant -> 1.  r2: full, P = 1/2.
    assert d["recall"] == 1.0 and d["precision"] == pytest.approx(0.75)


def test_reader_prediction_with_context_checks_spans(tmp_path):
    ctx = "One. Two. Three."
    (tmp_path / "p.jsonl").write_text(json.dumps(
        {"idx": "a", "context": ctx, "prediction": "<statement>X<cite>[1-7][9-9]</cite></statement>"}) + "\n")
    (tmp_path / "g.json").write_text(json.dumps([{"idx": "a", "statements": [{"statement": "X", "support": [2]}]}]))
    data = read_longbench_cite(tmp_path / "p.jsonl", tmp_path / "g.json")
    # [1-7] clamped to [1-2] in a 3-sentence context; [9-9] skipped.
    assert [(c.start, c.end, c.cite) for c in data.records[0].statements[0].citations] == [(1, 2, "Two. Three.")]


def test_reader_errors_are_one_line_user_errors(tmp_path):
    good = tmp_path / "g.json"
    good.write_text("[]")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"idx": 1, "statements": []}\n{not json\n')
    with pytest.raises(UserError, match=r"bad\.jsonl:2: not JSON") as e:
        read_longbench_cite(bad, good)
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="cannot read"):
        read_longbench_cite(tmp_path / "missing.json", good)
    (tmp_path / "nums.json").write_text("[1, 2]")
    with pytest.raises(UserError, match="expected JSON objects"):
        read_longbench_cite(tmp_path / "nums.json", good)
    (tmp_path / "p.json").write_text(json.dumps([{"idx": 1, "statements": [
        {"statement": "A", "citation": [{"start_sentence_idx": "0", "end_sentence_idx": 1}]}]}]))
    (tmp_path / "g1.json").write_text(json.dumps([{"idx": 1, "statements": []}]))
    with pytest.raises(UserError, match="start_sentence_idx must be an integer"):
        read_longbench_cite(tmp_path / "p.json", tmp_path / "g1.json")
