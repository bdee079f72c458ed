"""Long-document question answering for Minions (Narayan et al., 2025, arXiv 2502.15964).

The paper evaluates on three long-document benchmarks; :func:`load_docqa` reads each from its local
files in the official format and returns :class:`DocQA` items (document, question, gold answer,
answer kind), and :func:`score_answer` scores a prediction against one item.

* **FinanceBench** (github.com/patronus-ai/financebench, read: ``data/financebench_open_source.jsonl``,
  ``data/financebench_document_information.jsonl`` and the README): one JSON object per line with
  ``financebench_id, company, doc_name, question_type, question_reasoning, domain_question_num,
  question, answer, justification, dataset_subset_label, evidence``; each evidence entry holds
  ``evidence_text, doc_name, evidence_page_num`` (zero-indexed) and ``evidence_text_full_page``
  (the README calls the per-evidence name ``evidence_doc_name``; the data file says ``doc_name``, both
  are read). The filings are PDFs in ``pdfs/<doc_name>.pdf``. We read ``<doc_name>.txt`` or ``.md``
  from ``docs_dir``, else the PDF with ``pypdf`` when it is installed; without ``docs_dir`` the
  document is the evidence pages' full text (``metadata["document_source"] == "evidence_pages"``).
  A bare-number answer (``"$1577.00"``, ``"1.9%"``, ``"-0.02"``) is ``kind="numeric"``, scored with
  the 10% relative tolerance of the later Minions FinanceBench judge (``evaluate/correctness.py``,
  later removed, in the history of the HazyResearch/minions snapshot; its loader reads
  ``<pdf_dir>/<doc_name>.pdf``); the prose answers are ``kind="free"`` and scored by token F1
  (the paper used an LLM judge).
* **LongHealth** (github.com/kbressem/LongHealth ``data/benchmark_v5.json``; the layout was checked in
  that repository's task scripts and in HazyResearch's cartridges loader, as the repository itself is
  not mirrored here): ``{patient_id: {name, birthday, diagnosis, texts: {text_id: text},
  questions: [{No, question, answer_a..answer_e, correct, answer_location}]}}`` where ``correct`` is
  the text of the right option. One item per question, ``kind="choice"``, five choices.
* **QASPER** (``qasper-{train,dev,test}-v0.3.json``; layout from allenai/qasper-led-baseline
  ``fixtures/data/qasper_sample_tiny.json`` and ``qasper_baselines/dataset_reader.py``):
  ``{paper_id: {title, abstract, full_text: [{section_name, paragraphs}], qas: [{question,
  question_id, answers: [{answer: {unanswerable, extractive_spans, yes_no, free_form_answer,
  evidence, highlighted_evidence}, annotation_id, worker_id}]}]}}``. Reference strings follow the
  official ``qasper_evaluator.py`` (read in copies that mark it unchanged): ``"Unanswerable"``; else the extractive spans joined by ", ";
  else the free-form answer; else ``"Yes"``/``"No"``. The score is the best SQuAD-normalised token
  F1 over all annotators' references, as in that evaluator.

Checked: Hugging Face ``datasets`` has no loader for these raw files. Its generic ``json`` builder
reads the FinanceBench question rows but not the filings, and it does not read the
``{id: record}`` objects of LongHealth and QASPER as one row per record. The hub copy of QASPER is a
columnar parquet conversion (its ``qasper.py`` script, which read the raw files, was removed), and
no LongHealth loader turned up. The files are plain JSON, so the standard library reads them here.

:func:`synthetic_docqa` builds seeded "annual report" documents whose questions need ``hops`` facts
from different sections combined numerically, with look-alike distractor figures; every item
records the supporting sentences verbatim (``metadata["facts"]``), so a scripted oracle can answer
from exactly what it was shown (:func:`parse_fact_sentence`, :func:`combine`).
"""

from __future__ import annotations

import logging
import random
import re
from dataclasses import asdict, dataclass, field
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

from lmforge.common.errors import UserError
from lmforge.common.io import parse_json_lines, parse_json_text, read_user_text
from lmforge.eval.longctx import normalize_answer, qa_f1

__all__ = [
    "FORMATS",
    "KINDS",
    "OPERATIONS",
    "DocQA",
    "ParsedNumber",
    "combine",
    "load_docqa",
    "load_financebench",
    "load_longhealth",
    "load_qasper",
    "parse_fact_sentence",
    "parse_numbers",
    "score_answer",
    "synthetic_docqa",
]

logger = logging.getLogger(__name__)

KINDS = ("free", "numeric", "choice")
FORMATS = ("financebench", "longhealth", "qasper", "docqa")
NUMERIC_TOLERANCE = 0.10  # relative; the Minions FinanceBench judge's "10% tolerance"
LETTERS = "ABCDE"


