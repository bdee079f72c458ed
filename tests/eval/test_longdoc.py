"""Long-document QA: the three official formats load, the scorer matches hand-computed values, and the
synthetic multi-hop reports are reproducible, answerable from their supporting sentences and
padded with look-alike distractors.

Fixtures in tests/eval/data/longdoc/ copy the official structures, field for field:
* financebench_open_source.jsonl / financebench_document_information.jsonl: record keys, evidence keys
  and doc-info keys as in github.com/patronus-ai/financebench data/*.jsonl (HEAD cc39aeb).
* benchmark_v5.json: github.com/kbressem/LongHealth data/benchmark_v5.json, as read by that
  repository's task scripts and HazyResearch/cartridges' loader (patient -> name, birthday,
  diagnosis, texts, questions[No, question, answer_a..e, correct, answer_location]).
* qasper-dev-v0.3.json: allenai/qasper-led-baseline fixtures/data/qasper_sample_tiny.json (paper ->
  title, abstract, full_text[section_name, paragraphs], qas[question, question_id, ..., answers[
  answer{unanswerable, extractive_spans, yes_no, free_form_answer, evidence, highlighted_evidence},
  annotation_id, worker_id]]).
"""

from __future__ import annotations

import json
import re
import sys
import types
from pathlib import Path

import pytest

from lmforge.common.errors import UserError
from lmforge.eval import longdoc as ld
from lmforge.eval.longdoc import DocQA

DATA = Path(__file__).parent / "data" / "longdoc"
FB = DATA / "financebench_open_source.jsonl"
LH = DATA / "benchmark_v5.json"
QASPER = DATA / "qasper-dev-v0.3.json"


def _one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


# ---------------------------------------------------------------- FinanceBench


def test_financebench_evidence_pages_fallback_and_doc_info():
    items = ld.load_financebench(FB)
    assert [i.id for i in items] == ["financebench_id_03029", "financebench_id_00499", "financebench_id_01226"]
    capex, prose, ratio = items
    assert capex.kind == "numeric" and capex.answer == "$1577.00"
    assert ratio.kind == "numeric" and prose.kind == "free"
    assert capex.metadata["document_source"] == "evidence_pages"
    # The page is zero-indexed 59 in the file and shown as page 60.
    assert capex.document.startswith("## 3M_2018_10K, page 60\nConsolidated Statement of Cash Flows")
    # Two evidence entries on the same page give the page once; pages come in page order.
    assert prose.document.count("## 3M_2022_10K, page") == 2
    assert prose.document.index("page 48") < prose.document.index("page 50")
    # The sibling document-information file adds the filing's type and period.
    assert capex.metadata["doc_type"] == "10k" and capex.metadata["doc_period"] == 2018
    assert ratio.metadata["gics_sector"] == "Information Technology"
    assert capex.metadata["evidence_pages"] == [59]


def test_financebench_reads_text_files_from_docs_dir(tmp_path):
    (tmp_path / "3M_2018_10K.txt").write_text("## Item 8\nCapex was 1,577.", encoding="utf-8")
    (tmp_path / "3M_2022_10K.md").write_text("# 3M 2022\n## Item 7\nNet sales 34,229.", encoding="utf-8")
    (tmp_path / "ADOBE_2022_10K.txt").write_text("Adobe text", encoding="utf-8")
    items = ld.load_financebench(FB, tmp_path)
    assert items[0].document == "## Item 8\nCapex was 1,577."
    assert items[1].document.startswith("# 3M 2022")
    assert items[0].metadata["document_source"] == "text_file"
    assert items[0].metadata["document_path"].endswith("3M_2018_10K.txt")


def test_financebench_pdf_without_pypdf_is_a_one_line_error(tmp_path, monkeypatch):
    (tmp_path / "3M_2018_10K.pdf").write_bytes(b"%PDF-1.4 not really")
    monkeypatch.setitem(sys.modules, "pypdf", None)  # import pypdf -> ImportError
    with pytest.raises(UserError) as exc:
        ld.load_financebench(FB, tmp_path)
    msg = _one_line(exc)
    assert "3M_2018_10K.pdf" in msg and "3M_2018_10K.txt" in msg and "pypdf" in msg


