"""SelfCite length balancing: hand-worked cases for each branch of the official logic, its kept quirks,
and invariants over many seeded random pairs, checked with an independent parse of the outputs."""

from __future__ import annotations

import random
import re

from lmforge.methods.selfcite.balance import COVERAGE_KEYS, balance_rejected

_SIGNED_SPAN = re.compile(r"\[(-?\d+)-(-?\d+)\]")


def stmt(text: str, spans: list[tuple[int, int]] | None) -> str:
    if spans is None:
        return f"<statement>{text}</statement>"
    return f"<statement>{text}<cite>{''.join(f'[{s}-{e}]' for s, e in spans)}</cite></statement>"


def out_spans(response: str) -> list[list[tuple[int, int]]]:
    """Spans of each rebuilt statement, read raw (no merging), negative numbers allowed."""
    blocks = re.findall(r"<statement>(.*?)</statement>", response, re.DOTALL)
    return [[(int(a), int(b)) for a, b in _SIGNED_SPAN.findall(b)] for b in blocks]


def cov(spans) -> int:
    return sum(e - s + 1 for s, e in spans)


def one(rejected_spans, chosen_spans, seed=0, n_sentences=None, text="Fact."):
    res = balance_rejected(stmt(text, rejected_spans), stmt(text, chosen_spans), rng=random.Random(seed),
                           n_sentences=n_sentences)
    return res, out_spans(res.rejected)[0]


# ------------------------------------------------------------------------------ hand-worked branches


def test_diff_positive_coverage_diff_positive():
    # 1 vs 2 spans, coverage 1 vs 4: one fake of length 3, 3..10 sentences before 5 (clamped to start 0)
    # or after 21 (start 24..31), never overlapping [5-6], [20-21] or the rejected [5-5].
    seen_before, after_starts = False, set()
    for seed in range(200):
        res, spans = one([(5, 5)], [(5, 6), (20, 21)], seed)
        (fake,) = res.fake_citations[0]
        if fake == (0, 2):
            seen_before = True
            assert spans == [(0, 2), (5, 5)]
        else:
            assert 24 <= fake[0] <= 31 and fake[1] == fake[0] + 2
            after_starts.add(fake[0])
            assert spans == [(5, 5), fake]
        assert cov(spans) == 4 and not res.reached_max_tries
        assert res.chosen == stmt("Fact.", [(5, 6), (20, 21)])
        assert res.coverages == {"reject_before_edit": 1, "chosen_before_edit": 4, "reject_after_edit": 4,
                                 "chosen_after_edit": 4, "total_cites_reject_before_edit": 1,
                                 "total_cites_chosen_before_edit": 2, "total_cites_reject_after_edit": 2,
                                 "total_cites_chosen_after_edit": 2}
    assert seen_before and after_starts == set(range(24, 32))


def test_diff_positive_coverage_diff_not_positive_shrinks_then_adds_one():
    # [10-13] (4) vs [10-10][30-30] (2): coverage_diff = -2, shrink by 1 - (-2) = 3 -> [10-10]; one fake
    # of length 1 at 0..6 (before 10) or 33..40 (after 30).
    for seed in range(30):
        res, spans = one([(10, 13)], [(10, 10), (30, 30)], seed)
        (fake,) = res.fake_citations[0]
        assert fake[0] == fake[1] and (0 <= fake[0] <= 6 or 33 <= fake[0] <= 40)
        assert spans == sorted([(10, 10), fake]) and cov(spans) == 2


def test_diff_zero_growing():
    # Left neighbour free, right neighbour (11) cited by the chosen: all growth goes left.
    assert one([(10, 10)], [(11, 13)])[1] == [(8, 10)]
    # Both neighbours free: random split, any of the three.
    got = {tuple(one([(10, 10)], [(12, 14)], seed)[1]) for seed in range(40)}
    assert got == {((10, 12),), ((9, 11),), ((8, 10),)}
    # Two spans: the first grows left (2 free), the last cannot (9 is cited).
    assert one([(3, 3), (8, 8)], [(3, 5), (8, 9)])[1] == [(0, 3), (8, 8)]


def test_diff_zero_shrinking_avoids_an_exact_chosen_span():
    got = set()
    for seed in range(60):
        res, spans = one([(10, 15)], [(10, 11)], seed)
        assert not res.reached_max_tries and cov(spans) == 2
        got.add(tuple(spans))
    # (10, 11) is the chosen span itself: it is drawn again.
    assert got == {((11, 12),), ((12, 13),), ((13, 14),), ((14, 15),)}


