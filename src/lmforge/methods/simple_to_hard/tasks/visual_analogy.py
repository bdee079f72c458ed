"""Visual Analogy (S2H, ICML 2025): pick the option that completes the query row by the examples' relation.

A puzzle has two example rows of three panels, a query row of two panels and four option panels.
Every row follows one *(attribute, relation)* combination: the attributes are line type/color and
shape type/color/size/quantity/position, the relations XOR, OR, AND (on the set of values an
attribute takes in panels 1 and 2, giving panel 3's set) and Progression (strictly increasing or
decreasing); shape quantity only has Progression, so there are 25 combinations. The answer is the
option that completes the query row by the relation the examples share; every other option
completes it by a different relation.

This module follows the official generator (github.com/princeton-pli/VLM_S2H,
``data_generation/visual_analogy``, MIT):

- ``generate_puzzles.py``: HARD uses the 8 held-out combinations :data:`HARD_COMBOS` (``hard_combi``),
  its example rows on the *two different* held-out attributes of the query's relation (every
  relation has exactly two); SIMPLE uses the other 17 (:data:`SIMPLE_COMBOS`), both example rows on
  the query's own combination. The distractor options follow combinations of the query's object
  kind (line or shape) with another relation, drawn among the SIMPLE combinations for SIMPLE and
  among all 25 for HARD; options are shuffled.
- ``utils.py``: the attribute values (:data:`LINE_TYPES`, :data:`LINE_COLORS`, ...), the row
  contexts (``create_context`` for XOR/OR/AND: a value shared by panels 1 and 2 and a value only in
  panel 1; ``create_progression_context``), and the option construction (``create_panel``: the
  relation's value set, every value of it present for XOR/OR/AND and type/position Progression, one
  value for color/size/quantity Progression, the official shape-count rules), drawn by Panel.draw.
- ``create_image_text_pairs.py``: the text twin (``create_text``/``print_panel``), the chain of
  thought (``create_cot``), the answer block (``create_answer``: each example's and option's
  ``(attribute, relation)``, ``consistent`` or not, then ``Answer: k``) and the three questions.
- ``prepare_main_data.py``: the records of image2answer, image2answer+text, text2answer and
  image2text, with and without CoT (the official image2text+cot file is a copy of image2text).

Differences from the official code, all deliberate:

- Spurious rules. The official generator forbids attribute values (``exclude_spurious_correlation``)
  so that a row follows no other combination, but the exclusion has holes (Progression of type
  forbids one value of a randomly completed set; the position-progression test checks the diagonal
  for vertical shifts; rows are never re-checked). Here every row (example, gold and distractor) is
  drawn again until it follows *exactly* its labelled combination among all 25 by
  :func:`rule_holds`, so every puzzle has exactly one option following the examples' relation and
  the CoT's per-row labels are true. The per-panel random "forbidden value" of ``Panel`` (a
  distribution detail of the same exclusion) is not reproduced.
- Randomness. The official code reseeds numpy's global RNG per puzzle and takes SIMPLE combinations
  in ``set`` order (hash-randomised per process), so its puzzles cannot be reproduced from a seed;
  this module uses :class:`random.Random` and a fixed combination order. (The official code meant
  the examples and query to share a progression direction, but the check ``r == 'progression'`` is
  never true, so the directions are independent there as here.)
- Value order. The text twin and CoT list an attribute's values in Python ``set`` order officially
  (arbitrary); here in the canonical order of the value lists.
- Image. PIL, :data:`PANEL` pixel panels (official: 160 px cv2 canvases in a matplotlib figure of
  8x9 inches); same layout: three rows of three panels centred, ``?`` as the last query panel, a
  half-row gap, then four option panels.
- Not implemented: the CoT ablations (``cot_alt_template``, ``cot_alt_order``,
  ``cot_alt_attributes``) and the multi-image layout.
"""

from __future__ import annotations

import random
import re

from PIL import Image, ImageDraw

from lmforge.common.errors import UserError
from lmforge.methods.simple_to_hard.tasks import DATA_TYPES, check_level, check_rgb_image, check_sizes
from lmforge.methods.simple_to_hard.tasks import font as _font

NAME = "visual_analogy"

# ---------------------------------------------------------------------------------------------------
# Vocabulary (utils.py)
# ---------------------------------------------------------------------------------------------------

CANVAS = 160  # official CANVAS_SIZE; geometry below is in these units
DOMAINS = ("line_type", "line_color", "shape_type", "shape_color", "shape_size", "shape_quantity",
           "shape_position")