def test_financebench_pdf_pages_through_pypdf(tmp_path, monkeypatch):
    class Page:
        def __init__(self, text):
            self.text = text

        def extract_text(self):
            return self.text

    class Reader:
        def __init__(self, path):
            assert path.endswith(".pdf")
            self.pages = [Page("Cover"), Page("Cash flow: capex 1,577")]

    monkeypatch.setitem(sys.modules, "pypdf", types.SimpleNamespace(PdfReader=Reader))
    for name in ("3M_2018_10K", "3M_2022_10K", "ADOBE_2022_10K"):
        (tmp_path / f"{name}.pdf").write_bytes(b"%PDF")
    items = ld.load_financebench(FB, tmp_path)
    assert items[0].document == "## Page 1\nCover\n\n## Page 2\nCash flow: capex 1,577"
    assert items[0].metadata["document_source"] == "pdf"


def test_financebench_missing_document_errors_or_skips(tmp_path):
    (tmp_path / "3M_2018_10K.txt").write_text("only this one", encoding="utf-8")
    with pytest.raises(UserError) as exc:
        ld.load_financebench(FB, tmp_path)
    assert "3M_2022_10K" in _one_line(exc)
    kept = ld.load_financebench(FB, tmp_path, missing="skip")
    assert [i.metadata["doc_name"] for i in kept] == ["3M_2018_10K"]
    with pytest.raises(UserError):
        ld.load_financebench(FB, tmp_path / "nope")


# ---------------------------------------------------------------- LongHealth


def test_longhealth_one_choice_item_per_question():
    items = ld.load_longhealth(LH)
    assert [i.id for i in items] == ["patient_01-1", "patient_01-2", "patient_02-1"]
    first = items[0]
    assert first.kind == "choice"
    assert first.choices == ["Gadovist", "Omnipaque 240", "Imeron 350", "Ultravist 370", "No contrast agent"]
    assert first.answer == "Omnipaque 240" and first.metadata["correct_letter"] == "B"
    assert first.metadata["answer_location"] == ["text_1"]
    assert first.metadata["patient_id"] == "patient_01" and first.metadata["diagnosis"] == "Multiple Myeloma"
    # The document is every text of the patient under its id, in file order; no other patient's text.
    assert re.findall(r"^## (\S+)$", first.document, re.M) == ["text_0", "text_1"]
    assert "Omnipaque 240 showed osteolysis" in first.document and "Anna Berg" not in first.document
    assert items[1].metadata["correct_letter"] == "A"


def test_longhealth_unmatched_correct_option_is_skipped(tmp_path):
    data = json.loads(LH.read_text())
    data["patient_01"]["questions"][0]["correct"] = "Something else"
    data["patient_01"]["questions"][1]["correct"] = "  multiple myeloma IgG  kappa "  # spacing/case only
    path = tmp_path / "lh.json"
    path.write_text(json.dumps(data))
    items = ld.load_longhealth(path)
    assert [i.id for i in items] == ["patient_01-2", "patient_02-1"]
    assert items[0].answer == "Multiple Myeloma IgG kappa"


# ---------------------------------------------------------------- QASPER


def test_qasper_questions_answers_and_document():
    items = ld.load_qasper(QASPER)
    by_id = {i.id: i for i in items}
    assert list(by_id) == ["q-extractive", "q-yesno", "q-mixed"]  # all-unanswerable skipped
    ext = by_id["q-extractive"]
    assert ext.answer == "a vocabulary of positive and negative predicates"
    assert ext.metadata["answers"] == ["a vocabulary of positive and negative predicates", "a small list of words"]
    assert ext.metadata["answer_types"] == ["extractive", "abstractive"]
    assert by_id["q-yesno"].answer == "No"
    # First annotator could not answer: the gold is the first answer, every reference is kept
    # (extractive spans joined by ", ", and preferred to a free-form answer, as the official evaluator does).
    mixed = by_id["q-mixed"]
    assert mixed.answer == "Japanese"
    assert mixed.metadata["answers"] == ["Unanswerable", "Japanese", "Japanese, English"]
    doc = ext.document
    assert doc.startswith("# Minimally Supervised Learning")
    assert re.findall(r"^## (.+)$", doc, re.M) == [
        "Abstract", "Introduction", "Proposed Method ::: Polarity Function", "Conclusion"]
    assert "A short paragraph\n\nAnother intro paragraph" in doc


