"""``lmforge reproduce fit --quick``: per arm (clean and ambiguous core) the verdict is
the stated condition recomputed from the table, the tables (focus accuracy, the pretrained
checkpoint's probes before and after fine-tuning) agree with each other and with the saved results,
and the figures are written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmforge.reproduce.base import ReproduceOptions, get
from lmforge.reproduce.fit import ARMS, COLLAPSE_DROP, HOLD_MARGIN, HOLD_MIN, SPLITS, TRACK_MIN, verdict


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
    *mains, heldout, follow, pre, forget = res.tables
    assert len(mains) == len(ARMS)
    saved = json.loads((tmp_path / "fit-results.json").read_text())
    assert list(saved["arms"]) == list(ARMS)
    any_held = False
    for main, (arm, amb) in zip(mains, ARMS.items()):
        assert main.columns == ["method", *SPLITS] and arm in main.title
        rows = {r[0]: dict(zip(SPLITS, r[1:])) for r in main.rows}
        sft, core, spur = rows["SFT(y), plain prompt"], rows["FIT focus(C)+ignore(S)"], rows["FIT focus(S)"]
        # The arm's verdict is the condition stated in the module, recomputed from the table.
        expected = (sft["iid"] - sft["flipped"] >= COLLAPSE_DROP - 1e-9
                    and core["flipped"] >= HOLD_MIN and core["flipped"] >= sft["flipped"] + HOLD_MARGIN - 1e-9
                    and spur["flipped"] >= TRACK_MIN)
        a = saved["arms"][arm]
        assert a["checks"]["held"] == expected
        any_held |= expected
        # The arm's training set has the stated share of ambiguous texts (binomial, 800 records).
        assert a["ambiguity"] == amb and abs(a["ambiguous_share"] - amb) < 5 * (amb * (1 - amb) / 800) ** 0.5 + 1e-9

        # Flipped split, binary labels, y != y_S on every record: agreement with y and with y_S sum to 1,
        # and focus accuracy is agreement with y (y_S for the focus(S) rows).
        follow_rows = {r[0]: r for r in follow.rows if r[0].startswith(f"{arm}: ")}
        held_rows = {r[0]: r for r in heldout.rows if r[0].startswith(f"{arm}: ")}
        assert len(follow_rows) == len(held_rows) == len(rows)
        for name in rows:
            _, fy, fs, hy, hs = follow_rows[f"{arm}: {name}"]
            assert fy + fs == pytest.approx(1.0, abs=2e-3) and hy + hs == pytest.approx(1.0, abs=2e-3)
            assert rows[name]["flipped"] == pytest.approx(fs if "focus(S)" in name else fy, abs=2e-3)
            assert held_rows[f"{arm}: {name}"][4] == pytest.approx(hs if "focus(S)" in name else hy, abs=2e-3)

        # The saved results and the measured dict say the same as the table.
        for s in SPLITS:
            assert a["table"]["sft"][s] == pytest.approx(sft[s], abs=1e-3)
            assert a["table"]["fit:focus_s"][s] == pytest.approx(spur[s], abs=1e-3)
        assert res.measured[f"[{arm}] SFT(y) focus accuracy iid / flipped"] == f"{sft['iid']:.3f} / {sft['flipped']:.3f}"
        for k, v in verdict(a["table"]).items():
            if k != "held":
                assert res.measured[f"[{arm}] {k}"] == v
        steer = core["flipped"] - (1 - spur["flipped"])
        assert float(res.measured[f"[{arm}] FIT steerability on flipped"]) == pytest.approx(steer, abs=2e-3)
        added = float(res.measured[f"[{arm}] FIT focus(C)+ignore(S) minus FIT ∅ on flipped (what the instruction adds)"])
        assert added == pytest.approx(core["flipped"] - rows["FIT ∅"]["flipped"], abs=2e-3)

        # Before/after table: the after-SFT task-prompt share is SFT(y)'s flipped focus accuracy (same
        # prompt, same records); FIT's ∅ prompt is the task prompt, so after FIT it equals FIT ∅ on flipped.
        forget_rows = {r[0]: r for r in forget.rows}
        assert forget_rows[f"{arm}: after SFT(y)"][3] == pytest.approx(sft["flipped"], abs=2e-3)
        assert forget_rows[f"{arm}: after FIT"][3] == pytest.approx(rows["FIT ∅"]["flipped"], abs=2e-3)
        # Same budget for both: the training reports ran the same number of steps (no early stopping in quick).
        assert a["train"]["sft"]["steps_run"] == a["train"]["fit"]["steps_run"]
    assert res.held == any_held == saved["held"] == res.measured["all three checks in one arm"]

    # The pretrained checkpoint's rows: the probes as saved.
    assert pre.columns == ["probe", *SPLITS]
    assert len(pre.rows) == 3 and all(0.0 <= v <= 1.0 for r in pre.rows for v in r[1:])
    probes = saved["probes_pretrained"]
    for r, key in zip(pre.rows, ("sentiment", "keyword", "task=y")):
        for s, v in zip(SPLITS, r[1:]):
            assert v == pytest.approx(probes[s][key], abs=1e-3)
    pf = probes["flipped"]
    assert res.measured["pretrained checkpoint on flipped: sentiment task / keyword task / task prompt = y"] == (
        f"{pf['sentiment']:.3f} / {pf['keyword']:.3f} / {pf['task=y']:.3f}")
    # The before/after table's first row is the pretrained column "flipped" of the table above.
    assert forget.rows[0][1:] == pytest.approx([r[1 + SPLITS.index("flipped")] for r in pre.rows], abs=1e-3)
    assert [saved["pretrain"][k]["steps_run"] for k in ("stage1", "stage2")] == [40, 40]
    assert any("Quick mode" in n for n in res.notes)
    assert len(res.figures) == len(ARMS)
    for f in res.figures:
        assert Path(f.path).stat().st_size > 1000


def test_real_model_verdict_needs_two_of_three_seeds():
    from lmforge.reproduce.fit import REAL_MIN_SEEDS, REAL_SEEDS, real_verdict

    assert (REAL_MIN_SEEDS, REAL_SEEDS) == (2, 3)
    ok, bad = {"held": True}, {"held": False}
    assert real_verdict([ok, ok, bad]) == {"seeds held": 2, "seeds": 3, "held": True}
    assert not real_verdict([ok, bad, bad])["held"]
    assert real_verdict([ok, ok, ok])["seeds held"] == 3
