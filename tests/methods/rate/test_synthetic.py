"""RATE's claim on a task with known effects: naive is confounded, single rewrite is off by the
artifact, RATE recovers the effect with about nominal CI coverage (paired SEs; the official unpaired
ones are wider); failed rewrites are counted."""

from __future__ import annotations

import numpy as np
import pytest

from lmforge.methods.rate import synthetic as S
from lmforge.methods.rate.apply import run_rate
from lmforge.methods.rate.config import RateConfig

SEEDS = 120
N = 200


def _run(task: S.SyntheticRateTask, seed: int, n: int = N, **cfg) -> dict:
    p, y, w = S.sample(task, n, seed)
    return run_rate(p, y, w, S.reward(task), S.rewriter(task, 10_000 + seed), RateConfig(**cfg), classifier=S.classifier)


def test_naive_single_rewrite_and_rate_over_seeds():
    task = S.SyntheticRateTask(a=1.0, b=2.0, c=0.8, p_l_given_w1=0.8)
    res = [_run(task, s, paired_se=True)["effects"] for s in range(SEEDS)]
    mean = lambda f: float(np.mean([f(e) for e in res]))  # noqa: E731
    naive = mean(lambda e: e["naive"]["value"])
    # Naive is biased by the correlated attribute: a + b (P(l|w=1) - P(l|w=0)) = 1 + 2 * 0.6.
    assert naive == pytest.approx(task.naive_expected, abs=0.05) and abs(naive - task.a) > 1.0
    # Single rewrite: the artifact sits on the rewritten side only: a - c and a + c.
    assert mean(lambda e: e["single_rewrite"]["ATT"]["value"]) == pytest.approx(task.a - task.c, abs=0.03)
    assert mean(lambda e: e["single_rewrite"]["ATU"]["value"]) == pytest.approx(task.a + task.c, abs=0.03)
    # RATE: the artifact cancels.
    for k in ("ATT", "ATU", "ATE"):
        assert mean(lambda e, k=k: e["rate"][k]["value"]) == pytest.approx(task.a, abs=0.03)
    # With paired SEs about 95% of RATE's 95% intervals cover a (binomial sd over 120 seeds: 2%); the
    # others' do not.
    cover = lambda est, rs=res: float(np.mean([est(e)["ci_low"] <= task.a <= est(e)["ci_high"] for e in rs]))  # noqa: E731
    assert 0.89 <= cover(lambda e: e["rate"]["ATE"]) <= 0.995
    assert 0.89 <= cover(lambda e: e["rate"]["ATT"]) <= 0.995
    assert cover(lambda e: e["naive"]) < 0.05
    assert cover(lambda e: e["single_rewrite"]["ATT"]) < 0.05
    # The official unpaired SE (the default) ignores that both arms hold the same units, whose rewards
    # correlate here: wider intervals with the same centres, covering at least as often.
    off = [_run(task, s)["effects"] for s in range(SEEDS)]
    for k in ("ATT", "ATU", "ATE"):
        assert [e["rate"][k]["value"] for e in off] == pytest.approx([e["rate"][k]["value"] for e in res])
        assert all(o["rate"][k]["se"] > e["rate"][k]["se"] for o, e in zip(off, res))
    assert cover(lambda e: e["rate"]["ATE"], off) >= cover(lambda e: e["rate"]["ATE"])


def test_rate_stays_flat_while_naive_drifts_with_the_correlation():
    rows = []
    for p in (0.5, 0.75, 1.0):
        task = S.SyntheticRateTask(p_l_given_w1=p)
        es = [_run(task, s, n=150)["effects"] for s in range(25)]
        rows.append((np.mean([e["naive"]["value"] for e in es]), np.mean([e["rate"]["ATE"]["value"] for e in es]),
                     task.naive_expected))
    for naive, rate, expected in rows:
        assert naive == pytest.approx(expected, abs=0.12) and rate == pytest.approx(1.0, abs=0.05)
    assert rows[-1][0] - rows[0][0] > 1.5


def test_failed_rewrites_are_counted_and_listed_never_silently_dropped():
    task = S.SyntheticRateTask(p_fail=0.2, rewrite_noise=0.0)
    p, y, w = S.sample(task, 300, seed=4)
    rw = S.rewriter(task, 7)
    res = run_rate(p, y, w, S.reward(task), rw, RateConfig(), classifier=S.classifier, keep_texts=True)
    f = res["failures"]
    detail = res["units_detail"]
    first = sum(S.classifier(u["rewrite"]) != 1 - u["w"] for u in detail)
    second = sum(S.classifier(u["rewrite_of_rewrite"]) != u["w"] for u in detail)
    bad = [u["id"] for u in detail if not u["rewrites_flipped"]]
    assert f["rewrite_failed"] == first > 0 and f["rewrite_of_rewrite_failed"] == second > 0
    assert f["failed_ids"] == bad and f["units_with_a_failed_rewrite"] == len(bad)
    assert 0.25 < len(bad) / 300 < 0.5  # 1 - 0.8^2 = 0.36 in expectation
    assert res["units_used"] == 300  # kept by default
    # drop_failed: the same rewrites (same seed) with the failures left out, and RATE is exact again.
    res2 = run_rate(p, y, w, S.reward(task), S.rewriter(task, 7), RateConfig(drop_failed=True), classifier=S.classifier)
    assert res2["units_used"] == 300 - len(bad) and res2["failures"]["left_out_of_estimates"] == len(bad)
    assert res2["effects"]["rate"]["ATE"]["value"] == pytest.approx(task.a, abs=1e-9)
    # With failures kept, RATE is pulled towards 0 by the units whose attribute never changed.
    assert res["effects"]["rate"]["ATE"]["value"] < task.a - 0.1


def test_unchecked_rewrites_say_so():
    task = S.SyntheticRateTask()
    p, y, w = S.sample(task, 40, seed=1)
    res = run_rate(p, y, w, S.reward(task), S.rewriter(task, 1), RateConfig())
    assert res["failures"] == {"checked": False}
