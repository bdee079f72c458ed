"""Adaptive recompute: the knapsack plan against brute force, the wrapper against plain autograd.

Closed form for :func:`saved_activation_bytes` of ``nn.Linear(a, b)`` on an ``[n, a]`` input: the
forward is ``addmm(bias, x, Wᵀ)``; autograd saves ``x`` (for ``∇W = gᵀ x``) and, when ``x`` requires
grad, ``W`` (for ``∇x = g W``). ``W`` is a parameter (resident anyway, not counted), so the count is
the input's storage, ``n·a·4`` bytes in float32, whether or not ``x`` requires grad.
"""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from torch import nn

from lmforge.methods.omnibal.recompute import (
    Recomputed,
    apply_recompute,
    plan_recompute,
    plan_stages,
    recompute_delta_bytes,
    saved_activation_bytes,
)

torch.set_num_threads(1)


def _brute_force(mem: list[int], saved: list[float], free: int, granularity: int) -> list[int]:
    """Best subset by (saved time max, true bytes min, includes lower indices first) under the rounded budget."""
    n = len(mem)
    units = [-(-m // granularity) for m in mem]
    best_key, best = None, []
    for mask in itertools.product((1, 0), repeat=n):
        if sum(u for u, t in zip(units, mask) if t) > free // granularity:
            continue
        key = (sum(s for s, t in zip(saved, mask) if t), -sum(m for m, t in zip(mem, mask) if t), mask)
        if best_key is None or key > best_key:
            best_key, best = key, [i for i in range(n) if mask[i]]
    return best


def test_plan_equals_brute_force_integer_weights() -> None:
    rng = random.Random(0)
    for case in range(150):
        n = 12 if case % 10 == 0 else rng.randint(0, 10)
        mem = [rng.choice([0, rng.randint(1, 40)]) for _ in range(n)]
        saved = [float(rng.randint(0, 8)) for _ in range(n)]  # small integers: many exact ties
        free = rng.randint(1, max(1, sum(mem)))  # mostly a binding budget
        plan = plan_recompute(mem, saved, free, granularity=1)
        assert plan == _brute_force(mem, saved, free, 1), (mem, saved, free)
        assert sum(mem[i] for i in plan) <= free


def test_plan_equals_brute_force_float_times_coarse_units() -> None:
    rng = random.Random(1)
    mib = 1 << 20
    for _ in range(60):
        n = rng.randint(1, 9)
        mem = [rng.randint(0, 300 * mib) for _ in range(n)]
        saved = [rng.uniform(0.0, 0.05) for _ in range(n)]
        free = rng.randint(0, 800 * mib)
        plan = plan_recompute(mem, saved, free)
        want = _brute_force(mem, saved, free, mib) if free > 0 else []
        # float sums may differ by an ulp between summation orders; compare the optimum's value
        assert sum(saved[i] for i in plan) == pytest.approx(sum(saved[i] for i in want), rel=1e-12, abs=0)
        assert sum(mem[i] for i in plan) <= free  # rounding up ΔM keeps the plan inside the budget


def test_budget_is_never_exceeded() -> None:
    rng = random.Random(2)
    for _ in range(200):
        n = rng.randint(1, 16)
        g = rng.choice([1, 7, 1 << 10, 1 << 20])
        mem = [rng.randint(0, 50 * g) for _ in range(n)]
        saved = [rng.uniform(0, 1) for _ in range(n)]
        free = rng.randint(-5, 200 * g)
        plan = plan_recompute(mem, saved, free, granularity=g)
        assert plan == sorted(set(plan))
        assert sum(mem[i] for i in plan) <= max(free, 0)


def test_plan_edges() -> None:
    assert plan_recompute([10, 20], [1.0, 2.0], 0, granularity=1) == []
    assert plan_recompute([10, 20], [1.0, 2.0], -3, granularity=1) == []
    assert plan_recompute([10, 20], [1.0, 2.0], 30, granularity=1) == [0, 1]  # everything fits
    assert plan_recompute([10, 20], [1.0, 2.0], 25, granularity=1) == [1]
    assert plan_recompute([10, 10], [1.0, 1.0], 15, granularity=1) == [0]  # tie -> lower index
    assert plan_recompute([12, 10], [1.0, 1.0], 15, granularity=1) == [1]  # tie -> fewer bytes
    assert plan_recompute([10, 10], [1.0, 1.0], 25, granularity=8) == [0]  # 10 B -> 2 units of 8; 3 units free
    assert plan_recompute([0, 5], [0.0, 1.0], 5, granularity=1) == [0, 1]  # ΔM 0 costs nothing
    with pytest.raises(ValueError, match="non-negative"):
        plan_recompute([-1, 5], [1.0, 1.0], 10)
    with pytest.raises(ValueError):
        plan_recompute([1, 5], [1.0], 10)
    with pytest.raises(ValueError):
        plan_recompute([1], [float("nan")], 10)
    with pytest.raises(ValueError, match="coarser"):
        plan_recompute([1 << 40] * 4, [1.0] * 4, 1 << 40, granularity=1)


def test_plan_stages() -> None:
    rng = random.Random(3)
    mem = [rng.randint(1, 30) for _ in range(10)]
    saved = [rng.uniform(0, 1) for _ in range(10)]
    free = [25, 0, 60]
    plans = plan_stages(mem, saved, [3, 7], free, granularity=1)
    assert plans[0] == plan_recompute(mem[:3], saved[:3], 25, 1)
    assert plans[1] == []
    assert plans[2] == [7 + i for i in plan_recompute(mem[7:], saved[7:], 60, 1)]
    for plan, (a, b), f in zip(plans, [(0, 3), (3, 7), (7, 10)], free):
        assert all(a <= i < b for i in plan) and sum(mem[i] for i in plan) <= f
    with pytest.raises(ValueError):
        plan_stages(mem, saved, [3, 7], [1, 2], granularity=1)


def _stack(seed: int) -> list[nn.Module]:
    torch.manual_seed(seed)
    return [nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 6), nn.Tanh()).double() for _ in range(4)]


