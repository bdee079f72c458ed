"""The scripted oracle supervisor (``oracle.py``) in all four protocols, with a scripted reader.

The local side is :func:`perfect_reader`: a correct reader that quotes the asked figure from the
text it is given and never computes. The remote side is :class:`OracleRemote`, which answers only
from its messages; every test runs the real protocols (:func:`run_protocol`, the sandbox included)
on :func:`synthetic_docqa` items and checks answers with :func:`score_answer`.
"""

from __future__ import annotations

import copy
import json
import re

import pytest

from lmforge.bench.minions import BenchSetup, run_bench
from lmforge.eval.longdoc import DocQA, combine, synthetic_docqa, score_answer
from lmforge.methods.minions import prompts
from lmforge.methods.minions.apply import PROTOCOLS, MinionsConfig, _direct_prompt, run_protocol
from lmforge.methods.minions.clients import ScriptedClient, count_tokens
from lmforge.methods.minions.jobs import Job, JobManifest, JobOutput, chunk_by_section
from lmforge.methods.minions.ledger import CostLedger
from lmforge.methods.minions.minion import NO_ANSWER
from lmforge.methods.minions.minions import fallback_aggregate
from lmforge.methods.minions.oracle import (
    ORACLE_NAME,
    PROMPT_MARKERS,
    Figure,
    OracleRemote,
    _advice_question,
    _direct_fields,
    _later_notes,
    _minion_reply,
    _minion_task,
    _synthesis_fields,
    oracle_client,
    parse_question,
    perfect_reader,
    prompt_kind,
    read_figure,
    read_reply,
    reader_client,
)

DOC_CHARS, CHUNK = 8000, 2000
ITEMS = synthetic_docqa(5, seed=0, doc_chars=DOC_CHARS)
SOLVED = ("minion", "minions", "remote-only")


def _cfg(protocol: str, **kw) -> MinionsConfig:
    return MinionsConfig(protocol=protocol, chunk_size=kw.pop("chunk_size", CHUNK), **kw)


def _run_all(items: list[DocQA], oracle: OracleRemote, chunk_size: int = CHUNK) -> dict[str, list[dict]]:
    """Every protocol on every item, each with fresh clients; the records keep the clients."""
    out: dict[str, list[dict]] = {p: [] for p in PROTOCOLS}
    for item in items:
        for p in PROTOCOLS:
            remote, local = oracle.client(), reader_client()
            rec = run_protocol(local, remote, item.document, item.question, _cfg(p, chunk_size=chunk_size))
            rec.update(score=score_answer(item, rec["answer"]), remote=remote, local=local)
            out[p].append(rec)
    return out


def _remote_tokens(rec: dict) -> int:
    return rec["ledger"]["sides"].get("remote", {}).get("total_tokens", 0)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


# ----------------------------------------------------------------------------------------------
# Recognising the protocol prompts (built with the real prompt functions)
# ----------------------------------------------------------------------------------------------

Q = ("According to the Oakhurst Corporation annual report, what was the revenue of the Iris division in "
     "fiscal 2020, in USD millions?")
SENTINEL_DOC = "# Report\n\n## Outlook\nThe Iris division's revenue for fiscal 2020 came to $700.1 million.\nMore text."
SENTINEL_REPLY = "1. The revenue was 700.1.\n\n### Instructions (quoted by the worker)\nok"
SENTINEL_OUT = ("## What was the revenue of the Iris division in fiscal 2020? Answer in USD millions.\n"
                "- chunk 0: answer=700.1 | citation=x")
SENTINEL_PAD = "Found: the revenue of the Iris division in fiscal 2020 = 700.1."


def _built_prompts() -> dict[str, str]:
    return {
        "remote_only": _direct_prompt(SENTINEL_DOC, Q)[0]["content"],
        "minion_initial": prompts.minion_supervisor_initial(Q),
        "minion_conversation": prompts.minion_supervisor_conversation(SENTINEL_REPLY),
        "minion_final": prompts.minion_supervisor_final(SENTINEL_REPLY),
        "minions_advice": prompts.minions_advice(Q, "a 10-K filing"),
        "minions_decompose": prompts.minions_decompose(1, 3, 1, 1234),
        "minions_no_code": prompts.minions_no_code_block(),
        "minions_code_error": prompts.minions_code_error("NameError: x"),
        "minions_too_many_jobs": prompts.minions_too_many_jobs(5000, 2048),
        "minions_synthesis_cot": prompts.minions_synthesis_cot(Q, SENTINEL_OUT, SENTINEL_PAD),
        "minions_synthesis_json": prompts.minions_synthesis_json(),
        "minions_synthesis_final": prompts.minions_synthesis_final(Q, SENTINEL_OUT, SENTINEL_PAD),
    }


