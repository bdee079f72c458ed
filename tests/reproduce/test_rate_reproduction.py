"""``lmforge reproduce rate --quick``: the verdict is the stated condition recomputed from the tables
(the binomial coverage test with scipy), expected values in the table are the closed forms."""

from __future__ import annotations

from pathlib import Path

import pytest
from scipy.stats import binomtest

from lmforge.methods.rate.synthetic import SyntheticRateTask
from lmforge.reproduce.base import ReproduceOptions, get
from lmforge.reproduce.rate import COVER_ALPHA, DRIFT, TOL


def test_rate_quick(tmp_path: Path) -> None:
    res = get("rate").fn(ReproduceOptions(out_dir=tmp_path, quick=True, seed=0))
    sweep = res.tables[0].rows
    task = SyntheticRateTask()
    a = task.a
    pvals = []
    for p, naive_exp, naive, s_att, s_atu, rate, _sd, covered, pval in sweep:
        assert naive_exp == pytest.approx(task.a + task.b * (2 * p - 1), abs=1e-3)
        k, n = (int(x) for x in covered.split("/"))
        assert pval == pytest.approx(binomtest(k, n, 0.95).pvalue, abs=1e-3)
        pvals.append(pval)
    expected = (all(abs(r[5] - a) <= TOL for r in sweep)
                and sweep[-1][2] - sweep[0][2] > DRIFT
                and all(pv >= COVER_ALPHA for pv in pvals)
                and all(r[3] < a - TOL for r in sweep) and all(r[4] > a + TOL for r in sweep))
    text = {r[0]: r for r in res.tables[1].rows}
    true_att, _naive, single_att, rate_att = text["ATT"][1:]
    expected = expected and abs(rate_att - true_att) < abs(single_att - true_att)
    assert res.held == expected
    # ATE is the weighted mean of ATT and ATU, so it lies between them for every estimator.
    for col in (1, 3, 4):
        lo, hi = sorted((text["ATT"][col], text["ATU"][col]))
        assert lo - 1e-3 <= text["ATE"][col] <= hi + 1e-3
    assert Path(res.figures[0].path).stat().st_size > 1000
