"""AWQ wiring: the scale groups of each architecture, the per-layer search, the folding of scales.

Groups (official ``auto_scale_block``), as ``(preceding op, linears sharing its output, module whose
output is compared)``:

* Llama / Qwen2 / Mistral: ``input_layernorm -> q,k,v`` (inspect ``self_attn``),
  ``v_proj -> o_proj`` (only when their shapes match, i.e. no grouped-query attention),
  ``post_attention_layernorm -> gate,up`` (inspect ``mlp``), ``up_proj -> down_proj``.
* GPT-2: ``ln_1 -> c_attn`` (inspect ``attn``), ``ln_2 -> c_fc`` (inspect ``mlp``); ``c_proj`` layers
  follow a GELU or the attention mix and cannot take a folded scale.

A linear outside every group is clipped and quantized without scaling.

As in the official ``run_awq``, the next layer's inputs are this layer's outputs with the scaled
(mathematically equivalent) full-precision weights; the weights are quantized once every layer has
been searched. Checked: llm-compressor's ``AWQModifier`` implements the same search but only as a
modifier inside its own pipeline; AutoAWQ is archived and needs CUDA.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

import torch
from torch import nn

from lmforge.common.calibration import (
    LayerInputs,
    accumulate_linear_stats,
    get_decoder_layers,
    is_conv1d,
    iterate_layers,
    linear_modules,
)
from lmforge.common.compress import (
    CompressionResult,
    LayerRecord,
    check_compressible,
    get_weight,
    set_weight,
    layers_prefix,
)
from lmforge.common.errors import UserError
from lmforge.common.quant import relative_output_error
from lmforge.methods.awq.config import AWQConfig
from lmforge.methods.awq.core import fake_quantize, quantize_final, search_clip, search_scales

__all__ = ["apply_awq", "scale_groups"]

_LLAMA = [
    ("input_layernorm", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), "self_attn"),
    ("self_attn.v_proj", ("self_attn.o_proj",), "self_attn.o_proj"),
    ("post_attention_layernorm", ("mlp.gate_proj", "mlp.up_proj"), "mlp"),
    ("mlp.up_proj", ("mlp.down_proj",), "mlp.down_proj"),
]
_GPT2 = [("ln_1", ("attn.c_attn",), "attn"), ("ln_2", ("mlp.c_fc",), "mlp")]
# q/k errors are amplified by the softmax: the official auto_clip skips them (and GPT-2's fused c_attn).
_NO_CLIP = ("q_proj", "k_proj", "c_attn", "qkv_proj", "query_key_value")


def _get(module: nn.Module, path: str) -> nn.Module | None:
    obj: Any = module
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _can_take_scale(prev: nn.Module, fcs: list[nn.Module]) -> bool:
    """Whether ``prev``'s output channels can absorb ``1/s`` for the inputs of ``fcs``."""
    n_in = get_weight(fcs[0]).shape[1]
    if isinstance(prev, nn.Linear) or is_conv1d(prev):
        return get_weight(prev).shape[0] == n_in
    name = type(prev).__name__
    if "Gemma" in name:
        # NOTE: Gemma's RMSNorm multiplies by (1 + weight); dividing `weight` by s would not divide the
        # output by s. Such groups are quantized without scaling.
        return False
    w = getattr(prev, "weight", None)
    return ("Norm" in name) and isinstance(w, torch.Tensor) and w.shape == (n_in,)


def scale_groups(layer: nn.Module) -> list[tuple[str, tuple[str, ...], str]]:
    """The AWQ groups present in this decoder layer (see the module docstring)."""
    for table in (_LLAMA, _GPT2):
        groups = []
        for prev, fcs, inspect in table:
            prev_mod = _get(layer, prev)
            fc_mods = [_get(layer, f) for f in fcs]
            if prev_mod is None or any(m is None for m in fc_mods) or _get(layer, inspect) is None:
                continue
            if _can_take_scale(prev_mod, fc_mods):  # type: ignore[arg-type]
                groups.append((prev, fcs, inspect))
        if groups:
            return groups
    return []


@torch.no_grad()
def _fold(prev: nn.Module, fcs: list[nn.Module], s: torch.Tensor) -> None:
    """``prev`` output /= s, ``fc`` input columns *= s: the layer computes the same function."""
    if isinstance(prev, nn.Linear) or is_conv1d(prev):
        set_weight(prev, get_weight(prev) / s[:, None])
    else:
        prev.weight.div_(s.to(prev.weight.dtype))
    bias = getattr(prev, "bias", None)
    if isinstance(bias, torch.Tensor):
        bias.div_(s.to(bias.dtype))
    for fc in fcs:
        set_weight(fc, get_weight(fc) * s[None, :])


