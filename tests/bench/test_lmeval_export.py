"""lm-eval as an independent harness for ACBench's single-turn tasks.

The tasks are exported with :func:`lmforge.bench.lmeval.export_lmeval` and run by lm-eval's own
``hf`` model (its tokenization, ``model.generate`` and stop handling) in-process, offline. Checked,
item for item: lm-eval's model input is our prompt, its greedy completion is ours from
:func:`lmforge.common.generation.generate`, and its aggregated metrics are our mean scores.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from lmforge.bench import lmeval  # noqa: E402
from lmforge.bench import tasks as bench_tasks  # noqa: E402
from lmforge.bench.acbench import builtin_data  # noqa: E402
from lmforge.bench.task_defs import LongBenchRetrievalTask  # noqa: E402
from lmforge.bench.tasks import Context, Item, get_task  # noqa: E402
from lmforge.common.generation import generate, max_positions  # noqa: E402

LIMIT = 6


class MixedLimitsTask(LongBenchRetrievalTask):
    """LongBench retrieval whose items alternate between two token limits (lm-eval needs two subtasks)."""

    name = "lb_mixed_limits"

    def items(self, path: Path, ctx: Context) -> list[Item]:
        out = super().items(path, ctx)
        for i, it in enumerate(out):
            it.max_new_tokens = 8 if i % 2 == 0 else 3
        return out


@pytest.fixture
def keep_rng():
    """lm-eval's simple_evaluate seeds the global RNGs; give other tests theirs back."""
    state = random.getstate(), np.random.get_state(), torch.get_rng_state()
    yield
    random.setstate(state[0])
    np.random.set_state(state[1])
    torch.set_rng_state(state[2])


def _fitting_retrieval_file(src: Path, dst: Path, tok, limit: int, n: int) -> Path:
    """The first ``n`` records of ``src`` whose zoo prompt plus answer fits the model's positions.

    NOTE: some built-in LongBench records reach ~1020 tokens; with 8 new tokens that exceeds
    agent-small's 1024 positions, where lm-eval left-truncates the prompt and lmforge does not, so
    such records are not a like-for-like comparison.
    """
    task = get_task("longbench_retrieval")
    items = task.items(src, Context(tokenizer=tok, fmt="zoo"))
    lines = [ln for ln in src.read_text(encoding="utf-8").splitlines() if ln.strip()]
    keep = [ln for ln, it in zip(lines, items)
            if len(tok(it.prompt)["input_ids"]) + it.max_new_tokens <= limit][:n]
    assert len(keep) == n, "too few built-in retrieval records fit the model; raise the size"
    dst.write_text("\n".join(keep) + "\n", encoding="utf-8")
    return dst


