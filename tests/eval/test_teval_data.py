"""T-Eval files: the official record shapes load, generated files round-trip, gold responses score
the maximum, the zoo's records render to its training prompt, malformed files name the place."""

from __future__ import annotations

import json
import random

import pytest

from lmforge.common.errors import UserError
from lmforge.data import toolcalls
from lmforge.eval import teval_data as td

# Hand-made records in the shapes of T-Eval's data files (review_str, plan_str, instruct, rru json).
REVIEW_STR = {
    "template": "", "meta_data": {"response_format": "str"},
    "ground_truth": {"answer": "B", "thought": "The tool could not be reached."},
    "origin_prompt": [{"role": "system", "content": "Judge the call. Answer: <A-E>"},
                      {"role": "user", "content": "Goal: get weather\nName: Weather.get\nArgs: {}\nResponse: timeout"}],
}
PLAN_STR = {
    "meta": {"prompt_type": "str", "API_list": ["Hotel.search", "Mail.send"]},
    "ground_truth": [{"id": 0, "prev": [], "name": "Hotel.search", "args": {"city": "Oslo"}},
                     {"id": 1, "prev": [0], "name": "Mail.send", "args": {"to": "me"}},
                     {"id": 2, "prev": [1], "name": "FinishAction", "args": {}}],
    "origin_prompt": [{"role": "system", "content": "Plan. Each step: Use [api name] to [goal]."},
                      {"role": "user", "content": "Find a hotel in Oslo and mail me."}],
}
INSTRUCT_STRING = {
    "template": {"thought_start": "Thought:", "thought_end": "\n", "action_start": "Action:", "action_end": "\n",
                 "args_start": "Action Input:", "args_end": "<end>"},
    "meta_data": {"response_format": "string"},
    "ground_truth": {"action": "Weather.get", "args": {"city": "Paris", "days": 3}},
    "origin_prompt": [{"role": "user", "content": "Weather in Paris for 3 days?"}],
}
RRU_JSON = {
    "template": "", "meta_data": {"response_format": "json"},
    "ground_truth": {"thought": "look up the weather", "name": "Weather.get", "args": {"city": "Paris"}},
    "origin_prompt": [{"role": "user", "content": "Weather in Paris?"}],
}


def _without(record, key):
    return {k: v for k, v in record.items() if k != key}


def _write(tmp_path, records, name="data.json"):
    path = tmp_path / name
    path.write_text(json.dumps(records, indent=2))
    return path


def test_official_shapes_load_and_score(tmp_path):
    (review,) = td.load(_write(tmp_path, {"126": REVIEW_STR}), "review")
    assert (review.id, review.fmt, review.messages[1]["role"]) == ("126", "str", "user")
    assert td.score(review, "Answer: B")["review_quality"] == 1.0
    assert td.score(review, "Answer: C") == {"review_quality": 0.0, "parse_rate": 1.0}

    (plan,) = td.load(_write(tmp_path, {"query_0_1": PLAN_STR}), "plan")
    assert plan.fmt == "str" and plan.meta_data["API_list"] == ["Hotel.search", "Mail.send"]
    assert td.score(plan, "Use Hotel.search to find a hotel\nUse Mail.send to mail me")["parse_rate"] == 1.0
    assert td.score(plan, "I cannot help.") == {"precision": 0.0, "recall": 0.0, "f1_score": 0.0, "parse_rate": 0.0}

    (inst,) = td.load(_write(tmp_path, {"1": INSTRUCT_STRING}), "instruct")
    assert inst.fmt == "str"
    # Name + 1 of 2 arguments: args_em 2/3, format 1, score (1 + 2/3) / 2.
    res = td.score(inst, "Thought: go\nAction: Weather.get\nAction Input: {'city': 'Paris', 'days': 4}<end>")
    assert res == {"format_metric": 1.0, "args_em_metric": pytest.approx(2 / 3), "score": pytest.approx(5 / 6)}
    assert td.score(inst, td.reference(inst)) == {"format_metric": 1.0, "args_em_metric": 1.0, "score": 1.0}

    # One rru JSON file serves reason, retrieve and understand; each names its own headline metric.
    for kind in ("reason", "retrieve", "understand"):
        (item,) = td.load(_write(tmp_path, {"7": RRU_JSON}), kind)
        res = td.score(item, '{"thought": "look up the weather", "name": "Weather.get", "args": {"city": "Rome"}}')
        assert res == {"thought": pytest.approx(1.0), "name": 1.0, "args": 0.0, "parse_rate": 1.0}
    assert [td.primary(k) for k in td.KINDS] == ["score", "f1_score", "thought", "name", "args", "review_quality"]


