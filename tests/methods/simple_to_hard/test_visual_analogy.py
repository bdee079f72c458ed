"""Visual Analogy (S2H): combinations, unique answers by an independent rule check, prompts, image."""

from __future__ import annotations

import io
import json
import time

import pytest
from PIL import Image

from lmforge.common.errors import UserError
from lmforge.methods.simple_to_hard.tasks import DATA_TYPES, get_task, write_split
from lmforge.methods.simple_to_hard.tasks import visual_analogy as va

# generate_puzzles.py's hard_combi, copied from the official file.
OFFICIAL_HARD = [("shape_size", "XOR"), ("shape_position", "OR"), ("line_color", "AND"),
                 ("shape_type", "Progression"), ("shape_position", "XOR"), ("shape_type", "OR"),
                 ("shape_color", "AND"), ("line_color", "Progression")]

# ---------------------------------------------------------------------------------------------------
# An independent brute-force rule check over all 25 combinations (no code shared with the module).
# ---------------------------------------------------------------------------------------------------

ATTRIBUTES = {"line": ["type", "color"], "shape": ["type", "color", "size", "quantity", "position"]}
MOVES = [(0, 1), (1, 0), (1, 1)]  # horizontal, vertical, diagonal (wrapping on the 3x3 grid)


def _combos() -> list[tuple[str, str]]:
    out = []
    for kind, attrs in ATTRIBUTES.items():
        for attr in attrs:
            for rel in ["XOR", "OR", "AND", "Progression"]:
                if attr == "quantity" and rel != "Progression":
                    continue
                out.append((f"{kind}_{attr}", rel))
    return out


COMBOS = _combos()


def _vals(panel: dict, attr: str) -> list:
    """Sorted distinct values of ``attr`` in the panel."""
    seen = []
    for obj in panel["objects"]:
        v = tuple(obj["position"]) if attr == "position" else obj[attr]
        if v not in seen:
            seen.append(v)
    return sorted(seen)


def _follows(combo, panels) -> bool:
    domain, rel = combo
    kind, attr = domain.split("_")
    if any(p["kind"] != kind or len(p["objects"]) == 0 for p in panels):
        return False
    if attr == "quantity":
        n = [len(p["objects"]) for p in panels]
        return (n[0] < n[1] and n[1] < n[2]) or (n[0] > n[1] and n[1] > n[2])
    a, b, c = (_vals(p, attr) for p in panels)
    if rel == "XOR":
        want = sorted([v for v in a if v not in b] + [v for v in b if v not in a])
        return len(want) > 0 and c == want
    if rel == "OR":
        return c == sorted(set(a + b))
    if rel == "AND":
        want = [v for v in a if v in b]
        return len(want) > 0 and c == want
    if attr == "type":  # each panel keeps every earlier type and adds at least one
        return (all(v in b for v in a) and len(b) > len(a)) and (all(v in c for v in b) and len(c) > len(b))
    if attr == "position":
        for di, dj in MOVES:
            step1 = sorted(((i + di) % 3, (j + dj) % 3) for i, j in a)
            step2 = sorted(((i + di) % 3, (j + dj) % 3) for i, j in b)
            if step1 == b and step2 == c:
                return True
        return False
    if len(a) == 1 and len(b) == 1 and len(c) == 1:  # color, size: one value per panel, monotone
        return (a[0] < b[0] < c[0]) or (a[0] > b[0] > c[0])
    return False


def brute(p1, p2, p3) -> set:
    return {combo for combo in COMBOS if _follows(combo, [p1, p2, p3])}


# ---------------------------------------------------------------------------------------------------
# Fixtures and hand-made panels
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def puzzles():
    return {"SIMPLE": va.generate("SIMPLE", 80, 0), "HARD": va.generate("HARD", 80, 0)}


def L(*lines):
    return {"kind": "line", "objects": [{"type": t, "color": c} for t, c in lines]}


def S(*shapes):
    return {"kind": "shape",
            "objects": [{"type": t, "color": c, "size": s, "position": list(p)} for t, c, s, p in shapes]}


