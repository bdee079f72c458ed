"""DSLA layer math: the chunked GLA form against the recurrence, a closed form, GQA expansion, init."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import repeat_kv

from lmforge.methods.dsla.layer import (
    DSLACacheLayer,
    DSLAConfig,
    DualStateLinearAttention,
    energy_rescale_,
    expand_kv_weight,
    gla_chunked,
    gla_recurrent,
)

B, H, T, DK, DV = 2, 3, 45, 8, 6  # T = 45 is not a multiple of any chunk used below


def _inputs(seed: int = 0, requires_grad: bool = False):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, H, T, DK, generator=gen, dtype=torch.float64) for _ in range(2))
    v = torch.randn(B, H, T, DV, generator=gen, dtype=torch.float64)
    # Realistic gates (logsigmoid/16) with about 5% of entries at the clamp, -50.
    g = F.logsigmoid(3 * torch.randn(B, H, T, DK, generator=gen, dtype=torch.float64)) / 16
    g = torch.where(torch.rand(B, H, T, DK, generator=gen, dtype=torch.float64) < 0.05, -50.0, g)
    s0 = torch.randn(B, H, DK, DV, generator=gen, dtype=torch.float64)
    ts = [q, k, v, g, s0]
    if requires_grad:
        for t in ts:
            t.requires_grad_(True)
    return ts


@pytest.mark.parametrize("chunk", [1, 7, 16, 32, 64])
@pytest.mark.parametrize("with_state", [False, True])
def test_chunked_equals_recurrent(chunk: int, with_state: bool) -> None:
    q, k, v, g, s0 = _inputs()
    assert g.min() == -50.0
    state = s0 if with_state else None
    o_ref, s_ref = gla_recurrent(q, k, v, g, DK**-0.5, state)
    o, s = gla_chunked(q, k, v, g, DK**-0.5, chunk=chunk, state=state)
    assert torch.isfinite(o).all() and torch.isfinite(s).all()
    torch.testing.assert_close(o, o_ref, rtol=0, atol=1e-10)
    torch.testing.assert_close(s, s_ref, rtol=0, atol=1e-10)
    if with_state:  # the initial state matters (so the comparison above covers it)
        assert (o - gla_chunked(q, k, v, g, DK**-0.5, chunk=chunk)[0]).abs().max() > 1e-3


def test_chunked_split_sequence_resumes() -> None:
    q, k, v, g, s0 = _inputs(1)
    o_full, s_full = gla_chunked(q, k, v, g, 0.5, chunk=16, state=s0)
    o1, s1 = gla_chunked(q[:, :, :20], k[:, :, :20], v[:, :, :20], g[:, :, :20], 0.5, chunk=16, state=s0)
    o2, s2 = gla_chunked(q[:, :, 20:], k[:, :, 20:], v[:, :, 20:], g[:, :, 20:], 0.5, chunk=16, state=s1)
    torch.testing.assert_close(torch.cat([o1, o2], dim=2), o_full, rtol=0, atol=1e-10)
    torch.testing.assert_close(s2, s_full, rtol=0, atol=1e-10)


def test_chunked_gradients_equal_recurrent() -> None:
    gen = torch.Generator().manual_seed(3)
    w_o = torch.randn(B, H, T, DV, generator=gen, dtype=torch.float64)
    w_s = torch.randn(B, H, DK, DV, generator=gen, dtype=torch.float64)
    grads = []
    for form in ("recurrent", "chunked"):
        q, k, v, g, s0 = _inputs(2, requires_grad=True)
        if form == "recurrent":
            o, s = gla_recurrent(q, k, v, g, 0.4, s0)
        else:
            o, s = gla_chunked(q, k, v, g, 0.4, chunk=16, state=s0)
        ((o * w_o).sum() + (s * w_s).sum()).backward()
        grads.append([t.grad for t in (q, k, v, g, s0)])
    for ref, got in zip(*grads):
        assert torch.isfinite(got).all() and ref.abs().max() > 0
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-9)


def test_chunked_half_precision_input_keeps_float32_state() -> None:
    q, k, v, g, _ = (t.float() for t in _inputs(4))
    o, s = gla_chunked(q.bfloat16(), k.bfloat16(), v.bfloat16(), g.bfloat16(), 0.3, chunk=16)
    assert o.dtype == torch.bfloat16 and s.dtype == torch.float32
    o_ref, _ = gla_recurrent(q.bfloat16().float(), k.bfloat16().float(), v.bfloat16().float(),
                             g.bfloat16().float(), 0.3)
    torch.testing.assert_close(o.float(), o_ref, rtol=2e-2, atol=2e-2)


def test_zero_gates_closed_form() -> None:
    q, k, v, _, _ = _inputs(5)
    g = torch.zeros_like(q)
    scale = DK**-0.5
    prefix = torch.cumsum(k.unsqueeze(-1) * v.unsqueeze(-2), dim=2)  # sum_{s<=t} k_s^T v_s
    expected = scale * torch.einsum("bhtk,bhtkv->bhtv", q, prefix)
    torch.testing.assert_close(gla_recurrent(q, k, v, g, scale)[0], expected, rtol=0, atol=1e-10)
    torch.testing.assert_close(gla_chunked(q, k, v, g, scale, chunk=16)[0], expected, rtol=0, atol=1e-10)


def _attn_model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                      num_hidden_layers=1, vocab_size=100, attn_implementation="eager")
    return LlamaForCausalLM(cfg).double().eval()


def test_gqa_expansion_equals_repeat_kv() -> None:
    model = _attn_model()
    attn = model.model.layers[0].self_attn
    dsla = DualStateLinearAttention.from_attention(attn, model.config, DSLAConfig(), 0)
    x = torch.randn(2, 5, 64, dtype=torch.float64)
    for orig, new in ((attn.k_proj, dsla.k_proj), (attn.v_proj, dsla.v_proj)):
        ref = repeat_kv(orig(x).view(2, 5, 2, 16).transpose(1, 2), 2)
        got = new(x).view(2, 5, 4, 16).transpose(1, 2)
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-12)  # same rows, BLAS blocking may differ
    w = torch.arange(6.0).view(3, 2)  # 3 kv heads of dim 1 -> 6 query heads
    torch.testing.assert_close(expand_kv_weight(w, 6, 3, 1)[:, 0], torch.tensor([0.0, 0, 2, 2, 4, 4]))
    b = torch.tensor([1.0, 2.0, 3.0, 4.0])  # a bias: 2 kv heads of dim 2 -> 4 heads
    assert expand_kv_weight(b, 4, 2, 2).tolist() == [1, 2, 1, 2, 3, 4, 3, 4]
    with pytest.raises(ValueError):
        expand_kv_weight(w, 5, 3, 1)


def test_init_matches_official_recipe() -> None:
    model = _attn_model()
    attn = model.model.layers[0].self_attn
    rng = torch.get_rng_state()
    a = DualStateLinearAttention.from_attention(attn, model.config, DSLAConfig(seed=3), 0)
    assert torch.equal(torch.get_rng_state(), rng)  # the global RNG is left alone
    b = DualStateLinearAttention.from_attention(attn, model.config, DSLAConfig(seed=3), 0)
    c = DualStateLinearAttention.from_attention(attn, model.config, DSLAConfig(seed=3), 1)
    assert torch.equal(a.gk_proj.weight, torch.eye(64, dtype=torch.float64))
    assert a.gk_proj.bias.abs().max() == 0 and a.gk_proj2.bias.abs().max() == 0
    assert a.gk_proj2.weight.abs().max() <= 64**-0.5 and a.gk_proj2.weight.std() > 0.5 * 64**-0.5 / 3**0.5
    assert a.alpha.shape == (2,) and ((a.alpha >= 0) & (a.alpha < 1)).all()
    assert torch.equal(a.gk_proj2.weight, b.gk_proj2.weight) and torch.equal(a.alpha, b.alpha)
    assert not torch.equal(a.gk_proj2.weight, c.gk_proj2.weight)
    assert a.q_proj.weight.dtype == torch.float64 and torch.equal(a.q_proj.weight, attn.q_proj.weight)
    single = DualStateLinearAttention.from_attention(attn, model.config, DSLAConfig(n_states=1), 0)
    assert single.n_states == 1 and single.gk_proj2 is None and single.alpha.shape == (1,)
    with pytest.raises(ValueError):
        DSLAConfig(n_states=3)


@pytest.mark.parametrize("n_states", [1, 2])
def test_module_equals_formula(n_states: int) -> None:
    """The module's output is o_proj(sum_i softmax(alpha)_i * GLA_i(q, k, v, g_i)) with the official gates."""
    model = _attn_model()
    attn = model.model.layers[0].self_attn
    dsla = DualStateLinearAttention.from_attention(attn, model.config, DSLAConfig(n_states=n_states, chunk=4), 0)
    with torch.no_grad():
        dsla.alpha.copy_(torch.tensor([0.3, -0.7][:n_states]))
    x = torch.randn(2, 11, 64, dtype=torch.float64)
    out, weights = dsla(x)
    assert weights is None

    def heads(t):
        return t.view(2, 11, 4, 16).transpose(1, 2)

    q, k, v = heads(dsla.q_proj(x)), heads(dsla.k_proj(x)), heads(dsla.v_proj(x))
    mix = torch.softmax(dsla.alpha, 0)
    ref = 0
    for i, proj in enumerate([dsla.gk_proj, dsla.gk_proj2][:n_states]):
        g = heads(torch.clamp_min(F.logsigmoid(proj(x)) / 16, -50))
        ref = ref + mix[i] * gla_recurrent(q, k, v, g, 16**-0.5)[0]
    ref = dsla.o_proj(ref.transpose(1, 2).reshape(2, 11, 64))
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-10)


