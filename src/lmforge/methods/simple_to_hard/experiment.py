"""The S2H experiment on miniature Table Readout: supervision strategies from one base, scored on HARD.

:func:`run_arm` copies the base VLM, trains it on a strategy's phases (:func:`supervision.plan`, the
official composition) for a budget of examples, probes the gradient alignment with HARD images
during training (:mod:`align`), and scores greedy answers on HARD images, HARD text and SIMPLE
images (:func:`evaluate`). Data follow the official layout: every data type of a level is made from
the same puzzles, so a strategy that mixes types sees one puzzle in several forms, as the official
``combine_data.py`` does (each file shuffled with the same seed, then cut).
"""

from __future__ import annotations

import copy
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from lmforge.methods.simple_to_hard import align, mini, supervision, vlm
from lmforge.methods.simple_to_hard.train import Example, TrainConfig, batches, make_batch, train

MAX_NEW_TOKENS = 200  # conversion (73 words) + 18 CoT lines (5 words) + answer: at most 169


def example(p: mini.Puzzle, data_type: str) -> Example:
    conv = mini.conversation(p, data_type)
    human, gpt = conv["conversations"][0]["value"], conv["conversations"][1]["value"]
    return (human, gpt, mini.render_array(p) if data_type != "text2answer" else None)


def make_pools(n_simple: int, n_hard: int, seed: int) -> dict[tuple[str, str], list[Example]]:
    """Every (level, data type) pool, built from one puzzle list per level (the official layout)."""
    simple = mini.generate("SIMPLE", n_simple, seed)
    hard = mini.generate("HARD", n_hard, seed)
    pools: dict[tuple[str, str], list[Example]] = {}
    for lv, puzzles in (("SIMPLE", simple), ("HARD", hard)):
        for dt in ("text2answer", "image2answer", "image2answer+text"):
            pools[(lv, dt)] = [example(p, dt) for p in puzzles]
    return pools


def hard_probe_batch(tok, puzzles: list[mini.Puzzle]) -> dict[str, torch.Tensor]:
    """HARD-image gold responses in both image formats (direct CoT and image-via-text), one batch."""
    exs = [example(p, dt) for p in puzzles for dt in ("image2answer", "image2answer+text")]
    return make_batch(tok, exs, list(range(len(exs))))


@dataclass
class ArmResult:
    strategy: str
    seed: int
    budget: int
    steps: int
    train_seconds: float
    accuracy: dict[str, float]
    converted_hard_image: float
    alignment: list[dict[str, Any]] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    roles: dict[str, float] = field(default_factory=dict)  # response_token_accuracy on role_examples
    model: Any = None  # the trained model, with run_arm(keep_model=True)

    @property
    def mean_alignment(self) -> float:
        return sum(a["cos"] for a in self.alignment) / max(1, len(self.alignment))


def evaluate(model, tok, puzzles: dict[str, list[mini.Puzzle]]) -> tuple[dict[str, float], float]:
    """Greedy accuracy per split (``hard-image``, ``hard-text``, ``simple-image``...) and the share
    of HARD-image responses that converted to text first."""
    acc: dict[str, float] = {}
    conv = 0.0
    for split, ps in puzzles.items():
        image = split.endswith("image")
        prompts = [mini.prompt(p, image=image) for p in ps]
        outs = vlm.generate(model, tok, prompts, [mini.render_array(p) if image else None for p in ps],
                            max_new_tokens=MAX_NEW_TOKENS)
        acc[split] = sum(mini.score(p, o) for p, o in zip(ps, outs)) / len(ps)
        if split == "hard-image":
            conv = sum(mini.converted(o) for o in outs) / len(ps)
    return acc, conv


ROLES = ("conversion", "cell", "value", "total", "answer", "format")


def response_roles(gpt: str) -> list[str]:
    """The role of each response word of a miniature record, then ``format`` for EOS.

    ``conversion``: the words of an image-via-text conversion (``convert`` + the text table);
    in each CoT line ``cell value running-total... ;`` the ``cell`` (path following: which cell comes
    next), the ``value`` (reading that cell) and the ``total`` digits (the addition); ``answer``: the
    digits after ``answer``; ``format``: ``enumerate``, ``;``, ``answer`` and EOS."""
    roles: list[str] = []
    words = gpt.split()
    in_conv, line = words[:1] == ["convert"], -1
    after_answer = False
    for w in words:
        if w == "enumerate":
            in_conv = False
            roles.append("format")
        elif in_conv:
            roles.append("conversion")
        elif w in (";", "answer"):
            line, after_answer = -1, w == "answer"
            roles.append("format")
        elif after_answer:
            roles.append("answer")
        elif line == -1 and w in vlm._CELLS:
            line = 0
            roles.append("cell")
        else:
            line += 1
            roles.append("value" if line == 1 else "total")
    return roles + ["format"]


