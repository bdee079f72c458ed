"""T-Eval's six tool-use sub-scores (Chen et al., 2024), the tool-use capability of ACBench.

Each function scores one model response the way T-Eval's evaluators do (github.com/open-compass/
T-Eval at 58f2240, read for this module: ``teval/evaluators/*.py``, ``teval/utils/format_load.py``,
``teval/utils/template.py``, ``test.py``), with the official per-item metric names:

* **instruct** (``InstructEvaluator``): ``format_metric`` is 1 when the response parses in the
  requested format, ``args_em_metric`` = (action name equal + gold arguments whose value is equal) /
  (gold arguments + 1). JSON: the *whole* response (after :func:`postprocess`) must load as a
  dict holding the template's thought/action/args keys. String: the template's
  ``thought_start{thought}thought_end action_start{action}action_end args_start{args}args_end``,
  greedy groups, literal parts used as a regular expression unescaped (as ``parse_string`` does);
  the args group goes through ``ast.literal_eval`` (a failure keeps ``format`` at 1 with no args).
* **plan** (``PlanningEvaluator``, ``bertscore_match``): JSON plans are the list between the first
  ``[`` and the last ``]`` whose every step has ``name``/``id``/``args`` (else nothing parses);
  string plans are the response split at newlines and ``". "``, each step naming the API of the
  record's ``API_list`` that occurs first in it. Steps are sorted by id, a trailing ``FinishAction``
  dropped, matched by ``0.75 cos(name) + 0.25 cos(str(args)) > 0.8`` (networkx maximum-weight
  matching, as T-Eval), and the longest increasing run of matched gold positions gives
  ``precision``, ``recall``, ``f1_score``; ``parse_rate`` is 1 when both plans are non-empty.
* **reason / retrieve / understand** (``ReasonRetrieveUnderstandEvaluator``, the v2 protocol):
  ``thought`` is the cosine (clipped at 0) of predicted and gold thoughts; ``name`` is equality
  (JSON) or, for strings, "the gold name occurs in the response and no other ``a.b`` name or
  ``FinishAction`` does"; ``args`` is, for JSON, the share of gold arguments whose ``str`` values
  are equal (divided by ``n + 1e-5`` exactly as T-Eval does), and for strings the response (quotes
  stripped) equal to ``str`` of the gold arguments. ``parse_rate``: JSON responses that load as a
  dict; every string response.
* **review** (``ReviewEvaluator``): string: the first character after the first ``:`` is the option
  letter A-E; JSON: the whole response loads with a boolean ``is_finished``. ``review_quality`` is
  1 for the gold option, ``parse_rate`` 1 when something parsed.

NOTE: T-Eval embeds with all-mpnet-base-v2; the embedder here is pluggable and defaults to
lmforge's deterministic character-trigram embedder (no hub downloads), as for WorfBench.
"""

from __future__ import annotations

import ast
import copy
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import networkx as nx
import numpy as np

from lmforge.eval.metrics import Embedder, trigram_embed

__all__ = [
    "INSTRUCT_JSON_TEMPLATE",
    "INSTRUCT_STRING_TEMPLATE",
    "RRU_KEYS",
    "extract_json",
    "format_load",
    "instruct_score",
    "normalize_plan",
    "parse_plan_json",
    "parse_plan_str",
    "plan_score",
    "postprocess",
    "reason_score",
    "retrieve_score",
    "review_score",
    "rru_load",
    "rru_score",
    "understand_score",
]

# The template T-Eval's instruct records carry for each format (``datum["template"]``).
INSTRUCT_JSON_TEMPLATE = {"thought": "thought", "action": "name", "args": "args"}
INSTRUCT_STRING_TEMPLATE = {
    "thought_start": "Thought:", "thought_end": "\n",
    "action_start": "Action:", "action_end": "\n",
    "args_start": "Action Input:", "args_end": "\n",
}
# Reason/retrieve/understand response keys (T-Eval's ``format_load`` reads exactly these).
RRU_KEYS = {"thought": "thought", "name": "name", "args": "args"}
_SPECIAL_TOKENS = ("<eoa>", "<TOKENS_UNUSED_1>", "<|im_end|>", "\nuser", "\nassistant", "\nUSER", "[INST]", "<|user|>")


