"""BFCL (Berkeley Function Calling Leaderboard) files: find the packaged data, read and validate
BFCL's format, write seeded samples.

A BFCL category file (``BFCL_v4_<category>.json``, shipped in the ``bfcl-eval`` package's ``data/``
folder) is JSON lines, one test entry a line::

    {"id": "simple_python_0",
     "question": [[{"role": "user", "content": "..."}]],          # turns of messages; one turn here
     "function": [{"name": "calculate_triangle_area", "description": "...",
                   "parameters": {"type": "dict",
                                  "properties": {"base": {"type": "integer", "description": "..."}},
                                  "required": ["base"]}}]}

and its possible answers, ``possible_answer/BFCL_v4_<category>.json``, one line per entry in the
same order::

    {"id": "simple_python_0", "ground_truth": [{"calculate_triangle_area": {"base": [10], "unit": ["units", ""]}}]}

Each parameter lists its acceptable values; ``""`` among them marks the parameter optional.
Irrelevance categories have no possible answers (the model must not call anything).

Checked before writing this by hand: ``bfcl_eval.utils.load_file`` / ``load_dataset_entry`` read
the same files but importing ``bfcl_eval`` pulls in every provider SDK (anthropic, openai, ...),
tree-sitter and more, which lmforge does not depend on; and they validate nothing (a malformed
line is a KeyError deep in the checker). This module locates the package's data with
``importlib.util.find_spec`` (no import) and turns every format error into a one-line
:class:`~lmforge.common.errors.UserError` naming the file and line.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmforge.common.errors import UserError
from lmforge.common.io import atomic_write_text, parse_json_lines, read_user_text

__all__ = [
    "BFCL_PIN",
    "CATEGORIES",
    "PYTHON_TYPES",
    "BfclRecord",
    "answers_path",
    "category_of",
    "file_name",
    "load",
    "load_packaged",
    "package_data_dir",
    "sample",
    "write",
]

BFCL_PIN = "bfcl-eval==2026.3.23"
VERSION_PREFIX = "BFCL_v4"
# The five single-turn Python categories of BFCL v4's non-live AST group (the file names of
# bfcl-eval's data folder; "simple" is "simple_python" since v4 split out Java and JavaScript).
CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance")
# The parameter types of BFCL's Python function docs (ast_checker's PYTHON_TYPE_MAPPING keys).
PYTHON_TYPES = ("string", "integer", "float", "boolean", "array", "tuple", "dict", "any")
_NESTED = ("array", "tuple")
_FILE_RE = re.compile(r"^BFCL_v\d+_(?P<cat>[a-z_]+)\.json$")
# Categories whose entries lmforge's Python AST checker can score (single-turn, Python).
_UNSUPPORTED = ("java", "javascript", "multi_turn", "memory", "web_search", "format_sensitivity")


@dataclass
class BfclRecord:
    """One BFCL test entry with its possible answers.

    Attributes:
        id: the entry's id (``simple_python_0``).
        category: its test category, from the file name (``simple_python``, ``irrelevance`` ...).
        messages: the (single) turn's messages, as in the file.
        functions: the function docs, as in the file (no language hint; see
            :func:`lmforge.eval.bfcl_ast.prompt_functions`).
        ground_truth: the possible answers, one ``{function name: {param: [acceptable values]}}``
            per expected call; None for irrelevance categories.
        where: ``file:line`` of the entry, for messages.
    """

    id: str
    category: str
    messages: list[dict[str, str]]
    functions: list[dict[str, Any]]
    ground_truth: list[dict[str, dict[str, list[Any]]]] | None
    where: str = ""

    def to_entry(self) -> dict[str, Any]:
        """The entry as a BFCL file line holds it."""
        return {"id": self.id, "question": [self.messages], "function": self.functions}

    def to_answer(self) -> dict[str, Any] | None:
        """The possible-answer line (None for irrelevance)."""
        return None if self.ground_truth is None else {"id": self.id, "ground_truth": self.ground_truth}


def file_name(category: str) -> str:
    return f"{VERSION_PREFIX}_{category}.json"


def answers_path(path: Path) -> Path:
    """Where BFCL keeps a category file's possible answers: ``possible_answer/<same name>``."""
    return path.parent / "possible_answer" / path.name


