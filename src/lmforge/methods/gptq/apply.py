"""GPTQ on a whole model: the shared sequential engine with :func:`gptq_quantize` per linear."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from torch import nn

from lmforge.common.compress import CompressionResult, LinearResult, compress_linears
from lmforge.common.quant import FactorCache
from lmforge.methods.gptq.config import GPTQConfig
from lmforge.methods.gptq.core import gptq_quantize


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

    return compress_linears(model, calib_batches, fn, method="gptq", config=asdict(cfg), layer_errors=layer_errors, needs="hessian", progress=progress)
