"""Wanda on a whole model: the shared sequential engine (the reference code, too, feeds each layer the
outputs of the already-pruned layers before it) with :func:`wanda_prune` per linear."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import torch
from torch import nn

from lmforge.common.compress import CompressionResult, LinearResult, compress_linears
from lmforge.methods.wanda.config import WandaConfig
from lmforge.methods.wanda.core import wanda_prune


def apply_wanda(
    model: nn.Module,
    calib_batches: list[Any],
    cfg: WandaConfig,
    *,
    progress: bool = True,
    layer_errors: bool = True,
) -> CompressionResult:
    """Prune every decoder linear of ``model`` in place."""

    def fn(name, W, H):
        # ||X_j||_2 up to a constant factor, which no within-row ranking sees.
        w, mask = wanda_prune(W, torch.diagonal(H).clamp(min=0).sqrt(), cfg)
        return LinearResult(weight=w, mask=mask)

    return compress_linears(
        model, calib_batches, fn, method="wanda", config=asdict(cfg), layer_errors=layer_errors, needs="diag", hessian_dtype=torch.float32, progress=progress
    )
