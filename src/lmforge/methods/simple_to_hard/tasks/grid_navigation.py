"""Grid Navigation (S2H, arXiv 2501.02669): collect every object on a grid, avoid the obstacles, reach D.

The task of the paper's official data (princeton-pli/VLM_S2H, ``data_generation/grid_navigation``, scored
by ``VLMEvalKit/vlmeval/evaluate/OurEval.py``), implemented here independently from this specification;
only the data formats (prompt, text table, chain of thought, answer, raw record fields) are the official
ones, character for character.

Puzzle distribution
-------------------
A puzzle is a grid of 8 to 12 rows by 8 to 12 columns. The start S lies on a uniformly random cell. The
destination D lies in another row and another column than S (the official minimum separation of one row
and one column); its row is uniform over the allowed rows and its column uniform over the allowed
columns, where the official candidate lists for D stop before the first row and the first column, so D
never lies there. Every cell of the rectangle spanned by S and D, other than S and D, is a candidate obstacle
and exactly ``floor(0.35 * candidates)`` of them, chosen uniformly, become obstacles; every cell outside
that rectangle becomes an obstacle independently with probability 0.35. The objects then take distinct
uniformly random cells other than S and D (an object may cover an obstacle, which disappears) and are
numbered by a greedy tour: from S, the nearest remaining object in Manhattan distance is next, ties going
to the earlier drawn. (The official code draws the object cells with replacement; a grid with two objects
on one cell can never be solved by the solver below, so those grids are always dropped and drawing
distinct cells gives the same distribution of kept puzzles.)

SIMPLE puzzles have 1 or 2 objects, one obstacle type and a solver trace of 10 to 25 states; HARD puzzles
have 2 to 5 objects, 3, 4 or 5 obstacle types and a trace of 26 to 60 states. Each obstacle cell draws its
type uniformly among the puzzle's types (so a grid may show fewer types than it declares); the type names
are distinct names drawn from the five obstacle names, and the object names are 2 (SIMPLE) or 5 (HARD)
distinct names drawn from the 31 object names, of which the first ones label the objects on the grid in
tour order. Grids the solver cannot solve are dropped, so "Answer: No path exists" never occurs in the data.

Solver and chain of thought
---------------------------
The gold answer and the CoT come from a depth-first search. The current goal is the next object of the
tour, or D once every object is collected. At every cell the four moves are tried in order of the
Manhattan distance, then the squared Euclidean distance, from the neighbouring cell to the goal, ties in
the order up, down, left, right. A move is refused as ``invalid`` (off the grid), ``visited``, ``closed``
(an obstacle), ``future-objects-idx-<k+1>`` (a later object of the tour, while the k-th, 0-indexed, is
due) or ``future-objects-destination`` (D while an object is still due). Otherwise the search steps there;
stepping on the due object collects it and starts a fresh visited set. When every move of a cell has been
refused or has failed, the cell is reported as ``retrace`` and the search backs up one cell; a failed move
is then listed as ``blocked`` (printed ``visited``; a ``future-collect`` line names the object being sought,
as officially). Two details of the official search are kept because
they shape the traces: the order of the moves of a cell is fixed when the cell is entered, and when a move
that collected an object fails, the cell keeps counting the object as collected and keeps the fresh visited
set for its remaining moves. The trace holds one state per move taken and one per ``retrace``; its length
is the puzzle's ``num_steps``. This module's search keeps an explicit stack of open cells; checked against the
official search on 10 500 grids (this sampler's, the official sampler's, and small dense stress grids), it
gave identical traces and answers on all of them.

Records, text and scoring
-------------------------
A raw record keeps the official fields: ``start_row`` ... 1-indexed, ``reasoning_steps`` (0-indexed
``row``/``col``, ``action``, ``checkpoint``, ``considered_directions``), ``text`` the ``:0:-1:3`` grid with
obstacle types ``-1..-k`` and objects ``3..``, ``objects`` / ``obstacles`` the ``:``-joined names,
``collect_objects_coordinates`` (``r-c`` 1-indexed, tour order) and ``collect_objects_idx``. Its text twin::

     & a & b & c
     a & S & O & dot
     b & O & heart & D

Rows and columns are letters (``a`` = 1), rows top to bottom and columns left to right, as in the image's
tick labels and the CoT. A response is scored by the official rule: the moves after the last ``Answer: ``,
split on single spaces (any other token voids the list), walked from S; the walk must stay on the grid,
never stand on an obstacle, and reach D having visited every object (moves after the first arrival on D
are ignored).

# NOTE: bookkeeping differs from the official pipeline, not the distribution. The official code draws
#   40 000 grids per (rows, cols, objects) configuration, keeps an equal share of each configuration in
#   the step range and splits HARD into thirds for 3/4/5 obstacle types. Here each puzzle draws its
#   (rows, cols, objects, obstacle types) uniformly and redraws grids of that configuration until one is
#   in the step range, from one ``numpy.random.default_rng(seed)``. Puzzles are not the official ones for
#   any seed (the official random stream is not reproduced).
# NOTE: when a move that collected an object fails, a later move of the same cell could in principle
#   succeed without that object (the kept official quirk above); ``generate`` redraws any grid whose gold
#   answer :func:`simulate` rejects, so every gold answer here passes the scorer.
# NOTE: image2text: the official ``create_template.py`` defines the image2text conversion (prompt
#   ``<image>\\n\\n`` + image description + conversion instruction, answer the text table) but never writes
#   that file; here it is produced with the object and obstacle names, the conversion part of
#   image2answer+text alone.
# NOTE: no library solver is reused (the CoT needs this exact search order and trace); networkx serves
#   only the tests, as an independent shortest-path oracle.
# NOTE: the image is drawn with PIL (see :func:`render`): same content and colours as the official
#   matplotlib figure (1000 x 1000, S sky blue, D dark green, black cell borders, object and obstacle
#   symbols, letter tick labels), not pixel-identical to it.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from lmforge.common.errors import UserError
from lmforge.methods.simple_to_hard.tasks import DATA_TYPES, check_level, check_rgb_image, check_sizes
from lmforge.methods.simple_to_hard.tasks import font as _font

NAME = "grid_navigation"

SIZES = {
    "SIMPLE": {"nrows": (8, 12), "ncols": (8, 12), "tot_objs": (1, 2), "n_obstacles": (1, 1), "num_steps": (10, 25)},
    "HARD": {"nrows": (8, 12), "ncols": (8, 12), "tot_objs": (2, 5), "n_obstacles": (3, 5), "num_steps": (26, 60)},
}
MAX_OBJS = {"SIMPLE": 2, "HARD": 5}  # object names drawn per puzzle
PROB = 0.35  # obstacle probability / quota fraction
MIN_SEPARATION = 1  # S and D differ by at least this many rows and columns
MAX_ATTEMPTS = 20000  # grids drawn per puzzle before giving up on a size combination
IMAGE_SIZE = (1000, 1000)
S_COLOR = (135, 206, 235)  # 'skyblue'
D_COLOR = (0, 100, 0)  # 'darkgreen'
INK = (0, 0, 0)
PAPER = (255, 255, 255)

# Names and symbols (data: the names appear in the prompts; symbol k draws name k).
OBJ_NAMES = [" " + s for s in (
    "heart", "crown", "flag", "star", "flower", "umbrella", "plane", "phone", "spark", "diamond", "queen",
    "hammer", "club", "gear", "arrow", "sun", "bishop", "note", "coffee", "anchor", "cloud", "pawn", "castle",
    "horse", "infinity", "moon", "null", "approx", "integral", "product", "sum")]
OBS_NAMES = [" " + s for s in ("dot", "cross", "square", "triangle", "plus")]
OBJ_SYMBOLS = ['❤️', '♔', '⚑', '★', '✿', '☂', '✈', '☎', '✦', '❖', '♛', '⚒︎', '♣︎', '⚙', '➜', '☀',
               "♗", "♪", "☕", "⚓", "☁", "♙", "♖", "♘", "∞", "☾", "∅", "≈", "∫", "∏", "∑"]
OBS_SYMBOLS = ['●', '✖', '◼️', '▲', '✚']

# Prompt, CoT and answer strings (data formats, as in the official files).
IMAGE_DESCRIPTION = "The image shows a 2 dimensional grid. "
TEXT_DESCRIPTION = "The table above shows a 2 dimensional grid. "
IMAGE2TEXT_PROMPT = ("Convert the image into a text version of a table, where cells colored in blue, green are "
                     "respectively marked as S, D. Blank cells are given by O. Objects and obstacles are mentioned "
                     "by their names.")
GRID_DESCRIPTION = ("The grid is filled up with objects, which you will be asked to recognize and collect, and "
                    "obstacles, which you should avoid. Possible objects and obstacles are given as follows:\n"
                    f"Objects:{','.join(OBJ_NAMES)}\nObstacles:{','.join(OBS_NAMES)}\n")
ADD_GRID_DESCRIPTION_IMAGE = "Cells that don't contain any object or obstacle are left blank. "
ADD_GRID_DESCRIPTION_TEXT = "Cells that don't contain any object or obstacle are marked by O. "
IMAGE2ANSWER_PROMPT = ("A traveller starts at the source (colored in blue) and wishes to go to the destination "
                       "(colored in green). ")
TEXT2ANSWER_PROMPT = ("A traveller starts at the source (marked as S) and wishes to go to the destination "
                      "(marked as D). ")
COMMON_INSTRUCTION = ("Your task is to give a list of actions ( left right up down) each indicating a movement by "
                      "1 cell that the traveller needs to follow. The traveller must recognize all objects in the "
                      "grid, collect them but avoid obstacles in the process. Provide the final answer as "
                      "'Answer: [list of actions]'. If no path exists, output 'Answer: No path exists'.")
COT_HEADER = "We follow a depth first search, always moving towards the destination."
NO_PATH_ANSWER = "Answer: No path exists"

MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}


def _letter(i: int) -> str:
    """1-indexed row/column -> letter (1 -> 'a'; 0 -> '`' and n + 1 name cells just off the grid)."""
    return chr(96 + i)


def _cell(r: int, c: int) -> str:
    return f"{_letter(r)}, {_letter(c)}"


# ---------------------------------------------------------------- puzzle sampling


def _endpoints(rng: np.random.Generator, nrows: int, ncols: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """S anywhere; D at least :data:`MIN_SEPARATION` rows and columns away, never in row 0 or column 0."""
    s, d = [], []
    for size in (nrows, ncols):
        here = int(rng.integers(size))
        idx = np.arange(1, size)
        there = idx[np.abs(idx - here) >= MIN_SEPARATION]
        s.append(here)
        d.append(int(rng.choice(there)))
    return (s[0], s[1]), (d[0], d[1])


def _obstacles(rng: np.random.Generator, shape: tuple[int, int], s, d, prob: float) -> np.ndarray:
    """Boolean obstacle mask: a fixed quota inside the S-D rectangle, Bernoulli(prob) outside it."""
    rr, cc = np.indices(shape)
    box = ((rr >= min(s[0], d[0])) & (rr <= max(s[0], d[0]))
           & (cc >= min(s[1], d[1])) & (cc <= max(s[1], d[1])))
    candidates = box.copy()
    candidates[s] = candidates[d] = False
    pool = np.flatnonzero(candidates)
    mask = ~box & (rng.random(shape) < prob)
    mask.flat[rng.choice(pool, int(len(pool) * prob), replace=False)] = True
    return mask


def _object_tour(rng: np.random.Generator, shape: tuple[int, int], s, d, count: int) -> list[tuple[int, int]]:
    """``count`` distinct cells other than S and D, in greedy nearest-first (L1) order from S."""
    ncols = shape[1]
    cells = np.setdiff1d(np.arange(shape[0] * ncols), [s[0] * ncols + s[1], d[0] * ncols + d[1]])
    drawn = rng.choice(cells, count, replace=False)
    pending = np.column_stack(np.divmod(drawn, ncols))  # drawing order breaks distance ties
    tour, here = [], np.asarray(s)
    while len(pending):
        k = int(np.argmin(np.abs(pending - here).sum(axis=1)))
        here = pending[k]
        tour.append((int(here[0]), int(here[1])))
        pending = np.delete(pending, k, axis=0)
    return tour


def _draw_grid(rng: np.random.Generator, nrows: int, ncols: int, n_objects: int, prob: float = PROB):
    """One grid before obstacle typing: ``(grid, S, D, objects)``; grid values 0/1 S/2 D/-1/3.. objects."""
    s, d = _endpoints(rng, nrows, ncols)
    grid = np.where(_obstacles(rng, (nrows, ncols), s, d, prob), -1, 0)
    grid[s], grid[d] = 1, 2
    objects = _object_tour(rng, grid.shape, s, d, n_objects)
    for k, cell in enumerate(objects):
        grid[cell] = 3 + k
    return grid, s, d, objects


# ---------------------------------------------------------------- solver


class _Overrun(Exception):
    """The trace grew past the caller's limit (it only grows, so the grid is out of range)."""


