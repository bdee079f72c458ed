"""The teacher-forced per-role diagnostic (experiment.response_roles / response_token_accuracy)."""

from __future__ import annotations

import types

import pytest
import torch

from lmforge.methods.simple_to_hard import experiment, mini, vlm


def test_response_roles_by_hand():
    gpt = "enumerate e3 7 7 ; d3 4 1 1 ; answer 1 1"
    assert experiment.response_roles(gpt) == [
        "format", "cell", "value", "total", "format", "cell", "value", "total", "total", "format",
        "format", "answer", "answer", "format"]


def test_response_roles_of_a_conversion_then_cot():
    p = mini.generate("SIMPLE", 1, seed=3)[0]
    gpt = mini.conversation(p, "image2answer+text")["conversations"][1]["value"]
    roles = experiment.response_roles(gpt)
    n_conv = 1 + len(mini.text_table(p).split())  # "convert" + the table
    assert roles[:n_conv] == ["conversion"] * n_conv
    assert "conversion" not in roles[n_conv:]


@pytest.mark.parametrize("level", ["SIMPLE", "HARD"])
def test_role_counts_match_the_path(level):
    for p in mini.generate(level, 20, seed=5):
        roles = experiment.response_roles(mini.cot(p))
        assert len(roles) == len(mini.cot(p).split()) + 1
        assert roles.count("cell") == roles.count("value") == len(p.path)
        running = [sum(p.table[r][c] for r, c in p.path[:k + 1]) for k in range(len(p.path))]
        assert roles.count("total") == sum(len(str(t)) for t in running)
        assert roles.count("answer") == len(str(p.total))


class _CellOracle(torch.nn.Module):
    """Teacher-forced stub: predicts the next input token where it is a cell name, <pad> elsewhere."""

    def __init__(self, tok):
        super().__init__()
        self.v = len(tok)
        self.cells = torch.tensor([tok.convert_tokens_to_ids(c) for c in sorted(vlm._CELLS)])

    def forward(self, input_ids, attention_mask=None, pixel_values=None):
        nxt = torch.roll(input_ids, -1, dims=1)
        pred = torch.where(torch.isin(nxt, self.cells), nxt, torch.zeros_like(nxt))
        return types.SimpleNamespace(logits=torch.nn.functional.one_hot(pred, self.v).float())


def test_response_token_accuracy_separates_roles():
    tok = vlm.build_tokenizer()
    ps = mini.generate("SIMPLE", 10, seed=1)
    exs = [experiment.example(p, "text2answer") for p in ps] + [experiment.example(p, "image2answer") for p in ps]
    acc = experiment.response_token_accuracy(_CellOracle(tok), tok, exs, batch_size=7)
    assert acc == {"cell": 1.0, "value": 0.0, "total": 0.0, "answer": 0.0, "format": 0.0}


def test_run_arm_records_the_role_accuracy_of_its_trained_model():
    tok = vlm.build_tokenizer()
    shape = vlm.VLMShape(vision_hidden=16, vision_layers=1, vision_heads=2, hidden=32, layers=1, heads=2,
                         intermediate=64)
    base = vlm.build_model(tok, shape, seed=0)
    pools = experiment.make_pools(12, 12, seed=0)
    ev = {"hard-image": mini.generate("HARD", 1, 1)}
    probe = experiment.hard_probe_batch(tok, mini.generate("HARD", 2, 2))
    roles = [experiment.example(p, "image2answer") for p in mini.generate("SIMPLE", 5, 4)]
    from lmforge.methods.simple_to_hard.train import TrainConfig

    r = experiment.run_arm(base, tok, "image", 12, pools, ev, probe, seed=0, cfg=TrainConfig(batch_size=4),
                           probes_per_phase=1, probe_batch=4, keep_model=True, role_examples=roles)
    assert set(r.roles) == {"cell", "value", "total", "answer", "format"}
    assert r.roles == experiment.response_token_accuracy(r.model, tok, roles)
    # measured on the trained copy, not on the base (which run_arm leaves untouched)
    assert r.model is not base and r.steps > 0
    assert any(not torch.equal(a, b) for a, b in zip(base.parameters(), r.model.parameters()))
