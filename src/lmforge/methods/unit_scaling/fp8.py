"""FP8 numerics for µnit Scaling: saturating casts, an FP8 linear and underflow/overflow counters.

Narayan et al., "µnit Scaling: Simple and Scalable FP8 LLM Training" (ICML 2025): every hidden
linear layer runs in FP8 with a *direct cast* -- E4M3 for weights and activations in the forward
pass, E5M2 for gradients in the backward pass -- with clipping to the format's maximum and no amax
tracking or dynamic scale factors. That is only safe because µS keeps weights, activations and
gradients near unit scale.

Libraries checked: ``torch`` provides the formats (``torch.float8_e4m3fn``: max 448, smallest
subnormal 2^-9; ``torch.float8_e5m2``: max 57344, smallest subnormal 2^-16) but its cast of an
out-of-range value is not a saturation everywhere: E5M2 overflows to inf (checked, torch 2.13 CPU)
and e4m3fn, which has no inf, gives NaN on some versions/backends (torch 2.13 CPU saturates). We
clamp first, so both saturate everywhere. Graphcore's
``unit-scaling`` 0.3.5 ``formats.FPFormat(4, 3)`` is a different E4M3 (max 240, i.e. the "fnuz"
layout) with stochastic rounding by default; we follow the paper's hardware formats (H100 E4M3fn /
E5M2, round to nearest even) instead. See ``tests/methods/unit_scaling/test_vs_unit_scaling_lib.py``.

On CPU the FP8 GEMM is *simulated*: inputs are round-tripped through the FP8 dtype and multiplied
in float32 (an FP8 tensor-core GEMM also accumulates in higher precision). On CUDA, when
``torch._scaled_mm`` exists, the forward GEMM is a real FP8 GEMM with unit scales (the α multiplier
is applied to its float output).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

E4M3_MAX = float(torch.finfo(torch.float8_e4m3fn).max)  # 448
E5M2_MAX = float(torch.finfo(torch.float8_e5m2).max)  # 57344
KINDS = ("activation", "weight", "gradient")


def _saturating_cast(x: torch.Tensor, dtype: torch.dtype, fmax: float) -> torch.Tensor:
    # Clamp before the cast: out-of-range values would otherwise become inf (E5M2) or, on some
    # PyTorch versions/backends, NaN (e4m3fn has no inf).
    # NaN stays NaN through clamp, which is what a hardware cast would give too.
    return x.clamp(-fmax, fmax).to(dtype).to(x.dtype)


def cast_e4m3(x: torch.Tensor) -> torch.Tensor:
    """Round-trip ``x`` through ``torch.float8_e4m3fn`` with saturation at ±448.

    Args:
        x: a floating-point tensor.

    Returns:
        A tensor of ``x``'s dtype holding the nearest E4M3 values (ties to even).
    """
    return _saturating_cast(x, torch.float8_e4m3fn, E4M3_MAX)


def cast_e5m2(x: torch.Tensor) -> torch.Tensor:
    """Round-trip ``x`` through ``torch.float8_e5m2`` with saturation at ±57344.

    Args:
        x: a floating-point tensor.

    Returns:
        A tensor of ``x``'s dtype holding the nearest E5M2 values (ties to even).
    """
    return _saturating_cast(x, torch.float8_e5m2, E5M2_MAX)


def count_cast(x: torch.Tensor, xq: torch.Tensor, fmax: float) -> tuple[int, int, int]:
    """Underflows, overflows and element count of one cast ``x -> xq``.

    Args:
        x: the tensor before the cast.
        xq: the tensor after the cast.
        fmax: the format's largest finite magnitude.

    Returns:
        ``(underflow, overflow, total)``: nonzero values that became 0, values with |x| > fmax
        (saturated), and the number of elements.
    """
    with torch.no_grad():
        under = int(((x != 0) & (xq == 0)).sum())
        over = int((x.abs() > fmax).sum())
    return under, over, x.numel()


@dataclass
class FP8Counters:
    """Per-layer FP8 cast statistics, accumulated while ``enabled``.

    ``stats[layer][kind] = [underflow, overflow, total]`` with ``kind`` in :data:`KINDS`.
    """

    enabled: bool = True
    stats: dict[str, dict[str, list[int]]] = field(default_factory=dict)

    def add(self, layer: str, kind: str, under: int, over: int, total: int) -> None:
        """Accumulate one cast's counts for ``layer``/``kind``."""
        rec = self.stats.setdefault(layer, {k: [0, 0, 0] for k in KINDS})[kind]
        rec[0] += under
        rec[1] += over
        rec[2] += total

    def reset(self) -> None:
        """Forget every count (keeps ``enabled``)."""
        self.stats.clear()

    def totals(self, kind: str | None = None) -> dict[str, int]:
        """Summed ``underflow``/``overflow``/``total`` over layers, for one kind or all."""
        u = o = t = 0
        for rec in self.stats.values():
            for k, (a, b, c) in rec.items():
                if kind is None or k == kind:
                    u, o, t = u + a, o + b, t + c
        return {"underflow": u, "overflow": o, "total": t}

    def rates(self, kind: str | None = None) -> dict[str, float]:
        """Underflow and overflow fractions (0 when nothing was counted)."""
        t = self.totals(kind)
        n = max(t["total"], 1)
        return {"underflow": t["underflow"] / n, "overflow": t["overflow"] / n}

    def to_json(self) -> dict[str, Any]:
        """JSON-able copy of the per-layer counts."""
        return {layer: {k: list(v) for k, v in rec.items()} for layer, rec in self.stats.items()}


