"""BFCL's prompting-mode function calling: the system prompt, the output decoder and the AST checker.

BFCL (Patil et al., gorilla.cs.berkeley.edu; package ``bfcl-eval``) prompts a model without native
function calling with a system prompt that describes the output format and lists the functions as
JSON, decodes the reply as a Python list of calls (``[f(a=1, b='x'), g(c=[1, 2])]``) with ``ast``,
and checks the calls against the possible answers:

* **decoding** (``default_decode_ast_prompting``): strip backticks, newlines and spaces from the
  ends, add the missing ``[`` / ``]``, parse as one Python expression whose elements must all be
  calls; keyword arguments only (positional ones are dropped); a value is a literal, a name (its
  text), a call without keywords (its source text), a call with keywords (a nested call dict),
  an arithmetic expression (its value), a subscript (its text). Anything else fails decoding.
* **checking** (``ast_checker``): the function name must match; every required parameter must be
  present; every given parameter must be in the doc and in the answer; its type must be the doc's
  (an int is accepted as a float; ``bool`` is not an int; lists are checked one level deep, with no
  int-to-float there) unless it has the answer's own type (a "variable"); strings match after
  removing `` ,./-_*^``, lower-casing and turning ``'`` into ``"``, also inside lists and dicts; a
  dict must hold only answer keys with acceptable values and all non-optional ones; every answer
  parameter without ``""`` among its values must be given. ``multiple``: exactly one call, checked
  against the one expected. ``parallel`` / ``parallel_multiple``: as many calls as expected, matched
  order-free (each expected call, in turn, takes the first unmatched call that passes).
* **irrelevance**: correct when the reply decodes to no call (decoding fails, or ``[]``).

Checked before writing this by hand: ``bfcl_eval.eval_checker.ast_eval.ast_checker`` and
``bfcl_eval.model_handler.utils.default_decode_ast_prompting`` implement exactly this, but importing
them needs ``bfcl_eval.constants.model_config`` (every provider SDK: anthropic, openai, cohere ...),
tree-sitter and tenacity, none of which lmforge depends on; and BFCL's decoder ``eval``s arithmetic
in model output. This module re-implements the rules (tests/eval/test_bfcl.py runs bfcl-eval's own
checker, with those imports stubbed, as the reference on real and perturbed outputs).
"""

from __future__ import annotations

import ast
import copy
import json
import math
import operator
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DecodeError",
    "PYTHON_HINT",
    "Verdict",
    "check_calls",
    "chat_messages",
    "decode",
    "evaluate",
    "normalize_string",
    "prompt_functions",
    "render_call",
    "system_prompt",
]

# --------------------------------------------------------------------------------------------------
# The prompt (bfcl_eval.constants.default_prompts, DEFAULT_SYSTEM_PROMPT_FORMAT =
# "ret_fmt=python&tool_call_tag=False&func_doc_fmt=json&prompt_fmt=plaintext&style=classic")

# BFCL appends this to every function description of a Python category before prompting
# (bfcl_eval.utils._func_doc_language_specific_pre_processing); the checker sees the bare docs.
PYTHON_HINT = " Note that the provided function is in Python 3 syntax."

_PERSONA = "You are an expert in composing functions."
_TASK = (
    "You are given a question and a set of possible functions. Based on the question, you will need to "
    "make one or more function/tool calls to achieve the purpose. If none of the functions can be used, "
    "point it out. If the given question lacks the parameters required by the function, also point it out."
)
_OUTPUT_FORMAT = "[func_name1(params_name1=params_value1, params_name2=params_value2...), func_name2(params)]"
_TOOL_CALL = (
    "You should only return the function calls in your response.\n\nIf you decide to invoke any of the "
    "function(s), you MUST put it in the format of {output_format}. {param_types} You SHOULD NOT include any "
    "other text in the response."
)
_MULTITURN = (
    "At each turn, you should try your best to complete the tasks requested by the user within the current "
    "turn. Continue to output functions to call until you have fulfilled the user's request to the best of "
    "your ability. Once you have no more functions to call, the system will consider the current turn "
    "complete and proceed to the next turn or task."
)
_TOOLS = "Here is a list of functions in {format} format that you can invoke.\n{functions}\n"


