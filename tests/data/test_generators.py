"""Generators: seeded, in their official formats, and internally consistent."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from lmforge.data import corpus, needle, text, textworld, toolcalls, workflow


@pytest.mark.parametrize("mod", [toolcalls, workflow, textworld, text])
def test_same_seed_same_records(mod):
    assert mod.generate(random.Random(7), 20) == mod.generate(random.Random(7), 20)
    assert mod.generate(random.Random(7), 20) != mod.generate(random.Random(8), 20)


def test_toolcall_record_is_xlam_format_and_answer_is_consistent():
    for rec in toolcalls.generate(random.Random(0), 200):
        names = [t["name"] for t in rec["tools"]]
        call = rec["answers"][0]
        assert call["name"] in names
        schema = next(t for t in rec["tools"] if t["name"] == call["name"])
        assert set(call["arguments"]) == set(schema["parameters"])
        # Every argument value is copied from the query, so the call is recoverable from it.
        for value in call["arguments"].values():
            assert str(value) in rec["query"]
        assert toolcalls.exact_match(toolcalls.answer(rec), rec)
        assert json.loads(toolcalls.answer(rec)) == call


def test_toolcall_exact_match_rejects_wrong_calls():
    rec = toolcalls.generate(random.Random(1), 1)[0]
    call = dict(rec["answers"][0])
    wrong = dict(call, arguments={k: f"{v}x" for k, v in call["arguments"].items()})
    assert not toolcalls.exact_match(json.dumps(wrong), rec)
    assert not toolcalls.exact_match('{"name": ', rec)
    assert toolcalls.parse_call('junk {"a": {"b": 1}} tail') == {"a": {"b": 1}}


def test_workflow_render_parse_roundtrip_and_dag():
    import networkx as nx

    for rec in workflow.generate(random.Random(0), 100):
        nodes, edges = workflow.parse_plan(workflow.answer(rec))
        assert nodes == rec["nodes"] and edges == rec["edges"]
        g = nx.DiGraph([tuple(e) for e in edges])
        assert nx.is_directed_acyclic_graph(g)
        # Every node lies on a path from START to END.
        for i in range(1, len(nodes) + 1):
            assert nx.has_path(g, "START", i) and nx.has_path(g, i, "END")


def test_needle_answer_is_in_context_once_at_reported_depth():
    rng = random.Random(0)
    for _ in range(100):
        rec = needle.example(rng, n_sentences=30, n_needles=5)
        sentence = needle.needle_sentence(rec["key"], rec["answer"])
        assert rec["context"].count(f"{rec['key']} ") == 1
        assert sentence in rec["context"]
        pieces = rec["context"].split(". ")
        idx = next(i for i, p in enumerate(pieces) if p.startswith(f"{rec['key']} "))
        assert abs(idx / max(1, len(pieces) - 1) - rec["depth"]) < 1e-9
        assert needle.exact_match(" " + rec["answer"] + ".", rec)
        assert not needle.exact_match(" 12345", rec)


def test_needle_keys_are_single_tokens(zoo_tokenizer):
    for key in needle.KEYS:
        assert len(zoo_tokenizer(" " + key, add_special_tokens=False).input_ids) == 1, key


def test_digits_are_single_tokens(zoo_tokenizer):
    ids = zoo_tokenizer(" 4821", add_special_tokens=False).input_ids
    # The leading space rides on the first digit (no lone-space token between a key and its value).
    assert [zoo_tokenizer.decode([i]) for i in ids] == [" 4", "8", "2", "1"]
    assert zoo_tokenizer.decode(zoo_tokenizer("x=10, y 2.5").input_ids, skip_special_tokens=True) == "x=10, y 2.5"


def test_blocksworld_expert_solves_every_start_and_goal_with_three_blocks():
    blocks = ["A", "B", "C"]
    # All 13 states of 3 blocks: enumerate by brute force from random draws.
    states = {json.dumps(textworld.random_state(random.Random(s), blocks)) for s in range(3000)}
    assert len(states) == 13
    for init, goal in itertools.product(states, states):
        env = textworld.BlocksWorld(json.loads(init), json.loads(goal), max_steps=10)
        while not env.success():
            act = textworld.expert_action(env.state, env.goal)
            assert env.step(act), act
            assert env.steps <= 2 * len(blocks)
        assert env.invalid == 0


def test_blocksworld_rejects_invalid_moves():
    env = textworld.BlocksWorld([["A", "B"], ["C"]], [["A"], ["B"], ["C"]])
    assert not env.step("move A to table")  # A is under B
    assert not env.step("move C to table")  # already on the table
    assert not env.step("fly away")
    assert env.step("move B onto C")
    assert env.invalid == 3 and env.steps == 4
    assert textworld.render(env.state) == "[A] [C B]"


def test_corpus_segments_match_eval_prompt():
    segs = corpus.needle_segments(random.Random(3), 10)
    first, is_answer = segs[0]
    key = first.rsplit(" ", 1)[1]
    assert first.endswith(f"What is the code for {key}?\nAnswer: {key}") and not is_answer
    assert f"{key}{segs[1][0]}." in first  # the first answer is the queried needle's value
    answers = [s for s, is_answer in segs if is_answer]
    assert all(a.strip().isdigit() and len(a.strip()) == 4 for a in answers)
