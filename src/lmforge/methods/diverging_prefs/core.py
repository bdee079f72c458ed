"""Losses, pair categories and metrics of "Diverging Preferences" as pure functions.

Zhang, Wang, Hwang, Dong, Delalleau, Choi, Choi, Ren, Pyatkin, "Diverging Preferences: When do
Annotators Disagree and do Models Know?" (ICML 2025, arXiv 2410.14632). No official code exists;
TRL's ``RewardTrainer`` (checked, trl 1.16) has only the Bradley–Terry loss, so the distributional
losses are written here by hand; the AUROC is checked against scikit-learn in the tests.

Conventions. One annotator's label on a pair (A, B) is an integer in {−2, −1, 0, 1, 2}: positive
means A is preferred, 2 "A is clearly/significantly better", 1 "slightly better", 0 tie. A label
histogram is indexed by ``label + 2``: [B≫A, B>A, tie, A>B, A≫B].

The mean-variance model predicts r ~ N(μ, σ²) per response, so d = r_A − r_B ~ N(μ_A − μ_B,
σ_A² + σ_B² − 2ρσ_Aσ_B); the five labels are the intervals of d cut at ±c₀ and ±c₁ (the paper's
mapping, as reported: tie (−0.5, 0.5), slight [0.5, 1.5), strong [1.5, ∞)), whose probabilities
come from the normal CDF. Training minimises KL(annotator histogram ‖ interval probabilities).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

NUM_LABELS = 5
LABEL_NAMES = ("B>>A", "B>A", "tie", "A>B", "A>>B")

# Pair categories (Section 3 of the paper).
DIVERGING = "diverging"
HIGH_AGREEMENT = "high_agreement"
TIE = "tie"


def check_labels(labels: Sequence[int]) -> list[int]:
    """``labels`` as a list of ints in {−2..2}; ValueError otherwise."""
    out = []
    for v in labels:
        if isinstance(v, bool) or int(v) != v or not -2 <= int(v) <= 2:
            raise ValueError(f"a preference label must be an integer in -2..2, got {v!r}")
        out.append(int(v))
    if not out:
        raise ValueError("a pair needs at least one annotator label")
    return out


def label_histogram(labels: Sequence[Sequence[int]]) -> np.ndarray:
    """Per pair, the normalised histogram of its annotators' labels, shape (n, 5)."""
    hist = np.zeros((len(labels), NUM_LABELS), dtype=np.float64)
    for i, ls in enumerate(labels):
        for v in check_labels(ls):
            hist[i, v + 2] += 1
    return hist / hist.sum(axis=1, keepdims=True)


def pair_kind(labels: Sequence[int]) -> str:
    """``"diverging"`` (some annotator prefers A and another B), ``"high_agreement"`` (no annotator
    prefers the response the others rejected, and at least one prefers one) or ``"tie"`` (all ties)."""
    ls = check_labels(labels)
    pos, neg = any(v > 0 for v in ls), any(v < 0 for v in ls)
    if pos and neg:
        return DIVERGING
    return HIGH_AGREEMENT if (pos or neg) else TIE


def is_substantially_diverging(labels: Sequence[int]) -> bool:
    """Diverging with a strong label on both sides (one annotator A≫B, another B≫A).

    NOTE: the paper's "substantially diverging" subset needs strong labels; that it needs them on
    both sides is our reading (unverified).
    """
    ls = check_labels(labels)
    return 2 in ls and -2 in ls


def majority_side(labels: Sequence[int]) -> int:
    """+1 if more annotators prefer A than B, −1 if fewer, else the sign of the summed labels (0 if
    that is 0 too). For a high-agreement pair this is the side every non-tie annotator chose."""
    ls = check_labels(labels)
    n_a, n_b = sum(v > 0 for v in ls), sum(v < 0 for v in ls)
    if n_a != n_b:
        return 1 if n_a > n_b else -1
    s = sum(ls)
    return (s > 0) - (s < 0)


def soft_preference(labels: Sequence[int]) -> float | None:
    """The fraction of non-tie labels that prefer A (None when all are ties)."""
    ls = check_labels(labels)
    n_a, n_b = sum(v > 0 for v in ls), sum(v < 0 for v in ls)
    return None if n_a + n_b == 0 else n_a / (n_a + n_b)


# ------------------------------------------------------------------------------------------ losses


