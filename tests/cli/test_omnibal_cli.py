"""``lmforge train omnibal``: bad inputs are one line and exit 2 with nothing written; a run writes a
report whose groups cover every sample once, and real steps report a throughput ratio.

The per-stage times in the report are checked against closed forms: a stage's forward time is the
sum of its layers' profiled forward times, its backward time the sum of their backward times plus
the forward time of each recomputed layer; the simulated step is the 1F1B simulator's on those stage
times, between ``m · slowest stage`` and ``(m + p − 1) · (max forward + max backward)``. The
measured capacity is checked against meminfo and cgroup files the tests write, and the recompute
plan in the report against brute force over every subset of each stage's layers. A memory that
cannot be read falls back to the modelled rule with a warning when ``--capacity-source`` is not
given, and is an error when ``--capacity-source measured`` is; warnings land in ``omnibal.json``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lmforge.methods.omnibal import plan as P
from lmforge.methods.omnibal.simulate import simulate_1f1b_trace
from tests.cli.helpers import call, one_error_line
from tests.methods.omnibal.test_capacity import V2_SRC, _brute_plan, _cgroup, _closed_capacity, _meminfo

TINY = ["--vit-layers", "1", "--llm-layers", "2", "--d-model", "16", "--patch-tokens", "4", "--vit-mlp-ratio", "4",
        "--dp", "2", "--micro-batches", "2", "--rounds", "5"]


@pytest.fixture(autouse=True)
def _no_cgroup(tmp_path, monkeypatch):
    """No cgroup limit unless a test writes one: the machine's own cgroup stays out of the checks."""
    monkeypatch.setattr(P, "CGROUP", tmp_path / "no-cgroup")


def _lengths(path, n=240, seed=0):
    rng = np.random.default_rng(seed)
    vit = rng.choice([1, 3, 5], size=n)
    recs = [{"vit_num": int(v), "token_num": int(256 * v + rng.integers(20, 300))} for v in vit]
    path.write_text(json.dumps(recs))
    return recs


@pytest.mark.parametrize(("records", "extra", "message"), [
    ([{"vit_num": 1, "token_num": -3}], [], "token_num=-3"),
    ([{"token_num": 300}], [], "no 'vit_num'"),
    (None, ["--vit-cap", "2", "--token-cap", "1000"], "exceed the caps"),
    (None, ["--stages", "40"], "more than the model's"),
    (None, ["--vit-cap", "9"], "both --vit-cap and --token-cap"),
    (None, ["--capacity-mb", "0"], "--capacity-mb must be positive"),
    (None, ["--capacity-mb", "inf"], "--capacity-mb must be positive and finite, got inf"),
    (None, ["--capacity-mb", "nan"], "--capacity-mb must be positive and finite, got nan"),
    (None, ["--capacity-mb", "-inf"], "--capacity-mb must be positive and finite"),
    (None, ["--capacity-mb", "1e308"], "--capacity-mb must be positive and finite"),  # inf as bytes
    (None, ["--capacity-mb", "64", "--capacity-source", "modelled"], "not both"),
    (None, ["--capacity-source", "guess"], "--capacity-source must be"),
    (None, ["--backend", "mpi"], "--backend must be gloo or nccl"),
    (None, ["--backend", "nccl"], "nccl"),
    (None, ["--device", "cuda"], "cuda"),
])
def test_bad_inputs_are_one_line_and_write_nothing(tmp_path, monkeypatch, capsys, records, extra, message):
    f = tmp_path / "lengths.json"
    if records is None:
        _lengths(f)
    else:
        f.write_text(json.dumps(records))
    out = tmp_path / "out"
    code, _, err = call(monkeypatch, capsys, "train", "omnibal", "--lengths", str(f), "--out", str(out),
                        "--steps", "0", *TINY, *extra)
    assert code == 2 and message in one_error_line(err)
    assert not out.exists()


