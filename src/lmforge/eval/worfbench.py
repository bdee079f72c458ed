"""WorfBench task files: read the official format, write lmforge's generated plans in it.

WorfBench (Qiao et al., 2024; github.com/zjunlp/WorFBench, ``gold_traj/<split>/graph_eval.json``)
ships a JSON list of records::

    {"source": "os", "id": "os_92", "target": "graph", "category": "eval",
     "conversations": [{"role": "system", "content": <planner instructions>},
                       {"role": "user", "content": <task>},
                       {"role": "assistant", "content": "Node:\\n1: ...\\nEdge: (START,1) (1,2) ..."}]}

:func:`load` returns :class:`WorkflowItem` s (the prompt messages, the gold graph parsed from the
assistant turn, and that turn's text for the official reader); :func:`write` writes records in the same shape, so a user with the real split runs
it unchanged and lmforge's generated miniature goes through the same loader. A malformed file is a
one-line :class:`~lmforge.common.errors.UserError` naming the record (or the line of a ``.jsonl``).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmforge.common.errors import UserError
from lmforge.common.io import atomic_write_text, parse_json_lines, parse_json_text, read_user_text
from lmforge.data import workflow

__all__ = ["SYSTEM_PROMPT", "WorkflowItem", "generate", "load", "write"]

# WorfBench's planner instruction (paraphrased to the format it asks for).
SYSTEM_PROMPT = (
    "You are a helpful task planner. Plan a sequence of nodes, each a subtask of the task, and "
    "connect them into a graph from START to END by their dependencies. Keep your output in format:\n"
    "Node:\n1: {subtask_1}\n2: {subtask_2}\n...\nEdge: (START,1) ... (n,END)"
)


@dataclass
class WorkflowItem:
    """One WorfBench instance."""

    id: str
    source: str
    messages: list[dict[str, str]]  # the system and user turns
    gold_nodes: list[str]
    gold_edges: list[list[Any]]
    gold_text: str = ""  # the assistant turn as written (WorfBench's own reader parses this)

    @property
    def task(self) -> str:
        return next((m["content"] for m in self.messages if m["role"] == "user"), "")


def _records(path: Path) -> list[tuple[str, Any]]:
    """``(where, record)`` pairs from a JSON list or a JSON-lines file."""
    raw = read_user_text(path, "WorfBench")
    if path.suffix == ".jsonl":
        return [(f"{path}:{i}", rec) for i, rec in parse_json_lines(path, raw)]
    data = parse_json_text(path, raw)
    if not isinstance(data, list):
        raise UserError(f"{path}: expected a JSON list of WorfBench records")
    return [(f"{path} record {i}", rec) for i, rec in enumerate(data)]


def load(path: str | Path) -> list[WorkflowItem]:
    """Read a WorfBench ``graph_eval.json`` (or ``.jsonl``) into items with parsed gold graphs."""
    items = []
    for where, rec in _records(Path(path)):
        if not isinstance(rec, dict) or not isinstance(rec.get("conversations"), list):
            raise UserError(f"{where}: a WorfBench record needs a 'conversations' list")
        turns = rec["conversations"]
        if not all(isinstance(t, dict) and isinstance(t.get("content"), str) and "role" in t for t in turns):
            raise UserError(f"{where}: every conversation turn needs 'role' and a string 'content'")
        gold = [t for t in turns if t["role"] == "assistant"]
        if not gold:
            raise UserError(f"{where}: no assistant turn holding the gold plan")
        nodes, edges = workflow.parse_plan(gold[-1]["content"])
        if not nodes:
            raise UserError(f"{where}: the gold plan has no 'Node:' list")
        items.append(WorkflowItem(
            id=str(rec.get("id", where)),
            source=str(rec.get("source", "")),
            messages=[{"role": t["role"], "content": t["content"]} for t in turns if t["role"] != "assistant"],
            gold_nodes=nodes,
            gold_edges=edges,
            gold_text=gold[-1]["content"],
        ))
    if not items:
        raise UserError(f"{path}: no WorfBench records")
    return items


def generate(seed: int, n: int, source: str = "lmforge") -> list[dict[str, Any]]:
    """``n`` generated plans as WorfBench records."""
    rng = random.Random(seed)
    out = []
    for i, rec in enumerate(workflow.generate(rng, n)):
        out.append({
            "source": source,
            "id": f"{source}_{i}",
            "target": "graph",
            "category": "eval",
            "conversations": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": rec["task"]},
                {"role": "assistant", "content": workflow.answer(rec)},
            ],
        })
    return out


def write(records: list[dict[str, Any]], path: str | Path) -> Path:
    """Write records as a WorfBench JSON list (atomically)."""
    return atomic_write_text(path, json.dumps(records, indent=2, ensure_ascii=False) + "\n")