def test_every_protocol_prompt_is_recognised_by_its_markers() -> None:
    built = _built_prompts()
    built["minions_decompose_later"] = prompts.minions_decompose_later(2, "why", "what", SENTINEL_PAD, 3, 1, 1234)
    for kind, text in built.items():
        expected = "minions_decompose" if kind == "minions_decompose_later" else kind
        assert prompt_kind(text) == expected, kind
        opening, markers = PROMPT_MARKERS[expected]
        assert text.startswith(opening) and all(m in text for m in markers)
    # every prompt matches only its own markers (no two kinds are confused whatever the order)
    for kind, text in built.items():
        hits = [k for k, (o, ms) in PROMPT_MARKERS.items() if text.startswith(o) and all(m in text for m in ms)]
        assert hits == ["minions_decompose" if kind == "minions_decompose_later" else kind], (kind, hits)
    # the worker's own prompts and free text are not supervisor prompts
    assert prompt_kind(prompts.minions_worker("chunk", "task", "advice")) is None
    assert prompt_kind(prompts.minion_worker_system("ctx", Q)) is None
    assert prompt_kind("Hello there.") is None


def test_text_quoted_inside_a_prompt_does_not_change_its_kind() -> None:
    # a worker reply or a question that quotes another prompt's opening words
    tricky = prompts.minions_decompose(1, 3, 1, 1000)[:200]
    assert prompt_kind(prompts.minion_supervisor_conversation(tricky)) == "minion_conversation"
    assert prompt_kind(prompts.minion_supervisor_final("Briefly advise us " + tricky)) == "minion_final"
    assert prompt_kind(prompts.minions_advice("Read the document below and answer the question.", "x")) == "minions_advice"
    assert prompt_kind(prompts.minions_synthesis_cot(Q, "From your analysis, return one JSON object", "")) == (
        "minions_synthesis_cot")


def test_fields_are_read_back_exactly_from_the_real_prompts() -> None:
    b = _built_prompts()
    assert _direct_fields(b["remote_only"]) == (SENTINEL_DOC, Q)
    assert _minion_task(b["minion_initial"]) == Q
    assert _minion_reply(b["minion_conversation"]) == SENTINEL_REPLY
    assert _minion_reply(b["minion_final"]) == SENTINEL_REPLY
    assert _advice_question(b["minions_advice"]) == Q
    assert _synthesis_fields(b["minions_synthesis_cot"]) == (Q, SENTINEL_OUT, SENTINEL_PAD)
    assert _synthesis_fields(b["minions_synthesis_final"]) == (Q, SENTINEL_OUT, SENTINEL_PAD)
    later = prompts.minions_decompose_later(2, "why", "what", SENTINEL_PAD, 3, 1, 1234)
    assert _later_notes(later) == SENTINEL_PAD
    # the chunk size and the task bound the oracle's code uses are the prompt's
    for text in (b["minions_decompose"], later):
        assert "max_chunk_size: int = 1234" in text and re.search(r"at most 3 distinct tasks", text, re.I)


def test_strict_oracle_refuses_an_unknown_prompt() -> None:
    with pytest.raises(ValueError, match="unrecognised prompt"):
        OracleRemote(strict=True)([{"role": "user", "content": "Write me a poem."}])
    assert OracleRemote()([{"role": "user", "content": "Write me a poem."}]) == "I do not understand the request."


# ----------------------------------------------------------------------------------------------
# Reading the question and the worker's replies
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("hops", [1, 2, 3, 4])
def test_parse_question_reads_every_synthetic_form(hops: int) -> None:
    items = synthetic_docqa(40, seed=hops, doc_chars=2000, hops=hops)
    ops = set()
    for item in items:
        plan = parse_question(item.question)
        assert plan is not None, item.question
        # checked against the generator's record (which the oracle itself never sees)
        facts = item.metadata["facts"]
        assert plan.operation == item.metadata["operation"]
        assert [f.key for f in plan.figures] == [(f["division"], f["metric"], f["year"]) for f in facts]
        assert combine(plan.operation, [f["value"] for f in facts]) == item.answer
        ops.add(plan.operation)
    assert len(ops) >= (1 if hops == 1 else 2)
    assert parse_question("What is the capital of France?") is None


