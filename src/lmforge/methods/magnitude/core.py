"""Magnitude pruning: zero the smallest ``|W_ij|``, the baseline in SparseGPT (Frantar & Alistarh 2023,
Table 1) and Wanda (Sun et al. 2024, Table 2).

The comparison group is the whole layer, as in the Wanda reference code's ``prune_magnitude`` (one
threshold per linear layer); for N:M, the ``n`` smallest of every ``m`` consecutive inputs of a row.
"""

from __future__ import annotations

import torch

from lmforge.common.sparsity import layer_mask, nm_mask, parse_pattern
from lmforge.methods.magnitude.config import MagnitudeConfig

__all__ = ["magnitude_prune"]


@torch.no_grad()
def magnitude_prune(W: torch.Tensor, cfg: MagnitudeConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(W_pruned, mask)`` with ``mask`` True where a weight was pruned."""
    scores = W.abs().float()
    pattern = parse_pattern(cfg.pattern)
    mask = nm_mask(scores, pattern) if pattern is not None else layer_mask(scores, cfg.sparsity)
    return W.float().masked_fill(mask, 0.0), mask