def test_plan_only_run_writes_groups_that_cover_every_sample_once(tmp_path, monkeypatch, capsys):
    f = tmp_path / "lengths.json"
    recs = _lengths(f)
    out = tmp_path / "out"
    code, stdout, err = call(monkeypatch, capsys, "train", "omnibal", "--lengths", str(f), "--out", str(out),
                             "--steps", "0", "--vit-cap", "9", "--token-cap", "2600", "--capacity-source", "modelled",
                             *TINY, "--json")
    assert code == 0, err
    report = json.loads(stdout)
    assert report == json.loads((out / "omnibal.json").read_text())
    groups = [json.loads(line) for line in (out / "groups.jsonl").read_text().splitlines()]
    flat = [i for g in groups for i in g]
    assert sorted(flat) == list(range(len(recs)))
    for g in groups:
        assert sum(recs[i]["vit_num"] for i in g) <= 9 and sum(recs[i]["token_num"] for i in g) <= 2600
    assert report["groups"] == len(groups) and report["caps"] == {"vit": 9, "tokens": 2600, "token_floor": 2472,
                                                                  "searched": False}
    n = report["model"]["layers"]
    assert n == 1 + 1 + 1 + 2 + 1 and len(report["profile_ms"]["fwd"]) == n
    rec = report["recompute"]
    assert max(rec["stage_bytes_plan"]) <= rec["capacity_bytes"]
    assert set(rec["recomputed_layers"]) <= set(range(n))


@pytest.mark.slow  # spawns gloo processes twice; `reproduce omnibal --quick` covers timed_run in the default suite
def test_real_steps_report_the_throughput_ratio(tmp_path, monkeypatch, capsys):
    f = tmp_path / "lengths.json"
    _lengths(f, n=400)
    out = tmp_path / "out"
    code, stdout, err = call(monkeypatch, capsys, "train", "omnibal", "--lengths", str(f), "--out", str(out),
                             "--steps", "2", "--vit-cap", "9", "--token-cap", "2600", *TINY, "--json")
    assert code == 0, err
    report = json.loads(stdout)
    runs = report["real_runs"]
    assert len(runs["baseline"]["step_seconds"]) == 2 == len(runs["omnibal"]["step_seconds"])
    assert report["speedup"] == pytest.approx(runs["omnibal"]["median_tokens_per_s"]
                                              / runs["baseline"]["median_tokens_per_s"])


def test_a_large_capacity_plans_without_recompute(tmp_path, monkeypatch, capsys):
    """A capacity far above what any stage needs: the knapsack (coarser units for large budgets) turns
    recompute off everywhere."""
    f = tmp_path / "lengths.json"
    _lengths(f)
    out = tmp_path / "out"
    code, stdout, err = call(monkeypatch, capsys, "train", "omnibal", "--lengths", str(f), "--out", str(out),
                             "--steps", "0", "--vit-cap", "9", "--token-cap", "2600", "--capacity-mb", "100000",
                             *TINY, "--json")
    assert code == 0, err
    rec = json.loads(stdout)["recompute"]
    assert rec["recomputed_layers"] == [] and rec["capacity_bytes"] == 100000 * 2**20


PLAN = ["--steps", "0", "--vit-cap", "9", "--token-cap", "2600", "--llm-layers", "4", "--stages", "3",
        "--micro-batches", "4"]


def _plan_run(tmp_path, monkeypatch, capsys, *extra):
    tmp_path.mkdir(parents=True, exist_ok=True)
    f = tmp_path / "lengths.json"
    _lengths(f)
    out = tmp_path / "out"
    code, stdout, err = call(monkeypatch, capsys, "train", "omnibal", "--lengths", str(f), "--out", str(out),
                             *TINY, *PLAN, *extra)
    assert code == 0, err
    return json.loads((out / "omnibal.json").read_text()), stdout, err


