"""The three S2H tasks (Table Readout, Grid Navigation, Visual Analogy) behind one protocol.

A task module (``tasks/table_readout.py``, ``grid_navigation.py``, ``visual_analogy.py``) exposes:

- ``NAME``: the official setting name (``table_readout``, ``grid_navigation``, ``visual_analogy``).
- ``SIZES``: ``{level: {size_name: (lo, hi)}}``, the official default ranges per level (inclusive).
- ``generate(level, n, seed, **sizes) -> list[dict]``: ``n`` raw puzzles, JSON-serialisable and
  deterministic for the seed. A size outside the generator's range raises :class:`UserError`.
- ``render(raw) -> PIL.Image.Image``: the image modality (RGB).
- ``conversation(raw, data_type, cot=True) -> dict``: the official LLaVA-style record
  ``{"id", "conversations": [{"from": "human", "value": ...}, {"from": "gpt", "value": ...}]}`` for
  ``data_type`` in :data:`DATA_TYPES`; image records start the human turn with ``<image>``.
- ``score(raw, response) -> bool``: the task's checker on a model response.
- ``validate_image(image) -> None``: raises :class:`UserError` when an image cannot be one of this
  task's images (size, mode).

:func:`write_split` writes one level in the official layout (``{out}/{NAME}/{LEVEL}/{data_type}+cot.json``,
images under ``images/``), which :mod:`lmforge.methods.simple_to_hard.supervision` composes as
``scripts/combine_data.py`` does.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import os
from pathlib import Path
from types import ModuleType

from lmforge.common.errors import UserError

LEVELS = ("SIMPLE", "HARD")
# The official data_type_map order (scripts/combine_data.py): I->T, T->S, I->S, I->T+S.
DATA_TYPES = ("image2text", "text2answer", "image2answer", "image2answer+text")
TASK_MODULES = {
    "table_readout": "lmforge.methods.simple_to_hard.tasks.table_readout",
    "grid_navigation": "lmforge.methods.simple_to_hard.tasks.grid_navigation",
    "visual_analogy": "lmforge.methods.simple_to_hard.tasks.visual_analogy",
}


@functools.lru_cache(maxsize=32)
def font(size: int, bold: bool = False):
    """DejaVu Sans (shipped with matplotlib, a dependency) or, failing that, PIL's own scalable font."""
    from PIL import ImageFont

    spec = importlib.util.find_spec("matplotlib")
    if spec is not None and spec.origin:
        ttf = Path(spec.origin).parent / "mpl-data" / "fonts" / "ttf" / ("DejaVuSans-Bold.ttf" if bold else "DejaVuSans.ttf")
        if ttf.is_file():
            return ImageFont.truetype(str(ttf), size)
    return ImageFont.load_default(size)


def check_rgb_image(image, task: str, size: tuple[int, int]) -> None:
    """A :class:`UserError` unless ``image`` is an RGB PIL image of ``size`` (width, height)."""
    from PIL import Image

    if not isinstance(image, Image.Image):
        raise UserError(f"{task}: expected a PIL image, got {type(image).__name__}")
    if image.mode != "RGB":
        raise UserError(f"{task}: image mode is {image.mode}, expected RGB")
    if image.size != tuple(size):
        raise UserError(f"{task}: image is {image.size[0]}x{image.size[1]}, expected {size[0]}x{size[1]}")


def get_task(name: str) -> ModuleType:
    """The task module for ``name``; an unknown name is a :class:`UserError` listing the known ones."""
    key = name.replace("-", "_")
    if key not in TASK_MODULES:
        raise UserError(f"unknown S2H task {name!r}; known: {', '.join(sorted(TASK_MODULES))}")
    return importlib.import_module(TASK_MODULES[key])


def check_level(level: str) -> str:
    up = level.upper()
    if up not in LEVELS:
        raise UserError(f"unknown level {level!r}; known: {', '.join(LEVELS)}")
    return up


def check_sizes(task: str, level: str, ranges: dict[str, tuple[int, int]], sizes: dict[str, tuple[int, int] | int]) -> dict:
    """Merge user ``sizes`` into the level's ``ranges``; anything outside the range is a UserError."""
    out = dict(ranges)
    for key, val in sizes.items():
        if key not in ranges:
            raise UserError(f"{task}: unknown size {key!r}; known: {', '.join(sorted(ranges))}")
        lo, hi = (val, val) if isinstance(val, int) else tuple(val)
        rlo, rhi = ranges[key]
        if not (rlo <= lo <= hi <= rhi):
            raise UserError(f"{task} {level}: {key}={lo}..{hi} is outside the generator's range {rlo}..{rhi}")
        out[key] = (lo, hi)
    return out


def write_split(task: str, level: str, n: int, seed: int, out: Path, cot: bool = True, overwrite: bool = False,
                **sizes) -> Path:
    """Generate ``n`` puzzles and write them in the official layout under ``out/{task}/{LEVEL}``.

    Writes ``raw.json`` (the generator's records), ``images/{id}.png`` and one JSON per data type
    (``text2answer+cot.json`` ...; without ``+cot`` when ``cot`` is false), each record's ``image``
    naming its PNG relative to the level folder. The folder is built beside the target and renamed,
    so a failure leaves nothing behind; an existing folder needs ``overwrite``.
    """
    mod = get_task(task)
    level = check_level(level)
    if n < 1:
        raise UserError(f"--n must be at least 1 (got {n})")
    raws = mod.generate(level, n, seed, **sizes)  # validates sizes before anything is written
    final = out / mod.NAME / level
    if final.exists() and not overwrite:
        raise UserError(f"{final} exists; pass --overwrite to replace it")
    tmp = final.with_name(f".{level}.tmp-{os.getpid()}")
    if tmp.exists():
        import shutil
        shutil.rmtree(tmp)
    (tmp / "images").mkdir(parents=True)
    try:
        for raw in raws:
            mod.render(raw).save(tmp / "images" / f"{raw['id']}.png")
        (tmp / "raw.json").write_text(json.dumps(raws, indent=1))
        tag = "+cot" if cot else ""
        for dt in DATA_TYPES:
            recs = []
            for raw in raws:
                rec = mod.conversation(raw, dt, cot=cot)
                if dt != "text2answer":
                    rec["image"] = f"images/{raw['id']}.png"
                recs.append(rec)
            (tmp / f"{dt}{tag}.json").write_text(json.dumps(recs, indent=1))
        if final.exists():
            import shutil
            shutil.rmtree(final)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp.rename(final)
    except BaseException:
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final
