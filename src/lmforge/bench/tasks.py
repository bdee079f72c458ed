"""ACBench's twelve tasks as data plus scorers: what a model is asked, what a good answer is, and how
an answer is scored.

Capabilities and tasks (Dong et al., ICML 2025; the official suite vendors the benchmarks below):

* **workflow**: ``worfbench`` (WorfBench node F1 and graph F1).
* **tool use**: ``teval_instruct``, ``teval_plan``, ``teval_reason``, ``teval_retrieve``,
  ``teval_understand``, ``teval_review`` (T-Eval's six sub-tasks).
* **long context**: ``niah`` (needle in a haystack, 10 ROUGE-1 F on a length x depth grid),
  ``longbench_qa`` (token F1), ``longbench_retrieval`` (exact match), both by length bucket.
* **real world**: ``blocksworld`` and ``toolquery`` (AgentBoard-style multi-step environments:
  progress rate, success, grounding accuracy).

Every task reads its official file format (``Task.files`` names the files a data folder may hold
for it) and has a built-in generator that writes the same format, so the miniature and a user's real
data go through one loader.

Prompt formats. ``chat`` renders the official messages with the tokenizer's chat template, ``plain``
joins them with newlines (base models), ``zoo`` renders each task in the format lmforge's zoo models
were trained on (``lmforge.data``); ``auto`` picks ``zoo`` for a zoo model, ``chat`` for a tokenizer
with a chat template, else ``plain``. NOTE: the zoo format is an adapter for lmforge's own tiny
models, which never saw the official instructions; the scoring is the official one in every format.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmforge.common.errors import UserError

__all__ = [
    "CAPABILITIES",
    "SCORING_MODES",
    "check_scoring",
    "Context",
    "EpisodicTask",
    "Item",
    "SingleTurnTask",
    "Task",
    "TASKS",
    "get_task",
    "parse_task_list",
    "render_messages",
]

CAPABILITIES = ("workflow", "tool_use", "long_context", "real_world")
SCORING_MODES = ("official", "lmforge")  # Context.scoring / ``bench acbench --scoring``


def check_scoring(mode: str) -> str:
    """``mode`` if it is a scoring mode, else a one-line UserError."""
    if mode not in SCORING_MODES:
        raise UserError(f"--scoring must be {' or '.join(SCORING_MODES)}, got {mode!r}")
    return mode


@dataclass
class Item:
    """One single-turn query.

    Attributes:
        id: the record's id in its file.
        prompt: the rendered model input.
        reference: a gold completion (for the answer NLL and the KL against the original).
        max_new_tokens / stop: decoding limits.
        gold: what the scorer compares with.
        meta: extra fields for reports (context length, needle depth, length bucket ...).
    """

    id: str
    prompt: str
    reference: str
    max_new_tokens: int
    stop: tuple[str, ...]
    gold: Any
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Context:
    """What loading a task needs beyond its file."""

    tokenizer: Any
    fmt: str  # "chat" | "plain" | "zoo"
    seed: int = 0
    embed: Callable[[Sequence[str]], Any] | None = None
    length_buckets: tuple[int, ...] = (4000, 8000)
    max_positions: int | None = None
    max_steps: int = 30  # episode cap (AgentBoard's is 30)
    # "official": the official evaluators' rules (WorfBench's graph_evaluator.py); "lmforge":
    # lmforge's earlier WorfBench reading (see lmforge.eval.metrics). One of SCORING_MODES.
    scoring: str = "official"
    # Worked examples (user / assistant turns) before each WorfBench prompt; 0 is WorfBench's own
    # zero-shot protocol (see lmforge.eval.worfbench.demonstrations).
    shots: int = 0


def render_messages(tokenizer: Any, messages: list[dict[str, str]], fmt: str) -> str:
    """The official messages as model input: the chat template (``chat``) or joined lines (``plain``)."""
    if fmt == "chat":
        if not getattr(tokenizer, "chat_template", None):
            raise UserError("--prompt-format chat needs a tokenizer with a chat template; use plain")
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return "\n".join(m["content"] for m in messages)


class Task(ABC):
    """A benchmark task. Subclasses set the class attributes and implement the hooks."""

    name: str = ""
    capability: str = ""
    primary: str = ""  # the headline metric key
    files: tuple[str, ...] = ()  # official file names a data folder may hold (any subset but none)
    episodic: bool = False
    description: str = ""
    default_n: int = 40  # built-in records
    scale: float = 1.0  # the headline metric's maximum (NIAH: 10)

    @abstractmethod
    def generate(self, folder: Path, seed: int, n: int) -> None:
        """Write built-in files (``n`` records each, official formats) into ``folder``; files that are
        already there are kept."""

    def generate_for(self, folder: Path, seed: int, n: int, profile: str) -> None:
        """``generate`` for a built-in data profile: ``zoo`` (what lmforge's tiny models were trained
        on) or ``real`` (the original benchmark's content, for real models). Tasks whose built-in data
        does not depend on it ignore the profile."""
        self.generate(folder, seed, n)

    def paths(self, folder: Path) -> list[Path]:
        """This task's files present in ``folder``."""
        return [folder / f for f in self.files if (folder / f).is_file()]


class SingleTurnTask(Task):
    """A task of independent queries: generate once, score the response."""

    @abstractmethod
    def items(self, path: Path, ctx: Context) -> list[Item]:
        """The queries of a file."""

    @abstractmethod
    def score(self, item: Item, response: str, ctx: Context) -> dict[str, float]:
        """Official metrics of one response."""


class EpisodicTask(Task):
    """A multi-step environment task (AgentBoard style)."""

    episodic = True
    action_tokens: int = 32  # new tokens allowed for one action

    @abstractmethod
    def load(self, path: Path, ctx: Context) -> list[Any]:
        """The environment records of a file."""

    @abstractmethod
    def rollout(self, policy: Callable[[list[str]], list[str]], records: list[Any], ctx: Context) -> list[dict[str, Any]]:
        """Run ``policy`` on every record; one metrics dict (with ``id``) per episode."""

    @abstractmethod
    def expert_pairs(self, records: list[Any], ctx: Context) -> list[tuple[str, str]]:
        """(observation prompt, expert action completion) pairs, for the answer NLL and KL."""


# --------------------------------------------------------------------------------------------------
# Registry


TASKS: dict[str, Task] = {}


def register(task: Task) -> Task:
    TASKS[task.name] = task
    return task


def get_task(name: str) -> Task:
    _load_tasks()
    if name not in TASKS:
        raise UserError(f"unknown task {name!r}; known: {', '.join(TASKS)} (or a capability: {', '.join(CAPABILITIES)})")
    return TASKS[name]


def parse_task_list(spec: Sequence[str] | None) -> list[str]:
    """Task names from ``--tasks`` values: names, capabilities or comma lists; all tasks when empty."""
    _load_tasks()
    if not spec:
        return sorted(TASKS, key=lambda n: CAPABILITIES.index(TASKS[n].capability))
    out: list[str] = []
    for part in (p.strip() for s in spec for p in s.split(",")):
        if not part:
            continue
        names = [t.name for t in TASKS.values() if t.capability == part] if part in CAPABILITIES else [get_task(part).name]
        out.extend(n for n in names if n not in out)
    if not out:
        raise UserError("--tasks selected no task")
    return out


_TASK_MODULES = ("lmforge.bench.task_defs", "lmforge.bench.task_bfcl")  # the twelve tasks; bfcl


def _load_tasks() -> None:
    # Every module, every time (imports are cached): a caller that imported one of them directly
    # must not leave the registry without the others.
    import importlib

    for name in _TASK_MODULES:
        importlib.import_module(name)


# --------------------------------------------------------------------------------------------------
# Shared helpers for loaders


def read_jsonl(path: Path, what: str) -> list[tuple[str, dict[str, Any]]]:
    """``(where, record)`` pairs of a JSON-lines file; a bad line is a one-line error naming it."""
    from lmforge.common.io import parse_json_lines, read_user_text

    out = []
    for i, rec in parse_json_lines(path, read_user_text(path, what)):
        if not isinstance(rec, dict):
            raise UserError(f"{path}:{i}: expected a JSON object per line")
        out.append((f"{path}:{i}", rec))
    if not out:
        raise UserError(f"{path}: no {what} records")
    return out


def require(rec: dict[str, Any], where: str, **types: type | tuple[type, ...]) -> None:
    """Fields ``rec`` must have, with their types; a one-line error names the first one missing."""
    for key, typ in types.items():
        if key not in rec:
            raise UserError(f"{where}: missing field {key!r}")
        if not isinstance(rec[key], typ):
            names = typ.__name__ if isinstance(typ, type) else "/".join(t.__name__ for t in typ)
            raise UserError(f"{where}: field {key!r} must be {names}")


def bucket_name(n: int, edges: Sequence[int]) -> str:
    """The length bucket of ``n`` for ascending ``edges`` (LongBench-E: 4000, 8000 -> 0-4k/4-8k/8k+)."""
    def k(x: int) -> str:
        return f"{x // 1000}k" if x % 1000 == 0 else str(x)

    lo = 0
    for e in edges:
        if n < e:
            return f"{k(lo)}-{k(e)}"
        lo = e
    return f"{k(lo)}+"
