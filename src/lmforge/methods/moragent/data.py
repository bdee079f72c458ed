"""MoRAgent's multi-role data: three-role trajectories built from function-calling records.

Han et al., "MoRAgent" (ICML 2025) train each role group of the MoR layer
(:mod:`lmforge.methods.moragent.layer`) on its own spans of an agent trajectory. The paper takes
public function-calling sets, lets a strong LLM complete the missing role content and filters the
result by "reliability verification"; its prompts and sources are in an unreleased appendix, so this
module is a programmatic version of that pipeline (``# NOTE`` where it decides something itself).

**Input.** xLAM / APIGen function-calling records, the format of :mod:`lmforge.data.toolcalls`
(``{"query", "tools", "answers"}``, answers a list of ``{"name", "arguments"}``); a user's own
JSON / JSON-lines file of them (:func:`read_function_calls`, which also takes the real xLAM dump's
JSON-string ``tools`` / ``answers`` fields), or BFCL entries (:func:`from_bfcl`).

**Trajectory** (:class:`Trajectory`), the official agent loop unrolled, one segment per span::

    user         the tool list and the query
    reasoner     "Thought: ...\\nNext role: executor"        (once per gold call, before it)
    executor     the call, one line of JSON                  (the fixed format below)
    observation  the tool stub's JSON reply                  (:func:`execute_call`)
    reasoner     "Thought: ...\\nNext role: summarizer"      (after the last observation)
    summarizer   the answer to the user

The executor's text is the gold call serialised exactly as lmforge's function-calling targets are
(:func:`lmforge.data.toolcalls.answer` without its leading space):
``json.dumps({"name": ..., "arguments": {...}}, separators=(", ", ": "))`` -- so
:func:`lmforge.data.toolcalls.parse_call` and the BFCL scorer read it back.

**Completion** of the reasoner and summarizer texts goes through a :class:`Completer`
(``complete(role, prompt) -> str``): :class:`TemplateCompleter` (no model, deterministic texts) or
:class:`ChatCompleter` around any chat client of :mod:`lmforge.methods.minions.clients` -- a local
Hugging Face model (``HFChatClient``, on :func:`lmforge.common.generation.generate`) or an
OpenAI-compatible server -- built by :func:`make_completer` through minions' own
:func:`~lmforge.methods.minions.apply.make_client`.

**Reliability verification** (:func:`build_trajectories`) drops a record, and counts it under its
reason in the report, when: a gold call fails against the tool stub (``call_error``); a reasoner text
does not end by naming the role that follows it (``bad_next_role``); the summary states a value the
observations do not hold (``ungrounded_summary``, :func:`grounding_problems`); or it states none of
the observations' values (``summary_mentions_nothing``). Nothing is dropped silently.

**Role ids** (:func:`encode_trajectory`, :func:`role_ids_for`): the segments are rendered one by one
(:func:`render_segment`), tokenised one by one and concatenated, so every token belongs to exactly
one segment and carries its role id (0 reasoner, 1 executor, 2 summarizer; -1 user and observation).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from lmforge.common.chat import extract_json
from lmforge.common.errors import UserError
from lmforge.common.io import atomic_write_text, parse_json_lines, read_json_objects, read_user_text
from lmforge.methods.moragent.layer import NO_ROLE, ROLE_NAMES

__all__ = [
    "AGENT_ROLES",
    "DROP_REASONS",
    "ROLE_IDS",
    "SEGMENT_ROLES",
    "ChatCompleter",
    "Completer",
    "Segment",
    "TemplateCompleter",
    "Trajectory",
    "build_trajectories",
    "encode_trajectory",
    "execute_call",
    "format_call",
    "from_bfcl",
    "grounding_problems",
    "make_completer",
    "read_function_calls",
    "read_trajectories",
    "render_segment",
    "render_tools",
    "role_ids_for",
    "user_segment",
    "validate_function_call_record",
    "validate_trajectory",
    "write_trajectories",
]

AGENT_ROLES = ROLE_NAMES  # ("reasoner", "executor", "summarizer"): the MoR groups, in id order
SEGMENT_ROLES = ("user", *AGENT_ROLES, "observation")
ROLE_IDS = {"reasoner": 0, "executor": 1, "summarizer": 2, "user": NO_ROLE, "observation": NO_ROLE}
DROP_REASONS = ("call_error", "bad_next_role", "ungrounded_summary", "summary_mentions_nothing")
_NEXT_ROLE = re.compile(r"next\s+role\s*:\s*(reasoner|executor|summarizer)\W*$", re.IGNORECASE)


# --------------------------------------------------------------------------------------------------
# Trajectory record


@dataclass(frozen=True)
class Segment:
    """One span of a trajectory: its role (one of :data:`SEGMENT_ROLES`) and its text."""

    role: str
    text: str


@dataclass
class Trajectory:
    """A role-tagged agent trajectory (see the module docstring for the segment order).

    ``meta`` is free JSON (the source record's index, the tools); it travels with the JSON form.
    """

    segments: list[Segment]
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"segments": [{"role": s.role, "text": s.text} for s in self.segments], "meta": self.meta}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False)

    @classmethod
    def from_dict(cls, obj: Any, where: str = "trajectory") -> Trajectory:
        """Validate (:func:`validate_trajectory`) and build; a bad sample is a one-line UserError."""
        validate_trajectory(obj, where)
        return cls([Segment(s["role"], s["text"]) for s in obj["segments"]], dict(obj.get("meta") or {}))

    @classmethod
    def from_json(cls, text: str, where: str = "trajectory") -> Trajectory:
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UserError(f"{where}: not valid JSON ({exc.msg})") from None
        return cls.from_dict(obj, where)

    def roles(self) -> list[str]:
        return [s.role for s in self.segments]


def validate_trajectory(obj: Any, where: str = "trajectory") -> None:
    """Check a trajectory's JSON form; every problem is a one-line :class:`UserError`.

    Required: an object with a ``segments`` list; each segment an object with a string ``role`` (the
    role tag) among :data:`SEGMENT_ROLES` and a string ``text``; all three agent roles present; the
    last segment the summarizer's. ``meta``, when present, is an object.
    """
    if isinstance(obj, Trajectory):
        obj = obj.to_dict()
    if not isinstance(obj, dict) or not isinstance(obj.get("segments"), list):
        raise UserError(f"{where}: a trajectory is an object with a 'segments' list")
    segs = obj["segments"]
    if not segs:
        raise UserError(f"{where}: no segments")
    for i, s in enumerate(segs):
        if not isinstance(s, dict):
            raise UserError(f"{where}: segment {i} is not an object")
        if "role" not in s or s["role"] in (None, ""):
            raise UserError(f"{where}: segment {i} has no role tag; give each segment a 'role' "
                            f"({', '.join(SEGMENT_ROLES)})")
        if s["role"] not in SEGMENT_ROLES:
            raise UserError(f"{where}: segment {i} has unknown role {s['role']!r}; roles are "
                            f"{', '.join(SEGMENT_ROLES)}")
        if not isinstance(s.get("text"), str):
            raise UserError(f"{where}: segment {i} ({s['role']}) has no string 'text'")
    present = {s["role"] for s in segs}
    missing = [r for r in AGENT_ROLES if r not in present]
    if missing:
        raise UserError(f"{where}: no {', '.join(missing)} segment; a trajectory needs all three roles "
                        f"({', '.join(AGENT_ROLES)})")
    if segs[-1]["role"] != "summarizer":
        raise UserError(f"{where}: the last segment is {segs[-1]['role']!r}; a trajectory ends with the summarizer")
    if "meta" in obj and obj["meta"] is not None and not isinstance(obj["meta"], dict):
        raise UserError(f"{where}: 'meta' must be an object")


def write_trajectories(trajectories: Iterable[Trajectory], path: str | Path) -> Path:
    """JSON lines, one trajectory a line (written atomically)."""
    return atomic_write_text(path, "".join(t.to_json() + "\n" for t in trajectories))


def read_trajectories(path: str | Path) -> list[Trajectory]:
    """A JSON-lines trajectory file; a bad line is a one-line UserError naming ``file:line``."""
    path = Path(path)
    rows = parse_json_lines(path, read_user_text(path, "trajectory"))
    if not rows:
        raise UserError(f"{path}: no trajectories in the file")
    return [Trajectory.from_dict(obj, f"{path}:{i}") for i, obj in rows]


# --------------------------------------------------------------------------------------------------
# Function-calling records


def _maybe_json(value: Any, what: str, where: str) -> Any:
    # The real xLAM-60k dump stores "tools" and "answers" as JSON strings.
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            raise UserError(f"{where}: '{what}' is a string that is not valid JSON") from None
    return value


def validate_function_call_record(rec: Any, where: str = "record") -> dict[str, Any]:
    """The record in canonical form (``tools`` / ``answers`` parsed if they were JSON strings).

    Checks the structure only (query a non-empty string; tools a non-empty list of objects with a
    string ``name`` and an object ``parameters``; answers a non-empty list of ``{"name": str,
    "arguments": object}``); whether a call fits its tool is :func:`execute_call`'s business and a
    misfit is dropped and counted by :func:`build_trajectories`, not an error here.
    """
    if not isinstance(rec, dict):
        raise UserError(f"{where}: expected a JSON object")
    for key in ("query", "tools", "answers"):
        if key not in rec:
            raise UserError(f"{where}: missing {key!r} (a function-calling record has query, tools, answers)")
    if not isinstance(rec["query"], str) or not rec["query"].strip():
        raise UserError(f"{where}: 'query' must be a non-empty string")
    tools = _maybe_json(rec["tools"], "tools", where)
    answers = _maybe_json(rec["answers"], "answers", where)
    if not isinstance(tools, list) or not tools:
        raise UserError(f"{where}: 'tools' must be a non-empty list")
    for j, t in enumerate(tools):
        if not isinstance(t, dict) or not isinstance(t.get("name"), str) or not t["name"]:
            raise UserError(f"{where}: tool {j} needs a string 'name'")
        if not isinstance(t.get("parameters", {}), dict):
            raise UserError(f"{where}: tool {t['name']!r} has 'parameters' that is not an object")
    if not isinstance(answers, list) or not answers:
        raise UserError(f"{where}: 'answers' must be a non-empty list of calls")
    for j, a in enumerate(answers):
        if not isinstance(a, dict) or not isinstance(a.get("name"), str) or not a["name"]:
            raise UserError(f"{where}: answer {j} needs a string 'name'")
        if not isinstance(a.get("arguments"), dict):
            raise UserError(f"{where}: answer {j} ({a['name']}) needs an 'arguments' object")
    return {**rec, "tools": tools, "answers": answers}


def read_function_calls(path: str | Path) -> list[dict[str, Any]]:
    """xLAM-style records from a JSON list or JSON-lines file, validated
    (:func:`validate_function_call_record`); a bad record is a one-line UserError naming it."""
    path = Path(path)
    return [validate_function_call_record(r, f"{path}: record {i}")
            for i, r in enumerate(read_json_objects(path, "function-calling record"), 1)]


def from_bfcl(record: Any) -> dict[str, Any]:
    """A :class:`lmforge.data.bfcl.BfclRecord` as an xLAM-style record.

    The query is the turn's last user message; the gold call takes, per parameter, the first
    acceptable value that is not ``""`` (BFCL's mark of an omittable parameter, which is then
    omitted). Entries without possible answers (irrelevance) have no call: a UserError.
    """
    if record.ground_truth is None:
        raise UserError(f"{record.id}: BFCL entry has no possible answer (irrelevance); it has no call to build on")
    users = [m["content"] for m in record.messages if m.get("role") == "user"]
    answers = []
    for gt in record.ground_truth:
        (name, params), = gt.items()
        args = {}
        for k, values in params.items():
            vals = [v for v in values if v != ""]
            if vals:
                args[k] = vals[0]
        answers.append({"name": name, "arguments": args})
    return {"query": users[-1] if users else "", "tools": list(record.functions), "answers": answers,
            "id": record.id}


# --------------------------------------------------------------------------------------------------
# Deterministic tool stub

_TYPE_ALIASES = {
    "string": "string", "str": "string",
    "integer": "integer", "int": "integer",
    "number": "number", "float": "number", "double": "number",
    "boolean": "boolean", "bool": "boolean",
    "array": "array", "list": "array", "tuple": "array",
    "dict": "object", "object": "object",
    "any": "any",
}


def _base_type(type_spec: Any) -> str:
    """A parameter type as one of string/integer/number/boolean/array/object/any.

    Takes JSON-schema / BFCL names and xLAM's Python-ish ones (``"str, optional"``, ``"List[int]"``);
    NOTE: an unrecognised type is checked as ``any``.
    """
    if isinstance(type_spec, list):  # JSON-schema union: ["string", "null"]
        type_spec = next((t for t in type_spec if t != "null"), "any")
    if not isinstance(type_spec, str):
        return "any"
    t = type_spec.split(",")[0].strip().lower()
    t = re.split(r"[\[(]", t)[0].strip()
    if t.startswith("typing."):
        t = t[len("typing."):]
    return _TYPE_ALIASES.get(t, "any")


def _type_ok(value: Any, base: str) -> bool:
    if base == "string":
        return isinstance(value, str)
    if base == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if base == "number":  # BFCL's checker accepts an int for a float
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if base == "boolean":
        return isinstance(value, bool)
    if base == "array":
        return isinstance(value, list)
    if base == "object":
        return isinstance(value, dict)
    return True


def _param_table(tool: dict[str, Any]) -> tuple[dict[str, Any], set[str]]:
    """(parameter -> its spec, required names) of a tool, in either schema style.

    JSON schema / BFCL (``{"type": "dict"|"object", "properties": {...}, "required": [...]}``):
    ``required`` as listed. Flat xLAM / lmforge (``{arg: {"type": ...}}``): every parameter is
    required unless its type says ``optional`` or it has a ``default``.
    """
    params = tool.get("parameters") or {}
    if isinstance(params.get("properties"), dict):
        props = params["properties"]
        return props, {r for r in params.get("required", []) if isinstance(r, str)}
    required = set()
    for k, spec in params.items():
        spec = spec if isinstance(spec, dict) else {}
        t = spec.get("type", "")
        if "default" not in spec and not (isinstance(t, str) and "optional" in t.lower()):
            required.add(k)
    return params, required


def render_tools(tools: Sequence[dict[str, Any]]) -> str:
    """The tool list as the user segment shows it: ``- name(arg, arg, opt?)`` per tool, a ``?`` on
    each optional parameter (:func:`_param_table`, so both schema styles list their parameters).

    NOTE: signatures only, no descriptions or types (the format of
    :func:`lmforge.data.toolcalls.render_tools`, which lists a flat schema's keys and so would show
    a JSON-schema tool as ``f(type, properties, required)``): it keeps CPU prompts short (about 50
    SmolLM2 tokens for a BFCL entry); the record keeps the full schema.
    """
    lines = []
    for t in tools:
        props, required = _param_table(t)
        args = ", ".join(k if k in required else f"{k}?" for k in props)
        lines.append(f"- {t.get('name')}({args})")
    return "\n".join(lines)


def user_segment(record: dict[str, Any]) -> Segment:
    """The trajectory's opening segment: the tool list and the query."""
    return Segment("user", f"Tools:\n{render_tools(record['tools'])}\nQuery: {record['query']}")


def _call_problem(call: Any, tools: Sequence[dict[str, Any]]) -> str | None:
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return "the call is not an object with a string 'name'"
    args = call.get("arguments")
    if not isinstance(args, dict):
        return f"{call['name']}: 'arguments' is not an object"
    tool = next((t for t in tools if isinstance(t, dict) and t.get("name") == call["name"]), None)
    if tool is None:
        return f"unknown function {call['name']!r}"
    table, required = _param_table(tool)
    missing = sorted(required - set(args))
    if missing:
        return f"{call['name']}: missing required argument(s) {', '.join(missing)}"
    for k, v in args.items():
        if k not in table:
            return f"{call['name']}: unknown argument {k!r}"
        spec = table[k] if isinstance(table[k], dict) else {}
        base = _base_type(spec.get("type", "any"))
        if not _type_ok(v, base):
            return f"{call['name']}: argument {k!r} should be {base}, got {type(v).__name__} {v!r}"
    return None


def format_call(call: dict[str, Any]) -> str:
    """The executor's text: ``{"name": ..., "arguments": {...}}`` as one line of JSON (the format of
    :func:`lmforge.data.toolcalls.answer`, without its leading space)."""
    return json.dumps({"name": call["name"], "arguments": call["arguments"]}, separators=(", ", ": "),
                      ensure_ascii=False)


def execute_call(call: Any, tools: Sequence[dict[str, Any]]) -> str:
    """Run ``call`` against a deterministic stub of ``tools``; the observation, a JSON string.

    The call must name one of ``tools``, give every required parameter, no unknown one, and each of
    the parameter's type (:func:`_param_table`, :func:`_base_type`). A valid call gives
    ``{"status": "ok", "function": name, "result": {**arguments, "result_id": N}}`` where ``N`` is
    ``int(sha256(canonical call JSON)[:8], 16) % 10000`` -- a value that depends on the arguments only,
    so the same call always observes the same thing. NOTE: the stub echoes the arguments rather than
    inventing a domain answer (a weather, a price), so everything in it is checkable against the call.
    An invalid call gives ``{"status": "error", "function": name or null, "error": why}``.
    """
    problem = _call_problem(call, tools)
    name = call.get("name") if isinstance(call, dict) and isinstance(call.get("name"), str) else None
    if problem is not None:
        return json.dumps({"status": "error", "function": name, "error": problem}, ensure_ascii=False)
    canon = json.dumps({"name": name, "arguments": call["arguments"]}, sort_keys=True, ensure_ascii=False)
    result_id = int(hashlib.sha256(canon.encode("utf-8")).hexdigest()[:8], 16) % 10000
    return json.dumps({"status": "ok", "function": name, "result": {**call["arguments"], "result_id": result_id}},
                      ensure_ascii=False)


# --------------------------------------------------------------------------------------------------
# Grounding

_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w]|\.\d)")
_QUOTED = re.compile(r"'([^'\n]*)'|\"([^\"\n]*)\"")


