"""UDora's per-position target scores, splicing rules, before-negative stop and surrogate construction."""

from __future__ import annotations

import re

import pytest
import torch

from lmforge.methods.udora.intervals import (
    build_surrogate,
    collect_intervals,
    match_score,
    merge_overlap,
    splice_target,
    stops_at_negative,
    surrogate_segments,
)
from lmforge.methods.udora.scheduling import Interval

# next-token probabilities of a 4-token trace over a 5-token vocabulary (rows sum to 1)
TABLE = torch.tensor([
    [0.1, 0.6, 0.1, 0.1, 0.1],   # argmax 1
    [0.1, 0.1, 0.6, 0.1, 0.1],   # argmax 2
    [0.2, 0.1, 0.1, 0.1, 0.5],   # argmax 4
    [0.4, 0.3, 0.1, 0.1, 0.1],   # argmax 0
])


def test_match_score_hand_values():
    # [2, 4, 1] from 1: 2 = argmax row 1 (p .6), 4 = argmax row 2 (p .5), 1 != argmax row 3 (p .3)
    score, m = match_score([2, 4, 1], TABLE, 1)
    assert m == 2
    assert score == pytest.approx((2 + (0.6 + 0.5 + 0.3) / 3) / 4)
    # fully matched: m = L, so the score clears L / (L + 1)
    score, m = match_score([2, 4], TABLE, 1)
    assert (m, score) == (2, pytest.approx((2 + 0.55) / 3))
    assert score >= 2 / 3
    # first token already wrong: m = 0, p̄ is that token's probability alone
    score, m = match_score([3, 2], TABLE, 0)
    assert (m, score) == (0, pytest.approx(0.1 / 3))
    # target running past the trace's end: only the in-trace positions count, L stays 3
    score, m = match_score([0, 1, 2], TABLE, 3)
    assert (m, score) == (1, pytest.approx((1 + 0.4) / 4))
    # nothing to score past the end
    assert match_score([0], TABLE, 4) is None
    assert match_score([], TABLE, 0) is None


def test_match_score_ignores_rows_past_the_trace():
    extra = torch.cat([TABLE, torch.tensor([[0.0, 1.0, 0.0, 0.0, 0.0]])])   # e.g. the stripped EOS step
    assert match_score([0, 1, 2], extra, 3, n_positions=4) == match_score([0, 1, 2], TABLE, 3)
    score, m = match_score([0, 1], extra, 3)          # default n_positions = 5 rows: row 4 counts
    assert (m, score) == (2, pytest.approx((2 + 0.7) / 3))
    rows = list(TABLE)                                # a list of per-position tensors works too
    assert match_score([2, 4, 1], rows, 1) == match_score([2, 4, 1], TABLE, 1)


def test_merge_overlap_hand_cases():
    assert merge_overlap("Action: G", "GmailSendEmail") == ("Action: GmailSendEmail", True)
    assert merge_overlap("abc", "xyz") == ("abcxyz", False)
    assert merge_overlap("", "t") == ("t", False)
    assert merge_overlap("xaa", "aab") == ("xaab", True)          # longest overlap "aa", not "a"
    assert merge_overlap("ends ", " Send") == ("ends Send", True)  # a shared space is an overlap
    assert merge_overlap("aaaa", "aa") == ("aaaa", True)          # the whole target overlaps


# agent-small's tokenizer is byte-level BPE:
# "Action: GmailReadEmail now" -> Action : Ġ G mail R e ad E mail Ġno w
# "Action: GmailSendEmail"     -> Action : Ġ G mail S end E mail
# "Action:GmailSendEmail"      -> Action : G mail S end E mail
G, MAIL, S, END, E, SPACE = 41, 450, 53, 689, 39, 223
SEND_EMAIL = (G, MAIL, S, END, E, MAIL)


@pytest.fixture(scope="module")
def tok():
    from lmforge.models.load import load

    return load("zoo:agent-small")[1]