def test_lmeval_runs_our_prompts_generations_and_scores(tmp_path, small, monkeypatch, keep_rng):
    lm_eval = pytest.importorskip("lm_eval")
    import datasets.config
    from lm_eval.tasks import TaskManager

    from lmforge.models.load import resolve_spec

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-datasets")
    monkeypatch.setitem(bench_tasks.TASKS, MixedLimitsTask.name, MixedLimitsTask())
    model, tok = small
    limit_pos = max_positions(model)
    assert limit_pos is not None

    files = builtin_data(tmp_path / "data", 0, ["worfbench", "longbench_retrieval", "blocksworld"],
                         {"worfbench": LIMIT, "longbench_retrieval": 12, "blocksworld": 2})
    files = {name: paths[0] for name, paths in files.items()}  # one file each for these tasks
    files["longbench_retrieval"] = _fitting_retrieval_file(
        files["longbench_retrieval"], tmp_path / "data" / "retrieval_fit.jsonl", tok, limit_pos, LIMIT)
    files[MixedLimitsTask.name] = files["longbench_retrieval"]

    out = tmp_path / "lmeval"
    names = lmeval.export_lmeval(out, files, tok, "zoo", limit=LIMIT, max_positions=limit_pos)
    assert names == ["lmforge_worfbench", "lmforge_longbench_retrieval", "lmforge_lb_mixed_limits"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert "blocksworld" in manifest["skipped"] and manifest["tasks"] == names
    assert not (out / "lmforge_blocksworld.yaml").exists()
    for name in ("lmforge_acbench", "lmforge_worfbench", "lmforge_lb_mixed_limits_part0", "lmforge_lb_mixed_limits_part1"):
        assert (out / f"{name}.yaml").is_file()

    # Our side: the items, greedy completions (one at a time, as lm-eval runs them) and scores.
    ours: dict[str, dict] = {}
    for t in ("worfbench", "longbench_retrieval", MixedLimitsTask.name):
        task = get_task(t)
        ctx = Context(tokenizer=tok, fmt="zoo")
        items = task.items(files[t], ctx)[:LIMIT]
        texts = [generate(model, tok, [it.prompt], max_new_tokens=it.max_new_tokens, stop=list(it.stop),
                          batch_size=1)[0].text for it in items]
        scores = [task.score(it, r, ctx) for it, r in zip(items, texts)]
        ours[t] = {"items": items, "texts": texts, "scores": scores}
        # The documents rebuild the items exactly (gold tuples included).
        data = out / f"{t}.jsonl"
        docs = [json.loads(ln) for ln in data.read_text(encoding="utf-8").splitlines()]
        assert [lmeval.doc_to_item(d) for d in docs] == items

    res = lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={resolve_spec('zoo:agent-small')},dtype=float32,add_bos_token=True",
        tasks=["lmforge_acbench"],
        task_manager=TaskManager(include_path=str(out), include_defaults=False),
        limit=LIMIT, device="cpu", batch_size=1, log_samples=True, bootstrap_iters=0,
    )
    assert res is not None

    def check(lm_task: str, items: list[Item], texts: list[str], scores: list[dict]) -> None:
        samples = {s["doc"]["id"]: s for s in res["samples"][lm_task]}
        by_id = {it.id: (it, t, s) for it, t, s in zip(items, texts, scores)}
        assert set(samples) <= set(by_id) and samples
        for doc_id, s in samples.items():
            it, text, _ = by_id[doc_id]
            context, gen_kwargs = s["arguments"][0]
            assert context == it.prompt  # (1) the model input, byte for byte
            assert gen_kwargs["until"] == list(it.stop) and gen_kwargs["max_gen_toks"] == it.max_new_tokens
            assert s["resps"][0][0] == text, f"{lm_task} {doc_id}: lm-eval {s['resps'][0][0]!r} vs ours {text!r}"  # (2)

    # (1) and (2) per task; (3) lm-eval's aggregate = our mean of task.score over the same items.
    for t in ("worfbench", "longbench_retrieval"):
        o = ours[t]
        check(f"lmforge_{t}", o["items"], o["texts"], o["scores"])
        assert len(res["samples"][f"lmforge_{t}"]) == LIMIT
        for key in o["scores"][0]:
            mean = sum(s[key] for s in o["scores"]) / LIMIT
            assert abs(res["results"][f"lmforge_{t}"][f"{key},none"] - mean) < 1e-9, (t, key)
    assert set(ours["worfbench"]["scores"][0]) == {"node_f1", "graph_f1"}
    assert 0 < res["results"]["lmforge_worfbench"]["node_f1,none"] < 1  # not a degenerate comparison

    # Mixed limits: two subtasks (lm-eval's --limit applies to each: 3 + 3 items here), averaged by size.
    o = ours[MixedLimitsTask.name]
    for part in ("lmforge_lb_mixed_limits_part0", "lmforge_lb_mixed_limits_part1"):
        check(part, o["items"], o["texts"], o["scores"])
    assert sum(len(res["samples"][p]) for p in ("lmforge_lb_mixed_limits_part0", "lmforge_lb_mixed_limits_part1")) == LIMIT
    mean = sum(s["em"] for s in o["scores"]) / LIMIT
    assert abs(res["results"]["lmforge_lb_mixed_limits"]["em,none"] - mean) < 1e-9


def test_values_round_trip_and_command():
    from lmforge.bench.tasks import Item

    gold = (["a", "b"], [["START", 1], (1, "END")], {3: "x", "__tuple__": 1}, {1, 2}, None, 1.5)
    assert lmeval.decode_value(lmeval.encode_value(gold)) == gold
    it = Item(id="x", prompt="P:\n", reference=" r", max_new_tokens=4, stop=("\n", "\n\n"), gold=gold,
              meta={"length": 3, "bucket": "0-4k"})
    assert lmeval.doc_to_item(json.loads(json.dumps(lmeval.item_to_doc("t", it, "zoo")))) == it
    with pytest.raises(ValueError, match="only lmforge dataclasses"):
        lmeval.decode_value(json.dumps({"__dataclass__": "os:PathLike", "fields": {}}))

    argv = lmeval.lmeval_command("/o", "/m", ["lmforge_worfbench", "lmforge_niah"], 5)
    assert argv[0] == "lm_eval"
    assert argv[argv.index("--model_args") + 1] == "pretrained=/m,dtype=float32,add_bos_token=True"
    assert argv[argv.index("--tasks") + 1] == "lmforge_worfbench,lmforge_niah"
    assert argv[argv.index("--include_path") + 1] == "/o" and argv[-2:] == ["--limit", "5"]
    assert "--limit" not in lmeval.lmeval_command("/o", "/m", ["lmforge_acbench"], None)