@pytest.mark.parametrize("kind", td.KINDS)
@pytest.mark.parametrize("fmt", td.FORMATS)
def test_generated_files_round_trip_and_gold_scores_the_maximum(tmp_path, kind, fmt):
    records = td.generate(kind, fmt, seed=3, n=6)
    assert td.generate(kind, fmt, seed=3, n=6) == records  # deterministic
    for name in ("mini.json", "mini.jsonl"):
        items = td.load(td.write(records, tmp_path / name), kind)
        assert [it.id for it in items] == list(records)
        assert all(it.kind == kind and it.fmt == fmt for it in items)
        assert [it.messages for it in items] == [r["origin_prompt"] for r in records.values()]
    for item in items:
        res = td.score(item, td.reference(item))
        assert set(res) == set(td.metrics(kind, fmt)) and td.primary(kind) in res
        best = 1.0
        if kind == "understand" and fmt == "json":  # T-Eval divides by len(gold args) + 1e-5
            best = len(item.ground_truth["args"]) / (len(item.ground_truth["args"]) + 1e-5)
        assert res[td.primary(kind)] == pytest.approx(best, abs=1e-12)
        assert res.get("parse_rate", 1.0) == 1.0


def test_zoo_records_render_to_the_training_prompt():
    n, seed = 5, 11
    rng = random.Random(seed)
    sources = [toolcalls.example(rng) for _ in range(n)]
    for kind in ("instruct", "retrieve", "understand"):
        records = td.generate(kind, "json", seed, n)
        for (rid, rec), src in zip(records.items(), sources):
            item = td.TEvalItem(rid, kind, "json", rec["origin_prompt"], rec["template"], rec["ground_truth"],
                                rec["meta_data"])
            assert td.render_plain(item.messages) == toolcalls.prompt(src)
            assert td.reference(item) == toolcalls.answer(src)
            assert td.score(item, toolcalls.answer(src))[td.primary(kind)] > 0.99
    # The zoo writes no thought: a call-only response is well-formed for instruct.
    instruct = td.generate("instruct", "json", seed, 1)
    assert next(iter(instruct.values()))["template"] == {"thought": None, "action": "name", "args": "arguments"}


def test_render_uses_the_chat_template_when_there_is_one():
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]

    class Chat:
        chat_template = "{{ x }}"

        def apply_chat_template(self, messages, add_generation_prompt, tokenize):
            assert add_generation_prompt is True and tokenize is False
            return "<chat>" + "|".join(m["content"] for m in messages)

    class Plain:
        chat_template = None

    assert td.render(Chat(), msgs) == "<chat>S|U"
    assert td.render(Plain(), msgs) == td.render_plain(msgs) == "S\nU"


def test_malformed_json_names_the_line(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{\n  "a": {\n    "ground_truth": oops\n  }\n}\n')
    with pytest.raises(UserError) as err:
        td.load(path, "review")
    msg = str(err.value)
    assert f"{path}:3:" in msg and "\n" not in msg
    jsonl = tmp_path / "bad.jsonl"
    jsonl.write_text(json.dumps({"id": "a", **REVIEW_STR}) + "\n{oops\n")
    with pytest.raises(UserError, match=r"bad\.jsonl:2: not valid JSON"):
        td.load(jsonl, "review")


@pytest.mark.parametrize(
    "kind,record,needle",
    [
        ("review", _without(REVIEW_STR, "ground_truth"), "record 'r1': missing field 'ground_truth'"),
        ("review", _without(REVIEW_STR, "origin_prompt"), "record 'r1': missing field 'origin_prompt'"),
        ("review", {**REVIEW_STR, "meta_data": {}}, "record 'r1': missing field 'meta_data.response_format'"),
        ("review", {**REVIEW_STR, "ground_truth": {"thought": "x"}}, "review 'ground_truth' needs an 'answer'"),
        ("instruct", _without(INSTRUCT_STRING, "template"), "record 'r1': missing field 'template'"),
        ("instruct", {**INSTRUCT_STRING, "template": {"action_start": "A:"}}, "record 'r1': 'template' has no key"),
        ("plan", {**PLAN_STR, "meta": {"prompt_type": "str"}}, "record 'r1': a string plan record needs"),
        ("understand", {**RRU_JSON, "ground_truth": {"thought": "t", "name": "n"}}, "'ground_truth' has no 'args'"),
        ("review", {**REVIEW_STR, "meta_data": {"response_format": "yaml"}}, "unknown response format 'yaml'"),
    ],
)
def test_invalid_records_name_the_record_and_field(tmp_path, kind, record, needle):
    path = _write(tmp_path, {"r1": record})
    with pytest.raises(UserError) as err:
        td.load(path, kind)
    assert needle in str(err.value) and str(path) in str(err.value) and "\n" not in str(err.value)


def test_other_load_errors(tmp_path):
    with pytest.raises(UserError, match="not found"):
        td.load(tmp_path / "missing.json", "plan")
    with pytest.raises(UserError, match="unknown T-Eval sub-task"):
        td.load(_write(tmp_path, {"r1": REVIEW_STR}), "tooluse")
    with pytest.raises(UserError, match="no T-Eval records"):
        td.load(_write(tmp_path, {}), "review")
    with pytest.raises(UserError, match="expected a JSON object"):
        td.load(_write(tmp_path, 3), "review")
    # A record without a format takes the one the caller names (T-Eval's --prompt_type).
    (item,) = td.load(_write(tmp_path, {"r1": _without(REVIEW_STR, "meta_data")}), "review", fmt="str")
    assert item.fmt == "str"
