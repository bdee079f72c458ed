"""Tests for calibration capture, the layer-by-layer driver and Hessian accumulation."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from torch import nn

from lmforge.common.calibration import (
    HessianAccumulator,
    accumulate_linear_stats,
    capture_layer_inputs,
    get_decoder_layers,
    iterate_layers,
    linear_modules,
)
from lmforge.common.errors import UserError

from .conftest import FAMILIES, make_model

# (linear fed by the first norm, that norm) per family
FIRST_LINEAR = {
    "llama": ("self_attn.q_proj", "input_layernorm"),
    "qwen2": ("self_attn.q_proj", "input_layernorm"),
    "mistral": ("self_attn.q_proj", "input_layernorm"),
    "gpt2": ("attn.c_attn", "ln_1"),
}


def calib_batches(vocab: int, seed: int = 0):
    """Three batches; the second is right-padded (positions with mask 0)."""
    g = torch.Generator().manual_seed(seed)
    b0 = torch.randint(4, vocab, (2, 10), generator=g)
    ids1 = torch.randint(4, vocab, (3, 12), generator=g)
    mask1 = torch.ones(3, 12, dtype=torch.long)
    mask1[1, 8:] = 0
    mask1[2, 5:] = 0
    ids1[mask1 == 0] = 3  # pad id
    b2 = torch.randint(4, vocab, (1, 7), generator=g)
    return [b0, {"input_ids": ids1, "attention_mask": mask1}, b2]


def reference_hidden_states(model, batches):
    refs = []
    with torch.no_grad():
        for b in batches:
            ids, mask = (b["input_ids"], b["attention_mask"]) if isinstance(b, dict) else (b, None)
            refs.append(model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states)
    return refs


def final_norm(model, family):
    return model.transformer.ln_f if family == "gpt2" else model.model.norm


# ------------------------------------------------------------------------------------------------
# HessianAccumulator


@pytest.mark.parametrize(
    "dtype,tol,in_dtype",
    # float64 accumulation of float32 activations: each batch's X^T X in float32, the running sum in
    # float64; float64 activations stay float64 throughout.
    [(torch.float64, 1e-6, torch.float32), (torch.float64, 1e-12, torch.float64), (torch.float32, 1e-5, torch.float32)],
)
def test_hessian_equals_closed_form_and_drops_masked_rows(dtype, tol, in_dtype):
    g = torch.Generator().manual_seed(0)
    acc = HessianAccumulator(8, dtype=dtype)
    kept = []
    for shape in [(2, 5), (3, 4), (1, 9)]:
        x = torch.randn(*shape, 8, generator=g, dtype=torch.float64)
        mask = (torch.rand(*shape, generator=g) > 0.3).long()
        mask.view(-1)[0] = 1
        x_poisoned = x.clone()
        x_poisoned[mask == 0] = 1e6  # would dominate H if masked rows leaked in
        acc.add_batch(x_poisoned.to(in_dtype), mask)
        kept.append(x[mask == 1].to(in_dtype).double())
    X = torch.cat(kept)
    expected = 2.0 / X.shape[0] * X.T @ X
    assert acc.n_samples == X.shape[0]
    assert acc.hessian.dtype == dtype
    torch.testing.assert_close(acc.hessian.double(), expected, atol=tol, rtol=tol)


def test_hessian_without_mask_and_empty_batch():
    acc = HessianAccumulator(4, dtype=torch.float64)
    x = torch.randn(6, 4, dtype=torch.float64)
    acc.add_batch(x[:2])
    acc.add_batch(x[2:0])  # no rows: no change
    acc.add_batch(x[2:].reshape(2, 2, 4))
    torch.testing.assert_close(acc.hessian, 2.0 / 6 * x.T @ x)
    with pytest.raises(ValueError):
        acc.add_batch(torch.randn(3, 5))


# ------------------------------------------------------------------------------------------------
# Capture and the layer driver


def test_get_decoder_layers(models):
    assert get_decoder_layers(models["llama"]) is models["llama"].model.layers
    assert get_decoder_layers(models["gpt2"]) is models["gpt2"].transformer.h
    with pytest.raises(UserError):
        get_decoder_layers(nn.Sequential(nn.Linear(2, 2)))


@pytest.mark.parametrize("family", FAMILIES)
def test_capture_stops_before_layer_zero(models, tokenizer, family):
    model = models[family]
    calls = {"layer0": 0, "layer1": 0, "lm_head": 0}
    layers = get_decoder_layers(model)
    hooks = [
        layers[0].register_forward_hook(lambda *a: calls.__setitem__("layer0", calls["layer0"] + 1)),
        layers[1].register_forward_hook(lambda *a: calls.__setitem__("layer1", calls["layer1"] + 1)),
        model.lm_head.register_forward_hook(lambda *a: calls.__setitem__("lm_head", calls["lm_head"] + 1)),
    ]
    try:
        batches = calib_batches(len(tokenizer))
        inputs = capture_layer_inputs(model, batches)
    finally:
        for h in hooks:
            h.remove()
    assert calls == {"layer0": 0, "layer1": 0, "lm_head": 0}
    refs = reference_hidden_states(model, batches)
    assert len(inputs) == 3
    for b in range(3):
        torch.testing.assert_close(inputs.hidden_states[b], refs[b][0])
    assert inputs.padding_masks[0] is None and inputs.padding_masks[1] is not None
    assert inputs.n_tokens() == 2 * 10 + (12 + 8 + 5) + 7


@pytest.mark.parametrize("family", FAMILIES)
def test_driver_reproduces_full_forward(models, tokenizer, family):
    model = models[family]
    batches = calib_batches(len(tokenizer))
    refs = reference_hidden_states(model, batches)
    n_layers = len(get_decoder_layers(model))
    seen = []
    last_inputs = None
    for i, layer, inputs in iterate_layers(model, batches):
        assert layer is get_decoder_layers(model)[i]
        seen.append(i)
        for b in range(len(batches)):
            # refs[b][i] is the input of decoder layer i; compare on real tokens only.
            ref = refs[b][i]
            mask = inputs.padding_masks[b]
            keep = mask.bool() if mask is not None else torch.ones(ref.shape[:2], dtype=torch.bool)
            torch.testing.assert_close(inputs.hidden_states[b][keep], ref[keep], atol=1e-5, rtol=1e-5)
        last_inputs = inputs
    assert seen == list(range(n_layers))
    # After the last layer the shared list holds its outputs; the final norm gives last_hidden_state.
    for b in range(len(batches)):
        mask = last_inputs.padding_masks[b]
        keep = mask.bool() if mask is not None else slice(None)
        out = final_norm(model, family)(last_inputs.hidden_states[b])
        torch.testing.assert_close(out[keep], refs[b][-1][keep], atol=1e-5, rtol=1e-5)


def test_driver_holds_one_layer_of_activations(tokenizer):
    model = make_model("llama", tokenizer, layers=3)
    batches = calib_batches(len(tokenizer))
    gen = iterate_layers(model, batches)
    _, _, inputs0 = next(gen)
    refs = [weakref.ref(h) for h in inputs0.hidden_states]
    n_batches = len(inputs0)
    _, _, inputs1 = next(gen)
    gc.collect()
    assert all(r() is None for r in refs), "layer-0 activations are still alive after moving to layer 1"
    assert len(inputs1) == n_batches
    assert inputs1.hidden_states is inputs0.hidden_states  # replaced in place, not accumulated
    gen.close()


def test_driver_feeds_modified_layers_forward(tokenizer):
    """A layer modified by the caller produces the inputs of the next one (the GPTQ sequential pattern)."""
    model = make_model("llama", tokenizer, seed=5)
    batches = [torch.randint(4, len(tokenizer), (2, 9), generator=torch.Generator().manual_seed(1))]
    final = None
    for _, layer, inputs in iterate_layers(model, batches):
        with torch.no_grad():
            layer.mlp.down_proj.weight.mul_(0.5)  # "compress" the layer
        final = inputs
    with torch.no_grad():
        expected = model(batches[0], output_hidden_states=True).hidden_states[-1]
    torch.testing.assert_close(model.model.norm(final.hidden_states[0]), expected, atol=1e-5, rtol=1e-5)


def test_driver_handles_mixed_attention_kinds(tokenizer):
    """Qwen2 with sliding-window layers: each layer gets the mask of its own kind."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        use_sliding_window=True,
        sliding_window=4,
        max_window_layers=1,
        max_position_embeddings=256,
        initializer_range=0.2,
    )
    assert len(set(cfg.layer_types)) == 2
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    batches = [torch.randint(4, len(tokenizer), (2, 12), generator=torch.Generator().manual_seed(2))]
    refs = reference_hidden_states(model, batches)
    for i, _, inputs in iterate_layers(model, batches):
        torch.testing.assert_close(inputs.hidden_states[0], refs[0][i], atol=1e-5, rtol=1e-5)
    # Layers passed through during capture got their own forward back.
    assert all("forward" not in vars(layer) for layer in model.model.layers)