class _Open:
    """A cell on the search stack: its remaining moves (fixed on entry), refusals so far and progress."""

    __slots__ = ("cell", "due", "seen", "todo", "notes", "pending")

    def __init__(self, cell, due, seen, todo):
        self.cell, self.due, self.seen, self.todo = cell, due, seen, todo
        self.notes: list[dict] = []
        self.pending: str | None = None  # the move whose subtree is being explored


def _ranked_moves(cell, goal) -> deque:
    """Moves from ``cell`` nearest-first to ``goal``: L1, then squared L2, then up/down/left/right."""
    def key(item):
        dr, dc = goal[0] - cell[0] - item[1][0], goal[1] - cell[1] - item[1][1]
        return abs(dr) + abs(dc), dr * dr + dc * dc
    return deque(sorted(MOVES.items(), key=key))


def _solve(grid, start, dest, objects, limit: int | None = None):
    """Depth-first search of the module docstring: ``(trace, moves)``, ``moves`` None when unsolvable.

    ``grid`` is a 2-D array/list (negative = obstacle, ``3 + k`` = the k-th object of ``objects``), cells are
    0-indexed ``(row, col)`` tuples. ``limit``: raise :class:`_Overrun` once the trace is longer.
    """
    grid = np.asarray(grid)
    nrows, ncols = grid.shape
    objects = [tuple(int(v) for v in o) for o in objects]
    start, dest = tuple(start), tuple(dest)
    last = len(objects)
    trace: list[dict] = []
    moves: list[str] = []

    def record(state):
        trace.append(state)
        if limit is not None and len(trace) > limit:
            raise _Overrun

    def enter(cell, due, seen):
        seen.add(cell)
        return _Open(cell, due, seen, _ranked_moves(cell, objects[due] if due < last else dest))

    def refusal(top, nxt):
        if not (0 <= nxt[0] < nrows and 0 <= nxt[1] < ncols):
            return "invalid"
        if nxt in top.seen:
            return "visited"
        if grid[nxt] < 0:
            return "closed"
        if top.due < last:
            if grid[nxt] - 3 > top.due:
                return f"future-objects-idx-{top.due + 1}"
            if nxt == dest:
                return "future-objects-destination"
        return None

    stack = [enter(start, 0, set())]
    while stack:
        top = stack[-1]
        if top.pending is not None:  # came back from a failed subtree
            top.notes = top.notes + [{"action": top.pending, "result": "blocked"}]
            top.pending = None
            moves.pop()
        row, col = top.cell
        if not top.todo:
            record({"row": row, "col": col, "action": "retrace", "considered_directions": top.notes,
                    "checkpoint": -1})
            stack.pop()
            continue
        name, (dr, dc) = top.todo.popleft()
        nxt = (row + dr, col + dc)
        why = refusal(top, nxt)
        if why is not None:
            top.notes = top.notes + [{"action": name, "result": why}]
            continue
        checkpoint = -1
        if top.due < last and nxt == objects[top.due]:
            top.due += 1
            checkpoint = top.due
            top.seen = set()
        record({"row": row, "col": col, "action": name, "checkpoint": checkpoint, "considered_directions": top.notes})
        moves.append(name)
        if top.due == last and nxt == dest:
            return trace, moves
        top.pending = name
        stack.append(enter(nxt, top.due, top.seen))
    return trace, None


