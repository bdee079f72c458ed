"""The supervision strategies, composed as the official ``scripts/combine_data.py`` composes them.

A composition says which of the four data types (I->T, T->S, I->S, I->T+S, in the official
``data_type_map`` order) are drawn at each level. For ``total`` examples:

1. the options trained for several epochs take fewer unique examples (2 epochs: ``total // 2``;
   3 epochs: ``total // 3``; 1.5 epochs: ``2 * total // 3``), so every option sees about ``total``;
2. the total is split evenly over the levels that are used, then evenly over the data types used at
   that level (integer division, as the official code does);
3. each (level, data type) pool is shuffled with seed 42 and its first examples taken; the union is
   shuffled.

Option 9 (Image-via-Text+) repeats its SIMPLE part three times before adding HARD text, as the
official code does. Align-Mix+ is two phases: option 8 (SIMPLE T->S + I->T+S), then Mix+ (option 7)
from the phase-1 weights.

# NOTE: the official launcher trains option 8 as a run of its own, with the same total as the other
# options, and the second phase from its checkpoint; the data of the second phase is not in the
# repository's scripts. To keep the arms on equal data (as the reproduction's condition asks) the
# total is split between the phases (``align_phase1_fraction``, default 0.5).
# NOTE: "Image + HARD text" is the issue's arm (SIMPLE I->S + HARD T->S, 1 epoch), not an official
# option; it is composed with the same rules.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from lmforge.common.errors import UserError

DATA_TYPES = ("image2text", "text2answer", "image2answer", "image2answer+text")
LEVELS = ("SIMPLE", "HARD")
_F, _T = False, True

# option -> ({level: [I->T, T->S, I->S, I->T+S]}, epochs); official options 1-9 of combine_data.py and
# the epochs of train_template.sh.
OPTIONS: dict[int, tuple[dict[str, list[bool]], float]] = {
    1: ({"SIMPLE": [_F, _F, _F, _T], "HARD": [_F, _F, _F, _F]}, 3),  # Image-via-Text
    2: ({"SIMPLE": [_F, _T, _F, _F], "HARD": [_F, _F, _F, _F]}, 2),  # Text
    3: ({"SIMPLE": [_F, _F, _T, _F], "HARD": [_F, _F, _F, _F]}, 2),  # Image, 2 epochs
    4: ({"SIMPLE": [_F, _F, _T, _F], "HARD": [_F, _F, _F, _F]}, 3),  # Image, 3 epochs
    5: ({"SIMPLE": [_F, _T, _T, _F], "HARD": [_F, _F, _F, _F]}, 1.5),  # Image + Text
    6: ({"SIMPLE": [_F, _T, _T, _T], "HARD": [_F, _F, _F, _F]}, 1),  # Mix
    7: ({"SIMPLE": [_F, _T, _T, _T], "HARD": [_F, _T, _F, _F]}, 1),  # Mix+
    8: ({"SIMPLE": [_F, _T, _F, _T], "HARD": [_F, _F, _F, _F]}, 1),  # Align-Mix+ phase 1
    9: ({"SIMPLE": [_F, _F, _F, _T], "HARD": [_F, _T, _F, _F]}, 1),  # Image-via-Text+
}
# lmforge's own arm (see the NOTE above): SIMPLE images with HARD text.
EXTRA = {"image+hard-text": ({"SIMPLE": [_F, _F, _T, _F], "HARD": [_F, _T, _F, _F]}, 1)}

STRATEGIES: dict[str, list[int | str]] = {
    "text": [2], "image": [3], "image-3ep": [4], "image-via-text": [1], "image+text": [5], "mix": [6], "mix+": [7],
    "align-mix+": [8, 7], "image-via-text+": [9], "image+hard-text": ["image+hard-text"],
}


@dataclass(frozen=True)
class Phase:
    """One training run of a strategy: how many examples of each (level, data type), and epochs."""

    option: int | str
    counts: dict[tuple[str, str], int]
    epochs: float
    repeat_simple: int = 1  # option 9 repeats its SIMPLE part


def check_strategy(name: str) -> str:
    key = name.lower()
    if key not in STRATEGIES:
        raise UserError(f"unknown strategy {name!r}; known: {', '.join(STRATEGIES)}")
    return key


def phase_counts(option: int | str, total: int) -> Phase:
    """The official arithmetic of ``combine_data.main`` for one option and ``total`` examples."""
    comp, epochs = OPTIONS[option] if option in OPTIONS else EXTRA[option]
    if option in (2, 3):
        total = total // 2
    elif option in (1, 4):
        total = total // 3
    elif option == 5:
        total = 2 * total // 3
    used = {lv: any(comp[lv]) for lv in LEVELS}
    per_level = {lv: total // sum(used.values()) * used[lv] for lv in LEVELS}
    counts: dict[tuple[str, str], int] = {}
    for lv in LEVELS:
        if per_level[lv] <= 0:
            continue
        for i, dt in enumerate(DATA_TYPES):
            k = per_level[lv] // sum(comp[lv]) * comp[lv][i]
            if k > 0:
                # option 9 takes a third of its SIMPLE share and repeats it three times
                counts[(lv, dt)] = k // 3 if (option == 9 and lv == "SIMPLE") else k
    return Phase(option=option, counts=counts, epochs=epochs, repeat_simple=3 if option == 9 else 1)


def plan(strategy: str, total: int, align_phase1_fraction: float = 0.5) -> list[Phase]:
    """The phases of a strategy for a budget of ``total`` examples."""
    opts = STRATEGIES[check_strategy(strategy)]
    if total < 12:
        raise UserError(f"a budget of {total} examples is too small to split over levels and data types")
    if len(opts) == 1:
        return [phase_counts(opts[0], total)]
    first = int(round(total * align_phase1_fraction))
    return [phase_counts(opts[0], first), phase_counts(opts[1], total - first)]


def compose(phase: Phase, pools: dict[tuple[str, str], Sequence], seed: int = 42) -> list:
    """The phase's examples: each pool shuffled with ``seed`` (official: 42) and cut, then the union
    shuffled. ``pools[(level, data_type)]`` must hold at least the phase's count."""
    out: list = []
    simple: list = []
    for (lv, dt), k in phase.counts.items():
        pool = list(pools[(lv, dt)])
        if len(pool) < k:
            raise UserError(f"{lv} {dt}: the phase needs {k} examples, the data has {len(pool)}")
        random.Random(seed).shuffle(pool)
        (simple if lv == "SIMPLE" else out).extend(pool[:k])
    out = simple * phase.repeat_simple + out
    random.Random(seed + 1).shuffle(out)
    return out
