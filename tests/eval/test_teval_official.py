"""T-Eval answers are cut the way open-compass/T-Eval cuts them: only at end-of-turn markers
(``test.py``, ``split_special_tokens``), never at a line end, so the string instruct answer
(Thought / Action / Action Input on three lines, parsed by ``InstructEvaluator.string_format_parse``
through ``teval/utils/template.py``'s ``parse_string`` with ``re.S``) and pretty-printed JSON score
end to end through ``TEvalTask.items`` (its stop strings) and ``TEvalTask.score``. Only the zoo
format keeps a cut. Expected values are T-Eval's formulas worked out by hand:
``score = (format_metric + args_em_metric) / 2`` with ``args_em = (name equal + equal gold args) /
(gold args + 1)``.
"""

from __future__ import annotations

import json

import pytest

from lmforge.bench.tasks import Context, get_task
from lmforge.eval import teval_data

GOLD = {"action": "get_weather", "args": {"city": "Rome", "days": 3}}
JSON_TEMPLATE = {"thought": "thought", "action": "name", "args": "args"}  # T-Eval's JSON instruct keys
PROMPT = [{"role": "system", "content": "You have access to the API get_weather(city, days)."},
          {"role": "user", "content": "What will the weather be in Rome over the next three days?"}]


def instruct_file(tmp_path):
    records = {
        "str_0": {"template": dict(teval_data.STRING_TEMPLATE), "meta_data": {"response_format": "string"},
                  "ground_truth": GOLD, "origin_prompt": PROMPT},
        "json_0": {"template": JSON_TEMPLATE, "meta_data": {"response_format": "json"},
                   "ground_truth": GOLD, "origin_prompt": PROMPT},
    }
    path = tmp_path / "instruct_v2.json"
    path.write_text(json.dumps(records))
    return path


def generated(item, raw: str) -> str:
    """What the decode loop keeps of ``raw``: the text before the earliest stop string."""
    cuts = [raw.find(s) for s in item.stop if s and s in raw]
    return raw[: min(cuts)] if cuts else raw


def items_by_id(tmp_path, fmt):
    task = get_task("teval_instruct")
    return task, {it.id.split(":", 1)[1]: it for it in task.items(instruct_file(tmp_path), Context(tokenizer=None, fmt=fmt))}


# A chat model's answers: its own thought over two lines, JSON-style args, the end-of-turn marker.
STR_ANSWER = ("Thought: The user wants a three-day forecast for Rome,\nso I should look it up.\n"
              "Action: get_weather\nAction Input: {\"city\": \"Rome\", \"days\": 3}<|im_end|>")
STR_WRONG_DAYS = ("Thought: I need the forecast.\nAction: get_weather\n"
                  "Action Input: {'city': 'Rome', 'days': 5}")
JSON_PRETTY = ('```json\n{\n  "thought": "Look up the forecast.",\n  "name": "get_weather",\n'
               '  "args": {\n    "city": "Rome",\n    "days": 3\n  }\n}\n```')


@pytest.mark.parametrize("fmt", ["plain", "chat"])
def test_official_formats_have_no_stop_string(tmp_path, fmt):
    if fmt == "chat":
        class Tok:
            chat_template = "x"

            def apply_chat_template(self, messages, add_generation_prompt, tokenize):
                return "\n".join(m["content"] for m in messages) + "\nassistant:"

        task = get_task("teval_instruct")
        items = task.items(instruct_file(tmp_path), Context(tokenizer=Tok(), fmt="chat"))
    else:
        _, by_id = items_by_id(tmp_path, fmt)
        items = list(by_id.values())
    assert [it.stop for it in items] == [(), ()]


def test_multiline_string_answer_scores_end_to_end(tmp_path):
    task, by_id = items_by_id(tmp_path, "plain")
    item = by_id["str_0"]
    ctx = Context(tokenizer=None, fmt="plain")
    # Format parsed, name and both arguments equal: (1 + 3/3) / 2.
    assert task.score(item, generated(item, STR_ANSWER), ctx) == {"score": 1.0, "parse_rate": 1.0}
    # Name and city equal, days not: args_em = (1 + 1) / 3, score = (1 + 2/3) / 2.
    got = task.score(item, generated(item, STR_WRONG_DAYS), ctx)
    assert got["score"] == pytest.approx((1 + 2 / 3) / 2) and got["parse_rate"] == 1.0
    # Cut at the first line end, as before, the same answer is no parse at all.
    assert task.score(item, STR_ANSWER.split("\n", 1)[0], ctx) == {"score": 0.0, "parse_rate": 0.0}


def test_pretty_printed_json_answer_scores_end_to_end(tmp_path):
    task, by_id = items_by_id(tmp_path, "plain")
    item = by_id["json_0"]
    ctx = Context(tokenizer=None, fmt="plain")
    assert task.score(item, generated(item, JSON_PRETTY), ctx) == {"score": 1.0, "parse_rate": 1.0}
    wrong_name = JSON_PRETTY.replace('"get_weather"', '"get_forecast"')
    # Name wrong, both arguments equal: args_em = 2/3.
    assert task.score(item, generated(item, wrong_name), ctx)["score"] == pytest.approx((1 + 2 / 3) / 2)


def test_zoo_format_keeps_its_cuts(tmp_path):
    _, by_id = items_by_id(tmp_path, "zoo")
    # The zoo's JSON call is one line: cut at the line end. The three-line string answer: at a blank line.
    assert by_id["json_0"].stop == ("\n",)
    assert by_id["str_0"].stop == ("\n\n",)
    task = get_task("teval_instruct")
    item = by_id["str_0"]
    assert task.score(item, generated(item, STR_ANSWER + "\n\nThought: again"), Context(tokenizer=None, fmt="zoo")) == {
        "score": 1.0, "parse_rate": 1.0}


@pytest.mark.parametrize("kind", teval_data.KINDS)
def test_no_subtask_cuts_outside_the_zoo(tmp_path, kind):
    task = get_task(f"teval_{kind}")
    task.generate(tmp_path, seed=0, n=2)
    for path in task.paths(tmp_path):
        for fmt, expected in (("plain", {()}), ("zoo", None)):
            stops = {it.stop for it in task.items(path, Context(tokenizer=None, fmt=fmt))}
            if expected is not None:
                assert stops == expected
            else:
                assert stops and all(s in (("\n",), ("\n\n",)) for s in stops)
