"""LongCite/SelfCite format: sentence chunks, prompt, citation parsing, against hand-worked examples and
independent re-derivations."""

from __future__ import annotations

import random
import re

import pytest

from lmforge.methods.selfcite.format import (
    PROMPT_TEMPLATE,
    Citation,
    Sentence,
    build_prompt,
    cited_sentences,
    fill_prompt,
    get_citations,
    parse_spans,
    postprocess,
    prompt_for,
    render_statement,
    split_sentences,
    statement_spans,
    tag_context,
)


def _doc(n: int) -> list[Sentence]:
    """n sentences "S{i}. " laid end to end."""
    text = "".join(f"S{i}. " for i in range(n))
    sents = split_sentences(text)
    assert len(sents) == n
    return sents


# ------------------------------------------------------------------------------------------ splitting


def test_split_sentences_hand_worked_english():
    text = "Alpha beta. Gamma delta!  Next one?\nLast words here"
    got = [(s.index, s.content, s.start, s.end) for s in split_sentences(text)]
    # content runs to the next sentence's start, so it carries the following whitespace.
    assert got == [(0, "Alpha beta. ", 0, 12), (1, "Gamma delta!  ", 12, 26), (2, "Next one?\n", 26, 36),
                   (3, "Last words here", 36, 51)]


def test_split_sentences_cjk_punctuation_stays_with_the_preceding_piece():
    got = [(s.content, s.start, s.end) for s in split_sentences("第一句。第二句！第三句")]
    assert got == [("第一句。", 0, 4), ("第二句！", 4, 8), ("第三句", 8, 11)]
    # Leading whitespace is outside sentence 0; ；and 。 cut inside one Punkt sentence.
    got = [(s.content, s.start) for s in split_sentences("  Lead space. Then 中文；好。 End")]
    assert got == [("Lead space. ", 2), ("Then 中文；", 14), ("好。 ", 22), ("End", 25)]


def test_single_piece_falls_back_to_blank_lines_only_when_single():
    got = [(s.content, s.start) for s in split_sentences("no punctuation here\n\nsecond para")]
    assert got == [("no punctuation here\n\n", 0), ("second para", 21)]
    # Two Punkt pieces: the blank line inside the first one is not a cut.
    got = [s.content for s in split_sentences("First part\n\nstill first. Second.")]
    assert got == ["First part\n\nstill first. ", "Second."]
    assert [s.content for s in split_sentences("Just one sentence.")] == ["Just one sentence."]
    assert split_sentences("") == [] and split_sentences("  \n\n ") == []


def test_split_sentences_chunks_tile_the_text():
    rng = random.Random(0)
    words = ["Hello", "world.", "Mr.", "Smith", "是", "。", "！", "？", "；", "\n\n", "\n", "end?", "3.5", "(a)."]
    for _ in range(200):
        text = " ".join(rng.choice(words) for _ in range(rng.randint(1, 30)))
        sents = split_sentences(text)
        if not sents:
            assert not text.strip()
            continue
        assert "".join(s.content for s in sents) == text[sents[0].start:]
        assert not text[:sents[0].start].strip()
        for i, s in enumerate(sents):
            assert s.index == i and s.content == text[s.start:s.end] and s.content.strip()
            assert not s.content[0].isspace()
            if i + 1 < len(sents):
                assert s.end == sents[i + 1].start


# ----------------------------------------------------------------------------------------- prompt


def test_prompt_template_and_build_prompt():
    sents = split_sentences("One fact. Two facts.")
    prompt = build_prompt(sents, "What?")
    assert prompt.startswith("Please answer the user's question based on the following document. When a "
                             "sentence S in your response uses information from some chunks in the document "
                             "(i.e., <C{s1}>-<C_{e1}>, <C{s2}>-<C{e2}>, ...), please append")
    assert prompt.endswith("\n\n[Document Start]\n<C0>One fact. <C1>Two facts.\n[Document End]\n\nWhat?")
    assert "format \"<statement>{S}<cite>[{s1}-{e1}][{s2}-{e2}]...</cite></statement>\". You must answer" in prompt
    # The template's literal braces survive; only the two slots are filled.
    assert prompt == PROMPT_TEMPLATE.replace("{context}", "<C0>One fact. <C1>Two facts.").replace("{question}", "What?")
    assert prompt_for("One fact. Two facts.", "What?") == (prompt, sents)


def test_fill_prompt_does_not_reinterpret_braces_in_its_values():
    p = fill_prompt("ctx {question} {S}", "q {context}")
    assert "[Document Start]\nctx {question} {S}\n[Document End]\n\nq {context}" in p