@dataclass
class DocQA:
    """One question about one long document.

    Attributes:
        id: unique id within its set.
        document: the full plain text (sections start with ``## `` headers where the source has them).
        question: the question as asked.
        answer: the gold answer (LongHealth: the correct option's text).
        choices: the options of a multiple-choice item (LongHealth: five), else None.
        kind: ``"free"`` (token F1), ``"numeric"`` (10% tolerance) or ``"choice"``.
        metadata: source fields; ``answers`` lists all gold references where there are several.
    """

    id: str
    document: str
    question: str
    answer: str
    choices: list[str] | None = None
    kind: str = "free"
    metadata: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise UserError(f"DocQA '{self.id}': kind must be one of {', '.join(KINDS)}, got '{self.kind}'")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict; :func:`load_docqa` reads a JSON-lines file of these (``fmt="docqa"``)."""
        return asdict(self)


# ---------------------------------------------------------------- reading files


def _parse_any(path: Path) -> tuple[str, Any]:
    """``("json", value)`` for a JSON file, ``("jsonl", [records])`` for JSON lines; else UserError."""
    raw = read_user_text(path, "document QA")
    if not raw.strip():
        raise UserError(f"{path}: file is empty")
    try:
        return "json", parse_json_text(path, raw)
    except UserError as json_error:
        first = raw.strip().splitlines()[0]
        try:
            parse_json_text(path, first)
        except UserError:
            # Not even the first line is JSON: report where the whole-file parse failed.
            raise json_error from None
    # JSON lines; a bad line is reported with its number.
    return "jsonl", [value for _, value in parse_json_lines(path, raw)]


def _need(rec: Any, key: str, where: str, path: Path, types: type | tuple[type, ...] = str) -> Any:
    if not isinstance(rec, dict):
        raise UserError(f"{path}: {where}: expected a JSON object, got {type(rec).__name__}")
    if key not in rec:
        raise UserError(f"{path}: {where}: missing field '{key}'")
    value = rec[key]
    if not isinstance(value, types):
        names = " or ".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))
        raise UserError(f"{path}: {where}: field '{key}' must be {names}, got {type(value).__name__}")
    return value


def _records_object(data: Any, path: Path, what: str) -> dict:
    if not isinstance(data, dict) or not data:
        raise UserError(f"{path}: not a {what} file: expected a JSON object mapping ids to records")
    return data


def _detect(kind: str, data: Any) -> str | None:
    if kind == "jsonl":
        first = data[0] if data else None
        if not isinstance(first, dict):
            return None
        if "financebench_id" in first or {"doc_name", "evidence"} <= first.keys():
            return "financebench"
        if {"document", "question", "answer"} <= first.keys():
            return "docqa"
        if {"full_text", "qas"} <= first.keys():
            return "qasper"
        return None
    if isinstance(data, dict) and data:
        first = next(iter(data.values()))
        if isinstance(first, dict) and {"texts", "questions"} <= first.keys():
            return "longhealth"
        if isinstance(first, dict) and {"full_text", "qas"} <= first.keys():
            return "qasper"
    if isinstance(data, list) and data and isinstance(data[0], dict) and {"document", "question"} <= data[0].keys():
        return "docqa"
    return None


_OPTIONS = {"financebench": {"docs_dir", "doc_info", "missing"}, "qasper": {"keep_unanswerable"},
            "longhealth": set(), "docqa": set()}


def load_docqa(path: str | Path, fmt: str = "auto", **kw: Any) -> list[DocQA]:
    """Read a long-document QA file.

    Args:
        path: the file.
        fmt: ``"auto"`` (recognised from the records' fields) or one of :data:`FORMATS`.
        **kw: passed to the format's loader (``docs_dir`` for FinanceBench, ``keep_unanswerable``
            for QASPER, ...).

    Returns:
        The items, in file order.
    """
    path = Path(path)
    if fmt != "auto" and fmt not in FORMATS:
        raise UserError(f"unknown document QA format '{fmt}'; choose auto or one of {', '.join(FORMATS)}")
    unknown = set(kw) - _OPTIONS.get(fmt, set().union(*_OPTIONS.values()))
    if unknown:
        raise UserError(f"unknown option(s) for {fmt} document QA: {', '.join(sorted(unknown))}")
    kind, data = _parse_any(path)
    if fmt == "auto":
        detected = _detect(kind, data)
        if detected is None:
            raise UserError(f"{path}: format not recognised; pass one of {', '.join(FORMATS)}")
        fmt = detected
        unknown = set(kw) - _OPTIONS[fmt]
        if unknown:
            raise UserError(f"{path} is {fmt}, which takes no option(s) {', '.join(sorted(unknown))}")
    if fmt == "financebench":
        return _financebench(_as_lines(kind, data, path, "FinanceBench"), path, **kw)
    if fmt == "longhealth":
        return _longhealth(data, path, **kw)
    if fmt == "qasper":
        return _qasper(data if kind == "json" else _papers_from_lines(data, path), path, **kw)
    return _docqa_records(data if isinstance(data, list) else [data], path, **kw)


def _as_lines(kind: str, data: Any, path: Path, what: str) -> list:
    if kind == "jsonl":
        return data
    if isinstance(data, list):  # a JSON array of the same records
        return data
    if isinstance(data, dict):  # a one-line file
        return [data]
    raise UserError(f"{path}: not a {what} file: expected one JSON object per line")


def _docqa_records(records: list, path: Path) -> list[DocQA]:
    out = []
    for i, rec in enumerate(records, 1):
        where = f"record {i}"
        choices = rec.get("choices") if isinstance(rec, dict) else None
        out.append(DocQA(
            id=str(_need(rec, "id", where, path, (str, int))),
            document=_need(rec, "document", where, path),
            question=_need(rec, "question", where, path),
            answer=_need(rec, "answer", where, path),
            choices=list(choices) if choices is not None else None,
            kind=rec.get("kind", "free"),
            metadata=dict(rec.get("metadata") or {}),
        ))
    return out


# ---------------------------------------------------------------- FinanceBench


def load_financebench(path: str | Path, docs_dir: str | Path | None = None, *,
                      doc_info: str | Path | None = None, missing: str = "error") -> list[DocQA]:
    """Read ``financebench_open_source.jsonl``.

    Args:
        path: the questions file.
        docs_dir: a folder with ``<doc_name>.txt`` (or ``.md``, or ``.pdf`` read with pypdf) per
            filing; None uses the evidence pages' full text as the document.
        doc_info: ``financebench_document_information.jsonl``; by default the file of that name
            beside ``path`` when there is one (adds doc_type, doc_period, gics_sector).
        missing: ``"error"`` (default) or ``"skip"`` questions whose filing is not in ``docs_dir``.
    """
    path = Path(path)
    kind, data = _parse_any(path)
    return _financebench(_as_lines(kind, data, path, "FinanceBench"), path, docs_dir=docs_dir,
                         doc_info=doc_info, missing=missing)


def _financebench(rows: list, path: Path, docs_dir: str | Path | None = None, *,
                  doc_info: str | Path | None = None, missing: str = "error") -> list[DocQA]:
    if missing not in ("error", "skip"):
        raise UserError(f"missing must be 'error' or 'skip', got '{missing}'")
    info = _doc_info(path, doc_info)
    folder = None
    if docs_dir is not None:
        folder = Path(docs_dir)
        if not folder.is_dir():
            raise UserError(f"FinanceBench documents folder not found: {folder}")
    cache: dict[str, tuple[str, str, str]] = {}
    out = []
    for i, row in enumerate(rows, 1):
        qid = row.get("financebench_id", f"line{i}") if isinstance(row, dict) else None
        where = f"record {i} ({qid})"
        question = _need(row, "question", where, path)
        answer = _need(row, "answer", where, path, (str, int, float))
        doc_name = _need(row, "doc_name", where, path)
        evidence = row.get("evidence") or []
        meta: dict[str, Any] = {
            "financebench_id": qid, "doc_name": doc_name,
            **{k: row.get(k) for k in ("company", "question_type", "question_reasoning", "justification")},
            "evidence": [e.get("evidence_text", "") for e in evidence if isinstance(e, dict)],
            "evidence_pages": [e.get("evidence_page_num") for e in evidence if isinstance(e, dict)],
        }
        meta.update(info.get(doc_name, {}))
        if folder is None:
            document = _evidence_document(evidence, doc_name, where, path)
            meta["document_source"] = "evidence_pages"
        else:
            if doc_name not in cache:
                found = _read_filing(folder, doc_name)
                if found is None:
                    if missing == "skip":
                        logger.warning("FinanceBench: no document for %s in %s; question skipped", doc_name, folder)
                        continue
                    raise UserError(f"no document for '{doc_name}' in {folder}: expected {doc_name}.txt, .md or .pdf")
                cache[doc_name] = found
            document, source, doc_path = cache[doc_name]
            meta["document_source"], meta["document_path"] = source, doc_path
        answer = str(answer)
        out.append(DocQA(id=str(qid), document=document, question=question, answer=answer,
                         kind="numeric" if _is_number_only(answer) else "free", metadata=meta))
    return out


def _doc_info(path: Path, doc_info: str | Path | None) -> dict[str, dict]:
    info_path = Path(doc_info) if doc_info is not None else path.with_name("financebench_document_information.jsonl")
    if doc_info is None and not info_path.is_file():
        return {}
    raw = read_user_text(info_path, "FinanceBench document information")
    out = {}
    for line, rec in parse_json_lines(info_path, raw):
        name = _need(rec, "doc_name", f"line {line}", info_path)
        out[name] = {k: rec[k] for k in ("doc_type", "doc_period", "gics_sector", "doc_link") if k in rec}
    return out


def _evidence_document(evidence: Any, doc_name: str, where: str, path: Path) -> str:
    if not isinstance(evidence, list) or not evidence:
        raise UserError(f"{path}: {where}: missing field 'evidence' (needed when no docs_dir is given)")
    pages: dict[tuple[str, int], str] = {}
    for j, ev in enumerate(evidence):
        w = f"{where} evidence {j}"
        text = ev.get("evidence_text_full_page") if isinstance(ev, dict) else None
        if not text:
            text = _need(ev, "evidence_text", w, path)
        page = ev.get("evidence_page_num", j)
        name = ev.get("doc_name") or ev.get("evidence_doc_name") or doc_name
        pages.setdefault((name, int(page) if isinstance(page, (int, float)) else j), text)
    # NOTE: FinanceBench page numbers are zero-indexed; headers show them 1-based, as a reader would.
    return "\n\n".join(f"## {name}, page {page + 1}\n{text.strip()}" for (name, page), text in sorted(pages.items()))


def _read_filing(folder: Path, doc_name: str) -> tuple[str, str, str] | None:
    for ext in (".txt", ".md"):
        candidate = folder / f"{doc_name}{ext}"
        if candidate.is_file():
            return read_user_text(candidate, "FinanceBench document"), "text_file", str(candidate)
    pdf = folder / f"{doc_name}.pdf"
    if pdf.is_file():
        return _pdf_text(pdf), "pdf", str(pdf)
    return None


def _pdf_text(pdf: Path) -> str:
    try:
        import pypdf
    except ImportError:
        raise UserError(f"cannot read {pdf}: pypdf is not installed; install it or convert the PDF to "
                        f"text as {pdf.with_suffix('.txt').name}") from None
    try:
        reader = pypdf.PdfReader(str(pdf))
        pages = [page.extract_text() or "" for page in reader.pages]
    except Exception as exc:  # pypdf raises many types for damaged files
        raise UserError(f"cannot read {pdf}: {type(exc).__name__}: {exc}".splitlines()[0]) from None
    return "\n\n".join(f"## Page {i}\n{text.strip()}" for i, text in enumerate(pages, 1))


# ---------------------------------------------------------------- LongHealth


def load_longhealth(path: str | Path) -> list[DocQA]:
    """Read LongHealth's ``benchmark_v5.json``: one five-way multiple-choice item per question.

    The document is all of the patient's texts in file order, each under a ``## <text_id>`` header.
    """
    path = Path(path)
    kind, data = _parse_any(path)
    if kind != "json":
        raise UserError(f"{path}: not a LongHealth file: expected one JSON object mapping patient ids to records")
    return _longhealth(data, path)


def _longhealth(data: Any, path: Path) -> list[DocQA]:
    patients = _records_object(data, path, "LongHealth")
    out, skipped = [], 0
    for pid, patient in patients.items():
        texts = _need(patient, "texts", f"patient '{pid}'", path, dict)
        questions = _need(patient, "questions", f"patient '{pid}'", path, list)
        # NOTE: LongHealth's own task 1 shuffles the texts and truncates to the model's window; the
        # protocols here read the whole record, so the texts keep their file order.
        document = "\n\n".join(f"## {tid}\n{str(text).strip()}" for tid, text in texts.items())
        for j, q in enumerate(questions):
            number = q.get("No", j) if isinstance(q, dict) else j
            where = f"patient '{pid}' question {number}"
            choices = [_need(q, f"answer_{c}", where, path) for c in "abcde"]
            correct = _need(q, "correct", where, path)
            index = _option_index(correct, choices)
            if index is None:
                skipped += 1
                continue
            location = q.get("answer_location") or {}
            out.append(DocQA(
                id=f"{pid}-{number}", document=document, question=_need(q, "question", where, path),
                answer=choices[index], choices=choices, kind="choice",
                metadata={"patient_id": pid, "question_no": number, "correct_letter": LETTERS[index],
                          "answer_location": list(location) if isinstance(location, dict) else location,
                          **{k: patient.get(k) for k in ("name", "birthday", "diagnosis")}},
            ))
    if skipped:
        logger.warning("LongHealth %s: %d question(s) whose 'correct' text matches no option were skipped", path, skipped)
    return out


def _option_index(text: str, choices: list[str]) -> int | None:
    for i, c in enumerate(choices):
        if c == text:
            return i
    norm = " ".join(text.split()).casefold()
    for i, c in enumerate(choices):
        if " ".join(c.split()).casefold() == norm:
            return i
    return None


# ---------------------------------------------------------------- QASPER


def load_qasper(path: str | Path, *, keep_unanswerable: bool = False) -> list[DocQA]:
    """Read a QASPER ``qasper-*-v0.3.json`` file: one free-form item per (paper, question).

    Args:
        path: the file (a JSON-lines file with one paper per line, as the LED baseline reads, works too).
        keep_unanswerable: keep questions that no annotator could answer (gold ``"Unanswerable"``).
    """
    path = Path(path)
    kind, data = _parse_any(path)
    return _qasper(data if kind == "json" else _papers_from_lines(data, path), path,
                   keep_unanswerable=keep_unanswerable)


def _papers_from_lines(rows: list, path: Path) -> dict:
    papers = {}
    for i, row in enumerate(rows, 1):
        if not isinstance(row, dict):
            raise UserError(f"{path}: line {i}: expected a JSON object")
        papers[str(row.get("id", row.get("article_id", f"paper{i}")))] = row
    return papers


def _qasper_reference(ans: Any, where: str, path: Path) -> tuple[str, str] | None:
    """``(reference string, type)`` in the official evaluator's order, or None for an empty annotation."""
    if _need(ans, "unanswerable", where, path, bool):
        return "Unanswerable", "none"
    spans = ans.get("extractive_spans") or []
    if spans:
        return ", ".join(spans), "extractive"
    if ans.get("free_form_answer"):
        return ans["free_form_answer"], "abstractive"
    if ans.get("yes_no") is not None:
        return ("Yes" if ans["yes_no"] else "No"), "boolean"
    return None