def postprocess(text: str) -> str:
    """What T-Eval's ``test.py`` does to a raw generation before scoring (``split_special_tokens``):
    cut at the first end-of-turn marker, strip, and drop a ```` ```json ```` fence."""
    for marker in _SPECIAL_TOKENS:
        text = text.split(marker)[0]
    text = text.strip()
    if text.startswith("```json"):
        text = text[len("```json"):]
    return text.strip("`").strip()


def format_load(raw: Any, start: str = "", end: str = "") -> Any:
    """T-Eval's ``format_load``: a non-string passes through; a string is cut after a ```` ```json ````
    fence, then from the first ``start`` to the last ``end`` (when given; a missing marker cuts the
    way Python slicing with index -1 does, as in T-Eval), and parsed as a Python literal, else as
    JSON, else as JSON with single quotes made double. Raises ValueError when nothing parses."""
    if not isinstance(raw, str):
        return raw
    if "```json" in raw:
        raw = raw[raw.find("```json") + len("```json"):].strip("`")
    if start:
        raw = raw[raw.find(start):]
    if end:
        raw = raw[: raw.rfind(end) + len(end)]
    for parse in (ast.literal_eval, json.loads, lambda s: json.loads(s.replace("'", '"'))):
        try:
            return parse(raw)
        except Exception:  # noqa: BLE001 - T-Eval tries each parser under a bare except
            continue
    raise ValueError("cannot parse the response")


def extract_json(text: Any, start: str = "{", end: str = "}") -> Any:
    """:func:`format_load` between ``start`` and ``end``; None when nothing parses."""
    try:
        return format_load(text, start, end)
    except ValueError:
        return None


