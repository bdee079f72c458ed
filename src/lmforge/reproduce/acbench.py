"""``lmforge reproduce acbench``: ACBench's headline claims on a real instruction-tuned model.

Dong et al., "Can Compressed LLMs Truly Act? An Empirical Evaluation of Agentic Capabilities in LLM
Compression" (ICML 2025): 4-bit quantization (GPTQ, AWQ) costs 1-3% on workflow and tool use but
10-15% on real-world tasks, and pruning costs more than quantization.

The full run (``make demo``) uses SmolLM2-135M-Instruct (``real:smollm2-135m-instruct``, installed
from PyPI as GGUF and converted once) with GPTQ-4 and AWQ-4 at group size 64 (128 does not divide
SmolLM2's 576 columns), Wanda-50% and SparseGPT-50%, calibrated on the Paul Graham essays'
calibration split. Tasks: WorfBench (workflow), BFCL v4 (tool use), the original
NIAH (the Paul Graham haystack, the San Francisco needle; long context), blocksworld and tool-query
episodes (real world), with official scoring and the chat template. ``--quick`` (the tests) runs the
same grid on the zoo's agent-small, for the mechanism only.

The pass condition was fixed before any real-model run and is the one the zoo run used: the real-world
capability drops more under 4-bit quantization than workflow and tool use on average, and pruning's
mean capability drop and mean answer KL both exceed quantization's. Capabilities where the original
scores at floor (less than 5% of the scale above what an empty answer scores) have no meaningful
relative change and are listed as such.
"""

from __future__ import annotations

import time
from typing import Any

from lmforge.reproduce.base import ClaimResult, Figure, ReproduceOptions, Table, register_reproduction

MODEL = "real:smollm2-135m-instruct"
QUICK_MODEL = "zoo:agent-small"
# group 64: 128 divides neither SmolLM2's 576 columns nor agent-small's 192.
QUANT = ["gptq:bits=4,group_size=64", "awq:bits=4,group_size=64"]
PRUNE = ["wanda:sparsity=0.5", "sparsegpt:sparsity=0.5"]
PAPER = {
    "4-bit quantization, workflow": "-1% to -3%",
    "4-bit quantization, tool use": "-1% to -3%",
    "4-bit quantization, real world": "-10% to -15%",
    "pruning vs quantization": "pruning drops more",
}
CAPS = ("workflow", "tool_use", "long_context", "real_world")
# A capability is "at floor" when the original scores less than this (0-1 scale) above the floor, what
# an empty answer scores on the same records (BFCL: its irrelevance share, where making no call is
# right; 0 elsewhere). An earlier version compared with 0 and so counted BFCL's 0.20 of a model that
# never calls a function as above floor.
FLOOR = 0.05

# The real run's budget, chosen for time before the full run (a first, larger grid spent 27 min on the
# original setting alone on a shared 2-core machine: NIAH 786 s, BFCL 386 s). T-Eval instruct is not in
# the grid: SmolLM2-135M never produced its format (0 of 8 parsed in that run), so it only cost time.
REAL_TASKS = ["worfbench", "bfcl", "niah", "blocksworld", "toolquery"]
REAL_LIMITS = {"worfbench": 4, "bfcl": 5, "niah": 9, "blocksworld": 4, "toolquery": 4}
REAL_NIAH = {"context_lengths": [250, 500, 1000], "depth_percents": [0, 50, 100]}
REAL_MAX_NEW_TOKENS = 128
REAL_MAX_STEPS = 6
# Calibration windows x tokens for the real run's four methods. The first full run, at 16 x 512, took
# 1007 s (over the 15-minute budget), and AWQ alone 347 s of it: its grid search runs the attention
# block and the MLP on every calibration token 20 times per layer (fp32, as calibration stays), so its
# cost is linear in the windows. 8 x 512 (4,096 tokens) is the cut, chosen for time, before the next run.
REAL_CALIB = (8, 512)
# WorfBench's own zero-shot protocol. One worked example (`--shots 1`) was tried on the demo's grid
# after the 787 s run had scored SmolLM2 0 zero-shot: node F1 0.033 on its 4 records (0.206 on 8 other
# generated records, with another action list, in an earlier experiment), still at floor, so the demo
# keeps the official protocol.
REAL_SHOTS = 0


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
    out = opts.out_dir / "acbench"
    if opts.quick:
        model = QUICK_MODEL
        bench = BenchOptions(
            models=[model], out=out, compress=QUANT + PRUNE, limit=6, seed=opts.seed, calib_samples=16,
            calib_seq_len=256, length_buckets=(256, 512), max_steps=12, analysis_texts=12, progress=False,
            builtin_sizes={"niah": 20},
        )
    else:
        model = MODEL
        _write_niah_grid(out / "data")
        bench = BenchOptions(
            models=[model], out=out, compress=QUANT + PRUNE, tasks=REAL_TASKS, limit=None, seed=opts.seed,
            calib_samples=REAL_CALIB[0], calib_seq_len=REAL_CALIB[1], max_steps=REAL_MAX_STEPS, analysis_texts=6, progress=True,
            builtin_sizes={"bfcl": 1}, task_limits=dict(REAL_LIMITS), max_new_tokens=REAL_MAX_NEW_TOKENS,
            builtin_profile="real", shots=REAL_SHOTS,
        )
    data = run_acbench(bench)
    return _claim(data, model, opts, out, start)


