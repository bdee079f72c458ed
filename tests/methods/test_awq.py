"""AWQ: scale folding keeps the function, the search beats plain RTN, the grid search picks the minimum."""

from __future__ import annotations

import copy

import torch

from lmforge.common.calibration import get_decoder_layers, iterate_layers
from lmforge.common.compress import get_weight
from lmforge.common.quant import quantize_rtn, relative_output_error
from lmforge.methods.awq.apply import _fold, apply_awq, scale_groups
from lmforge.methods.awq.config import AWQConfig
from lmforge.methods.awq.core import fake_quantize, normalized_scales, quantize_final, search_clip, search_scales


def test_llama_groups_skip_v_to_o_under_gqa(small):
    model, _ = small
    layer = get_decoder_layers(model)[0]
    groups = scale_groups(layer)
    prevs = [g[0] for g in groups]
    # agent-small has 6 heads and 3 KV heads: v_proj's output (96) is not o_proj's input (192).
    assert prevs == ["input_layernorm", "post_attention_layernorm", "mlp.up_proj"]


def test_folding_scales_keeps_the_layer_function(small, small_calib):
    model, _ = small
    model = copy.deepcopy(model)
    g = torch.Generator().manual_seed(0)
    for i, layer, inputs in iterate_layers(model, small_calib[:2]):
        before = inputs.forward_all(layer)
        for prev, fcs, _ in scale_groups(layer):
            mods = [layer.get_submodule(f) for f in fcs]
            n_in = get_weight(mods[0]).shape[1]
            _fold(layer.get_submodule(prev), mods, torch.rand(n_in, generator=g) * 3 + 0.2)
        after = inputs.forward_all(layer)
        for a, b in zip(before, after):
            assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)
        break


def test_scale_grid_search_returns_the_argmin():
    x_mean = torch.tensor([0.1, 1.0, 10.0, 3.0])
    target = normalized_scales(x_mean, 0.35)
    best, ratio, losses = search_scales(x_mean, lambda s: float((s - target).pow(2).sum()), n_grid=20)
    assert ratio == 0.35 and torch.allclose(best, target)
    assert len(losses) == 20 and min(losses) == losses[7]
    # Normalised: sqrt(max * min) == 1.
    assert abs(float(best.max() * best.min()) - 1.0) < 1e-5


def _official_pseudo_quantize(w: torch.Tensor, n_bit: int, group: int, zero_point: bool) -> torch.Tensor:
    """llm-awq's ``pseudo_quantize_tensor`` written out group by group, as its formulas read."""
    out = torch.empty_like(w)
    for r in range(w.shape[0]):
        for g0 in range(0, w.shape[1], group):
            x = w[r, g0 : g0 + group]
            if zero_point:
                max_int, min_int = 2**n_bit - 1, 0
                scale = max(float(x.max() - x.min()), 1e-5) / max_int
                zero = min(max(-round(float(x.min()) / scale), min_int), max_int)
            else:
                max_int, min_int = 2 ** (n_bit - 1) - 1, -(2 ** (n_bit - 1))
                scale, zero = max(float(x.abs().max()), 1e-5) / max_int, 0
            out[r, g0 : g0 + group] = (torch.clamp(torch.round(x / scale) + zero, min_int, max_int) - zero) * scale
    return out


def test_awq_grid_is_the_official_pseudo_quantize_tensor():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(6, 64, generator=g)
    w[0] = w[0].abs() + 0.3  # an all-positive row: the zero-point clamp pins its grid to 0 (clips the top)
    w[1] = -w[1].abs() - 0.3
    w[2, :32] = 0.0  # an all-zero group: the range clamps at 1e-5
    for bits in (3, 4):
        for sym in (False, True):
            ref = _official_pseudo_quantize(w, bits, 32, zero_point=not sym)
            ours = fake_quantize(w, bits, 32, sym)
            torch.testing.assert_close(ours, ref, rtol=0, atol=1e-6)
            torch.testing.assert_close(quantize_final(w, bits, 32, sym).dequantize(), ref, rtol=0, atol=1e-6)
    # Against GPTQ's grid (asymmetric): the same on groups that straddle 0; on an all-positive group the
    # official zero point clamps at 0, so its grid starts at 0 with the group's own (smaller) range
    # and clips the group's top, where GPTQ's grid [0, max] keeps it.
    gptq, awq = quantize_rtn(w, 4, 32, False).dequantize(), fake_quantize(w, 4, 32, False)
    mixed = (w.amin(dim=1) < 0) & (w.amax(dim=1) > 0)
    mixed[2] = False
    torch.testing.assert_close(awq[mixed], gptq[mixed], rtol=0, atol=1e-6)
    top = int(w[0].argmax())
    assert abs(float(gptq[0, top] - w[0, top])) < 0.05 * float(w[0].max())
    assert float(awq[0, top]) < float(w[0, top]) - 0.1