# ---------------------------------------------------------------- records


def _grid_text(grid) -> str:
    """The ``:0:-1:3`` text: every value prefixed by ``:``, one line (newline-terminated) per row."""
    return "\n".join("".join(f":{int(v)}" for v in row) for row in np.asarray(grid)) + "\n"


def parse_grid(text: str) -> list[list[int]]:
    """The ``:0:-1:3`` grid text back to rows of ints."""
    return [[int(v) for v in line.split(":")[1:]] for line in text.strip().splitlines()]


def _type_obstacles(rng: np.random.Generator, grid: np.ndarray, n_types: int, n_names: int):
    """Obstacle names and per-cell types, object names: ``(obstacles, objects, typed grid)``."""
    obstacle_names = rng.choice(len(OBS_NAMES), n_types, replace=False)
    typed = grid.copy()
    walls = typed == -1
    typed[walls] = -rng.integers(1, n_types + 1, size=int(walls.sum()))
    object_names = rng.choice(len(OBJ_NAMES), n_names, replace=False)
    return (":".join(OBS_NAMES[k] for k in obstacle_names), ":".join(OBJ_NAMES[k] for k in object_names), typed)


def _coords_text(objects) -> str:
    return ":".join(f"{r + 1}-{c + 1}" for r, c in objects)


