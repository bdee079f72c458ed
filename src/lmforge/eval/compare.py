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
vectorised over positions (a test checks them against scipy, ties included), since a run has
thousands. As scipy: ties get average ranks (Spearman) or the tau-b correction (Kendall), and a row
where either input is constant has no correlation (NaN). :func:`topk_agreement` averages over the
positions where it is defined and gives None where none is, so no NaN reaches a results file.
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
    """Ranks 1..k along the last dimension, tied values sharing their average rank (scipy's
    ``rankdata(method="average")``): #(smaller) + (#(equal, itself included) + 1) / 2."""
    x = x.double()
    smaller = (x[..., None, :] < x[..., :, None]).sum(-1)
    equal = (x[..., None, :] == x[..., :, None]).sum(-1)
    return smaller.double() + (equal.double() + 1.0) / 2.0


def spearman_rho(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Spearman's rho between ``a`` and ``b`` along the last dimension (one value per row).

    The Pearson correlation of the average ranks, as ``scipy.stats.spearmanr``; NaN for a row where
    either input is constant (scipy's answer too): callers must not average it in blindly.
    """
    ra, rb = _ranks(a), _ranks(b)
    ra = ra - ra.mean(dim=-1, keepdim=True)
    rb = rb - rb.mean(dim=-1, keepdim=True)
    den = (ra.pow(2).sum(-1) * rb.pow(2).sum(-1)).sqrt()
    rho = (ra * rb).sum(-1) / den.clamp(min=1e-300)
    return torch.where(den > 0, rho.clamp(-1.0, 1.0), torch.full_like(den, math.nan))


def kendall_tau(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Kendall's tau-b between ``a`` and ``b`` along the last dimension (one value per row).

    NaN for a row where either input is constant, as ``scipy.stats.kendalltau``.
    """
    da = torch.sign(a[..., :, None] - a[..., None, :]).double()
    db = torch.sign(b[..., :, None] - b[..., None, :]).double()
    k = a.shape[-1]
    upper = torch.triu(torch.ones(k, k, dtype=torch.bool, device=a.device), diagonal=1)
    concord = (da * db)[..., upper].sum(-1)
    ta = (da[..., upper] != 0).sum(-1).double()
    tb = (db[..., upper] != 0).sum(-1).double()
    den = (ta * tb).sqrt()
    return torch.where(den > 0, concord / den.clamp(min=1e-300), torch.full_like(den, math.nan))


@torch.no_grad()
def topk_agreement(original: torch.Tensor, compressed: torch.Tensor, k: int) -> dict[str, float]:
    """Mean over positions of the top-k Jaccard overlap, Kendall's tau and Spearman's rho.

    Args:
        original, compressed: logits ``(..., vocab)`` of the two models on the same inputs.
        k: how many top tokens.

    Kendall's tau and Spearman's rho are undefined at a position where the compressed model's
    logits on those k tokens are all equal (the original's top-k are distinct unless its own are
    tied): such positions are left out of their mean, which is None when no position remains.
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
        "kendall_tau": _defined_mean(kendall_tau(a, b)),
        "spearman_rho": _defined_mean(spearman_rho(a, b)),
    }


def _defined_mean(values: torch.Tensor) -> float | None:
    """The mean of the finite entries; None when there is none (never NaN)."""
    finite = values[torch.isfinite(values)]
    return float(finite.mean()) if finite.numel() else None


def energy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``-T logsumexp(z / T)`` per position: shape ``logits.shape[:-1]``."""
    return -temperature * torch.logsumexp(logits.double() / temperature, dim=-1)
