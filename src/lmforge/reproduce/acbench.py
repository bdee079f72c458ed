"""``lmforge reproduce acbench``: ACBench's headline claims on the demo zoo model.

Dong et al., "Can Compressed LLMs Truly Act? An Empirical Evaluation of Agentic Capabilities in LLM
Compression" (ICML 2025): 4-bit quantization (GPTQ, AWQ) costs 1-3% on workflow and tool use but
10-15% on real-world tasks, and pruning costs more than quantization. Here: agent-small (the zoo's
demo model) with GPTQ-4, AWQ-4, Wanda-50% and SparseGPT-50% over the twelve tasks, built-in data.
"""

from __future__ import annotations

import time
from typing import Any

from lmforge.reproduce.base import ClaimResult, Figure, ReproduceOptions, Table, register_reproduction

MODEL = "zoo:agent-small"
# agent-small's widths (192, 512) take groups of 64 (real 7B models: 128).
QUANT = ["gptq:bits=4,group_size=64", "awq:bits=4,group_size=64"]
PRUNE = ["wanda:sparsity=0.5", "sparsegpt:sparsity=0.5"]
PAPER = {
    "4-bit quantization, workflow": "-1% to -3%",
    "4-bit quantization, tool use": "-1% to -3%",
    "4-bit quantization, real world": "-10% to -15%",
    "pruning vs quantization": "pruning drops more",
}
CAPS = ("workflow", "tool_use", "long_context", "real_world")


def _mean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _fmt_pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:+.1f}%"


def _cap_cell(v: dict[str, Any] | None, original: bool) -> str:
    if v is None:
        return "—"
    return f"{v['score']:.3f}" if original else f"{v['score']:.3f} ({_fmt_pct(v['relative'])})"


