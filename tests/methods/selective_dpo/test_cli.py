"""``lmforge align selective-dpo`` in-process: one-line errors and a real (tiny) run."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from lmforge.data.preferences import max_digit_pairs, write_preferences
from lmforge.methods.selective_dpo.toy import toy_tokenizer
from tests.cli.helpers import call


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    tok = toy_tokenizer()
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    return write_preferences(tmp_path_factory.mktemp("prefs") / "pairs.jsonl", max_digit_pairs(40, 0))


@pytest.mark.parametrize("tau", ["0", "-0.1", "1.5"])
def test_tau_outside_unit_interval_is_one_line_error(monkeypatch, capsys, tmp_path, tau, data_file):
    code, out, err = call(monkeypatch, capsys, "align", "selective-dpo", "--model", "zoo:missing", "--data",
                          str(data_file), "--tau", tau, "--out", str(tmp_path / "o"))
    assert code == 2
    assert err.strip().splitlines() == [f"error: --tau must lie in (0, 1], got {float(tau)}"]
    assert not (tmp_path / "o").exists()


def test_missing_field_names_the_line(monkeypatch, capsys, tmp_path, tiny_dir):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "p", "chosen": "a", "rejected": "b"}) + "\n"
                   + json.dumps({"prompt": "p", "rejected": "b"}) + "\n")
    code, _, err = call(monkeypatch, capsys, "align", "selective-dpo", "--model", str(tiny_dir), "--data", str(bad),
                        "--out", str(tmp_path / "o"))
    assert code == 2 and err.strip() == f"error: {bad}:2: missing field 'chosen'"


def test_run_writes_model_and_difficulty(monkeypatch, capsys, tmp_path, tiny_dir, data_file):
    out = tmp_path / "run"
    args = ["align", "selective-dpo", "--model", str(tiny_dir), "--data", str(data_file), "--out", str(out),
            "--tau", "0.5", "--beta", "0.5", "--lr", "1e-3", "--ref-lr", "1e-2", "--batch-size", "4",
            "--seeds", "41,42", "--checkpoints", "2", "--lora-r", "2", "--json"]
    code, stdout, err = call(monkeypatch, capsys, *args)
    assert code == 0, err
    summary = json.loads(stdout)
    assert summary["pairs"] == 40 and summary["kept"] == 20 and len(summary["seed_spearman"]) == 1
    rows = [json.loads(x) for x in (out / "difficulty.jsonl").read_text().splitlines()]
    record = json.loads((out / "selective_dpo.json").read_text())
    scores = np.array([r["difficulty"] for r in rows])
    # The saved order is the 20 easiest, ascending; the kept flags and ranks agree with it.
    assert record["order"] == sorted(range(40), key=lambda i: (scores[i], i))[:20]
    assert [i for i, r in enumerate(rows) if r["kept"]] == sorted(record["order"])
    assert all(r["difficulty"] == pytest.approx(np.mean(r["per_seed"])) for r in rows)
    assert (out / "config.json").exists() and len(record["train_losses"]) == 5
    # The output is never replaced without --overwrite.
    code, _, err = call(monkeypatch, capsys, *args)
    assert code == 2 and "--overwrite" in err


def test_trl_engine_reuses_scores_and_keeps_the_selection(monkeypatch, capsys, tmp_path, tiny_dir, data_file):
    rng = np.random.default_rng(0)
    scores = rng.random(40)
    sfile = tmp_path / "difficulty.jsonl"
    sfile.write_text("".join(json.dumps({"difficulty": float(x)}) + "\n" for x in scores))
    out2 = tmp_path / "run-trl"
    code, stdout, err = call(monkeypatch, capsys, "align", "selective-dpo", "--model", str(tiny_dir), "--data",
                             str(data_file), "--out", str(out2), "--scores", str(sfile),
                             "--engine", "trl", "--lr", "1e-3", "--beta", "0.5", "--batch-size", "4", "--json")
    assert code == 0, err
    rec2 = json.loads((out2 / "selective_dpo.json").read_text())
    assert rec2["order"] == sorted(range(40), key=lambda i: scores[i])[:20] and rec2["difficulty_source"] == "given"
    assert len(rec2["train_losses"]) == 5  # 20 pairs, batch 4, logged every step
