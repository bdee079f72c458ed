"""T-Eval task files: read the official format, score an item, write lmforge's generated records.

A T-Eval file (github.com/open-compass/T-Eval, ``data/<task>_<fmt>_v2.json``) is one JSON object
mapping record ids to records::

    {"<id>": {"template": <instruct: response key mapping; others "">,
              "meta_data": {"response_format": "json" | "str" | "string"},
              "ground_truth": <per sub-task, below>,
              "origin_prompt": [{"role": "system" | "user" | "assistant", "content": str}, ...]}}

Plan files carry ``"meta": {"prompt_type": "json" | "str", "API_list": [api names]}`` in place of
``meta_data``. Ground truth per sub-task (what T-Eval's evaluators read):

* instruct: ``{"action": name, "args": {arg: value}}`` (``thought`` optional);
* plan: ``[{"id", "prev", "name", "args"}, ..., {"name": "FinishAction", ...}]``;
* reason / retrieve / understand: ``{"thought", "name", "args"}`` (one ``rru`` JSON file serves
  all three; string files one each);
* review: ``{"answer": "A".."E", "thought"}`` (JSON: ``answer`` is the boolean ``is_finished``).

:func:`load` returns :class:`TEvalItem` s, :func:`score` scores a response with T-Eval's per-item
metrics (:func:`primary` names the headline one), :func:`reference` writes a gold response in the
record's own format, and :func:`generate` / :func:`write` build miniature files of the same shape
from :mod:`lmforge.data.toolcalls`, so real data and the miniature go through one loader. The JSON
instruct, retrieve and understand records are rendered exactly as the zoo's tool-call prompt
(``Tools:\\n- name(arg, ...)\\nUser: <query>\\nCall:``) and say through their data that the call
is ``{"name", "arguments"}`` with no thought (instruct ``template``; ``meta_data["response_keys"]``).
A malformed file is a one-line :class:`~lmforge.common.errors.UserError` naming the file and the
JSON line or the record and field.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmforge.common.errors import UserError
from lmforge.common.io import atomic_write_text, parse_json_lines, parse_json_text, read_user_text
from lmforge.data import toolcalls
from lmforge.eval import teval
from lmforge.eval.metrics import Embedder, trigram_embed

__all__ = [
    "FORMATS",
    "KINDS",
    "STRING_TEMPLATE",
    "TEvalItem",
    "ZOO_RESPONSE_KEYS",
    "ZOO_TEMPLATE",
    "generate",
    "load",
    "metrics",
    "primary",
    "reference",
    "render",
    "render_plain",
    "score",
    "write",
]

KINDS = ("instruct", "plan", "reason", "retrieve", "understand", "review")
FORMATS = ("json", "str")
RRU = ("reason", "retrieve", "understand")
_PRIMARY = {
    "instruct": "score", "plan": "f1_score", "reason": "thought", "retrieve": "name",
    "understand": "args", "review": "review_quality",
}
_STRING_TEMPLATE_KEYS = ("thought_start", "thought_end", "action_start", "action_end", "args_start", "args_end")


@dataclass
class TEvalItem:
    """One T-Eval record.

    Attributes:
        id: the record's id.
        kind: the sub-task (:data:`KINDS`).
        fmt: ``"json"`` or ``"str"`` (T-Eval's ``"string"`` is read as ``"str"``).
        messages: the ``origin_prompt`` turns.
        template: instruct's response key mapping (``""`` elsewhere).
        ground_truth: as in the file.
        meta_data: the record's ``meta`` and ``meta_data`` merged (plan's ``API_list`` is here).
    """

    id: str
    kind: str
    fmt: str
    messages: list[dict[str, str]]
    template: Any
    ground_truth: Any
    meta_data: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------ reading


def _records(path: Path) -> list[tuple[str, Any]]:
    """``(id, record)`` pairs from a T-Eval JSON object, a JSON list or JSON lines with ``id``."""
    raw = read_user_text(path, "T-Eval")
    if path.suffix == ".jsonl":
        rows = []
        for i, rec in parse_json_lines(path, raw):
            if not isinstance(rec, dict) or "id" not in rec:
                raise UserError(f"{path}:{i}: a JSON-lines T-Eval record needs an 'id' field")
            rows.append((str(rec["id"]), rec))
        return rows
    data = parse_json_text(path, raw)
    if isinstance(data, dict):
        return [(str(k), v) for k, v in data.items()]
    if isinstance(data, list):
        rows = []
        for i, rec in enumerate(data):
            if not isinstance(rec, dict) or "id" not in rec:
                raise UserError(f"{path}: record {i} of the list has no 'id' field")
            rows.append((str(rec["id"]), rec))
        return rows
    raise UserError(f"{path}: expected a JSON object mapping ids to T-Eval records")


def _format_of(rec: Mapping[str, Any], default: str | None) -> str | None:
    for holder, key in (("meta_data", "response_format"), ("meta", "prompt_type")):
        value = rec.get(holder)
        if isinstance(value, dict) and value.get(key) is not None:
            return value[key]
    return default


def _check(kind: str, fmt: str, rec: Mapping[str, Any], meta: Mapping[str, Any], where: str) -> None:
    """Raise a UserError when a record lacks what its sub-task's scorer reads."""
    gt, tpl = rec["ground_truth"], rec.get("template")
    if kind == "instruct":
        if not isinstance(gt, dict) or "action" not in gt or not isinstance(gt.get("args"), dict):
            raise UserError(f"{where}: instruct 'ground_truth' needs 'action' and an 'args' object")
        needed = ("thought", "action", "args") if fmt == "json" else _STRING_TEMPLATE_KEYS
        if not isinstance(tpl, dict):
            raise UserError(f"{where}: missing field 'template' (an object with keys {', '.join(needed)})")
        missing = [k for k in needed if k not in tpl]
        if missing:
            raise UserError(f"{where}: 'template' has no key {missing[0]!r}")
    elif kind == "plan":
        if not isinstance(gt, list) or not teval.normalize_plan(gt):
            raise UserError(f"{where}: plan 'ground_truth' must be a list of steps with 'id', 'name' and 'args'")
        if fmt == "str":
            api = meta.get("API_list")
            if not isinstance(api, list) or not all(isinstance(a, str) for a in api):
                raise UserError(f"{where}: a string plan record needs 'meta': {{'API_list': [api names]}}")
    elif kind in RRU:
        if not teval.rru_load(gt, fmt):
            raise UserError(f"{where}: {kind} 'ground_truth' must be an object with 'thought', 'name' and 'args'")
        own = {"reason": "thought", "retrieve": "name", "understand": "args"}[kind]
        if isinstance(gt, dict) and own not in gt:
            raise UserError(f"{where}: {kind} 'ground_truth' has no {own!r}")
        keys = meta.get("response_keys")
        if keys is not None and (not isinstance(keys, dict) or not set(keys) <= set(teval.RRU_KEYS)):
            raise UserError(f"{where}: 'meta_data.response_keys' must map some of thought/name/args to keys")
    elif kind == "review":
        if not isinstance(gt, dict) or "answer" not in gt:
            raise UserError(f"{where}: review 'ground_truth' needs an 'answer'")


