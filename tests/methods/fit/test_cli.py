"""``lmforge align fit-data`` and ``lmforge align fit`` in-process."""

from __future__ import annotations

import json
from pathlib import Path


from lmforge.data import spurious as sp
from tests.cli.helpers import call

TASK = "Is the sentiment positive or negative?"
MAP = json.dumps({kw: sp.keyword_label(kw) for pair in sp.FAMILIES.values() for kw in pair})


def _records(path: Path, n: int, rho: float, seed: str) -> list[dict]:
    recs = [{"review": r["text"], "y": r["label"], "kw": r["keyword"], "fam": r["family"]}
            for r in sp.make_split(seed, n, rho)]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return recs


def _fit_data(monkeypatch, capsys, src: Path, out: Path, *extra: str) -> tuple[int, str, str]:
    return call(monkeypatch, capsys, "align", "fit-data", "-i", str(src), "--out", str(out), "--task", TASK,
                "--core-name", "the sentiment", "--spurious-name-field", "fam", "--spurious-name-format", "the {}",
                "--text-field", "review", "--label-field", "y", "--spurious-field", "kw", "--spurious-map", MAP,
                *extra)


def test_fit_data_all_types(monkeypatch, capsys, tmp_path):
    recs = _records(tmp_path / "in.jsonl", 20, 0.0, "cli")
    code, out, err = _fit_data(monkeypatch, capsys, tmp_path / "in.jsonl", tmp_path / "fit.jsonl", "--mode", "all",
                               "--json")
    assert code == 0, err
    assert json.loads(out)["examples"] == 120
    rows = [json.loads(x) for x in (tmp_path / "fit.jsonl").read_text().splitlines()]
    for i, rec in enumerate(recs):
        for e in rows[6 * i: 6 * i + 6]:
            # rho = 0: y_S is always the other label, so the two label rules never coincide.
            y_s = sp.other(rec["y"])
            assert e["spurious_label"] == y_s
            assert e["focus_label"] == (y_s if e["focus_type"] in ("focus_s", "focus_s_ignore_c") else rec["y"])
            assert e["completion"] == " " + e["focus_label"]
            assert f"Text: {rec['review']}\nAnswer:" in e["prompt"]


def test_fit_data_errors(monkeypatch, capsys, tmp_path):
    _records(tmp_path / "in.jsonl", 3, 0.5, "err")
    (tmp_path / "exists.jsonl").write_text("x")
    code, _, err = _fit_data(monkeypatch, capsys, tmp_path / "in.jsonl", tmp_path / "exists.jsonl")
    assert code == 2 and "already exists" in err
    code, _, err = call(monkeypatch, capsys, "align", "fit-data", "-i", str(tmp_path / "in.jsonl"), "--out",
                        str(tmp_path / "o.jsonl"), "--task", TASK, "--core-name", "c", "--spurious-label-field", "y")
    assert code == 2 and "--spurious-name" in err
    code, _, err = _fit_data(monkeypatch, capsys, tmp_path / "missing.jsonl", tmp_path / "o.jsonl")
    assert code == 2 and "not found" in err
    code, _, err = _fit_data(monkeypatch, capsys, tmp_path / "in.jsonl", tmp_path / "o.jsonl", "--types", "focus_z")
    assert code == 2 and "unknown focus type" in err


def test_fit_trains_saves_and_evaluates(monkeypatch, capsys, tmp_path, tiny_dir):
    import torch

    from lmforge.methods.fit.evaluate import evaluate_examples
    from lmforge.models import load

    torch.set_num_threads(1)
    _records(tmp_path / "train.jsonl", 64, 0.9, "cli-train")
    _records(tmp_path / "test.jsonl", 8, 0.0, "cli-test")
    assert _fit_data(monkeypatch, capsys, tmp_path / "train.jsonl", tmp_path / "fit.jsonl")[0] == 0
    assert _fit_data(monkeypatch, capsys, tmp_path / "test.jsonl", tmp_path / "eval.jsonl", "--mode", "all")[0] == 0
    out = tmp_path / "run"
    code, stdout, err = call(monkeypatch, capsys, "align", "fit", "-m", str(tiny_dir), "--data",
                             str(tmp_path / "fit.jsonl"), "--out", str(out), "--eval", str(tmp_path / "eval.jsonl"),
                             "--steps", "6", "--batch-size", "8", "--eval-every", "3", "--json")
    assert code == 0, err
    res = json.loads(stdout)
    assert res["train"]["steps_run"] == 6 and res["n_val"] == 6 and res["n_train"] == 58
    assert res["labels"] == ["negative", "positive"]
    assert json.loads((out / "fit.json").read_text())["eval"] == res["eval"]
    # The saved weights are the evaluated ones: scoring the reloaded model gives the same numbers.
    model, tok = load(str(out))
    ev = [json.loads(x) for x in (tmp_path / "eval.jsonl").read_text().splitlines()]
    again = evaluate_examples(model, tok, ev, res["labels"])
    assert again["by_type"] == res["eval"]["by_type"]  # counts over the same argmax predictions
    # A second run into the same folder needs --overwrite.
    code, _, err = call(monkeypatch, capsys, "align", "fit", "-m", str(tiny_dir), "--data",
                        str(tmp_path / "fit.jsonl"), "--out", str(out), "--steps", "1")
    assert code == 2 and "already exists" in err


def test_fit_lora_loop_saves_a_merged_plain_model(monkeypatch, capsys, tmp_path, tiny_dir):
    import torch

    from lmforge.models import load

    torch.set_num_threads(1)
    _records(tmp_path / "train.jsonl", 48, 0.9, "cli-lora")
    assert _fit_data(monkeypatch, capsys, tmp_path / "train.jsonl", tmp_path / "fit.jsonl")[0] == 0
    out = tmp_path / "run"
    code, stdout, err = call(monkeypatch, capsys, "align", "fit", "-m", str(tiny_dir), "--data",
                             str(tmp_path / "fit.jsonl"), "--out", str(out), "--steps", "4", "--batch-size", "8",
                             "--eval-every", "0", "--lora-r", "2", "--trainer", "loop", "--lr", "0.05", "--json")
    assert code == 0, err
    res = json.loads(stdout)
    assert res["config"]["lora_r"] == 2 and res["config"]["trainer"] == "loop" and res["train"]["steps_run"] == 4
    # Saved merged: a plain checkpoint (no adapter files) whose attention weights moved by a rank-<=2
    # update and whose embedding did not move (LoRA does not target it).
    assert not (out / "adapter_config.json").exists()
    before, _ = load(str(tiny_dir))
    after, _ = load(str(out))
    q0, q1 = (m.model.layers[0].self_attn.q_proj.weight.detach() for m in (before, after))
    assert 0 < int(torch.linalg.matrix_rank(q1 - q0, rtol=1e-4)) <= 2
    assert torch.equal(before.get_input_embeddings().weight, after.get_input_embeddings().weight)
