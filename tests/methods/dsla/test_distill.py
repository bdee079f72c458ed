"""Chained distillation: the official loss against a hand computation, only DSLA parameters train, the
stage checkpoint resumes to the same weights, zeroing is exact; the decode-speed cache is the right size."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from lmforge.common.errors import UserError
from lmforge.methods.dsla.convert import converted, dsla_state_dict
from lmforge.methods.dsla.distill import (DistillConfig, ZeroAttention, chain_distill, distill_stage, evaluate,
                                          official_loss, put_back, zero_layers)
from lmforge.methods.dsla.layer import DSLAConfig, DualStateLinearAttention
from lmforge.methods.dsla.speed import decode_ms_per_token, filled_cache

DCFG = DSLAConfig(chunk=8)


def _tiny(seed: int = 0, layers: int = 3) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                      num_hidden_layers=layers, vocab_size=50)
    return LlamaForCausalLM(cfg).eval()


def _windows(n: int = 8, length: int = 16, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 50, (n, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("index", ["output", "official"])
def test_official_loss_equals_a_hand_computation(index):
    teacher = _tiny(0)
    student = _tiny(1)
    ids = _windows(2, 10)
    with torch.no_grad():
        s = student(ids, output_hidden_states=True)
        t = teacher(ids, output_hidden_states=True)
    cfg = DistillConfig(alpha=0.3, beta=0.7, temperature=2.0, hidden_index=index)
    loss, parts = official_loss(s, t, ids, [0, 2], cfg)
    # hand: mean next-token CE; KL summed over positions and vocab / batch, times T^2; MSE of the layers
    logp = torch.log_softmax(s.logits[:, :-1], -1)
    ce = -logp.gather(-1, ids[:, 1:, None]).mean()
    ps, pt = torch.log_softmax(s.logits / 2, -1), torch.softmax(t.logits / 2, -1)
    kl = (pt * (pt.log() - ps)).sum() / ids.shape[0] * 4
    off = 1 if index == "output" else 0
    mse = torch.stack([((s.hidden_states[i + off] - t.hidden_states[i + off]) ** 2).mean() for i in (0, 2)]).mean()
    assert float(loss) == pytest.approx(float(ce + 0.3 * kl + 0.7 * mse), rel=1e-5)
    assert parts["kl"] == pytest.approx(float(kl), rel=1e-5) and parts["mse"] == pytest.approx(float(mse), rel=1e-5)


def test_a_stage_trains_only_the_converted_attention_and_lowers_the_local_mse():
    teacher = _tiny(0)
    student = copy.deepcopy(teacher)
    before = {k: v.clone() for k, v in student.state_dict().items()}
    cfg = DistillConfig(local_steps=25, joint_steps=3, lr=1e-2, batch_size=4, energy_init=True)
    log = distill_stage(student, teacher, 1, _windows(), cfg, DCFG)
    assert converted(student) == [1] and isinstance(student.model.layers[1].self_attn, DualStateLinearAttention)
    after = student.state_dict()
    for k, v in before.items():
        if ".layers.1.self_attn." not in k:
            assert torch.equal(after[k], v), k  # nothing outside layer 1's attention moved
    assert log.local_mse[-1] < 0.5 * log.local_mse[0]
    assert len(log.joint_loss) == 3 and log.energy_factor is not None and log.energy_factor > 0


def test_chain_checkpoint_resumes_to_the_same_weights(tmp_path):
    teacher = _tiny(0)
    cfg = DistillConfig(local_steps=3, joint_steps=2, batch_size=2)
    full = copy.deepcopy(teacher)
    chain_distill(full, teacher, [2, 0], _windows(), cfg, DCFG)
    # interrupted after the first stage, then resumed
    part = copy.deepcopy(teacher)
    chain_distill(part, teacher, [2], _windows(), cfg, DCFG, ckpt_dir=tmp_path / "run")
    import json

    doc = json.loads((tmp_path / "run" / "stages.json").read_text())
    doc["settings"]["order"] = [2, 0]  # the same run, stopped after stage 1
    (tmp_path / "run" / "stages.json").write_text(json.dumps(doc))
    resumed = copy.deepcopy(teacher)
    logs = chain_distill(resumed, teacher, [2, 0], _windows(), cfg, DCFG, ckpt_dir=tmp_path / "run")
    assert [s.layer for s in logs] == [2, 0]
    a, b = dsla_state_dict(full), dsla_state_dict(resumed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(UserError, match="other settings"):
        chain_distill(copy.deepcopy(teacher), teacher, [2, 0], _windows(),
                      DistillConfig(local_steps=4, joint_steps=2, batch_size=2), DCFG, ckpt_dir=tmp_path / "run")


def test_zeroing_is_exact_and_put_back_restores():
    model = _tiny(0)
    ids = _windows(2, 8)
    with torch.no_grad():
        ref = model(ids).logits
        originals = zero_layers(model, [0, 1, 2])
        assert all(isinstance(layer.self_attn, ZeroAttention) for layer in model.model.layers)
        # with every attention zeroed, each position sees only itself: logits equal per-token forwards
        whole = model(ids).logits
        alone = torch.cat([model(ids[:, i:i + 1]).logits for i in range(ids.shape[1])], dim=1)
        put_back(model, originals)
        back = model(ids).logits
    assert torch.allclose(whole, alone, atol=1e-5)
    assert torch.equal(ref, back)
    teacher = _tiny(0)
    res = evaluate(model, teacher, ids)
    assert res["kl"] == pytest.approx(0.0, abs=1e-9)


def test_decode_cache_holds_the_context_for_both_layer_kinds():
    from lmforge.methods.dsla.convert import convert_layers

    model = convert_layers(_tiny(0), [1], DCFG)
    cache = filled_cache(model, 40)
    assert cache.get_seq_length() == 40
    assert cache.layers[0].keys.shape[-2] == 40 and cache.layers[1].get_seq_length() == 40
    assert decode_ms_per_token(model, 40, n_tokens=2, warmup=1) > 0