def _leaves(obj: Any, skip: tuple[str, ...] = ()) -> list[Any]:
    if isinstance(obj, dict):
        return [x for k, v in obj.items() if k not in skip for x in _leaves(v)]
    if isinstance(obj, list):
        return [x for v in obj for x in _leaves(v)]
    return [obj]


def _as_text(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def grounding_problems(summary: str, observations: Sequence[str]) -> list[str]:
    """Why ``summary`` is not grounded in ``observations`` (JSON strings); empty when it is.

    The definition:

    * The observation values are the scalar leaves of the observations' JSON, except the top-level
      ``status`` and ``function`` fields (a summary may name the function, but naming it, or saying
      "ok", states nothing about the result). Their numbers are the numeric leaves plus every number
      written inside a string leaf; their strings are the string leaves.
    * The summary's claims are its numbers (``-?\\d+(\\.\\d+)?`` not inside a word, e.g. not the 3
      of "mp3") and its quoted strings ('...' or "..." on one line). Every number claim must equal one
      of the observation numbers (as floats), and every quoted claim must equal one of the
      observation values' texts exactly (numbers and booleans as JSON writes them): else
      ``"ungrounded: <claim>"``.
    * The summary must mention at least one observation value: a grounded claim, or a string leaf
      of 2+ characters that occurs in it case-insensitively at word boundaries: else
      ``"mentions nothing"``.
    """
    values: list[Any] = []
    for obs in observations:
        try:
            parsed = json.loads(obs)
        except json.JSONDecodeError:
            parsed = obs
        values += _leaves(parsed, skip=("status", "function")) if isinstance(parsed, dict) else _leaves(parsed)
    numbers: set[float] = set()
    texts = {_as_text(v) for v in values}
    for v in values:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            numbers.add(float(v))
        elif isinstance(v, str):
            numbers.update(float(m.group()) for m in _NUMBER.finditer(v))
    problems: list[str] = []
    grounded = 0
    quoted_spans = []
    for m in _QUOTED.finditer(summary):
        claim = m.group(1) if m.group(1) is not None else m.group(2)
        quoted_spans.append(m.span())
        if claim in texts:
            grounded += 1
        else:
            problems.append(f"ungrounded: {claim!r}")
    for m in _NUMBER.finditer(summary):
        if any(a <= m.start() < b for a, b in quoted_spans):
            continue  # part of a quoted claim, judged above
        if float(m.group()) in numbers:
            grounded += 1
        else:
            problems.append(f"ungrounded: {m.group()}")
    if not grounded and not any(
        isinstance(v, str) and len(v) >= 2
        and re.search(rf"(?<!\w){re.escape(v.lower())}(?!\w)", summary.lower()) for v in values
    ):
        problems.append("mentions nothing")
    return problems


# --------------------------------------------------------------------------------------------------
# Completers


@runtime_checkable
class Completer(Protocol):
    """Writes a role's text: ``complete(role, prompt) -> str`` (role ``reasoner`` or ``summarizer``).

    The prompt (:func:`role_prompt`) ends with one JSON object: ``{"call": ...}`` (a reasoner before
    a call), ``{"observations": [...], "next_role": "summarizer"}`` (the reasoner after the last
    observation) or ``{"observations": [...]}`` (the summarizer).
    """

    def complete(self, role: str, prompt: str) -> str: ...


class TemplateCompleter:
    """Deterministic role texts, no model.

    * reasoner before a call: ``"Thought: I need to call {name} with {k}={v}, ....\\nNext role: executor"``
      (values as JSON writes them);
    * reasoner after the observations: ``"Thought: I have the result of {name}; I can answer
      now.\\nNext role: summarizer"``;
    * summarizer: ``"{name} returned k 'string', k 12, ...."`` per observation's result, strings
      quoted, so every stated value is checkable (:func:`grounding_problems`).
    """

    name = "template"

    def complete(self, role: str, prompt: str) -> str:
        obj = extract_json(prompt) or {}
        if role == "reasoner":
            if isinstance(obj.get("call"), dict):
                call = obj["call"]
                args = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in call["arguments"].items())
                return f"Thought: I need to call {call['name']} with {args or 'no arguments'}.\nNext role: executor"
            names = [json.loads(o).get("function") for o in obj.get("observations", [])]
            done = ", ".join(map(str, names))
            return f"Thought: I have the result of {done}; I can answer now.\nNext role: summarizer"
        if role == "summarizer":
            parts = []
            for o in obj.get("observations", []):
                ob = json.loads(o)
                res = ob.get("result", {})
                fields = ", ".join(f"{k} {_say(v)}" for k, v in res.items()) if isinstance(res, dict) else _say(res)
                parts.append(f"{ob.get('function')} returned {fields}.")
            return " ".join(parts)
        raise UserError(f"the template completer writes reasoner and summarizer texts, not {role!r}")


