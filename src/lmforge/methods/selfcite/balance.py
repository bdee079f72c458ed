"""SelfCite's length balancing of the rejected response of a citation preference pair.

SimPO on (chosen, rejected) citation pairs would learn "cite more" if the chosen response's citations
were simply longer. SelfCite (Chuang et al., ICML 2025) edits the rejected response so that each
statement has as many citation spans as the chosen one and about the same number of cited sentences:
missing spans are added as "fake" citations a few sentences away from the chosen ones, or the rejected
spans are grown/shrunk. This module follows the behaviour of the official
``training/length_balancing.py::create_edited_reject_prediction`` (with its inner
``extract_text_and_cites``, ``rebuild_statement``, ``generate_fake_citation`` and ``coverage_of``),
written anew (the official code is CC BY-NC). Randomness comes from the ``random.Random`` passed in,
called in the same order and with the same arguments as the official calls to the ``random`` module,
so a ``Random(seed)`` reproduces the official output under ``random.seed(seed)``. Kept quirks and
deviations are marked ``NOTE:``.

Libraries checked: nothing on PyPI implements this edit (it is specific to the SelfCite recipe; TRL's
preference trainers take the pairs as given).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

Span = tuple[int, int]

_STATEMENT = re.compile(r"<statement>(.*?)</statement>", re.DOTALL)
_FIRST_CITE = re.compile(r"<cite>(.*?)</cite>", re.DOTALL)
_SPAN = re.compile(r"\[(\d+)-(\d+)\]")

FAKE_MAX_TRIES = 1000   # official generate_fake_citation's max_tries
ADJUST_MAX_TRIES = 31   # official max_tries of the grow/shrink loop
LONG_SPAN = 10          # a parsed span longer than this (end - start > 10) ...
LONG_SPAN_CUT = 5       # ... becomes start..start+5

COVERAGE_KEYS = (
    "reject_before_edit", "chosen_before_edit", "reject_after_edit", "chosen_after_edit",
    "total_cites_reject_before_edit", "total_cites_chosen_before_edit",
    "total_cites_reject_after_edit", "total_cites_chosen_after_edit",
)


@dataclass(frozen=True)
class BalanceResult:
    """The edited pair.

    ``rejected``/``chosen``: the rebuilt responses, one ``<statement>…</statement>`` per line (text
    outside statements is not carried over, as officially); on a statement-count mismatch, the inputs
    unchanged. ``coverages``: the official counters (:data:`COVERAGE_KEYS`; empty on a mismatch).
    ``reached_max_tries``: some statement ran out of tries: fewer fakes than needed were placed, or
    every grow/shrink attempt hit a chosen span. ``fake_citations``: per rebuilt statement, the fake
    spans added to the rejected one. ``text_mismatches``: statements whose texts differed (kept as is).
    """

    rejected: str
    chosen: str
    coverages: dict[str, int]
    reached_max_tries: bool
    fake_citations: tuple[tuple[Span, ...], ...] = ()
    text_mismatches: int = 0


def coverage(spans: list[Span] | tuple[Span, ...]) -> int:
    """Cited sentences counted per span, ``sum(end - start + 1)`` (official ``coverage_of``; an
    inverted span counts as zero or less, overlaps count twice)."""
    return sum(e - s + 1 for s, e in spans)


def parse_statement(inner: str) -> tuple[str, list[Span]]:
    """Text and spans of one statement's inner text (official ``extract_text_and_cites``).

    Only the first ``<cite>…</cite>`` counts; every copy of that exact block is removed from the text,
    which is then stripped. A span with ``end - start > 10`` is cut to ``start..start+5``; a span starting
    right after the previous span's end is merged into it. No cite block: the text as is, no spans.
    """
    m = _FIRST_CITE.search(inner)
    if m is None:
        return inner, []
    # NOTE: kept: a second, different cite block stays in the text (the official parser reads one).
    text = inner.replace(m.group(0), "").strip()
    spans: list[Span] = []
    for a, b in _SPAN.findall(m.group(1)):
        start, end = int(a), int(b)
        if end - start > LONG_SPAN:
            end = start + LONG_SPAN_CUT
        if spans and spans[-1][1] == start - 1:
            spans[-1] = (spans[-1][0], end)
        else:
            spans.append((start, end))
    return text, spans


def rebuild_statement(text: str, spans: list[Span] | tuple[Span, ...]) -> str:
    """``<statement>{text}<cite>[s-e]…</cite></statement>`` (official ``rebuild_statement``)."""
    return "<statement>" + text + "<cite>" + "".join(f"[{s}-{e}]" for s, e in spans) + "</cite></statement>"


def _split_budget(rng: random.Random, how_many: int, length: int) -> list[int]:
    """Lengths of ``how_many`` fakes sharing ``length`` cited sentences (each at least 1)."""
    if how_many == 1:
        return [length]
    if how_many == 2:
        if length <= 2:
            return [1, 1]
        first = rng.randint(1, length - 1)
        return [first, length - first]
    if length <= how_many:
        return [1] * how_many
    cuts = sorted(rng.sample(range(1, length), how_many - 1))
    bounds = [0, *cuts, length]
    return [bounds[i + 1] - bounds[i] for i in range(how_many)]


def _overlaps(a: Span, b: Span) -> bool:
    return not (a[1] < b[0] or b[1] < a[0])


def draw_fake_citations(rng: random.Random, chosen: list[Span], used: set[Span], how_many: int, length: int,
                   n_sentences: int | None = None) -> tuple[list[Span], bool]:
    """Draw ``how_many`` fake spans covering ``length`` sentences in all (official
    ``generate_fake_citation``); returns ``(fakes, ran_out_of_tries)``.

    Each try picks a side at random: a start in ``[max(min_c - L - 10, 0), max(min_c - L - 3, 0)]``
    (before the first chosen sentence, at least 3 sentences away) or in ``[max_c + 3, max_c + 10]``
    (after the last one); a span overlapping a chosen span, a used (rejected) span or an earlier fake
    is drawn again, at most 1000 tries in all. With ``n_sentences``, a span reaching past the document
    is drawn again too.
    """
    lengths = _split_budget(rng, how_many, length)
    if chosen:
        lo_anchor = min(s for s, _ in chosen)
        hi_anchor = max(e for _, e in chosen)
    else:
        # NOTE: kept from the official code, although balance_rejected never gets here (it adds fakes
        # only when the chosen statement has more spans than the rejected one, so at least one).
        lo_anchor = rng.randint(100, 300)
        hi_anchor = rng.randint(lo_anchor, 500)
    forbidden = list(chosen) + [u for u in used if u not in chosen]
    placed: list[Span] = []
    tries = 0
    while len(placed) < how_many and tries < FAKE_MAX_TRIES:
        tries += 1
        side = rng.choice(["before", "after"])
        span_len = lengths[len(placed)]
        if side == "before":
            lo, hi = max(lo_anchor - span_len - 10, 0), max(lo_anchor - span_len - 3, 0)
        else:
            lo, hi = hi_anchor + 3, hi_anchor + 10
        # (lo <= hi always holds here; the official swap for an inverted range never fires.)
        start = rng.randint(lo, max(lo, hi))
        cand = (start, start + span_len - 1)
        if any(_overlaps(cand, f) for f in forbidden):
            continue
        if n_sentences is not None and (cand[0] < 0 or cand[1] > n_sentences - 1):
            # NOTE: deviation, only with n_sentences: the official code does not know the document's
            # length; ours can, so fakes stay inside the document (the draw counts as a try).
            continue
        placed.append(cand)
        forbidden.append(cand)
    return placed, len(placed) < how_many


def _shrink_for_fakes(spans: list[Span], coverage_diff: int, diff: int) -> list[Span]:
    """Make room for the fakes' coverage by shortening the rejected spans (official ``to_shrink``)."""
    spans = list(spans)
    if diff - coverage_diff <= 0:
        return spans
    # NOTE: kept on purpose: the official code needs diff - coverage_diff sentences shrunk but shrinks by
    # 1 - coverage_diff. So the coverage is matched only when one fake is added (diff == 1); with
    # coverage_diff == 1 nothing is shrunk; with coverage_diff >= 2 "shrink" is negative and the first
    # span (if longer than one sentence) GROWS by coverage_diff - 1.
    to_shrink = 1 - coverage_diff
    for i, (s, e) in enumerate(spans):
        if e - s + 1 > 1:
            step = min(to_shrink, e - s)
            spans[i] = (s, e - step)
            to_shrink -= step
        if to_shrink <= 0:  # 0: done; < 0: the "over-shrink" exit of the quirk above
            break
    return spans


