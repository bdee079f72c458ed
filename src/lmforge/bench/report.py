"""The ACBench report: what a user reads after ``lmforge bench acbench``.

Written next to ``results.json``::

    report.html   one page, CSS inline, figures embedded as data: URIs
    report.md     the same tables in Markdown, figures referenced as figures/*.png
    figures/      NIAH heatmaps, energy histograms, ERank per layer

Sections per model: the mean relative change per capability; one table per capability with each
task's headline metric and its relative change against the original; the answer NLL and KL beside
them; LongBench length buckets; AgentBoard progress/success/grounding; the NIAH heatmaps; the analysis
metrics (ERank, top-k ranking agreement, energy).
"""

from __future__ import annotations

import base64
import math
from pathlib import Path
from typing import Any

from lmforge.bench.tasks import CAPABILITIES
from lmforge.common.io import atomic_write_text
from lmforge.report.render import _CSS, _esc, _html_table, _md_table

__all__ = ["write_report"]

_EXTRA_CSS = "\n.scroll { overflow-x: auto; }\n"
_CAP_TITLES = {"workflow": "Workflow", "tool_use": "Tool use", "long_context": "Long context", "real_world": "Real world"}


def _pct(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{100 * x:+.1f}%"


def _num(x: Any, digits: int = 3) -> str:
    if x is None:
        return "—"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in text).strip("_")


def _save(fig: Any, path: Path) -> Path:
    """Lay out and write a matplotlib Figure (Agg canvas, no pyplot) as PNG."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, format="png")
    return path


def _figure_niah(cells: list[dict[str, Any]], path: Path, title: str) -> Path | None:
    rows = [r for c in cells for r in c["per_item"]]
    if not rows or "meta_length" not in rows[0]:
        return None
    from matplotlib.figure import Figure

    lengths = sorted({r["meta_length"] for r in rows})
    depths = sorted({r["meta_depth"] for r in rows})
    grid = [[math.nan] * len(lengths) for _ in depths]
    for r in rows:
        grid[depths.index(r["meta_depth"])][lengths.index(r["meta_length"])] = r["score"]
    fig = Figure(figsize=(1.2 + 0.9 * len(lengths), 1.0 + 0.45 * len(depths)))
    ax = fig.add_subplot(1, 1, 1)
    im = ax.imshow(grid, vmin=0, vmax=10, cmap="RdYlGn", aspect="auto", origin="upper")
    ax.set_xticks(range(len(lengths)), [str(n) for n in lengths])
    ax.set_yticks(range(len(depths)), [f"{d}%" for d in depths])
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("needle depth")
    ax.set_title(title, fontsize=9)
    for i in range(len(depths)):
        for j in range(len(lengths)):
            if not math.isnan(grid[i][j]):
                ax.text(j, i, f"{grid[i][j]:.1f}", ha="center", va="center", fontsize=7)
    fig.colorbar(im, ax=ax, label="10 x ROUGE-1 F")
    return _save(fig, path)


def capability_change_grid(by_setting: dict[str, Any], settings: list[str], caps: list[str]) -> list[list[float]]:
    """Relative change per (compressed setting, capability), NaN where the original is at 0."""
    grid = []
    for s in settings:
        row = []
        for c in caps:
            v = by_setting.get(s, {}).get("capabilities", {}).get(c)
            row.append(math.nan if v is None or v.get("relative") is None else float(v["relative"]))
        grid.append(row)
    return grid


def _figure_capability_heatmap(by_setting: dict[str, Any], settings: list[str], caps: list[str], path: Path,
                               title: str) -> Path | None:
    """Capability x setting heatmap of the relative change against the original (diverging colours)."""
    if not settings or not caps:
        return None
    from matplotlib.figure import Figure

    grid = capability_change_grid(by_setting, settings, caps)
    finite = [abs(x) for row in grid for x in row if not math.isnan(x)]
    lim = max([0.05, *finite])
    fig = Figure(figsize=(2.2 + 1.5 * len(caps), 1.0 + 0.5 * len(settings)))
    ax = fig.add_subplot(1, 1, 1)
    im = ax.imshow(grid, vmin=-lim, vmax=lim, cmap="RdBu", aspect="auto")
    ax.set_xticks(range(len(caps)), [_CAP_TITLES[c] for c in caps], fontsize=8)
    ax.set_yticks(range(len(settings)), settings, fontsize=8)
    ax.set_title(title, fontsize=9)
    for i, row in enumerate(grid):
        for j, x in enumerate(row):
            ax.text(j, i, "at floor" if math.isnan(x) else f"{100 * x:+.1f}%", ha="center", va="center", fontsize=7)
    fig.colorbar(im, ax=ax, label="relative change vs original")
    return _save(fig, path)


def _figure_energy(analysis: dict[str, dict[str, Any]], path: Path, title: str) -> Path | None:
    if not analysis:
        return None
    from matplotlib.figure import Figure

    n = len(analysis)
    fig = Figure(figsize=(4.0 * min(n, 3), 3.2 * math.ceil(n / 3)))
    for k, (label, a) in enumerate(analysis.items()):
        ax = fig.add_subplot(math.ceil(n / 3), min(n, 3), k + 1)
        e = a["energy"]
        edges = e["edges"]
        centers = [(edges[i] + edges[i + 1]) / 2 for i in range(len(edges) - 1)]
        width = edges[1] - edges[0]
        ax.bar(centers, e["original"], width=width, alpha=0.5, label="original")
        ax.bar(centers, e["compressed"], width=width, alpha=0.5, label=label)
        ax.set_xlabel("energy  -logsumexp(z)")
        ax.set_ylabel("positions")
        ax.set_title(label, fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def _figure_erank(analysis: dict[str, dict[str, Any]], path: Path, title: str) -> Path | None:
    if not analysis:
        return None
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.0, 4.0))
    ax = fig.add_subplot(1, 1, 1)
    first = next(iter(analysis.values()))["erank"]["original"]
    layers = list(range(len(first)))
    ax.plot(layers, first, marker="o", color="black", label="original")
    for label, a in analysis.items():
        ax.plot(layers, a["erank"]["compressed"], marker="o", markersize=3, label=label)
    ax.set_xticks(layers)
    ax.set_xlabel("hidden-state layer (0 = embeddings)")
    ax.set_ylabel("ERank")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


class _Doc:
    """Builds the HTML and Markdown side by side."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.html: list[str] = []
        self.md: list[str] = []

    def heading(self, level: int, text: str, anchor: str | None = None) -> None:
        aid = f' id="{_esc(anchor)}"' if anchor else ""
        self.html.append(f"<h{level}{aid}>{_esc(text)}</h{level}>")
        self.md += ["", "#" * level + " " + text, ""]

    def para(self, text: str, cls: str = "") -> None:
        c = f' class="{cls}"' if cls else ""
        self.html.append(f"<p{c}>{_esc(text)}</p>")
        self.md += [text, ""]

    def table(self, columns: list[str], rows: list[list[Any]], cls: str = "") -> None:
        self.html.append(f'<div class="scroll">{_html_table(columns, rows, cls=cls)}</div>')
        self.md += _md_table(columns, rows) + [""]

    def figure(self, path: Path | None, caption: str) -> None:
        if path is None:
            return
        data = base64.b64encode(path.read_bytes()).decode()
        self.html.append(f'<figure><img src="data:image/png;base64,{data}" alt="{_esc(caption)}">'
                         f"<figcaption>{_esc(caption)}</figcaption></figure>")
        self.md += [f"![{caption}]({path.relative_to(self.root).as_posix()})", ""]