def _grads(layers: list[nn.Module], x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    params = [p for layer in layers for p in layer.parameters()]
    x = x.clone().requires_grad_(True)
    h = x
    for layer in layers:
        h = layer(h)
    grads = torch.autograd.grad(h.pow(2).sum(), [x, *params])
    return grads[0], list(grads[1:])


def test_apply_recompute_is_exact() -> None:
    layers = _stack(0)
    x = torch.randn(5, 6, dtype=torch.float64)
    gx, gp = _grads(layers, x)
    wrapped = apply_recompute(layers, {0, 2})
    assert isinstance(wrapped[0], Recomputed) and isinstance(wrapped[2], Recomputed)
    assert wrapped[1] is layers[1] and wrapped[3] is layers[3]
    gx2, gp2 = _grads(wrapped, x)
    assert torch.equal(gx, gx2) and all(torch.equal(a, b) for a, b in zip(gp, gp2))
    with pytest.raises(ValueError):
        apply_recompute(layers, {4})


def test_saved_bytes_linear_closed_form() -> None:
    n, a, b = 7, 5, 3
    lin = nn.Linear(a, b)
    assert saved_activation_bytes(lin, torch.randn(n, a)) == n * a * 4
    assert saved_activation_bytes(lin, torch.randn(n, a, requires_grad=True)) == n * a * 4
    assert saved_activation_bytes(lin, torch.randn(2, n, a)) == 2 * n * a * 4  # flattened view: one storage
    mlp = nn.Sequential(nn.Linear(a, 11), nn.Tanh())  # + tanh saves its output [n, 11]
    assert saved_activation_bytes(mlp, torch.randn(n, a)) == n * a * 4 + n * 11 * 4


def test_recompute_drops_saved_bytes() -> None:
    n = 9
    layer = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 6)).train()
    x = torch.randn(n, 6)
    plain = saved_activation_bytes(layer, x)
    # the input (first Linear), tanh's output (saved by tanh for its backward and by the second Linear
    # as its input: one storage, counted once)
    assert plain == n * 6 * 4 + n * 16 * 4
    wrapped = saved_activation_bytes(Recomputed(layer), x)
    assert wrapped == n * 6 * 4  # checkpoint keeps only the input
    assert recompute_delta_bytes(layer, x) == plain - wrapped
    assert saved_activation_bytes(Recomputed(layer).eval(), x) == plain  # eval: no checkpoint