def _write_niah_grid(folder: Any) -> None:
    """The real run's NIAH grid: the original needle in the Paul Graham haystack, 500-2000 tokens."""
    import json

    from lmforge.common.io import atomic_write_text
    from lmforge.eval.niah import NEEDLE, QUESTION

    folder.mkdir(parents=True, exist_ok=True)
    grid = dict(REAL_NIAH, needle=NEEDLE, question=QUESTION, haystack="paul_graham", reserve_tokens=200)
    if not (folder / "niah.json").is_file():
        atomic_write_text(folder / "niah.json", json.dumps(grid, indent=2) + "\n")


def _time_rows(data: dict[str, Any], model: str, out: Any, tasks: list[str]) -> list[list[Any]]:
    """Where the run's time went: each setting's compression (from its ``compression.json``) and
    evaluation seconds per task."""
    import json

    from lmforge.bench.acbench import ORIGINAL, compressed_folder, parse_setting

    cells = {(c["setting"], c["task"]): c.get("seconds", 0.0) for c in data["cells"].values() if c["model"] == model}
    rows = []
    for s in [ORIGINAL] + QUANT + PRUNE:
        comp = 0.0
        if s != ORIGINAL:
            rec = compressed_folder(out, model, parse_setting(s)) / "compression.json"
            comp = json.loads(rec.read_text())["seconds"] if rec.is_file() else 0.0
        evals = [cells.get((s, t), 0.0) for t in tasks]
        rows.append([s, round(comp, 1), *[round(x, 1) for x in evals], round(comp + sum(evals), 1)])
    return rows


