"""The recompute plan's capacity read from the machine: ``/proc/meminfo`` (a file the tests write), CUDA's
free bytes (``torch.cuda`` replaced by fakes), and the plan at that capacity against brute force.

Closed forms: a rank's share is ``⌊MemAvailable · 1024 / ranks⌋``; the capacity is the share less
``⌈share · 10 / 100⌉`` and the 512 MiB (CPU) or 1 GiB (CUDA) reserve. The plan: per stage ``s`` of
``p`` (``f = min(p − s, m)`` micro-batches in flight), the stage's free bytes are the capacity less
``4 · params + f · Σ (act − ΔM)`` (full recompute), and the layers whose recompute goes off are the
best subset by brute force: saved forward time max, then bytes min, then lower indices, with ΔM·f
rounded up and the budget down to the planner's memory unit.
"""

from __future__ import annotations

import random

import pytest
import torch

from lmforge.methods.omnibal import plan as P
from tests.methods.omnibal.test_recompute import _brute_force

MIB = 2**20


def _meminfo(path, kb: int | None, extra: str = "") -> None:
    lines = ["MemTotal:       32000000 kB", "MemFree:         1000000 kB"]
    if kb is not None:
        lines.append(f"MemAvailable:   {kb} kB")
    path.write_text("\n".join([*lines, "Buffers:          100000 kB", extra]) + "\n")


def _closed_capacity(free_bytes: int, ranks: int, reserve: int) -> int:
    share = free_bytes // ranks
    return max(0, share - -(-share // 10) - reserve)


def _brute_plan(mem: P.LayerMemory, fwd: list[float], bounds: list[int], cap: int, n_micro: int) -> set[int]:
    """Layers that keep recompute, by a naive loop over stages and every subset of each stage."""
    n = len(fwd)
    cuts = [0, *bounds, n]
    p = len(cuts) - 1
    frees, stages = [], []
    for s in range(p):
        idx = list(range(cuts[s], cuts[s + 1]))
        flight = min(p - s, n_micro)
        full = 4 * sum(mem.param_bytes[i] for i in idx) + flight * sum(mem.act_bytes[i] - mem.delta_bytes[i]
                                                                       for i in idx)
        frees.append(cap - full)
        stages.append((idx, flight))
    unit = max(4096, -(-max(max(frees), 1) // 200_000))
    off: set[int] = set()
    for (idx, flight), free in zip(stages, frees):
        chosen = _brute_force([mem.delta_bytes[i] * flight for i in idx], [fwd[i] for i in idx], free, unit)
        off |= {idx[j] for j in chosen}
    return set(range(n)) - off


def _memory(seed: int, n: int) -> tuple[P.LayerMemory, list[float]]:
    rng = random.Random(seed)
    params = [rng.randint(1, 8) * MIB for _ in range(n)]
    act = [rng.randint(20, 120) * MIB + rng.randint(0, 4095) for _ in range(n)]
    delta = [a - rng.randint(1, 10) * MIB for a in act]  # a recomputed layer keeps its input
    fwd = [rng.randint(1, 12) * 0.25 for _ in range(n)]  # dyadic: float sums are exact, ties are real
    return P.LayerMemory(params, act, delta), fwd


def test_read_mem_available(tmp_path):
    f = tmp_path / "meminfo"
    _meminfo(f, 123456)
    assert P.read_mem_available(f) == 123456 * 1024
    _meminfo(f, None)
    with pytest.raises(ValueError, match="MemAvailable"):
        P.read_mem_available(f)
    f.write_text("MemAvailable: lots\n")
    with pytest.raises(ValueError, match="malformed"):
        P.read_mem_available(f)
    with pytest.raises(OSError):
        P.read_mem_available(tmp_path / "missing")


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_measured_capacity_plans_as_brute_force(tmp_path, monkeypatch, ranks):
    """MemAvailable swept from below full recompute's need to above no recompute's: the capacity is
    the closed form and the plan at it equals brute force; the sweep crosses several plans."""
    f = tmp_path / "meminfo"
    monkeypatch.setattr(P, "MEMINFO", f)
    n_micro, bounds = 4, [3, 5]
    mem, fwd = _memory(ranks, 8)
    everything = set(range(8))
    full = max(P.stage_memory(mem, bounds, everything, n_micro))
    none = max(P.stage_memory(mem, bounds, set(), n_micro))
    kept_counts = set()
    for k in range(-1, 12):
        target = full + k * (none - full) // 10  # the capacity wanted
        kb = -(-(target + 512 * MIB) * ranks * 10 // 9) // 1024
        _meminfo(f, kb)
        got = P.measured_capacity("cpu", ranks)
        assert got.free_bytes == [kb * 1024] and got.ranks == [ranks] and got.read_from.startswith("/proc/meminfo")
        assert got.capacity == _closed_capacity(kb * 1024, ranks, 512 * MIB)
        assert abs(got.capacity - target) <= 1024 * ranks  # the sweep lands where it meant to
        keep = P.recompute_plan(mem, fwd, bounds, got.capacity, n_micro)
        assert keep == _brute_plan(mem, fwd, bounds, got.capacity, n_micro), k
        assert all(a <= got.capacity for a, b in zip(P.stage_memory(mem, bounds, keep, n_micro),
                                                     P.stage_memory(mem, bounds, everything, n_micro))
                   if b <= got.capacity)  # a stage that fits under full recompute still fits
        kept_counts.add(len(keep))
    assert max(kept_counts) == 8 and min(kept_counts) == 0 and len(kept_counts) >= 4


def test_small_machines_give_zero_capacity(tmp_path, monkeypatch):
    f = tmp_path / "meminfo"
    monkeypatch.setattr(P, "MEMINFO", f)
    _meminfo(f, 300 * 1024)  # 300 MiB for 1 rank: below the 512 MiB reserve
    assert P.measured_capacity("cpu", 1).capacity == 0
    mem, fwd = _memory(0, 6)
    assert P.recompute_plan(mem, fwd, [3], 0, 4) == set(range(6))  # nothing fits: full recompute stays


def test_cuda_capacity_shares_each_device_among_its_ranks(monkeypatch):
    """3 ranks on 2 devices (rank r on device r mod 2): device 0 holds ranks 0 and 2, device 1 rank 1."""
    free = {0: 40 * 2**30, 1: 15 * 2**30}
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d: (free[d], 80 * 2**30))
    got = P.measured_capacity("cuda", 3)
    assert got.free_bytes == [free[0], free[1]] and got.ranks == [2, 1]
    assert got.read_from == "torch.cuda.mem_get_info" and got.reserve_bytes == 2**30
    assert got.capacity == min(_closed_capacity(free[0], 2, 2**30), _closed_capacity(free[1], 1, 2**30))
    assert got.capacity == _closed_capacity(free[1], 1, 2**30)  # 13.5 GiB - 1 GiB < 18 GiB - 1 GiB
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(RuntimeError, match="no CUDA device"):
        P.measured_capacity("cuda", 1)
