"""Magnitude pruning on a whole model. Calibration data is used only to report each layer's error."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import torch
from torch import nn

from lmforge.common.compress import CompressionResult, LinearResult, compress_linears
from lmforge.methods.magnitude.config import MagnitudeConfig
from lmforge.methods.magnitude.core import magnitude_prune


def apply_magnitude(
    model: nn.Module,
    calib_batches: list[Any],
    cfg: MagnitudeConfig,
    *,
    progress: bool = True,
    layer_errors: bool = True,
) -> CompressionResult:
    """Prune every decoder linear of ``model`` in place."""

    def fn(name, W, H):
        w, mask = magnitude_prune(W, cfg)
        return LinearResult(weight=w, mask=mask)

    return compress_linears(
        model, calib_batches, fn, method="magnitude", config=asdict(cfg), layer_errors=layer_errors, needs="diag", hessian_dtype=torch.float32, progress=progress
    )