# ------------------------------------------------------------------------------------------------
# Linear statistics


@pytest.mark.parametrize("family", FAMILIES)
def test_linear_stats_match_normed_inputs(models, tokenizer, family):
    model = models[family]
    batches = calib_batches(len(tokenizer))
    lin_name, norm_name = FIRST_LINEAR[family]
    for i, layer, inputs in iterate_layers(model, batches):
        stats = accumulate_linear_stats(layer, inputs, dtype=torch.float64)
        assert list(stats) == list(linear_modules(layer))
        norm = layer.get_submodule(norm_name)
        rows = []
        with torch.no_grad():
            for h, m in zip(inputs.hidden_states, inputs.padding_masks):
                x = norm(h)
                rows.append(x[m.bool()] if m is not None else x.reshape(-1, x.shape[-1]))
        X = torch.cat(rows).double()
        expected = 2.0 / X.shape[0] * X.T @ X
        acc = stats[lin_name]
        assert acc.n_samples == inputs.n_tokens() == X.shape[0]
        torch.testing.assert_close(acc.hessian, expected, atol=1e-6, rtol=1e-5)
        if i == 1:
            break


def test_gpt2_conv1d_treated_as_linear(models, tokenizer):
    model = models["gpt2"]
    inputs = capture_layer_inputs(model, calib_batches(len(tokenizer)))
    layer = get_decoder_layers(model)[0]
    stats = accumulate_linear_stats(layer, inputs, names=["attn.c_attn", "mlp.c_proj"])
    assert list(stats) == ["attn.c_attn", "mlp.c_proj"]
    assert stats["attn.c_attn"].hessian.shape == (64, 64)  # Conv1D weight is (in, out) = (64, 192)
    assert stats["mlp.c_proj"].hessian.shape == (256, 256)
    with pytest.raises(UserError):
        accumulate_linear_stats(layer, inputs, names=["attn.q_proj"])
    # The hooks are gone afterwards.
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in linear_modules(layer).values())


