"""Grid Navigation (S2H): the sampler's distribution rules, the DFS on hand-worked grids and as a replayed
walk, the official text formats on a hand-built record, the solver against networkx, the simulator, and the
image decoded back to the grid."""

from __future__ import annotations

import itertools
import json
from collections import Counter

import networkx as nx
import numpy as np
import pytest

from lmforge.common.errors import UserError
from lmforge.methods.simple_to_hard.tasks import DATA_TYPES, get_task, write_split
from lmforge.methods.simple_to_hard.tasks import grid_navigation as gn

ORDER = {"up": 0, "down": 1, "left": 2, "right": 3}
STEP = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}


@pytest.fixture(scope="module")
def puzzles():
    return {level: gn.generate(level, 40, 11) for level in ("SIMPLE", "HARD")}


def grid_of(raw):
    return gn.parse_grid(raw["text"])


def objects_of(raw):
    return [tuple(int(x) for x in s.split("-")) for s in raw["collect_objects_coordinates"].split(":")]


# ------------------------------------------------------------------------------ sampler


def test_endpoints_follow_the_separation_rule_and_are_uniform():
    rng = np.random.default_rng(0)
    pairs = [gn._endpoints(rng, 8, 10) for _ in range(6000)]
    s_rows = Counter(s[0] for s, _ in pairs)
    s_cols = Counter(s[1] for s, _ in pairs)
    assert set(s_rows) == set(range(8)) and set(s_cols) == set(range(10))  # S anywhere
    assert all(abs(v / 6000 - 1 / 8) < 0.02 for v in s_rows.values())
    assert all(abs(v / 6000 - 1 / 10) < 0.02 for v in s_cols.values())
    for s, d in pairs:
        assert s[0] != d[0] and s[1] != d[1]  # other row and other column
        assert d[0] >= 1 and d[1] >= 1  # the official candidate lists stop before row/column 0
    # given S in row 3, D's row is uniform over {1, 2, 4, 5, 6, 7}
    given = Counter(d[0] for s, d in pairs if s[0] == 3)
    total = sum(given.values())
    assert set(given) == {1, 2, 4, 5, 6, 7}
    assert all(abs(v / total - 1 / 6) < 0.05 for v in given.values())


def test_obstacles_fill_a_quota_inside_the_rectangle_and_bernoulli_outside():
    rng = np.random.default_rng(1)
    outside_hits = outside_cells = 0
    for s, d in [((0, 0), (5, 7)), ((6, 2), (1, 9)), ((3, 3), (4, 5)), ((9, 0), (1, 1))]:
        for _ in range(150):
            mask = gn._obstacles(rng, (10, 11), s, d, gn.PROB)
            r0, r1 = sorted((s[0], d[0]))
            c0, c1 = sorted((s[1], d[1]))
            inside = np.zeros_like(mask)
            inside[r0:r1 + 1, c0:c1 + 1] = True
            assert not mask[s] and not mask[d]
            k = inside.sum() - 2
            assert mask[inside].sum() == int(k * 0.35)  # exactly floor(0.35 * candidates) inside
            outside_hits += mask[~inside].sum()
            outside_cells += (~inside).sum()
    assert abs(outside_hits / outside_cells - 0.35) < 0.01


def test_objects_are_distinct_and_numbered_by_the_nearest_first_tour():
    rng = np.random.default_rng(2)
    seen_cells = set()
    for _ in range(300):
        s, d = (2, 5), (7, 1)
        tour = gn._object_tour(rng, (9, 8), s, d, 5)
        assert len(set(tour)) == 5 and s not in tour and d not in tour
        assert all(0 <= r < 9 and 0 <= c < 8 for r, c in tour)
        here = s
        for k, cell in enumerate(tour):  # each stop is a nearest remaining object
            dist = lambda o: abs(o[0] - here[0]) + abs(o[1] - here[1])  # noqa: E731
            assert dist(cell) == min(dist(o) for o in tour[k:])
            here = cell
        seen_cells.update(tour)
    assert len(seen_cells) == 9 * 8 - 2  # every other cell occurs


