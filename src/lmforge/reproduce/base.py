"""The reproduce framework: a registry of miniature experiments and their :class:`ClaimResult`.

Each paper's module registers one function ``run(cfg: ReproduceOptions) -> ClaimResult``. A result
holds the paper's claim in one sentence, the paper's numbers, our measured numbers, and whether the
claim held under a condition fixed in code before the run (on a miniature or on a small real model:
absolute numbers are not comparable to the paper's, the direction is).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lmforge.common.errors import UserError


@dataclass
class Table:
    """A small table for the report: a title, column names and rows of cells."""

    title: str
    columns: list[str]
    rows: list[list[Any]]


@dataclass
class Figure:
    """A figure already written to disk (PNG) by the experiment, with a caption."""

    path: str
    caption: str


@dataclass
class ClaimResult:
    """What one miniature reproduction found.

    Attributes:
        name: reproduction name (``lmforge reproduce NAME``).
        title: the paper (short citation).
        claim: the paper's headline claim in one sentence.
        paper: the paper's numbers, by metric.
        measured: our numbers, by metric.
        held: whether the claim held under the condition the reproduction wrote down before running.
        tables: tables for the report.
        figures: PNG figures for the report.
        notes: caveats (what differs from the paper's setting and why).
        seconds: wall time of the experiment.
    """

    name: str
    title: str
    claim: str
    paper: dict[str, Any]
    measured: dict[str, Any]
    held: bool
    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict with at least name, claim, paper, measured, held."""
        return asdict(self)


@dataclass
class ReproduceOptions:
    """Options every reproduction receives.

    Attributes:
        out_dir: a fresh directory where the experiment may write figures and artefacts.
        quick: shrink the experiment (tests use this); the report says so.
        seed: base random seed.
        full: also run the settings that do not fit the 15-minute budget, where a reproduction has
            them (``lmforge reproduce NAME --full``); the report says which ran.
        progress: show progress bars on long steps.
    """

    out_dir: Path
    quick: bool = False
    seed: int = 0
    full: bool = False
    progress: bool = False


ReproFn = Callable[[ReproduceOptions], ClaimResult]


@dataclass(frozen=True)
class Reproduction:
    """A registered reproduction."""

    name: str
    title: str
    fn: ReproFn
    summary: str


REPRODUCTIONS: dict[str, Reproduction] = {}


def figure(*args: Any, **kwargs: Any) -> Any:
    """``plt.subplots(*args, **kwargs)`` on matplotlib's Agg backend (no display needed): the
    ``(fig, axes)`` of a report figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kwargs)


def save_figure(fig: Any, path: str | Path) -> Path:
    """Lay out, write (PNG at 110 dpi, the reports' size) and close a report figure; returns ``path``."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def register_reproduction(name: str, title: str, summary: str) -> Callable[[ReproFn], ReproFn]:
    """Decorator registering ``fn`` as ``lmforge reproduce NAME``."""

    def deco(fn: ReproFn) -> ReproFn:
        if name in REPRODUCTIONS and REPRODUCTIONS[name].fn is not fn:
            raise ValueError(f"reproduction {name!r} registered twice")
        REPRODUCTIONS[name] = Reproduction(name=name, title=title, fn=fn, summary=summary)
        return fn

    return deco


def load_all() -> dict[str, Reproduction]:
    """Import every module in ``lmforge.reproduce`` so that each registers itself."""
    import lmforge.reproduce as pkg

    for info in pkgutil.iter_modules(pkg.__path__):
        if info.name != "base":
            importlib.import_module(f"lmforge.reproduce.{info.name}")
    return REPRODUCTIONS


def get(name: str) -> Reproduction:
    """The reproduction called ``name``, or a UserError listing the known ones."""
    load_all()
    if name not in REPRODUCTIONS:
        known = ", ".join(sorted(REPRODUCTIONS)) or "(none)"
        raise UserError(f"unknown reproduction '{name}'; known: {known}")
    return REPRODUCTIONS[name]
