"""S2H training (train.py): batch plan, learning-rate schedule, pretraining drills, a short run."""

from __future__ import annotations

import collections
import math
import re

import numpy as np
import pytest
import torch
from transformers import get_cosine_schedule_with_warmup

from lmforge.methods.simple_to_hard import mini, vlm
from lmforge.methods.simple_to_hard import train as T

CELL_RE = re.compile(r"^[a-f][1-6]$")
_IMG = np.zeros((48, 48, 3), dtype=np.uint8)  # batches() only looks at whether an image is there


def _fake(n_image, n_text):
    ex = [("<image> image read", "a1 1 on", _IMG) for _ in range(n_image)] + \
         [("add 1 + 1 =", "2", None) for _ in range(n_text)]
    # interleave so that modality is not the index order
    return [ex[i] for i in np.random.default_rng(0).permutation(len(ex))]


# --- batches ---------------------------------------------------------------------------------------


def test_batches_group_by_modality_and_cover_each_epoch():
    ex = _fake(9, 13)
    cfg = T.TrainConfig(batch_size=4, seed=3)
    plan = T.batches(ex, 2, cfg)
    for b in plan:
        kinds = {ex[i][2] is not None for i in b}
        assert len(kinds) == 1, b  # all-image or all-text
        assert 0 < len(b) <= 4
    # at most one short batch per modality
    assert sum(len(b) < 4 for b in plan) <= 2
    flat = [i for b in plan for i in b]
    assert collections.Counter(flat) == {i: 2 for i in range(22)}
    # the batch order is shuffled: image and text batches interleave
    kinds = [ex[b[0]][2] is not None for b in plan]
    assert kinds != sorted(kinds) and kinds != sorted(kinds, reverse=True)


@pytest.mark.parametrize("n", [20, 22])
def test_batches_fractional_epochs(n):
    ex = _fake(n // 2, n - n // 2)
    for group in (True, False):
        plan = T.batches(ex, 1.5, T.TrainConfig(batch_size=4, seed=1, group_by_modality=group))
        flat = [i for b in plan for i in b]
        assert len(flat) == n + round(n / 2)
        c = collections.Counter(flat)
        assert set(c) == set(range(n)) and set(c.values()) <= {1, 2}
        assert sum(v == 2 for v in c.values()) == round(n / 2)


def test_batches_without_grouping_are_consecutive_shuffled_epochs():
    ex = _fake(5, 5)
    plan = T.batches(ex, 2, T.TrainConfig(batch_size=3, seed=0, group_by_modality=False))
    assert [len(b) for b in plan] == [3, 3, 3, 3, 3, 3, 2]
    flat = [i for b in plan for i in b]
    assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:]) == list(range(10))
    assert flat[:10] != list(range(10))  # shuffled


def test_batches_are_deterministic_per_seed():
    ex = _fake(10, 14)
    a = T.batches(ex, 2, T.TrainConfig(batch_size=4, seed=5))
    assert a == T.batches(ex, 2, T.TrainConfig(batch_size=4, seed=5))
    assert a != T.batches(ex, 2, T.TrainConfig(batch_size=4, seed=6))


# --- learning-rate schedule ------------------------------------------------------------------------


def test_lr_factor_closed_form():
    # total 200, warm-up ratio 0.05 -> 10 warm-up steps; then 0.5 (1 + cos(pi (s - 10) / 190))
    assert T.lr_factor(0, 200, 0.05) == pytest.approx(0.1)
    assert T.lr_factor(4, 200, 0.05) == pytest.approx(0.5)
    assert T.lr_factor(9, 200, 0.05) == pytest.approx(1.0)
    assert T.lr_factor(10, 200, 0.05) == pytest.approx(1.0)
    assert T.lr_factor(105, 200, 0.05) == pytest.approx(0.5)  # a quarter turn: cos(pi/2) = 0
    assert T.lr_factor(48, 200, 0.05) == pytest.approx(0.5 * (1 + math.cos(math.pi * 38 / 190)))
    assert T.lr_factor(199, 200, 0.05) == pytest.approx(0.5 * (1 + math.cos(math.pi * 189 / 190)))
    assert T.lr_factor(199, 200, 0.05) < 1e-3
    assert T.lr_factor(200, 200, 0.05) == pytest.approx(0.0, abs=1e-12)
    assert T.lr_factor(0, 10, 0.0) == pytest.approx(1.0)  # at least one warm-up step


