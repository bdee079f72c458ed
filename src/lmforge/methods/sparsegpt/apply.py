"""SparseGPT on a whole model: the shared sequential engine with :func:`sparsegpt_prune` per linear."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from torch import nn

from lmforge.common.compress import CompressionResult, LinearResult, compress_linears
from lmforge.common.quant import FactorCache
from lmforge.methods.sparsegpt.config import SparseGPTConfig
from lmforge.methods.sparsegpt.core import sparsegpt_prune


def apply_sparsegpt(
    model: nn.Module,
    calib_batches: list[Any],
    cfg: SparseGPTConfig,
    *,
    progress: bool = True,
    layer_errors: bool = True,
) -> CompressionResult:
    """Prune every decoder linear of ``model`` in place."""

    cache = FactorCache()

    def fn(name, W, H):
        w, mask = sparsegpt_prune(W, H, cfg, factor=cache.get(H, cfg.damp))
        return LinearResult(weight=w, mask=mask)

    return compress_linears(model, calib_batches, fn, method="sparsegpt", config=asdict(cfg), layer_errors=layer_errors, needs="hessian", progress=progress)
