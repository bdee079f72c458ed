"""RTN on a whole model. Calibration data is used only to report each layer's output error."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import torch
from torch import nn

from lmforge.common.compress import CompressionResult, LinearResult, compress_linears
from lmforge.common.quant import quantize_rtn
from lmforge.methods.rtn.config import RTNConfig


def apply_rtn(
    model: nn.Module,
    calib_batches: list[Any],
    cfg: RTNConfig,
    *,
    progress: bool = True,
    layer_errors: bool = True,
) -> CompressionResult:
    """Quantize every decoder linear of ``model`` in place (weights end fake-quantized)."""

    def fn(name, W, H):
        q = quantize_rtn(W, cfg.bits, cfg.group_size, cfg.sym)
        return LinearResult(weight=q.dequantize(), quantized=q)

    return compress_linears(
        model, calib_batches, fn, method="rtn", config=asdict(cfg), layer_errors=layer_errors, needs="diag", hessian_dtype=torch.float32, progress=progress
    )
