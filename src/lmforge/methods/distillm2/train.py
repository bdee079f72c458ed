"""DistiLLM-2 training loop: a student distilled from a teacher on DPO-format pairs.

DistiLLM-2 (Ko et al., ICML 2025, arXiv 2503.07067). Per epoch: (re)sample student responses y_s with
the current student, batch each prompt's (y_t, y_s) pair, run teacher (no grad) and student on both
sequences, and minimise ``(1-beta) SKL_alpha(y_t) + beta SRKL_alpha(y_s)`` (:mod:`.losses`) with AdamW,
linear warm-up and cosine decay (the released config: lr 5e-5, warm-up 0.1, cosine).

What we reuse from TRL 1.16 and why:
    * ``trl.trainer.dpo_trainer.DataCollatorForPreference`` batches the pairs: it takes
      ``prompt_ids``/``chosen_ids``/``rejected_ids`` and returns right-padded ``input_ids`` with the
      chosen rows first and the rejected rows second plus a ``completion_mask`` -- exactly the
      concatenated chosen/rejected forward of the official trainer (a DPOTrainer fork).
    * Not ``DPOTrainer`` itself: its loss is a function of sequence log-probs against a reference
      model, while DistiLLM-2 needs the teacher's full-vocabulary logits at every position.
    * Not ``GKDTrainer``: it supports only the generalized JSD, one response per prompt (the
      ChatML collator) and on-policy mixing by a coin flip (``lmbda``) per step, not a teacher and a
      student response per prompt with different losses. Our own ~100-line loop over the collator
      is simpler than subclassing either and runs on CPU without accelerate.
    * PEFT ``LoraConfig``/``get_peft_model`` for the LoRA option (the paper trains LoRA r = 16 on all
      linear layers).
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from lmforge.methods.distillm2 import losses as L
from lmforge.methods.distillm2.config import DistillConfig
from lmforge.methods.distillm2.data import Pair, build_pairs, sample_responses, with_student


@dataclass
class DistillResult:
    """What :func:`distill` returns.

    Attributes:
        student: the trained student (a PEFT model when ``cfg.lora``; merge with ``merge_and_unload``).
        history: one dict per optimizer step (step, epoch, loss, lr, beta, alpha_skl, alpha_srkl).
        epochs: one dict per epoch (mean loss, student mean token log-prob on y_t and y_s).
        pairs: the last epoch's pairs.
    """

    student: Any
    history: list[dict[str, float]] = field(default_factory=list)
    epochs: list[dict[str, float]] = field(default_factory=list)
    pairs: list[Pair] = field(default_factory=list)


def collate_pairs(pairs: list[Pair], pad_id: int) -> dict[str, torch.Tensor]:
    """Batch pairs with TRL's ``DataCollatorForPreference`` (chosen rows first, then rejected)."""
    from trl.trainer.dpo_trainer import DataCollatorForPreference

    coll = DataCollatorForPreference(pad_token_id=pad_id)
    return coll([{"prompt_ids": p.prompt_ids, "chosen_ids": p.chosen_ids, "rejected_ids": p.rejected_ids}
                 for p in pairs])


