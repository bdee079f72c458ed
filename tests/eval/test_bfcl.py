"""The ``bfcl`` task: lmforge's BFCL AST checker against bfcl-eval's own, the prompt, the loader.

The reference is bfcl-eval's own evaluation path (``eval_runner._evaluate_single_ast_entry`` and
``_evaluate_single_relevance_entry`` with the prompting-mode decoder ``default_decode_ast_prompting``,
which is what ``OSSHandler.decode_ast`` calls). It imports once a few modules it does not use on
that path are stubbed in ``sys.modules`` for the duration of the test module:

* ``bfcl_eval.constants.model_config``: ``ast_checker`` reads ``MODEL_CONFIG_MAPPING`` only to ask
  whether a model needs ``.`` turned into ``_`` in function names (FC models only); the real module
  imports every provider handler, hence anthropic, openai, cohere, mistralai, google-genai ... The
  stub holds one prompting model, ``underscore_to_dot=False``, as every prompting model has.
* ``tree_sitter``, ``tree_sitter_java``, ``tree_sitter_javascript`` (the Java / JavaScript call
  parsers), ``tenacity`` (API retries), ``overrides`` and ``dotenv`` (handlers, runner): stubbed
  only when not installed.

The pairs: every real SmolLM2-135M-Instruct reply in ``data/bfcl_smollm2_outputs.jsonl`` (made by
``data/make_bfcl_outputs.py``), gold answers of packaged entries rendered and then perturbed one
rule at a time, odd syntax, and hand-made entries for the rules the packaged data rarely reaches
(variables, lists of dicts, nested dicts, greedy parallel matching).
"""

from __future__ import annotations

import copy
import importlib.util
import json
import random
import sys
import types
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from lmforge.common.errors import UserError
from lmforge.data import bfcl
from lmforge.data.bfcl import BfclRecord
from lmforge.eval import bfcl_ast
from lmforge.eval.bfcl_ast import decode, evaluate, render_call

HAVE_BFCL = importlib.util.find_spec("bfcl_eval") is not None
needs_bfcl = pytest.mark.skipif(not HAVE_BFCL, reason=f"bfcl-eval not installed (pip install --no-deps {bfcl.BFCL_PIN})")
FIXTURE = Path(__file__).parent / "data" / "bfcl_smollm2_outputs.jsonl"
MODEL = "lmforge-prompting"


# --------------------------------------------------------------------------------------------------
# bfcl-eval's own checker


class Reference:
    def __init__(self) -> None:
        cfg = types.ModuleType("bfcl_eval.constants.model_config")
        cfg.MODEL_CONFIG_MAPPING = {MODEL: types.SimpleNamespace(underscore_to_dot=False)}  # type: ignore[attr-defined]
        sys.modules["bfcl_eval.constants.model_config"] = cfg
        self.stubbed = []
        for name in ("tree_sitter", "tree_sitter_java", "tree_sitter_javascript", "tenacity", "overrides", "dotenv"):
            if importlib.util.find_spec(name) is None:
                stub = mock.MagicMock(name=name)
                if name == "overrides":
                    stub.override = lambda f: f
                sys.modules[name] = stub
                self.stubbed.append(name)
        import bfcl_eval.eval_checker.eval_runner as runner
        import bfcl_eval.model_handler.utils as hutils
        from bfcl_eval.constants.default_prompts import DEFAULT_SYSTEM_PROMPT_FORMAT
        from bfcl_eval.constants.enums import Language, ReturnFormat

        self.runner, self.hutils = runner, hutils
        self.language, self.fmt = Language.PYTHON, ReturnFormat.PYTHON
        self.default_format = DEFAULT_SYSTEM_PROMPT_FORMAT
        self.handler = types.SimpleNamespace(decode_ast=hutils.default_decode_ast_prompting)

    def valid(self, rec: BfclRecord, output: str) -> bool:
        entry = copy.deepcopy({"id": rec.id, "question": [rec.messages], "function": rec.functions})
        if "relevance" in rec.category:
            res = self.runner._evaluate_single_relevance_entry(self.handler, rec.id, output, entry, MODEL, rec.category)
        else:
            res = self.runner._evaluate_single_ast_entry(
                self.handler, rec.id, output, copy.deepcopy(rec.ground_truth), entry, MODEL, rec.category,
                language=self.language, return_format=self.fmt, has_tool_call_tag=False)
        return bool(res["valid"])


@pytest.fixture(scope="module")
def reference():
    if not HAVE_BFCL:
        pytest.skip("bfcl-eval not installed")
    with mock.patch.dict(sys.modules):  # every stub and bfcl_eval module goes away afterwards
        yield Reference()


# --------------------------------------------------------------------------------------------------
# Pairs


