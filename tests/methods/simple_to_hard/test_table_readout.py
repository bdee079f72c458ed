"""Table Readout task (S2H): generation, text and image modalities, conversations and scoring."""

from __future__ import annotations

import collections
import json
import re
import time

import numpy as np
import pytest
from PIL import Image

from lmforge.common.errors import UserError
from lmforge.methods.simple_to_hard import tasks
from lmforge.methods.simple_to_hard.tasks import table_readout as T


@pytest.fixture(scope="module")
def puzzles():
    return {level: T.generate(level, 80, seed=11) for level in ("SIMPLE", "HARD")}


def _turns(path):
    """Direction changes, counted cell by cell (independent of T.path_turns)."""
    turns, prev = 0, None
    for k in range(1, len(path)):
        step = (path[k][0] - path[k - 1][0], path[k][1] - path[k - 1][1])
        if prev is not None and step != prev:
            turns += 1
        prev = step
    return turns


def _cell_sum(raw):
    total = 0
    for r, c in raw["path"]:
        total += raw["table"][r][c]
    return total


# --- generation ------------------------------------------------------------------------------------


@pytest.mark.parametrize("level", ["SIMPLE", "HARD"])
def test_tables_and_paths_are_well_formed(puzzles, level):
    lo, hi = T.SIZES[level]["turns"]
    for raw in puzzles[level]:
        n, m = len(raw["table"]), len(raw["table"][0])
        assert 7 <= n <= 12 and 7 <= m <= 10
        assert all(len(row) == m and all(0 <= v <= 9 for v in row) for row in raw["table"])
        assert len(raw["row_names"]) == n == len(set(raw["row_names"])) and set(raw["row_names"]) <= set(T.PRODUCTS)
        assert len(raw["col_names"]) == m == len(set(raw["col_names"])) and set(raw["col_names"]) <= set(T.MONTHS)
        path = [tuple(p) for p in raw["path"]]
        assert len(path) >= 2
        assert all(0 <= r < n and 0 <= c < m for r, c in path), "cell outside the table"
        assert all(abs(a[0] - b[0]) + abs(a[1] - b[1]) == 1 for a, b in zip(path, path[1:])), "not contiguous"
        assert len(set(path)) == len(path), "path revisits a cell"
        assert lo <= _turns(path) <= hi
        assert T.path_turns(raw["path"]) == _turns(path)
        assert T.path_sum(raw) == _cell_sum(raw)


def test_path_turns_on_known_shapes():
    assert T.path_turns([(0, 0), (0, 1), (0, 2)]) == 0
    assert T.path_turns([(0, 0), (0, 1), (1, 1), (2, 1)]) == 1
    assert T.path_turns([(0, 0), (0, 1), (1, 1), (1, 0)]) == 2
    assert T.path_turns([(3, 3), (2, 3), (2, 2), (2, 1), (3, 1), (3, 2)]) == 3


def test_level_mixture_follows_generate_data_sh():
    for level, expected in (("SIMPLE", {"random", "sine", "spiral"}), ("HARD", {"sine", "spiral", "compose"})):
        raws = T.generate(level, 450, seed=3)
        counts = collections.Counter(r["family"] for r in raws)
        assert set(counts) == expected
        assert all(120 <= v <= 180 for v in counts.values()), counts  # one third each
        allowed = {f: (set(g), set(k)) for f, g, k in T.LEVEL_FAMILIES[level]}
        assert all(r["gap"] in allowed[r["family"]][0] and r["npieces"] in allowed[r["family"]][1] for r in raws)
    assert T.LEVEL_FAMILIES["SIMPLE"][1][2] == (3, 4) and T.LEVEL_FAMILIES["HARD"][0][2] == (8, 10)
    assert T.LEVEL_FAMILIES["HARD"][1][2] == (6, 8) and T.LEVEL_FAMILIES["HARD"][2][2] == (8, 10)


# --- path families: structure -----------------------------------------------------------------------
# The expectations below are derived from the family descriptions (module docstring and the official
# scripts), not from the implementation: they check geometry cell by cell.


def _segments(path):
    """Maximal straight pieces of ``path`` as [unit step, number of steps]."""
    segs = []
    for a, b in zip(path, path[1:]):
        step = (b[0] - a[0], b[1] - a[1])
        if segs and segs[-1][0] == step:
            segs[-1][1] += 1
        else:
            segs.append([step, 1])
    return segs


