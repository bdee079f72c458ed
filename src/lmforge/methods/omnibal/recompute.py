"""Adaptive activation recompute: per pipeline stage, turn recompute off where the memory allows.

OmniBal (Yao et al., ICML 2025, arXiv 2407.20761), method section, memory balance (adaptive re-computation):
start from full activation recompute; record each stage's free memory; measure ΔM, the extra memory
of disabling recompute for one layer; then in each stage disable recompute for as many layers as fit
in its free memory. :func:`plan_recompute` makes "as many as fit" exact: a 0/1 knapsack that
maximises the recompute time saved (the forward time of the layers no longer recomputed) under the
stage's free bytes. :func:`apply_recompute` wraps the layers that keep recompute in
``torch.utils.checkpoint``; :func:`saved_activation_bytes` and :func:`recompute_delta_bytes` measure
what a layer's forward keeps for backward.

No kept library does this: ``torch.utils.checkpoint`` recomputes what it is told to and
``torch.distributed.pipelining`` (checked in torch 2.13) has no memory planning; OmniBal's official
repository (ModelTC/OmniBal) releases only the data-balancing (ISF) code, not this.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from lmforge.methods.omnibal.simulate import _check_boundaries

MAX_DP_CELLS = 50_000_000  # (layers + 1) x (capacity units + 1); raise granularity beyond this


def _exact_ints(values: Sequence[float]) -> list[int]:
    """The values times one common power of two, as exact integers (floats are dyadic rationals)."""
    ratios = [float(v).as_integer_ratio() for v in values]
    den = max((d for _, d in ratios), default=1)
    return [num * (den // d) for num, d in ratios]


def plan_recompute(delta_mem: Sequence[int], saved_time: Sequence[float], free_bytes: int,
                   granularity: int = 1 << 20) -> list[int]:
    """Which layers to turn recompute OFF for, within one stage's free memory (exact 0/1 knapsack).

    Maximises the total saved time subject to ``sum(delta_mem[i]) <= free_bytes`` by dynamic
    programming over memory units of ``granularity`` bytes. Each ΔM is rounded *up* to whole units
    and the budget *down*, so the plan never exceeds ``free_bytes`` (it may leave up to one unit per
    chosen layer unused). Ties in saved time go to the plan with fewer (true) bytes, then to the one
    that includes lower-indexed layers (the largest indicator vector, layer 0 most significant). The
    comparisons are exact: saved times are turned into integers without rounding.

    Args:
        delta_mem: ΔM per layer, the extra bytes kept when that layer is not recomputed (>= 0).
        saved_time: time saved per layer when it is not recomputed (its forward time, >= 0).
        free_bytes: the stage's free memory under full recompute; ``<= 0`` gives ``[]``.
        granularity: bytes per DP memory unit (1 makes the DP exact in bytes).

    Returns:
        Sorted indices of the layers whose recompute is disabled.

    Raises:
        ValueError: mismatched lengths, a negative ΔM, a negative or non-finite saved time, a
            granularity < 1, or a DP larger than ``MAX_DP_CELLS`` (use a coarser granularity).
    """
    n = len(delta_mem)
    if len(saved_time) != n:
        raise ValueError(f"delta_mem has {n} layers, saved_time {len(saved_time)}")
    if granularity < 1:
        raise ValueError(f"granularity must be >= 1, got {granularity}")
    mem = [int(d) for d in delta_mem]
    if any(d != dm for d, dm in zip(mem, delta_mem)) or any(d < 0 for d in mem):
        raise ValueError(f"delta_mem must be non-negative integers (bytes), got {list(delta_mem)}")
    if any(not (math.isfinite(t) and t >= 0) for t in saved_time):
        raise ValueError(f"saved_time must be finite and >= 0, got {list(saved_time)}")
    if free_bytes <= 0 or n == 0:
        return []
    units = [-(-d // granularity) for d in mem]  # ceil
    cap = min(int(free_bytes) // granularity, sum(units))
    if (n + 1) * (cap + 1) > MAX_DP_CELLS:
        raise ValueError(f"knapsack of {n} layers x {cap + 1} memory units is too large; "
                         f"use a coarser granularity than {granularity} bytes")
    value = _exact_ints(saved_time)
    # best[i][c]: the best (value, bytes) over layers i.. with c units, value max then bytes min.
    best_v = [[0] * (cap + 1) for _ in range(n + 1)]
    best_b = [[0] * (cap + 1) for _ in range(n + 1)]
    for i in reversed(range(n)):
        nv, nb, w, v, b = best_v[i + 1], best_b[i + 1], units[i], value[i], mem[i]
        row_v, row_b = nv[:], nb[:]
        for c in range(w, cap + 1):
            tv, tb = v + nv[c - w], b + nb[c - w]
            if tv > row_v[c] or (tv == row_v[c] and tb < row_b[c]):
                row_v[c], row_b[c] = tv, tb
        best_v[i], best_b[i] = row_v, row_b
    chosen, c = [], cap
    for i in range(n):  # take layer i whenever an optimal plan still can: lower indices win ties
        w = units[i]
        take = (value[i] + best_v[i + 1][c - w], mem[i] + best_b[i + 1][c - w]) if w <= c else None
        if take == (best_v[i][c], best_b[i][c]):
            chosen.append(i)
            c -= w
    return chosen


def plan_stages(delta_mem: Sequence[int], saved_time: Sequence[float], boundaries: Sequence[int],
                free_bytes_per_stage: Sequence[int], granularity: int = 1 << 20) -> list[list[int]]:
    """:func:`plan_recompute` in every pipeline stage, with that stage's free memory.

    Args:
        delta_mem: ΔM of every layer of the model (pipeline order).
        saved_time: saved time of every layer.
        boundaries: the N-1 stage boundaries (as in :func:`lmforge.methods.omnibal.simulate.stage_costs`).
        free_bytes_per_stage: N free-memory budgets.
        granularity: bytes per DP memory unit.

    Returns:
        Per stage, the sorted *global* indices of the layers whose recompute is disabled.
    """
    n = len(delta_mem)
    cuts = (0, *_check_boundaries(boundaries, n), n)
    if len(free_bytes_per_stage) != len(cuts) - 1:
        raise ValueError(f"{len(cuts) - 1} stages but {len(free_bytes_per_stage)} free-memory budgets")
    plans = []
    for (a, b), free in zip(zip(cuts, cuts[1:]), free_bytes_per_stage):
        local = plan_recompute(delta_mem[a:b], saved_time[a:b], free, granularity)
        plans.append([a + i for i in local])
    return plans


class Recomputed(nn.Module):
    """Runs ``layer`` under ``torch.utils.checkpoint`` (non-reentrant) in training with grad enabled.

    Args:
        layer: the wrapped module (kept as ``self.layer``).
    """

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.training and torch.is_grad_enabled():
            return checkpoint(self.layer, *args, use_reentrant=False, **kwargs)
        return self.layer(*args, **kwargs)


def apply_recompute(layers: Sequence[nn.Module], recompute: set[int]) -> list[nn.Module]:
    """The layers with those in ``recompute`` wrapped in :class:`Recomputed` (the others unchanged).

    Args:
        layers: the layer stack.
        recompute: indices of the layers that keep activation recompute.

    Returns:
        A new list; the wrappers share the original layers' parameters.
    """
    bad = sorted(i for i in recompute if not 0 <= i < len(layers))
    if bad:
        raise ValueError(f"recompute indices {bad} are outside 0..{len(layers) - 1}")
    return [Recomputed(layer) if i in recompute else layer for i, layer in enumerate(layers)]


def _storage_key(t: torch.Tensor) -> tuple[Any, int, int]:
    try:
        st = t.untyped_storage()
        return (t.device, st.data_ptr(), st.nbytes())
    except (RuntimeError, NotImplementedError):  # tensors without a plain storage: count as themselves
        return (t.device, id(t), t.numel() * t.element_size())


def saved_activation_bytes(module: nn.Module, *inputs: Any) -> int:
    """Bytes of the tensors one forward of ``module`` saves for backward (its activation memory).

    Measured with ``torch.autograd.graph.saved_tensors_hooks``: every tensor autograd packs is
    counted by its whole storage (a view keeps its storage alive), each distinct storage once. The
    module's own parameters and buffers (and views of them, e.g. a transposed weight) are not counted:
    they are resident anyway. A checkpointed module shows only the inputs checkpoint keeps.

    Args:
        module: the layer (run as called, in its current train/eval mode, with grad enabled).
        *inputs: its positional inputs.

    Returns:
        The byte count.
    """
    resident = {_storage_key(p)[:2] for p in [*module.parameters(), *module.buffers()]}
    seen: dict[tuple[Any, int], int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        dev, ptr, nbytes = _storage_key(t)
        if (dev, ptr) not in resident:
            seen[(dev, ptr)] = nbytes
        return t

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(*inputs)
    return sum(seen.values())


def recompute_delta_bytes(layer: nn.Module, *inputs: Any) -> int:
    """ΔM of one layer: its saved bytes without recompute minus those with recompute (>= 0).

    Under recompute a layer still keeps its inputs, so ΔM is what it saves beyond them.
    """
    plain = saved_activation_bytes(layer, *inputs)
    wrapped = Recomputed(layer).train(layer.training)
    return max(0, plain - saved_activation_bytes(wrapped, *inputs))