def test_shared_inputs_share_one_accumulator(models, tokenizer):
    model = models["llama"]
    batches = calib_batches(len(tokenizer))
    for i, layer, inputs in iterate_layers(model, batches):
        plain = accumulate_linear_stats(layer, inputs, dtype=torch.float64)
        shared = accumulate_linear_stats(layer, inputs, dtype=torch.float64, share_inputs=True)
        # q/k/v read the same normed tensor, gate/up another: one accumulator each.
        assert shared["self_attn.q_proj"] is shared["self_attn.k_proj"] is shared["self_attn.v_proj"]
        assert shared["mlp.gate_proj"] is shared["mlp.up_proj"]
        assert shared["self_attn.o_proj"] is not shared["self_attn.q_proj"]
        assert shared["mlp.down_proj"] is not shared["mlp.gate_proj"]
        assert len({id(a) for a in shared.values()}) == 4
        for name in plain:
            assert shared[name].n_samples == plain[name].n_samples
            torch.testing.assert_close(shared[name].hessian, plain[name].hessian)
        break


# ------------------------------------------------------------------------------------------------
# The fast paths of the engine (triangular X^T X, forwards cut short), against plain computations


@pytest.mark.parametrize("n,rows,h_dtype", [(576, 300, torch.float64), (1536, 97, torch.float32), (100, 40, torch.float64)])
def test_add_gram_equals_the_full_product(n, rows, h_dtype):
    from lmforge.common.calibration import add_gram

    g = torch.Generator().manual_seed(n)
    X = torch.randn(rows, n, generator=g)
    A = torch.randn(n, n, generator=g, dtype=torch.float64)
    H0 = A @ A.T
    H0 = ((H0 + H0.T) / 2).to(h_dtype)  # an exactly symmetric start, as a running Hessian is
    H = H0.clone()
    add_gram(H, X)
    expected = H0.double() + X.double().T @ X.double()
    if n > 192:  # the blocked path mirrors its blocks: exactly symmetric
        assert torch.equal(H, H.T)
    # float32 products: relative to the entries' scale, about sqrt(rows) float32 roundings.
    torch.testing.assert_close(H.double(), expected, rtol=0, atol=1e-4 * float(expected.abs().max()))