def _qasper(data: Any, path: Path, *, keep_unanswerable: bool = False) -> list[DocQA]:
    papers = _records_object(data, path, "QASPER")
    out = []
    for pid, paper in papers.items():
        where = f"paper '{pid}'"
        title = _need(paper, "title", where, path)
        full_text = _need(paper, "full_text", where, path, list)
        parts = [f"# {title}", f"## Abstract\n{str(paper.get('abstract') or '').strip()}"]
        for k, section in enumerate(full_text):
            name = section.get("section_name") if isinstance(section, dict) else None
            paragraphs = _need(section, "paragraphs", f"{where} section {k}", path, list)
            body = "\n\n".join(p.strip() for p in paragraphs if isinstance(p, str) and p.strip())
            parts.append(f"## {name or 'Section'}\n{body}")
        document = "\n\n".join(parts)
        for j, qa in enumerate(_need(paper, "qas", where, path, list)):
            qwhere = f"{where} question {j}"
            refs, types, evidence = [], [], []
            for a, annotation in enumerate(_need(qa, "answers", qwhere, path, list)):
                ans = _need(annotation, "answer", f"{qwhere} annotation {a}", path, dict)
                ref = _qasper_reference(ans, f"{qwhere} annotation {a}", path)
                if ref is None:
                    continue
                refs.append(ref[0])
                types.append(ref[1])
                evidence.append(list(ans.get("evidence") or []))
            answerable = [r for r, t in zip(refs, types) if t != "none"]
            if not answerable and not keep_unanswerable:
                continue
            if not refs:
                continue
            # The gold answer is the first annotator who answered; scoring uses every reference.
            out.append(DocQA(
                id=str(qa.get("question_id", f"{pid}-{j}")), document=document,
                question=_need(qa, "question", qwhere, path), answer=answerable[0] if answerable else refs[0],
                kind="free",
                metadata={"paper_id": pid, "title": title, "answers": refs, "answer_types": types,
                          "evidence": evidence},
            ))
    return out