def test_module_backward_reaches_every_parameter() -> None:
    model = _attn_model()
    dsla = DualStateLinearAttention.from_attention(model.model.layers[0].self_attn, model.config, DSLAConfig(chunk=4))
    x = torch.randn(2, 10, 64, dtype=torch.float64, requires_grad=True)
    out, _ = dsla(x)
    out.square().mean().backward()
    for name, p in dsla.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().max() > 0, name
    assert torch.isfinite(x.grad).all()


def test_padding_mask_raises_and_full_mask_passes() -> None:
    model = _attn_model()
    dsla = DualStateLinearAttention.from_attention(model.model.layers[0].self_attn, model.config)
    x = torch.randn(2, 5, 64, dtype=torch.float64)
    out, _ = dsla(x, attention_mask=torch.ones(2, 5))
    torch.testing.assert_close(out, dsla(x)[0], rtol=0, atol=0)
    with pytest.raises(ValueError, match="padding"):
        dsla(x, attention_mask=torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]]))
    causal = torch.ones(5, 5, dtype=torch.bool).tril()[None, None].expand(2, 1, 5, 5)
    dsla(x, attention_mask=causal)  # a causal 4-D mask without padding is fine
    left_pad = causal.clone()
    left_pad[1, :, :, 0] = False
    with pytest.raises(ValueError, match="padding"):
        dsla(x, attention_mask=left_pad)


