"""Table Readout at CPU size: the miniature the reproduction and the tiny VLM use.

The official task (``tasks/table_readout.py``) has 7-12 x 7-10 tables of product/month names whose
digits are drawn as words, and a VLM of 8B parameters. At CPU size (``shared/papers/wave2.md`` §7c):

- a 6 x 6 table of digits; rows ``a``-``f``, columns ``1``-``6`` (a cell is named ``c4``);
- the image is 48 x 48 RGB, one 8 x 8 px cell per ViT patch: a 5 x 7 digit glyph in black on the
  official colours (path cells yellow, the others ``#f5f5f5``);
- SIMPLE paths have 4-8 cells and at most 2 turns, HARD paths 12-18 cells and 4-6 turns; a path never
  touches itself (no two non-consecutive cells are neighbours), so following the highlight from the
  start cell is unambiguous, as in the official sine/spiral/zigzag paths.

The four official data types (``scripts/combine_data.py``: I->T, T->S, I->S, I->T+S) keep the official
structure: image and image-via-text records share one prompt, the model decides whether to convert;
image-via-text answers ``convert`` + the text table, then the same CoT as the others.

# NOTE: deviations from the official formats, for a model of ~1M parameters trained for minutes:
# - The text table names every cell (``c4 5*``) where the official LaTeX relies on row names and
#   column order: a tiny RoPE model cannot count ``&`` separators to find a column, and with the
#   coordinate in the token both modalities address a cell by content (image patches carry the ViT's
#   position embedding).
# - The CoT line is ``cell value running-total`` where the official line is
#   ``RowIdx\tColIdx\tRow\tCol\tValue`` and the sum is written once at the end
#   (``The total is a + b + ... = S.``): adding 18 digits in one step is beyond a 4-layer model; the
#   running total keeps each step a single-digit addition (taught in pretraining).
# - Digits are glyphs, not words (ZERO..NINE): a word does not fit an 8 x 8 patch.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
from PIL import Image

from lmforge.common.errors import UserError

N = 6  # rows and columns
CELL = 8  # pixels per cell (= ViT patch)
ROWS = "abcdef"
YELLOW = (255, 255, 0)  # the official path colour
GREY = (245, 245, 245)  # the official '#f5f5f5' of other cells
INK = (0, 0, 0)
# level -> (min cells, max cells, min turns, max turns)
LEVELS = {"SIMPLE": (4, 8, 0, 2), "HARD": (12, 18, 4, 6)}
DATA_TYPES = ("image2text", "text2answer", "image2answer", "image2answer+text")

# 5 x 7 digit glyphs (rows top to bottom, '#' = ink), the classic LCD/dot-matrix shapes.
_GLYPH_ROWS = {
    0: [".###.", "#...#", "#..##", "#.#.#", "##..#", "#...#", ".###."],
    1: ["..#..", ".##..", "..#..", "..#..", "..#..", "..#..", ".###."],
    2: [".###.", "#...#", "....#", "...#.", "..#..", ".#...", "#####"],
    3: ["#####", "...#.", "..#..", "...#.", "....#", "#...#", ".###."],
    4: ["...#.", "..##.", ".#.#.", "#..#.", "#####", "...#.", "...#."],
    5: ["#####", "#....", "####.", "....#", "....#", "#...#", ".###."],
    6: ["..##.", ".#...", "#....", "####.", "#...#", "#...#", ".###."],
    7: ["#####", "....#", "...#.", "..#..", ".#...", ".#...", ".#..."],
    8: [".###.", "#...#", "#...#", ".###.", "#...#", "#...#", ".###."],
    9: [".###.", "#...#", "#...#", ".####", "....#", "...#.", ".##.."],
}
GLYPHS = {d: np.array([[c == "#" for c in row] for row in rows], dtype=bool) for d, rows in _GLYPH_ROWS.items()}
GLYPH_X, GLYPH_Y = 1, 0  # top-left of the 5 x 7 glyph inside its 8 x 8 cell


def cell_name(r: int, c: int) -> str:
    return f"{ROWS[r]}{c + 1}"


def parse_cell(name: str) -> tuple[int, int]:
    return ROWS.index(name[0]), int(name[1:]) - 1


@dataclass
class Puzzle:
    """One table and its highlighted path (cells in reading order, start first)."""

    table: list[list[int]]
    path: list[tuple[int, int]]
    id: str = ""

    @property
    def total(self) -> int:
        return sum(self.table[r][c] for r, c in self.path)

    def to_json(self) -> dict:
        return {"id": self.id, "table": self.table, "path": [list(p) for p in self.path]}

    @classmethod
    def from_json(cls, d: dict) -> Puzzle:
        return cls(table=[list(r) for r in d["table"]], path=[tuple(p) for p in d["path"]], id=d.get("id", ""))


def turns(path: list[tuple[int, int]]) -> int:
    """Direction changes along the path."""
    dirs = [(b[0] - a[0], b[1] - a[1]) for a, b in zip(path, path[1:])]
    return sum(1 for d0, d1 in zip(dirs, dirs[1:]) if d0 != d1)


def _touches_itself(path: list[tuple[int, int]]) -> bool:
    pos = {p: i for i, p in enumerate(path)}
    for i, (r, c) in enumerate(path):
        for nb in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
            j = pos.get(nb)
            if j is not None and abs(j - i) > 1:
                return True
    return False


def random_path(level: str, rng: random.Random, max_tries: int = 20000) -> list[tuple[int, int]]:
    """A self-avoiding, non-touching 4-neighbour path with the level's cell and turn counts.

    A random walk that keeps its direction with probability 1/2 at each step (turning only to a free
    cell), rejected until the counts fall inside the level's ranges; a walk is cut at a random length
    inside the range so short and long paths are both drawn.
    """
    lo, hi, tlo, thi = LEVELS[level]
    for _ in range(max_tries):
        want = rng.randint(lo, hi)
        r, c = rng.randrange(N), rng.randrange(N)
        path = [(r, c)]
        d = rng.choice([(0, 1), (1, 0), (0, -1), (-1, 0)])
        while len(path) < want:
            options = []
            for nd in ((0, 1), (1, 0), (0, -1), (-1, 0)):
                if nd == (-d[0], -d[1]):
                    continue
                nr, nc = path[-1][0] + nd[0], path[-1][1] + nd[1]
                if 0 <= nr < N and 0 <= nc < N and (nr, nc) not in path and not _touches_itself(path + [(nr, nc)]):
                    options.append(nd)
            if not options:
                break
            d = d if d in options and rng.random() < 0.5 else rng.choice(options)
            path.append((path[-1][0] + d[0], path[-1][1] + d[1]))
        if len(path) == want and tlo <= turns(path) <= thi:
            return path
    raise RuntimeError(f"no {level} path found in {max_tries} tries")  # pragma: no cover - ranges are feasible


def generate(level: str, n: int, seed: int) -> list[Puzzle]:
    level = level.upper()
    if level not in LEVELS:
        raise UserError(f"unknown level {level!r}; known: {', '.join(LEVELS)}")
    rng = random.Random(f"s2h-mini-{level}-{seed}")
    out = []
    for i in range(n):
        table = [[rng.randrange(10) for _ in range(N)] for _ in range(N)]
        out.append(Puzzle(table=table, path=random_path(level, rng), id=f"{level}-{seed}-{i}"))
    return out


# --- the image modality -------------------------------------------------------------------------

def render_array(p: Puzzle) -> np.ndarray:
    """The puzzle as a (48, 48, 3) uint8 array."""
    img = np.empty((N * CELL, N * CELL, 3), dtype=np.uint8)
    on_path = set(p.path)
    for r in range(N):
        for c in range(N):
            y0, x0 = r * CELL, c * CELL
            img[y0:y0 + CELL, x0:x0 + CELL] = YELLOW if (r, c) in on_path else GREY
            glyph = GLYPHS[p.table[r][c]]
            block = img[y0 + GLYPH_Y:y0 + GLYPH_Y + 7, x0 + GLYPH_X:x0 + GLYPH_X + 5]
            block[glyph] = INK
    return img


def render(p: Puzzle) -> Image.Image:
    return Image.fromarray(render_array(p), mode="RGB")


def validate_image(img: Image.Image | np.ndarray) -> np.ndarray:
    """The image as an array, or a UserError when it cannot be a miniature Table Readout image."""
    arr = np.asarray(img.convert("RGB") if isinstance(img, Image.Image) else img)
    if arr.shape != (N * CELL, N * CELL, 3):
        raise UserError(f"image is {arr.shape[1]}x{arr.shape[0]}, a miniature Table Readout image is "
                        f"{N * CELL}x{N * CELL} RGB")
    try:
        decode_image(arr)
    except ValueError as e:
        raise UserError(f"image is not a miniature Table Readout image: {e}") from None
    return arr


def decode_image(arr: np.ndarray) -> tuple[list[list[int]], set[tuple[int, int]]]:
    """Pixel-exact decoder: the table's digits and the highlighted cells, read back from the pixels."""
    table = [[0] * N for _ in range(N)]
    lit = set()
    for r in range(N):
        for c in range(N):
            cell = arr[r * CELL:(r + 1) * CELL, c * CELL:(c + 1) * CELL]
            ink = np.all(cell == INK, axis=-1)
            bg = cell[~ink]
            if len(bg) == 0 or not (np.all(bg == YELLOW) or np.all(bg == GREY)):
                raise ValueError(f"cell {cell_name(r, c)} has a background that is neither yellow nor grey")
            if np.all(bg == YELLOW):
                lit.add((r, c))
            glyph = ink[GLYPH_Y:GLYPH_Y + 7, GLYPH_X:GLYPH_X + 5]
            if ink.sum() != glyph.sum():
                raise ValueError(f"cell {cell_name(r, c)} has ink outside its glyph box")
            match = [d for d, g in GLYPHS.items() if np.array_equal(g, glyph)]
            if len(match) != 1:
                raise ValueError(f"cell {cell_name(r, c)} holds no digit glyph")
            table[r][c] = match[0]
    return table, lit


