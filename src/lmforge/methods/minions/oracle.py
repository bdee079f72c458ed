"""A scripted "strong remote model" for Minions runs without an API: an oracle supervisor.

What it stands in for. In the paper (Narayan et al., ICML 2025, arXiv 2502.15964) the remote model
is GPT-4o. ``lmforge reproduce minions`` and the bench tests have no such model, so
:class:`OracleRemote` plays the remote's part in all four protocols of
:func:`lmforge.methods.minions.apply.run_protocol` (``remote-only``, ``minion``, ``minions``; it is
not called in ``local-only``) on the questions of :func:`lmforge.eval.longdoc.synthetic_docqa`. It
is a perfect *reasoner over what it is shown* and nothing more:

* it recognises which protocol prompt it is answering by the prompts' structure (the opening words
  and section headers of each function in :mod:`.prompts`, see :func:`prompt_kind`);
* it knows from the question text alone (parsed by the generator's question templates,
  :func:`parse_question`) which figures are needed and how they combine
  (:func:`lmforge.eval.longdoc.combine`);
* it answers only from its messages: in ``remote-only`` it reads the whole document and finds the
  fact sentences (:func:`lmforge.eval.longdoc.parse_fact_sentence`); in MINION it never sees the
  document and asks the local worker, in plain words, for the figures, then reads numbers out of the
  worker's replies (:func:`read_figure`, lenient: the first number after the asked line item in the
  clause that names the figure, else the clause's last number); in MINIONS it writes real Python
  ``prepare_jobs`` / ``transform_outputs`` code (run in the sandbox by :mod:`.minions`) with one job
  per (needed figure x chunk) and reads the aggregated worker outputs it is then shown, letting a
  worker's quoted citation decide between conflicting answers.

So its accuracy in MINION and MINIONS is bounded by how well the local model reads: with a local
worker that returns nothing useful it finds nothing (the tests show it), while remote-only, which
reads the document itself, still answers.

What it cannot do. It is not a language model: it understands only the synthetic report questions
(any other question gets an honest "cannot answer" in the protocol's format), it does not debug
code (a failed ``prepare_jobs`` is resent unchanged; too many jobs doubles the chunk size), and it
never guesses. It never looks at an item's gold answer or metadata: it is a function of its messages
only (stateless: the same messages give the same reply, so one instance serves every protocol and
question, and a test recomputes every reply).

Its cost is the tokens it reads and writes, counted like a real model's. It runs as the responder of
a :class:`~lmforge.methods.minions.clients.ScriptedClient` (:func:`oracle_client`), which counts
prompt tokens over every message it is sent and completion tokens over every reply it writes, with
:func:`~lmforge.methods.minions.clients.count_tokens`. Its name, :data:`ORACLE_NAME`
(``"oracle/gpt-4o"``), is priced by :class:`~lmforge.methods.minions.ledger.CostLedger` as
``gpt-4o`` (the ledger drops a provider prefix), so its dollars are GPT-4o's release price on those
tokens. Its replies are short (a line of reasoning and the JSON or code the protocol asks for), so
its completion tokens are at the low end of what GPT-4o would write.

For tests and CPU dry runs, :func:`perfect_reader` is the matching scripted *local* model: a correct
reader that quotes the asked figure from the text it is given and never computes (in the
reproduction a zoo model replaces it).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lmforge.eval.longdoc import combine, parse_fact_sentence, parse_numbers
from lmforge.methods.minions.clients import ScriptedClient, extract_json

__all__ = [
    "ORACLE_NAME",
    "PROMPT_MARKERS",
    "Figure",
    "OracleRemote",
    "QuestionPlan",
    "oracle_client",
    "parse_question",
    "perfect_reader",
    "prompt_kind",
    "read_figure",
    "read_reply",
    "reader_client",
]

ORACLE_NAME = "oracle/gpt-4o"
FINAL = "provide_final_answer"
MORE = "request_additional_info"

Messages = list[dict[str, str]]

# ----------------------------------------------------------------------------------------------
# Which prompt is this? (opening words + structural headers of each prompt in prompts.py / apply.py)
# ----------------------------------------------------------------------------------------------

# kind -> (the prompt's opening words, section markers that must all be present). The opening words
# come first in every prompt, so a document or a worker reply quoted inside a prompt cannot change
# its kind. tests/methods/minions/test_oracle.py builds every prompt with the real functions and
# checks these, so a wording change in prompts.py fails there, not silently here.
PROMPT_MARKERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "remote_only": ("Read the document below and answer the question.", ("\nDocument:\n", "\n\nQuestion: ")),
    "minion_initial": ("Our goal is to complete the task below.", ("### Task\n", "### How we work")),
    "minion_final": ("The small language model replied:", ("### Reply\n", "### Instructions", "This was the last round")),
    "minion_conversation": ("The small language model replied:", ("### Reply\n", "### Instructions", MORE)),
    "minions_advice": ("A question has to be answered from", ("## Question\n", "Briefly advise us")),
    "minions_decompose": ("# Decomposition round", ("def prepare_jobs(", "max_chunk_size: int = ")),
    "minions_no_code": ("Please try again: your reply had no", ("python",)),
    "minions_code_error": ("Please try again. Running your code failed", ()),
    "minions_too_many_jobs": ("Your code produced", ("allowed in one round",)),
    "minions_synthesis_cot": ("Now bring together what the junior workers",
                              ("1. The question:\n", "2. The workers' outputs:\n", "## Instructions")),
    "minions_synthesis_json": ("From your analysis, return one JSON object", ('"decision"',)),
    "minions_synthesis_final": ("Now give the final answer from everything gathered.",
                                ("1. The question:\n", "2. The workers' outputs:\n")),
    "json_correction": ("That reply could not be used:", ("JSON",)),
}  # fmt: skip


def prompt_kind(text: str) -> str | None:
    """The kind of protocol prompt ``text`` is (a key of :data:`PROMPT_MARKERS`), else None."""
    for kind, (opening, markers) in PROMPT_MARKERS.items():
        if text.startswith(opening) and all(m in text for m in markers):
            return kind
    return None


def _between(text: str, start: str, end: str | None, *, last_end: bool = True) -> str:
    """The text after the first ``start`` and before the last (or first) ``end`` after it."""
    i = text.find(start)
    if i < 0:
        return ""
    i += len(start)
    if end is None:
        return text[i:]
    j = text.rfind(end) if last_end else text.find(end, i)
    return text[i:j] if j >= i else text[i:]


# Field extraction from each prompt (the delimiters are the prompts' own section headers).
def _direct_fields(text: str) -> tuple[str, str]:
    """(document, question) of the baselines' single prompt."""
    q_at = text.rfind("\n\nQuestion: ")
    document = _between(text[:q_at], "\nDocument:\n", None)
    question = text[q_at + len("\n\nQuestion: "):].split("\n", 1)[0]
    return document, question.strip()