# ---------------------------------------------------------------- scoring

_SCALES = {"thousand": 1e3, "k": 1e3, "million": 1e6, "mn": 1e6, "mm": 1e6, "m": 1e6,
           "billion": 1e9, "bn": 1e9, "b": 1e9, "trillion": 1e12, "tn": 1e12}
_NUM_RE = re.compile(
    r"(?P<open>\()?\s*(?P<sign>[-−])?\s*(?P<cur>[$€£])?\s*(?P<sign2>[-−])?"
    r"(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
    r"(?:\s*(?P<close>\)))?"
    r"(?:\s*(?P<pct>%|percent\b|per\s+cent\b))?"
    r"(?:\s*(?P<scale>thousand|million|billion|trillion|mn|mm|bn|tn|k|m|b)\b)?",
    re.IGNORECASE,
)
_NUMBER_ONLY_RE = re.compile(
    r"^\s*(?:\(\s*)?[-−]?\s*[$€£]?\s*[-−]?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)\s*\)?"
    r"\s*(?:%|percent|per\s+cent)?\s*(?:thousand|million|billion|trillion|mn|mm|bn|tn|k|m|b)?\s*\.?\s*$",
    re.IGNORECASE,
)
_DECREASE_RE = re.compile(r"\b(decrease[sd]?|declin\w*|drop\w*|fell|fall\w*|lower|loss|down|negative|shrank|shrunk)\b", re.I)


@dataclass(frozen=True)
class ParsedNumber:
    """A number found in text by :func:`parse_numbers`."""

    value: float            # signed mantissa as written ("1.5" of "$1.5 billion")
    scale: float | None     # multiplier of an explicit scale word, or None
    pct: bool
    year_like: bool

    @property
    def total(self) -> float:
        return self.value * (self.scale or 1.0)