def prompt_functions(functions: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The function docs as BFCL shows them to the model: a copy with the Python hint appended to
    each description."""
    out = copy.deepcopy(list(functions))
    for f in out:
        f["description"] = f["description"] + PYTHON_HINT
    return out


def system_prompt(functions: Sequence[dict[str, Any]]) -> str:
    """BFCL's default system prompt for prompting-mode models, listing ``functions`` (already with
    the hint, see :func:`prompt_functions`) as indented JSON."""
    # The plaintext template joins persona and task with no separator, and the Python format has
    # no parameter-type sentence, leaving two spaces: both as BFCL renders them.
    tool_call = _TOOL_CALL.format(output_format=_OUTPUT_FORMAT, param_types="")
    tools = _TOOLS.format(format="json", functions=json.dumps(list(functions), indent=4))
    return f"{_PERSONA}{_TASK}\n\n{tool_call}\n\n{_MULTITURN}\n\n{tools}"


def chat_messages(messages: Sequence[dict[str, str]], functions: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    """The messages BFCL sends a prompting-mode chat model for a single-turn entry: its system prompt
    first, merged into the entry's own system message when it has one
    (``system_prompt_pre_processing_chat_model``)."""
    sys_text = system_prompt(prompt_functions(functions))
    out = [dict(m) for m in messages]
    if out and out[0]["role"] == "system":
        out[0]["content"] = sys_text + "\n\n" + out[0]["content"]
    else:
        out.insert(0, {"role": "system", "content": sys_text})
    return out


# --------------------------------------------------------------------------------------------------
# Decoding


class DecodeError(ValueError):
    """The output is not a list of Python function calls."""


def decode(text: str) -> list[dict[str, dict[Any, Any]]]:
    """The calls of a prompting-mode output, ``[{function name: {param: value}}, ...]``; raises
    :class:`DecodeError` where BFCL's decoder fails."""
    s = text.strip("`\n ")
    if not s.startswith("["):
        s = "[" + s
    if not s.endswith("]"):
        s = s + "]"
    s = s.strip().strip("'")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escapes in model text are not our warnings
            tree = ast.parse(s, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise DecodeError(f"not a Python expression: {exc}") from None
    body = tree.body
    try:
        if isinstance(body, ast.Call):
            return [_call(body)]
        if not isinstance(body, (ast.List, ast.Tuple, ast.Set)):
            raise DecodeError(f"not a list of calls ({type(body).__name__})")
        out = []
        for elem in body.elts:
            if not isinstance(elem, ast.Call):
                raise DecodeError(f"list element is a {type(elem).__name__}, not a call")
            out.append(_call(elem))
        return out
    except RecursionError:
        raise DecodeError("nesting too deep") from None


def _call(node: ast.Call) -> dict[str, dict[Any, Any]]:
    # The dotted name of the callee; parts below the last attribute that are not a plain name
    # (``f().g``, ``a[0].g``) are left out, as BFCL does.
    parts = []
    f = node.func
    while isinstance(f, ast.Attribute):
        parts.append(f.attr)
        f = f.value
    if isinstance(f, ast.Name):
        parts.append(f.id)
    args: dict[Any, Any] = {}
    for kw in node.keywords:  # NOTE: positional arguments are ignored, as in BFCL
        args[kw.arg] = _value(kw.value)
    return {".".join(reversed(parts)): args}


def _value(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant):
        return "..." if node.value is Ellipsis else node.value
    if isinstance(node, ast.UnaryOp):
        # NOTE: BFCL negates the operand of every unary operator (``+5`` and ``~5`` decode to -5)
        # and fails on any operand that is not a literal; kept for agreement.
        if not isinstance(node.operand, ast.Constant):
            raise DecodeError("unary operator on a non-literal")
        try:
            return -node.operand.value
        except TypeError:
            raise DecodeError("unary operator on a non-number") from None
    if isinstance(node, ast.List):
        return [_value(v) for v in node.elts]
    if isinstance(node, ast.Tuple):
        return tuple(_value(v) for v in node.elts)
    if isinstance(node, ast.Dict):
        out = {}
        for k, v in zip(node.keys, node.values):
            if k is None:
                raise DecodeError("dict unpacking in a value")
            key = _value(k)
            try:
                out[key] = _value(v)
            except TypeError:
                raise DecodeError("unhashable dict key") from None
        return out
    if isinstance(node, ast.BinOp):
        # NOTE: BFCL ``eval``s the expression's source in its own module (so ``abs(-2) * 3`` or
        # ``os.sep + 'x'`` would evaluate there); lmforge evaluates only literal arithmetic and
        # fails anything else, the same verdict for every expression of literals.
        return _arith(node)
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Call):
        return ast.unparse(node) if not node.keywords else _call(node)
    if isinstance(node, ast.Subscript):
        return ast.unparse(node.value) + "[" + ast.unparse(node.slice) + "]"
    raise DecodeError(f"unsupported value: {type(node).__name__}")


_BINOPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
    ast.LShift: operator.lshift, ast.RShift: operator.rshift, ast.BitOr: operator.or_,
    ast.BitXor: operator.xor, ast.BitAnd: operator.and_,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Invert: operator.invert, ast.Not: operator.not_}
# NOTE: limits BFCL's eval does not have (it would hang or exhaust memory on ``9**9**9``):
# integers up to 100k bits, sequences up to a million items.
_MAX_BITS = 100_000
_MAX_LEN = 1_000_000


def _arith(node: ast.AST) -> Any:
    """A literal expression's value under Python's own semantics (inside ``eval`` a unary minus is
    a real one), refusing names, calls and oversized results."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.List):
        return [_arith(v) for v in node.elts]
    if isinstance(node, ast.Tuple):
        return tuple(_arith(v) for v in node.elts)
    if isinstance(node, ast.Set):
        return _apply(set, [_arith(v) for v in node.elts])
    if isinstance(node, ast.Dict) and None not in node.keys:
        return _apply(dict, [(_arith(k), _arith(v)) for k, v in zip(node.keys, node.values)])  # type: ignore[arg-type]
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _apply(_UNARY[type(node.op)], _arith(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _arith(node.left), _arith(node.right)
        op = type(node.op)
        if op is ast.Pow and isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1 \
                and right * math.log2(abs(left)) > _MAX_BITS:
            raise DecodeError("integer power too large")
        if op is ast.LShift and isinstance(left, int) and isinstance(right, int) and right > _MAX_BITS:
            raise DecodeError("shift too large")
        if op is ast.Mult and (_too_long(left, right) or _too_long(right, left)):
            raise DecodeError("sequence too long")
        return _apply(_BINOPS[op], left, right)
    # NOTE: a name, call, comparison, comprehension ... inside arithmetic: BFCL's eval raises
    # NameError for all but its module's globals and Python builtins, and evaluates the rest;
    # lmforge treats every one as a decode failure.
    raise DecodeError(f"unsupported expression: {type(node).__name__}")


def _too_long(seq: Any, n: Any) -> bool:
    return isinstance(seq, (str, bytes, list, tuple)) and isinstance(n, int) and len(seq) * max(n, 0) > _MAX_LEN


def _apply(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except (ArithmeticError, TypeError, ValueError) as exc:
        raise DecodeError(f"cannot evaluate: {exc}") from None


# --------------------------------------------------------------------------------------------------
# Checking

_PY_TYPES: dict[str, type] = {
    "string": str, "integer": int, "float": float, "boolean": bool,
    "array": list, "tuple": list, "dict": dict, "any": str,
}
_STRIP = re.compile(r"[ ,./\-_*^]")


@dataclass
class Verdict:
    """An output's verdict: ``valid`` and, when not, the first failure (``kind``: ``decode``,
    ``count``, ``function``, ``missing_required``, ``unexpected_param``, ``type``, ``value``,
    ``missing_optional``, ``no_match``, ``called``)."""

    valid: bool
    kind: str = ""
    error: str = ""
    calls: list[dict[str, dict[Any, Any]]] | None = None


class _Fail(Exception):
    def __init__(self, kind: str, error: str) -> None:
        super().__init__(error)
        self.kind, self.error = kind, error


def normalize_string(s: str) -> str:
    """BFCL's string comparison form: no `` ,./-_*^``, lower case, ``'`` as ``"``."""
    return _STRIP.sub("", s).lower().replace("'", '"')


def _norm(x: Any) -> Any:
    return normalize_string(x) if type(x) is str else x