def _fit_growth(lo: int, hi: int, left: int, right: int, n_sentences: int | None) -> tuple[int, int]:
    """With ``n_sentences``, move growth that would leave the document to the span's other end."""
    if n_sentences is None:
        # NOTE: kept: the official growth is not bounded, so a span may start below 0 (rendered
        # "[-2-0]") or run past the document.
        return left, right
    # NOTE: deviation, only with n_sentences: grown spans stay inside the document (same coverage,
    # unless the document is too short); the random draws are unchanged.
    room_left, room_right = max(lo, 0), max(n_sentences - 1 - hi, 0)
    if left > room_left:
        right, left = right + left - room_left, room_left
    if right > room_right:
        left, right = min(left + right - room_right, room_left), room_right
    return left, right


def _adjust(rng: random.Random, reject: list[Span], chosen: list[Span], coverage_diff: int,
            n_sentences: int | None) -> tuple[list[Span], bool]:
    """Grow or shrink the first/last rejected span to the chosen coverage, avoiding an exact chosen span
    (official ``diff <= 0`` branch); returns ``(spans, ran_out_of_tries)``."""
    if coverage_diff == 0:
        return list(reject), False
    cited = {i for s, e in chosen for i in range(s, e + 1)}
    new: list[Span] = list(reject)
    for _ in range(ADJUST_MAX_TRIES):
        first, last = reject[0], reject[-1]
        if coverage_diff > 0:
            # Grow towards the side whose neighbour the chosen response does not cite, else at random.
            left_free, right_free = first[0] - 1 not in cited, last[1] + 1 not in cited
            if left_free and right_free:
                left = rng.randint(0, coverage_diff)
            elif left_free:
                left = coverage_diff
            elif right_free:
                left = 0
            else:
                left = rng.randint(0, coverage_diff)
            left, right = _fit_growth(first[0], last[1], left, coverage_diff - left, n_sentences)
            if len(reject) == 1:
                new = [(first[0] - left, first[1] + right)]
            else:
                new = [(first[0] - left, first[1]), *reject[1:-1], (last[0], last[1] + right)]
        else:
            # NOTE: kept: shrinking is not bounded by the span lengths, so a span can end up inverted
            # (e.g. [2-1]); its coverage then counts as 0 and the official get_citations skips it.
            left = rng.randint(0, -coverage_diff)
            right = -coverage_diff - left
            if len(reject) == 1:
                new = [(first[0] + left, first[1] - right)]
            else:
                new = [(first[0] + left, first[1]), *reject[1:-1], (last[0], last[1] - right)]
        ends = (new[0],) if len(reject) == 1 else (new[0], new[-1])
        if all(e not in chosen for e in ends):
            return new, False
    # The last attempt is kept even though it equals a chosen span (official).
    return new, True