def parse_numbers(text: str) -> list[ParsedNumber]:
    """Every number in ``text``: commas, currency signs, ``%``/percent, accounting parentheses,
    leading minus and scale words (thousand, million, bn, ...) are understood."""
    out = []
    for m in _NUM_RE.finditer(text):
        # A digit glued to letters on the left is part of a name ("FY2018" keeps 2018, "Q3" keeps 3)
        # but a hyphen between two words/numbers ("2018-2019", "COVID-19") is not a minus sign.
        sign_at = m.start("sign") if m.group("sign") else m.start("sign2") if m.group("sign2") else -1
        sign = sign_at >= 0 and not (sign_at > 0 and text[sign_at - 1].isalnum())
        negative = bool(sign) or bool(m.group("open") and m.group("close"))
        raw = m.group("num").replace(",", "")
        value = float(raw)
        scale_word = (m.group("scale") or "").lower()
        year_like = (raw.isdigit() and len(raw) == 4 and 1900 <= value <= 2100 and not m.group("cur")
                     and "," not in m.group("num") and not m.group("pct") and not scale_word)
        out.append(ParsedNumber(-value if negative else value, _SCALES.get(scale_word), bool(m.group("pct")), year_like))
    return out


def _is_number_only(text: str) -> bool:
    return bool(_NUMBER_ONLY_RE.match(text)) and bool(parse_numbers(text))


def _close(a: float, b: float, tol: float) -> bool:
    if b == 0:
        return abs(a) <= 1e-9
    return abs(a - b) <= tol * abs(b) * (1 + 1e-9)


_UNIT_RE = re.compile(r"\b(?:in|of)\s+(?:usd\s+|us\$\s*|\$\s*|dollars\s+)?(thousands|millions|billions)\b",
                      re.IGNORECASE)


def question_unit(question: str) -> float | None:
    """The unit a question asks its figures in ("... in USD millions?" -> 1e6), or None."""
    m = _UNIT_RE.search(question or "")
    return None if m is None else {"thousands": 1e3, "millions": 1e6, "billions": 1e9}[m.group(1).lower()]


def _numbers_match(p: ParsedNumber, g: ParsedNumber, tol: float, unit: float | None = None) -> bool:
    if _close(p.total, g.total, tol):
        return True
    if (p.scale is None) != (g.scale is None):
        # One side names its scale and the other does not. The bare number is in the question's
        # unit when it states one ("$1577.00" asked "in USD millions" vs "$1.58 billion"); else the
        # two agree only as written ("1,577" vs "1,577 million": the unit left out).
        # NOTE: trying every scale for the bare number would accept answers 1000x off ("1.5
        # million" for 1,577 millions), which FinanceBench's LLM judge would not.
        bare, scaled = (p, g) if p.scale is None else (g, p)
        if _close(bare.value * unit, scaled.total, tol) if unit is not None else _close(bare.value, scaled.value, tol):
            return True
    if g.pct != p.pct:  # 42.7% written as the fraction 0.427, or the reverse
        return _close(p.value * 100 if g.pct else p.value / 100, g.value, tol)
    return False


def _numeric_score(gold_text: str, prediction: str, tol: float, unit: float | None = None) -> float:
    golds = parse_numbers(gold_text)
    if not golds:
        return qa_f1(prediction, gold_text)
    gold = golds[0]
    cands = [n for n in parse_numbers(prediction) if gold.year_like or not n.year_like] or parse_numbers(prediction)
    same_kind = [n for n in cands if n.pct == gold.pct]
    if not cands:
        return 0.0
    # The stated answer is taken to be the last number of its kind ("5,000 - 3,000 = 2,000").
    pred = (same_kind or cands)[-1]
    if _numbers_match(pred, gold, tol, unit):
        return 1.0
    # "decreased by 12.3" answers a change of -12.3.
    if gold.value < 0 < pred.value and _DECREASE_RE.search(prediction):
        return float(_numbers_match(ParsedNumber(-pred.value, pred.scale, pred.pct, False), gold, tol, unit))
    return 0.0


_LETTER_START = re.compile(r"^\s*(?:\*\*)?\(?([A-E])\)?(?:\*\*)?\s*(?:[).:\-]|$)")
_LETTER_SAID = re.compile(r"\b(?:[Aa]nswer|[Oo]ption|[Cc]hoice)\b(?:\s+is)?\s*[:\-]?\s*(?:\*\*)?\(?([A-E])\b")


def _choice_index(item: DocQA, prediction: str) -> int | None:
    choices = item.choices or []
    said = _LETTER_SAID.findall(prediction)
    if said:
        letter = said[-1]
    else:
        m = _LETTER_START.match(prediction)
        letter = m.group(1) if m else (prediction.strip().upper() if len(prediction.strip()) == 1 else None)
    if letter and letter in LETTERS[: len(choices)]:
        return LETTERS.index(letter)
    pred = normalize_answer(prediction)
    if not pred:
        return None
    norms = [normalize_answer(c) for c in choices]
    for i, c in enumerate(norms):
        if c == pred:
            return i
    contained = [i for i, c in enumerate(norms) if c and c in pred]
    # Drop options that are only contained because a longer contained option includes them.
    contained = [i for i in contained if not any(j != i and norms[i] in norms[j] for j in contained)]
    return contained[0] if len(contained) == 1 else None


def score_answer(item: DocQA, prediction: str | None) -> float:
    """Score one prediction in [0, 1].

    * ``numeric``: 1 when the prediction's stated number (the last one; years such as 2021 are
      skipped unless the gold is a year; percentages preferred when the gold is one) is within
      ``metadata.get("tolerance", 0.10)`` relative error of the gold; commas, ``$``, ``%``,
      parentheses and scale words are understood, and a bare number may stand for units,
      thousands, millions or billions when the other side names its scale.
    * ``choice``: 1 when the prediction picks the right option, by letter ("C", "(C)", "The answer
      is C: ...") or by the option's text (exactly one option's text appears in it).
    * ``free``: the best SQuAD-normalised token F1 over ``metadata["answers"]`` (else the answer).
    """
    if prediction is None:
        return 0.0
    prediction = str(prediction)
    if item.kind == "numeric":
        return _numeric_score(item.answer, prediction, float(item.metadata.get("tolerance", NUMERIC_TOLERANCE)),
                              question_unit(item.question))
    if item.kind == "choice":
        gold = _option_index(item.answer, item.choices or [])
        picked = _choice_index(item, prediction)
        return float(gold is not None and picked == gold)
    refs = item.metadata.get("answers") or [item.answer]
    return float(qa_f1(prediction, list(refs)))


