"""UDora's placement of target "noise" in the agent's reasoning trace: weighted interval scheduling.

Every candidate placement of a target string in the greedy reasoning trace is an :class:`Interval`
(token span ``[start, end)`` of the trace that the spliced target would occupy, with its matching
score, see ``intervals.py``). UDora picks at most ``num_location`` pairwise non-overlapping intervals
with the largest summed score by the textbook weighted-interval-scheduling dynamic programme with a
cardinality budget:

* intervals are sorted by ``end`` (a stable sort, so equal ends keep their collection order);
* ``p(j)`` is the latest interval ``i < j`` with ``end_i <= start_j`` (none: ``-1`` here);
* ``M[j][l] = max(M[j-1][l], score_j + M[p(j)+1][l-1])`` (``M[0][*] = M[*][0] = 0``);
* backtracking from ``(n, num_location)`` takes interval ``j`` whenever ``M[j][l]`` equals its
  include value, so a tie between taking and skipping goes to taking the later-ending interval.

Sequential mode then keeps only the chosen intervals that are already fully matched
(``score >= L/(L+1)``, see :func:`is_matched`); when none is, it keeps the single best-scoring one.

Follows the official ``udora/scheduling.py`` (AI-secure/UDora, MIT): ``weighted_interval_scheduling``
with ``_reconstruct_solution`` (the same comparisons in the same order, so the same tie-breaking) and
``filter_intervals_by_sequential_mode``; ``count_matched_locations`` of ``udora/text_processing.py``.
The official loop calls these with ``UDoraConfig`` defaults ``num_location=2`` and ``sequential=True``;
its scripts (``injecagent.py``, ``webshop.py``, ``agentharm.py``) default to ``--num_location 1``
(``3`` in agentharm.py) and to joint mode (``--sequential`` is a ``store_true`` flag), and the README
runs all pass ``--num_location 3``.

Libraries checked: nanoGCG (the code base UDora adapts; 0.3.0 read from its PyPI wheel) has no target
placement at all, and cannot be installed next to our transformers anyway (it pins
``transformers<=4.47.1``); the budgeted DP is a few lines, so it is written here rather than pulled in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Interval:
    """One candidate placement of a target in the reasoning trace.

    ``start``/``end`` index the trace's tokens (``end`` may pass the trace's length when the target
    runs past its last token); ``target_ids`` are the target's tokens as they tokenize in that
    context (``end - start == len(target_ids)``); ``score = (num_matched + mean_prob) / (L + 1)``;
    ``target_index`` is the target's index in the list of targets and ``target_text`` its string.
    """

    start: int
    end: int
    score: float
    target_ids: tuple[int, ...]
    num_matched: int = 0
    target_index: int = 0
    target_text: str = ""

    @property
    def length(self) -> int:
        return len(self.target_ids)


def matched_threshold(length: int) -> float:
    """``L / (L + 1)``: the lowest score of a fully matched target of ``length`` tokens."""
    return length / (length + 1)


def is_matched(interval: Interval, threshold: float | None = None) -> bool:
    """Whether ``interval`` reaches ``threshold`` (default ``L/(L+1)``: every target token is the argmax)."""
    # NOTE: the official count_matched_locations writes `success_threshold or L/(L+1)`, so a threshold
    # of 0.0 also falls back to L/(L+1); kept.
    return interval.score >= (threshold or matched_threshold(interval.length))


def count_matched(intervals: Sequence[Interval], threshold: float | None = None) -> int:
    """How many intervals are fully matched (official ``count_matched_locations``, used for logging)."""
    return sum(1 for iv in intervals if is_matched(iv, threshold))


def sort_by_end(intervals: Sequence[Interval]) -> list[Interval]:
    """The official order: a stable sort on ``end`` (ties keep the order of collection)."""
    return sorted(intervals, key=lambda iv: iv.end)


def _predecessors(ordered: Sequence[Interval]) -> list[int]:
    """``p[j]``: the largest ``i < j`` with ``end_i <= start_j``, or ``-1`` when there is none."""
    pred = []
    for j, cur in enumerate(ordered):
        p = -1
        for i in range(j - 1, -1, -1):
            if ordered[i].end <= cur.start:
                p = i
                break
        pred.append(p)
    return pred


def _include_value(ordered: Sequence[Interval], pred: Sequence[int], table: list[list[float]], j: int, l: int) -> float:
    """Score of taking interval ``j - 1`` (1-based ``j``) with budget ``l``, written as the official does."""
    cur = ordered[j - 1]
    if pred[j - 1] >= 0:
        return cur.score + table[pred[j - 1] + 1][l - 1]
    return cur.score


def weighted_schedule(intervals: Sequence[Interval], num_location: int) -> list[Interval]:
    """At most ``num_location`` non-overlapping intervals of maximal summed score, in ``end`` order.

    The input is not modified (NOTE: the official sorts its list in place and returns indices into
    the sorted list; returning the intervals themselves makes that side effect unnecessary).
    """
    if num_location < 0:
        raise ValueError(f"num_location must be >= 0, got {num_location}")
    if not intervals:
        return []
    ordered = sort_by_end(intervals)
    n = len(ordered)
    pred = _predecessors(ordered)
    # table[j][l]: best total using the first j intervals (end order) and at most l of them
    table: list[list[float]] = [[0] * (num_location + 1) for _ in range(n + 1)]
    for j in range(1, n + 1):
        for l in range(1, num_location + 1):
            table[j][l] = max(table[j - 1][l], _include_value(ordered, pred, table, j, l))

    chosen: list[int] = []
    j, l = n, num_location
    while j > 0 and l > 0:
        if table[j][l] == _include_value(ordered, pred, table, j, l):
            chosen.append(j - 1)
            j = pred[j - 1] + 1
            l -= 1
        else:
            j -= 1
    return [ordered[k] for k in sorted(chosen)]


def sequential_filter(chosen: Sequence[Interval], sequential: bool = True) -> list[Interval]:
    """Sequential mode: keep the fully matched intervals, or else the single best one; joint: all.

    ``chosen`` is the scheduler's output (``end`` order); the result keeps that order.
    """
    if not sequential:
        return list(chosen)
    kept: list[Interval] = []
    best: Interval | None = None
    best_score = float("-inf")
    for iv in chosen:
        if iv.score >= matched_threshold(iv.length):
            kept.append(iv)
        elif iv.score > best_score:  # strict: the earliest (in end order) of equal best scores wins
            best_score = iv.score
            best = iv
    if not kept and best is not None:
        kept.append(best)
    return kept


def select_intervals(intervals: Sequence[Interval], num_location: int, sequential: bool) -> list[Interval]:
    """The official per-step selection: :func:`weighted_schedule`, then :func:`sequential_filter`."""
    return sequential_filter(weighted_schedule(intervals, num_location), sequential)
