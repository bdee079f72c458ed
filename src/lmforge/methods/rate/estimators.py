"""RATE's estimators of an attribute's causal effect on a reward, as pure numpy functions.

Reber, Richardson, Nief, Garbacea, Veitch, "RATE: Causal Explainability of Reward Models with
Imperfect Counterfactuals" (ICML 2025, arXiv 2410.11348); checked against the official
``toddnief/RATE`` ``src/rate/treatment_effects.py`` (read, not copied).

With W(y) ∈ {0, 1} the attribute, Re(y, w) a rewrite setting it to w and R the reward:

* naive:          mean R(y) | w=1 − mean R(y) | w=0 (confounded by whatever correlates with W);
* single rewrite: ATT = mean_{w=1} R(y) − R(Re(y,0)),  ATU = mean_{w=0} R(Re(y,1)) − R(y)
  (biased by the rewrite's own off-target changes, "artifacts");
* RATE:           ATT = mean_{w=1} R(Re(Re(y,0),1)) − R(Re(y,0)),
                  ATU = mean_{w=0} R(Re(y,1)) − R(Re(Re(y,1),0)),
                  ATE = (n₁·ATT + n₀·ATU) / n — both sides rewritten, so the artifacts cancel.

Standard errors, as the official code computes them (``treatment_effects_pipeline`` and
``_calculate_treatment_effects`` of the current ``treatment_effects.py``): the naive estimate and the
RATE ATT, ATU and ATE use the unpaired formula sqrt(var(treated)/n₁ + var(untreated)/n₀), the
single-rewrite ones the paired sd(d)/√n. (An earlier version of that file used the paired SE for the
RATE ATE and the unpaired one for ATT and ATU.) Both RATE arms hold the same units, so the unpaired SE
ignores their correlation and is conservative; ``paired_se=True`` gives the paired SE of the same
point estimates, which is what the paper's √n-consistency result is about.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
from scipy.stats import norm


@dataclass
class Estimate:
    """A point estimate with its standard error and normal confidence interval."""

    value: float
    se: float
    n: int
    ci_low: float
    ci_high: float

    def to_json(self) -> dict[str, Any]:
        """As a dict; an undefined number (no unit, or one: no standard error) is None, not NaN."""
        return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in asdict(self).items()}


def _estimate(value: float, se: float, n: int, confidence: float) -> Estimate:
    z = float(norm.ppf(0.5 + confidence / 2))
    return Estimate(float(value), float(se), int(n), float(value - z * se), float(value + z * se))


def paired(diffs: np.ndarray, confidence: float = 0.95) -> Estimate:
    """Mean of per-unit differences with the paired SE sd(d, ddof=1)/√n."""
    d = np.asarray(diffs, dtype=np.float64)
    if len(d) == 0:
        return _estimate(math.nan, math.nan, 0, confidence)
    se = float(np.std(d, ddof=1) / math.sqrt(len(d))) if len(d) > 1 else math.nan
    return _estimate(float(d.mean()), se, len(d), confidence)


def unpaired(treated: np.ndarray, control: np.ndarray, confidence: float = 0.95) -> Estimate:
    """Difference of two independent means with SE sqrt(var₁/n₁ + var₀/n₀)."""
    t, c = np.asarray(treated, np.float64), np.asarray(control, np.float64)
    if len(t) < 2 or len(c) < 2:
        return _estimate(float(t.mean() - c.mean()) if len(t) and len(c) else math.nan, math.nan,
                         len(t) + len(c), confidence)
    se = math.sqrt(np.var(t, ddof=1) / len(t) + np.var(c, ddof=1) / len(c))
    return _estimate(float(t.mean() - c.mean()), se, len(t) + len(c), confidence)


def _check(w: np.ndarray, *arrays: np.ndarray) -> np.ndarray:
    w = np.asarray(w)
    if not np.isin(w, (0, 1)).all():
        raise ValueError("w must hold only 0 and 1")
    for a in arrays:
        if len(a) != len(w):
            raise ValueError("every reward array needs one value per unit")
    return w.astype(bool)


def naive_effect(r_original: np.ndarray, w: np.ndarray, confidence: float = 0.95) -> Estimate:
    """mean R | w=1 − mean R | w=0 (unpaired SE)."""
    r = np.asarray(r_original, np.float64)
    m = _check(w, r)
    return unpaired(r[m], r[~m], confidence)


def single_rewrite_effects(r_original: np.ndarray, r_rewrite: np.ndarray, w: np.ndarray,
                           confidence: float = 0.95) -> dict[str, Estimate]:
    """Single-rewrite ATT, ATU and ATE (paired SEs). ``r_rewrite[i]`` = R(Re(y_i, 1 − w_i))."""
    r0, r1 = np.asarray(r_original, np.float64), np.asarray(r_rewrite, np.float64)
    m = _check(w, r0, r1)
    d = np.where(m, r0 - r1, r1 - r0)  # do(W=1) minus do(W=0) per unit
    return {"ATT": paired(d[m], confidence), "ATU": paired(d[~m], confidence), "ATE": paired(d, confidence)}


def rate_effects(r_rewrite: np.ndarray, r_rewrite_rewrite: np.ndarray, w: np.ndarray,
                 confidence: float = 0.95, *, paired_se: bool = False) -> dict[str, Estimate]:
    """RATE's ATT, ATU and ATE. ``r_rewrite[i]`` = R(Re(y_i, 1 − w_i)) and ``r_rewrite_rewrite[i]`` =
    R(Re(Re(y_i, 1 − w_i), w_i)). Unpaired SEs as the official code (``n`` counts units, once);
    ``paired_se``: the paired SEs of the same estimates."""
    r1, r2 = np.asarray(r_rewrite, np.float64), np.asarray(r_rewrite_rewrite, np.float64)
    m = _check(w, r1, r2)
    # w=1: Re(Re(y,0),1) has W=1, Re(y,0) has W=0; w=0: Re(y,1) has W=1, Re(Re(y,1),0) has W=0.
    do1, do0 = np.where(m, r2, r1), np.where(m, r1, r2)
    if paired_se:
        d = do1 - do0
        return {"ATT": paired(d[m], confidence), "ATU": paired(d[~m], confidence), "ATE": paired(d, confidence)}

    def unp(t: np.ndarray, c: np.ndarray) -> Estimate:
        return replace(unpaired(t, c, confidence), n=len(t))

    return {"ATT": unp(do1[m], do0[m]), "ATU": unp(do1[~m], do0[~m]), "ATE": unp(do1, do0)}


def all_effects(r_original: np.ndarray, r_rewrite: np.ndarray, r_rewrite_rewrite: np.ndarray, w: np.ndarray,
                confidence: float = 0.95, *, paired_se: bool = False) -> dict[str, Any]:
    """Naive, single-rewrite and RATE estimates together, as JSON-able dicts (``paired_se``: RATE's
    paired SEs instead of the official unpaired ones)."""
    out: dict[str, Any] = {"naive": naive_effect(r_original, w, confidence).to_json()}
    out["single_rewrite"] = {k: v.to_json() for k, v in single_rewrite_effects(r_original, r_rewrite, w, confidence).items()}
    out["rate"] = {k: v.to_json() for k, v in rate_effects(r_rewrite, r_rewrite_rewrite, w, confidence,
                                                           paired_se=paired_se).items()}
    return out
