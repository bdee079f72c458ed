"""The sequential engine: layer l is calibrated on the outputs of layers 0..l-1 already compressed."""

from __future__ import annotations

import copy

import torch

from lmforge.common.calibration import accumulate_linear_stats, iterate_layers
from lmforge.common.compress import LinearResult, compress_linears
from lmforge.common.quant import quantize_rtn, relative_output_error


def test_each_layer_sees_the_compressed_layers_before_it(small, small_calib):
    model, _ = small
    model = copy.deepcopy(model)
    seen: dict[str, torch.Tensor] = {}

    def fn(name, W, H):
        seen[name] = H.clone()
        q = quantize_rtn(W, 2, 32, False)  # coarse, so that feeding FP outputs instead would show
        return LinearResult(weight=q.dequantize(), quantized=q)

    res = compress_linears(model, small_calib, fn, method="rtn2", config={}, progress=False)
    assert [r.name for r in res.layers] == list(seen)
    # Replaying the final model gives every layer the inputs the engine used: layers before it
    # compressed, and (as in llm-compressor, without GPTQ's optional "true sequential") the layer
    # itself still in full precision while its Hessians are collected in one pass.
    fp, _ = small
    fp_layers = fp.model.layers
    for i, layer, inputs in iterate_layers(model, small_calib):
        compressed = copy.deepcopy(layer.state_dict())
        layer.load_state_dict(fp_layers[i].state_dict())
        stats = accumulate_linear_stats(layer, inputs, dtype=torch.float64)
        for name, acc in stats.items():
            torch.testing.assert_close(acc.hessian, seen[f"model.layers.{i}.{name}"], rtol=1e-6, atol=1e-8)
        layer.load_state_dict(compressed)  # the next layer's inputs come from the compressed layer
    # And they differ from the full-precision model's inputs beyond layer 0.
    for i, layer, inputs in iterate_layers(copy.deepcopy(fp), small_calib):
        H = accumulate_linear_stats(layer, inputs, ["mlp.down_proj"], dtype=torch.float64)["mlp.down_proj"].hessian
        same = torch.allclose(H, seen[f"model.layers.{i}.mlp.down_proj"], rtol=1e-6, atol=1e-8)
        assert same == (i == 0)
    # The recorded errors are the errors of the weights now in the model.
    rec = res.layers[0]
    W_new = model.model.layers[0].self_attn.q_proj.weight.detach()
    W_old = fp.model.layers[0].self_attn.q_proj.weight.detach()
    assert abs(relative_output_error(W_old, W_new, seen[rec.name]) - rec.rel_error) < 1e-9


def test_without_layer_errors_wanda_keeps_only_the_diagonal_and_prunes_the_same(small, small_calib):
    from lmforge.methods.wanda.apply import apply_wanda
    from lmforge.methods.wanda.config import WandaConfig

    model, _ = small
    a, b = copy.deepcopy(model), copy.deepcopy(model)
    ra = apply_wanda(a, small_calib[:4], WandaConfig(), progress=False)
    rb = apply_wanda(b, small_calib[:4], WandaConfig(), progress=False, layer_errors=False)
    assert all(r.rel_error is not None for r in ra.layers) and all(r.rel_error is None for r in rb.layers)
    for (na, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(pa == 0, pb == 0), na


def test_true_sequential_calibrates_each_group_through_the_compressed_earlier_groups(small, small_calib):
    """GPTQ's --true-sequential: q/k/v, then o, then gate/up, then down; each group's X^T X is collected
    (here by plain forward hooks, written independently of the engine) with the earlier groups of the same
    layer already quantized."""
    model, _ = small
    calib = small_calib[:4]
    stages = [["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"], ["self_attn.o_proj"],
              ["mlp.gate_proj", "mlp.up_proj"], ["mlp.down_proj"]]

    def fn(name, W, H):
        seen[name] = H.clone()
        q = quantize_rtn(W, 2, 32, False)
        return LinearResult(weight=q.dequantize(), quantized=q)

    seen: dict[str, torch.Tensor] = {}
    ours = copy.deepcopy(model)
    compress_linears(ours, calib, fn, method="rtn2", config={}, progress=False, true_sequential=True)
    ts = dict(seen)
    seen.clear()
    compress_linears(copy.deepcopy(model), calib, fn, method="rtn2", config={}, progress=False)
    plain = dict(seen)

    ref = copy.deepcopy(model)
    for i, layer, inputs in iterate_layers(ref, calib):
        mods = dict(layer.named_modules())
        for stage in stages:
            xs: list[torch.Tensor] = []
            hook = mods[stage[0]].register_forward_pre_hook(lambda m, a: xs.append(a[0].reshape(-1, a[0].shape[-1])))
            with torch.no_grad():
                for b in range(len(inputs)):
                    inputs.run(layer, b)
            hook.remove()
            X = torch.cat(xs).double()
            H = 2 * X.T @ X / X.shape[0]
            for n in stage:
                # (the engine sums each batch's product in float32, hence the tolerance)
                torch.testing.assert_close(ts[f"model.layers.{i}.{n}"], H, rtol=1e-4, atol=1e-6 * float(H.abs().max()))
                with torch.no_grad():
                    mods[n].weight.copy_(quantize_rtn(mods[n].weight.detach().float(), 2, 32, False).dequantize())
    # Same final model, and a real difference from the one-pass default past the first group.
    for (n, a), (_, b) in zip(ours.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=n)
    name = "model.layers.0.self_attn.o_proj"
    assert not torch.allclose(ts[name], plain[name], rtol=1e-3, atol=1e-6)
    torch.testing.assert_close(ts["model.layers.0.self_attn.q_proj"], plain["model.layers.0.self_attn.q_proj"])