def _capture(
    layer: nn.Module, inputs: LayerInputs, groups: list[tuple[str, tuple[str, ...], str]]
) -> tuple[dict[str, list[tuple[tuple, dict]]], dict[str, torch.Tensor]]:
    """One pass over the calibration batches recording, per group, the call arguments of the
    inspected module (when it is not the group's own linear) and the mean ``|x|`` per input channel
    of the group's linears (the official ``get_act_scale``)."""
    calls: dict[str, list[tuple[tuple, dict]]] = {insp: [] for _, fcs, insp in groups if insp not in fcs}
    abs_sum: dict[str, list[Any]] = {prev: [None, 0] for prev, _, _ in groups}

    def record_call(name: str):
        def pre(module, args, kwargs):
            calls[name].append((tuple(args), dict(kwargs)))

        return pre

    def record_abs(key: str):
        def pre(module, args):
            x = args[0].detach().reshape(-1, args[0].shape[-1]).float()
            acc = abs_sum[key]
            acc[0] = x.abs().sum(dim=0) if acc[0] is None else acc[0] + x.abs().sum(dim=0)
            acc[1] += x.shape[0]

        return pre

    handles = [_get(layer, insp).register_forward_pre_hook(record_call(insp), with_kwargs=True) for insp in calls]
    handles += [_get(layer, fcs[0]).register_forward_pre_hook(record_abs(prev)) for prev, fcs, _ in groups]
    try:
        inputs.forward_all(layer)
    finally:
        for h in handles:
            h.remove()
    return calls, {k: v[0] / max(v[1], 1) for k, v in abs_sum.items()}


def _first(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, (tuple, list)) else out


def _duo_weight_mean(fcs: list[nn.Module], group_size: int) -> torch.Tensor:
    """AutoAWQ's ``w_mean``: |W| over its quantization group's max, averaged over all output rows of
    the group's linears (a ragged last group is normalised by its own max)."""
    w = torch.cat([get_weight(fc) for fc in fcs]).abs()
    n = w.shape[1]
    gs = group_size if 0 < group_size < n else n
    normed = torch.empty_like(w)
    for g0 in range(0, n, gs):
        blk = w[:, g0 : g0 + gs]
        normed[:, g0 : g0 + gs] = blk / (blk.amax(dim=1, keepdim=True) + 1e-6)
    return normed.mean(dim=0)


@torch.no_grad()
def _fold_is_exact(layer: nn.Module, inputs: LayerInputs, prev: nn.Module, fcs: list[nn.Module]) -> bool:
    """Whether folding scales into ``prev`` keeps the layer's function, checked on one calibration
    batch with random scales (name and shape matching alone cannot tell, e.g. Phi's parallel block
    feeds ``input_layernorm`` to the MLP too, OLMo-2 normalises after the attention)."""
    n_in = get_weight(fcs[0]).shape[1]
    g = torch.Generator().manual_seed(0)
    s = (torch.rand(n_in, generator=g) * 1.5 + 0.5).to(get_weight(fcs[0]).device)
    before = inputs.run(layer, 0)
    saved = {id(m): {k: v.clone() for k, v in m.state_dict().items()} for m in [prev, *fcs]}
    _fold(prev, fcs, s)
    after = inputs.run(layer, 0)
    for m in [prev, *fcs]:
        m.load_state_dict(saved[id(m)])
    return bool(torch.allclose(before.float(), after.float(), rtol=1e-3, atol=1e-4 * float(before.abs().max()) + 1e-6))


