"""Render reproduction results as a report folder: Markdown, one self-contained HTML page and JSON.

``write_report`` writes, atomically (the folder appears complete or not at all)::

    OUT/report.md      Markdown; figures referenced as figures/NAME.png
    OUT/report.html    one page: CSS inline, figures embedded as data: URIs, no scripts, no external links
    OUT/results.json   [ClaimResult.to_json(), ...]
    OUT/figures/       copies of every figure

``plot_curves`` is the small plotting helper experiments use to make those figures.
"""

from __future__ import annotations

import base64
import html
import json
import mimetypes
import math
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lmforge.common.io import atomic_dir, atomic_write_json, atomic_write_text
from lmforge.reproduce.base import ClaimResult, Table

__all__ = ["plot_curves", "write_report"]

_MISSING = "—"
_HELD = "✓"
_NOT_HELD = "✗"

_CSS = """
body { font-family: -apple-system, BlinkMacSystemFont, "Segoe UI", Helvetica, Arial, sans-serif;
       max-width: 60rem; margin: 2rem auto; padding: 0 1rem; color: #1f2328; line-height: 1.5; }
h1 { border-bottom: 2px solid #d0d7de; padding-bottom: .3rem; }
h2 { border-bottom: 1px solid #d0d7de; padding-bottom: .2rem; margin-top: 2.5rem; }
h3 { margin-top: 1.5rem; }
table { border-collapse: collapse; margin: .8rem 0; }
th, td { border: 1px solid #d0d7de; padding: .3rem .7rem; text-align: left; vertical-align: top; }
th { background: #f6f8fa; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.held { color: #1a7f37; font-weight: 600; }
.not-held { color: #cf222e; font-weight: 600; }
.claim { background: #f6f8fa; border-left: 4px solid #8c959f; padding: .5rem 1rem; margin: .8rem 0; }
figure { margin: 1rem 0; }
figure img { max-width: 100%; border: 1px solid #d0d7de; }
figcaption { color: #57606a; font-size: .9rem; }
.missing { color: #cf222e; }
.meta { color: #57606a; font-size: .9rem; }
"""


# ---------------------------------------------------------------- formatting helpers


def _fmt(value: Any) -> str:
    """A short, readable string for a table cell."""
    if value is None:
        return _MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        return f"{value:.4g}"
    if isinstance(value, int | str):
        return str(value)
    if isinstance(value, list | tuple | dict):
        return json.dumps(value, default=str, ensure_ascii=False)
    try:  # numpy / torch scalars
        item = value.item()
    except (AttributeError, ValueError, TypeError):
        return str(value)
    return _fmt(item)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _md_cell(value: Any) -> str:
    text = value if isinstance(value, str) else _fmt(value)
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\r", "").replace("\n", "<br>")


def _md_table(columns: Sequence[Any], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(_md_cell(str(c)) for c in columns) + " |"]
    lines.append("|" + "|".join(" --- " for _ in columns) + "|")
    for row in rows:
        cells = list(row) + [""] * (len(columns) - len(row))
        lines.append("| " + " | ".join(_md_cell(c) for c in cells) + " |")
    return lines


def _esc(value: Any) -> str:
    return html.escape(value if isinstance(value, str) else _fmt(value), quote=True)


def _html_table(columns: Sequence[Any], rows: Sequence[Sequence[Any]], cls: str = "") -> str:
    head = "".join(f"<th>{_esc(str(c))}</th>" for c in columns)
    body = []
    for row in rows:
        cells = list(row) + [""] * (len(columns) - len(row))
        tds = "".join(
            f'<td class="num">{_esc(c)}</td>' if _is_number(c) else f"<td>{_esc(c)}</td>" for c in cells
        )
        body.append(f"<tr>{tds}</tr>")
    cls_attr = f' class="{cls}"' if cls else ""
    return f"<table{cls_attr}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _metric_rows(result: ClaimResult) -> list[list[Any]]:
    """Rows ``metric | paper | measured``: the paper's metrics first, then any measured-only ones."""
    keys = list(result.paper) + [k for k in result.measured if k not in result.paper]
    return [[k, result.paper.get(k), result.measured.get(k)] for k in keys]