def load(path: str | Path, kind: str, fmt: str | None = None) -> list[TEvalItem]:
    """Read a T-Eval file of sub-task ``kind`` into validated items.

    ``fmt`` is the format for records that name none (T-Eval's ``--prompt_type``); a record's own
    ``meta_data.response_format`` (or plan's ``meta.prompt_type``) wins.
    """
    if kind not in KINDS:
        raise UserError(f"unknown T-Eval sub-task {kind!r}; expected one of {', '.join(KINDS)}")
    path = Path(path)
    items = []
    for rid, rec in _records(path):
        where = f"{path}: record {rid!r}"
        if not isinstance(rec, dict):
            raise UserError(f"{where}: not a JSON object")
        for name in ("origin_prompt", "ground_truth"):
            if name not in rec:
                raise UserError(f"{where}: missing field {name!r}")
        turns = rec["origin_prompt"]
        if isinstance(turns, str):  # some T-Eval dumps store the prompt as a JSON string
            try:
                turns = json.loads(turns)
            except json.JSONDecodeError:
                turns = None
        if not isinstance(turns, list) or not all(
            isinstance(t, dict) and isinstance(t.get("role"), str) and isinstance(t.get("content"), str) for t in turns
        ):
            raise UserError(f"{where}: 'origin_prompt' must be a list of {{'role', 'content'}} messages")
        raw_fmt = _format_of(rec, fmt)
        if raw_fmt is None:
            raise UserError(f"{where}: missing field 'meta_data.response_format'")
        item_fmt = {"json": "json", "str": "str", "string": "str"}.get(str(raw_fmt))
        if item_fmt is None:
            raise UserError(f"{where}: unknown response format {raw_fmt!r} (expected json, str or string)")
        for name in ("meta", "meta_data"):
            if not isinstance(rec.get(name) or {}, dict):
                raise UserError(f"{where}: {name!r} must be an object")
        meta = {**(rec.get("meta") or {}), **(rec.get("meta_data") or {})}
        _check(kind, item_fmt, rec, meta, where)
        items.append(TEvalItem(
            id=rid, kind=kind, fmt=item_fmt,
            messages=[{"role": t["role"], "content": t["content"]} for t in turns],
            template=rec.get("template", ""), ground_truth=rec["ground_truth"], meta_data=meta,
        ))
    if not items:
        raise UserError(f"{path}: no T-Eval records")
    return items