def test_generated_puzzles_follow_the_level_spec(puzzles):
    for level, raws in puzzles.items():
        sizes = gn.SIZES[level]
        for raw in raws:
            grid = np.array(grid_of(raw))
            n, m = grid.shape
            assert (n, m) == (raw["nrows"], raw["ncols"])
            assert sizes["nrows"][0] <= n <= sizes["nrows"][1] and sizes["ncols"][0] <= m <= sizes["ncols"][1]
            s, d = (raw["start_row"], raw["start_col"]), (raw["end_row"], raw["end_col"])
            assert grid[s[0] - 1, s[1] - 1] == 1 and grid[d[0] - 1, d[1] - 1] == 2
            assert (grid == 1).sum() == 1 and (grid == 2).sum() == 1
            assert s[0] != d[0] and s[1] != d[1] and d[0] >= 2 and d[1] >= 2
            objs = objects_of(raw)
            assert len(objs) == raw["tot_objs"] and sizes["tot_objs"][0] <= len(objs) <= sizes["tot_objs"][1]
            assert [int(grid[r - 1, c - 1]) for r, c in objs] == list(range(3, 3 + len(objs)))
            assert sorted(grid[grid > 2].tolist()) == list(range(3, 3 + len(objs)))
            assert raw["collect_objects_idx"] == ":".join(str(k) for k in range(1, len(objs) + 1))
            names = raw["objects"].split(":")
            assert len(names) == len(set(names)) == gn.MAX_OBJS[level] and set(names) <= set(gn.OBJ_NAMES)
            declared = raw["obstacles"].split(":")
            assert len(set(declared)) == len(declared) == raw["n_obstacles"]
            assert sizes["n_obstacles"][0] <= len(declared) <= sizes["n_obstacles"][1]
            assert set(declared) <= set(gn.OBS_NAMES)
            assert set(grid[grid < 0].tolist()) <= set(range(-len(declared), 0))
            lo, hi = sizes["num_steps"]
            assert raw["num_steps"] == len(raw["reasoning_steps"]) and lo <= raw["num_steps"] <= hi
            ok, why = gn.simulate(raw, raw["answer_steps"])
            assert ok, why
            assert gn.score(raw, gn.answer_line(raw))
    assert {r["n_obstacles"] for r in puzzles["HARD"]} == {3, 4, 5}
    assert {r["tot_objs"] for r in puzzles["SIMPLE"]} == {1, 2}
    assert {r["tot_objs"] for r in puzzles["HARD"]} == {2, 3, 4, 5}
    # HARD grids with several obstacle types do show several types
    assert any(len(set(np.array(grid_of(r))[np.array(grid_of(r)) < 0].tolist())) >= 3 for r in puzzles["HARD"])


def test_generate_is_deterministic_per_seed():
    a = gn.generate("HARD", 5, 3)
    assert a == gn.generate("HARD", 5, 3)
    assert a != gn.generate("HARD", 5, 4)
    assert json.loads(json.dumps(a)) == a  # JSON-serialisable as is


def test_sizes_outside_the_range_raise():
    with pytest.raises(UserError):
        gn.generate("SIMPLE", 1, 0, tot_objs=3)
    with pytest.raises(UserError):
        gn.generate("HARD", 1, 0, nrows=(7, 9))
    with pytest.raises(UserError):
        gn.generate("SIMPLE", 1, 0, n_obstacles=2)
    with pytest.raises(UserError):
        gn.generate("HARD", 1, 0, num_steps=(20, 30))
    with pytest.raises(UserError):
        gn.generate("SIMPLE", 1, 0, colours=3)
    with pytest.raises(UserError):
        gn.generate("MEDIUM", 1, 0)
    with pytest.raises(UserError):
        gn.generate("SIMPLE", 1, -1)
    narrowed = gn.generate("HARD", 3, 0, nrows=10, ncols=(8, 9), tot_objs=5)
    assert all(len(grid_of(r)) == 10 and len(grid_of(r)[0]) in (8, 9) and r["tot_objs"] == 5 for r in narrowed)


# ------------------------------------------------------------------------------ the DFS


# Worked by hand from the search rules (moves ranked by L1 then squared L2 from the neighbour to the goal,
# ties up/down/left/right; refusals invalid / visited / closed / future-objects-idx-<due+1> /
# future-objects-destination; a failed move is noted "blocked"; collecting starts a fresh visited set).
#      a  b  c  d  e           0-indexed: S (2, 3), D (1, 1), object 1 at (0, 3), object 2 at (1, 2)
#   a  .  .  .  1  .
#   b  .  D  2  X  .
#   c  X  .  .  S  .
HAND_GRID = [[0, 0, 0, 3, 0], [0, 2, 4, -1, 0], [-1, 0, 0, 1, 0]]