RELATIONS = ("XOR", "OR", "AND", "Progression")
# name -> (points in canvas fractions, mode), VALUES['line_type']
LINE_GEOMETRY = {
    "falling diagonal line": (((0, 0), (1, 1)), "line"),
    "rising diagonal line": (((0, 1), (1, 0)), "line"),
    "horizontal line": (((0, 0.5), (1, 0.5)), "line"),
    "vertical line": (((0.5, 0), (0.5, 1)), "line"),
    "diamond lines": (((0.5, 0), (0, 0.5), (0.5, 1), (1, 0.5)), "contour"),
    "circular line": (((0.5, 0.5),), "circle"),
    "V-shape facing up": (((0, 0), (0.5, 1), (1, 0)), "contour"),
    "V-shape facing left": (((0, 0), (1, 0.5), (0, 1)), "contour"),
    "V-shape facing down": (((0, 1), (0.5, 0), (1, 1)), "contour"),
    "V-shape facing right": (((1, 0), (0, 0.5), (1, 1)), "contour"),
}
LINE_TYPES = tuple(LINE_GEOMETRY)
LINE_COLORS = (0, 90, 135, 189)  # grey levels; larger is lighter
SHAPE_TYPES = ("circle", "rectangle", "triangle", "pentagon", "hexagon")
SHAPE_COLORS = (0, 90, 135, 189, 255)
SHAPE_SIZES = (20, 27, 34, 41)  # np.arange(20, 42, 7)
QUANTITIES = (1, 2, 3, 4, 5)
POSITIONS = tuple((i, j) for i in range(3) for j in range(3))  # (row, column) on the 3x3 grid
_VALUES = {
    ("line", "type"): LINE_TYPES, ("line", "color"): LINE_COLORS,
    ("shape", "type"): SHAPE_TYPES, ("shape", "color"): SHAPE_COLORS, ("shape", "size"): SHAPE_SIZES,
    ("shape", "position"): POSITIONS,
}
_ATTRS = {"line": ("type", "color"), "shape": ("type", "color", "size", "quantity", "position")}
# Position Progression moves every shape one cell (wrapping): horizontal, vertical or diagonal.
SHIFTS = {"horizontal": (0, 1), "vertical": (1, 0), "diagonal": (1, 1)}

# generate_puzzles.py: hard_combi (held out), in the official order.
HARD_COMBOS = (("shape_size", "XOR"), ("shape_position", "OR"), ("line_color", "AND"),
               ("shape_type", "Progression"), ("shape_position", "XOR"), ("shape_type", "OR"),
               ("shape_color", "AND"), ("line_color", "Progression"))
ALL_COMBOS = tuple((d, r) for d in DOMAINS for r in RELATIONS if d != "shape_quantity" or r == "Progression")
SIMPLE_COMBOS = tuple(c for c in ALL_COMBOS if c not in HARD_COMBOS)
LEVEL_COMBOS = {"SIMPLE": SIMPLE_COMBOS, "HARD": HARD_COMBOS}

# Size knobs, the official values. nshot is generate_puzzles.py's --nshot (the prompts say "2
# examples (row 1 and 2)" and "a 3 by 3 grid", so only 2 fits them); options is fixed at 4 ("need 4
# options"); context_extra_lines is utils.NUM_LINES (randint(NUM_LINES) extra lines per XOR/OR/AND
# context panel) and context_shapes utils.NUM_SHAPES (randint(2, NUM_SHAPES) shapes per XOR/OR/AND
# context panel, so always 2).
SIZES = {
    level: {"nshot": (2, 2), "options": (4, 4), "context_extra_lines": (0, 1), "context_shapes": (2, 2)}
    for level in ("SIMPLE", "HARD")
}

MAX_TRIES = 200  # draws of a row (context or option) before giving up on it

# ---------------------------------------------------------------------------------------------------
# Questions (create_image_text_pairs.py, verbatim, typo included) and prepare_main_data.py's pieces
# ---------------------------------------------------------------------------------------------------

IMAGE2ANS_QUESTION = (
    "The image shows a a puzzle in a 3 by 3 grid followed by 4 options. The puzzle consists of 2 examples "
    "(row 1 and 2), a query (row 3), and four options. Each example contains three images following a relation "
    "along certain attribute, and this relation is consistent across all examples. The query contains two "
    "images. Analyze the changes in the following attributes for each example: line type, line color, shape "
    "type, shape color, shape size, shape quantity, shape position, and consider the relations: Progression, "
    "XOR, OR, and AND. Progression requires the value of a certain attribute to strictly increase or decrease, "
    "but not necessarily by a fixed amount. Please provide your predictions in the format 'Example i: "
    "(attribute, relation)' for each example and similarly for options. Provide the final answer as 'Answer: "
    "[correct option]'."
)
TEXT2ANS_QUESTION = (
    "The paragraph above describes a puzzle. The puzzle consists of 2 examples, a query, and four options. Each "
    "example contains three images following a relation along certain attribute, and this relation is "
    "consistent across all examples. The query contains two images. Analyze the changes in the following "
    "attributes for each example: line type, line color, shape type, shape color, shape size, shape quantity, "
    "shape position, and consider the relations: Progression, XOR, OR, and AND. Progression requires the value "
    "of a certain attribute to strictly increase or decrease, but not necessarily by a fixed amount. Please "
    "provide your predictions in the format 'Example i: (attribute, relation)' for each example and similarly "
    "for options. Provide the final answer as 'Answer: [correct option]'."
)
IMAGE2TEXT_QUESTION = (
    "The image shows a puzzle in a 3 by 3 grid followed by 4 options. Convert the image into a text version of "
    "the puzzle that describes each image in the example (row 1 and 2), query (row 3), and options (at the "
    "bottom) by identifying the value of the following attributes, if applicable: line type, line color, shape "
    "type, shape color, shape size, shape quantity, and shape position."
)
CONVERT_PREFIX = "Convert the image into a text version of the puzzle.\n"
IMAGE_TOKEN = "<image>\n\n"

