"""The S2H miniature Table Readout (mini.py): paths, pixels, text table, CoT, conversations, vocabulary.

Every check recomputes what it asserts by an independent loop (no call into the function under test
for the expected value).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from PIL import Image

from lmforge.common.errors import UserError
from lmforge.methods.simple_to_hard import mini

SEEDS = (0, 1, 7)
CELL_RE = re.compile(r"^[a-f][1-6]$")


def _my_turns(path):
    """Direction changes, counted step by step."""
    n, prev = 0, None
    for k in range(1, len(path)):
        step = (path[k][0] - path[k - 1][0], path[k][1] - path[k - 1][1])
        if prev is not None and step != prev:
            n += 1
        prev = step
    return n


def _name(r, c):
    return "abcdef"[r] + str(c + 1)


def _parse_text_table(s: str):
    """``a1 5 a2 3* ...`` -> (table, starred cells), by hand."""
    toks = s.split()
    assert len(toks) == 72
    table = [[None] * 6 for _ in range(6)]
    starred = set()
    for name, val in zip(toks[0::2], toks[1::2]):
        assert CELL_RE.match(name), name
        r, c = "abcdef".index(name[0]), int(name[1]) - 1
        assert table[r][c] is None, f"{name} listed twice"
        if val.endswith("*"):
            starred.add((r, c))
            val = val[:-1]
        assert len(val) == 1 and val.isdigit()
        table[r][c] = int(val)
    return table, starred


@pytest.fixture(scope="module")
def paths():
    return {lv: [p for s in SEEDS for p in mini.generate(lv, 200, s)] for lv in ("SIMPLE", "HARD")}


@pytest.fixture(scope="module")
def sample():
    return mini.generate("SIMPLE", 25, 3) + mini.generate("HARD", 25, 3)


# --- generation ------------------------------------------------------------------------------------


@pytest.mark.parametrize("level", ["SIMPLE", "HARD"])
def test_paths_are_contiguous_self_avoiding_non_touching_and_in_range(paths, level):
    lo, hi, tlo, thi = mini.LEVELS[level]
    lengths = set()
    for p in paths[level]:
        path = p.path
        lengths.add(len(path))
        assert lo <= len(path) <= hi
        assert tlo <= _my_turns(path) <= thi, (path, _my_turns(path))
        assert all(0 <= r < 6 and 0 <= c < 6 for r, c in path)
        assert len(set(path)) == len(path)  # self-avoiding
        for a, b in zip(path, path[1:]):
            assert abs(a[0] - b[0]) + abs(a[1] - b[1]) == 1  # 4-neighbour steps
        for i in range(len(path)):
            for j in range(i + 2, len(path)):
                d = abs(path[i][0] - path[j][0]) + abs(path[i][1] - path[j][1])
                assert d != 1, f"cells {i} and {j} of {path} touch"
        assert len(p.table) == 6 and all(len(row) == 6 and all(0 <= v <= 9 for v in row) for row in p.table)
    assert len(lengths) >= 3  # lengths are spread over the range, not one fixed length


def test_generate_is_deterministic_per_seed_and_checks_level():
    a, b = mini.generate("HARD", 10, 5), mini.generate("hard", 10, 5)
    assert [(p.table, p.path) for p in a] == [(p.table, p.path) for p in b]
    assert [p.path for p in a] != [p.path for p in mini.generate("HARD", 10, 6)]
    with pytest.raises(UserError):
        mini.generate("MEDIUM", 1, 0)


def test_total_is_the_sum_over_the_path(sample):
    for p in sample:
        s = 0
        for r, c in p.path:
            s += p.table[r][c]
        assert p.total == s
        assert mini.Puzzle.from_json(p.to_json()).total == s


# --- image -----------------------------------------------------------------------------------------


def test_glyphs_are_pairwise_distinct_5x7():
    for d in range(10):
        assert mini.GLYPHS[d].shape == (7, 5) and mini.GLYPHS[d].any()
        for e in range(d + 1, 10):
            assert not np.array_equal(mini.GLYPHS[d], mini.GLYPHS[e]), (d, e)


def test_render_colours_each_cell_by_the_path(sample):
    for p in sample[::5]:
        arr = mini.render_array(p)
        assert arr.shape == (48, 48, 3) and arr.dtype == np.uint8
        for r in range(6):
            for c in range(6):
                # column 7 and row 7 of a cell lie outside the 5 x 7 glyph box: always background
                want = (255, 255, 0) if (r, c) in set(p.path) else (245, 245, 245)
                assert tuple(arr[r * 8 + 7, c * 8 + 7]) == want
                assert tuple(arr[r * 8, c * 8]) == want  # column 0 is outside the box too


def test_decode_recovers_table_and_highlight(sample):
    assert len(sample) == 50
    for p in sample:
        table, lit = mini.decode_image(mini.render_array(p))
        assert table == p.table
        assert lit == set(p.path)
        arr = mini.validate_image(mini.render(p))  # PIL input
        assert np.array_equal(arr, mini.render_array(p))


def _ink_pixels(arr, r, c):
    cell = arr[r * 8:(r + 1) * 8, c * 8:(c + 1) * 8]
    return [(y, x) for y in range(8) for x in range(8) if tuple(cell[y, x]) == (0, 0, 0)]


def test_decode_rejects_a_broken_glyph(sample):
    p = sample[0]
    base = mini.render_array(p)
    for r, c in [(0, 0), (2, 3), (5, 5), p.path[0]]:
        bg = (255, 255, 0) if (r, c) in set(p.path) else (245, 245, 245)
        ink = _ink_pixels(base, r, c)
        for y, x in ink[:: max(1, len(ink) // 4)]:
            arr = base.copy()
            arr[r * 8 + y, c * 8 + x] = bg  # one ink pixel erased: the glyph is no digit any more
            with pytest.raises(ValueError):
                mini.decode_image(arr)


def test_decode_rejects_stray_ink_and_foreign_colours(sample):
    p = sample[1]
    base = mini.render_array(p)
    arr = base.copy()
    arr[3 * 8 + 7, 2 * 8 + 6] = (0, 0, 0)  # ink outside the glyph box
    with pytest.raises(ValueError):
        mini.decode_image(arr)
    arr = base.copy()
    arr[1 * 8 + 7, 4 * 8 + 7] = (200, 30, 30)  # a background pixel in a third colour
    with pytest.raises(ValueError):
        mini.decode_image(arr)
    r, c = p.path[0]
    arr = base.copy()
    arr[r * 8 + 7, c * 8 + 7] = (245, 245, 245)  # a yellow cell with one grey pixel
    with pytest.raises(ValueError):
        mini.decode_image(arr)
    y, x = _ink_pixels(base, 0, 0)[0]
    arr = base.copy()
    arr[y, x] = (10, 10, 10)  # near-black is not ink
    with pytest.raises(ValueError):
        mini.decode_image(arr)


def test_validate_image_rejects_wrong_size_and_non_tables(sample):
    with pytest.raises(UserError):
        mini.validate_image(np.zeros((40, 48, 3), dtype=np.uint8))
    with pytest.raises(UserError):
        mini.validate_image(Image.new("RGB", (64, 64), (245, 245, 245)))
    with pytest.raises(UserError):
        mini.validate_image(Image.new("RGB", (48, 48), (255, 255, 255)))
    noise = np.random.default_rng(0).integers(0, 256, (48, 48, 3), dtype=np.uint8)
    with pytest.raises(UserError):
        mini.validate_image(noise)


# --- text, CoT and scoring -------------------------------------------------------------------------


def test_text_table_parses_back_to_table_and_path(sample):
    for p in sample:
        table, starred = _parse_text_table(mini.text_table(p))
        assert table == p.table
        assert starred == set(p.path)


def test_cot_lines_follow_the_path_with_running_totals(sample):
    for p in sample:
        toks = mini.cot(p).split()
        assert toks[0] == "enumerate"
        k = toks.index("answer")
        body, tail = toks[1:k], toks[k + 1:]
        lines, cur = [], []
        for t in body:
            if t == ";":
                lines.append(cur)
                cur = []
            else:
                cur.append(t)
        assert cur == []
        assert len(lines) == len(p.path)
        running = 0
        for line, (r, c) in zip(lines, p.path):
            running += p.table[r][c]
            assert line[0] == _name(r, c)
            assert line[1] == str(p.table[r][c])
            assert line[2:] == list(str(running))  # the running total, digit by digit
        assert tail == list(str(running))
        assert int("".join(tail)) == p.total


def test_parse_answer_and_score(sample):
    for p in sample[:10]:
        gold = mini.cot(p)
        assert mini.parse_answer(gold) == p.total and mini.score(p, gold) is True
        wrong = gold[: gold.rindex("answer")] + "answer " + " ".join(str(p.total + 1))
        assert mini.parse_answer(wrong) == p.total + 1 and mini.score(p, wrong) is False
        cut = gold[: gold.rindex("answer")]
        assert mini.parse_answer(cut) is None and mini.score(p, cut) is False
    assert mini.parse_answer("answer 1 2 answer 3 4 ;") == 34  # the last answer counts
    assert mini.parse_answer("answer ; 5") is None
    assert mini.parse_answer("answer 12") is None  # digits are single tokens


# --- conversations ---------------------------------------------------------------------------------


def _turns_of(p, dt, **kw):
    conv = mini.conversation(p, dt, **kw)["conversations"]
    assert [t["from"] for t in conv] == ["human", "gpt"]
    return conv[0]["value"], conv[1]["value"]


def test_image_records_share_one_prompt_and_via_text_converts_first(sample):
    for p in sample:
        h_img, g_img = _turns_of(p, "image2answer")
        h_ivt, g_ivt = _turns_of(p, "image2answer+text")
        h_txt, g_txt = _turns_of(p, "text2answer")
        assert h_img == h_ivt
        assert h_img.split()[0] == "<image>" and h_img.split().count("<image>") == 1
        assert g_ivt == "convert " + mini.text_table(p) + " " + g_img
        assert g_img == g_txt == mini.cot(p)
        assert mini.converted(g_ivt) and not mini.converted(g_img)
        # the converted table in the response is the puzzle's table with exactly the path starred
        table, starred = _parse_text_table(" ".join(g_ivt.split()[1:73]))
        assert table == p.table and starred == set(p.path)
        # start and end cells named in both prompts are the path's ends
        for h in (h_img, h_txt):
            w = h.split()
            i = w.index("path")
            assert w[i + 1] == _name(*p.path[0]) and w[i + 2] == "to" and w[i + 3] == _name(*p.path[-1])
        # the text prompt carries the table itself
        t, s = _parse_text_table(" ".join(h_txt.split()[:72]))
        assert t == p.table and s == set(p.path)
        h_i2t, g_i2t = _turns_of(p, "image2text")
        assert h_i2t.split()[0] == "<image>" and g_i2t == "convert " + mini.text_table(p)
        _, g_short = _turns_of(p, "text2answer", with_cot=False)
        assert g_short.split() == ["answer"] + list(str(p.total))


def test_unknown_data_type_is_a_user_error(sample):
    with pytest.raises(UserError):
        mini.conversation(sample[0], "text2image")


def test_every_word_is_in_the_vocabulary(sample):
    vocab = set(mini.WORDS)
    assert len(vocab) == len(mini.WORDS)  # word-level ids must be unique
    for p in sample:
        for dt in mini.DATA_TYPES:
            for with_cot in (True, False):
                for turn in mini.conversation(p, dt, with_cot=with_cot)["conversations"]:
                    missing = [w for w in turn["value"].split() if w not in vocab]
                    assert not missing, (dt, missing)