def _state(r, c, action, notes, checkpoint=-1):
    return {"row": r, "col": c, "action": action, "checkpoint": checkpoint,
            "considered_directions": [{"action": a, "result": x} for a, x in notes]}


HAND_TRACE = [
    _state(2, 3, "left", [("up", "closed")]),
    _state(2, 2, "left", [("up", "future-objects-idx-1"), ("right", "visited")]),
    _state(2, 1, "retrace", [("up", "future-objects-destination"), ("right", "visited"), ("down", "invalid"),
                             ("left", "closed")]),
    _state(2, 2, "retrace", [("up", "future-objects-idx-1"), ("right", "visited"), ("left", "blocked"),
                             ("down", "invalid")]),
    _state(2, 3, "right", [("up", "closed"), ("left", "blocked")]),
    _state(2, 4, "up", []),
    _state(1, 4, "up", []),
    _state(0, 4, "left", [], checkpoint=1),
    _state(0, 3, "left", [("down", "closed")]),
    _state(0, 2, "down", [], checkpoint=2),
    _state(1, 2, "left", []),
]
HAND_MOVES = ["right", "up", "up", "left", "left", "down", "left"]

# Unsolvable, also worked by hand: object 1 at (0, 2) is walled in by X, object 2 and D.
#      a  b  c  d
#   a  S  X  1  .
#   b  .  .  2  .
#   c  X  D  .  .
DEAD_GRID = [[1, -1, 3, 0], [0, 0, 4, 0], [-1, 2, 0, 0]]
DEAD_TRACE = [
    _state(0, 0, "down", [("right", "closed"), ("up", "invalid")]),
    _state(1, 0, "right", []),
    _state(1, 1, "retrace", [("up", "closed"), ("right", "future-objects-idx-1"),
                             ("down", "future-objects-destination"), ("left", "visited")]),
    _state(1, 0, "retrace", [("right", "blocked"), ("up", "visited"), ("down", "closed"), ("left", "invalid")]),
    _state(0, 0, "retrace", [("right", "closed"), ("up", "invalid"), ("down", "blocked"), ("left", "invalid")]),
]


# Unsolvable, worked by hand, showing the kept official detail: when the move that collected an object
# fails, its cell keeps the object as collected and the fresh visited set. Object 2 at (2, 0) is collected
# (state 2) and that branch fails (states 3-9); back at (1, 0) the cell now seeks D with the branch's
# visited set (state 10: up is "visited"); back at S the cell still counts object 1 as collected with the
# visited set started when it collected it, so (0, 1) then S itself are entered again (states 11-12).
#      a  b  c
#   a  S  .  X
#   b  1  X  .
#   c  2  X  D
KEEP_GRID = [[1, 0, -1], [3, -1, 0], [4, -1, 2]]
KEEP_TRACE = [
    _state(0, 0, "down", [], checkpoint=1),
    _state(1, 0, "down", [], checkpoint=2),
    _state(2, 0, "up", [("right", "closed")]),
    _state(1, 0, "up", [("right", "closed"), ("down", "visited")]),
    _state(0, 0, "right", [("down", "visited")]),
    _state(0, 1, "retrace", [("down", "closed"), ("right", "closed"), ("left", "visited"), ("up", "invalid")]),
    _state(0, 0, "retrace", [("down", "visited"), ("right", "blocked"), ("up", "invalid"), ("left", "invalid")]),
    _state(1, 0, "retrace", [("right", "closed"), ("down", "visited"), ("up", "blocked"), ("left", "invalid")]),
    _state(2, 0, "retrace", [("right", "closed"), ("up", "blocked"), ("down", "invalid"), ("left", "invalid")]),
    _state(1, 0, "retrace", [("down", "blocked"), ("left", "invalid"), ("right", "closed"), ("up", "visited")]),
    _state(0, 0, "right", [("down", "blocked"), ("left", "invalid")]),
    _state(0, 1, "left", [("down", "closed")]),
    _state(0, 0, "retrace", [("down", "visited"), ("left", "invalid"), ("right", "visited"), ("up", "invalid")]),
    _state(0, 1, "retrace", [("down", "closed"), ("left", "blocked"), ("right", "closed"), ("up", "invalid")]),
    _state(0, 0, "retrace", [("down", "blocked"), ("left", "invalid"), ("right", "blocked"), ("up", "invalid")]),
]


