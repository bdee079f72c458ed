"""WorfBench files: the official record shape round-trips, malformed files name their record/line."""

from __future__ import annotations

import json

import pytest

from lmforge.common.errors import UserError
from lmforge.eval import worfbench
from lmforge.eval.metrics import graph_f1, node_f1

OFFICIAL = {
    "source": "os", "id": "os_8", "target": "graph", "category": "eval",
    "conversations": [
        {"role": "system", "content": "You are a helpful task planner."},
        {"role": "user", "content": "Count the files in 'Work'."},
        {"role": "assistant", "content": "Node:\n1: execute bash code to count the files\n2: take answer action\n"
                                         "Edge: (START,1) (1,2) (2,END)"},
    ],
}


def test_reads_the_official_shape(tmp_path):
    path = tmp_path / "graph_eval.json"
    path.write_text(json.dumps([OFFICIAL]))
    (item,) = worfbench.load(path)
    assert item.id == "os_8" and item.source == "os" and item.task == "Count the files in 'Work'."
    assert item.gold_nodes == ["execute bash code to count the files", "take answer action"]
    assert item.gold_edges == [["START", 1], [1, 2], [2, "END"]]
    assert [m["role"] for m in item.messages] == ["system", "user"]


def test_generated_records_round_trip_and_score_one(tmp_path):
    recs = worfbench.generate(0, 5)
    path = worfbench.write(recs, tmp_path / "mini.json")
    items = worfbench.load(path)
    assert len(items) == 5
    for item, rec in zip(items, recs):
        # A perfect prediction is the gold plan text itself.
        from lmforge.data.workflow import parse_plan

        nodes, edges = parse_plan(rec["conversations"][-1]["content"])
        assert node_f1(nodes, item.gold_nodes, item.gold_edges)["f1"] == 1.0
        assert graph_f1(nodes, edges, item.gold_nodes, item.gold_edges)["f1"] == 1.0


@pytest.mark.parametrize(
    "content,suffix,needle",
    [
        ('[{"id": 1}]', ".json", "record 0"),
        ("[1, 2", ".json", ":1: not valid JSON"),
        (json.dumps(OFFICIAL) + "\n{oops\n", ".jsonl", ":2: not valid JSON"),
        ('{"a": 1}', ".json", "expected a JSON list"),
    ],
)
def test_malformed_files_name_the_place(tmp_path, content, suffix, needle):
    path = tmp_path / f"bad{suffix}"
    path.write_text(content)
    with pytest.raises(UserError, match=needle.replace("[", r"\[")):
        worfbench.load(path)


def test_generated_user_turn_lists_the_gold_steps_among_other_actions(tmp_path):
    import random

    from lmforge.data import workflow

    recs = worfbench.generate(3, 12)
    tasks = [r["task"] for r in workflow.generate(random.Random(3), 12)]
    for rec, task in zip(recs, tasks):
        user = rec["conversations"][1]["content"]
        head, actions_line = user.split("\n")
        assert head == "Task: " + task  # the action lists draw from their own stream: same tasks as before
        actions = json.loads(actions_line.removeprefix(worfbench.ACTIONS_PREFIX))
        gold, _ = workflow.parse_plan(rec["conversations"][2]["content"])
        extra = [a for a in actions if a not in gold]
        assert set(gold) <= set(actions) and len(actions) == len(set(actions))
        assert len(extra) >= worfbench.MIN_DISTRACTOR_STEPS
        assert actions != list(dict.fromkeys(gold)) + extra  # shuffled, not gold first
    # The zoo's prompt sees the task alone, as it was trained.
    item = worfbench.load(worfbench.write(recs[:1], tmp_path / "w.json"))[0]
    assert item.task == tasks[0]


def test_demonstrations_are_worked_examples_never_an_evaluated_task():
    from lmforge.data import workflow

    demo = worfbench.demonstrations(0, 2)
    assert [m["role"] for m in demo] == ["user", "assistant", "user", "assistant"]
    assert demo == worfbench.demonstrations(0, 2)  # seeded
    for user, answer in zip(demo[::2], demo[1::2]):
        nodes, edges = workflow.parse_plan(answer["content"])
        actions = json.loads(user["content"].split("\n")[1].removeprefix(worfbench.ACTIONS_PREFIX))
        assert nodes and edges and set(nodes) <= set(actions)
    first = worfbench.task_text(demo[0]["content"])
    again = worfbench.demonstrations(0, 1, exclude={first})
    assert worfbench.task_text(again[0]["content"]) != first
    evaluated = {worfbench.task_text(r["conversations"][1]["content"]) for r in worfbench.generate(0, 50)}
    assert not evaluated & {worfbench.task_text(m["content"]) for m in worfbench.demonstrations(0, 3, exclude=evaluated)[::2]}
    with pytest.raises(UserError, match="--shots"):
        worfbench.demonstrations(0, -1)


@pytest.mark.parametrize("shots", [0, 1, 2])
def test_task_prompt_puts_the_shots_between_system_and_user(tmp_path, shots):
    from lmforge.bench.tasks import Context, get_task

    recs = worfbench.generate(1, 2)
    path = worfbench.write(recs, tmp_path / "worfbench.json")
    items = get_task("worfbench").items(path, Context(tokenizer=None, fmt="plain", seed=5, shots=shots))
    demo = worfbench.demonstrations(5, shots, {worfbench.task_text(r["conversations"][1]["content"]) for r in recs})
    for item, rec in zip(items, recs):
        system, user = rec["conversations"][0]["content"], rec["conversations"][1]["content"]
        assert item.prompt == "\n".join([system] + [m["content"] for m in demo] + [user])