def test_read_reply_is_lenient_but_attributes_figures() -> None:
    rev = Figure("revenue", "Iris", 2020)
    capex = Figure("capital expenditure", "Iris", 2020)
    old = Figure("revenue", "Iris", 2019)
    assert read_figure("The revenue of the Iris division in fiscal 2020 was $1,047.3 million.", rev) == 1047.3
    assert read_figure("1047.3", rev) == 1047.3
    assert read_figure("Revenue (FY2020): $1.0473 billion", rev) == pytest.approx(1047.3)
    # the number after the line item, not a later comparison
    assert read_figure("In 2020 revenue was $1,047.3 million, up from $990.0 million in 2019.", rev) == 1047.3
    assert read_figure("I could not find it; the report covers fiscal 2020.", rev) is None
    # several figures in one reply: by line item, by numbered list, within one sentence by clause
    two = [rev, capex]
    assert read_reply("Capital expenditure: 66.6 million.\nRevenue: 1,047.3 million.", two) == {rev: 1047.3, capex: 66.6}
    assert read_reply("1. 1047.3\n2. 66.6", two) == {rev: 1047.3, capex: 66.6}
    assert read_reply("Revenue was 1047.3 and capital expenditure was 66.6.", two) == {rev: 1047.3, capex: 66.6}
    # figures told apart by year only
    years = [old, rev]
    assert read_reply("Revenue was $990.0 million in fiscal 2019 and $1,047.3 million in fiscal 2020.", years) == {
        old: 990.0, rev: 1047.3}
    # only what is there
    assert read_reply("Revenue: 1047.3. I did not find the capital expenditure.", two) == {rev: 1047.3}


def _final_synthesis(oracle: OracleRemote, outputs: str) -> dict:
    question = ("According to the Oakhurst Corporation annual report, what was the Iris division's revenue "
                "minus its operating costs in fiscal 2020, in USD millions?")
    messages = [{"role": "user", "content": prompts.minions_advice(question, "x")},
                {"role": "assistant", "content": "advice"},
                {"role": "user", "content": prompts.minions_synthesis_final(question, outputs, "No previous progress.")}]
    return json.loads(oracle(messages))


def test_synthesis_lets_citations_decide_and_reads_the_fallback_aggregation() -> None:
    oracle = OracleRemote(strict=True)
    rev, cost = "What was the revenue of the Iris division in fiscal 2020? Answer in USD millions.", \
        "What was the operating costs of the Iris division in fiscal 2020? Answer in USD millions."
    outputs = "\n".join([
        f"## {rev}",
        "- chunk 0: answer=990.0 | citation=In fiscal 2019, the Iris division reported revenue of $990.0 million.",
        "- chunk 1: answer=990.0 | citation=In fiscal 2019, the Iris division reported revenue of $990.0 million.",
        "- chunk 2: answer=$1,047.3 million | citation=For fiscal 2020, the Iris division recorded revenue of $1,047.3 million.",
        f"## {cost}",
        "- chunk 3: answer=The costs were 600.2 | citation=",
    ])
    obj = _final_synthesis(oracle, outputs)
    assert obj["decision"] == "provide_final_answer" and obj["answer"] == "447.1"  # 1047.3 - 600.2
    # the distractors (another year's figure) alone are not taken for the asked figure
    only_wrong = outputs.split("\n- chunk 2")[0] + f"\n## {cost}\n- chunk 3: answer=600.2 | citation="
    obj = _final_synthesis(oracle, only_wrong)
    assert obj["answer"] is None and "revenue of the Iris division in fiscal 2020" in obj["feedback"]

    # the protocol's fallback aggregation (when transform_outputs fails) shows raw JSON replies
    def job(chunk_id: int, task_id: int, task: str, answer: str | None, citation: str | None) -> Job:
        sample = json.dumps({"explanation": "e", "citation": citation, "answer": answer})
        return Job(JobManifest(chunk="c", task=task, chunk_id=chunk_id, task_id=task_id, job_id=chunk_id),
                   JobOutput("e", citation, answer), sample)

    text = fallback_aggregate([job(0, 0, rev, None, None), job(1, 0, rev, "1047.3", "revenue of $1,047.3 million"),
                               job(0, 1, cost, "600.2 million", None)])
    obj = _final_synthesis(oracle, text)
    assert obj["answer"] == "447.1"


