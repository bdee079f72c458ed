"""T-Eval's six tool-use sub-scores (Chen et al., 2024), the tool-use capability of ACBench.

Each function scores one model response against its ground truth the way T-Eval's evaluators do
(github.com/open-compass/T-Eval, ``teval/evaluators/*.py``, read for this module):

* **instruct** (``InstructEvaluator``): the response must parse in the requested format (``json``: a
  JSON object with the template's thought/action/args keys; ``string``: the template's
  ``thought_start ... thought_end action_start ... action_end args_start ... args_end`` pattern);
  ``format`` is 1 if it does, and ``args_em`` = (action name matches + number of gold arguments whose
  value matches) / (number of gold arguments + 1).
* **plan** (``PlanningEvaluator.bertscore_match``): predicted and gold action lists (a trailing
  ``FinishAction`` dropped) are matched one-to-one by ``0.75 * cos(name) + 0.25 * cos(args)`` above
  0.8 (maximum-weight matching); the longest increasing subsequence of matched gold positions in
  predicted order gives P = LIS/|pred|, R = LIS/|gold|, F1.
* **reason**: the cosine (clipped at 0) between predicted and gold thoughts.
* **retrieve**: json: the tool name equals the gold name; string: the gold name occurs in the
  response and no other ``a.b``-style name or ``FinishAction`` does.
* **understand**: the cosine (clipped at 0) between the string forms of predicted and gold arguments.
* **review**: json: ``is_finished`` equals the gold boolean; string: the first character after the
  first ``:`` is the gold option letter (A-E).

NOTE: T-Eval embeds with all-mpnet-base-v2; the embedder here is pluggable and defaults to
lmforge's deterministic character-trigram embedder (no hub downloads), as for WorfBench.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from lmforge.eval.metrics import Embedder, lis_length, trigram_embed

__all__ = [
    "extract_json",
    "instruct_score",
    "plan_score",
    "reason_score",
    "retrieve_score",
    "review_score",
    "understand_score",
]

JSON_TEMPLATE = {"thought": "thought", "action": "name", "args": "args"}
STRING_TEMPLATE = {
    "thought_start": "Thought:", "thought_end": "\n",
    "action_start": "Action:", "action_end": "\n",
    "args_start": "Action Input:", "args_end": "\n",
}


def extract_json(text: str, start: str = "{", end: str = "}") -> Any:
    """The JSON value between the first ``start`` and the last ``end`` of ``text`` (T-Eval's
    ``format_load``), also accepting Python literals; None when nothing parses."""
    i, j = text.find(start), text.rfind(end)
    if i < 0 or j < i:
        return None
    chunk = text[i : j + 1]
    for parse in (json.loads, ast.literal_eval):
        try:
            return parse(chunk)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    return None


def _cos(a: str, b: str, embed: Embedder) -> float:
    e = embed([a, b])
    return float(max(0.0, float(e[0] @ e[1])))


def _parse_string_format(text: str, template: dict[str, str]) -> dict[str, Any] | None:
    pattern = (
        re.escape(template["thought_start"]) + r"(?P<thought>.*?)" + re.escape(template["thought_end"])
        + r"\s*" + re.escape(template["action_start"]) + r"(?P<action>.*?)" + re.escape(template["action_end"])
        + r"\s*" + re.escape(template["args_start"]) + r"(?P<args>.*?)(?:" + re.escape(template["args_end"]) + r"|$)"
    )
    m = re.search(pattern, text, flags=re.S)
    if m is None:
        return None
    try:
        args = ast.literal_eval(m["args"].strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        args = {}
    return {"thought": m["thought"], "action": m["action"].strip(), "args": args if isinstance(args, dict) else {}}


def instruct_score(
    response: str, gold_action: str, gold_args: dict[str, Any], fmt: str = "json",
    template: dict[str, str] | None = None,
) -> dict[str, float]:
    """``{"format": 0|1, "args_em": ...}`` of one instruct-following response."""
    if fmt == "json":
        tpl = template or JSON_TEMPLATE
        data = extract_json(response)
        try:
            pred = {"action": data[tpl["action"]], "args": data[tpl["args"]], "thought": data[tpl["thought"]]}
        except (TypeError, KeyError):
            pred = None
        if pred is not None and not isinstance(pred["args"], dict):
            pred["args"] = {}
    elif fmt == "string":
        pred = _parse_string_format(response, template or STRING_TEMPLATE)
    else:
        raise ValueError(f"fmt must be 'json' or 'string', got {fmt!r}")
    if pred is None:
        return {"format": 0.0, "args_em": 0.0}
    hits = float(pred["action"] == gold_action)
    hits += sum(1.0 for k, v in gold_args.items() if pred["args"].get(k, "") == v)
    return {"format": 1.0, "args_em": hits / (len(gold_args) + 1)}


def plan_score(
    pred_plan: Sequence[dict[str, Any]], gold_plan: Sequence[dict[str, Any]], *, embed: Embedder = trigram_embed,
    name_weight: float = 0.75, args_weight: float = 0.25, threshold: float = 0.8,
) -> dict[str, float]:
    """LIS precision/recall/F1 of a predicted plan (``[{"name", "args"}, ...]`` in order)."""
    def trim(plan: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        plan = list(plan)
        return plan[:-1] if plan and plan[-1].get("name") == "FinishAction" else plan

    pred, gold = trim(pred_plan), trim(gold_plan)
    if not pred or not gold:
        return {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    from scipy.optimize import linear_sum_assignment

    names = embed([str(p["name"]) for p in pred] + [str(g["name"]) for g in gold])
    args = embed([str(p.get("args", "")) for p in pred] + [str(g.get("args", "")) for g in gold])
    n = len(pred)
    sim = name_weight * np.maximum(names[:n] @ names[n:].T, 0) + args_weight * np.maximum(args[:n] @ args[n:].T, 0)
    weights = np.where(sim > threshold, sim, 0.0)
    rows, cols = linear_sum_assignment(-weights)
    match = {int(r): int(c) for r, c in zip(rows, cols) if weights[r, c] > 0}
    lis = lis_length([match[i] for i in range(n) if i in match])
    p, r = lis / n, lis / len(gold)
    return {"precision": p, "recall": r, "f1": 0.0 if lis == 0 else 2 * p * r / (p + r)}


def reason_score(pred_thought: str, gold_thought: str, *, embed: Embedder = trigram_embed) -> float:
    return _cos(pred_thought, gold_thought, embed)


def retrieve_score(response: str, gold_name: str, fmt: str = "json") -> float:
    if fmt == "json":
        data = extract_json(response)
        return float(isinstance(data, dict) and str(data.get("name", "")) == gold_name)
    if gold_name not in response:
        return 0.0
    others = re.findall(r"\w+\.\w+", response) + re.findall(r"FinishAction", response)
    return float(all(name == gold_name for name in others))


def understand_score(pred_args: Any, gold_args: Any, *, embed: Embedder = trigram_embed) -> float:
    return _cos(str(pred_args), str(gold_args), embed)


def review_score(response: str, gold: Any, fmt: str = "json") -> float:
    if fmt == "json":
        data = extract_json(response)
        value = data.get("is_finished") if isinstance(data, dict) else None
        return float(isinstance(value, bool) and value == gold)
    tail = response[response.find(":") + 1 :].strip()
    return float(bool(tail) and tail[0] in "ABCDE" and tail[0] == gold)