def test_splice_overlap_rule(tok):
    trace = tok.encode("Action: GmailReadEmail now", add_special_tokens=False)
    assert trace[3:5] == [G, MAIL]
    # in front of "mail" the prefix ends in "G": the target overlaps it and starts one token earlier
    start, ids = splice_target(tok, trace, 4, "GmailSendEmail")
    assert start == 3 and ids == SEND_EMAIL
    # in front of the space token nothing overlaps: the target starts right there
    start, ids = splice_target(tok, trace, 2, "GmailSendEmail")
    assert start == 2 and ids == SEND_EMAIL


def test_splice_leading_space_rule(tok):
    trace = tok.encode("Action: GmailReadEmail now", add_special_tokens=False)
    assert tok.convert_ids_to_tokens(trace[2]).startswith("Ġ")
    # the next token starts with a space: with the option the target gets one too
    start, ids = splice_target(tok, trace, 2, "GmailSendEmail", add_space_before_target=True)
    assert start == 2 and ids == tuple(tok.encode(" GmailSendEmail", add_special_tokens=False))
    # "mail" does not start with a space: no space is added even with the option
    start, ids = splice_target(tok, trace, 4, "GmailSendEmail", add_space_before_target=True)
    assert start == 3 and ids == SEND_EMAIL


class WordTokenizer:
    """A word-level stand-in with GPT-2-style "Ġ" markers, so that "cannot" is one token."""

    vocab = ["<pad>", "I", "Ġthink", "ĠI", "Ġcannot", "Ġhelp", "Ġcan't", "Ġdo", "Ġit", "Send", "ĠSend", "Ġ"]

    def encode(self, text, add_special_tokens=False):
        return [self.vocab.index(w.replace(" ", "Ġ")) for w in re.findall(r" ?[^ ]+| ", text)]

    def decode(self, ids, skip_special_tokens=False):
        return "".join(self.vocab[int(i)].replace("Ġ", " ") for i in ids)

    def convert_ids_to_tokens(self, i):
        return self.vocab[int(i)]


@pytest.mark.parametrize("negative", ["cannot", "can't"])
def test_before_negative_stops_the_scan(negative):
    wt = WordTokenizer()
    trace = wt.encode(f"I think I {negative} help")
    probs = torch.full((len(trace), len(wt.vocab)), 1.0 / len(wt.vocab))
    assert [stops_at_negative(wt, trace, i) for i in range(len(trace))] == [False, False, False, True, False]
    kept = collect_intervals(trace, ["Send"], wt, probs, add_space_before_target=True, before_negative=True)
    assert [(iv.start, iv.target_ids) for iv in kept] == [(0, (9,)), (1, (10,)), (2, (10,))]
    every = collect_intervals(trace, ["Send"], wt, probs, add_space_before_target=True)
    assert [iv.start for iv in every] == [0, 1, 2, 3, 4]


def test_build_surrogate_hand_case():
    trace = list(range(10, 20))
    first = Interval(start=2, end=4, score=0.9, target_ids=(100, 101))
    second = Interval(start=6, end=9, score=0.5, target_ids=(102, 103, 104))
    assert surrogate_segments(trace, [first, second]) == [[10, 11], [100, 101], [14, 15], [102, 103, 104]]
    ids, spans = build_surrogate(trace, [first, second])
    assert ids == [10, 11, 100, 101, 14, 15, 102, 103, 104]      # cut after the last target (19 dropped)
    assert spans == [(2, 4), (6, 9)]
    assert [ids[s:e] for s, e in spans] == [[100, 101], [102, 103, 104]]
    # adjacent targets leave an empty context between them; a target may run past the trace
    third = Interval(start=4, end=5, score=0.1, target_ids=(105,))
    tail = Interval(start=9, end=12, score=0.1, target_ids=(106, 107, 108))
    ids, spans = build_surrogate(trace, [first, third, tail])
    assert ids == [10, 11, 100, 101, 105, 15, 16, 17, 18, 106, 107, 108]
    assert spans == [(2, 4), (4, 5), (9, 12)]
    assert build_surrogate(trace, []) == ([], [])
    with pytest.raises(ValueError):
        build_surrogate(trace, [second, first])
