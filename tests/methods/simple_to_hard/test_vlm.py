"""The tiny S2H VLM (vlm.py): LLaVA image prefix, encoding and labels, save/load, batched generation."""

from __future__ import annotations

import json
import re

import pytest
import torch
from transformers import LlavaForConditionalGeneration

from lmforge.methods.simple_to_hard import mini, vlm

TINY = vlm.VLMShape(vision_hidden=16, vision_layers=1, vision_heads=2, hidden=32, layers=1, heads=2, intermediate=64)
CELL_RE = re.compile(r"^[a-f][1-6]$")


@pytest.fixture(scope="module")
def tok():
    return vlm.build_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    m = vlm.build_model(tok, TINY, seed=0)
    m.eval()
    return m


@pytest.fixture(scope="module")
def puzzles():
    return mini.generate("SIMPLE", 3, 4) + mini.generate("HARD", 3, 4)


def _image_batch(tok, ps):
    enc = [vlm.encode(tok, mini.prompt(p, image=True), None) for p in ps]
    batch = vlm.collate(enc, tok.pad_token_id)
    return batch["input_ids"], batch["attention_mask"], vlm.pixels([mini.render_array(p) for p in ps])


def test_pixels_normalise_to_minus_one_one(puzzles):
    arr = mini.render_array(puzzles[0])
    x = vlm.pixels([arr])
    assert x.shape == (1, 3, 48, 48)
    for y, xx in [(0, 0), (7, 7), (20, 33), (47, 47)]:
        for ch in range(3):
            assert float(x[0, ch, y, xx]) == pytest.approx(arr[y, xx, ch] / 127.5 - 1.0, abs=1e-7)
    assert float(x.min()) >= -1.0 and float(x.max()) <= 1.0


@torch.no_grad()
def test_image_prefix_equals_manual_inputs_embeds(model, tok, puzzles):
    ids, mask, pix = _image_batch(tok, puzzles[:2])
    assert not torch.equal(pix[0], pix[1])
    ref = model(input_ids=ids, pixel_values=pix, attention_mask=mask).logits
    emb = vlm.manual_inputs_embeds(model, ids, pix)
    got = model(inputs_embeds=emb, attention_mask=mask).logits
    assert ref.shape == got.shape == (2, ids.shape[1], len(tok))
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    # the image matters: swapping the two images changes every logit after the image tokens, and
    # nothing before them (position 0 is <s>, causally blind to the image)
    swapped = model(input_ids=ids, pixel_values=pix.flip(0), attention_mask=mask).logits
    torch.testing.assert_close(swapped[:, 0], ref[:, 0], atol=1e-6, rtol=0)
    for b in range(2):
        assert (swapped[b, 37:] - ref[b, 37:]).abs().amax(-1).min() > 1e-4
    # the prompts agree up to 'image yellow path' (position 39): there the image alone decides the logits
    torch.testing.assert_close(swapped[0, :40], ref[1, :40], atol=1e-5, rtol=0)


def test_encode_expands_image_and_masks_the_prompt(tok, puzzles):
    p = puzzles[0]
    human, gpt = mini.prompt(p, image=True), mini.cot(p)
    ids, labels = vlm.encode(tok, human, gpt)
    words = gpt.split()
    hwords = human.split()
    n_prompt = 1 + 36 + (len(hwords) - 1)
    assert len(ids) == len(labels) == n_prompt + len(words) + 1
    image_id = mini.WORDS.index("<image>")
    assert ids[0] == mini.WORDS.index("<s>") == tok.bos_token_id
    assert ids[1:37] == [image_id] * 36 and ids.count(image_id) == 36
    assert ids[37:n_prompt] == [mini.WORDS.index(w) for w in hwords[1:]]
    assert ids[n_prompt:-1] == [mini.WORDS.index(w) for w in words]
    assert ids[-1] == mini.WORDS.index("</s>") == tok.eos_token_id
    assert labels[:n_prompt] == [-100] * n_prompt
    assert labels[n_prompt:] == ids[n_prompt:]
    # a text prompt encodes as the tokenizer itself encodes it
    th = mini.prompt(p, image=False)
    tids, tlabels = vlm.encode(tok, th, None)
    assert tids == [tok.bos_token_id] + tok(th, add_special_tokens=False).input_ids
    assert tlabels == [-100] * len(tids)