def test_questions_it_cannot_parse_get_an_honest_no_answer() -> None:
    question, doc = "Who chairs the board?", "# Report\n\nThe board is chaired by Ann Lee. " * 40
    for p in SOLVED:
        rec = run_protocol(reader_client(), oracle_client(strict=True), doc, question, _cfg(p, max_rounds=2))
        assert rec["answer"] in (NO_ANSWER, "I cannot answer this question: it is not one of the report "
                                 "questions I can work out."), (p, rec["answer"])


# ----------------------------------------------------------------------------------------------
# All four protocols with a correct reader
# ----------------------------------------------------------------------------------------------


def test_all_protocols_answer_with_a_perfect_reader_and_honest_tokens() -> None:
    oracle = OracleRemote(strict=True)
    runs = _run_all(ITEMS, oracle)
    for p in SOLVED:
        assert [r["score"] for r in runs[p]] == [1.0] * len(ITEMS), (p, [r["answer"] for r in runs[p]])
    # local-only: the reader quotes the figures but does no arithmetic; it is right only where the
    # 10% tolerance happens to take a quoted figure for the result
    local_only = _mean([r["score"] for r in runs["local-only"]])
    assert local_only < 1.0
    assert all(r["answer"].startswith("The report says:") for r in runs["local-only"])

    for p in SOLVED:
        for rec in runs[p]:
            remote: ScriptedClient = rec["remote"]
            side = rec["ledger"]["sides"]["remote"]
            # honest accounting: prompt = every message sent, completion = every reply written
            # (the oracle is a pure function of its messages, so its replies are recomputed)
            assert side["prompt_tokens"] == sum(count_tokens(m["content"]) for c in remote.calls for m in c)
            assert side["completion_tokens"] == sum(count_tokens(oracle(c)) for c in remote.calls)
            assert side["calls"] == len(remote.calls)
            # priced as GPT-4o ($2.50 / $10.00 per million tokens)
            assert side["dollars"] == pytest.approx((side["prompt_tokens"] * 2.5 + side["completion_tokens"] * 10) / 1e6)
    # MINION and MINIONS never show the document to the oracle: no filler sentence reaches it
    for p in ("minion", "minions"):
        for item, rec in zip(ITEMS, runs[p]):
            fillers = [s for s in re.split(r"(?<=\.)\s+", item.document) if "$" not in s and len(s) > 60]
            sent = "\n".join(m["content"] for c in rec["remote"].calls for m in c)
            assert fillers and not any(s in sent for s in fillers)
    # MINIONS: one local job per (needed figure x chunk), on overlapping chunks
    for item, rec in zip(ITEMS, runs["minions"]):
        n_figs = len(parse_question(item.question).figures)
        n_chunks = len(chunk_by_section(item.document, CHUNK, 200))
        assert rec["details"]["jobs_per_round"] == [n_figs * n_chunks]
        assert rec["details"]["round_logs"][0]["aggregation"] == "transform_outputs"

    tokens = {p: _mean([_remote_tokens(r) for r in runs[p]]) for p in SOLVED}
    ratio = {p: tokens["remote-only"] / tokens[p] for p in ("minion", "minions")}
    print(f"\n{DOC_CHARS}-char documents, chunks of {CHUNK}: remote tokens/question {tokens}; "
          f"remote-only / minion = {ratio['minion']:.2f}x, remote-only / minions = {ratio['minions']:.2f}x; "
          f"local-only accuracy {local_only:.2f}")
    # On documents this short MINIONS' fixed prompts (the decomposition prompt alone is ~1,000
    # tokens, read again by both synthesis calls) cost more than reading the ~1,400-token
    # document: the paper's ordering needs long documents (next test).
    assert tokens["minion"] < tokens["remote-only"] < tokens["minions"]