def has_answers(category: str) -> bool:
    return "relevance" not in category  # irrelevance, live_irrelevance, live_relevance


def category_of(path: Path) -> str:
    """The test category named by a BFCL file name (``BFCL_v4_parallel.json`` -> ``parallel``)."""
    m = _FILE_RE.match(Path(path).name)
    if not m:
        raise UserError(f"{path}: not a BFCL file name (expected BFCL_v4_<category>.json)")
    cat = m.group("cat")
    if any(u in cat for u in _UNSUPPORTED) or (cat.startswith("simple") and cat != "simple_python" and cat != "simple"):
        raise UserError(f"{path}: BFCL category {cat!r} is not a single-turn Python category; "
                        "lmforge scores simple, multiple, parallel, parallel_multiple and (ir)relevance")
    return cat


def package_data_dir() -> Path:
    """The ``data`` folder of the installed ``bfcl-eval`` package, found without importing it."""
    try:
        spec = importlib.util.find_spec("bfcl_eval")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"BFCL data needs the bfcl-eval package: pip install --no-deps {BFCL_PIN}")
    folder = Path(next(iter(spec.submodule_search_locations))) / "data"
    if not (folder / file_name(CATEGORIES[0])).is_file():
        raise UserError(f"{folder}: no BFCL v4 data in the installed bfcl-eval; pip install --no-deps {BFCL_PIN}")
    return folder


def load_packaged(category: str) -> list[BfclRecord]:
    """Every entry of one of bfcl-eval's own category files."""
    if category not in CATEGORIES:
        raise UserError(f"unknown BFCL category {category!r}; known: {', '.join(CATEGORIES)}")
    return load(package_data_dir() / file_name(category))


def load(path: str | Path, answers: str | Path | None = None) -> list[BfclRecord]:
    """The entries of a BFCL category file with their possible answers (``answers``, by default
    ``possible_answer/<name>`` beside it; none for irrelevance). Any deviation from BFCL's format
    is a one-line :class:`UserError` naming the file and line."""
    path = Path(path)
    category = category_of(path)
    lines = parse_json_lines(path, read_user_text(path, "BFCL"))
    if not lines:
        raise UserError(f"{path}: no BFCL entries")
    records = [_entry(rec, f"{path}:{i}", category) for i, rec in lines]
    seen: dict[str, str] = {}
    for r in records:
        if r.id in seen:
            raise UserError(f"{r.where}: duplicate id {r.id!r} (first at {seen[r.id]})")
        seen[r.id] = r.where
    if not has_answers(category):
        return records
    apath = Path(answers) if answers is not None else answers_path(path)
    if not apath.is_file():
        raise UserError(f"{path}: BFCL category {category!r} needs its possible answers at {apath}")
    alines = parse_json_lines(apath, read_user_text(apath, "BFCL possible-answer"))
    if len(alines) != len(records):
        raise UserError(f"{apath}: {len(alines)} possible answers for the {len(records)} entries of {path}")
    for r, (i, rec) in zip(records, alines):
        r.ground_truth = _answer(rec, f"{apath}:{i}", r)
    return records


def write(records: Sequence[BfclRecord], path: str | Path) -> None:
    """Write entries as a BFCL category file (and ``possible_answer/<name>`` unless irrelevance)."""
    path = Path(path)
    atomic_write_text(path, "".join(json.dumps(r.to_entry()) + "\n" for r in records))
    answers = [r.to_answer() for r in records]
    if all(a is not None for a in answers) and answers:
        atomic_write_text(answers_path(path), "".join(json.dumps(a) + "\n" for a in answers))


def sample(category: str, seed: int, n: int) -> list[BfclRecord]:
    """A seeded sample of ``n`` entries of a packaged category, in BFCL's order (all if ``n`` is
    at least the category's size)."""
    records = load_packaged(category)
    if n >= len(records):
        return records
    rng = random.Random(f"bfcl:{category}:{seed}")
    keep = sorted(rng.sample(range(len(records)), max(0, n)))
    return [records[i] for i in keep]


# --------------------------------------------------------------------------------------------------
# Validation


