"""``lmforge train omnibal``: OmniBal's data balance, model partition and memory plan (Yao et al., ICML 2025).

From a per-sample length file (the official ``{"vit_num", "token_num"}`` records) it runs ISF (the
official cap search unless caps are given) and reports PadRatio and DistRatio against random
micro-batches; profiles a VLM-shaped model on a typical ISF micro-batch; picks BMP's pipeline
partition and the recompute plan; and, unless ``--steps 0``, trains that model for real on
``--stages`` processes (1F1B; gloo on the CPU, or NCCL with ``--device cuda``), the baseline and
OmniBal side by side. It writes ``omnibal.json`` (everything reported) and ``groups.jsonl`` (the
ISF micro-batches as sample indices, for a user's own data loader).

The report shows where the time goes: per pipeline stage, the profiled forward and backward time
of one micro-batch and the simulated 1F1B step (with each stage's idle time) for the equal split,
the greedy anchor, BMP's pick and BMP's pick with the recompute plan. The recompute plan's
capacity is measured (the free memory now, less a safety margin: see
:func:`~lmforge.methods.omnibal.plan.measured_capacity`) unless ``--capacity-mb`` states it or
``--capacity-source modelled`` asks for the modelled rule; ``omnibal.json`` says which was used.
Without ``--capacity-source`` a memory that cannot be read falls back to the modelled rule with a
warning; ``--capacity-source measured`` makes it an error. Warnings about the capacity are printed
and kept in ``omnibal.json`` (``recompute.warnings``).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from lmforge.commands.groups import train_app
from lmforge.common.errors import UserError

JsonOpt = Annotated[bool, typer.Option("--json", help="Print results as JSON on stdout.")]


def _finite(x: float) -> float | None:
    return None if x != x or x in (float("inf"), float("-inf")) else x


def _check_devices(backend: str, device: str, stages: int, steps: int) -> None:
    """``--backend`` and ``--device``: known names, CUDA present when asked for, one device per NCCL rank."""
    if backend not in ("gloo", "nccl"):
        raise UserError(f"--backend must be gloo or nccl, got {backend!r}")
    if device not in ("cpu", "cuda"):
        raise UserError(f"--device must be cpu or cuda, got {device!r}")
    if backend == "gloo" and device == "cpu":
        return
    import torch

    asked = "--backend nccl" if backend == "nccl" else "--device cuda"
    if not torch.cuda.is_available():
        raise UserError(f"{asked} needs CUDA, and torch.cuda.is_available() is False here")
    # NOTE: NCCL communicates CUDA tensors only, and gloo's point-to-point send/recv (what the
    # pipeline's stages use) takes CPU tensors only (torch.distributed's backend table): the two
    # working pairs are gloo/cpu and nccl/cuda.
    if backend == "nccl" and device != "cuda":
        raise UserError("--backend nccl needs --device cuda (NCCL communicates CUDA tensors only)")
    if backend == "gloo" and device == "cuda":
        raise UserError("--device cuda needs --backend nccl (gloo's pipeline sends take CPU tensors only)")
    if steps and torch.cuda.device_count() < stages:
        raise UserError(f"--backend nccl puts each of the {stages} stages on its own CUDA device, and "
                        f"{torch.cuda.device_count()} are visible: lower --stages or pass --steps 0")


def _capacity_text(rec: dict[str, Any]) -> str:
    """How the recompute plan's capacity was found, in words."""
    m = rec["measured"]
    if rec["capacity_source"] == "stated":
        return "stated by --capacity-mb"
    if m is None:
        return "modelled: halfway between full recompute and none on the equal split's fullest stage"
    shares = ", ".join(f"{f / 2**20:.0f} MiB / {k} rank{'s' if k > 1 else ''}"
                       for f, k in zip(m["free_bytes"], m["ranks"], strict=True))
    others = "; ".join(f"{src} {b / 2**20:.0f} MiB" for src, b in m["readings"].items() if src != m["read_from"])
    return (f"measured, {m['read_from']} {shares}, less {100 * m['margin_fraction']:.0f}% and "
            f"{m['reserve_bytes'] / 2**20:.0f} MiB per rank" + (f" (also read: {others})" if others else ""))