def test_qasper_keep_unanswerable_flag():
    items = ld.load_qasper(QASPER, keep_unanswerable=True)
    una = {i.id: i for i in items}["q-unanswerable"]
    assert una.answer == "Unanswerable" and una.metadata["answers"] == ["Unanswerable", "Unanswerable"]
    assert ld.score_answer(una, "unanswerable") == 1.0


def test_qasper_score_is_max_token_f1_over_annotators():
    ext = {i.id: i for i in ld.load_qasper(QASPER)}["q-extractive"]
    # vs "a small list of words" -> {small, list, of, words}: pred {small, list} P=1, R=2/4 -> 2/3.
    # vs the extractive span (6 tokens, no overlap) -> 0. Max = 2/3.
    assert ld.score_answer(ext, "small list") == pytest.approx(2 / 3)
    assert ld.score_answer(ext, "The vocabulary!") == pytest.approx(2 * (1 * 1 / 6) / (1 + 1 / 6))
    assert ld.score_answer(ext, "nothing relevant") == 0.0


# ---------------------------------------------------------------- load_docqa and bad input


def test_load_docqa_auto_detects_each_format(tmp_path):
    assert [i.id for i in ld.load_docqa(FB)] == [i.id for i in ld.load_financebench(FB)]
    assert [i.id for i in ld.load_docqa(LH)] == [i.id for i in ld.load_longhealth(LH)]
    assert [i.id for i in ld.load_docqa(QASPER, keep_unanswerable=True)] == [
        i.id for i in ld.load_qasper(QASPER, keep_unanswerable=True)]
    # lmforge's own records round-trip.
    items = ld.synthetic_docqa(2, seed=3, doc_chars=2000)
    path = tmp_path / "set.jsonl"
    path.write_text("".join(json.dumps(i.to_dict()) + "\n" for i in items))
    assert ld.load_docqa(path) == items


def test_load_docqa_rejects_unknown_format_and_options(tmp_path):
    with pytest.raises(UserError) as exc:
        ld.load_docqa(FB, fmt="longbench")
    assert "longbench" in _one_line(exc)
    with pytest.raises(UserError) as exc:
        ld.load_docqa(LH, docs_dir=tmp_path)  # LongHealth takes no docs_dir
    assert "docs_dir" in _one_line(exc)
    other = tmp_path / "other.json"
    other.write_text('{"a": {"b": 1}}')
    with pytest.raises(UserError) as exc:
        ld.load_docqa(other)
    assert "not recognised" in _one_line(exc)


@pytest.mark.parametrize("content, expect", [
    ("this is not json at all\nnor this", "not valid JSON"),
    ('{"financebench_id": 1, "doc_name": "x", "evidence": []}\n{broken\n', ":2: not valid JSON"),
    ("", "empty"),
])
def test_bad_files_are_one_line_errors(tmp_path, content, expect):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(UserError) as exc:
        ld.load_docqa(path)
    msg = _one_line(exc)
    assert expect in msg and str(path) in msg


def test_missing_fields_name_the_field(tmp_path):
    data = json.loads(LH.read_text())
    del data["patient_02"]["questions"][0]["answer_c"]
    path = tmp_path / "lh.json"
    path.write_text(json.dumps(data))
    with pytest.raises(UserError) as exc:
        ld.load_longhealth(path)
    assert "answer_c" in _one_line(exc) and "patient_02" in str(exc.value)

    rows = [json.loads(line) for line in FB.read_text().splitlines()]
    del rows[1]["question"]
    path = tmp_path / "fb.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(UserError) as exc:
        ld.load_financebench(path)
    assert "'question'" in _one_line(exc) and "financebench_id_00499" in str(exc.value)

    with pytest.raises(UserError) as exc:
        ld.load_qasper(LH)  # a LongHealth file is not QASPER
    assert "title" in _one_line(exc)
    with pytest.raises(UserError):
        ld.load_qasper(tmp_path / "missing.json")


# ---------------------------------------------------------------- score_answer


def _numeric(answer: str, question: str = "?", **meta) -> DocQA:
    return DocQA(id="n", document="", question=question, answer=answer, kind="numeric", metadata=meta)