def _minion_task(text: str) -> str:
    return _between(text, "### Task\n", "\n\n### How we work").strip()


def _minion_reply(text: str) -> str:
    return _between(text, "### Reply\n", "\n\n### Instructions").strip()


def _advice_question(text: str) -> str:
    return _between(text, "## Question\n", "\n\n---\n").strip()


def _synthesis_fields(text: str) -> tuple[str, str, str]:
    """(question, workers' outputs, progress so far) of a synthesis prompt."""
    progress = _between(text, "## Progress so far\n", "\n\n## Inputs", last_end=False).strip()
    question = _between(text, "1. The question:\n", "\n\n2. The workers' outputs:\n", last_end=False).strip()
    end = "\n\n## Instructions" if "\n\n## Instructions" in text else "\n\nReturn one JSON object"
    outputs = _between(text, "2. The workers' outputs:\n", end).strip()
    return question, outputs, progress


def _later_notes(text: str) -> str:
    return _between(text, "Notes so far: ", "\nWhy more is needed:", last_end=False).strip()


# ----------------------------------------------------------------------------------------------
# What does the question ask for? (synthetic_docqa's question templates)
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Figure:
    """One reported figure: a line item of a division in a fiscal year (USD millions)."""

    metric: str
    division: str
    year: int

    def describe(self) -> str:
        return f"the {self.metric} of the {self.division} division in fiscal {self.year}"

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.division, self.metric, self.year)


@dataclass(frozen=True)
class QuestionPlan:
    """The figures a question needs, in the operand order of :func:`~lmforge.eval.longdoc.combine`."""

    operation: str
    figures: tuple[Figure, ...]

    def answer(self, values: dict[Figure, float]) -> str:
        return combine(self.operation, [values[f] for f in self.figures])