def generate(level: str, n: int, seed: int, **sizes) -> list[dict]:
    """``n`` puzzles of ``level``; each size in :data:`SIZES` may be narrowed (an int or ``(lo, hi)``)."""
    level = check_level(level)
    ranges = check_sizes(NAME, level, SIZES[level], sizes)
    if n < 0:
        raise UserError(f"{NAME}: n must be non-negative (got {n})")
    if not (isinstance(seed, (int, np.integer)) and 0 <= seed < 2 ** 32):
        raise UserError(f"{NAME}: seed must be an integer in [0, 2**32) (got {seed!r})")
    rng = np.random.default_rng(int(seed))
    lo_steps, hi_steps = ranges["num_steps"]

    def pick(key):
        lo, hi = ranges[key]
        return int(rng.integers(lo, hi + 1))

    out = []
    for i in range(n):
        nrows, ncols, tot_objs, n_obstacles = pick("nrows"), pick("ncols"), pick("tot_objs"), pick("n_obstacles")
        for _ in range(MAX_ATTEMPTS):
            grid, s, d, objects = _draw_grid(rng, nrows, ncols, tot_objs)
            try:
                trace, moves = _solve(grid, s, d, objects, limit=hi_steps)
            except _Overrun:
                continue
            if moves is None or len(trace) < lo_steps:
                continue
            place = {"start_row": s[0] + 1, "start_col": s[1] + 1, "end_row": d[0] + 1, "end_col": d[1] + 1}
            check = dict(place, text=_grid_text(grid), collect_objects_coordinates=_coords_text(objects))
            if simulate(check, moves)[0]:
                break
        else:
            raise UserError(f"{NAME} {level}: no {nrows}x{ncols} grid with {tot_objs} objects and "
                            f"{lo_steps}-{hi_steps} DFS steps in {MAX_ATTEMPTS} draws; widen the sizes")
        obstacles, names, typed = _type_obstacles(rng, grid, n_obstacles, MAX_OBJS[level])
        out.append({
            "id": f"{NAME}_{level}_{seed}_{i}",
            "level": level,
            "nrows": nrows,
            "ncols": ncols,
            "tot_objs": tot_objs,
            "n_obstacles": n_obstacles,
            **place,
            "num_steps": len(trace),
            "reasoning_steps": trace,
            "is_solvable": True,
            "answer_steps": moves,
            "text": _grid_text(typed),
            "collect_objects_coordinates": _coords_text(objects),
            "collect_objects_idx": ":".join(str(k + 1) for k in range(len(objects))),
            "objects": names,
            "obstacles": obstacles,
        })
    return out


