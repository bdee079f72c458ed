"""LLM-as-judge on diverging pairs with a scripted judge, and the filter that drops them."""

from __future__ import annotations

import numpy as np
import pytest

from lmforge.common.errors import UserError
from lmforge.methods.diverging_prefs import core
from lmforge.methods.diverging_prefs.data import PreferencePair
from lmforge.methods.diverging_prefs.judge import (
    filter_diverging,
    judge_messages,
    judge_pairs,
    judge_report,
    parse_verdict,
)
from lmforge.methods.minions.clients import ScriptedClient


def _pairs() -> list[PreferencePair]:
    spec = [  # (labels, len A, len B)
        ([2, 1, 1], 30, 5), ([-1, -2, 0], 5, 30), ([1, -1, 2], 40, 10), ([-2, 2, 0], 10, 40),
        ([0, 0, 0], 10, 10), ([1, -2, -1], 50, 5), ([1, 1, 0], 5, 50),
    ]
    return [PreferencePair(f"p{i}", "Explain X.", "a" * la, "b" * lb, ls) for i, (ls, la, lb) in enumerate(spec)]


def _longer_judge(messages):
    user = messages[-1]["content"]
    a = user.split("[The Start of Assistant A's Answer]\n")[1].split("\n[The End")[0]
    b = user.split("[The Start of Assistant B's Answer]\n")[1].split("\n[The End")[0]
    verdict = "[[A]]" if len(a) > len(b) else "[[B]]" if len(b) > len(a) else "[[C]]"
    return f"Assistant {verdict[2]} is more detailed. {verdict}"


def test_parse_verdict_takes_the_last_and_none_when_absent():
    assert parse_verdict("maybe [[B]] ... final: [[A]]") == 1
    assert parse_verdict("[[ C ]]") == 0 and parse_verdict("[[B]]") == -1
    assert parse_verdict("I cannot decide") is None


def test_judge_is_decisive_on_diverging_pairs_and_the_filter_removes_them():
    pairs = _pairs()
    client = ScriptedClient(_longer_judge)
    verdicts = judge_pairs(client, pairs)
    assert [v.winner for v in verdicts] == [1, -1, 1, -1, 0, 1, -1]
    assert client.calls[0] == judge_messages(pairs[0])
    rep = judge_report(verdicts, pairs)["all"]
    # A verbosity-loving judge picks a winner on every diverging pair, as on high-agreement ones.
    assert rep["picks_winner_on_diverging"] == 1.0 and rep["picks_winner_on_high_agreement"] == 1.0
    assert rep["diverging_pairs"] == 3 and rep["high_agreement_pairs"] == 3 and rep["tie_pairs"] == 1
    # majority on high-agreement pairs: p0 A (judge A), p1 B (judge B), p6 A (judge B)
    assert rep["agreement_with_majority_on_high_agreement"] == pytest.approx(2 / 3)

    # An oracle divergence score: the filter drops exactly the diverging pairs.
    div = np.array([1.0 if core.pair_kind(p.labels) == core.DIVERGING else 0.0 for p in pairs])
    kept, dropped = filter_diverging(pairs, div, threshold=0.5)
    assert dropped == [2, 3, 5] and kept == [0, 1, 4, 6]
    rep2 = judge_report(verdicts, pairs, kept)
    assert rep2["dropped"] == {"pairs": 3, "diverging": 3, "high_agreement": 0, "ties": 0}
    assert rep2["filtered"]["diverging_pairs"] == 0 and rep2["filtered"]["picks_winner_on_diverging"] is None


def test_filter_by_fraction_and_argument_checks():
    pairs = _pairs()
    div = np.arange(len(pairs), dtype=float)
    kept, dropped = filter_diverging(pairs, div, drop_fraction=2 / 7)
    assert dropped == [5, 6] and kept == [0, 1, 2, 3, 4]
    with pytest.raises(UserError):
        filter_diverging(pairs, div)
    with pytest.raises(UserError):
        filter_diverging(pairs, div, threshold=1.0, drop_fraction=0.1)
