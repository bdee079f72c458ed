"""``lmforge train omnibal``: OmniBal's data balance, model partition and memory plan (Yao et al., ICML 2025).

From a per-sample length file (the official ``{"vit_num", "token_num"}`` records) it runs ISF (the
official cap search unless caps are given) and reports PadRatio and DistRatio against random
micro-batches; profiles a VLM-shaped model on a typical ISF micro-batch; picks BMP's pipeline
partition and the recompute plan; and, unless ``--steps 0``, trains that model for real on
``--stages`` gloo processes (1F1B), the baseline and OmniBal side by side. It writes
``omnibal.json`` (everything reported) and ``groups.jsonl`` (the ISF micro-batches as sample
indices, for a user's own data loader).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from lmforge.commands.groups import train_app
from lmforge.common.errors import UserError

JsonOpt = Annotated[bool, typer.Option("--json", help="Print results as JSON on stdout.")]


def _finite(x: float) -> float | None:
    return None if x != x or x in (float("inf"), float("-inf")) else x


@train_app.command("omnibal")
def omnibal_cmd(
    lengths: Annotated[str, typer.Option(help="Per-sample lengths: a JSON list (or .jsonl) of {'vit_num', 'token_num'} records, an official wrap file {name: {'token_lengths': PATH}}, or `internvl` for the generator fitted to InternVL-1.2M's released lengths.")],
    out: Annotated[Path, typer.Option(help="Output folder: omnibal.json (the report) and groups.jsonl (ISF micro-batches as sample indices).")],
    stages: Annotated[int, typer.Option(help="Pipeline stages (one gloo process each for the real steps).")] = 2,
    dp: Annotated[int, typer.Option(help="Data-parallel ranks for PadRatio/DistRatio (the official test: 8).")] = 8,
    micro_bs: Annotated[int, typer.Option(help="Samples per random micro-batch (the baseline) and the cap search's target group size.")] = 4,
    vit_cap: Annotated[int | None, typer.Option(help="ISF ViT cap Q_v in tiles (with --token-cap: skip the cap search).")] = None,
    token_cap: Annotated[int | None, typer.Option(help="ISF token cap Q_t (the floor is Q_t - 128, as the official code).")] = None,
    rounds: Annotated[int, typer.Option(help="ISF iterations (official iter_time: 50).")] = 50,
    isf_seed: Annotated[int, typer.Option(help="ISF shuffle seed (official: 1024).")] = 1024,
    skip_oversize: Annotated[bool, typer.Option(help="Skip samples larger than a cap on their own, as the official code does silently (they are counted).")] = False,
    micro_batches: Annotated[int, typer.Option(help="Micro-batches per step (1F1B needs at least --stages).")] = 8,
    steps: Annotated[int, typer.Option(help="Real training steps per configuration on --stages gloo processes; 0: plan only.")] = 20,
    top_k: Annotated[int, typer.Option(help="BMP: how many of the best-ranked candidates (stage-time variance, then communication) to score in the 1F1B simulator on the profiled costs (`lmforge reproduce omnibal` also runs them for real).")] = 3,
    capacity_mb: Annotated[float | None, typer.Option(help="Device memory per stage in MiB for the recompute plan (default: halfway between full recompute and none on the equal split's fullest stage).")] = None,
    vit_layers: Annotated[int, typer.Option(help="Model: ViT blocks.")] = 8,
    llm_layers: Annotated[int, typer.Option(help="Model: LLM blocks.")] = 16,
    d_model: Annotated[int, typer.Option(help="Model: hidden size.")] = 64,
    patch_tokens: Annotated[int, typer.Option(help="Model: tokens per tile (InternVL: 256; text is scaled by the same factor).")] = 16,
    vit_mlp_ratio: Annotated[int, typer.Option(help="Model: ViT MLP width / d (48: a ViT layer costs ~3x an LLM layer).")] = 48,
    seed: Annotated[int, typer.Option(help="Seed of the model, the data order and the random baseline.")] = 0,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing output folder.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Balance data (ISF), partition the model (BMP) and plan recompute for VLM pipeline training.

    \b
    Examples:
      lmforge train omnibal --lengths internvl --out runs/omnibal
      lmforge train omnibal --lengths my_lengths.json --stages 4 --steps 0 --out runs/plan
      lmforge train omnibal --lengths internvl_sft_1.2M.json --vit-cap 9 --token-cap 4096 --out runs/fixed
    """
    import numpy as np

    from lmforge.common.io import atomic_dir, atomic_write_json, atomic_write_text, check_output_dir
    from lmforge.data.vlm_lengths import load_lengths, sample_internvl_lengths
    from lmforge.methods.omnibal import plan as P
    from lmforge.methods.omnibal.experiment import balance_data, micro_streams, plan_model, timed_run
    from lmforge.methods.omnibal.pipeline import VLMConfig

    for name, val, low in (("--stages", stages, 1), ("--dp", dp, 1), ("--micro-bs", micro_bs, 1),
                           ("--rounds", rounds, 1), ("--micro-batches", micro_batches, 1), ("--steps", steps, 0),
                           ("--top-k", top_k, 1), ("--vit-layers", vit_layers, 1), ("--llm-layers", llm_layers, 1),
                           ("--d-model", d_model, 2), ("--patch-tokens", patch_tokens, 1),
                           ("--vit-mlp-ratio", vit_mlp_ratio, 1)):
        if val < low:
            raise UserError(f"{name} must be at least {low}, got {val}")
    if (vit_cap is None) != (token_cap is None):
        raise UserError("give both --vit-cap and --token-cap, or neither (then the official cap search runs)")
    if token_cap is not None and (vit_cap < 1 or token_cap <= 128):
        raise UserError(f"caps must be at least 1 tile and more than 128 tokens, got {vit_cap} / {token_cap}")
    cfg = VLMConfig(vit_layers=vit_layers, llm_layers=llm_layers, d_model=d_model, n_heads=2 if d_model % 2 == 0 else 1,
                    vit_mlp_ratio=vit_mlp_ratio, patch_tokens=patch_tokens)
    if stages > cfg.n_layers:
        raise UserError(f"--stages {stages} is more than the model's {cfg.n_layers} layers "
                        f"(embed + {vit_layers} ViT + projector + {llm_layers} LLM + head)")
    if steps and micro_batches < stages:
        raise UserError(f"1F1B needs at least as many micro-batches as stages: --micro-batches {micro_batches} < "
                        f"--stages {stages}")
    check_output_dir(out, overwrite)
    vit, tok = sample_internvl_lengths(seed=seed) if lengths == "internvl" else load_lengths(lengths)
    if vit_cap is not None:
        over = int(((vit > vit_cap) | (tok > token_cap)).sum())
        if over and not skip_oversize:
            raise UserError(f"{over} of {len(vit)} samples exceed the caps {vit_cap} tiles / {token_cap} tokens "
                            f"(largest: {int(vit.max())} tiles, {int(tok.max())} tokens); the official code skips "
                            "them silently: pass --skip-oversize to do so, or raise the caps")
        if over == len(vit):
            raise UserError(f"no sample fits the caps {vit_cap} tiles / {token_cap} tokens")

    say = (lambda m: None) if as_json else (lambda m: typer.echo(m, err=True))
    show = os.environ.get("LMFORGE_NO_PROGRESS") != "1"
    say(f"{len(vit)} samples; ISF ({'cap search' if vit_cap is None else 'given caps'}) over {dp} ranks ...")
    bal = balance_data(vit, tok, dp, micro_bs, rounds=rounds, seed=isf_seed, vit_cap=vit_cap, token_cap=token_cap,
                       shuffle_seed=seed,
                       progress=(lambda t: say(f"  caps {t.vit_cap}/{t.token_cap}: {t.mean_group:.2f} samples "
                                                 f"per group, sum of ratios {t.metrics.total:.4f}")) if show else None)
    if len(bal.isf.skipped) and not skip_oversize:
        raise UserError(f"{len(bal.isf.skipped)} samples exceed the searched caps {bal.vit_cap}/{bal.token_cap}; "
                        "the official code skips them silently: pass --skip-oversize to do so")
    tiles, text = P.scale_samples(vit, tok, patch_tokens)
    packed = P.packed_micro(tiles, text, bal.isf.groups)
    shape = tuple(int(v) for v in np.median(np.asarray(packed), axis=0))
    say(f"profiling a {cfg.n_layers}-layer VLM-shaped model on a micro-batch of {shape[0]} tiles + {shape[1]} text "
        "tokens; BMP and the recompute plan ...")
    cap = None if capacity_mb is None else int(capacity_mb * 2**20)
    mp = plan_model(cfg, shape, stages, micro_batches, top_k=top_k, capacity=cap, seed=seed)
    runs: dict[str, Any] = {}
    if steps:
        need = micro_batches * steps
        if len(bal.isf.groups) < need or len(vit) < need * micro_bs:
            raise UserError(f"{len(vit)} samples make {len(bal.isf.groups)} ISF groups: too few for {steps} steps "
                            f"of {micro_batches} micro-batches; lower --steps")
        (bp, br), (ip, ir), _ = micro_streams(vit, tok, cfg, bal, steps, seed, micro_batches, micro_bs)
        every = set(range(cfg.n_layers))
        for name, plans, real, cuts, rec in (("baseline", bp, br, mp.equal, every),
                                            ("omnibal", ip, ir, mp.bmp.chosen, mp.recompute)):
            say(f"{steps} real steps on {stages} gloo processes: {name} ...")
            r = timed_run(cfg, cuts, rec, plans, real, seed=seed)
            runs[name] = {k: v for k, v in r.items() if k != "losses"}
    report = {
        "samples": len(vit), "skipped_oversize": int(len(bal.isf.skipped)),
        "caps": {"vit": bal.vit_cap, "tokens": bal.token_cap, "token_floor": bal.token_floor,
                 "searched": bal.search is not None},
        "groups": len(bal.isf.groups), "mean_group_size": float(np.mean(bal.isf.sizes())),
        "kept_per_round": bal.isf.kept_per_round,
        "random": {"pad_ratio": bal.random.pad_ratio, "dist_ratio_vit": bal.random.dist_ratio_vit,
                   "dist_ratio_llm": bal.random.dist_ratio_llm},
        "isf": {"pad_ratio": bal.balanced.pad_ratio, "dist_ratio_vit": bal.balanced.dist_ratio_vit,
                "dist_ratio_llm": bal.balanced.dist_ratio_llm},
        "dist_ratio_reduction": {k: _finite(v) for k, v in bal.reduction().items()},
        "model": {"layers": cfg.n_layers, "vit_layers": vit_layers, "llm_layers": llm_layers, "d_model": d_model,
                  "patch_tokens": patch_tokens, "vit_mlp_ratio": vit_mlp_ratio, "profiled_shape": list(shape)},
        "profile_ms": {"fwd": [1e3 * x for x in mp.profile.fwd_s], "bwd": [1e3 * x for x in mp.profile.bwd_s]},
        "partition": {"stages": stages, "equal": list(mp.equal), "anchor": list(mp.bmp.anchor),
                      "bmp": list(mp.bmp.chosen),
                      "candidates": [{"boundaries": list(c.boundaries), "variance": c.variance, "comm": c.comm,
                                      "measured_s": mp.bmp.measured.get(c.boundaries)}
                                     for c in mp.bmp.candidates]},
        "simulated": mp.simulated,
        "recompute": {"capacity_bytes": mp.capacity, "recomputed_layers": sorted(mp.recompute),
                      "stage_bytes_full_recompute": mp.stage_memory_full, "stage_bytes_plan": mp.stage_memory_plan},
        "real_runs": runs,
    }
    if runs:
        report["speedup"] = runs["omnibal"]["median_tokens_per_s"] / runs["baseline"]["median_tokens_per_s"]
    with atomic_dir(out, overwrite) as tmp:
        atomic_write_json(tmp / "omnibal.json", report)
        atomic_write_text(tmp / "groups.jsonl", "".join(json.dumps(g.tolist()) + "\n" for g in bal.isf.groups))
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    r_, i_ = report["random"], report["isf"]
    typer.echo(f"ISF caps {bal.vit_cap} tiles / {bal.token_cap} tokens: {len(bal.isf.groups)} groups of "
               f"{report['mean_group_size']:.2f} samples" + (f" ({report['skipped_oversize']} oversize skipped)"
                                                               if report["skipped_oversize"] else ""))
    typer.echo(f"PadRatio {r_['pad_ratio']:.3f} -> {i_['pad_ratio']:.3f}; DistRatio ViT {r_['dist_ratio_vit']:.3f} -> "
               f"{i_['dist_ratio_vit']:.4f}, LLM {r_['dist_ratio_llm']:.3f} -> {i_['dist_ratio_llm']:.4f} "
               f"(random micro-batches of {micro_bs} vs ISF, {dp} ranks)")
    sim = mp.simulated
    typer.echo(f"partition into {stages} stages: equal {list(mp.equal)}, anchor {list(mp.bmp.anchor)}, BMP "
               f"{list(mp.bmp.chosen)}; simulated step {1e3 * sim['equal']['step_s']:.1f} -> "
               f"{1e3 * sim['bmp']['step_s']:.1f} ms -> {1e3 * sim['bmp+recompute']['step_s']:.1f} ms with the "
               "recompute plan")
    typer.echo(f"recompute stays on for {len(mp.recompute)} of {cfg.n_layers} layers "
               f"(capacity {mp.capacity / 2**20:.1f} MiB per stage)")
    if runs:
        typer.echo(f"real: baseline {runs['baseline']['median_step_s']:.3f} s/step, OmniBal "
                   f"{runs['omnibal']['median_step_s']:.3f} s/step; real-token throughput x{report['speedup']:.2f}")
    typer.echo(f"saved to {out} (omnibal.json, groups.jsonl)")
