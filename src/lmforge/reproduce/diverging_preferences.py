"""``lmforge reproduce diverging-preferences``: distributional reward models know when annotators disagree.

Zhang et al., "Diverging Preferences: When do Annotators Disagree and do Models Know?" (ICML 2025,
arXiv 2410.14632): Bradley–Terry reward models give diverging pairs the same confident margins as
high-agreement pairs (Diverging-ID AUROC ≈ 0.46–0.49, below chance), while the mean-variance model
trained with a KL loss to the annotators' label histogram identifies them (0.58–0.62, about +0.10 to
+0.16) at equal preference accuracy; LLM judges pick a winner on diverging pairs as often as on
high-agreement ones.

Here, in miniature: four simulated annotator groups agree on a response's quality and disagree on
its style (each style axis is loved by one group and disliked by another; :func:`simulate_pairs`).
Small MLP reward models on the responses' features are trained with every head of the paper —
BT on aggregated labels, BT on all labels, mean-variance with the NLL loss (distributional
preference learning), mean-variance with the KL loss (the paper's), and the classification head on
per-response ratings — over several seeds, and scored on held-out pairs. A scripted judge that
shares one group's taste plays the LLM judge, and the mean-variance model's σ filters the pairs.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from lmforge.reproduce.base import (ClaimResult, Figure, ReproduceOptions, Table, figure, register_reproduction,
                                   save_figure)

NAME = "diverging-preferences"
TITLE = "Diverging Preferences: When do Annotators Disagree and do Models Know? (Zhang et al., ICML 2025)"
# The verdict, fixed before any run: the KL mean-variance model's Diverging-ID AUROC is at least
# GAIN above BT (aggregated) and its preference accuracy within ACC_TOL of BT's (seed means).
GAIN = 0.10
ACC_TOL = 0.02
MODELS = {  # name -> DivergingPrefsConfig keywords
    "BT (agg)": {"head": "bt", "bt_target": "agg"},
    "BT (all)": {"head": "bt", "bt_target": "all"},
    "Mean-Var (NLL)": {"head": "meanvar", "meanvar_loss": "nll"},
    "Mean-Var (KL)": {"head": "meanvar", "meanvar_loss": "kl"},
    "Classification (KL)": {"head": "class"},
}
# Table 3 of the paper as reported by a secondary summary (preference accuracy, Diverging-ID AUROC);
# NOTE: not read from the PDF itself.
PAPER = {
    "MultiPref: BT (agg) acc / AUROC": "0.663 / 0.458",
    "MultiPref: BT (all) acc / AUROC": "0.648 / 0.438",
    "MultiPref: Mean-Var (KL) acc / AUROC": "0.664 / 0.615",
    "HelpSteer2: BT (agg) acc / AUROC": "0.683 / 0.482",
    "HelpSteer2: Mean-Var (KL) acc / AUROC": "0.684 / 0.582",
    "HelpSteer2: Classification (KL) acc / AUROC": "0.659 / 0.648",
    "Diverging-ID AUROC gain of Mean-Var (KL) over BT": "+0.10 (HelpSteer2) to +0.16 (MultiPref), accuracy unchanged",
    "LLM judge picks a winner (MultiPref): high-agreement / diverging": "73.1% / 73.8%",
    "setting": "Llama-3-8B-Instruct reward models on MultiPref (10k pairs x 4 annotators) and HelpSteer2 (12k x 3-5)",
}


def _judge_responder(by_prompt: dict[str, Any]):  # noqa: ANN202
    """A judge with group 0's taste (it loves style axis 0), answering in the MT-Bench format."""
    import re

    def respond(messages: list[dict[str, str]]) -> str:
        m = re.search(r"\[User Question\]\n(.*?)\n", messages[-1]["content"])
        pair = by_prompt[m.group(1)]
        ua = pair.features_a[0] + 1.5 * pair.features_a[1]
        ub = pair.features_b[0] + 1.5 * pair.features_b[1]
        return "[[A]]" if ua - ub > 0.5 else "[[B]]" if ub - ua > 0.5 else "[[C]]"

    return respond