# ---------------------------------------------------------------------------------------------------
# Panels and the rule check
#
# A panel is {"kind": "line" | "shape", "objects": [...]}; a line is {"type", "color"}, a shape
# {"type", "color", "size", "position": [row, col]}. Lines of a panel have distinct types, shapes of
# a panel distinct positions (as the official generator draws them).
# ---------------------------------------------------------------------------------------------------


def attribute_values(panel: dict, attr: str) -> frozenset:
    """The set of values ``attr`` takes in ``panel`` (``quantity``: the number of shapes)."""
    objs = panel["objects"]
    if attr == "quantity":
        return frozenset([len(objs)]) if panel["kind"] == "shape" and objs else frozenset()
    if attr == "position":
        return frozenset(tuple(o["position"]) for o in objs if "position" in o)
    return frozenset(o[attr] for o in objs if attr in o)


def _summary(panel: dict) -> dict:
    s = {a: attribute_values(panel, a) for a in ("type", "color", "size", "position")}
    s["kind"], s["n"] = panel["kind"], len(panel["objects"])
    return s


def _shift(positions, d) -> frozenset:
    di, dj = d
    return frozenset(((i + di) % 3, (j + dj) % 3) for i, j in positions)


def _holds(domain: str, relation: str, s1: dict, s2: dict, s3: dict) -> bool:
    kind, attr = domain.split("_")
    if not all(s["kind"] == kind and s["n"] > 0 for s in (s1, s2, s3)):
        return False
    if attr == "quantity":
        a, b, c = s1["n"], s2["n"], s3["n"]
        return relation == "Progression" and (a < b < c or a > b > c)
    a, b, c = s1[attr], s2[attr], s3[attr]
    if relation == "XOR":  # (c is never empty here: every panel holds objects)
        return bool(c) and c == a ^ b
    if relation == "OR":
        return c == a | b
    if relation == "AND":
        return bool(c) and c == a & b
    # Progression
    if attr == "type":  # each panel adds types: create_progression's "superset" rule
        return a < b < c
    if attr == "position":  # every shape moves one cell the same way
        return any(_shift(a, d) == b and _shift(b, d) == c for d in SHIFTS.values())
    if len(a) == len(b) == len(c) == 1:  # color/size: one value per panel, strictly monotone
        (x,), (y,), (z,) = a, b, c
        return x < y < z or x > y > z
    return False


def rule_holds(domain: str, relation: str, p1: dict, p2: dict, p3: dict) -> bool:
    """Whether panels ``p1, p2, p3`` follow ``(domain, relation)``.

    XOR / OR / AND: panel 3's value set is the symmetric difference / union / intersection of panels 1
    and 2 (XOR and AND non-empty). Progression: type sets strictly grow (p1 < p2 < p3); color and size
    are one value per panel, strictly increasing or decreasing; quantity strictly increases or
    decreases; positions all move one cell horizontally, vertically or diagonally (wrapping) each
    step. Every panel must hold objects of the domain's kind.
    """
    if (domain, relation) not in ALL_COMBOS:
        raise UserError(f"{NAME}: ({domain}, {relation}) is not one of the 25 combinations")
    return _holds(domain, relation, _summary(p1), _summary(p2), _summary(p3))


_KIND_COMBOS = {k: tuple(c for c in ALL_COMBOS if c[0].startswith(k)) for k in ("line", "shape")}


def _satisfied(s1: dict, s2: dict, s3: dict) -> list[tuple[str, str]]:
    return [c for c in _KIND_COMBOS.get(s3["kind"], ()) if _holds(c[0], c[1], s1, s2, s3)]


def _only(combo, s1: dict, s2: dict, s3: dict) -> bool:
    """Whether the row follows ``combo`` and no other combination."""
    if not _holds(combo[0], combo[1], s1, s2, s3):
        return False
    return not any(c != combo and _holds(c[0], c[1], s1, s2, s3) for c in _KIND_COMBOS[s3["kind"]])


def satisfied_combos(p1: dict, p2: dict, p3: dict) -> list[tuple[str, str]]:
    """Every (domain, relation) of the 25 that ``p1, p2, p3`` follow."""
    return _satisfied(_summary(p1), _summary(p2), _summary(p3))


def consistent_options(raw: dict) -> list[int]:
    """0-based options whose row with the query panels follows the query's (domain, relation).

    Computed from the panels by :func:`rule_holds` alone (the option labels are not read).
    """
    d, r = raw["query"]["label"]
    q1, q2 = raw["query"]["panels"]
    return [k for k, opt in enumerate(raw["options"]) if rule_holds(d, r, q1, q2, opt["panel"])]


