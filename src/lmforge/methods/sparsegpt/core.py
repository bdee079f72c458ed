"""SparseGPT: massive language models can be accurately pruned in one shot.

Frantar & Alistarh, ICML 2023, https://arxiv.org/abs/2301.00774 (reference code
github.com/IST-DASLab/sparsegpt, ``sparsegpt.py: SparseGPT.fasterprune``).

How it works: the same column sweep as GPTQ with the upper Cholesky factor ``U`` of the damped
``H^-1``, but each column is "quantized" to 0 where the mask says so. The mask is chosen adaptively
per block of ``block_size`` columns, from the OBS saliency ``w^2 / U_jj^2`` of the error-updated
weights when the sweep enters the block: the lowest ``sparsity`` fraction of the whole block (all rows
together) is pruned. For N:M the ``n`` lowest saliencies of every ``m`` consecutive columns of a row
are pruned when the sweep reaches the run's first column.
"""

from __future__ import annotations

import torch

from lmforge.common.quant import HessianFactor, factor_hessian
from lmforge.common.sparsity import NMPattern, layer_mask, nm_mask, parse_pattern
from lmforge.methods.sparsegpt.config import SparseGPTConfig

__all__ = ["sparsegpt_prune"]


@torch.no_grad()
def sparsegpt_prune(
    W: torch.Tensor, H: torch.Tensor, cfg: SparseGPTConfig, *, factor: HessianFactor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prune ``W`` (out x in) with OBS updates given the input Hessian ``H``.

    ``factor`` is :func:`factor_hessian` of ``H`` with ``cfg.damp``, when the caller already has it.

    Returns:
        ``(W_pruned, mask)``: the updated weight (float32, exact zeros where ``mask``) and the boolean
        pruning mask (True = pruned).
    """
    pattern: NMPattern | None = parse_pattern(cfg.pattern)
    out_f, n = W.shape
    if factor is None:
        factor = factor_hessian(H, cfg.damp)
    W = W.detach().float().clone()
    W[:, factor.dead] = 0.0
    U = factor.U
    mask = torch.zeros_like(W, dtype=torch.bool)
    bs = cfg.block_size
    if pattern is not None and bs % pattern.m:
        # Runs of m columns must not straddle blocks.
        bs = max(pattern.m, bs - bs % pattern.m)

    for i1 in range(0, n, bs):
        i2 = min(i1 + bs, n)
        W1 = W[:, i1:i2].clone()
        U1 = U[i1:i2, i1:i2]
        d = torch.diagonal(U1)
        Err1 = torch.zeros_like(W1)
        if pattern is None:
            # NOTE: the reference code prunes every weight <= the k-th smallest saliency (k + 1 of
            # them, more on ties); we prune exactly k = int(numel * sparsity) per block.
            mask1 = layer_mask(W1**2 / d[None, :] ** 2, cfg.sparsity)
        else:
            mask1 = torch.zeros_like(W1, dtype=torch.bool)
        for i in range(i2 - i1):
            if pattern is not None and i % pattern.m == 0:
                j = min(i + pattern.m, i2 - i1)
                mask1[:, i:j] = nm_mask(W1[:, i:j] ** 2 / d[None, i:j] ** 2, pattern)
            w = W1[:, i]
            err = torch.where(mask1[:, i], w, torch.zeros_like(w)) / U1[i, i]  # (w - q) / d, q = 0 where pruned
            W1[:, i:].addr_(err, U1[i, i:], alpha=-1.0)
            W1[:, i].masked_fill_(mask1[:, i], 0.0)  # exact zeros (the update leaves round-off)
            Err1[:, i] = err
        W[:, i1:i2] = W1
        mask[:, i1:i2] = mask1
        W[:, i2:] -= Err1 @ U[i1:i2, i2:]
    return W, mask
