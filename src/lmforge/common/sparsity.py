"""Pruning masks shared by magnitude, Wanda and SparseGPT.

N:M follows the convention of the Wanda and SparseGPT reference code and of llm-compressor
(``mask_structure="2:4"``): in every run of ``M`` consecutive input weights of a row, the ``N`` with the
lowest score are pruned. For the 2:4 pattern that GPUs accelerate this is the usual "2 of every 4".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lmforge.common.errors import UserError

__all__ = ["NMPattern", "check_sparsity", "nm_mask", "parse_pattern", "row_mask", "is_nm", "layer_mask"]


@dataclass(frozen=True)
class NMPattern:
    """``n`` pruned weights in every ``m`` consecutive input weights."""

    n: int
    m: int

    def __str__(self) -> str:
        return f"{self.n}:{self.m}"

    @property
    def sparsity(self) -> float:
        return self.n / self.m


def parse_pattern(text: str | None) -> NMPattern | None:
    """``"2:4"`` -> ``NMPattern(2, 4)``; None/``""``/``"unstructured"`` -> None. Bad input: UserError."""
    if text is None or str(text).strip().lower() in ("", "unstructured", "none"):
        return None
    parts = str(text).split(":")
    try:
        n, m = (int(p) for p in parts)
    except ValueError:
        raise UserError(f"pattern must look like N:M (e.g. 2:4), got {text!r}") from None
    if not 0 < n < m:
        raise UserError(f"pattern N:M needs 0 < N < M, got {text!r}")
    return NMPattern(n, m)


def check_sparsity(sparsity: float) -> None:
    if not 0.0 <= float(sparsity) < 1.0:
        raise UserError(f"sparsity must be in [0, 1), got {sparsity!r}")


def row_mask(scores: torch.Tensor, sparsity: float) -> torch.Tensor:
    """Prune (True) the ``int(in * sparsity)`` lowest-scoring weights of every row (Wanda's grouping)."""
    k = int(scores.shape[1] * sparsity)
    mask = torch.zeros_like(scores, dtype=torch.bool)
    if k > 0:
        idx = torch.topk(scores, k, dim=1, largest=False).indices
        mask.scatter_(1, idx, True)
    return mask


def layer_mask(scores: torch.Tensor, sparsity: float) -> torch.Tensor:
    """Prune the ``int(numel * sparsity)`` lowest-scoring weights of the whole matrix (magnitude's
    per-layer threshold, and SparseGPT's per-block selection)."""
    k = int(scores.numel() * sparsity)
    mask = torch.zeros(scores.numel(), dtype=torch.bool, device=scores.device)
    if k > 0:
        mask[torch.topk(scores.reshape(-1), k, largest=False).indices] = True
    return mask.view_as(scores)


def nm_mask(scores: torch.Tensor, pattern: NMPattern) -> torch.Tensor:
    """Prune the ``n`` lowest scores in each run of ``m`` columns. A trailing run shorter than ``m``
    (``in`` not a multiple of ``m``) prunes ``floor(len * n / m)``."""
    rows, cols = scores.shape
    mask = torch.zeros_like(scores, dtype=torch.bool)
    full = cols - cols % pattern.m
    if full:
        blocks = scores[:, :full].reshape(rows, full // pattern.m, pattern.m)
        idx = torch.topk(blocks, pattern.n, dim=2, largest=False).indices
        mask[:, :full] = torch.zeros_like(blocks, dtype=torch.bool).scatter_(2, idx, True).reshape(rows, full)
    if full < cols:
        mask[:, full:] = row_mask(scores[:, full:], pattern.n / pattern.m)
    return mask


def is_nm(weight: torch.Tensor, pattern: NMPattern) -> bool:
    """Whether every full run of ``m`` input weights of every row has at least ``n`` zeros."""
    rows, cols = weight.shape
    full = cols - cols % pattern.m
    zeros = (weight[:, :full].reshape(rows, -1, pattern.m) == 0).sum(dim=2)
    return bool((zeros >= pattern.n).all())
