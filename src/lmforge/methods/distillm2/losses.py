"""Token-level distillation divergences and the DistiLLM-2 contrastive loss.

Papers:
    * DistiLLM-2 (Ko et al., ICML 2025, arXiv 2503.07067): skew KL on teacher responses plus skew
      reverse KL on student responses, L = (1-beta)*SKL_alpha(x, y_t) + beta*SRKL_alpha(x, y_s).
    * DistiLLM (Ko et al., ICML 2024, arXiv 2402.03898): the skew KL / skew reverse KL divergences.
    * GKD (Agarwal et al., ICLR 2024, arXiv 2306.13649): the generalized Jensen-Shannon divergence.

Libraries checked before writing by hand: TRL 1.16 has only the generalized JSD
(``trl.experimental.gkd.GKDTrainer.generalized_jsd_loss``); it has no skew KL / skew reverse KL, so those
are written here. :func:`generalized_jsd` re-implements TRL's convention (not imported, because the
experimental module's API is unstable and importing it pulls in the whole SFT stack); a test checks it
equals TRL's on random logits.

Checked against the official code (github.com/jongwooko/distillm-2, ``src/distillm_trainer.py``,
``get_batch_logps`` and ``kd_loss`` with ``loss_type="distillm_v2"``):
    * SKL mixes ``alpha*p + (1-alpha)*q`` with NO stop-gradient: the student gets gradient through
      the q inside the mixture too.
    * SRKL mixes ``(1-alpha)*p + alpha*sg(q)``: q is ``.detach()``-ed inside the mixture only.
    * Both are summed over the vocabulary per position, averaged over the response tokens of each
      sequence (``average_log_prob=True``), then averaged over the batch (``losses.mean()``).
    * Total: ``(2-b)*SKL + b*SRKL`` with ``b = 1`` (released, ``gradual_beta=False``) or
      ``b = 1 + 0.5*min(1, 2*step/max_steps)``; this is ``2*[(1-beta)*SKL + beta*SRKL]`` with
      ``beta = b/2``. We use the paper's form (the constant factor 2 only rescales the learning rate).
    * Adaptive alpha (``update_alpha``, shipped False): ``alpha = clip(1 - (1-alpha0)*m/(g+1e-5), 0.01,
      alpha0)`` per sequence, ``g = exp(mean log p) - exp(mean log q)`` on teacher responses (reversed on
      student responses) and ``m`` a stored batch-average of ``g``.
    * No temperature (logits used as is).

Masked vocabularies (logits of -inf): as DistiLLM's official code (github.com/jongwooko/distillm,
``distillm/losses.py``: ``inf_mask = torch.isinf(logits) | torch.isinf(teacher_logits)``, then
``masked_fill(..., inf_mask, 0)`` on every per-vocabulary term), a vocabulary entry where either
model's logit is -inf is left out of the sum. The distributions stay the models' softmaxes over the
whole vocabulary (a -inf entry has probability 0); with a mask both models share this is the
divergence on the finite sub-vocabulary. A position where every entry is -inf contributes 0. Values
and gradients are finite (no ``-inf - -inf``, no ``0 * inf``). NOTE: DistiLLM-2's released
``get_batch_logps`` has no such masking (a -inf logit there gives NaN); we follow DistiLLM's.

Conventions: p = teacher, q = student. All logits are (B, T, V); ``mask`` is (B, T) bool/float, nonzero
on the response tokens that count. The elementary divergences return the mean over masked tokens of
the per-token divergence (summed over the vocabulary); pass ``reduction="sequence"`` to average per
sequence first and then over sequences (the official DistiLLM-2 reduction).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = [
    "adaptive_alpha",
    "beta_schedule",
    "distillm2_loss",
    "forward_kl",
    "generalized_jsd",
    "reduce_tokens",
    "reverse_kl",
    "skew_kl",
    "skew_reverse_kl",
]


def _check(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> None:
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(
            f"student logits {tuple(student_logits.shape)} and teacher logits "
            f"{tuple(teacher_logits.shape)} differ in shape"
        )
    if student_logits.dim() != 3:
        raise ValueError(f"logits must be (B, T, V), got {tuple(student_logits.shape)}")


def _check_alpha(alpha: float | torch.Tensor) -> None:
    if isinstance(alpha, torch.Tensor):
        if bool(((alpha < 0) | (alpha > 1)).any()):
            raise ValueError("alpha must lie in [0, 1]")
    elif not 0.0 <= float(alpha) <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")


def reduce_tokens(
    per_token: torch.Tensor, mask: torch.Tensor | None = None, reduction: str = "token"
) -> torch.Tensor:
    """Reduce a (B, T) per-token loss to a scalar over the masked tokens.

    Args:
        per_token: (B, T) loss per position.
        mask: (B, T) bool or float weights; None counts every position.
        reduction: ``"token"`` = sum over masked tokens / number of masked tokens (TRL GKD's
            ``batchmean`` with labels); ``"sequence"`` = per-sequence token mean, then mean over
            sequences (DistiLLM-2's ``average_log_prob=True`` then ``losses.mean()``); a sequence with
            no masked token contributes 0 and is still counted.

    Returns:
        A scalar tensor.
    """
    if mask is None:
        mask = torch.ones_like(per_token)
    mask = mask.to(per_token.dtype)
    if mask.shape != per_token.shape:
        raise ValueError(f"mask {tuple(mask.shape)} does not match per-token loss {tuple(per_token.shape)}")
    if reduction == "token":
        # clamp_min(1): an all-masked batch gives 0 (with a gradient path), not nan, as TRL does.
        return (per_token * mask).sum() / mask.sum().clamp_min(1.0)
    if reduction == "sequence":
        per_seq = (per_token * mask).sum(-1) / mask.sum(-1).clamp_min(1.0)
        return per_seq.mean()
    raise ValueError(f"unknown reduction {reduction!r}; use 'token' or 'sequence'")


def _log_probs(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """log q, log p and the (B, T, V) bool mask of the entries left out (either logit is -inf).

    Left-out entries hold log-probability 0 in both (finite, so no NaN reaches a value or a gradient);
    every per-vocabulary term below is 0 there and is also zeroed explicitly by :func:`_vocab_sum`.
    When no logit is -inf (the usual case) the mask is None and the plain log-softmaxes are returned:
    the masked path would give the same values and gradients bit for bit (each ``torch.where`` keeps
    its input where nothing is left out), at several more passes over a (B, T, V) tensor.
    """
    s_inf = torch.isneginf(student_logits)
    t_inf = torch.isneginf(teacher_logits)

    def scaled(logits: torch.Tensor) -> torch.Tensor:
        return logits if temperature == 1.0 else logits / temperature  # x / 1.0 == x exactly

    if not (bool(s_inf.any()) or bool(t_inf.any())):
        return F.log_softmax(scaled(student_logits), dim=-1), F.log_softmax(scaled(teacher_logits), dim=-1), None
    out = s_inf | t_inf

    def log_softmax(logits: torch.Tensor, inf: torch.Tensor) -> torch.Tensor:
        # A position masked everywhere would give -inf - (-inf) = NaN: give it finite logits; all
        # its entries are left out anyway.
        dead = inf.all(-1, keepdim=True)
        logits = torch.where(dead, torch.zeros_like(logits), logits)
        logp = F.log_softmax(scaled(logits), dim=-1)
        return torch.where(out, torch.zeros_like(logp), logp)

    return log_softmax(student_logits, s_inf), log_softmax(teacher_logits, t_inf), out


def _vocab_sum(log_input: torch.Tensor, log_target: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """sum_v exp(log_target) * (log_target - log_input) over the entries not left out: (B, T)."""
    term = F.kl_div(log_input, log_target, reduction="none", log_target=True)
    if out is None:
        return term.sum(-1)
    return torch.where(out, torch.zeros_like(term), term).sum(-1)


def _log_mix(log_a: torch.Tensor, log_b: torch.Tensor, w_a: float | torch.Tensor) -> torch.Tensor:
    """log(w_a*a + (1-w_a)*b) computed in log space (w_a in [0, 1], endpoints exact)."""
    if isinstance(w_a, torch.Tensor):
        w = w_a.to(log_a.dtype)
        # Broadcast a per-sequence (B,) weight over (B, T, V).
        while w.dim() < log_a.dim():
            w = w.unsqueeze(-1)
        return torch.logaddexp(log_a + torch.log(w), log_b + torch.log1p(-w))
    w_a = float(w_a)
    if w_a == 1.0:
        return log_a
    if w_a == 0.0:
        return log_b
    return torch.logaddexp(log_a + math.log(w_a), log_b + math.log1p(-w_a))


def forward_kl(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    reduction: str = "token",
) -> torch.Tensor:
    """Forward KL(p || q) = sum_v p (log p - log q), p teacher, q student (standard KD, Hinton et al.).

    Args:
        student_logits: (B, T, V) student logits.
        teacher_logits: (B, T, V) teacher logits.
        mask: (B, T) response-token mask.
        reduction: see :func:`reduce_tokens`.

    Returns:
        Scalar mean over masked tokens.
    """
    _check(student_logits, teacher_logits)
    log_q, log_p, out = _log_probs(student_logits, teacher_logits)
    # xlogy-style: p*log p where p = 0 contributes 0 (kl_div with log_target handles it).
    per_tok = _vocab_sum(log_q, log_p, out)
    return reduce_tokens(per_tok, mask, reduction)


def reverse_kl(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    reduction: str = "token",
) -> torch.Tensor:
    """Reverse KL(q || p) = sum_v q (log q - log p) (MiniLLM, Gu et al., ICLR 2024).

    Args:
        student_logits: (B, T, V) student logits.
        teacher_logits: (B, T, V) teacher logits.
        mask: (B, T) response-token mask.
        reduction: see :func:`reduce_tokens`.

    Returns:
        Scalar mean over masked tokens.
    """
    _check(student_logits, teacher_logits)
    log_q, log_p, out = _log_probs(student_logits, teacher_logits)
    per_tok = _vocab_sum(log_p, log_q, out)
    return reduce_tokens(per_tok, mask, reduction)


def skew_kl(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    alpha: float | torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    reduction: str = "token",
) -> torch.Tensor:
    """Skew KL, SKL_alpha = sum_v p [log p - log(alpha p + (1-alpha) q)] (DistiLLM Eq. 3; DistiLLM-2 Eq. 2).

    Reductions with this convention: ``alpha = 0`` gives forward KL(p||q); ``alpha = 1`` gives 0
    (mixture = p). No stop-gradient: the official code lets gradient flow through the q in the mixture.

    Args:
        student_logits: (B, T, V) student logits (q).
        teacher_logits: (B, T, V) teacher logits (p).
        alpha: skew in [0, 1]; a float or a (B,) tensor (per-sequence alpha, as adaptive alpha gives).
        mask: (B, T) response-token mask.
        reduction: see :func:`reduce_tokens`.

    Returns:
        Scalar mean over masked tokens.
    """
    _check(student_logits, teacher_logits)
    _check_alpha(alpha)
    log_q, log_p, out = _log_probs(student_logits, teacher_logits)
    log_mix = _log_mix(log_p, log_q, alpha)
    per_tok = _vocab_sum(log_mix, log_p, out)
    return reduce_tokens(per_tok, mask, reduction)


def skew_reverse_kl(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    alpha: float | torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    reduction: str = "token",
) -> torch.Tensor:
    """Skew reverse KL, SRKL_alpha = sum_v q [log q - log((1-alpha) p + alpha sg(q))] (DistiLLM-2 Eq. 2).

    The stop-gradient sits on the q inside the mixture only, as in the official code
    (``vocab_logps.detach()`` in ``get_batch_logps``); the outer q and log q carry gradient.
    Reductions with this convention: ``alpha = 0`` gives reverse KL(q||p); ``alpha = 1`` gives 0, value and
    gradient (mixture = sg(q), so log q - log sg(q) = 0 at every token).

    Args:
        student_logits: (B, T, V) student logits (q).
        teacher_logits: (B, T, V) teacher logits (p).
        alpha: skew in [0, 1]; a float or a (B,) tensor.
        mask: (B, T) response-token mask.
        reduction: see :func:`reduce_tokens`.

    Returns:
        Scalar mean over masked tokens.
    """
    _check(student_logits, teacher_logits)
    _check_alpha(alpha)
    log_q, log_p, out = _log_probs(student_logits, teacher_logits)
    # mixture weight on sg(q) is alpha, on p is 1 - alpha
    log_mix = _log_mix(log_q.detach(), log_p, alpha)
    per_tok = _vocab_sum(log_mix, log_q, out)
    return reduce_tokens(per_tok, mask, reduction)


def generalized_jsd(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    beta: float,
    mask: torch.Tensor | None = None,
    *,
    temperature: float = 1.0,
    reduction: str = "token",
) -> torch.Tensor:
    """Generalized JSD in TRL's ``GKDTrainer.generalized_jsd_loss`` convention (GKD, Agarwal et al. 2024).

    With m = beta p + (1-beta) q: JSD = beta KL(p||m) + (1-beta) KL(q||m) for 0 < beta < 1. As in TRL,
    ``beta == 0`` is special-cased to forward KL(p||q) and ``beta == 1`` to reverse KL(q||p) (the
    interpolation itself tends to 0 at both ends; TRL switches to the KLs there). Logits are divided
    by ``temperature`` first, as TRL does. With a mask, equals TRL's value with ``labels`` = -100
    outside the mask and ``reduction="batchmean"`` (sum / number of valid tokens). Without a mask TRL
    divides by the batch size, we by the number of tokens.

    Args:
        student_logits: (B, T, V) student logits.
        teacher_logits: (B, T, V) teacher logits.
        beta: interpolation in [0, 1].
        mask: (B, T) response-token mask.
        temperature: softmax temperature.
        reduction: see :func:`reduce_tokens`.

    Returns:
        Scalar mean over masked tokens.
    """
    _check(student_logits, teacher_logits)
    if not 0.0 <= float(beta) <= 1.0:
        raise ValueError(f"beta must lie in [0, 1], got {beta}")
    log_q, log_p, out = _log_probs(student_logits, teacher_logits, temperature)
    beta = float(beta)
    if beta == 0.0:
        per_tok = _vocab_sum(log_q, log_p, out)
    elif beta == 1.0:
        per_tok = _vocab_sum(log_p, log_q, out)
    else:
        log_m = _log_mix(log_p, log_q, beta)
        kl_p = _vocab_sum(log_m, log_p, out)
        kl_q = _vocab_sum(log_m, log_q, out)
        per_tok = beta * kl_p + (1.0 - beta) * kl_q
    return reduce_tokens(per_tok, mask, reduction)


def distillm2_loss(
    student_logits_on_teacher: torch.Tensor,
    teacher_logits_on_teacher: torch.Tensor,
    student_logits_on_student: torch.Tensor,
    teacher_logits_on_student: torch.Tensor,
    alpha: float | torch.Tensor | tuple[float | torch.Tensor, float | torch.Tensor],
    beta: float,
    mask_teacher: torch.Tensor | None = None,
    mask_student: torch.Tensor | None = None,
    *,
    reduction: str = "sequence",
) -> torch.Tensor:
    """DistiLLM-2 contrastive loss L = (1-beta) SKL_alpha(x, y_t) + beta SRKL_alpha(x, y_s) (Eq. 4).

    SKL on teacher responses pulls q up where p is high (increasing the likelihood of teacher
    responses); SRKL on student responses pushes q down where q > p (decreasing the likelihood of
    student responses).

    Args:
        student_logits_on_teacher: (B, T1, V) student logits on prompt + teacher response.
        teacher_logits_on_teacher: (B, T1, V) teacher logits on the same sequences.
        student_logits_on_student: (B, T2, V) student logits on prompt + student response.
        teacher_logits_on_student: (B, T2, V) teacher logits on the same sequences.
        alpha: one skew for both terms, or a pair ``(alpha_skl, alpha_srkl)`` (the official code keeps
            ``base_alpha_1`` and ``base_alpha_2``; each may be a (B,) tensor from :func:`adaptive_alpha`).
        beta: weight of the SRKL term in [0, 1] (released code: 0.5; see :func:`beta_schedule`).
        mask_teacher: (B, T1) teacher-response token mask.
        mask_student: (B, T2) student-response token mask.
        reduction: ``"sequence"`` (default, the official code's per-sequence token mean then batch mean)
            or ``"token"``.

    Returns:
        Scalar loss.
    """
    if not 0.0 <= float(beta) <= 1.0:
        raise ValueError(f"beta must lie in [0, 1], got {beta}")
    if isinstance(alpha, tuple):
        alpha_skl, alpha_srkl = alpha
    else:
        alpha_skl = alpha_srkl = alpha
    skl = skew_kl(student_logits_on_teacher, teacher_logits_on_teacher, alpha_skl, mask_teacher, reduction=reduction)
    srkl = skew_reverse_kl(
        student_logits_on_student, teacher_logits_on_student, alpha_srkl, mask_student, reduction=reduction
    )
    return (1.0 - beta) * skl + beta * srkl


def beta_schedule(step: int, max_steps: int, gradual: bool = False, beta0: float = 0.5) -> float:
    """The SRKL weight beta at ``step``.

    Official code (``kd_loss``): ``b = 1 + 0.5*min(1, 2*step/max_steps)`` if ``gradual_beta`` else 1, with
    the loss ``(2-b)*SKL + b*SRKL``. In the paper's form beta = b/2: it rises linearly from 0.5 to 0.75
    over the first half of training, then stays at 0.75. ``gradual=False`` (the released default) gives
    ``beta0`` (0.5) at every step.

    Args:
        step: current optimizer step (0-based).
        max_steps: total optimizer steps.
        gradual: the official ``gradual_beta`` flag.
        beta0: the fixed beta when ``gradual`` is False (0.5 in the released code).

    Returns:
        beta in [0, 1].
    """
    if not gradual:
        return float(beta0)
    frac = min(1.0, 2.0 * step / max(max_steps, 1))
    return 0.5 * (1.0 + 0.5 * frac)


def adaptive_alpha(
    mean_logp_teacher: torch.Tensor,
    mean_logp_student: torch.Tensor,
    anchor_gap: float,
    alpha0: float = 0.1,
    on_student_responses: bool = False,
) -> torch.Tensor:
    """Per-sequence adaptive alpha (DistiLLM-2 Sec. 3.3; official ``get_batch_logps``).

    From log(p / (alpha p + (1-alpha) q)) ~ (1-alpha)(p - q): choose alpha so that the skewed gap matches
    a reference gap. With ``g = exp(mean log p) - exp(mean log q)`` per sequence on teacher responses
    (``q-bar - p-bar`` on student responses), ``alpha = clip(1 - (1-alpha0)*m/(g + 1e-5), 0.01, alpha0)``
    where ``m = anchor_gap`` is a batch-average of ``g`` recorded earlier in training.

    NOTE: in the released code this path is dead: ``update_alpha=False``, and even when set True the
    stored anchor is read from the wrong level of ``_stored_metrics`` (an empty dict), so the ``try``
    falls back to ``alpha0``. We implement the formula as written in ``get_batch_logps``.

    Args:
        mean_logp_teacher: (B,) mean token log-prob of each response under the teacher.
        mean_logp_student: (B,) mean token log-prob of each response under the student.
        anchor_gap: the reference gap m.
        alpha0: the base alpha (0.1) and the upper clip.
        on_student_responses: use ``q-bar - p-bar`` (for the SRKL term).

    Returns:
        (B,) alpha per sequence, in [0.01, alpha0].
    """
    p_bar = mean_logp_teacher.exp()
    q_bar = mean_logp_student.exp()
    gap = (q_bar - p_bar) if on_student_responses else (p_bar - q_bar)
    alpha = 1.0 - (1.0 - alpha0) * anchor_gap / (gap + 1e-5)
    return alpha.clamp(min=0.01, max=alpha0).detach()