def test_encode_mask_cells_masks_exactly_the_cell_names(tok, puzzles):
    p = puzzles[3]
    human, gpt = mini.prompt(p, image=True), mini.cot(p)
    ids, plain = vlm.encode(tok, human, gpt)
    _, masked = vlm.encode(tok, human, gpt, mask_cells=True)
    n_prompt = len(ids) - len(gpt.split()) - 1
    assert masked[:n_prompt] == [-100] * n_prompt
    n_cells = 0
    for j, w in enumerate(gpt.split()):
        if CELL_RE.match(w):
            n_cells += 1
            assert masked[n_prompt + j] == -100
        else:
            assert masked[n_prompt + j] == plain[n_prompt + j] == ids[n_prompt + j] != -100
    assert n_cells == len(p.path)
    assert masked[-1] == tok.eos_token_id


def test_encode_rejects_unknown_words(tok):
    with pytest.raises(ValueError):
        vlm.encode(tok, "<image> image banana", None)
    with pytest.raises(ValueError):
        vlm.encode(tok, "<image> image read", "a1 5 maybe")


def test_collate_right_pads(tok, puzzles):
    a = vlm.encode(tok, "add 1 + 2 =", "3")
    b = vlm.encode(tok, mini.prompt(puzzles[0], image=False), mini.cot(puzzles[0]))
    batch = vlm.collate([a, b], tok.pad_token_id)
    n = len(a[0])
    assert batch["input_ids"][0, :n].tolist() == a[0]
    assert set(batch["input_ids"][0, n:].tolist()) == {tok.pad_token_id}
    assert batch["labels"][0, n:].eq(-100).all() and batch["attention_mask"][0].sum() == n
    assert batch["attention_mask"][1].sum() == len(b[0]) == batch["input_ids"].shape[1]


@torch.no_grad()
def test_save_load_round_trip(model, tok, puzzles, tmp_path):
    out = tmp_path / "vlm"
    vlm.save(model, tok, out, card={"shape": "tiny"})
    assert json.loads((out / "vlm.json").read_text()) == {"shape": "tiny"}
    again = LlavaForConditionalGeneration.from_pretrained(out, dtype=torch.float32).eval()
    ids, mask, pix = _image_batch(tok, puzzles[:2])
    ref = model(input_ids=ids, pixel_values=pix, attention_mask=mask).logits
    torch.testing.assert_close(again(input_ids=ids, pixel_values=pix, attention_mask=mask).logits, ref,
                               atol=0, rtol=0)
    m2, tok2 = vlm.load(out)
    assert not m2.training
    assert tok2.get_vocab() == tok.get_vocab()
    assert tok2.pad_token_id == tok.pad_token_id and tok2.eos_token_id == tok.eos_token_id
    torch.testing.assert_close(m2(input_ids=ids, pixel_values=pix, attention_mask=mask).logits, ref, atol=0, rtol=0)


def test_batched_left_padded_generation_equals_one_by_one(tok, puzzles):
    m = vlm.build_model(tok, TINY, seed=0)
    # a model at init echoes its last token; larger random weights make the answer depend on the prompt
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
    prompts, images = [], []
    for i, p in enumerate(puzzles):
        image = i % 2 == 0
        prompts.append(mini.prompt(p, image=image))
        images.append(mini.render_array(p) if image else None)
    prompts[1], images[1] = "add 1 2 + 3 =", None  # a short text prompt among long ones
    lengths = {len(vlm.encode(tok, h, None)[0]) for h in prompts}
    assert len(lengths) >= 3
    m.train()
    alone = vlm.generate(m, tok, prompts, images, max_new_tokens=8, batch_size=1)
    assert m.training  # the mode is restored
    together = vlm.generate(m, tok, prompts, images, max_new_tokens=8)
    chunks = vlm.generate(m, tok, prompts, images, max_new_tokens=8, batch_size=4)
    assert len(set(alone)) >= 3  # the outputs depend on the prompt, so the comparison means something
    assert together == alone
    assert chunks == alone
    for s in alone:
        assert 0 < len(s.split()) <= 8 and all(w in mini.WORDS for w in s.split())


def test_longest_records_fit_the_default_context(tok):
    # worst case by hand: image2answer+text on an 18-cell path with 3-digit running totals:
    # 1 (<s>) + 36 + 8 prompt words + 1 (convert) + 72 + 1 (enumerate) + 18 * 6 + 1 + 3 + 1 (</s>) = 232
    longest = 0
    for p in mini.generate("HARD", 60, 9):
        for dt in mini.DATA_TYPES:
            conv = mini.conversation(p, dt)["conversations"]
            longest = max(longest, len(vlm.encode(tok, conv[0]["value"], conv[1]["value"])[0]))
    assert 150 < longest <= 232 <= vlm.VLMShape().max_positions
