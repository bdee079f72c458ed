"""WorfBench task files: read the official format, write lmforge's generated plans in it.

WorfBench (Qiao et al., 2024; github.com/zjunlp/WorFBench, ``gold_traj/<split>/graph_eval.json``)
ships a JSON list of records::

    {"source": "os", "id": "os_92", "target": "graph", "category": "eval",
     "conversations": [{"role": "system", "content": <planner instructions>},
                       {"role": "user", "content": <task>},  # function-call domains add the action list
                       {"role": "assistant", "content": "Node:\\n1: ...\\nEdge: (START,1) (1,2) ..."}]}

:func:`load` returns :class:`WorkflowItem` s (the prompt messages, the gold graph parsed from the
assistant turn, and that turn's text for the official reader); :func:`write` writes records in the same shape, so a user with the real split runs
it unchanged and lmforge's generated miniature goes through the same loader. A generated user turn is
``Task: <task>\nThe action list you can take: [<step>, ...]`` (the gold steps and at least four steps of
other activities, shuffled), as WorfBench's function-call domains list their tools. A malformed file is a
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

__all__ = ["SYSTEM_PROMPT", "WorkflowItem", "demonstrations", "generate", "load", "user_turn", "write"]

# WorfBench's planner instruction (paraphrased to the format it asks for).
SYSTEM_PROMPT = (
    "You are a helpful task planner. Plan a sequence of nodes, each a subtask of the task, and "
    "connect them into a graph from START to END by their dependencies. Keep your output in format:\n"
    "Node:\n1: {subtask_1}\n2: {subtask_2}\n...\nEdge: (START,1) ... (n,END)"
)
# WorfBench's user turn in its function-call domains: the task, then the actions the planner may use.
TASK_PREFIX = "Task: "
ACTIONS_PREFIX = "The action list you can take: "
# Whole other activities, at least this many steps in all, join a generated record's action list
# beside its gold steps, so that the list names more actions than the plan needs, as WorfBench's
# tool lists do.
MIN_DISTRACTOR_STEPS = 4


def user_turn(task: str, actions: list[str]) -> str:
    """A WorfBench user turn: ``Task: ...`` and the action list (a JSON list of strings)."""
    return f"{TASK_PREFIX}{task}\n{ACTIONS_PREFIX}{json.dumps(actions, ensure_ascii=False)}"


def task_text(user: str) -> str:
    """The task alone from a user turn written by :func:`user_turn` (any other text unchanged)."""
    if user.startswith(TASK_PREFIX):
        return user[len(TASK_PREFIX):].split("\n", 1)[0]
    return user


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
        """The task text (without the action list), as lmforge's zoo models were trained on it."""
        return task_text(next((m["content"] for m in self.messages if m["role"] == "user"), ""))


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


def _action_list(rec: dict[str, Any], rng: random.Random) -> list[str]:
    """The record's gold steps and the steps of other activities (at least
    :data:`MIN_DISTRACTOR_STEPS`), shuffled."""
    actions = list(dict.fromkeys(rec["nodes"]))
    for kind in rng.sample(sorted(workflow.ACTIVITIES), len(workflow.ACTIVITIES)):
        if len(actions) >= len(set(rec["nodes"])) + MIN_DISTRACTOR_STEPS:
            break
        _, steps, entities = workflow.ACTIVITIES[kind]
        entity = rng.choice(entities)
        new = [st.format(x=entity) for st in steps]
        if any(x in actions for x in new) or kind in rec["task"].lower():
            continue
        actions.extend(new)
    rng.shuffle(actions)
    return actions


def _record(rec: dict[str, Any], rid: str, source: str, rng: random.Random) -> dict[str, Any]:
    return {
        "source": source,
        "id": rid,
        "target": "graph",
        "category": "eval",
        "conversations": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": user_turn(rec["task"], _action_list(rec, rng))},
            {"role": "assistant", "content": workflow.answer(rec)},
        ],
    }


def generate(seed: int, n: int, source: str = "lmforge") -> list[dict[str, Any]]:
    """``n`` generated plans as WorfBench records (the user turn: the task and an action list)."""
    rng = random.Random(seed)
    # The action lists draw from their own stream, so the tasks are those of earlier versions.
    actions_rng = random.Random(f"worfbench-actions:{seed}")
    return [_record(rec, f"{source}_{i}", source, actions_rng) for i, rec in enumerate(workflow.generate(rng, n))]


def demonstrations(seed: int, k: int, exclude: set[str] = frozenset()) -> list[dict[str, str]]:
    """``k`` worked examples as alternating user / assistant turns, generated from a stream of their
    own (so never one of the evaluated records of :func:`generate`) and skipping any task in
    ``exclude``.

    NOTE: WorfBench evaluates zero-shot; this is the ``--shots`` option, off by default."""
    if k < 0:
        raise UserError(f"--shots must be 0 or more, got {k}")
    rng = random.Random(f"worfbench-shots:{seed}")
    out: list[dict[str, str]] = []
    while len(out) < 2 * k:
        rec = workflow.example(rng)
        if rec["task"] in exclude:
            continue
        turns = _record(rec, "shot", "lmforge", rng)["conversations"]
        out += [dict(turns[1]), dict(turns[2])]
    return out


def write(records: list[dict[str, Any]], path: str | Path) -> Path:
    """Write records as a WorfBench JSON list (atomically)."""
    return atomic_write_text(path, json.dumps(records, indent=2, ensure_ascii=False) + "\n")