def shapes_of(attr, values, base=("circle", 0, 20)):
    """One shape per value of ``attr`` (positions along the grid unless ``attr`` is position)."""
    out = []
    for k, v in enumerate(values):
        t, c, s = base
        p = (k // 3, k % 3)
        if attr == "type":
            t = v
        elif attr == "color":
            c = v
        elif attr == "size":
            s = v
        else:
            p = v
        out.append((t, c, s, p))
    return S(*out)


# ---------------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------------


def test_the_25_combinations_and_the_official_held_out_set():
    assert len(COMBOS) == 25 and set(va.ALL_COMBOS) == set(COMBOS)
    assert list(va.HARD_COMBOS) == OFFICIAL_HARD
    assert len(va.SIMPLE_COMBOS) == 17 and set(va.SIMPLE_COMBOS) == set(COMBOS) - set(OFFICIAL_HARD)
    for rel in ["XOR", "OR", "AND", "Progression"]:  # HARD example rows need two attributes per relation
        assert len({d for d, r in OFFICIAL_HARD if r == rel}) == 2
    assert get_task("visual-analogy") is va and va.NAME == "visual_analogy"


@pytest.mark.parametrize("level", ["SIMPLE", "HARD"])
def test_every_puzzle_has_one_consistent_option_and_it_is_the_gold(puzzles, level):
    for raw in puzzles[level]:
        q1, q2 = raw["query"]["panels"]
        qcombo = tuple(raw["query"]["label"])
        gold = raw["answer"]
        sats = [brute(q1, q2, opt["panel"]) for opt in raw["options"]]
        assert [k for k, s in enumerate(sats) if qcombo in s] == [gold], raw["id"]
        # stronger: no other option completes the query by the examples' relation on any attribute
        assert [k for k, s in enumerate(sats) if any(r == qcombo[1] for _, r in s)] == [gold], raw["id"]
        assert va.consistent_options(raw) == [gold]
        # every row follows exactly its labelled combination, so the CoT's per-row claims are true
        for opt, s in zip(raw["options"], sats):
            assert s == {tuple(opt["label"])}, raw["id"]
        for ex in raw["examples"]:
            assert brute(*ex["panels"]) == {tuple(ex["label"])}, raw["id"]
        assert len(raw["options"]) == 4 and len(raw["examples"]) == 2
        assert len({json.dumps(o["panel"], sort_keys=True) for o in raw["options"]}) == 4


def test_levels_use_their_own_combinations(puzzles):
    hard = set(OFFICIAL_HARD)
    for raw in puzzles["HARD"]:
        assert tuple(raw["query"]["label"]) in hard
        assert all(tuple(ex["label"]) in hard for ex in raw["examples"])
        assert tuple(raw["options"][raw["answer"]]["label"]) in hard
    for raw in puzzles["SIMPLE"]:
        labels = [raw["query"]["label"]] + [ex["label"] for ex in raw["examples"]]
        labels += [o["label"] for o in raw["options"]]
        assert not any(tuple(lab) in hard for lab in labels)
    # every held-out combination is asked in 80 HARD puzzles; most SIMPLE ones in 80 SIMPLE
    assert {tuple(r["query"]["label"]) for r in puzzles["HARD"]} == hard
    assert len({tuple(r["query"]["label"]) for r in puzzles["SIMPLE"]}) >= 15


def test_simple_examples_share_the_attribute_hard_examples_differ(puzzles):
    for raw in puzzles["SIMPLE"]:
        assert [tuple(ex["label"]) for ex in raw["examples"]] == [tuple(raw["query"]["label"])] * 2
    for raw in puzzles["HARD"]:
        (d1, r1), (d2, r2) = (ex["label"] for ex in raw["examples"])
        assert d1 != d2 and r1 == r2 == raw["query"]["label"][1]
        assert tuple(raw["query"]["label"]) in {(d1, r1), (d2, r2)}


SET_CASES = [
    # attr, panel 1 values, panel 2 values, {relation: panel 3 values that follow it}
    ("type", ["circle", "triangle"], ["circle", "hexagon"],
     {"XOR": ["triangle", "hexagon"], "OR": ["circle", "triangle", "hexagon"], "AND": ["circle"]}),
    ("color", [0, 90], [90, 255], {"XOR": [0, 255], "OR": [0, 90, 255], "AND": [90]}),
    ("size", [20, 27], [27, 41], {"XOR": [20, 41], "OR": [20, 27, 41], "AND": [27]}),
    ("position", [(0, 0), (1, 1)], [(1, 1), (2, 2)],
     {"XOR": [(0, 0), (2, 2)], "OR": [(0, 0), (1, 1), (2, 2)], "AND": [(1, 1)]}),
]


@pytest.mark.parametrize("attr,a,b,answers", SET_CASES)
def test_xor_or_and_on_sets(attr, a, b, answers):
    p1, p2 = shapes_of(attr, a), shapes_of(attr, b)
    for rel, c in answers.items():
        p3 = shapes_of(attr, c)
        for other in ["XOR", "OR", "AND"]:
            assert va.rule_holds(f"shape_{attr}", other, p1, p2, p3) == (other == rel), (attr, rel, other)
            assert ((f"shape_{attr}", other) in brute(p1, p2, p3)) == (other == rel)
    # duplicated values count once: two circles still make the set {circle}
    assert va.rule_holds("shape_type", "AND", shapes_of("type", ["circle", "triangle"]),
                         shapes_of("type", ["circle", "hexagon"]), shapes_of("type", ["circle", "circle"]))


def test_xor_and_need_a_non_empty_result_and_lines_work_the_same():
    same = shapes_of("type", ["circle"])
    assert not va.rule_holds("shape_type", "XOR", same, same, same)  # XOR of equal sets is empty
    assert not va.rule_holds("shape_type", "AND", shapes_of("type", ["circle"]), shapes_of("type", ["hexagon"]),
                             shapes_of("type", ["circle"]))
    p1 = L(("horizontal line", 0), ("vertical line", 90))
    p2 = L(("horizontal line", 135), ("circular line", 90))
    assert va.rule_holds("line_type", "XOR", p1, p2, L(("vertical line", 0), ("circular line", 189)))
    assert va.rule_holds("line_type", "AND", p1, p2, L(("horizontal line", 189)))
    assert va.rule_holds("line_color", "OR", p1, p2, L(("diamond lines", 0), ("horizontal line", 90),
                                                        ("vertical line", 135)))
    assert va.rule_holds("line_color", "AND", p1, p2, L(("diamond lines", 90)))
    # a shape rule never holds on line panels
    assert not va.rule_holds("shape_type", "OR", p1, p2, p1)


def test_progression():
    up = [shapes_of("size", [20, 20]), shapes_of("size", [27]), shapes_of("size", [41, 41, 41])]
    assert va.rule_holds("shape_size", "Progression", *up)  # strict, not by a fixed step
    assert va.rule_holds("shape_size", "Progression", *up[::-1])  # decreasing too
    assert not va.rule_holds("shape_size", "Progression", up[0], up[1], shapes_of("size", [27]))
    assert not va.rule_holds("shape_size", "Progression", up[0], shapes_of("size", [27, 34]), up[2])  # one size
    assert va.rule_holds("line_color", "Progression", L(("horizontal line", 0)), L(("vertical line", 90)),
                         L(("circular line", 189)))
    assert not va.rule_holds("line_color", "Progression", L(("horizontal line", 0)), L(("vertical line", 135)),
                             L(("circular line", 90)))
    q = [shapes_of("type", ["circle"] * n) for n in (1, 2, 4)]
    assert va.rule_holds("shape_quantity", "Progression", *q)
    assert va.rule_holds("shape_quantity", "Progression", *q[::-1])
    assert not va.rule_holds("shape_quantity", "Progression", q[1], q[1], q[2])
    t = [shapes_of("type", ["circle"]), shapes_of("type", ["circle", "triangle"]),
         shapes_of("type", ["circle", "triangle", "pentagon"])]
    assert va.rule_holds("shape_type", "Progression", *t)
    assert not va.rule_holds("shape_type", "Progression", t[0], t[1], shapes_of("type", ["circle", "pentagon"]))
    pos = [shapes_of("position", p) for p in ([(0, 1)], [(0, 2)], [(0, 0)])]  # horizontal, wrapping
    assert va.rule_holds("shape_position", "Progression", *pos)
    diag = [shapes_of("position", p) for p in ([(0, 0), (1, 2)], [(1, 1), (2, 0)], [(2, 2), (0, 1)])]
    assert va.rule_holds("shape_position", "Progression", *diag)
    mixed = [shapes_of("position", p) for p in ([(0, 0)], [(0, 1)], [(1, 1)])]  # right, then down
    assert not va.rule_holds("shape_position", "Progression", *mixed)
    for panels in (up, q, t, pos, diag, mixed):
        assert brute(*panels) == set(va.satisfied_combos(*panels))


def test_generation_is_deterministic_and_fast():
    a, b = va.generate("HARD", 5, 7), va.generate("HARD", 5, 7)
    assert json.dumps(a) == json.dumps(b)
    assert json.dumps(a) != json.dumps(va.generate("HARD", 5, 8))
    assert json.loads(json.dumps(a)) == a  # JSON-serialisable as is
    for level in ("SIMPLE", "HARD"):
        t = time.process_time()
        va.generate(level, 100, 1)
        assert time.process_time() - t < 2.0


def test_render_is_deterministic_and_distinguishes_puzzles(puzzles):
    raws = puzzles["HARD"][:3]

    def png(raw):
        buf = io.BytesIO()
        va.render(raw).save(buf, format="PNG")
        return buf.getvalue()

    first = png(raws[0])
    assert png(raws[0]) == first
    assert len({first, png(raws[1]), png(raws[2])}) == 3
    img = va.render(raws[0])
    va.validate_image(img)
    assert img.mode == "RGB" and img.size == (va.WIDTH, va.HEIGHT)
    # the gold option's panel is drawn where the layout says it is
    x, y = va.panel_boxes()["options"][raws[0]["answer"]]
    crop = img.crop((x, y, x + va.PANEL, y + va.PANEL))
    assert crop.tobytes() == va.draw_panel(raws[0]["options"][raws[0]["answer"]]["panel"]).tobytes()
    with pytest.raises(UserError):
        va.validate_image(img.convert("L"))
    with pytest.raises(UserError):
        va.validate_image(Image.new("RGB", (va.WIDTH + 1, va.HEIGHT)))


@pytest.mark.parametrize("bad", [{"options": 5}, {"nshot": 3}, {"context_extra_lines": (0, 2)},
                                 {"context_shapes": 3}, {"rows": 4}])
def test_sizes_outside_the_range_raise(bad):
    with pytest.raises(UserError):
        va.generate("SIMPLE", 1, 0, **bad)
    with pytest.raises(UserError):
        va.generate("MEDIUM", 1, 0)


def test_context_extra_lines_knob():
    raws = va.generate("SIMPLE", 60, 3, context_extra_lines=0)
    rows = [ex["panels"] for raw in raws for ex in raw["examples"]
            if ex["label"][0].startswith("line") and ex["label"][1] != "Progression"]
    assert rows
    assert all(len(p1["objects"]) == 2 and len(p2["objects"]) == 1 for p1, p2, _ in rows)


def _parse_panel(line: str) -> dict:
    """Attribute sets from one ``print_panel`` line (the text twin)."""
    out = {}
    if "; " in line:
        count, line = line.split("; ", 1)
        out["quantity"] = [int(count.split()[0])]
    keys = ["type", "color", "size", "position"]
    parts = {}
    rest = line
    for key in reversed(keys):
        marker = f", {key}: "
        if marker in rest:
            rest, parts[key] = rest.split(marker, 1)
    parts["type"] = rest[len("type: "):]
    for key, text in parts.items():
        if key == "position":
            vals = [tuple(int(x) for x in item.strip("()").split(", ")) for item in text.split("), (")]
        else:
            vals = [int(v) if v.isdigit() else v for v in text.split(", ")]
        out[key] = sorted(vals)
    return out


def test_text_twin_describes_every_panel(puzzles):
    raw = puzzles["HARD"][0]
    text = va.puzzle_text(raw)
    assert text.startswith("Example 1:\nPanel 1:\n") and "\nQuery:\n" in text and "\nOptions:\nOption 1:\n" in text
    panels = [p for ex in raw["examples"] for p in ex["panels"]] + raw["query"]["panels"] + \
        [o["panel"] for o in raw["options"]]
    described = [ln for ln in text.splitlines() if ln.startswith(("type:", "1 shape;")) or " shapes; " in ln]
    assert len(described) == len(panels) == 12
    for line, panel in zip(described, panels):
        got = _parse_panel(line)
        for attr in ATTRIBUTES[panel["kind"]]:
            want = [len(panel["objects"])] if attr == "quantity" else _vals(panel, attr)
            assert got[attr] == want, (line, attr)


@pytest.mark.parametrize("data_type", DATA_TYPES)
@pytest.mark.parametrize("cot", [True, False])
def test_conversation_follows_the_official_records(puzzles, data_type, cot):
    raw = puzzles["HARD"][1]
    rec = va.conversation(raw, data_type, cot=cot)
    assert rec["id"] == raw["id"]
    (human, gpt) = rec["conversations"]
    assert human["from"] == "human" and gpt["from"] == "gpt"
    h, g = human["value"], gpt["value"]
    text = va.puzzle_text(raw)
    k = raw["answer"] + 1
    if data_type == "text2answer":
        assert h == text + "\n" + va.TEXT2ANS_QUESTION and "<image>" not in h
    else:
        assert h.startswith("<image>\n\nThe image shows a")
    if data_type == "image2text":
        assert h == "<image>\n\n" + va.IMAGE2TEXT_QUESTION
        assert g == "Convert the image into a text version of the puzzle.\n" + text[:-1]  # cot has no effect
        assert "Answer:" not in g
        return
    assert h.endswith("Provide the final answer as 'Answer: [correct option]'.")
    assert g.endswith(f"\n\nAnswer: {k}") and va.score(raw, g)
    assert g.startswith("Convert the image into a text version of the puzzle.\n" + text + "\n") == \
        (data_type == "image2answer+text")
    assert ("We first analyze the examples" in g) == cot
    (d1, r1), (d2, r2) = (ex["label"] for ex in raw["examples"])
    assert f"Example 1: ({d1.replace('_', ' ')}, {r1})\nExample 2: ({d2.replace('_', ' ')}, {r2})\n" in g
    assert g.count(", consistent\n") == 1 and f"Option {k}: " in g.split(", consistent\n")[0].splitlines()[-1]
    if cot:
        assert g.count("and " + raw["query"]["label"][1] + " is the target relation.") == 1
        assert f"We conclude that option {k} is the answer" in g


def test_score_reads_the_last_answer(puzzles):
    raw = puzzles["SIMPLE"][0]
    k = raw["answer"] + 1
    wrong = k % 4 + 1
    assert va.score(raw, f"Answer: {k}") and va.score(raw, f"Answer: [{k}]")
    assert va.score(raw, f"Answer: {wrong}\n...\nAnswer: {k}")
    assert not va.score(raw, f"Answer: {wrong}") and not va.score(raw, f"option {k}")
    with pytest.raises(UserError):
        va.conversation(raw, "image2caption")


def test_write_split_writes_the_official_layout(tmp_path):
    level_dir = write_split("visual_analogy", "HARD", 2, 0, tmp_path)
    assert level_dir == tmp_path / "visual_analogy" / "HARD"
    raws = json.loads((level_dir / "raw.json").read_text())
    for dt in DATA_TYPES:
        recs = json.loads((level_dir / f"{dt}+cot.json").read_text())
        assert [r["id"] for r in recs] == [r["id"] for r in raws]
    with Image.open(level_dir / "images" / f"{raws[0]['id']}.png") as img:
        va.validate_image(img.convert("RGB"))