def test_cache_slot_batch_ops_and_crop() -> None:
    slot = DSLACacheLayer()
    slot.advance(torch.arange(3.0).view(3, 1, 1, 1, 1), 4)
    assert slot.get_seq_length() == 4 and slot.get_mask_sizes(2) == (6, 0)
    slot.reorder_cache(torch.tensor([2, 0, 0]))
    assert slot.states.flatten().tolist() == [2, 0, 0]
    slot.batch_select_indices(torch.tensor([0]))
    slot.batch_repeat_interleave(2)
    assert slot.states.flatten().tolist() == [2, 2]
    slot.crop(0)
    with pytest.raises(ValueError):
        slot.crop(-1)
    with pytest.raises(RuntimeError):
        slot.update(torch.zeros(1), torch.zeros(1))
    slot.reset()
    assert slot.states is None and slot.get_seq_length() == 0
    cache = DynamicCache()
    cache.update(torch.zeros(1, 1, 3, 2), torch.zeros(1, 1, 3, 2), 0)
    model = _attn_model()
    dsla = DualStateLinearAttention.from_attention(model.model.layers[0].self_attn, model.config, layer_idx=0)
    with pytest.raises(ValueError, match="softmax"):
        dsla(torch.randn(1, 2, 64, dtype=torch.float64), past_key_values=cache)


def test_energy_rescale_matches_teacher_norm() -> None:
    model = _attn_model()
    attn = model.model.layers[0].self_attn
    dsla = DualStateLinearAttention.from_attention(attn, model.config)
    x = torch.randn(2, 9, 64, dtype=torch.float64)
    cos_sin = model.model.rotary_emb(x, torch.arange(9)[None])
    with torch.no_grad():
        teacher, _ = attn(x, position_embeddings=cos_sin, attention_mask=None)
    before = dsla.o_proj.weight.clone()
    factor = energy_rescale_(dsla, x, teacher)
    torch.testing.assert_close(dsla.o_proj.weight, before * factor, rtol=0, atol=0)
    with torch.no_grad():
        after = dsla(x)[0]
    torch.testing.assert_close(after.norm(), teacher.norm(), rtol=1e-10, atol=0)
    assert factor != pytest.approx(1.0)