def _plot(path: Path, rows: dict[str, dict[str, list[float]]]) -> Path:
    names = list(rows)
    fig, axes = figure(1, 2, figsize=(9, 3.4))
    for ax, key, title in ((axes[0], "acc", "preference accuracy (high-agreement pairs)"),
                           (axes[1], "auroc", "Diverging-ID AUROC")):
        means = [statistics.mean(rows[n][key]) for n in names]
        errs = [statistics.pstdev(rows[n][key]) for n in names]
        ax.bar(range(len(names)), means, yerr=errs, color=["#888", "#aaa", "#9cf", "#36c", "#c63"])
        ax.set_xticks(range(len(names)), [n.replace(" (", "\n(") for n in names], fontsize=7)
        ax.set_title(title, fontsize=9)
        if key == "auroc":
            ax.axhline(0.5, color="k", lw=0.6, ls="--")
            ax.set_ylim(0.3, 1.0)
        else:
            ax.set_ylim(0.5, 1.0)
    return save_figure(fig, path)


@register_reproduction(NAME, title=TITLE,
                       summary="BT vs mean-variance (KL) reward heads on four simulated annotator groups: "
                               "equal accuracy, higher Diverging-ID AUROC; a judge filter")
def run(opts: ReproduceOptions) -> ClaimResult:
    import torch

    from lmforge.methods.diverging_prefs.config import DivergingPrefsConfig
    from lmforge.methods.diverging_prefs.core import DIVERGING, pair_kind
    from lmforge.methods.diverging_prefs.data import simulate_pairs
    from lmforge.methods.diverging_prefs.heads import make_model
    from lmforge.methods.diverging_prefs.judge import filter_diverging, judge_pairs, judge_report
    from lmforge.methods.diverging_prefs.train import divergence_scores, evaluate, predict, train_reward_model
    from lmforge.methods.minions.clients import ScriptedClient

    torch.set_num_threads(1)
    start = time.perf_counter()
    seeds = [opts.seed] if opts.quick else [opts.seed + i for i in range(3)]
    n_train, n_dev, n_test = (1200, 300, 600) if opts.quick else (3000, 600, 1500)
    epochs = 15 if opts.quick else 30
    rows: dict[str, dict[str, list[float]]] = {n: {"acc": [], "auroc": [], "sub": []} for n in MODELS}
    judge_stats: dict[str, Any] = {}
    bt_tuned: dict[str, list[Any]] = {"auroc": [], "tau": []}
    data_stats: dict[str, Any] = {}
    for si, seed in enumerate(seeds):
        train = simulate_pairs(n_train, seed=1000 * seed + 1)
        dev = simulate_pairs(n_dev, seed=1000 * seed + 2)
        test = simulate_pairs(n_test, seed=1000 * seed + 3)
        mv_model = mv_cfg = mv_lambda = None
        for name, kw in MODELS.items():
            cfg = DivergingPrefsConfig(epochs=epochs, seed=seed, **kw)
            model = make_model(cfg, in_dim=len(train[0].features_a))
            train_reward_model(model, train, cfg)
            res = evaluate(model, test, cfg, dev_pairs=dev)
            rows[name]["acc"].append(res["preference_accuracy"])
            rows[name]["auroc"].append(res["diverging_id_auroc"])
            if name == "BT (agg)":
                # the same model with its score tuned on the dev pairs, as λ is for mean-variance
                tuned = evaluate(model, test, cfg, dev_pairs=dev, tune_bt=True)
                bt_tuned["auroc"].append(tuned["diverging_id_auroc"])
                bt_tuned["tau"].append(tuned["bt_tau"])
            if "substantial_diverging_id_auroc" in res:  # absent: no substantially diverging test pair
                rows[name]["sub"].append(res["substantial_diverging_id_auroc"])
            if name == "Mean-Var (KL)":
                mv_model, mv_cfg, mv_lambda = model, cfg, res["lambda"]
            if si == 0:
                data_stats = {k: res[k] for k in ("pairs", "diverging", "high_agreement", "ties")}
        if si == 0:
            # The judge experiment on the first seed's test pairs.
            by_prompt = {p.prompt: p for p in test}
            verdicts = judge_pairs(ScriptedClient(_judge_responder(by_prompt)), test)
            oa, ob = predict(mv_model, test, mv_cfg)
            div = divergence_scores(oa, ob, mv_cfg, mv_lambda)
            # the share of diverging pairs to drop, from the dev split (the test labels stay unseen)
            frac_div = sum(pair_kind(p.labels) == DIVERGING for p in dev) / len(dev)
            kept, _ = filter_diverging(test, div, drop_fraction=round(frac_div, 2))
            judge_stats = judge_report(verdicts, test, kept)

    def m(name: str, key: str) -> float:
        return statistics.mean(rows[name][key])

    gain = m("Mean-Var (KL)", "auroc") - m("BT (agg)", "auroc")
    acc_gap = m("Mean-Var (KL)", "acc") - m("BT (agg)", "acc")
    held = bool(gain >= GAIN and abs(acc_gap) <= ACC_TOL)
    # Reported beside the verdict, not part of it (the condition was fixed against the paper's BT score):
    # the gain over BT whose divergence score is tuned on the dev pairs like the mean-variance λ.
    gain_tuned = m("Mean-Var (KL)", "auroc") - statistics.mean(bt_tuned["auroc"])

    def sub(name: str) -> float | str:
        # An AUROC needs both classes: a test split without a substantially diverging pair has none
        # (it was NaN once; results files hold strict JSON).
        vals = rows[name]["sub"]
        return round(statistics.mean(vals), 3) if vals else "n/a (no substantially diverging test pair)"

    table_rows = [[n, round(m(n, "acc"), 3), round(m(n, "auroc"), 3), sub(n),
                   ", ".join(f"{v:.3f}" for v in rows[n]["auroc"])] for n in MODELS]
    table_rows.insert(1, ["BT (agg), score tuned on dev (-| |Δr| - τ |)", round(m("BT (agg)", "acc"), 3),
                          round(statistics.mean(bt_tuned["auroc"]), 3), "",
                          ", ".join(f"{v:.3f}" for v in bt_tuned["auroc"])])
    a, f, d = judge_stats["all"], judge_stats["filtered"], judge_stats["dropped"]
    judge_rows = [
        ["all test pairs", a["pairs"], _pct(a["picks_winner_on_high_agreement"]), _pct(a["picks_winner_on_diverging"]),
         _pct(a["agreement_with_majority_on_high_agreement"])],
        [f"after dropping the {d['pairs']} highest-divergence pairs (Mean-Var KL)", f["pairs"],
         _pct(f["picks_winner_on_high_agreement"]), _pct(f["picks_winner_on_diverging"]),
         _pct(f["agreement_with_majority_on_high_agreement"])],
    ]
    measured: dict[str, Any] = {
        "Diverging-ID AUROC: BT (agg) / Mean-Var (KL)": f"{m('BT (agg)', 'auroc'):.3f} / {m('Mean-Var (KL)', 'auroc'):.3f}",
        "Diverging-ID AUROC gain of Mean-Var (KL) over BT (agg)": round(gain, 3),
        "Diverging-ID AUROC gain over BT (agg) with its score tuned on dev (not the verdict)": round(gain_tuned, 3),
        "BT score's tuned tau per seed (0 = the paper's -|Δr|)": [
            t if isinstance(t, str) else round(t, 3) for t in bt_tuned["tau"]],
        "preference accuracy: BT (agg) / Mean-Var (KL)": f"{m('BT (agg)', 'acc'):.3f} / {m('Mean-Var (KL)', 'acc'):.3f}",
        "preference accuracy gap (Mean-Var KL - BT agg)": round(acc_gap, 4),
        "judge picks a winner: high-agreement / diverging": f"{_pct(a['picks_winner_on_high_agreement'])} / "
                                                            f"{_pct(a['picks_winner_on_diverging'])}",
        "filter: diverging pairs among those dropped": f"{d['diverging']} of {d['pairs']}",
        "seeds": len(seeds),
    }
    fig = _plot(opts.out_dir / "diverging-preferences.png", rows)
    notes = [
        f"Held means: Mean-Var (KL) Diverging-ID AUROC at least {GAIN} above BT (agg) and preference accuracy within "
        f"{ACC_TOL} of it (means over {len(seeds)} seed(s)); fixed before running.",
        "Data: simulated, not MultiPref/HelpSteer2 (no network here; `lmforge reward train --data` reads both). Four "
        "annotator groups share a quality utility; two style axes are each loved by one group and disliked by "
        "another, so pairs with distinct styles split the groups. One annotator per group labels each pair on the "
        f"paper's 5-point scale (cut at 0.5 and 1.5). Test split: {data_stats.get('pairs')} pairs, "
        f"{data_stats.get('diverging')} diverging, {data_stats.get('high_agreement')} high-agreement.",
        f"Models: 2-layer MLPs (64 units) on the responses' features, not Llama-3-8B; {n_train} training pairs, "
        f"{epochs} epochs of Adam. λ of the mean-variance divergence score λ(σ_A+σ_B) − |μ_A−μ_B| is fitted on "
        f"{n_dev} dev pairs.",
        "BT's AUROC is above 0.5 here (the paper: below 0.5): in the simulation a small quality gap itself makes a "
        "split more likely, which −|margin| picks up; what the claim is about, the gain of the distributional "
        "model at equal accuracy, is measured against it.",
        f"Mean-Var (NLL) (distributional preference learning, the paper's weaker distributional baseline) reaches "
        f"{m('Mean-Var (NLL)', 'auroc'):.3f} here against {m('Mean-Var (KL)', 'auroc'):.3f} for the KL model: with one "
        "annotator per group on every pair, the soft binary target already carries the split; the paper's gap "
        "between the two does not show in this simulation.",
        "BT tuned: the paper scores BT models with -|Δr| and tunes nothing for them, while the mean-variance "
        "score's λ is fitted on dev pairs. For a like-for-like comparison the BT (agg) model is also scored with "
        "-| |Δr| - τ |, τ fitted on the same dev pairs from 0 (the paper's score), the dev gaps' quantiles and ∞ "
        "(+|Δr|); its AUROC is reported beside the verdict, which stays the one fixed before the run.",
        "The judge filter drops the share of pairs that are diverging in the dev split (it used the test "
        "split's share before, a peek at the test labels).",
        "The judge is scripted (it has one annotator group's taste) — a stand-in for GPT-4-class judges; the "
        "paper's point that judges pick winners on diverging pairs is built into it, and the table shows what the "
        "filter removes.",
        "Paper numbers are from a secondary summary of the paper's Table 3 (the PDF was not available here); cut "
        "points (0.5, 1.5), the ρ term (0 here) and the divergence score's form are likewise unverified.",
    ]
    if opts.quick:
        notes.append("Quick mode: one seed, 1200 training pairs, 15 epochs.")
    return ClaimResult(
        name=NAME, title=TITLE,
        claim=("A mean-variance reward model trained with a KL loss to the annotators' label distribution identifies "
               "diverging preference pairs (Diverging-ID AUROC about +0.10 over Bradley-Terry) at equal preference "
               "accuracy."),
        paper=PAPER, measured=measured, held=held,
        tables=[
            Table("Reward heads on simulated annotator groups (means over seeds; the last column per seed)",
                  ["model", "preference accuracy", "Diverging-ID AUROC", "substantial Diverging-ID AUROC",
                   "AUROC per seed"], table_rows),
            Table("A judge with one group's taste, before and after the divergence filter (first seed)",
                  ["pairs judged", "n", "picks a winner: high-agreement", "picks a winner: diverging",
                   "agrees with the majority (high-agreement)"], judge_rows),
        ],
        figures=[Figure(str(fig), "Preference accuracy and Diverging-ID AUROC per reward head (mean ± sd over seeds).")],
        notes=notes, seconds=time.perf_counter() - start,
    )


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"
