"""Patch-complexity statistics of an instance, read from its unified diffs.

SetUpAgent (Vergopoulos, Müller, Vechev, ICML 2025, arXiv 2503.07701) compares SWEE-Bench and
SWA-Bench with SWE-bench on fix complexity (the new sets have larger fixes), in the manner of
SWE-bench's Table 1 (files and lines edited by the gold patch, FAIL_TO_PASS and total tests). Per
instance this module gives, for ``patch`` and for ``test_patch``: files, hunks, lines added, lines
removed (and their sum, lines edited); and the sizes of the test lists.

Library checked: ``unidiff`` (what swebench uses to split patches) parses unified diffs into files
and hunks, but it is not installed here nor a dependency of lmforge, and the counts need only the
hunk headers; swebench has no statistics function. The parser is written here and counts by the
hunk headers' line numbers, so a removed line whose text starts with ``--`` (shown as ``---``) or an
added one starting ``++`` is counted as a line, never taken for a file header.

NOTE: the paper's exact statistics are not in reach here (its text could not be retrieved); files,
hunks and lines are the usual ones (SWE-bench's Table 1). Functions edited (SWE-bench also reports
them) need the source files and are left out.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lmforge.methods.setupagent.schema import Instance

_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")


@dataclass(frozen=True)
class DiffStats:
    """Counts of one unified diff.

    Attributes:
        files: files the diff touches (binary files included).
        hunks: ``@@`` hunks.
        added: ``+`` lines.
        removed: ``-`` lines.
    """

    files: int = 0
    hunks: int = 0
    added: int = 0
    removed: int = 0

    @property
    def lines(self) -> int:
        """Lines edited: added + removed."""
        return self.added + self.removed


def diff_stats(diff: str) -> DiffStats:
    """Files, hunks and added/removed lines of a unified diff (git's or plain ``diff -u``).

    A file is a ``diff --git`` header, or a ``--- ``/``+++ `` header pair outside any hunk in a diff
    without git headers. A malformed hunk (its body shorter than its header says) is a ValueError.
    """
    files = hunks = added = removed = 0
    old_left = new_left = 0  # lines of the current hunk still to read
    git_style = False
    lines = diff.splitlines()
    for i, line in enumerate(lines):
        if old_left > 0 or new_left > 0:
            if line.startswith("\\"):  # "\ No newline at end of file"
                continue
            tag = line[:1]
            if tag == "+":
                added += 1
                new_left -= 1
            elif tag == "-":
                removed += 1
                old_left -= 1
            elif tag == " " or line == "":  # a context line (an empty one may lose its space)
                old_left -= 1
                new_left -= 1
            else:
                raise ValueError(f"line {i + 1} of the diff is inside a hunk but is not a hunk line: {line[:60]!r}")
            if old_left < 0 or new_left < 0:
                raise ValueError(f"hunk ending at line {i + 1} has more lines than its header says")
            continue
        if line.startswith("diff --git "):
            files += 1
            git_style = True
        elif line.startswith("--- ") and not git_style and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            files += 1
        else:
            m = _HUNK.match(line)
            if m:
                hunks += 1
                old_left = int(m.group(1)) if m.group(1) is not None else 1
                new_left = int(m.group(2)) if m.group(2) is not None else 1
    if old_left > 0 or new_left > 0:
        raise ValueError("the diff ends inside a hunk (truncated?)")
    return DiffStats(files, hunks, added, removed)


def instance_stats(instance: Instance) -> dict[str, Any]:
    """The statistics of one instance as a flat dict (for a table or a JSONL line)::

        {"instance_id", "patch_files", "patch_hunks", "patch_added", "patch_removed", "patch_lines",
         "test_patch_files", ..., "fail_to_pass", "pass_to_pass", "pass_to_fail", "fail_to_fail"}
    """
    out: dict[str, Any] = {"instance_id": instance.instance_id}
    for name in ("patch", "test_patch"):
        s = diff_stats(getattr(instance, name))
        for key, value in asdict(s).items():
            out[f"{name}_{key}"] = value
        out[f"{name}_lines"] = s.lines
    for key in ("FAIL_TO_PASS", "PASS_TO_PASS", "PASS_TO_FAIL", "FAIL_TO_FAIL"):
        out[key.lower()] = len(getattr(instance, key))
    return out