def _say(v: Any) -> str:
    if isinstance(v, str):
        return f"'{v}'"
    return json.dumps(v, ensure_ascii=False)


class ChatCompleter:
    """A :class:`Completer` on any chat client of :mod:`lmforge.methods.minions.clients`.

    The prompt is sent as one user message; the reply's text, stripped, is the role's text (the
    verification in :func:`build_trajectories` judges it). ``max_tokens`` caps each reply.
    """

    def __init__(self, client: Any, *, max_tokens: int | None = 128) -> None:
        self.client = client
        self.max_tokens = max_tokens
        self.name = getattr(client, "name", type(client).__name__)

    @classmethod
    def from_model(cls, model: Any, tokenizer: Any, *, max_tokens: int = 128, **kwargs: Any) -> ChatCompleter:
        """An in-process Hugging Face model (greedy by default), via minions' ``HFChatClient``."""
        from lmforge.methods.minions.clients import HFChatClient

        return cls(HFChatClient(model, tokenizer, max_tokens=max_tokens, **kwargs), max_tokens=max_tokens)

    def complete(self, role: str, prompt: str) -> str:
        return self.client.chat([{"role": "user", "content": prompt}], max_tokens=self.max_tokens).text.strip()


def make_completer(spec: str, *, base_url: str | None = None, max_tokens: int = 128, **kwargs: Any) -> Completer:
    """``template`` (:class:`TemplateCompleter`), else a :class:`ChatCompleter` on
    :func:`lmforge.methods.minions.apply.make_client` (``zoo:NAME`` / a local HF folder in-process;
    a model name at an OpenAI-compatible ``base_url``, its key from ``key_env``; ``kwargs`` go to it)."""
    if spec == "template":
        return TemplateCompleter()
    from lmforge.methods.minions.apply import make_client

    return ChatCompleter(make_client(spec, base_url=base_url, max_tokens=max_tokens, **kwargs), max_tokens=max_tokens)


