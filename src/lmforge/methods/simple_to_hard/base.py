"""``vlm-nano``: the committed base VLM, pretrained here on generic skills only.

Built by :func:`build_base` (``lmforge train s2h-base``), committed under
``lmforge/zoo_weights/vlm-nano`` with its card (``vlm.json``: recipe, seconds, held-out probe
accuracies). The principle: pretraining teaches only generic skills, never the Table Readout task (no
paths, no sums of a path, no prompts of the task), and every skill that involves a table is drilled
equally in the image and the text form, so the supervision strategies compared on it start from the
same skills and pretraining does not decide the comparison. Two phases:

1. :func:`~lmforge.methods.simple_to_hard.train.pretraining_examples` (3000 batches, lr 3e-4):
   reading cells of image and text tables (digit and highlight) and adding a digit to a number;
2. :func:`~lmforge.methods.simple_to_hard.train.spatial_examples` mixed with phase-1 drills
   (``SPATIAL_STEPS`` batches): the grid neighbours of a named cell (text only, no table), the
   highlighted neighbours of a named cell and reads of cells named in the prompt (image and text
   tables with a random highlighted set, half each).

# NOTE: a deviation from issue 27's wording ("pretrained only on generic single-cell reading and
# arithmetic"): phase 1 alone never learned path following within the reproduction's budget (every
# arm at ~0, README history), so the strategies could not be told apart. Phase 2 keeps the issue's
# intent (generic, equal across modalities, nothing of the task) and adds multi-cell skills.
# Phase 2 gives the tiny backbone the spatial skills a real LLM backbone brings (what "next to"
# means, looking at a named cell's neighbours, copying a name from the prompt). Measured (issue 27,
# 1 thread; SIMPLE-image fine-tuning 200 steps at lr 1e-3 from the base, teacher-forced next-cell
# accuracy on 96 puzzles / greedy SIMPLE-image accuracy on 48):
#   phase 1 alone 0.17 / 0.08 (350 steps: 0.37 / 0.02);
#   + 600 phase-2 steps (60% spatial), lr 3e-4 or 1e-3: 0.13-0.19 / 0.02 (the drills not learned yet);
#   + 1500 phase-2 steps at lr 1e-3, 80% spatial, 20% phase-1 drills: 0.86 / 0.23 (the drills are
#     learned past a plateau at ~700 steps), but additions fell from 0.79 to 0.40 and the running
#     total (0.71) became the limit; with half of the phase-1 share on additions
#     (``SPATIAL_ADD_SHARE``): 70% spatial 0.87 / 0.31 (totals 0.90), 80% spatial 0.80 / 0.46 (totals
#     0.99; the committed recipe).
# Before fine-tuning every such base scores 0 greedy on SIMPLE and HARD, images and text (the pilots);
# ``test_base.py`` checks the committed one on SIMPLE images, SIMPLE text and HARD images.
# NOTE: phase-2 lr 1e-3 (phase 1 keeps 3e-4, train.py NOTE): from the phase-1 weights 1e-3 learned the
# drills faster than 3e-4 (after 600 steps grid neighbours 0.35 against 0.15 greedy-exact).
# NOTE: the committed weights continue the committed phase-1 checkpoint (``init``: the previous
# vlm-nano, built by this phase-1 code and recipe, 1036 s) instead of re-running phase 1; the card's
# ``phase 1 from`` says so, and ``build_base`` refuses a checkpoint of another phase-1 recipe.
"""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
import sys
import time
from pathlib import Path

import torch

from lmforge.common.errors import UserError
from lmforge.methods.simple_to_hard import vlm
from lmforge.methods.simple_to_hard.train import TrainConfig, pretraining_examples, spatial_examples, train

BASE_NAME = "vlm-nano"
# phase 2 (spatial drills), NOTE in the module docstring
SPATIAL_STEPS = 1500
SPATIAL_FRACTION = 0.8
SPATIAL_ADD_SHARE = 0.5
SPATIAL_LR = 1e-3


def packaged_base() -> Path:
    return Path(__file__).resolve().parents[2] / "zoo_weights" / BASE_NAME


def load_base(path: Path | None = None):
    """The committed base (or the one at ``path``): ``(model, tokenizer)``."""
    p = path or packaged_base()
    if not (p / "model.safetensors").exists():
        raise UserError(f"no S2H base VLM at {p}; build one with `lmforge train s2h-base --out DIR`")
    return vlm.load(p)


def probe(model, tok, n: int = 240, seed: int = 10_001, n_spatial: int = 120) -> dict[str, float]:
    """Held-out accuracy of the pretraining skills.

    Reads are teacher-forced (a drill's cell names are random, so the model is given them): a cell
    counts when both its digit and its highlight are the argmax; additions and the spatial drills
    (``adjacent``, ``lit neighbours``, ``named reads``) are greedy and exact."""
    from lmforge.methods.simple_to_hard.train import make_batch

    exs = pretraining_examples(n, seed=seed)
    hits: dict[str, list[bool]] = {"read image": [], "read text": [], "add": []}
    reads = [i for i, e in enumerate(exs) if not e[0].startswith("add")]
    model.eval()
    with torch.no_grad():
        for s in range(0, len(reads), 32):
            idx = reads[s:s + 32]
            batch = make_batch(tok, exs, idx)
            pred = model(**{k: v for k, v in batch.items() if k != "labels"}).logits[:, :-1].argmax(-1)
            lab = batch["labels"][:, 1:]
            for row, i in enumerate(idx):
                pos = (lab[row] != -100).nonzero().flatten().tolist()[:-1]  # digit, flag per cell; EOS last
                ok = (pred[row, pos] == lab[row, pos]).tolist()
                key = "read image" if exs[i][2] is not None else "read text"
                hits[key] += [ok[j] and ok[j + 1] for j in range(0, len(ok), 2)]
    adds = [e for e in exs if e[0].startswith("add")]
    outs = vlm.generate(model, tok, [e[0] for e in adds], [None] * len(adds), max_new_tokens=6)
    hits["add"] = [o.split() == e[1].split() for e, o in zip(adds, outs)]
    # phase 2's spatial drills, greedy and exact (their cell names follow from the prompt)
    sp = spatial_examples(n_spatial, seed=seed)
    outs = vlm.generate(model, tok, [e[0] for e in sp], [e[2] for e in sp], max_new_tokens=24)
    for e, o in zip(sp, outs):
        key = ("adjacent" if e[0].endswith(" to") else "lit neighbours" if e[0].endswith(" on") else "named reads")
        hits.setdefault(key, []).append(o.split() == e[1].split())
    return {k: round(sum(v) / max(1, len(v)), 4) for k, v in hits.items()}


