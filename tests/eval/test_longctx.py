"""Long-context and AgentBoard scorers against hand-computed cases."""

from __future__ import annotations

import pytest

from lmforge.eval.longctx import episode_scores, length_bucket, niah_score, normalize_answer, qa_f1, retrieval_em

NEEDLE = "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day."


def test_niah_is_ten_rouge1_f():
    pytest.importorskip("rouge_score")
    assert niah_score(NEEDLE, NEEDLE) == pytest.approx(10.0)
    assert niah_score(NEEDLE, "No idea, sorry.") == 0.0
    # All 4 response words are among the needle's 21 tokens: P = 1, R = 4/21, F = 8/25.
    assert niah_score(NEEDLE, "eat a sandwich Park") == pytest.approx(10 * 2 * (4 / 21) / (1 + 4 / 21))


def test_qa_f1_and_em_follow_longbench():
    assert normalize_answer("The  Eiffel Tower!") == "eiffel tower"
    assert qa_f1("the Eiffel tower", ["Eiffel Tower", "Paris"]) == 1.0
    # pred {eiffel, tower, paris} vs gold {eiffel, tower}: P 2/3, R 1, F1 0.8.
    assert qa_f1("Eiffel Tower, Paris", "Eiffel Tower") == pytest.approx(0.8)
    assert qa_f1("nothing", "Eiffel Tower") == 0.0
    assert retrieval_em("Paragraph 3.", ["paragraph 3"]) == 1.0
    assert [length_bucket(n) for n in (10, 3999, 4000, 9000)] == ["0-4k", "0-4k", "4-8k", "8k+"]


def test_agentboard_episode_scores():
    s = episode_scores([0, 1, 1, 2, 1], 4, [True, True, False, True, True])
    assert s == {"progress_rate": 0.5, "success": 0.0, "grounding": 0.8}
    assert episode_scores([1, 2], 2, [True, True])["success"] == 1.0
    # Steps beyond 30 do not count.
    assert episode_scores([0] * 30 + [3], 3, [True] * 31)["progress_rate"] == 0.0
