"""``lmforge reproduce acbench --quick``: every capability is measured for every setting, the claim's
verdict is the measured conditions, and the robust half (pruning damages more than 4-bit
quantization, in answer KL) holds even at 6 records per task."""

from __future__ import annotations

from pathlib import Path

from lmforge.reproduce.acbench import CAPS, FLOOR, PAPER, PRUNE, QUANT
from lmforge.reproduce.base import ReproduceOptions, get


def test_acbench_reproduction_quick(tmp_path: Path) -> None:
    res = get("acbench").fn(ReproduceOptions(out_dir=tmp_path, quick=True, seed=0))
    m = res.measured
    assert set(PAPER) <= set(m)  # our numbers sit beside each of the paper's
    caps_table = res.tables[0]
    assert [r[0] for r in caps_table.rows] == ["original", *QUANT, *PRUNE]
    floor_table, tasks_table = res.tables[1], res.tables[2]
    assert len(tasks_table.rows) == 13  # the twelve ACBench tasks and BFCL
    # Each capability against its floor (an empty answer's score): the verdict is the stated margin.
    assert [r[0] for r in floor_table.rows] == list(CAPS)
    for cap, orig, floor, verdict in floor_table.rows:
        assert verdict == ("at floor" if float(orig) < float(floor) + FLOOR else "above floor")
    tool_floor = float(next(r[2] for r in floor_table.rows if r[0] == "tool_use"))
    assert tool_floor > 0  # BFCL's irrelevance share: no call is right there, so an empty reply scores
    above = sum(r[3] == "above floor" for r in floor_table.rows)
    assert m["capabilities above floor"] == f"{above} of {len(CAPS)}"
    kl = {r[0]: r[-1] for r in caps_table.rows}
    assert kl["original"] == 0
    assert min(kl[s] for s in PRUNE) > max(kl[s] for s in QUANT) > 0
    assert res.held == (m["real world hit hardest under 4-bit quantization"]
                        and m["pruning costs more than quantization (score and KL)"])
    assert len(res.figures) == 4 and all(Path(f.path).stat().st_size > 1000 for f in res.figures)
