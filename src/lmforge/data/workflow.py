"""Multi-step workflow plans as node lists and edges, in the WorfBench format.

A task names 2-4 activities; activities joined by "and" run in parallel, groups joined by
"then" run one after the other. Each activity expands to a fixed chain of steps with the task's
entities filled in, so the gold graph is a deterministic function of the task text. Records::

    {"task": str, "nodes": [str, ...], "edges": [[src, dst], ...]}   # src/dst: "START", "END" or 1-based int

rendered the way WorfBench writes plans::

    Node:
    1: search flights to Rome
    2: book the flight to Rome
    Edge: (START,1) (1,2) (2,END)

Two readers: :func:`parse_plan` (lmforge's: a ``Node`` block of ``i: text`` lines, ``Edge`` lines of
``(a,b)`` pairs with START/END kept as names) and :func:`parse_graph_official`, WorfBench's own
(``node_eval.py``, ``workflow_to_graph_list``), which ``--scoring official`` uses.
"""

from __future__ import annotations

import random
import re
from typing import Any

from lmforge.data.text import PEOPLE, PLACES
from lmforge.data.toolcalls import FOODS, TOPICS

ROOMS = ["kitchen", "garage", "office", "bedroom", "attic"]
BILLS = ["water", "phone", "power", "gas", "internet"]

# activity phrase -> chain of step templates; {x} is the activity's entity.
ACTIVITIES: dict[str, tuple[str, list[str], list[str]]] = {
    "flight": ("book a flight to {x}", ["search flights to {x}", "compare flight prices", "book the flight to {x}"], PLACES),
    "hotel": ("reserve a hotel in {x}", ["search hotels in {x}", "book a hotel room in {x}"], PLACES),
    "cook": ("cook {x}", ["buy ingredients for {x}", "prepare the {x}", "serve the {x}"], FOODS),
    "email": ("email {x}", ["write an email to {x}", "send the email to {x}"], PEOPLE),
    "report": ("write a report on {x}", ["collect data on {x}", "draft the {x} report", "review the {x} report"], TOPICS),
    "clean": ("clean the {x}", ["tidy up the {x}", "vacuum the {x}"], ROOMS),
    "bill": ("pay the {x} bill", ["check the {x} bill", "pay the {x} bill online"], BILLS),
    "weather": ("check the weather in {x}", ["get the forecast for {x}"], PLACES),
    "meet": ("meet {x}", ["call {x} to fix a time", "go to the meeting with {x}"], PEOPLE),
    "shop": ("shop for {x}", ["make a list for {x}", "go to the store", "buy the {x}"], FOODS),
}


def example(rng: random.Random, n_activities: tuple[int, int] = (2, 4)) -> dict[str, Any]:
    """One task with its gold plan graph."""
    k = rng.randint(*n_activities)
    kinds = rng.sample(sorted(ACTIVITIES), k)
    # Split the k activities into sequential groups of parallel activities.
    groups: list[list[tuple[str, str]]] = []
    for kind in kinds:
        entity = rng.choice(ACTIVITIES[kind][2])
        if groups and rng.random() < 0.4:
            groups[-1].append((kind, entity))
        else:
            groups.append([(kind, entity)])
    phrases = [" and ".join(ACTIVITIES[kd][0].format(x=e) for kd, e in g) for g in groups]
    task = ", then ".join(phrases)
    task = task[0].upper() + task[1:] + "."

    nodes: list[str] = []
    edges: list[list[Any]] = []
    prev_ends: list[Any] = ["START"]
    for group in groups:
        ends = []
        for kind, entity in group:
            steps = [s.format(x=entity) for s in ACTIVITIES[kind][1]]
            first = len(nodes) + 1
            nodes.extend(steps)
            for src in prev_ends:
                edges.append([src, first])
            for i in range(first, first + len(steps) - 1):
                edges.append([i, i + 1])
            ends.append(first + len(steps) - 1)
        prev_ends = ends
    for src in prev_ends:
        edges.append([src, "END"])
    return {"task": task, "nodes": nodes, "edges": edges}


def generate(rng: random.Random, n: int) -> list[dict[str, Any]]:
    """``n`` records."""
    return [example(rng) for _ in range(n)]


def prompt(record: dict[str, Any]) -> str:
    return f"Task: {record['task']}\nPlan:\n"


def render_plan(nodes: list[str], edges: list[list[Any]]) -> str:
    """The WorfBench text form of a plan."""
    lines = ["Node:"] + [f"{i}: {n}" for i, n in enumerate(nodes, 1)]
    lines.append("Edge: " + " ".join(f"({a},{b})" for a, b in edges))
    return "\n".join(lines)


def answer(record: dict[str, Any]) -> str:
    return render_plan(record["nodes"], record["edges"])


_NODE_RE = re.compile(r"^\s*(\d+)\s*:\s*(.+?)\s*$")
_EDGE_RE = re.compile(r"\(\s*(START|END|\d+)\s*,\s*(START|END|\d+)\s*\)")


def parse_plan(text: str) -> tuple[list[str], list[list[Any]]]:
    """Parse WorfBench text into (nodes, edges); unparseable lines are skipped."""
    nodes: list[str] = []
    edges: list[list[Any]] = []
    in_nodes = False
    for line in text.splitlines():
        if line.strip().startswith("Node"):
            in_nodes = True
            continue
        if line.strip().startswith("Edge"):
            in_nodes = False
            for a, b in _EDGE_RE.findall(line):
                edges.append([a if not a.isdigit() else int(a), b if not b.isdigit() else int(b)])
            continue
        if in_nodes:
            m = _NODE_RE.match(line)
            if m:
                nodes.append(m.group(2))
    return nodes, edges


# WorfBench's reader (zjunlp/WorFBench ``node_eval.py``, ``workflow_to_graph_list``): a node is any
# "<digits>: " or "<digits>. " followed by text, anywhere in the response (not only under "Node:");
# an edge is any "(a,b)" whose a is a number or START and whose b is a number or END.
_OFFICIAL_NODE_RE = re.compile(r"\d+[:.] (.+)")
_OFFICIAL_EDGE_RE = re.compile(r"\(\s*(\d+|START)\s*,\s*(\d+|END)\s*\)")


def parse_graph_official(text: str) -> tuple[list[str], list[tuple[int, int]]] | None:
    """A plan read the way WorfBench's evaluator reads it: ``(nodes, edges)`` with ``nodes`` =
    ``["START", step 1, ..., step n, "END"]`` (a trailing "Finish" step is kept) and ``edges`` index
    pairs into that list (START is 0, END is n + 1, a number is used as written, even when no step
    has it); None when WorfBench gets no graph: the text has no "Node", or no edge parses.
    """
    if "Node" not in text:
        return None
    nodes = ["START"] + [m.strip() for m in _OFFICIAL_NODE_RE.findall(text)] + ["END"]
    end = len(nodes) - 1
    edges = [(0 if a == "START" else int(a), end if b == "END" else int(b))
             for a, b in _OFFICIAL_EDGE_RE.findall(text)]
    return (nodes, edges) if edges else None
