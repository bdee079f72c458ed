"""Train a BT / mean-variance / classification reward head on per-annotator labels, and evaluate it.

Zhang et al. (ICML 2025, arXiv 2410.14632), Section 4: reward models trained on the aggregated or on
all annotator labels (Bradley–Terry), the mean-variance model with the KL loss (theirs) or the NLL
loss (distributional preference learning), and the classification model; evaluated by preference
accuracy on high-agreement pairs and Diverging-ID AUROC (diverging vs high-agreement pairs).

A plain Adam loop over index batches: TRL's ``RewardTrainer`` fixes the BT loss and a
chosen/rejected collator, and the paper's targets are label histograms, so the loop is written
here; it runs the same for an MLP on features and for an HF body on texts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from lmforge.common.errors import UserError
from lmforge.methods.diverging_prefs import core
from lmforge.methods.diverging_prefs.config import DivergingPrefsConfig
from lmforge.methods.diverging_prefs.data import PreferencePair
from lmforge.methods.diverging_prefs.heads import MLPRewardModel, RewardOutputs, format_text, head_outputs, to_outputs


def _inputs(model: nn.Module, pairs: Sequence[PreferencePair]) -> tuple[Any, Any]:
    """(inputs of A, inputs of B): feature tensors for an MLP, texts for an HF body."""
    if isinstance(model, MLPRewardModel):
        if any(p.features_a is None or p.features_b is None for p in pairs):
            raise UserError("an MLP reward model needs features_a / features_b on every pair")
        fa = torch.tensor([p.features_a for p in pairs], dtype=torch.float32)
        fb = torch.tensor([p.features_b for p in pairs], dtype=torch.float32)
        return fa, fb
    tok = model.tokenizer
    return ([format_text(tok, p.prompt, p.response_a) for p in pairs],
            [format_text(tok, p.prompt, p.response_b) for p in pairs])


def _take(inputs: Any, idx: np.ndarray) -> Any:
    if isinstance(inputs, torch.Tensor):
        return inputs[torch.as_tensor(idx)]
    return [inputs[i] for i in idx]


def _rating_hist(ratings: list[int] | None, k: int, pair_id: str) -> np.ndarray:
    if not ratings:
        raise UserError(f"pair '{pair_id}' has no per-response ratings; the classification head needs ratings_a/ratings_b")
    h = np.zeros(k)
    for r in ratings:
        if not 1 <= r <= k:
            raise UserError(f"pair '{pair_id}': rating {r} outside 1..{k}")
        h[r - 1] += 1
    return h / h.sum()


def training_targets(pairs: Sequence[PreferencePair], cfg: DivergingPrefsConfig) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The pairs a head trains on (indices) and their targets, by the head's loss.

    BT (agg): 1 if the majority prefers A else 0, pairs without a majority dropped; BT (all) and
    mean-variance NLL: the fraction of non-tie labels preferring A, all-tie pairs dropped;
    mean-variance KL: the label histogram (every pair, ties included); classification: each
    response's rating histogram.
    """
    labels = [p.labels for p in pairs]
    if cfg.head == "meanvar" and cfg.meanvar_loss == "kl":
        return np.arange(len(pairs)), {"hist": core.label_histogram(labels)}
    if cfg.head == "class":
        ha = np.stack([_rating_hist(p.ratings_a, cfg.num_ratings, p.id) for p in pairs])
        hb = np.stack([_rating_hist(p.ratings_b, cfg.num_ratings, p.id) for p in pairs])
        return np.arange(len(pairs)), {"hist_a": ha, "hist_b": hb}
    if cfg.head == "bt" and cfg.bt_target == "agg":
        sides = np.array([core.majority_side(ls) for ls in labels])
        keep = np.flatnonzero(sides != 0)
        return keep, {"target": (sides[keep] > 0).astype(np.float64)}
    soft = [core.soft_preference(ls) for ls in labels]
    keep = np.array([i for i, s in enumerate(soft) if s is not None], dtype=np.int64)
    return keep, {"target": np.array([soft[i] for i in keep], dtype=np.float64)}


def pair_loss(raw_a: torch.Tensor, raw_b: torch.Tensor, targets: dict[str, torch.Tensor],
              cfg: DivergingPrefsConfig) -> torch.Tensor:
    """The head's loss on a batch of raw outputs (n, out_dim) of A and of B."""
    oa, ob = head_outputs(raw_a, cfg), head_outputs(raw_b, cfg)
    if cfg.head == "bt":
        return core.bt_loss(oa["reward"], ob["reward"], targets["target"])
    if cfg.head == "meanvar":
        if cfg.meanvar_loss == "kl":
            return core.meanvar_kl_loss(oa["reward"], oa["sigma"], ob["reward"], ob["sigma"], targets["hist"],
                                        cfg.cuts, cfg.rho)
        return core.meanvar_nll_loss(oa["reward"], oa["sigma"], ob["reward"], ob["sigma"], targets["target"], cfg.rho)
    return 0.5 * (core.class_kl_loss(oa["logits"], targets["hist_a"]) + core.class_kl_loss(ob["logits"], targets["hist_b"]))


