"""MoRAgent training pieces: completion-only targets, the loss against a naive per-token CE, the exact
frozen-prefix cache (a step with it equals a step without it), the parameter match of the LoRA
baseline (closed form against counted parameters), and the adapter save/load round trip."""

from __future__ import annotations

import copy
import random

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from lmforge.common.errors import UserError
from lmforge.data import toolcalls
from lmforge.methods.moragent.adapter import count_trainable, mor_layers, set_roles
from lmforge.methods.moragent.data import TemplateCompleter, build_trajectories, render_segment
from lmforge.methods.moragent.layer import MoRConfig
from lmforge.methods.moragent.train import (
    TrainSettings,
    _collate,
    _inner,
    _loss,
    add_adapter,
    encode_examples,
    load_adapter,
    lora_rank_for,
    mor_trainable_count,
    save_adapter,
    train_adapter,
)
from lmforge.models.tokenizer import train_tokenizer


@pytest.fixture(scope="module")
def data():
    recs = toolcalls.generate(random.Random(4), 24)
    kept, _ = build_trajectories(recs, TemplateCompleter())
    tok = train_tokenizer(["".join(render_segment(s) for s in t.segments) for t in kept], 400)
    return tok, kept


def _model(tok, layers: int = 3) -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=layers, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=len(tok), max_position_embeddings=512,
                      attn_implementation="eager", eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return LlamaForCausalLM(cfg).eval()


def test_targets_are_the_role_tokens_only(data):
    tok, trajs = data
    ex, too_long = encode_examples(tok, trajs)
    assert too_long == 0 and len(ex) == len(trajs)
    for e in ex:
        assert [lab != -100 for lab in e.labels] == [r >= 0 for r in e.role_ids]
        assert all(lab == i for lab, i in zip(e.labels, e.input_ids) if lab != -100)
    short, dropped = encode_examples(tok, trajs, max_len=min(len(e.input_ids) for e in ex))
    assert dropped == len(trajs) - len(short) and dropped > 0


def test_loss_equals_naive_masked_cross_entropy(data):
    tok, trajs = data
    model = _model(tok)
    ex, _ = encode_examples(tok, trajs[:3])
    batch = _collate(tok, ex)
    with torch.no_grad():
        got = float(_loss(model, batch, 0, None))
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    terms = []
    for b, e in enumerate(ex):
        for t in range(1, len(e.input_ids)):
            if e.role_ids[t] >= 0:
                terms.append(-torch.log_softmax(logits[b, t - 1], -1)[e.input_ids[t]])
    assert got == pytest.approx(float(torch.stack(terms).mean()), rel=1e-5)


@pytest.mark.parametrize("kind", ["mor", "lora"])
def test_prefix_cache_step_equals_full_model_step(data, kind):
    tok, trajs = data
    ex, _ = encode_examples(tok, trajs[:8])
    runs = []
    for cache in (True, False):
        model, _ = add_adapter(_model(tok), kind, [-1], config=MoRConfig(rank=2), seed=3)
        if kind == "mor":  # B = 0 at init: give it a start off zero so every path matters
            with torch.no_grad():
                for layer in mor_layers(model).values():
                    layer.mor_B.normal_(0, 0.1)
        s = TrainSettings(steps=3, lr=1e-2, batch_size=4, warmup=0, bf16=False, prefix_cache=cache, seed=1)
        log = train_adapter(model, tok, ex, s)
        runs.append((log, {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}))
    (with_cache, p1), (without, p2) = runs
    assert with_cache["prefix_layer"] == 2 and without["prefix_layer"] == 0
    assert with_cache["losses"] == pytest.approx(without["losses"], rel=1e-5, abs=1e-6)
    for n in p1:
        torch.testing.assert_close(p1[n], p2[n], rtol=1e-4, atol=1e-6)


def test_lora_baseline_matches_mor_parameter_count(data):
    tok, _ = data
    cfg = MoRConfig(rank=2)
    mor, info_m = add_adapter(_model(tok), "mor", [-2, -1], config=cfg)
    assert info_m["trainable"] == count_trainable(mor) == mor_trainable_count([(32, 32), (32, 16), (32, 16),
                                                                                (32, 32), (32, 48), (32, 48),
                                                                                (48, 32)] * 2, cfg)
    lora, info_l = add_adapter(_model(tok), "lora", [-2, -1], config=cfg)
    dims_sum = 2 * (64 + 48 + 48 + 64 + 80 + 80 + 80)
    assert info_l["rank"] == lora_rank_for([(dims_sum, 0)], info_m["trainable"]) == round(info_m["trainable"] / dims_sum)
    assert info_l["trainable"] == info_l["rank"] * dims_sum
    assert abs(info_l["trainable"] - info_m["trainable"]) <= dims_sum / 2
    with pytest.raises(UserError, match="out of range"):
        add_adapter(_model(tok), "mor", [5])
    with pytest.raises(UserError, match="'mor' or 'lora'"):
        add_adapter(_model(tok), "dora", [-1])


@pytest.mark.parametrize("kind", ["mor", "lora"])
def test_save_and_load_round_trip(data, kind, tmp_path):
    tok, trajs = data
    ex, _ = encode_examples(tok, trajs[:4])
    model, _ = add_adapter(_model(tok), kind, [-1], config=MoRConfig(rank=2), seed=1)
    train_adapter(model, tok, ex, TrainSettings(steps=2, lr=1e-2, batch_size=2, warmup=0, bf16=False))
    save_adapter(model, tmp_path / "a", {"note": 1})
    assert not (tmp_path / "a" / "model.safetensors").exists()
    with pytest.raises(UserError):
        save_adapter(model, tmp_path / "a", {})
    loaded = load_adapter(_model(tok), tmp_path / "a")
    batch = _collate(tok, ex[:2])
    outs = []
    for m in (model, loaded):
        if kind == "mor":
            set_roles(m, batch["role_ids"])
        with torch.no_grad():
            outs.append(_inner(m)(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits)
    torch.testing.assert_close(outs[0], outs[1])
    base = _model(tok)
    with torch.no_grad():
        plain = base(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    assert not torch.allclose(outs[0], plain)
    with pytest.raises(UserError, match="not an adapter folder"):
        load_adapter(_model(tok), tmp_path)
