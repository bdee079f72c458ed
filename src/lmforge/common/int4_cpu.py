"""PyTorch's own CPU int4 matmul for uniform 4-bit group-wise weights (GPTQ, AWQ, RTN).

torch 2.13 ships ``aten._convert_weight_to_int4pack_for_cpu`` and ``aten._weight_int4pack_mm_for_cpu``
(the kernels behind torchao's CPU int4 weight-only path; torchao 0.18's wheel has no other CPU
kernel, so it is not a dependency). Their weight convention, checked against the dequantized
reference in ``tests/common/test_int4_cpu.py``, is

    W[o, j] = (q[o, j] - 8) * S[j // g, o, 0] + S[j // g, o, 1]

with ``S`` of shape ``(in / g, out, 2)`` and the dtype of ``x``. lmforge stores
``W = scales * (q - zeros)`` (integer zero points, GPTQ/AWQ), so ``S[..., 0] = scales^T`` and
``S[..., 1] = ((8 - zeros) * scales)^T``.

Limits of the kernel: ``out % 16 == 0``, ``in % g == 0``, ``g`` in {32, 64, 128, 256}, 4 bits, no
act-order column permutation, CPU tensors, ``x`` 2-D in float32, bfloat16 or float16.

Speed (``benchmarks/int4_matmul.py``): the kernel is fast with bfloat16 activations only; with
float32 activations it ran 6-15x slower than a dense float32 matmul on a 2-core AVX2 CPU. So the
``"int4"`` path computes in bfloat16 (``x`` cast down, the output cast back), which rounds the
activations, and the kernel's scales and zero offsets, to bfloat16 (a bfloat16 model rounds its weights
instead); the float32 kernel call is exact to the dequantized weight, which a test checks. On the 2-core
AVX-512 EPYC (``benchmarks/results/int4_matmul.json``) the bfloat16 call is 6.4x faster than dense
float32 at 4096 x 4096 but slower on SmolLM2's 576 x 576 and 192 x 576; ``UniformQuantLinear``'s default
(``kernel="auto"``) therefore runs lmforge's compiled GEMV (:mod:`lmforge.common.lut_kernel`) for float32
and for a few bfloat16 tokens, and this kernel for bfloat16/float16 prompts.
"""

from __future__ import annotations

import torch

__all__ = ["GROUP_SIZES", "Int4Packed", "available", "int4_matmul", "pack_int4", "unsupported_reason"]

GROUP_SIZES = (32, 64, 128, 256)
_MM = getattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu", None)


def available() -> bool:
    """True when this torch build has the CPU int4 ops."""
    aten = torch.ops.aten
    return hasattr(aten, "_convert_weight_to_int4pack_for_cpu") and hasattr(aten, "_weight_int4pack_mm_for_cpu")


def unsupported_reason(
    out_features: int, in_features: int, bits: int, group_size: int, act_order: bool, device: torch.device | str
) -> str | None:
    """Why the int4 kernel cannot run this layer, or None when it can."""
    if not available():
        return f"torch {torch.__version__} has no CPU int4 matmul (aten._weight_int4pack_mm_for_cpu)"
    if torch.device(device).type != "cpu":
        return f"the int4 kernel is CPU only, the layer is on {torch.device(device).type}"
    if bits != 4:
        return f"the int4 kernel needs 4-bit codes, the layer has {bits}"
    if act_order:
        return "the int4 kernel has no act-order (g_idx) column permutation"
    if group_size not in GROUP_SIZES:
        return f"the int4 kernel needs a group size in {GROUP_SIZES}, the layer has {group_size or 'per-channel'}"
    if in_features % group_size:
        return f"the int4 kernel needs in_features ({in_features}) divisible by the group size {group_size}"
    if out_features % 16:
        return f"the int4 kernel needs out_features ({out_features}) divisible by 16"
    return None


class Int4Packed:
    """A weight in the kernel's layout: ``weight`` uint8 ``(out, in / 2)``, ``group_size``, and the
    ``(in / g, out, 2)`` scale/zero tensor per activation dtype (made on first use)."""

    def __init__(self, weight: torch.Tensor, group_size: int, scale_zero: torch.Tensor, out_features: int) -> None:
        self.weight = weight
        self.group_size = group_size
        self.out_features = out_features
        self._sz64 = scale_zero
        self._sz: dict[torch.dtype, torch.Tensor] = {}

    def scale_zero(self, dtype: torch.dtype) -> torch.Tensor:
        if dtype not in self._sz:
            self._sz[dtype] = self._sz64.to(dtype).contiguous()
        return self._sz[dtype]

    def nbytes(self, dtype: torch.dtype = torch.bfloat16) -> int:
        """Bytes the kernel reads for one matmul with ``dtype`` activations (codes + scales/zeros)."""
        return self.weight.numel() * self.weight.element_size() + self._sz64.numel() * dtype.itemsize


def pack_int4(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int) -> Int4Packed:
    """Pack ``(out, in)`` codes in 0..15 with ``(out, in / g)`` scales and integer zero points.

    The caller checks :func:`unsupported_reason` first.
    """
    out_f, in_f = codes.shape
    if scales.shape != (out_f, in_f // group_size) or zeros.shape != scales.shape:
        raise ValueError(f"scales/zeros must be ({out_f}, {in_f // group_size})")
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32).contiguous(), 1)
    s = scales.double()
    sz = torch.stack([s.t(), ((8.0 - zeros.double()) * s).t()], dim=-1).contiguous()
    return Int4Packed(packed, int(group_size), sz, out_f)


def int4_matmul(x: torch.Tensor, packed: Int4Packed, compute_dtype: torch.dtype | None = torch.bfloat16) -> torch.Tensor:
    """``x @ W^T`` through the kernel, in ``x``'s dtype.

    Args:
        x: ``(..., in)`` activations.
        packed: from :func:`pack_int4`.
        compute_dtype: the kernel's activation dtype (bfloat16: the fast one); None runs in ``x``'s
            own dtype (float32 gives the dequantized reference to float32 rounding, slowly).
    """
    dt = compute_dtype or x.dtype
    xk = x.reshape(-1, x.shape[-1]).to(dt)
    if not xk.is_contiguous():
        xk = xk.contiguous()
    y = _MM(xk, packed.weight, packed.group_size, packed.scale_zero(dt))
    if y.dtype != x.dtype:
        y = y.to(x.dtype)
    return y if x.dim() == 2 else y.reshape(*x.shape[:-1], packed.out_features)
