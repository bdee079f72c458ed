"""``lmforge reproduce selfcite``: the SelfCite reward with SmolLM2-135M-Instruct as its own judge (tier A).

Setup, fixed before the verdict run:

* **Model.** SmolLM2-135M-Instruct (``real:smollm2-135m-instruct``) in bfloat16 (2.2× faster prefill on
  this CPU; the reward is a difference of mean log-probabilities, so bf16 rounding is far below the
  gaps it ranks), the official prompt in the model's chat template.
* **Documents.** ``N_DOCS`` documents of :mod:`lmforge.methods.selfcite.data`: 9 consecutive sentences
  of a held-out Paul Graham essay with 3 invented facts about one invented entity inserted apart;
  two statements per response, each fused (two facts, so one citation is not enough) with probability
  one half, else single.
* **Candidates.** Eight per statement (:func:`~lmforge.methods.selfcite.experiment.candidate_pool`):
  gold, the sentences before and after, a partial (one of a fused statement's two sentences), two
  random filler spans, gold widened by two sentences each side, and the whole document.
* **Reward.** The official one (:mod:`lmforge.methods.selfcite.reward`): mean statement-token
  log-probability with only the cited sentences minus with them removed, given the previous
  statements (with their gold citations); the 384-token penalty is on (no candidate reaches it here:
  the documents are about 300 tokens).

Conditions (the issue's, fixed before the run; ``held`` needs both):

* **AUROC** of gold over the seven other candidates, pairwise within a statement, ≥ 0.8;
* **best-of-8 − first-sample citation F1 ≥ 0.15**: the eight candidates in a seeded random order stand
  for eight samples; F1 is the gold-set citation F1 of :mod:`lmforge.methods.selfcite.metrics`, per
  response, averaged.

The pilot that chose the document size ran at seed 100 on 6 documents (AUROC 0.87); the verdict runs
at ``--seed`` (0 by default).

Tier B, the whole loop (:func:`lmforge.methods.selfcite.toy.run_tier_b`, about 3.5 min): a 0.6M
Llama trained here from scratch writes the format after SFT on 30%-noisy citations; best-of-N on its
own reward gives the chosen responses; SimPO (LoRA) trains one arm on balanced pairs and one on raw
pairs. Its condition, fixed before the verdict seed was run (``TIER_B_CONDITIONS``): greedy citation
F1 of SimPO-balanced − SFT ≥ 0.05; the inflation of cited sentences without balancing is reported.
(Tier B was added to this reproduction after tier A's verdict run; tier A's code and conditions did
not change.)

The reproduction holds when both tiers hold.
"""

from __future__ import annotations

import random
import time
from typing import Any

from lmforge.reproduce.base import ClaimResult, Figure, ReproduceOptions, Table, figure, register_reproduction, save_figure

TITLE = "SelfCite: Self-Supervised Alignment for Context Attribution in Large Language Models (Chuang et al., ICML 2025)"
REAL_MODEL = "real:smollm2-135m-instruct"
N_DOCS = 40
N_DOCS_QUICK = 2
N_STATEMENTS = 2
FUSED_SHARE = 0.5
AUROC_MIN = 0.8
BON_GAIN_MIN = 0.15
N_BON = 8
PAPER = {"LongBench-Cite citation F1, LongCite-8B": 73.8, "+ best-of-N and SimPO": 79.1,
         "best-of-N alone (README reproduction)": 78.2}


