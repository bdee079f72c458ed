"""Run RATE end to end: rewrite, rewrite the rewrite, score, estimate.

Reber et al. (ICML 2025, arXiv 2410.11348), following the official pipeline (toddnief/RATE:
``create_dataset.py`` writes "original", "rewrite" and "rewritten rewrite" per example,
``score_dataset.py`` scores all three, ``treatment_effects.py`` estimates).

Reward models (:func:`load_scorer`): any Hugging Face sequence-classification reward model folder
(safetensors only, no remote code, offline), a reward model saved by ``lmforge reward train`` (its
μ), or a Python function (tests).

Rewrites that fail to flip the attribute. When a classifier W is given, each unit's rewrite is
checked (W(Re(y, 1 − w)) = 1 − w) and so is its rewrite of the rewrite (W(Re(Re(y, 1−w), w)) = w).
Failures are counted and listed by id in the result — never silently dropped: by default the units
stay in the estimate (the paper's estimator uses every unit); ``drop_failed`` leaves them out and
the result says how many were left out.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

import numpy as np

from lmforge.common.errors import UserError
from lmforge.methods.rate import estimators
from lmforge.methods.rate.config import RateConfig
from lmforge.methods.rate.rewriters import Rewriter

Scorer = Callable[[Sequence[str], Sequence[str]], np.ndarray]


class HFRewardScorer:
    """R(prompt, response) from a reward-model folder (:func:`lmforge.methods.diverging_prefs.heads.load_reward_model`)."""

    def __init__(self, spec: str | os.PathLike[str], batch_size: int = 16) -> None:
        from lmforge.methods.diverging_prefs.heads import MLPRewardModel, load_reward_model

        self.model, self.cfg = load_reward_model(spec)
        # Refused here, before any rewrite is paid for, not at the first scoring call.
        if isinstance(self.model, MLPRewardModel):
            raise UserError("an MLP reward model scores feature vectors, not texts; use an HF reward model")
        self.batch_size = batch_size
        self.name = str(spec)

    def __repr__(self) -> str:
        return f"HFRewardScorer(name={self.name!r}, head={self.cfg.head!r})"

    def __call__(self, prompts: Sequence[str], responses: Sequence[str]) -> np.ndarray:
        import torch

        from lmforge.methods.diverging_prefs.heads import format_text, to_outputs

        texts = [format_text(self.model.tokenizer, p, r) for p, r in zip(prompts, responses, strict=True)]
        out = []
        with torch.no_grad():
            for s in range(0, len(texts), self.batch_size):
                out.append(to_outputs(self.model.score(texts[s : s + self.batch_size]), self.cfg).reward)
        return np.concatenate(out) if out else np.zeros(0)


def load_scorer(spec: str | os.PathLike[str]) -> HFRewardScorer:
    """A reward-model folder as a scorer."""
    return HFRewardScorer(spec)


def run_rate(
    prompts: Sequence[str],
    responses: Sequence[str],
    w: Sequence[int],
    scorer: Scorer,
    rewriter: Rewriter,
    cfg: RateConfig,
    *,
    classifier: Callable[[str], int] | None = None,
    ids: Sequence[str] | None = None,
    keep_texts: bool = False,
) -> dict[str, Any]:
    """RATE on one dataset.

    Args:
        prompts: the prompt of each response (what the reward model conditions on).
        responses: the original responses y.
        w: W(y) per response (0 or 1): from the data or from ``classifier``.
        scorer: ``(prompts, responses) -> rewards``.
        rewriter: sets the attribute (:mod:`.rewriters`).
        cfg: settings.
        classifier: W(y), to check that rewrites flipped the attribute (None: unchecked, said so).
        ids: unit ids for the failure lists (default: indices).
        keep_texts: include the rewrites and rewards per unit in the result.

    Returns:
        A JSON-able dict: naive / single-rewrite / RATE estimates, counts of w=1 and w=0 units and of
        failed rewrites, and which units failed.
    """
    n = len(responses)
    if not (len(prompts) == n == len(w)):
        raise UserError("prompts, responses and w must have the same length")
    w_arr = np.asarray(w, dtype=int)
    if not np.isin(w_arr, (0, 1)).all():
        raise UserError("w must be 0 or 1 for every response")
    if w_arr.sum() < 2 or (1 - w_arr).sum() < 2:
        raise UserError(f"RATE needs at least two responses with w=1 and two with w=0 (got {int(w_arr.sum())} and "
                        f"{int((1 - w_arr).sum())})")
    ids = [str(i) for i in (ids if ids is not None else range(n))]
    flip = (1 - w_arr).tolist()
    rewrite = rewriter.rewrite(list(responses), flip)
    rewrite2 = rewriter.rewrite(rewrite, w_arr.tolist())
    if len(rewrite) != n or len(rewrite2) != n:
        raise UserError("the rewriter returned a different number of texts than it was given")

    failures: dict[str, Any] = {"checked": classifier is not None}
    ok = np.ones(n, dtype=bool)
    if classifier is not None:
        fail1 = np.array([classifier(t) != f for t, f in zip(rewrite, flip, strict=True)])
        fail2 = np.array([classifier(t) != int(x) for t, x in zip(rewrite2, w_arr, strict=True)])
        ok = ~(fail1 | fail2)
        failures.update({
            "rewrite_failed": int(fail1.sum()), "rewrite_of_rewrite_failed": int(fail2.sum()),
            "units_with_a_failed_rewrite": int((~ok).sum()),
            "failed_ids": [ids[i] for i in np.flatnonzero(~ok)],
            "original_w_disagrees_with_classifier": int(sum(classifier(t) != int(x) for t, x in zip(responses, w_arr, strict=True))),
        })
    truncated = getattr(rewriter, "truncated", None)
    if truncated is not None:
        failures["rewrites_cut_at_max_tokens"] = int(truncated)

    r0 = np.asarray(scorer(list(prompts), list(responses)), dtype=np.float64)
    r1 = np.asarray(scorer(list(prompts), rewrite), dtype=np.float64)
    r2 = np.asarray(scorer(list(prompts), rewrite2), dtype=np.float64)
    use = ok if cfg.drop_failed else np.ones(n, dtype=bool)
    if cfg.drop_failed:
        failures["left_out_of_estimates"] = int((~ok).sum())
        if w_arr[use].sum() < 2 or (1 - w_arr[use]).sum() < 2:
            raise UserError("after leaving out the failed rewrites fewer than two units remain on one side")
    effects = estimators.all_effects(r0[use], r1[use], r2[use], w_arr[use], cfg.confidence,
                                     paired_se=cfg.paired_se)
    result: dict[str, Any] = {
        "method": "rate", "attribute": cfg.attribute, "rewriter": getattr(rewriter, "name", type(rewriter).__name__),
        "units": n, "units_used": int(use.sum()), "w1": int(w_arr[use].sum()), "w0": int((1 - w_arr[use]).sum()),
        "config": asdict(cfg), "failures": failures, "effects": effects,
        "rewrite_effect": {  # the official diagnostic: R(rewritten rewrite) − R(original), by group
            "w1": estimators.paired((r2 - r0)[use & (w_arr == 1)], cfg.confidence).to_json(),
            "w0": estimators.paired((r2 - r0)[use & (w_arr == 0)], cfg.confidence).to_json(),
        },
    }
    if keep_texts:
        result["units_detail"] = [
            {"id": ids[i], "w": int(w_arr[i]), "original": responses[i], "rewrite": rewrite[i], "rewrite_of_rewrite": rewrite2[i],
             "reward": [float(r0[i]), float(r1[i]), float(r2[i])], "rewrites_flipped": bool(ok[i])}
            for i in range(n)
        ]
    return result