# --- the text modality and the four data types ---------------------------------------------------

def text_table(p: Puzzle) -> str:
    """Every cell as ``name value`` with ``*`` glued to path values (the official marker)."""
    on_path = set(p.path)
    return " ".join(f"{cell_name(r, c)} {p.table[r][c]}{'*' if (r, c) in on_path else ''}"
                    for r in range(N) for c in range(N))


def digits(n: int) -> str:
    return " ".join(str(n))


def cot(p: Puzzle) -> str:
    """``enumerate`` then one line per path cell: ``cell value running-total``; then the answer."""
    lines, total = [], 0
    for r, c in p.path:
        total += p.table[r][c]
        lines.append(f"{cell_name(r, c)} {p.table[r][c]} {digits(total)} ;")
    return "enumerate " + " ".join(lines) + f" answer {digits(total)}"


def prompt(p: Puzzle, image: bool) -> str:
    s, e = cell_name(*p.path[0]), cell_name(*p.path[-1])
    if image:  # the image records share one prompt (as create_splits.py's image2answer and image2answer+text)
        return f"<image> image yellow path {s} to {e} total ?"
    return f"{text_table(p)} table star path {s} to {e} total ?"


def conversation(p: Puzzle, data_type: str, with_cot: bool = True) -> dict:
    """The official LLaVA-style record for one data type."""
    if data_type not in DATA_TYPES:
        raise UserError(f"unknown data type {data_type!r}; known: {', '.join(DATA_TYPES)}")
    answer = cot(p) if with_cot else f"answer {digits(p.total)}"
    if data_type == "image2text":
        human, gpt = f"<image> image convert to table", f"convert {text_table(p)}"
    elif data_type == "text2answer":
        human, gpt = prompt(p, image=False), answer
    elif data_type == "image2answer":
        human, gpt = prompt(p, image=True), answer
    else:
        human, gpt = prompt(p, image=True), f"convert {text_table(p)} {answer}"
    return {"id": p.id, "conversations": [{"from": "human", "value": human}, {"from": "gpt", "value": gpt}]}


def parse_answer(response: str) -> int | None:
    """The total after the last ``answer`` word (its digits joined), or None."""
    toks = response.split()
    if "answer" not in toks:
        return None
    i = len(toks) - 1 - toks[::-1].index("answer")
    ds = []
    for t in toks[i + 1:]:
        if t.isdigit() and len(t) == 1:
            ds.append(t)
        else:
            break
    return int("".join(ds)) if ds else None


def score(p: Puzzle, response: str) -> bool:
    return parse_answer(response) == p.total


def converted(response: str) -> bool:
    """Whether a response chose image-via-text (starts with the conversion)."""
    return response.split()[:1] == ["convert"]


# --- the vocabulary -------------------------------------------------------------------------------

WORDS = (["<pad>", "<s>", "</s>", "<image>"] + [str(d) for d in range(10)] + [f"{d}*" for d in range(10)]
         + [cell_name(r, c) for r in range(N) for c in range(N)]
         + ["image", "table", "yellow", "star", "path", "to", "total", "?", "convert", "enumerate", "answer", ";",
            "read", "add", "+", "=", "is", "on", "off"])