# ---------------------------------------------------------------------------------------------------
# Drawing objects
# ---------------------------------------------------------------------------------------------------


def _pick(rng: random.Random, pool):
    pool = list(pool)
    return rng.choice(pool) if pool else None


def _add_line(rng, panel, types=None, colors=None, no_types=(), no_colors=()) -> bool:
    """Add a line (type among ``types`` minus ``no_types`` and the panel's types, color likewise)."""
    taken = {o["type"] for o in panel["objects"]}
    t = _pick(rng, [x for x in (types or LINE_TYPES) if x not in taken and x not in no_types])
    c = _pick(rng, [x for x in (colors or LINE_COLORS) if x not in no_colors])
    if t is None or c is None:
        return False
    panel["objects"].append({"type": t, "color": c})
    return True


def _add_shape(rng, panel, only: dict | None = None, never: dict | None = None) -> bool:
    """Add a shape on a free cell; ``only``/``never`` map attributes to allowed/forbidden values."""
    only, never = only or {}, never or {}
    taken = {tuple(o["position"]) for o in panel["objects"]}
    obj = {}
    for attr, values in (("type", SHAPE_TYPES), ("color", SHAPE_COLORS), ("size", SHAPE_SIZES),
                         ("position", POSITIONS)):
        pool = only.get(attr, values)
        bad = set(never.get(attr, ()))
        if attr == "position":
            bad |= taken
        v = _pick(rng, [x for x in pool if x not in bad])
        if v is None:
            return False
        obj[attr] = list(v) if attr == "position" else v
    panel["objects"].append(obj)
    return True


def _panel(kind: str) -> dict:
    return {"kind": kind, "objects": []}


def _add(rng, panel, only=None, never=None) -> bool:
    only, never = only or {}, never or {}
    if panel["kind"] == "line":
        return _add_line(rng, panel, only.get("type"), only.get("color"), never.get("type", ()),
                         never.get("color", ()))
    return _add_shape(rng, panel, only, never)


# ---------------------------------------------------------------------------------------------------
# Contexts (panels 1 and 2 of a row): utils.create_context / create_progression_context
# ---------------------------------------------------------------------------------------------------


def _attr_of(obj: dict, attr: str):
    return tuple(obj["position"]) if attr == "position" else obj[attr]


def _context(rng, domain: str, sizes: dict):
    """Panels 1 and 2 for an XOR/OR/AND row: one value shared by both, one only in panel 1."""
    kind, attr = domain.split("_")
    p1, p2 = _panel(kind), _panel(kind)
    ok = _add(rng, p1)
    common = p1["objects"][0]
    ok &= _add(rng, p1, never={attr: [_attr_of(common, attr)]})
    if not ok:
        return None
    diff = p1["objects"][1]
    if kind == "line":
        for _ in range(rng.randint(*sizes["context_extra_lines"])):
            ok &= _add(rng, p1)
        ok &= _add(rng, p2, only={attr: [common[attr]]}, never={attr: [diff[attr]]})
        for _ in range(rng.randint(*sizes["context_extra_lines"])):
            ok &= _add(rng, p2, never={attr: [diff[attr]]})
    else:
        n1, n2 = rng.randint(*sizes["context_shapes"]), rng.randint(*sizes["context_shapes"])
        for _ in range(n1 - 2):
            ok &= _add(rng, p1)
        ok &= _add(rng, p2, only={attr: [_attr_of(common, attr)]})
        for _ in range(n2 - 1):
            ok &= _add(rng, p2, never={attr: [_attr_of(diff, attr)]})
    return (p1, p2) if ok else None


def _progression_context(rng, domain: str):
    kind, attr = domain.split("_")
    p1, p2 = _panel(kind), _panel(kind)
    ok = True
    if domain == "line_type":
        for _ in range(1 + (rng.random() > 0.5)):
            ok &= _add(rng, p1)
        for o in p1["objects"]:
            ok &= _add(rng, p2, only={"type": [o["type"]]})
        ok &= _add(rng, p2)  # a new type
    elif attr == "quantity":
        up = rng.random() < 0.5
        q1 = rng.choice(QUANTITIES[:-2] if up else QUANTITIES[2:])
        q2 = _pick(rng, [q for q in QUANTITIES[1:-1] if (q > q1 if up else q < q1)])
        for panel, q in ((p1, q1), (p2, q2)):
            for _ in range(q):
                ok &= _add(rng, panel)
    elif attr in ("color", "size"):
        values = _VALUES[kind, attr]
        up = rng.random() < 0.5  # "from dark color to light color" / "increase in size"
        v1 = rng.choice(values[:-2] if up else values[2:])
        v2 = _pick(rng, [v for v in values[1:-1] if (v > v1 if up else v < v1)])
        if kind == "line":  # a common line type in both panels, all lines of a panel one color
            for v, panel in ((v1, p1), (v2, p2)):
                first = {"color": [v]} if panel is p1 else {"color": [v], "type": [p1["objects"][0]["type"]]}
                ok &= _add(rng, panel, only=first)
                for _ in range(1 + (rng.random() > 0.5)):
                    ok &= _add(rng, panel, only={"color": [v]})
        else:
            n1 = rng.choice(QUANTITIES)
            n2 = rng.randint(1, QUANTITIES[-1] - 1)
            for panel, n, v in ((p1, n1, v1), (p2, n2, v2)):
                for _ in range(n):
                    ok &= _add(rng, panel, only={attr: [v]})
    elif attr == "type":  # shape type: panel 2 keeps panel 1's types and adds new ones
        for _ in range(rng.choice(QUANTITIES[:-2])):
            ok &= _add(rng, p1)
        types1 = sorted(attribute_values(p1, "type"), key=SHAPE_TYPES.index)
        n2 = rng.randint(len(types1), QUANTITIES[-1] - 1)
        for t in types1:
            ok &= _add(rng, p2, only={"type": [t]})
        for _ in range(n2 - len(types1)):
            ok &= _add(rng, p2)
    else:  # shape position: every shape moves one cell
        for _ in range(rng.choice(QUANTITIES[:-2])):
            ok &= _add(rng, p1)
        d = SHIFTS[rng.choice(list(SHIFTS))]
        for o in p1["objects"]:
            (pos,) = _shift([tuple(o["position"])], d)
            ok &= _add(rng, p2, only={"position": [pos]})
    return (p1, p2) if ok else None