@torch.no_grad()
def apply_awq(
    model: nn.Module,
    calib_batches: list[Any],
    cfg: AWQConfig,
    *,
    progress: bool = True,
    layer_errors: bool = True,
) -> CompressionResult:
    """Run AWQ on every decoder layer of ``model`` in place (weights end fake-quantized) and return
    the packed weights and per-linear errors. ``result.extra["scaled_groups"]`` lists the groups whose
    scales were searched and folded; ``result.extra["unscaled"]`` the candidate groups refused because
    folding would change the layer's function."""
    if not calib_batches:
        raise UserError("the calibration set is empty")
    plan = check_compressible(model)
    layers = get_decoder_layers(model)
    prefix = layers_prefix(model, layers)
    result = CompressionResult(method="awq", config=asdict(cfg))
    scaled: list[str] = []
    refused: list[str] = []
    pending: dict[str, tuple[nn.Module, torch.Tensor]] = {}
    start = time.perf_counter()
    # run_last=False: the last layer's outputs feed nothing.
    for i, layer, inputs in iterate_layers(model, calib_batches, progress=progress, run_last=False):
        if i == 0:
            result.n_calib_tokens = inputs.n_tokens()
        names = plan[f"{prefix}.{i}"]
        if not names:
            continue
        modules = linear_modules(layer)
        W0 = {n: get_weight(modules[n]) for n in names}
        stats = accumulate_linear_stats(layer, inputs, names, dtype=torch.float64, share_inputs=True)
        H = {n: acc.hessian for n, acc in stats.items()}
        groups = []
        for g in scale_groups(layer):
            if not all(f in names for f in g[1]):
                continue
            if _fold_is_exact(layer, inputs, _get(layer, g[0]), [modules[f] for f in g[1]]):
                groups.append(g)
            else:
                refused.append(f"{prefix}.{i}.{g[0]} -> {', '.join(g[1])}")
        calls, x_means = _capture(layer, inputs, groups)
        dev = W0[names[0]].device
        in_scale = {n: torch.ones(W0[n].shape[1], device=dev) for n in names}
        out_scale = {n: torch.ones(W0[n].shape[0], device=dev) for n in names}
        for prev_name, fc_names, insp_name in groups:
            prev, insp = _get(layer, prev_name), _get(layer, insp_name)
            fcs = [modules[f] for f in fc_names]
            orig = [get_weight(fc) for fc in fcs]
            w_mean = _duo_weight_mean(fcs, cfg.group_size) if cfg.duo_scaling else None
            if insp_name in fc_names:
                # The compared output is the linear's own (o_proj, down_proj): its mean squared error
                # over the calibration tokens is tr(D H D^T) / (2 out) for D = W' - W, with H the
                # Hessian of its (so far unscaled) inputs, so no forward pass is needed.
                (fc_name,) = fc_names
                H_in = H[fc_name].float() / (in_scale[fc_name][:, None] * in_scale[fc_name][None, :])

                def loss_of(s: torch.Tensor) -> float:
                    d = fake_quantize(orig[0] * s[None, :], cfg.bits, cfg.group_size, cfg.sym) / s[None, :] - orig[0]
                    return float(((d @ H_in) * d).sum()) / (2 * d.shape[0])

            else:
                ref = [_first(insp(*a, **k)).float() for a, k in calls[insp_name]]

                def loss_of(s: torch.Tensor) -> float:
                    for fc, w in zip(fcs, orig):
                        set_weight(fc, fake_quantize(w * s[None, :], cfg.bits, cfg.group_size, cfg.sym) / s[None, :])
                    total, count = 0.0, 0
                    for (a, k), r in zip(calls[insp_name], ref):
                        out = _first(insp(*a, **k)).float()
                        total += float((out - r).pow(2).sum())
                        count += r.numel()
                    return total / max(count, 1)

            s, _, _ = search_scales(x_means[prev_name], loss_of, cfg.n_grid, w_mean)
            for fc, w in zip(fcs, orig):
                set_weight(fc, w)
            _fold(prev, fcs, s)
            scaled.append(f"{prefix}.{i}.{prev_name} -> {', '.join(fc_names)}")
            for f in fc_names:
                in_scale[f] = in_scale[f] * s
            if prev_name in out_scale:
                out_scale[prev_name] = out_scale[prev_name] / s
        for n in names:
            w = get_weight(modules[n])
            s = in_scale[n].double()
            if cfg.clip and not any(n.endswith(t) for t in _NO_CLIP):
                # H of the scaled inputs x / s. The clipped weight is only quantized: the module keeps
                # the scaled full-precision weight for replaying the layer (see the NOTE below).
                w = search_clip(w, H[n] / (s[:, None] * s[None, :]), cfg.bits, cfg.group_size, cfg.sym,
                                cfg.n_grid, cfg.clip_max_shrink)
            q = quantize_final(w, cfg.bits, cfg.group_size, cfg.sym)
            full = f"{prefix}.{i}.{n}"
            result.quantized[full] = q
            pending[full] = (modules[n], q.dequantize())
            # In the original input and output spaces: undo the column scales and any row scales.
            effective = q.dequantize() / in_scale[n][None, :] / out_scale[n][:, None]
            result.layers.append(
                LayerRecord(
                    name=full,
                    rel_error=relative_output_error(W0[n], effective, H[n]),
                    shape=(int(w.shape[0]), int(w.shape[1])),
                    sparsity=0.0,
                )
            )
    # NOTE: as in the official run_awq, the next layer's inputs are computed with full-precision
    # weights (here scaled, which changes nothing, and not clipped); the quantized weights are
    # written once every layer has been searched.
    for mod, w in pending.values():
        set_weight(mod, w)
    result.extra["scaled_groups"] = scaled
    result.extra["unscaled"] = refused
    result.seconds = time.perf_counter() - start
    return result