def as_record(grid, s, d, objs, trace, moves):
    return {"text": "".join("".join(f":{v}" for v in row) + "\n" for row in grid), "start_row": s[0] + 1,
            "start_col": s[1] + 1, "end_row": d[0] + 1, "end_col": d[1] + 1,
            "collect_objects_coordinates": ":".join(f"{r + 1}-{c + 1}" for r, c in objs),
            "reasoning_steps": trace, "answer_steps": moves}


HAND_CASES = [(HAND_GRID, (2, 3), (1, 1), [(0, 3), (1, 2)], HAND_TRACE, HAND_MOVES),
              (DEAD_GRID, (0, 0), (2, 1), [(0, 2), (1, 2)], DEAD_TRACE, None),
              (KEEP_GRID, (0, 0), (2, 2), [(1, 0), (2, 0)], KEEP_TRACE, None)]


def test_dfs_on_hand_worked_grids():
    for grid, s, d, objs, want_trace, want_moves in HAND_CASES:
        trace, moves = gn._solve(grid, s, d, objs)
        assert trace == want_trace
        assert moves == want_moves
        replay(as_record(grid, s, d, objs, trace, moves))  # the replay agrees with the hand-worked traces
    with pytest.raises(gn._Overrun):
        gn._solve(HAND_GRID, (2, 3), (1, 1), [(0, 3), (1, 2)], limit=10)


def replay(raw):
    """Check a trace as a depth-first walk, independently of the solver. A stack of open cells, each with
    its goal (fixed on entry), its due object and its visited set (shared with the cells it opens, replaced
    by a fresh one when it collects); every state is at the top cell, lists its cell's earlier verdicts
    unchanged, then ``blocked`` for the move that just failed, then new verdicts that are true of the grid
    and of the visited set, in rank order toward the goal; a move goes to a free cell, ``retrace`` pops.
    The final stack spells the gold answer (or is empty for an unsolvable record)."""
    grid = grid_of(raw)
    n, m = len(grid), len(grid[0])
    objs = [(r - 1, c - 1) for r, c in objects_of(raw)]
    dest = (raw["end_row"] - 1, raw["end_col"] - 1)

    def frame(cell, due, seen):
        seen.add(cell)
        return {"cell": cell, "due": due, "seen": seen, "goal": objs[due] if due < len(objs) else dest,
                "notes": [], "pending": None}

    def verdict(top, cell):
        """What the rules say about stepping from the top cell to ``cell`` (None: allowed)."""
        if not (0 <= cell[0] < n and 0 <= cell[1] < m):
            return "invalid"
        if cell in top["seen"]:
            return "visited"
        if grid[cell[0]][cell[1]] < 0:
            return "closed"
        if top["due"] < len(objs) and grid[cell[0]][cell[1]] - 3 > top["due"]:
            return f"future-objects-idx-{top['due'] + 1}"
        if top["due"] < len(objs) and cell == dest:
            return "future-objects-destination"
        return None

    stack = [frame((raw["start_row"] - 1, raw["start_col"] - 1), 0, set())]
    path = []
    for k, st in enumerate(raw["reasoning_steps"]):
        top = stack[-1]
        assert (st["row"], st["col"]) == top["cell"], k
        r, c = top["cell"]
        notes = [(x["action"], x["result"]) for x in st["considered_directions"]]
        assert notes[:len(top["notes"])] == top["notes"], k
        fresh = notes[len(top["notes"]):]
        if top["pending"] is not None:
            assert fresh[0] == (top["pending"], "blocked"), k
            fresh = fresh[1:]
        for action, result in fresh:
            assert verdict(top, (r + STEP[action][0], c + STEP[action][1])) == result, (k, action)

        def rank(action, goal=top["goal"]):
            dr, dc = goal[0] - r - STEP[action][0], goal[1] - c - STEP[action][1]
            return abs(dr) + abs(dc), dr * dr + dc * dc, ORDER[action]

        tried = [a for a, _ in notes] + ([] if st["action"] == "retrace" else [st["action"]])
        assert [rank(a) for a in tried] == sorted(rank(a) for a in tried) and len(set(tried)) == len(tried)
        top["notes"], top["pending"] = notes, None
        if st["action"] == "retrace":
            assert len(tried) == 4
            stack.pop()
            if path:
                stack[-1]["pending"] = path.pop()
            continue
        nxt = (r + STEP[st["action"]][0], c + STEP[st["action"]][1])
        assert verdict(top, nxt) is None, k
        if top["due"] < len(objs) and nxt == objs[top["due"]]:  # collects the due object
            top["due"] += 1
            top["seen"] = set()
            assert st["checkpoint"] == top["due"], k
        else:
            assert st["checkpoint"] == -1, k
        stack.append(frame(nxt, top["due"], top["seen"]))
        path.append(st["action"])
    if raw.get("answer_steps") is None:
        assert not stack
    else:
        assert stack[-1]["cell"] == dest and stack[-1]["due"] == len(objs)
        assert path == raw["answer_steps"]