def _stage_lines(sim: dict[str, dict[str, Any]], n_micro: int) -> list[str]:
    """Per configuration: each stage's forward+backward ms per micro-batch, the slowest stage, the
    simulated step and each stage's idle time; then the configurations by slowest stage."""
    lines = [f"per stage, one micro-batch (forward+backward ms) and the simulated 1F1B step of {n_micro} "
             "micro-batches:"]
    width = max(len(k) for k in sim)
    for name, r in sim.items():
        stages = " | ".join(f"{1e3 * f:.1f}+{1e3 * b:.1f}" for f, b in zip(r["stage_fwd_s"], r["stage_bwd_s"]))
        idle = " | ".join(f"{1e3 * x:.1f}" for x in r["bubble_s"])
        lines.append(f"  {name:<{width}} {r['boundaries']}: {stages}; slowest stage {r['slowest_stage']} "
                     f"({1e3 * r['slowest_stage_s']:.1f} ms); step {1e3 * r['step_s']:.1f} ms, idle {idle} ms")
    order = sorted(sim, key=lambda k: sim[k]["slowest_stage_s"])  # stable: ties keep the report's order
    text = order[0] + f" {1e3 * sim[order[0]]['slowest_stage_s']:.2f}"
    for a, b in zip(order, order[1:]):
        rel = "=" if sim[a]["slowest_stage_s"] == sim[b]["slowest_stage_s"] else "<"
        text += f" {rel} {b} {1e3 * sim[b]['slowest_stage_s']:.2f}"
    lines.append(f"slowest stage, fastest first: {text} ms")
    return lines


