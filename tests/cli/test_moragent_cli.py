"""``lmforge agent mor-data`` / ``mor-train`` / ``mor-run`` on the committed agent-small: the data
report counts what was written and what was dropped; training saves the adapter only and it loads
back equal to what was trained; the LoRA baseline matches MoR's size; the run's scores equal a
recount from its episodes; an existing output is never replaced without --overwrite."""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import random
import re
from collections import Counter
from pathlib import Path

import pytest
import torch

from lmforge.data import toolcalls
from lmforge.methods.moragent.agent import Episode
from lmforge.methods.moragent.data import TemplateCompleter, build_trajectories, user_segment, write_trajectories
from tests.cli.helpers import call, one_error_line

MODEL = "zoo:agent-small"
TRAIN = ["--layers", "2", "--rank", "2", "--steps", "2", "--batch-size", "2"]
needs_bfcl = pytest.mark.skipif(importlib.util.find_spec("bfcl_eval") is None,
                                reason="bfcl-eval not installed (pip install --no-deps bfcl-eval==2026.3.23)")
MOR_FILES = {"mor_adapter.safetensors", "mor_config.json", "mor_train.json"}


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def base():
    """agent-small in float32 (deep-copy before adding an adapter)."""
    from lmforge.models.load import load

    return load(MODEL)


@pytest.fixture(scope="module")
def traj_file(tmp_path_factory) -> Path:
    kept, _ = build_trajectories(toolcalls.generate(random.Random(3), 4), TemplateCompleter())
    return write_trajectories(kept, tmp_path_factory.mktemp("traj") / "traj.jsonl")


# ------------------------------------------------------------------------------------- mor-data


class _WrongHandover(TemplateCompleter):
    """The template, except that a query mentioning 148 gets a reasoner that hands over to the wrong role."""

    def complete(self, role: str, prompt: str) -> str:
        text = super().complete(role, prompt)
        if role == "reasoner" and "148" in prompt and text.endswith("executor"):
            return text.replace("Next role: executor", "Next role: summarizer")
        return text


def test_mor_data_report_counts_the_lines_written_and_every_drop(tmp_path, monkeypatch, capsys):
    recs = toolcalls.generate(random.Random(0), 4)  # record 1 asks for the tip on a bill of 148
    assert "148" in recs[1]["query"] and all("148" not in r["query"] for r in recs[:1] + recs[2:])
    unknown = {**recs[0], "answers": [{"name": "nosuch", "arguments": {}}]}
    wrong_type = copy.deepcopy(recs[0])
    wrong_type["answers"][0]["arguments"][next(iter(wrong_type["answers"][0]["arguments"]))] = [1, 2]
    inp = _write_jsonl(tmp_path / "recs.jsonl", [*recs, unknown, wrong_type])
    import lmforge.methods.moragent.data as data_mod

    monkeypatch.setattr(data_mod, "make_completer", lambda spec, **kw: _WrongHandover())
    out = tmp_path / "traj.jsonl"
    code, stdout, err = call(monkeypatch, capsys, "agent", "mor-data", "--input", str(inp), "--out", str(out))
    assert code == 0, err
    report = json.loads((tmp_path / "traj.report.json").read_text())
    lines = out.read_text().splitlines()
    assert report["total"] == 6 and report["kept"] == len(lines) == 3 and report["dropped"] == 3
    assert report["dropped_by_reason"] == {"call_error": 2, "bad_next_role": 1, "ungrounded_summary": 0,
                                          "summary_mentions_nothing": 0}
    assert [(d["index"], d["reason"]) for d in report["drops"]] == [(1, "bad_next_role"), (4, "call_error"),
                                                                     (5, "call_error")]
    assert [json.loads(ln)["meta"]["source_index"] for ln in lines] == [0, 2, 3]
    assert "kept 3 of 6" in stdout and "call_error 2" in stdout and "bad_next_role 1" in stdout

    # nothing kept: one error line with the drop counts, nothing written
    bad = _write_jsonl(tmp_path / "bad.jsonl", [unknown, wrong_type])
    code, _, err = call(monkeypatch, capsys, "agent", "mor-data", "--input", str(bad), "--out",
                        str(tmp_path / "b.jsonl"))
    assert code == 2 and "call_error 2" in one_error_line(err)
    assert not (tmp_path / "b.jsonl").exists() and not (tmp_path / "b.report.json").exists()

    # an existing output is not replaced without --overwrite
    before = _snapshot(tmp_path)
    code, _, err = call(monkeypatch, capsys, "agent", "mor-data", "--input", str(inp), "--out", str(out))
    assert code == 2 and "--overwrite" in one_error_line(err) and _snapshot(tmp_path) == before