def write_report(data: dict[str, Any], out: Path, title: str = "ACBench: agent capabilities under compression") -> Path:
    """Write ``report.html``, ``report.md`` and ``figures/`` for a results dict; returns the HTML path."""
    from lmforge.bench.acbench import ORIGINAL, summarize

    out = Path(out)
    figs = out / "figures"
    doc = _Doc(out)
    header = data["header"]
    summary = summarize(data)
    doc.html += ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
                 '<meta name="viewport" content="width=device-width, initial-scale=1">',
                 f"<title>{_esc(title)}</title>", f"<style>{_CSS}{_EXTRA_CSS}</style>", "</head><body>"]
    doc.heading(1, title)
    n_cells = len(data["cells"])
    n_total = len(header["models"]) * len(header["settings"]) * len(header["tasks"])
    doc.para(f"{n_cells} of {n_total} cells finished. Settings: {', '.join(header['settings'])}. "
             f"Tasks: {', '.join(header['tasks'])}. Prompt format: {header['prompt_format']}; "
             f"limit per task: {header['limit'] or 'all'}; embedder: {header['embedder']}.", cls="meta")
    doc.para("Relative change = (compressed - original) / original on the task's headline metric; "
             "answer NLL is the mean negative log-likelihood (nats/token) of the gold completion and KL "
             "the mean KL(original || compressed) over those tokens, so damage shows even where "
             "exact-match scores do not move.", cls="meta")
    cells = list(data["cells"].values())
    for model in header["models"]:
        by_setting = summary.get(model, {})
        mslug = _slug(model)
        doc.heading(2, f"Model {model}", anchor=f"model-{mslug}")
        # Capability summary.
        caps = [c for c in CAPABILITIES if any(c in e["capabilities"] for e in by_setting.values())]
        rows = []
        for s in header["settings"]:
            if s not in by_setting:
                continue
            capv = by_setting[s]["capabilities"]
            row: list[Any] = [s]
            for c in caps:
                v = capv.get(c)
                row.append("—" if v is None else _num(v["score"]) if s == ORIGINAL else f"{_num(v['score'])} ({_pct(v['relative'])})")
            rows.append(row)
        if rows:
            doc.heading(3, "Capability scores and relative change against the original")
            doc.para("Capability score = mean of its tasks' headline metrics on a 0-1 scale (NIAH / 10).", cls="meta")
            doc.table(["setting"] + [_CAP_TITLES[c] for c in caps], rows, cls="summary")
            compressed = [s for s in header["settings"] if s in by_setting and s != ORIGINAL]
            doc.figure(_figure_capability_heatmap(by_setting, compressed, caps, figs / f"capabilities-{mslug}.png",
                                                  f"{model}: relative change per capability"),
                       "Relative change of each capability score against the original (blue: better, red: "
                       "worse; 'at floor': the original scores 0, so no relative change exists).")
        # One table per capability: tasks as rows, settings as columns.
        settings = [s for s in header["settings"] if s in by_setting]
        for cap in CAPABILITIES:
            tasks = [t for t in header["tasks"] if any(c["task"] == t and c["capability"] == cap for c in cells)]
            if not tasks:
                continue
            doc.heading(3, _CAP_TITLES[cap], anchor=f"{mslug}-{cap}")
            rows, div_rows = [], []
            for t in tasks:
                metric = next(c["primary"] for c in cells if c["task"] == t)
                row: list[Any] = [f"{t} ({metric})"]
                drow: list[Any] = [t]
                for s in settings:
                    v = by_setting[s]["tasks"].get(t)
                    if v is None:
                        row.append("—")
                        drow.append("—")
                        continue
                    row.append(_num(v["value"]) if s == ORIGINAL else f"{_num(v['value'])} ({_pct(v['relative'])})")
                    drow.append(_num(v["answer_nll"]) if s == ORIGINAL else f"{_num(v['answer_nll'])} / {_num(v['answer_kl'], 4)}")
                rows.append(row)
                div_rows.append(drow)
            doc.table(["task (metric)"] + settings, rows, cls=f"capability {cap}")
            doc.para("Answer NLL (nats/token) of the gold completions; for compressed settings: NLL / KL against the original.", cls="meta")
            doc.table(["task"] + settings, div_rows, cls=f"divergence {cap}")
        # Length buckets and episodes.
        model_cells = [c for c in cells if c["model"] == model]
        bucket_rows = []
        for c in model_cells:
            for b, v in sorted((c.get("buckets") or {}).items()):
                bucket_rows.append([c["setting"], c["task"], b, v["n"], _num(v[c["primary"]])])
        if bucket_rows:
            doc.heading(3, "LongBench by context length")
            doc.table(["setting", "task", "length bucket", "n", "score"], bucket_rows)
        ep_rows = [[c["setting"], c["task"], _num(c["metrics"].get("progress_rate")), _num(c["metrics"].get("success")),
                    _num(c["metrics"].get("grounding")), _num(c["metrics"].get("steps"), 1)]
                   for c in model_cells if c["capability"] == "real_world"]
        if ep_rows:
            doc.heading(3, "AgentBoard episodes")
            doc.table(["setting", "task", "progress rate", "success", "grounding accuracy", "mean steps"], ep_rows)
        # NIAH heatmaps.
        niah = [c for c in model_cells if c["task"] == "niah"]
        if niah:
            doc.heading(3, "Needle in a haystack", anchor=f"{mslug}-niah")
            for c in sorted(niah, key=lambda c: header["settings"].index(c["setting"])):
                p = _figure_niah([c], figs / f"niah-{mslug}-{_slug(c['setting'])}.png", f"{model}: {c['setting']}")
                doc.figure(p, f"NIAH, {c['setting']}: 10 x ROUGE-1 F by context length and needle depth.")
        # Analysis.
        analysis = {k.split("|", 1)[1]: v for k, v in data["analysis"].items() if k.split("|", 1)[0] == model}
        if analysis:
            doc.heading(3, "Analysis against the original (ERank, top-k ranking, energy)", anchor=f"{mslug}-analysis")
            ks = sorted({k for a in analysis.values() for k in a["topk"]}, key=int)
            names = list(analysis)
            rows = [["probe tokens"] + [a["tokens"] for a in analysis.values()],
                    ["ERank diff, last layer"] + [_num(a["erank"]["diff"][-1]) for a in analysis.values()],
                    ["mean |ERank diff| over layers"] + [_num(sum(abs(x) for x in a["erank"]["diff"]) / len(a["erank"]["diff"]))
                                                         for a in analysis.values()]]
            for key, label in (("jaccard", "Jaccard"), ("kendall_tau", "Kendall tau"), ("spearman_rho", "Spearman rho")):
                rows += [[f"{label}@{k}"] + [_num(a["topk"][k][key]) for a in analysis.values()] for k in ks]
            rows.append(["energy mean, original"] + [_num(a["energy"]["mean_original"], 2) for a in analysis.values()])
            rows.append(["energy mean, compressed"] + [_num(a["energy"]["mean_compressed"], 2) for a in analysis.values()])
            doc.table(["metric"] + names, rows, cls="analysis")
            doc.figure(_figure_energy(analysis, figs / f"energy-{mslug}.png", f"{model}: energy per position"),
                       "Energy -logsumexp(logits) per position: original vs each compressed setting.")
            doc.figure(_figure_erank(analysis, figs / f"erank-{mslug}.png", f"{model}: ERank per layer"),
                       "ERank of the centred, row-normalised hidden states at each layer.")
    doc.html.append("</body></html>")
    atomic_write_text(out / "report.md", "\n".join(doc.md).strip() + "\n")
    return atomic_write_text(out / "report.html", "\n".join(doc.html) + "\n")