@torch.no_grad()
def response_token_accuracy(model, tok, examples: list[Example], batch_size: int = 32) -> dict[str, float]:
    """Teacher-forced argmax accuracy of the response tokens, per :func:`response_roles` role.

    The diagnostic that separates the sub-skills of a CoT (which cell comes next, reading it, adding)
    when greedy accuracy is 0 (issue 27: cells stayed at 0.08 while values reached 0.98)."""
    hits: dict[str, list[bool]] = {}
    was = model.training
    model.eval()
    for s in range(0, len(examples), batch_size):
        idx = list(range(s, min(s + batch_size, len(examples))))
        batch = make_batch(tok, examples, idx)
        pred = model(**{k: v for k, v in batch.items() if k != "labels"}).logits[:, :-1].argmax(-1)
        lab = batch["labels"][:, 1:]
        for row, i in enumerate(idx):
            pos = (lab[row] != -100).nonzero().flatten().tolist()
            roles = response_roles(examples[i][1])
            if len(roles) != len(pos):
                raise ValueError("response_token_accuracy needs records without masked response words")
            for role, p in zip(roles, pos):
                hits.setdefault(role, []).append(bool(pred[row, p] == lab[row, p]))
    model.train(was)
    return {r: round(sum(hits[r]) / len(hits[r]), 4) for r in ROLES if r in hits}


def run_arm(base, tok, strategy: str, budget: int, pools: dict[tuple[str, str], list[Example]],
            eval_puzzles: dict[str, list[mini.Puzzle]], hard_probe: dict[str, torch.Tensor], seed: int,
            cfg: TrainConfig | None = None, probes_per_phase: int = 4, probe_batch: int = 32,
            keep_model: bool = False, progress: bool = False,
            loss_puzzles: list[mini.Puzzle] | None = None,
            role_examples: list[Example] | None = None) -> ArmResult:
    """Train a copy of ``base`` on ``strategy`` for ``budget`` examples and evaluate it.

    Each alignment probe records :func:`align.probe`'s statistics (``cos``, ``drop``, ``ratio``, the
    gradient norms); with ``loss_puzzles`` (HARD puzzles) also the §5 HARD-image loss decomposition
    (``loss_conversion``, ``loss_reasoning``, ``loss_direct``: :func:`align.hard_image_losses`).
    With ``role_examples`` the trained model's teacher-forced accuracy per CoT role
    (:func:`response_token_accuracy`) is recorded in ``roles``."""
    model = copy.deepcopy(base)
    cfg = cfg or TrainConfig(seed=seed)
    phases = supervision.plan(strategy, budget)
    aligns: list[dict[str, Any]] = []
    losses: list[float] = []
    steps = 0
    t0 = time.time()
    for k, phase in enumerate(phases):
        data = supervision.compose(phase, pools)
        probe_ids = list(range(min(probe_batch, len(data))))
        phase_cfg = TrainConfig(lr=cfg.lr, batch_size=cfg.batch_size, warmup_ratio=cfg.warmup_ratio,
                                weight_decay=cfg.weight_decay, grad_clip=cfg.grad_clip, seed=cfg.seed + k,
                                group_by_modality=cfg.group_by_modality)
        n_batches = len(batches(data, phase.epochs, phase_cfg))
        at = {int(i * n_batches / probes_per_phase) for i in range(probes_per_phase)}

        def on_step(step: int, total: int, loss: float, _k=k, _data=data, _at=at) -> None:
            if progress and (step % 50 == 0 or step == total - 1):
                print(f"[s2h {strategy}] phase {_k + 1}/{len(phases)} step {step + 1}/{total} loss {loss:.3f} "
                      f"({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
            if step in _at:
                rec = {"phase": _k, "step": steps + step,
                       **align.probe(model, make_batch(tok, _data, probe_ids), hard_probe, cfg.lr)}
                if loss_puzzles:
                    parts = align.hard_image_losses(model, tok, loss_puzzles)
                    rec.update({f"loss_{name}": v for name, v in parts.items()})
                aligns.append(rec)
                model.train()

        ls = train(model, tok, data, phase.epochs, phase_cfg, on_step=on_step)
        losses += ls
        steps += len(ls)
    secs = time.time() - t0
    acc, conv = evaluate(model, tok, eval_puzzles)
    roles = response_token_accuracy(model, tok, role_examples) if role_examples else {}
    return ArmResult(strategy=strategy, seed=seed, budget=budget, steps=steps, train_seconds=round(secs, 1),
                     accuracy=acc, converted_hard_image=conv, alignment=aligns, losses=losses, roles=roles,
                     model=model if keep_model else None)