def test_equal_coverage_is_unchanged_up_to_the_parse():
    res, spans = one([(1, 2), (7, 7)], [(4, 6)])
    assert spans == [(1, 2), (7, 7)] and res.fake_citations == ((),)
    # The parse merges adjacent spans and cuts spans longer than 10 to 6 sentences.
    # Here [1-2][3-4] -> [1-4] and [20-40] -> [20-25]: 2 spans covering 10, as the chosen (4 + 6).
    res, spans = one([(1, 2), (3, 4), (20, 40)], [(0, 3), (20, 25)])
    assert spans == [(1, 4), (20, 25)] and res.rejected == stmt("Fact.", [(1, 4), (20, 25)])
    # end - start == 10 is not "too long"; 11 is.
    assert one([(0, 10)], [(20, 30)])[1] == [(0, 10)]
    assert one([(0, 11)], [(20, 25)])[1] == [(0, 5)]


def test_kept_quirks():
    # diff = 3 > coverage_diff = 2: the official "shrink" by 1 - 2 = -1 grows the first span, and the
    # three fakes are one sentence each: coverage 3 + 3 = 6, not the chosen 4.
    res, spans = one([(10, 11)], [(10, 10), (12, 12), (14, 14), (16, 16)])
    assert (10, 12) in spans and len(spans) == 4 and cov(spans) == 6
    assert all(s == e for s, e in res.fake_citations[0])
    # diff = 2, coverage_diff = -1: shrunk by 2 (not 3), two one-sentence fakes: 2 + 2 = 4 = chosen 3 + 1.
    res, spans = one([(10, 13)], [(10, 10), (20, 20), (30, 30)])
    assert (10, 11) in spans and cov(spans) == 4
    # Growth is unbounded below 0 without n_sentences ...
    res, spans = one([(0, 0)], [(1, 3)])
    assert spans == [(-2, 0)] and "[-2-0]" in res.rejected
    # ... and is moved to the other end with it.
    assert one([(0, 0)], [(1, 3)], n_sentences=10)[1] == [(0, 2)]
    # Shrinking can invert a span (coverage 0): [1-1][5-5] vs [3-3].
    spans = one([(1, 1), (5, 5)], [(3, 3)])[1]
    assert spans in ([(2, 1), (5, 5)], [(1, 1), (5, 4)]) and cov(spans) == 1


def test_statement_count_mismatch_returns_inputs():
    rej = stmt("A.", [(1, 1)]) + "\n" + stmt("B.", [(2, 2)])
    cho = stmt("A.", [(1, 1), (4, 4)])
    res = balance_rejected(rej, cho, rng=random.Random(0))
    assert (res.rejected, res.chosen, res.coverages, res.reached_max_tries) == (rej, cho, {}, False)


def test_text_mismatch_keeps_both_statements_and_text_outside_statements_is_dropped():
    rej = "Intro. " + stmt("A.", [(1, 1)]) + " mid " + stmt("B.", [(3, 3)])
    cho = stmt("A.", [(1, 1), (9, 9)]) + stmt("Other.", [(3, 4)])
    res = balance_rejected(rej, cho, rng=random.Random(0))
    assert res.text_mismatches == 1
    lines = res.rejected.split("\n")
    assert len(lines) == 2 and lines[1] == stmt("B.", [(3, 3)])
    assert res.chosen.split("\n") == [stmt("A.", [(1, 1), (9, 9)]), stmt("Other.", [(3, 4)])]
    assert res.coverages["chosen_before_edit"] == 2 + 2 and res.coverages["chosen_after_edit"] == 2


def test_n_sentences_keeps_fakes_inside_the_document():
    # Chosen near the end of a 30-sentence document: "after" (start 32..39) would leave it, so the one
    # fake (length 4 - 1 = 3) goes before 25: start 12..19.
    starts = set()
    for seed in range(100):
        res, spans = one([(27, 27)], [(25, 26), (28, 29)], seed, n_sentences=30)
        (fake,) = res.fake_citations[0]
        assert fake[1] == fake[0] + 2 and spans == [fake, (27, 27)]
        starts.add(fake[0])
    assert starts == set(range(12, 20))
    # Without n_sentences, the same draws also land after the document.
    assert any(one([(27, 27)], [(25, 26), (28, 29)], seed)[0].fake_citations[0][0][0] >= 32 for seed in range(30))
    # A document too small for any fake (before: start 0 hits [0-0]; after: 5+): tries run out, reported.
    res, spans = one([(1, 1)], [(0, 0), (2, 2)], n_sentences=3)
    assert res.reached_max_tries and res.fake_citations == ((),) and spans == [(1, 1)]