def _held_text(held: bool) -> str:
    return f"{_HELD} held" if held else f"{_NOT_HELD} did not hold"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "item"


# ---------------------------------------------------------------- figures


class _Fig:
    """A figure as placed in the report folder."""

    def __init__(self, caption: str, source: Path, rel: str | None):
        self.caption = caption
        self.source = source
        self.rel = rel  # "figures/NAME" or None when the source file is missing

    def data_uri(self, root: Path) -> str:
        assert self.rel is not None
        path = root / self.rel
        mime = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode('ascii')}"


def _copy_figures(results: Sequence[ClaimResult], root: Path) -> list[list[_Fig]]:
    fig_dir = root / "figures"
    used: set[str] = set()
    out: list[list[_Fig]] = []
    for r in results:
        figs = []
        for i, fig in enumerate(r.figures, start=1):
            src = Path(fig.path).expanduser()
            if not src.is_file():
                figs.append(_Fig(fig.caption, src, None))
                continue
            name = _slug(f"{r.name}-{i}-{src.name}")
            while name in used:
                name = "_" + name
            used.add(name)
            fig_dir.mkdir(exist_ok=True)
            shutil.copyfile(src, fig_dir / name)
            figs.append(_Fig(fig.caption, src, f"figures/{name}"))
        out.append(figs)
    return out


# ---------------------------------------------------------------- Markdown


def _markdown(results: Sequence[ClaimResult], figures: list[list[_Fig]], title: str) -> str:
    lines = [f"# {title}", ""]
    held = sum(bool(r.held) for r in results)
    lines += [f"{held} of {len(results)} claims held (each under the condition its section states).", ""]
    if results:
        lines += _md_table(
            ["reproduction", "paper", "held", "seconds"],
            [[r.name, r.title, _HELD if r.held else _NOT_HELD, f"{r.seconds:.1f}"] for r in results],
        )
        lines.append("")
    for r, figs in zip(results, figures, strict=True):
        lines += [f"## {r.name}: {r.title}", ""]
        lines += [f"**Claim.** {r.claim}", ""]
        lines += [f"**Result:** {_held_text(r.held)}.", ""]
        lines += _md_table(["metric", "paper", "measured"], _metric_rows(r))
        lines.append("")
        for t in r.tables:
            lines += _md_extra_table(t)
        for f in figs:
            if f.rel is None:
                lines += [f"*Figure missing: `{f.source}` ({f.caption})*", ""]
            else:
                alt = f.caption.replace("[", "(").replace("]", ")").replace("\n", " ")
                lines += [f"![{alt}]({f.rel})", "", f"*{f.caption}*", ""]
        if r.notes:
            lines += ["**Notes**", ""]
            lines += [f"- {n}" for n in r.notes]
            lines.append("")
        lines += [f"_Ran in {r.seconds:.1f} s._", ""]
    return "\n".join(lines).rstrip() + "\n"


def _md_extra_table(t: Table) -> list[str]:
    return [f"### {t.title}", "", *_md_table(t.columns, t.rows), ""]


# ---------------------------------------------------------------- HTML


