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

Performance paths (each gives the loss the plain path gives, up to float rounding; tests check it):
    * Only the positions that predict a response token go through the output head and the losses
      (:func:`response_index`, :func:`response_logits`): a forward pre-hook on the model's output
      embedding gathers those hidden states, so a long prompt no longer costs a (T, V) logit block per
      row (the prompt still runs through every block, as it must). The official code computes all
      logits and masks the prompt; the masked positions contribute nothing to the loss or its gradient.
    * :class:`TeacherCache`: the teacher is frozen, so its logits on a (prompt, response) sequence are
      the same in every epoch and for every loss that sees that sequence. The teacher's responses are
      looked up after their first forward (without a caller's cache, only up to ``PRIVATE_CACHE_BYTES``
      and only when a later epoch reads them); a cache the caller passes to several runs also keeps the
      first epoch's student responses, which repeat across runs that start from the same student with
      the same seed (see ``first_student_responses``).
"""

from __future__ import annotations

import copy
import math
import random
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from lmforge.methods.distillm2 import losses as L
from lmforge.methods.distillm2.config import DistillConfig
from lmforge.methods.distillm2.data import Pair, build_pairs, sample_responses, with_student


#: The most bytes of teacher logits the private cache of a :func:`distill` run without a
#: ``teacher_cache`` keeps (rows past it are recomputed each epoch, as before the cache existed).
PRIVATE_CACHE_BYTES = 1 << 30


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


def response_index(batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The positions that predict a response token, row by row, left-aligned.

    Returns:
        ``(index, mask, targets)``, each (N, R) with R the most response tokens of any row: ``index``
        the positions (a row with fewer tokens is padded with its last one, ``mask`` False there),
        ``targets`` the token each position predicts. ``logits[:, :-1].gather`` at ``index`` with
        ``mask`` holds exactly what :func:`shifted` selects.
    """
    _, full = shifted(batch["input_ids"].unsqueeze(-1), batch)
    counts = full.sum(-1)
    width = max(int(counts.max()), 1) if full.numel() else 1
    index = torch.zeros(full.shape[0], width, dtype=torch.long)
    mask = torch.zeros(full.shape[0], width, dtype=torch.bool)
    for r in range(full.shape[0]):
        pos = full[r].nonzero().flatten()
        if len(pos):
            index[r, :len(pos)] = pos
            index[r, len(pos):] = pos[-1]
            mask[r, :len(pos)] = True
    targets = batch["input_ids"].gather(1, index + 1)
    return index, mask, targets


def response_logits(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    index: torch.Tensor) -> torch.Tensor:
    """``model``'s logits at ``index`` (N, R) only: (N, R, V).

    A forward pre-hook on the output embedding (``get_output_embeddings()``, the LM head; a peft
    model passes the call to the model it wraps) gathers the final hidden states at ``index`` before
    the head, so the head and everything after it see R positions instead of T. A model the hook does
    not reach (no output embedding, or logits of another width) falls back to full logits, gathered.
    """
    head = model.get_output_embeddings() if callable(getattr(model, "get_output_embeddings", None)) else None
    handle = None
    fired = [0]
    if head is not None:
        def gather(_mod: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
            h = args[0]
            fired[0] += 1
            return (h.gather(1, index.unsqueeze(-1).expand(-1, -1, h.shape[-1])), *args[1:])

        handle = head.register_forward_pre_hook(gather)
    try:
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    finally:
        if handle is not None:
            handle.remove()
    # Whether the hook ran, not whether the widths agree: a head computed without calling the module
    # gives full (N, T, V) logits, and T can equal R (the teacher cache's sub-batches are cut to their
    # own width).
    if fired[0] == 1 and logits.shape[1] == index.shape[1]:
        return logits
    if fired[0] > 1:  # the head ran more than once: which call gave the logits is unknown, run it plain
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    return logits.gather(1, index.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))


