"""T-Eval sub-scores against hand-computed cases (semantics of open-compass/T-Eval's evaluators)."""

from __future__ import annotations

import numpy as np
import pytest

from lmforge.eval.teval import (
    extract_json,
    format_load,
    instruct_score,
    normalize_plan,
    parse_plan_json,
    parse_plan_str,
    plan_score,
    postprocess,
    reason_score,
    retrieve_score,
    review_score,
    rru_score,
    understand_score,
)

GOLD_ARGS = {"city": "Paris", "days": 3}


def identity_embed(texts):
    """One axis per distinct text: cosine 1 for equal strings, 0 otherwise."""
    axes = {t: i for i, t in enumerate(dict.fromkeys(texts))}
    out = np.zeros((len(texts), len(axes)))
    for row, t in enumerate(texts):
        out[row, axes[t]] = 1.0
    return out


def test_format_load_and_postprocess():
    assert format_load('{"a": true}') == {"a": True}  # JSON after the Python-literal attempt fails
    assert format_load("{'a': True}") == {"a": True}
    assert format_load('```json\n{"a": 1}\n```') == {"a": 1}
    assert extract_json("x [1, 2] y", "[", "]") == [1, 2]
    assert extract_json("no braces at all") is None
    with pytest.raises(ValueError):
        format_load("Sure. {'a': 1}")  # no slicing without start/end markers
    assert postprocess('  {"a": 1}<|im_end|>more') == '{"a": 1}'
    assert postprocess("```json\n[1]\n```") == "[1]"
    assert postprocess("Answer: B\nuser: next turn") == "Answer: B"


def test_instruct_json():
    good = '{"thought": "look it up", "name": "weather.get", "args": {"city": "Paris", "days": 3}}'
    assert instruct_score(good, "weather.get", GOLD_ARGS) == {"format_metric": 1.0, "args_em_metric": 1.0}
    # Name hit + 1 of 2 arguments: (1 + 1) / 3.
    half = '{"thought": "", "name": "weather.get", "args": {"city": "Rome", "days": 3}}'
    assert instruct_score(half, "weather.get", GOLD_ARGS)["args_em_metric"] == pytest.approx(2 / 3)
    # Wrong name, 1 of 2 arguments: 1 / 3.
    wrong = "{'thought': '', 'name': 'weather.put', 'args': {'city': 'Paris'}}"
    assert instruct_score(wrong, "weather.get", GOLD_ARGS)["args_em_metric"] == pytest.approx(1 / 3)
    # Args that are not a dict count as no arguments: name only, 1 / 3.
    assert instruct_score('{"thought": "", "name": "weather.get", "args": "Paris"}', "weather.get",
                          GOLD_ARGS)["args_em_metric"] == pytest.approx(1 / 3)
    # The whole response must parse, and the template's thought key must be there.
    assert instruct_score("Sure. " + good, "weather.get", GOLD_ARGS)["format_metric"] == 0.0
    no_thought = '{"name": "weather.get", "arguments": {"city": "Paris", "days": 3}}'
    assert instruct_score(no_thought, "weather.get", GOLD_ARGS)["format_metric"] == 0.0
    zoo = {"thought": None, "action": "name", "args": "arguments"}
    assert instruct_score(no_thought, "weather.get", GOLD_ARGS, template=zoo) == {
        "format_metric": 1.0, "args_em_metric": 1.0}


def test_instruct_string():
    text = "Thought: check\nAction: weather.get\nAction Input: {'city': 'Paris', 'days': 3}\n"
    assert instruct_score(text, "weather.get", GOLD_ARGS, fmt="string") == {"format_metric": 1.0, "args_em_metric": 1.0}
    half = "Thought: check\nAction: weather.get\nAction Input: {'city': 'Rome', 'days': 3}\n"
    assert instruct_score(half, "weather.get", GOLD_ARGS, fmt="string")["args_em_metric"] == pytest.approx(2 / 3)
    # The default template ends the args with a newline: without it nothing matches.
    assert instruct_score(text.rstrip("\n"), "weather.get", GOLD_ARGS, fmt="string")["format_metric"] == 0.0
    # Args that are no Python literal keep the parse: name only, 1 / 3.
    bad_args = "Thought: x\nAction: weather.get\nAction Input: city=Paris\n"
    assert instruct_score(bad_args, "weather.get", GOLD_ARGS, fmt="string") == {
        "format_metric": 1.0, "args_em_metric": pytest.approx(1 / 3)}
    assert instruct_score("Action: weather.get", "weather.get", GOLD_ARGS, fmt="string")["format_metric"] == 0.0


GOLD_PLAN = [
    {"id": 0, "prev": [], "name": "search.flights", "args": {"to": "Oslo"}},
    {"id": 1, "prev": [0], "name": "book.hotel", "args": {"city": "Oslo"}},
    {"id": 2, "prev": [1], "name": "send.email", "args": {"to": "me"}},
    {"id": 3, "prev": [2], "name": "FinishAction", "args": {}},
]