def test_tag_context_keep_and_drop_keep_original_indices():
    sents = _doc(4)
    assert tag_context(sents) == "<C0>S0. <C1>S1. <C2>S2. <C3>S3. "
    assert tag_context(sents, drop={1, 3}) == "<C0>S0. <C2>S2. "
    assert tag_context(sents, keep={3, 1}) == "<C1>S1. <C3>S3. "
    assert tag_context(sents, keep=set()) == ""
    assert build_prompt(sents, "q", keep=[2]).endswith("[Document Start]\n<C2>S2. \n[Document End]\n\nq")
    with pytest.raises(ValueError):
        tag_context(sents, keep={1}, drop={2})


# ------------------------------------------------------------------------------------------ helpers


def test_span_helpers():
    assert parse_spans("x[1-2] [10-3][a-b][4-4]") == [(1, 2), (10, 3), (4, 4)]
    assert cited_sentences([(1, 3), (2, 2), (7, 6), (9, 9)]) == {1, 2, 3, 9}
    assert render_statement("Fact.", [(0, 1), (4, 4)]) == "<statement>Fact.<cite>[0-1][4-4]</cite></statement>"
    assert render_statement("Fact.", []) == "<statement>Fact.<cite></cite></statement>"
    answer = ("pre <statement>A<cite>[1-2]</cite> b<cite>[5-5][3-1]</cite></statement> mid "
              "<statement>C</statement><statement>D<cite>[12-30]")
    assert statement_spans(answer) == [("A b", [(1, 2), (5, 5), (3, 1)]), ("C", [])]


# ------------------------------------------------------------------------------------ get_citations


def test_get_citations_hand_worked():
    sents = _doc(5)
    text, cits, out = get_citations("Fact here.<cite>[0-1][2-2][4-9][7-8][3-1]</cite>", sents)
    assert text == "Fact here."
    # [0-1]+[2-2] adjacent -> [0-2]; [4-9] clamped to [4-4] (3 is not 2+1: no merge); [7-8] starts past
    # the document (skipped, counted); [3-1] inverted (skipped).
    assert cits == [Citation(0, 2, 0, 12, "S0. S1. S2. "), Citation(4, 4, 16, 20, "S4. ")]
    assert out == 1


def test_get_citations_overlap_not_merged_and_at_most_three():
    sents = _doc(10)
    _, cits, _ = get_citations("x<cite>[0-2][1-3]</cite>", sents)
    assert [(c.start, c.end) for c in cits] == [(0, 2), (1, 3)]
    text, cits, _ = get_citations("a<cite>[0-0][2-2]</cite> b <cite>[4-4][6-6]</cite>.", sents)
    assert text == "a b ." and [(c.start, c.end) for c in cits] == [(0, 0), (2, 2), (4, 4)]
    # Adjacency merges across cite blocks, before the limit of 3 applies.
    _, cits, _ = get_citations("a<cite>[0-0][1-1]</cite><cite>[2-2][5-5][7-7][9-9]</cite>", sents)
    assert [(c.start, c.end) for c in cits] == [(0, 2), (5, 5), (7, 7)]


def test_get_citations_unknown_document():
    text, cits, out = get_citations("a<cite>[40-41][42-42][1-0]</cite>", None)
    assert text == "a" and out == 0
    assert cits == [Citation(40, 42, -1, -1, "")]


# ------------------------------------------------------------------------------------- postprocess


def test_postprocess_hand_worked():
    sents = _doc(5)
    answer = ("Intro text here. <statement>A fact.<cite>[0-0][1-1]</cite></statement>ok"
              "<statement>B<cite>[9-9]</cite></statement> <statement> </statement>Trailing words!")
    res = postprocess(answer, sents)
    got = [(s.text, None if s.citations is None else [(c.start, c.end) for c in s.citations])
           for s in res.all_statements]
    assert got == [("Intro text here. ", []), ("A fact.", [(0, 1)]), ("ok", None), ("B", []), (" ", None),
                   (" ", None), ("Trailing words!", [])]
    assert [s.text for s in res.statements] == ["Intro text here. ", "A fact.", "B", "Trailing words!"]
    assert res.answer == ("<statement>Intro text here. <cite></cite></statement><statement>A fact.<cite>[0-1]"
                          "</cite></statement>ok<statement>B<cite></cite></statement>  "
                          "<statement>Trailing words!<cite></cite></statement>")
    assert (res.malformed, res.out_of_document, res.over_limit) == (0, 1, 0)
    # Filler: more than 5 non-space characters makes a statement, exactly 5 does not.
    res = postprocess(" abcde <statement>A<cite></cite></statement> abcdef ", sents)
    assert [(s.text, s.citations) for s in res.all_statements] == [(" abcde ", None), ("A", []), (" abcdef ", [])]