def test_traces_replay_as_depth_first_walks(puzzles):
    retraces = 0
    for raws in puzzles.values():
        for raw in raws:
            replay(raw)
            retraces += sum(st["action"] == "retrace" for st in raw["reasoning_steps"])
    assert retraces > 0  # the replay did see backtracking
    bad = dict(puzzles["HARD"][0])
    bad["answer_steps"] = bad["answer_steps"][:-1] + ["up"]
    with pytest.raises(AssertionError):
        replay(bad)


# ------------------------------------------------------------------------------ solver and simulator


def nx_shortest_length(raw) -> int | None:
    """Independent: networkx distances on the free-cell graph, minimised over object orders."""
    grid = grid_of(raw)
    g = nx.Graph()
    for r, row in enumerate(grid, 1):
        for c, v in enumerate(row, 1):
            if v > -1:
                g.add_node((r, c))
                for nb in ((r - 1, c), (r, c - 1)):
                    if nb in g:
                        g.add_edge((r, c), nb)
    start, end = (raw["start_row"], raw["start_col"]), (raw["end_row"], raw["end_col"])
    objs = objects_of(raw)
    no_d = g.subgraph([v for v in g if v != end])  # D ends the walk, so it is not passed through

    def dist(graph, a, b):
        try:
            return nx.shortest_path_length(graph, a, b)
        except nx.NetworkXNoPath:
            return None

    best = None
    for order in itertools.permutations(objs):
        stops = [start, *order]
        legs = [dist(no_d, a, b) for a, b in zip(stops, stops[1:])] + [dist(g, stops[-1], end)]
        if None not in legs and (best is None or sum(legs) < best):
            best = sum(legs)
    return best


def test_bfs_matches_networkx_and_is_no_longer_than_the_dfs_gold(puzzles):
    for raws in puzzles.values():
        for raw in raws[:20]:
            path = gn.shortest_path(raw)
            assert path is not None
            assert len(path) == nx_shortest_length(raw)
            assert len(path) <= len(raw["answer_steps"])
            assert gn.simulate(raw, path)[0]


# The hand grid above as a record: one obstacle type (dot), objects heart then star.
HAND = {"id": "hand", "text": ":0:0:0:3:0\n:0:2:4:-1:0\n:-1:0:0:1:0\n", "start_row": 3, "start_col": 4,
        "end_row": 2, "end_col": 2, "collect_objects_coordinates": "1-4:2-3", "collect_objects_idx": "1:2",
        "objects": " heart: star", "obstacles": " dot", "is_solvable": True, "num_steps": 11,
        "reasoning_steps": HAND_TRACE, "answer_steps": HAND_MOVES}


def test_simulator_accepts_and_rejects_hand_made_paths():
    assert gn.simulate(HAND, HAND_MOVES) == (True, "reached D with every object")
    assert gn.simulate(HAND, ["right", "up", "up", "left", "down", "left"])[0] is False  # steps on X at (b, d)
    ok, why = gn.simulate(HAND, ["up"])
    assert not ok and "obstacle" in why
    for moves in (["down"], ["right", "right"]):
        ok, why = gn.simulate(HAND, moves)
        assert not ok and "leaves the grid" in why
    ok, why = gn.simulate(HAND, ["left", "left", "up"])  # D before any object
    assert not ok and "without the objects" in why
    ok, why = gn.simulate(HAND, ["right", "up", "up", "left"])  # stops on the first object
    assert not ok and "not on D" in why
    assert not gn.simulate(HAND, [])[0]
    # the verifier stops at the first arrival on D and ignores the rest
    assert gn.simulate(HAND, HAND_MOVES + ["right", "right"])[0]
    # shortest: 7 moves (S to heart takes 4 either way round the X, then 3 more past star to D)
    path = gn.shortest_path(HAND)
    assert len(path) == 7 and gn.simulate(HAND, path)[0]