@register_reproduction(
    "acbench",
    title="ACBench: Can Compressed LLMs Truly Act? (Dong et al., ICML 2025)",
    summary="agent-small under GPTQ-4, AWQ-4, Wanda-50%, SparseGPT-50% on the twelve agent tasks",
)
def run(opts: ReproduceOptions) -> ClaimResult:
    from lmforge.bench.acbench import BenchOptions, run_acbench, summarize

    start = time.perf_counter()
    limit = 6 if opts.quick else 40
    out = opts.out_dir / "acbench"
    data = run_acbench(BenchOptions(
        models=[MODEL], out=out, compress=QUANT + PRUNE, limit=limit, seed=opts.seed,
        calib_samples=16 if opts.quick else 64,
        calib_seq_len=256, length_buckets=(256, 512), max_steps=12,
        analysis_texts=12 if opts.quick else 36, progress=False,
        builtin_sizes={"niah": 20} if opts.quick else {"blocksworld": 200, "toolquery": 100},
        task_limits={} if opts.quick else {"blocksworld": 200, "toolquery": 100},
    ))
    summ = summarize(data)[MODEL]
    by_setting = {s: summ[s] for s in QUANT + PRUNE}

    def cap_drop(settings: list[str], cap: str) -> float | None:
        return _mean([(by_setting[s]["capabilities"].get(cap) or {}).get("relative") for s in settings])

    def kl(settings: list[str]) -> float:
        vals = [v["answer_kl"] for s in settings for v in by_setting[s]["tasks"].values()]
        return sum(vals) / len(vals)

    quant = {c: cap_drop(QUANT, c) for c in CAPS}
    prune = {c: cap_drop(PRUNE, c) for c in CAPS}
    quant_all = _mean(list(quant.values()))
    prune_all = _mean(list(prune.values()))
    kl_q, kl_p = kl(QUANT), kl(PRUNE)
    wt = _mean([quant["workflow"], quant["tool_use"]])
    realworld_worse = quant["real_world"] is not None and wt is not None and quant["real_world"] < wt
    prune_worse = prune_all is not None and quant_all is not None and prune_all < quant_all and kl_p > kl_q
    held = bool(realworld_worse and prune_worse)

    rows = []
    for s in ["original"] + QUANT + PRUNE:
        caps = summ[s]["capabilities"]
        tasks = summ[s]["tasks"]
        rows.append([s] + [_cap_cell(caps.get(c), s == "original") for c in CAPS]
                    + [round(sum(v["answer_kl"] for v in tasks.values()) / len(tasks), 4)])
    task_rows = []
    for t, v in summ["original"]["tasks"].items():
        task_rows.append([t, v["capability"], v["metric"], round(v["value"], 3)]
                         + [_fmt_pct(by_setting[s]["tasks"][t]["relative"]) for s in QUANT + PRUNE]
                         + [round(v["answer_nll"], 3)]
                         + [round(by_setting[s]["tasks"][t]["answer_nll"], 3) for s in QUANT + PRUNE])
    analysis_rows = []
    for s in QUANT + PRUNE:
        a = data["analysis"][f"{MODEL}|{s}"]
        analysis_rows.append([s, round(a["topk"]["3"]["jaccard"], 3), round(a["topk"]["10"]["jaccard"], 3),
                              round(a["topk"]["10"]["kendall_tau"], 3), round(a["erank"]["diff"][-1], 3),
                              round(a["energy"]["mean_compressed"] - a["energy"]["mean_original"], 3)])
    measured: dict[str, Any] = {
        "4-bit quantization, workflow": _fmt_pct(quant["workflow"]),
        "4-bit quantization, tool use": _fmt_pct(quant["tool_use"]),
        "4-bit quantization, real world": _fmt_pct(quant["real_world"]),
        "pruning vs quantization": (f"pruning {_fmt_pct(prune_all)} vs quantization {_fmt_pct(quant_all)}; "
                                    f"answer KL {kl_p:.4f} vs {kl_q:.4f}"),
        **{f"50% pruning, {c.replace('_', ' ')}": _fmt_pct(prune[c]) for c in CAPS},
        "4-bit quantization, long context": _fmt_pct(quant["long_context"]),
        "real world hit hardest under 4-bit quantization": realworld_worse,
        "pruning costs more than quantization (score and KL)": prune_worse,
    }
    figures = [Figure(str(p), cap) for p, cap in (
        (out / "figures" / "energy-zoo_agent-small.png", "Energy per position, original vs each compressed setting."),
        (out / "figures" / "erank-zoo_agent-small.png", "ERank per layer, original vs each compressed setting."),
        (out / "figures" / "niah-zoo_agent-small-original.png", "NIAH heatmap of the original agent-small."),
    ) if p.is_file()]
    notes = [
        f"{limit} records per task ({'' if opts.quick else '200 blocksworld and 100 tool-query episodes; '}"
        "lmforge's built-in data in the official formats), greedy decoding, zoo prompt format; episodes "
        "capped at 12 steps (AgentBoard: 30): a greedy agent that repeats a failed action sees the same "
        "observation and loops, so a longer cap only repeats the loop.",
        "agent-small's real-world failures are mostly such loops on an invalid first move (its zoo card: "
        "82% of blocksworld steps invalid). A perturbation of the weights breaks some loops and starts "
        "others, so compression moves its real-world scores up or down by a few episodes rather than "
        "down: the paper's compounding of per-step errors over long horizons needs an agent that is "
        "right most of the time.",
        "Capability change = mean over its tasks of (compressed - original) / original on the headline metric; "
        "tasks where the original scores 0 have no relative change and are left out.",
        "agent-small (2M parameters) never learned needle retrieval (its zoo card: 0 exact match), so the "
        "long-context rows are at the floor for every setting; their answer NLL and KL still show the damage.",
        "T-Eval's reason/plan/review formats were never in agent-small's training mixture; those sub-scores sit "
        "near the floor and carry little of the comparison.",
        "Full report of the run (all tables, NIAH heatmaps, histograms): acbench/report.html inside this "
        "reproduction's scratch folder; `lmforge bench acbench` writes the same for any model.",
    ]
    if opts.quick:
        notes.append("Quick mode: 6 records per task: differences are within noise.")
    return ClaimResult(
        name="acbench",
        title="ACBench: Can Compressed LLMs Truly Act? (Dong et al., ICML 2025)",
        claim=("4-bit quantization costs 1-3% on workflow and tool use but 10-15% on real-world agent tasks, "
               "and pruning costs more than quantization."),
        paper=PAPER,
        measured=measured,
        held=held,
        tables=[
            Table("Mean relative change per capability (agent-small)", ["setting", *CAPS, "mean answer KL"], rows),
            Table("Per task: original score and relative change; answer NLL (nats/token)",
                  ["task", "capability", "metric", "original", *QUANT, *PRUNE, "NLL original",
                   *[f"NLL {s}" for s in QUANT + PRUNE]], task_rows),
            Table("Analysis against the original", ["setting", "Jaccard@3", "Jaccard@10", "Kendall tau@10",
                                                    "ERank diff (last layer)", "energy shift"], analysis_rows),
        ],
        figures=figures,
        notes=notes,
        seconds=time.perf_counter() - start,
    )