class Raw:
    """A value written as raw source text in a rendered call."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _random_args(params: dict[str, list[Any]], rng: random.Random) -> dict[str, Any]:
    """A random acceptable value per parameter ("" drops it), nested dict answers likewise."""
    args = {}
    for p, alts in params.items():
        if alts:
            v = rng.choice(alts)
            if isinstance(v, dict):
                v = _random_args(v, rng)
            elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
                v = [_random_args(x, rng) for x in v]
            if v != "":
                args[p] = copy.deepcopy(v)
    return args


def _random_gold(gt: list[dict[str, dict[str, list[Any]]]], rng: random.Random) -> list[dict[str, dict[str, Any]]]:
    return [{name: _random_args(params, rng)} for call in gt for name, params in call.items()]


def _param_mutations(doc: dict[str, Any], args: dict[str, Any], expected: dict[str, list[Any]], rng: random.Random):
    """(label, new args) for each rule a parameter of this call can exercise."""
    props = doc["parameters"]["properties"]
    req = doc["parameters"]["required"]
    out = []

    def put(label: str, p: str, v: Any) -> None:
        a = copy.deepcopy(args)
        a[p] = v
        out.append((label, a))

    for p, v in args.items():
        t = props.get(p, {}).get("type")
        it = props.get(p, {}).get("items", {}).get("type")
        if t == "float" and isinstance(v, float) and v == int(v) and abs(v) < 1e15:
            put("float_given_as_int", p, int(v))
        if t == "integer" and type(v) is int:
            put("int_given_as_float", p, float(v))
            put("int_given_as_str", p, str(v))
            put("int_as_expression", p, Raw(f"{v - 3} + 3"))
            put("int_with_unary_plus", p, Raw(f"+{v}"))
            put("int_as_bool", p, bool(v))
        if t == "float" and type(v) in (int, float):
            put("float_given_as_str", p, str(v))
            put("float_negated", p, -v if v else 1.5)
        if t == "boolean" and type(v) is bool:
            put("bool_given_as_int", p, int(v))
            put("bool_flipped", p, not v)
        if t == "string" and type(v) is str and v:
            put("str_upper", p, v.upper())
            put("str_punct_space", p, v.replace(" ", " - ") + ".")
            put("str_quote_swap", p, v.replace('"', "'"))
            put("str_changed", p, v + " zz")
            if v.isidentifier():
                put("str_as_bare_name", p, Raw(v))
        if t in ("array", "tuple") and type(v) is list:
            if len(v) > 1:
                put("list_reversed", p, list(reversed(v)))
                put("list_shorter", p, v[:-1])
            put("list_as_tuple", p, tuple(v))
            if it == "float" and v and all(type(x) is float and x == int(x) for x in v):
                put("float_list_as_ints", p, [int(x) for x in v])
            if it == "integer" and v and all(type(x) is int for x in v):
                put("int_list_as_floats", p, [float(x) for x in v])
            if it == "string" and v and all(type(x) is str for x in v):
                put("str_list_upper", p, [x.upper() for x in v])
            if it == "dict" and v and all(isinstance(x, dict) for x in v):
                d = copy.deepcopy(v)
                d[0]["zz_extra"] = 1
                put("list_dict_extra_key", p, d)
        if t == "dict" and isinstance(v, dict) and v:
            k = rng.choice(sorted(v))
            put("dict_key_dropped", p, {kk: vv for kk, vv in v.items() if kk != k})
            put("dict_extra_key", p, {**v, "zz_extra": 1})
            if isinstance(v[k], str):
                put("dict_value_upper", p, {**v, k: v[k].upper()})
        put("value_none", p, None)
        if t == "string":
            put("value_attribute", p, Raw("math.pi"))
            put("value_call_text", p, Raw("get_value()"))
    for p in args:
        a = {k: v for k, v in args.items() if k != p}
        kind = "required" if p in req else ("optional" if "" in expected.get(p, [""]) else "answer_needed")
        out.append((f"drop_{kind}_param", a))
    for p, alts in expected.items():
        given = [a for a in alts if a != "" and not isinstance(a, dict) and not (isinstance(a, list) and a and isinstance(a[0], dict))]
        if p not in args and "" in alts and given and p in props:
            out.append(("add_optional_param", {**args, p: copy.deepcopy(given[-1])}))
            break
    out.append(("extra_unknown_param", {**args, "zz_extra": 1}))
    spare = [p for p in props if p not in args and p not in expected]
    if spare:
        out.append(("extra_doc_param_not_in_answer", {**args, spare[0]: "x"}))
    return out


def _perturbed(rec: BfclRecord, rng: random.Random) -> list[tuple[str, str]]:
    docs = {f["name"]: f for f in rec.functions}
    if rec.ground_truth is None:
        f = rec.functions[0]
        typed = {"string": "x", "integer": 1, "float": 1.0, "boolean": True, "array": [], "tuple": [], "dict": {}, "any": "x"}
        args = {p: typed[f["parameters"]["properties"][p]["type"]] for p in f["parameters"]["required"]}
        call = render_call([{f["name"]: args}])
        return [("irr_empty", ""), ("irr_empty_list", "[]"), ("irr_refusal", "None of the functions can be used."),
                ("irr_call", call), ("irr_call_no_args", f"[{f['name']}()]"), ("irr_bare_name", f"[{f['name']}]"),
                ("irr_fenced_call", f"```\n{call}\n```"), ("irr_prose_then_call", f"I will call {call}")]
    from lmforge.bench.task_bfcl import gold_calls

    out = [("gold_random_alternatives", render_call(_random_gold(rec.ground_truth, rng)))]
    # Mutations start from the task's reference reply, which bfcl-eval accepts on every entry
    # (test_task_reference_is_correct_for_bfcl_eval), so each one tests a single rule.
    gold = gold_calls(rec.ground_truth, rec.functions)
    out.append(("gold_first_alternatives", render_call(gold)))
    i = rng.randrange(len(gold))
    (name, args), = gold[i].items()
    expected = next(iter(rec.ground_truth[i].values()))
    for label, new in _param_mutations(docs[name], args, expected, rng):
        calls = copy.deepcopy(gold)
        calls[i] = {name: new}
        out.append((label, render_call(calls)))
    calls = copy.deepcopy(gold)
    calls[i] = {name + "_v2": args}
    out.append(("wrong_function_name", render_call(calls)))
    others = [f["name"] for f in rec.functions if f["name"] != name]
    if others:
        calls = copy.deepcopy(gold)
        calls[i] = {others[0]: args}
        out.append(("other_listed_function", render_call(calls)))
    parts = [render_call([c])[1:-1] for c in gold]
    parts[i] = f"{name}(" + ", ".join(repr(v) for v in args.values()) + ")"
    out.append(("positional_args", "[" + ", ".join(parts) + "]"))
    if len(gold) > 1:
        out.append(("calls_reversed", render_call(list(reversed(gold)))))
        shuffled = gold[:]
        rng.shuffle(shuffled)
        out.append(("calls_shuffled", render_call(shuffled)))
        out.append(("call_dropped", render_call(gold[:-1])))
        out.append(("calls_newline_separated", "\n".join(render_call([c]) for c in gold)))
    out.append(("call_duplicated", render_call(gold + gold[:1])))
    text = render_call(gold)
    out += [("fenced", f"```\n{text}\n```"), ("fenced_python", f"```python\n{text}\n```"),
            ("no_brackets", text[1:-1]), ("prose_before", f"Sure! {text}"), ("prose_after", f"{text}\nDone."),
            ("leading_tab", "\t" + text), ("single_quoted", f"'{text}'"), ("trailing_spaces", text + "  \n"),
            ("json_style", json.dumps([{"name": name, "arguments": args}], default=str))]
    return out


def _handmade() -> list[tuple[BfclRecord, str, str]]:
    """Entries for rules the packaged data rarely reaches, with outputs aimed at each."""
    props = {
        "n": {"type": "integer", "description": "count"},
        "ratio": {"type": "float", "description": "ratio"},
        "pts": {"type": "array", "items": {"type": "float"}, "description": "points"},
        "rows": {"type": "array", "items": {"type": "dict"}, "description": "rows"},
        "cfg": {"type": "dict", "description": "config"},
        "pair": {"type": "tuple", "items": {"type": "integer"}, "description": "pair"},
        "any_v": {"type": "any", "description": "anything"},
        "tags": {"type": "array", "items": {"type": "string"}, "description": "tags"},
    }
    doc = {"name": "tool.run", "description": "Run.", "parameters": {"type": "dict", "properties": props, "required": ["n"]}}
    gt = [{"tool.run": {
        "n": ["count_var", 3], "ratio": [0.5, ""], "pts": [[1.0, 2.5], ""], "rows": [[{"a": ["X"], "b": ["", 2]}], ""],
        "cfg": [{"mode": ["Fast Mode"], "level": [1, ""]}, ""], "pair": [[1, 2], ""], "any_v": ["", "hello"], "tags": ["", ["a-b", "C"]],
    }}]
    rec = BfclRecord("simple_python_9001", "simple_python", [{"role": "user", "content": "q"}], [doc], gt)
    # Answer typed unlike the doc ("variable"): an integer parameter whose answer is a string.
    gt_var = [{"tool.run": {"n": ["count_var"]}}]
    rec_var = BfclRecord("simple_python_9002", "simple_python", [{"role": "user", "content": "q"}], [doc], gt_var)
    outs = [
        "[tool.run(n=3)]", "[tool.run(n=count_var)]", "[tool.run(n='count_var')]", "[tool.run(n='COUNT_VAR')]",
        "[tool.run(n=3, ratio=0.5)]", "[tool.run(n=3, ratio=1/2)]", "[tool.run(n=3, ratio=0.25*2)]",
        "[tool.run(n=3, pts=[1.0, 2.5])]", "[tool.run(n=3, pts=[1, 2.5])]", "[tool.run(n=3, pts=(1.0, 2.5))]",
        "[tool.run(n=3, pts=[])]", "[tool.run(n=3, rows=[{'a': 'x'}])]", "[tool.run(n=3, rows=[{'a': 'x', 'b': 2}])]",
        "[tool.run(n=3, rows=[{'a': 'x', 'c': 2}])]", "[tool.run(n=3, rows=[{'b': 2}])]", "[tool.run(n=3, rows=[])]",
        "[tool.run(n=3, rows={'a': 'x'})]", "[tool.run(n=3, cfg={'mode': 'fast-mode'})]",
        "[tool.run(n=3, cfg={'mode': 'fast mode', 'level': 1})]", "[tool.run(n=3, cfg={'mode': 'slow'})]",
        "[tool.run(n=3, cfg={'level': 1})]", "[tool.run(n=3, cfg={})]", "[tool.run(n=3, cfg={'mode': 'Fast Mode', 'x': 1})]",
        "[tool.run(n=3, pair=(1, 2))]", "[tool.run(n=3, pair=[1, 2])]", "[tool.run(n=3, pair=(2, 1))]",
        "[tool.run(n=3, any_v='Hello')]", "[tool.run(n=3, any_v=5)]", "[tool.run(n=3, tags=['A_B', 'c'])]",
        "[tool.run(n=3, tags=['ab', 'c'])]", "[tool.run(n=3, tags='a-b')]", "[tool.run(n=3.0)]", "[tool.run(n=True)]",
        "[tool.run(n=-(-3))]", "[tool.run(n=--3)]", "[tool.run(n=2**1+1)]", "[tool.run(n=+3)]", "[tool.run(n=~-4)]",
        "[tool.run(n=7 // 2)]", "[tool.run(n=3, ratio=-0.5)]", "[tool.run(n=3, ratio=...)]", "[tool.run(n=3, ratio=None)]",
        "[tool.run(n=3, any_v=b'hello')]", "[tool.run(n=3, any_v=f'hello')]", "[tool.run(n=3, any_v=lambda: 1)]",
        "[tool.run(n=3, any_v={'hello'})]", "[tool.run(n=3, any_v=x[0])]", "[tool.run(n=3, any_v=hello)]",
        "[tool.run(n=3, **extra)]", "[tool.run(n=3, cfg={**base})]", "[tool.run(n=3, cfg={[1]: 2})]",
        "[tool.run(n=3, any_v=1 if a else 2)]", "[tool.run(n=3, any_v=not_a_name.attr)]", "[tool.run(n=3, ratio=1/0)]",
        "[tool.run(n=3, any_v='he' + 'llo')]", "[tool.run(n=3, tags=['a-b'] + ['C'])]", "[tool.run(n=3, pts=[1.0, 2.5][0:2])]",
        "[tool.run(n=3, any_v=-'x')]", "[tool.run(n=3, any_v=tool.helper(k=1))]", "[x.tool.run(n=3)]", "[run(n=3)]",
        "[tool.run(n=3)][0]", "[[tool.run(n=3)]]", "[tool.run(n=3), 4]", "[tool.run(3)]", "[tool.run(n=3) for _ in x]",
        "tool.run(n=3)", "[tool.run(n=3)", "tool.run(n=3)]", "", "[]", "[tool.run(n=3)]\n\n", "``[tool.run(n=3)]``",
        "[tool.run(n=3) ]", "[tool.run(\n  n=3,\n)]", "[tool.run(n=3), tool.run(n=3)]", "[tool.run(n=3,)]",
        "[tool.run(n=3, n=4)]", "[tool.run(n=1e400 - 1e400)]", "[tool.run(n='3')]", "[tool.run(n=0x3)]",
    ]
    pairs = [(rec, o, "handmade") for o in outs] + [(rec_var, o, "handmade_variable") for o in outs[:8]]
    # Parallel: order-free, greedy; the second entry has a perfect matching greedy misses.
    f = {"name": "pick", "description": "Pick.", "parameters": {"type": "dict", "properties": {
        "k": {"type": "string", "description": "k"}}, "required": ["k"]}}
    par = BfclRecord("parallel_9001", "parallel", [{"role": "user", "content": "q"}], [f],
                     [{"pick": {"k": ["a"]}}, {"pick": {"k": ["b"]}}])
    greedy = BfclRecord("parallel_9002", "parallel", [{"role": "user", "content": "q"}], [f],
                        [{"pick": {"k": ["a", "b"]}}, {"pick": {"k": ["a"]}}])
    for o in ["[pick(k='a'), pick(k='b')]", "[pick(k='b'), pick(k='a')]", "[pick(k='a'), pick(k='a')]",
              "[pick(k='B'), pick(k='A')]", "[pick(k='a')]", "[pick(k='a'), pick(k='b'), pick(k='b')]"]:
        pairs += [(par, o, "handmade_parallel"), (greedy, o, "handmade_greedy")]
    return pairs


def _fixture() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    lines = [json.loads(x) for x in FIXTURE.read_text(encoding="utf-8").splitlines() if x.strip()]
    return lines[0]["_meta"], lines[1:]


def _all_pairs() -> list[tuple[BfclRecord, str, str]]:
    by_id = {r.id: r for c in bfcl.CATEGORIES for r in bfcl.load_packaged(c)}
    _, real = _fixture()
    pairs = [(by_id[x["id"]], x["output"], "smollm2") for x in real]
    rng = random.Random(20250317)
    for c in bfcl.CATEGORIES:
        recs = bfcl.load_packaged(c)
        for rec in rng.sample(recs, 12 if c == "irrelevance" else 16):
            pairs += [(rec, out, label) for label, out in _perturbed(rec, rng)]
    return pairs + _handmade()


# --------------------------------------------------------------------------------------------------
# Agreement with bfcl-eval


@needs_bfcl
def test_agrees_with_bfcl_eval_checker(reference: Reference, capsys: pytest.CaptureFixture[str]) -> None:
    pairs = _all_pairs()
    real = sum(1 for _, _, label in pairs if label == "smollm2")
    disagreements = []
    verdicts = Counter()
    for rec, out, label in pairs:
        ref = reference.valid(rec, out)
        got = evaluate(out, rec.functions, rec.ground_truth, rec.category)
        verdicts[ref] += 1
        if got.valid != ref:
            disagreements.append(f"{rec.id} [{label}] bfcl={ref} lmforge={got.valid} ({got.kind}: {got.error}) output={out!r}")
    agreement = 1 - len(disagreements) / len(pairs)
    with capsys.disabled():
        print(f"\nBFCL checker agreement: {agreement:.2%} on {len(pairs)} pairs ({real} real SmolLM2 outputs; "
              f"{verdicts[True]} valid / {verdicts[False]} invalid per bfcl-eval); stubbed: {reference.stubbed}")
        for d in disagreements:
            print("  DISAGREE", d)
    assert len(pairs) >= 500 and real >= 150
    assert 0.2 < verdicts[True] / len(pairs) < 0.8  # both verdicts well represented
    assert agreement >= 0.99, "\n".join(disagreements)


@needs_bfcl
def test_task_reference_is_correct_for_bfcl_eval(reference: Reference) -> None:
    """The gold reply the task uses (answer NLL / KL) passes bfcl-eval's checker on every packaged
    entry of the four AST categories."""
    from lmforge.bench.task_bfcl import gold_calls

    n = 0
    for c in bfcl.CATEGORIES[:4]:
        for rec in bfcl.load_packaged(c):
            assert reference.valid(rec, render_call(gold_calls(rec.ground_truth, rec.functions))), rec.id
            n += 1
    assert n == 1000


@needs_bfcl
def test_perturbations_reach_each_rule(reference: Reference) -> None:
    """The perturbations reach each rule, and bfcl-eval's verdict on the clear-cut ones is what
    BFCL's rules say (so the agreement test compares on both verdicts of every rule)."""
    seen: dict[str, set[bool]] = defaultdict(set)
    for rec, out, label in _all_pairs():
        seen[label].add(reference.valid(rec, out))
    must_pass = ["gold_first_alternatives", "add_optional_param", "float_given_as_int", "str_upper",
                 "str_punct_space", "str_quote_swap", "str_as_bare_name", "fenced", "no_brackets", "trailing_spaces",
                 "calls_reversed", "calls_shuffled", "irr_empty", "irr_empty_list", "irr_refusal", "irr_bare_name",
                 "int_as_expression"]
    must_fail = ["int_given_as_float", "int_given_as_str", "bool_given_as_int", "str_changed", "drop_required_param",
                 "extra_unknown_param", "wrong_function_name", "call_dropped", "call_duplicated", "fenced_python",
                 "prose_before", "prose_after", "irr_call", "irr_call_no_args", "value_none", "float_list_as_ints",
                 "value_attribute", "list_as_tuple", "json_style", "calls_newline_separated", "leading_tab",
                 "single_quoted", "positional_args", "other_listed_function"]
    for label in must_pass:
        assert seen[label] == {True}, label
    for label in must_fail:
        assert seen[label] == {False}, label