def shifted(logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits at positions 0..T-2 (each predicts the next token) and the mask of response targets."""
    mask = (batch["completion_mask"][:, 1:] * batch["attention_mask"][:, 1:]).bool()
    return logits[:, :-1, :], mask


def mean_token_logprob(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-sequence mean log-prob of the target tokens (the official ``average_log_prob=True``)."""
    lp = torch.log_softmax(logits.float(), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    m = mask.to(lp.dtype)
    return (lp * m).sum(-1) / m.sum(-1).clamp_min(1.0)


def batch_loss(
    cfg: DistillConfig,
    s_logits: torch.Tensor,
    t_logits: torch.Tensor,
    batch: dict[str, torch.Tensor],
    *,
    beta: float,
    alpha: tuple[float | torch.Tensor, float | torch.Tensor],
) -> torch.Tensor:
    """The configured loss on one collated batch (rows [:B] teacher responses, [B:] student responses).

    Args:
        cfg: the configuration (``loss``, ``gjsd_beta``, ``baseline_data``).
        s_logits: (2B, T, V) student logits on the collated batch.
        t_logits: (2B, T, V) teacher logits on the same batch.
        batch: the collated batch (``input_ids``, ``attention_mask``, ``completion_mask``).
        beta: the SRKL weight for ``distillm2``.
        alpha: ``(alpha_skl, alpha_srkl)``, floats or (B,) tensors.

    Returns:
        Scalar loss (per-sequence token mean, then batch mean, as the official code).
    """
    s, mask = shifted(s_logits, batch)
    t, _ = shifted(t_logits, batch)
    b = s.shape[0] // 2
    if cfg.loss == "distillm2":
        return L.distillm2_loss(s[:b], t[:b], s[b:], t[b:], alpha, beta, mask[:b], mask[b:], reduction="sequence")

    def div(st: torch.Tensor, te: torch.Tensor, m: torch.Tensor, a: float | torch.Tensor) -> torch.Tensor:
        if cfg.loss == "kl":
            return L.forward_kl(st, te, m, reduction="sequence")
        if cfg.loss == "rkl":
            return L.reverse_kl(st, te, m, reduction="sequence")
        if cfg.loss == "gjsd":
            return L.generalized_jsd(st, te, cfg.gjsd_beta, m, reduction="sequence")
        return L.skew_kl(st, te, a, m, reduction="sequence")

    if cfg.baseline_data == "teacher":
        return div(s[:b], t[:b], mask[:b], alpha[0])
    if cfg.baseline_data == "student":
        return div(s[b:], t[b:], mask[b:], alpha[1])
    # Equal weight on both data types: the same data DistiLLM-2 sees (official "gkd" sums both terms).
    return 0.5 * div(s[:b], t[:b], mask[:b], alpha[0]) + 0.5 * div(s[b:], t[b:], mask[b:], alpha[1])


def apply_lora(model: Any, cfg: DistillConfig) -> Any:
    """Wrap ``model`` with PEFT LoRA adapters on all linear layers (r, alpha, dropout from ``cfg``)."""
    from peft import LoraConfig, get_peft_model

    lcfg = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules="all-linear", task_type="CAUSAL_LM")
    return get_peft_model(model, lcfg)


def distill(
    teacher: Any,
    student: Any,
    tokenizer: Any,
    prompts: list[str],
    cfg: DistillConfig,
    *,
    teacher_responses: list[tuple[str, list[int]]] | None = None,
    on_step: Callable[[dict[str, float], Any], None] | None = None,
    copy_student: bool = True,
) -> DistillResult:
    """Distil ``teacher`` into ``student`` on ``prompts`` with the loss in ``cfg``.

    Args:
        teacher: causal LM p (frozen, eval mode).
        student: causal LM q; copied first unless ``copy_student`` is False.
        tokenizer: the shared tokenizer.
        prompts: training prompts.
        cfg: settings.
        teacher_responses: precomputed ``(text, ids)`` per prompt (sampled once, as the paper does);
            sampled here when None.
        on_step: called after every optimizer step with the step record and the student (for curves).
        copy_student: deep-copy the student so the caller's model is left untouched.

    Returns:
        A :class:`DistillResult`.
    """
    from lmforge.common.generation import eos_token_ids, pad_token_id

    if copy_student:
        student = copy.deepcopy(student)
    if cfg.lora:
        student = apply_lora(student, cfg)
    teacher.eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    pad_id = pad_token_id(tokenizer, eos_token_ids(student, tokenizer))
    gen = dict(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
               batch_size=cfg.gen_batch_size)
    if teacher_responses is None:
        teacher_responses = sample_responses(teacher, tokenizer, prompts, seed=cfg.seed, **gen)
    student.train()
    params = [p for p in student.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    steps_per_epoch = math.ceil(len(prompts) / cfg.batch_size)
    total = steps_per_epoch * cfg.epochs
    warmup = int(round(cfg.warmup_ratio * total))
    result = DistillResult(student=student)
    rng = random.Random(cfg.seed)
    anchor: dict[str, list[float]] = {"skl": [], "srkl": []}
    pairs: list[Pair] = []
    step = 0
    for epoch in range(cfg.epochs):
        if epoch == 0 or cfg.regenerate_student:
            student_out = sample_responses(student, tokenizer, prompts, seed=cfg.seed + 1000 * (epoch + 1), **gen)
            pairs = (build_pairs(tokenizer, prompts, teacher_responses, student_out) if epoch == 0
                     else with_student(pairs, student_out))
        order = list(range(len(pairs)))
        rng.shuffle(order)
        ep_losses: list[float] = []
        for i in range(steps_per_epoch):
            chunk = [pairs[j] for j in order[i * cfg.batch_size:(i + 1) * cfg.batch_size]]
            batch = collate_pairs(chunk, pad_id)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
                with torch.no_grad():
                    t_logits = teacher(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
                s_logits = student(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            beta = L.beta_schedule(step, total, cfg.gradual_beta, cfg.beta)
            alpha = _alphas(cfg, epoch, s_logits, t_logits, batch, anchor)
            loss = batch_loss(cfg, s_logits.float(), t_logits.float(), batch, beta=beta, alpha=alpha)
            lr = cfg.lr * _lr_factor(step, total, warmup, cfg.min_lr_ratio)
            for g in opt.param_groups:
                g["lr"] = lr
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            rec = {"step": step, "epoch": epoch, "loss": float(loss.detach()), "lr": lr, "beta": beta,
                   "alpha_skl": _mean(alpha[0]), "alpha_srkl": _mean(alpha[1])}
            result.history.append(rec)
            ep_losses.append(rec["loss"])
            if on_step is not None:
                on_step(rec, student)
            step += 1
        result.epochs.append({"epoch": epoch, "loss": sum(ep_losses) / len(ep_losses)})
    result.pairs = pairs
    student.eval()
    return result


def _lr_factor(step: int, steps: int, warmup: int, min_ratio: float) -> float:
    """Linear warm-up then cosine decay (HF ``get_cosine_schedule_with_warmup``, floor ``min_ratio``)."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))


def _mean(a: float | torch.Tensor) -> float:
    return float(a.float().mean()) if isinstance(a, torch.Tensor) else float(a)


def _alphas(
    cfg: DistillConfig,
    epoch: int,
    s_logits: torch.Tensor,
    t_logits: torch.Tensor,
    batch: dict[str, torch.Tensor],
    anchor: dict[str, list[float]],
) -> tuple[float | torch.Tensor, float | torch.Tensor]:
    """alpha for the SKL and SRKL terms: fixed ``cfg.alpha`` or, with ``update_alpha``, adaptive.

    NOTE: the official code records the anchor m once from the first logged batch (and, by a lookup
    bug, never actually uses it, see :func:`losses.adaptive_alpha`). The paper switches adaptive alpha
    off in epoch 1; we collect m as the mean gap over all of epoch 1's batches and use it from epoch 2.
    """
    if not cfg.update_alpha:
        return cfg.alpha, cfg.alpha
    with torch.no_grad():
        s, mask = shifted(s_logits.detach(), batch)
        t, _ = shifted(t_logits, batch)
        tgt = batch["input_ids"][:, 1:]
        lq = mean_token_logprob(s, tgt, mask)
        lp = mean_token_logprob(t, tgt, mask)
        b = s.shape[0] // 2
        if epoch == 0:
            anchor["skl"].append(float((lp[:b].exp() - lq[:b].exp()).mean()))
            anchor["srkl"].append(float((lq[b:].exp() - lp[b:].exp()).mean()))
            return cfg.alpha, cfg.alpha
        m_skl = sum(anchor["skl"]) / max(len(anchor["skl"]), 1)
        m_srkl = sum(anchor["srkl"]) / max(len(anchor["srkl"]), 1)
        a1 = L.adaptive_alpha(lp[:b], lq[:b], m_skl, cfg.alpha)
        a2 = L.adaptive_alpha(lp[b:], lq[b:], m_srkl, cfg.alpha, on_student_responses=True)
    return a1, a2
