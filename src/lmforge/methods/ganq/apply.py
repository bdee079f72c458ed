"""GANQ on a whole model: the shared sequential engine with :func:`ganq_quantize` per linear."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from torch import nn

from lmforge.common.compress import CompressionResult, LinearResult, compress_linears
from lmforge.methods.ganq.config import GANQConfig
from lmforge.methods.ganq.core import ganq_quantize


def apply_ganq(
    model: nn.Module,
    calib_batches: list[Any],
    cfg: GANQConfig,
    *,
    progress: bool = True,
    layer_errors: bool = True,
) -> CompressionResult:
    """Quantize every decoder linear of ``model`` to per-row codebooks in place (weights end
    fake-quantized)."""

    def fn(name, W, H):
        q = ganq_quantize(W, H, cfg)
        return LinearResult(weight=q.dequantize(), quantized=q)

    return compress_linears(model, calib_batches, fn, method="ganq", config=asdict(cfg), layer_errors=layer_errors, needs="hessian", progress=progress)
