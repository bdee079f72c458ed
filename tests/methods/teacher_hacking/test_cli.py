"""``lmforge align teacher-hacking`` in-process: a tiny run writes curves.json whose numbers agree with
each other and with the detector recomputed from the curve; user errors exit 2 with one line."""

from __future__ import annotations

import json

from lmforge.methods.teacher_hacking.detector import detect_deviation
from tests.cli.helpers import call


def test_teacher_hacking_command_writes_curves(monkeypatch, capsys, tmp_path) -> None:
    out = tmp_path / "th"
    code, stdout, err = call(monkeypatch, capsys, "align", "teacher-hacking", "--out", str(out), "--regimes",
                             "offline", "--steps", "40", "--n-prompts", "40", "--teacher-data", "100", "--teacher-steps", "30",
                             "--eval-prompts", "32", "--json")
    assert code == 0, err
    payload = json.loads(stdout)
    saved = json.loads((out / "curves.json").read_text())
    assert saved["runs"][0]["regime"] == "offline" and (out / "proxy_vs_golden.png").stat().st_size > 1000
    run = saved["runs"][0]
    curve = run["curve"]
    assert curve["steps"][0] == 0 and curve["steps"][-1] == 40 and len(curve["train_loss"]) == 40
    assert run["golden_min"] == min(curve["golden"]) and run["proxy_end"] == curve["proxy"][-1]
    assert run["detector_fired"] == detect_deviation(curve["steps"], curve["proxy"]).fired
    assert payload["setup"]["teacher_golden"] == saved["setup"]["teacher_golden"] > 0

    code, _, err = call(monkeypatch, capsys, "align", "teacher-hacking", "--out", str(out), "--steps", "40")
    assert code == 2 and "already exists" in err


def test_teacher_hacking_command_rejects_bad_options(monkeypatch, capsys, tmp_path) -> None:
    code, _, err = call(monkeypatch, capsys, "align", "teacher-hacking", "--out", str(tmp_path / "a"), "--regimes",
                        "offline,sideways")
    assert code == 2 and "sideways" in err
    code, _, err = call(monkeypatch, capsys, "align", "teacher-hacking", "--out", str(tmp_path / "b"), "--loss", "tv")
    assert code == 2 and "loss" in err
