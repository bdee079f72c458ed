"""``lmforge reproduce unit-scaling`` in quick mode: the verdict, gaps and counters follow from the saved runs."""

from __future__ import annotations

import json
import math

import pytest
import torch

from lmforge.reproduce.base import ReproduceOptions, get
from lmforge.reproduce.unit_scaling import TAIL, best_lr, slope, tail_mean, verdict


def test_best_lr_recovers_a_parabola_vertex_and_flags_grid_edges():
    lrs = [2.0 ** e for e in range(-8, -2)]
    vertex = -5.3
    losses = [1.0 + 0.2 * (math.log2(lr) - vertex) ** 2 for lr in lrs]
    got, interior = best_lr(lrs, losses)
    assert interior and math.log2(got) == pytest.approx(vertex, abs=1e-9)
    got, interior = best_lr(lrs, [5, 4, 3, 2, 1, float("nan")])
    assert got == lrs[4]  # NaN (diverged) counts as +inf, so 1 at index 4 is the interior minimum
    assert best_lr(lrs, [6, 5, 4, 3, 2, 1]) == (lrs[-1], False)
    assert slope([64, 128, 256], [2.0 ** -9, 2.0 ** -10, 2.0 ** -11]) == pytest.approx(-1.0)


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("unit-scaling")
    prev = torch.get_num_threads()
    try:
        res = get("unit-scaling").fn(ReproduceOptions(out_dir=out, quick=True, seed=0))
    finally:
        torch.set_num_threads(prev)
    runs = json.loads((out / "unit-scaling-runs.json").read_text())
    return res, runs


def test_verdict_is_the_condition_recomputed_from_the_saved_runs(quick):
    res, runs = quick
    v = verdict(runs["sweep"], runs["fp8"])
    assert res.held == v["held"] == all(v["parts"].values())
    parts = [val for key, val in res.measured.items() if isinstance(val, bool)]
    assert len(parts) == 4 and res.held == all(parts)
    # The measured best LRs are the parabola fits of the saved sweep.
    for kind, label in (("mus", "µS"), ("sp", "SP")):
        for w in runs["sweep"]["widths"]:
            fit = best_lr(runs["sweep"]["lrs"][kind], runs["sweep"]["loss"][kind][str(w)])[0]
            assert res.measured[f"best LR by width, {label}"][w] == pytest.approx(fit, rel=1e-3, abs=1e-6)
    shift = max(v["opt"]["mus"]) / min(v["opt"]["mus"])
    assert res.measured["µS best-LR shift across widths (max/min)"] == pytest.approx(shift, abs=1e-3)


def test_fp8_gap_is_computed_from_the_saved_curves(quick):
    res, runs = quick
    curves = runs["fp8"]["curves"]
    assert set(curves) == {"mus-fp32", "mus-fp8", "sp-fp32", "sp-fp8"}
    assert len({len(c) for c in curves.values()}) == 1 and len(curves["mus-fp8"]) == runs["fp8"]["steps"]
    f32 = sum(curves["mus-fp32"][-TAIL:]) / TAIL
    f8 = sum(curves["mus-fp8"][-TAIL:]) / TAIL
    key = f"µS FP8 vs fp32 gap (mean of last {TAIL} training losses)"
    assert res.measured[key] == pytest.approx(abs(f8 - f32) / f32, abs=1e-5)
    assert res.measured["µS FP8 within 2% of fp32"] == (abs(f8 - f32) / f32 <= 0.02)
    # Same batches, same seed: the runs start from the same loss (FP8 only perturbs it).
    assert curves["mus-fp8"][0] == pytest.approx(curves["mus-fp32"][0], rel=0.05)
    table = res.tables[1]
    row = {r[0]: r for r in table.rows}
    assert row["mus-fp8"][1] == round(tail_mean(curves["mus-fp8"]), 4)


def test_counters_are_consistent(quick):
    res, runs = quick
    counters = runs["fp8"]["counters"]
    assert set(counters) == {"mus-fp8", "sp-fp8"}  # only the FP8 runs count casts
    for name, c in counters.items():
        kinds = [c[k] for k in ("activation", "weight", "gradient")]
        for k in kinds:
            assert 0.0 <= k["underflow"] <= 1.0 and 0.0 <= k["overflow"] <= 1.0
        assert c["total_underflow"] == pytest.approx(sum(k["underflow"] for k in kinds) / 3)
        row = {r[0]: r for r in res.tables[1].rows}[name]
        assert row[3:6] == [f"{k['underflow']:.4%}" for k in kinds]
    mus, sp = res.measured["mean underflow rate over activations/weights/gradients, µS vs SP"]
    assert mus == pytest.approx(counters["mus-fp8"]["total_underflow"], abs=1e-6)
    assert sp == pytest.approx(counters["sp-fp8"]["total_underflow"], abs=1e-6)
    # µS's N(0,1) weights never underflow as often as SP's N(0, 0.02^2) ones.
    assert counters["sp-fp8"]["weight"]["underflow"] > counters["mus-fp8"]["weight"]["underflow"]


def test_report_artefacts(quick):
    res, _ = quick
    assert res.name == "unit-scaling" and res.paper["final loss SP vs µS (µS in FP8)"]["7B"] == [2.399, 2.400]
    for fig in res.figures:
        with open(fig.path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert any("Quick mode" in n for n in res.notes)
    json.dumps(res.to_json(), default=str)
