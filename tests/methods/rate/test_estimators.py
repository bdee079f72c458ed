"""RATE's estimators against brute-force loops and scipy's t statistics."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from lmforge.methods.rate import estimators as E


@pytest.fixture()
def data():
    rng = np.random.default_rng(0)
    n = 57
    w = (rng.random(n) < 0.4).astype(int)
    r0, r1, r2 = rng.normal(size=n), rng.normal(size=n) + 0.3, rng.normal(size=n) - 0.2
    return r0, r1, r2, w


def test_naive_is_welch_difference(data):
    r0, _, _, w = data
    est = E.naive_effect(r0, w)
    t, c = r0[w == 1], r0[w == 0]
    assert est.value == pytest.approx(t.mean() - c.mean())
    welch = stats.ttest_ind(t, c, equal_var=False)
    assert est.value / est.se == pytest.approx(welch.statistic)
    z = stats.norm.ppf(0.975)
    assert (est.ci_low, est.ci_high) == pytest.approx((est.value - z * est.se, est.value + z * est.se))


def test_single_rewrite_and_rate_by_loops(data):
    """Point estimates by brute-force loops; single-rewrite SEs paired and RATE's unpaired by default
    (the official code), paired with ``paired_se``: each checked against scipy's t statistics."""
    r0, r1, r2, w = data
    att_sr, atu_sr, att, atu, ate_sr, ate = [], [], [], [], [], []
    for i in range(len(w)):
        if w[i] == 1:  # y has W=1; r1 = R(Re(y,0)); r2 = R(Re(Re(y,0),1))
            att_sr.append(r0[i] - r1[i]); att.append(r2[i] - r1[i])  # noqa: E702
            ate_sr.append(r0[i] - r1[i]); ate.append(r2[i] - r1[i])  # noqa: E702
        else:  # y has W=0; r1 = R(Re(y,1)); r2 = R(Re(Re(y,1),0))
            atu_sr.append(r1[i] - r0[i]); atu.append(r1[i] - r2[i])  # noqa: E702
            ate_sr.append(r1[i] - r0[i]); ate.append(r1[i] - r2[i])  # noqa: E702
    sr = E.single_rewrite_effects(r0, r1, w)
    ra = E.rate_effects(r1, r2, w, paired_se=True)
    for got, diffs in [(sr["ATT"], att_sr), (sr["ATU"], atu_sr), (sr["ATE"], ate_sr), (ra["ATT"], att), (ra["ATU"], atu),
                       (ra["ATE"], ate)]:
        d = np.array(diffs)
        assert got.value == pytest.approx(d.mean()) and got.n == len(d)
        assert got.se == pytest.approx(d.std(ddof=1) / math.sqrt(len(d)))
        # paired SE: the one-sample t statistic of the differences
        assert got.value / got.se == pytest.approx(stats.ttest_1samp(d, 0.0).statistic)
    n1, n0 = int(w.sum()), int((1 - w).sum())
    assert ra["ATE"].value == pytest.approx((n1 * ra["ATT"].value + n0 * ra["ATU"].value) / len(w))
    # with paired_se, RATE's ATT is a paired t-test of R(Re(Re(y,0),1)) against R(Re(y,0)) over w=1
    m = w == 1
    assert ra["ATT"].value / ra["ATT"].se == pytest.approx(stats.ttest_rel(r2[m], r1[m]).statistic)
    # default: the official unpaired SE, Welch's statistic of the do(W=1) arm against the do(W=0) arm
    un = E.rate_effects(r1, r2, w)
    do1, do0 = np.where(m, r2, r1), np.where(m, r1, r2)
    for key, sel in (("ATT", m), ("ATU", ~m), ("ATE", np.ones_like(m))):
        assert un[key].value == pytest.approx(ra[key].value) and un[key].n == int(sel.sum())
        welch = stats.ttest_ind(do1[sel], do0[sel], equal_var=False).statistic
        assert un[key].value / un[key].se == pytest.approx(welch)
        assert un[key].se != pytest.approx(ra[key].se)
    assert E.all_effects(r0, r1, r2, w)["rate"]["ATE"]["se"] == pytest.approx(un["ATE"].se)
    assert E.all_effects(r0, r1, r2, w, paired_se=True)["rate"]["ATE"]["se"] == pytest.approx(ra["ATE"].se)


def test_input_checks_and_degenerate_sizes():
    with pytest.raises(ValueError):
        E.naive_effect(np.zeros(3), np.array([0, 1, 2]))
    with pytest.raises(ValueError):
        E.rate_effects(np.zeros(3), np.zeros(2), np.array([0, 1, 1]))
    one = E.paired(np.array([0.5]))
    assert one.value == 0.5 and math.isnan(one.se)
    assert E.paired(np.array([])).n == 0


def test_undefined_estimates_are_none_in_json_not_nan():
    import json

    from lmforge.methods.rate.estimators import paired, unpaired

    one = paired(np.array([0.5])).to_json()  # one unit: a mean, but no standard error
    assert one["value"] == 0.5 and one["se"] is None and one["ci_low"] is None and one["n"] == 1
    none = unpaired(np.array([1.0, 2.0]), np.array([])).to_json()  # no control unit at all
    assert none["value"] is None and none["se"] is None
    json.dumps([one, none], allow_nan=False)