def test_score_parses_like_the_official_extract_directions():
    assert gn.score(HAND, "some reasoning\nAnswer: right up up left left down left")
    assert not gn.score(HAND, "Answer: right up up left left down left.")  # a stray token voids the list
    assert not gn.score(HAND, "Answer: right up  up left left down left")  # split on single spaces
    assert not gn.score(HAND, "Answer: right up")
    assert not gn.score(HAND, "Answer: No path exists")
    assert gn.parse_answer("Answer: up\nAnswer: left down") == ["left", "down"]
    assert gn.parse_answer("Answer: left\nright") == []


# ------------------------------------------------------------------------------ text formats


# Expected strings written out from the official templates (create_template.py: convert_text_table,
# get_reasoning_steps, the prompt constants), applied by hand to HAND. Note the official wording of a
# future object: it names the object being sought ("future-collect ( heart)"), not the one in the cell.
HAND_TABLE = (" & a & b & c & d & e\n"
              " a & O & O & O & heart & O\n"
              " b & O & D & star & dot & O\n"
              " c & dot & O & O & S & O\n")
HAND_COT = """We follow a depth first search, always moving towards the destination.
Source:( c, d) Destination:( b, b)
Collect objects: heart( a, d) star( b, c)
Avoid dot
 c, d:
 up: b, d closed( dot)
 left: c, c okay
 c, c:
 up: b, c future-collect ( heart)
 right: c, d visited
 left: c, b okay
 c, b:
 up: b, b future-collect (destination)
 right: c, c visited
 down: d, b outside
 left: c, a closed( dot)
No available actions. retrace 1 step
 c, c:
 up: b, c future-collect ( heart)
 right: c, d visited
 left: c, b visited
 down: d, c outside
No available actions. retrace 1 step
 c, d:
 up: b, d closed( dot)
 left: c, c visited
 right: c, e okay
 c, e:
 up: b, e okay
 b, e:
 up: a, e okay
 a, e:
 left: a, d okay
 a, d: Collect heart
 down: b, d closed( dot)
 left: a, c okay
 a, c:
 down: b, c okay
 b, c: Collect star
 left: b, b okay
"""
HAND_ANSWER = "Answer: right up up left left down left"
OBJECT_LIST = ("Objects: heart, crown, flag, star, flower, umbrella, plane, phone, spark, diamond, queen, hammer, "
               "club, gear, arrow, sun, bishop, note, coffee, anchor, cloud, pawn, castle, horse, infinity, moon, "
               "null, approx, integral, product, sum\nObstacles: dot, cross, square, triangle, plus\n")
INSTRUCTION = ("Your task is to give a list of actions ( left right up down) each indicating a movement by 1 cell "
               "that the traveller needs to follow. The traveller must recognize all objects in the grid, collect "
               "them but avoid obstacles in the process. Provide the final answer as 'Answer: [list of actions]'. "
               "If no path exists, output 'Answer: No path exists'.")
GRID_TEXT = ("The grid is filled up with objects, which you will be asked to recognize and collect, and obstacles, "
             "which you should avoid. Possible objects and obstacles are given as follows:\n" + OBJECT_LIST)
CONVERT = ("Convert the image into a text version of a table, where cells colored in blue, green are respectively "
           "marked as S, D. Blank cells are given by O. Objects and obstacles are mentioned by their names.")