def test_deterministic_for_a_seed():
    rej = "\n".join(stmt(f"S{i}.", [(10 * i, 10 * i)]) for i in range(5))
    cho = "\n".join(stmt(f"S{i}.", [(10 * i, 10 * i + 2), (10 * i + 5, 10 * i + 6), (10 * i + 8, 10 * i + 8)])
                    for i in range(5))
    a = balance_rejected(rej, cho, rng=random.Random(7))
    b = balance_rejected(rej, cho, rng=random.Random(7))
    assert a == b
    assert any(balance_rejected(rej, cho, rng=random.Random(s)).rejected != a.rejected for s in range(8, 12))


# ----------------------------------------------------------------------------- random invariants


def _parse(spans):
    """Independent re-statement of the official parse: cut long spans, merge adjacent ones."""
    out: list[tuple[int, int]] = []
    for s, e in spans:
        if e - s > 10:
            e = s + 5
        if out and out[-1][1] + 1 == s:
            out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def _rand_spans(rng: random.Random, k: int):
    return [(s, s + rng.choice([0, 0, 1, 2, 4, 14])) for s in (rng.randint(0, 60) for _ in range(k))]


def test_random_pairs_invariants():
    rng = random.Random(2025)
    checked_equal = checked_unequal = 0
    for case in range(400):
        m = rng.randint(1, 3)
        texts = [f"Statement {i}." for i in range(m)]
        raw_r = [_rand_spans(rng, rng.randint(0, 3)) for _ in range(m)]
        raw_c = [_rand_spans(rng, rng.randint(0, 5)) for _ in range(m)]
        n_sent = rng.choice([None, None, 90])
        res = balance_rejected("\n".join(stmt(t, s) for t, s in zip(texts, raw_r, strict=True)),
                               "\n".join(stmt(t, s) for t, s in zip(texts, raw_c, strict=True)),
                               rng=random.Random(case), n_sentences=n_sent)
        assert set(res.coverages) == set(COVERAGE_KEYS)
        got_r, got_c = out_spans(res.rejected), out_spans(res.chosen)
        assert len(got_r) == len(got_c) == m
        for r0, c0, new, cho, fakes in zip(raw_r, raw_c, got_r, got_c, res.fake_citations, strict=True):
            r, c = _parse(r0), _parse(c0)
            assert cho == sorted(c, key=lambda x: x[0])
            assert new == sorted(new, key=lambda x: x[0])
            diff, cd = len(c) - len(r), cov(c) - cov(r)
            if diff <= 0:
                # Grow/shrink the outer spans: same count, the chosen coverage exactly, no fakes.
                assert fakes == () and len(new) == len(r) and cov(new) == cov(c)
                continue
            assert len(fakes) <= diff
            cmin, cmax = min(x[0] for x in c), max(x[1] for x in c)
            for i, f in enumerate(fakes):
                length = f[1] - f[0] + 1
                assert length >= 1
                # 3..10 sentences before the first chosen sentence (clamped at 0) or after the last one.
                assert max(cmin - length - 10, 0) <= f[0] <= max(cmin - length - 3, 0) or cmax + 3 <= f[0] <= cmax + 10
                assert not any(f[1] >= x[0] and x[1] >= f[0] for x in c + r + list(fakes[:i]))
                if n_sent is not None:
                    assert f[0] >= 0 and f[1] <= n_sent - 1
            if len(fakes) < diff:
                assert res.reached_max_tries
                continue
            assert len(new) == len(c)  # at least as many spans as the chosen (exactly as many)
            # Coverage after the edit, from the official arithmetic.
            cap = sum(e - s for s, e in r if e - s + 1 > 1)
            if cd > 0 and diff <= cd:
                want = cov(c)
                assert sum(f[1] - f[0] + 1 for f in fakes) == cd
            elif cd > 0:
                grows = cd >= 2 and bool(r) and r[0][1] - r[0][0] + 1 > 1
                want = cov(r) + diff + (cd - 1 if grows else 0)
            else:
                want = cov(r) - min(1 - cd, cap) + diff
            assert cov(new) == want
            # ... which is the chosen coverage exactly when:
            equal = (cd > 0 and diff <= cd) or (cd <= 0 and diff == 1 and cap >= 1 - cd)
            assert (cov(new) == cov(c)) == equal
            checked_equal += equal
            checked_unequal += not equal
    assert checked_equal > 50 and checked_unequal > 20