@pytest.mark.parametrize("pred, score", [
    ("109.9", 1.0), ("110.1", 0.0), ("90.1", 1.0), ("89.9", 0.0),  # 9.9% in, 10.1% out, both sides
    ("100", 1.0), ("-100", 0.0), ("", 0.0), ("no idea", 0.0),
])
def test_numeric_tolerance_edges(pred, score):
    assert ld.score_answer(_numeric("100"), pred) == score


@pytest.mark.parametrize("pred, score", [
    ("$1,577 million", 1.0),            # commas, $, scale word vs a bare gold
    ("1.58 billion", 1.0),              # the bare gold is in millions (as the question says)
    ("$1.577bn", 1.0),
    ("In FY2018 capex was 1,577.", 1.0),  # the year is not the answer
    ("$1,577 million in fiscal 2018", 1.0),
    ("1,800", 0.0),                     # 14% off
    ("(1,577)", 0.0),                   # accounting negative
    ("5,000 - 3,000 = 1,577", 1.0),     # the stated answer is the last number
    ("1,577 - 300 = 1,277", 0.0),
    ("1.5 million", 0.0),               # 1000x off: never a match, whatever the scale
    ("1,577 thousand", 0.0),
])
def test_numeric_financebench_style(pred, score):
    item = _numeric("$1577.00", question="What is the FY2018 capital expenditure amount (in USD millions)?")
    assert ld.score_answer(item, pred) == score


def test_numeric_bare_gold_without_a_stated_unit_matches_only_as_written():
    item = _numeric("$1577.00", question="What was the capital expenditure?")
    assert ld.score_answer(item, "$1,577 million") == 1.0  # the unit left out of the gold
    assert ld.score_answer(item, "1.58 billion") == 0.0  # no unit in the question to convert with
    assert ld.question_unit("Revenue in USD thousands?") == 1e3 and ld.question_unit("Revenue?") is None


def test_numeric_signs_percent_zero_and_custom_tolerance():
    assert ld.score_answer(_numeric("-12.3"), "It decreased by 12.3 million") == 1.0
    assert ld.score_answer(_numeric("-12.3"), "It increased by 12.3") == 0.0
    assert ld.score_answer(_numeric("-0.02"), "-0.021") == 1.0
    assert ld.score_answer(_numeric("1.9%"), "about 1.9 percent, up from 2021") == 1.0
    assert ld.score_answer(_numeric("1.9%"), "0.019") == 1.0
    # A percentage gold is compared with the prediction's percentages first, and the reverse.
    assert ld.score_answer(_numeric("1.9%"), "the margin was 1.9% on sales of 500") == 1.0
    assert ld.score_answer(_numeric("1577"), "1,577, up 15% on the prior year") == 1.0
    assert ld.score_answer(_numeric("0"), "0") == 1.0
    assert ld.score_answer(_numeric("0"), "0.1") == 0.0
    assert ld.score_answer(_numeric("100", tolerance=0.01), "101.5") == 0.0
    assert ld.score_answer(_numeric("100", tolerance=0.01), "100.5") == 1.0
    assert ld.score_answer(_numeric("100"), None) == 0.0


def test_choice_matches_letter_or_option_text():
    item = ld.load_longhealth(LH)[0]  # correct: B, "Omnipaque 240"
    for pred in ("B", "b", "(B)", "B) Omnipaque 240", "The correct answer is B: Omnipaque 240",
                 "Answer: B", "Omnipaque 240", "They used omnipaque 240 for the scan."):
        assert ld.score_answer(item, pred) == 1.0, pred
    for pred in ("A", "C: Imeron 350", "Gadovist", "Omnipaque 240 or Gadovist", "", "The answer is E"):
        assert ld.score_answer(item, pred) == 0.0, pred


def test_free_f1_hand_computed():
    item = DocQA(id="f", document="", question="?", answer="a vocabulary")
    # normalised: pred [seed, lexicon, vocabulary] vs gold [vocabulary]: P = 1/3, R = 1, F1 = 0.5.
    assert ld.score_answer(item, "The seed lexicon vocabulary.") == pytest.approx(0.5)
    assert ld.score_answer(item, "A vocabulary") == 1.0


# ---------------------------------------------------------------- synthetic reports


def _section_text(document: str, title: str) -> str:
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", document, re.M | re.S)
    assert m, title
    return m.group(1)