# ---------------------------------------------------------------- text formats


def _names(raw: dict) -> tuple[list[str], list[str]]:
    return raw["objects"].split(":"), raw["obstacles"].split(":")


def _label(value: int, objects: list[str], obstacles: list[str]) -> str:
    """What a grid value reads as in the text table (names carry their leading space)."""
    fixed = {0: " O", 1: " S", 2: " D"}
    if value in fixed:
        return fixed[value]
    return objects[value - 3] if value > 2 else obstacles[-value - 1]


def text_table(raw: dict) -> str:
    """The text twin of the grid: a header of column letters, then one ``&``-separated line per row."""
    objects, obstacles = _names(raw)
    grid = parse_grid(raw["text"])
    header = " &" + " &".join(f" {_letter(c)}" for c in range(1, len(grid[0]) + 1))
    lines = [f" {_letter(r)} &" + " &".join(_label(v, objects, obstacles) for v in row)
             for r, row in enumerate(grid, 1)]
    return "\n".join([header, *lines]) + "\n"


def _collected_names(raw: dict) -> list[str]:
    objects, _ = _names(raw)
    return [objects[int(k) - 1] for k in raw["collect_objects_idx"].split(":")]


def _verdict(note: dict, neighbour: tuple[int, int], grid, collect: list[str], obstacles: list[str]) -> str:
    """How the CoT words one considered move (``neighbour`` 1-indexed)."""
    result = note["result"]
    if result == "closed":
        return f"closed({obstacles[-grid[neighbour[0] - 1][neighbour[1] - 1] - 1]})"
    if result == "future-objects-destination":
        return "future-collect (destination)"
    if result.startswith("future-objects-idx-"):
        return f"future-collect ({collect[int(result.rsplit('-', 1)[1]) - 1]})"
    return {"invalid": "outside", "visited": "visited", "blocked": "visited"}[result]


