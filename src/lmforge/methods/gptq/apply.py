"""GPTQ on a whole model: the shared sequential engine with :func:`gptq_quantize` per linear.

Modules that share one Hessian (q/k/v, gate/up) are quantized in one sweep over their stacked rows:
GPTQ treats every output row on its own (its grid, its codes and its error feedback read only that
row and the shared factor ``U``), so the stacked sweep gives each module exactly the codes, scales and
zeros of its own sweep (tests/methods/test_gptq_sparsegpt_core.py), in four sweeps of the per-column loop
per Llama layer instead of seven.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import torch
from torch import nn

from lmforge.common.compress import CompressionResult, LinearResult, compress_linears
from lmforge.common.quant import FactorCache, UniformQuantized
from lmforge.methods.gptq.config import GPTQConfig
from lmforge.methods.gptq.core import gptq_quantize


def split_rows(q: UniformQuantized, sizes: list[int]) -> list[UniformQuantized]:
    """Cut a quantized stack of weights back into its modules (``sizes`` output rows each)."""
    out, r0 = [], 0
    for n in sizes:
        r1 = r0 + n
        out.append(
            UniformQuantized(
                codes=q.codes[r0:r1].clone(),
                scales=q.scales[r0:r1].clone(),
                zeros=q.zeros[r0:r1].clone(),
                bits=q.bits,
                group_size=q.group_size,
                sym=q.sym,
                g_idx=None if q.g_idx is None else q.g_idx.clone(),
            )
        )
        r0 = r1
    return out


def apply_gptq(
    model: nn.Module,
    calib_batches: list[Any],
    cfg: GPTQConfig,
    *,
    progress: bool = True,
    layer_errors: bool = True,
) -> CompressionResult:
    """Quantize every decoder linear of ``model`` in place (weights end fake-quantized)."""

    cache = FactorCache()

    def fn(name, W, H):
        q = gptq_quantize(W, H, cfg, factor=cache.get(H, cfg.damp, cfg.act_order))
        return LinearResult(weight=q.dequantize(), quantized=q)

    def group_fn(names, Ws, H):
        q = gptq_quantize(torch.cat(Ws), H, cfg, factor=cache.get(H, cfg.damp, cfg.act_order))
        parts = split_rows(q, [int(W.shape[0]) for W in Ws])
        return [LinearResult(weight=p.dequantize(), quantized=p) for p in parts]

    return compress_linears(model, calib_batches, fn, method="gptq", config=asdict(cfg), layer_errors=layer_errors,
                            needs="hessian", progress=progress, group_fn=group_fn,
                            true_sequential=cfg.true_sequential)
