"""``lmforge reproduce omnibal``: balanced data, partition and memory for VLM pipeline training.

Setup (the issue's, fixed before the final run):

* **Data.** 70,706 samples drawn from the length generator fitted to the per-sample lengths that
  ModelTC/OmniBal released for four InternVL-1.2M subsets (:mod:`lmforge.data.vlm_lengths`), over
  8 data-parallel ranks, micro-batches of 4 for the random baseline. ISF caps come from the
  official cap search (:func:`~lmforge.methods.omnibal.search.search_caps`).
* **Model.** A VLM-shaped model (:mod:`lmforge.methods.omnibal.pipeline`): 8 ViT blocks, a
  projector and 16 LLM blocks, d = 64, 16 tokens per tile (InternVL's 256 scaled by 1/16, text
  scaled alike), ViT MLP ratio 48 so a ViT layer costs about 3× an LLM layer (the notes' setting).
* **Runs.** 2 gloo processes, one pipeline of 2 stages (1F1B), 8 micro-batches per step, AdamW,
  20 steps per configuration, median step. The paper's ablation ladder: the baseline (random
  micro-batches of 4 padded to their longest, Megatron's equal layer split, full recompute), then
  + ISF, + BMP, + the recompute plan.

Conditions (the issue's, written here before the run; ``held`` needs all three):

* **A.** ISF's DistRatio is ≥ 5× lower than random batching's, for the ViT and for the LLM.
* **B.** BMP's slowest stage ≤ the greedy anchor's ≤ the equal split's, in the 1F1B simulator on
  the profiled costs (4 stages) and in the real 2-process run (median step time, 2 stages).
* **C.** Real-token throughput with all three parts is ≥ 1.3× the baseline's (median of 20 steps).
"""

from __future__ import annotations

import time
import numpy as np

from lmforge.reproduce.base import (ClaimResult, Figure, ReproduceOptions, Table, figure, register_reproduction,
                                   save_figure)

TITLE = "OmniBal: Towards Fast Instruct-tuning for VLMs via Omniverse Computation Balance (Yao et al., ICML 2025)"
DIST_REDUCTION = 5.0
SPEEDUP = 1.3
DP, MICRO_BS, N_MICRO, STEPS, STAGES_SIM = 8, 4, 8, 20, 4
NOTES_CAPS = (20, 5824)  # the caps behind the notes' measured 0 / 0.017 / 0.024 (not the search's)
PAPER = {"GPU-days, Megatron 3D baseline": 61.8, "+ ISF": 51.9, "+ BMP": 29.0, "+ recompute": 21.3,
         "headline speed-up (vs DeepSpeed ZeRO-3, 38.9 GPU-days)": 1.8,
         "ISF PadRatio": "0.31 -> 0", "ISF DistRatio (ViT)": "0.34 -> 0.02"}


