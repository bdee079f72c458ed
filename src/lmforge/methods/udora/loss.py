"""UDora's two losses over the targets spliced into the surrogate response.

The forwarded sequence is ``prompt-before ⊕ adversarial string ⊕ prompt-after ⊕ surrogate response``;
target ``k`` (in surrogate order, ``k = 0, 1, ...``) occupies positions ``[s_k, s_k + L_k)`` of it and
is predicted by the logits at ``[s_k - 1, s_k + L_k - 1)``. With ``w`` the ``weight`` option:

* gradient loss (what the token gradient differentiates): ``Σ_k w^k · mean_j CE(t_kj)`` — per-target
  token-mean cross-entropy, weighted by ``w^k`` and summed over targets — or, with ``use_mellowmax``,
  ``Σ_k w^k · mellowmax_α(-z_k)`` with ``z_k`` the target tokens' logits and
  ``mellowmax_α(x) = (logsumexp(α x) - log n) / α``;
* selection loss (what ranks the candidates, lower is better):
  ``Σ_k w^k · (-Σ_j Π_{i<=j} match_ki  -  p̄_k) / (L_k + 1)``, where ``match`` is "argmax logit == target
  token" and ``p̄_k`` is the mean target-token probability over positions up to and including the
  first mismatch (all ``L_k`` positions when every token matches). It is minus the interval score of
  ``intervals.py`` evaluated on the candidate's surrogate, summed over targets.

Follows the official ``udora/loss.py`` (``compute_cross_entropy_loss``, ``apply_mellowmax_loss``,
``compute_udora_loss``), ``udora/utils.py`` (``mellowmax``) and the callers in ``udora/attack.py``
(``_compute_target_loss``, ``_compute_udora_batch_loss``) of AI-secure/UDora (MIT). Official defaults:
``weight=1.0``, ``use_mellowmax=False``, ``mellowmax_alpha=1.0``. ``minimize_reward`` (negating both
losses) belongs to the attack loop, not here. The official ``_compute_udora_batch_loss`` multiplies
each target's term by an "active mask" that is all ones in both modes, so the sum here has no mask.
The official averages both losses over the prompts of a multi-prompt attack; that too is the loop's.

Libraries checked: nanoGCG 0.3.0 (installed with ``--no-deps`` for the tests only) has the same CE /
mellowmax losses for a single fixed target and no selection loss of this kind; GCG's step-0 CE and
token gradient agree with it (``tests/methods/udora/test_nanogcg_reference.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

# (position of the target's first token in the forwarded sequence, the target's token ids)
TargetSpan = tuple[int, Sequence[int]]


def place_spans(offset: int, surrogate_ids: Sequence[int], spans: Sequence[tuple[int, int]]) -> list[TargetSpan]:
    """The targets of ``build_surrogate``'s ``spans`` for a sequence in which the surrogate starts at
    ``offset`` (``offset`` counts the positions whose logits are in the tensor given to the losses)."""
    return [(offset + s, [int(t) for t in surrogate_ids[s:e]]) for s, e in spans]


def mellowmax(t: torch.Tensor, alpha: float = 1.0, dim: int = -1) -> torch.Tensor:
    """``(logsumexp(alpha * t) - log n) / alpha`` along ``dim`` (official ``utils.mellowmax``)."""
    n = torch.tensor(t.shape[dim], dtype=t.dtype, device=t.device)
    return 1.0 / alpha * (torch.logsumexp(alpha * t, dim=dim) - torch.log(n))


def _span_logits(logits: torch.Tensor, position: int, ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits predicting the span (B, L, V), labels (B, L))."""
    length = len(ids)
    if length == 0:
        raise ValueError("empty target span")
    if position < 1 or position - 1 + length > logits.shape[1]:
        raise ValueError(f"target at {position} of length {length} does not fit logits of length {logits.shape[1]}")
    span_logits = logits[:, position - 1:position - 1 + length, :]
    labels = torch.as_tensor([int(t) for t in ids], dtype=torch.long, device=logits.device)
    return span_logits, labels.unsqueeze(0).expand(logits.shape[0], -1)


def _check(logits: torch.Tensor) -> None:
    if logits.dim() != 3:
        raise ValueError(f"logits must be (batch, seq, vocab), got shape {tuple(logits.shape)}")


def target_ce_loss(logits: torch.Tensor, targets: Sequence[TargetSpan], weight: float = 1.0) -> torch.Tensor:
    """``Σ_k weight^k · mean-token CE`` of each target; shape (batch,)."""
    _check(logits)
    total = torch.zeros(logits.shape[0], dtype=logits.dtype, device=logits.device)
    for k, (position, ids) in enumerate(targets):
        span_logits, labels = _span_logits(logits, position, ids)
        ce = F.cross_entropy(span_logits.reshape(-1, span_logits.shape[-1]), labels.reshape(-1), reduction="none")
        total = total + ce.view(logits.shape[0], -1).mean(dim=-1) * (weight ** k)
    return total


def target_mellowmax_loss(logits: torch.Tensor, targets: Sequence[TargetSpan], weight: float = 1.0,
                          alpha: float = 1.0) -> torch.Tensor:
    """``Σ_k weight^k · mellowmax_alpha(-target logits)``; shape (batch,)."""
    _check(logits)
    total = torch.zeros(logits.shape[0], dtype=logits.dtype, device=logits.device)
    for k, (position, ids) in enumerate(targets):
        span_logits, labels = _span_logits(logits, position, ids)
        label_logits = span_logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        total = total + mellowmax(-label_logits, alpha=alpha, dim=-1) * (weight ** k)
    return total


def gradient_loss(logits: torch.Tensor, targets: Sequence[TargetSpan], weight: float = 1.0,
                  use_mellowmax: bool = False, mellowmax_alpha: float = 1.0) -> torch.Tensor:
    """The loss the token gradient is taken of (official ``_compute_target_loss``); shape (batch,)."""
    if use_mellowmax:
        return target_mellowmax_loss(logits, targets, weight, mellowmax_alpha)
    return target_ce_loss(logits, targets, weight)


def selection_loss(logits: torch.Tensor, targets: Sequence[TargetSpan], weight: float = 1.0) -> torch.Tensor:
    """The loss that ranks candidates (official ``compute_udora_loss`` summed over targets); (batch,)."""
    _check(logits)
    batch = logits.shape[0]
    total = torch.zeros(batch, dtype=torch.float32, device=logits.device)
    for k, (position, ids) in enumerate(targets):
        span_logits, labels = _span_logits(logits, position, ids)
        length = labels.shape[1]
        probs = torch.softmax(span_logits, dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        matches = span_logits.argmax(dim=-1) == labels
        reward = -torch.cumprod(matches.float(), dim=1).sum(dim=1)
        idx = torch.arange(length, device=logits.device).unsqueeze(0).expand(batch, -1)
        first_miss = torch.where(~matches, idx, torch.full_like(idx, length)).min(dim=1).values
        upto = (idx <= first_miss.unsqueeze(1)).float()
        mean_neg_prob = (-probs * upto).sum(dim=1) / upto.sum(dim=1)
        total = total + (reward + mean_neg_prob) / (length + 1) * (weight ** k)
    return total
