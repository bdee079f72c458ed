"""Selective DPO wiring: reference runs on half splits, the difficulty score, and DPO over the
easiest τ share in easy-to-hard order.

Gao et al., "Principled Data Selection for Alignment: The Hidden Risks of Difficult Examples"
(ICML 2025, arXiv 2502.09650); official code github.com/glorgao/SelectiveDPO (52653aa).

Library checked first: TRL 1.16's ``DPOTrainer``. It fits the final run (the official
``SelectiveDPOTrainer`` is a DPOTrainer with a ``SequentialSampler``; :func:`trl_sequential_dpo`
does the same here), but the difficulty protocol needs 2·len(seeds) reference runs with a
per-pair held-out loss at five checkpoints each (the official code overrides DPOTrainer's whole
evaluation loop for that), and for the tiny models of the tests and the reproduction a
DPOTrainer's set-up (dataset maps, accelerate, collator) costs more than the training itself.
# NOTE: so the default engine is the loop below: the same sigmoid loss (``core.dpo_loss``, checked
# against a real DPOTrainer in the tests), summed completion log-probs as TRL computes them,
# reference log-probs computed once from the frozen start model, AdamW with warm-up + cosine and
# gradient clipping at 1.0 as the HF Trainer; the tests check that a few steps of this loop and of
# ``trl.DPOTrainer`` with a sequential sampler leave the same weights.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from lmforge.methods.selective_dpo.config import SelectiveDPOConfig
from lmforge.methods.selective_dpo.core import checkpoint_steps, difficulty, dpo_loss, easy_to_hard, half_split, lr_factor
from lmforge.models.zoo import collate

Encoded = tuple[list[int], list[bool]]


@dataclass
class EncodedPairs:
    """Token ids of every pair: ``BOS prompt completion EOS`` with the completion (and EOS) scored."""

    chosen: list[Encoded]
    rejected: list[Encoded]

    def __len__(self) -> int:
        return len(self.chosen)

    def subset(self, idx: Sequence[int]) -> EncodedPairs:
        return EncodedPairs([self.chosen[i] for i in idx], [self.rejected[i] for i in idx])


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def encode_preferences(tok: Any, records: Sequence[dict[str, Any]]) -> EncodedPairs:
    """Tokenize each record's two sequences as TRL 1.16's DPOTrainer does for plain-text pairs.

    The EOS text is appended to each completion (unless it already ends with it); ``prompt``,
    ``prompt+chosen`` and ``prompt+rejected`` are tokenized whole (with the tokenizer's special
    tokens), and the completion starts where the prompt's ids and both full sequences first
    diverge (TRL's ``common_prefix_length``), so a token merged across the boundary is scored.
    """
    eos = tok.eos_token or ""
    chosen, rejected = [], []
    for r in records:
        p_ids = tok(r["prompt"]).input_ids
        full = [tok(r["prompt"] + (c if c.endswith(eos) else c + eos)).input_ids for c in (r["chosen"], r["rejected"])]
        n = min(_common_prefix(p_ids, full[0]), _common_prefix(p_ids, full[1]))
        for ids, out in zip(full, (chosen, rejected)):
            out.append((ids, [False] * n + [True] * (len(ids) - n)))
    return EncodedPairs(chosen, rejected)


def _seq_logps(model: torch.nn.Module, seqs: list[Encoded], pad_id: int) -> torch.Tensor:
    batch = collate(seqs, pad_id)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1].float()
    labels = batch["labels"][:, 1:]
    mask = labels != -100
    tok_logps = torch.log_softmax(logits, dim=-1).gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return (tok_logps * mask).sum(-1)


def pair_logps(model: torch.nn.Module, pairs: EncodedPairs, pad_id: int, batch_size: int = 64,
               grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed completion log-probs ``(chosen, rejected)`` of every pair, in one forward per batch
    (chosen and rejected concatenated, as TRL's ``concatenated_forward``)."""
    outs_c, outs_r = [], []
    ctx = torch.enable_grad() if grad else torch.no_grad()
    with ctx:
        for s in range(0, len(pairs), batch_size):
            c, r = pairs.chosen[s:s + batch_size], pairs.rejected[s:s + batch_size]
            lp = _seq_logps(model, c + r, pad_id)
            outs_c.append(lp[: len(c)])
            outs_r.append(lp[len(c):])
    return torch.cat(outs_c), torch.cat(outs_r)


def dpo_train(model: torch.nn.Module, pairs: EncodedPairs, ref_chosen: torch.Tensor, ref_rejected: torch.Tensor,
              order: Sequence[int], *, beta: float, lr: float, batch_size: int, pad_id: int, epochs: int = 1,
              warmup_ratio: float = 0.1, weight_decay: float = 0.0, max_grad_norm: float | None = 1.0,
              on_step: Callable[[int, int], None] | None = None) -> list[float]:
    """DPO over ``pairs`` in exactly the given ``order`` (a sequential sampler: no shuffling).

    Args:
        model: the policy, trained in place (every parameter with ``requires_grad``).
        pairs / ref_chosen / ref_rejected: the data and the frozen reference log-probs, by index.
        order: indices into ``pairs``, consumed front to back in batches of ``batch_size``; the last
            batch may be short (``dataloader_drop_last=False``).
        beta, lr, batch_size, epochs, warmup_ratio, weight_decay, max_grad_norm: as in
            :class:`SelectiveDPOConfig` (None: no clipping).
        on_step: called as ``on_step(step, total_steps)`` after each optimizer step (1-based).

    Returns:
        The mean batch loss of every step.
    """
    order = list(order)
    per_epoch = math.ceil(len(order) / batch_size)
    total = per_epoch * epochs
    warmup = math.ceil(total * warmup_ratio)  # transformers' get_warmup_steps rounds up
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, total, warmup))
    model.train()
    losses = []
    step = 0
    for _ in range(epochs):
        for s in range(0, len(order), batch_size):
            idx = order[s:s + batch_size]
            sub = pairs.subset(idx)
            pc, pr = pair_logps(model, sub, pad_id, batch_size=len(idx), grad=True)
            loss = dpo_loss(pc, pr, ref_chosen[idx], ref_rejected[idx], beta)[0].mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
            opt.step()
            sched.step()
            step += 1
            losses.append(float(loss.detach()))
            if on_step is not None:
                on_step(step, total)
    model.eval()
    return losses