# ------------------------------------------------------------------------------------------ scoring


def primary(kind: str) -> str:
    """The headline metric of a sub-task, a key of :func:`score`'s result: instruct ``score`` (the
    mean of ``format_metric`` and ``args_em_metric``, as T-Eval's ``convert_results.py`` combines
    them per format), plan ``f1_score``, reason ``thought``, retrieve ``name``, understand ``args``,
    review ``review_quality``."""
    if kind not in _PRIMARY:
        raise ValueError(f"unknown T-Eval sub-task {kind!r}")
    return _PRIMARY[kind]


def metrics(kind: str, fmt: str) -> tuple[str, ...]:
    """The keys :func:`score` returns for a sub-task and format."""
    if kind == "instruct":
        return ("format_metric", "args_em_metric", "score")
    if kind == "plan":
        return ("precision", "recall", "f1_score", "parse_rate")
    if kind in RRU:
        return ("thought", "name", "args", "parse_rate") if fmt == "json" else (_PRIMARY[kind], "parse_rate")
    if kind == "review":
        return ("review_quality", "parse_rate")
    raise ValueError(f"unknown T-Eval sub-task {kind!r}")


def score(
    item: TEvalItem, response: str, *, embed: Embedder = trigram_embed, clean: bool = True,
) -> dict[str, float]:
    """T-Eval's per-item metrics of ``response`` (see :func:`metrics`); averaged over a file they
    are T-Eval's reported numbers. ``clean`` first applies :func:`lmforge.eval.teval.postprocess`
    (what T-Eval's ``test.py`` does to every generation)."""
    text = teval.postprocess(response) if clean else response
    gt = item.ground_truth
    if item.kind == "instruct":
        fmt = "json" if item.fmt == "json" else "string"
        out = teval.instruct_score(text, gt["action"], gt["args"], fmt=fmt, template=item.template)
        out["score"] = (out["format_metric"] + out["args_em_metric"]) / 2
        return out
    if item.kind == "plan":
        if item.fmt == "json":
            pred = teval.parse_plan_json(text)
        else:
            pred = teval.parse_plan_str(text, item.meta_data.get("API_list", []))
        return teval.plan_score(pred, teval.normalize_plan(gt), embed=embed)
    if item.kind in RRU:
        return teval.rru_score(text, gt, item.fmt, item.kind, embed=embed,
                               response_keys=item.meta_data.get("response_keys"))
    if item.kind == "review":
        return teval.review_score(text, gt["answer"], item.fmt)
    raise ValueError(f"unknown T-Eval sub-task {item.kind!r}")


# ------------------------------------------------------------------------------------------ prompts


def render_plain(messages: Sequence[Mapping[str, str]]) -> str:
    """The messages' contents joined by newlines (for tokenizers without a chat template)."""
    return "\n".join(m["content"] for m in messages)


