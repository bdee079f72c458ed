"""Rich progress bars for long loops (anything over about two seconds)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

T = TypeVar("T")

# Progress goes to stderr so that `--json` output on stdout stays machine-readable.
console = Console(stderr=True)


def progress_enabled() -> bool:
    """Bars are shown unless LMFORGE_NO_PROGRESS=1 (tests and CI logs set it)."""
    return os.environ.get("LMFORGE_NO_PROGRESS", "0") != "1"


def make_progress() -> Progress:
    """A Progress with the columns every lmforge bar uses."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not progress_enabled(),
        transient=not sys.stderr.isatty(),
    )


def track(items: Iterable[T], description: str, total: int | None = None) -> Iterator[T]:
    """Iterate ``items`` with a progress bar (a drop-in for ``rich.progress.track``)."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with make_progress() as prog:
        task = prog.add_task(description, total=total, info="")
        for item in items:
            yield item
            prog.advance(task)


def save_pretrained_quietly(obj: object, path: object, **kwargs: object) -> None:
    """``obj.save_pretrained(path, **kwargs)`` without transformers' "Writing model shards" bar, which
    it prints to stderr on every save: lmforge saves models into its cache as a side effect of loading
    (zoo training, GGUF conversion), where a stray bar would break a command's one-line error contract."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        obj.save_pretrained(path, **kwargs)  # type: ignore[attr-defined]
    finally:
        if was:
            hf_logging.enable_progress_bar()