_ROLE_INSTRUCTIONS = {
    ("reasoner", "call"): ("You are the reasoner of a tool-using agent. In one or two sentences starting with "
                           "'Thought:', explain why the call below answers the user, then end with the line "
                           "'Next role: executor'."),
    ("reasoner", "finish"): ("You are the reasoner of a tool-using agent. The tool results are below. In one "
                             "sentence starting with 'Thought:', say that they answer the user, then end with "
                             "the line 'Next role: summarizer'."),
    ("summarizer", "finish"): ("You are the summarizer of a tool-using agent. Answer the user from the tool "
                               "results below. State only values that appear in the results, quote strings "
                               "with single quotes, and invent nothing."),
}


def role_prompt(role: str, stage: str, record: dict[str, Any], payload: dict[str, Any]) -> str:
    """The completer's prompt: instructions, the tools, the query, then ``payload`` as one JSON line."""
    return (f"{_ROLE_INSTRUCTIONS[(role, stage)]}\n\nTools:\n{render_tools(record['tools'])}\n"
            f"User: {record['query']}\n\n{json.dumps(payload, ensure_ascii=False)}")


# --------------------------------------------------------------------------------------------------
# The pipeline


def _next_role_ok(text: str, expected: str) -> bool:
    m = _NEXT_ROLE.search(text.strip())
    return m is not None and m.group(1).lower() == expected