def _assert_simple_inside(path, n, m):
    assert len(path) >= 2
    for r, c in path:
        assert 0 <= r < n and 0 <= c < m, "cell outside the table"
    for a, b in zip(path, path[1:]):
        assert abs(a[0] - b[0]) + abs(a[1] - b[1]) == 1, "not contiguous"
    assert len(set(path)) == len(path), "path revisits a cell"


def _assert_induced(path):
    """No two cells of the path touch unless they are consecutive (one free line between sweeps/rings)."""
    index = {p: k for k, p in enumerate(path)}
    for k, (r, c) in enumerate(path):
        for nb in ((r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)):
            if nb in index:
                assert abs(index[nb] - k) == 1, f"cells {path[k]} and {nb} touch but are not consecutive"


def _start_trim(path, corners):
    """Cells missing before ``path[0]`` if the path starts on the first run from one of ``corners``.

    The first straight piece must lie on the corner's row (horizontal) or column (vertical) and
    ``path[0]`` be at most 2 cells from the corner along it; otherwise None.
    """
    (r, c), (r1, c1) = path[0], path[1]
    for cr, cc in corners:
        on_line = (r == r1 == cr) if r == r1 else (c == c1 == cc)
        d = abs(r - cr) + abs(c - cc)
        if on_line and d <= 2:
            return d
    return None


def _rest_on_one_side(path):
    """Every straight piece longer than 2 steps, except the last, has all later cells strictly on one
    side of its line (sweeps, rings and cut strips never come back); ``path`` in generation order."""
    start = 0
    segs = _segments(path)
    for i, (step, length) in enumerate(segs):
        end = start + length
        if length > 2 and i < len(segs) - 1:
            axis = 0 if step[0] == 0 else 1  # a horizontal piece lies on a row (axis 0)
            line = path[start][axis]
            later = [p[axis] - line for p in path[end + 1:]]
            if not (all(x > 0 for x in later) or all(x < 0 for x in later)):
                return False
        start = end
    return True


def _family_draws(family, configs, count, seed):
    out = []
    for gap, npieces in configs:
        for raw in T.generate_family(family, count, seed + 10 * gap + npieces, gap=gap, npieces=npieces):
            n, m = len(raw["table"]), len(raw["table"][0])
            out.append((gap, npieces, n, m, [tuple(p) for p in raw["path"]]))
    return out


# (gap, npieces) pairs of generate_data.sh; turn ranges worked out from the shapes: a sine path of
# npieces crossing steps turns twice per finished U-turn and once into the unfinished last one
# (3, 3, 7, 9 turns for npieces 3, 4, 8, 10) and loses up to one turn to trimming (SIMPLE 2-3; HARD
# down to 4 when a 7-row table with gap 1 ends the sweep inside its third crossing); a spiral turns
# once per piece (SIMPLE 2-4 after trimming the final 1-cell arm; HARD 3-8, a 7x7 table with gap 1
# closing after 4 turns); a compose path has at most 2 turns per piece, the last piece 1.
_SINE = {"SIMPLE": ([(g, k) for g in (0, 1) for k in (3, 4)], (2, 3)),
         "HARD": ([(g, k) for g in (0, 1) for k in (8, 10)], (4, 9))}
_SPIRAL = {"SIMPLE": ([(g, k) for g in (0, 1) for k in (3, 4)], (2, 4)),
           "HARD": ([(g, k) for g in (0, 1) for k in (6, 8)], (3, 8))}


def _oriented(path, check):
    """The orientations of ``path`` (as given, reversed) that ``check`` accepts, as (path, result, is_given)."""
    out = []
    for given, p in ((True, path), (False, path[::-1])):
        result = check(p)
        if result is not None:
            out.append((p, result, given))
    return out