# ---------------------------------------------------------------------------------------------------
# Options (panel 3 of a row): utils.create_panel
# ---------------------------------------------------------------------------------------------------


def _constraint(rng, domain: str, relation: str, s1: dict, s2: dict):
    """``("all", values)`` (panel 3 shows exactly these values) or ``("any", values)`` (one of them)."""
    kind, attr = domain.split("_")
    if s1["kind"] != kind or s2["kind"] != kind or not s1["n"] or not s2["n"]:
        return None
    order = _VALUES.get((kind, attr))
    if attr == "quantity":
        a, b = s1["n"], s2["n"]
        vals = [q for q in QUANTITIES if (q > b if b > a else q < b)] if a != b else []
        return ("any", vals) if vals else None
    a, b = s1[attr], s2[attr]
    if relation != "Progression":
        vals = a ^ b if relation == "XOR" else a | b if relation == "OR" else a & b
        return ("all", sorted(vals, key=order.index)) if vals else None
    if attr == "type":
        new = [t for t in order if t not in b]
        if not (a < b) or not new:
            return None
        return "all", sorted(b | {rng.choice(new)}, key=order.index)
    if attr == "position":
        for d in SHIFTS.values():
            if _shift(a, d) == b:
                return "all", sorted(_shift(b, d))
        return None
    if len(a) != 1 or len(b) != 1 or a == b:
        return None
    (x,), (y,) = a, b
    vals = [v for v in order if (v > y if y > x else v < y)]
    return ("any", vals) if vals else None


def _draw_option(rng, domain: str, relation: str, s1: dict, s2: dict):
    c = _constraint(rng, domain, relation, s1, s2)
    if c is None:
        return None
    mode, vals = c
    kind, attr = domain.split("_")
    panel = _panel(kind)
    if kind == "line":
        chosen = vals if mode == "all" else [rng.choice(vals)]
        for v in chosen:
            if not _add(rng, panel, only={attr: [v]}):
                return None
        return panel
    if attr == "quantity":
        counts = vals
    elif attr == "position" and relation == "Progression":
        counts = [s2["n"]]
    elif attr == "position":
        counts = [len(vals)]
    else:  # the official np.arange(len(constraints), 5) + 1
        counts = list(range(len(vals) + 1, QUANTITIES[-1] + 1))
    if attr != "quantity" and s1["n"] != s2["n"]:  # the official "forbid quantity": no quantity Progression
        a, b = s1["n"], s2["n"]
        counts = [q for q in counts if not (q > b if b > a else q < b)]
    if not counts:
        return None
    n = rng.choice(counts)
    if mode == "all":
        for v in vals:
            if not _add(rng, panel, only={attr: [v]}):
                return None
        for _ in range(n - len(vals)):
            if not _add(rng, panel, only={attr: [rng.choice(vals)]}):
                return None
    else:
        only = {} if attr == "quantity" else {attr: [rng.choice(vals)]}
        for _ in range(n):
            if not _add(rng, panel, only=only):
                return None
    return panel


