"""ACBench's analysis metrics: how a compressed model's internals and outputs differ from its original.

Dong et al., "Can Compressed LLMs Truly Act?" (ICML 2025, github.com/pprp/ACBench); the recipes, as
the notes in ``shared/papers/efficiency.md`` §1 read them from the code:

* **ERank** (the Diff-eRank recipe): hidden states ``R`` (tokens x d) are centred (the mean row
  subtracted) and each row L2-normalised; ``A = R^T R / N`` scaled to trace 1; with its singular values
  ``sigma``, ``p = sigma / sum(sigma)`` and ``ERank = exp(-sum p log p)``, between 1 (rank one) and d
  (isotropic). ACBench reports ``ERank_compressed - ERank_original``.
* **Top-k ranking correlation**, per position: the Jaccard overlap of the two models' top-k next-token
  sets, and Kendall's tau and Spearman's rho between the two models' logits on the *original* model's
  top-k tokens; averaged over positions, for k in {3, 10, 20}.
* **Energy**: ``E = -T logsumexp(z / T)`` per position (T = 1), compared as histograms.

Checked: scipy.stats has ``kendalltau``/``spearmanr`` for one pair of vectors; here they are
vectorised over positions (a test checks them against scipy), since a run has thousands.
"""

from __future__ import annotations

import math

import torch

__all__ = ["energy", "erank", "kendall_tau", "spearman_rho", "topk_agreement"]


@torch.no_grad()
def erank(hidden: torch.Tensor) -> float:
    """Effective rank of hidden states ``(tokens, d)`` (leading dimensions are flattened)."""
    R = hidden.detach().reshape(-1, hidden.shape[-1]).double()
    R = R - R.mean(dim=0, keepdim=True)
    norms = R.norm(dim=1, keepdim=True)
    R = R[norms[:, 0] > 0] / norms[norms[:, 0] > 0]
    if R.shape[0] == 0:
        return 1.0
    A = R.T @ R / R.shape[0]
    A = A / torch.trace(A)
    sigma = torch.linalg.svdvals(A)
    p = sigma / sigma.sum()
    p = p[p > 0]
    return float(math.exp(-(p * p.log()).sum()))


def _ranks(x: torch.Tensor) -> torch.Tensor:
    """Ranks 0..k-1 along the last dimension (ties broken by position, as argsort does)."""
    return torch.argsort(torch.argsort(x, dim=-1), dim=-1).to(torch.float64)


def spearman_rho(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Spearman's rho between ``a`` and ``b`` along the last dimension (one value per row)."""
    ra, rb = _ranks(a), _ranks(b)
    ra = ra - ra.mean(dim=-1, keepdim=True)
    rb = rb - rb.mean(dim=-1, keepdim=True)
    den = (ra.pow(2).sum(-1) * rb.pow(2).sum(-1)).sqrt()
    return torch.where(den > 0, (ra * rb).sum(-1) / den.clamp(min=1e-300), torch.ones_like(den))


def kendall_tau(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Kendall's tau-b between ``a`` and ``b`` along the last dimension (one value per row)."""
    da = torch.sign(a[..., :, None] - a[..., None, :]).double()
    db = torch.sign(b[..., :, None] - b[..., None, :]).double()
    k = a.shape[-1]
    upper = torch.triu(torch.ones(k, k, dtype=torch.bool, device=a.device), diagonal=1)
    concord = (da * db)[..., upper].sum(-1)
    ta = (da[..., upper] != 0).sum(-1).double()
    tb = (db[..., upper] != 0).sum(-1).double()
    den = (ta * tb).sqrt()
    return torch.where(den > 0, concord / den.clamp(min=1e-300), torch.ones_like(den))


@torch.no_grad()
def topk_agreement(original: torch.Tensor, compressed: torch.Tensor, k: int) -> dict[str, float]:
    """Mean over positions of the top-k Jaccard overlap, Kendall's tau and Spearman's rho.

    Args:
        original, compressed: logits ``(..., vocab)`` of the two models on the same inputs.
        k: how many top tokens.
    """
    zo = original.detach().reshape(-1, original.shape[-1]).double()
    zc = compressed.detach().reshape(-1, compressed.shape[-1]).double()
    if zo.shape != zc.shape:
        raise ValueError(f"logit shapes differ: {tuple(original.shape)} vs {tuple(compressed.shape)}")
    top_o = zo.topk(k, dim=-1).indices
    top_c = zc.topk(k, dim=-1).indices
    inter = (top_o[:, :, None] == top_c[:, None, :]).any(-1).sum(-1).double()
    jaccard = inter / (2 * k - inter)
    a, b = zo.gather(1, top_o), zc.gather(1, top_o)
    return {
        "jaccard": float(jaccard.mean()),
        "kendall_tau": float(kendall_tau(a, b).mean()),
        "spearman_rho": float(spearman_rho(a, b).mean()),
    }


def energy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``-T logsumexp(z / T)`` per position: shape ``logits.shape[:-1]``."""
    return -temperature * torch.logsumexp(logits.double() / temperature, dim=-1)