@register_reproduction(
    "omnibal",
    title=TITLE,
    summary="InternVL-fitted lengths on 8 ranks, a VLM-shaped model on 2 gloo pipeline stages: ISF, BMP, recompute",
)
def run(opts: ReproduceOptions) -> ClaimResult:
    from lmforge.data.vlm_lengths import sample_internvl_lengths
    from lmforge.methods.omnibal.experiment import balance_data, micro_streams, plan_model, timed_run
    from lmforge.methods.omnibal.pipeline import VLMConfig

    t_start = time.time()
    quick = opts.quick
    steps = 3 if quick else STEPS
    n_samples = 6000 if quick else None
    cfg = (VLMConfig(vit_layers=2, llm_layers=4, d_model=32, vit_mlp_ratio=16, patch_tokens=4, vocab=64)
           if quick else VLMConfig(patch_tokens=16, vit_mlp_ratio=48))
    log = print if opts.progress else (lambda *a, **k: None)

    # --- A: data balance -------------------------------------------------------------------------
    vit, tok = sample_internvl_lengths(n_samples, seed=opts.seed)
    bal = balance_data(vit, tok, DP, MICRO_BS)
    red = bal.reduction()
    held_a = red["vit"] >= DIST_REDUCTION and red["llm"] >= DIST_REDUCTION
    notes = balance_data(vit, tok, DP, MICRO_BS, vit_cap=NOTES_CAPS[0], token_cap=NOTES_CAPS[1])
    log(f"ISF caps {bal.vit_cap}/{bal.token_cap}: DistRatio ViT {bal.balanced.dist_ratio_vit:.4f}, "
        f"LLM {bal.balanced.dist_ratio_llm:.4f} (random {bal.random.dist_ratio_vit:.3f}/{bal.random.dist_ratio_llm:.3f})")

    # --- B: partitions (simulator at 4 stages; real at 2) ---------------------------------------
    (base_plans, base_real), (isf_plans, isf_real), packed = micro_streams(vit, tok, cfg, bal, steps, opts.seed,
                                                                           N_MICRO, MICRO_BS)
    shape = tuple(int(v) for v in np.median(np.asarray(packed), axis=0))
    sim = plan_model(cfg, shape, STAGES_SIM, N_MICRO, seed=opts.seed)
    s = sim.simulated
    held_b_sim = s["bmp"]["slowest_stage_s"] <= s["anchor"]["slowest_stage_s"] <= s["equal"]["slowest_stage_s"]

    everything = set(range(cfg.n_layers))
    bmp_steps = 2 if quick else 10
    measured_candidates: dict[tuple[int, ...], float] = {}

    def real_runner(cuts):
        r = timed_run(cfg, cuts, everything, isf_plans[:bmp_steps], isf_real[:bmp_steps], seed=opts.seed)
        measured_candidates[tuple(cuts)] = r["median_step_s"]
        return r["median_step_s"]

    # NOTE: the quick run lets the simulator stand in for BMP's real candidate runs (3 fewer launches).
    two = plan_model(cfg, shape, 2, N_MICRO, runner=None if quick else real_runner, seed=opts.seed)
    log(f"BMP (2 stages): anchor {two.bmp.anchor}, chosen {two.bmp.chosen}, equal {two.equal}; "
        f"recompute kept on {sorted(two.recompute)}")

    ladder = [("baseline: random x4, equal split, full recompute", base_plans, base_real, two.equal, everything),
              ("+ ISF", isf_plans, isf_real, two.equal, everything)]
    if two.bmp.anchor != two.bmp.chosen:
        ladder.append(("+ ISF, greedy anchor", isf_plans, isf_real, two.bmp.anchor, everything))
    ladder += [("+ BMP", isf_plans, isf_real, two.bmp.chosen, everything),
               ("+ recompute plan (OmniBal)", isf_plans, isf_real, two.bmp.chosen, two.recompute)]
    runs: dict[str, dict] = {}
    done: dict[tuple, str] = {}
    for name, plans, real, cuts, rec in ladder:
        key = (id(plans), tuple(cuts), frozenset(rec))
        if key in done:  # the same configuration (e.g. BMP kept the equal split): one measurement
            runs[name] = runs[done[key]]
        else:
            runs[name] = timed_run(cfg, cuts, rec, plans, real, seed=opts.seed)
            done[key] = name
        log(f"{name}: median step {runs[name]['median_step_s']:.3f} s, "
            f"{runs[name]['median_tokens_per_s']:.0f} real tokens/s")
    step = {k: v["median_step_s"] for k, v in runs.items()}
    anchor_step = step.get("+ ISF, greedy anchor", step["+ BMP"])
    held_b_real = step["+ BMP"] <= anchor_step <= step["+ ISF"]
    base_name, full_name = ladder[0][0], ladder[-1][0]
    speedup = runs[full_name]["median_tokens_per_s"] / runs[base_name]["median_tokens_per_s"]
    held_c = speedup >= SPEEDUP
    held = held_a and held_b_sim and held_b_real and held_c

    # --- report ----------------------------------------------------------------------------------
    def m3(m):
        return [round(m.pad_ratio, 4), round(m.dist_ratio_vit, 4), round(m.dist_ratio_llm, 4)]

    t_data = Table("Data balance over 8 data-parallel ranks (PadRatio, DistRatio ViT, DistRatio LLM)",
                   ["batching", "caps (tiles / tokens)", "PadRatio", "DistRatio ViT", "DistRatio LLM",
                    "samples per micro-batch"],
                   [["random micro-batches of 4", "-", *m3(bal.random), MICRO_BS],
                    ["ISF, official cap search", f"{bal.vit_cap} / {bal.token_cap}", *m3(bal.balanced),
                     round(float(np.mean(bal.isf.sizes())), 2)],
                    ["ISF, the notes' caps (not counted)", f"{NOTES_CAPS[0]} / {NOTES_CAPS[1]}",
                     *m3(notes.balanced), round(float(np.mean(notes.isf.sizes())), 2)]])
    t_search = Table("The official cap search: every setting it ran",
                     ["ViT cap", "token cap", "mean group", "PadRatio", "DistRatio ViT", "DistRatio LLM"],
                     [[tr.vit_cap, tr.token_cap, round(tr.mean_group, 2), *m3(tr.metrics)]
                      for tr in (bal.search.trials if bal.search else [])])
    t_sim = Table(f"1F1B simulator on the profiled costs ({STAGES_SIM} stages, {N_MICRO} micro-batches, ms)",
                  ["partition", "boundaries", "slowest stage", "simulated step"],
                  [[k, str(c), round(1e3 * s[k]["slowest_stage_s"], 2), round(1e3 * s[k]["step_s"], 1)]
                   for k, c in (("equal", sim.equal), ("anchor", sim.bmp.anchor), ("bmp", sim.bmp.chosen),
                                ("bmp+recompute", sim.bmp.chosen))])
    t_real = Table(f"Real steps on 2 gloo processes (1F1B, {N_MICRO} micro-batches, median of {steps} steps)",
                   ["configuration", "boundaries", "recomputed layers", "median step (s)", "real tokens / step",
                    "real tokens / s", "speed-up"],
                   [[name, str(tuple(cuts)), len(rec), round(runs[name]["median_step_s"], 3),
                     round(runs[name]["real_tokens_per_step"]), round(runs[name]["median_tokens_per_s"]),
                     round(runs[name]["median_tokens_per_s"] / runs[base_name]["median_tokens_per_s"], 2)]
                    for name, _, _, cuts, rec in ladder])
    t_bmp = Table("BMP's candidates at 2 stages, ranked; the top 3 "
                  + ("scored by the simulator (quick run)" if quick else f"run for real (median of {bmp_steps} steps)"),
                  ["boundaries", "stage-time variance (ms²)", "communication (bytes)", "measured step (s)"],
                  [[str(c.boundaries), round(1e6 * c.variance, 3), int(c.comm),
                    round(measured_candidates[c.boundaries], 3) if c.boundaries in measured_candidates else "-"]
                   for c in two.bmp.candidates])
    mem_rows = [[s_, round(a / 2**20, 1), round(b / 2**20, 1), round(two.capacity / 2**20, 1)]
                for s_, (a, b) in enumerate(zip(two.stage_memory_full, two.stage_memory_plan, strict=True))]
    t_mem = Table("Memory per stage (modelled MiB: AdamW states + in-flight activations)",
                  ["stage", "full recompute", "OmniBal plan", "capacity"], mem_rows)

    fig, ax = figure(1, 2, figsize=(10, 3.6))
    prof = sim.profile
    ax[0].bar(range(len(prof.fwd_s)), [1e3 * (f + b) for f, b in zip(prof.fwd_s, prof.bwd_s, strict=True)])
    for c in sim.bmp.chosen:
        ax[0].axvline(c - 0.5, color="k", ls="--")
    ax[0].set(xlabel="layer (embed, ViT, projector, LLM, head)", ylabel="fwd+bwd ms",
              title=f"profile and BMP cuts ({STAGES_SIM} stages)")
    names = [n for n, *_ in ladder]
    ax[1].barh(range(len(names)), [runs[n]["median_tokens_per_s"] for n in names])
    ax[1].set_yticks(range(len(names)), [n.split(":")[0] for n in names])
    ax[1].set(xlabel="real tokens / s", title="real 2-stage runs")
    fig_path = save_figure(fig, opts.out_dir / "omnibal.png")

    measured = {
        "ISF caps (tiles/tokens)": f"{bal.vit_cap}/{bal.token_cap}",
        "DistRatio ViT random -> ISF": f"{bal.random.dist_ratio_vit:.3f} -> {bal.balanced.dist_ratio_vit:.4f}",
        "DistRatio LLM random -> ISF": f"{bal.random.dist_ratio_llm:.3f} -> {bal.balanced.dist_ratio_llm:.4f}",
        "PadRatio random -> ISF": f"{bal.random.pad_ratio:.3f} -> {bal.balanced.pad_ratio:.3f}",
        "DistRatio reduction (ViT, LLM)": f"{red['vit']:.1f}x, {red['llm']:.1f}x",
        "simulated slowest stage ms (BMP/anchor/equal)": " / ".join(
            f"{1e3 * s[k]['slowest_stage_s']:.1f}" for k in ("bmp", "anchor", "equal")),
        "real median step s (BMP/anchor/equal)": f"{step['+ BMP']:.3f} / {anchor_step:.3f} / {step['+ ISF']:.3f}",
        "real throughput speed-up (all three)": round(speedup, 2),
        "condition A (DistRatio >= 5x, both)": held_a,
        "condition B (BMP <= anchor <= equal), simulator": held_b_sim,
        "condition B, real run": held_b_real,
        "condition C (>= 1.3x)": held_c,
    }
    notes_ = [
        "Conditions A-C are the issue's, fixed in the code before the final run; prototype runs were made "
        "while building (same code paths) and none of the conditions or settings changed after them.",
        "Lengths: a generator fitted to the 4 InternVL-1.2M subsets OmniBal released (70,706 samples; "
        "quantiles per (subset, tiles), not the data). On the real files the cap search takes the same path "
        "and picks the same caps (18/6016; DistRatio LLM 0.069 there, 0.071 here).",
        "The official cap search keeps only settings with 4-5 samples per group and minimises PadRatio + "
        "both DistRatios; on this data its grid (4096 + k·320 tokens, 12 + k tiles) never reaches the "
        "notes' 20/5824, which give a lower LLM DistRatio (row 3, not counted).",
        "DistRatio is the 8-rank data-parallel measure; the real run has one pipeline (2 processes on 2 "
        "cores), so only padding and the partition and memory parts show in its step time.",
        "Throughput counts real (unpadded) LLM tokens per second; the baseline pads each micro-batch to "
        "its longest sample, and pipelining pads all micro-batches of a step to one shape (both arms).",
        "Memory: CPU has no device memory to read; the capacity is fixed halfway between the equal "
        "split's fullest stage with full recompute and without (full recompute fits, none does not).",
        "BMP's candidates at 2 stages ran for real (the paper runs the best few ~20 iterations); at 4 stages "
        "the simulator is the runner. Profiles vary run to run on a shared 2-core machine.",
        "Paper anchors are InternViT-6B + InternLM2-20B on GPUs; the 1.8x headline is against DeepSpeed "
        "ZeRO-3 (38.9 GPU-days; verify), while our ladder mirrors the Megatron ablation (61.8 -> 21.3).",
    ]
    if quick:
        notes_.insert(0, "QUICK run: 6,000 samples, a tiny model, 3 steps; the verdict is not meaningful.")
    return ClaimResult(
        name="omnibal",
        title=TITLE,
        claim=("Balancing data (ISF), model partition (BMP) and memory (adaptive recompute) speeds up VLM "
               "training on 3D parallelism by about 1.8x."),
        paper=PAPER,
        measured=measured,
        held=held,
        tables=[t_data, t_search, t_sim, t_bmp, t_real, t_mem],
        figures=[Figure(str(fig_path), "Left: profiled per-layer time and BMP's 4-stage cuts. Right: real "
                                       "2-stage throughput along the ablation ladder.")],
        notes=notes_,
        seconds=round(time.time() - t_start, 1),
    )