def test_clip_search_never_increases_the_group_error(real_layer):
    W, H = real_layer
    clipped = search_clip(W, H, bits=3, group_size=32, sym=False)
    base = relative_output_error(W, quantize_final(W, 3, 32, False).dequantize(), H)
    ours = relative_output_error(W, quantize_final(clipped, 3, 32, False).dequantize(), H)
    assert ours <= base + 1e-9
    assert torch.all(clipped.abs() <= W.abs() + 1e-7)


def test_awq_beats_rtn_on_the_model(small, small_calib):
    model, _ = small
    awq_model, rtn_model = copy.deepcopy(model), copy.deepcopy(model)
    res = apply_awq(awq_model, small_calib, AWQConfig(bits=3, group_size=32), progress=False)
    from lmforge.methods.rtn.apply import apply_rtn
    from lmforge.methods.rtn.config import RTNConfig

    rtn = apply_rtn(rtn_model, small_calib, RTNConfig(bits=3, group_size=32), progress=False)
    # Same grid (3-bit, g32, asymmetric): the activation-aware scales and clipping lower the mean
    # relative output error across the linears.
    mean = lambda r: sum(layer.rel_error for layer in r.layers) / len(r.layers)  # noqa: E731
    assert mean(res) < 0.9 * mean(rtn)
    # Packed weights take at most 8 values per (row, group).
    q = res.quantized["model.layers.0.mlp.down_proj"]
    w = q.dequantize()
    assert max(len(torch.unique(w[r, :32])) for r in range(8)) <= 8


def _tiny(kind: str):
    from transformers import LlamaConfig, LlamaForCausalLM, PhiConfig, PhiForCausalLM

    torch.manual_seed(0)
    if kind == "llama-mha":
        cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
        return LlamaForCausalLM(cfg).eval()
    cfg = PhiConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, max_position_embeddings=64)
    return PhiForCausalLM(cfg).eval()


def test_v_to_o_is_folded_without_gqa_and_keeps_the_function():
    model = _tiny("llama-mha")
    calib = [torch.randint(0, 64, (1, 16), generator=torch.Generator().manual_seed(i)) for i in range(4)]
    prevs = [g[0] for g in scale_groups(model.model.layers[0])]
    assert "self_attn.v_proj" in prevs
    res = apply_awq(copy.deepcopy(model), calib, AWQConfig(bits=8, group_size=0, clip=False), progress=False)
    assert any("v_proj -> self_attn.o_proj" in g for g in res.extra["scaled_groups"]) and not res.extra["unscaled"]
    # 8-bit per-channel: the scaled, quantized model stays close to the original (folding is exact).
    ids = torch.randint(0, 64, (1, 16), generator=torch.Generator().manual_seed(9))
    q = copy.deepcopy(model)
    apply_awq(q, calib, AWQConfig(bits=8, group_size=0, clip=False), progress=False)
    with torch.no_grad():
        a, b = model(input_ids=ids).logits, q(input_ids=ids).logits
    assert (a - b).abs().max() < 0.05 * a.abs().max()


def test_groups_that_would_change_the_function_are_refused():
    # Phi's parallel block feeds input_layernorm to the attention *and* the MLP: dividing the norm by
    # s and scaling only q/k/v would change fc1's input.
    model = _tiny("phi")
    calib = [torch.randint(0, 64, (1, 16), generator=torch.Generator().manual_seed(i)) for i in range(2)]
    res = apply_awq(copy.deepcopy(model), calib, AWQConfig(bits=8, group_size=0, clip=False), progress=False)
    assert any("input_layernorm" in g for g in res.extra["unscaled"])
    assert not any("input_layernorm" in g for g in res.extra["scaled_groups"])


def test_duo_scaling_with_a_ragged_group(small, small_calib):
    model, _ = small
    res = apply_awq(copy.deepcopy(model), small_calib[:4], AWQConfig(bits=4, group_size=128, duo_scaling=True, clip=False),
                    progress=False)
    assert len(res.layers) == 28 and all(r.rel_error < 0.2 for r in res.layers)