# ---------------------------------------------------------------- synthetic multi-hop reports

OPERATIONS = ("value", "difference", "change", "ratio", "sum_divisions", "sum_years", "net_of_costs")
_YEARS = tuple(range(2018, 2025))
_DIVISIONS = ("Aster", "Birch", "Cedar", "Dunmore", "Ember", "Fjord", "Granite", "Harbor", "Iris",
              "Juniper", "Kestrel", "Lumen", "Marlow", "Northgate")
_METRICS = ("revenue", "operating costs", "research spending", "capital expenditure", "marketing spend")
_COST_SHARE = {"operating costs": (0.50, 0.70), "research spending": (0.05, 0.12),
               "capital expenditure": (0.04, 0.10), "marketing spend": (0.03, 0.08)}
_COMPANIES = ("Halvorsen Group", "Marlowe Holdings", "Corvane Industries", "Tessaly Group", "Brightwater Holdings",
              "Oakhurst Corporation", "Veridian Works", "Solent Partners", "Kilbride Group", "Ardent Systems")
_SECTIONS = ("Letter from the Chair", "Strategic Overview", "Market Environment", "Segment Performance",
             "Financial Review", "Cost Management", "Investment Programme", "Research and Development",
             "Regional Highlights", "Risk Factors", "Sustainability", "Our People", "Corporate Governance",
             "Remuneration Report", "Capital Allocation", "Outlook")
_NOTE_TOPICS = ("Segment Information", "Operating Expenses", "Property and Equipment", "Leases", "Provisions",
                "Financial Instruments", "Related Parties", "Contingent Liabilities", "Subsequent Events")
_FACT_TEMPLATES = (
    "In fiscal {year}, the {div} division reported {metric} of ${value} million.",
    "The {div} division's {metric} for fiscal {year} came to ${value} million.",
    "{Metric} at the {div} division totalled ${value} million in fiscal {year}.",
    "For fiscal {year}, the {div} division recorded {metric} of ${value} million.",
)
_FILLER_TEMPLATES = (
    "The board met {n} times during the year and reviewed the risk register at every meeting.",
    "Management continued to simplify the product range of the {div} division, retiring several legacy lines.",
    "Supply chain conditions in {region} eased in the second half, which allowed inventory to normalise.",
    "Employee engagement surveys reached a response rate of {pct} percent across all sites.",
    "The {div} division opened a new service centre in {region} to shorten delivery times for key customers.",
    "Customer retention remained a priority, and account teams were reorganised around larger clients.",
    "The audit committee reviewed the effectiveness of internal controls and found no material weaknesses.",
    "Energy use per unit of output fell for the {nth} consecutive year as older equipment was replaced.",
    "A new enterprise resource planning system was rolled out to the {div} division in stages.",
    "Competition in {region} intensified, particularly from smaller regional suppliers with lower overheads.",
    "The group renewed its revolving credit facility on terms similar to those of the previous agreement.",
    "Training hours per employee increased, with a focus on safety, data literacy and leadership skills.",
    "Several long-standing customer contracts in {region} were extended for a further {n} years.",
    "The {div} division completed the integration of a small software business acquired the year before.",
    "Freight and logistics costs remained volatile, and the group continued to diversify its carriers.",
    "Directors consider that the group has adequate resources to continue in operation for the foreseeable future.",
    "Health and safety performance improved, with lost-time incidents down on the prior year.",
    "The group published its first report aligned with the recommendations on climate-related disclosures.",
    "Pricing actions were taken in {region} to offset higher input costs without losing market share.",
    "The {div} division piloted automated quality inspection on {n} production lines.",
    "Working capital discipline remained strong, supported by tighter collection of receivables.",
    "The remuneration committee reviewed incentive targets to align them with long-term value creation.",
    "Digital sales channels grew faster than traditional channels, especially among smaller customers.",
    "Cyber security testing was extended to all major sites, and no significant breaches were recorded.",
    "Demand from the public sector in {region} was steady, while private sector orders were more cyclical.",
    "The group maintained its policy of sourcing from suppliers that meet its code of conduct.",
    "An independent review of the {div} division's processes recommended {n} improvements, all now under way.",
    "Currency movements had a modest effect on reported results, mainly through translation.",
    "The group continued to engage with shareholders on strategy, governance and capital allocation.",
    "Product recalls were limited to {n} minor cases, each resolved without lasting customer impact.",
)
_REGIONS = ("northern Europe", "the Iberian peninsula", "the Gulf region", "South East Asia", "Central America",
            "the Baltic states", "western Canada", "East Africa", "the Pacific Northwest", "southern Germany")
_NUM_WORDS = ("two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve")
_NTH = ("second", "third", "fourth", "fifth", "sixth")
_FACT_PARSE = {
    "year": re.compile(r"\bfiscal (\d{4})\b"),
    "value": re.compile(r"\$(-?[\d,]+(?:\.\d+)?) million"),
    "division": re.compile(r"\b(" + "|".join(_DIVISIONS) + r") division"),
    "metric": re.compile("(" + "|".join(sorted(_METRICS, key=len, reverse=True)) + ")", re.I),
}


def parse_fact_sentence(sentence: str) -> dict[str, Any] | None:
    """The ``division, metric, year, value`` of a synthetic report's fact sentence, else None."""
    found = {k: rx.search(sentence) for k, rx in _FACT_PARSE.items()}
    if not all(found.values()):
        return None
    return {"division": found["division"].group(1), "metric": found["metric"].group(1).lower(),
            "year": int(found["year"].group(1)), "value": float(found["value"].group(1).replace(",", ""))}


def _fmt_decimal(d: Decimal) -> str:
    text = f"{d:.1f}"
    return "0.0" if text == "-0.0" else text