@needs_bfcl
def test_mor_data_from_a_bfcl_sample(tmp_path, monkeypatch, capsys):
    from lmforge.data import bfcl

    out = tmp_path / "b.jsonl"
    code, stdout, err = call(monkeypatch, capsys, "agent", "mor-data", "--bfcl", "simple_python,multiple", "--n", "2",
                             "--seed", "1", "--out", str(out), "--json")
    assert code == 0, err
    counts = json.loads(stdout)
    ids = [e.id for c in ("simple_python", "multiple") for e in bfcl.sample(c, 1, 2)]
    kept = [json.loads(ln)["meta"]["id"] for ln in out.read_text().splitlines()]
    dropped = [ids[d["index"]] for d in json.loads((tmp_path / "b.report.json").read_text())["drops"]]
    assert counts["total"] == 4 and counts["kept"] == len(kept) and sorted(kept + dropped) == sorted(ids)


# ------------------------------------------------------------------------------------ mor-train


def test_mor_train_saves_the_adapter_only_and_it_loads_back_as_trained(base, traj_file, tmp_path, monkeypatch, capsys):
    import lmforge.methods.moragent.train as train_mod
    from lmforge.methods.moragent.adapter import mor_layers, mor_state_dict

    trained = {}
    real_save = train_mod.save_adapter

    def spy(model, folder, log, **kw):
        if mor_layers(model):
            trained.update({k: v.detach().clone() for k, v in mor_state_dict(model).items()})
        return real_save(model, folder, log, **kw)

    monkeypatch.setattr(train_mod, "save_adapter", spy)
    out = tmp_path / "mor"
    code, stdout, err = call(monkeypatch, capsys, "agent", "mor-train", "-m", MODEL, "--data", str(traj_file),
                             "--out", str(out), *TRAIN, "--json")
    assert code == 0, err
    summary = json.loads(stdout)
    assert {p.name for p in out.iterdir()} == MOR_FILES  # no model.safetensors, no config.json
    from safetensors import safe_open

    with safe_open(str(out / "mor_adapter.safetensors"), "pt") as f:
        keys = list(f.keys())
    adapter_key = re.compile(r"^model\.layers\.[23]\.\w+\.\w+_proj\.(mor_A|mor_B|(routers|shared_gates)\.\d\.weight)$")
    assert len(keys) == 2 * 7 * 8 and all(adapter_key.match(k) for k in keys), keys[:5]  # 2 layers x 7 linears
    log = json.loads((out / "mor_train.json").read_text())
    assert log["adapter"]["kind"] == "mor" and log["adapter"]["layers"] == [2, 3]
    assert len(log["losses"]) == 2 and log["settings"]["steps"] == 2 and log["trajectories"] == 4
    assert summary["trainable"] == log["adapter"]["trainable"]

    from lmforge.methods.moragent.train import load_adapter

    loaded = load_adapter(copy.deepcopy(base[0]), out)
    state = mor_state_dict(loaded)
    assert set(state) == set(trained)
    assert all(torch.equal(state[k], trained[k]) for k in trained)
    assert any(k.endswith("mor_B") and trained[k].abs().sum() > 0 for k in trained)  # training moved B off 0

    lora = tmp_path / "lora"
    code, stdout, err = call(monkeypatch, capsys, "agent", "mor-train", "-m", MODEL, "--data", str(traj_file),
                             "--out", str(lora), *TRAIN, "--adapter", "lora", "--json")
    assert code == 0, err
    names = {p.name for p in lora.iterdir()}
    assert {"adapter_model.safetensors", "adapter_config.json", "mor_train.json"} <= names
    assert not names & {"model.safetensors", "config.json", "pytorch_model.bin"}
    with safe_open(str(lora / "adapter_model.safetensors"), "pt") as f:
        assert all("lora_" in k for k in f.keys())
    lora_log = json.loads((lora / "mor_train.json").read_text())
    assert lora_log["adapter"]["layers"] == log["adapter"]["layers"]
    assert abs(lora_log["adapter"]["trainable"] - log["adapter"]["trainable"]) <= 0.05 * log["adapter"]["trainable"]

    before = _snapshot(out)
    code, _, err = call(monkeypatch, capsys, "agent", "mor-train", "-m", MODEL, "--data", str(traj_file),
                        "--out", str(out), *TRAIN)
    assert code == 2 and "--overwrite" in one_error_line(err) and _snapshot(out) == before


