"""MoRAgent's multi-role data pipeline: records, tool stub, grounding, verification, role ids."""

from __future__ import annotations

import json
import random

import pytest

from lmforge.common.errors import UserError
from lmforge.data import toolcalls
from lmforge.methods.moragent.data import (
    ROLE_IDS,
    ChatCompleter,
    Segment,
    TemplateCompleter,
    Trajectory,
    build_trajectories,
    encode_trajectory,
    execute_call,
    format_call,
    grounding_problems,
    read_function_calls,
    read_trajectories,
    render_segment,
    role_ids_for,
    validate_trajectory,
    write_trajectories,
)
from lmforge.methods.minions.clients import ScriptedClient
from lmforge.models.tokenizer import train_tokenizer

TOOLS = [
    {"name": "add", "description": "Add", "parameters": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
    {"name": "greet", "description": "Greet", "parameters": {"type": "dict", "properties": {
        "who": {"type": "string"}, "loud": {"type": "boolean"}, "ratio": {"type": "float"}},
        "required": ["who"]}},
    {"name": "find", "parameters": {"q": {"type": "str"}, "limit": {"type": "int, optional", "default": 5}}},
]


def _traj() -> Trajectory:
    return Trajectory([Segment("user", "Query: add 2 and 3"),
                       Segment("reasoner", "Thought: add them.\nNext role: executor"),
                       Segment("executor", '{"name": "add", "arguments": {"a": 2, "b": 3}}'),
                       Segment("observation", '{"status": "ok", "function": "add", "result": {"sum": 5}}'),
                       Segment("reasoner", "Thought: done.\nNext role: summarizer"),
                       Segment("summarizer", "The sum is 5.")], {"source_index": 0})


def test_round_trip(tmp_path):
    t = _traj()
    assert Trajectory.from_json(t.to_json()) == t
    write_trajectories([t, t], tmp_path / "t.jsonl")
    assert read_trajectories(tmp_path / "t.jsonl") == [t, t]


@pytest.mark.parametrize("mutate, match", [
    (lambda d: d["segments"][1].update(role="planner"), "unknown role 'planner'"),
    (lambda d: d["segments"][2].pop("role"), "segment 2 has no role tag"),
    (lambda d: d.update(segments=[s for s in d["segments"] if s["role"] != "executor"]), "no executor segment"),
    (lambda d: d["segments"].append({"role": "user", "text": "thanks"}), "ends with the summarizer"),
    (lambda d: d["segments"][0].update(text=3), "no string 'text'"),
    (lambda d: d.pop("segments"), "'segments' list"),
])
def test_validation_errors(mutate, match):
    d = _traj().to_dict()
    mutate(d)
    with pytest.raises(UserError, match=match) as exc:
        validate_trajectory(d)
    assert "\n" not in str(exc.value)


def test_trajectory_file_errors_name_the_line(tmp_path):
    d = _traj().to_dict()
    d["segments"][1]["role"] = "critic"
    p = tmp_path / "t.jsonl"
    p.write_text(_traj().to_json() + "\n" + json.dumps(d) + "\n")
    with pytest.raises(UserError, match=r"t\.jsonl:2: segment 1 has unknown role 'critic'"):
        read_trajectories(p)


def test_read_function_calls(tmp_path):
    recs = toolcalls.generate(random.Random(0), 3)
    p = tmp_path / "fc.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert read_function_calls(p) == recs
    # The xLAM dump's JSON-string fields are parsed.
    q = tmp_path / "fc.json"
    q.write_text(json.dumps([{**recs[0], "tools": json.dumps(recs[0]["tools"]),
                              "answers": json.dumps(recs[0]["answers"])}]))
    assert read_function_calls(q) == recs[:1]
    for bad, match in [({"query": "x", "tools": TOOLS}, "missing 'answers'"),
                       ({"query": "x", "tools": TOOLS, "answers": [{"name": "add", "arguments": "a=1"}]},
                        "answer 0 \\(add\\) needs an 'arguments' object"),
                       ({"query": "x", "tools": [], "answers": []}, "'tools' must be a non-empty list")]:
        p.write_text(json.dumps(bad) + "\n")
        with pytest.raises(UserError, match=match):
            read_function_calls(p)


def test_execute_call():
    ok = json.loads(execute_call({"name": "add", "arguments": {"a": 2, "b": 3}}, TOOLS))
    assert ok["status"] == "ok" and ok["result"]["a"] == 2 and ok["result"]["b"] == 3
    assert execute_call({"name": "add", "arguments": {"a": 2, "b": 3}}, TOOLS) == json.dumps(ok)  # deterministic
    other = json.loads(execute_call({"name": "add", "arguments": {"a": 2, "b": 4}}, TOOLS))
    assert other["result"]["result_id"] != ok["result"]["result_id"]
    for call, why in [({"name": "add", "arguments": {"a": 2}}, "missing required argument(s) b"),
                      ({"name": "add", "arguments": {"a": 2, "b": "3"}}, "'b' should be integer"),
                      ({"name": "add", "arguments": {"a": True, "b": 3}}, "'a' should be integer"),
                      ({"name": "sub", "arguments": {}}, "unknown function 'sub'"),
                      ({"name": "add", "arguments": {"a": 1, "b": 2, "c": 3}}, "unknown argument 'c'"),
                      ({"name": "greet", "arguments": {"loud": True}}, "missing required argument(s) who")]:
        obs = json.loads(execute_call(call, TOOLS))
        assert obs["status"] == "error" and why in obs["error"], (call, obs)
    # JSON-schema optional parameters, float accepting an int; xLAM "optional"/default.
    assert json.loads(execute_call({"name": "greet", "arguments": {"who": "Ann", "ratio": 2}}, TOOLS))["status"] == "ok"
    assert json.loads(execute_call({"name": "find", "arguments": {"q": "x"}}, TOOLS))["status"] == "ok"


def test_grounding():
    obs = [execute_call({"name": "greet", "arguments": {"who": "Ann Lee", "ratio": 0.5}}, TOOLS)]
    rid = json.loads(obs[0])["result"]["result_id"]
    assert grounding_problems(f"Greeted 'Ann Lee' with ratio 0.5, id {rid}.", obs) == []
    assert grounding_problems("I greeted Ann Lee.", obs) == []  # mentions a value, claims nothing false
    assert grounding_problems("Greeted 'Ann Lee' 7 times.", obs) == ["ungrounded: 7"]
    assert grounding_problems("Greeted 'Bob'.", obs) == ["ungrounded: 'Bob'", "mentions nothing"]
    assert grounding_problems("All done, ok.", obs) == ["mentions nothing"]  # status/function do not count


def test_template_trajectories_are_kept_on_generated_data():
    recs = toolcalls.generate(random.Random(1), 50)
    kept, report = build_trajectories(recs, TemplateCompleter())
    assert report["kept"] == 50 and report["dropped"] == 0
    t = kept[0]
    assert t.roles() == ["user", "reasoner", "executor", "observation", "reasoner", "summarizer"]
    assert toolcalls.parse_call(t.segments[2].text) == recs[0]["answers"][0]
    assert t.segments[2].text == format_call(recs[0]["answers"][0]) == toolcalls.answer(recs[0]).lstrip()


def test_build_trajectories_drops_and_counts():
    recs = toolcalls.generate(random.Random(2), 6)
    recs[1] = {**recs[1], "answers": [{"name": "no_such_tool", "arguments": {}}]}
    call = recs[2]["answers"][0]
    recs[2] = {**recs[2], "answers": [{"name": call["name"], "arguments": {}}]}  # missing args
    template = TemplateCompleter()

    class Hallucinating:
        """Template texts, except a made-up number in the summaries of records whose query has 'X'."""

        def __init__(self):
            self.calls = 0

        def complete(self, role, prompt):
            self.calls += 1
            text = template.complete(role, prompt)
            if role == "summarizer" and "HALLUCINATE" in prompt:
                return text + " It also costs 123456789 dollars."
            if role == "summarizer" and "VAGUE" in prompt:
                return "Done."
            if role == "reasoner" and "WANDER" in prompt and "Next role: summarizer" in text:
                return "Thought: let me look again.\nNext role: executor"
            return text

    recs[3] = {**recs[3], "query": recs[3]["query"] + " HALLUCINATE"}
    recs[4] = {**recs[4], "query": recs[4]["query"] + " VAGUE"}
    recs[5] = {**recs[5], "query": recs[5]["query"] + " WANDER"}
    comp = Hallucinating()
    kept, report = build_trajectories(recs, comp)
    assert [t.meta["source_index"] for t in kept] == [0]
    assert report["total"] == 6 and report["kept"] == 1 and report["dropped"] == 5
    assert report["dropped_by_reason"] == {"call_error": 2, "bad_next_role": 1, "ungrounded_summary": 1,
                                           "summary_mentions_nothing": 1}
    assert [(d["index"], d["reason"]) for d in report["drops"]] == [
        (1, "call_error"), (2, "call_error"), (3, "ungrounded_summary"), (4, "summary_mentions_nothing"),
        (5, "bad_next_role")]
    assert "unknown function 'no_such_tool'" in report["drops"][0]["detail"]
    assert "123456789" in report["drops"][2]["detail"]
    # failed calls are dropped before any completion is asked for: 4 records x up to 3 completions
    assert comp.calls == 3 + 3 + 3 + 2


def test_chat_completer_on_a_client():
    recs = toolcalls.generate(random.Random(3), 2)
    def reply(msgs):
        first = msgs[0]["content"].split("\n")[0]  # the role's instruction
        if "reasoner" in first:
            return "Thought: ok.\nNext role: " + ("executor" if "'Next role: executor'" in first else "summarizer")
        return "Nothing to report."

    client = ScriptedClient(reply)
    kept, report = build_trajectories(recs, ChatCompleter(client))
    assert report["dropped_by_reason"]["summary_mentions_nothing"] == 2 and not kept
    assert len(client.calls) == 6


@pytest.fixture(scope="module")
def tok():
    recs = toolcalls.generate(random.Random(4), 40)
    kept, _ = build_trajectories(recs, TemplateCompleter())
    return train_tokenizer(["".join(render_segment(s) for s in t.segments) for t in kept], 400)


def test_role_ids_for(tok):
    kept, _ = build_trajectories(toolcalls.generate(random.Random(5), 5), TemplateCompleter())
    for t in kept:
        ids, roles = encode_trajectory(tok, t, add_eos=False)
        full = tok("".join(render_segment(s) for s in t.segments), add_special_tokens=False)["input_ids"]
        assert ids == full and len(roles) == len(full)
        assert role_ids_for(tok, t, add_eos=False) == roles
        pos = 0
        for s in t.segments:
            n = len(tok(render_segment(s), add_special_tokens=False)["input_ids"])
            assert n > 0 and roles[pos:pos + n] == [ROLE_IDS[s.role]] * n
            pos += n
        assert pos == len(roles)
        assert set(roles) == {-1, 0, 1, 2}
        ids_e, roles_e = encode_trajectory(tok, t)
        assert ids_e == ids + [tok.eos_token_id] and roles_e == roles + [2]


def test_from_bfcl():
    from lmforge.data.bfcl import BfclRecord
    from lmforge.methods.moragent.data import from_bfcl

    fn = {"name": "area", "description": "Area", "parameters": {
        "type": "dict", "properties": {"base": {"type": "integer"}, "unit": {"type": "string"}},
        "required": ["base"]}}
    rec = BfclRecord("simple_python_0", "simple_python", [{"role": "user", "content": "Area of base 10?"}], [fn],
                     [{"area": {"base": [10], "unit": ["", "units"]}}])
    fc = from_bfcl(rec)
    assert fc["query"] == "Area of base 10?"
    assert fc["answers"] == [{"name": "area", "arguments": {"base": 10, "unit": "units"}}]
    rec.ground_truth = [{"area": {"base": [10], "unit": [""]}}]
    kept, report = build_trajectories([from_bfcl(rec)], TemplateCompleter())
    assert report["kept"] == 1 and kept[0].segments[2].text == '{"name": "area", "arguments": {"base": 10}}'
    rec.ground_truth = None
    with pytest.raises(UserError, match="irrelevance"):
        from_bfcl(rec)