def train_reward_model(model: nn.Module, pairs: Sequence[PreferencePair], cfg: DivergingPrefsConfig,
                       progress: bool = False) -> list[float]:
    """Train ``model`` in place on ``pairs``; returns the mean loss of each epoch."""
    keep, targets_np = training_targets(pairs, cfg)
    if len(keep) == 0:
        raise UserError("no training pairs carry a usable label for this head")
    inputs_a, inputs_b = _inputs(model, [pairs[i] for i in keep])
    targets = {k: torch.tensor(v, dtype=torch.float32) for k, v in targets_np.items()}
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=cfg.lr, weight_decay=cfg.weight_decay)
    gen = np.random.default_rng(cfg.seed)
    history = []
    model.train()
    epochs = range(cfg.epochs)
    if progress:
        from lmforge.common.progress import track

        epochs = track(epochs, description=f"train {cfg.head}", total=cfg.epochs)
    n = len(keep)
    for _ in epochs:
        order = gen.permutation(n)
        total = 0.0
        for start in range(0, n, cfg.batch_size):
            idx = order[start : start + cfg.batch_size]
            raw_a = model.score(_take(inputs_a, idx))
            raw_b = model.score(_take(inputs_b, idx))
            loss = pair_loss(raw_a, raw_b, {k: v[torch.as_tensor(idx)] for k, v in targets.items()}, cfg)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
        history.append(total / n)
    model.eval()
    return history


@torch.no_grad()
def predict(model: nn.Module, pairs: Sequence[PreferencePair], cfg: DivergingPrefsConfig,
            batch_size: int = 64) -> tuple[RewardOutputs, RewardOutputs]:
    """The model's outputs on every pair's A and B responses."""
    model.eval()
    inputs_a, inputs_b = _inputs(model, pairs)
    outs = []
    for inputs in (inputs_a, inputs_b):
        raws = [model.score(_take(inputs, np.arange(s, min(s + batch_size, len(pairs)))))
                for s in range(0, len(pairs), batch_size)]
        outs.append(to_outputs(torch.cat(raws), cfg))
    return outs[0], outs[1]


def divergence_scores(out_a: RewardOutputs, out_b: RewardOutputs, cfg: DivergingPrefsConfig,
                      lam: float | None = None, bt_tau: float | None = None) -> np.ndarray:
    """The head's divergence score per pair (higher = more likely diverging): −|Δr| for BT (with
    ``bt_tau``: the tuned −| |Δr| − τ |), λ(σ_A + σ_B) − |Δμ| for mean-variance, extreme-rating mass
    for classification."""
    if cfg.head == "meanvar":
        if lam is None:
            raise ValueError("a mean-variance divergence score needs lambda")
        return core.meanvar_divergence(out_a.reward, out_b.reward, out_a.sigma, out_b.sigma, lam)
    if cfg.head == "class":
        return core.class_divergence(out_a.probs, out_b.probs)
    if bt_tau is not None:
        return core.bt_divergence_tuned(out_a.reward, out_b.reward, bt_tau)
    return core.bt_divergence(out_a.reward, out_b.reward)


def evaluate(model: nn.Module, pairs: Sequence[PreferencePair], cfg: DivergingPrefsConfig,
             dev_pairs: Sequence[PreferencePair] | None = None, lam: float | None = None,
             tune_bt: bool = False) -> dict[str, Any]:
    """Preference accuracy (high-agreement pairs) and Diverging-ID AUROC (all and substantial).

    For mean-variance heads λ is ``lam`` if given, else fitted on ``dev_pairs`` (:func:`core.fit_lambda`),
    else σ alone (λ = ∞) is used; the fitted value is reported. For BT heads the score is the paper's
    −|Δr|; with ``tune_bt`` and ``dev_pairs`` it is the tuned −| |Δr| − τ | with τ fitted on them
    (:func:`core.fit_bt_tau`), reported as ``bt_tau``.
    """
    out_a, out_b = predict(model, pairs, cfg)
    labels = [p.labels for p in pairs]
    bt_tau = None
    if dev_pairs and ((cfg.head == "meanvar" and lam is None) or (cfg.head == "bt" and tune_bt)):
        da, db = predict(model, dev_pairs, cfg)
        dev_labels = [p.labels for p in dev_pairs]
        if cfg.head == "meanvar":
            lam = core.fit_lambda(da.reward, db.reward, da.sigma, db.sigma, dev_labels)
        elif tune_bt:
            bt_tau = core.fit_bt_tau(da.reward, db.reward, dev_labels)
    if cfg.head == "meanvar" and lam is None:
        lam = math.inf
    div = divergence_scores(out_a, out_b, cfg, lam, bt_tau)
    kinds = [core.pair_kind(ls) for ls in labels]
    result: dict[str, Any] = {
        "head": cfg.head,
        "pairs": len(pairs),
        "diverging": kinds.count(core.DIVERGING),
        "high_agreement": kinds.count(core.HIGH_AGREEMENT),
        "ties": kinds.count(core.TIE),
        "preference_accuracy": core.preference_accuracy(out_a.reward - out_b.reward, labels),
        "diverging_id_auroc": core.diverging_id_auroc(div, labels),
    }
    if any(core.is_substantially_diverging(ls) for ls in labels):
        result["substantial_diverging_id_auroc"] = core.diverging_id_auroc(div, labels, substantial=True)
    if cfg.head == "meanvar":
        # JSON has no infinity: lambda = inf (sigma alone) is written as the string "inf", which
        # `--lambda inf` and float() read back.
        result["lambda"] = "inf" if lam is not None and math.isinf(lam) else lam
    if bt_tau is not None:
        result["bt_tau"] = "inf" if math.isinf(bt_tau) else bt_tau
    return result