def _cot_block(state: dict, collected: str | None, grid, collect: list[str], obstacles: list[str]) -> str:
    """One trace state: the cell (and the object just collected), the refused moves, then the move taken."""
    r, c = state["row"] + 1, state["col"] + 1
    lines = [f" {_cell(r, c)}:" + (f" Collect{collected}" if collected is not None else "")]
    for note in state["considered_directions"]:
        dr, dc = MOVES[note["action"]]
        said = _verdict(note, (r + dr, c + dc), grid, collect, obstacles)
        lines.append(f" {note['action']}: {_cell(r + dr, c + dc)} {said}")
    if state["action"] == "retrace":
        lines.append("No available actions. retrace 1 step")
    else:
        dr, dc = MOVES[state["action"]]
        lines.append(f" {state['action']}: {_cell(r + dr, c + dc)} okay")
    return "\n".join(lines)


def reasoning(raw: dict) -> str:
    """The DFS trace as the official CoT text (header, targets, one block per trace state)."""
    _, obstacles = _names(raw)
    collect = _collected_names(raw)
    grid = parse_grid(raw["text"])
    blocks, collected = [], None
    for state in raw["reasoning_steps"]:
        blocks.append(_cot_block(state, collected, grid, collect, obstacles))
        # an object collected by this move is announced on the next state
        collected = collect[state["checkpoint"] - 1] if state["checkpoint"] != -1 else None
    places = [tuple(int(v) for v in p.strip().split("-")) for p in raw["collect_objects_coordinates"].split(":")]
    targets = "Collect objects:" + "".join(f"{name}( {_cell(*p)})" for name, p in zip(collect, places))
    source, target = _cell(raw["start_row"], raw["start_col"]), _cell(raw["end_row"], raw["end_col"])
    ends = f"Source:( {source}) Destination:( {target})"
    return "\n".join([COT_HEADER, ends, targets, "Avoid" + "".join(obstacles), "\n".join(blocks)]) + "\n"


def answer_line(raw: dict) -> str:
    """``Answer: left right ...`` (``Answer: No path exists`` for an unsolvable record)."""
    if not raw.get("is_solvable", True):
        return NO_PATH_ANSWER
    return "Answer:" + "".join(f" {m}" for m in raw["answer_steps"])


_EXTRA_FIELDS = ("num_steps", "start_row", "start_col", "end_row", "end_col", "text", "obstacles", "objects",
                 "collect_objects_coordinates", "collect_objects_idx")


def conversation(raw: dict, data_type: str, cot: bool = True) -> dict:
    """The official LLaVA record for ``data_type``.

    Answer records carry the official extra fields (``num_steps``, ``start_row`` ..., ``text``,
    ``collect_objects_coordinates`` ...) that VLMEvalKit's grid evaluation reads; ``num_tokens`` and
    ``image_RGB`` are left out (the tokenizer and the image store are the caller's). image2text is the
    same with or without ``cot``.
    """
    if data_type not in DATA_TYPES:
        raise UserError(f"{NAME}: unknown data type {data_type!r}; known: {', '.join(DATA_TYPES)}")
    if data_type == "image2text":
        turns = ("<image>\n\n" + IMAGE_DESCRIPTION + IMAGE2TEXT_PROMPT, text_table(raw))
        return {"id": raw["id"], "conversations": [{"from": "human", "value": turns[0]},
                                                   {"from": "gpt", "value": turns[1]}]}
    response = (reasoning(raw) if cot else "") + answer_line(raw)
    if data_type == "text2answer":
        prompt = "".join([text_table(raw), "\n\n", TEXT_DESCRIPTION, GRID_DESCRIPTION, ADD_GRID_DESCRIPTION_TEXT,
                          TEXT2ANSWER_PROMPT, COMMON_INSTRUCTION])
    else:
        prompt = "".join(["<image>\n\n", IMAGE_DESCRIPTION, GRID_DESCRIPTION, ADD_GRID_DESCRIPTION_IMAGE,
                          IMAGE2ANSWER_PROMPT, COMMON_INSTRUCTION])
        if data_type == "image2answer+text":
            response = f"{IMAGE2TEXT_PROMPT}\n{text_table(raw)}\n{response}"
    rec = {"id": raw["id"], "conversations": [{"from": "human", "value": prompt}, {"from": "gpt", "value": response}]}
    rec.update({k: raw[k] for k in _EXTRA_FIELDS})
    return rec


