"""``lmforge reproduce fit --quick``: the verdict is the stated condition recomputed from the table, the
tables (focus accuracy, the pretrained checkpoint's probes before and after fine-tuning) agree with
each other and with the saved results, and the figures are written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmforge.reproduce.base import ReproduceOptions, get
from lmforge.reproduce.fit import COLLAPSE_DROP, HOLD_MARGIN, HOLD_MIN, SPLITS, TRACK_MIN, verdict


def test_verdict_rule():
    def t(sft_iid, sft_flip, core_flip, spur_flip):
        return {"sft": {"iid": sft_iid, "flipped": sft_flip}, "fit:focus_c_ignore_s": {"flipped": core_flip},
                "fit:focus_s": {"flipped": spur_flip}}

    assert verdict(t(0.9, 0.1, 0.9, 0.9))["held"]
    assert not verdict(t(0.9, 0.8, 0.99, 0.9))["held"]  # no collapse
    assert not verdict(t(0.9, 0.1, 0.7, 0.9))["held"]  # core does not hold
    assert not verdict(t(0.9, 0.7, 0.8, 0.9))["held"]  # holds but not above SFT by the margin
    assert not verdict(t(0.9, 0.1, 0.9, 0.5))["held"]  # focus(S) does not track


def test_fit_reproduction_quick(tmp_path: Path) -> None:
    res = get("fit").fn(ReproduceOptions(out_dir=tmp_path, quick=True, seed=0))
    main, heldout, follow, pre, forget = res.tables
    assert main.columns == ["method", *SPLITS]
    rows = {r[0]: dict(zip(SPLITS, r[1:])) for r in main.rows}
    sft, core, spur = rows["SFT(y), plain prompt"], rows["FIT focus(C)+ignore(S)"], rows["FIT focus(S)"]

    # The verdict is the condition stated in the module, recomputed from the table.
    expected = (sft["iid"] - sft["flipped"] >= COLLAPSE_DROP - 1e-9
                and core["flipped"] >= HOLD_MIN and core["flipped"] >= sft["flipped"] + HOLD_MARGIN - 1e-9
                and spur["flipped"] >= TRACK_MIN)
    assert res.held == expected

    # Flipped split, binary labels, y != y_S on every record: agreement with y and with y_S sum to 1,
    # and focus accuracy is agreement with y (y_S for the focus(S) rows).
    for r in follow.rows:
        name, fy, fs, hy, hs = r
        assert fy + fs == pytest.approx(1.0, abs=2e-3) and hy + hs == pytest.approx(1.0, abs=2e-3)
        want = fs if "focus(S)" in name else fy
        assert rows[name]["flipped"] == pytest.approx(want, abs=2e-3)
        held_row = {x[0]: x for x in heldout.rows}[name]
        assert held_row[4] == pytest.approx(hs if "focus(S)" in name else hy, abs=2e-3)

    # The saved results and the measured dict say the same as the table.
    saved = json.loads((tmp_path / "fit-results.json").read_text())
    assert saved["checks"]["held"] == res.held
    for s in SPLITS:
        assert saved["table"]["sft"][s] == pytest.approx(sft[s], abs=1e-3)
        assert saved["table"]["fit:focus_s"][s] == pytest.approx(spur[s], abs=1e-3)
    assert res.measured["SFT(y) focus accuracy iid / flipped"] == f"{sft['iid']:.3f} / {sft['flipped']:.3f}"
    for k, v in verdict(saved["table"]).items():
        if k != "held":
            assert res.measured[k] == v
    steer = core["flipped"] - (1 - spur["flipped"])
    assert float(res.measured["FIT steerability on flipped"]) == pytest.approx(steer, abs=2e-3)

    # The pretrained checkpoint's rows: the probes as saved; on a split with y_S = y everywhere
    # ("high") nothing distinguishes the features, and the task-prompt row is the share answering y.
    assert pre.columns == ["probe", *SPLITS]
    assert len(pre.rows) == 3 and all(0.0 <= v <= 1.0 for r in pre.rows for v in r[1:])
    probes = saved["probes"]
    for r, key in zip(pre.rows, ("sentiment", "keyword", "task=y")):
        for s, v in zip(SPLITS, r[1:]):
            assert v == pytest.approx(probes["pretrained"][s][key], abs=1e-3)
    pf = probes["pretrained"]["flipped"]
    assert res.measured["pretrained checkpoint on flipped: sentiment task / keyword task / task prompt = y"] == (
        f"{pf['sentiment']:.3f} / {pf['keyword']:.3f} / {pf['task=y']:.3f}")
    # Before/after table: its first row is the pretrained column "flipped" of the table above, and
    # the after-SFT task-prompt share is SFT(y)'s flipped focus accuracy (same prompt, same records).
    first = forget.rows[0]
    assert first[1:] == pytest.approx([r[1 + SPLITS.index("flipped")] for r in pre.rows], abs=1e-3)
    after_sft = {r[0]: r for r in forget.rows}["after SFT(y)"]
    assert after_sft[3] == pytest.approx(sft["flipped"], abs=2e-3)
    # FIT's ∅ prompt is the task prompt, so after FIT the task-prompt share equals FIT ∅ on flipped.
    after_fit = {r[0]: r for r in forget.rows}["after FIT"]
    assert after_fit[3] == pytest.approx(rows["FIT ∅"]["flipped"], abs=2e-3)
    # Same budget for both: the training reports ran the same number of steps (no early stopping in quick).
    assert saved["train"]["sft"]["steps_run"] == saved["train"]["fit"]["steps_run"]
    assert [saved["pretrain"][k]["steps_run"] for k in ("stage1", "stage2")] == [40, 40]
    assert any("Quick mode" in n for n in res.notes)
    for f in res.figures:
        assert Path(f.path).stat().st_size > 1000