def test_synthetic_is_deterministic_and_prefix_stable():
    a = ld.synthetic_docqa(4, seed=7, doc_chars=6000)
    assert a == ld.synthetic_docqa(4, seed=7, doc_chars=6000)
    assert a[:2] == ld.synthetic_docqa(2, seed=7, doc_chars=6000)
    b = ld.synthetic_docqa(4, seed=8, doc_chars=6000)
    assert [x.document for x in a] != [x.document for x in b]
    assert len({x.id for x in a}) == 4


@pytest.mark.parametrize("hops", [1, 2, 3, 4, 5, 6])
def test_synthetic_answer_recomputes_from_verbatim_sentences(hops):
    for item in ld.synthetic_docqa(6, seed=hops, doc_chars=6000, hops=hops):
        facts = item.metadata["facts"]
        assert item.kind == "numeric" and len(facts) == hops
        assert len({f["section"] for f in facts}) == hops  # every hop in its own section
        values = []
        for f in facts:
            assert item.document.count(f["sentence"]) == 1
            assert item.document[f["start"]:f["start"] + len(f["sentence"])] == f["sentence"]
            assert f["sentence"] in _section_text(item.document, f["section"])
            parsed = ld.parse_fact_sentence(f["sentence"])
            assert parsed == {k: f[k] for k in ("division", "metric", "year", "value")}
            assert parsed["metric"] in item.question
            assert str(parsed["year"]) in item.question and parsed["division"] in item.question
            values.append(parsed["value"])
        assert ld.combine(item.metadata["operation"], values) == item.answer
        assert ld.score_answer(item, item.answer) == 1.0
        if hops == 1:
            assert item.metadata["operation"] == "value" and float(item.answer) == values[0]


def test_synthetic_operations_cover_two_hop_kinds_and_compute_right():
    ops = {i.metadata["operation"] for i in ld.synthetic_docqa(30, seed=0, doc_chars=2000, hops=2)}
    assert ops == {"difference", "change", "ratio", "sum_divisions"}
    assert ld.combine("difference", [412.3, 287.9]) == "124.4"
    assert ld.combine("change", [300.0, 287.5]) == "-12.5"
    assert ld.combine("ratio", [50.0, 400.0]) == "12.5"
    assert ld.combine("ratio", [1.0, 3.0]) == "33.3"
    assert ld.combine("sum_years", [0.1, 0.2]) == "0.3"  # exact decimal arithmetic
    assert ld.combine("net_of_costs", [100.0, 20.5, 30.0]) == "49.5"


def test_synthetic_distractors_look_alike_and_keys_are_unique():
    for item in ld.synthetic_docqa(5, seed=11, doc_chars=20000, hops=2):
        distractors = item.metadata["distractors"]
        assert len(distractors) >= 20
        sentences = [s.strip() for s in re.split(r"(?<=\.)\s+", item.document)]
        parsed = [p for p in map(ld.parse_fact_sentence, sentences) if p]
        keys = [(p["division"], p["metric"], p["year"]) for p in parsed]
        assert len(keys) == len(set(keys)) == len(distractors) + 2  # one figure per line item
        for f in item.metadata["facts"]:
            # The same line for the same division in another year, or another division in the same year.
            near = [d for d in distractors if d["metric"] == f["metric"]
                    and (d["division"] == f["division"]) != (d["year"] == f["year"])]
            assert near, f
            assert any(abs(d["value"] - f["value"]) <= 0.3 * f["value"] for d in near)


@pytest.mark.parametrize("doc_chars", [3000, 20000, 60000])
def test_synthetic_length_and_sections(doc_chars):
    for item in ld.synthetic_docqa(2, seed=1, doc_chars=doc_chars, hops=3):
        doc = item.document
        assert abs(len(doc) - doc_chars) <= 150
        titles = re.findall(r"^## (.+)$", doc, re.M)
        assert titles == item.metadata["sections"] and len(titles) >= 5
        assert max(len(_section_text(doc, t)) for t in titles) < 5000  # each fits one 5000-char chunk


def test_synthetic_bad_arguments():
    for kwargs in ({"hops": 0}, {"hops": 7}, {"doc_chars": 500}):
        with pytest.raises(UserError):
            ld.synthetic_docqa(1, **kwargs)
    assert ld.synthetic_docqa(0) == []
    with pytest.raises(UserError):
        ld.combine("median", [1.0])