# ---------------------------------------------------------------- scoring


def parse_answer(response: str) -> list[str]:
    """The moves after the last ``Answer: ``; any other token voids the list (the official rule).

    As officially, the text is split on single spaces, so ``Answer: left  right`` (two spaces),
    ``down.`` or moves on separate lines parse to ``[]``.
    """
    tokens = [t.strip() for t in response.rsplit("Answer: ", 1)[-1].strip().split(" ")]
    return tokens if all(t in MOVES for t in tokens) else []


def _objects(raw: dict) -> list[tuple[int, int]]:
    return [tuple(int(v) for v in s.split("-")) for s in raw["collect_objects_coordinates"].split(":")]


def simulate(raw: dict, moves: list[str]) -> tuple[bool, str]:
    """Walk ``moves`` from S (1-indexed cells) by the official verifier's rule; ``(ok, reason)``.

    A move must stay inside the grid and never land on an obstacle; objects count when visited, in any
    order; the walk ends at the first arrival on D, which succeeds only if every object was collected
    by then (moves after it are ignored, as the official verifier ignores them). A walk that runs out
    of moves elsewhere fails.
    # NOTE: the official check ``curr_r < 0`` lets row/column 0 through and indexes ``grid[-1]``; here
    # leaving the grid on any side fails.
    """
    grid = parse_grid(raw["text"])
    n, m = len(grid), len(grid[0])
    r, c = raw["start_row"], raw["start_col"]
    end = (raw["end_row"], raw["end_col"])
    objs = _objects(raw)
    got = [False] * len(objs)
    for k, mv in enumerate(list(moves) + [None]):
        for j, o in enumerate(objs):
            if (r, c) == o:
                got[j] = True
        if (r, c) == end:
            missing = [f"{_letter(a)}, {_letter(b)}" for (a, b), g in zip(objs, got) if not g]
            if missing:
                return False, f"reached D after {k} moves without the objects at ({'), ('.join(missing)})"
            extra = len(moves) - k
            return True, "reached D with every object" + (f"; {extra} later moves ignored" if extra else "")
        if mv is None:
            return False, f"the moves end at ({_letter(r)}, {_letter(c)}), not on D"
        if mv not in MOVES:
            return False, f"move {k + 1} is {mv!r}, not one of {', '.join(MOVES)}"
        r, c = r + MOVES[mv][0], c + MOVES[mv][1]
        if not (1 <= r <= n and 1 <= c <= m):
            return False, f"move {k + 1} ({mv}) leaves the grid"
        if grid[r - 1][c - 1] <= -1:
            return False, f"move {k + 1} ({mv}) steps on an obstacle at ({_letter(r)}, {_letter(c)})"
    raise AssertionError("unreachable")


def score(raw: dict, response: str) -> bool:
    """The official grid checker: parse ``Answer: ...`` and verify the walk (:func:`simulate`)."""
    moves = parse_answer(response)
    if not moves:
        return not raw.get("is_solvable", True)  # official: empty prediction and empty target agree
    return simulate(raw, moves)[0]


def shortest_path(raw: dict) -> list[str] | None:
    """A shortest move list that :func:`simulate` accepts (BFS over cell x collected set), or None.

    Objects in any order; D is entered only as the last move (the verifier stops at D); ties are broken
    by the move order up, down, left, right.
    """
    grid = parse_grid(raw["text"])
    n, m = len(grid), len(grid[0])
    objs = _objects(raw)
    bits = {}
    for j, o in enumerate(objs):
        bits[o] = bits.get(o, 0) | (1 << j)
    full = (1 << len(objs)) - 1
    start = (raw["start_row"], raw["start_col"])
    end = (raw["end_row"], raw["end_col"])
    s0 = (start[0], start[1], bits.get(start, 0))
    prev = {s0: None}
    queue = deque([s0])
    while queue:
        state = queue.popleft()
        r, c, mask = state
        for mv, (dr, dc) in MOVES.items():
            nr, nc = r + dr, c + dc
            if not (1 <= nr <= n and 1 <= nc <= m) or grid[nr - 1][nc - 1] <= -1:
                continue
            nmask = mask | bits.get((nr, nc), 0)
            if (nr, nc) == end and nmask != full:
                continue
            nxt = (nr, nc, nmask)
            if nxt in prev:
                continue
            prev[nxt] = (state, mv)
            if (nr, nc) == end:
                path = []
                while prev[nxt] is not None:
                    nxt, mv = prev[nxt]
                    path.append(mv)
                return path[::-1]
            queue.append(nxt)
    return None