def balance_rejected(rejected: str, chosen: str, *, rng: random.Random,
                     n_sentences: int | None = None) -> BalanceResult:
    """Edit ``rejected`` so each statement's citations match ``chosen``'s in count and (mostly) coverage.

    Both responses must have the same number of ``<statement>…</statement>`` blocks, else they are
    returned unchanged with empty counters. Per statement pair (``diff`` = chosen spans - rejected
    spans, ``coverage_diff`` = chosen coverage - rejected coverage):

    * texts differ (cite block removed, stripped): both statements are kept as they are;
    * ``diff > 0``: ``diff`` fake spans are added (:func:`draw_fake_citations`); they share ``coverage_diff``
      sentences when ``coverage_diff >= diff``, else they are one sentence each and the rejected spans
      are first shrunk by the official arithmetic (see the NOTE in ``_shrink_for_fakes``);
    * ``diff <= 0``: the first/last rejected spans grow or shrink by ``coverage_diff`` sentences.

    Spans are then sorted by start and each statement re-rendered; statements are joined with ``"\\n"``.
    ``n_sentences`` (default: unknown, the official behaviour) keeps fakes and grown spans inside the
    document.
    """
    reject_blocks = _STATEMENT.findall(rejected)
    chosen_blocks = _STATEMENT.findall(chosen)
    if len(reject_blocks) != len(chosen_blocks):
        return BalanceResult(rejected, chosen, {}, False)

    counts = dict.fromkeys(COVERAGE_KEYS, 0)
    out_reject: list[str] = []
    out_chosen: list[str] = []
    fakes_per_statement: list[tuple[Span, ...]] = []
    out_of_tries = False
    mismatches = 0
    for r_inner, c_inner in zip(reject_blocks, chosen_blocks, strict=True):
        r_text, r_spans = parse_statement(r_inner)
        c_text, c_spans = parse_statement(c_inner)
        coverage_diff = coverage(c_spans) - coverage(r_spans)
        counts["reject_before_edit"] += coverage(r_spans)
        counts["chosen_before_edit"] += coverage(c_spans)
        counts["total_cites_reject_before_edit"] += len(r_spans)
        counts["total_cites_chosen_before_edit"] += len(c_spans)

        r_text, c_text = r_text.strip(), c_text.strip()
        if r_text != c_text:
            # NOTE: deviation: the official code appends the rejected statement's inner text WITHOUT its
            # <statement> tags and leaves the chosen statement out of the edited chosen response, so
            # the pair's statements no longer line up; we keep both statements whole and unedited.
            mismatches += 1
            out_reject.append(f"<statement>{r_inner}</statement>")
            out_chosen.append(f"<statement>{c_inner}</statement>")
            fakes_per_statement.append(())
            continue

        diff = len(c_spans) - len(r_spans)
        fakes: list[Span] = []
        if diff > 0:
            used = set(r_spans)  # forbidden for fakes: the rejected spans as parsed, before shrinking
            budget = coverage_diff if coverage_diff > 0 else diff
            shrunk = _shrink_for_fakes(r_spans, coverage_diff, diff)
            fakes, short = draw_fake_citations(rng, c_spans, used, diff, budget, n_sentences)
            out_of_tries |= short
            new_spans = shrunk + fakes
        else:
            new_spans, short = _adjust(rng, r_spans, c_spans, coverage_diff, n_sentences)
            out_of_tries |= short

        new_spans = sorted(new_spans, key=lambda sp: sp[0])
        c_sorted = sorted(c_spans, key=lambda sp: sp[0])
        counts["reject_after_edit"] += coverage(new_spans)
        counts["chosen_after_edit"] += coverage(c_sorted)
        counts["total_cites_reject_after_edit"] += len(new_spans)
        counts["total_cites_chosen_after_edit"] += len(c_sorted)
        out_reject.append(rebuild_statement(r_text, new_spans))
        out_chosen.append(rebuild_statement(c_text, c_sorted))
        fakes_per_statement.append(tuple(fakes))

    # NOTE: the official flag (too_many_tries) is set only past 100 tries of a 31-try loop, so it is
    # always False; ours reports the loops that really ran out.
    return BalanceResult("\n".join(out_reject), "\n".join(out_chosen), counts, out_of_tries,
                         tuple(fakes_per_statement), mismatches)
