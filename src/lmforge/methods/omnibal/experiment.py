"""OmniBal end to end: balance the data, partition the model, plan the memory, time real steps.

Used by ``lmforge train omnibal`` and ``lmforge reproduce omnibal``; each step is one function:

* :func:`balance_data`: the ISF cap search (or given caps), ISF, and PadRatio/DistRatio of ISF
  against plain random micro-batches, over ``dp`` ranks.
* :func:`plan_model`: profile the model's layers on a typical ISF micro-batch, BMP under full
  recompute, then the recompute plan on BMP's partition; per-stage times and the simulated 1F1B
  step of the equal split, the greedy anchor, BMP's pick and BMP's pick with the recompute plan.
* :func:`timed_run`: real training steps on ``pp`` processes (1F1B; gloo on CPUs, or NCCL with one
  CUDA device per rank), median step time and real-token throughput.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from lmforge.methods.omnibal import plan as P
from lmforge.methods.omnibal.bmp import BMPResult, bmp_search, equal_split
from lmforge.methods.omnibal.isf import ISFResult, group_sums, isf
from lmforge.methods.omnibal.metrics import BalanceMetrics, balance_metrics
from lmforge.methods.omnibal.pipeline import StepPlan, VLMConfig, launch, train_steps
from lmforge.methods.omnibal.sampler import ISFBatchSampler
from lmforge.methods.omnibal.profile import LayerProfile, profile_layers
from lmforge.methods.omnibal.search import CapSearchResult, search_caps
from lmforge.methods.omnibal.simulate import simulate_1f1b_trace, stage_costs


@dataclass
class DataBalance:
    """ISF against random micro-batches (the paper's Table of PadRatio / DistRatio)."""

    vit_cap: int
    token_cap: int
    token_floor: int
    isf: ISFResult
    random: BalanceMetrics
    balanced: BalanceMetrics
    search: CapSearchResult | None = None

    def reduction(self) -> dict[str, float]:
        """How many times lower ISF's DistRatios are (inf where ISF's is 0)."""
        def ratio(a: float, b: float) -> float:
            return float("inf") if b == 0 else a / b
        return {"vit": ratio(self.random.dist_ratio_vit, self.balanced.dist_ratio_vit),
                "llm": ratio(self.random.dist_ratio_llm, self.balanced.dist_ratio_llm)}


def balance_data(vit: np.ndarray, tok: np.ndarray, dp: int, micro_bs: int, rounds: int = 50, seed: int = 1024,
                 vit_cap: int | None = None, token_cap: int | None = None, shuffle_seed: int = 0,
                 progress: Callable[[Any], None] | None = None) -> DataBalance:
    """Caps (searched unless both are given), ISF, and the metrics of both batchings.

    The random baseline shuffles the samples once (``shuffle_seed``) before Megatron's sampler
    shards them, so a length file sorted by subset does not put one subset on one rank.
    """
    search = None
    if vit_cap is None or token_cap is None:
        search = search_caps(vit, tok, dp_size=dp, micro_bs=micro_bs, rounds=rounds, seed=seed, progress=progress)
        vit_cap, token_cap, floor = search.vit_cap, search.token_cap, search.token_floor
    else:
        floor = token_cap - 128
    res = isf(vit, tok, vit_cap, token_cap, rounds=rounds, seed=seed, token_floor=floor)
    order = np.random.default_rng(shuffle_seed).permutation(len(vit))
    rand = balance_metrics(vit[order], tok[order], dp, micro_bs)
    gv, gt = group_sums(res.groups, vit, tok)
    bal = balance_metrics(gv, gt, dp, 1)
    return DataBalance(int(vit_cap), int(token_cap), int(floor), res, rand, bal, search)


@dataclass
class ModelPlan:
    """Profile, partitions and the recompute plan for ``n_stages`` pipeline stages.

    ``simulated[name]`` for ``name`` in ``equal``, ``anchor``, ``bmp``, ``bmp+recompute`` (the first
    three under full recompute) holds ``boundaries``; per stage and micro-batch ``stage_fwd_s``,
    ``stage_bwd_s`` (backward plus the forward of its recomputed layers) and ``stage_s`` (their
    per-layer sum); ``slowest_stage`` (index, ties to the first) and ``slowest_stage_s``; the 1F1B
    simulator's ``step_s`` (makespan of ``n_micro`` micro-batches) and ``bubble_s`` (each stage's
    idle time within it, ``step_s − n_micro · stage time``).
    """

    profile: LayerProfile
    memory: P.LayerMemory
    n_stages: int
    n_micro: int
    equal: tuple[int, ...]
    bmp: BMPResult
    capacity: int
    recompute: set[int]
    stage_memory_full: list[int]
    stage_memory_plan: list[int]
    simulated: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def bwd_full(self) -> list[float]:
        """Backward times under full recompute."""
        return P.with_recompute(self.profile.fwd_s, self.profile.bwd_s, set(range(len(self.profile.fwd_s))))


def plan_model(cfg: VLMConfig, shape: tuple[int, int], n_stages: int, n_micro: int, top_k: int = 3,
               runner: Callable[[Sequence[int]], float] | None = None, repeats: int = 5,
               capacity: int | None = None, seed: int = 0, device: str = "cpu") -> ModelPlan:
    """Profile on one ``(n_tiles, T)`` micro-batch, BMP under full recompute, then the memory plan.

    Args:
        cfg: the model.
        shape: the profiled micro-batch (a typical ISF group).
        n_stages: pipeline stages.
        n_micro: micro-batches per step.
        top_k: BMP candidates to run.
        runner: ``runner(boundaries) -> seconds`` for BMP's candidates (default: the 1F1B simulator).
        repeats: timed repeats per layer in the profile.
        capacity: bytes per device (default :func:`~lmforge.methods.omnibal.plan.capacity_rule`).
        seed: model seed.
        device: where the layers are profiled and measured (``"cpu"`` or ``"cuda"``: the device the
            run will use).
    """
    dev = torch.device(device)

    def model() -> tuple[list[torch.nn.Module], torch.Tensor]:
        layers, x = P.example_input(cfg, shape, seed)
        return [layer.to(dev) for layer in layers], x.to(dev)

    layers, x = model()
    prof = profile_layers(layers, x, repeats=repeats, warmup=1)
    layers, x = model()
    mem = P.layer_memory(layers, x)
    n = len(layers)
    everything = set(range(n))
    bwd_full = P.with_recompute(prof.fwd_s, prof.bwd_s, everything)
    result = bmp_search(prof.fwd_s, bwd_full, prof.out_bytes, n_stages, n_micro, top_k=top_k, runner=runner)
    equal = tuple(equal_split(n, n_stages))
    cap = P.capacity_rule(mem, equal, n_micro) if capacity is None else int(capacity)
    keep = P.recompute_plan(mem, prof.fwd_s, result.chosen, cap, n_micro)
    plan = ModelPlan(prof, mem, n_stages, n_micro, equal, result, cap, keep,
                     P.stage_memory(mem, result.chosen, everything, n_micro),
                     P.stage_memory(mem, result.chosen, keep, n_micro))
    for name, cuts, rec in (("equal", equal, everything), ("anchor", result.anchor, everything),
                            ("bmp", result.chosen, everything), ("bmp+recompute", result.chosen, keep)):
        bwd = P.with_recompute(prof.fwd_s, prof.bwd_s, rec)
        f, b = stage_costs(prof.fwd_s, list(cuts)), stage_costs(bwd, list(cuts))
        both = stage_costs([x + y for x, y in zip(prof.fwd_s, bwd, strict=True)], list(cuts))
        trace = simulate_1f1b_trace(f, b, n_micro)
        plan.simulated[name] = {"boundaries": list(cuts), "stage_fwd_s": f, "stage_bwd_s": b, "stage_s": both,
                                "slowest_stage": both.index(max(both)),
                                "slowest_stage_s": P.slowest_stage(prof.fwd_s, bwd, cuts),
                                "step_s": trace.makespan, "bubble_s": list(trace.bubble)}
    if dev.type == "cuda":  # hand the profile's cached blocks back before the ranks start
        del layers, x
        torch.cuda.empty_cache()
    return plan


def micro_streams(vit: np.ndarray, tok: np.ndarray, cfg: VLMConfig, balance: DataBalance, steps: int, seed: int,
                  n_micro: int, micro_bs: int) -> tuple[tuple[list[StepPlan], list[int]], tuple[list[StepPlan], list[int]],
                                                        list[tuple[int, int]]]:
    """The baseline and the ISF micro-batch streams for ``steps`` steps of ``n_micro``.

    Baseline: a seeded shuffle cut into micro-batches of ``micro_bs`` samples, each padded to its
    longest sample. ISF: the groups in :class:`~lmforge.methods.omnibal.sampler.ISFBatchSampler`
    order (epoch ``seed``), one packed micro-batch each. Returns ``((plans, real tokens per step)``
    for both, and the ISF micro-batches as ``(n_tiles, T)``.
    """
    tiles, text = P.scale_samples(vit, tok, cfg.patch_tokens)
    order = np.random.default_rng(seed).permutation(len(vit))[: n_micro * micro_bs * steps]
    base, base_real = P.padded_micro(tiles, text, order.reshape(-1, micro_bs), cfg.patch_tokens)
    sampler = ISFBatchSampler.from_result(balance.isf)
    sampler.set_epoch(seed)
    groups = [np.asarray(g) for _, g in zip(range(n_micro * steps), sampler, strict=False)]
    packed = P.packed_micro(tiles, text, groups)
    packed_real = [n * cfg.patch_tokens + t for n, t in packed]

    def per_step(real: list[int]) -> list[int]:
        return [sum(real[i * n_micro:(i + 1) * n_micro]) for i in range(steps)]

    return ((P.step_plans(base, n_micro, steps), per_step(base_real)),
            (P.step_plans(packed, n_micro, steps), per_step(packed_real)), packed)


def timed_run(cfg: VLMConfig, boundaries: Sequence[int], recompute: set[int], plans: Sequence[StepPlan],
              real_tokens: Sequence[int], seed: int = 0, threads: int = 1, timeout_s: float = 600.0,
              backend: str = "gloo", device: str = "cpu") -> dict[str, Any]:
    """Train ``len(plans)`` real steps on ``len(boundaries) + 1`` processes (pp only), on ``backend``
    (gloo, or NCCL with ``device="cuda"``: rank ``r`` on ``cuda:r``, see :func:`launch`).

    Returns the per-step seconds (max over ranks), their median, and the median real-token
    throughput (``real_tokens[k] / seconds[k]``).
    """
    pp = len(boundaries) + 1
    out = launch(pp, train_steps, pp, 1, cfg, list(boundaries), set(recompute), list(plans), seed,
                 threads=threads, timeout_s=timeout_s, backend=backend, optimizer="adamw", device=device)
    secs = out[0]["step_seconds"]
    tput = [t / s for t, s in zip(real_tokens, secs, strict=True)]
    return {"step_seconds": secs, "median_step_s": float(np.median(secs)),
            "median_tokens_per_s": float(np.median(tput)), "real_tokens_per_step": float(np.mean(real_tokens)),
            "losses": out[-1].get("losses", [])}