def _option(rng, combo, s1: dict, s2: dict):
    """Panel 3 following ``combo`` and no other of the 25 combinations, or None."""
    for _ in range(MAX_TRIES // 10):
        panel = _draw_option(rng, combo[0], combo[1], s1, s2)
        if panel is None:
            if _constraint(rng, combo[0], combo[1], s1, s2) is None:
                return None  # the context does not admit the combination at all
            continue
        if _only(combo, s1, s2, _summary(panel)):
            return panel
    return None


def _row_context(rng, combo, sizes):
    domain, relation = combo
    return _progression_context(rng, domain) if relation == "Progression" else _context(rng, domain, sizes)


def _example(rng, combo, sizes):
    for _ in range(MAX_TRIES):
        ctx = _row_context(rng, combo, sizes)
        if ctx is None:
            continue
        s1, s2 = _summary(ctx[0]), _summary(ctx[1])
        opt = _option(rng, combo, s1, s2)
        if opt is not None:
            return {"label": list(combo), "panels": [ctx[0], ctx[1], opt]}
    raise UserError(f"{NAME}: could not draw a row for {combo} in {MAX_TRIES} tries")


def _query(rng, combo, candidates, n_options, sizes):
    kind = combo[0].split("_")[0]
    pool = [c for c in candidates if c[0].startswith(kind) and c[1] != combo[1]]
    for _ in range(MAX_TRIES):
        ctx = _row_context(rng, combo, sizes)
        if ctx is None:
            continue
        s1, s2 = _summary(ctx[0]), _summary(ctx[1])
        gold = _option(rng, combo, s1, s2)
        if gold is None:
            continue
        options = [(combo, gold)]
        for cand in rng.sample(pool, len(pool)):
            panel = _option(rng, cand, s1, s2)
            if panel is not None:
                options.append((cand, panel))
                if len(options) == n_options:
                    break
        if len(options) < n_options:
            continue
        rng.shuffle(options)
        answer = next(k for k, (c, _) in enumerate(options) if c == combo)
        return ({"label": list(combo), "panels": [ctx[0], ctx[1]]},
                [{"label": list(c), "panel": p} for c, p in options], answer)
    raise UserError(f"{NAME}: could not draw a query for {combo} with {n_options} options in {MAX_TRIES} tries")


def generate(level: str, n: int, seed: int, **sizes) -> list[dict]:
    """``n`` puzzles of ``level``, deterministic for ``seed``.

    A puzzle is ``{"id", "level", "examples": [{"label": [domain, relation], "panels": [p1, p2, p3]}]
    * nshot, "query": {"label", "panels": [p1, p2]}, "options": [{"label", "panel"}] * 4, "answer"}``
    with ``answer`` 0-based. Sizes (see :data:`SIZES`): ``nshot`` and ``options`` are fixed by the
    official prompts; ``context_extra_lines`` (extra lines per XOR/OR/AND line panel) and
    ``context_shapes`` (shapes per XOR/OR/AND shape panel) are drawn per panel in their range.
    """
    level = check_level(level)
    ranges = check_sizes(NAME, level, SIZES[level], sizes)
    if n < 0:
        raise UserError(f"{NAME}: n must be non-negative (got {n})")
    nshot, n_options = ranges["nshot"][0], ranges["options"][0]
    combos = LEVEL_COMBOS[level]
    out = []
    for i in range(n):
        rng = random.Random(f"{NAME}/{level}/{seed}/{i}")
        query_combo = rng.choice(combos)
        if level == "HARD":  # the other held-out attributes of the query's relation, one per example
            same = [c for c in combos if c[1] == query_combo[1]]
            shots = rng.sample(same, nshot) if len(same) >= nshot else [rng.choice(same) for _ in range(nshot)]
            candidates = ALL_COMBOS
        else:
            shots = [query_combo] * nshot
            candidates = SIMPLE_COMBOS
        examples = [_example(rng, c, ranges) for c in shots]
        query, options, answer = _query(rng, query_combo, candidates, n_options, ranges)
        out.append({"id": f"{NAME}-{level}-{seed}-{i}", "level": level, "examples": examples, "query": query,
                    "options": options, "answer": answer})
    return out


# ---------------------------------------------------------------------------------------------------
# Text twin, chain of thought, answer block, conversations
# ---------------------------------------------------------------------------------------------------


def _value_strings(panel: dict, attr: str) -> list[str]:
    vals = attribute_values(panel, attr)
    if attr == "quantity":
        return [str(v) for v in vals]
    order = _VALUES[panel["kind"], attr]
    return [str(v) for v in sorted(vals, key=order.index)]


def panel_text(panel: dict) -> str:
    """``print_panel``: ``type: ..., color: ...`` for lines, ``N shapes; type: ..., color: ..., size: ...,
    position: ...`` for shapes (``1 shape; `` for one), ``NA`` for an attribute without values."""
    objs = panel["objects"]
    if not objs:
        return ""
    fields = ("type", "color") if panel["kind"] == "line" else ("type", "color", "size", "position")
    body = ", ".join(f"{a}: {', '.join(_value_strings(panel, a)) or 'NA'}" for a in fields)
    if panel["kind"] == "line":
        return body + "\n"
    count = "1 shape; " if len(objs) == 1 else f"{len(objs)} shapes; "
    return count + body + "\n"


def puzzle_text(raw: dict) -> str:
    """``create_text``: the text twin of the whole puzzle (examples, query, options)."""
    text = ""
    for i, ex in enumerate(raw["examples"]):
        text += f"Example {i + 1}:\n"
        for j, p in enumerate(ex["panels"]):
            text += f"Panel {j + 1}:\n" + panel_text(p)
    text += "Query:\n"
    for j, p in enumerate(raw["query"]["panels"]):
        text += f"Panel {j + 1}:\n" + panel_text(p)
    text += "Options:\n"
    for i, opt in enumerate(raw["options"]):
        text += f"Option {i + 1}:\n" + panel_text(opt["panel"])
    return text


def _words(domain: str) -> str:
    return " ".join(domain.split("_"))


def _attr_lines(panels, attrs) -> str:
    out = ""
    for a in attrs:
        out += f"{a}:\n"
        for j, p in enumerate(panels):
            vals = _value_strings(p, a)
            out += f"Image {j + 1}: {', '.join(vals) if vals else 'NA'}\n"
    return out


def chain_of_thought(raw: dict) -> str:
    """``create_cot``: each example's attributes per image, the common relation, the query, each option."""
    gt_domain, gt_relation = raw["query"]["label"]
    cot = "We first analyze the examples by considering the applicable attributes and relations:\n"
    labels = []
    for i, ex in enumerate(raw["examples"]):
        d, r = ex["label"]
        labels.append(f"({_words(d)}, {r})")
        kind, attr = d.split("_")
        cot += f"Example {i + 1}:\n"
        for a in _ATTRS[kind]:
            cot += _attr_lines(ex["panels"], [a])
            cot += "No pattern.\n" if a != attr else f"This suggests the {r} relation.\n"
    cot += f"The examples suggest the following patterns: {', '.join(labels)}.\n"
    cot += f"We conclude that {gt_relation} is the common relation.\n"
    cot += "Now, we analyze the images in the query:\n"
    cot += _attr_lines(raw["query"]["panels"], _ATTRS[gt_domain.split("_")[0]])
    cot += "Looking at the options, we find:\n"
    for i, opt in enumerate(raw["options"]):
        d, r = opt["label"]
        vals = _value_strings(opt["panel"], d.split("_")[1])
        cot += (f"Option {i + 1} has {_words(d)} of {', '.join(vals)}, " if vals
                else f"Option {i + 1} does not have {_words(d)}, ")
        cot += f"so it is consistent with the {r} relation on {_words(d)}, "
        cot += (f"and {r} is the target relation.\n" if i == raw["answer"]
                else f"but {r} is not the target relation.\n")
    cot += (f"We conclude that option {raw['answer'] + 1} is the answer since it is consistent with the "
            f"{gt_relation} relation.\n")
    return cot


def answer_block(raw: dict) -> str:
    """``create_answer``: ``Example i: (attribute, relation)`` lines, option lines, ``Answer: k``."""
    out = ""
    for i, ex in enumerate(raw["examples"]):
        d, r = ex["label"]
        out += f"Example {i + 1}: ({_words(d)}, {r})\n"
    for i, opt in enumerate(raw["options"]):
        d, r = opt["label"]
        out += f"Option {i + 1}: ({_words(d)}, {r}), {'consistent' if i == raw['answer'] else 'not consistent'}\n"
    return out + f"\nAnswer: {raw['answer'] + 1}"


def conversation(raw: dict, data_type: str, cot: bool = True) -> dict:
    """The record of ``prepare_main_data.convert_to_instruction`` for ``data_type``.

    image2answer: ``<image>\\n\\n`` + question; reply = [CoT + ``\\n\\n``] + answer block.
    image2answer+text: the same, the reply opening with the conversion (``Convert the image into a
    text version of the puzzle.\\n`` + text + ``\\n``). text2answer: text + ``\\n`` + question.
    image2text: the conversion alone (the official image2text+cot file is the same record, so
    ``cot`` has no effect there).
    """
    if data_type not in DATA_TYPES:
        raise UserError(f"{NAME}: unknown data type {data_type!r}; known: {', '.join(DATA_TYPES)}")
    text = puzzle_text(raw)
    reasoning = (chain_of_thought(raw) + "\n\n" if cot else "") + answer_block(raw)
    if data_type == "image2text":
        human, gpt = IMAGE_TOKEN + IMAGE2TEXT_QUESTION, (CONVERT_PREFIX + text + "\n")[:-2]
    elif data_type == "image2answer":
        human, gpt = IMAGE_TOKEN + IMAGE2ANS_QUESTION, reasoning
    elif data_type == "image2answer+text":
        human, gpt = IMAGE_TOKEN + IMAGE2ANS_QUESTION, CONVERT_PREFIX + text + "\n" + reasoning
    else:  # text2answer
        human, gpt = text + "\n" + TEXT2ANS_QUESTION, reasoning
    return {"id": raw["id"], "conversations": [{"from": "human", "value": human}, {"from": "gpt", "value": gpt}]}


# ---------------------------------------------------------------------------------------------------
# Scoring
# ---------------------------------------------------------------------------------------------------

_ANSWER = re.compile(r"Answer:\s*\[?\s*(\d+)")


def parse_answer(response: str) -> int | None:
    """The 1-based option of the last ``Answer: k`` in ``response`` (``Answer: [k]`` too), or None."""
    found = _ANSWER.findall(response)
    return int(found[-1]) if found else None


def score(raw: dict, response: str) -> bool:
    """True when the response's last ``Answer: k`` names the gold option (1-based).

    NOTE: the official VLMEvalKit metric (``OurEval_Analogy_eval``) reports the exact match of the
    whole answer block and a "partial" score whose option-line check is off by one line (it counts
    the blank line before ``Answer:``), so it rejects the gold block itself; this checker reads the
    final answer only.
    """
    got = parse_answer(response)
    return got is not None and got == raw["answer"] + 1


# ---------------------------------------------------------------------------------------------------
# Image
# ---------------------------------------------------------------------------------------------------

PANEL = 96  # pixels per panel side (the official canvas is 160)
_GAP = 4  # white margin around every panel
CELL = PANEL + 2 * _GAP
WIDTH, HEIGHT = 4 * CELL, 4 * CELL + CELL // 2  # official figure: 4 panel widths, 4.5 panel heights


_POLYGONS = {
    "triangle": ((0, -0.5), (0.577, 0.5), (-0.577, 0.5)),
    "pentagon": ((0, -0.5), (-0.525, -0.12), (-0.324, 0.496), (0.324, 0.496), (0.525, -0.12)),
    "hexagon": ((0.5, 0), (0.25, -0.45), (-0.25, -0.45), (-0.5, 0), (-0.25, 0.45), (0.25, 0.45)),
}


def draw_panel(panel: dict | None) -> Image.Image:
    """One ``PANEL`` x ``PANEL`` RGB panel (``None``: the query's ``?``), framed in black."""
    img = Image.new("RGB", (PANEL, PANEL), (255, 255, 255))
    draw = ImageDraw.Draw(img)
    k = PANEL / CANVAS
    thick, edge = max(1, round(4 * k)), max(1, round(2 * k))
    if panel is None:
        draw.text((PANEL / 2, PANEL / 2), "?", fill=(0, 0, 0), font=_font(PANEL // 2), anchor="mm")
    else:
        for o in panel["objects"]:
            g = (o["color"],) * 3
            if panel["kind"] == "line":
                pts, mode = LINE_GEOMETRY[o["type"]]
                xy = [(x * CANVAS * k, y * CANVAS * k) for x, y in pts]
                if mode == "circle":
                    r = CANVAS / 5 * k
                    (cx, cy), = xy
                    draw.ellipse((cx - r, cy - r, cx + r, cy + r), outline=g, width=thick)
                else:
                    draw.line(xy + [xy[0]] if mode == "contour" else xy, fill=g, width=thick, joint="curve")
                continue
            i, j = o["position"]
            cx, cy = (0.2 + 0.3 * j) * CANVAS * k, (0.2 + 0.3 * i) * CANVAS * k
            h = o["size"] / 2 * k
            if o["type"] == "circle":
                draw.ellipse((cx - h, cy - h, cx + h, cy + h), fill=g, outline=(0, 0, 0), width=edge)
            elif o["type"] == "rectangle":
                draw.rectangle((cx - h, cy - h, cx + h, cy + h), fill=g, outline=(0, 0, 0), width=edge)
            else:
                s = o["size"] * k
                draw.polygon([(cx + u * s, cy + v * s) for u, v in _POLYGONS[o["type"]]], fill=g,
                             outline=(0, 0, 0), width=edge)
    draw.rectangle((0, 0, PANEL - 1, PANEL - 1), outline=(0, 0, 0), width=1)
    return img


def panel_boxes(n_examples: int = 2) -> dict:
    """Top-left pixel of every panel: ``examples[i][j]``, ``query[j]`` (j = 2 is the ``?``), ``options[k]``."""
    def at(col: float, row: float):
        return int(col * CELL) + _GAP, int(row * CELL) + _GAP
    return {"examples": [[at(0.5 + j, i) for j in range(3)] for i in range(n_examples)],
            "query": [at(0.5 + j, n_examples) for j in range(3)],
            "options": [at(k, n_examples + 1.5) for k in range(4)]}


def render(raw: dict) -> Image.Image:
    """The puzzle image (RGB, ``WIDTH`` x ``HEIGHT``): example rows, query row with ``?``, options."""
    if len(raw["examples"]) != 2 or len(raw["options"]) != 4:
        raise UserError(f"{NAME}: the image layout holds 2 examples and 4 options")
    img = Image.new("RGB", (WIDTH, HEIGHT), (255, 255, 255))
    boxes = panel_boxes(len(raw["examples"]))
    for i, ex in enumerate(raw["examples"]):
        for j, p in enumerate(ex["panels"]):
            img.paste(draw_panel(p), boxes["examples"][i][j])
    for j, p in enumerate(raw["query"]["panels"] + [None]):
        img.paste(draw_panel(p), boxes["query"][j])
    for k, opt in enumerate(raw["options"]):
        img.paste(draw_panel(opt["panel"]), boxes["options"][k])
    return img


def validate_image(image) -> None:
    """Raise :class:`UserError` unless ``image`` is a ``WIDTH`` x ``HEIGHT`` RGB PIL image."""
    check_rgb_image(image, NAME, (WIDTH, HEIGHT))