def test_postprocess_counts_malformed_input_without_raising():
    sents = _doc(5)
    # An unclosed <statement>: its text is dropped (official), counted.
    res = postprocess("<statement>A<cite>[0-0]</cite></statement><statement>dangling text", sents)
    assert [s.text for s in res.statements] == ["A"] and res.malformed == 1
    assert res.answer == "<statement>A<cite>[0-0]</cite></statement>"
    # An unclosed <cite> stays in the text; an inverted span is skipped; both counted.
    res = postprocess("<statement>B<cite>[1-1]</statement><statement>C<cite>[3-1][2-2]</cite></statement>", sents)
    assert [(s.text, [(c.start, c.end) for c in s.citations]) for s in res.statements] == [
        ("B<cite>[1-1]", []), ("C", [(2, 2)])]
    assert res.malformed == 2
    # A stray </statement> and a nested <statement>.
    res = postprocess("junk words</statement><statement>x<statement>y<cite>[0-0]</cite></statement>", sents)
    assert [s.text for s in res.statements] == ["junk words</statement>", "x<statement>y"]
    assert res.malformed == 2
    # Over the limit of 3.
    res = postprocess("<statement>D<cite>[0-0][2-2][4-4][6-6]</cite></statement>", _doc(8))
    assert res.over_limit == 1 and len(res.statements[0].citations) == 3


def test_postprocess_random_input_invariants_and_idempotence():
    rng = random.Random(1)
    sents = _doc(6)
    toks = ["<statement>", "</statement>", "<cite>", "</cite>", "[0-1]", "[2-2]", "[3-1]", "[4-9]", "[7-7]",
            "[5-5]", "word ", "A longer bit of text ", " ", "\n"]
    for _ in range(300):
        answer = "".join(rng.choice(toks) for _ in range(rng.randint(0, 30)))
        res = postprocess(answer, sents)  # never raises
        for s in res.statements:
            assert len(s.citations) <= 3
            for a, b in zip(s.citations, s.citations[1:], strict=False):
                assert b.start != a.end + 1  # adjacent ones were merged
            for c in s.citations:
                assert 0 <= c.start <= c.end <= 5
                assert c.cite == "".join(x.content for x in sents[c.start:c.end + 1])
    # Well-formed answers: re-parsing the normalised answer gives it back.
    for _ in range(200):
        parts = []
        for _ in range(rng.randint(0, 5)):
            spans = "".join(rng.choice(["[0-1]", "[2-2]", "[3-4]", "[9-9]", "[5-5]"])
                            for _ in range(rng.randint(0, 5)))
            filler = rng.choice(["", "Some filler text. ", "ok "])
            parts.append(filler + f"<statement>Claim.<cite>{spans}</cite></statement>")
        once = postprocess("".join(parts), sents)
        twice = postprocess(once.answer, sents)
        assert twice.answer == once.answer
        assert [(s.text.strip(), s.citations) for s in twice.statements] == [
            (s.text.strip(), s.citations) for s in once.statements]


def test_postprocess_matches_a_naive_statement_walk():
    """The statements with citations of a well-formed answer, derived independently with one regex."""
    rng = random.Random(2)
    n = 7
    sents = _doc(n)
    for _ in range(200):
        pieces = []
        for _ in range(rng.randint(1, 4)):
            spans = [(rng.randint(0, 9), 0) for _ in range(rng.randint(0, 5))]
            spans = [(s, s + rng.randint(-1, 3)) for s, _ in spans]
            pieces.append((f"Claim {rng.randint(0, 99)}.", spans))
        answer = " ".join(f"<statement>{t}<cite>{''.join(f'[{a}-{b}]' for a, b in sp)}</cite></statement>"
                          for t, sp in pieces)
        res = postprocess(answer, sents)
        expect = []
        for text, spans in pieces:
            merged: list[list[int]] = []
            for a, b in spans:
                if b < a or a >= n:
                    continue
                b = min(b, n - 1)
                if merged and a == merged[-1][1] + 1:
                    merged[-1][1] = b
                else:
                    merged.append([a, b])
            expect.append((text, [tuple(m) for m in merged[:3]]))
        assert [(s.text, [(c.start, c.end) for c in s.citations]) for s in res.statements] == expect
        assert re.sub(r"<cite>.*?</cite>", "", res.answer) == re.sub(r"<cite>.*?</cite>", "", answer)