def test_text_formats_on_the_hand_record():
    assert gn.text_table(HAND) == HAND_TABLE
    assert gn.reasoning(HAND) == HAND_COT
    assert gn.answer_line(HAND) == HAND_ANSWER
    text = gn.conversation(HAND, "text2answer")
    assert text["conversations"] == [
        {"from": "human", "value": HAND_TABLE + "\n\nThe table above shows a 2 dimensional grid. " + GRID_TEXT
         + "Cells that don't contain any object or obstacle are marked by O. A traveller starts at the source "
           "(marked as S) and wishes to go to the destination (marked as D). " + INSTRUCTION},
        {"from": "gpt", "value": HAND_COT + HAND_ANSWER}]
    image_prompt = ("<image>\n\nThe image shows a 2 dimensional grid. " + GRID_TEXT + "Cells that don't contain any "
                    "object or obstacle are left blank. A traveller starts at the source (colored in blue) and "
                    "wishes to go to the destination (colored in green). " + INSTRUCTION)
    image = gn.conversation(HAND, "image2answer")
    assert image["conversations"] == [{"from": "human", "value": image_prompt},
                                      {"from": "gpt", "value": HAND_COT + HAND_ANSWER}]
    both = gn.conversation(HAND, "image2answer+text", cot=False)
    assert both["conversations"][0]["value"] == image_prompt
    assert both["conversations"][1]["value"] == CONVERT + "\n" + HAND_TABLE + "\n" + HAND_ANSWER
    assert gn.conversation(HAND, "text2answer", cot=False)["conversations"][1]["value"] == HAND_ANSWER
    assert gn.conversation(HAND, "image2text")["conversations"] == [
        {"from": "human", "value": "<image>\n\nThe image shows a 2 dimensional grid. " + CONVERT},
        {"from": "gpt", "value": HAND_TABLE}]
    for dt in ("text2answer", "image2answer", "image2answer+text"):
        rec = gn.conversation(HAND, dt)
        assert rec["id"] == "hand" and rec["collect_objects_coordinates"] == "1-4:2-3" and rec["num_steps"] == 11
    with pytest.raises(UserError):
        gn.conversation(HAND, "text2image")


def test_unsolvable_record_formats():
    dead = {"id": "dead", "text": ":1:-2:3:0\n:0:0:4:0\n:-1:2:0:0\n", "start_row": 1, "start_col": 1,
            "end_row": 3, "end_col": 2, "collect_objects_coordinates": "1-3:2-3", "collect_objects_idx": "1:2",
            "objects": " moon: sun", "obstacles": " cross: plus", "is_solvable": False, "num_steps": 5,
            "reasoning_steps": DEAD_TRACE, "answer_steps": None}
    assert gn.text_table(dead) == (" & a & b & c & d\n a & S & plus & moon & O\n b & O & O & sun & O\n"
                                   " c & cross & D & O & O\n")
    assert gn.reasoning(dead) == """We follow a depth first search, always moving towards the destination.
Source:( a, a) Destination:( c, b)
Collect objects: moon( a, c) sun( b, c)
Avoid cross plus
 a, a:
 right: a, b closed( plus)
 up: `, a outside
 down: b, a okay
 b, a:
 right: b, b okay
 b, b:
 up: a, b closed( plus)
 right: b, c future-collect ( moon)
 down: c, b future-collect (destination)
 left: b, a visited
No available actions. retrace 1 step
 b, a:
 right: b, b visited
 up: a, a visited
 down: c, a closed( cross)
 left: b, ` outside
No available actions. retrace 1 step
 a, a:
 right: a, b closed( plus)
 up: `, a outside
 down: b, a visited
 left: a, ` outside
No available actions. retrace 1 step
"""
    assert gn.answer_line(dead) == "Answer: No path exists"
    assert gn.score(dead, "Answer: No path exists")  # official: an empty prediction matches no path
    assert not gn.score(dead, "Answer: down right")


def test_conversation_structure_on_generated_puzzles(puzzles):
    raw = puzzles["HARD"][0]
    answer = "Answer: " + " ".join(raw["answer_steps"])
    table = gn.text_table(raw)
    rows = table.rstrip("\n").split("\n")
    assert rows[0] == " & " + " & ".join("abcdefghijkl"[: raw["ncols"]])
    assert len(rows) == raw["nrows"] + 1 and rows[1].startswith(" a & ")
    assert table.count(" S") == 1 and table.count(" D") == 1
    for dt in DATA_TYPES:
        for cot in (True, False):
            rec = gn.conversation(raw, dt, cot=cot)
            human, gpt = rec["conversations"]
            assert human["value"].startswith("<image>\n\n") == (dt != "text2answer")
            if dt == "image2text":
                assert gpt["value"] == table
                continue
            assert gpt["value"].endswith(answer) and gn.score(raw, gpt["value"])
            assert ("We follow a depth first search" in gpt["value"]) == cot
    cot = gn.reasoning(raw)
    assert cot.count("retrace 1 step") == sum(st["action"] == "retrace" for st in raw["reasoning_steps"])
    blocks = cot.split("\nAvoid")[1].split("\n", 1)[1]
    assert sum(line[:1] == " " and line.endswith(":") or ": Collect" in line
               for line in blocks.split("\n")) == raw["num_steps"]  # one block per trace state
    assert cot.count(": Collect ") == sum(st["checkpoint"] != -1 for st in raw["reasoning_steps"]) >= raw["tot_objs"]


