"""UDora's weighted interval scheduling: optimality (brute force), official tie-breaking, sequential filter."""

from __future__ import annotations

import itertools
import random

import pytest

from lmforge.methods.udora.scheduling import (
    Interval,
    count_matched,
    matched_threshold,
    select_intervals,
    sequential_filter,
    weighted_schedule,
)


def _iv(start, length, score, tag=0):
    return Interval(start=start, end=start + length, score=score, target_ids=tuple(range(length)), target_index=tag)


def _random_intervals(rng: random.Random, n: int, ties: bool) -> list[Interval]:
    out = []
    for k in range(n):
        start = rng.randrange(0, 20)
        length = rng.randint(1, 6)
        score = rng.choice([0.25, 0.5, 0.75, 1.0]) if ties else rng.random()
        out.append(_iv(start, length, score, tag=k))
    return out


def _disjoint(chosen) -> bool:
    ordered = sorted(chosen, key=lambda iv: iv.start)
    return all(a.end <= b.start for a, b in zip(ordered, ordered[1:]))


def _brute_force(intervals, budget) -> float:
    best = 0.0
    for size in range(1, min(budget, len(intervals)) + 1):
        for combo in itertools.combinations(intervals, size):
            if _disjoint(combo):
                best = max(best, sum(iv.score for iv in combo))
    return best


def test_dp_equals_brute_force_on_random_cases():
    rng = random.Random(1234)
    for case in range(240):
        n = rng.randint(0, 12)
        budget = rng.randint(1, 4)
        intervals = _random_intervals(rng, n, ties=case % 3 == 0)
        chosen = weighted_schedule(intervals, budget)
        assert len(chosen) <= budget
        assert _disjoint(chosen)
        assert [iv.end for iv in chosen] == sorted(iv.end for iv in chosen)
        assert sum(iv.score for iv in chosen) == pytest.approx(_brute_force(intervals, budget), abs=1e-12)


def test_tie_between_taking_and_skipping_goes_to_the_later_ending_interval():
    a = _iv(0, 2, 1.0, tag=0)   # [0, 2)
    b = _iv(1, 2, 1.0, tag=1)   # [1, 3), overlaps a, same score
    assert weighted_schedule([a, b], 1) == [b]
    assert weighted_schedule([b, a], 1) == [b]
    # equal ends: the stable sort keeps collection order, and the later-collected one is taken
    c = _iv(1, 2, 1.0, tag=2)
    assert weighted_schedule([b, c], 1) == [c]
    assert weighted_schedule([c, b], 1) == [b]


def test_budget_limits_the_count_and_zero_budget_selects_nothing():
    ivs = [_iv(0, 2, 0.5), _iv(2, 2, 0.5), _iv(4, 2, 0.5)]
    assert weighted_schedule(ivs, 0) == []
    assert len(weighted_schedule(ivs, 2)) == 2
    assert weighted_schedule(ivs, 3) == ivs
    assert weighted_schedule([], 3) == []
    # one heavy interval beats two light ones it overlaps
    assert weighted_schedule(ivs + [_iv(0, 6, 1.4)], 3) == ivs
    assert weighted_schedule(ivs + [_iv(0, 6, 1.6)], 3) == [_iv(0, 6, 1.6)]
    # a tie (0.5 * 3 == 1.5) goes to taking the last interval in end order, here the heavy one
    assert weighted_schedule(ivs + [_iv(0, 6, 1.5)], 3) == [_iv(0, 6, 1.5)]


def test_input_list_is_not_reordered():
    ivs = [_iv(5, 2, 0.3), _iv(0, 1, 0.9)]
    before = list(ivs)
    select_intervals(ivs, 2, sequential=False)
    assert ivs == before


def test_sequential_filter_hand_cases():
    full3 = _iv(0, 3, matched_threshold(3) + 0.1, tag=0)   # (3 + 0.4) / 4 = 0.85 >= 0.75
    exact = _iv(5, 3, 0.75, tag=1)                         # exactly L/(L+1): counts as matched
    part = _iv(10, 3, 0.6, tag=2)                          # m = 2, p = 0.4: (2.4) / 4
    low = _iv(20, 2, 0.2, tag=3)
    low2 = _iv(30, 2, 0.4, tag=4)
    low3 = _iv(40, 2, 0.4, tag=5)
    assert sequential_filter([full3, exact, part], sequential=True) == [full3, exact]
    assert sequential_filter([full3, exact, part], sequential=False) == [full3, exact, part]
    assert sequential_filter([low, part, low2], sequential=True) == [part]
    assert sequential_filter([low, low2, low3], sequential=True) == [low2]   # first of equal best
    assert sequential_filter([], sequential=True) == []
    assert count_matched([full3, exact, part, low]) == 2
    assert count_matched([full3, exact, part, low], threshold=0.5) == 3


def test_select_intervals_sequential_vs_joint():
    matched = _iv(0, 2, 0.9)      # >= 2/3
    unmatched = _iv(4, 2, 0.6)
    assert select_intervals([matched, unmatched], 2, sequential=False) == [matched, unmatched]
    assert select_intervals([matched, unmatched], 2, sequential=True) == [matched]
    assert select_intervals([unmatched, _iv(8, 2, 0.1)], 2, sequential=True) == [unmatched]