@needs_bfcl
def test_smollm2_fixture_scores(reference: Reference, capsys: pytest.CaptureFixture[str]) -> None:
    """SmolLM2's accuracy per category, lmforge's and bfcl-eval's (the numbers in the report)."""
    meta, real = _fixture()
    by_id = {r.id: r for c in bfcl.CATEGORIES for r in bfcl.load_packaged(c)}
    ours: dict[str, list[float]] = defaultdict(list)
    theirs: dict[str, list[float]] = defaultdict(list)
    for x in real:
        rec = by_id[x["id"]]
        assert rec.category == x["category"]
        ours[rec.category].append(float(evaluate(x["output"], rec.functions, rec.ground_truth, rec.category).valid))
        theirs[rec.category].append(float(reference.valid(rec, x["output"])))
    assert set(ours) == set(bfcl.CATEGORIES) and all(len(v) >= 25 for v in ours.values())
    with capsys.disabled():
        print(f"\nSmolLM2-135M-Instruct ({meta['dtype']}, greedy, {meta['max_new_tokens']} new tokens), accuracy:")
        for c in bfcl.CATEGORIES:
            print(f"  {c:18s} n={len(ours[c]):3d} lmforge={sum(ours[c]) / len(ours[c]):.3f} "
                  f"bfcl-eval={sum(theirs[c]) / len(theirs[c]):.3f}")
    for c in bfcl.CATEGORIES:
        assert sum(ours[c]) == sum(theirs[c]), c


