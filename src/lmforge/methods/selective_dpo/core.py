"""Selective DPO's math as pure functions: the DPO loss, the half splits, the checkpoint schedule,
the difficulty score, the selection and its easy-to-hard order.

Gao et al., "Principled Data Selection for Alignment: The Hidden Risks of Difficult Examples"
(ICML 2025, arXiv 2502.09650). Checked against the official code (github.com/glorgao/SelectiveDPO,
commit 52653aa) and TRL 1.16 (``DPOTrainer._compute_loss``, ``loss_type="sigmoid"``), whose loss is
inlined in the trainer and not importable as a function, hence :func:`dpo_loss` here; the tests
check it against a real ``trl.DPOTrainer`` on the same model and pairs.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F


def dpo_loss(policy_chosen_logps: torch.Tensor, policy_rejected_logps: torch.Tensor,
             ref_chosen_logps: torch.Tensor, ref_rejected_logps: torch.Tensor,
             beta: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-pair sigmoid DPO loss ``-log σ(β[(π_c - ref_c) - (π_r - ref_r)])`` (Rafailov et al.).

    Args:
        policy_chosen_logps / policy_rejected_logps: summed completion log-probs under the policy.
        ref_chosen_logps / ref_rejected_logps: the same under the reference model.
        beta: DPO's β.

    Returns:
        ``(losses, chosen_rewards, rejected_rewards)``, each of the batch's shape; the rewards are
        ``β·(π - ref)`` (TRL's logged implicit rewards), detached.
    """
    chosen_logratios = policy_chosen_logps - ref_chosen_logps
    rejected_logratios = policy_rejected_logps - ref_rejected_logps
    # logsigmoid is the numerically stable form of log σ (TRL uses the same call).
    losses = -F.logsigmoid(beta * (chosen_logratios - rejected_logratios))
    return losses, (beta * chosen_logratios).detach(), (beta * rejected_logratios).detach()


def half_split(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The two halves of ``range(n)`` for one seed, as the official ``run_half.py`` draws them.

    ``np.random.seed(seed); indices = np.random.permutation(n)``; split ``"first"`` evaluates on
    ``indices[:n // 2]`` and trains on ``indices[n // 2:]``, split ``"second"`` the reverse. A legacy
    ``RandomState(seed)`` gives the same permutation without touching numpy's global state.

    Returns:
        ``(first_half, second_half)`` = ``(indices[:n // 2], indices[n // 2:])``.
    """
    if n < 2:
        raise ValueError("need at least 2 pairs to split into halves")
    perm = np.random.RandomState(seed).permutation(n)
    return perm[: n // 2], perm[n // 2:]


def checkpoint_steps(total_steps: int, n_checkpoints: int) -> list[int]:
    """Optimizer steps after which a reference run scores its held-out half.

    Official ``run_half.py``: ``eval_steps = max(total_steps // num_eval, 1)`` with HF's
    ``eval_strategy="steps"``, so evaluations fall at ``eval_steps·k``; ``make_curricula.py`` reads
    the first ``num_eval`` of them (``step0`` .. ``step4``).

    Raises:
        ValueError: when the run has fewer steps than checkpoints (the official scripts would then
            miss a record file).
    """
    if total_steps < n_checkpoints:
        raise ValueError(f"a reference run of {total_steps} steps cannot hold {n_checkpoints} checkpoints; "
                         "use more pairs or a smaller batch")
    every = max(total_steps // n_checkpoints, 1)
    return [every * k for k in range(1, n_checkpoints + 1)]


def difficulty(held_out_losses: np.ndarray) -> np.ndarray:
    """The paper's difficulty ("learning order"): the mean held-out DPO loss over every reference
    run and checkpoint.

    Args:
        held_out_losses: ``[runs, n]`` array (a run = one seed × one checkpoint; official: 3 × 5 = 15
            columns of ``learning_order.csv``), NaN where a pair was not held out. Every pair is held
            out once per seed (split ``first`` or ``second``), so a row per (seed, checkpoint) is full
            after both halves are merged.

    Returns:
        ``[n]`` mean over runs (official ``merged_df.filter(like='loss').mean(axis=1)``, which skips
        NaN as pandas does).
    """
    arr = np.asarray(held_out_losses, dtype=float)
    if arr.ndim != 2:
        raise ValueError("held_out_losses must be [runs, n]")
    if np.isnan(arr).all(axis=0).any():
        raise ValueError("some pair was never held out")
    return np.nanmean(arr, axis=0)


def n_selected(n: int, tau: float) -> int:
    """How many pairs τ keeps: ``int(n·τ)`` as the official ``select(range(int(len·0.5)))``.

    # NOTE: floored like the official code, but at least 1 so that a tiny τ still trains on
    # something (the official scripts never meet that case).
    """
    if not 0.0 < tau <= 1.0:
        raise ValueError(f"tau must lie in (0, 1], got {tau}")
    # The epsilon keeps int(10 * 0.7) = 7, not 6 (0.7 * 10 = 6.999...).
    return max(1, int(math.floor(n * tau + 1e-9)))


def easy_to_hard(scores: np.ndarray, tau: float) -> np.ndarray:
    """Indices of the easiest ``τ`` share, in training order: ascending difficulty.

    Official ``run_selective_dpo.py``: ``sort("learning_order")`` (ascending) then
    ``select(range(int(len·τ)))``, trained with a ``SequentialSampler``. Ties keep their original
    order (a stable sort; ``datasets.sort`` is stable too).
    """
    scores = np.asarray(scores, dtype=float)
    if np.isnan(scores).any():
        raise ValueError("difficulty scores contain NaN")
    order = np.argsort(scores, kind="stable")
    return order[: n_selected(len(scores), tau)]


def lr_factor(step: int, total: int, warmup: int) -> float:
    """Linear warm-up then cosine decay to 0: transformers' ``get_cosine_schedule_with_warmup``
    (``lr_scheduler_type: cosine`` in the official recipes), as a multiplier at 0-based ``step``."""
    if step < warmup:
        return float(step) / float(max(1, warmup))
    progress = float(step - warmup) / float(max(1, total - warmup))
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