_DIV = r"[A-Z][A-Za-z-]*"
_MET = r"[a-z][a-z ]*?"
_QUESTION_FORMS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("change", re.compile(rf"by how much did the (?P<metric>{_MET}) of the (?P<div>{_DIV}) division change "
                          r"from fiscal (?P<y1>\d{4}) to fiscal (?P<y2>\d{4})")),
    ("ratio", re.compile(rf"what was the (?P<div>{_DIV}) division's (?P<metric>{_MET}) in fiscal (?P<year>\d{{4}}) "
                         r"as a percentage of its revenue in fiscal (?P=year)")),
    ("net_of_costs", re.compile(rf"what was the (?P<div>{_DIV}) division's revenue in fiscal (?P<year>\d{{4}}) "
                                r"minus its (?P<costs>[a-z ,]+?) in the same year")),
    ("difference", re.compile(rf"what was the (?P<div>{_DIV}) division's revenue minus its (?P<metric>{_MET}) "
                              r"in fiscal (?P<year>\d{4})")),
    ("sum_divisions", re.compile(rf"what was the combined (?P<metric>{_MET}) of the (?P<divs>{_DIV}(?:(?:, | and ){_DIV})*) "
                                 r"divisions in fiscal (?P<year>\d{4})")),
    ("sum_years", re.compile(rf"what was the total (?P<metric>{_MET}) of the (?P<div>{_DIV}) division over fiscal "
                             r"(?P<years>\d{4}(?:(?:, | and )\d{4})*) combined")),
    ("value", re.compile(rf"what was the (?P<metric>{_MET}) of the (?P<div>{_DIV}) division in fiscal (?P<year>\d{{4}})")),
)  # fmt: skip
_LIST_SPLIT = re.compile(r", | and ")


def parse_question(question: str) -> QuestionPlan | None:
    """The figures and the operation a synthetic report question asks for, from its text only;
    None for a question in none of :func:`~lmforge.eval.longdoc.synthetic_docqa`'s forms."""
    for op, rx in _QUESTION_FORMS:
        m = rx.search(question)
        if m is None:
            continue
        g = m.groupdict()
        if op == "change":
            figs = [Figure(g["metric"], g["div"], int(g["y1"])), Figure(g["metric"], g["div"], int(g["y2"]))]
        elif op == "ratio":
            year = int(g["year"])
            figs = [Figure(g["metric"], g["div"], year), Figure("revenue", g["div"], year)]
        elif op == "net_of_costs":
            year = int(g["year"])
            costs = [c.strip() for c in _LIST_SPLIT.split(g["costs"]) if c.strip()]
            figs = [Figure("revenue", g["div"], year)] + [Figure(c, g["div"], year) for c in costs]
        elif op == "difference":
            year = int(g["year"])
            figs = [Figure("revenue", g["div"], year), Figure(g["metric"], g["div"], year)]
        elif op == "sum_divisions":
            figs = [Figure(g["metric"], d, int(g["year"])) for d in _LIST_SPLIT.split(g["divs"])]
        elif op == "sum_years":
            figs = [Figure(g["metric"], g["div"], int(y)) for y in _LIST_SPLIT.split(g["years"])]
        else:
            figs = [Figure(g["metric"], g["div"], int(g["year"]))]
        return QuestionPlan(op, tuple(figs))
    return None


_FIGURE_TEXT = re.compile(rf"the (?P<metric>{_MET}) of the (?P<div>{_DIV}) division in fiscal (?P<year>\d{{4}})")
_FOUND_TEXT = re.compile(_FIGURE_TEXT.pattern + r" = (?P<value>-?\d+(?:\.\d+)?)")


def _figures_in(text: str) -> list[Figure]:
    """The figures named as :meth:`Figure.describe` writes them (the oracle's own asks and tasks)."""
    out: list[Figure] = []
    for m in _FIGURE_TEXT.finditer(text):
        fig = Figure(m["metric"], m["div"], int(m["year"]))
        if fig not in out:
            out.append(fig)
    return out


def _found_in(text: str) -> dict[Figure, float]:
    """Figures with values as the oracle writes them in its scratchpad ("<figure> = 123.4")."""
    return {Figure(m["metric"], m["div"], int(m["year"])): float(m["value"]) for m in _FOUND_TEXT.finditer(text)}


# ----------------------------------------------------------------------------------------------
# Reading numbers out of what a worker wrote (lenient)
# ----------------------------------------------------------------------------------------------

_SENTENCE_SPLIT = re.compile(r"(?<=[.;!?])\s+|\n+")
_CLAUSE_SPLIT = re.compile(r",\s+|;\s+|\s+and\s+|\s+while\s+|\s+whereas\s+")
_LIST_MARK = re.compile(r"^\s*(?:[-*\u2022]\s+|\(?(\d{1,2})[.)]\s+)")
_NUMBER = re.compile(r"[$\u20ac\u00a3]?-?\d[\d,]*(?:\.\d+)?(?:\s*(?:thousand|million|billion|trillion|bn|mn)\b)?",
                     re.IGNORECASE)
_TO_MILLIONS = {1e3: 1e-3, 1e6: 1.0, 1e9: 1e3, 1e12: 1e6}