def _entry(rec: Any, where: str, category: str) -> BfclRecord:
    if not isinstance(rec, dict):
        raise UserError(f"{where}: not a BFCL entry (expected a JSON object with id, question, function)")
    for key in ("id", "question", "function"):
        if key not in rec:
            raise UserError(f"{where}: not a BFCL entry: missing field {key!r}")
    if not isinstance(rec["id"], str) or not rec["id"]:
        raise UserError(f"{where}: BFCL field 'id' must be a non-empty string")
    q = rec["question"]
    if not isinstance(q, list) or not q or not isinstance(q[0], list):
        raise UserError(f"{where}: BFCL field 'question' must be a list of turns, each a list of messages")
    if len(q) != 1:
        raise UserError(f"{where}: {len(q)} turns; lmforge's BFCL task scores single-turn entries only")
    messages = q[0]
    if not messages:
        raise UserError(f"{where}: BFCL question has no messages")
    for m in messages:
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise UserError(f"{where}: each BFCL message must be an object with string 'role' and 'content'")
        if m["role"] not in ("system", "user", "assistant"):
            raise UserError(f"{where}: unknown message role {m['role']!r}")
    funcs = rec["function"]
    if not isinstance(funcs, list):
        raise UserError(f"{where}: BFCL field 'function' must be a list of function docs")
    names = set()
    for f in funcs:
        _function_doc(f, where)
        if f["name"] in names:
            raise UserError(f"{where}: function {f['name']!r} is listed twice")
        names.add(f["name"])
    return BfclRecord(id=rec["id"], category=category, messages=messages, functions=funcs, ground_truth=None, where=where)


def _function_doc(f: Any, where: str) -> None:
    if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not f["name"]:
        raise UserError(f"{where}: each function doc needs a string 'name'")
    name = f["name"]
    if not isinstance(f.get("description"), str):
        raise UserError(f"{where}: function {name!r} needs a string 'description'")
    params = f.get("parameters")
    if not isinstance(params, dict) or not isinstance(params.get("properties"), dict):
        raise UserError(f"{where}: function {name!r} needs 'parameters' with an object 'properties'")
    req = params.get("required")
    if not isinstance(req, list) or not all(isinstance(r, str) for r in req):
        raise UserError(f"{where}: function {name!r}: parameters need a 'required' list of parameter names")
    for p, d in params["properties"].items():
        if not isinstance(d, dict) or d.get("type") not in PYTHON_TYPES:
            got = d.get("type") if isinstance(d, dict) else d
            raise UserError(f"{where}: function {name!r} parameter {p!r}: type {got!r} is not a BFCL Python type "
                            f"({', '.join(PYTHON_TYPES)})")
        if d["type"] in _NESTED:
            items = d.get("items")
            if not isinstance(items, dict) or items.get("type") not in PYTHON_TYPES:
                raise UserError(f"{where}: function {name!r} parameter {p!r}: an {d['type']} needs 'items' "
                                f"with a BFCL Python type")


def _answer(rec: Any, where: str, entry: BfclRecord) -> list[dict[str, dict[str, list[Any]]]]:
    if not isinstance(rec, dict) or "ground_truth" not in rec:
        raise UserError(f"{where}: not a BFCL possible answer (expected an object with id and ground_truth)")
    if rec.get("id") != entry.id:
        raise UserError(f"{where}: possible answer for id {rec.get('id')!r}, but {entry.where} is {entry.id!r}")
    gt = rec["ground_truth"]
    if not isinstance(gt, list) or not gt:
        raise UserError(f"{where}: 'ground_truth' must be a non-empty list of calls")
    names = {f["name"] for f in entry.functions}
    for call in gt:
        if not isinstance(call, dict) or len(call) != 1:
            raise UserError(f"{where}: each ground-truth call must be an object with one function name")
        (fname, args), = call.items()
        if fname not in names:
            raise UserError(f"{where}: ground truth calls {fname!r}, which the entry does not define")
        if not isinstance(args, dict):
            raise UserError(f"{where}: ground truth of {fname!r} must map parameters to value lists")
        for p, alts in args.items():
            if not isinstance(alts, list):
                raise UserError(f"{where}: ground truth of {fname!r} parameter {p!r} must be a list of acceptable values")
    return copy.deepcopy(gt)
