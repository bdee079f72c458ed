"""ACBench's ``bfcl`` task: BFCL v4 tool use in prompting mode, scored by lmforge's AST checker.

The five single-turn Python categories of BFCL v4 (simple, multiple, parallel, parallel_multiple,
irrelevance) as the ``bfcl-eval`` package ships them (``BFCL_v4_<category>.json`` plus
``possible_answer/BFCL_v4_<category>.json``). Each entry is prompted the way BFCL prompts a model
without native function calling (its default system prompt, the functions as JSON; see
:mod:`lmforge.eval.bfcl_ast`), and the reply is scored by BFCL's AST rules: ``accuracy`` is 1 for a
correct call list (for irrelevance: for no call), with per-category accuracy as buckets.

The built-in data is a seeded sample of bfcl-eval's own files (``n`` entries per category), so it
needs ``bfcl-eval`` installed (``pip install --no-deps bfcl-eval==2026.3.23``); a user's data folder
with files of the same names goes through the same loader.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmforge.bench.tasks import Context, Item, SingleTurnTask, register, render_messages

# NOTE: BFCL lets a model write up to 4096 tokens; 256 fit the longest gold reply of the five
# categories (an 8-call parallel entry, ~230 SmolLM2 tokens) and keep CPU runs affordable.
MAX_NEW_TOKENS = 256
# NOTE: irrelevance has no gold reply; the reference (for the answer NLL / KL only) is the kind of
# reply BFCL's system prompt asks for ("If none of the functions can be used, point it out").
IRRELEVANT_REFERENCE = "None of the given functions can be used to answer this question."
_SENTINEL = "\x00lmforge-system-probe\x00"


def _system_role_kept(tokenizer: Any) -> bool:
    """Whether the chat template renders a system message (some raise, some drop it silently)."""
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "system", "content": _SENTINEL}, {"role": "user", "content": "hi"}],
            add_generation_prompt=True, tokenize=False)
    except Exception:  # noqa: BLE001 - jinja raise_exception, TemplateError, ...
        return False
    return _SENTINEL in text


def fold_system(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """The system prompt as the opening of the first user turn, as BFCL's handlers for templates
    without a system role do (Gemma: ``system.strip() + "\\n\\n" + user``)."""
    if not messages or messages[0]["role"] != "system":
        return messages
    system, rest = messages[0]["content"].strip(), [dict(m) for m in messages[1:]]
    for m in rest:
        if m["role"] == "user":
            m["content"] = system + "\n\n" + m["content"]
            return rest
    return [{"role": "user", "content": system}] + rest


class BfclTask(SingleTurnTask):
    name = "bfcl"
    capability = "tool_use"
    primary = "accuracy"
    description = ("BFCL v4 simple/multiple/parallel/parallel_multiple/irrelevance, prompting mode: AST-checked "
                   "accuracy, per category")
    default_n = 20  # per category

    def __init__(self) -> None:
        from lmforge.data import bfcl

        self.files = tuple(bfcl.file_name(c) for c in bfcl.CATEGORIES)

    def generate(self, folder: Path, seed: int, n: int) -> None:
        """A seeded sample of ``n`` entries of each category of bfcl-eval's data, in BFCL's format
        (possible answers under ``possible_answer/``); files already there are kept."""
        from lmforge.data import bfcl

        for cat, fname in zip(bfcl.CATEGORIES, self.files):
            if not (folder / fname).is_file():
                bfcl.write(bfcl.sample(cat, seed, n), folder / fname)

    def items(self, path: Path, ctx: Context) -> list[Item]:
        from lmforge.data import bfcl
        from lmforge.eval import bfcl_ast

        fold = ctx.fmt == "chat" and getattr(ctx.tokenizer, "chat_template", None) and not _system_role_kept(ctx.tokenizer)
        out = []
        for rec in bfcl.load(path):
            messages = bfcl_ast.chat_messages(rec.messages, rec.functions)
            if fold:
                messages = fold_system(messages)
            # NOTE: "plain" and "zoo" join the messages with newlines: lmforge's zoo models never
            # saw BFCL's prompt, and BFCL has no base-model format of its own.
            prompt = render_messages(ctx.tokenizer, messages, "chat" if ctx.fmt == "chat" else "plain")
            if rec.ground_truth is None:
                reference = IRRELEVANT_REFERENCE
            else:
                reference = bfcl_ast.render_call(gold_calls(rec.ground_truth, rec.functions))
            # NOTE: no stop strings: BFCL decodes the whole reply (text after the calls fails it).
            out.append(Item(id=rec.id, prompt=prompt, reference=reference, max_new_tokens=MAX_NEW_TOKENS,
                            stop=(), gold=rec, meta={"bucket": rec.category}))
        return out

    def score(self, item: Item, response: str, ctx: Context) -> dict[str, float]:
        from lmforge.eval import bfcl_ast

        rec = item.gold
        verdict = bfcl_ast.evaluate(response, rec.functions, rec.ground_truth, rec.category)
        try:
            decoded = 1.0 if bfcl_ast.decode(response) else 0.0
        except bfcl_ast.DecodeError:
            decoded = 0.0
        return {"accuracy": float(verdict.valid), "decoded": decoded}


def gold_calls(ground_truth: list[dict[str, dict[str, list[Any]]]],
               functions: list[dict[str, Any]] | None = None) -> list[dict[str, dict[str, Any]]]:
    """One correct reply: each parameter's first acceptable value other than the optional marker
    ``""`` (inside dict values and lists of dicts too); optional parameters (``""`` among the
    values) left out unless the function doc requires them, and parameters the doc lacks left out.

    NOTE: BFCL's data marks a few doc-required parameters optional and lists a few parameters the
    doc lacks; the reply follows whichever rule would reject it."""
    docs = {f["name"]: f["parameters"] for f in functions or []}
    calls = []
    for call in ground_truth:
        (name, params), = call.items()
        doc = docs.get(name)
        calls.append({name: _pick_params(params, doc)})
    return calls


def _pick_params(params: dict[str, Any], doc: dict[str, Any] | None = None) -> dict[str, Any]:
    args = {}
    for p, alts in params.items():
        if not isinstance(alts, list):
            continue
        required = doc is None or p in doc.get("required", ())
        if doc is not None and p not in doc.get("properties", {}):
            continue
        if "" in alts and not required:
            continue
        chosen = [a for a in alts if a != ""]
        if chosen:
            args[p] = _pick_value(chosen[0])
    return args


def _pick_value(v: Any) -> Any:
    # A dict answer maps each key to its own acceptable values; so does each dict in a list of dicts.
    if isinstance(v, dict):
        return _pick_params(v)
    if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
        return [_pick_params(x) for x in v]
    return v


register(BfclTask())
