"""``lmforge train omnibal``: bad inputs are one line and exit 2 with nothing written; a run writes a
report whose groups cover every sample once, and real steps report a throughput ratio."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.cli.helpers import call, one_error_line

TINY = ["--vit-layers", "1", "--llm-layers", "2", "--d-model", "16", "--patch-tokens", "4", "--vit-mlp-ratio", "4",
        "--dp", "2", "--micro-batches", "2", "--rounds", "5"]


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
                             "--steps", "0", "--vit-cap", "9", "--token-cap", "2600", *TINY, "--json")
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