def test_lr_factor_matches_transformers_cosine_schedule():
    # transformers' schedule is step / warm during warm-up (0 at step 0); lmforge counts the step it is
    # about to take ((step + 1) / warm), the same cosine afterwards
    total, ratio = 120, 0.03
    warm = math.ceil(ratio * total)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    hf = get_cosine_schedule_with_warmup(opt, warm, total).lr_lambdas[0]
    for s in range(total):
        want = hf(s + 1) if s < warm else hf(s)
        assert T.lr_factor(s, total, ratio) == pytest.approx(want, abs=1e-12), s
    factors = [T.lr_factor(s, total, ratio) for s in range(warm, total)]
    assert all(a >= b for a, b in zip(factors, factors[1:]))


# --- pretraining drills ----------------------------------------------------------------------------


def _parse_text_table(words):
    table, lit = [[None] * 6 for _ in range(6)], set()
    for name, val in zip(words[0::2], words[1::2]):
        r, c = "abcdef".index(name[0]), int(name[1]) - 1
        if val.endswith("*"):
            lit.add((r, c))
        table[r][c] = int(val.rstrip("*"))
    return table, lit


def test_pretraining_examples_are_correct_drills_without_paths():
    ex = T.pretraining_examples(300, seed=0)
    kinds = collections.Counter()
    isolated = 0
    for e in ex:
        human, gpt = e[0], e[1]
        vocab = set(mini.WORDS)
        assert all(w in vocab for w in (human + " " + gpt).split())
        if human.startswith("add"):
            kinds["add"] += 1
            w = human.split()
            assert w[0] == "add" and w[-1] == "=" and len(e) == 3 and e[2] is None
            k = w.index("+")
            a, d = int("".join(w[1:k])), int(w[k + 1])
            assert gpt.split() == list(str(a + d))
            continue
        if human.startswith("<image>"):
            kinds["image"] += 1
            assert human == "<image> image read"
            table, lit = mini.decode_image(e[2])
        else:
            kinds["text"] += 1
            w = human.split()
            assert w[-2:] == ["table", "read"] and len(w) == 74 and e[2] is None
            table, lit = _parse_text_table(w[:72])
        assert e[3] is True  # the cell names in the response carry no loss
        toks = gpt.split()
        assert len(toks) % 3 == 0 and 4 <= len(toks) // 3 <= 12
        asked = []
        for name, val, onoff in zip(toks[0::3], toks[1::3], toks[2::3]):
            assert CELL_RE.match(name)
            r, c = "abcdef".index(name[0]), int(name[1]) - 1
            asked.append((r, c))
            assert int(val) == table[r][c]
            assert onoff == ("on" if (r, c) in lit else "off")
        assert len(set(asked)) == len(asked)
        # a random highlighted set, not a path: some lit cell has no lit 4-neighbour
        if any(not ({(r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)} & lit) for r, c in lit):
            isolated += 1
    assert kinds["image"] > 50 and kinds["text"] > 50 and kinds["add"] > 20
    assert isolated > (kinds["image"] + kinds["text"]) // 2
    a, b = T.pretraining_examples(20, seed=4), T.pretraining_examples(20, seed=4)
    assert [x[:2] for x in a] == [x[:2] for x in b]


def test_drills_are_not_read_in_table_order():
    ex = [e for e in T.pretraining_examples(300, seed=1) if not e[0].startswith("add")]
    in_order = 0
    for e in ex:
        cells = ["abcdef".index(n[0]) * 6 + int(n[1]) for n in e[1].split()[0::3]]
        in_order += cells == sorted(cells)
    assert in_order < 0.05 * len(ex)


def test_pretraining_add_share_sets_the_mix_and_keeps_the_default_stream():
    base = T.pretraining_examples(400, seed=3)
    assert [x[:2] for x in base] == [x[:2] for x in T.pretraining_examples(400, seed=3, add_share=0.2)]
    half = T.pretraining_examples(2000, seed=3, add_share=0.5)
    adds = sum(e[0].startswith("add") for e in half)
    images = sum(e[2] is not None for e in half)
    assert 900 < adds < 1100 and 400 < images < 600  # reads stay half image, half text


# --- phase-2 spatial drills ------------------------------------------------------------------------