def build_trajectories(records: Iterable[dict[str, Any]], completer: Completer
                       ) -> tuple[list[Trajectory], dict[str, Any]]:
    """Three-role trajectories from function-calling records, reliability-verified.

    Per record (validated by :func:`validate_function_call_record`; a malformed one is a UserError,
    not a drop): every gold call is executed first (a failure drops the record as ``call_error``
    before any completion is asked for); then, per call, a reasoner text (must end
    ``Next role: executor``), the executor's call (:func:`format_call`) and its observation; then a
    reasoner text ending ``Next role: summarizer`` (else ``bad_next_role``) and the summary, which
    must pass :func:`grounding_problems` (``ungrounded_summary``, or ``summary_mentions_nothing``
    when that is its only problem).

    Returns:
        ``(kept, report)``: ``report`` has ``total``, ``kept``, ``dropped``, ``dropped_by_reason``
        (every reason of :data:`DROP_REASONS`, zeros included) and ``drops`` (``{"index", "reason",
        "detail"}`` per dropped record, in order).
    """
    kept: list[Trajectory] = []
    drops: list[dict[str, Any]] = []
    total = 0
    for index, raw in enumerate(records):
        total += 1
        rec = validate_function_call_record(raw, f"record {index}")

        def drop(reason: str, detail: str, index: int = index) -> None:
            drops.append({"index": index, "reason": reason, "detail": detail})

        observations = [execute_call(call, rec["tools"]) for call in rec["answers"]]
        failed = [json.loads(o)["error"] for o in observations if json.loads(o)["status"] != "ok"]
        if failed:
            drop("call_error", failed[0])
            continue
        segments = [user_segment(rec)]
        bad = None
        for call, obs in zip(rec["answers"], observations):
            thought = completer.complete("reasoner", role_prompt("reasoner", "call", rec, {"call": call}))
            if not _next_role_ok(thought, "executor"):
                bad = thought
                break
            segments += [Segment("reasoner", thought), Segment("executor", format_call(call)),
                         Segment("observation", obs)]
        if bad is None:
            thought = completer.complete("reasoner", role_prompt("reasoner", "finish", rec,
                                                                 {"observations": observations,
                                                                  "next_role": "summarizer"}))
            if not _next_role_ok(thought, "summarizer"):
                bad = thought
        if bad is not None:
            drop("bad_next_role", bad[-200:])
            continue
        segments.append(Segment("reasoner", thought))
        summary = completer.complete("summarizer", role_prompt("summarizer", "finish", rec,
                                                               {"observations": observations}))
        problems = grounding_problems(summary, observations)
        if problems:
            reason = "summary_mentions_nothing" if problems == ["mentions nothing"] else "ungrounded_summary"
            drop(reason, "; ".join(problems))
            continue
        segments.append(Segment("summarizer", summary))
        meta = {"source_index": index, **({"id": rec["id"]} if "id" in rec else {})}
        traj = Trajectory(segments, meta)
        validate_trajectory(traj, f"record {index}")
        kept.append(traj)
    counts = Counter(d["reason"] for d in drops)
    report = {"total": total, "kept": len(kept), "dropped": len(drops),
              "dropped_by_reason": {r: counts.get(r, 0) for r in DROP_REASONS}, "drops": drops}
    return kept, report


