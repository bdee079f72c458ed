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
