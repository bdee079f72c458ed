"""``lmforge reproduce rate``: rewriting twice removes the rewrite's own bias from attribute effects.

Reber, Richardson, Nief, Garbacea, Veitch, "RATE: Causal Explainability of Reward Models with
Imperfect Counterfactuals" (ICML 2025, arXiv 2410.11348). The paper's semi-synthetic IMDB study
subsamples reviews so that P(long | positive) grows from 0.5 to 1.0: the naive estimate of the
sentiment effect drifts with the length confound, the single-rewrite estimate carries the LLM
rewrite's own artifacts, and RATE (which compares a rewrite with a rewrite of the rewrite) stays flat.

Two miniatures, both with a rewriter that leaves an artifact in everything it touches:

1. The synthetic task of :mod:`lmforge.methods.rate.synthetic` (reward a·w + b·l + c·art + content
   + rewrite noise, known effect a), with P(l | w=1) swept from 0.5 to 1.0 as in the paper, over many
   seeds: bias, spread, and the coverage of RATE's 95% intervals.
2. Real texts and a learned reward model: short movie reviews (sentiment words, an optional length
   sentence correlated with sentiment), a scikit-learn logistic-regression reward model trained on
   simulated ratings of reviews of which some were LLM-written (they open with "Certainly!"), and a
   rule rewriter (lmforge's built-in sentiment rule) that adds "Certainly!" and a random filler word.
   The true effect is exact here: the reward of the same review with only its sentiment words swapped.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from lmforge.reproduce.base import (ClaimResult, Figure, ReproduceOptions, Table, figure, register_reproduction,
                                   save_figure)

NAME = "rate"
TITLE = "RATE: Causal Explainability of Reward Models with Imperfect Counterfactuals (Reber et al., ICML 2025)"
# The verdict, fixed before any run: across the sweep RATE's mean ATE stays within TOL of the true
# effect at every correlation while the naive estimate moves by more than DRIFT; its 95% intervals
# cover the truth as often as 95% intervals should (a two-sided binomial test of the number of seeds
# covered against 0.95 does not reject at the 1% level); the single-rewrite ATT and ATU are off by the
# artifact (each more than TOL from the truth, on opposite sides); and on the text task RATE's ATT is
# closer to the true ATT than the single-rewrite ATT.
TOL = 0.05
DRIFT = 0.5
COVER_ALPHA = 0.01
PAPER = {
    "semi-synthetic IMDB, P(long | positive) 0.5 -> 1.0": "naive sentiment effect drifts with the length confound; "
                                                          "single rewrite biased by rewrite artifacts; RATE flat",
    "reward models": "ArmoRM-8B, FsfairX-LLaMA3-RM, NCSOFT OffsetBias-RM-8B; rewrites by gpt-4o-2024-08-06 at T = 0.7",
    "theory": "RATE is sqrt(n)-consistent when rewrites flip W and add the same artifact effect in both directions",
}

POS_SENT = ["I loved this film and the acting was great.", "A wonderful story with a brilliant cast.",
            "The best movie this year, fun and beautiful."]
NEG_SENT = ["I hated this film and the acting was terrible.", "A horrible story with a dull cast.",
            "The worst movie this year, boring and ugly."]
TOPICS = ["The plot follows a family in a small town.", "It is set on a ship during a storm.",
          "The director adapts a famous novel.", "Most scenes take place in one old house."]
LONG = "It runs for over two hours and has many long scenes."
ARTIFACT = "Certainly!"
FILLERS = ["really", "truly", "honestly", "quite"]


def _review(rng: np.random.Generator, w: int, long: int) -> str:
    parts = [str(rng.choice(TOPICS)), str(rng.choice(POS_SENT if w else NEG_SENT))]
    if long:
        parts.append(LONG)
    return " ".join(parts)


def _text_reward_model(seed: int, n: int = 4000) -> Any:
    """Logistic regression on word counts, fit to simulated ratings: sentiment, length and the
    'LLM-written' opener all raise the chance of a high rating."""
    from sklearn.feature_extraction.text import CountVectorizer
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(seed)
    texts, ys = [], []
    for _ in range(n):
        w, long, art = int(rng.random() < 0.5), int(rng.random() < 0.5), int(rng.random() < 0.3)
        t = _review(rng, w, long)
        if art:
            t = f"{ARTIFACT} {t}"
        logit = 2.0 * w + 1.5 * long + 1.5 * art - 2.0
        texts.append(t)
        ys.append(int(rng.random() < 1 / (1 + np.exp(-logit))))
    vec = CountVectorizer(lowercase=True, token_pattern=r"[A-Za-z!]+")
    clf = LogisticRegression(C=10.0, max_iter=2000).fit(vec.fit_transform(texts), ys)
    return lambda prompts, responses: clf.decision_function(vec.transform(list(responses)))


def _text_task(seed: int, n: int, p_long: float, scorer: Any) -> dict[str, Any]:
    from lmforge.methods.rate.apply import run_rate
    from lmforge.methods.rate.config import RateConfig
    from lmforge.methods.rate.rewriters import ProgrammaticRewriter, sentiment_rewrite, sentiment_w

    rng = np.random.default_rng(seed)
    w = (rng.random(n) < 0.5).astype(int)
    long = (rng.random(n) < np.where(w == 1, p_long, 1 - p_long)).astype(int)
    texts = [_review(rng, int(w[i]), int(long[i])) for i in range(n)]
    noise = np.random.default_rng(seed + 1)

    def llm_like(text: str, target: int) -> str:
        out = sentiment_rewrite(text, target)
        if not out.startswith(ARTIFACT):
            out = f"{ARTIFACT} {out}"
        words = out.split()
        if noise.random() < 0.5:  # an off-target change at random
            words.insert(int(noise.integers(1, len(words))), str(noise.choice(FILLERS)))
        return " ".join(words)

    cfg = RateConfig(attribute="sentiment", w1_string="positive sentiment", w0_string="negative sentiment")
    res = run_rate(["Write a movie review: "] * n, texts, w.tolist(), scorer, ProgrammaticRewriter(llm_like), cfg,
                   classifier=sentiment_w)
    # The exact effect: the same review with only its sentiment words swapped.
    r = scorer(None, texts)
    r_flip = scorer(None, [sentiment_rewrite(t, 1 - int(x)) for t, x in zip(texts, w, strict=True)])
    d = np.where(w == 1, r - r_flip, r_flip - r)
    res["true"] = {"ATE": float(d.mean()), "ATT": float(d[w == 1].mean()), "ATU": float(d[w == 0].mean())}
    return res


def _plot(path: Path, ps: list[float], curves: dict[str, list[float]], truth: float) -> Path:
    fig, ax = figure(figsize=(6, 3.6))
    for name, ys in curves.items():
        ax.plot(ps, ys, marker="o", label=name)
    ax.axhline(truth, color="k", ls="--", lw=0.8, label="true effect a")
    ax.set_xlabel("P(l = 1 | w = 1)  (the confound's strength)")
    ax.set_ylabel("estimated effect of w (mean over seeds)")
    ax.legend(fontsize=7)
    return save_figure(fig, path)


@register_reproduction(NAME, title=TITLE,
                       summary="naive, single-rewrite and RATE estimates under a growing confound, with a rewriter "
                               "that leaves an artifact; synthetic rewards and a logistic-regression reward model")
def run(opts: ReproduceOptions) -> ClaimResult:
    from lmforge.methods.rate import synthetic as S
    from lmforge.methods.rate.apply import run_rate
    from lmforge.methods.rate.config import RateConfig

    start = time.perf_counter()
    ps = [0.5, 0.75, 1.0] if opts.quick else [0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    n_seeds = 20 if opts.quick else 100
    n_units = 200 if opts.quick else 500
    from scipy.stats import binomtest

    sweep_rows = []
    curves: dict[str, list[float]] = {"naive": [], "single rewrite ATT": [], "single rewrite ATU": [], "RATE ATE": []}
    coverages, cover_p, paired_cov = [], [], []
    a = S.SyntheticRateTask().a
    for pi, p in enumerate(ps):
        task = S.SyntheticRateTask(p_l_given_w1=p)
        es, paired_es = [], []
        for s in range(n_seeds):
            seed = opts.seed * 100_003 + pi * 1000 + s  # fresh seeds per point: independent estimates
            pr, y, w = S.sample(task, n_units, seed)
            es.append(run_rate(pr, y, w, S.reward(task), S.rewriter(task, seed + 7), RateConfig(),
                               classifier=S.classifier)["effects"])
            # the same data with the paired-SE option, reported beside (the verdict uses the default)
            paired_es.append(run_rate(pr, y, w, S.reward(task), S.rewriter(task, seed + 7), RateConfig(paired_se=True),
                                      classifier=S.classifier)["effects"]["rate"]["ATE"])
        naive = [e["naive"]["value"] for e in es]
        s_att = [e["single_rewrite"]["ATT"]["value"] for e in es]
        s_atu = [e["single_rewrite"]["ATU"]["value"] for e in es]
        rate = [e["rate"]["ATE"]["value"] for e in es]
        covered = sum(e["rate"]["ATE"]["ci_low"] <= a <= e["rate"]["ATE"]["ci_high"] for e in es)
        coverages.append(covered / n_seeds)
        paired_cov.append(sum(e["ci_low"] <= a <= e["ci_high"] for e in paired_es) / n_seeds)
        cover_p.append(float(binomtest(covered, n_seeds, 0.95).pvalue))
        for k, v in zip(curves, (naive, s_att, s_atu, rate), strict=True):
            curves[k].append(statistics.mean(v))
        sweep_rows.append([p, round(task.naive_expected, 3), round(statistics.mean(naive), 3),
                           round(statistics.mean(s_att), 3), round(statistics.mean(s_atu), 3),
                           round(statistics.mean(rate), 3), round(statistics.pstdev(rate), 3),
                           f"{covered}/{n_seeds}", round(cover_p[-1], 3)])

    # The text task with a learned reward model.
    scorer = _text_reward_model(opts.seed)
    text_seeds = 5 if opts.quick else 20
    text_runs = [_text_task(opts.seed * 1009 + s, 300 if opts.quick else 600, 0.8, scorer) for s in range(text_seeds)]
    def tmean(f: Any) -> float:
        return statistics.mean(f(r) for r in text_runs)

    text_table = []
    for k in ("ATT", "ATU", "ATE"):
        text_table.append([k, round(tmean(lambda r, k=k: r["true"][k]), 3),
                           round(tmean(lambda r: r["effects"]["naive"]["value"]), 3),
                           round(tmean(lambda r, k=k: r["effects"]["single_rewrite"][k]["value"]), 3),
                           round(tmean(lambda r, k=k: r["effects"]["rate"][k]["value"]), 3)])
    t_true_att, _, t_single_att, t_rate_att = text_table[0][1], text_table[0][2], text_table[0][3], text_table[0][4]
    t_cover = sum(r["effects"]["rate"]["ATE"]["ci_low"] <= r["true"]["ATE"] <= r["effects"]["rate"]["ATE"]["ci_high"]
                  for r in text_runs)
    failed = sum(r["failures"]["units_with_a_failed_rewrite"] for r in text_runs)

    c = S.SyntheticRateTask().c
    rate_flat = all(abs(v - a) <= TOL for v in curves["RATE ATE"])
    naive_drift = curves["naive"][-1] - curves["naive"][0]
    cover_ok = all(pv >= COVER_ALPHA for pv in cover_p)
    single_biased = all(v < a - TOL for v in curves["single rewrite ATT"]) and all(v > a + TOL for v in curves["single rewrite ATU"])
    text_ok = abs(t_rate_att - t_true_att) < abs(t_single_att - t_true_att)
    held = bool(rate_flat and naive_drift > DRIFT and cover_ok and single_biased and text_ok)

    measured: dict[str, Any] = {
        "synthetic: true effect a": a,
        "synthetic: naive at P(l|w=1) = 0.5 / 1.0": f"{curves['naive'][0]:.3f} / {curves['naive'][-1]:.3f}",
        "synthetic: single-rewrite ATT / ATU (expected a - c / a + c)":
            f"{statistics.mean(curves['single rewrite ATT']):.3f} / {statistics.mean(curves['single rewrite ATU']):.3f} "
            f"({a - c:.1f} / {a + c:.1f})",
        "synthetic: RATE ATE range over the sweep": f"{min(curves['RATE ATE']):.3f} .. {max(curves['RATE ATE']):.3f}",
        "synthetic: RATE 95% CI coverage per point": [f"{100 * x:.0f}%" for x in coverages],
        "synthetic: the same with the paired-SE option": [f"{100 * x:.0f}%" for x in paired_cov],
        "synthetic: binomial p of the coverage vs 0.95, smallest": round(min(cover_p), 4),
        "text + logistic-regression RM, ATT: true / single rewrite / RATE": f"{t_true_att} / {t_single_att} / {t_rate_att}",
        "text: RATE 95% CI covers the true ATE": f"{t_cover} of {text_seeds} seeds",
        "text: units with a rewrite that did not flip sentiment": failed,
    }
    fig = _plot(opts.out_dir / "rate-sweep.png", ps, curves, a)
    notes = [
        f"Held means: RATE's mean ATE within {TOL} of the true effect at every point of the sweep; the naive estimate "
        f"moving by more than {DRIFT} across it; the number of seeds whose RATE 95% interval covers the truth "
        f"consistent with 95% at every point (two-sided binomial test, p >= {COVER_ALPHA}); the single-rewrite ATT "
        f"below and ATU above the truth by more than {TOL}; and on the text task RATE's ATT closer to the true ATT "
        "than the single-rewrite ATT. Fixed before running.",
        "With half the units at w = 1 the single-rewrite ATE is nearly unbiased (its ATT and ATU errors, -c and +c, "
        "cancel), so the single-rewrite bias is shown on ATT and ATU.",
        f"Synthetic sweep: {n_seeds} seeds x {n_units} units per point; reward a·w + b·l + c·art + q + z with a = 1, "
        "b = 2, c = 0.8, content q ~ N(0, 1), and each rewrite adding N(0, 0.5²) to z. The paper's reward models are "
        "8B LLM reward models and its rewriter is gpt-4o; here the rewriter is a rule whose artifact is known.",
        "Text task: reviews built from topic, sentiment and optional length sentences (P(long | positive) = 0.8); "
        "the reward model is scikit-learn logistic regression on word counts fit to 4000 simulated ratings in which "
        "'Certainly!'-opened (LLM-written) reviews rate higher. The rewriter swaps sentiment words (lmforge's "
        "built-in rule), opens with 'Certainly!' and half the time inserts a filler word; the true effect is the "
        "reward change from swapping only the sentiment words.",
        "Standard errors as the official code computes them: naive and RATE unpaired (Welch's), single-rewrite "
        "paired. Both RATE arms hold the same units, so the unpaired intervals are conservative: the coverage test "
        "reads them against 95% as written before the run, and the paired-SE option's coverage on the same data "
        "is reported beside it. (Before this change lmforge used paired SEs for every rewrite estimate; the "
        "verdict condition is unchanged.)",
    ]
    if opts.quick:
        notes.append(f"Quick mode: 3 sweep points, {n_seeds} seeds of {n_units} units, {text_seeds} text seeds.")
    return ClaimResult(
        name=NAME, title=TITLE,
        claim=("Estimating an attribute's effect on a reward from rewrites is biased by the rewriter's own artifacts; "
               "comparing a rewrite with a rewrite of the rewrite (RATE) removes that bias, and the naive estimate is "
               "confounded by correlated attributes."),
        paper=PAPER, measured=measured, held=held,
        tables=[
            Table("Synthetic sweep of the confound (means over seeds; true effect a = 1, artifact c = 0.8)",
                  ["P(l=1 | w=1)", "naive, expected", "naive", "single rewrite ATT", "single rewrite ATU", "RATE ATE",
                   "RATE ATE sd", "RATE 95% CI covers a", "binomial p vs 0.95"], sweep_rows),
            Table("Text reviews, logistic-regression reward model (means over seeds; naive is one number)",
                  ["effect", "true (sentiment words swapped only)", "naive", "single rewrite", "RATE"], text_table),
        ],
        figures=[Figure(str(fig), "Mean estimates of the effect of w as the confound grows; the dashed line is the "
                                  "true effect.")],
        notes=notes, seconds=time.perf_counter() - start,
    )