@needs_bfcl
def test_prompt_is_bfcl_default_prompt(reference: Reference) -> None:
    """The messages lmforge builds are the ones bfcl-eval builds for a prompting model."""
    from bfcl_eval.utils import add_language_specific_hint_to_function_doc

    checked = 0
    for c in bfcl.CATEGORIES:
        for rec in bfcl.load_packaged(c)[:5]:
            entries = add_language_specific_hint_to_function_doc([copy.deepcopy(rec.to_entry())])
            theirs = reference.hutils.system_prompt_pre_processing_chat_model(
                entries[0]["question"][0], entries[0]["function"], rec.id)
            assert bfcl_ast.chat_messages(rec.messages, rec.functions) == theirs
            checked += 1
    # An entry with its own system message: BFCL's prompt goes first in that message.
    rec = bfcl.load_packaged("simple_python")[0]
    own = [{"role": "system", "content": "Be terse."}] + rec.messages
    entry = add_language_specific_hint_to_function_doc([{"id": rec.id, "question": [copy.deepcopy(own)], "function": copy.deepcopy(rec.functions)}])[0]
    assert bfcl_ast.chat_messages(own, rec.functions) == reference.hutils.system_prompt_pre_processing_chat_model(
        entry["question"][0], entry["function"], rec.id)
    assert checked == 25
    assert reference.default_format == "ret_fmt=python&tool_call_tag=False&func_doc_fmt=json&prompt_fmt=plaintext&style=classic"