def difference_sd(sigma_a: torch.Tensor, sigma_b: torch.Tensor, rho: float = 0.0) -> torch.Tensor:
    """sd(r_A − r_B) = sqrt(σ_A² + σ_B² − 2ρσ_Aσ_B)."""
    var = sigma_a**2 + sigma_b**2 - 2.0 * rho * sigma_a * sigma_b
    return torch.sqrt(var.clamp_min(1e-12))


def interval_probs(delta_mu: torch.Tensor, sd: torch.Tensor, cuts: tuple[float, float] = (0.5, 1.5)) -> torch.Tensor:
    """P(d in each label interval) for d ~ N(delta_mu, sd²), shape (..., 5) in histogram order.

    Intervals: (−∞, −c₁), [−c₁, −c₀), [−c₀, c₀), [c₀, c₁), [c₁, ∞).
    """
    c0, c1 = cuts
    edges = torch.tensor([-c1, -c0, c0, c1], dtype=delta_mu.dtype, device=delta_mu.device)
    z = (edges - delta_mu.unsqueeze(-1)) / sd.unsqueeze(-1)
    cdf = torch.special.ndtr(z)
    zeros = torch.zeros_like(cdf[..., :1])
    ones = torch.ones_like(cdf[..., :1])
    full = torch.cat([zeros, cdf, ones], dim=-1)
    return (full[..., 1:] - full[..., :-1]).clamp_min(0.0)


def log_interval_probs(delta_mu: torch.Tensor, sd: torch.Tensor,
                       cuts: tuple[float, float] = (0.5, 1.5)) -> torch.Tensor:
    """log P(d in each label interval), computed in log space (same order as :func:`interval_probs`).

    Φ(b) − Φ(a) as a float difference is 0 once an interval is far in a tail (Δμ = 2, sd 0.4 is
    enough in float32), and the log of a clamped 0 has no gradient: a confidently wrong model could
    never be pulled back. Here each interval is log Φ(b) + log(1 − exp(log Φ(a) − log Φ(b))) on the
    side where both CDFs are small (the upper tail uses Φ(−a) − Φ(−b)), so the log-probability and its
    gradient stay finite far into the tails.
    """
    c0, c1 = cuts
    # NOTE: the open ends are +-1e4 rather than +-inf: log Φ(+-1e4/sd) is exactly 0 or a finite,
    # hugely negative number, which gives the same values while keeping the unused branch of each
    # torch.where finite (an infinite z there makes the gradient 0 * inf = nan).
    far = 1e4
    # NOTE: in float64. The open ends put z near -far/sd (-5e4 at sd 0.2), where log_ndtr's float32
    # backward, exp(-z²/2 - log Φ(z)) with both terms near -1e9, is NaN: it made every weight NaN
    # (mean-variance KL, seed 1, epoch 10). float64 keeps it exact to |z| ~ 1e7 (sd >= min_sigma).
    dtype = delta_mu.dtype
    delta_mu, sd = delta_mu.double(), sd.double()
    lo = torch.tensor([-far, -c1, -c0, c0, c1], dtype=delta_mu.dtype, device=delta_mu.device)
    hi = torch.tensor([-c1, -c0, c0, c1, far], dtype=delta_mu.dtype, device=delta_mu.device)
    za = (lo - delta_mu.unsqueeze(-1)) / sd.unsqueeze(-1)
    zb = (hi - delta_mu.unsqueeze(-1)) / sd.unsqueeze(-1)
    upper = za > 0  # both bounds above the mean: use the survival side, Φ(−a) − Φ(−b)
    big = torch.where(upper, torch.special.log_ndtr(-za), torch.special.log_ndtr(zb))
    small = torch.where(upper, torch.special.log_ndtr(-zb), torch.special.log_ndtr(za))
    # log(1 − exp(x)) for x = small − big ≤ 0 (an open end gives x ≈ −5e7/sd², i.e. log 1 = 0).
    x = (small - big).clamp(max=-1e-300)
    near = x > -0.693
    # NOTE: each branch gets an input it is finite on. log1p(−exp(x)) at x ≈ 0 is −inf with an
    # infinite derivative, and torch.where's gradient for the branch it did not pick is 0 * inf = nan:
    # one such pair in a batch turned every weight into NaN (mean-variance KL, seed 1, epoch 10).
    x_far = torch.where(near, torch.full_like(x, -1.0), x)
    return (big + torch.where(near, torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x_far)))).to(dtype)


