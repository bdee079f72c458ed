"""``vlm-nano``: the committed base VLM, pretrained here on generic skills only.

Built by :func:`build_base` (``lmforge train s2h-base``), committed under
``lmforge/zoo_weights/vlm-nano`` with its card (``vlm.json``: recipe, seconds, held-out probe
accuracies). Its pretraining (:func:`~lmforge.methods.simple_to_hard.train.pretraining_examples`) is
reading cells of image and text tables and adding a digit to a number, so the supervision strategies
compared on it start from the same generic skills and pretraining does not decide the comparison.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import torch

from lmforge.common.errors import UserError
from lmforge.methods.simple_to_hard import vlm
from lmforge.methods.simple_to_hard.train import TrainConfig, pretraining_examples, train

BASE_NAME = "vlm-nano"


def packaged_base() -> Path:
    return Path(__file__).resolve().parents[2] / "zoo_weights" / BASE_NAME


def load_base(path: Path | None = None):
    """The committed base (or the one at ``path``): ``(model, tokenizer)``."""
    p = path or packaged_base()
    if not (p / "model.safetensors").exists():
        raise UserError(f"no S2H base VLM at {p}; build one with `lmforge train s2h-base --out DIR`")
    return vlm.load(p)


def probe(model, tok, n: int = 240, seed: int = 10_001) -> dict[str, float]:
    """Held-out accuracy of the pretraining skills.

    Reads are teacher-forced (a drill's cell names are random, so the model is given them): a cell
    counts when both its digit and its highlight are the argmax; additions are greedy and exact."""
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
    return {k: round(sum(v) / max(1, len(v)), 4) for k, v in hits.items()}


def build_base(out: Path, steps: int = 3000, seed: int = 0, overwrite: bool = False,
               cfg: TrainConfig | None = None, progress: bool = True) -> dict:
    """Pretrain a fresh tiny VLM for ``steps`` batches and save it (with its card) to ``out``."""
    if out.exists() and not overwrite:
        raise UserError(f"{out} exists; pass --overwrite to replace it")
    cfg = cfg or TrainConfig(seed=seed)
    tok = vlm.build_tokenizer()
    model = vlm.build_model(tok, seed=seed)
    examples = pretraining_examples(steps * cfg.batch_size, seed=seed)
    t0 = time.time()

    def report(step: int, total: int, loss: float) -> None:
        if progress and (step % 100 == 0 or step == total - 1):
            print(f"[s2h-base] step {step + 1}/{total} loss {loss:.3f} ({time.time() - t0:.0f} s)", file=sys.stderr,
                  flush=True)

    losses = train(model, tok, examples, 1.0, cfg, on_step=report)
    card = {"name": BASE_NAME, "recipe": {"steps": steps, "batch_size": cfg.batch_size, "lr": cfg.lr, "seed": seed,
                                          "pretraining": "pretraining_examples (cell reads, image and text; additions)"},
            "parameters": sum(p.numel() for p in model.parameters()), "train_seconds": round(time.time() - t0, 1),
            "final_loss": round(sum(losses[-50:]) / len(losses[-50:]), 4), "probe": probe(model, tok),
            "torch": torch.__version__}
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    vlm.save(model, tok, tmp, card)
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return card