def test_plan_lis_f1():
    gold = normalize_plan(GOLD_PLAN)
    assert gold[1] == {"name": "book.hotel", "id": 1, "args": "{'city': 'Oslo'}"}
    assert plan_score(gold, gold, embed=identity_embed)["f1_score"] == 1.0
    # Reversed: every step matches but only one is in order: LIS 1, P = R = F1 = 1/3.
    rev = [dict(s, id=i) for i, s in enumerate(gold[:3][::-1])]
    res = plan_score(rev, gold, embed=identity_embed)
    assert res["precision"] == res["recall"] == res["f1_score"] == pytest.approx(1 / 3)
    # Listed out of order but ids say the right order: sorted by id first.
    assert plan_score([gold[2], gold[0], gold[1]], gold, embed=identity_embed)["f1_score"] == 1.0
    # Two of three, in order: P = 1, R = 2/3, F1 = 0.8.
    res = plan_score([gold[0], gold[2]], gold, embed=identity_embed)
    assert (res["precision"], res["recall"], res["f1_score"]) == (1.0, pytest.approx(2 / 3), pytest.approx(0.8))
    # Nothing matches: T-Eval's run count still starts at 1: P = 1/2, R = 1/3, F1 = 0.4.
    other = [{"id": 0, "name": "x.y", "args": "{}"}, {"id": 1, "name": "z.w", "args": "{}"}]
    res = plan_score(other, gold, embed=identity_embed)
    assert (res["precision"], res["recall"], res["f1_score"]) == (0.5, pytest.approx(1 / 3), pytest.approx(0.4))
    assert plan_score([], gold) == {"precision": 0.0, "recall": 0.0, "f1_score": 0.0, "parse_rate": 0.0}
    # Repeated identical steps tie exactly; the gold plan itself still scores 1.
    rep = normalize_plan([{"id": i, "name": "mail.show", "args": {}} for i in range(3)])
    assert plan_score(rep, rep, embed=identity_embed)["f1_score"] == 1.0


def test_plan_parsers():
    text = 'Plan: [{"id": 0, "name": "a.b", "args": "{}"}, {"id": 1, "name": "c.d", "args": {"x": 1}}] done'
    assert parse_plan_json(text) == [{"name": "a.b", "id": 0, "args": "{}"},
                                     {"name": "c.d", "id": 1, "args": "{'x': 1}"}]
    assert parse_plan_json('[{"name": "a.b", "args": "{}"}]') == []  # a step without an id drops the plan
    assert parse_plan_json("no list") == []
    steps = parse_plan_str("Use c.d to start. Then use a.b and c.d\nthanks\nUse e.f", ["a.b", "c.d", "e.f"])
    assert [(s["id"], s["name"]) for s in steps] == [(0, "c.d"), (1, "a.b"), (2, "e.f")]
    assert steps[1]["args"] == "Then use a.b and c.d"


def test_rru_json():
    gold = {"thought": "find the weather", "name": "weather.get", "args": GOLD_ARGS}
    res = rru_score('{"thought": "find the weather", "name": "weather.get", "args": {"city": "Paris"}}',
                    gold, "json", "reason")
    # One of two arguments over T-Eval's len + 1e-5.
    assert res == {"thought": pytest.approx(1.0), "name": 1.0, "args": pytest.approx(1 / (2 + 1e-5)),
                   "parse_rate": 1.0}
    assert rru_score("not json", gold, "json", "retrieve") == {
        "thought": 0.0, "name": 0.0, "args": 0.0, "parse_rate": 0.0}
    zoo = '{"name": "weather.get", "arguments": {"city": "Paris", "days": 3}}'
    assert rru_score(zoo, gold, "json", "understand")["args"] == 0.0  # T-Eval's keys: no "args" key
    res = rru_score(zoo, gold, "json", "understand", response_keys={"thought": None, "args": "arguments"})
    assert res["name"] == 1.0 and res["args"] == pytest.approx(2 / (2 + 1e-5)) and res["parse_rate"] == 1.0


def test_rru_str_and_parts():
    gold = {"thought": "find the weather", "name": "weather.get", "args": GOLD_ARGS}
    assert rru_score("find the weather", gold, "str", "reason") == {"thought": pytest.approx(1.0), "parse_rate": 1.0}
    assert rru_score("I will call weather.get now", gold, "str", "retrieve") == {"name": 1.0, "parse_rate": 1.0}
    # A second a.b name (or FinishAction) in the response voids the retrieval.
    assert rru_score("weather.get or weather.put", gold, "str", "retrieve")["name"] == 0.0
    assert retrieve_score("weather.get then FinishAction", "weather.get", "str") == 0.0
    assert retrieve_score("weather", "weather.get", "str") == 0.0
    assert retrieve_score("weather.get", "weather.get", "json") == 1.0
    # String understand: the response (quotes stripped) equals str() of the gold arguments.
    assert rru_score("{'city': 'Paris', 'days': 3}", gold, "str", "understand") == {"args": 1.0, "parse_rate": 1.0}
    assert understand_score("\"{'city': 'Paris', 'days': 3}\"", "{'city': 'Paris', 'days': 3}") == 1.0
    assert understand_score('{"city": "Paris", "days": 3}', "{'city': 'Paris', 'days': 3}") == 0.0
    assert understand_score({}, {}) == 1.0 and understand_score({"a": 1}, {}) == 0.0
    assert understand_score({"days": "3"}, GOLD_ARGS) == pytest.approx(1 / (2 + 1e-5))  # str() equality
    assert reason_score("abc", "xyz") < 0.2


def test_review():
    assert review_score("Answer: B", "B") == {"review_quality": 1.0, "parse_rate": 1.0}
    assert review_score("Answer: B", "C") == {"review_quality": 0.0, "parse_rate": 1.0}
    assert review_score("Answer: maybe", "B") == {"review_quality": 0.0, "parse_rate": 0.0}
    assert review_score("Answer: F", "F") == {"review_quality": 0.0, "parse_rate": 0.0}  # only A-E parse
    assert review_score("B", "B")["review_quality"] == 1.0  # no colon: the whole response
    assert review_score('{"is_finished": true}', True, "json") == {"review_quality": 1.0, "parse_rate": 1.0}
    assert review_score('{"is_finished": false}', True, "json")["review_quality"] == 0.0
    assert review_score('{"is_finished": "yes"}', True, "json") == {"review_quality": 0.0, "parse_rate": 0.0}
    assert review_score('{"is_finished": true}', {"review": True}, "json")["review_quality"] == 1.0