class TeacherCache:
    """Teacher logits at the response positions of (prompt, response) sequences, kept across epochs
    and, when the caller passes one cache to several :func:`distill` runs, across runs.

    The teacher is frozen (:func:`distill` switches its gradients off and runs it in eval mode), so its
    logits on a sequence do not depend on the epoch or the loss. Entries are (n, V) tensors in the
    dtype the forward gave (bf16 under ``cfg.bf16``), keyed by the token ids and the bf16 flag. One
    cache serves one teacher object (held by a weak reference): :func:`distill` refuses a cache bound
    to another teacher, or to one that no longer exists; changing the teacher's weights in place
    between runs is not detected. A cached row was computed in its first batch; recomputed in another
    batch (other padding width) it may differ by float rounding only. ``max_bytes``: rows that would
    take the entries past it are not kept (None: no bound).
    """

    def __init__(self, max_bytes: int | None = None) -> None:
        self.entries: dict[tuple[Any, ...], torch.Tensor] = {}
        self.max_bytes = max_bytes
        self.nbytes = 0
        self.hits = 0
        self.misses = 0
        # A weak reference, not id(): an id can be reused by a new teacher once the old one is freed,
        # and the cache should not keep a teacher alive.
        self._teacher: weakref.ref[Any] | None = None

    def bind(self, teacher: Any) -> None:
        if self._teacher is None:
            self._teacher = weakref.ref(teacher)
        elif self._teacher() is not teacher:
            raise ValueError("this TeacherCache holds another teacher's logits")

    def put(self, key: tuple[Any, ...], row: torch.Tensor) -> None:
        """Keep ``row`` under ``key`` unless that would take the cache past ``max_bytes`` (then the row
        is recomputed whenever it is needed again: the values are the same, only slower)."""
        if key in self.entries:
            return
        size = row.numel() * row.element_size()
        if self.max_bytes is not None and self.nbytes + size > self.max_bytes:
            return
        self.entries[key] = row
        self.nbytes += size


def _teacher_logits(teacher: Any, batch: dict[str, torch.Tensor], index: torch.Tensor, mask: torch.Tensor,
                    keys: list[tuple[Any, ...]], store: list[bool], cache: TeacherCache, bf16: bool) -> torch.Tensor:
    """(N, R, V) teacher logits at ``index``: cached rows looked up, the others computed together (their
    own right-padded sub-batch) and stored where ``store`` says; positions outside ``mask`` hold 0."""
    n, width = index.shape
    rows: list[torch.Tensor | None] = [cache.entries.get(k) for k in keys]
    todo = [r for r in range(n) if rows[r] is None]
    cache.hits += n - len(todo)
    cache.misses += len(todo)
    if todo:
        sel = torch.tensor(todo, dtype=torch.long)
        att = batch["attention_mask"][sel]
        cols = int(att.sum(-1).max())
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = response_logits(teacher, batch["input_ids"][sel, :cols], att[:, :cols], index[sel])
        for j, r in enumerate(todo):
            rows[r] = out[j, :int(mask[r].sum())].detach().clone()
            if store[r]:
                cache.put(keys[r], rows[r])
    first = rows[0]
    assert first is not None
    t = torch.zeros(n, width, first.shape[-1], dtype=first.dtype)
    for r, block in enumerate(rows):
        assert block is not None
        t[r, :block.shape[0]] = block
    return t