@train_app.command("omnibal")
def omnibal_cmd(
    lengths: Annotated[str, typer.Option(help="Per-sample lengths: a JSON list (or .jsonl) of {'vit_num', 'token_num'} records, an official wrap file {name: {'token_lengths': PATH}}, or `internvl` for the generator fitted to InternVL-1.2M's released lengths.")],
    out: Annotated[Path, typer.Option(help="Output folder: omnibal.json (the report) and groups.jsonl (ISF micro-batches as sample indices).")],
    stages: Annotated[int, typer.Option(help="Pipeline stages (one process each for the real steps: gloo on the CPU, or NCCL with --backend nccl --device cuda).")] = 2,
    dp: Annotated[int, typer.Option(help="Data-parallel ranks for PadRatio/DistRatio (the official test: 8).")] = 8,
    micro_bs: Annotated[int, typer.Option(help="Samples per random micro-batch (the baseline) and the cap search's target group size.")] = 4,
    vit_cap: Annotated[int | None, typer.Option(help="ISF ViT cap Q_v in tiles (with --token-cap: skip the cap search).")] = None,
    token_cap: Annotated[int | None, typer.Option(help="ISF token cap Q_t (the floor is Q_t - 128, as the official code).")] = None,
    rounds: Annotated[int, typer.Option(help="ISF iterations (official iter_time: 50).")] = 50,
    isf_seed: Annotated[int, typer.Option(help="ISF shuffle seed (official: 1024).")] = 1024,
    skip_oversize: Annotated[bool, typer.Option(help="Skip samples larger than a cap on their own, as the official code does silently (they are counted).")] = False,
    micro_batches: Annotated[int, typer.Option(help="Micro-batches per step (1F1B needs at least --stages).")] = 8,
    steps: Annotated[int, typer.Option(help="Real training steps per configuration on --stages processes (--backend, --device); 0: plan only.")] = 20,
    top_k: Annotated[int, typer.Option(help="BMP: how many of the best-ranked candidates (stage-time variance, then communication) to score in the 1F1B simulator on the profiled costs (`lmforge reproduce omnibal` also runs them for real).")] = 3,
    capacity_mb: Annotated[float | None, typer.Option(help="Stated memory per stage in MiB for the recompute plan (positive and finite; instead of --capacity-source).")] = None,
    capacity_source: Annotated[str | None, typer.Option(help="Where the recompute plan's per-stage capacity comes from without --capacity-mb: `measured` (the free memory now: on a CPU the smaller of /proc/meminfo's MemAvailable and the cgroup's free memory, shared by the --stages ranks; torch.cuda.mem_get_info on CUDA; less 10% and a per-rank reserve; an error where it cannot be read) or `modelled` (halfway between full recompute and none on the equal split's fullest stage). Not given: measured, falling back to modelled with a warning where the memory cannot be read.")] = None,
    backend: Annotated[str, typer.Option(help="Process-group backend of the real steps: gloo (CPU) or nccl (CUDA, one device per stage).")] = "gloo",
    device: Annotated[str, typer.Option(help="Where the model is profiled and the real steps run: cpu or cuda (with --backend nccl).")] = "cpu",
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
      lmforge train omnibal --lengths internvl --stages 4 --backend nccl --device cuda --out runs/gpu
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
    if capacity_source is not None and capacity_source not in ("measured", "modelled"):
        raise UserError(f"--capacity-source must be measured or modelled, got {capacity_source!r}")
    if capacity_mb is not None and capacity_source is not None:
        raise UserError("give --capacity-mb (a stated capacity) or --capacity-source, not both")
    # NOTE: finite in bytes too (MiB · 2**20): 1e308 MiB is a finite float whose bytes overflow to inf.
    if capacity_mb is not None and not (capacity_mb > 0 and math.isfinite(capacity_mb * 2**20)):
        raise UserError(f"--capacity-mb must be positive and finite, got {capacity_mb}")
    _check_devices(backend, device, stages, steps)
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

    # NOTE: the free memory is read after the inputs are checked and before any work (ISF, the
    # profile) allocates anything, so an explicit `--capacity-source measured` that cannot be read
    # stops the run before it starts.
    source = "stated" if capacity_mb is not None else (capacity_source or "measured")
    measured, warnings = None, []
    if source == "measured":
        try:
            measured = P.measured_capacity(device, stages)
        except (OSError, ValueError, RuntimeError) as exc:
            why = " ".join(str(exc).split())
            if capacity_source == "measured":  # asked for: no fallback
                raise UserError(f"--capacity-source measured: cannot read the free memory ({why}); pass "
                                "--capacity-source modelled or --capacity-mb MIB") from None
            warnings.append(f"cannot read the free memory ({why}); the recompute plan uses the modelled capacity")
            source = "modelled"
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
    for w in warnings:  # printed once the inputs have passed every check
        typer.echo(f"warning: {w}", err=True)
    cap = (int(capacity_mb * 2**20) if source == "stated" else measured.capacity if measured is not None
           else None)
    mp = plan_model(cfg, shape, stages, micro_batches, top_k=top_k, capacity=cap, seed=seed, device=device)
    over = [s for s, need in enumerate(mp.stage_memory_full) if need > mp.capacity]
    if over:
        warnings.append(f"stage{'s' if len(over) > 1 else ''} {', '.join(map(str, over))} need"
                        f"{'' if len(over) > 1 else 's'} more than the capacity of {mp.capacity / 2**20:.1f} MiB "
                        "even with full recompute (modelled)")
        typer.echo(f"warning: {warnings[-1]}", err=True)
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
            say(f"{steps} real steps on {stages} {backend} processes: {name} ...")
            r = timed_run(cfg, cuts, rec, plans, real, seed=seed, backend=backend, device=device)
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
        "partition": {"stages": stages, "micro_batches": micro_batches, "equal": list(mp.equal),
                      "anchor": list(mp.bmp.anchor),
                      "bmp": list(mp.bmp.chosen),
                      "candidates": [{"boundaries": list(c.boundaries), "stage_s": list(c.stage_times),
                                      "variance": c.variance, "comm": c.comm,
                                      "measured_s": mp.bmp.measured.get(c.boundaries)}
                                     for c in mp.bmp.candidates]},
        "simulated": mp.simulated,
        "recompute": {"capacity_source": source, "capacity_bytes": mp.capacity,
                      "measured": None if measured is None else measured.as_dict(), "warnings": warnings,
                      "recomputed_layers": sorted(mp.recompute),
                      "stage_bytes_full_recompute": mp.stage_memory_full, "stage_bytes_plan": mp.stage_memory_plan,
                      "layer_bytes": {"param": mp.memory.param_bytes, "activation": mp.memory.act_bytes,
                                      "recompute_delta": mp.memory.delta_bytes}},
        "run": {"backend": backend, "device": device},
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
    for line in _stage_lines(sim, micro_batches):
        typer.echo(line)
    typer.echo(f"recompute stays on for {len(mp.recompute)} of {cfg.n_layers} layers "
               f"(capacity {mp.capacity / 2**20:.1f} MiB per stage, {_capacity_text(report['recompute'])})")
    if runs:
        typer.echo(f"real: baseline {runs['baseline']['median_step_s']:.3f} s/step, OmniBal "
                   f"{runs['omnibal']['median_step_s']:.3f} s/step; real-token throughput x{report['speedup']:.2f}")
    typer.echo(f"saved to {out} (omnibal.json, groups.jsonl)")
