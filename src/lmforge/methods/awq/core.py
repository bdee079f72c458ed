"""AWQ: activation-aware weight quantization.

Lin, Tang, Tang, Yang, Chen, Wang, Xiao, Dang, Gan, Han, MLSys 2024, https://arxiv.org/abs/2306.00978
(official code github.com/mit-han-lab/llm-awq, ``awq/quantize/auto_scale.py`` and ``auto_clip.py``).

How it works: a few input channels carry large activations; scaling their weight columns up by ``s``
before quantization (and the activations down by ``1/s``, folded into the preceding norm or linear)
protects them. Per group of linears that share an input, the scale is searched on a grid,
``s = mean|x|^alpha`` normalised by ``sqrt(max(s) min(s))``, ``alpha`` in ``[0, 1)``, minimising the
mean squared error of the output of the module that consumes them (the attention block for q/k/v, the
MLP for gate/up, the linear itself for o_proj and down_proj) with the weights fake-quantized as
``Q(W diag(s)) diag(s)^-1``. Then (``auto_clip``) each group's clipping range ``[-m, m]`` is shrunk on a
grid to minimise the group's partial output error, except for q/k whose errors are amplified by the
softmax. Finally every linear is quantized group-wise with round-to-nearest.

The grid is the official ``pseudo_quantize_tensor``'s, not GPTQ's: asymmetric groups span their own
``[min, max]`` (GPTQ's grid always includes 0), with the range clamped at 1e-5 and the zero point
clamped to ``[0, 2^b - 1]``. On a group of one sign that clamp pins the grid's end to 0 while its span
stays the group's range, so the group's largest-magnitude values are clipped: the official code's
behaviour, kept (a test checks it). Symmetric groups use
``scale = max|w| / (2^(b-1) - 1)`` and signed codes ``[-2^(b-1), 2^(b-1) - 1]`` (stored offset by
``2^(b-1)``), where GPTQ uses ``2 max|w| / (2^b - 1)``. See :func:`awq_qparams`.

This file holds the tensor math; module walking is in ``apply.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from lmforge.common.quant import UniformQuantized, fake_quantize_rtn, quantize_rtn

__all__ = ["awq_qparams", "fake_quantize", "normalized_scales", "quantize_final", "search_clip", "search_scales"]


def awq_qparams(w: torch.Tensor, bits: int, sym: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row ``(scale, zero)`` of ``w`` (``(rows, cols)``) as llm-awq's ``pseudo_quantize_tensor``.

    Asymmetric: ``scale = clamp(max - min, 1e-5) / (2^b - 1)``, ``zero = clamp(-round(min / scale), 0,
    2^b - 1)`` over the row's own min and max. Symmetric: ``scale = clamp(max|w|, 1e-5) / (2^(b-1) - 1)``
    and zero point ``2^(b-1)``, so unsigned codes ``0 .. 2^b - 1`` are the official signed codes
    ``-2^(b-1) .. 2^(b-1) - 1`` plus ``2^(b-1)``.
    """
    w = w.float()
    if sym:
        scale = w.abs().amax(dim=1).clamp(min=1e-5) / (2 ** (bits - 1) - 1)
        return scale, torch.full_like(scale, 2 ** (bits - 1))
    maxq = 2**bits - 1
    lo, hi = w.amin(dim=1), w.amax(dim=1)
    scale = (hi - lo).clamp(min=1e-5) / maxq
    zero = torch.clamp(-torch.round(lo / scale), 0, maxq)
    return scale, zero


def fake_quantize(w: torch.Tensor, bits: int, group_size: int, sym: bool) -> torch.Tensor:
    """Group-wise min-max RTN on AWQ's grid, dequantized (the official ``pseudo_quantize_tensor``)."""
    return fake_quantize_rtn(w, bits, group_size, sym, qparams=awq_qparams)


