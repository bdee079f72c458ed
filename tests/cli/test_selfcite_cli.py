"""``lmforge align selfcite-bon`` / ``selfcite-simpo`` and ``lmforge bench citations``: outputs that
agree with the library, resume, and bad inputs as one line with exit 2 and nothing written."""

from __future__ import annotations

import json

import pytest

from tests.cli.helpers import call, one_error_line

DOC = ("The harbour was quiet that morning. The Velmora Glass Archive was founded in 1874 by Ilse Marren. "
       "Gulls circled over the old pier. Today the archive keeps 3,210 glass plates in its east wing. "
       "Nobody could say why the bell rang twice.")
RESP = ("<statement>The archive was founded in 1874 by Ilse Marren.<cite>[0-0]</cite></statement>"
        "<statement>It keeps 3,210 glass plates.<cite>[2-2]</cite></statement>")
MODEL = "zoo:agent-small"
FAST = ["--n", "3", "--no-chat", "--max-response-tokens", "8"]


def _docs(path, n=3, broken=False):
    rows = [{"idx": f"d{i}", "context": DOC, "query": "What about the archive?", "prediction": RESP} for i in range(n)]
    if broken:
        rows[1]["prediction"] = "<statement>The archive was founded in 1874.<cite>[1-1]</statement> tail"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def test_bon_writes_reranked_responses_and_resumes(tmp_path, monkeypatch, capsys):
    data = tmp_path / "docs.jsonl"
    _docs(data, broken=True)
    full = tmp_path / "full"
    code, out, err = call(monkeypatch, capsys, "align", "selfcite-bon", "-m", MODEL, "--data", str(data),
                          "--out", str(full), *FAST, "--json")
    assert code == 0, err
    summary = json.loads(out)
    rows = [json.loads(x) for x in (full / "bon.jsonl").read_text().splitlines()]
    assert [r["idx"] for r in rows] == ["d0", "d1", "d2"] and summary["documents"] == 3
    assert summary["malformed"] >= 1  # the unclosed <cite> of d1 is counted, not fatal
    for r in rows:
        for b in r["branches"]:
            if b["chosen"] is not None:  # the argmax of the recorded rewards
                assert b["chosen"] == max(b["candidates"], key=lambda c: b["candidates"][c]["reward"])
    assert not (full / "bon.partial.jsonl").exists()

    # an interrupted run: the partial file holds the first document; the rerun finishes the rest and
    # gives what the uninterrupted run gave
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    # ... and a second line cut by the interruption (redone, never followed by appended rows)
    (resumed / "bon.partial.jsonl").write_text(json.dumps(rows[0]) + "\n" + json.dumps(rows[1])[:40])
    code, out, err = call(monkeypatch, capsys, "align", "selfcite-bon", "-m", MODEL, "--data", str(data),
                          "--out", str(resumed), *FAST)
    assert code == 0, err
    again = [json.loads(x) for x in (resumed / "bon.jsonl").read_text().splitlines()]
    assert again == rows

    # a finished output is not replaced without --overwrite
    before = (full / "bon.jsonl").read_text()
    code, _, err = call(monkeypatch, capsys, "align", "selfcite-bon", "-m", MODEL, "--data", str(data),
                        "--out", str(full), *FAST)
    assert code == 2 and "--overwrite" in one_error_line(err)
    assert (full / "bon.jsonl").read_text() == before


@pytest.mark.parametrize(("rows", "extra", "message"), [
    (None, ["--n", "0"], "N must be >= 1"),
    ([{"context": "", "query": "q"}], [], "non-empty string 'context'"),
    ([{"context": DOC, "query": "q", "prediction": 3}], [], "'prediction' must be a string"),
    ([{"idx": 1, "context": DOC, "query": "q"}, {"idx": 1, "context": DOC, "query": "q"}], [], "appears twice"),
])
def test_bon_bad_inputs(tmp_path, monkeypatch, capsys, rows, extra, message):
    data = tmp_path / "docs.jsonl"
    if rows is None:
        _docs(data)
    else:
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    code, _, err = call(monkeypatch, capsys, "align", "selfcite-bon", "-m", MODEL, "--data", str(data),
                        "--out", str(out), "--no-chat", *extra)
    assert code == 2 and message in one_error_line(err)
    assert not out.exists()