def _optional(alternatives: Any) -> bool:
    """``""`` is among the acceptable values: the parameter may be left out."""
    return isinstance(alternatives, (list, tuple, str)) and "" in alternatives


def _answer_type(alternatives: Sequence[Any]) -> type | None:
    """The type of the first non-optional acceptable value (how BFCL spots a "variable" answer)."""
    for a in alternatives:
        if a != "":
            return type(a)
    return None


def _type_ok(value: Any, alternatives: Sequence[Any], expected: type, item_type: type | None) -> tuple[bool, bool]:
    """(type acceptable, value is a "variable": typed like the answer rather than like the doc)."""
    answer_t = _answer_type(alternatives)
    variable = answer_t is not None and answer_t is not expected
    if type(value) is expected:
        if item_type is None:
            return True, variable
        # One level deep: every element must have the item type (or, per alternative, that
        # alternative's own element type); a non-list alternative (the optional "") passes.
        for alt in alternatives:
            if type(alt) is not list or all(_type_ok(v, alt, item_type, None)[0] for v in value):
                return True, variable
        return False, variable
    if answer_t is not None and type(value) is answer_t:
        return True, True
    return False, False


def _sequence(alt: Any) -> list[Any] | None:
    # NOTE: BFCL indexes an alternative of a list parameter element by element, so a string
    # alternative compares as its characters ("" as the empty list); any other kind makes BFCL
    # raise, and matches nothing here.
    return list(alt) if isinstance(alt, (list, str)) else None


def _list_ok(value: list[Any], alternatives: Sequence[Any]) -> bool:
    got = [_norm(v) for v in value]
    for alt in alternatives:
        seq = _sequence(alt)
        if seq is not None and got == [_norm(a) for a in seq]:
            return True
    return False


def _dict_ok(value: Any, alternatives: Sequence[Any]) -> bool:
    if not isinstance(value, dict):
        return False  # NOTE: BFCL raises on a non-dict here; only a "variable" could get this far
    for alt in alternatives:
        if not isinstance(alt, dict):
            continue  # the optional marker "" (anything else makes BFCL raise)
        ok = True
        for k, v in value.items():
            seq = _sequence(alt.get(k)) if k in alt else None
            if seq is None or _norm(v) not in [_norm(a) for a in seq]:
                ok = False
                break
        if ok and all(k in value or _optional(vals) for k, vals in alt.items()):
            return True
    return False


def _list_of_dicts_ok(value: list[Any], alternatives: Sequence[Any]) -> bool:
    for alt in alternatives:
        seq = _sequence(alt)
        if seq is None or len(seq) != len(value):
            continue
        if all(_dict_ok(v, [a]) for v, a in zip(value, seq)):
            return True
    return False


def _check_call(doc: dict[str, Any], call: dict[str, dict[Any, Any]], answer: dict[str, dict[str, list[Any]]]) -> None:
    """One call against one expected call; raises :class:`_Fail` with the first failure."""
    expected = next(iter(answer.values()))
    name = doc["name"]
    if name not in call:
        raise _Fail("function", f"expected a call of {name!r}, got {next(iter(call), '')!r}")
    args = call[name]
    props = doc["parameters"]["properties"]
    for p in doc["parameters"]["required"]:
        if p not in args:
            raise _Fail("missing_required", f"{name}: missing required parameter {p!r}")
    for p, value in args.items():
        if p not in props or p not in expected:
            raise _Fail("unexpected_param", f"{name}: unexpected parameter {p!r}")
        type_name = props[p]["type"]
        if type_name not in _PY_TYPES:
            raise _Fail("type", f"{name}: parameter {p!r} has unsupported type {type_name!r}")
        exp_t = _PY_TYPES[type_name]
        item_t = _PY_TYPES.get(props[p].get("items", {}).get("type", "")) if type_name in ("array", "tuple") else None
        if type_name in ("array", "tuple") and item_t is None:
            raise _Fail("type", f"{name}: parameter {p!r} has no usable item type")
        alts = expected[p]
        if type_name == "tuple" and type(value) is tuple:
            value = list(value)  # the answers went through JSON, where tuples are lists
        if type_name == "float" and type(value) is int:
            value = float(value)  # an integer literal is a fine float
        ok, variable = _type_ok(value, alts, exp_t, item_t)
        if not ok:
            raise _Fail("type", f"{name}: parameter {p!r} expects {type_name}, got {type(value).__name__} {value!r}")
        if not variable:
            if exp_t is dict:
                good = _dict_ok(value, alts)
            elif exp_t is list and item_t is dict:
                good = _list_of_dicts_ok(value, alts)
            elif exp_t is str:
                good = _norm(value) in [_norm(a) for a in alts if type(a) is str]
            elif exp_t is list:
                good = _list_ok(value, alts)
            else:
                good = value in alts
        else:
            good = value in alts
        if not good:
            raise _Fail("value", f"{name}: parameter {p!r} = {value!r} is not one of {alts!r}")
    for p, alts in expected.items():
        if p not in args and not _optional(alts):
            raise _Fail("missing_optional", f"{name}: parameter {p!r} is expected but not given")


