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


def run_arm(base, tok, strategy: str, budget: int, pools: dict[tuple[str, str], list[Example]],
            eval_puzzles: dict[str, list[mini.Puzzle]], hard_probe: dict[str, torch.Tensor], seed: int,
            cfg: TrainConfig | None = None, probes_per_phase: int = 4, probe_batch: int = 32,
            keep_model: bool = False, progress: bool = False,
            loss_puzzles: list[mini.Puzzle] | None = None) -> ArmResult:
    """Train a copy of ``base`` on ``strategy`` for ``budget`` examples and evaluate it.

    Each alignment probe records :func:`align.probe`'s statistics (``cos``, ``drop``, ``ratio``, the
    gradient norms); with ``loss_puzzles`` (HARD puzzles) also the §5 HARD-image loss decomposition
    (``loss_conversion``, ``loss_reasoning``, ``loss_direct``: :func:`align.hard_image_losses`)."""
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
    return ArmResult(strategy=strategy, seed=seed, budget=budget, steps=steps, train_seconds=round(secs, 1),
                     accuracy=acc, converted_hard_image=conv, alignment=aligns, losses=losses,
                     model=model if keep_model else None)