def _grid_neighbours(name):
    """Independent: every cell at Manhattan distance 1, listed up / right / down / left."""
    r, c = "abcdef".index(name[0]), int(name[1]) - 1
    cells = {(rr, cc) for rr in range(6) for cc in range(6) if abs(rr - r) + abs(cc - c) == 1}
    order = [(r - 1, c), (r, c + 1), (r + 1, c), (r, c - 1)]
    return [q for q in order if q in cells]


def _name(q):
    return f"{'abcdef'[q[0]]}{q[1] + 1}"


def test_spatial_drills_are_correct_generic_and_equal_across_modalities():
    ex = T.spatial_examples(600, seed=0)
    kinds = collections.Counter()
    isolated = tables = 0
    task_words = {"path", "total", "enumerate", "answer", "yellow", "star", "convert", "?", ";"}
    for e in ex:
        human, gpt, img = e[0], e[1], e[2]
        words = (human + " " + gpt).split()
        assert all(w in set(mini.WORDS) for w in words) and not task_words & set(words)
        assert len(e) == 3  # no masking: every response word follows from the prompt
        if human.startswith("read"):
            kinds["adjacent"] += 1
            _, name, to = human.split()
            assert to == "to" and img is None
            assert gpt.split() == [_name(q) for q in _grid_neighbours(name)]
            continue
        if img is not None:
            head, query = human.split(" read ")
            assert head == "<image> image"
            table, lit = mini.decode_image(img)
        else:
            w = human.split()
            assert w[72:74] == ["table", "read"]
            table, lit = _parse_text_table(w[:72])
            query = " ".join(w[74:])
        tables += 1
        if any(not ({(r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)} & lit) for r, c in lit):
            isolated += 1
        q = query.split()
        if q[-1] == "on":
            kinds["lit " + ("image" if img is not None else "text")] += 1
            assert len(q) == 2
            want = [q[0], "is"] + [_name(n) for n in _grid_neighbours(q[0]) if n in lit]
            assert gpt.split() == want
        else:
            kinds["named " + ("image" if img is not None else "text")] += 1
            toks = gpt.split()
            assert 2 <= len(q) <= 6 and len(set(q)) == len(q) and toks[0::3] == q
            for name, val, onoff in zip(toks[0::3], toks[1::3], toks[2::3]):
                r, c = "abcdef".index(name[0]), int(name[1]) - 1
                assert int(val) == table[r][c] and onoff == ("on" if (r, c) in lit else "off")
    # about 20% / 45% / 35%, and each table drill about half image, half text
    assert 80 < kinds["adjacent"] < 160
    for k in ("lit", "named"):
        im, tx = kinds[f"{k} image"], kinds[f"{k} text"]
        assert im + tx > 150 and abs(im - tx) < 0.25 * (im + tx), kinds
    assert isolated > tables // 2  # random highlighted sets, not paths
    assert [x[:2] for x in T.spatial_examples(30, seed=5)] == [x[:2] for x in T.spatial_examples(30, seed=5)]


# --- a short run -----------------------------------------------------------------------------------


def test_short_training_run_lowers_the_loss():
    tok = vlm.build_tokenizer()
    shape = vlm.VLMShape(vision_hidden=16, vision_layers=1, vision_heads=2, hidden=64, layers=1, heads=2,
                         intermediate=128)
    model = vlm.build_model(tok, shape, seed=0)
    ps = mini.generate("SIMPLE", 8, 1)
    ex = []
    for i, p in enumerate(ps):
        dt = "image2answer" if i % 2 else "text2answer"
        conv = mini.conversation(p, dt, with_cot=False)["conversations"]
        ex.append((conv[0]["value"], conv[1]["value"], mini.render_array(p) if i % 2 else None))
    batch = T.make_batch(tok, ex, list(range(8)))
    with torch.no_grad():
        before = float(model(**batch).loss)
    assert before > 3.5  # about ln(len(WORDS)) at init
    steps = []
    losses = T.train(model, tok, ex, 15, T.TrainConfig(lr=3e-3, batch_size=4),
                     on_step=lambda s, n, loss: steps.append((s, n)))
    assert len(losses) == 30 and steps == [(s, 30) for s in range(30)]  # 4 image + 4 text, batch 4, 15 epochs
    assert not model.training
    with torch.no_grad():
        after = float(model(**batch).loss)
    assert after < 0.5 * before, (before, after)