def tier_a(model: Any, tok: Any, n_docs: int, seed: int, *, batch_size: int = 8,
           progress: bool = False) -> dict[str, Any]:
    """Score every candidate of every statement; AUROC and best-of-8 vs first-sample F1."""
    from lmforge.methods.selfcite.data import make_docs
    from lmforge.methods.selfcite.experiment import (CANDIDATE_KINDS, by_kind, candidate_pool, gold_response,
                                                     pairwise_auroc)
    from lmforge.methods.selfcite.format import postprocess, split_sentences
    from lmforge.methods.selfcite.metrics import GoldStatement, score_dataset
    from lmforge.methods.selfcite.reward import RewardQuery, RewardSettings, citation_rewards, statement_segments

    docs = make_docs(n_docs, seed=seed, n_statements=N_STATEMENTS, fused_share=FUSED_SHARE)
    rng = random.Random(seed + 1)
    items: list[tuple[RewardQuery, str]] = []
    where: list[tuple[int, int, str]] = []
    pools: dict[tuple[int, int], list[Any]] = {}
    sents_of = []
    for d_i, doc in enumerate(docs):
        sents = split_sentences(doc.context)
        sents_of.append(sents)
        resp = gold_response(doc)
        for j, seg in enumerate(statement_segments(resp)):
            q = RewardQuery(sents, doc.question, resp[:seg.prefix_end], resp[seg.prefix_end:seg.cite_start])
            pool = candidate_pool(doc, j, len(sents), rng)
            pools[(d_i, j)] = pool
            for c in pool:
                items.append((q, c.text))
                where.append((d_i, j, c.kind))
    rewards = citation_rewards(model, tok, items, RewardSettings(batch_size=batch_size), progress=progress)
    rows: dict[tuple[int, int], dict[str, Any]] = {}
    for (d_i, j, kind), r in zip(where, rewards):
        row = rows.setdefault((d_i, j), {"doc": d_i, "statement": j, "kind": docs[d_i].statements[j].kind,
                                         "rewards": {}, "penalised": {}})
        row["rewards"][kind] = r.reward
        row["penalised"][kind] = r.penalised
    rows_list = list(rows.values())
    groups = [([r["rewards"]["gold"]], [v for k, v in r["rewards"].items() if k != "gold"]) for r in rows_list]
    auroc = pairwise_auroc(groups)
    per_kind = by_kind(rows_list)
    per_type = {}
    for sk in ("single", "fused"):
        sub = [g for g, r in zip(groups, rows_list) if r["kind"] == sk]
        per_type[sk] = pairwise_auroc(sub) if sub else None

    # best-of-8 vs first sample: per statement a seeded order of the eight candidates
    order_rng = random.Random(seed + 2)
    first_items, best_items = [], []
    picks = {"first": {k: 0 for k in CANDIDATE_KINDS}, "best": {k: 0 for k in CANDIDATE_KINDS}}
    for d_i, doc in enumerate(docs):
        gold = [GoldStatement(s.text, frozenset(s.support)) for s in doc.statements]
        first_resp, best_resp = "", ""
        for j, st in enumerate(doc.statements):
            pool = pools[(d_i, j)]
            sample = order_rng.sample(pool, N_BON)
            first = sample[0]
            best = max(sample, key=lambda c: rows[(d_i, j)]["rewards"][c.kind])
            picks["first"][first.kind] += 1
            picks["best"][best.kind] += 1
            first_resp += f"<statement>{st.text}<cite>{first.text}</cite></statement>"
            best_resp += f"<statement>{st.text}<cite>{best.text}</cite></statement>"
        first_items.append((postprocess(first_resp, sents_of[d_i]), gold))
        best_items.append((postprocess(best_resp, sents_of[d_i]), gold))
    f1_first = score_dataset(first_items)
    f1_best = score_dataset(best_items)
    gold_items = [(postprocess(gold_response(d), s), [GoldStatement(x.text, frozenset(x.support)) for x in d.statements])
                  for d, s in zip(docs, sents_of)]
    f1_gold = score_dataset(gold_items)
    return {"docs": docs, "rows": rows_list, "auroc": auroc, "auroc_by_kind": per_kind, "auroc_by_type": per_type,
            "f1_first": f1_first, "f1_best": f1_best, "f1_gold": f1_gold, "picks": picks,
            "n_candidates": len(items), "n_statements": len(rows_list)}


def verdict(auroc: float, f1_first: float, f1_best: float) -> dict[str, bool]:
    """The conditions fixed before the run."""
    a = auroc >= AUROC_MIN
    b = f1_best - f1_first >= BON_GAIN_MIN
    return {"auroc >= 0.8": a, "best-of-8 - first >= 0.15": b, "held": a and b}