def _doc(functions: Sequence[dict[str, Any]], name: str) -> dict[str, Any]:
    for f in functions:
        if f["name"] == name:
            return f
    raise _Fail("function", f"the answer's function {name!r} is not among the entry's functions")


def check_calls(functions: Sequence[dict[str, Any]], calls: Sequence[dict[str, dict[Any, Any]]],
                ground_truth: Sequence[dict[str, dict[str, list[Any]]]], category: str) -> Verdict:
    """Decoded calls against the possible answers of a ``simple``, ``multiple``, ``parallel`` or
    ``parallel_multiple`` entry (BFCL picks the rule by the category's name)."""
    calls = list(calls)
    try:
        # BFCL's simple rule wants exactly one call whatever the answer lists.
        want = len(ground_truth) if ("parallel" in category or "multiple" in category) else 1
        if len(calls) != want:
            raise _Fail("count", f"{len(calls)} calls, expected {want}")
        if "parallel" in category:
            # NOTE: BFCL's order-free match is greedy (each expected call takes the first unmatched
            # call that passes), not a maximum matching; kept for agreement.
            used: set[int] = set()
            for answer in ground_truth:
                doc = _doc(functions, next(iter(answer)))
                last: _Fail | None = None
                for j, call in enumerate(calls):
                    if j in used:
                        continue
                    try:
                        _check_call(doc, call, answer)
                    except _Fail as exc:
                        last = exc
                        continue
                    used.add(j)
                    last = None
                    break
                if last is not None:
                    raise _Fail("no_match", f"no call matches the expected {next(iter(answer))!r} ({last.error})")
        elif "multiple" in category:
            _check_call(_doc(functions, next(iter(ground_truth[0]))), calls[0], ground_truth[0])
        else:
            # NOTE: BFCL's simple rule checks against the entry's first function doc.
            _check_call(functions[0], calls[0], ground_truth[0])
    except _Fail as exc:
        return Verdict(False, exc.kind, exc.error, calls)
    return Verdict(True, calls=calls)


def evaluate(output: str, functions: Sequence[dict[str, Any]],
             ground_truth: Sequence[dict[str, dict[str, list[Any]]]] | None, category: str) -> Verdict:
    """BFCL's verdict on one prompting-mode output of an entry of ``category``."""
    try:
        calls = decode(output)
    except DecodeError as exc:
        if "irrelevance" in category:
            return Verdict(True)  # no call is the right answer
        return Verdict(False, "decode", str(exc))
    if "relevance" in category:
        # [] is no call ([{}], BFCL's other empty form, cannot come out of the decoder).
        if "irrelevance" in category:
            return Verdict(not calls, "called" if calls else "", "a call where none applies" if calls else "", calls)
        return Verdict(bool(calls), "" if calls else "decode", "" if calls else "no call", calls)
    if ground_truth is None:
        raise ValueError(f"category {category!r} needs possible answers")
    return check_calls(functions, calls, ground_truth, category)


def render_call(calls: Sequence[dict[str, dict[str, Any]]]) -> str:
    """Calls written in BFCL's output format, ``[f(a=1, b='x'), g()]`` (values as Python literals)."""
    parts = []
    for c in calls:
        (name, args), = c.items()
        parts.append(f"{name}(" + ", ".join(f"{k}={v!r}" for k, v in args.items()) + ")")
    return "[" + ", ".join(parts) + "]"
