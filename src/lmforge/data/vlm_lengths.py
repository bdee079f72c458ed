"""Per-sample VLM lengths (``vit_num`` image tiles, ``token_num`` LLM tokens), as OmniBal packs them.

Two sources:

* :func:`sample_internvl_lengths`: a generator fitted to the per-sample length files ModelTC/OmniBal
  released for four InternVL-1.2M subsets (ai2d, chartqa, docvqa, synthdog; 70,706 samples). The
  committed ``internvl_lengths.json`` holds, per (subset, vit_num), the count and 101 quantiles of
  ``token_num`` (``benchmarks/fit/fit_internvl_lengths.py`` wrote it); sampling draws each sample's
  ``token_num`` by inverse-CDF interpolation between those quantiles. The data files themselves are
  not committed.
* :func:`load_lengths`: a user's own file in the official format, a JSON list of
  ``{"vit_num": int, "token_num": int, ...}`` records (or JSON lines of them), or an official wrap
  file ``{name: {"token_lengths": PATH}}`` whose paths are relative to the wrap file.

Records with a missing, non-integer or negative field are a :class:`UserError` naming the record.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from lmforge.common.errors import UserError
from lmforge.common.io import parse_json_lines, parse_json_text

_FITTED = Path(__file__).with_name("internvl_lengths.json")


@lru_cache(maxsize=1)
def _fitted() -> dict[str, Any]:
    return json.loads(_FITTED.read_text())


def internvl_subset_sizes() -> dict[str, int]:
    """Sample counts of the four fitted subsets (70,706 in all)."""
    return {name: sum(c["count"] for c in cells.values()) for name, cells in _fitted()["subsets"].items()}


def sample_internvl_lengths(n: int | None = None, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Draw ``n`` (default: as many as the source, 70,706) samples' ``(vit_num, token_num)``.

    Cells (subset, vit_num) keep their source proportions: each gets ``round(n·share)`` samples
    (the remainder goes to the largest cells), then the order is shuffled.
    """
    cells = [(int(v), c["count"], np.asarray(c["quantiles"], dtype=np.float64))
             for sub in _fitted()["subsets"].values() for v, c in sub.items()]
    total = sum(c for _, c, _ in cells)
    n = total if n is None else int(n)
    if n < 1:
        raise UserError(f"need at least one sample, got n={n}")
    counts = np.floor(np.array([c for _, c, _ in cells], dtype=np.float64) * n / total).astype(int)
    for i in np.argsort([-c for _, c, _ in cells])[: n - int(counts.sum())]:
        counts[i] += 1
    rng = np.random.default_rng(seed)
    vit, tok = [], []
    grid = np.linspace(0.0, 1.0, 101)
    for (v, _, q), k in zip(cells, counts, strict=True):
        vit.append(np.full(k, v, dtype=np.int64))
        tok.append(np.rint(np.interp(rng.random(k), grid, q)).astype(np.int64))
    order = rng.permutation(n)
    return np.concatenate(vit)[order], np.concatenate(tok)[order]


def _records(path: Path) -> list[tuple[int, Any]]:
    raw = path.read_text()
    if path.suffix == ".jsonl":
        return parse_json_lines(path, raw)
    doc = parse_json_text(path, raw)
    if isinstance(doc, dict):  # the official wrap file: {name: {"token_lengths": path}}
        out: list[tuple[int, Any]] = []
        for name, entry in doc.items():
            if not isinstance(entry, dict) or "token_lengths" not in entry:
                raise UserError(f"{path}: entry {name!r} has no 'token_lengths' path")
            sub = (path.parent / entry["token_lengths"]).resolve()
            if not sub.is_file():
                raise UserError(f"{path}: {name!r} points to {sub}, which does not exist")
            out.extend(_records(sub))
        return out
    if not isinstance(doc, list):
        raise UserError(f"{path}: expected a JSON list of {{'vit_num', 'token_num'}} records")
    return list(enumerate(doc, start=1))


def load_lengths(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Read ``(vit_num, token_num)`` arrays from a length file (see the module docstring)."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"length file {p} does not exist")
    vit, tok = [], []
    for i, rec in _records(p):
        if not isinstance(rec, dict):
            raise UserError(f"{p}: record {i} is not an object")
        for key in ("vit_num", "token_num"):
            val = rec.get(key)
            if val is None:
                raise UserError(f"{p}: record {i} has no '{key}'")
            if isinstance(val, bool) or not isinstance(val, int) or val < 0:
                raise UserError(f"{p}: record {i} has {key}={val!r}; expected a non-negative integer")
        vit.append(rec["vit_num"])
        tok.append(rec["token_num"])
    if not vit:
        raise UserError(f"{p}: no records")
    return np.asarray(vit, dtype=np.int64), np.asarray(tok, dtype=np.int64)