@register_reproduction(
    "selfcite", title=TITLE,
    summary="A: SmolLM2-135M-Instruct scores 8 candidate citations per statement with the context-ablation reward "
            "(AUROC, best-of-8 vs first-sample F1); B: the whole loop (SFT on noisy citations, best-of-N, SimPO "
            "balanced vs raw) on a tiny model trained here",
)
def run(opts: ReproduceOptions) -> ClaimResult:
    import torch

    from lmforge.models.load import load

    start = time.perf_counter()
    n_docs = N_DOCS_QUICK if opts.quick else N_DOCS
    from lmforge.methods.selfcite.toy import run_tier_b

    model, tok = load(REAL_MODEL, dtype=torch.bfloat16)
    res = tier_a(model, tok, n_docs, opts.seed, progress=opts.progress)
    del model
    f1_first, f1_best = res["f1_first"]["f1"], res["f1_best"]["f1"]
    v = verdict(res["auroc"], f1_first, f1_best)
    b = run_tier_b(opts.seed, quick=opts.quick, progress=opts.progress)
    ev = b["eval"]
    measured = {
        "documents / statements / scored candidates": f"{n_docs} / {res['n_statements']} / {res['n_candidates']}",
        "AUROC gold vs the 7 others (within statement)": round(res["auroc"], 3),
        "AUROC single / fused statements": {k: (round(x, 3) if x is not None else None)
                                            for k, x in res["auroc_by_type"].items()},
        "citation F1 first sample / best-of-8 / gold": (f"{f1_first:.3f} / {f1_best:.3f} / "
                                                        f"{res['f1_gold']['f1']:.3f}"),
        "best-of-8 - first sample": round(f1_best - f1_first, 3),
        "conditions": {k: x for k, x in v.items() if k != "held"},
        "[tier B] greedy F1 SFT / SimPO-balanced / SimPO-unbalanced": (
            f"{ev['sft']['f1']:.3f} / {ev['balanced']['f1']:.3f} / {ev['unbalanced']['f1']:.3f}"),
        "[tier B] SimPO-balanced - SFT (>= 0.05)": round(b["f1_gain_balanced"], 3),
        "[tier B] cited sentences per statement SFT / balanced / unbalanced": (
            f"{ev['sft']['cited_per_statement']:.3f} / {ev['balanced']['cited_per_statement']:.3f} / "
            f"{ev['unbalanced']['cited_per_statement']:.3f}"),
        "[tier B] share of answers restating the facts correctly (SFT)": round(ev["sft"]["content_exact_share"], 3),
        "[tier B] preference pairs (chosen != original)": b["pairs"]["balanced"],
        "[tier B] conditions": b["verdict"],
        "tier A held / tier B held": f"{v['held']} / {b['verdict']['f1_gain >= 0.05']}",
    }
    held = v["held"] and b["verdict"]["f1_gain >= 0.05"]
    kinds = list(res["auroc_by_kind"])
    tables = [
        Table("AUROC of gold against each kind of candidate (within statement; 0.5 = a coin flip)",
              ["kind", "AUROC"], [[k, round(res["auroc_by_kind"][k], 3)] for k in kinds]),
        Table("Which candidate the first sample and the argmax reward picked (counts over statements)",
              ["kind", "first sample", "best-of-8"],
              [[k, res["picks"]["first"][k], res["picks"]["best"][k]] for k in res["picks"]["first"]]),
        Table("Citation recall / precision / F1 (gold-set judge)", ["responses", "recall", "precision", "F1"],
              [[name, round(s["recall"], 3), round(s["precision"], 3), round(s["f1"], 3)]
               for name, s in (("first sample", res["f1_first"]), ("best-of-8", res["f1_best"]),
                               ("gold citations", res["f1_gold"]))]),
        Table("[tier B] Greedy answers on held-out toy documents, and best-of-N against the original samples "
              "on the training documents", ["responses", "F1", "recall", "precision", "cited / statement",
                                            "content copied", "parseable"],
              [[name, round(e["f1"], 3), round(e["recall"], 3), round(e["precision"], 3),
                round(e["cited_per_statement"], 3), round(e["content_exact_share"], 3), round(e["parseable_share"], 3)]
               for name, e in (("SFT (greedy)", ev["sft"]), ("SimPO balanced (greedy)", ev["balanced"]),
                               ("SimPO unbalanced (greedy)", ev["unbalanced"]),
                               ("original samples (train docs)", b["bon_vs_original"]["original"]),
                               ("best-of-N (train docs)", b["bon_vs_original"]["bon"]))]),
    ]
    fig, ax = figure(figsize=(7, 3.6))
    data = [[r["rewards"][k] for r in res["rows"]] for k in ["gold", *kinds]]
    ax.boxplot(data, tick_labels=["gold", *kinds])
    ax.axhline(0.0, color="grey", lw=0.5)
    ax.set_ylabel("reward: log p(r|E) - log p(r|C\\E)")
    ax.set_title("SmolLM2-135M-Instruct as its own citation judge")
    path = save_figure(fig, opts.out_dir / "selfcite_rewards.png")
    figures = [Figure(str(path), "Reward of each kind of candidate citation, per statement.")]
    notes = [
        "Tier A only. The reward is the official drop-and-hold one; the candidates are a fixed pool (SmolLM2-135M "
        "does not write the LongCite format, so its own samples cannot be reranked), which stands for the N samples.",
        "The citation F1 uses gold supporting sentences in place of the official GPT-4o judge (same structure: "
        "per-statement support 1/0.5/0, per-citation relevance, response F1 averaged).",
        "Wide spans and the whole document contain the gold sentences, so the metric counts them as fully "
        "supported and relevant; only the reward separates them from gold (and only weakly: see the table).",
        "Tier B uses a 0.6M Llama trained here because SFT + best-of-N sampling + two SimPO runs of SmolLM2 do not "
        "fit in 15 minutes on 2 CPU cores. Diagnosis when it does not hold: the tiny model learns the format and "
        "to cite a fact sentence, but not to copy a fact's content from the document (see 'content copied'); "
        "without copying, log p(statement | cited sentences) does not depend on which sentences are cited, so "
        "its own reward carries no signal, its citation samples rarely differ, and best-of-N and SimPO have "
        "nothing to teach. Pilots at seed 123 (toy.PILOT_RUNS): up to 2000 SFT steps / 5 min, content 0-2 %.",
        f"Tier B timings (s): {', '.join(f'{k} {x:.0f}' for k, x in b['seconds'].items())}.",
    ]
    if opts.quick:
        notes.insert(0, f"--quick: {n_docs} documents; the verdict is the full run's ({N_DOCS} documents).")
    return ClaimResult(
        name="selfcite", title=TITLE,
        claim="The context-ablation reward ranks the right citation first, so best-of-N sampling improves "
              "citation F1 (LongBench-Cite 73.8 -> 79.1 with SimPO).",
        paper=PAPER, measured=measured, held=held, tables=tables, figures=figures,
        notes=notes, seconds=time.perf_counter() - start,
    )