def _naive_linear_hessians(layer, inputs):
    """``(2/N) X^T X`` per linear from plain forward hooks over full forwards, in float64."""
    sums, counts, handles = {}, {}, []
    current = {}

    def make(name):
        def hook(module, args, output):
            x = args[0].detach().double()
            m = current["mask"]
            x = x[m.bool()] if m is not None else x.reshape(-1, x.shape[-1])
            sums[name] = sums.get(name, 0) + x.T @ x
            counts[name] = counts.get(name, 0) + x.shape[0]

        return hook

    for name, mod in linear_modules(layer).items():
        handles.append(mod.register_forward_hook(make(name)))
    try:
        with torch.no_grad():
            for b in range(len(inputs)):
                current["mask"] = inputs.padding_masks[b] if b < len(inputs.padding_masks) else None
                inputs.run(layer, b)
    finally:
        for h in handles:
            h.remove()
    return {k: 2.0 / counts[k] * sums[k] for k in sums}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("share", [False, True])
def test_every_linear_hessian_equals_a_naive_hook_loop(models, tokenizer, family, share):
    # The later batches' forwards end at the last linear's input: its Hessian and every earlier
    # one must still be those of full forwards, batch by batch, padding left out.
    model = models[family]
    for i, layer, inputs in iterate_layers(model, calib_batches(len(tokenizer))):
        stats = accumulate_linear_stats(layer, inputs, dtype=torch.float64, share_inputs=share)
        naive = _naive_linear_hessians(layer, inputs)
        assert set(stats) == set(naive)
        for name, H in naive.items():
            torch.testing.assert_close(stats[name].hessian, H, atol=1e-6, rtol=1e-5, msg=f"{family} {i} {name}")
        assert all(not m._forward_hooks and not m._forward_pre_hooks for m in linear_modules(layer).values())


def test_run_last_false_leaves_the_last_layer_unrun(models, tokenizer):
    model = models["llama"]
    batches = calib_batches(len(tokenizer))
    seen = []
    for i, layer, inputs in iterate_layers(model, batches, run_last=False):
        seen.append([h.clone() for h in inputs.hidden_states])
        last = inputs
    assert len(seen) == len(get_decoder_layers(model))
    # The stored states are still the last layer's inputs, not its outputs.
    for a, b in zip(last.hidden_states, seen[-1]):
        assert torch.equal(a, b)
    refs = reference_hidden_states(model, batches)
    for b, ref in enumerate(refs):
        mask = batches[b]["attention_mask"].bool() if isinstance(batches[b], dict) else slice(None)
        torch.testing.assert_close(last.hidden_states[b][mask], ref[-2][mask], atol=1e-5, rtol=1e-5)


def test_bf16_calibration_runs_layers_under_autocast_and_keeps_fp32_hessians(models, tokenizer):
    from lmforge.common.calibration import calibration_dtype

    model = models["llama"]
    batches = calib_batches(len(tokenizer))
    layer0 = get_decoder_layers(model)[0]
    for _, layer, inputs in iterate_layers(model, batches):
        with torch.no_grad():
            plain = inputs.run(layer, 0)
            with calibration_dtype(torch.bfloat16):
                cast = inputs.run(layer, 0)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                by_hand = layer(inputs.hidden_states[0], *inputs.args[0], **inputs.kwargs[0])
        with calibration_dtype(torch.bfloat16):
            stats = accumulate_linear_stats(layer, inputs, dtype=torch.float32)
        by_hand = by_hand[0] if isinstance(by_hand, (tuple, list)) else by_hand
        # The context's forward is exactly torch's bf16 autocast, and it is not the float32 forward.
        assert torch.equal(cast, by_hand)
        assert not torch.equal(cast, plain)
        assert float((cast.float() - plain).abs().max()) < 0.1 * float(plain.abs().max())
        # Statistics stay in their own dtype, close to the float32 forward's (measured: at most 1.1%
        # relative, against the 5% bound). q/k/v read the first RMSNorm of the layer's input, which
        # Llama computes in float32 even under autocast, so their Hessians are exactly the float32
        # ones; gate/up (after the bf16 attention), o_proj and down_proj read bf16 matmul outputs.
        ref = accumulate_linear_stats(layer, inputs, dtype=torch.float32)
        rels = {}
        for name, acc in stats.items():
            assert acc.hessian.dtype == torch.float32
            rels[name] = float((acc.hessian - ref[name].hessian).norm() / ref[name].hessian.norm())
            assert rels[name] < 0.05, name
        assert all(rels[n] == 0 for n in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"))
        assert rels["self_attn.o_proj"] > 0 and rels["mlp.down_proj"] > 0
        break
    assert layer is layer0
    # Outside the context nothing is cast; a bad dtype is refused.
    with pytest.raises(UserError, match="bfloat16 or float16"):
        with calibration_dtype(torch.float64):
            pass