def meanvar_kl_loss(
    mu_a: torch.Tensor,
    sigma_a: torch.Tensor,
    mu_b: torch.Tensor,
    sigma_b: torch.Tensor,
    hist: torch.Tensor,
    cuts: tuple[float, float] = (0.5, 1.5),
    rho: float = 0.0,
    eps: float = 1e-8,
) -> torch.Tensor:
    """Mean over pairs of KL(hist ‖ interval_probs(μ_A − μ_B, sd)); terms with hist = 0 count 0."""
    log_p = log_interval_probs(mu_a - mu_b, difference_sd(sigma_a, sigma_b, rho), cuts)
    h = hist.to(log_p.dtype)
    # Terms with h = 0 are 0; masking log_p too keeps a -inf there from making 0 * inf = nan.
    terms = torch.where(h > 0, h * (torch.log(h.clamp_min(eps)) - torch.where(h > 0, log_p, torch.zeros_like(log_p))),
                        torch.zeros_like(h))
    return terms.sum(-1).mean()


def meanvar_nll_loss(
    mu_a: torch.Tensor,
    sigma_a: torch.Tensor,
    mu_b: torch.Tensor,
    sigma_b: torch.Tensor,
    target: torch.Tensor,
    rho: float = 0.0,
) -> torch.Tensor:
    """Distributional preference learning (Siththaranjan et al., mean-variance): binary NLL with
    P(A ≻ B) = Φ((μ_A − μ_B) / sd), against the soft target (fraction of annotators preferring A)."""
    z = (mu_a - mu_b) / difference_sd(sigma_a, sigma_b, rho)
    t = target.to(z.dtype)
    # log Φ(z) and log Φ(−z) = log(1 − Φ(z)) stably: 1 − eps rounds to 1 in float32.
    return -(t * torch.special.log_ndtr(z) + (1 - t) * torch.special.log_ndtr(-z)).mean()