@needs_bfcl
def test_decoder_matches_bfcl_decoder(reference: Reference) -> None:
    """Decoded values (not only verdicts) are BFCL's, for outputs that decode."""
    outs = ["[f(a=1, b='x', c=[1, 2.5], d={'k': (1, 2)})]", "[m.n.f(a=-2, b=2*3, c=g(1), d=g(k=2), e=x[0], f=name)]",
            "f(a=None, b=True, c=...)", "```\n[f(a=1), g(b=2)]\n```", "[f(1, 2, a=3)]", "[f(a=+3, b=~1, c=not 1)]",
            "[a().b(x=1)]", "[f(a='He said \"hi\"')]", "[f(a=1e3, b=0x10, c=1j)]", "[f(a={'x': [1, {'y': 2}]})]"]
    for out in outs:
        assert decode(out) == reference.hutils.default_decode_ast_prompting(out), out


# --------------------------------------------------------------------------------------------------
# Unit tests: expected verdicts from BFCL's rules, written by hand

DOC = {"name": "calc.area", "description": "Area.", "parameters": {"type": "dict", "required": ["base", "height"], "properties": {
    "base": {"type": "integer", "description": ""}, "height": {"type": "float", "description": ""},
    "unit": {"type": "string", "description": ""}, "dims": {"type": "array", "items": {"type": "float"}, "description": ""},
    "opts": {"type": "dict", "description": ""}, "pair": {"type": "tuple", "items": {"type": "integer"}, "description": ""},
    "flag": {"type": "boolean", "description": ""}, "note": {"type": "string", "description": ""}}}}
GT = [{"calc.area": {"base": [10], "height": [5.0], "unit": ["units", "meters", ""], "dims": [[1.0, 2.0], ""],
                     "opts": [{"a": ["x"], "b": ["", 1]}, ""], "pair": [[1, 2], ""], "flag": ["", False],
                     "note": ["New York, NY"]}}]
OK = "[calc.area(base=10, height=5.0, note='New York, NY'"