def _millions(text: str) -> list[tuple[int, float]]:
    """(position, value in USD millions) of every number in ``text`` that is not a year; a bare
    number is taken to be in millions already (what the oracle asks for)."""
    out = []
    for m in _NUMBER.finditer(text):
        parsed = parse_numbers(m.group(0))
        if not parsed or parsed[0].year_like:
            continue
        n = parsed[0]
        out.append((m.start(), n.value * _TO_MILLIONS.get(n.scale or 1e6, 1.0)))
    return out


def _metric_word(fig: Figure) -> str:
    return fig.metric.split()[0].lower()


def _mentions(text: str, fig: Figure, feature: str) -> bool:
    low = text.lower()
    if feature == "metric":
        return re.search(r"\b" + re.escape(_metric_word(fig)), low) is not None
    if feature == "division":
        return re.search(r"\b" + re.escape(fig.division.lower()) + r"\b", low) is not None
    return re.search(rf"\b{fig.year}\b", text) is not None


def _distinguishing(asked: Sequence[Figure]) -> tuple[str, ...]:
    """The features that tell the asked figures apart (what a reply must name to be attributed)."""
    if len(asked) < 2:
        return ()
    feats = []
    for feature, attr in (("metric", "metric"), ("division", "division"), ("year", "year")):
        if len({getattr(f, attr) for f in asked}) > 1:
            feats.append(feature)
    return tuple(feats)


def _value_in(unit: str, fig: Figure) -> float | None:
    """The first number after the line item's name, else the last number of ``unit``."""
    nums = _millions(unit)
    if not nums:
        return None
    m = re.search(r"\b" + re.escape(_metric_word(fig)), unit.lower())
    if m is not None:
        after = [v for pos, v in nums if pos >= m.end()]
        if after:
            return after[0]
    return nums[-1][1]


def read_reply(text: str, asked: Sequence[Figure]) -> dict[Figure, float]:
    """The values a worker's free-text reply gives for the ``asked`` figures (those it gives).

    Lenient, as one reads a small model's reply: the reply is cut into sentences (a sentence that
    names several asked figures, into clauses); a piece counts for a figure when it names what
    tells that figure apart from the others asked (its line item, division or year; nothing when
    one figure was asked), or starts with the figure's number in a numbered ask; the value is the
    first number after the line item's name, else the piece's last number (years are skipped). The
    last such piece in the reply wins (a correction comes after the slip). Pieces that name the
    line item are preferred over pieces that do not.
    """
    need = _distinguishing(asked)
    pieces: list[tuple[int | None, str]] = []
    for line in text.splitlines():
        mark = _LIST_MARK.match(line)
        index = int(mark.group(1)) if mark and mark.group(1) else None
        body = line[mark.end():] if mark else line
        for sentence in _SENTENCE_SPLIT.split(body):
            if not sentence.strip():
                continue
            named = [f for f in asked if need and all(_mentions(sentence, f, x) for x in need)]
            if len(named) > 1:
                pieces += [(index, c) for c in _CLAUSE_SPLIT.split(sentence) if c.strip()]
            else:
                pieces.append((index, sentence))
    out: dict[Figure, float] = {}
    for i, fig in enumerate(asked, start=1):
        for strict in (True, False):
            value = None
            for index, piece in pieces:
                ok = index == i and len(asked) > 1 or all(_mentions(piece, fig, x) for x in need)
                if not ok or (strict and not _mentions(piece, fig, "metric")):
                    continue
                v = _value_in(piece, fig)
                if v is not None:
                    value = v
            if value is not None:
                out[fig] = value
                break
    return out


def read_figure(text: str, fig: Figure) -> float | None:
    """The value a worker's answer text gives for one figure (see :func:`read_reply`), else None."""
    return read_reply(text, [fig]).get(fig)


def _fmt(value: float) -> str:
    return f"{value:.1f}" if abs(value - round(value, 1)) < 1e-9 else f"{value:g}"


def _fact_sentences(text: str) -> list[tuple[str, dict[str, Any]]]:
    """(sentence, parsed) for every synthetic report fact sentence in ``text``."""
    out = []
    for s in _SENTENCE_SPLIT.split(text):
        parsed = parse_fact_sentence(s)
        if parsed is not None:
            out.append((s.strip(), parsed))
    return out


def _matches(parsed: dict[str, Any], fig: Figure) -> bool:
    return (parsed["division"], parsed["metric"], parsed["year"]) == (fig.division, fig.metric.lower(), fig.year)


# ----------------------------------------------------------------------------------------------
# The oracle
# ----------------------------------------------------------------------------------------------