# ---------------------------------------------------------------- image

_PLOT_BOX = (125, 120, 900, 890)  # left, top, right, bottom of the square-cell grid area (pixels)
_BORDER = 3  # cell border width in pixels (2 pt at 100 dpi)
_TICK = 5


def _glyphs(raw: dict) -> dict[int, str]:
    """Grid value -> symbol drawn in the cell (variation selectors dropped: the font draws the base glyph)."""
    objects, obstacles = _names(raw)
    plain = lambda s: s.replace("\ufe0f", "").replace("\ufe0e", "")  # noqa: E731
    out = {3 + k: plain(OBJ_SYMBOLS[OBJ_NAMES.index(name)]) for k, name in enumerate(objects)}
    out.update({-1 - k: plain(OBS_SYMBOLS[OBS_NAMES.index(name)]) for k, name in enumerate(obstacles)})
    return out


def render(raw: dict):
    """The grid as a 1000 x 1000 RGB PIL image, drawn with PIL.

    Square cells as large as fit in the plot area (centred), S filled sky blue, D dark green, every
    other cell white with its object or obstacle symbol (DejaVu Sans, black) centred, black borders
    between all cells, letter labels with small ticks: rows ``a..`` top to bottom on the left, columns
    ``a..`` left to right below.
    """
    from PIL import Image, ImageDraw

    grid = np.asarray(parse_grid(raw["text"]))
    nrows, ncols = grid.shape
    left, top, right, bottom = _PLOT_BOX
    size = min((right - left) // ncols, (bottom - top) // nrows)
    x0 = left + ((right - left) - size * ncols) // 2
    y0 = top + ((bottom - top) - size * nrows) // 2
    xs = [x0 + size * j for j in range(ncols + 1)]
    ys = [y0 + size * i for i in range(nrows + 1)]

    image = Image.new("RGB", IMAGE_SIZE, PAPER)
    pen = ImageDraw.Draw(image)
    symbols = _glyphs(raw)
    symbol_font = _font(min(55, int(size * 0.6)))
    fills = {1: S_COLOR, 2: D_COLOR}
    for (i, j), v in np.ndenumerate(grid):
        v = int(v)
        if v in fills:
            pen.rectangle([xs[j], ys[i], xs[j + 1], ys[i + 1]], fill=fills[v])
        elif v != 0:
            pen.text(((xs[j] + xs[j + 1]) / 2, (ys[i] + ys[i + 1]) / 2), symbols[v], fill=INK, font=symbol_font,
                     anchor="mm")
    half = _BORDER // 2
    for x in xs:
        pen.rectangle([x - half, ys[0] - half, x - half + _BORDER - 1, ys[-1] + half], fill=INK)
    for y in ys:
        pen.rectangle([xs[0] - half, y - half, xs[-1] + half, y - half + _BORDER - 1], fill=INK)

    label_font = _font(28)
    below = ys[-1] + half + _TICK
    for j in range(ncols):
        cx = (xs[j] + xs[j + 1]) // 2
        pen.line([cx, ys[-1] + half, cx, below], fill=INK, width=1)
        pen.text((cx, below + 4), _letter(j + 1), fill=INK, font=label_font, anchor="mt")
    before = xs[0] - half - _TICK
    for i in range(nrows):
        cy = (ys[i] + ys[i + 1]) // 2
        pen.line([before, cy, xs[0] - half, cy], fill=INK, width=1)
        pen.text((before - 6, cy), _letter(i + 1), fill=INK, font=label_font, anchor="rm")
    return image


def validate_image(image) -> None:
    """A grid image is a 1000 x 1000 RGB PIL image (the official 10 x 10 in figure at 100 dpi)."""
    check_rgb_image(image, NAME, IMAGE_SIZE)


__all__ = ["NAME", "SIZES", "generate", "render", "conversation", "score", "validate_image", "simulate",
           "shortest_path", "parse_answer", "text_table", "reasoning", "answer_line", "parse_grid"]
