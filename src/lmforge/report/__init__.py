"""Reports: Markdown, a self-contained HTML page and JSON for reproduction results, plus a plot helper."""

from lmforge.report.render import plot_curves, write_report

__all__ = ["plot_curves", "write_report"]