def test_stage_times_are_layer_sums_and_agree_with_the_simulator(tmp_path, monkeypatch, capsys):
    """Each configuration's per-stage times are the sums of the profiled per-layer times over the
    stage's layers; its step and idle times are the simulator's on them; the printed order of the
    configurations by slowest stage is the order of their busiest simulated stages."""
    report, stdout, _ = _plan_run(tmp_path, monkeypatch, capsys, "--capacity-source", "modelled")
    fwd, bwd = report["profile_ms"]["fwd"], report["profile_ms"]["bwd"]
    n, m, part = len(fwd), report["partition"]["micro_batches"], report["partition"]
    sim = report["simulated"]
    assert n == 1 + 1 + 1 + 4 + 1 and m == 4 and list(sim) == ["equal", "anchor", "bmp", "bmp+recompute"]
    configs = {"equal": (part["equal"], set(range(n))), "anchor": (part["anchor"], set(range(n))),
               "bmp": (part["bmp"], set(range(n))),
               "bmp+recompute": (part["bmp"], set(report["recompute"]["recomputed_layers"]))}
    busiest = {}
    for name, (bounds, rec) in configs.items():
        r = sim[name]
        assert r["boundaries"] == bounds
        cuts = [0, *bounds, n]
        want_f, want_b = [], []
        for s in range(3):  # a naive loop over each stage's layers
            tf = tb = 0.0
            for i in range(cuts[s], cuts[s + 1]):
                tf += fwd[i]
                tb += bwd[i] + (fwd[i] if i in rec else 0.0)
            want_f.append(tf)
            want_b.append(tb)
        assert [1e3 * x for x in r["stage_fwd_s"]] == pytest.approx(want_f, rel=1e-9)
        assert [1e3 * x for x in r["stage_bwd_s"]] == pytest.approx(want_b, rel=1e-9)
        assert [1e3 * x for x in r["stage_s"]] == pytest.approx([a + b for a, b in zip(want_f, want_b)], rel=1e-9)
        assert 1e3 * r["slowest_stage_s"] == pytest.approx(max(a + b for a, b in zip(want_f, want_b)), rel=1e-9)
        trace = simulate_1f1b_trace(r["stage_fwd_s"], r["stage_bwd_s"], m)
        assert r["step_s"] == trace.makespan and r["bubble_s"] == list(trace.bubble)
        assert r["slowest_stage"] == max(range(3), key=lambda s: (trace.busy[s], -s))  # the least idle stage
        assert m * r["slowest_stage_s"] <= r["step_s"] * (1 + 1e-12)
        assert r["step_s"] <= (m + 2) * (max(r["stage_fwd_s"]) + max(r["stage_bwd_s"])) * (1 + 1e-12)
        busiest[name] = max(trace.busy) / m
    # recompute only adds backward time: the plan's stages are never slower than full recompute's
    assert all(a <= b * (1 + 1e-12) for a, b in zip(sim["bmp+recompute"]["stage_s"], sim["bmp"]["stage_s"]))
    line = next(ln for ln in stdout.splitlines() if ln.startswith("slowest stage, fastest first: "))
    words = line.removeprefix("slowest stage, fastest first: ").removesuffix(" ms").split()
    order, rels = words[0::3], words[2::3]
    assert sorted(order) == sorted(sim) and all(r in ("<", "=") for r in rels)
    for a, b, rel in zip(order, order[1:], rels):
        assert busiest[a] <= busiest[b] * (1 + 1e-12)
        assert (rel == "=") == (sim[a]["slowest_stage_s"] == sim[b]["slowest_stage_s"])
    for name in sim:  # one printed line per configuration, with its stage times
        row = next(ln for ln in stdout.splitlines() if ln.startswith(f"  {name} "))
        assert f"slowest stage {sim[name]['slowest_stage']} " in row
    for c in part["candidates"]:  # BMP's ranked candidates carry their stage times (full recompute)
        cuts = [0, *c["boundaries"], n]
        want = [sum(fwd[i] + bwd[i] + fwd[i] for i in range(cuts[s], cuts[s + 1])) for s in range(3)]
        assert [1e3 * x for x in c["stage_s"]] == pytest.approx(want, rel=1e-9)


