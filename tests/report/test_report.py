"""Tests for lmforge.report: Markdown, self-contained HTML, JSON and the plot helper."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest

from lmforge.common.errors import UserError
from lmforge.report import plot_curves, write_report
from lmforge.reproduce.base import ClaimResult, Figure, Table

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def figure_png(tmp_path) -> Path:
    return plot_curves(
        tmp_path / "exp" / "curve.png",
        {"baseline": ([1, 2, 3], [1.0, 0.5, 0.25]), "method": ([1, 2, 3], [1.0, 0.3, 0.1])},
        xlabel="step",
        ylabel="loss",
        title="loss curves",
        logy=True,
    )


@pytest.fixture
def results(figure_png) -> list[ClaimResult]:
    first = ClaimResult(
        name="toy-scaling",
        title="Someone et al., ICML 2025",
        claim="Method X lowers perplexity by at least 10%.",
        paper={"ppl_baseline": 12.5, "ppl_method": 10.9},
        measured={"ppl_baseline": 31.4159, "ppl_method": 27.1828, "tokens": 4096},
        held=True,
        tables=[Table(title="Per-seed results", columns=["seed", "ppl"], rows=[[0, 27.1], [1, 27.3]])],
        figures=[Figure(path=str(figure_png), caption="Loss over training")],
        notes=["Tiny model; absolute numbers are not comparable."],
        seconds=3.25,
    )
    second = ClaimResult(
        name="toy-ood",
        title="Other et al., ICML 2025",
        claim="Y generalises out of distribution.",
        paper={"acc": 0.81},
        measured={"acc": 0.42},
        held=False,
    )
    return [first, second]


def test_plot_curves_writes_png(figure_png):
    assert figure_png.is_file()
    assert figure_png.read_bytes().startswith(PNG_MAGIC)


def test_plot_curves_rejects_bad_series(tmp_path):
    with pytest.raises(ValueError):
        plot_curves(tmp_path / "x.png", {"a": ([1, 2], [1.0])}, xlabel="x", ylabel="y", title="t")


def test_files_written(results, tmp_path):
    paths = write_report(results, tmp_path / "report")
    for key in ("markdown", "html", "json"):
        assert paths[key].is_file()
    assert paths["dir"] == tmp_path / "report"
    assert len(list(paths["figures"].glob("*.png"))) == 1
    # nothing temporary left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp", "report"]


def test_markdown_content(results, tmp_path):
    md = write_report(results, tmp_path / "r")["markdown"].read_text(encoding="utf-8")
    assert "Method X lowers perplexity by at least 10%." in md
    assert "| metric | paper | measured |" in md
    assert "| ppl_baseline | 12.5 | 31.42 |" in md
    assert "| tokens | — | 4096 |" in md
    assert "✓" in md and "✗" in md
    assert "### Per-seed results" in md and "| 1 | 27.3 |" in md
    fig_ref = re.search(r"!\[Loss over training\]\((figures/[^)]+\.png)\)", md)
    assert fig_ref and (tmp_path / "r" / fig_ref.group(1)).is_file()
    assert "Tiny model; absolute numbers are not comparable." in md
    assert "1 of 2 claims held" in md


def test_html_self_contained(results, figure_png, tmp_path):
    page = write_report(results, tmp_path / "r")["html"].read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    assert "<style>" in page
    assert 'src="http' not in page and "href=\"http" not in page
    assert "<script" not in page and "<link" not in page
    images = re.findall(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(images) == 1
    decoded = base64.b64decode(images[0])
    assert decoded.startswith(PNG_MAGIC)
    assert decoded == figure_png.read_bytes()
    assert "Method X lowers perplexity by at least 10%." in page
    assert "31.42" in page and "12.5" in page


def test_json_round_trip(results, tmp_path):
    data = json.loads(write_report(results, tmp_path / "r")["json"].read_text(encoding="utf-8"))
    assert data == [r.to_json() for r in results]
    for item in data:
        assert {"name", "claim", "paper", "measured", "held"} <= set(item)
    assert data[0]["measured"]["ppl_method"] == 27.1828
    assert data[1]["held"] is False


def test_existing_dir_refused_then_replaced(results, tmp_path):
    out = tmp_path / "r"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with pytest.raises(UserError, match="already exists"):
        write_report(results, out)
    assert (out / "old.txt").is_file()
    write_report(results, out, overwrite=True)
    assert not (out / "old.txt").exists()
    assert (out / "report.html").is_file()


def test_html_escapes_text(tmp_path):
    r = ClaimResult(
        name="esc",
        title="A <i>title</i>",
        claim="Bold <b>& claim",
        paper={"m<1>": "x & y"},
        measured={"m<1>": "<script>alert(1)</script>"},
        held=True,
        tables=[Table(title="t<>", columns=["c&"], rows=[["<td>"]])],
        notes=["note <u>"],
    )
    paths = write_report([r], tmp_path / "r", title="Report <&>")
    page = paths["html"].read_text(encoding="utf-8")
    assert "Bold &lt;b&gt;&amp; claim" in page
    assert "<b>" not in page and "<script>" not in page and "<u>" not in page and "<i>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<title>Report &lt;&amp;&gt;</title>" in page
    md = paths["markdown"].read_text(encoding="utf-8")
    assert "Bold <b>& claim" in md


def test_missing_figure_is_reported_not_fatal(tmp_path):
    r = ClaimResult(
        name="nofig", title="t", claim="c", paper={}, measured={}, held=True,
        figures=[Figure(path=str(tmp_path / "gone.png"), caption="gone")],
    )
    paths = write_report([r], tmp_path / "r")
    assert "Figure missing" in paths["markdown"].read_text(encoding="utf-8")
    assert "Figure missing" in paths["html"].read_text(encoding="utf-8")
    assert "<img" not in paths["html"].read_text(encoding="utf-8")


def test_markdown_table_cells_escape_pipes(tmp_path):
    r = ClaimResult(name="p", title="t", claim="c", paper={"a|b": 1}, measured={"a|b": "x\ny"}, held=False)
    md = write_report([r], tmp_path / "r")["markdown"].read_text(encoding="utf-8")
    assert "| a\\|b | 1 | x<br>y |" in md