def normalized_scales(
    x_mean: torch.Tensor, ratio: float, w_mean: torch.Tensor | None = None
) -> torch.Tensor:
    """``s = x_mean^ratio`` (or ``x_mean^ratio / w_mean^(1-ratio)`` with ``w_mean``), clamped at 1e-4
    and divided by ``sqrt(max(s) * min(s))`` so the scales are centred around 1."""
    if w_mean is None:
        s = x_mean.pow(ratio).clamp(min=1e-4)
    else:
        s = (x_mean.pow(ratio) / w_mean.pow(1 - ratio).clamp(min=1e-4)).clamp(min=1e-4)
    return s / (s.max() * s.min()).sqrt()


def search_scales(
    x_mean: torch.Tensor,
    loss_of_scales: Callable[[torch.Tensor], float],
    n_grid: int,
    w_mean: torch.Tensor | None = None,
) -> tuple[torch.Tensor, float, list[float]]:
    """Grid search of the scale exponent.

    Args:
        x_mean: ``(in,)`` mean absolute activation per input channel.
        loss_of_scales: the output MSE with the group's weights fake-quantized under scales ``s``.
        n_grid: grid points ``ratio = k / n_grid``, ``k = 0..n_grid-1``.
        w_mean: AutoAWQ's weight statistic for duo scaling, or None for the paper's ``s_X^alpha``.

    Returns:
        ``(best scales, best ratio, losses over the grid)``.
    """
    best, best_ratio, best_loss = None, 0.0, float("inf")
    losses = []
    for k in range(n_grid):
        ratio = k / n_grid
        s = normalized_scales(x_mean, ratio, w_mean)
        loss = float(loss_of_scales(s))
        losses.append(loss)
        if loss < best_loss:
            best, best_ratio, best_loss = s, ratio, loss
    if best is None:  # every loss was nan/inf: fall back to no scaling
        best = torch.ones_like(x_mean)
    return best, best_ratio, losses


@torch.no_grad()
def search_clip(
    W: torch.Tensor,
    H: torch.Tensor,
    bits: int,
    group_size: int,
    sym: bool,
    n_grid: int = 20,
    max_shrink: float = 0.5,
) -> torch.Tensor:
    """Per (row, group) clipping threshold minimising the group's partial output error.

    For row ``i`` and group ``g`` the official code compares ``(x_g . w_ig)`` with
    ``(x_g . Q(clamp(w_ig, -m, m)))`` over 512 sampled tokens. The mean squared difference over tokens
    is ``d H_gg d^T / N`` with ``d`` the weight change and ``H_gg`` the group's block of ``X^T X``, so
    ``H`` (proportional to ``X^T X``) evaluates it over all calibration tokens at once.

    Returns:
        ``W`` clamped to the best ``[-m, m]`` per (row, group).
    """
    out_f, in_f = W.shape
    gs = group_size if 0 < group_size < in_f else in_f
    if in_f % gs:
        # NOTE: the official code requires in % group_size == 0; a ragged tail is left unclipped.
        full = in_f - in_f % gs
    else:
        full = in_f
    Wc = W.clone().float()
    Hf = H.float()
    for g0 in range(0, full, gs):
        w = W[:, g0 : g0 + gs].float()
        Hg = Hf[g0 : g0 + gs, g0 : g0 + gs]
        org_max = w.abs().amax(dim=1, keepdim=True)
        best_max = org_max.clone()
        best_err = torch.full((out_f,), float("inf"), device=W.device)
        for i_s in range(int(max_shrink * n_grid)):
            m = org_max * (1 - i_s / n_grid)
            cur = torch.clamp(w, -m, m)
            q = fake_quantize_rtn(cur, bits, 0, sym, qparams=awq_qparams)
            d = q - w
            err = torch.einsum("ij,jk,ik->i", d, Hg, d)
            better = err < best_err
            best_err = torch.where(better, err, best_err)
            best_max = torch.where(better[:, None], m, best_max)
        Wc[:, g0 : g0 + gs] = torch.clamp(w, -best_max, best_max)
    return Wc


def quantize_final(W: torch.Tensor, bits: int, group_size: int, sym: bool) -> UniformQuantized:
    """The last step: group-wise RTN of the scaled (and clipped) weight, on AWQ's grid."""
    return quantize_rtn(W, bits, group_size, sym, qparams=awq_qparams)