@pytest.mark.parametrize("output,valid", [
    (OK + ")]", True),
    ("[calc.area(base=10, height=5, note='New York, NY')]", True),  # int accepted as float
    ("[calc.area(base=10.0, height=5.0, note='New York, NY')]", False),  # float not accepted as int
    ("[calc.area(base=True, height=5.0, note='New York, NY')]", False),  # bool is not an int
    ("[calc.area(base='10', height=5.0, note='New York, NY')]", False),
    ("[calc.area(height=5.0, note='New York, NY')]", False),  # required missing
    ("[calc.area(base=10, height=5.0)]", False),  # answer parameter with no "" missing
    ("[calc.area(base=10, height=5.0, note='new york ny')]", True),  # spaces, commas, case
    ("[calc.area(base=10, height=5.0, note='NEW-YORK/NY.')]", True),
    ("[calc.area(base=10, height=5.0, note='New York')]", False),
    (OK + ", unit='Meters')]", True), (OK + ", unit='feet')]", False),
    # No int->float inside lists, but the optional "" among the alternatives passes the element
    # type check (BFCL checks element types per list alternative; a non-list one passes).
    (OK + ", dims=[1.0, 2.0])]", True), (OK + ", dims=[1, 2])]", True),
    (OK + ", dims=[2.0, 1.0])]", False), (OK + ", dims=(1.0, 2.0))]", False), (OK + ", dims=[])]", True),  # [] ~ ""
    (OK + ", pair=(1, 2))]", True), (OK + ", pair=[1, 2])]", True), (OK + ", pair=(1.0, 2))]", True),  # "" again; 1.0 == 1
    (OK + ", opts={'a': 'X'})]", True), (OK + ", opts={'a': 'x', 'b': 1})]", True),
    (OK + ", opts={'a': 'x', 'c': 1})]", False), (OK + ", opts={'b': 1})]", False), (OK + ", opts={'a': 'y'})]", False),
    (OK + ", flag=False)]", True), (OK + ", flag=0)]", False), (OK + ", flag=True)]", False),
    (OK + ", zz=1)]", False),  # not in the doc
    (OK + ", base=2*5)]", True),  # later keyword wins; arithmetic is evaluated
    ("[calc.area(base=+10, height=5.0, note='New York, NY')]", False),  # BFCL: unary plus negates
    ("[calc.area(base=-(-10), height=5.0, note='New York, NY')]", False),  # nested unary: decode fails
    ("[calc_area(base=10, height=5.0, note='New York, NY')]", False),
    ("```\n[calc.area(base=10, height=5.0, note='New York, NY')]\n```", True),
    ("```python\n[calc.area(base=10, height=5.0, note='New York, NY')]\n```", False),
    ("calc.area(base=10, height=5.0, note='New York, NY')", True),
    ("Sure: [calc.area(base=10, height=5.0, note='New York, NY')]", False),
    ("[calc.area(10, 5.0, note='New York, NY')]", False),  # positional arguments are dropped
    ("[calc.area(base=10, height=5.0, note='New York, NY'), calc.area(base=10, height=5.0, note='New York, NY')]", False),
    ("[calc.area(base=10, height=5.0, note=math.pi)]", False),  # an attribute value fails decoding
])
def test_simple_rules(output: str, valid: bool) -> None:
    v = evaluate(output, [DOC], GT, "simple_python")
    assert v.valid is valid, (output, v)


def test_list_elements_are_not_converted_to_float() -> None:
    gt = copy.deepcopy(GT)
    gt[0]["calc.area"]["dims"] = [[1.0, 2.0]]  # required by the answer: no "" alternative
    assert evaluate(OK + ", dims=[1.0, 2.0])]", [DOC], gt, "simple").valid
    assert not evaluate(OK + ", dims=[1, 2])]", [DOC], gt, "simple").valid
    assert not evaluate(OK + ")]", [DOC], gt, "simple").valid


def test_variable_answers() -> None:
    """An answer typed unlike the doc is a "variable": the value may have the answer's type and is
    then compared exactly (no string normalisation)."""
    gt = [{"calc.area": {"base": ["b"], "height": [5.0]}}]
    assert evaluate("[calc.area(base=b, height=5.0)]", [DOC], gt, "simple").valid  # a bare name decodes as its text
    assert evaluate("[calc.area(base='b', height=5.0)]", [DOC], gt, "simple").valid
    assert not evaluate("[calc.area(base='B', height=5.0)]", [DOC], gt, "simple").valid
    assert not evaluate("[calc.area(base=3, height=5.0)]", [DOC], gt, "simple").valid


def test_multiple_and_parallel_rules() -> None:
    other = copy.deepcopy(DOC)
    other["name"] = "calc.volume"
    gt = [{"calc.volume": {"base": [1], "height": [2.0]}}]
    assert evaluate("[calc.volume(base=1, height=2)]", [DOC, other], gt, "multiple").valid
    assert not evaluate("[calc.area(base=1, height=2)]", [DOC, other], gt, "multiple").valid
    assert not evaluate("[calc.volume(base=1, height=2), calc.area(base=1, height=2)]", [DOC, other], gt, "multiple").valid
    gt2 = [{"calc.volume": {"base": [1], "height": [2.0]}}, {"calc.area": {"base": [3], "height": [4.0]}}]
    for cat in ("parallel", "parallel_multiple"):
        assert evaluate("[calc.area(base=3, height=4), calc.volume(base=1, height=2)]", [DOC, other], gt2, cat).valid
        assert evaluate("calc.volume(base=1, height=2), calc.area(base=3, height=4)", [DOC, other], gt2, cat).valid
        assert not evaluate("[calc.area(base=3, height=4)]", [DOC, other], gt2, cat).valid
        assert not evaluate("[calc.area(base=3, height=4), calc.area(base=3, height=4)]", [DOC, other], gt2, cat).valid
    # BFCL matches greedily: the first expected call takes the first passing output even when the
    # other assignment would have matched both.
    f = {"name": "pick", "description": "", "parameters": {"type": "dict", "required": ["k"], "properties": {"k": {"type": "string", "description": ""}}}}
    gt3 = [{"pick": {"k": ["a", "b"]}}, {"pick": {"k": ["a"]}}]
    assert evaluate("[pick(k='b'), pick(k='a')]", [f], gt3, "parallel").valid
    assert not evaluate("[pick(k='a'), pick(k='b')]", [f], gt3, "parallel").valid


def test_irrelevance_rules() -> None:
    for out, valid in [("", True), ("[]", True), ("I cannot do that.", True), ("[calc.area]", True),
                       ("[calc.area()]", False), ("calc.area(base=1)", False), ("```\n[]\n```", True)]:
        assert evaluate(out, [DOC], None, "irrelevance").valid is valid, out