# --------------------------------------------------------------------------------------------------
# Tokens and role ids


def render_segment(segment: Segment) -> str:
    """A segment's text as the model sees it: ``"{role}: {text}\\n"``.

    NOTE: a plain ``role: content`` rendering (that of :func:`lmforge.common.chat.render_plain`,
    with the segment roles as speaker names) rather than a tokenizer's chat template, so that
    segment-by-segment tokenisation is exact: a chat template's output cannot be split back into
    per-segment pieces in general (it adds system prompts, merges consecutive assistant turns).
    The ``{role}: `` header is tagged with the segment's role: at inference the agent loop writes the
    header and the role's experts then produce the content, so the header is part of the role's
    span (the official prompt-token tagging is unreleased).
    """
    return f"{segment.role}: {segment.text}\n"


def encode_trajectory(tokenizer: Any, trajectory: Trajectory, *, add_eos: bool = True
                      ) -> tuple[list[int], list[int]]:
    """``(input_ids, role_ids)`` of a trajectory, equal in length.

    Each segment's :func:`render_segment` text is tokenised on its own (no special tokens) and the
    pieces are concatenated; every token of a piece gets its segment's id in :data:`ROLE_IDS`
    (0 reasoner, 1 executor, 2 summarizer, -1 user / observation). With ``add_eos`` (and a tokenizer
    that has an EOS token) an EOS closes the sequence with the summarizer's id, so a trained model
    learns to stop. NOTE: the ids are the concatenation, which is exact by construction; for a
    byte-level BPE whose pre-tokenizer splits at the newline ending each piece, they also equal the
    tokenisation of the whole rendered text (the tests check this for lmforge's tokenizer).
    """
    validate_trajectory(trajectory)
    ids: list[int] = []
    roles: list[int] = []
    for seg in trajectory.segments:
        piece = tokenizer(render_segment(seg), add_special_tokens=False)["input_ids"]
        ids += piece
        roles += [ROLE_IDS[seg.role]] * len(piece)
    eos = getattr(tokenizer, "eos_token_id", None)
    if add_eos and eos is not None:
        ids.append(int(eos))
        roles.append(ROLE_IDS["summarizer"])
    return ids, roles


def role_ids_for(tokenizer: Any, trajectory: Trajectory, *, add_eos: bool = True) -> list[int]:
    """The per-token role ids of :func:`encode_trajectory` (same length as its ``input_ids``)."""
    return encode_trajectory(tokenizer, trajectory, add_eos=add_eos)[1]
