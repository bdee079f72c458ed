"""The ACBench report as a user sees it: rendered by headless Chromium (Debian's ``chromium``).

Slow (a small benchmark run plus two browser starts). Needs ``/usr/bin/chromium``
(``apt-get install chromium``); skipped without it.
"""

from __future__ import annotations

import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# The flags this machine's closed network needs (see the env notes): no background connections.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--window-size=1280,4000"]


class _Dom(HTMLParser):
    """Counts what the rendered DOM holds: tables by class, rows, images and their sources."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[str] = []
        self.rows = 0
        self.images: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "table":
            self.tables.append(a.get("class") or "")
        elif tag == "tr":
            self.rows += 1
        elif tag == "img":
            self.images.append(a.get("src") or "")


def _chromium(args: list[str], profile: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True,
                          timeout=120, check=True)


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")
def test_report_renders_tables_and_figures_in_chromium(tmp_path: Path) -> None:
    import numpy as np
    from PIL import Image

    from lmforge.bench.acbench import BenchOptions, run_acbench

    out = tmp_path / "run"
    run_acbench(BenchOptions(
        models=["zoo:agent-small"], out=out, compress=["magnitude:sparsity=0.5"],
        tasks=["worfbench", "teval_instruct", "niah", "blocksworld"], limit=4, progress=False, calib_samples=8,
        calib_seq_len=128, max_steps=4, analysis_texts=4, builtin_sizes={"worfbench": 4, "teval_instruct": 2,
                                                                          "niah": 8, "blocksworld": 4},
    ))
    url = (out / "report.html").resolve().as_uri()

    dom = _Dom()
    dom.feed(_chromium(["--dump-dom", url], tmp_path / "profile1").stdout)
    classes = " ".join(dom.tables)
    for cls in ("summary", "capability workflow", "capability tool_use", "capability long_context",
                "capability real_world", "analysis"):
        assert cls in classes, f"table {cls!r} missing from the rendered page"
    assert dom.rows > 30
    # Two NIAH heatmaps (original, pruned), the energy histograms and the ERank plot, all inline PNGs.
    assert len(dom.images) == 4 and all(src.startswith("data:image/png;base64,") for src in dom.images)

    shot = tmp_path / "shot.png"
    _chromium([f"--screenshot={shot}", url], tmp_path / "profile2")
    img = np.asarray(Image.open(shot).convert("RGB")).astype(float) / 255
    # The page is not blank, and the figures were decoded and painted: count saturated pixels
    # (heatmap greens/reds, histogram blues/oranges); text and table borders are grey.
    mx, mn = img.max(-1), img.min(-1)
    saturated = ((mx - mn) / np.maximum(mx, 1e-6) > 0.4) & (mx > 0.2)
    assert (img.mean(-1) < 0.9).mean() > 0.01, "the page rendered (nearly) blank"
    assert saturated.sum() > 20_000, f"only {saturated.sum()} coloured pixels: figures did not render"