@pytest.mark.parametrize("level", ["SIMPLE", "HARD"])
def test_sine_paths_are_boustrophedons(level):
    configs, (t_lo, t_hi) = _SINE[level]
    trims, givens, run_shortfalls = set(), set(), set()
    for gap, npieces, n, m, path in _family_draws("sine", configs, 50, 100):
        _assert_simple_inside(path, n, m)
        _assert_induced(path)
        turns = _turns(path)
        # npieces unit crossing steps, two per U-turn (2 turns each), the last U-turn left unfinished
        assert t_lo <= turns <= t_hi and turns <= 2 * ((npieces + 1) // 2) - 1
        segs = _segments(path)
        run_step = max(segs, key=lambda s: s[1])[0]
        horizontal_runs = run_step[0] == 0
        runs = [s for s in segs if (s[0][0] == 0) == horizontal_runs]
        crossings = [s for s in segs if (s[0][0] == 0) != horizontal_runs]
        # runs and crossings alternate, runs sweep back and forth, crossings all advance the same way
        assert all((a[0][0] == 0) != (b[0][0] == 0) for a, b in zip(segs, segs[1:]))
        assert all(a[0] == (-b[0][0], -b[0][1]) for a, b in zip(runs, runs[1:]))
        assert len({s[0] for s in crossings}) == 1
        assert sum(s[1] for s in crossings) <= npieces
        extent = m if horizontal_runs else n
        for k, (step, length) in enumerate(segs):
            if 0 < k < len(segs) - 1:  # interior pieces are untrimmed
                if (step[0] == 0) != horizontal_runs:
                    assert length == 2, "a U-turn crosses exactly two cells"
                else:  # an interior run spans the table but for 0-1 cell at each end (a coin per run)
                    run_shortfalls.add(extent - 1 - length)
        corners = [(r, c) for r in (gap, n - 1 - gap) for c in (gap, m - 1 - gap)]
        found = _oriented(path, lambda p: _start_trim(p, corners) if _rest_on_one_side(p) else None)
        assert found, "no orientation starts at the (gap-inset) corner and sweeps away from it"
        if len(found) == 1:  # (short SIMPLE sweeps can read both ways)
            trims.add(found[0][1])
            givens.add(found[0][2])
    assert trims == {0, 1, 2} and givens == {True, False}  # both trims and reversal happen
    assert run_shortfalls == {0, 1, 2}


def _spiral_check(path, n, m, gap):
    """Trim at the outer end if ``path`` (outer end first) is a gap-inset spiral, else None."""
    corners = [(r, c) for r in (gap, n - 1 - gap) for c in (gap, m - 1 - gap)]
    trim = _start_trim(path, corners)
    if trim is None or not _rest_on_one_side(path):
        return None
    segs = _segments(path)
    lengths = [s[1] for s in segs]
    # arm 1 runs the full inset side; arm 0 is as long as arm 2 less the trim; from arm 1 on, each arm
    # is 2 shorter than the previous parallel one (one free line between rings); the last arm is a stub
    if len(lengths) >= 3 and lengths[1] != (n if segs[1][0][1] == 0 else m) - 2 * gap - 1:
        return None
    if len(lengths) >= 4 and not lengths[2] - 2 <= lengths[0] <= lengths[2]:
        return None
    if any(lengths[i + 2] != lengths[i] - 2 for i in range(1, len(lengths) - 3)):
        return None
    return trim


@pytest.mark.parametrize("level", ["SIMPLE", "HARD"])
def test_spiral_paths_turn_one_way_with_rings_two_apart(level):
    configs, (t_lo, t_hi) = _SPIRAL[level]
    trims, senses, givens = set(), set(), set()
    for gap, npieces, n, m, path in _family_draws("spiral", configs, 50, 200):
        _assert_simple_inside(path, n, m)
        _assert_induced(path)
        assert t_lo <= _turns(path) <= t_hi and _turns(path) <= npieces
        found = _oriented(path, lambda p: _spiral_check(p, n, m, gap))
        # (up to 3 turns, e.g. arms W-1, H-1, W-1, H-3, a spiral can read as one from both ends)
        assert found, "no orientation is an inward spiral from a gap-inset corner"
        assert len(found) == 1 or _turns(path) <= 3
        oriented, trim, given = found[0]
        if len(found) == 1:
            trims.add(trim)
            givens.add(given)
        segs = _segments(oriented)
        cross = {a[0][0] * b[0][1] - a[0][1] * b[0][0] for a, b in zip(segs, segs[1:])}
        assert len(cross) == 1 and 0 not in cross, "a spiral turns in one rotational sense"
        senses |= cross
    assert trims == {0, 1, 2} and givens == {True, False}
    assert senses == {1, -1}  # clockwise and counter-clockwise both occur


def test_compose_paths_are_corner_walks_on_a_shrinking_rectangle():
    trims, givens, turns, reversals = set(), set(), set(), 0
    for _gap, npieces, n, m, path in _family_draws("compose", [(g, k) for g in (0, 1) for k in (8, 10)], 60, 300):
        _assert_simple_inside(path, n, m)
        _assert_induced(path)
        t = _turns(path)
        assert 4 <= t <= min(18, 2 * npieces - 1)  # at most two turns per piece, one in the last
        turns.add(t)
        corners = [(0, 0), (0, m - 1), (n - 1, 0), (n - 1, m - 1)]  # gap is ignored: a table corner
        found = _oriented(path, lambda p: _start_trim(p, corners) if _rest_on_one_side(p) else None)
        assert found and min(f[1] for f in found) <= 1, "compose starts at a table corner, trimmed by <= 1"
        trims.add(min(f[1] for f in found))
        givens |= {f[2] for f in found}
        segs = _segments(path)
        # a sine-like U-turn: a 2-step piece between two opposite pieces
        reversals += sum(1 for a, b, c in zip(segs, segs[1:], segs[2:])
                         if b[1] == 2 and a[0] == (-c[0][0], -c[0][1]))
    assert trims == {0, 1} and givens == {True, False}
    assert reversals > 0 and max(turns) > 10  # both sine-like and spiral-like continuations occur


class _Scripted:
    """A stand-in RNG returning scripted ``randrange`` values (first value repeated once exhausted)."""

    def __init__(self, values):
        self.values = list(values)

    def randrange(self, _stop):
        return self.values.pop(0) if len(self.values) > 1 else self.values[0]


def test_compose_sweep_stops_short_of_row_zero_but_not_of_the_last_row():
    """All sine-like U-turns on a 7x7 table: a sweep down from the top reaches row 6, a sweep up from
    the bottom stops in row 1 (the official crossing test rejects index 0). Draws, in
    ``_compose_walk``'s order: row side, column side, first run axis (1: along a row), then the coins
    (0: back along the same axis)."""
    down = T._compose_walk(_Scripted([0, 0, 1, 0]), 7, 7, 10)
    expected = ([(0, c) for c in range(7)] + [(1, 6), (2, 6)] + [(2, c) for c in range(5, -1, -1)]
                + [(3, 0), (4, 0)] + [(4, c) for c in range(1, 7)] + [(5, 6), (6, 6)]
                + [(6, c) for c in range(5, -1, -1)])
    assert down == expected
    up = T._compose_walk(_Scripted([1, 0, 1, 0]), 7, 7, 10)
    expected = ([(6, c) for c in range(7)] + [(5, 6), (4, 6)] + [(4, c) for c in range(5, -1, -1)]
                + [(3, 0), (2, 0)] + [(2, c) for c in range(1, 7)] + [(1, 6)])
    assert up == expected
    # spiral-like turns only (coin 1), from the bottom-right corner along the bottom row
    spiral = T._compose_walk(_Scripted([1, 1, 1, 1]), 7, 7, 3)
    assert spiral == ([(6, c) for c in range(6, -1, -1)] + [(r, 0) for r in range(5, -1, -1)]
                      + [(0, c) for c in range(1, 7)] + [(1, 6), (2, 6)])


def test_random_paths_are_staircases_between_far_cells():
    seen = set()
    for _gap, _k, n, m, path in _family_draws("random", [(0, 4)], 300, 400):
        _assert_simple_inside(path, n, m)
        t = _turns(path)
        assert 0 <= t <= 3 and len(_segments(path)) == t + 1
        seen.add(t)
        (r0, c0), (r1, c1) = path[0], path[-1]
        if t == 0:
            assert len(path) >= 5 and (r0 == r1 or c0 == c1)
        else:
            assert abs(r0 - r1) >= 4 and abs(c0 - c1) >= 4
            # the official end candidates above/left of the start stop before row/column 0
            assert not (r1 < r0 and r1 == 0) and not (c1 < c0 and c1 == 0)
    assert seen == {0, 1, 2, 3}


def test_level_turn_ranges_cover_the_families():
    """SIZES['turns'] is the union of the per-family ranges (random 0-3; compose 4-18, 18 being the
    most a 10-piece corner walk fits in a 12x10 table once trimmed)."""
    assert T.SIZES["SIMPLE"]["turns"] == (min(0, _SINE["SIMPLE"][1][0], _SPIRAL["SIMPLE"][1][0]),
                                          max(3, _SINE["SIMPLE"][1][1], _SPIRAL["SIMPLE"][1][1]))
    assert T.SIZES["HARD"]["turns"] == (min(4, _SINE["HARD"][1][0], _SPIRAL["HARD"][1][0]),
                                        max(18, _SINE["HARD"][1][1], _SPIRAL["HARD"][1][1]))


def test_generate_family_rejects_bad_arguments():
    for kwargs in ({"family": "zigzag"}, {"family": "sine", "gap": 2}, {"family": "random", "npieces": 5},
                   {"family": "spiral", "npieces": 0}):
        family = kwargs.pop("family")
        with pytest.raises(UserError):
            T.generate_family(family, 1, 0, **kwargs)


def test_generation_is_deterministic_and_fast():
    t0 = time.perf_counter()
    a = T.generate("HARD", 100, seed=5)
    assert time.perf_counter() - t0 < 2.0
    assert a == T.generate("HARD", 100, seed=5)
    assert a != T.generate("HARD", 100, seed=6)
    assert json.loads(json.dumps(a)) == a
    assert len({r["id"] for r in a}) == 100


def test_sizes_restrict_and_out_of_range_is_user_error():
    raws = T.generate("SIMPLE", 30, seed=2, rows=7, cols=(9, 10), turns=(3, 4))
    assert all(len(r["table"]) == 7 and len(r["table"][0]) in (9, 10) and 3 <= _turns(r["path"]) <= 4 for r in raws)
    for bad in ({"rows": 13}, {"rows": (6, 8)}, {"cols": 11}, {"turns": (0, 5)}, {"colour": 3}):
        with pytest.raises(UserError):
            T.generate("SIMPLE", 1, seed=0, **bad)
    with pytest.raises(UserError):
        T.generate("HARD", 1, seed=0, turns=2)
    with pytest.raises(UserError):
        T.generate("MEDIUM", 1, seed=0)


# --- text modality ---------------------------------------------------------------------------------


def _parse_latex(text):
    """LaTeX text -> (column format, months, [(product, [cell strings])])."""
    lines = text.split("\n")
    assert lines[:2] == ["\\begin{table}[ht]", "\\centering"]
    assert lines[-4:] == [" \\end{tabular}", f"\\caption{{{T.CAPTION}}}", f"\\label{{{T.LABEL}}}", "\\end{table}"]
    fmt = re.fullmatch(r"\\begin\{tabular\}\{([lr]+)\}", lines[2]).group(1)
    header = lines[3]
    assert header.startswith(" & ") and header.endswith(" \\\\")
    months = header[3:-3].split(" & ")
    rows = []
    for line in lines[4:-4]:
        assert line.startswith(" ") and line.endswith(" \\\\")
        name, *cells = line[1:-3].split(" & ")
        rows.append((name, cells))
    return fmt, months, rows


@pytest.mark.parametrize("level", ["SIMPLE", "HARD"])
def test_latex_marks_exactly_the_path_cells(puzzles, level):
    for raw in puzzles[level][:30]:
        fmt, months, rows = _parse_latex(T.latex_text(raw))
        assert months == raw["col_names"]
        assert [name for name, _ in rows] == raw["row_names"]
        marked, values = set(), []
        for i, (_, cells) in enumerate(rows):
            values.append([int(c.removesuffix(" *")) for c in cells])
            marked |= {(i, j) for j, c in enumerate(cells) if c.endswith(" *")}
        assert values == raw["table"]
        assert marked == {tuple(p) for p in raw["path"]}
        # Styler: object (marked) columns left-aligned, integer columns right-aligned.
        assert fmt == "l" + "".join("l" if any(j == c for _, c in marked) else "r" for j in range(len(months)))


def test_latex_known_layout():
    raw = {"id": "x", "row_names": ["AlphaWidget", "BetaGadget"], "col_names": ["January", "March", "May"],
           "table": [[0, 1, 2], [3, 4, 5]], "path": [[0, 1], [1, 1], [1, 2]]}
    assert T.latex_text(raw) == (
        "\\begin{table}[ht]\n\\centering\n\\begin{tabular}{lrll}\n"
        " & January & March & May \\\\\n"
        " AlphaWidget & 0 & 1 * & 2 \\\\\n"
        " BetaGadget & 3 & 4 * & 5 * \\\\\n"
        " \\end{tabular}\n"
        "\\caption{Business Sales Data for products in different months}\n"
        "\\label{tab:business_sales}\n\\end{table}"
    )


def test_latex_matches_pandas_styler(puzzles):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("jinja2")
    from pandas.io.formats.style import Styler

    for raw in puzzles["SIMPLE"][:10] + puzzles["HARD"][:10]:
        df = pd.DataFrame(raw["table"], index=raw["row_names"], columns=raw["col_names"])
        for r, c in raw["path"]:
            # pandas < 3 upcasts a column to object when the official code writes "v*" into it
            col = df.columns[c]
            if df[col].dtype != object:
                df[col] = df[col].astype(object)
            df.iat[r, c] = f"{df.iat[r, c]}*"
        latex = Styler(df).to_latex()
        latex = f"\\begin{{table}}[ht]\n\\centering\n{latex}\\caption{{{T.CAPTION}}}\n\\label{{{T.LABEL}}}\n\\end{{table}}"
        latex = latex.replace("*", " *").replace("\\\\\n", "\\\\\n ")
        assert T.latex_text(raw) == latex


# --- conversations -----------------------------------------------------------------------------


_CELL = r"\(([A-Za-z]+), ([A-Za-z]+)\)"


@pytest.mark.parametrize("level", ["SIMPLE", "HARD"])
def test_prompts_name_the_first_and_last_path_cells(puzzles, level):
    for raw in puzzles[level][:20]:
        (r0, c0), (r1, c1) = raw["path"][0], raw["path"][-1]
        for dt in ("image2answer", "image2answer+text", "text2answer"):
            human = T.conversation(raw, dt)["conversations"][0]["value"]
            m = re.search(f"starting from {_CELL} and ending at {_CELL}\\.", human)
            assert m.groups() == (raw["row_names"][r0], raw["col_names"][c0], raw["row_names"][r1], raw["col_names"][c1])
            assert human.startswith("<image>\n\n") == (dt != "text2answer")
        assert T.conversation(raw, "text2answer")["conversations"][0]["value"].startswith(T.latex_text(raw) + "\n\nThe table above")


@pytest.mark.parametrize("level", ["SIMPLE", "HARD"])
def test_cot_lists_the_path_cells_in_order_and_adds_them_up(puzzles, level):
    for raw in puzzles[level][:20]:
        gpt = T.conversation(raw, "image2answer")["conversations"][1]["value"]
        head = ("We enumerate the relevant row indices, column indices, row names, column names, and their "
                "corresponding values.\n\nRow Index, Column Index, Row Name, Column Name, Value\n")
        assert gpt.startswith(head)
        body, tail = gpt[len(head):].split("\n\n\nThe total is ")
        cells = [line.split("\t") for line in body.split("\n")]
        expected = [[str(r + 1), str(c + 1), raw["row_names"][r], raw["col_names"][c], str(raw["table"][r][c])]
                    for r, c in raw["path"]]
        assert cells == expected
        m = re.fullmatch(r"([\d + ]+) = (\d+)\.\n\nAnswer: (\d+)", tail)
        summands = [int(x) for x in m.group(1).split(" + ")]
        assert summands == [raw["table"][r][c] for r, c in raw["path"]]
        assert int(m.group(2)) == sum(summands) == int(m.group(3)) == _cell_sum(raw)


def test_conversation_shapes(puzzles):
    raw = puzzles["SIMPLE"][0]
    text, total = T.latex_text(raw), _cell_sum(raw)
    conv = {dt: T.conversation(raw, dt)["conversations"] for dt in tasks.DATA_TYPES}
    assert all([t["from"] for t in c] == ["human", "gpt"] for c in conv.values())
    assert conv["image2text"][0]["value"].startswith("<image>\n\n")
    assert conv["image2text"][1]["value"] == text
    assert conv["image2answer+text"][1]["value"] == (
        "Convert the image into a latex code of the given table, where highlighted cells (colored in yellow) "
        "are marked with a * symbol next to the values.\n" + text + "\n\n" + conv["image2answer"][1]["value"])
    assert conv["text2answer"][1]["value"] == conv["image2answer"][1]["value"]
    plain = {dt: T.conversation(raw, dt, cot=False)["conversations"][1]["value"] for dt in tasks.DATA_TYPES}
    assert plain["image2answer"] == plain["text2answer"] == f"Answer: {total}"
    assert plain["image2answer+text"].endswith(f"{text}\n\nAnswer: {total}")
    assert plain["image2text"] == text
    with pytest.raises(UserError):
        T.conversation(raw, "image2cot")


def test_image_prompt_is_the_official_template():
    raw = {"id": "x", "row_names": ["AlphaWidget", "BetaGadget"], "col_names": ["January", "March", "May"],
           "table": [[0, 1, 2], [3, 4, 5]], "path": [[0, 1], [1, 1], [1, 2]]}
    assert T.conversation(raw, "image2answer")["conversations"][0]["value"] == (
        "<image>\n\nThe image shows the sales data of different products in different months. For readability, "
        "values in the cells have been replaced by their English names, e.g. 0 is represented by ZERO. There is "
        "a path of highlighted cells (colored in yellow) starting from (AlphaWidget, March) and ending at "
        "(BetaGadget, May). Please return the total of all values in the highlighted cells. Provide the final "
        "answer as 'Answer: [total]'.")
    assert T.conversation(raw, "image2answer")["conversations"][1]["value"].endswith(
        "1\t2\tAlphaWidget\tMarch\t1\n2\t2\tBetaGadget\tMarch\t4\n2\t3\tBetaGadget\tMay\t5\n"
        "\n\nThe total is 1 + 4 + 5 = 10.\n\nAnswer: 10")


# A hand-built 3x3 puzzle whose path runs bottom-up (so START_CELL is the bottom cell), with months
# out of calendar order and an unmarked first column. The expected strings are written out from
# create_splits.py's templates (human: template with START/END_CELL filled as "(product, month)";
# gpt: [conversion instruction + "\n" + text] + "\n\nWe enumerate ...Value\n" + one
# "row\tcol\tproduct\tmonth\tvalue\n" line per cell (1-based) + "\n\nThe total is a + b = S.\n\nAnswer: S")
# and from the Styler LaTeX layout (marked columns "l", unmarked "r", " *" marks, a space after "\\").
_HAND = {"id": "hand", "row_names": ["MuGadget", "NuDevice", "XiTool"], "col_names": ["July", "January", "May"],
         "table": [[7, 0, 3], [2, 9, 4], [5, 6, 8]], "path": [[2, 2], [1, 2], [1, 1], [0, 1]]}
_HAND_TEXT = (
    "\\begin{table}[ht]\n"
    "\\centering\n"
    "\\begin{tabular}{lrll}\n"
    " & July & January & May \\\\\n"
    " MuGadget & 7 & 0 * & 3 \\\\\n"
    " NuDevice & 2 & 9 * & 4 * \\\\\n"
    " XiTool & 5 & 6 & 8 * \\\\\n"
    " \\end{tabular}\n"
    "\\caption{Business Sales Data for products in different months}\n"
    "\\label{tab:business_sales}\n"
    "\\end{table}"
)
_HAND_COT = (
    "We enumerate the relevant row indices, column indices, row names, column names, and their corresponding "
    "values.\n\nRow Index, Column Index, Row Name, Column Name, Value\n"
    "3\t3\tXiTool\tMay\t8\n"
    "2\t3\tNuDevice\tMay\t4\n"
    "2\t2\tNuDevice\tJanuary\t9\n"
    "1\t2\tMuGadget\tJanuary\t0\n"
    "\n\nThe total is 8 + 4 + 9 + 0 = 21.\n\nAnswer: 21"
)


def test_hand_built_puzzle_has_the_official_text_prompts_and_cot():
    assert T.latex_text(_HAND) == _HAND_TEXT
    assert T.chain_of_thought(_HAND) == _HAND_COT
    assert T.path_sum(_HAND) == 21
    conv = {dt: T.conversation(_HAND, dt)["conversations"] for dt in tasks.DATA_TYPES}
    assert conv["text2answer"][0]["value"] == _HAND_TEXT + (
        "\n\nThe table above shows the sales data of different products in different months. There is a path "
        "of highlighted cells (marked with a * symbol) starting from (XiTool, May) and ending at "
        "(MuGadget, January). Please return the total of all values in the highlighted cells. Provide the "
        "final answer as 'Answer: [total]'.")
    image_prompt = (
        "<image>\n\nThe image shows the sales data of different products in different months. For readability, "
        "values in the cells have been replaced by their English names, e.g. 0 is represented by ZERO. There is "
        "a path of highlighted cells (colored in yellow) starting from (XiTool, May) and ending at "
        "(MuGadget, January). Please return the total of all values in the highlighted cells. Provide the final "
        "answer as 'Answer: [total]'.")
    assert conv["image2answer"][0]["value"] == conv["image2answer+text"][0]["value"] == image_prompt
    assert conv["text2answer"][1]["value"] == conv["image2answer"][1]["value"] == _HAND_COT
    assert conv["image2answer+text"][1]["value"] == (
        "Convert the image into a latex code of the given table, where highlighted cells (colored in yellow) "
        "are marked with a * symbol next to the values.\n" + _HAND_TEXT + "\n\n" + _HAND_COT)
    assert T.score(_HAND, "... Answer: 21") and not T.score(_HAND, "Answer: 20")
    assert T.official_exact_match(_HAND, _HAND_COT)
    assert not T.official_exact_match(_HAND, _HAND_COT.replace("8 + 4 + 9 + 0", "8 + 4 + 9"))


# --- scoring ---------------------------------------------------------------------------------------


def test_score_accepts_gold_and_rejects_a_wrong_total(puzzles):
    for raw in puzzles["HARD"][:10]:
        total = _cell_sum(raw)
        for dt in ("image2answer", "image2answer+text", "text2answer"):
            for cot in (True, False):
                gold = T.conversation(raw, dt, cot=cot)["conversations"][1]["value"]
                assert T.score(raw, gold)
        assert T.score(raw, f"Answer: {total}")
        assert not T.score(raw, f"Answer: {total + 1}")
        assert not T.score(raw, f"The total is {total}.")  # no 'Answer:'
        assert not T.score(raw, f"Answer: {total}\nActually, Answer: {total - 1}")  # the last one counts
        gold = T.conversation(raw, "image2answer")["conversations"][1]["value"]
        assert T.official_exact_match(raw, gold)
        assert not T.official_exact_match(raw, gold.replace("The total is ", "The total is 1 + "))


# --- image modality --------------------------------------------------------------------------------


def _dominant(img: np.ndarray, box, inset=3):
    x0, y0, x1, y1 = box
    patch = img[y0 + inset:y1 - inset, x0 + inset:x1 - inset].reshape(-1, 3).astype(np.int64)
    colours, counts = np.unique(patch @ np.array([1 << 16, 1 << 8, 1]), return_counts=True)
    c = int(colours[counts.argmax()])
    return (c >> 16, (c >> 8) & 255, c & 255)


@pytest.mark.parametrize("level", ["SIMPLE", "HARD"])
def test_render_is_deterministic_and_yellow_exactly_on_the_path(puzzles, level):
    for raw in puzzles[level][:4]:
        image = T.render(raw)
        T.validate_image(image)
        assert image.tobytes() == T.render(raw).tobytes()
        arr = np.asarray(image)
        geo = T.layout(raw)
        on_path = {tuple(p) for p in raw["path"]}
        for (i, j), box in geo["cells"].items():
            assert tuple(arr[box[1], box[0]]) == (0, 0, 0)  # the cell's border
            colour = _dominant(arr, box)
            assert colour == ((255, 255, 0) if (i, j) in on_path else (0xF5, 0xF5, 0xF5)), (i, j)
        for box in geo["header"] + geo["index"] + [geo["corner"]]:
            assert _dominant(arr, box) == (0x40, 0x46, 0x6E)
        # path cells carry their word in dark ink, header cells in white
        x0, y0, x1, y1 = geo["cells"][tuple(raw["path"][0])]
        assert (arr[y0 + 3:y1 - 3, x0 + 3:x1 - 3].sum(axis=2) < 200).any()
        x0, y0, x1, y1 = geo["header"][0]
        assert (arr[y0 + 3:y1 - 3, x0 + 3:x1 - 3].min(axis=2) > 230).any()


def test_validate_image_rejects_other_images(puzzles):
    image = T.render(puzzles["SIMPLE"][0])
    T.validate_image(image)
    with pytest.raises(UserError):
        T.validate_image(image.convert("L"))
    with pytest.raises(UserError):
        T.validate_image(image.resize((750, 400)))
    with pytest.raises(UserError):
        T.validate_image(np.asarray(image))


def test_write_split_layout(tmp_path):
    final = tasks.write_split("table_readout", "SIMPLE", 2, 0, tmp_path)
    assert final == tmp_path / "table_readout" / "SIMPLE"
    raws = json.loads((final / "raw.json").read_text())
    for dt in tasks.DATA_TYPES:
        recs = json.loads((final / f"{dt}+cot.json").read_text())
        assert [r["id"] for r in recs] == [r["id"] for r in raws]
    image = Image.open(final / "images" / f"{raws[0]['id']}.png")
    T.validate_image(image.convert("RGB"))
