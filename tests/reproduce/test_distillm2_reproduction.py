"""``lmforge reproduce distillm2 --quick``: every loss ran the same budget, the student moved towards the
teacher, the tables agree with each other, and ``held`` is the stated condition recomputed from the table."""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pytest

from lmforge.reproduce.base import ReproduceOptions, get
from lmforge.reproduce.distillm2 import COMPARED, LABELS, LOSSES, MAX_RESPONSE, MarkovLanguage


def test_markov_language_is_a_distribution_and_stops() -> None:
    lang = MarkovLanguage(0)
    np.testing.assert_allclose(lang.probs.sum(-1), 1.0, rtol=1e-12)
    assert (lang.stop >= 0.04).all() and (lang.stop <= 0.2).all()
    rng = random.Random(0)
    lens = [len(lang.continue_(rng, [0, 1, 2, 3])) for _ in range(400)]
    assert min(lens) >= 1 and max(lens) <= MAX_RESPONSE
    # mean length matches the stop hazards roughly (geometric with p in [0.04, 0.2])
    assert 4 < sum(lens) / len(lens) < 20


def test_distillm2_reproduction_quick(tmp_path: Path) -> None:
    res = get("distillm2").fn(ReproduceOptions(out_dir=tmp_path, quick=True, seed=0))
    table = res.tables[0]
    rows = {r[0]: dict(zip(table.columns, r)) for r in table.rows}
    base = rows["SFT student (before distillation)"]
    students = {k: rows[LABELS[k]] for k in LOSSES}

    # Same budget for every loss.
    assert len({s["steps"] for s in students.values()}) == 1 and students["distillm2"]["steps"] > 0
    for s in (base, *students.values()):
        assert math.isfinite(s["seq KL(p||q)"]) and s["seq KL(p||q)"] >= 0 and s["seq KL(q||p)"] >= 0
        assert 0.0 <= s["win rate % (teacher judge)"] <= 100.0
    # Distillation moves the SFT student towards the teacher under every compared loss.
    for k in COMPARED:
        assert students[k]["seq KL(p||q)"] < base["seq KL(p||q)"], k

    # The paired differences are consistent with the two columns they come from.
    for k in LOSSES:
        if k == "distillm2":
            continue
        mean = float(students[k]["vs DistiLLM-2"].split(" ± ")[0])
        assert mean == pytest.approx(students[k]["seq KL(p||q)"] - students["distillm2"]["seq KL(p||q)"], abs=2e-4)

    # The curve table ends at the final numbers and starts at the SFT student.
    curves = {r[0]: r[1:] for r in res.tables[2].rows}
    for k in LOSSES:
        assert curves[LABELS[k]][0] == pytest.approx(base["seq KL(p||q)"], abs=1e-4)
        assert curves[LABELS[k]][-1] == pytest.approx(students[k]["seq KL(p||q)"], abs=1e-4)
    assert int(res.tables[2].columns[-1]) == students["distillm2"]["steps"]

    # The verdict is the stated condition recomputed from the table.
    expected = students["distillm2"]["seq KL(p||q)"] < min(students[k]["seq KL(p||q)"] for k in COMPARED
                                                           if k != "distillm2")
    assert res.held == expected
    assert res.paper["DistiLLM-2"] == 58.69 and res.paper["GKD"] == 56.14
    assert res.figures and Path(res.figures[0].path).stat().st_size > 1000
    assert any("Quick mode" in n for n in res.notes)
