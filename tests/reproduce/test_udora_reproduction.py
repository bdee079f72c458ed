"""``lmforge reproduce udora --quick``: the table holds what the code measured, ``held`` is the stated
condition recomputed from it, and the Wilson interval matches its closed form."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from lmforge.reproduce.base import ReproduceOptions, get
from lmforge.reproduce.udora import ARMS, ASR_GAP, wilson


def test_wilson_closed_forms():
    z = 1.959963984540054  # the 97.5% normal quantile
    assert wilson(0, 10) == pytest.approx((0.0, z * z / (10 + z * z)))  # k = 0: upper = z^2/(n+z^2)
    lo, hi = wilson(10, 10)
    assert hi == pytest.approx(1.0) and lo == pytest.approx(10 / (10 + z * z))
    lo, hi = wilson(5, 10)  # symmetric around 1/2
    assert lo + hi == pytest.approx(1.0)
    p, n = 0.3, 200
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    assert wilson(60, 200) == pytest.approx((centre - half, centre + half))


def test_udora_reproduction_quick(tmp_path: Path) -> None:
    res = get("udora").fn(ReproduceOptions(out_dir=tmp_path, quick=True, seed=0))
    (table,) = res.tables
    by_arm = {r[1]: r for r in table.rows}
    assert set(by_arm) == set(ARMS)
    for arm, (seed, _, frac, asr, ci, _) in by_arm.items():
        k, n = (int(x) for x in frac.split("/"))
        assert asr == pytest.approx(k / n if n else 0.0, abs=1e-3)
        lo, hi = (float(x) for x in ci.strip("[]").split(", "))
        assert lo <= asr + 1e-3 and asr <= hi + 1e-3
    gap = by_arm["udora-joint"][3] - by_arm["gcg"][3]
    assert res.measured["[seed 0] ASR UDora joint - GCG (>= 0.15)"] == pytest.approx(gap, abs=1e-3)
    assert res.held == (gap >= ASR_GAP)
    kept, drawn = (int(x) for x in res.measured["[seed 0] cases kept / drawn (the rest trigger without an attack)"].split(" / "))
    assert 0 < kept <= drawn
