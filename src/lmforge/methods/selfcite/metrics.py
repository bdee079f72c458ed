"""Citation recall, precision and F1 of LongCite-format answers against gold supporting sentences.

The official evaluation (github.com/facebookresearch/SelfCite ``gpt4o_eval_cite.py``, itself LongCite's
LongBench-Cite scorer: ``score_recall``, ``score_precision``, ``get_citation_score`` and the averaging
in its ``__main__``) asks GPT-4o three questions. Here the judge is replaced by gold supporting-sentence
sets, one per statement, keeping the official structure:

* recall of a statement with citations: GPT-4o's "is the statement supported by the concatenated cited
  text" becomes 1 if every gold sentence is among the cited sentences, 0.5 if some are, 0 if none are
  (or the gold set is empty: nothing in the document supports it, so nothing cited can);
* recall of a statement without citations: ``1 - need_citation``, with ``need_citation`` = 1 when the
  gold set is non-empty;
* precision: each citation is relevant (1) when it contains a gold sentence of its statement, else 0;
* per response: recall = mean over statements, precision = mean over all citations (0 when there are
  none), F1 = 2PR/(P+R) (0 when P+R = 0); only the first 40 statements count (official
  ``max_statement_num=40``); the dataset scores are means of the per-response values.

Written anew (the official code is CC BY-NC). Libraries checked: no PyPI package scores LongCite
citations (ALCE/LongCite scorers are NLI- or GPT-judged scripts, not packages), so the arithmetic is here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from lmforge.common.errors import UserError
from lmforge.methods.selfcite.format import (
    Citation,
    Postprocessed,
    Statement,
    postprocess,
    split_sentences,
)

# Official process(): get_citation_score(js, max_statement_num=40).
MAX_STATEMENTS = 40

Matcher = Literal["order", "text"]


@dataclass(frozen=True)
class GoldStatement:
    """A gold statement: its text and the indices of the document sentences that support it (empty:
    it needs no citation)."""

    text: str
    support: frozenset[int]


@dataclass(frozen=True)
class StatementScore:
    """One predicted statement: its support score (recall term), the relevance of each of its
    citations (precision terms) and whether a gold statement was matched to it."""

    support: float
    relevance: tuple[int, ...]
    matched: bool


@dataclass(frozen=True)
class ResponseScore:
    recall: float
    precision: float
    f1: float
    n_statements: int
    n_citations: int
    unmatched: int
    statements: tuple[StatementScore, ...]


def normalise_text(text: str) -> str:
    """The key of the ``"text"`` matcher: case-folded, whitespace runs collapsed, stripped."""
    return re.sub(r"\s+", " ", text).strip().casefold()


def _citation_sentences(c: Citation) -> range:
    return range(c.start, c.end + 1)


def support_score(citations: Sequence[Citation], support: frozenset[int]) -> float:
    """Recall term of one statement (see the module docstring)."""
    if not citations:
        need_citation = 1 if support else 0
        return float(1 - need_citation)
    cited = {i for c in citations for i in _citation_sentences(c)}
    hit = len(support & cited)
    # NOTE: our choice where the judge has no gold analogue: a cited statement whose gold set is empty
    # (it needs no citation, or it is unmatched) scores 0, as GPT-4o would find no support for it.
    if not support or hit == 0:
        return 0.0
    return 1.0 if hit == len(support) else 0.5


def _match(statements: Sequence[Statement], gold: Sequence[GoldStatement], matcher: Matcher
           ) -> list[GoldStatement | None]:
    if matcher == "order":
        return [gold[i] if i < len(gold) else None for i in range(len(statements))]
    if matcher == "text":
        free: dict[str, list[GoldStatement]] = {}
        for g in gold:
            free.setdefault(normalise_text(g.text), []).append(g)
        out: list[GoldStatement | None] = []
        for s in statements:
            queue = free.get(normalise_text(s.text))
            out.append(queue.pop(0) if queue else None)
        return out
    raise ValueError(f"unknown matcher {matcher!r}: use 'order' or 'text'")


def score_response(statements: Sequence[Statement] | Postprocessed, gold: Sequence[GoldStatement], *,
                   matcher: Matcher = "order", max_statements: int | None = MAX_STATEMENTS) -> ResponseScore:
    """Recall, precision and F1 of one response.

    ``statements``: :func:`~lmforge.methods.selfcite.format.postprocess`'s ``statements`` (those with
    citations not ``None``; a :class:`Postprocessed` is accepted too), scored with their citations as
    given (postprocess already keeps at most 3 merged ones per statement). Matching to ``gold``:
    ``"order"`` pairs the i-th statement with the i-th gold statement (the gold is written per
    predicted statement); ``"text"`` pairs each statement with the first unused gold statement of the
    same :func:`normalise_text`. An unmatched statement is scored with an empty gold set (needs no
    citation: 1 without citations, 0 with) and counted in ``unmatched``.
    """
    if isinstance(statements, Postprocessed):
        statements = statements.statements
    if any(s.citations is None for s in statements):
        raise ValueError("score_response takes statements with citations (postprocess().statements)")
    if max_statements is not None:
        statements = list(statements)[:max_statements]
    matched = _match(statements, gold, matcher)
    scores = []
    for s, g in zip(statements, matched, strict=True):
        support = g.support if g is not None else frozenset()
        cits = s.citations or []
        relevance = tuple(int(any(i in support for i in _citation_sentences(c))) for c in cits)
        scores.append(StatementScore(support_score(cits, support), relevance, g is not None))
    recall = sum(x.support for x in scores) / len(scores) if scores else 0.0
    terms = [r for x in scores for r in x.relevance]
    precision = sum(terms) / len(terms) if terms else 0.0
    f1 = 0.0 if recall + precision == 0 else 2 * recall * precision / (recall + precision)
    return ResponseScore(recall, precision, f1, len(scores), len(terms),
                         sum(not x.matched for x in scores), tuple(scores))


def score_dataset(items: Iterable[tuple[Sequence[Statement] | Postprocessed, Sequence[GoldStatement]]], *,
                  matcher: Matcher = "order", max_statements: int | None = MAX_STATEMENTS) -> dict[str, float]:
    """Means over responses of their recall, precision and F1 (official averaging of per-example
    values), with ``n`` responses and the totals ``statements``, ``citations``, ``unmatched``."""
    per = [score_response(p, g, matcher=matcher, max_statements=max_statements) for p, g in items]
    n = len(per)

    def mean(xs: list[float]) -> float:
        return sum(xs) / n if n else 0.0

    return {
        "recall": mean([r.recall for r in per]),
        "precision": mean([r.precision for r in per]),
        "f1": mean([r.f1 for r in per]),
        "n": n,
        "statements": sum(r.n_statements for r in per),
        "citations": sum(r.n_citations for r in per),
        "unmatched": sum(r.unmatched for r in per),
    }


# ---------------------------------------------------------------- reading LongBench-Cite-style files


@dataclass
class CiteRecord:
    """One prediction aligned with its gold statements."""

    idx: Any
    statements: list[Statement]
    gold: list[GoldStatement]
    dataset: str | None = None


@dataclass
class CiteData:
    """Aligned records and what could not be aligned: ``missing_gold`` (predictions whose idx has no
    gold), ``missing_prediction`` (gold idx without a prediction), ``no_idx`` (objects without
    ``idx``, in either file), ``duplicates`` (repeated idx; the first one is used)."""

    records: list[CiteRecord]
    missing_gold: list[Any] = field(default_factory=list)
    missing_prediction: list[Any] = field(default_factory=list)
    no_idx: int = 0
    duplicates: int = 0

    def pairs(self) -> list[tuple[list[Statement], list[GoldStatement]]]:
        """``(statements, gold)`` per record, for :func:`score_dataset`."""
        return [(r.statements, r.gold) for r in self.records]


def _load_objects(path: Path) -> list[Any]:
    """A JSON list, a single JSON object, or JSON lines."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise UserError(f"{path} is not UTF-8 text (expected JSON or JSONL)") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = None
        rows = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise UserError(f"{path}:{lineno}: not JSON or JSON lines ({e.msg})") from None
        return rows
    return data if isinstance(data, list) else [data]


