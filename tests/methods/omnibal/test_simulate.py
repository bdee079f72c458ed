"""The 1F1B simulator against closed forms, bounds, and an independent recurrence reference.

The reference (:func:`_reference_makespan`) builds each stage's op order the way torch's
``Schedule1F1B._step_microbatches`` runs it (``min(m, p - s)`` warm-up forwards, then "1B1F" until the
forwards are done, then the remaining backwards) and computes every op's finish time by the closed
recurrence ``finish(op) = max(finish(previous op on the stage), ready(op)) + duration(op)``,
memoised over the op graph; it shares no code with the event-driven implementation.
"""

from __future__ import annotations

import functools
import itertools
import random

import pytest

from lmforge.methods.omnibal.simulate import simulate_1f1b, simulate_1f1b_trace, stage_costs


def _torch_order(s: int, p: int, m: int) -> list[tuple[str, int]]:
    warm = min(m, p - s)
    ops = [("F", i) for i in range(warm)]
    f, b = warm, 0
    while True:
        ops.append(("B", b))
        b += 1
        if f == m:
            break
        ops.append(("F", f))
        f += 1
    ops += [("B", i) for i in range(b, m)]
    return ops


def _reference_makespan(fwd: list[float], bwd: list[float], m: int, comm: list[float]) -> float:
    p = len(fwd)
    orders = [_torch_order(s, p, m) for s in range(p)]
    pos = {(s, op): k for s in range(p) for k, op in enumerate(orders[s])}

    @functools.lru_cache(maxsize=None)
    def finish(s: int, k: int) -> float:
        kind, i = orders[s][k]
        prev = finish(s, k - 1) if k else 0.0
        if kind == "F":
            ready = finish(s - 1, pos[(s - 1, ("F", i))]) + comm[s - 1] if s else 0.0
            return max(prev, ready) + fwd[s]
        if s == p - 1:
            ready = finish(s, pos[(s, ("F", i))])
        else:
            ready = finish(s + 1, pos[(s + 1, ("B", i))]) + comm[s]
        return max(prev, ready) + bwd[s]

    return max(finish(s, len(orders[s]) - 1) for s in range(p))


@pytest.mark.parametrize("p,m", [(1, 1), (1, 5), (2, 1), (3, 2), (4, 4), (4, 8), (5, 3), (6, 16)])
@pytest.mark.parametrize("tf,tb", [(1.0, 2.0), (1.5, 1.0), (0.25, 0.75)])
def test_uniform_closed_form(p: int, m: int, tf: float, tb: float) -> None:
    got = simulate_1f1b([tf] * p, [tb] * p, m)
    assert got == pytest.approx((m + p - 1) * (tf + tb), rel=1e-12)
    if p == 1:
        assert got == pytest.approx(m * (tf + tb), rel=1e-12)


def test_random_costs_match_reference() -> None:
    rng = random.Random(0)
    for _ in range(300):
        p, m = rng.randint(1, 6), rng.randint(1, 12)
        fwd = [rng.uniform(0.1, 3.0) for _ in range(p)]
        bwd = [rng.uniform(0.1, 6.0) for _ in range(p)]
        comm = [rng.choice([0.0, rng.uniform(0.0, 2.0)]) for _ in range(p - 1)]
        got = simulate_1f1b(fwd, bwd, m, comm)
        assert got == pytest.approx(_reference_makespan(fwd, bwd, m, comm), rel=1e-12, abs=1e-12)


def test_bounds_and_monotone() -> None:
    rng = random.Random(1)
    for _ in range(200):
        p, m = rng.randint(1, 5), rng.randint(1, 10)
        fwd = [rng.uniform(0.1, 3.0) for _ in range(p)]
        bwd = [rng.uniform(0.1, 6.0) for _ in range(p)]
        comm = [rng.uniform(0.0, 1.0) for _ in range(p - 1)]
        t = simulate_1f1b(fwd, bwd, m, comm)
        stage_total = [f + b for f, b in zip(fwd, bwd)]
        assert t >= m * max(stage_total) - 1e-9  # the busiest stage works m·(f+b)
        assert t >= sum(stage_total) + 2 * sum(comm) - 1e-9  # micro-batch 0 goes down and back
        s = rng.randrange(p)
        slower_f, slower_b = list(fwd), list(bwd)
        slower_f[s] += rng.uniform(0.01, 2.0)
        slower_b[s] += rng.choice([0.0, rng.uniform(0.01, 2.0)])
        assert simulate_1f1b(slower_f, slower_b, m, comm) >= t - 1e-12


def test_trace_respects_dependencies() -> None:
    rng = random.Random(2)
    p, m = 4, 6
    fwd = [rng.uniform(0.5, 2) for _ in range(p)]
    bwd = [rng.uniform(0.5, 4) for _ in range(p)]
    comm = [0.3, 0.0, 0.7]
    tr = simulate_1f1b_trace(fwd, bwd, m, comm)
    assert tr.busy == tuple(m * (f + b) for f, b in zip(fwd, bwd))
    assert all(x >= -1e-12 for x in tr.bubble)
    dur = {"F": fwd, "B": bwd}
    for s in range(p):
        assert len(tr.starts[s]) == 2 * m
        spans = sorted((t, t + dur[k][s]) for (k, _), t in tr.starts[s].items())
        assert all(a[1] <= b[0] + 1e-12 for a, b in zip(spans, spans[1:]))  # one op at a time
        for i in range(m):
            if s:
                assert tr.starts[s][("F", i)] >= tr.starts[s - 1][("F", i)] + fwd[s - 1] + comm[s - 1] - 1e-12
            if s < p - 1:
                assert tr.starts[s][("B", i)] >= tr.starts[s + 1][("B", i)] + bwd[s + 1] + comm[s] - 1e-12
            else:
                assert tr.starts[s][("B", i)] >= tr.starts[s][("F", i)] + fwd[s] - 1e-12
    assert tr.makespan == pytest.approx(max(t + dur[k][s] for s in range(p) for (k, _), t in tr.starts[s].items()))


def test_scalar_comm_is_every_boundary() -> None:
    fwd, bwd = [1.0, 2.0, 1.5], [2.0, 3.0, 2.5]
    assert simulate_1f1b(fwd, bwd, 5, 0.4) == simulate_1f1b(fwd, bwd, 5, [0.4, 0.4])


def test_stage_costs() -> None:
    costs = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert stage_costs(costs, [2, 4]) == [3.0, 7.0, 5.0]
    assert stage_costs(costs, []) == [15.0]
    for cuts in itertools.combinations(range(1, 5), 2):
        assert sum(stage_costs(costs, cuts)) == 15.0
    for bad in ([0, 2], [2, 5], [3, 3], [4, 2]):
        with pytest.raises(ValueError, match="boundar"):
            stage_costs(costs, bad)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        simulate_1f1b([1.0, 1.0], [1.0], 2)
    with pytest.raises(ValueError):
        simulate_1f1b([1.0], [1.0], 0)
    with pytest.raises(ValueError, match="per boundary"):
        simulate_1f1b([1.0, 1.0], [1.0, 1.0], 2, [0.1, 0.1])
