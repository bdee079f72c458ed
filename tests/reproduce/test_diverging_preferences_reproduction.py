"""``lmforge reproduce diverging-preferences --quick``: the verdict is the stated condition recomputed
from the table, the tables agree with each other, the figure is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmforge.reproduce.base import ReproduceOptions, get
from lmforge.reproduce.diverging_preferences import ACC_TOL, GAIN, MODELS


def test_diverging_preferences_quick(tmp_path: Path) -> None:
    res = get("diverging-preferences").fn(ReproduceOptions(out_dir=tmp_path, quick=True, seed=0))
    rows = {r[0]: r for r in res.tables[0].rows}
    tuned = next(k for k in rows if k.startswith("BT (agg), score tuned"))
    assert [k for k in rows if k != tuned] == list(MODELS)
    # the tuned BT row is the same model (same accuracy), and its gain is the reported one
    assert rows[tuned][1] == rows["BT (agg)"][1]
    assert res.measured["Diverging-ID AUROC gain over BT (agg) with its score tuned on dev (not the verdict)"] == \
        pytest.approx(rows["Mean-Var (KL)"][2] - rows[tuned][2], abs=2e-3)
    for r in rows.values():
        assert 0.0 <= r[1] <= 1.0 and 0.0 <= r[2] <= 1.0
        assert r[2] == pytest.approx(float(r[4]), abs=1e-3)  # one seed: the mean is that seed's value
    gain = rows["Mean-Var (KL)"][2] - rows["BT (agg)"][2]
    gap = rows["Mean-Var (KL)"][1] - rows["BT (agg)"][1]
    assert res.held == (gain >= GAIN - 1e-3 and abs(gap) <= ACC_TOL + 1e-3)
    assert res.measured["Diverging-ID AUROC gain of Mean-Var (KL) over BT (agg)"] == pytest.approx(gain, abs=2e-3)
    # The judge table: the filtered set is the full set minus what the filter dropped.
    all_row, filt_row = res.tables[1].rows
    dropped = int(filt_row[0].split("dropping the ")[1].split(" ")[0])
    assert filt_row[1] == all_row[1] - dropped
    n_div, n_drop = (int(x) for x in res.measured["filter: diverging pairs among those dropped"].split(" of "))
    assert n_drop == dropped and 0 <= n_div <= n_drop
    assert Path(res.figures[0].path).stat().st_size > 1000
