"""Training the tiny VLM: pretraining on generic skills and fine-tuning on a supervision strategy.

A training example is ``(human, gpt, image)``: the LLaVA conversation's two turns and the image array
(None for text records). The loss is the mean cross-entropy on the response tokens and EOS (LLaVA's
completion-only loss). The loop follows the official ``train_template.sh``: AdamW with weight decay 0,
warm-up ratio 0.03 and a cosine schedule. Batches are grouped by modality as the official
``group_by_modality_length`` sampler groups them (each batch holds image records or text records, not
both).

# NOTE: the official sampler also groups by length within a modality (LLaVA's megabatches); here the
# order within a modality is random: at 1-2 minutes per arm the padding it would save is small.

# NOTE: the official learning rate (2e-5, batch 128) fine-tunes an 8B model; a ~1M-parameter model
# trained for minutes needs a larger step: lr 3e-4, batch 32. Measured here: at 1e-3 the image path
# never learned even to read one fixed cell in 200 steps (loss at chance), at 3e-4 it did in 100.
# That is pretraining from random weights; fine-tuning the pretrained base on a strategy learns path
# following faster at 1e-3 (the reproduction's ``FINETUNE_LR`` NOTE has the numbers), so the
# reproduction and ``lmforge train s2h`` pass lr 1e-3 and this default stays the pretraining lr.

Pretraining covers only generic skills, equal in the two modalities, so it does not decide which
supervision strategy wins: phase 1 (:func:`pretraining_examples`) reading one cell (its digit and
whether it is highlighted) from the image and from the text table, and adding a digit to a number;
phase 2 (:func:`spatial_examples`, ``base.py`` NOTE) the grid neighbours of a named cell, which of
them are highlighted, and reading cells named in the prompt, on random highlighted sets (no paths).
Checked for reuse: transformers' ``Trainer`` would work but costs more per step than the loop itself
at this size, and the alignment probe needs the model between steps.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from lmforge.methods.simple_to_hard import mini, vlm

# (human, gpt, image or None[, mask_cells]): see :func:`lmforge.methods.simple_to_hard.vlm.encode`
Example = tuple


@dataclass
class TrainConfig:
    lr: float = 3e-4
    batch_size: int = 32
    warmup_ratio: float = 0.03
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    seed: int = 0
    group_by_modality: bool = True


def batches(examples: list[Example], epochs: float, cfg: TrainConfig) -> list[list[int]]:
    """Index batches over ``epochs`` passes (a fractional last pass takes a prefix of a shuffle).

    With ``group_by_modality`` each batch is all-image or all-text, and the batch order is shuffled.
    """
    rng = random.Random(cfg.seed)
    order: list[int] = []
    full = int(epochs)
    for _ in range(full):
        perm = list(range(len(examples)))
        rng.shuffle(perm)
        order += perm
    frac = epochs - full
    if frac > 0:
        perm = list(range(len(examples)))
        rng.shuffle(perm)
        order += perm[:int(round(frac * len(examples)))]
    if not cfg.group_by_modality:
        return [order[i:i + cfg.batch_size] for i in range(0, len(order), cfg.batch_size)]
    out = []
    for want_image in (True, False):
        idx = [i for i in order if (examples[i][2] is not None) == want_image]
        out += [idx[i:i + cfg.batch_size] for i in range(0, len(idx), cfg.batch_size)]
    rng.shuffle(out)
    return out


def make_batch(tok, examples: list[Example], idx: list[int]) -> dict[str, torch.Tensor]:
    enc = [vlm.encode(tok, examples[i][0], examples[i][1], *examples[i][3:]) for i in idx]
    batch = vlm.collate(enc, tok.pad_token_id)
    imgs = [examples[i][2] for i in idx if examples[i][2] is not None]
    if imgs:
        batch["pixel_values"] = vlm.pixels(imgs)
    return batch


def lr_factor(step: int, total: int, warmup_ratio: float) -> float:
    warm = max(1, math.ceil(warmup_ratio * total))
    if step < warm:
        return (step + 1) / warm
    return 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm)))


def train(model, tok, examples: list[Example], epochs: float, cfg: TrainConfig,
          on_step: Callable[[int, int, float], None] | None = None) -> list[float]:
    """Train in place; returns the loss per step. ``on_step(step, total, loss)`` runs after each step."""
    plan = batches(examples, epochs, cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    torch.manual_seed(cfg.seed)
    model.train()
    losses = []
    for step, idx in enumerate(plan):
        for g in opt.param_groups:
            g["lr"] = cfg.lr * lr_factor(step, len(plan), cfg.warmup_ratio)
        loss = model(**make_batch(tok, examples, idx)).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if on_step is not None:
            on_step(step, len(plan), losses[-1])
    model.eval()
    return losses


# --- pretraining on generic skills ---------------------------------------------------------------

def pretraining_examples(n: int, seed: int, reads: tuple[int, int] = (4, 12), add_share: float = 0.2) -> list[Example]:
    """Generic skills only: read cells of a table (image or text), add a digit to a number.

    A reading drill names ``reads`` random cells in the response, each followed by its digit and
    whether it is highlighted (``c4 5 on``); the names carry no loss (they are random), the answers do:
    dense queries, which got tiny Llamas off the retrieval plateau here
    (``shared/papers/zoo-learnability.md``). Tables carry a random set of highlighted cells, not a
    path, and cells are drawn in random order, never the reading order of a conversion, so neither
    path following nor image-to-text conversion is learned.
    """
    rng = random.Random(f"s2h-pretrain-{seed}")
    out: list[Example] = []
    cells = [(r, c) for r in range(mini.N) for c in range(mini.N)]
    for _ in range(n):
        kind = rng.random()
        if kind < 1 - add_share:
            table = [[rng.randrange(10) for _ in range(mini.N)] for _ in range(mini.N)]
            lit = [(r, c) for r, c in cells if rng.random() < 0.3]
            p = mini.Puzzle(table=table, path=lit)
            asked = rng.sample(cells, rng.randint(*reads))
            ans = " ".join(f"{mini.cell_name(r, c)} {table[r][c]} {'on' if (r, c) in set(lit) else 'off'}" for r, c in asked)
            if kind < (1 - add_share) / 2:
                out.append(("<image> image read", ans, mini.render_array(p), True))
            else:
                out.append((f"{mini.text_table(p)} table read", ans, None, True))
        else:
            a, d = rng.randrange(0, 171), rng.randrange(10)
            out.append((f"add {mini.digits(a)} + {d} =", mini.digits(a + d), None))
    return out


# up, right, down, left: the order every spatial drill lists a cell's neighbours in
_DIRS = ((-1, 0), (0, 1), (1, 0), (0, -1))


def neighbours(r: int, c: int) -> list[tuple[int, int]]:
    """The 4-neighbours of a cell inside the 6 x 6 grid, up / right / down / left."""
    return [(r + dr, c + dc) for dr, dc in _DIRS if 0 <= r + dr < mini.N and 0 <= c + dc < mini.N]


def spatial_examples(n: int, seed: int, lit_p: float = 0.3) -> list[Example]:
    """Generic spatial drills (the skills a real LLM backbone brings), equal across the two modalities.

    - ``adjacent`` (text only, no table): ``read d4 to`` -> ``c4 d5 e4 d3``, the grid neighbours of a
      named cell (what "next to" means for cell names);
    - ``lit neighbours`` (image or text table, half each): ``... read d4 on`` -> ``d4 is d5 e4``: the
      named cell, then those of its neighbours that are highlighted;
    - ``named reads`` (image or text table, half each): ``... read c4 a2 f1`` -> ``c4 5 on a2 3 off
      f1 7 on``: cells named in the prompt, copied with their digit and highlight (the names carry
      loss: copying a name from the prompt is the skill).
    Tables carry a random highlighted set (each cell with probability ``lit_p``), not a path, and
    nothing is summed: neither path following nor the Table Readout answer is taught.
    """
    rng = random.Random(f"s2h-spatial-{seed}")
    out: list[Example] = []
    cells = [(r, c) for r in range(mini.N) for c in range(mini.N)]
    for _ in range(n):
        kind = rng.random()
        r, c = rng.choice(cells)
        name = mini.cell_name(r, c)
        if kind < 0.2:
            out.append((f"read {name} to", " ".join(mini.cell_name(*q) for q in neighbours(r, c)), None))
            continue
        table = [[rng.randrange(10) for _ in range(mini.N)] for _ in range(mini.N)]
        lit = {q for q in cells if rng.random() < lit_p}
        p = mini.Puzzle(table=table, path=sorted(lit))
        image = rng.random() < 0.5
        head = "<image> image read" if image else f"{mini.text_table(p)} table read"
        if kind < 0.65:
            query = f"{name} on"
            ans = " ".join([name, "is"] + [mini.cell_name(*q) for q in neighbours(r, c) if q in lit])
        else:
            asked = rng.sample(cells, rng.randint(2, 6))
            query = " ".join(mini.cell_name(*q) for q in asked)
            ans = " ".join(f"{mini.cell_name(*q)} {table[q[0]][q[1]]} {'on' if q in lit else 'off'}" for q in asked)
        out.append((f"{head} {query}", ans, mini.render_array(p) if image else None))
    return out
