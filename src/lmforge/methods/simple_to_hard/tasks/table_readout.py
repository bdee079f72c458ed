"""Table Readout (S2H, ICML 2025): sum the digits along a highlighted path through a sales table.

A table of 7-12 products (rows) x 7-10 months (columns) holds digits 0-9; a path of adjacent cells is
highlighted and the model returns the total of the highlighted values. The task, its path families,
level mixtures, names, prompts and answer formats are those of the official generator
(github.com/princeton-pli/VLM_S2H, ``data_generation/table_readout``, MIT). The path generators here are
an independent implementation of the official path *families* (same shapes, same distributions as
far as measured), not a port of its code: they use their own construction and a ``random.Random``
stream, so no seed reproduces an official puzzle.

The path families (one table per puzzle; "runs" are straight stretches along a row or column):

- ``random`` (``create_random_path.py``, ``--max_pieces 4``): a staircase of 1-4 straight pieces
  (uniform), alternating between horizontal and vertical, so 0-3 turns. One piece is a straight
  segment spanning at least 4 rows or columns: its orientation is picked in proportion to how many
  ordered endpoint pairs at least 4 apart its axis offers, then such a pair and the fixed row/column
  uniformly. With 2-4 pieces the start and end cells are at least 4 rows *and* 4 columns apart. On
  each axis the start coordinate is weighted by the number of directions (up/down) that leave room for a
  4-cell span and the end coordinate is uniform over those at least 4 away, except that an end above
  or left of the start is never row/column 0 (a property of the official candidate lists). The first
  piece is horizontal or vertical with probability 1/2; every piece but the last two stops at a
  uniformly chosen coordinate strictly past the current one on the side of the end coordinate (the
  higher side when they coincide), never within one cell of the end coordinate; the last two pieces
  land on the end column and end row. No trimming, no reversal.
- ``sine`` (``create_sine_path.py``): a boustrophedon. It starts at a table corner moved ``gap``
  (0/1) cells inward along both axes and sweeps parallel to one of the two corner edges (corner and
  axis uniform), running to the far edge or stopping one cell short of it (a fresh coin per run),
  then crossing two cells away from the start corner and running back, and so on. The crossings take
  ``npieces`` unit steps in all (two per U-turn, so an odd count ends in the middle of a crossing);
  the sweep also ends where a crossing step would leave the table (short tables cut HARD paths).
- ``spiral`` (``create_spiral_path.py``): an inward spiral in the table inset by ``gap`` on every
  side, starting at one of its corners and running along one of the two corner edges first (corner
  and sense uniform: clockwise or counter-clockwise). The arms are W-1, H-1, W-1, H-3, W-3, H-5, W-5,
  ... steps long (W x H the inset rectangle, W along the first arm), i.e. one free line between
  consecutive rings. After ``npieces`` turns the path takes a single step into the next arm and ends;
  it ends earlier, at the end of an arm, when the next arm would be shorter than 2 steps.
- ``compose`` (``create_compose_path.py``): sine and spiral moves mixed. A walker starts at a table
  corner (``gap`` is ignored, as in the official script) and repeats ``npieces`` times: run along one
  edge of the still-free rectangle to its far corner, then take two steps inward along the other edge
  there, which removes the swept line and the one after it from the free rectangle. The first run's
  axis is uniform; after each piece a fair coin keeps the crossing's axis (a spiral turn: the two steps
  were the start of the next run) or returns to the previous axis (a sine U-turn). The walk ends early
  when a crossing step would leave the free rectangle or land in row 0 or column 0 (the official
  bounds test excludes index 0, so a sweep towards the top or left edge stops one line short).
- ``sine`` and ``spiral`` paths then lose 0-2 cells at each end (``compose``: 0-1), the two counts
  uniform and independent, and are reversed with probability 1/2.

The level mixtures are those of ``generate_data.sh``: SIMPLE is one third each of ``random``
(``--max_pieces 4``), ``sine`` and ``spiral`` (``--npieces`` 3 or 4, ``--gap`` 0 or 1, a quarter each);
HARD is one third each of ``sine`` (npieces 8 or 10), ``spiral`` (6 or 8) and ``compose`` (8 or 10),
gap 0 or 1. (``generate_eval_data.sh`` builds SIMPLE_eval from the same three families at 50/200/200
puzzles and HARD_eval from ``compose`` alone; see :data:`EVAL_FAMILIES`.) Table sizes are
``--min_rows 7 --max_rows 12 --min_cols 7 --max_cols 10`` everywhere, product names and months drawn
without replacement (months in random order, as officially), digits uniform.

Text modality: the official ``generate_latex_table`` output (pandas ``Styler.to_latex`` of the table
with ``*`` appended to path cells, wrapped in a ``table`` environment, then ``.replace("*", " *")`` and
a space after every ``\\\\`` line break), written out directly by :func:`latex_text` rather than through
pandas (pandas is not a dependency; the format is checked against ``Styler.to_latex`` in the tests
where pandas and jinja2 are importable). Prompts and chain of thought are ``create_splits.py``'s,
character for character.

The image is drawn with PIL (the official one is a matplotlib ``ax.table`` on a 15x8 inch figure at
100 dpi): 1500x800 RGB, digits written as ZERO..NINE, header and index cells ``#40466e`` with white
bold names, path cells yellow, the others ``#f5f5f5``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from PIL import Image, ImageDraw

from lmforge.common.errors import UserError
from lmforge.methods.simple_to_hard.tasks import DATA_TYPES, check_level, check_rgb_image, check_sizes
from lmforge.methods.simple_to_hard.tasks import font as _font

NAME = "table_readout"

# names.py of the official generator (data, kept verbatim and in order).
MONTHS = (
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
)
PRODUCTS = (
    "AlphaWidget", "BetaGadget", "GammaDevice", "DeltaTool", "EpsilonInstrument", "ZetaApparatus",
    "EtaMachine", "ThetaContraption", "IotaEngine", "KappaMechanism", "LambdaWidget", "MuGadget",
    "NuDevice", "XiTool", "OmicronInstrument", "PiApparatus", "RhoMachine", "SigmaContraption",
    "TauEngine", "UpsilonMechanism", "PhiWidget", "ChiGadget", "PsiDevice", "OmegaTool",
    "HyperWidget", "MegaGadget", "UltraDevice", "SuperTool", "PowerInstrument", "ProApparatus",
    "TurboMachine", "SpeedContraption", "MaxEngine", "EliteMechanism", "ApexWidget", "PrimeGadget",
    "ZenithDevice", "VertexTool", "SummitInstrument", "CrestApparatus", "PeakMachine",
    "PinnacleContraption", "AcmeEngine", "CrownMechanism", "TopWidget", "SuperiorGadget",
    "SupremeDevice", "PremierTool", "ParamountInstrument", "StellarApparatus", "RadiantMachine",
    "LuminousContraption", "GlowingEngine", "BrilliantMechanism", "DazzleWidget", "SparkGadget",
    "ShineDevice", "FlashTool", "GlowInstrument", "BrightApparatus", "LightMachine",
    "IllumineContraption", "BlazeEngine", "FlameMechanism", "InfernoWidget", "EmberGadget",
    "FireDevice", "HeatTool", "WarmInstrument", "ToastyApparatus", "ScorchMachine",
    "SizzleContraption", "BurnEngine", "IgniteMechanism", "PyroWidget", "CombustGadget",
    "FlareDevice", "RadiateTool", "GlimmerInstrument", "ShimmerApparatus", "TwinkleMachine",
    "SparkleContraption", "FlashEngine", "ShineMechanism", "RayWidget", "BeamGadget",
    "PhotonDevice", "WaveTool", "QuantaInstrument", "QuantumApparatus", "ParticleMachine",
    "AtomContraption", "MoleculeEngine", "NanoMechanism", "MicroWidget", "MiniGadget",
    "SmallDevice", "TinyTool", "PetiteInstrument", "DiminutiveApparatus",
)
DIGIT_WORDS = ("ZERO", "ONE", "TWO", "THREE", "FOUR", "FIVE", "SIX", "SEVEN", "EIGHT", "NINE")

# generate_data.sh: (family, gaps, npieces) per level, the families in equal shares. For ``random``
# the value is --max_pieces (the path draws 1..max_pieces pieces itself; it has no gap).
LEVEL_FAMILIES = {
    "SIMPLE": (("random", (0,), (4,)), ("sine", (0, 1), (3, 4)), ("spiral", (0, 1), (3, 4))),
    "HARD": (("sine", (0, 1), (8, 10)), ("spiral", (0, 1), (6, 8)), ("compose", (0, 1), (8, 10))),
}
# generate_eval_data.sh: puzzles per (family, gap, npieces) file of the evaluation splits.
EVAL_FAMILIES = {
    "SIMPLE": {("random", 0, 4): 50, **{(f, g, k): 50 for f in ("sine", "spiral") for g in (0, 1) for k in (3, 4)}},
    "HARD": {("compose", g, k): 500 for g in (0, 1) for k in (8, 10)},
}

# Official table sizes (both levels) and the range of path turns (direction changes) that the
# level's mixture produces. Measured on 60,000 paths per family and level (all simple, contiguous and
# inside their table): SIMPLE random 0-3, sine 2-3, spiral 2-4; HARD sine 4-9 (a 7-row table ends the
# sweeps early), spiral 3-8, compose 4-17. Enumerating every table size, corner, first axis, coin
# sequence and end trim of compose gives 4-18 (18 from 8 of 163,840 walks with npieces 10), the same
# ranges as the official scripts' paths.
SIZES = {
    "SIMPLE": {"rows": (7, 12), "cols": (7, 10), "turns": (0, 4)},
    "HARD": {"rows": (7, 12), "cols": (7, 10), "turns": (3, 18)},
}

CAPTION = "Business Sales Data for products in different months"
LABEL = "tab:business_sales"

# create_splits.py, verbatim.
_IMAGE_QUESTION = (
    "<image>\n\nThe image shows the sales data of different products in different months. For readability, "
    "values in the cells have been replaced by their English names, e.g. 0 is represented by ZERO. There is a "
    "path of highlighted cells (colored in yellow) starting from START_CELL and ending at END_CELL. Please "
    "return the total of all values in the highlighted cells. Provide the final answer as 'Answer: [total]'."
)
_TEXT_QUESTION = (
    "\n\nThe table above shows the sales data of different products in different months. There is a path of "
    "highlighted cells (marked with a * symbol) starting from START_CELL and ending at END_CELL. Please return "
    "the total of all values in the highlighted cells. Provide the final answer as 'Answer: [total]'."
)
CONVERT_INSTRUCTION = (
    "Convert the image into a latex code of the given table, where highlighted cells (colored in yellow) are "
    "marked with a * symbol next to the values."
)
_ENUMERATE = (
    "We enumerate the relevant row indices, column indices, row names, column names, and their corresponding "
    "values.\n\nRow Index, Column Index, Row Name, Column Name, Value\n"
)
# NOTE: the official task has no image2text file (create_splits.py writes image2answer+text+cot,
# image2answer+cot and text2answer+cot only). Our image2text asks for the conversion with the image
# description of the image prompts and the conversion instruction of image2answer+text, and answers
# with the LaTeX text alone, as grid_navigation's official image2text does with its text table.
_IMAGE2TEXT_QUESTION = (
    "<image>\n\nThe image shows the sales data of different products in different months. For readability, "
    "values in the cells have been replaced by their English names, e.g. 0 is represented by ZERO. "
    + CONVERT_INSTRUCTION
)

MAX_TRIES = 2000  # draws per puzzle before a turn range is declared unreachable


# ---------------------------------------------------------------------------------------------------
# Path families (see the module docstring). Each builder takes a ``random.Random`` and returns the
# path's cells as ``(row, col)`` in path order. Sine and spiral paths are built in a canonical frame
# (start corner at the top-left, first run along a row) and then mapped onto the table by a
# transpose and row/column flips, which gives the 4 corners x 2 first axes of the official scripts.
# ---------------------------------------------------------------------------------------------------

Cell = tuple[int, int]
FAMILIES = ("random", "sine", "spiral", "compose")
MIN_SPAN = 4  # random paths: endpoints at least this many rows (and columns) apart
_END_TRIM = {"sine": 2, "spiral": 2, "compose": 1}  # at most this many cells dropped at each end
_CLOCKWISE = ((0, 1), (1, 0), (0, -1), (-1, 0))  # right, down, left, up as (d_row, d_col)


def _polyline(corners: Sequence[Cell]) -> list[Cell]:
    """The cells of the axis-parallel polyline through ``corners``, the first corner included."""
    cells = [tuple(corners[0])]
    for (r0, c0), (r1, c1) in zip(corners, corners[1:]):
        dr, dc = (r1 > r0) - (r1 < r0), (c1 > c0) - (c1 < c0)
        if dr and dc:
            raise ValueError(f"corners ({r0}, {c0}) and ({r1}, {c1}) share no row or column")
        cells.extend((r0 + k * dr, c0 + k * dc) for k in range(1, abs(r1 - r0) + abs(c1 - c0) + 1))
    return cells


def _sine_canonical(rng: random.Random, rows: int, cols: int, npieces: int, gap: int) -> list[Cell]:
    """Boustrophedon from ``(gap, gap)``: runs along rows, crossings of 2 cells downwards.

    ``npieces`` bounds the unit steps spent crossing; each run ends at the far column or one short of
    it (fair coin).
    """
    row, col = gap, gap
    corners = [(row, col)]
    steps_left = npieces
    eastward = True
    while True:
        short = rng.randrange(2)
        col = cols - 1 - short if eastward else short
        corners.append((row, col))
        down = min(2, steps_left, rows - 1 - row)
        if down == 0:
            break
        row += down
        steps_left -= down
        corners.append((row, col))
        if down < 2 or steps_left == 0:
            break
        eastward = not eastward
    return _polyline(corners)


def _spiral_arm(k: int, height: int, width: int) -> int:
    """Steps of arm ``k`` of a clockwise spiral filling a ``height`` x ``width`` box from its corner.

    Arms 0, 1, 2 follow three sides (W-1, H-1, W-1); from then on each arm is 2 shorter than the last
    arm parallel to it (H-3, W-3, H-5, W-5, ...), keeping one free line between the rings.
    """
    if k == 0:
        return width - 1
    side = height if k % 2 else width
    return side - 1 - 2 * ((k - 1) // 2)


def _spiral_canonical(rows: int, cols: int, npieces: int, gap: int) -> list[Cell]:
    """Clockwise spiral from ``(gap, gap)`` inside the table inset by ``gap``; first arm rightwards."""
    height, width = rows - 2 * gap, cols - 2 * gap
    row, col = gap, gap
    corners = [(row, col)]
    for k in range(npieces + 1):
        steps = _spiral_arm(k, height, width)
        if k and steps < 2:  # the rings have closed in: end at the previous corner
            break
        if k == npieces:  # after the last turn, one step into the next arm
            steps = 1
        d_row, d_col = _CLOCKWISE[k % 4]
        row, col = row + steps * d_row, col + steps * d_col
        corners.append((row, col))
    return _polyline(corners)


def _compose_walk(rng: random.Random, n: int, m: int, npieces: int) -> list[Cell]:
    """Corner walk on the shrinking free rectangle (table coordinates; see the module docstring)."""
    # free[axis] = [low, high] of the free rectangle along that axis (0: rows, 1: columns);
    # side[axis] = which end of that range (0: low, 1: high) the walker stands on.
    free = [[0, n - 1], [0, m - 1]]
    side = [rng.randrange(2), rng.randrange(2)]
    pos = [free[0][side[0]], free[1][side[1]]]
    cells = [tuple(pos)]
    axis = rng.randrange(2)  # the axis the next run moves along
    for _ in range(npieces):
        # run to the far end of the free range along `axis`
        side[axis] = 1 - side[axis]
        target = free[axis][side[axis]]
        while pos[axis] != target:
            pos[axis] += 1 if target > pos[axis] else -1
            cells.append(tuple(pos))
        # two steps inward along the other axis, cutting the swept line (and the next) off
        other = 1 - axis
        inward = 1 if side[other] == 0 else -1
        for _ in range(2):
            nxt = pos[other] + inward
            if not (free[other][0] <= nxt <= free[other][1]) or nxt == 0:
                return cells
            pos[other] = nxt
            free[other][side[other]] = nxt
            cells.append(tuple(pos))
        # spiral-like (keep running along the crossing's axis) or sine-like (back along `axis`)
        axis = other if rng.randrange(2) else axis
    return cells


def _far_pair(rng: random.Random, size: int) -> tuple[int, int]:
    """Start and end coordinates on one axis of a multi-piece random path (see the module docstring)."""
    weight, ends = [], []
    for x in range(size):
        up = list(range(1, x - MIN_SPAN + 1))  # never 0: the official list stops short of it
        down = list(range(x + MIN_SPAN, size))
        ends.append(up + down)
        weight.append(((x - MIN_SPAN >= 0) + (x + MIN_SPAN <= size - 1)) if up or down else 0)
    if not any(weight):
        raise UserError(f"{NAME}: a random path needs at least {MIN_SPAN + 1} rows and columns")
    start = rng.choices(range(size), weights=weight)[0]
    return start, rng.choice(ends[start])


def _random_path(rng: random.Random, n: int, m: int, max_pieces: int) -> list[Cell]:
    """A ``random``-family staircase of 1..max_pieces straight pieces."""
    pieces = rng.randint(1, max_pieces)
    if pieces == 1:
        # every (orientation, ordered endpoint pair) is weighted 1 / (pairs on that axis): the
        # official script redraws a uniform orientation and pair until the span is long enough
        options = []
        for vertical, size in ((True, n), (False, m)):
            pairs = [(a, b) for a in range(size) for b in range(size) if abs(a - b) >= MIN_SPAN]
            options += [(vertical, a, b, 1.0 / (size * (size - 1))) for a, b in pairs]
        if not options:
            raise UserError(f"{NAME}: a straight random path needs {MIN_SPAN + 1} rows or columns")
        vertical, a, b, _ = rng.choices(options, weights=[o[3] for o in options])[0]
        fixed = rng.randrange(m if vertical else n)
        return _polyline([(a, fixed), (b, fixed)] if vertical else [(fixed, a), (fixed, b)])
    start_row, end_row = _far_pair(rng, n)
    start_col, end_col = _far_pair(rng, m)
    end, size = (end_row, end_col), (n, m)
    pos = [start_row, start_col]
    corners = [tuple(pos)]
    axis = rng.randrange(2)  # 1: the first piece runs along the row (horizontal)
    for k in range(pieces):
        here, goal = pos[axis], end[axis]
        if pieces - k <= 2:
            pos[axis] = goal
        else:
            beyond = range(here) if here > goal else range(here + 1, size[axis])
            pos[axis] = rng.choice([x for x in beyond if abs(x - goal) > 1])
        corners.append(tuple(pos))
        axis = 1 - axis
    return _polyline(corners)


def _family_path(rng: random.Random, family: str, n: int, m: int, gap: int, npieces: int) -> list[Cell]:
    """One path of ``family`` on an ``n`` x ``m`` table (trimmed and oriented where the family is)."""
    if family == "random":
        return _random_path(rng, n, m, npieces)
    if family == "compose":
        cells = _compose_walk(rng, n, m, npieces)
    else:
        transpose = rng.random() < 0.5  # first run along a column
        flip_rows, flip_cols = rng.random() < 0.5, rng.random() < 0.5  # start at a bottom / right corner
        rows, cols = (m, n) if transpose else (n, m)
        if family == "sine":
            canon = _sine_canonical(rng, rows, cols, npieces, gap)
        else:
            canon = _spiral_canonical(rows, cols, npieces, gap)
        cells = []
        for a, b in canon:
            r, c = (b, a) if transpose else (a, b)
            cells.append((n - 1 - r if flip_rows else r, m - 1 - c if flip_cols else c))
    most = _END_TRIM[family]
    head, tail = rng.randint(0, most), rng.randint(0, most)
    cells = cells[head:len(cells) - tail]
    return cells[::-1] if rng.random() < 0.5 else cells


def _draw(rng: random.Random, family: str, gap: int, npieces: int,
          rows: tuple[int, int], cols: tuple[int, int]) -> dict:
    """One table (shape, names, months, digits) and a path of ``family`` on it."""
    n, m = rng.randint(*rows), rng.randint(*cols)
    names = rng.sample(PRODUCTS, n)
    months = rng.sample(MONTHS, m)
    table = [[rng.randrange(10) for _ in range(m)] for _ in range(n)]
    path = _family_path(rng, family, n, m, gap, npieces)
    return {"family": family, "gap": gap, "npieces": npieces, "row_names": names, "col_names": months,
            "table": table, "path": [[r, c] for r, c in path]}


# ---------------------------------------------------------------------------------------------------
# Path checks
# ---------------------------------------------------------------------------------------------------


def path_turns(path: Sequence[Sequence[int]]) -> int:
    """Number of direction changes along ``path`` (cells as ``(row, col)``)."""
    steps = [(b[0] - a[0], b[1] - a[1]) for a, b in zip(path, path[1:])]
    return sum(1 for s, t in zip(steps, steps[1:]) if s != t)


def path_sum(raw: dict) -> int:
    """The total of the table values on the path (the gold answer)."""
    return sum(int(raw["table"][r][c]) for r, c in raw["path"])


def path_problem(path: Sequence[Sequence[int]], n: int, m: int) -> str | None:
    """Why ``path`` is not a simple path of 4-neighbour steps inside an ``n`` x ``m`` table, or None.

    The official scripts do not check this; :func:`generate` draws again on any such path.
    """
    if len(path) < 2:
        return "fewer than 2 cells"
    for r, c in path:
        if not (0 <= r < n and 0 <= c < m):
            return f"cell ({r}, {c}) outside the {n}x{m} table"
    for a, b in zip(path, path[1:]):
        if abs(a[0] - b[0]) + abs(a[1] - b[1]) != 1:
            return f"cells {tuple(a)} and {tuple(b)} are not neighbours"
    if len({tuple(p) for p in path}) != len(path):
        return "the path visits a cell twice"
    return None



# ---------------------------------------------------------------------------------------------------
# Generation
# ---------------------------------------------------------------------------------------------------


def generate_family(family: str, n: int, seed: int, gap: int = 0, npieces: int = 4,
                    rows: tuple[int, int] = (7, 12), cols: tuple[int, int] = (7, 10)) -> list[dict]:
    """``n`` tables with paths of one family (``gap`` and ``npieces`` as the official script flags).

    For ``random``, ``npieces`` is ``--max_pieces`` (1-4). Paths are returned as built, unchecked
    (see :func:`path_problem`); deterministic for ``seed``. Ids are ``{i}_{seed}`` as officially.
    """
    if family not in FAMILIES:
        raise UserError(f"{NAME}: unknown path family {family!r}; known: {', '.join(FAMILIES)}")
    if gap not in (0, 1):
        raise UserError(f"{NAME}: gap must be 0 or 1 (got {gap})")
    if not (1 <= npieces <= (4 if family == "random" else 99)):
        raise UserError(f"{NAME}: npieces={npieces} is out of range for the {family} family")
    if n < 0:
        raise UserError(f"{NAME}: n must be non-negative (got {n})")
    rng = random.Random(seed)
    out = []
    for i in range(n):
        raw = _draw(rng, family, gap, npieces, rows, cols)
        raw["id"] = f"{i}_{seed}"
        out.append(raw)
    return out


def generate(level: str, n: int, seed: int, **sizes) -> list[dict]:
    """``n`` puzzles of ``level`` from the official mixture, deterministic for ``seed``.

    Sizes: ``rows``, ``cols`` (table shape, drawn uniformly in the range) and ``turns`` (direction
    changes of the path); each an int or an inclusive ``(lo, hi)`` inside :data:`SIZES`. Every puzzle
    draws a family (equal shares), a gap and an npieces (uniform over the level's values), then a
    table and path; a path that is not simple, contiguous and inside the table (none is expected), or
    whose turn count is outside ``turns``, is drawn again, so a ``turns`` range gives the family
    mixture conditioned on it.

    A record: ``id``, ``level``, ``family``, ``gap``, ``npieces`` (``--max_pieces`` for random),
    ``row_names``, ``col_names``, ``table`` (rows of digits) and ``path`` (``[row, col]`` cells, 0-based,
    in reading order; the first is START_CELL).
    """
    level = check_level(level)
    ranges = check_sizes(NAME, level, SIZES[level], sizes)
    if n < 0:
        raise UserError(f"{NAME}: n must be non-negative (got {n})")
    t_lo, t_hi = ranges["turns"]
    families = LEVEL_FAMILIES[level]
    rng = random.Random(f"{NAME}/{level}/{seed}")
    out = []
    for i in range(n):
        for _ in range(MAX_TRIES):
            family, gaps, npieces = rng.choice(families)
            raw = _draw(rng, family, rng.choice(gaps), rng.choice(npieces), ranges["rows"], ranges["cols"])
            nr, nc = len(raw["table"]), len(raw["table"][0])
            if path_problem(raw["path"], nr, nc) is None and t_lo <= path_turns(raw["path"]) <= t_hi:
                break
        else:
            raise UserError(f"{NAME} {level}: no path with {t_lo}..{t_hi} turns on a {ranges['rows']} x "
                            f"{ranges['cols']} table in {MAX_TRIES} draws; widen the sizes")
        out.append({"id": f"{NAME}-{level}-{seed}-{i}", "level": level, **raw})
    return out


# ---------------------------------------------------------------------------------------------------
# Text modality and conversations
# ---------------------------------------------------------------------------------------------------


def latex_text(raw: dict) -> str:
    """The official ``text`` field: Styler.to_latex of the marked table, post-processed as the scripts do.

    A column holding a path cell becomes object dtype once ``"v*"`` is written into it, so Styler
    left-aligns it (``l``); untouched integer columns are right-aligned (``r``); the index is ``l``.
    """
    on_path = {(r, c) for r, c in raw["path"]}
    table, cols = raw["table"], raw["col_names"]
    marked_cols = {c for _, c in on_path}
    fmt = "l" + "".join("l" if j in marked_cols else "r" for j in range(len(cols)))
    lines = ["\\begin{table}[ht]", "\\centering", f"\\begin{{tabular}}{{{fmt}}}",
             " & " + " & ".join(cols) + " \\\\"]
    for i, (name, row) in enumerate(zip(raw["row_names"], table)):
        cells = [f"{v} *" if (i, j) in on_path else f"{v}" for j, v in enumerate(row)]
        lines.append(f" {name} & " + " & ".join(cells) + " \\\\")
    lines += [" \\end{tabular}", f"\\caption{{{CAPTION}}}", f"\\label{{{LABEL}}}", "\\end{table}"]
    return "\n".join(lines)


def _cell(raw: dict, k: int) -> str:
    r, c = raw["path"][k]
    return f"({raw['row_names'][r]}, {raw['col_names'][c]})"


def _question(template: str, raw: dict) -> str:
    return template.replace("START_CELL", _cell(raw, 0)).replace("END_CELL", _cell(raw, -1))


def chain_of_thought(raw: dict) -> str:
    """create_splits.py's reasoning: one tab-separated line per path cell, the sum, the answer."""
    lines = ""
    values = []
    for r, c in raw["path"]:
        v = int(raw["table"][r][c])
        lines += f"{r + 1}\t{c + 1}\t{raw['row_names'][r]}\t{raw['col_names'][c]}\t{v}\n"
        values.append(v)
    total = sum(values)
    return f"{_ENUMERATE}{lines}\n\nThe total is {' + '.join(map(str, values))} = {total}.\n\nAnswer: {total}"


def conversation(raw: dict, data_type: str, cot: bool = True) -> dict:
    """The LLaVA-style record of create_splits.py for ``data_type`` (see :data:`DATA_TYPES`).

    NOTE: the official table_readout scripts write only ``+cot`` files (image2answer,
    image2answer+text, text2answer); ``scripts/combine_data.py --no_cot`` would look for files they
    never create. Without ``cot`` the answer here is ``Answer: S`` alone; image2answer+text keeps
    its conversion (as grid_navigation's official no-CoT files do) followed by ``\\n\\nAnswer: S``.
    """
    if data_type not in DATA_TYPES:
        raise UserError(f"{NAME}: unknown data type {data_type!r}; known: {', '.join(DATA_TYPES)}")
    text = latex_text(raw)
    total = path_sum(raw)
    reasoning = chain_of_thought(raw) if cot else f"Answer: {total}"
    if data_type == "image2text":
        human, gpt = _IMAGE2TEXT_QUESTION, text
    elif data_type == "image2answer":
        human, gpt = _question(_IMAGE_QUESTION, raw), reasoning
    elif data_type == "image2answer+text":
        human, gpt = _question(_IMAGE_QUESTION, raw), f"{CONVERT_INSTRUCTION}\n{text}\n\n{reasoning}"
    else:  # text2answer
        human, gpt = text + _question(_TEXT_QUESTION, raw), reasoning
    return {"id": raw["id"], "conversations": [{"from": "human", "value": human}, {"from": "gpt", "value": gpt}]}


# ---------------------------------------------------------------------------------------------------
# Scoring
# ---------------------------------------------------------------------------------------------------

_ANSWER = re.compile(r"Answer:\s*([-+]?\d+)")


def parse_answer(response: str) -> int | None:
    """The integer of the last ``Answer: N`` in ``response`` (thousands commas allowed), or None."""
    found = _ANSWER.findall(re.sub(r"(\d),(\d)", r"\1\2", response))
    return int(found[-1]) if found else None


def score(raw: dict, response: str) -> bool:
    """True when the response's ``Answer: N`` equals the path total."""
    got = parse_answer(response)
    return got is not None and got == path_sum(raw)


# The number pattern of the official metric: decimals keep a sign, integers are matched unsigned.
_METRIC_NUMBER = re.compile(r"[-+]?\d*\.\d+|\d+")


def official_exact_match(raw: dict, response: str) -> bool:
    """The official VLMEvalKit table metric (``OurEval_Table_eval``'s exact match), for comparison.

    It reads the numbers between the last ``total is`` and the ``=`` after it (the whole response when
    there is no ``total is``; digit-comma-digit joined first) and compares them, comma-joined, with the
    gold CoT's summands: the path values in order, not the total.
    """
    summands = response.rpartition("total is")[2].partition("=")[0]
    found = _METRIC_NUMBER.findall(re.sub(r"(\d),(\d)", r"\1\2", summands))
    return ",".join(found) == ",".join(str(int(raw["table"][r][c])) for r, c in raw["path"])


# ---------------------------------------------------------------------------------------------------
# Image modality
# ---------------------------------------------------------------------------------------------------

WIDTH, HEIGHT = 1500, 800  # the official figure: figsize=(15, 8) at matplotlib's 100 dpi
HEADER = (0x40, 0x46, 0x6E)
BODY = (0xF5, 0xF5, 0xF5)
PATH = (255, 255, 0)  # matplotlib's "yellow"
LINE = (0, 0, 0)
_MARGIN = 16
_PAD = 6


def _text_size(text: str, size: int, bold: bool) -> tuple[int, int]:
    box = _font(size, bold).getbbox(text)
    return box[2] - box[0], box[3] - box[1]


def layout(raw: dict) -> dict:
    """Pixel geometry of :func:`render`: cell boxes ``(x0, y0, x1, y1)`` (x1, y1 exclusive) and font sizes.

    ``cells[(i, j)]`` is the body cell of table row ``i``, column ``j``; ``header[j]`` the month cells,
    ``index[i]`` the product cells and ``corner`` the empty top-left cell.
    """
    n, m = len(raw["table"]), len(raw["table"][0])
    row_h = (HEIGHT - 2 * _MARGIN) // (n + 1)
    name_size = 20
    index_w = max(_text_size(s, name_size, True)[0] for s in raw["row_names"]) + 2 * _PAD
    col_w = (WIDTH - 2 * _MARGIN - index_w) // m
    # Shrink the fonts until every label fits its cell with padding (deterministic: a fixed search).
    while name_size > 8 and (
        max(_text_size(s, name_size, True)[0] for s in raw["col_names"]) + 2 * _PAD > col_w
        or _text_size("Ag", name_size, True)[1] + 2 * _PAD > row_h
    ):
        name_size -= 1
    value_size = min(22, name_size + 2)
    while value_size > 8 and (
        max(_text_size(w, value_size, False)[0] for w in DIGIT_WORDS) + 2 * _PAD > col_w
        or _text_size("Ag", value_size, False)[1] + 2 * _PAD > row_h
    ):
        value_size -= 1
    total_w = index_w + m * col_w
    total_h = (n + 1) * row_h
    x0, y0 = (WIDTH - total_w) // 2, (HEIGHT - total_h) // 2
    xs = [x0, x0 + index_w] + [x0 + index_w + (j + 1) * col_w for j in range(m)]
    ys = [y0 + i * row_h for i in range(n + 2)]
    return {
        "corner": (xs[0], ys[0], xs[1], ys[1]),
        "header": [(xs[j + 1], ys[0], xs[j + 2], ys[1]) for j in range(m)],
        "index": [(xs[0], ys[i + 1], xs[1], ys[i + 2]) for i in range(n)],
        "cells": {(i, j): (xs[j + 1], ys[i + 1], xs[j + 2], ys[i + 2]) for i in range(n) for j in range(m)},
        "name_size": name_size,
        "value_size": value_size,
    }


def _draw_cell(draw: ImageDraw.ImageDraw, box, fill, text: str, font, color) -> None:
    x0, y0, x1, y1 = box
    draw.rectangle((x0, y0, x1 - 1, y1 - 1), fill=fill, outline=LINE, width=1)
    if text:
        draw.text(((x0 + x1) / 2, (y0 + y1) / 2), text, fill=color, font=font, anchor="mm")


def render(raw: dict) -> Image.Image:
    """The puzzle as a 1500x800 RGB table image (values as ZERO..NINE, path cells yellow)."""
    geo = layout(raw)
    img = Image.new("RGB", (WIDTH, HEIGHT), (255, 255, 255))
    draw = ImageDraw.Draw(img)
    bold, plain = _font(geo["name_size"], True), _font(geo["value_size"], False)
    white, black = (255, 255, 255), (0, 0, 0)
    _draw_cell(draw, geo["corner"], HEADER, "", bold, white)
    for j, name in enumerate(raw["col_names"]):
        _draw_cell(draw, geo["header"][j], HEADER, name, bold, white)
    for i, name in enumerate(raw["row_names"]):
        _draw_cell(draw, geo["index"][i], HEADER, name, bold, white)
    on_path = {(r, c) for r, c in raw["path"]}
    for (i, j), box in geo["cells"].items():
        fill = PATH if (i, j) in on_path else BODY
        _draw_cell(draw, box, fill, DIGIT_WORDS[int(raw["table"][i][j])], plain, black)
    return img


def validate_image(image) -> None:
    """Raise :class:`UserError` unless ``image`` is a 1500x800 RGB PIL image (ours and the official's)."""
    check_rgb_image(image, NAME, (WIDTH, HEIGHT))