def combine(operation: str, values: list[float]) -> str:
    """The answer string of a synthetic question from its facts' values, in ``metadata["facts"]`` order.

    ``value``: the one value; ``difference``: first minus second; ``change``: second (later year)
    minus first; ``ratio``: first as a percentage of second, one decimal; ``sum_divisions`` /
    ``sum_years``: the sum; ``net_of_costs``: first minus all the others. Money answers carry one
    decimal (USD millions).
    """
    ds = [Decimal(str(v)) for v in values]
    if operation == "value":
        result = ds[0]
    elif operation == "difference":
        result = ds[0] - ds[1]
    elif operation == "change":
        result = ds[1] - ds[0]
    elif operation == "ratio":
        result = (ds[0] / ds[1] * 100).quantize(Decimal("0.1"), rounding=ROUND_HALF_UP)
    elif operation in ("sum_divisions", "sum_years"):
        result = sum(ds, Decimal(0))
    elif operation == "net_of_costs":
        result = ds[0] - sum(ds[1:], Decimal(0))
    else:
        raise UserError(f"unknown synthetic operation '{operation}'; expected one of {', '.join(OPERATIONS)}")
    return _fmt_decimal(result)


class _Report:
    """Figures of one synthetic company, drawn lazily (and so reproducibly) from ``rng``."""

    def __init__(self, rng: random.Random, divisions: list[str]):
        self.rng = rng
        center = rng.uniform(300, 900)
        self.base = {d: center * rng.uniform(0.85, 1.15) for d in divisions}
        self.growth = {d: rng.uniform(-0.05, 0.12) for d in divisions}
        self.share: dict[tuple[str, str], float] = {}
        self.cache: dict[tuple[str, str, int], int] = {}  # values in tenths of a million

    def tenths(self, div: str, metric: str, year: int) -> int:
        key = (div, metric, year)
        if key not in self.cache:
            if metric == "revenue":
                v = self.base[div] * (1 + self.growth[div]) ** (year - _YEARS[0]) * self.rng.uniform(0.97, 1.03)
            else:
                if (div, metric) not in self.share:
                    self.share[(div, metric)] = self.rng.uniform(*_COST_SHARE[metric])
                v = self.tenths(div, "revenue", year) / 10 * self.share[(div, metric)] * self.rng.uniform(0.95, 1.05)
            self.cache[key] = max(1, round(v * 10))
        return self.cache[key]


def _money(tenths: int) -> str:
    return f"{tenths // 10:,}.{tenths % 10}"


def _fact_sentence(rng: random.Random, div: str, metric: str, year: int, tenths: int) -> str:
    template = rng.choice(_FACT_TEMPLATES)
    return template.format(div=div, metric=metric, Metric=metric[0].upper() + metric[1:], year=year, value=_money(tenths))


class _Filler:
    """Filler prose; templates are dealt from a shuffled deck so neighbours rarely repeat."""

    def __init__(self, rng: random.Random, divisions: list[str]):
        self.rng, self.divisions, self.deck = rng, divisions, []

    def __call__(self) -> str:
        if not self.deck:
            self.deck = list(_FILLER_TEMPLATES)
            self.rng.shuffle(self.deck)
        rng = self.rng
        return self.deck.pop().format(
            div=rng.choice(self.divisions), region=rng.choice(_REGIONS), n=rng.choice(_NUM_WORDS),
            pct=rng.randint(55, 92), nth=rng.choice(_NTH))


def _question(rng: random.Random, hops: int, divisions: list[str], company: str
              ) -> tuple[str, str, list[tuple[str, str, int]], str]:
    """``(operation, question, supporting keys in operand order, unit)``."""
    year = rng.choice(_YEARS)
    div = rng.choice(divisions)
    costs = [m for m in _METRICS if m != "revenue"]
    lead = f"According to the {company} annual report, "
    if hops == 1:
        metric = rng.choice(_METRICS)
        return ("value", f"{lead}what was the {metric} of the {div} division in fiscal {year}, in USD millions?",
                [(div, metric, year)], "USD millions")
    ops = ["difference", "change", "ratio", "sum_divisions"] if hops == 2 else \
        ["sum_divisions", "sum_years"] + (["net_of_costs"] if hops - 1 <= len(costs) else [])
    op = rng.choice(ops)
    if op == "difference":
        cost = rng.choice(costs)
        return (op, f"{lead}what was the {div} division's revenue minus its {cost} in fiscal {year}, in USD millions?",
                [(div, "revenue", year), (div, cost, year)], "USD millions")
    if op == "change":
        metric = rng.choice(_METRICS)
        y1, y2 = sorted(rng.sample(_YEARS, 2))
        return (op, f"{lead}by how much did the {metric} of the {div} division change from fiscal {y1} to fiscal "
                    f"{y2} (fiscal {y2} minus fiscal {y1}), in USD millions?",
                [(div, metric, y1), (div, metric, y2)], "USD millions")
    if op == "ratio":
        cost = rng.choice(costs)
        return (op, f"{lead}what was the {div} division's {cost} in fiscal {year} as a percentage of its revenue in "
                    f"fiscal {year}, rounded to one decimal place?",
                [(div, cost, year), (div, "revenue", year)], "percent")
    if op == "sum_divisions":
        metric = rng.choice(_METRICS)
        divs = rng.sample(divisions, hops)
        names = ", ".join(divs[:-1]) + f" and {divs[-1]}"
        return (op, f"{lead}what was the combined {metric} of the {names} divisions in fiscal {year}, in USD millions?",
                [(d, metric, year) for d in divs], "USD millions")
    if op == "sum_years":
        metric = rng.choice(_METRICS)
        start = rng.randrange(len(_YEARS) - hops + 1)
        years = list(_YEARS[start:start + hops])
        names = ", ".join(map(str, years[:-1])) + f" and {years[-1]}"
        return (op, f"{lead}what was the total {metric} of the {div} division over fiscal {names} combined, "
                    f"in USD millions?",
                [(div, metric, y) for y in years], "USD millions")
    picked = rng.sample(costs, hops - 1)
    names = ", ".join(picked[:-1]) + f" and {picked[-1]}" if len(picked) > 1 else picked[0]
    return (op, f"{lead}what was the {div} division's revenue in fiscal {year} minus its {names} in the same year, "
                f"in USD millions?",
            [(div, "revenue", year)] + [(div, c, year) for c in picked], "USD millions")


