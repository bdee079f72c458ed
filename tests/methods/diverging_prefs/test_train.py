"""The paper's claim in miniature (MLP heads on simulated annotator groups), training targets, and
reward heads on a real HF body (agent-nano): last-token pooling, save/load, safe loading."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lmforge.common.errors import UserError
from lmforge.methods.diverging_prefs import core
from lmforge.methods.diverging_prefs.config import DivergingPrefsConfig
from lmforge.methods.diverging_prefs.data import PreferencePair, simulate_pairs
from lmforge.methods.diverging_prefs.heads import (
    LMRewardModel,
    format_text,
    load_reward_model,
    make_model,
    save_reward_model,
)
from lmforge.methods.diverging_prefs.train import evaluate, predict, train_reward_model, training_targets

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def sim():
    return simulate_pairs(1500, seed=11), simulate_pairs(400, seed=12), simulate_pairs(800, seed=13)


def _fit(cfg, train):
    model = make_model(cfg, in_dim=len(train[0].features_a))
    hist = train_reward_model(model, train, cfg)
    return model, hist


def test_meanvar_kl_identifies_diverging_pairs_bt_does_not_and_accuracy_is_equal(sim):
    train, dev, test = sim
    bt_cfg = DivergingPrefsConfig(head="bt", epochs=25)
    mv_cfg = DivergingPrefsConfig(head="meanvar", epochs=25)
    bt, bt_hist = _fit(bt_cfg, train)
    mv, mv_hist = _fit(mv_cfg, train)
    assert bt_hist[-1] < bt_hist[0] and mv_hist[-1] < mv_hist[0]
    r_bt = evaluate(bt, test, bt_cfg)
    r_mv = evaluate(mv, test, mv_cfg, dev_pairs=dev)
    assert abs(r_bt["preference_accuracy"] - r_mv["preference_accuracy"]) <= 0.02
    assert r_mv["diverging_id_auroc"] >= r_bt["diverging_id_auroc"] + 0.10
    # The reported metrics are the core functions applied to the model's own outputs.
    oa, ob = predict(mv, test, mv_cfg)
    labels = [p.labels for p in test]
    assert r_mv["diverging_id_auroc"] == pytest.approx(core.diverging_id_auroc(
        core.meanvar_divergence(oa.reward, ob.reward, oa.sigma, ob.sigma, r_mv["lambda"]), labels))
    # sigma learned the style: responses with a style vector get a larger sigma.
    styled = np.array([any(p.features_a[1:3]) for p in test])
    assert oa.sigma[styled].mean() > 1.5 * oa.sigma[~styled].mean()


def test_classification_head_trains_on_ratings_and_flags_divergence(sim):
    train, _, test = sim
    cfg = DivergingPrefsConfig(head="class", epochs=15)
    model, hist = _fit(cfg, train[:800])
    assert hist[-1] < hist[0]
    res = evaluate(model, test, cfg)
    assert res["preference_accuracy"] > 0.9 and res["diverging_id_auroc"] > 0.6


def test_training_targets_per_head():
    pairs = [PreferencePair(str(i), "p", "a", "b", ls) for i, ls in enumerate([[2, 1], [1, -1], [0, 0], [-1, -1, 1], [1, 1, -1, 0]])]
    keep, t = training_targets(pairs, DivergingPrefsConfig(head="bt"))
    assert keep.tolist() == [0, 3, 4] and t["target"].tolist() == [1.0, 0.0, 1.0]  # [1,-1] and ties dropped
    keep, t = training_targets(pairs, DivergingPrefsConfig(head="bt", bt_target="all"))
    assert keep.tolist() == [0, 1, 3, 4] and t["target"] == pytest.approx([1.0, 0.5, 1 / 3, 2 / 3])
    keep, t = training_targets(pairs, DivergingPrefsConfig(head="meanvar"))
    assert keep.tolist() == [0, 1, 2, 3, 4] and t["hist"][2].tolist() == [0, 0, 1, 0, 0]
    with pytest.raises(UserError, match="needs ratings"):
        training_targets(pairs, DivergingPrefsConfig(head="class"))


def test_config_checks():
    for bad in (dict(head="dpo"), dict(cuts=(1.5, 0.5)), dict(rho=1.0), dict(meanvar_loss="mse")):
        with pytest.raises(UserError):
            DivergingPrefsConfig(**bad)


def test_mlp_save_load_roundtrip(tmp_path, sim):
    cfg = DivergingPrefsConfig(head="meanvar", epochs=1)
    model, _ = _fit(cfg, sim[0][:100])
    save_reward_model(model, cfg, tmp_path)
    back, cfg2 = load_reward_model(tmp_path)
    assert cfg2 == cfg
    a1, _ = predict(model, sim[2][:20], cfg)
    a2, _ = predict(back, sim[2][:20], cfg2)
    np.testing.assert_allclose(a1.reward, a2.reward)
    np.testing.assert_allclose(a1.sigma, a2.sigma)


def _text_pairs(n: int, seed: int) -> list[PreferencePair]:
    rng = np.random.default_rng(seed)
    words = ["plan", "tool", "call", "answer", "search", "file"]
    out = []
    for i in range(n):
        a = " ".join(rng.choice(words, size=rng.integers(2, 6)))
        b = " ".join(rng.choice(words, size=rng.integers(2, 6)))
        labels = [1, 1, 2] if len(a) > len(b) else [-1, -2, -1]
        out.append(PreferencePair(f"t{i}", "Pick one:", a, b, labels))
    return out


def test_lm_head_reads_the_last_real_token_and_trains(nano_dir, tmp_path):
    cfg = DivergingPrefsConfig(head="meanvar", epochs=3, batch_size=8, lr=1e-3)
    model = make_model(cfg, lm_spec=str(nano_dir), body="lm", max_length=64)
    assert isinstance(model, LMRewardModel)
    texts = ["a short one", "a much longer text with many more words in it"]
    with torch.no_grad():
        batch = model.score(texts)
        single = torch.cat([model.score([t]) for t in texts])
        # By hand: the LM's final hidden state at the last token of the unpadded text.
        ids = model.tokenizer(texts[0], return_tensors="pt")
        h = model.lm(**ids, output_hidden_states=True).hidden_states[-1][0, -1]
    torch.testing.assert_close(batch, single, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(batch[0], model.head(h), atol=1e-5, rtol=1e-5)
    pairs = _text_pairs(24, 0)
    hist = train_reward_model(model, pairs, cfg)
    assert hist[-1] < hist[0]
    save_reward_model(model, cfg, tmp_path / "rm")
    back, cfg2 = load_reward_model(tmp_path / "rm")
    a1, _ = predict(model, pairs[:4], cfg)
    a2, _ = predict(back, pairs[:4], cfg2)
    np.testing.assert_allclose(a1.reward, a2.reward, atol=1e-5)
    np.testing.assert_allclose(a1.sigma, a2.sigma, atol=1e-5)
    # agent-nano's tokenizer has no chat template: the reward model reads prompt, newline, response
    assert not getattr(model.tokenizer, "chat_template", None)
    assert format_text(model.tokenizer, "Q", "R") == "Q\nR"


def test_seqcls_body_and_plain_reward_model_folder(nano_dir, tmp_path, caplog):
    cfg = DivergingPrefsConfig(head="bt", epochs=2, batch_size=8)
    model = make_model(cfg, lm_spec=str(nano_dir), body="seqcls", max_length=64)
    assert model.model.config.num_labels == 1
    train_reward_model(model, _text_pairs(16, 1), cfg)
    # Saved as a plain HF folder (no reward.json): read as a BT reward model on logit 0.
    plain = tmp_path / "plain"
    model.model.save_pretrained(plain, safe_serialization=True)
    model.tokenizer.save_pretrained(plain)
    back, cfg2 = load_reward_model(plain)
    assert cfg2.head == "bt"
    pairs = _text_pairs(4, 2)
    np.testing.assert_allclose(predict(back, pairs, cfg2)[0].reward, predict(model, pairs, cfg)[0].reward, atol=1e-5)
    # A 2-label classifier is read at logit 0 too, but not silently.
    two = tmp_path / "two"
    model.model.config.num_labels = 2
    model.model.score = torch.nn.Linear(model.model.score.in_features, 2, bias=False)
    model.model.save_pretrained(two, safe_serialization=True)
    model.tokenizer.save_pretrained(two)
    with caplog.at_level("WARNING", logger="lmforge.methods.diverging_prefs.heads"):
        back2, _ = load_reward_model(two)
    assert "2 labels" in caplog.text and "logit 0" in caplog.text
    # The reward is the classifier's logit 0, and only that: the full logits computed here directly.
    with torch.no_grad():
        logits = back2.model(**back2.tokenizer(["x y z"], return_tensors="pt")).logits
        reward = back2.score(["x y z"])
    assert logits.shape[-1] == 2 and reward.shape == (1, 1)
    assert float(reward[0, 0]) == pytest.approx(float(logits[0, 0]), abs=1e-5)
    assert float(logits[0, 1]) != pytest.approx(float(logits[0, 0]), abs=1e-3)
    # Pickle weights are refused.
    pick = tmp_path / "pickle"
    pick.mkdir()
    (pick / "config.json").write_text(json.dumps(model.model.config.to_dict()))
    torch.save(model.model.state_dict(), pick / "pytorch_model.bin")
    with pytest.raises(UserError, match="refusing to load pickle"):
        load_reward_model(pick)


def test_a_causal_lm_folder_is_not_taken_for_a_reward_model(nano_dir):
    with pytest.raises(UserError, match="not a sequence-classification reward model"):
        load_reward_model(nano_dir)