def response_loss(
    cfg: DistillConfig,
    s: torch.Tensor,
    t: torch.Tensor,
    mask: torch.Tensor,
    *,
    beta: float,
    alpha: tuple[float | torch.Tensor, float | torch.Tensor],
) -> torch.Tensor:
    """The configured loss on aligned logits: ``s``, ``t`` (2B, R, V) at the positions whose targets
    ``mask`` (2B, R) marks, rows [:B] teacher responses and [B:] student responses (what
    :func:`batch_loss` computes from full logits, see :func:`response_index`)."""
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
    return response_loss(cfg, s, t, mask, beta=beta, alpha=alpha)


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
    teacher_cache: TeacherCache | None = None,
    first_student_responses: list[tuple[str, list[int]]] | None = None,
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
        teacher_cache: a :class:`TeacherCache` to share teacher logits with other runs on the same
            teacher (it then also keeps epoch 1's student responses; it is not bounded, the caller
            sizes it); None: a private one, which keeps the teacher's responses' logits only while a
            later epoch will read them and only up to :data:`PRIVATE_CACHE_BYTES` (the rest is
            recomputed each epoch).
        first_student_responses: epoch 1's student responses, sampled by the caller: they must be what
            this run would sample, ``sample_responses(student, tokenizer, prompts, seed=cfg.seed + 1000,
            max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
            batch_size=cfg.gen_batch_size)`` (LoRA adapters start at zero, so the wrapped student samples
            what the plain one does). Several runs from one student share one sampling this way.

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
    if first_student_responses is not None and len(first_student_responses) != len(prompts):
        raise ValueError("first_student_responses and prompts differ in number")
    shared = teacher_cache is not None
    # NOTE: a private cache is bounded (PRIVATE_CACHE_BYTES): it holds (response tokens x vocabulary)
    # logits per teacher response, which for a real data set and vocabulary is far beyond memory
    # (before the cache, `lmforge align distill` held one batch of teacher logits).
    cache = teacher_cache if teacher_cache is not None else TeacherCache(max_bytes=PRIVATE_CACHE_BYTES)
    cache.bind(teacher)
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
            if epoch == 0 and first_student_responses is not None:
                student_out = first_student_responses
            else:
                student_out = sample_responses(student, tokenizer, prompts, seed=cfg.seed + 1000 * (epoch + 1), **gen)
            pairs = (build_pairs(tokenizer, prompts, teacher_responses, student_out) if epoch == 0
                     else with_student(pairs, student_out))
        order = list(range(len(pairs)))
        rng.shuffle(order)
        ep_losses: list[float] = []
        for i in range(steps_per_epoch):
            chunk = [pairs[j] for j in order[i * cfg.batch_size:(i + 1) * cfg.batch_size]]
            batch = collate_pairs(chunk, pad_id)
            index, mask, targets = response_index(batch)
            keys = ([(cfg.bf16, tuple(p.prompt_ids), tuple(p.chosen_ids)) for p in chunk]
                    + [(cfg.bf16, tuple(p.prompt_ids), tuple(p.rejected_ids)) for p in chunk])
            # Keep the teacher's responses (a private cache: only while a later epoch will read them),
            # epoch 1's student responses for a shared cache.
            store = [shared or epoch < cfg.epochs - 1] * len(chunk) + [shared and epoch == 0] * len(chunk)
            t_logits = _teacher_logits(teacher, batch, index, mask, keys, store, cache, cfg.bf16)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
                s_logits = response_logits(student, batch["input_ids"], batch["attention_mask"], index)
            beta = L.beta_schedule(step, total, cfg.gradual_beta, cfg.beta)
            alpha = _alphas(cfg, epoch, s_logits, t_logits, targets, mask, anchor)
            loss = response_loss(cfg, s_logits.float(), t_logits.float(), mask, beta=beta, alpha=alpha)
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
    s: torch.Tensor,
    t: torch.Tensor,
    tgt: torch.Tensor,
    mask: torch.Tensor,
    anchor: dict[str, list[float]],
) -> tuple[float | torch.Tensor, float | torch.Tensor]:
    """alpha for the SKL and SRKL terms: fixed ``cfg.alpha`` or, with ``update_alpha``, adaptive
    (``s``, ``t``: aligned student and teacher logits, ``tgt`` their targets, see :func:`response_index`).

    NOTE: the official code records the anchor m once from the first logged batch (and, by a lookup
    bug, never actually uses it, see :func:`losses.adaptive_alpha`). The paper switches adaptive alpha
    off in epoch 1; we collect m as the mean gap over all of epoch 1's batches and use it from epoch 2.
    """
    if not cfg.update_alpha:
        return cfg.alpha, cfg.alpha
    with torch.no_grad():
        lq = mean_token_logprob(s.detach(), tgt, mask)
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
