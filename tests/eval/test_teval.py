"""T-Eval sub-scores against hand-computed cases."""

from __future__ import annotations

import pytest

from lmforge.eval.teval import (
    extract_json,
    instruct_score,
    plan_score,
    reason_score,
    retrieve_score,
    review_score,
    understand_score,
)


def test_instruct_json_and_string():
    gold_args = {"city": "Paris", "days": 3}
    good = 'Sure. {"thought": "look it up", "name": "weather.get", "args": {"city": "Paris", "days": 3}}'
    assert instruct_score(good, "weather.get", gold_args) == {"format": 1.0, "args_em": 1.0}
    half = '{"thought": "", "name": "weather.get", "args": {"city": "Rome", "days": 3}}'
    assert instruct_score(half, "weather.get", gold_args)["args_em"] == pytest.approx(2 / 3)
    wrong_name = '{"thought": "", "name": "weather.put", "args": {"city": "Paris"}}'
    assert instruct_score(wrong_name, "weather.get", gold_args)["args_em"] == pytest.approx(1 / 3)
    assert instruct_score("no json here", "weather.get", gold_args) == {"format": 0.0, "args_em": 0.0}
    text = "Thought: check\nAction: weather.get\nAction Input: {'city': 'Paris', 'days': 3}\n"
    assert instruct_score(text, "weather.get", gold_args, fmt="string") == {"format": 1.0, "args_em": 1.0}
    assert instruct_score("Action: weather.get", "weather.get", gold_args, fmt="string")["format"] == 0.0


def test_plan_lis_f1():
    gold = [{"name": "search.flights", "args": "{'to': 'Oslo'}"}, {"name": "book.hotel", "args": "{'city': 'Oslo'}"},
            {"name": "send.email", "args": "{'to': 'me'}"}, {"name": "FinishAction", "args": "{}"}]
    assert plan_score(gold, gold)["f1"] == 1.0
    # Reversed: one step in order, P = R = 1/3.
    assert plan_score(gold[:3][::-1], gold)["f1"] == pytest.approx(1 / 3)
    # Two of three, in order: P = 1, R = 2/3.
    res = plan_score([gold[0], gold[2]], gold)
    assert res["precision"] == 1.0 and res["recall"] == pytest.approx(2 / 3)
    assert plan_score([], gold)["f1"] == 0.0


def test_reason_understand_retrieve_review():
    assert reason_score("find the weather in Paris", "find the weather in Paris") == pytest.approx(1.0)
    assert reason_score("abc", "xyz") < 0.2
    assert understand_score({"city": "Paris"}, {"city": "Paris"}) == pytest.approx(1.0)
    assert retrieve_score('{"name": "weather.get"}', "weather.get") == 1.0
    assert retrieve_score('{"name": "weather.put"}', "weather.get") == 0.0
    assert retrieve_score("I will call weather.get now", "weather.get", fmt="string") == 1.0
    assert retrieve_score("weather.get or weather.put", "weather.get", fmt="string") == 0.0
    assert review_score('{"is_finished": true}', True) == 1.0
    assert review_score('{"is_finished": "yes"}', True) == 0.0
    assert review_score("Answer: B, because", "B", fmt="string") == 1.0
    assert review_score("Answer: maybe", "B", fmt="string") == 0.0
    assert extract_json("x [1, 2] y", "[", "]") == [1, 2]