def test_remote_tokens_minion_below_minions_below_remote_only_on_long_documents() -> None:
    items = synthetic_docqa(5, seed=0, doc_chars=60000)
    runs = _run_all(items, OracleRemote(strict=True), chunk_size=5000)
    for p in SOLVED:
        assert [r["score"] for r in runs[p]] == [1.0] * len(items), p
    tokens = {p: _mean([_remote_tokens(r) for r in runs[p]]) for p in SOLVED}
    dollars = {p: _mean([r["ledger"]["sides"]["remote"]["dollars"] for r in runs[p]]) for p in SOLVED}
    print(f"\n60000-char documents, chunks of 5000: remote tokens/question {tokens}; remote-only / minion = "
          f"{tokens['remote-only'] / tokens['minion']:.1f}x, remote-only / minions = "
          f"{tokens['remote-only'] / tokens['minions']:.2f}x (dollars: "
          f"{dollars['remote-only'] / dollars['minion']:.1f}x, {dollars['remote-only'] / dollars['minions']:.2f}x)")
    # the paper's ordering of remote cost: MINION < MINIONS < remote-only
    assert tokens["minion"] < tokens["minions"] < tokens["remote-only"]
    assert dollars["minion"] < dollars["minions"] < dollars["remote-only"]


# ----------------------------------------------------------------------------------------------
# Only what it is shown
# ----------------------------------------------------------------------------------------------


def _useless(messages: list[dict[str, str]]) -> str:
    if messages[-1]["content"].startswith("Here is an excerpt from a document:"):
        return json.dumps({"explanation": "Nothing here.", "citation": None, "answer": None})
    return "I am not sure; the report is long and I could not find that."


def test_with_a_useless_worker_only_remote_only_finds_the_answer() -> None:
    oracle = OracleRemote(strict=True)
    for item in ITEMS[:3]:
        remote = oracle.client()
        local = ScriptedClient(_useless, name="useless")
        ans = {p: run_protocol(local, remote, item.document, item.question, _cfg(p, max_rounds=2))["answer"]
               for p in SOLVED}
        assert ans["minion"] == NO_ANSWER and ans["minions"] == NO_ANSWER
        assert score_answer(item, ans["remote-only"]) == 1.0
        # it kept asking: MINION asked again, MINIONS ran a second round of jobs
        minion_asks = [m for c in local.calls if c[0]["role"] == "system" for m in c if m["role"] == "user"]
        assert any(m["content"].startswith("I still need") for m in minion_asks)


def test_answers_do_not_depend_on_item_metadata(tmp_path) -> None:
    items = ITEMS[:3]
    corrupt = copy.deepcopy(items)
    for item in corrupt:
        for fact in item.metadata["facts"] + item.metadata["distractors"]:
            fact["value"], fact["sentence"], fact["division"] = 1.0, "Revenue was $1.0 million.", "Nowhere"
        item.metadata["operation"], item.metadata["formula"] = "value", "1.0 = 1.0"
    answers = []
    for batch, out in ((items, tmp_path / "a"), (corrupt, tmp_path / "b")):
        oracle = OracleRemote(strict=True)
        data = run_bench(batch, reader_client(), oracle.client(), out,
                         BenchSetup(local="scripted-reader", remote=ORACLE_NAME, data="synthetic"),
                         cfg=MinionsConfig(chunk_size=CHUNK), progress=False)
        answers.append({k: c["answer"] for k, c in data["cells"].items()})
    assert answers[0] == answers[1]
    assert all(answers[0][f"{p}|{it.id}"] == it.answer for p in SOLVED for it in items)


# ----------------------------------------------------------------------------------------------
# Later rounds: it asks again for what is missing, and only for that
# ----------------------------------------------------------------------------------------------


def test_minion_asks_again_for_the_missing_figure() -> None:
    item = ITEMS[0]

    def first_line_only(messages: list[dict[str, str]]) -> str:
        return perfect_reader(messages).splitlines()[0]  # answers only the first asked figure

    local = ScriptedClient(first_line_only, name="forgetful")
    rec = run_protocol(local, oracle_client(strict=True), item.document, item.question, _cfg("minion"))
    assert score_answer(item, rec["answer"]) == 1.0 and rec["details"]["rounds"] == 2
    first, second = [m["content"] for m in rec["details"]["worker_messages"] if m["role"] == "user"]
    figs = parse_question(item.question).figures
    assert all(f.describe() in first for f in figs)
    assert second.startswith("I still need") and figs[1].describe() in second and figs[0].describe() not in second

    # one figure per message when asked to
    local = reader_client()
    rec = run_protocol(local, oracle_client(minion_ask="one", strict=True), item.document, item.question, _cfg("minion"))
    assert score_answer(item, rec["answer"]) == 1.0 and rec["details"]["rounds"] == 2