def test_simpo_balances_the_pairs_and_saves_an_adapter(tmp_path, monkeypatch, capsys):
    from lmforge.methods.selfcite.balance import coverage, parse_statement
    import re

    chosen = ("<statement>The archive was founded in 1874 by Ilse Marren.<cite>[1-1][3-3]</cite></statement>"
              "<statement>It keeps 3,210 glass plates.<cite>[3-3]</cite></statement>")
    pairs = tmp_path / "pairs.jsonl"
    long_doc = DOC + "".join(f" Filler sentence number {w} was here." for w in
                                                              ("one", "two", "three", "four", "five", "six", "seven",
                                                               "eight", "nine"))
    pairs.write_text(json.dumps({"context": long_doc, "query": "What about the archive?", "chosen": chosen,
                                 "rejected": RESP}) + "\n"
                     + json.dumps({"context": DOC, "query": "q", "chosen": RESP, "rejected": RESP}) + "\n")
    out = tmp_path / "simpo"
    code, stdout, err = call(monkeypatch, capsys, "align", "selfcite-simpo", "-m", MODEL, "--pairs", str(pairs),
                             "--out", str(out), "--max-steps", "2", "--lr", "1e-3", "--json")
    assert code == 0, err
    summary = json.loads(stdout)
    assert summary["pairs"] == 1 and summary["data"]["identical (skipped)"] == 1 and summary["steps"] == 2
    assert summary["data"]["ran out of placements (partly balanced)"] == 0
    (row,) = [json.loads(x) for x in (out / "pairs.jsonl").read_text().splitlines()]
    for rej, cho in zip(re.findall(r"<statement>(.*?)</statement>", row["rejected"]),
                        re.findall(r"<statement>(.*?)</statement>", row["chosen"])):
        (_, rs), (_, cs) = parse_statement(rej), parse_statement(cho)
        assert len(rs) >= len(cs) and coverage(rs) == coverage(cs)  # balanced: as many cited sentences
    assert (out / "adapter_config.json").exists() and (out / "selfcite_simpo.json").exists()
    assert "<C1>" in row["prompt"] and "[Document Start]" in row["prompt"]


def test_simpo_without_usable_pairs_writes_nothing(tmp_path, monkeypatch, capsys):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"context": DOC, "query": "q", "chosen": RESP, "rejected": RESP}) + "\n")
    out = tmp_path / "simpo"
    code, _, err = call(monkeypatch, capsys, "align", "selfcite-simpo", "-m", MODEL, "--pairs", str(pairs),
                        "--out", str(out))
    assert code == 2 and "no usable pair" in one_error_line(err)
    assert not out.exists()


def _gold(path, support=(1, 3)):
    path.write_text(json.dumps({"idx": "d0", "context": DOC, "statements": [
        {"statement": "The archive was founded in 1874 by Ilse Marren.", "support": [support[0]]},
        {"statement": "It keeps 3,210 glass plates.", "support": [support[1]]}]}) + "\n")


def test_bench_citations_scores_by_hand(tmp_path, monkeypatch, capsys):
    pred = tmp_path / "pred.jsonl"
    # statement 1 cites [0-1]: fully supported, one citation, relevant; statement 2 cites [2-2]: not
    # supported, irrelevant -> recall (1 + 0)/2, precision 1/2, F1 0.5
    pred.write_text(json.dumps({"idx": "d0", "context": DOC, "prediction":
                                "<statement>The archive was founded in 1874 by Ilse Marren.<cite>[0-1]</cite></statement>"
                                "<statement>It keeps 3,210 glass plates.<cite>[2-2]</cite></statement>"}) + "\n")
    gold = tmp_path / "gold.jsonl"
    _gold(gold)
    code, out, err = call(monkeypatch, capsys, "bench", "citations", "--pred", str(pred), "--gold", str(gold), "--json")
    assert code == 0, err
    s = json.loads(out)
    assert s["recall"] == pytest.approx(0.5) and s["precision"] == pytest.approx(0.5) and s["f1"] == pytest.approx(0.5)


def test_bench_citations_gold_outside_the_document(tmp_path, monkeypatch, capsys):
    pred = tmp_path / "pred.jsonl"
    pred.write_text(json.dumps({"idx": "d0", "context": DOC, "prediction": RESP}) + "\n")
    gold = tmp_path / "gold.jsonl"
    _gold(gold, support=(1, 9))
    code, _, err = call(monkeypatch, capsys, "bench", "citations", "--pred", str(pred), "--gold", str(gold))
    assert code == 2 and "outside the document" in one_error_line(err)