def _html(results: Sequence[ClaimResult], figures: list[list[_Fig]], title: str, root: Path) -> str:
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_esc(title)}</title>",
        f"<style>{_CSS}</style>",
        "</head><body>",
        f"<h1>{_esc(title)}</h1>",
    ]
    held = sum(bool(r.held) for r in results)
    parts.append(f'<p class="meta">{held} of {len(results)} claims held (each under the condition its section states).</p>')
    if results:
        rows = []
        for r in results:
            cls = "held" if r.held else "not-held"
            mark = _HELD if r.held else _NOT_HELD
            rows.append(
                f'<tr><td><a href="#{_esc(_slug(r.name))}">{_esc(r.name)}</a></td><td>{_esc(r.title)}</td>'
                f'<td class="{cls}">{mark}</td><td class="num">{r.seconds:.1f}</td></tr>'
            )
        parts.append(
            "<table><thead><tr><th>reproduction</th><th>paper</th><th>held</th><th>seconds</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>"
        )
    for r, figs in zip(results, figures, strict=True):
        cls = "held" if r.held else "not-held"
        parts.append(f'<section id="{_esc(_slug(r.name))}">')
        parts.append(f"<h2>{_esc(r.name)}: {_esc(r.title)}</h2>")
        parts.append(f'<p class="claim"><strong>Claim.</strong> {_esc(r.claim)}</p>')
        parts.append(f'<p><strong>Result:</strong> <span class="{cls}">{_esc(_held_text(r.held))}</span>.</p>')
        parts.append(_html_table(["metric", "paper", "measured"], _metric_rows(r), cls="metrics"))
        for t in r.tables:
            parts.append(f"<h3>{_esc(t.title)}</h3>")
            parts.append(_html_table(t.columns, t.rows))
        for f in figs:
            if f.rel is None:
                parts.append(f'<p class="missing">Figure missing: {_esc(str(f.source))} ({_esc(f.caption)})</p>')
            else:
                parts.append(
                    f'<figure><img src="{f.data_uri(root)}" alt="{_esc(f.caption)}">'
                    f"<figcaption>{_esc(f.caption)}</figcaption></figure>"
                )
        if r.notes:
            parts.append("<h3>Notes</h3><ul>" + "".join(f"<li>{_esc(n)}</li>" for n in r.notes) + "</ul>")
        parts.append(f'<p class="meta">Ran in {r.seconds:.1f} s.</p>')
        parts.append("</section>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


# ---------------------------------------------------------------- public API


def write_report(
    results: list[ClaimResult],
    out_dir: str | Path,
    *,
    title: str = "lmforge report",
    overwrite: bool = False,
) -> dict[str, Path]:
    """Write a report folder for ``results``.

    Args:
        results: the reproductions' results, in report order.
        out_dir: the report folder; it must not exist unless ``overwrite`` is on.
        title: the report's heading.
        overwrite: replace an existing ``out_dir`` (atomically, only once the new report is complete).

    Returns:
        Final paths: ``{"dir", "markdown", "html", "json", "figures"}``. ``figures`` is the figures
        folder; it exists only when some result has a figure. A figure whose file is missing is
        reported as missing in the report rather than failing the whole report.

    Raises:
        UserError: ``out_dir`` exists and ``overwrite`` is off.
    """
    final = Path(out_dir)
    with atomic_dir(final, overwrite=overwrite) as tmp:
        figures = _copy_figures(results, tmp)
        atomic_write_text(tmp / "report.md", _markdown(results, figures, title))
        atomic_write_text(tmp / "report.html", _html(results, figures, title, tmp))
        atomic_write_json(tmp / "results.json", [r.to_json() for r in results])
    return {
        "dir": final,
        "markdown": final / "report.md",
        "html": final / "report.html",
        "json": final / "results.json",
        "figures": final / "figures",
    }


def plot_curves(
    path: str | Path,
    series: dict[str, tuple[Sequence[float], Sequence[float]]],
    *,
    xlabel: str,
    ylabel: str,
    title: str,
    logy: bool = False,
) -> Path:
    """Plot one line per series and save a PNG (dpi 120).

    Uses matplotlib's Agg canvas directly (no pyplot), so it works headless, changes no global
    backend and leaks no open figures.

    Args:
        path: output PNG; parent folders are created.
        series: ``{label: (xs, ys)}``; each series needs as many xs as ys.
        xlabel, ylabel, title: axis labels and title.
        logy: logarithmic y axis.

    Returns:
        ``path`` as a Path.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path = Path(path)
    if not series:
        raise ValueError("plot_curves needs at least one series")
    fig = Figure(figsize=(6.0, 4.0))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for label, (xs, ys) in series.items():
        xs, ys = list(xs), list(ys)
        if len(xs) != len(ys):
            raise ValueError(f"series {label!r} has {len(xs)} x values but {len(ys)} y values")
        ax.plot(xs, ys, marker="o" if len(xs) <= 20 else None, markersize=3, label=str(label))
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if len(series) > 1 or next(iter(series)):
        ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, format="png")
    return path
