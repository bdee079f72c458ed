"""``lmforge reproduce fit --quick``: the verdict is the stated condition recomputed from the table, the
tables agree with each other and with the saved results, and the figures are written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmforge.reproduce.base import ReproduceOptions, get
from lmforge.reproduce.fit import COLLAPSE_DROP, HOLD_MARGIN, HOLD_MIN, SPLITS, TRACK_MIN, verdict


def _key(row_name: str) -> str:
    from lmforge.methods.fit.data import FOCUS_SYMBOLS

    sym = row_name.removeprefix("FIT ")
    return "fit:" + next(k for k, v in FOCUS_SYMBOLS.items() if v == sym)


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
    main, heldout, follow, control = res.tables
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
    crow = {r[0]: r for r in control.rows}
    steer_main = core["flipped"] - (1 - spur["flipped"])
    steer_ctrl = crow["FIT focus(C)+ignore(S)"][4] - (1 - crow["FIT focus(S)"][4])
    got = [float(x) for x in res.measured["FIT steerability on flipped, XOR core / control"].split(" / ")]
    assert got == pytest.approx([steer_main, steer_ctrl], abs=2e-3)
    assert res.measured["control (one-token core), flipped: SFT(y) / FIT focus(C)+ignore(S) / FIT focus(S)"] == (
        f"{crow['SFT(y), plain prompt'][4]:.3f} / {crow['FIT focus(C)+ignore(S)'][4]:.3f} / "
        f"{crow['FIT focus(S)'][4]:.3f}")
    for name, r in crow.items():
        assert r[4] == pytest.approx(saved["control"]["table"]["sft" if name.startswith("SFT") else
                                                               _key(name)]["flipped"], abs=1e-3)
    assert any("Quick mode" in n for n in res.notes)
    for f in res.figures:
        assert Path(f.path).stat().st_size > 1000