def render(tokenizer: Any, messages: Sequence[Mapping[str, str]]) -> str:
    """The prompt text: the tokenizer's chat template with the generation prompt when it has one,
    else :func:`render_plain`."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
    return render_plain(messages)


def _compact(obj: Any) -> str:
    return json.dumps(obj, separators=(", ", ": "), ensure_ascii=False)


def reference(item: TEvalItem) -> str:
    """A gold response in the record's own format (for teacher-forced NLL).

    It starts with a space when the prompt's last message ends with ``:`` (the completion continues
    that line, as after the zoo's ``Call:``); a JSON call is one line of ``json.dumps`` with
    ``", "``/``": "`` separators, so the zoo's instruct record gives exactly ``toolcalls.answer``.
    """
    gt, kind, fmt = item.ground_truth, item.kind, item.fmt
    if kind == "instruct":
        tpl = item.template
        if fmt == "json":
            call = {} if tpl.get("thought") is None else {tpl["thought"]: gt.get("thought", "")}
            call[tpl["action"]] = gt["action"]
            call[tpl["args"]] = gt["args"]
            text = _compact(call)
        else:
            thought = "" if tpl.get("thought_start") is None else \
                f"{tpl['thought_start']} {gt.get('thought', '')}{tpl.get('thought_end') or ''}"
            text = (f"{thought}{tpl['action_start']} {gt['action']}{tpl['action_end']}"
                    f"{tpl['args_start']} {gt['args']!r}{tpl['args_end']}")
    elif kind == "plan":
        steps = teval.normalize_plan(gt)
        if fmt == "json":
            text = json.dumps([{"id": s["id"], "name": s["name"], "args": s["args"]} for s in steps],
                              ensure_ascii=False)
        else:
            text = "\n".join(f"Use {s['name']} to run it with {s['args']}"
                              for s in steps if s["name"] != "FinishAction")
    elif kind in RRU:
        gold = gt if isinstance(gt, dict) else teval.rru_load(gt, "json")
        if fmt == "json":
            keys = {**teval.RRU_KEYS, **(item.meta_data.get("response_keys") or {})}
            text = _compact({keys[k]: gold.get(k, "" if k != "args" else {}) for k in ("thought", "name", "args")
                             if keys[k] is not None})
        else:
            text = str({"reason": gold.get("thought", ""), "retrieve": gold.get("name", ""),
                        "understand": gold.get("args", "")}[kind])
    elif kind == "review":
        answer = gt["answer"]
        if fmt == "json":
            if isinstance(answer, dict):
                finished = answer.get("review")
            else:
                finished = answer if isinstance(answer, bool) else answer == "A"
            text = _compact({"thought": gt.get("thought", ""), "is_finished": bool(finished)})
        else:
            text = f"Answer: {answer}"
    else:
        raise ValueError(f"unknown T-Eval sub-task {kind!r}")
    last = item.messages[-1]["content"] if item.messages else ""
    return (" " + text) if last.endswith(":") else text


# --------------------------------------------------------------------------------------- generation

_API_HEADER = "You have access to the following APIs:\n"
_PROMPTS = {
    ("instruct", "str"): (
        "Answer with the next API call in exactly this format:\n"
        "Thought: <why this call>\nAction: <the API name>\nAction Input: <the arguments as a Python dict on one line>"
    ),
    ("plan", "json"): (
        "Plan the whole task as a JSON list of actions, each {\"id\": number, \"name\": API name, "
        "\"args\": \"{'arg': 'value'}\"} (the args a dict written as a string), in the order they run, "
        "ending with {\"id\": number, \"name\": \"FinishAction\", \"args\": \"{}\"}. Output only the list."
    ),
    ("plan", "str"): (
        "Give the whole plan with the APIs above and no other words, one step per line, each step "
        "calling one API in the form: Use [API name] to [goal]."
    ),
    ("reason", "json"): (
        "Answer with one JSON object {\"thought\": your reasoning about the next step, "
        "\"name\": the API to call, \"args\": its arguments}."
    ),
    ("reason", "str"): "Think about the next step before calling an API. Answer with that thought in one sentence.",
    ("retrieve", "str"): "Which API should be called next? Answer with its name only.",
    ("understand", "str"): "Answer with the arguments of the next call as a Python dict on one line.",
}
_REVIEW_INTRO = (
    "You see a tool call and what the tool returned, as:\nGoal: <what the call should achieve>\n"
    "Name: <the tool>\nArgs: <its arguments>\nResponse: <what the tool returned>\n"
    "Judge whether the goal was achieved."
)
_REVIEW_OPTIONS = (
    "Choose one option:\nA: Success -- the goal is achieved.\n"
    "B: Internal error -- the tool failed or could not be reached.\n"
    "C: Input error -- the tool or its arguments do not fit the task.\n"
    "D: Irrelevant response -- the output does not match what the tool should return.\n"
    "E: Unable to accomplish -- the response is empty or says the task is impossible.\n"
    "Answer in the format:\nAnswer: <one letter from A to E>"
)
_REVIEW_JSON = (
    "Answer with one JSON object {\"thought\": your judgement, \"is_finished\": true or false}, "
    "is_finished true only when the goal is achieved."
)
_REVIEW_THOUGHTS = {
    "A": "The tool returned the requested result, so the goal is achieved.",
    "B": "The call failed with a connection error inside the tool, an internal error.",
    "C": "The arguments do not fit the tool's parameters, so the call was rejected.",
    "D": "The response belongs to a different request and does not answer the goal.",
    "E": "The tool returned nothing, so the goal cannot be accomplished.",
}
STRING_TEMPLATE = {
    "thought_start": "Thought:", "thought_end": "\n",
    "action_start": "Action:", "action_end": "\n",
    # NOTE: T-Eval's own string templates end each field with a line end; lmforge's ends the args
    # at the end of the response, since T-Eval strips every generation (a final "\n" never survives).
    "args_start": "Action Input:", "args_end": "",
}
# The zoo's call format as T-Eval response keys: {"name", "arguments"} and no thought.
ZOO_TEMPLATE = {"thought": None, "action": "name", "args": "arguments"}
ZOO_RESPONSE_KEYS = {"thought": None, "name": "name", "args": "arguments"}


def _apis(tools: Sequence[Mapping[str, Any]]) -> str:
    return _API_HEADER + "\n".join(_compact(t) for t in tools)


def _zoo_messages(rec: Mapping[str, Any]) -> list[dict[str, str]]:
    """The zoo prompt as two turns whose contents, joined by a newline, are ``toolcalls.prompt``."""
    return [
        {"role": "system", "content": f"Tools:\n{toolcalls.render_tools(rec['tools'])}"},
        {"role": "user", "content": f"User: {rec['query']}\nCall:"},
    ]


def _thought(name: str, args: Mapping[str, Any]) -> str:
    return f"I should call {name} with " + " and ".join(f"the {k} {v}" for k, v in args.items()) + "."


def _single(kind: str, fmt: str, rng: random.Random) -> dict[str, Any]:
    rec = toolcalls.example(rng)
    call = rec["answers"][0]
    name, args = call["name"], call["arguments"]
    asked = [{"role": "system", "content": f"{_apis(rec['tools'])}\n{_PROMPTS.get((kind, fmt), '')}".rstrip()},
             {"role": "user", "content": rec["query"]}]
    if kind == "instruct":
        if fmt == "json":
            return {"template": dict(ZOO_TEMPLATE), "meta_data": {"response_format": "json"},
                    "ground_truth": {"action": name, "args": args}, "origin_prompt": _zoo_messages(rec)}
        return {"template": dict(STRING_TEMPLATE), "meta_data": {"response_format": "string"},
                "ground_truth": {"thought": _thought(name, args), "action": name, "args": args},
                "origin_prompt": asked}
    gold = {"thought": _thought(name, args), "name": name, "args": args}
    meta: dict[str, Any] = {"response_format": fmt}
    if fmt == "json" and kind in ("retrieve", "understand"):
        meta["response_keys"] = dict(ZOO_RESPONSE_KEYS)
        prompt = _zoo_messages(rec)
    else:
        prompt = asked
        if kind == "understand":
            prompt[-1] = {"role": "user", "content": f"{rec['query']}\nThe next call is {name}."}
    return {"template": "", "meta_data": meta, "ground_truth": gold, "origin_prompt": prompt}


def _plan(fmt: str, rng: random.Random) -> dict[str, Any]:
    k = rng.choice([2, 3])
    targets = rng.sample(toolcalls.TOOLS, k)
    others = [t for t in toolcalls.TOOLS if t not in targets]
    offered = targets + rng.sample(others, rng.randint(0, 5 - k))
    rng.shuffle(offered)
    steps, pieces = [], []
    for i, tool in enumerate(targets):
        args = tool.sample(rng)
        pieces.append(rng.choice(tool.templates).format(**args))
        steps.append({"id": i, "prev": [i - 1] if i else [], "name": tool.name, "args": args})
    steps.append({"id": k, "prev": [k - 1], "name": "FinishAction", "args": {}})
    tools = [t.schema() for t in offered]
    return {
        "meta": {"prompt_type": fmt, "API_list": [t.name for t in offered]},
        "ground_truth": steps,
        "origin_prompt": [{"role": "system", "content": f"{_apis(tools)}\n{_PROMPTS[('plan', fmt)]}"},
                          {"role": "user", "content": " Then ".join(pieces)}],
    }


def _review(fmt: str, rng: random.Random) -> dict[str, Any]:
    rec = toolcalls.example(rng)
    call = rec["answers"][0]
    name, args = call["name"], dict(call["arguments"])
    label = rng.choice("ABCDE")
    if label == "A":
        response = str({"status": 200, "result": {**args, "done": True}})
    elif label == "B":
        response = (f"HTTPSConnectionPool(host='api.{name}.example', port=443): Max retries exceeded with url: "
                    f"/{name} (Caused by NewConnectionError('Failed to establish a new connection: "
                    f"[Errno 111] Connection refused'))")
    elif label == "C":
        key = list(args)[-1]
        if len(args) > 1:
            del args[key]
            response = str({"error": f"missing required argument '{key}'"})
        else:
            args = {f"{key}_value": args[key]}
            response = str({"error": f"unexpected argument '{key}_value'"})
    elif label == "D":
        other = rng.choice([t for t in toolcalls.TOOLS if t.name != name])
        response = str({"result": other.sample(rng)})
    else:
        response = "{}"
    system = f"{_REVIEW_INTRO}\n{_REVIEW_JSON if fmt == 'json' else _REVIEW_OPTIONS}"
    user = f"Goal: {rec['query']}\nName: {name}\nArgs: {args}\nResponse: {response}"
    answer: Any = label == "A" if fmt == "json" else label
    return {"template": "", "meta_data": {"response_format": fmt},
            "ground_truth": {"answer": answer, "thought": _REVIEW_THOUGHTS[label]},
            "origin_prompt": [{"role": "system", "content": system}, {"role": "user", "content": user}]}


def generate(kind: str, fmt: str, seed: int, n: int) -> dict[str, dict[str, Any]]:
    """``n`` generated records of sub-task ``kind`` in format ``fmt`` (``"json"``/``"str"``), as the
    id -> record object of a T-Eval file."""
    if kind not in KINDS:
        raise ValueError(f"unknown T-Eval sub-task {kind!r}")
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be 'json' or 'str', got {fmt!r}")
    rng = random.Random(seed)
    out = {}
    for i in range(n):
        if kind == "plan":
            rec = _plan(fmt, rng)
        elif kind == "review":
            rec = _review(fmt, rng)
        else:
            rec = _single(kind, fmt, rng)
        out[f"lmforge_{kind}_{fmt}_{i}"] = rec
    return out


def write(records: Mapping[str, Mapping[str, Any]], path: str | Path) -> Path:
    """Write records as a T-Eval JSON object (atomically); a ``.jsonl`` path gets one record a line
    with its ``id``."""
    path = Path(path)
    if path.suffix == ".jsonl":
        text = "".join(json.dumps({"id": k, **v}, ensure_ascii=False) + "\n" for k, v in records.items())
    else:
        text = json.dumps(dict(records), indent=2, ensure_ascii=False) + "\n"
    return atomic_write_text(path, text)