def build_base(out: Path, steps: int = 3000, seed: int = 0, overwrite: bool = False,
               cfg: TrainConfig | None = None, progress: bool = True, spatial_steps: int = SPATIAL_STEPS,
               spatial_fraction: float = SPATIAL_FRACTION, spatial_lr: float = SPATIAL_LR,
               init: Path | None = None) -> dict:
    """Pretrain a fresh tiny VLM and save it (with its card) to ``out``.

    Phase 1: ``steps`` batches of :func:`pretraining_examples` (reading, adding). Phase 2:
    ``spatial_steps`` batches of which ``spatial_fraction`` are :func:`spatial_examples` and the rest
    phase-1 drills (so reading and adding are kept), at ``spatial_lr``."""
    if out.exists() and not overwrite:
        raise UserError(f"{out} exists; pass --overwrite to replace it")
    if out.exists() and not out.is_dir():
        raise UserError(f"{out} is a file, not a folder for a base VLM")
    if init is not None:
        ri, ro = init.resolve(), out.resolve()
        if ri == ro or ro in ri.parents or ri == ro.with_name(ro.name + ".tmp"):
            raise UserError(f"--init {init} lies in --out {out}: the build would replace the checkpoint it reads; "
                            "write to another folder")
    cfg = cfg or TrainConfig(seed=seed)
    t0 = time.time()

    def report(name: str):
        def on_step(step: int, total: int, loss: float) -> None:
            if progress and (step % 100 == 0 or step == total - 1):
                print(f"[s2h-base] {name} step {step + 1}/{total} loss {loss:.3f} ({time.time() - t0:.0f} s)",
                      file=sys.stderr, flush=True)
        return on_step

    recipe: dict = {"steps": steps, "batch_size": cfg.batch_size, "lr": cfg.lr, "seed": seed,
                    "pretraining": "pretraining_examples (cell reads, image and text; additions)"}
    if init is None:
        tok = vlm.build_tokenizer()
        model = vlm.build_model(tok, seed=seed)
        train(model, tok, pretraining_examples(steps * cfg.batch_size, seed=seed), 1.0, cfg, on_step=report("phase 1"))
        phase1_seconds = round(time.time() - t0, 1)
    else:  # phase 1 done before: continue from its checkpoint (its card must hold the same phase-1 recipe)
        if not (init / "vlm.json").exists() or not (init / "model.safetensors").exists():
            raise UserError(f"{init} is not a base VLM checkpoint with its card (vlm.json)")
        try:
            prev = json.loads((init / "vlm.json").read_text())
            prev_recipe = prev.get("recipe", {})
            got = {k: prev_recipe.get(k) for k in ("steps", "batch_size", "lr", "seed")}
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
            raise UserError(f"{init / 'vlm.json'} is not a base VLM card: {e}") from None
        want = {k: recipe[k] for k in ("steps", "batch_size", "lr", "seed")}
        if got != want or "phase 2" in prev_recipe:
            raise UserError(f"{init} was pretrained with {prev.get('recipe')}, not the phase-1 recipe {want} alone")
        model, tok = vlm.load(init)
        phase1_seconds = prev.get("train_seconds")
        recipe["phase 1 from"] = f"{prev.get('name', init.name)} checkpoint ({phase1_seconds} s)"
    losses: list[float] = []
    t1 = time.time()
    if spatial_steps > 0:
        n = spatial_steps * cfg.batch_size
        k = int(round(n * spatial_fraction))
        data = spatial_examples(k, seed=seed) + pretraining_examples(n - k, seed=seed + 1, add_share=SPATIAL_ADD_SHARE)
        random.Random(f"s2h-phase2-{seed}").shuffle(data)
        cfg2 = dataclasses.replace(cfg, lr=spatial_lr, seed=seed + 1)
        losses = train(model, tok, data, 1.0, cfg2, on_step=report("phase 2"))
        recipe["phase 2"] = {"steps": spatial_steps, "lr": spatial_lr, "spatial_fraction": spatial_fraction,
                             "add_share_of_the_rest": SPATIAL_ADD_SHARE,
                             "drills": "spatial_examples (grid neighbours; highlighted neighbours and named reads, "
                                       "image and text) + pretraining_examples"}
    phase2_seconds = round(time.time() - t1, 1)
    card = {"name": BASE_NAME, "recipe": recipe, "parameters": sum(p.numel() for p in model.parameters()),
            "train_seconds": round((phase1_seconds or 0) + phase2_seconds, 1),
            "phase_seconds": [phase1_seconds, phase2_seconds],
            "final_loss": round(sum(losses[-50:]) / len(losses[-50:]), 4) if losses else None,
            "probe": probe(model, tok), "torch": torch.__version__}
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    vlm.save(model, tok, tmp, card)
    old = out.with_name(out.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        out.rename(old)  # the previous base stays whole until the new one is in place
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)
    return card