def test_decode_values() -> None:
    assert decode("[f(a=1, b='x'), m.g(c=[1, 2.5])]") == [{"f": {"a": 1, "b": "x"}}, {"m.g": {"c": [1, 2.5]}}]
    assert decode("f(x=g(1), y=g(k=2), z=v[0], w=name, e=...)") == [{"f": {"x": "g(1)", "y": {"g": {"k": 2}}, "z": "v[0]", "w": "name", "e": "..."}}]
    assert decode("[f(x=(1, 2), y={'a': -1.5}, z=2**3 - 1)]") == [{"f": {"x": (1, 2), "y": {"a": -1.5}, "z": 7}}]
    assert decode("[a().b(x=1)]") == [{"b": {"x": 1}}]
    assert decode("``\n[]\n``") == []
    for bad in ["[f(x=1)] and more", "[1, 2]", "[[f(x=1)]]", "[f(x={1, 2})]", "[f(x=lambda: 1)]", "[f(x=y + 1)]",
                "[f(x=9**9**9)]", "[f(x='a' * 10**9)]", "[f(x=abs(-1) * 2)]", "[f(x=f'{y}')]", "[f(x=-y)]", "[f(x={**k})]"]:
        with pytest.raises(bfcl_ast.DecodeError):
            decode(bad)


def test_normalize_string_is_bfcls() -> None:
    assert bfcl_ast.normalize_string("April 1, 2024") == bfcl_ast.normalize_string("april 1 2024") == "april12024"
    assert bfcl_ast.normalize_string("it's a/b-c_d*e^f.") == 'it"sabcdef'


def test_system_prompt_text() -> None:
    funcs = [{"name": "f", "description": "Do f.", "parameters": {"type": "dict", "properties": {}, "required": []}}]
    msgs = bfcl_ast.chat_messages([{"role": "user", "content": "hi"}], funcs)
    assert [m["role"] for m in msgs] == ["system", "user"] and msgs[1]["content"] == "hi"
    text = msgs[0]["content"]
    assert text.startswith("You are an expert in composing functions.You are given a question")
    assert "func_name2(params)].  You SHOULD NOT include any other text" in text
    assert text.endswith("Here is a list of functions in json format that you can invoke.\n"
                         + json.dumps([{**funcs[0], "description": "Do f." + bfcl_ast.PYTHON_HINT}], indent=4) + "\n")
    assert funcs[0]["description"] == "Do f."  # the record itself is untouched


# --------------------------------------------------------------------------------------------------
# Loader: BFCL's format, one-line errors


def _write_entry(folder: Path, category: str, entries: list[Any], answers: list[Any] | None) -> Path:
    path = folder / bfcl.file_name(category)
    path.write_text("".join((e if isinstance(e, str) else json.dumps(e)) + "\n" for e in entries))
    if answers is not None:
        (folder / "possible_answer").mkdir(exist_ok=True)
        bfcl.answers_path(path).write_text("".join((a if isinstance(a, str) else json.dumps(a)) + "\n" for a in answers))
    return path


ENTRY = {"id": "simple_python_0", "question": [[{"role": "user", "content": "Area of base 10, height 5?"}]],
         "function": [DOC]}
ANSWER = {"id": "simple_python_0", "ground_truth": GT}


def _one_line_error(fn, *args) -> str:
    with pytest.raises(UserError) as exc:
        fn(*args)
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_user_files_load_and_score(tmp_path: Path) -> None:
    path = _write_entry(tmp_path, "simple_python", [ENTRY], [ANSWER])
    (rec,) = bfcl.load(path)
    assert rec.category == "simple_python" and rec.ground_truth == GT and rec.where == f"{path}:1"
    assert evaluate("[calc.area(base=10, height=5, note='new york ny')]", rec.functions, rec.ground_truth, rec.category).valid
    irr = _write_entry(tmp_path, "irrelevance", [{**ENTRY, "id": "irrelevance_0"}], None)
    assert bfcl.load(irr)[0].ground_truth is None


@pytest.mark.parametrize("entry,answer,needle", [
    ("{not json", ANSWER, ":1: not valid JSON"),
    ([1, 2], ANSWER, ":1: not a BFCL entry"),
    ({k: v for k, v in ENTRY.items() if k != "function"}, ANSWER, ":1: not a BFCL entry: missing field 'function'"),
    ({**ENTRY, "question": "hi"}, ANSWER, ":1: BFCL field 'question' must be"),
    ({**ENTRY, "question": [[{"role": "user"}]]}, ANSWER, ":1: each BFCL message"),
    ({**ENTRY, "function": [{**DOC, "parameters": {**DOC["parameters"], "properties": {"x": {"type": "object"}}}}]}, ANSWER,
     ":1: function 'calc.area' parameter 'x': type 'object' is not a BFCL Python type"),
    ({**ENTRY, "function": [{**DOC, "parameters": {**DOC["parameters"], "properties": {"x": {"type": "array"}}}}]}, ANSWER,
     ":1: function 'calc.area' parameter 'x': an array needs 'items'"),
    (ENTRY, {**ANSWER, "id": "simple_python_7"}, "possible_answer/BFCL_v4_simple_python.json:1: possible answer for id 'simple_python_7'"),
    (ENTRY, {"id": "simple_python_0"}, "BFCL_v4_simple_python.json:1: not a BFCL possible answer"),
    (ENTRY, {**ANSWER, "ground_truth": [{"nope": {}}]}, ":1: ground truth calls 'nope'"),
    (ENTRY, {**ANSWER, "ground_truth": [{"calc.area": {"base": 10}}]}, ":1: ground truth of 'calc.area' parameter 'base' must be a list"),
])
def test_bad_files_are_one_line_errors_naming_file_and_line(tmp_path: Path, entry: Any, answer: Any, needle: str) -> None:
    path = _write_entry(tmp_path, "simple_python", [entry], [answer])
    msg = _one_line_error(bfcl.load, path)
    assert needle in msg and str(tmp_path) in msg, msg


