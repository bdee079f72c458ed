"""`lmforge reproduce zoo --quick`: JSON fields, the report files, and an honest `held`."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from lmforge.cli import app


def test_reproduce_zoo_quick_json_and_report(tmp_path, nano_dir):
    res = CliRunner().invoke(app, ["reproduce", "zoo", "--quick", "--json", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert {"name", "claim", "paper", "measured", "held"} <= set(data)
    assert data["name"] == "zoo" and isinstance(data["held"], bool)
    # `held` is recomputed here from the curves the build wrote, not trusted.
    losses = [loss for _, _, loss in json.loads((nano_dir / "curves.json").read_text())["losses"]]
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    assert data["held"] == (last < 0.8 * first)
    assert abs(data["measured"]["loss_first10"] - first) < 1e-4
    report = tmp_path / "zoo"
    assert (report / "report.md").is_file() and (report / "report.html").is_file()
    md = (report / "report.md").read_text()
    assert "toolcall_exact_match" in md and data["claim"] in md
    assert len(list((report / "figures").glob("*.png"))) >= 3
    assert json.loads((report / "results.json").read_text())[0]["name"] == "zoo"
