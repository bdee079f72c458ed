"""``lmforge reproduce dsla --quick``: the tables hold what the code measured, and ``held`` is the stated
condition (A and B and C) recomputed from them."""

from __future__ import annotations

from pathlib import Path

from lmforge.reproduce.base import ReproduceOptions, get
from lmforge.reproduce.dsla import SPEEDUP


def test_dsla_reproduction_quick(tmp_path: Path) -> None:
    res = get("dsla").fn(ReproduceOptions(out_dir=tmp_path, quick=True, seed=0))
    quality, speed, policy, entropy = res.tables
    rows = {r[0]: r for r in quality.rows}
    assert rows["teacher (no layer converted)"][1] == 0.0  # the teacher against itself
    # every converted arm differs from the teacher, zeroing included
    for name in ("zeroing the attention", "DSLA", "single-state GLA"):
        assert rows[name][1] > 0
    # the entropy order: the converted layers are the lowest-entropy ones
    ent = {r[0]: r[1] for r in entropy.rows}
    layers = eval(res.measured["layers converted"])  # noqa: S307 (our own "[i, j]" cell)
    assert max(ent[i] for i in layers) <= min((v for i, v in ent.items() if i not in layers), default=float("inf"))
    assert len(layers) == 2 and len(ent) >= len(layers)
    # verdict = A and B and C from the tables
    kl = {k: rows[k][1] for k in rows}
    a = kl["DSLA"] < kl["zeroing the attention"] and kl["DSLA"] <= kl["single-state GLA"]
    b = speed.rows[-1][-1] >= SPEEDUP
    c = res.measured["condition C (swap/unswap bit-identical)"]
    assert c is True
    assert res.measured["condition A (KL DSLA < zeroing, <= single-state)"] == a
    assert res.measured["condition B (>= 1.3x decode)"] == b
    assert res.held == (a and b and c)
    assert Path(res.figures[0].path).stat().st_size > 1000