def test_minions_second_round_asks_only_for_the_missing_figure() -> None:
    item = ITEMS[0]
    second_task = f"What was {parse_question(item.question).figures[1].describe()}?"
    seen: set[str] = set()

    def late_reader(messages: list[dict[str, str]]) -> str:
        prompt = messages[-1]["content"]
        if second_task in prompt and prompt not in seen:  # misses it the first time it reads a chunk
            seen.add(prompt)
            return json.dumps({"explanation": "not here", "citation": None, "answer": None})
        return perfect_reader(messages)

    remote = oracle_client(strict=True)
    rec = run_protocol(ScriptedClient(late_reader, name="late"), remote, item.document, item.question, _cfg("minions"))
    d = rec["details"]
    assert score_answer(item, rec["answer"]) == 1.0 and d["rounds"] == 2
    assert d["round_logs"][0]["synthesis"]["decision"] == "request_additional_info"
    # round 2's code has one task, the missing figure, over the same chunks
    assert second_task in d["code"][1] and "TASKS = [\n" in d["code"][1]
    assert d["code"][1].count("Answer in USD millions") == 1
    assert d["jobs_per_round"][1] * 2 == d["jobs_per_round"][0]
    # the figure found in round 1 reached round 2 only through the oracle's own scratchpad
    later = [c[-1]["content"] for c in remote.calls if c[-1]["content"].startswith("# Decomposition round 2")]
    assert len(later) == 1 and "Notes so far: Found: the revenue" in later[0]


def test_minions_too_many_jobs_makes_the_oracle_use_bigger_chunks() -> None:
    item = ITEMS[0]
    rec = run_protocol(reader_client(), oracle_client(strict=True), item.document, item.question,
                       _cfg("minions", max_jobs=4))
    d = rec["details"]
    assert score_answer(item, rec["answer"]) == 1.0
    assert len(d["round_logs"][0]["code_errors"]) == 2 and all("jobs >" in e for e in d["round_logs"][0]["code_errors"])
    assert d["jobs_per_round"] == [4] and "chunk_by_section(doc, 8000, 200)" in d["code"][0]


# ----------------------------------------------------------------------------------------------
# The bench on these items
# ----------------------------------------------------------------------------------------------


def test_bench_summary_ratios_match_the_cells(tmp_path) -> None:
    data = run_bench(ITEMS, reader_client(), oracle_client(strict=True), tmp_path,
                     BenchSetup(local="scripted-reader", remote=ORACLE_NAME, data="synthetic"),
                     cfg=MinionsConfig(chunk_size=CHUNK), ledger_factory=CostLedger, progress=False)
    cells, summary = data["cells"], data["summary"]
    assert len(cells) == len(ITEMS) * len(PROTOCOLS)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["summary"] == summary

    def mean(p: str, f) -> float:
        return _mean([f(c) for c in cells.values() if c["protocol"] == p])

    acc = {p: mean(p, lambda c: c["score"]) for p in PROTOCOLS}
    dollars = {p: mean(p, lambda c: c["ledger"]["sides"].get("remote", {}).get("dollars", 0.0)) for p in PROTOCOLS}
    assert acc["minion"] == acc["minions"] == acc["remote-only"] == 1.0 and acc["local-only"] < 1.0
    assert dollars["local-only"] == 0.0
    for p in ("minion", "minions", "local-only"):
        row = summary[p]
        assert row["accuracy"] == pytest.approx(acc[p])
        assert row["remote_dollars"] == pytest.approx(dollars[p])
        assert row["quality_recovered"] == pytest.approx(acc[p] / acc["remote-only"])
        if p == "local-only":
            assert row["cost_reduction"] is None  # no remote cost at all
        else:
            assert row["cost_measure"] == "dollars"
            assert row["cost_reduction"] == pytest.approx(dollars["remote-only"] / dollars[p])
    assert summary["remote-only"]["cost_reduction"] is None
    print(f"\nbench, {DOC_CHARS}-char documents: cost reduction minion {summary['minion']['cost_reduction']:.2f}x, "
          f"minions {summary['minions']['cost_reduction']:.2f}x; quality kept {summary['minion']['quality_recovered']:.0%}, "
          f"{summary['minions']['quality_recovered']:.0%}")
