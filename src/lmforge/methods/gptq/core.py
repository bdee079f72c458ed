"""GPTQ: accurate post-training quantization for generative pre-trained transformers.

Frantar, Ashkboos, Hoefler, Alistarh, ICLR 2023, https://arxiv.org/abs/2210.17323 (reference code
github.com/IST-DASLab/gptq, ``gptq.py: GPTQ.fasterquant``).

How it works: for a linear layer ``W`` (out x in) with input Hessian ``H = 2/N X^T X``, columns are
quantized one at a time; the error of column ``j`` is spread over the not-yet-quantized columns with
the row ``j`` of the inverse Hessian of the remaining columns (Optimal Brain Surgeon). Those rows are
the rows of the upper Cholesky factor ``U`` of ``H^-1`` (scaled by ``1/U_jj``), computed once. Updates
are applied lazily: inside a block of ``block_size`` columns eagerly, to the columns after the block
once per block (``W[:, i2:] -= Err @ U[i1:i2, i2:]``). With groups, a group's scale/zero is fixed when
the sweep reaches its first column, from the group's error-updated weights. With act-order the columns
are swept in decreasing ``diag(H)`` and groups are formed in that order (``g_idx`` records them).
"""

from __future__ import annotations

import math

import torch

from lmforge.common.quant import (
    HessianFactor,
    UniformQuantized,
    factor_hessian,
    uniform_qparams,
)
from lmforge.methods.gptq.config import GPTQConfig

__all__ = ["gptq_quantize"]


@torch.no_grad()
def gptq_quantize(
    W: torch.Tensor, H: torch.Tensor, cfg: GPTQConfig, *, factor: HessianFactor | None = None
) -> UniformQuantized:
    """Quantize ``W`` (out x in) given the input Hessian ``H`` (in x in).

    ``factor`` is :func:`factor_hessian` of ``H`` with ``cfg.damp`` and ``cfg.act_order``, when the
    caller already has it (modules sharing one input share it).

    Returns:
        A :class:`UniformQuantized` whose ``dequantize()`` is the GPTQ weight, codes in the original
        column order (``g_idx`` set under act-order with groups).
    """
    out_f, n = W.shape
    if factor is None:
        factor = factor_hessian(H, cfg.damp, cfg.act_order)
    W = W.detach().float().clone()
    W[:, factor.dead] = 0.0  # inputs that were always 0: the weight never mattered
    gs = cfg.group_size if 0 < cfg.group_size < n else 0
    perm = factor.perm
    if perm is not None:
        W = W[:, perm]
    U = factor.U

    n_groups = math.ceil(n / gs) if gs else 1
    scales = torch.empty(out_f, n_groups, device=W.device)
    zeros = torch.empty(out_f, n_groups, device=W.device)
    codes = torch.empty(out_f, n, dtype=torch.uint8, device=W.device)
    U = U.to(W.device)
    if not gs:
        s, z = uniform_qparams(W, cfg.bits, cfg.sym)
        scales[:, 0], zeros[:, 0] = s, z

    maxq = 2**cfg.bits - 1
    s = z = None
    for i1 in range(0, n, cfg.block_size):
        i2 = min(i1 + cfg.block_size, n)
        W1 = W[:, i1:i2].clone()
        U1 = U[i1:i2, i1:i2]
        Q1 = torch.empty_like(W1)  # integer codes (as floats) of the block
        Err1 = torch.empty_like(W1)
        for i in range(i2 - i1):
            col = i1 + i
            if gs and col % gs == 0:
                # NOTE: the reference code reads the group from W, whose columns have not yet received
                # the error feedback of the current block; we read the up-to-date values: W1 inside the
                # block, and after it W minus the block's pending lazy update so far.
                g_end = min(col + gs, n)
                grp = W1[:, i : min(i2, g_end) - i1]
                if g_end > i2:
                    pending = W[:, i2:g_end] - Err1[:, :i] @ U[i1 : i1 + i, i2:g_end]
                    grp = torch.cat([grp, pending], dim=1)
                s, z = uniform_qparams(grp, cfg.bits, cfg.sym)
                scales[:, col // gs], zeros[:, col // gs] = s, z
            elif s is None:
                s, z = scales[:, 0].contiguous(), zeros[:, 0].contiguous()
            w = W1[:, i]
            q = torch.clamp(torch.round(w / s) + z, 0, maxq)
            Q1[:, i] = q
            err = (w - s * (q - z)) / U1[i, i]
            # Rank-1 update of the rest of the block, in place.
            W1[:, i:].addr_(err, U1[i, i:], alpha=-1.0)
            Err1[:, i] = err
        codes[:, i1:i2] = Q1.to(torch.uint8)
        W[:, i2:] -= Err1 @ U[i1:i2, i2:]

    g_idx = None
    if perm is not None:
        inv = torch.argsort(perm)
        codes = codes[:, inv]
        if gs:
            # Column perm[k] was swept k-th, so it belongs to group k // gs.
            g_idx = (torch.arange(n, device=W.device) // gs)[inv].to(torch.int32)
    return UniformQuantized(
        codes=codes, scales=scales, zeros=zeros, bits=cfg.bits, group_size=gs, sym=cfg.sym, g_idx=g_idx
    )
