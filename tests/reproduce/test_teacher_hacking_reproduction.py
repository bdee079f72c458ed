"""``lmforge reproduce teacher-hacking --quick``: the five runs are reported consistently with their curves,
the detector's verdicts are recomputed from the curves, the verdict is the stated condition recomputed
from the tables, and the figures are written."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmforge.methods.teacher_hacking.detector import detect_deviation, detect_slope_collapse
from lmforge.reproduce.base import ReproduceOptions, get
from lmforge.reproduce.teacher_hacking import SMOOTH, U_MIN_REL, smooth, u_depth


def test_u_depth_and_smoothing_on_hand_made_curves() -> None:
    assert smooth([3.0, 6.0, 9.0, 0.0], 3) == [3.0, 4.5, 6.0, 5.0]
    # golden bottoms at index 2, then rises by 0.5 while proxy keeps falling: the U's left arm
    assert u_depth([5, 4, 3, 2, 1], [5, 4, 3, 3.2, 3.5]) == pytest.approx(0.5)
    # golden rises only once proxy is above its value at golden's minimum: no U
    assert u_depth([5, 4, 3, 3.5, 4], [5, 4, 3, 3.2, 3.5]) == 0.0
    assert u_depth([5, 4, 3, 2, 1], [5, 4, 3, 2, 1]) == 0.0


def test_teacher_hacking_reproduction_quick(tmp_path: Path) -> None:
    res = get("teacher-hacking").fn(ReproduceOptions(out_dir=tmp_path, quick=True, seed=0))
    cols = res.tables[0].columns
    rows = {r[0]: dict(zip(cols, r)) for r in res.tables[0].rows}
    assert list(rows) == ["offline 100x1", "offline 50x2", "offline 20x5", "online teacher", "online student"]
    curves: dict[str, list[list]] = {}
    for run, step, proxy, golden in res.tables[1].rows:
        curves.setdefault(run, []).append([step, proxy, golden])

    stats = {}
    for name, row in rows.items():
        steps, proxy, golden = (list(x) for x in zip(*curves[name]))
        assert steps[0] == 0 and steps == sorted(steps)
        # fixed dataset size across the offline knob, one prompt pool for all regimes
        if name.startswith("offline"):
            assert row["prompts"] * row["gens/prompt"] == 100
        # every run starts from the same student: identical step-0 metrics
        assert proxy[0] == pytest.approx(rows["offline 100x1"]["proxy start"], abs=1e-3)
        assert golden[0] == pytest.approx(rows["offline 100x1"]["golden start"], abs=1e-3)
        # table numbers agree with the curves
        assert row["golden min (raw)"] == pytest.approx(min(golden), abs=1e-3)
        assert row["golden end (raw)"] == pytest.approx(golden[-1], abs=1e-3)
        gs, ps = smooth(golden, SMOOTH), smooth(proxy, SMOOTH)
        assert row["golden rise (sm)"] == pytest.approx(gs[-1] - min(gs), abs=2e-3)
        assert row["U depth (sm)"] == pytest.approx(u_depth(ps, gs), abs=2e-3)
        # the detector's verdict is recomputed from the proxy curve alone
        det = detect_deviation(steps, proxy)
        assert row["detector fired"] == det.fired
        assert row["detector excess"] == pytest.approx(det.max_excess, abs=0.01)
        slope = detect_slope_collapse(steps, proxy)  # the post-hoc reading, reported beside it
        assert row["slope-collapse fired (post hoc)"] == slope.fired
        assert row["b late"] == pytest.approx(slope.b_late, abs=0.01)
        # distillation moves every student toward the teacher
        assert proxy[-1] < proxy[0]
        stats[name] = row

    # the teacher is imperfect: its own golden KL is clearly positive
    setup = dict(res.tables[2].rows)
    assert setup["teacher_golden"] > 0.1
    assert setup["student_params"] < setup["teacher_params"]

    base, fewer5 = stats["offline 100x1"], stats["offline 20x5"]
    on = [stats["online teacher"], stats["online student"]]
    expected = (
        base["U depth (sm)"] >= U_MIN_REL * base["golden min (sm)"]
        and all(r["golden rise (sm)"] <= U_MIN_REL * r["golden min (sm)"]
                and r["U depth (sm)"] < U_MIN_REL * r["golden min (sm)"] for r in on)
        and base["detector fired"] and not any(r["detector fired"] for r in on)
        and fewer5["golden rise (sm)"] > base["golden rise (sm)"]
    )
    assert res.held == expected
    assert res.notes[0].startswith("QUICK")
    for fig in res.figures:
        assert Path(fig.path).stat().st_size > 5000
    assert len(res.figures) == 2
