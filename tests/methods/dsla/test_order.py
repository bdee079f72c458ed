"""DSLA-Serve's entropy order against an independent recomputation of the attention probabilities."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from lmforge.common.errors import UserError
from lmforge.methods.dsla.order import entropy_order, fallback_order, last_row_entropy

# q_proj scale per layer: sharper attention (lower entropy) for larger scales, so the layers'
# entropies are well apart and the order is a non-trivial permutation: 2 (x12), 0 (x6), 3 (x3), 1 (x1).
Q_SCALES = [6.0, 1.0, 12.0, 3.0]
EXPECTED_ORDER = [2, 0, 3, 1]


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(cfg).to(torch.float64).eval()
    with torch.no_grad():
        for layer, s in zip(model.model.layers, Q_SCALES):
            layer.self_attn.q_proj.weight.mul_(s * 8.0)
            layer.self_attn.k_proj.weight.mul_(8.0)
    return model


@pytest.fixture(scope="module")
def tiny32(tiny):
    """The same model in float32: transformers' eager mask overflows to NaN on padded float64 rows."""
    return copy.deepcopy(tiny).to(torch.float32)


@torch.no_grad()
def reference_entropies(model, ids: torch.Tensor) -> list[float]:
    """Per-layer entropy of the last token's attention row, from each layer's own inputs: q/k
    projections + RoPE recomputed here, softmax(q k^T / sqrt(d) + causal mask) in float64. One
    unpadded sequence, run with the model's default (sdpa) attention."""
    captured: dict[int, tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]] = {}
    hooks = []
    for i, layer in enumerate(model.model.layers):
        def pre(mod, args, kwargs, i=i):
            captured[i] = (kwargs["hidden_states"] if "hidden_states" in kwargs else args[0],
                           kwargs["position_embeddings"])
        hooks.append(layer.self_attn.register_forward_pre_hook(pre, with_kwargs=True))
    try:
        with torch.no_grad():
            model(input_ids=ids[None, :])
    finally:
        for h in hooks:
            h.remove()
    cfg = model.config
    d = cfg.hidden_size // cfg.num_attention_heads
    groups = cfg.num_attention_heads // cfg.num_key_value_heads
    n = ids.shape[0]
    causal = torch.full((n, n), float("-inf"), dtype=torch.float64).triu(1)
    out = []
    for i, layer in enumerate(model.model.layers):
        h, (cos, sin) = captured[i]
        attn = layer.self_attn
        q = attn.q_proj(h).view(1, n, -1, d).transpose(1, 2)
        k = attn.k_proj(h).view(1, n, -1, d).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        k = k.repeat_interleave(groups, dim=1)
        probs = torch.softmax(q.double() @ k.double().transpose(-1, -2) / math.sqrt(d) + causal, dim=-1)
        last = probs[0, :, -1, :]  # (heads, keys)
        ent = -(last * last.clamp_min(1e-300).log()).sum(-1)
        out.append(float(ent.mean().detach()))
    return out


def test_entropies_match_independent_softmax(tiny):
    ids = torch.randint(0, 97, (13,), generator=torch.Generator().manual_seed(1))
    assert tiny.config._attn_implementation == "sdpa"
    order, ent = entropy_order(tiny, ids)
    ref = reference_entropies(tiny, ids)
    assert ent == pytest.approx(ref, abs=1e-6)
    assert order == sorted(range(4), key=lambda i: ref[i])
    assert order == EXPECTED_ORDER
    gaps = [ent[b] - ent[a] for a, b in zip(order, order[1:])]
    assert min(gaps) > 1e-3  # the order is not decided by rounding
    assert tiny.config._attn_implementation == "sdpa"  # restored
    assert not tiny.training


def test_implementation_restored_after_error(tiny):
    with pytest.raises(UserError, match="too short"):
        entropy_order(tiny, torch.tensor([[5]]))
    bad_mask = torch.tensor([[1, 1, 0]])  # right padding
    with pytest.raises(UserError, match="pad on the left"):
        entropy_order(tiny, torch.tensor([[5, 6, 0]]), bad_mask)
    assert tiny.config._attn_implementation == "sdpa"


def test_left_padded_batch_excludes_masked_keys(tiny32):
    tiny = tiny32
    g = torch.Generator().manual_seed(2)
    a = torch.randint(1, 97, (7,), generator=g)
    b = torch.randint(1, 97, (11,), generator=g)
    _, ent_a = entropy_order(tiny, a)
    _, ent_b = entropy_order(tiny, b)
    # a alone, left-padded by 4: the same entropies as unpadded.
    ids = torch.cat([torch.zeros(4, dtype=torch.long), a])[None, :]
    mask = torch.cat([torch.zeros(4, dtype=torch.long), torch.ones(7, dtype=torch.long)])[None, :]
    _, ent_pad = entropy_order(tiny, ids, mask)
    assert ent_pad == pytest.approx(ent_a, abs=1e-6)
    # a batch of both: the mean of the two rows' entropies.
    batch = torch.stack([ids[0], b])
    bmask = torch.stack([mask[0], torch.ones(11, dtype=torch.long)])
    order, ent_batch = entropy_order(tiny, batch, bmask)
    mean = [(x + y) / 2 for x, y in zip(ent_a, ent_b)]
    assert ent_batch == pytest.approx(mean, abs=1e-6)
    assert order == sorted(range(4), key=lambda i: mean[i])


def test_non_finite_attention_is_an_error(tiny):
    def poison(mod, args, out):
        return out[0], out[1] * float("nan")

    h = tiny.model.layers[1].self_attn.register_forward_hook(poison, prepend=True)  # before transformers' capture hook
    try:
        with pytest.raises(UserError, match="layer 1's attention weights are not finite"):
            entropy_order(tiny, torch.arange(1, 9))
    finally:
        h.remove()
    assert tiny.config._attn_implementation == "sdpa"


def test_last_row_entropy_masks_renormalises_and_drops_tiny_terms():
    row = torch.tensor([[[0.5, 0.25, 0.25], [1.0 - 1e-10, 1e-10, 0.0]]], dtype=torch.float64)  # (1 batch, 2 heads, 3 keys)
    ent = last_row_entropy(row)
    h0 = -(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25))
    assert ent[0, 0].item() == pytest.approx(h0, abs=1e-12)
    # p = 1e-10 <= 1e-9 counts 0; the other term is -(1-1e-10) log(1-1e-10) ~ 1e-10.
    assert ent[0, 1].item() == pytest.approx(0.0, abs=1e-9)
    # key 0 masked: [0.25, 0.25] renormalised to [0.5, 0.5] -> log 2. Head 1 keeps only 1e-10 mass
    # (on key 1); the official sum clamp at 1e-9 makes it p = 0.1, not 1: entropy -0.1 log 0.1.
    masked = last_row_entropy(row, torch.tensor([[0, 1, 1]]))
    assert masked[0, 0].item() == pytest.approx(math.log(2), abs=1e-12)
    assert masked[0, 1].item() == pytest.approx(0.1 * math.log(10), rel=1e-9)
    # everything masked: sum clamped at 1e-9, all terms 0 -> entropy 0 (no NaN).
    assert last_row_entropy(row, torch.tensor([[0, 0, 0]])).abs().max().item() == 0.0


def test_fallback_order_is_official():
    assert fallback_order(32) == list(range(31, -1, -1))
    assert fallback_order(3) == [2, 1, 0]