# -------------------------------------------------------------------------------------- mor-run


@pytest.fixture(scope="module")
def mor_adapter(base, traj_file, tmp_path_factory) -> Path:
    """A MoR adapter on agent-small's top two layers, one training step (built by the library)."""
    from lmforge.methods.moragent.data import read_trajectories
    from lmforge.methods.moragent.layer import MoRConfig
    from lmforge.methods.moragent.train import TrainSettings, add_adapter, encode_examples, save_adapter, train_adapter

    model, tok = copy.deepcopy(base[0]), base[1]
    model, _ = add_adapter(model, "mor", [-2, -1], config=MoRConfig(rank=2))
    examples, _ = encode_examples(tok, read_trajectories(traj_file))
    log = train_adapter(model, tok, examples, TrainSettings(steps=1, batch_size=2, warmup=0, lr=1e-2))
    return save_adapter(model, tmp_path_factory.mktemp("adapter") / "mor", log)


def _recount(out: Path) -> dict:
    """Accuracy per BFCL category from episodes.jsonl, rescored with BFCL's checker."""
    from lmforge.data import bfcl
    from lmforge.eval.bfcl_ast import check_calls

    rows = [json.loads(ln) for ln in (out / "episodes.jsonl").read_text().splitlines()]
    source = json.loads((out / "results.json").read_text())["source"]
    entries = {e.id: e for c in source["bfcl"].split(",") for e in bfcl.sample(c, source["seed"], source["n"])}
    by: dict[str, list[bool]] = {}
    for r in rows:
        e = entries[r["id"]]
        calls = [{c["name"]: c["arguments"]} for c in r["calls"] if c is not None]
        by.setdefault(e.category, []).append(check_calls(e.functions, calls, e.ground_truth, e.category).valid)
    return {"correct": sum(sum(v) for v in by.values()), "episodes": len(rows),
            "by_category": {c: {"episodes": len(v), "correct": sum(v), "accuracy": sum(v) / len(v)}
                            for c, v in by.items()},
            "ended": dict(Counter(r["ended"] for r in rows))}


def _check_against_recount(out: Path) -> dict:
    results = json.loads((out / "results.json").read_text())
    again = _recount(out)
    assert results["metric"] == "bfcl_ast"
    assert {k: results[k] for k in again} == again
    assert results["accuracy"] == again["correct"] / again["episodes"]
    return results