def test_measured_capacity_plans_as_brute_force(tmp_path, monkeypatch, capsys):
    """With a meminfo file whose MemAvailable puts the capacity between full recompute's need and no
    recompute's, the report names the measured source and bytes, and its plan is brute force's."""
    modelled, _, _ = _plan_run(tmp_path / "a", monkeypatch, capsys, "--capacity-source", "modelled")
    rec = modelled["recompute"]
    target = rec["capacity_bytes"]  # halfway on the equal split's fullest stage
    kb = -(-(target + 512 * 2**20) * 3 * 10 // 9) // 1024  # 3 ranks (--stages 3) share the machine
    f = tmp_path / "meminfo"
    _meminfo(f, kb)
    monkeypatch.setattr(P, "MEMINFO", f)
    report, stdout, err = _plan_run(tmp_path / "b", monkeypatch, capsys)
    assert "warning" not in err
    rec = report["recompute"]
    cap = _closed_capacity(kb * 1024, 3, 512 * 2**20)
    assert rec["capacity_source"] == "measured" and rec["capacity_bytes"] == cap
    assert rec["measured"] == {"device": "cpu", "read_from": "/proc/meminfo MemAvailable", "free_bytes": [kb * 1024],
                               "ranks": [3], "margin_fraction": 0.1, "reserve_bytes": 512 * 2**20, "capacity": cap,
                               "readings": {"/proc/meminfo MemAvailable": kb * 1024}}
    assert rec["warnings"] == []
    assert f"{cap / 2**20:.1f} MiB per stage, measured" in stdout
    lb = rec["layer_bytes"]
    mem = P.LayerMemory(lb["param"], lb["activation"], lb["recompute_delta"])
    assert lb == modelled["recompute"]["layer_bytes"]  # bytes are deterministic; times are not
    fwd_s = [x / 1e3 for x in report["profile_ms"]["fwd"]]
    keep = _brute_plan(mem, fwd_s, report["partition"]["bmp"], cap, 4)
    assert set(rec["recomputed_layers"]) == keep
    n = report["model"]["layers"]
    assert 0 < len(keep) < n  # the capacity binds: some layers keep recompute, some do not
    assert max(rec["stage_bytes_plan"]) <= cap


def test_missing_meminfo_falls_back_to_the_modelled_rule(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(P, "MEMINFO", tmp_path / "no-meminfo")
    report, stdout, err = _plan_run(tmp_path, monkeypatch, capsys, "--json")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("warning: cannot read the free memory") and "modelled" in lines[0]
    rec = report["recompute"]
    assert rec["capacity_source"] == "modelled" and rec["measured"] is None
    assert rec["warnings"] == [lines[0].removeprefix("warning: ")] and "no-meminfo" in rec["warnings"][0]
    lb, equal, n = rec["layer_bytes"], report["partition"]["equal"], report["model"]["layers"]
    mem = P.LayerMemory(lb["param"], lb["activation"], lb["recompute_delta"])
    full = max(P.stage_memory(mem, equal, set(range(n)), 4))
    none = max(P.stage_memory(mem, equal, set(), 4))
    assert rec["capacity_bytes"] == full + (none - full) // 2
    again, _, err = _plan_run(tmp_path / "b", monkeypatch, capsys, "--capacity-source", "modelled")
    assert "warning" not in err and again["recompute"]["warnings"] == []
    assert again["recompute"]["capacity_bytes"] == rec["capacity_bytes"]


def test_a_machine_too_small_for_full_recompute_is_warned_about(tmp_path, monkeypatch, capsys):
    f = tmp_path / "meminfo"
    _meminfo(f, 1024 * 1024)  # 1 GiB for 3 ranks: below the 512 MiB reserve each, capacity 0
    monkeypatch.setattr(P, "MEMINFO", f)
    report, _, err = _plan_run(tmp_path, monkeypatch, capsys, "--json")
    rec = report["recompute"]
    assert rec["capacity_bytes"] == 0 and rec["recomputed_layers"] == list(range(report["model"]["layers"]))
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines == ["warning: stages 0, 1, 2 need more than the capacity of 0.0 MiB even with full recompute "
                     "(modelled)"]
    assert rec["warnings"] == [lines[0].removeprefix("warning: ")]  # kept in omnibal.json too


@pytest.mark.parametrize("broken", ["missing", "malformed", "cgroup"])
def test_an_explicit_measured_source_that_cannot_be_read_is_an_error(tmp_path, monkeypatch, capsys, broken):
    """``--capacity-source measured`` given: no fallback; one error line, exit 2, nothing written
    (the same memory without the option falls back with a warning)."""
    f = tmp_path / "meminfo"
    if broken == "malformed":
        f.write_text("MemAvailable: lots\n")
    elif broken == "cgroup":
        _meminfo(f, 8 * 2**20)
        monkeypatch.setattr(P, "CGROUP", _cgroup(tmp_path / "cg", v2=("oops", 0)))
    monkeypatch.setattr(P, "MEMINFO", f)
    lengths = tmp_path / "lengths.json"
    _lengths(lengths)
    out = tmp_path / "out"
    code, stdout, err = call(monkeypatch, capsys, "train", "omnibal", "--lengths", str(lengths), "--out", str(out),
                             *TINY, *PLAN, "--capacity-source", "measured")
    line = one_error_line(err)
    assert code == 2 and stdout == "" and not out.exists()
    assert line.startswith("error: --capacity-source measured: cannot read the free memory"), line
    assert {"missing": "meminfo", "malformed": "malformed", "cgroup": "memory.max"}[broken] in line
    report, _, err = _plan_run(tmp_path / "default", monkeypatch, capsys)  # not given: the fallback
    warned = [ln for ln in err.splitlines() if ln.startswith("warning:")]
    assert len(warned) == 1 and warned[0].startswith("warning: cannot read the free memory"), err
    assert report["recompute"]["capacity_source"] == "modelled" and len(report["recompute"]["warnings"]) == 1


def test_a_cgroup_limit_below_memavailable_bounds_the_capacity(tmp_path, monkeypatch, capsys):
    """In a container /proc/meminfo shows the host: a cgroup v2 limit with less free memory wins, and
    the report names it."""
    f = tmp_path / "meminfo"
    _meminfo(f, 64 * 2**20)  # the host: 64 GiB available
    monkeypatch.setattr(P, "MEMINFO", f)
    monkeypatch.setattr(P, "CGROUP", _cgroup(tmp_path / "cg", v2=(str(6 * 2**30), 2**30)))  # 5 GiB free
    report, stdout, _ = _plan_run(tmp_path / "run", monkeypatch, capsys)
    m = report["recompute"]["measured"]
    assert m["read_from"] == V2_SRC and m["free_bytes"] == [5 * 2**30]
    assert m["readings"] == {"/proc/meminfo MemAvailable": 64 * 2**30, V2_SRC: 5 * 2**30}
    assert report["recompute"]["capacity_bytes"] == _closed_capacity(5 * 2**30, 3, 512 * 2**20)
    assert f"measured, {V2_SRC} 5120 MiB / 3 ranks" in stdout and "also read: /proc/meminfo MemAvailable" in stdout


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_one_stage_on_nccl_measures_cuda_memory(tmp_path, monkeypatch, capsys):
    """The CUDA path end to end on one device: profile on CUDA, the capacity from mem_get_info, real
    steps of one stage on NCCL (world size 1)."""
    f = tmp_path / "lengths.json"
    _lengths(f, n=400)
    out = tmp_path / "out"
    code, stdout, err = call(monkeypatch, capsys, "train", "omnibal", "--lengths", str(f), "--out", str(out),
                             *TINY, "--vit-cap", "9", "--token-cap", "2600", "--stages", "1", "--steps", "2",
                             "--backend", "nccl", "--device", "cuda", "--json")
    assert code == 0, err
    report = json.loads(stdout)
    rec = report["recompute"]
    assert rec["capacity_source"] == "measured" and rec["measured"]["read_from"] == "torch.cuda.mem_get_info"
    assert rec["measured"]["ranks"] == [1] and rec["capacity_bytes"] > 0
    assert report["run"] == {"backend": "nccl", "device": "cuda"}
    assert len(report["real_runs"]["omnibal"]["step_seconds"]) == 2
