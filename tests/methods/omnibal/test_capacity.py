"""The recompute plan's capacity read from the machine: ``/proc/meminfo`` and the cgroup's memory files
(files the tests write), CUDA's free bytes (``torch.cuda`` replaced by fakes), and the plan at that
capacity against brute force.

The CPU's free memory is the smaller of ``MemAvailable`` and the cgroup's ``limit − usage`` (v2:
``memory.max − memory.current``, ``max`` meaning no limit; v1: ``memory.limit_in_bytes −
memory.usage_in_bytes``, 9223372036854771712 meaning no limit), and the report names the smaller.

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
V1_NO_LIMIT = 9223372036854771712  # what cgroup v1 shows without a limit (4 KiB pages)


@pytest.fixture(autouse=True)
def _no_cgroup(tmp_path, monkeypatch):
    """No cgroup limit unless a test writes one: the machine's own cgroup stays out of the checks."""
    monkeypatch.setattr(P, "CGROUP", tmp_path / "no-cgroup")


def _cgroup(root, v2: tuple[str, int] | None = None, v1: tuple[int, int] | None = None):
    """A fake cgroup mount: v2 ``(memory.max, memory.current)``, v1 ``(limit, usage)``."""
    root.mkdir(parents=True, exist_ok=True)
    if v2 is not None:
        (root / "memory.max").write_text(f"{v2[0]}\n")
        (root / "memory.current").write_text(f"{v2[1]}\n")
    if v1 is not None:
        (root / "memory").mkdir(exist_ok=True)
        (root / "memory" / "memory.limit_in_bytes").write_text(f"{v1[0]}\n")
        (root / "memory" / "memory.usage_in_bytes").write_text(f"{v1[1]}\n")
    return root


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


MEMINFO_SRC = "/proc/meminfo MemAvailable"
V2_SRC = "cgroup v2 memory.max - memory.current"
V1_SRC = "cgroup v1 memory.limit_in_bytes - memory.usage_in_bytes"


@pytest.mark.parametrize(("v2", "v1", "want_source", "want_readings"), [
    # v2 limited: 6 GiB limit, 2 GiB used -> 4 GiB free, below MemAvailable's 20 GiB
    (("6442450944", 2 * 2**30), None, V2_SRC, {MEMINFO_SRC: 20 * 2**30, V2_SRC: 4 * 2**30}),
    # v2 without a limit: only MemAvailable
    (("max", 2 * 2**30), None, MEMINFO_SRC, {MEMINFO_SRC: 20 * 2**30}),
    # v1 limited: 3 GiB limit, 1 GiB used
    (None, (3 * 2**30, 2**30), V1_SRC, {MEMINFO_SRC: 20 * 2**30, V1_SRC: 2 * 2**30}),
    # v1 without a limit (the huge value): only MemAvailable
    (None, (V1_NO_LIMIT, 2**30), MEMINFO_SRC, {MEMINFO_SRC: 20 * 2**30}),
    # no cgroup files at all
    (None, None, MEMINFO_SRC, {MEMINFO_SRC: 20 * 2**30}),
    # a cgroup limit above MemAvailable: MemAvailable bounds, both are recorded
    (("107374182400", 2**30), None, MEMINFO_SRC, {MEMINFO_SRC: 20 * 2**30, V2_SRC: 99 * 2**30}),
    # usage above the limit (the kernel reclaims lazily): 0 free, not negative
    (("1073741824", 2 * 2**30), None, V2_SRC, {MEMINFO_SRC: 20 * 2**30, V2_SRC: 0}),
])
def test_cpu_free_memory_is_the_smaller_of_meminfo_and_the_cgroup(tmp_path, v2, v1, want_source, want_readings):
    f = tmp_path / "meminfo"
    _meminfo(f, 20 * 2**20)  # 20 GiB in kB
    root = _cgroup(tmp_path / "cg", v2, v1)
    free, source, readings = P.read_cpu_free(f, root)
    assert (free, source, readings) == (min(want_readings.values()), want_source, want_readings)
    got = P.measured_capacity("cpu", 2, meminfo=f, cgroup=root)
    assert got.read_from == want_source and got.free_bytes == [free] and got.readings == want_readings
    assert got.capacity == _closed_capacity(free, 2, 512 * MIB)
    assert got.as_dict()["readings"] == want_readings  # what omnibal.json records


def test_the_default_paths_are_the_module_constants(tmp_path, monkeypatch):
    f = tmp_path / "meminfo"
    _meminfo(f, 8 * 2**20)
    monkeypatch.setattr(P, "MEMINFO", f)
    monkeypatch.setattr(P, "CGROUP", _cgroup(tmp_path / "cg", v2=("2147483648", 2**30)))
    got = P.measured_capacity("cpu", 1)
    assert got.read_from == V2_SRC and got.free_bytes == [2**30]


def test_bad_cgroup_files_raise(tmp_path):
    f = tmp_path / "meminfo"
    _meminfo(f, 20 * 2**20)
    root = _cgroup(tmp_path / "a", v2=("lots", 0))
    with pytest.raises(ValueError, match="memory.max"):
        P.read_cpu_free(f, root)
    root = _cgroup(tmp_path / "b", v2=("2147483648", 0))
    (root / "memory.current").unlink()  # a limit whose usage cannot be read: the free memory is unknown
    with pytest.raises(OSError):
        P.measured_capacity("cpu", 1, meminfo=f, cgroup=root)
    root = _cgroup(tmp_path / "c", v1=(2**31, 0))
    (root / "memory" / "memory.usage_in_bytes").write_text("-5\n")
    with pytest.raises(ValueError, match="usage_in_bytes"):
        P.read_cgroup_free(root)