def _near_keys(key: tuple[str, str, int], divisions: list[str]) -> list[tuple[str, str, int]]:
    """Look-alike figures: the same line in neighbouring years, for other divisions, other lines."""
    div, metric, year = key
    out = [(div, metric, y) for y in (year - 1, year + 1, year - 2, year + 2) if y in _YEARS]
    out += [(d, metric, year) for d in divisions if d != div]
    out += [(div, m, year) for m in _METRICS if m != metric]
    return out


def _section_titles(n: int, rng: random.Random) -> list[str]:
    rest = list(_SECTIONS[1:])
    rng.shuffle(rest)
    titles = [_SECTIONS[0]] + rest
    k = 1
    while len(titles) < n:
        titles.append(f"Note {k}: {_NOTE_TOPICS[(k - 1) % len(_NOTE_TOPICS)]}")
        k += 1
    return titles[:n]


def _one_report(rng: random.Random, index: int, seed: int, doc_chars: int, hops: int) -> DocQA:
    company = rng.choice(_COMPANIES)
    divisions = rng.sample(_DIVISIONS, 8)
    report = _Report(rng, divisions)
    op, question, keys, unit = _question(rng, hops, divisions, company)

    # Look-alike distractors first (neighbouring years, other divisions, other lines), then random
    # figures, up to about one fact per 500 characters of document.
    n_facts = min(max(4 * hops, doc_chars // 500), 150)
    chosen: list[tuple[str, str, int]] = []
    for key in keys:
        near = [k for k in _near_keys(key, divisions) if k not in keys and k not in chosen]
        chosen += rng.sample(near, min(3, len(near)))
    while len(chosen) + len(keys) < n_facts:
        k = (rng.choice(divisions), rng.choice(_METRICS), rng.choice(_YEARS))
        if k not in keys and k not in chosen:
            chosen.append(k)

    n_sections = min(max(doc_chars // 1600, hops + 2, 6), 40)
    titles = _section_titles(n_sections, rng)
    sections: list[list[tuple[str, bool]]] = [[] for _ in titles]  # (sentence, paragraph break after)

    def place(s: int, sentence: str) -> None:
        sections[s].insert(rng.randrange(len(sections[s]) + 1), (sentence, rng.random() < 0.25))

    facts = []
    for key, s in zip(keys, rng.sample(range(n_sections), hops)):  # each hop in its own section
        sentence = _fact_sentence(rng, *key, report.tenths(*key))
        place(s, sentence)
        facts.append({"sentence": sentence, "section": titles[s], "division": key[0], "metric": key[1],
                      "year": key[2], "value": report.tenths(*key) / 10})
    distractors = []
    for key in chosen:
        s = rng.randrange(n_sections)
        sentence = _fact_sentence(rng, *key, report.tenths(*key))
        place(s, sentence)
        distractors.append({"sentence": sentence, "section": titles[s], "division": key[0], "metric": key[1],
                            "year": key[2], "value": report.tenths(*key) / 10})

    header = f"# {company} Annual Report, Fiscal {_YEARS[-1]}"
    filler = _Filler(rng, divisions)

    def render() -> str:
        parts = [header]
        for title, body in zip(titles, sections):
            text = "".join(s + ("\n\n" if brk else " ") for s, brk in body).strip()
            parts.append(f"## {title}\n{text}")
        return "\n\n".join(parts)

    # Filler up to the target length: an upper bound first, then exact top-ups.
    estimate = len(render())
    while True:
        sentence = filler()
        if estimate + len(sentence) + 2 > doc_chars:
            break
        place(rng.randrange(n_sections), sentence)
        estimate += len(sentence) + 2
    document = render()
    while len(document) < doc_chars - 120:
        place(rng.randrange(n_sections), filler())
        document = render()

    # Character offsets, so a caller that cuts fixed-size windows knows which window holds a fact.
    for entry in facts + distractors:
        entry["start"] = document.index(entry["sentence"])
    values = [f["value"] for f in facts]
    answer = combine(op, values)
    symbol = {"difference": " - ", "change": " -> ", "ratio": " / ", "net_of_costs": " - "}.get(op, " + ")
    return DocQA(
        id=f"synthetic-{seed}-{hops}hop-{index}", document=document, question=question, answer=answer,
        kind="numeric",
        metadata={"operation": op, "hops": hops, "unit": unit, "company": company, "facts": facts,
                  "distractors": distractors, "formula": symbol.join(f"{v:.1f}" for v in values) + f" = {answer}",
                  "sections": titles, "seed": seed, "doc_chars": doc_chars},
    )


def synthetic_docqa(n: int, *, seed: int = 0, doc_chars: int = 20000, hops: int = 2) -> list[DocQA]:
    """``n`` seeded multi-hop numeric questions over long synthetic annual reports.

    Each document is plain text: a ``# <company> Annual Report`` title and ``## <Section>`` headers,
    with filler prose, the ``hops`` supporting fact sentences in distinct sections, and distractor
    figures for the same line in other years, other divisions and other lines of the same year.

    Args:
        n: number of items; the first ``k`` items do not depend on ``n``.
        seed: ``random.Random(seed)`` drives everything.
        doc_chars: target document length in characters (met within about 150 characters unless
            the facts alone are longer).
        hops: facts combined per answer, 1..6 (1: a single look-up; 2: a difference, a change
            between years, a ratio or a sum; more: sums or revenue net of several costs).

    Returns:
        ``kind="numeric"`` items; ``metadata["facts"]`` lists each supporting sentence verbatim with
        its section and character offset (``start``), in the operand order of :func:`combine`
        (``metadata["operation"]``); ``metadata["distractors"]`` has the same fields.
    """
    if n < 0:
        raise UserError(f"n must be >= 0, got {n}")
    if not 1 <= hops <= 6:
        raise UserError(f"hops must be between 1 and 6, got {hops}")
    if doc_chars < 1000:
        raise UserError(f"doc_chars must be at least 1000, got {doc_chars}")
    rng = random.Random(seed)
    return [_one_report(rng, i, seed, doc_chars, hops) for i in range(n)]
