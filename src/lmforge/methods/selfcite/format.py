"""The LongCite / SelfCite citation format: sentence chunks, the tagged prompt, and the parsing of
``<statement>…<cite>[s-e]…</cite></statement>`` answers.

SelfCite (Chuang et al., ICML 2025) trains and evaluates on LongCite's format: the document is cut
into sentences, each prefixed with ``<C{i}>`` in the prompt, and the model answers with statements
that cite inclusive sentence ranges ``[s-e]``. This module follows the behaviour of the official code
(github.com/facebookresearch/SelfCite, ``longcite_modeling_llama.py``): ``text_split_by_punctuation``
(:func:`split_sentences`), ``get_prompt`` (:func:`build_prompt`; with ``keep``/``drop`` it is the
context of ``query_log_prob_hold_pruning`` / ``query_log_prob_drop_ablating``), ``get_citations``
(:func:`get_citations`) and ``postprocess`` (:func:`postprocess`). It is written anew (the official
code is CC BY-NC); where it deviates, a ``NOTE:`` comment says why.

Libraries checked: no package on PyPI implements LongCite's chunk/citation format (the official code
itself is not packaged); sentence splitting uses nltk's untrained ``PunktSentenceTokenizer()``, exactly
as the official code does (no model download: the untrained tokenizer has no language parameters).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from nltk.tokenize.punkt import PunktSentenceTokenizer

# The instruction the LongCite / SelfCite models are trained on, character for character as in the
# official ``get_prompt`` (whose ``%s`` slots are ``{context}`` and ``{question}`` here). The other
# braces are literal text of the prompt: fill it with :func:`fill_prompt`, never ``str.format``.
PROMPT_TEMPLATE = (
    "Please answer the user's question based on the following document. When a sentence S in your "
    "response uses information from some chunks in the document (i.e., <C{s1}>-<C_{e1}>, "
    "<C{s2}>-<C{e2}>, ...), please append these chunk numbers to S in the format "
    "\"<statement>{S}<cite>[{s1}-{e1}][{s2}-{e2}]...</cite></statement>\". You must answer in the same "
    "language as the user's question.\n\n[Document Start]\n{context}\n[Document End]\n\n{question}"
)

# At most this many merged citations are kept per statement (official ``get_citations``).
MAX_CITATIONS_PER_STATEMENT = 3

_CJK_STOPS = re.compile(r"([。；！？])")
_PLACEHOLDER = re.compile(r"\{(context|question)\}")
# The span pattern of the brief / the official length balancing (``\d`` also matches non-ASCII digits).
_SPAN = re.compile(r"\[(\d+)-(\d+)\]")
# NOTE: the official ``get_citations`` matches ASCII digits only (``[0-9]+``); kept for its parse.
_SPAN_ASCII = re.compile(r"\[([0-9]+)-([0-9]+)\]")
_CITE_BLOCK = re.compile(r"<cite>(.*?)</cite>", re.DOTALL)
_STATEMENT_BLOCK = re.compile(r"<statement>(.*?)</statement>", re.DOTALL)

_OPEN_S, _CLOSE_S = "<statement>", "</statement>"


@dataclass(frozen=True)
class Sentence:
    """One document chunk ``<C{index}>``.

    ``content`` is ``text[start:end]``: from the sentence's first character up to the start of the next
    sentence (so it carries the whitespace that follows it); the last one runs to the end of the text.
    """

    index: int
    content: str
    start: int
    end: int


@dataclass(frozen=True)
class Citation:
    """A merged citation of one statement: sentences ``start..end`` (inclusive).

    ``start_char``/``end_char`` are the character range of those sentences in the document and ``cite``
    their text (``document[start_char:end_char]``). When the document is unknown (``sentences=None``
    in :func:`get_citations`), they are ``-1``, ``-1`` and ``""``.
    """

    start: int
    end: int
    start_char: int
    end_char: int
    cite: str


@dataclass(frozen=True)
class Statement:
    """A statement of a post-processed answer: its text (cite blocks removed) and its citations.

    ``citations is None`` marks filler text kept between statements (official ``"citation": None``);
    ``[]`` a statement without citations.
    """

    text: str
    citations: list[Citation] | None


@dataclass
class Postprocessed:
    """What :func:`postprocess` returns.

    ``answer``: the normalised answer (every statement re-rendered with its merged spans), stripped.
    ``statements``: the statements whose citations are not ``None`` (official
    ``statements_with_citations``); ``all_statements``: every piece, filler included.
    Counters (the input is never rejected): ``malformed`` counts an unclosed ``<statement>`` (its text is
    dropped, as officially), a stray or nested statement tag, a ``<cite>`` or ``</cite>`` left unpaired
    and a span ``[a-b]`` with ``a > b`` (skipped); ``out_of_document`` counts spans starting past the
    last sentence (skipped); ``over_limit`` counts merged citations beyond the 3 kept per statement.
    """

    answer: str
    statements: list[Statement]
    all_statements: list[Statement]
    malformed: int = 0
    out_of_document: int = 0
    over_limit: int = 0


def fill_prompt(context: str, question: str) -> str:
    """:data:`PROMPT_TEMPLATE` with the tagged context and the question put in (one pass, so braces or
    placeholder-like text inside either are left alone)."""
    values = {"context": context, "question": question}
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], PROMPT_TEMPLATE)


def _pieces(text: str) -> list[str]:
    """The stripped sentence strings of ``text`` in order (official ``text_split_by_punctuation``)."""
    pieces: list[str] = []
    for sent in PunktSentenceTokenizer().tokenize(text):
        # Each CJK stop ends a piece: split keeping the stop, then glue it to what precedes it.
        parts = _CJK_STOPS.split(sent)
        for j in range(0, len(parts), 2):
            piece = parts[j] + (parts[j + 1] if j + 1 < len(parts) else "")
            if piece:
                pieces.append(piece)
    if len(pieces) == 1:
        # A single piece: paragraphs become the chunks instead.
        pieces = text.split("\n\n")
    return [p.strip() for p in pieces if p.strip()]


def split_sentences(text: str) -> list[Sentence]:
    """Cut ``text`` into the chunks ``<C0>``, ``<C1>``, … of the LongCite prompt.

    nltk's untrained Punkt splits sentences, which are cut again after each of 。；！？; a text that
    gives a single piece is split on blank lines (``"\\n\\n"``) instead. Each stripped piece is found in
    ``text`` from the end of the previous one, and its chunk runs to the start of the next piece.
    """
    located: list[tuple[int, int]] = []
    pos = 0
    for piece in _pieces(text):
        at = text.find(piece, pos)
        if at == -1:  # pieces are in-order substrings of text, so this is a bug, not bad input
            raise RuntimeError(f"sentence piece not found in the text: {piece[:40]!r}")
        located.append((at, at + len(piece)))
        pos = at + len(piece)
    sentences: list[Sentence] = []
    for i, (start, _) in enumerate(located):
        end = located[i + 1][0] if i + 1 < len(located) else len(text)
        sentences.append(Sentence(index=i, content=text[start:end], start=start, end=end))
    return sentences


def tag_context(sentences: Sequence[Sentence], *, keep: Collection[int] | None = None,
                drop: Collection[int] | None = None) -> str:
    """``"<C{i}>" + content`` for each sentence, with the original indices.

    ``keep``: only these sentence indices (official ``query_log_prob_hold_pruning``); ``drop``: all but
    these (``query_log_prob_drop_ablating``). The kept chunks are not renumbered.
    """
    if keep is not None and drop is not None:
        raise ValueError("pass keep or drop, not both")
    keep_set = None if keep is None else set(keep)
    drop_set = set() if drop is None else set(drop)
    return "".join(f"<C{s.index}>{s.content}" for s in sentences
                   if (keep_set is None or s.index in keep_set) and s.index not in drop_set)


def build_prompt(sentences: Sequence[Sentence], question: str, *, keep: Collection[int] | None = None,
                 drop: Collection[int] | None = None) -> str:
    """The LongCite prompt for these chunks and question (see :func:`tag_context` for keep/drop)."""
    return fill_prompt(tag_context(sentences, keep=keep, drop=drop), question)


def prompt_for(context: str, question: str) -> tuple[str, list[Sentence]]:
    """Official ``get_prompt``: split ``context`` and build the prompt; returns ``(prompt, sentences)``."""
    sentences = split_sentences(context)
    return build_prompt(sentences, question), sentences


def parse_spans(text: str) -> list[tuple[int, int]]:
    """Every ``[s-e]`` in ``text`` as ``(s, e)``, in order, unchecked (inverted spans included)."""
    return [(int(a), int(b)) for a, b in _SPAN.findall(text)]


def cited_sentences(spans: Sequence[tuple[int, int]]) -> set[int]:
    """The sentence indices covered by inclusive spans (an inverted span covers nothing)."""
    out: set[int] = set()
    for s, e in spans:
        out.update(range(s, e + 1))
    return out


def render_statement(text: str, spans: Sequence[tuple[int, int]]) -> str:
    """``<statement>{text}<cite>[s-e][s-e]…</cite></statement>`` (``<cite></cite>`` when no spans)."""
    return f"{_OPEN_S}{text}<cite>{''.join(f'[{s}-{e}]' for s, e in spans)}</cite>{_CLOSE_S}"


def statement_spans(answer: str) -> list[tuple[str, list[tuple[int, int]]]]:
    """Each closed ``<statement>…</statement>`` of ``answer`` as ``(text, spans)``: the text with every
    ``<cite>…</cite>`` block removed (not stripped) and the raw spans of all its cite blocks (no
    merging, clamping or 3-citation limit)."""
    out = []
    for inner in _STATEMENT_BLOCK.findall(answer):
        spans = [span for block in _CITE_BLOCK.findall(inner) for span in parse_spans(block)]
        out.append((_CITE_BLOCK.sub("", inner), spans))
    return out


@dataclass
class _CiteParse:
    text: str
    citations: list[Citation]
    out_of_document: int = 0
    inverted: int = 0
    over_limit: int = 0
    unpaired_cite_tags: int = 0


def _citation(start: int, end: int, sentences: Sequence[Sentence] | None) -> Citation:
    if sentences is None:
        return Citation(start, end, -1, -1, "")
    return Citation(start, end, sentences[start].start, sentences[end].end,
                    "".join(s.content for s in sentences[start:end + 1]))


def _parse_citations(statement: str, sentences: Sequence[Sentence] | None) -> _CiteParse:
    blocks = _CITE_BLOCK.findall(statement)
    text = _CITE_BLOCK.sub("", statement)
    res = _CiteParse(text=text, citations=[])
    # A <cite> or </cite> that survives the removal of the closed blocks had no partner.
    res.unpaired_cite_tags = text.count("<cite>") + text.count("</cite>")
    n = None if sentences is None else len(sentences)
    merged: list[Citation] = []
    for block in blocks:
        for a, b in _SPAN_ASCII.findall(block):
            st, ed = int(a), int(b)
            if ed < st:
                res.inverted += 1
                continue
            if n is not None:
                if st > n - 1:
                    res.out_of_document += 1
                    continue
                ed = min(ed, n - 1)
            if merged and st == merged[-1].end + 1:
                # Adjacent to the previous citation: extend it (overlapping spans are not merged).
                merged[-1] = _citation(merged[-1].start, ed, sentences)
            else:
                merged.append(_citation(st, ed, sentences))
    res.over_limit = max(0, len(merged) - MAX_CITATIONS_PER_STATEMENT)
    res.citations = merged[:MAX_CITATIONS_PER_STATEMENT]
    return res


def get_citations(statement_with_cite: str, sentences: Sequence[Sentence] | None
                  ) -> tuple[str, list[Citation], int]:
    """Official ``get_citations``: the statement without its cite blocks, its merged citations and the
    number of spans skipped because they start past the last sentence.

    Spans come from every ``<cite>…</cite>`` block; a span with ``end < start`` or ``start > n-1`` is
    skipped, ``end`` is clamped to ``n-1``, a span starting right after the previous citation's end is
    merged into it, and only the first 3 merged citations are kept. ``sentences=None`` means the
    document is unknown: nothing is skipped or clamped for length, and char offsets are ``-1``.
    """
    res = _parse_citations(statement_with_cite, sentences)
    return res.text, res.citations, res.out_of_document


def postprocess(answer: str, sentences: Sequence[Sentence] | None) -> Postprocessed:
    """Official ``postprocess``: walk the ``<statement>…</statement>`` blocks of a generated answer.

    Text before, between and after the statements becomes a statement with no citations (``[]``) when
    it has more than 5 non-space characters, else filler (citations ``None``, copied as is). Each
    statement is parsed with :func:`get_citations` and re-rendered with its merged spans. Never raises;
    malformed pieces are counted (see :class:`Postprocessed`).
    """
    pieces: list[Statement] = []
    rendered: list[str] = []
    malformed = out_of_document = over_limit = 0

    def filler_or_plain(text: str) -> None:
        nonlocal malformed
        if _OPEN_S in text or _CLOSE_S in text:  # a stray </statement> before the next <statement>
            malformed += text.count(_OPEN_S) + text.count(_CLOSE_S)
        if len(text.strip()) > 5:
            pieces.append(Statement(text, []))
            rendered.append(render_statement(text, []))
        else:
            pieces.append(Statement(text, None))
            rendered.append(text)

    pos = 0
    while True:
        open_at = answer.find(_OPEN_S, pos)
        if open_at == -1:
            open_at = len(answer)
        close_at = answer.find(_CLOSE_S, open_at)
        filler_or_plain(answer[pos:open_at])
        if close_at == -1:
            if open_at < len(answer):
                # NOTE: as officially, the text after an unclosed <statement> is dropped; we count it.
                malformed += 1
            break
        inner = answer[open_at + len(_OPEN_S):close_at]
        if _OPEN_S in inner:  # "<statement>a<statement>b</statement>": one statement "a<statement>b"
            malformed += inner.count(_OPEN_S)
        if inner.strip():
            res = _parse_citations(inner, sentences)
            malformed += res.inverted + res.unpaired_cite_tags
            out_of_document += res.out_of_document
            over_limit += res.over_limit
            pieces.append(Statement(res.text, res.citations))
            rendered.append(render_statement(res.text, [(c.start, c.end) for c in res.citations]))
        else:
            pieces.append(Statement(inner, None))
            rendered.append(inner)
        pos = close_at + len(_CLOSE_S)

    return Postprocessed(
        answer="".join(rendered).strip(),
        statements=[p for p in pieces if p.citations is not None],
        all_statements=pieces,
        malformed=malformed,
        out_of_document=out_of_document,
        over_limit=over_limit,
    )
