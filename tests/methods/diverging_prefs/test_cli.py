"""``lmforge reward train / eval / judge`` in-process: outputs, refusals, one-line errors."""

from __future__ import annotations

import json

import numpy as np

from lmforge.methods.diverging_prefs import core
from lmforge.methods.diverging_prefs.data import load_pairs, save_pairs, simulate_pairs
from lmforge.methods.diverging_prefs.heads import load_reward_model
from lmforge.methods.diverging_prefs.train import predict
from tests.cli.helpers import call


def test_train_eval_roundtrip_on_features(tmp_path, monkeypatch, capsys):
    data = save_pairs(simulate_pairs(600, seed=5), tmp_path / "sim.jsonl")
    out = tmp_path / "rm"
    code, stdout, err = call(monkeypatch, capsys, "reward", "train", "--head", "meanvar", "--data", str(data),
                             "--out", str(out), "--epochs", "5", "--test-fraction", "0.3", "--json")
    assert code == 0, err
    rec = json.loads(stdout)
    assert rec["train_pairs"] == 360 and rec["test_pairs"] == 180 and rec["dev_pairs"] == 60
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["test"] == rec["test"] and (out / "reward.json").is_file()

    # eval with the saved lambda reproduces the test metric on the same pairs.
    test_file = tmp_path / "test.jsonl"
    order = np.random.default_rng(0).permutation(600)
    pairs = load_pairs(data)
    save_pairs([pairs[i] for i in order[60:240]], test_file)
    code, stdout, err = call(monkeypatch, capsys, "reward", "eval", "--reward-model", str(out), "--data", str(test_file),
                             "--lambda", str(rec["test"]["lambda"]), "--json")
    assert code == 0, err
    ev = json.loads(stdout)
    assert ev["diverging_id_auroc"] == rec["test"]["diverging_id_auroc"]
    assert ev["preference_accuracy"] == rec["test"]["preference_accuracy"]

    # an existing output is refused without --overwrite
    code, _, err = call(monkeypatch, capsys, "reward", "train", "--head", "bt", "--data", str(data), "--out", str(out))
    assert code == 2 and "already exists" in err


def test_bad_data_and_bad_head_are_one_line_errors(tmp_path, monkeypatch, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "1", "prompt": "p", "response_a": "a", "response_b": "b", "labels": [1]}\n{oops\n')
    code, _, err = call(monkeypatch, capsys, "reward", "train", "--head", "bt", "--data", str(bad), "--out", str(tmp_path / "o"))
    assert code == 2 and err.strip() == f"error: {bad}:2: not valid JSON (Expecting property name enclosed in double quotes)"
    code, _, err = call(monkeypatch, capsys, "reward", "train", "--head", "dpo", "--data", str(bad), "--out", str(tmp_path / "o"))
    assert code == 2 and err.count("\n") == 1 and "head must be one of" in err
    good = save_pairs(simulate_pairs(20, seed=1), tmp_path / "g.jsonl")
    text_only = tmp_path / "t.jsonl"
    text_only.write_text("".join(json.dumps({k: v for k, v in json.loads(line).items() if not k.startswith("features")}) + "\n"
                                 for line in good.read_text().splitlines()))
    code, _, err = call(monkeypatch, capsys, "reward", "train", "--head", "bt", "--data", str(text_only), "--out", str(tmp_path / "o"))
    assert code == 2 and "pass --model" in err


def test_judge_command_with_a_local_model_and_a_filter(tmp_path, monkeypatch, capsys, nano_dir):
    # Text pairs from the simulator (features too, for the MLP reward model that scores divergence).
    data = save_pairs(simulate_pairs(300, seed=2), tmp_path / "sim.jsonl")
    rm = tmp_path / "rm"
    code, _, err = call(monkeypatch, capsys, "reward", "train", "--head", "meanvar", "--data", str(data),
                        "--out", str(rm), "--epochs", "8")
    assert code == 0, err
    few = save_pairs(load_pairs(data, limit=6), tmp_path / "few.jsonl")
    code, stdout, err = call(monkeypatch, capsys, "reward", "judge", "--data", str(few), "--judge", f"hf:{nano_dir}",
                             "--reward-model", str(rm), "--drop-fraction", "0.5", "--max-tokens", "4", "--json")
    assert code == 0, err
    rep = json.loads(stdout)
    pairs = load_pairs(few)
    kinds = [core.pair_kind(p.labels) for p in pairs]
    assert rep["all"]["pairs"] == 6 and rep["all"]["diverging_pairs"] == kinds.count(core.DIVERGING)
    # The filter dropped the 3 pairs with the largest sigma_A + sigma_B.
    net, cfg = load_reward_model(rm)
    oa, ob = predict(net, pairs, cfg)
    top = set(np.argsort(-(oa.sigma + ob.sigma), kind="stable")[:3].tolist())
    assert rep["dropped"]["pairs"] == 3
    assert rep["dropped"]["diverging"] == sum(kinds[i] == core.DIVERGING for i in top)


def test_train_on_multipref_text_with_an_hf_body(tmp_path, monkeypatch, capsys, nano_dir):
    from tests.methods.diverging_prefs.test_data import _mp

    prefs = ["A-is-clearly-better", "A-is-slightly-better", "Tie", "B-is-slightly-better", "B-is-clearly-better"]
    rng = np.random.default_rng(0)
    recs = []
    for i in range(30):
        rec = _mp(str(i), [str(rng.choice(prefs)) for _ in range(2)], [str(rng.choice(prefs)) for _ in range(2)])
        rec["text"], rec["completion_a"], rec["completion_b"] = f"question {i}", "plan " * (1 + i % 4), "tool " * (1 + i % 3)
        recs.append(rec)
    data = tmp_path / "mp.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in recs))
    out = tmp_path / "rm"
    code, stdout, err = call(monkeypatch, capsys, "reward", "train", "--head", "meanvar", "--data", str(data),
                             "--out", str(out), "--model", str(nano_dir), "--epochs", "1", "--batch-size", "8",
                             "--max-length", "32", "--test-fraction", "0.3", "--json")
    assert code == 0, err
    rec = json.loads(stdout)
    assert rec["body"] == "lm" and rec["train_pairs"] == 18 and rec["test_pairs"] == 9
    net, cfg = load_reward_model(out)
    assert cfg.head == "meanvar" and type(net).__name__ == "LMRewardModel"
    # eval on the file reads the saved model and reports on every pair
    code, stdout, err = call(monkeypatch, capsys, "reward", "eval", "--reward-model", str(out), "--data", str(data), "--json")
    assert code == 0, err
    ev = json.loads(stdout)
    kinds = [core.pair_kind(p.labels) for p in load_pairs(data)]
    assert ev["pairs"] == 30 and ev["diverging"] == kinds.count(core.DIVERGING) and ev["lambda"] == "inf"  # JSON has no infinity