def _int(value: Any, what: str, path: Path, idx: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise UserError(f"{path}: idx {idx!r}: {what} must be an integer, got {value!r}")
    return value


def _pred_statements(obj: dict[str, Any], path: Path) -> list[Statement]:
    idx = obj.get("idx")
    if "statements" in obj:
        raw = obj["statements"]
        if not isinstance(raw, list):
            raise UserError(f"{path}: idx {idx!r}: 'statements' must be a list")
        out = []
        for st in raw:
            if not isinstance(st, dict) or not isinstance(st.get("statement"), str):
                raise UserError(f"{path}: idx {idx!r}: each statement needs a 'statement' string")
            cits = st.get("citation")
            if cits is None:  # filler text (official citation None) is not scored
                continue
            if not isinstance(cits, list):
                raise UserError(f"{path}: idx {idx!r}: 'citation' must be a list")
            citations = []
            for c in cits:
                if not isinstance(c, dict):
                    raise UserError(f"{path}: idx {idx!r}: each citation must be an object")
                citations.append(Citation(
                    _int(c.get("start_sentence_idx"), "start_sentence_idx", path, idx),
                    _int(c.get("end_sentence_idx"), "end_sentence_idx", path, idx),
                    c.get("start_char_idx", -1), c.get("end_char_idx", -1), c.get("cite", "")))
            out.append(Statement(st["statement"], citations))
        return out
    if isinstance(obj.get("prediction"), str):
        # Without the statements, parse the answer; with its context the spans are checked against it.
        context = obj.get("context")
        sentences = split_sentences(context) if isinstance(context, str) else None
        return postprocess(obj["prediction"], sentences).statements
    raise UserError(f"{path}: idx {idx!r}: a prediction needs 'statements' or a 'prediction' string")


def _gold_statements(obj: dict[str, Any], path: Path) -> list[GoldStatement]:
    idx = obj.get("idx")
    raw = obj.get("statements")
    if not isinstance(raw, list):
        raise UserError(f"{path}: idx {idx!r}: gold needs a 'statements' list")
    out = []
    for st in raw:
        if not isinstance(st, dict) or not isinstance(st.get("statement"), str):
            raise UserError(f"{path}: idx {idx!r}: each gold statement needs a 'statement' string")
        support = st.get("support", [])
        if not isinstance(support, list):
            raise UserError(f"{path}: idx {idx!r}: 'support' must be a list of sentence indices")
        out.append(GoldStatement(st["statement"], frozenset(_int(i, "support", path, idx) for i in support)))
    return out


def _by_idx(objs: list[Any], path: Path, data: CiteData) -> dict[Any, dict[str, Any]]:
    out: dict[Any, dict[str, Any]] = {}
    for obj in objs:
        if not isinstance(obj, dict):
            raise UserError(f"{path}: expected JSON objects, got {type(obj).__name__}")
        if "idx" not in obj:
            data.no_idx += 1
            continue
        key = obj["idx"]
        if isinstance(key, (list, dict)):
            raise UserError(f"{path}: idx must be a string or a number, got {key!r}")
        if key in out:
            data.duplicates += 1
            continue
        out[key] = obj
    return out


def read_longbench_cite(pred_path: str | Path, gold_path: str | Path) -> CiteData:
    """Read LongBench-Cite-style predictions and gold statements, aligned by ``idx``.

    Predictions (a JSON list, one object, or JSONL): ``{"idx", "statements": [{"statement",
    "citation": [{"start_sentence_idx", "end_sentence_idx", ...}] | null}], ...}`` as the official
    prediction scripts write, or ``{"idx", "prediction"}`` (optionally ``"context"``), parsed with
    :func:`~lmforge.methods.selfcite.format.postprocess`; ``statements`` wins when both are present.
    Gold: ``{"idx", "statements": [{"statement", "support": [int, ...]}]}``. Records follow the
    predictions' order; unaligned objects are counted in the result, not raised. Unreadable or non-JSON
    files and wrongly shaped objects raise :class:`UserError`.
    """
    pred_path, gold_path = Path(pred_path), Path(gold_path)
    data = CiteData(records=[])
    preds = _by_idx(_load_objects(pred_path), pred_path, data)
    golds = _by_idx(_load_objects(gold_path), gold_path, data)
    for key, obj in preds.items():
        if key not in golds:
            data.missing_gold.append(key)
            continue
        dataset = obj.get("dataset")
        data.records.append(CiteRecord(key, _pred_statements(obj, pred_path), _gold_statements(golds[key], gold_path),
                                       dataset if isinstance(dataset, str) else None))
    data.missing_prediction = [k for k in golds if k not in preds]
    return data