def _lora(model: torch.nn.Module, r: int, alpha: int) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model

    # The official curriculum-lens recipes: r = 16, alpha = 16, dropout 0.05 on every projection.
    names = {n.split(".")[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    targets = sorted(names & {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"})
    if not targets:
        raise ValueError("no Llama-style projections found for LoRA; pass ref_lora_r=0")
    return get_peft_model(model, LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.05, target_modules=targets))


@dataclass
class DifficultyResult:
    """The reference runs' record.

    Attributes:
        losses: ``[len(seeds), n_checkpoints, n]`` held-out DPO loss of every pair at every
            checkpoint of the run that held it out.
        scores: ``[n]`` difficulty, the mean over seeds and checkpoints.
        seeds: the split seeds.
        steps: per seed, the checkpoint steps of its two runs.
        train_losses: per (seed, split) the training-loss curve.
    """

    losses: np.ndarray
    scores: np.ndarray
    seeds: tuple[int, ...]
    steps: list[list[list[int]]] = field(default_factory=list)
    train_losses: list[list[float]] = field(default_factory=list)

    def per_seed(self) -> np.ndarray:
        """``[len(seeds), n]``: each seed's difficulty (mean over its checkpoints)."""
        return self.losses.mean(axis=1)


def compute_difficulty(model: torch.nn.Module, pairs: EncodedPairs, cfg: SelectiveDPOConfig, pad_id: int,
                       ref_logps: tuple[torch.Tensor, torch.Tensor] | None = None,
                       progress: Callable[[str], None] | None = None) -> DifficultyResult:
    """The paper's difficulty: for each seed, two reference DPO runs (one per half), each scoring
    the other half's per-pair DPO loss at ``cfg.n_checkpoints`` evenly spaced checkpoints.

    The reference of every run is ``model`` itself (frozen); each run starts from a copy of it,
    with LoRA adapters when ``cfg.ref_lora_r > 0``. Training follows the data order of the
    split (official: HF's default random sampler; here the permuted half, already random).
    """
    n = len(pairs)
    if ref_logps is None:
        ref_logps = pair_logps(model, pairs, pad_id, cfg.eval_batch_size)
    ref_c, ref_r = ref_logps
    losses = np.full((len(cfg.seeds), cfg.n_checkpoints, n), np.nan)
    all_steps: list[list[list[int]]] = []
    curves: list[list[float]] = []
    for si, seed in enumerate(cfg.seeds):
        first, second = half_split(n, seed)
        seed_steps = []
        # Split "first": evaluate on the first half, train on the second; "second": the reverse.
        for held, train_idx in ((first, second), (second, first)):
            torch.manual_seed(seed)
            run_model = copy.deepcopy(model)
            if cfg.ref_lora_r > 0:
                run_model = _lora(run_model, cfg.ref_lora_r, cfg.ref_lora_alpha)
            else:
                for p in run_model.parameters():
                    p.requires_grad_(True)
            total = math.ceil(len(train_idx) / cfg.batch_size) * cfg.epochs
            marks = checkpoint_steps(total, cfg.n_checkpoints)
            seed_steps.append(marks)
            held_pairs = pairs.subset(held)

            def on_step(step: int, _total: int, marks: list[int] = marks, held: np.ndarray = held,
                        held_pairs: EncodedPairs = held_pairs, run_model: torch.nn.Module = run_model) -> None:
                if step in marks:
                    k = marks.index(step)
                    run_model.eval()
                    pc, pr = pair_logps(run_model, held_pairs, pad_id, cfg.eval_batch_size)
                    run_model.train()
                    losses[si, k, held] = dpo_loss(pc, pr, ref_c[held], ref_r[held], cfg.beta)[0].numpy()

            curves.append(dpo_train(run_model, pairs, ref_c, ref_r, train_idx.tolist(), beta=cfg.beta,
                                    lr=cfg.ref_lr, batch_size=cfg.batch_size, pad_id=pad_id, epochs=cfg.epochs,
                                    warmup_ratio=cfg.warmup_ratio, weight_decay=cfg.weight_decay,
                                    max_grad_norm=cfg.max_grad_norm, on_step=on_step))
            if progress is not None:
                progress(f"reference run seed {seed}: {len(curves)} of {2 * len(cfg.seeds)} done")
        all_steps.append(seed_steps)
    flat = losses.reshape(-1, n)
    return DifficultyResult(losses=losses, scores=difficulty(flat), seeds=cfg.seeds, steps=all_steps,
                            train_losses=curves)


@dataclass
class SelectiveDPOResult:
    """A Selective DPO run: the trained policy, the difficulty record and the training order."""

    model: torch.nn.Module
    difficulty: DifficultyResult
    order: np.ndarray
    train_losses: list[float]


def selective_dpo(model: torch.nn.Module, tok: Any, records: Sequence[dict[str, Any]], cfg: SelectiveDPOConfig,
                  scores: np.ndarray | None = None,
                  progress: Callable[[str], None] | None = None) -> SelectiveDPOResult:
    """Selective DPO end to end: difficulty (unless ``scores`` are given), keep the easiest
    ``cfg.tau``, then DPO over them easy to hard; ``model`` is the reference and is not modified.

    Returns:
        The trained copy, the difficulty record (``losses`` empty when ``scores`` were given), and
        the training order (indices into ``records``).
    """
    pad_id = tok.pad_token_id
    pairs = encode_preferences(tok, records)
    model.eval()
    ref = pair_logps(model, pairs, pad_id, cfg.eval_batch_size)
    if scores is None:
        diff = compute_difficulty(model, pairs, cfg, pad_id, ref_logps=ref, progress=progress)
    else:
        scores = np.asarray(scores, dtype=float)
        if scores.shape != (len(records),):
            raise ValueError(f"scores must have one value per pair ({len(records)}), got shape {scores.shape}")
        diff = DifficultyResult(losses=np.empty((0, 0, len(records))), scores=scores, seeds=())
    order = easy_to_hard(diff.scores, cfg.tau)
    torch.manual_seed(cfg.seed)
    policy = copy.deepcopy(model)
    for p in policy.parameters():
        p.requires_grad_(True)
    curve = dpo_train(policy, pairs, ref[0], ref[1], order.tolist(), beta=cfg.beta, lr=cfg.lr,
                      batch_size=cfg.batch_size, pad_id=pad_id, epochs=cfg.epochs, warmup_ratio=cfg.warmup_ratio,
                      weight_decay=cfg.weight_decay, max_grad_norm=cfg.max_grad_norm)
    return SelectiveDPOResult(model=policy, difficulty=diff, order=order, train_losses=curve)


def preference_accuracy(policy: torch.nn.Module, tok: Any, records: Sequence[dict[str, Any]],
                        batch_size: int = 64) -> float:
    """Share of pairs whose chosen completion the policy gives the higher log-probability."""
    pc, pr = pair_logps(policy, encode_preferences(tok, records), tok.pad_token_id, batch_size)
    return float((pc > pr).float().mean())


def trl_sequential_dpo(model: torch.nn.Module, tok: Any, records: Sequence[dict[str, Any]], cfg: SelectiveDPOConfig,
                       out_dir: str, ref_model: torch.nn.Module | None = None, max_steps: int = -1) -> Any:
    """Plain DPO through ``trl.DPOTrainer`` over ``records`` in their given order.

    The official ``SelectiveDPOTrainer`` overrides ``get_train_dataloader`` to use a
    ``SequentialSampler``; transformers 5 exposes that as ``train_sampling_strategy="sequential"``,
    so no subclass is needed. CPU settings: ``use_cpu=True``, fp32 (``bf16=False``). Warm-up: a float
    ``warmup_steps`` in [0, 1) is a ratio in transformers 5 (``warmup_ratio`` is gone).

    Args:
        model: the policy (trained in place); ``ref_model`` defaults to TRL's frozen copy of it.
        records: ``prompt``/``chosen``/``rejected`` records, already in training order.
        cfg: β, learning rate, batch size, epochs, warm-up and seed.
        out_dir: the trainer's scratch folder (nothing is saved there).
        max_steps: stop early (tests); -1 runs the epochs.

    Returns:
        The trainer, after ``train()``.
    """
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    ds = Dataset.from_list([{"prompt": r["prompt"], "chosen": r["chosen"], "rejected": r["rejected"]}
                            for r in records])
    args = DPOConfig(output_dir=out_dir, beta=cfg.beta, learning_rate=cfg.lr, per_device_train_batch_size=cfg.batch_size,
                     num_train_epochs=cfg.epochs, warmup_steps=cfg.warmup_ratio, lr_scheduler_type="cosine",
                     weight_decay=cfg.weight_decay, max_grad_norm=cfg.max_grad_norm, train_sampling_strategy="sequential", use_cpu=True, bf16=False,
                     seed=cfg.seed, report_to=[], save_strategy="no", logging_steps=1, max_steps=max_steps,
                     disable_tqdm=True, dataloader_drop_last=False)
    trainer = DPOTrainer(model=model, ref_model=ref_model, args=args, train_dataset=ds, processing_class=tok)
    trainer.train()
    return trainer
