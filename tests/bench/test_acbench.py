"""The ACBench runner: cells, resume, bad input, the NLL/KL columns and the report."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from lmforge.bench import acbench
from lmforge.bench.acbench import BenchOptions, parse_setting, run_acbench, summarize
from lmforge.cli import app
from lmforge.common.errors import UserError

TASKS = ["worfbench", "teval_instruct", "longbench_retrieval", "blocksworld"]
SIZES = {"worfbench": 6, "teval_instruct": 3, "longbench_retrieval": 6, "blocksworld": 4}


def _opts(out: Path, **kw) -> BenchOptions:
    base = dict(models=["zoo:agent-small"], out=out, compress=["rtn:bits=8,group_size=64"], tasks=TASKS, limit=3,
                progress=False, calib_samples=8, calib_seq_len=128, max_steps=6, analysis_texts=4,
                builtin_sizes=SIZES, length_buckets=(256, 512))
    base.update(kw)
    return BenchOptions(**base)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("acbench")
    run_acbench(_opts(out))
    return out


def test_every_cell_is_saved_with_official_metrics_and_nll_kl(run_dir: Path) -> None:
    data = json.loads((run_dir / "results.json").read_text())
    assert set(data["cells"]) == {f"zoo:agent-small|{s}|{t}" for s in ("original", "rtn:bits=8,group_size=64") for t in TASKS}
    for cell in data["cells"].values():
        assert cell["n"] == 3 and len(cell["per_item"]) == 3
        m = cell["metrics"]
        assert cell["primary"] in m and 0.0 <= m[cell["primary"]] <= 1.0
        assert m["answer_nll"] > 0
        if cell["setting"] == "original":
            assert m["answer_kl"] == 0.0
        else:
            assert m["answer_kl"] > 0  # 8-bit RTN changes the logits a little, never not at all
    wf = data["cells"]["zoo:agent-small|original|worfbench"]["metrics"]
    assert {"node_f1", "graph_f1"} <= set(wf)
    ti = data["cells"]["zoo:agent-small|original|teval_instruct"]
    assert {"score", "parse_rate"} <= set(ti["metrics"])
    assert {i["meta_fmt"] for i in ti["per_item"]} == {"json", "str"}  # --limit keeps both formats
    bw = data["cells"]["zoo:agent-small|original|blocksworld"]["metrics"]
    assert {"progress_rate", "success", "grounding_accuracy"} <= set(bw)
    assert data["cells"]["zoo:agent-small|original|longbench_retrieval"]["buckets"]
    # The compressed model is kept (loadable) for reuse.
    assert (run_dir / "models" / "zoo_agent-small" / "rtn_bits_8_group_size_64" / "config.json").is_file()


def test_cell_mean_is_the_mean_of_item_scores(run_dir: Path) -> None:
    data = json.loads((run_dir / "results.json").read_text())
    cell = data["cells"]["zoo:agent-small|original|worfbench"]
    items = cell["per_item"]
    assert cell["metrics"]["node_f1"] == pytest.approx(sum(i["node_f1"] for i in items) / len(items))
    assert cell["metrics"]["answer_nll"] == pytest.approx(sum(i["nll"] for i in items) / len(items))


def test_analysis_has_erank_topk_and_energy(run_dir: Path) -> None:
    data = json.loads((run_dir / "results.json").read_text())
    (a,) = data["analysis"].values()
    assert set(a["topk"]) == {"3", "10", "20"}
    assert all(0.5 < a["topk"][k]["jaccard"] <= 1.0 for k in a["topk"])  # 8-bit: nearly the same top-k
    n_states = len(a["erank"]["original"])
    assert n_states == 5  # embeddings + 4 layers
    assert sum(a["energy"]["original"]) == sum(a["energy"]["compressed"]) == a["tokens"]


def test_summary_relative_change_against_the_original(run_dir: Path) -> None:
    data = json.loads((run_dir / "results.json").read_text())
    s = summarize(data)["zoo:agent-small"]
    comp = s["rtn:bits=8,group_size=64"]
    for t, v in comp["tasks"].items():
        b = s["original"]["tasks"][t]["value"]
        if b:
            assert v["relative"] == pytest.approx((v["value"] - b) / b)
        else:
            assert v["relative"] is None
    # A capability's score is the mean of its tasks' headline metrics; its change is relative to the original's.
    lc = comp["capabilities"]["long_context"]
    assert lc["score"] == pytest.approx(comp["tasks"]["longbench_retrieval"]["value"])
    rw = comp["capabilities"]["real_world"]
    assert rw["original"] == pytest.approx(s["original"]["tasks"]["blocksworld"]["value"])
    if rw["original"] > 0:
        assert rw["relative"] == pytest.approx((rw["score"] - rw["original"]) / rw["original"])


def test_rerun_resumes_without_recomputing(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = (run_dir / "results.json").read_text()

    def boom(*a, **k):
        raise AssertionError("a finished cell was recomputed")

    monkeypatch.setattr(acbench, "_single_turn_cell", boom)
    monkeypatch.setattr(acbench, "_episodic_cell", boom)
    monkeypatch.setattr(acbench, "_compressed", boom)
    run_acbench(_opts(run_dir, report=False))
    assert (run_dir / "results.json").read_text() == before


def test_interrupted_run_leaves_valid_results_and_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = acbench._single_turn_cell
    calls = []

    def flaky(task, *a, **k):
        calls.append(task.name)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(task, *a, **k)

    monkeypatch.setattr(acbench, "_single_turn_cell", flaky)
    opts = _opts(tmp_path, compress=[], tasks=["worfbench", "longbench_retrieval"], report=False)
    with pytest.raises(KeyboardInterrupt):
        run_acbench(opts)
    data = json.loads((tmp_path / "results.json").read_text())
    assert list(data["cells"]) == ["zoo:agent-small|original|worfbench"]
    calls.clear()
    monkeypatch.setattr(acbench, "_single_turn_cell", lambda task, *a, **k: (calls.append(task.name), real(task, *a, **k))[1])
    run_acbench(opts)
    assert calls == ["longbench_retrieval"]
    assert len(json.loads((tmp_path / "results.json").read_text())["cells"]) == 2


def test_other_settings_in_the_same_folder_are_refused(run_dir: Path) -> None:
    with pytest.raises(UserError, match="other settings .*limit"):
        run_acbench(_opts(run_dir, limit=2, report=False))


def test_report_has_capability_tables_and_figures(run_dir: Path) -> None:
    html = (run_dir / "report.html").read_text()
    for title in ("Workflow", "Tool use", "Long context", "Real world", "Capability scores and relative change",
                  "AgentBoard episodes", "LongBench by context length", "Jaccard@10"):
        assert title in html
    assert html.count("<img src=\"data:image/png;base64,") >= 2  # energy histogram and ERank plot
    assert (run_dir / "report.md").read_text().count("|") > 20


def test_setting_parse_and_errors() -> None:
    s = parse_setting("GPTQ:bits=4, group_size=64")
    assert (s.method, s.overrides, s.label) == ("gptq", ("bits=4", "group_size=64"), "gptq:bits=4,group_size=64")
    with pytest.raises(UserError, match="unknown recipe key 'bitz'"):
        parse_setting("gptq:bitz=4")
    with pytest.raises(UserError, match="unknown compression method"):
        parse_setting("zip:bits=4")
    with pytest.raises(UserError, match="not key=value"):
        parse_setting("gptq:4")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--tasks", "nosuchtask"], "unknown task 'nosuchtask'"),
        (["--compress", "wanda:sparsty=0.5"], "unknown recipe key 'sparsty'"),
    ],
)
def test_cli_bad_input_is_one_line_and_leaves_no_results(tmp_path: Path, args: list[str], message: str) -> None:
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["bench", "acbench", "--model", "zoo:agent-small", "--out", str(out), *args])
    assert res.exit_code != 0
    assert isinstance(res.exception, UserError) and message in str(res.exception)
    assert "\n" not in str(res.exception)
    assert not (out / "results.json").exists()


def test_malformed_dataset_names_the_line_and_leaves_no_results(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    good = json.dumps({"input": "q", "context": "c", "answers": ["a"], "length": 1})
    (data / "longbench_retrieval.jsonl").write_text(good + "\n" + good + "\n{not json\n")
    with pytest.raises(UserError, match=r"longbench_retrieval.jsonl:3: not valid JSON"):
        run_acbench(_opts(tmp_path / "run", tasks=["longbench_retrieval"], data_dir=data, compress=[]))
    assert not (tmp_path / "run" / "results.json").exists()


def test_missing_task_file_in_data_folder(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no worfbench.json for task worfbench"):
        run_acbench(_opts(tmp_path / "run", tasks=["worfbench"], data_dir=tmp_path, compress=[]))


def test_task_selection_by_capability() -> None:
    from lmforge.bench.tasks import parse_task_list

    assert parse_task_list(["real_world"]) == ["blocksworld", "toolquery"]
    assert parse_task_list(["niah,worfbench", "niah"]) == ["niah", "worfbench"]
    assert len(parse_task_list(None)) == 13  # the twelve ACBench tasks and BFCL


def test_answer_divergence_matches_the_scorer_and_is_zero_against_itself(small) -> None:
    from lmforge.bench.divergence import answer_divergence
    from lmforge.common.scoring import score_continuations

    model, tok = small
    pairs = [("Task: Email Anna.\nPlan:\n", "Node:\n1: write an email to Anna"), ("Goal: [A B]\nState: [A] [B]\nAction:", " move B onto A")]
    d = answer_divergence(model, model, tok, pairs, batch_size=2)
    ref = score_continuations(model, tok, pairs)
    for nll, r in zip(d["nll"], ref):
        assert nll == pytest.approx(-r.mean, abs=1e-5)
    assert all(abs(k) < 1e-6 for k in d["kl"])
    assert all(math.isfinite(x) for x in d["nll"])


def test_answer_divergence_from_the_cached_original_equals_a_fresh_forward(small) -> None:
    import copy

    from lmforge.bench.divergence import answer_divergence

    model, tok = small
    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    pairs = [("Task: Email Anna.\nPlan:\n", "Node:\n1: write an email to Anna"),
             ("Goal: [A B]\nState: [A] [B]\nAction:", " move B onto A"), ("Q: 2+2?\nA:", " 4")]
    fresh = answer_divergence(other, model, tok, pairs, batch_size=2)
    assert min(fresh["kl"]) > 1e-4  # the perturbation shows
    cache: dict = {}
    answer_divergence(model, None, tok, pairs, batch_size=2, base_cache=cache)  # the original's own cell
    assert len(cache) == len(pairs)
    calls = []
    handle = model.register_forward_hook(lambda *a: calls.append(1))
    try:
        cached = answer_divergence(other, model, tok, pairs, batch_size=2, base_cache=cache)
        assert not calls  # the original never ran again
        # a pair the cache lacks runs the original for its batch
        answer_divergence(other, model, tok, pairs + [("Q: 3+3?\nA:", " 6")], batch_size=8, base_cache=cache)
        assert len(calls) == 1
    finally:
        handle.remove()
    assert cached["nll"] == fresh["nll"]
    for a, b in zip(cached["kl"], fresh["kl"]):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-7)


def test_episode_actions_get_enough_new_tokens(small, tmp_path: Path) -> None:
    """Every expert action of the built-in environments fits the task's per-step token budget (a
    cut JSON call would count as an invalid action)."""
    from lmforge.bench.acbench import builtin_data
    from lmforge.bench.tasks import Context, get_task

    _, tok = small
    files = builtin_data(tmp_path, 0, ["blocksworld", "toolquery"], {"blocksworld": 30, "toolquery": 30})
    for name, paths in files.items():
        task = get_task(name)
        ctx = Context(tokenizer=tok, fmt="zoo")
        pairs = task.expert_pairs(task.load(paths[0], ctx), ctx)
        longest = max(len(tok(c, add_special_tokens=False)["input_ids"]) for _, c in pairs)
        assert longest + 2 <= task.action_tokens, (name, longest)


def test_niah_grid_keeps_lengths_that_fit_and_scores_the_retrieved_part(small, tmp_path: Path) -> None:
    from lmforge.bench.acbench import builtin_data
    from lmforge.bench.tasks import Context, get_task

    _, tok = small
    (path,) = builtin_data(tmp_path, 0, ["niah"], {"niah": 8})["niah"]
    task = get_task("niah")
    items = task.items(path, Context(tokenizer=tok, fmt="zoo", max_positions=300))
    assert sorted({it.meta["length"] for it in items}) == [128, 256]
    for it in items:
        assert len(tok(it.prompt)["input_ids"]) <= it.meta["length"]
    it = items[0]
    needle, prefix = it.gold
    value = needle[len(prefix):].strip(" .")
    # The zoo prompt already holds the key: the answer is scored on the code alone.
    assert task.score(it, " " + value, None)["score"] == 10.0
    assert task.score(it, " 0000" if value != "0000" else " 1111", None)["score"] == 0.0


def test_export_lmeval_never_writes_into_an_existing_folder(tmp_path: Path) -> None:
    out = tmp_path / "export"
    out.mkdir()
    (out / "longbench_qa.jsonl").write_text("user data\n")
    res = CliRunner().invoke(app, ["bench", "export-lmeval", str(out), "--model", "zoo:agent-small", "-t", "worfbench"])
    assert isinstance(res.exception, UserError) and "--overwrite" in str(res.exception)
    assert (out / "longbench_qa.jsonl").read_text() == "user data\n"
    res = CliRunner().invoke(app, ["bench", "export-lmeval", str(out), "--model", "zoo:agent-small", "-t", "worfbench",
                                   "--data", str(out), "--overwrite"])
    assert isinstance(res.exception, UserError) and "inside OUT" in str(res.exception)
    assert (out / "longbench_qa.jsonl").read_text() == "user data\n"


def test_header_records_the_scoring_mode(run_dir: Path) -> None:
    data = json.loads((run_dir / "results.json").read_text())
    assert data["header"]["scoring"] == "official"  # the default; a resumed run must match it


def test_bad_scoring_is_one_line_exit_2_before_any_model_loads(tmp_path: Path, monkeypatch, capsys) -> None:
    import importlib
    import sys

    from lmforge.cli import main

    model_load = importlib.import_module("lmforge.models.load")  # the package re-exports load() over the module name

    def no_load(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(model_load, "load", no_load)
    monkeypatch.setattr(model_load, "resolve_spec", no_load)
    out = tmp_path / "run"
    monkeypatch.setattr(sys, "argv", ["lmforge", "bench", "acbench", "--model", "zoo:agent-small", "--out", str(out),
                                      "--scoring", "paper"])
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: --scoring must be official or lmforge, got 'paper'"
    assert not out.exists()
    with pytest.raises(UserError, match="--scoring must be"):
        run_acbench(_opts(out, scoring="paper", compress=[]))
    assert not out.exists()


def test_capability_floor_is_the_mean_of_its_tasks_empty_answer_scores() -> None:
    def cell(task: str, cap: str, value: float, floor: float | None, scale: float = 1.0) -> dict:
        c = {"model": "m", "setting": "original", "task": task, "capability": cap, "primary": "x", "scale": scale,
             "metrics": {"x": value, "answer_nll": 1.0, "answer_kl": 0.0}}
        if floor is not None:
            c["floor"] = floor
        return c

    data = {"cells": {str(i): c for i, c in enumerate([
        cell("bfcl", "tool_use", 0.2, 0.2), cell("teval_plan", "tool_use", 0.3, 0.0),
        cell("niah", "long_context", 9.0, 0.0, scale=10.0), cell("blocksworld", "real_world", 0.1, None)])}}
    caps = summarize(data)["m"]["original"]["capabilities"]
    assert caps["tool_use"]["floor"] == pytest.approx(0.1) and caps["tool_use"]["score"] == pytest.approx(0.25)
    assert caps["long_context"]["floor"] == 0.0 and caps["long_context"]["score"] == pytest.approx(0.9)
    assert caps["real_world"]["floor"] == 0.0  # an episodic cell has no empty answer: floor 0


def test_worfbench_cell_floor_is_zero_and_saved(run_dir: Path) -> None:
    data = json.loads((run_dir / "results.json").read_text())
    for key, c in data["cells"].items():
        if c["task"] == "worfbench":
            assert c["floor"] == 0.0  # an empty plan has no edge: the official reader scores it 0
        if c["task"] == "blocksworld":
            assert "floor" not in c


def test_score_single_turn_on_a_loaded_model_equals_the_runs_cells(run_dir: Path) -> None:
    """score_single_turn (what a caller with an in-memory model uses) gives the responses, scores and
    floor that the run stored for the original, on the same items built by build_task_items (the
    model loaded in the run's inference dtype, as the run loads it)."""
    from lmforge.bench.acbench import build_task_items, get_embedder, score_single_turn
    from lmforge.bench.tasks import Context, SingleTurnTask, get_task
    from lmforge.common.runtime import resolve_dtype
    from lmforge.models.load import load

    data = json.loads((run_dir / "results.json").read_text())
    model, tok = load("zoo:agent-small", dtype=resolve_dtype("auto"))
    ctx = Context(tokenizer=tok, fmt="zoo", seed=0, embed=get_embedder("trigram"), length_buckets=(256, 512),
                  max_positions=None, max_steps=6, scoring="official", shots=0)
    single = [t for t in TASKS if isinstance(get_task(t), SingleTurnTask)]
    files = {t: get_task(t).paths(run_dir / "data") for t in single}
    items = build_task_items(files, single, ctx, limit=3)
    for t in single:
        cell = score_single_turn(get_task(t), items[t], model, tok, ctx)
        stored = data["cells"][f"zoo:agent-small|original|{t}"]
        assert [r["response"] for r in cell["per_item"]] == [r["response"] for r in stored["per_item"]]
        assert cell["floor"] == stored["floor"]
        for k, v in cell["metrics"].items():
            assert v == pytest.approx(stored["metrics"][k]), (t, k)
    with pytest.raises(UserError, match="no records"):
        score_single_turn(get_task(single[0]), [], model, tok, ctx)