def test_bad_second_line_names_line_two(tmp_path: Path) -> None:
    path = _write_entry(tmp_path, "multiple", [{**ENTRY, "id": "multiple_0"}, {"id": "multiple_1", "question": []}], None)
    msg = _one_line_error(bfcl.load, path)
    assert msg.startswith(f"{path}:2:")


def test_missing_answers_and_bad_names(tmp_path: Path) -> None:
    path = _write_entry(tmp_path, "parallel", [{**ENTRY, "id": "parallel_0"}], None)
    assert "possible_answer/BFCL_v4_parallel.json" in _one_line_error(bfcl.load, path)
    other = tmp_path / "tools.json"
    other.write_text(json.dumps(ENTRY) + "\n")
    assert "not a BFCL file name" in _one_line_error(bfcl.load, other)
    java = _write_entry(tmp_path, "simple_java", [ENTRY], [ANSWER])
    assert "not a single-turn Python category" in _one_line_error(bfcl.load, java)
    short = _write_entry(tmp_path, "simple_python", [ENTRY, {**ENTRY, "id": "simple_python_1"}], [ANSWER])
    assert "1 possible answers for the 2 entries" in _one_line_error(bfcl.load, short)


def test_not_installed_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "bfcl_eval" else real(name, *a))
    msg = _one_line_error(bfcl.package_data_dir)
    assert "pip install --no-deps bfcl-eval==2026.3.23" in msg


@needs_bfcl
def test_packaged_data_loads_without_importing_bfcl_eval() -> None:
    before = {m for m in sys.modules if m.startswith("bfcl_eval")}
    sizes = {c: len(bfcl.load_packaged(c)) for c in bfcl.CATEGORIES}
    assert sizes == {"simple_python": 400, "multiple": 200, "parallel": 200, "parallel_multiple": 200, "irrelevance": 240}
    assert {m for m in sys.modules if m.startswith("bfcl_eval")} == before


# --------------------------------------------------------------------------------------------------
# The ACBench task


class _Tok:
    """A chat tokenizer stand-in: ``<role>content</role>`` per message; ``system`` as configured."""

    chat_template = "stand-in"

    def __init__(self, system: str = "keep") -> None:
        self.system = system

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=False):
        out = ""
        for m in messages:
            if m["role"] == "system":
                if self.system == "raise":
                    raise ValueError("System role not supported")
                if self.system == "drop":
                    continue
            out += f"<{m['role']}>{m['content']}</{m['role']}>"
        return out + ("<assistant>" if add_generation_prompt else "")


@needs_bfcl
def test_task_generates_sample_and_scores_gold(tmp_path: Path) -> None:
    from lmforge.bench.tasks import Context, get_task

    task = get_task("bfcl")
    assert (task.capability, task.primary) == ("tool_use", "accuracy")
    assert task.files == ("BFCL_v4_simple_python.json", "BFCL_v4_multiple.json", "BFCL_v4_parallel.json",
                          "BFCL_v4_parallel_multiple.json", "BFCL_v4_irrelevance.json")
    task.generate(tmp_path / "a", 3, 4)
    task.generate(tmp_path / "b", 3, 4)
    task.generate(tmp_path / "c", 4, 4)
    assert len(task.paths(tmp_path / "a")) == 5
    assert sorted(p.name for p in (tmp_path / "a" / "possible_answer").iterdir()) == sorted(task.files[:4])
    for f in task.files:
        assert (tmp_path / "a" / f).read_text() == (tmp_path / "b" / f).read_text()
    assert any((tmp_path / "a" / f).read_text() != (tmp_path / "c" / f).read_text() for f in task.files)
    packaged = {r.id: r for c in bfcl.CATEGORIES for r in bfcl.load_packaged(c)}
    ctx = Context(tokenizer=_Tok(), fmt="chat")
    items = [it for p in task.paths(tmp_path / "a") for it in task.items(p, ctx)]
    assert len(items) == 20 and Counter(it.meta["bucket"] for it in items) == Counter({c: 4 for c in bfcl.CATEGORIES})
    for it in items:
        rec = packaged[it.id]  # the sample is bfcl-eval's own entries, unchanged
        assert it.gold.to_entry() == rec.to_entry() and it.gold.ground_truth == rec.ground_truth
        assert it.prompt.startswith("<system>You are an expert in composing functions.")
        assert it.prompt.endswith(f"<user>{rec.messages[0]['content']}</user><assistant>")
        assert task.score(it, it.reference, ctx)["accuracy"] == 1.0  # the gold reply, and for irrelevance a refusal
        wrong = "[nothing_here(x=1)]"
        assert task.score(it, wrong, ctx) == {"accuracy": 0.0, "decoded": 1.0}
        # The floor ACBench's report compares with: an empty reply is right on irrelevance alone.
        assert task.score(it, "", ctx)["accuracy"] == (1.0 if it.meta["bucket"] == "irrelevance" else 0.0)
    # Existing files are kept.
    first = (tmp_path / "a" / task.files[0]).read_text()
    task.generate(tmp_path / "a", 99, 2)
    assert (tmp_path / "a" / task.files[0]).read_text() == first


@needs_bfcl
@pytest.mark.parametrize("system", ["raise", "drop"])
def test_template_without_system_role_folds_prompt_into_user_turn(tmp_path: Path, system: str) -> None:
    from lmforge.bench.tasks import Context, get_task

    task = get_task("bfcl")
    task.generate(tmp_path, 0, 2)
    items = task.items(tmp_path / task.files[0], Context(tokenizer=_Tok(system), fmt="chat"))
    for it in items:
        assert it.prompt.startswith("<user>You are an expert in composing functions.")
        assert "that you can invoke.\n[" in it.prompt and "]\n\n" in it.prompt
        assert it.prompt.count("<user>") == 1
    plain = task.items(tmp_path / task.files[0], Context(tokenizer=_Tok(), fmt="plain"))
    assert plain[0].prompt.startswith("You are an expert") and "<" not in plain[0].prompt[:5]