def bt_loss(r_a: torch.Tensor, r_b: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Bradley–Terry: −[t log σ(r_A − r_B) + (1 − t) log σ(r_B − r_A)], mean over pairs (TRL's
    ``RewardTrainer`` loss when t = 1 and there is no margin)."""
    return F.binary_cross_entropy_with_logits(r_a - r_b, target.to(r_a.dtype))


def class_kl_loss(logits: torch.Tensor, hist: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Classification head: mean KL(rating histogram ‖ softmax(logits))."""
    logp = torch.log_softmax(logits, dim=-1)
    h = hist.to(logp.dtype)
    terms = torch.where(h > 0, h * (torch.log(h.clamp_min(eps)) - logp), torch.zeros_like(h))
    return terms.sum(-1).mean()


# --------------------------------------------------------------------------------- scores, metrics


def bt_divergence(r_a: np.ndarray, r_b: np.ndarray) -> np.ndarray:
    """Single-value models: −|r_A − r_B| (a small gap predicts a diverging pair)."""
    return -np.abs(np.asarray(r_a, float) - np.asarray(r_b, float))


def bt_divergence_tuned(r_a: np.ndarray, r_b: np.ndarray, tau: float) -> np.ndarray:
    """A tuned single-value score, −| |r_A − r_B| − τ | (pairs whose gap is near τ rank highest).

    NOTE: not the paper's: it scores BT models with −|Δr| and tunes nothing for them. This one-parameter
    family (τ = 0 is the paper's score, τ = ∞ gives +|Δr|) lets a comparison tune BT on the same dev
    pairs as the mean-variance score's λ, so that a gain is not only a tuning advantage.
    """
    gap = np.abs(np.asarray(r_a, float) - np.asarray(r_b, float))
    if math.isinf(tau):
        return gap
    return -np.abs(gap - tau)


def meanvar_divergence(mu_a: np.ndarray, mu_b: np.ndarray, sigma_a: np.ndarray, sigma_b: np.ndarray,
                       lam: float) -> np.ndarray:
    """Mean-variance models: λ(σ_A + σ_B) − |μ_A − μ_B| (large spread, small gap: diverging).

    NOTE: the paper scores divergence from |μ_A − μ_B| and λ(σ_A + σ_B) with λ tuned on development
    data (as reported by secondary sources; unverified against the PDF). ``lam = inf`` means σ
    alone: the score is then σ_A + σ_B.
    """
    spread = np.asarray(sigma_a, float) + np.asarray(sigma_b, float)
    if math.isinf(lam):
        return spread
    return lam * spread - np.abs(np.asarray(mu_a, float) - np.asarray(mu_b, float))


def class_divergence(probs_a: np.ndarray, probs_b: np.ndarray) -> np.ndarray:
    """Classification models: P(rated lowest)·P(rated highest), summed over the two responses — the
    chance that two independent annotators give a response the two extreme ratings (halved).

    NOTE: the paper scores divergence by "P(rated 1 and rated 5)"; summing it over A and B is our
    reading for pairs (unverified).
    """
    pa, pb = np.asarray(probs_a, float), np.asarray(probs_b, float)
    return pa[:, 0] * pa[:, -1] + pb[:, 0] * pb[:, -1]


def roc_auc(scores: Sequence[float], positive: Sequence[bool]) -> float:
    """Area under the ROC curve (scikit-learn's ``roc_auc_score``; ties count one half)."""
    from sklearn.metrics import roc_auc_score

    y = np.asarray(positive, dtype=bool)
    if y.all() or not y.any():
        raise ValueError("AUROC needs at least one positive and one negative example")
    return float(roc_auc_score(y, np.asarray(scores, dtype=np.float64)))


def preference_accuracy(margins: Sequence[float], labels: Sequence[Sequence[int]]) -> float:
    """Accuracy of sign(r_A − r_B) on the high-agreement pairs (a zero margin counts one half)."""
    hits, n = 0.0, 0
    for m, ls in zip(margins, labels, strict=True):
        if pair_kind(ls) != HIGH_AGREEMENT:
            continue
        side = majority_side(ls)
        n += 1
        hits += 0.5 if m == 0 else float((m > 0) == (side > 0))
    if n == 0:
        raise ValueError("no high-agreement pairs to measure preference accuracy on")
    return hits / n


def diverging_id_auroc(divergence: Sequence[float], labels: Sequence[Sequence[int]],
                       substantial: bool = False) -> float:
    """AUROC of ``divergence`` for diverging (positive) vs high-agreement (negative) pairs; tie pairs
    are left out. ``substantial`` keeps only substantially diverging pairs as positives."""
    scores, pos = [], []
    for d, ls in zip(divergence, labels, strict=True):
        kind = pair_kind(ls)
        if kind == DIVERGING:
            if substantial and not is_substantially_diverging(ls):
                continue
            scores.append(d)
            pos.append(True)
        elif kind == HIGH_AGREEMENT:
            scores.append(d)
            pos.append(False)
    return roc_auc(scores, pos)


LAMBDA_GRID = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, math.inf)


def fit_lambda(mu_a: np.ndarray, mu_b: np.ndarray, sigma_a: np.ndarray, sigma_b: np.ndarray,
               labels: Sequence[Sequence[int]], grid: Sequence[float] = LAMBDA_GRID) -> float:
    """The λ of :func:`meanvar_divergence` with the best Diverging-ID AUROC on development pairs
    (the first best in grid order)."""
    best, best_auc = grid[0], -1.0
    for lam in grid:
        auc = diverging_id_auroc(meanvar_divergence(mu_a, mu_b, sigma_a, sigma_b, lam), labels)
        if auc > best_auc + 1e-12:
            best, best_auc = lam, auc
    return float(best)


BT_TAU_QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)


def fit_bt_tau(r_a: np.ndarray, r_b: np.ndarray, labels: Sequence[Sequence[int]],
               quantiles: Sequence[float] = BT_TAU_QUANTILES) -> float:
    """The τ of :func:`bt_divergence_tuned` with the best Diverging-ID AUROC on development pairs, from
    0 (the paper's −|Δr|), the ``quantiles`` of the dev pairs' |Δr| and ∞, the first best in that order."""
    gap = np.abs(np.asarray(r_a, float) - np.asarray(r_b, float))
    grid = [0.0, *[float(np.quantile(gap, q)) for q in quantiles], math.inf]
    best, best_auc = grid[0], -1.0
    for tau in grid:
        auc = diverging_id_auroc(bt_divergence_tuned(r_a, r_b, tau), labels)
        if auc > best_auc + 1e-12:
            best, best_auc = tau, auc
    return float(best)