@needs_bfcl
def test_mor_run_with_a_mor_adapter_scores_what_its_episodes_hold(mor_adapter, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    code, stdout, err = call(monkeypatch, capsys, "agent", "mor-run", "-m", MODEL, "--adapter", str(mor_adapter),
                             "--bfcl", "simple_python,multiple", "--n", "2", "--max-steps", "3",
                             "--max-new-tokens", "12", "--out", str(out))
    assert code == 0, err
    results = _check_against_recount(out)
    assert results["episodes"] == 4 and set(results["by_category"]) == {"simple_python", "multiple"}
    assert results["adapter"] == str(mor_adapter) and results["settings"]["dtype"] == "bfloat16"
    rows = [json.loads(ln) for ln in (out / "episodes.jsonl").read_text().splitlines()]
    assert all(r["segments"][0]["role"] == "user" and r["ended"] for r in rows)

    before = _snapshot(out)
    code, _, err = call(monkeypatch, capsys, "agent", "mor-run", "-m", MODEL, "--bfcl", "multiple", "--n", "1",
                        "--out", str(out))
    assert code == 2 and "--overwrite" in one_error_line(err) and _snapshot(out) == before


def _scripted(answer_for):
    """A stand-in for run_agent whose i-th episode makes the calls ``answer_for(i, record)``."""

    def run(model, tokenizer, records, **kwargs):
        eps = []
        for i, rec in enumerate(records):
            ep = Episode(record=rec, segments=[user_segment(rec)], calls=answer_for(i, rec), ended="answered")
            eps.append(ep)
        return eps

    return run


@needs_bfcl
def test_mor_run_bfcl_accuracy_per_category_on_scripted_calls(tmp_path, monkeypatch, capsys):
    import lmforge.methods.moragent.agent as agent_mod

    def answer(i, rec):  # even episodes make the gold call(s), odd ones call with a wrong argument value
        gold = [dict(c, arguments=dict(c["arguments"])) for c in rec["answers"]]
        if i % 2:
            k = next(iter(gold[0]["arguments"]))
            gold[0]["arguments"][k] = "certainly wrong"
        return gold

    monkeypatch.setattr(agent_mod, "run_agent", _scripted(answer))
    out = tmp_path / "run"
    code, _, err = call(monkeypatch, capsys, "agent", "mor-run", "-m", MODEL, "--bfcl", "simple_python,parallel",
                        "--n", "2", "--out", str(out))
    assert code == 0, err
    results = _check_against_recount(out)
    assert results["correct"] == 2 and results["accuracy"] == 0.5
    half = {"episodes": 2, "correct": 1, "accuracy": 0.5}
    assert results["by_category"] == {"simple_python": half, "parallel": half}
    assert results["ended"] == {"answered": 4}


def test_mor_run_exact_match_is_order_free_and_needs_every_call(tmp_path, monkeypatch, capsys):
    import lmforge.methods.moragent.agent as agent_mod

    recs = toolcalls.generate(random.Random(5), 3)
    two = {**recs[0], "answers": [recs[0]["answers"][0], {**recs[0]["answers"][0], "arguments": {}}]}
    inp = _write_jsonl(tmp_path / "recs.jsonl", [two, recs[1], recs[2]])
    scripted = {0: list(reversed(two["answers"])),                                  # both calls, other order: right
                1: [{**recs[1]["answers"][0], "arguments": {"x": 1}}],                # wrong arguments
                2: [None]}                                                           # unparsable call
    monkeypatch.setattr(agent_mod, "run_agent", _scripted(lambda i, rec: scripted[i]))
    out = tmp_path / "run"
    code, stdout, err = call(monkeypatch, capsys, "agent", "mor-run", "-m", MODEL, "--input", str(inp),
                             "--out", str(out), "--json")
    assert code == 0, err
    results = json.loads((out / "results.json").read_text())
    rows = [json.loads(ln) for ln in (out / "episodes.jsonl").read_text().splitlines()]
    assert results["metric"] == "exact_match" and [r["correct"] for r in rows] == [True, False, False]
    assert results["correct"] == 1 and results["episodes"] == 3 and json.loads(stdout)["correct"] == 1


# ------------------------------------------------------------------------------------------ help


@pytest.mark.parametrize(("cmd", "words"), [
    ("mor-data", ["report.json", "--bfcl", "--completer", "dropped_by_reason"]),
    ("mor-train", ["mor_adapter.safetensors", "adapter_model.safetensors", "mor_train.json", "--top-k",
                   "never the base"]),
    ("mor-run", ["episodes.jsonl", "results.json", "--max-steps", "exact match"]),
])
def test_help_names_the_files_written(cmd, words, monkeypatch, capsys):
    code, out, _ = call(monkeypatch, capsys, "agent", cmd, "--help")
    text = " ".join(out.split())
    assert code == 0 and all(w in text for w in words), [w for w in words if w not in text]
