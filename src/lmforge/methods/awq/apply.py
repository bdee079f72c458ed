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


def _capture(layer: nn.Module, inputs, groups) -> dict[str, list[tuple[tuple, dict]]]:
    """Record the call arguments of every inspected module, per calibration batch."""
    calls: dict[str, list[tuple[tuple, dict]]] = {insp: [] for _, _, insp in groups}

    def make(name: str):
        def pre(module, args, kwargs):
            calls[name].append((tuple(args), dict(kwargs)))

        return pre

    handles = [_get(layer, insp).register_forward_pre_hook(make(insp), with_kwargs=True) for _, _, insp in groups]
    try:
        inputs.forward_all(layer)
    finally:
        for h in handles:
            h.remove()
    return calls


def _first(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, (tuple, list)) else out


def _group_input(calls: list[tuple[tuple, dict]]) -> torch.Tensor:
    """All tokens entering the inspected module, ``(tokens, hidden)``."""
    xs = [a[0] if a else k["hidden_states"] for a, k in calls]
    return torch.cat([x.reshape(-1, x.shape[-1]) for x in xs])


@torch.no_grad()
def apply_awq(model: nn.Module, calib_batches: list[Any], cfg: AWQConfig, *, progress: bool = True) -> CompressionResult:
    """Run AWQ on every decoder layer of ``model`` in place (weights end fake-quantized) and return
    the packed weights and per-linear errors."""
    if not calib_batches:
        raise UserError("the calibration set is empty")
    plan = check_compressible(model)
    layers = get_decoder_layers(model)
    prefix = layers_prefix(model, layers)
    result = CompressionResult(method="awq", config=asdict(cfg))
    pending: dict[str, tuple[nn.Module, torch.Tensor]] = {}
    start = time.perf_counter()
    for i, layer, inputs in iterate_layers(model, calib_batches, progress=progress):
        if i == 0:
            result.n_calib_tokens = inputs.n_tokens()
        names = plan[f"{prefix}.{i}"]
        if not names:
            continue
        modules = linear_modules(layer)
        W0 = {n: get_weight(modules[n]) for n in names}
        H = {n: h.hessian for n, h in accumulate_linear_stats(layer, inputs, names, dtype=torch.float64, share_inputs=True).items()}
        groups = [g for g in scale_groups(layer) if all(f in names for f in g[1])]
        calls = _capture(layer, inputs, groups)
        in_scale = {n: torch.ones(W0[n].shape[1]) for n in names}
        out_scale = {n: torch.ones(W0[n].shape[0]) for n in names}
        for prev_name, fc_names, insp_name in groups:
            prev, insp = _get(layer, prev_name), _get(layer, insp_name)
            fcs = [modules[f] for f in fc_names]
            x_mean = _group_input(calls[insp_name]).abs().float().mean(dim=0)
            w_mean = None
            if cfg.duo_scaling:
                w = torch.cat([get_weight(fc) for fc in fcs])
                gs = cfg.group_size if 0 < cfg.group_size < w.shape[1] else w.shape[1]
                wg = w.abs().reshape(w.shape[0], -1, gs)
                w_mean = (wg / wg.amax(dim=2, keepdim=True).clamp(min=1e-8)).reshape(w.shape).mean(dim=0)
            orig = [get_weight(fc) for fc in fcs]
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

            s, _, _ = search_scales(x_mean, loss_of, cfg.n_grid, w_mean)
            for fc, w in zip(fcs, orig):
                set_weight(fc, w)
            _fold(prev, fcs, s)
            for f in fc_names:
                in_scale[f] = in_scale[f] * s
            if prev_name in out_scale:
                out_scale[prev_name] = out_scale[prev_name] / s
            # The scaled-down activations now enter the next group's inspected module (v->o, up->down).
        for n in names:
            w = get_weight(modules[n])
            s = in_scale[n].double()
            # H of the scaled inputs x / s.
            Hs = H[n] / (s[:, None] * s[None, :])
            if cfg.clip and not any(n.endswith(t) for t in _NO_CLIP):
                w = search_clip(w, Hs, cfg.bits, cfg.group_size, cfg.sym, cfg.n_grid, cfg.clip_max_shrink)
                set_weight(modules[n], w)
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
    # NOTE: as in the official run_awq, the layers were fed full-precision (scaled, clipped) outputs
    # during the search; the quantized weights are written now.
    for mod, w in pending.values():
        set_weight(mod, w)
    result.seconds = time.perf_counter() - start
    return result