def _claim(data: dict[str, Any], MODEL: str, opts: ReproduceOptions, out: Any, start: float) -> ClaimResult:
    from lmforge.bench.acbench import summarize

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

    def at_floor(c: str) -> bool:
        v = summ["original"]["capabilities"].get(c)
        return v is None or v["score"] < v.get("floor", 0.0) + FLOOR

    floor = [c for c in CAPS if at_floor(c)]
    floor_rows = [[c, "—" if summ["original"]["capabilities"].get(c) is None else
                   f"{summ['original']['capabilities'][c]['score']:.3f}",
                   "—" if summ["original"]["capabilities"].get(c) is None else
                   f"{summ['original']['capabilities'][c].get('floor', 0.0):.3f}",
                   "at floor" if at_floor(c) else "above floor"] for c in CAPS]
    rows = []
    for s in ["original"] + QUANT + PRUNE:
        caps = summ[s]["capabilities"]
        tasks = summ[s]["tasks"]
        rows.append([s] + [_cap_cell(caps.get(c), s == "original") for c in CAPS]
                    + [round(sum(v["answer_kl"] for v in tasks.values()) / len(tasks), 4)])
    task_rows, nll_rows = [], []
    for t, v in summ["original"]["tasks"].items():
        task_rows.append([t, v["capability"], v["metric"], round(v["value"], 3)]
                         + [_fmt_pct(by_setting[s]["tasks"][t]["relative"]) for s in QUANT + PRUNE])
        nll_rows.append([t, round(v["answer_nll"], 3)]
                        + [f"{by_setting[s]['tasks'][t]['answer_nll']:.3f} / {by_setting[s]['tasks'][t]['answer_kl']:.4f}"
                           for s in QUANT + PRUNE])
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
        "capabilities at floor (original < empty answer + 5%)": ", ".join(floor) or "none",
        "capabilities above floor": f"{len(CAPS) - len(floor)} of {len(CAPS)}",
        "real world hit hardest under 4-bit quantization": realworld_worse,
        "pruning costs more than quantization (score and KL)": prune_worse,
    }
    from lmforge.bench.report import _slug

    slug = _slug(MODEL)
    figures = [Figure(str(p), cap) for p, cap in (
        (out / "figures" / f"capabilities-{slug}.png", "Relative change per capability and setting."),
        (out / "figures" / f"niah-{slug}-original.png", f"NIAH heatmap of the original {MODEL}."),
        (out / "figures" / f"energy-{slug}.png", "Energy per position, original vs each compressed setting."),
        (out / "figures" / f"erank-{slug}.png", "ERank per layer, original vs each compressed setting."),
    ) if p.is_file()]
    runtime = next(iter(data["cells"].values())).get("runtime", {})
    time_rows = _time_rows(data, MODEL, out, list(summ["original"]["tasks"]))
    notes = [
        "Pass condition (fixed in the code before the run, unchanged from the zoo version): real-world drop "
        "under 4-bit quantization larger than the mean workflow/tool-use drop, and pruning's mean capability "
        "drop and mean answer KL both larger than quantization's.",
        "Capability change = mean over its tasks of (compressed - original) / original on the headline metric; "
        "a capability whose original score is 0 has no relative change.",
        f"Capabilities at floor for the original model: {', '.join(floor) or 'none'} (floor: what an empty "
        "answer scores on the same records, plus 5% of the scale).",
        f"Runtime: {runtime.get('threads')} threads, {runtime.get('dtype')} inference "
        f"(CPU with native bf16: {runtime.get('cpu_fast_bf16')}); compression in float32.",
        "The run's own bench report (every table, NIAH heatmaps, histograms) is written to a scratch folder "
        "that is removed at the end; its figures are copied here, and `lmforge bench acbench` with the same "
        "settings writes the whole report for any model.",
    ]
    if opts.quick:
        notes.append("Quick mode: zoo:agent-small (2M parameters, zoo prompt format), 6 records per task: "
                     "differences are within noise and the run checks the mechanism only.")
    else:
        from lmforge.models.real import get_real

        notes += [
            f"{MODEL}: {get_real(MODEL.removeprefix('real:')).weights_note}. The 4-bit group-64 settings "
            "re-quantize a model that is already on a 4-bit group-32 grid, so they cost less than on the "
            "paper's bf16 checkpoints.",
            f"Records per task: {', '.join(f'{t} {n}' for t, n in REAL_LIMITS.items())}; NIAH lengths "
            f"{REAL_NIAH['context_lengths']} x depths {REAL_NIAH['depth_percents']}; at most "
            f"{REAL_MAX_NEW_TOKENS} new tokens per answer and {REAL_MAX_STEPS} steps per episode "
            "(AgentBoard: 30), greedy decoding, the chat template, official scoring. These sizes were set "
            "for the 15-minute budget before the run; at this size a capability moves by whole records, so "
            "differences of a few percent are noise.",
            "WorfBench zero-shot, as its protocol is; with one worked example before each task "
            "(`lmforge bench acbench --shots 1`) this model scored node F1 0.033 on the same 4 records, "
            "still at floor.",
            f"Calibration: {REAL_CALIB[0]} windows of {REAL_CALIB[1]} tokens from the Paul Graham essays' "
            "calibration split (lmforge.data.essays, split by essay); the papers calibrate on 128 windows.",
        ]
    return ClaimResult(
        name="acbench",
        title="ACBench: Can Compressed LLMs Truly Act? (Dong et al., ICML 2025)",
        claim=("4-bit quantization costs 1-3% on workflow and tool use but 10-15% on real-world agent tasks, "
               "and pruning costs more than quantization."),
        paper=PAPER,
        measured=measured,
        held=held,
        tables=[
            Table(f"Capability score (0-1) and relative change ({MODEL})", ["setting", *CAPS, "mean answer KL"], rows),
            Table("Original model against the floor (an empty answer's score) per capability",
                  ["capability", "original", "floor", "verdict"], floor_rows),
            Table("Per task: original score and relative change", ["task", "capability", "metric", "original",
                                                                    *QUANT, *PRUNE], task_rows),
            Table("Per task: answer NLL (nats/token) of the gold completion; compressed: NLL / KL vs original",
                  ["task", "original", *QUANT, *PRUNE], nll_rows),
            Table("Seconds per setting: the compression method alone and each task's evaluation",
                  ["setting", "compression", *summ["original"]["tasks"], "total"], time_rows),
            Table("Analysis against the original", ["setting", "Jaccard@3", "Jaccard@10", "Kendall tau@10",
                                                    "ERank diff (last layer)", "energy shift"], analysis_rows),
        ],
        figures=figures,
        notes=notes,
        seconds=time.perf_counter() - start,
    )
