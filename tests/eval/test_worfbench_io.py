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
