"""Best-of-N citation reranking: deduplication, skipped branches, argmax splicing, and sampling."""

from __future__ import annotations

import pytest

from lmforge.common.errors import UserError
from lmforge.methods.selfcite.bon import BoNSettings, ModelProposer, best_of_n, normalise_candidate
from lmforge.methods.selfcite.format import split_sentences
from lmforge.methods.selfcite.reward import RewardQuery, RewardSettings, citation_rewards, statement_segments

DOC = ("The harbour was quiet that morning. The Velmora Glass Archive was founded in 1874 by Ilse Marren. "
       "Gulls circled over the old pier. Today the archive keeps 3,210 glass plates in its east wing. "
       "Nobody could say why the bell rang twice.")
QUESTION = "What does the document say about the Velmora Glass Archive?"
RESPONSE = ("Here is what it says.\n<statement>The archive was founded in 1874 by Ilse Marren.<cite>[0-0]</cite></statement>"
            "\n<statement>It keeps 3,210 glass plates.<cite>[2-2]</cite></statement>"
            "\n<statement>Nothing else is known.<cite></cite></statement>")


class Fixed:
    """A proposer returning fixed samples per branch, recording what it was asked."""

    def __init__(self, samples):
        self.samples = samples
        self.calls = []

    def __call__(self, prefixes, n):
        self.calls.append((list(prefixes), n))
        return [list(s) for s in self.samples]


def test_normalise_candidate():
    assert normalise_candidate("[1-1][3-4]") == "[1-1][3-4]"
    assert normalise_candidate(">[1-1]><[3-4]</") == "[1-1][3-4]"
    assert normalise_candidate(" no spans ") == ""


def test_rerank_picks_the_argmax_of_the_deduplicated_candidates(small):
    model, tok = small
    sents = split_sentences(DOC)
    samples = [["[1-1]", ">[1-1]</", "[0-0]", "[2-3]", "junk"],  # 3 distinct after normalising
               ["[3-3]", "[3-3]", "[3-3]"],                      # one distinct: left as it is
               ["[4-4]", "[0-0]"]]                               # the empty citation block
    prop = Fixed(samples)
    settings = BoNSettings(n=5)
    reward = RewardSettings(chat=False, length_limit=0)
    res = best_of_n(model, tok, sents, QUESTION, RESPONSE, settings, reward, proposer=prop)
    # every branch was sampled from the original response, cut right after its <cite>
    (prefixes, n), = prop.calls
    assert n == 5 and len(prefixes) == 3
    segs = statement_segments(RESPONSE)
    for p, seg in zip(prefixes, segs):
        assert p.endswith(RESPONSE[:seg.content_start]) and p.endswith("<cite>")
    b0, b1, b2 = res.branches
    assert [c.candidate for c in b0.candidates] == ["[1-1]", "[0-0]", "[2-3]"]
    assert b1.candidates == [] and b1.chosen is None
    # the reward of each candidate is the one citation_rewards gives for that statement alone
    q0 = RewardQuery(sents, QUESTION, RESPONSE[:segs[0].prefix_end], RESPONSE[segs[0].prefix_end:segs[0].cite_start])
    want = citation_rewards(model, tok, [(q0, c) for c in ("[1-1]", "[0-0]", "[2-3]")], reward)
    assert [c.reward for c in b0.candidates] == pytest.approx([w.reward for w in want], abs=1e-4)
    best0 = max(b0.candidates, key=lambda c: c.reward).candidate
    best2 = max(b2.candidates, key=lambda c: c.reward).candidate
    assert b0.chosen == best0 and b2.chosen == best2
    expected = (RESPONSE[:segs[0].content_start] + best0 + RESPONSE[segs[0].content_end:segs[2].content_start]
                + best2 + RESPONSE[segs[2].content_end:])
    assert res.response == expected
    assert "<cite>[2-2]</cite>" in res.response  # the single-option branch kept its original citation


def test_a_response_without_citations_is_returned_unchanged(small):
    model, tok = small
    res = best_of_n(model, tok, split_sentences(DOC), QUESTION, "No tags here.", BoNSettings(n=2),
                    RewardSettings(chat=False), proposer=Fixed([]))
    assert res.response == "No tags here." and res.branches == []


def test_n_below_one_is_a_user_error():
    with pytest.raises(UserError, match="N must be >= 1"):
        BoNSettings(n=0)


def test_model_proposer_samples_n_per_prefix_and_stops_at_the_citation_end(small):
    model, tok = small
    prop = ModelProposer(model, tok, BoNSettings(n=3, max_new_tokens=6, seed=1))
    out = prop(["<statement>a<cite>", "<statement>b<cite>"], 3)
    assert [len(x) for x in out] == [3, 3]
    assert all("</cite>" not in t for row in out for t in row)
    again = ModelProposer(model, tok, BoNSettings(n=3, max_new_tokens=6, seed=1))(["<statement>a<cite>", "<statement>b<cite>"], 3)
    assert again == out  # seeded


def test_pairwise_auroc_equals_sklearn_within_one_group_and_pools_pairs():
    import random

    from sklearn.metrics import roc_auc_score

    from lmforge.methods.selfcite.experiment import pairwise_auroc

    rng = random.Random(0)
    pos = [round(rng.gauss(1, 1), 1) for _ in range(7)]  # rounded: ties occur and count one half
    neg = [round(rng.gauss(0, 1), 1) for _ in range(9)]
    assert pairwise_auroc([(pos, neg)]) == pytest.approx(roc_auc_score([1] * 7 + [0] * 9, pos + neg))
    # two groups: the mean over all within-group pairs, never comparing across groups
    assert pairwise_auroc([([1.0], [0.0, 2.0]), ([10.0], [9.0])]) == pytest.approx((1 + 0 + 1) / 3)