_CANNOT = "I cannot answer this question: it is not one of the report questions I can work out."


def _json_block(obj: dict[str, Any]) -> str:
    return "```json\n" + json.dumps(obj) + "\n```"


class OracleRemote:
    """The scripted remote supervisor; call it with a conversation to get its reply.

    Use it as the responder of a :class:`~lmforge.methods.minions.clients.ScriptedClient`
    (:meth:`client` / :func:`oracle_client`): the client counts its tokens and the ledger prices
    them. Stateless: the reply is a function of the messages alone.

    Args:
        minion_ask: MINION: ``"all"`` asks the worker for every missing figure in one message (a
            numbered list), ``"one"`` asks for one figure per round.
        overlap: MINIONS: characters of overlap between consecutive chunks in the oracle's
            ``prepare_jobs`` (at most a quarter of the chunk), so that a fact sentence cut at one
            chunk's edge is whole in the next.
        strict: raise ValueError on a prompt it does not recognise (tests: catches a protocol
            prompt that changed); otherwise reply that it does not understand.
    """

    def __init__(self, *, minion_ask: str = "all", overlap: int = 200, strict: bool = False) -> None:
        if minion_ask not in ("all", "one"):
            raise ValueError(f"minion_ask must be 'all' or 'one', got {minion_ask!r}")
        if overlap < 0:
            raise ValueError(f"overlap must be >= 0, got {overlap}")
        self.minion_ask = minion_ask
        self.overlap = overlap
        self.strict = strict

    def client(self, name: str = ORACLE_NAME) -> ScriptedClient:
        """A chat client whose replies are this oracle's (priced as GPT-4o under the default name)."""
        return ScriptedClient(self, name=name)

    # -------------------------------------------------------------------------------- dispatch

    def __call__(self, messages: Messages) -> str:
        kind, index = self._last_prompt(messages)
        if kind is None:
            if self.strict:
                raise ValueError(f"oracle: unrecognised prompt: {messages[-1]['content'][:80]!r}")
            return "I do not understand the request."
        text = messages[index]["content"]
        handler = getattr(self, "_" + kind)
        return handler(messages, text)

    def _last_prompt(self, messages: Messages) -> tuple[str | None, int]:
        """The kind and index of the prompt to answer: the last user message, or the one before a
        JSON correction (the oracle's JSON is always valid, but a correction is answered anyway)."""
        for i in range(len(messages) - 1, -1, -1):
            if messages[i]["role"] != "user":
                continue
            kind = prompt_kind(messages[i]["content"])
            if kind != "json_correction":
                return kind, i
        return None, len(messages) - 1

    # -------------------------------------------------------------------------------- remote-only

    def _remote_only(self, messages: Messages, text: str) -> str:
        document, question = _direct_fields(text)
        plan = parse_question(question)
        if plan is None:
            return _CANNOT
        facts = _fact_sentences(document)
        values: dict[Figure, float] = {}
        for fig in plan.figures:
            for _, parsed in facts:
                if _matches(parsed, fig):
                    values[fig] = parsed["value"]
                    break
        missing = [f for f in plan.figures if f not in values]
        if missing:
            return "The report does not state " + "; ".join(f.describe() for f in missing) + "."
        return plan.answer(values)

    # -------------------------------------------------------------------------------- MINION

    def _ask(self, figures: Sequence[Figure], again: bool) -> str:
        figs = list(figures[:1]) if self.minion_ask == "one" else list(figures)
        lead = "I still need" if again else "Please find"
        if len(figs) == 1:
            return (f"{lead} {figs[0].describe()}, in USD millions. Quote the sentence of the report "
                    "that states it, or say that it is not there.")
        lines = "\n".join(f"{i}. {f.describe()}" for i, f in enumerate(figs, start=1))
        return (f"{lead} these figures from the report, each in USD millions. For each, quote the "
                f"sentence that states it, or say that it is not there.\n{lines}")

    def _minion_initial(self, messages: Messages, text: str) -> str:
        plan = parse_question(_minion_task(text))
        if plan is None:
            return _CANNOT + "\n" + _json_block({"message": "Please summarise what the document says."})
        names = "; ".join(f.describe() for f in plan.figures)
        return f"I need {names}.\n" + _json_block({"message": self._ask(plan.figures, again=False)})

    def _minion_state(self, messages: Messages) -> tuple[QuestionPlan | None, dict[Figure, float], int]:
        """(plan, figures found so far, worker replies read) from the conversation."""
        plan = None
        found: dict[Figure, float] = {}
        asked: list[Figure] = []
        replies = 0
        for m in messages:
            kind = prompt_kind(m["content"]) if m["role"] == "user" else None
            if kind == "minion_initial":
                plan = parse_question(_minion_task(m["content"]))
            elif m["role"] == "assistant":
                obj = extract_json(m["content"]) or {}
                asked = _figures_in(str(obj.get("message") or ""))
            elif kind in ("minion_conversation", "minion_final"):
                replies += 1
                found.update(read_reply(_minion_reply(m["content"]), asked))
        return plan, found, replies

    def _minion_conversation(self, messages: Messages, text: str, *, last: bool = False) -> str:
        plan, found, _ = self._minion_state(messages)
        if plan is None:
            return _CANNOT + "\n" + _json_block({"decision": FINAL, "answer": None})
        have = [f for f in plan.figures if f in found]
        missing = [f for f in plan.figures if f not in found]
        notes = "; ".join(f"{f.describe()} = {_fmt(found[f])}" for f in have) or "nothing yet"
        if not missing:
            answer = plan.answer(found)
            return f"Found {notes}. {plan.operation}: {answer}.\n" + _json_block({"decision": FINAL, "answer": answer})
        gap = "; ".join(f.describe() for f in missing)
        if last:
            return f"Found {notes}; still missing {gap}, so I cannot answer.\n" + _json_block(
                {"decision": FINAL, "answer": None})
        return f"Found {notes}; still missing {gap}.\n" + _json_block(
            {"decision": MORE, "message": self._ask(missing, again=True)})

    def _minion_final(self, messages: Messages, text: str) -> str:
        return self._minion_conversation(messages, text, last=True)

    # -------------------------------------------------------------------------------- MINIONS

    @staticmethod
    def _minions_question(messages: Messages) -> str:
        for m in messages:
            if m["role"] == "user" and prompt_kind(m["content"]) == "minions_advice":
                return _advice_question(m["content"])
        return ""

    def _minions_advice(self, messages: Messages, text: str) -> str:
        plan = parse_question(_advice_question(text))
        if plan is None:
            return _CANNOT
        names = "; ".join(f.describe() for f in plan.figures)
        return (f"Find the sentences that state {names} (USD millions); other years, divisions and line "
                f"items are distractors. Then the answer is their {plan.operation.replace('_', ' ')}.")

    def _code(self, figures: Sequence[Figure], chunk_size: int) -> str:
        overlap = min(self.overlap, chunk_size // 4)
        tasks = [f"What was {f.describe()}? Answer in USD millions." for f in figures]
        advice = ("Only a sentence naming this division, this line item and this fiscal year counts. Answer "
                  "with the number, quote that sentence as the citation; answer null if the excerpt lacks it.")
        return f'''\
One task per missing figure, over overlapping chunks so that no sentence is lost at a chunk edge.

```python
TASKS = {json.dumps(tasks, indent=4)}
ADVICE = {advice!r}

def prepare_jobs(context, prev_job_manifests=None, prev_job_outputs=None):
    jobs = []
    for doc in context:
        for chunk in chunk_by_section(doc, {chunk_size}, {overlap}):
            for task in TASKS:
                jobs.append(JobManifest(chunk=chunk, task=task, advice=ADVICE))
    return jobs

def transform_outputs(jobs):
    found = {{}}
    for job in jobs:
        answer = " ".join(str(job.output.answer or "").split())
        if answer.lower() in ("", "none", "null", "n/a"):
            continue
        citation = " ".join(str(job.output.citation or "").split())
        found.setdefault(job.manifest.task, []).append(
            f"- chunk {{job.manifest.chunk_id}}: answer={{answer}} | citation={{citation}}")
    lines = []
    for task in TASKS:
        lines.append("## " + task)
        lines.extend(found.get(task) or ["- no chunk stated it"])
    return "\\n".join(lines)
```'''

    def _decompose_reply(self, messages: Messages, index: int) -> str:
        """The code for the decomposition prompt at ``index`` (the latest one)."""
        text = messages[index]["content"]
        m = re.search(r"max_chunk_size: int = (\d+)", text)
        chunk_size = int(m.group(1)) if m else 5000
        m = re.search(r"at most (\d+) distinct tasks", text, re.IGNORECASE)
        n_tasks = int(m.group(1)) if m else 3
        # Each complaint about too many jobs since that prompt doubles the chunk size.
        complaints = sum(1 for x in messages[index + 1:] if x["role"] == "user"
                         and prompt_kind(x["content"]) == "minions_too_many_jobs")
        chunk_size *= 2 ** complaints
        plan = parse_question(self._minions_question(messages))
        figures: list[Figure] = []
        if plan is not None:
            found = _found_in(_later_notes(text)) if "## Where the last round left off" in text else {}
            figures = [f for f in plan.figures if f not in found][:n_tasks]
        return self._code(figures, chunk_size)

    def _latest(self, messages: Messages, kind: str) -> int:
        for i in range(len(messages) - 1, -1, -1):
            if messages[i]["role"] == "user" and prompt_kind(messages[i]["content"]) == kind:
                return i
        raise ValueError(f"oracle: no {kind} prompt in the conversation")

    def _minions_decompose(self, messages: Messages, text: str) -> str:
        return self._decompose_reply(messages, self._latest(messages, "minions_decompose"))

    # A failed attempt: the oracle cannot debug; it writes its code again (bigger chunks when the
    # complaint was about the number of jobs).
    _minions_no_code = _minions_decompose
    _minions_code_error = _minions_decompose
    _minions_too_many_jobs = _minions_decompose

    @staticmethod
    def _candidates(outputs: str, figures: Sequence[Figure]) -> dict[Figure, list[tuple[float, str]]]:
        """(value, citation) per figure from the aggregated worker outputs: the oracle's own
        ``transform_outputs`` format, or the protocol's fallback aggregation (raw JSON samples)."""
        out: dict[Figure, list[tuple[float, str]]] = {f: [] for f in figures}
        fig: Figure | None = None
        section: list[str] = []

        def flush() -> None:
            if fig is None:
                return
            body = "\n".join(section)
            pairs = [(a, c) for a, c in re.findall(r"answer=(.*?) \| citation=(.*)", body)]
            if not pairs:  # the fallback aggregation shows each job's raw JSON reply
                for obj_text in re.findall(r"\{[^{}]*\}", body):
                    try:
                        obj = json.loads(obj_text)
                    except json.JSONDecodeError:
                        continue
                    if isinstance(obj, dict) and obj.get("answer") not in (None, "", "null", "none"):
                        pairs.append((str(obj["answer"]), str(obj.get("citation") or "")))
            for answer, citation in pairs:
                value = read_figure(answer, fig)
                if value is None:
                    value = read_figure(citation, fig)
                if value is not None:
                    out[fig].append((value, citation))

        for line in outputs.splitlines():
            if line.startswith("## "):
                flush()
                named = _figures_in(line)
                fig = named[0] if named and named[0] in out else None
                section = []
            else:
                section.append(line)
        flush()
        return out

    @staticmethod
    def _decide(cands: list[tuple[float, str]], fig: Figure) -> float | None:
        """Let the citations decide: a citation that states the figure wins; answers whose citation
        states another figure (a distractor) are dropped; of the rest, the most common answer among
        workers whose citation names the division and year, else among all."""
        kept = []
        for value, citation in cands:
            parsed = parse_fact_sentence(citation)
            if parsed is None:
                kept.append((value, citation))
            elif _matches(parsed, fig):
                return parsed["value"]
        cands = kept
        if not cands:
            return None
        named = [v for v, c in cands if _mentions(c, fig, "division") and _mentions(c, fig, "year")]
        pool = named or [v for v, _ in cands]
        return Counter(pool).most_common(1)[0][0]

    def _synthesis(self, text: str) -> tuple[QuestionPlan | None, dict[Figure, float]]:
        question, outputs, progress = _synthesis_fields(text)
        plan = parse_question(question)
        if plan is None:
            return None, {}
        found = {f: v for f, v in _found_in(progress).items() if f in plan.figures}
        for fig, cands in self._candidates(outputs, [f for f in plan.figures if f not in found]).items():
            value = self._decide(cands, fig)
            if value is not None:
                found[fig] = value
        return plan, found

    @staticmethod
    def _notes(plan: QuestionPlan, found: dict[Figure, float]) -> tuple[str, list[Figure]]:
        have = "; ".join(f"{f.describe()} = {_fmt(found[f])}" for f in plan.figures if f in found)
        missing = [f for f in plan.figures if f not in found]
        notes = f"Found: {have or 'nothing yet'}."
        if missing:
            notes += " Missing: " + "; ".join(f.describe() for f in missing) + "."
        return notes, missing

    def _decision(self, text: str, *, last: bool) -> dict[str, Any]:
        plan, found = self._synthesis(text)
        if plan is None:
            return {"explanation": _CANNOT, "feedback": None, "decision": FINAL, "answer": None, "scratchpad": ""}
        notes, missing = self._notes(plan, found)
        if not missing:
            answer = plan.answer(found)
            return {"explanation": f"All figures found; {plan.operation} = {answer}.", "feedback": None,
                    "decision": FINAL, "answer": answer, "scratchpad": notes}
        gap = "; ".join(f.describe() for f in missing)
        if last:
            return {"explanation": "Some figures were never found.", "feedback": f"Still missing {gap}.",
                    "decision": FINAL, "answer": None, "scratchpad": notes}
        return {"explanation": "Some figures are still missing.", "feedback": f"Find {gap}.",
                "decision": MORE, "answer": None, "scratchpad": notes}

    def _minions_synthesis_cot(self, messages: Messages, text: str) -> str:
        plan, found = self._synthesis(text)
        if plan is None:
            return _CANNOT
        notes, missing = self._notes(plan, found)
        if missing:
            return notes + " Not enough to answer yet."
        return notes + f" Enough to answer: {plan.operation.replace('_', ' ')} = {plan.answer(found)}."

    def _minions_synthesis_json(self, messages: Messages, text: str) -> str:
        cot = self._latest(messages, "minions_synthesis_cot")
        return json.dumps(self._decision(messages[cot]["content"], last=False))

    def _minions_synthesis_final(self, messages: Messages, text: str) -> str:
        return json.dumps(self._decision(text, last=True))


def oracle_client(name: str = ORACLE_NAME, **kwargs: Any) -> ScriptedClient:
    """A :class:`ScriptedClient` replying as an :class:`OracleRemote` (``kwargs`` go to it)."""
    return OracleRemote(**kwargs).client(name)


# ----------------------------------------------------------------------------------------------
# The matching scripted local model: a correct reader (tests and CPU dry runs only)
# ----------------------------------------------------------------------------------------------


def _asked_in(line: str, facts: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """Fact sentences whose division, line item and year are all named in ``line``."""
    low = line.lower()
    return [(s, p) for s, p in facts
            if re.search(rf"\b{re.escape(p['division'].lower())}\b", low) and p["metric"] in low
            and re.search(rf"\b{p['year']}\b", line)]


def _say(p: dict[str, Any]) -> str:
    return f"The {p['metric']} of the {p['division']} division in fiscal {p['year']} was ${p['value']:,.1f} million."


def perfect_reader(messages: Messages) -> str:
    """A scripted local model that reads correctly and never computes (a stand-in for a zoo model).

    * MINIONS job (``prompts.minions_worker``): the fact sentence of the excerpt that states the
      figure the task names, as a ``JobOutput`` JSON (answer: the number; citation: the sentence),
      or an answer of null.
    * MINION (``prompts.minion_worker_system`` + the supervisor's messages): for each line of the
      last message that names a figure, that figure, paraphrased ("The revenue of the X division in
      fiscal 2020 was $1,047.3 million."), kept in the ask's numbering.
    * local-only (the baselines' whole-document prompt): it quotes the fact sentences the question
      names and does no arithmetic, so it answers only single-figure questions (a multi-figure
      answer can still score by the 10% tolerance when a quoted figure is near the result).
    """
    last = messages[-1]["content"]
    if last.startswith("Here is an excerpt from a document:"):
        excerpt = _between(last, "Here is an excerpt from a document:", "\nYour task:", last_end=False)
        task = _between(last, "Your task:", "\nAdvice on how to approach it:", last_end=False)
        hits = _asked_in(task, _fact_sentences(excerpt))
        if not hits:
            return json.dumps({"explanation": "The excerpt does not state this figure.", "citation": None,
                               "answer": None})
        sentence, parsed = hits[0]
        return json.dumps({"explanation": "The excerpt states it.", "citation": sentence,
                           "answer": _fmt(parsed["value"])})
    if messages[0]["role"] == "system" and "### Context\n" in messages[0]["content"]:
        context = _between(messages[0]["content"], "### Context\n", "\n\n### Task\n")
        facts = _fact_sentences(context)
        out = []
        for line in last.splitlines():
            hits = _asked_in(line, facts)
            mark = _LIST_MARK.match(line)
            prefix = mark.group(0).strip() + " " if mark and mark.group(1) else ""
            out += [prefix + _say(p) for _, p in hits[:1]]
        return "\n".join(out) or "I could not find that in the document."
    if last.startswith("Read the document below and answer the question."):
        document, question = _direct_fields(last)
        hits = _asked_in(question, _fact_sentences(document))
        if not hits:
            return "I could not find it in the document."
        return "The report says: " + " ".join(s for s, _ in hits)
    return "I cannot help with that."


def reader_client(name: str = "scripted-reader") -> ScriptedClient:
    """A :class:`ScriptedClient` replying as :func:`perfect_reader`."""
    return ScriptedClient(perfect_reader, name=name)