def _unit_rows(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    norm = np.linalg.norm(x, axis=-1, keepdims=True)
    return np.divide(x, norm, out=np.zeros_like(x), where=norm > 0)


def _cos_matrix(a: Sequence[str], b: Sequence[str], embed: Embedder) -> np.ndarray:
    """Cosines (clipped at 0) between every text of ``a`` and every text of ``b``.

    Each distinct text is embedded once and every pair read from one table, so equal pairs get
    bit-identical cosines: plans with repeated steps then tie exactly, and the matching breaks the
    tie by insertion order as T-Eval's does (a matrix product can differ in the last bit between
    equal rows, which flips such ties)."""
    uniq = list(dict.fromkeys([*a, *b]))
    pos = {t: i for i, t in enumerate(uniq)}
    e = _unit_rows(embed(uniq))
    table = np.maximum(e @ e.T, 0.0)
    return table[np.ix_([pos[t] for t in a], [pos[t] for t in b])]


# ---------------------------------------------------------------------------------------- instruct


def _parse_instruct_json(text: str, template: Mapping[str, Any]) -> dict[str, Any] | None:
    try:
        data = format_load(text)
        # NOTE: ``"thought": None`` in the template means the response needs no thought key (an
        # lmforge extension for call-only formats); T-Eval's own data always names one.
        thought_key = template.get("thought")
        thought = None if thought_key is None else data[thought_key]
        action = data[template["action"]]
        args = data[template["args"]]
    except Exception:  # noqa: BLE001 - T-Eval: any failure is a format miss
        return None
    return {"thought": thought, "action": action, "args": args if isinstance(args, dict) else {}}


def _parse_instruct_string(text: str, template: Mapping[str, Any]) -> dict[str, Any] | None:
    keys, parts = [], []
    # NOTE: a template whose thought_start is None asks for no thought (lmforge extension).
    if template.get("thought_start") is not None:
        keys.append("thought")
        parts.append((template["thought_start"], template.get("thought_end") or ""))
    keys += ["action", "args"]
    parts += [(template["action_start"], template["action_end"]), (template["args_start"], template["args_end"])]
    pattern = "".join(f"{a}(.*){b}" for a, b in parts)
    try:
        found = re.findall(pattern, text, re.S)
    except re.error:
        # NOTE: T-Eval would crash on a template that is not a valid regular expression; we match
        # its literal text instead.
        found = re.findall("".join(f"{re.escape(a)}(.*){re.escape(b)}" for a, b in parts), text, re.S)
    if not found:
        return None
    res = dict(zip(keys, found[0]))
    res.setdefault("thought", None)
    try:
        args = ast.literal_eval(res["args"].strip())
    except Exception:  # noqa: BLE001 - T-Eval keeps the parse with empty args
        return {"thought": res["thought"], "action": res["action"].strip(), "args": {}}
    return {"thought": res["thought"], "action": res["action"].strip(), "args": args if isinstance(args, dict) else {}}


def instruct_score(
    response: str, gold_action: Any, gold_args: Mapping[str, Any], fmt: str = "json",
    template: Mapping[str, Any] | None = None,
) -> dict[str, float]:
    """``{"format_metric": 0|1, "args_em_metric": ...}`` of one instruct-following response.

    ``fmt`` is the record's ``response_format``: ``"json"``, anything else is the string format
    (T-Eval's files say ``"string"``)."""
    if fmt == "json":
        pred = _parse_instruct_json(response, template or INSTRUCT_JSON_TEMPLATE)
    else:
        pred = _parse_instruct_string(response, template or INSTRUCT_STRING_TEMPLATE)
    if pred is None:
        return {"format_metric": 0.0, "args_em_metric": 0.0}
    hits = float(pred["action"] == gold_action)
    hits += sum(1.0 for k, v in gold_args.items() if pred["args"].get(k, "") == v)
    return {"format_metric": 1.0, "args_em_metric": hits / (len(gold_args) + 1)}


# -------------------------------------------------------------------------------------------- plan


def normalize_plan(data: Any) -> list[dict[str, Any]]:
    """T-Eval's plan loader: the list between ``[`` and ``]`` (or a list as is) with every step
    reduced to ``{"name": str, "id": int, "args": str}``; ``[]`` when anything is missing."""
    try:
        plan = format_load(data, "[", "]")
    except ValueError:
        return []
    if type(plan) is not list:
        return []
    out = []
    for step in plan:
        try:
            out.append({"name": str(step["name"]), "id": int(step["id"]), "args": str(step["args"])})
        except Exception:  # noqa: BLE001 - T-Eval drops the whole plan
            return []
    return out


def parse_plan_json(response: str) -> list[dict[str, Any]]:
    return normalize_plan(response)


def parse_plan_str(response: str, api_list: Sequence[str]) -> list[dict[str, Any]]:
    """T-Eval's string plan: one step per line (``". "`` also ends a step) naming the API of
    ``api_list`` that occurs earliest in it (ties: the first listed); the step text is its args."""
    steps = []
    for line in response.replace(". ", "\n").split("\n"):
        best, at = "", None
        for api in api_list:
            pos = line.find(api)
            if pos != -1 and (at is None or pos < at):
                best, at = api, pos
        if best:
            steps.append({"id": len(steps), "name": best, "args": line})
    return steps


def plan_score(
    pred_plan: Sequence[Mapping[str, Any]], gold_plan: Sequence[Mapping[str, Any]], *,
    embed: Embedder = trigram_embed, name_weight: float = 0.75, args_weight: float = 0.25,
    threshold: float = 0.8,
) -> dict[str, float]:
    """``precision``/``recall``/``f1_score``/``parse_rate`` of a predicted plan against the gold one
    (both lists of ``{"id", "name", "args"}`` steps; a missing id counts as the step's position).

    NOTE (faithful to T-Eval): the longest-increasing-run count starts at 1 for every predicted
    step, matched or not, so a non-empty plan with no matched step still scores P = 1/|pred|,
    R = 1/|gold|. Where T-Eval raises (a plan that is only ``FinishAction``), we score 0. Exact
    ties between matchings (repeated identical steps) go to the order-preserving one.
    """
    zero = {"precision": 0.0, "recall": 0.0, "f1_score": 0.0}
    if not pred_plan or not gold_plan:
        return {**zero, "parse_rate": 0.0}

    def ordered(plan: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        steps = sorted(
            [dict(copy.deepcopy(s), _i=i) for i, s in enumerate(plan)],
            key=lambda s: s["_i"] if s.get("id") is None else s["id"],
        )
        return steps[:-1] if steps[-1].get("name") == "FinishAction" else steps

    pred, gold = ordered(pred_plan), ordered(gold_plan)
    if not pred or not gold:
        return {**zero, "parse_rate": 1.0}
    names = _cos_matrix([str(s.get("name", "")) for s in pred], [str(s.get("name", "")) for s in gold], embed)
    args = _cos_matrix([str(s.get("args", "")) for s in pred], [str(s.get("args", "")) for s in gold], embed)
    sim = name_weight * names + args_weight * args
    graph = nx.Graph()
    for i in range(len(pred)):
        for j in range(len(gold)):
            if sim[i, j] > threshold:
                # NOTE: repeated identical steps tie exactly; T-Eval's pick between such equal
                # matchings rests on float rounding in its cosine matrix, so we break ties towards
                # the order-preserving pairing (the non-crossing one has the smaller sum of |i - j|).
                graph.add_edge(i, str(j), weight=float(sim[i, j]) - 1e-9 * abs(i - j))
    match = [-1] * len(pred)
    for a, b in nx.max_weight_matching(graph):
        i, j = (a, b) if isinstance(a, int) else (b, a)
        match[i] = int(j)
    run = [1] * len(pred)  # T-Eval's dp starts every step at 1 (see the NOTE above)
    for i in range(len(pred)):
        for j in range(i):
            if match[i] != -1 and match[j] != -1 and match[i] > match[j]:
                run[i] = max(run[i], run[j] + 1)
    correct = max(run)
    p, r = correct / len(pred), correct / len(gold)
    return {"precision": p, "recall": r, "f1_score": 2 * p * r / (p + r), "parse_rate": 1.0}


# ------------------------------------------------------------------- reason / retrieve / understand


def rru_load(data: Any, fmt: str, keys: Mapping[str, str | None] | None = None) -> dict[str, Any]:
    """T-Eval's reason/retrieve/understand loader: the dict between ``{`` and ``}`` as
    ``{"thought": str, "name": str, "args": dict (JSON) | str (string format)}``, a missing key
    read as ``""`` (``{}`` for JSON args); ``{}`` when no dict parses.

    ``keys`` maps T-Eval's key names to the ones the response uses (None: the response has none).
    NOTE: an lmforge extension (``meta_data["response_keys"]``) for call formats such as
    ``{"name", "arguments"}``; T-Eval's data always uses thought/name/args, the default.
    """
    obj = extract_json(data, "{", "}")
    if type(obj) is not dict:
        return {}
    k = {**RRU_KEYS, **(keys or {})}

    def get(name: str) -> Any:
        if k[name] is None or k[name] not in obj:
            raise KeyError(name)
        return obj[k[name]]

    out: dict[str, Any] = {}
    for name in ("thought", "name"):
        try:
            out[name] = str(get(name))
        except Exception:  # noqa: BLE001
            out[name] = ""
    try:
        args = get("args")
        out["args"] = (args if isinstance(args, dict) else {}) if fmt == "json" else str(args)
    except Exception:  # noqa: BLE001
        out["args"] = {} if fmt == "json" else ""
    return out


def reason_score(pred_thought: str, gold_thought: str, *, embed: Embedder = trigram_embed) -> float:
    """The cosine (clipped at 0) of a predicted and the gold thought."""
    return float(_cos_matrix([str(pred_thought)], [str(gold_thought)], embed)[0, 0])


def retrieve_score(pred: str, gold_name: str, fmt: str = "json") -> float:
    """JSON: ``pred`` is the predicted tool name, equal to the gold one. String: ``pred`` is the
    whole response, which must contain the gold name and no other ``a.b`` name or ``FinishAction``."""
    if fmt == "json":
        return float(pred == gold_name)
    if gold_name not in pred:
        return 0.0
    others = re.findall(r"\w+\.\w+", pred) + re.findall(r"FinishAction", pred)
    return float(all(name == gold_name for name in others))


def understand_score(pred_args: Any, gold_args: Any) -> float:
    """T-Eval v2's argument score. Gold dict (JSON format): the gold arguments whose ``str`` value
    the prediction repeats, over ``len(gold) + 1e-5`` (T-Eval's constant, so a perfect call scores
    just under 1); no gold arguments: 1 iff none predicted. Gold string: the prediction with quotes
    stripped equals it."""
    if isinstance(gold_args, dict):
        pred = pred_args if isinstance(pred_args, dict) else {}
        if not gold_args:
            return float(not pred)
        hits = sum(1 for k, v in gold_args.items() if k in pred and str(pred[k]) == str(v))
        return hits / (len(gold_args) + 1e-5)
    return float(str(pred_args).strip("'").strip('"') == gold_args)


def rru_score(
    response: str, ground_truth: Any, fmt: str, kind: str, *, embed: Embedder = trigram_embed,
    response_keys: Mapping[str, str | None] | None = None,
) -> dict[str, float]:
    """One reason/retrieve/understand item, with T-Eval's metric keys: JSON records score all of
    ``thought``, ``name``, ``args``, ``parse_rate``; string records the ``kind``'s own metric
    (reason: ``thought``, retrieve: ``name``, understand: ``args``) and ``parse_rate``."""
    if kind not in ("reason", "retrieve", "understand"):
        raise ValueError(f"kind must be reason, retrieve or understand, got {kind!r}")
    gold = rru_load(ground_truth, fmt)
    if fmt == "json":
        keys = ("thought", "name", "args", "parse_rate")
        pred = rru_load(response, fmt, response_keys)
        if not pred or not gold:
            pred = {}
    else:
        metric = {"reason": "thought", "retrieve": "name", "understand": "args"}[kind]
        keys = (metric, "parse_rate")
        pred = {metric: response}
    out = dict.fromkeys(keys, 0.0)
    out["parse_rate"] = float(bool(pred))
    if "thought" in pred and "thought" in gold:
        out["thought"] = reason_score(pred["thought"], gold["thought"], embed=embed)
    if "name" in pred and "name" in gold:
        out["name"] = retrieve_score(pred["name"], gold["name"], fmt)
    if "args" in pred and "args" in gold:
        out["args"] = understand_score(pred["args"], gold["args"])
    return out


# ------------------------------------------------------------------------------------------ review


def review_score(response: str, gold: Any, fmt: str = "str") -> dict[str, float]:
    """``{"review_quality", "parse_rate"}`` of a review response against the gold answer (an option
    letter A-E for the string format; for JSON T-Eval compares ``{"review": is_finished}`` with it).

    NOTE: T-Eval compares that dict with the gold answer as is, so a boolean gold could never match;
    we also accept ``is_finished == gold`` for a boolean gold (T-Eval only runs the string format).
    """
    pred: Any
    if fmt == "json":
        try:
            value = format_load(response)["is_finished"]
            pred = {"review": value} if value in [True, False] else None
        except Exception:  # noqa: BLE001
            pred = None
    else:
        tail = response[response.find(":") + 1:].strip()
        pred = tail[0] if tail and tail[0] in "ABCDE" else None
    if pred is None:
        return {"review_quality": 0.0, "parse_rate": 0.0}
    hit = pred == gold or (isinstance(gold, bool) and isinstance(pred, dict) and pred["review"] == gold)
    return {"review_quality": float(hit), "parse_rate": 1.0}