# ------------------------------------------------------------------------------ image


def decode(image) -> list[list[str]]:
    """Read the grid back from pixels: cell borders from the long black lines, then S / D by fill
    colour, X for a cell with black ink (object or obstacle), '.' for a blank white cell."""
    a = np.asarray(image).astype(int)
    dark = (a < 80).all(axis=2)

    def lines(counts):
        idx = np.flatnonzero(counts >= 0.95 * counts.max())
        groups = np.split(idx, np.flatnonzero(np.diff(idx) > 1) + 1)
        return [g.mean() for g in groups]

    ys, xs = lines(dark.sum(axis=1)), lines(dark.sum(axis=0))
    out = []
    for y0, y1 in zip(ys, ys[1:]):
        row = []
        for x0, x1 in zip(xs, xs[1:]):
            my, mx = 0.12 * (y1 - y0), 0.12 * (x1 - x0)
            cell = a[int(y0 + my):int(y1 - my), int(x0 + mx):int(x1 - mx)]
            frac = lambda col: (np.abs(cell - np.array(col)).sum(axis=2) < 30).mean()  # noqa: E731
            if frac(gn.S_COLOR) > 0.9:
                row.append("S")
            elif frac(gn.D_COLOR) > 0.9:
                row.append("D")
            elif (cell < 80).all(axis=2).sum() > 20:
                row.append("X")
            else:
                assert (cell == 255).all()
                row.append(".")
        out.append(row)
    return out


def test_render_is_deterministic_and_decodes_back_to_the_grid(puzzles):
    for raw in puzzles["SIMPLE"][:2] + puzzles["HARD"][:2] + [HAND]:
        img = gn.render(raw)
        gn.validate_image(img)
        assert img.mode == "RGB" and img.size == (1000, 1000)
        assert np.array_equal(np.asarray(img), np.asarray(gn.render(raw)))
        want = [["S" if v == 1 else "D" if v == 2 else "." if v == 0 else "X" for v in row] for row in grid_of(raw)]
        assert decode(img) == want
        a = np.asarray(img)
        assert (a == gn.S_COLOR).all(axis=2).sum() > 3000 and (a == gn.D_COLOR).all(axis=2).sum() > 3000


def test_every_symbol_draws_visible_ink():
    # a 12 x 12 grid (smallest cells) holding every object and obstacle symbol once
    names = gn.OBJ_NAMES + gn.OBS_NAMES
    values = list(range(3, 3 + len(gn.OBJ_NAMES))) + [-k for k in range(1, len(gn.OBS_NAMES) + 1)]
    cells = [[0] * 12 for _ in range(12)]
    cells[0][0], cells[11][11] = 1, 2
    for k, v in enumerate(values):
        cells[1 + k // 12][k % 12] = v
    raw = {"text": "".join("".join(f":{v}" for v in row) + "\n" for row in cells),
           "objects": ":".join(names[:len(gn.OBJ_NAMES)]), "obstacles": ":".join(gn.OBS_NAMES)}
    got = decode(gn.render(raw))
    want = [["S" if v == 1 else "D" if v == 2 else "." if v == 0 else "X" for v in row] for row in cells]
    assert got == want


def test_validate_image_rejects_wrong_size_and_mode():
    from PIL import Image

    gn.validate_image(Image.new("RGB", (1000, 1000)))
    with pytest.raises(UserError):
        gn.validate_image(Image.new("RGB", (448, 448)))
    with pytest.raises(UserError):
        gn.validate_image(Image.new("RGBA", (1000, 1000)))
    with pytest.raises(UserError):
        gn.validate_image(np.zeros((1000, 1000, 3), dtype=np.uint8))


def test_write_split_layout(tmp_path):
    assert get_task("grid-navigation") is gn
    folder = write_split("grid_navigation", "simple", 2, 0, tmp_path)
    assert folder == tmp_path / "grid_navigation" / "SIMPLE"
    raws = json.loads((folder / "raw.json").read_text())
    assert raws == gn.generate("SIMPLE", 2, 0)
    for dt in DATA_TYPES:
        recs = json.loads((folder / f"{dt}+cot.json").read_text())
        assert [r["id"] for r in recs] == [r["id"] for r in raws]
    for r in raws:
        assert (folder / "images" / f"{r['id']}.png").exists()
