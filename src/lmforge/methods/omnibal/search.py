"""The ISF cap search (official ``search_arguments`` in ``test_balanced_dynamic_batch.py``).

Start from ``Q_t = 4096`` and ``Q_v = 4096 // a`` with ``a = ((mean_tok // mean_vit + 1) // 16)·16``,
where ``mean_tok`` is the mean of token counts rounded up to multiples of 256 (the official
``collect_origin_info`` bins before averaging). Each step runs ISF at ``(Q_v, Q_t, Q_t − 128)`` and
scores its groups with :func:`~lmforge.methods.omnibal.metrics.balance_metrics` (one group per
micro-batch). While no setting's mean group size has passed ``micro_bs + 1``, both caps grow by one
step (``Q_v += 1``, ``Q_t += a``); once it has, and some setting had a mean group size in
``[micro_bs, micro_bs + 1]``, the search stops and returns the one with the lowest PadRatio +
DistRatio(ViT) + DistRatio(LLM); if none had, both caps shrink by one step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from lmforge.common.errors import UserError
from lmforge.methods.omnibal.isf import TOKEN_SLACK, group_sums, isf
from lmforge.methods.omnibal.metrics import BalanceMetrics, balance_metrics

MAX_STEPS = 200


@dataclass
class CapTrial:
    """One setting the search ran."""

    vit_cap: int
    token_cap: int
    token_floor: int
    mean_group: float
    metrics: BalanceMetrics


@dataclass
class CapSearchResult:
    """The chosen caps and every setting tried (in order)."""

    vit_cap: int
    token_cap: int
    token_floor: int
    step_tokens: int
    trials: list[CapTrial] = field(default_factory=list)


def initial_caps(vit: np.ndarray, tok: np.ndarray, token_cap: int = 4096) -> tuple[int, int, int]:
    """``(Q_v, Q_t, a)``, the search's start and token step (official ``get_init_llm_vit_len``)."""
    binned = -(-np.asarray(tok, dtype=np.int64) // 256) * 256
    mean_vit = float(np.mean(vit))
    mean_tok = float(np.mean(binned))
    step = int(((mean_tok // max(mean_vit, 1.0) + 1) // 16) * 16)
    if step < 1:
        raise UserError("token counts are too small for the cap search (mean tokens per tile under 16)")
    return token_cap // step, token_cap, step


def search_caps(vit: np.ndarray, tok: np.ndarray, dp_size: int = 8, micro_bs: int = 4, rounds: int = 50,
                seed: int = 1024, progress=None) -> CapSearchResult:
    """Search ISF caps (see the module docstring). ``progress(trial)`` is called after each setting."""
    vit_cap, token_cap, step = initial_caps(vit, tok)
    trials: list[CapTrial] = []
    hits: list[tuple] = []
    max_mean = 0.0
    for _ in range(MAX_STEPS):
        # NOTE: the official loop has no guard; a data set whose group size jumps over
        # [micro_bs, micro_bs + 1] would shrink the caps forever. We stop at a zero cap or MAX_STEPS.
        if vit_cap < 1 or token_cap <= TOKEN_SLACK:
            break
        floor = token_cap - TOKEN_SLACK
        res = isf(vit, tok, vit_cap, token_cap, rounds=rounds, seed=seed, token_floor=floor)
        if not res.groups:
            raise UserError(f"no sample fits caps of {vit_cap} tiles / {token_cap} tokens")
        gv, gt = group_sums(res.groups, vit, tok)
        mean_group = float(np.mean(res.sizes()))
        max_mean = max(max_mean, mean_group)
        trial = CapTrial(vit_cap, token_cap, floor, mean_group, balance_metrics(gv, gt, dp_size, 1))
        trials.append(trial)
        if progress is not None:
            progress(trial)
        if micro_bs <= mean_group <= micro_bs + 1:
            m = trial.metrics  # the official sort key: [total, vit dist, llm dist, Q_v, Q_t, floor, size]
            hits.append((m.total, m.dist_ratio_vit, m.dist_ratio_llm, vit_cap, token_cap, floor, mean_group,
                         len(trials) - 1))
        if max_mean > micro_bs + 1:
            if hits:
                break
            vit_cap -= 1
            token_cap -= step
        else:
            vit_cap += 1
            token_cap += step
    if not hits:
        raise UserError(f"the cap search found no setting with {micro_bs}-{micro_bs + 1} samples per group "
                        f"after {len(trials)} settings; give --vit-cap and --token-cap")
    best = trials[min(hits)[-1]]
    return CapSearchResult(best.vit_cap, best.token_cap, best.token_floor, step, trials)
