"""GANQ on a whole model: the shared sequential engine with :func:`ganq_quantize` per linear."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import torch
from torch import nn

from lmforge.common.compress import CompressionResult, LinearResult, compress_linears
from lmforge.common.quant import CodebookQuantized
from lmforge.methods.ganq.config import GANQConfig
from lmforge.methods.ganq.core import ganq_quantize


def _split_rows(q: CodebookQuantized, sizes: list[int]) -> list[CodebookQuantized]:
    """The stacked result of linears that shared one call, cut back into one result per linear."""
    out, r0 = [], 0
    rows = q.outlier_rows.long() if q.n_outliers else None
    for size in sizes:
        part = CodebookQuantized(codes=q.codes[r0 : r0 + size].clone(), codebook=q.codebook[r0 : r0 + size].clone(),
                                 bits=q.bits)
        if rows is not None:
            sel = (rows >= r0) & (rows < r0 + size)
            part.outlier_rows = (q.outlier_rows[sel] - r0).to(torch.int32)
            part.outlier_cols = q.outlier_cols[sel].clone()
            part.outlier_vals = q.outlier_vals[sel].clone()
        out.append(part)
        r0 += size
    return out


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

    def group_fn(names, weights, H):
        # Rows are independent terms of the objective and every per-row choice (codebook, outliers,
        # the best of two starts) is made row by row, so the linears that share H (q/k/v, gate/up) are
        # quantized in one call on their stacked rows: the same result up to float summation order (a
        # code may rarely flip), one S-step loop instead of three.
        q = ganq_quantize(torch.cat(weights, dim=0), H, cfg)
        parts = _split_rows(q, [int(w.shape[0]) for w in weights])
        return [LinearResult(weight=p.dequantize(), quantized=p) for p in parts]

    # Full-precision rows are ranked within each linear, so those linears are quantized one by one.
    return compress_linears(model, calib_batches, fn, method="ganq", config=asdict(cfg), layer_errors=layer_errors,
                            needs="hessian", progress=progress, group_fn=group_fn if cfg.full_rows == 0 else None)
