"""``lmforge reward rate`` in-process with a Hugging Face sequence-classification reward model."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lmforge.methods.rate import estimators as E
from tests.cli.helpers import call

REVIEWS = [
    "I loved this film, the acting was great.", "A bad plot and boring scenes.", "The best movie of the year, wonderful.",
    "Awful pacing and a terrible ending.", "Fun and happy from start to end.", "Dull characters, ugly sets, sad story.",
    "Good music and a brilliant cast.", "I hated it; the worst script.",
]


@pytest.fixture(scope="module")
def plain_rm(nano_dir, tmp_path_factory):
    """agent-nano's weights under a fresh 1-logit head, saved as a plain HF reward-model folder."""
    from lmforge.methods.diverging_prefs.config import DivergingPrefsConfig
    from lmforge.methods.diverging_prefs.heads import make_model

    torch.manual_seed(0)
    model = make_model(DivergingPrefsConfig(head="bt"), lm_spec=str(nano_dir), body="seqcls", max_length=64)
    folder = tmp_path_factory.mktemp("rm") / "plain"
    model.model.save_pretrained(folder, safe_serialization=True)
    model.tokenizer.save_pretrained(folder)
    return folder, model


def test_rate_command_end_to_end(tmp_path, monkeypatch, capsys, plain_rm):
    folder, model = plain_rm
    data = tmp_path / "reviews.jsonl"
    data.write_text("".join(json.dumps({"id": f"r{i}", "prompt": "Write a movie review: ", "response": t}) + "\n"
                            for i, t in enumerate(REVIEWS)))
    out = tmp_path / "rate.json"
    code, stdout, err = call(monkeypatch, capsys, "reward", "rate", "--reward-model", str(folder), "--data", str(data),
                             "--attribute", "sentiment", "--rewriter", "programmatic", "--out", str(out), "--json")
    assert code == 0, err
    summary = json.loads(stdout)
    full = json.loads(out.read_text())
    assert summary["w1"] == 4 and summary["w0"] == 4 and summary["failures"]["rewrite_failed"] == 0
    detail = full["units_detail"]
    assert [u["w"] for u in detail] == [1, 0, 1, 0, 1, 0, 1, 0]
    # The scorer is the reward model's logit on the chat-formatted text.
    from lmforge.methods.diverging_prefs.heads import format_text

    with torch.no_grad():
        direct = [float(model.score([format_text(model.tokenizer, "Write a movie review: ", u["original"])])[0, 0])
                  for u in detail]
    np.testing.assert_allclose([u["reward"][0] for u in detail], direct, atol=1e-5)
    # The estimates are the estimators applied to the stored rewards.
    r = np.array([u["reward"] for u in detail])
    w = np.array([u["w"] for u in detail])
    want = E.all_effects(r[:, 0], r[:, 1], r[:, 2], w)
    for group in ("single_rewrite", "rate"):
        for k in ("ATT", "ATU", "ATE"):
            assert summary["effects"][group][k]["value"] == pytest.approx(want[group][k]["value"])
    assert summary["effects"]["naive"]["value"] == pytest.approx(want["naive"]["value"])

    # without --json: a readable summary, and the same --out is refused without --overwrite
    code, stdout, err = call(monkeypatch, capsys, "reward", "rate", "--reward-model", str(folder), "--data", str(data),
                             "--attribute", "sentiment", "--out", str(out))
    assert code == 2 and "already exists" in err


def test_rate_command_errors(tmp_path, monkeypatch, capsys, plain_rm):
    folder, _ = plain_rm
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"response": "x"}) + "\n" + json.dumps({"response": "y", "w": 2}) + "\n")
    code, _, err = call(monkeypatch, capsys, "reward", "rate", "--reward-model", str(folder), "--data", str(data),
                        "--attribute", "sentiment")
    assert code == 2 and err.strip() == f"error: {data}:2: 'w' must be 0 or 1, got 2"
    data.write_text(json.dumps({"response": "x"}) + "\n")
    code, _, err = call(monkeypatch, capsys, "reward", "rate", "--reward-model", str(folder), "--data", str(data),
                        "--attribute", "humour")
    assert code == 2 and "not a built-in attribute" in err
    data.write_text("".join(json.dumps({"response": t, "w": 1}) + "\n" for t in REVIEWS[:3]))
    code, _, err = call(monkeypatch, capsys, "reward", "rate", "--reward-model", str(folder), "--data", str(data),
                        "--attribute", "humour", "--rewriter", "hf:")
    assert code == 2 and "names no model" in err
    monkeypatch.delenv("NO_SUCH_KEY_ENV", raising=False)
    code, _, err = call(monkeypatch, capsys, "reward", "rate", "--reward-model", str(folder), "--data", str(data),
                        "--attribute", "humour", "--rewriter", "openai:gpt-4o", "--api-key-env", "NO_SUCH_KEY_ENV")
    assert code == 2 and "NO_SUCH_KEY_ENV" in err


def test_an_mlp_reward_model_is_refused_before_any_rewrite(tmp_path):
    """RATE scores texts: a feature-vector (MLP) reward model is refused when it is loaded, so no
    rewrite (possibly a paid API call) is spent first."""
    from lmforge.common.errors import UserError
    from lmforge.methods.diverging_prefs.config import DivergingPrefsConfig
    from lmforge.methods.diverging_prefs.heads import make_model, save_reward_model
    from lmforge.methods.rate.apply import load_scorer

    cfg = DivergingPrefsConfig(head="bt")
    (tmp_path / "mlp").mkdir()
    save_reward_model(make_model(cfg, in_dim=4), cfg, tmp_path / "mlp")
    with pytest.raises(UserError, match="MLP reward model scores feature vectors"):
        load_scorer(tmp_path / "mlp")
