"""Wanda: a simple and effective pruning approach for large language models.

Sun, Liu, Bair, Kolter, ICLR 2024, https://arxiv.org/abs/2306.11695 (reference code
github.com/locuslab/wanda, ``lib/prune.py: prune_wanda``).

How it works: the score of weight ``W_ij`` is ``|W_ij| * ||X_j||_2``, the weight magnitude times the
norm of input feature ``j`` over all calibration tokens; weights are compared within each output row
(per-output comparison group), the lowest ``sparsity`` fraction of each row is set to zero, with no
weight update. For N:M the lowest ``n`` of every ``m`` consecutive inputs of a row are pruned.

The feature norms are read off the calibration Hessian's diagonal, ``H_jj = 2/N ||X_j||^2``: the
positive factor does not change any within-row ranking.
"""

from __future__ import annotations

import torch

from lmforge.common.sparsity import nm_mask, parse_pattern, row_mask
from lmforge.methods.wanda.config import WandaConfig

__all__ = ["wanda_prune", "wanda_scores"]


def wanda_scores(W: torch.Tensor, feature_norm: torch.Tensor) -> torch.Tensor:
    """``|W| * ||X_j||`` (Eq. 1 of the paper); ``feature_norm`` has shape ``(in,)``."""
    return W.abs().float() * feature_norm.float()[None, :]


@torch.no_grad()
def wanda_prune(W: torch.Tensor, feature_norm: torch.Tensor, cfg: WandaConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Prune ``W`` (out x in) given the input feature norms ``||X_j||_2`` (shape ``(in,)``).

    Returns ``(W_pruned, mask)`` with ``mask`` True where a weight was pruned.
    """
    scores = wanda_scores(W, feature_norm)
    pattern = parse_pattern(cfg.pattern)
    mask = nm_mask(scores, pattern) if pattern is not None else row_mask(scores, cfg.sparsity)
    return W.float().masked_fill(mask, 0.0), mask