def _scaled_mm_available(x: torch.Tensor, w: torch.Tensor) -> bool:
    # FP8 tensor-core GEMMs need both inner and output dimensions to be multiples of 16.
    return x.is_cuda and hasattr(torch, "_scaled_mm") and w.shape[0] % 16 == 0 and w.shape[1] % 16 == 0


def _gemm_e4m3(xq: torch.Tensor, wq: torch.Tensor) -> torch.Tensor:
    """``xq @ wq.T`` for E4M3-representable float inputs: a real FP8 GEMM on CUDA, else float32."""
    if _scaled_mm_available(xq, wq):
        x8 = xq.reshape(-1, xq.shape[-1]).to(torch.float8_e4m3fn)
        # _scaled_mm wants the second operand column-major: w.T of a row-major w is exactly that.
        w8 = wq.to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=xq.device, dtype=torch.float32)
        y = torch._scaled_mm(x8, w8, scale_a=one, scale_b=one, out_dtype=torch.float32)
        return y.reshape(*xq.shape[:-1], wq.shape[0]).to(xq.dtype)
    return xq @ wq.t()


class _FP8Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, alpha: float,
                counters: FP8Counters | None, name: str, grad_scale: float) -> torch.Tensor:
        xq, wq = cast_e4m3(x), cast_e4m3(w)
        if counters is not None and counters.enabled:
            counters.add(name, "activation", *count_cast(x, xq, E4M3_MAX))
            counters.add(name, "weight", *count_cast(w, wq, E4M3_MAX))
        ctx.save_for_backward(xq, wq)
        ctx.alpha, ctx.counters, ctx.name, ctx.grad_scale = alpha, counters, name, grad_scale
        # α scales the GEMM output (the GEMM's α), so the FP8 operands themselves stay unit-scaled.
        return _gemm_e4m3(xq, wq) * alpha

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        xq, wq = ctx.saved_tensors
        s = ctx.grad_scale
        gs = g * s if s != 1.0 else g
        gq = cast_e5m2(gs)
        c = ctx.counters
        if c is not None and c.enabled:
            c.add(ctx.name, "gradient", *count_cast(gs, gq, E5M2_MAX))
        if s != 1.0:
            gq = gq / s
        a = ctx.alpha
        grad_x = (gq @ wq) * a if ctx.needs_input_grad[0] else None
        grad_w = None
        if ctx.needs_input_grad[1]:
            grad_w = (gq.reshape(-1, gq.shape[-1]).t() @ xq.reshape(-1, xq.shape[-1])) * a
        return grad_x, grad_w, None, None, None, None


def fp8_linear(x: torch.Tensor, w: torch.Tensor, alpha: float = 1.0,
               counters: FP8Counters | None = None, name: str = "linear", grad_scale: float = 1.0) -> torch.Tensor:
    """``alpha * (cast_e4m3(x) @ cast_e4m3(w).T)`` with the incoming gradient cast to E5M2.

    The backward pass returns ``alpha * gq @ wq`` for ``x`` and ``alpha * gq.T @ xq`` for ``w``
    (``xq``/``wq`` the E4M3 values used in forward, ``gq = cast_e5m2(g * grad_scale) / grad_scale``),
    the gradients of the FP8 GEMM as a FP8 training recipe computes them.

    Args:
        x: input activations ``(..., fan_in)``.
        w: weight ``(fan_out, fan_in)``.
        alpha: static output multiplier (µS: ``1/sqrt(fan_in)``).
        counters: where to record underflows/overflows, or None.
        name: the layer's name in ``counters``.
        grad_scale: a *static* constant the incoming gradient is multiplied by before its E5M2 cast
            and divided by after (a fixed loss scale; no amax, nothing data-dependent). The µS model
            passes 1 (the paper's direct cast), or ``n_tokens * fan_in_of_head`` with
            ``MuSConfig.fp8_grad_scale`` (see ``model.MuSForCausalLM.forward``).

    Returns:
        ``(..., fan_out)`` output in ``x``'s dtype.
    """
    return _FP8Linear.apply(x, w, float(alpha), counters, name, float(grad_scale))
