"""Linear layers that run from packed quantized weights, and the matmuls behind them.

* :class:`UniformQuantLinear` holds a :class:`~lmforge.common.quant.UniformQuantized` weight (GPTQ,
  AWQ, RTN) as packed int32 codes (:func:`~lmforge.common.quant.pack_codes`) with float32
  ``scales``/``zeros`` per (row, group) and an optional act-order ``g_idx``; its forward is
  :func:`dequant_matmul`.
* :class:`CodebookQuantLinear` holds a :class:`~lmforge.common.quant.CodebookQuantized` weight (GANQ)
  as packed codes, a ``(out, 2^bits)`` codebook and optional sparse outliers; its forward is the
  codebook matmul of :func:`lut_matmul`.
* :func:`lut_matmul` computes ``x @ W^T`` for ``W[i, j] = T[i, Q[i, j]]`` two ways: ``"gather"``
  dequantizes (``T.gather(1, Q)``) then multiplies; ``"lut"`` is the LUT / bucket-sum formulation
  ``y_i = sum_s T[i, s] * (sum_{j: Q_ij = s} x_j)`` (a scatter-add of ``x`` into ``2^bits`` buckets
  per row, then a ``2^bits``-long dot product per row).
* :func:`weight_bytes` counts the bytes that hold a module's weight; :func:`swap_linear` replaces a
  ``nn.Linear`` or GPT-2 ``Conv1D`` by a quantized module with the same ``y = x W^T + b``.

Both matmuls work on blocks of output rows: a block's codes are unpacked (to float32 for uniform
codes, to the int64 indices ``gather`` and ``scatter_add_`` need for codebooks) and dequantized while
they are still in cache, and only
one block's float weight exists at a time, so a forward never materialises the whole float weight
(memory is the point of quantization). No dense weight is cached unless a module is built with
``cache_weight=True``. A uniform 4-bit layer that runs PyTorch's int4 kernel keeps a second copy of its
codes in the kernel's layout (as many bytes as ``qweight``), made on its first such forward.

On the CPU both layers run by default (``kernel="auto"``) through lmforge's compiled kernel
(:mod:`lmforge.common.lut_kernel`, C built at first use with the system compiler): a GEMV straight from
the packed codes for a few tokens (the decode step), float32 blocks dequantized in C and ``F.linear``
for more. It reads ``qweight`` in place (no repacked copy); its extra memory is a codebook layer's
table repeated to 16 entries per row (2^(4-bits) times the codebook), the outliers' deltas and, for
uniform groups that do not tile 16-word chunks, a group index per word (``NativeLayer.extra_bytes``).
Without a compiler the PyTorch paths run, with one warning per process.

Checked for reuse: compressed-tensors' ``CompressedLinear`` decompresses the whole weight on every
forward and has no per-row-codebook format; transformers' quantizers (GPTQ/AWQ via gptqmodel, HQQ,
compressed-tensors) need their own packing layouts and, for GPTQ/AWQ, compiled kernels. These are
plain PyTorch, CPU and GPU alike.
"""

from __future__ import annotations

import abc
import math
import sys
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.common import int4_cpu, lut_kernel
from lmforge.common.calibration import is_conv1d as _is_conv1d
from lmforge.common.errors import UserError
from lmforge.common.int4_cpu import Int4Packed
from lmforge.common.quant import (
    CodebookQuantized,
    UniformQuantized,
    codes_per_word,
    pack_codes,
    unpack_codes,
)

__all__ = [
    "CODEBOOK_KERNELS",
    "KERNELS",
    "CodebookQuantLinear",
    "UniformQuantLinear",
    "check_kernel",
    "dequant_matmul",
    "is_quant_linear",
    "lut_matmul",
    "set_kernel",
    "swap_linear",
    "weight_bytes",
]

# Input dtypes the compiled kernel runs (computing in float32); others take the PyTorch path.
_NATIVE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# Attributes that hold a quantized layer's weight (reassigning one drops the compiled kernel's view).
_WEIGHT_NAMES = frozenset({"qweight", "scales", "zeros", "g_idx", "codebook", "outlier_rows", "outlier_cols",
                           "outlier_vals", "bias"})

# A block of output rows holds about this many weights (2 MiB of float32): large enough for an
# efficient matmul, small enough that the unpacked codes and the dequantized block stay in cache.
_BLOCK_ELEMS = 1 << 19

_LUT_METHODS = ("auto", "lut", "gather")

_LITTLE_ENDIAN = sys.byteorder == "little"


def _block_rows(in_features: int, out_features: int, block_rows: int | None) -> int:
    if block_rows is not None:
        if block_rows <= 0:
            raise ValueError(f"block_rows must be positive, got {block_rows}")
        return block_rows
    return max(16, min(out_features, _BLOCK_ELEMS // max(1, in_features)))


def _unpack_rows(words: torch.Tensor, bits: int, n: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """``(rows, n)`` codes of packed int32 ``words`` (the layout of :func:`pack_codes`) as ``dtype``.

    For widths that divide 8 (1, 2, 4, 8 bits) the words are read as little-endian bytes, so the
    shifts and masks run on uint8 (a third faster than on int32 at 4 bits). Other widths shift int32
    words; an arithmetic shift of a negative word only smears the sign into bits the mask drops.
    """
    rows = words.shape[0]
    mask = (1 << bits) - 1
    if 8 % bits == 0 and _LITTLE_ENDIAN:
        b = words.contiguous().view(torch.uint8)  # byte k of a word holds codes k*(8//bits)...
        if bits == 8:
            codes = b
        else:
            per_byte = 8 // bits
            codes = torch.stack([(b >> (k * bits)) & mask for k in range(per_byte)], dim=-1)
    else:
        shifts = torch.arange(codes_per_word(bits), dtype=torch.int32, device=words.device) * bits
        codes = (words.unsqueeze(-1) >> shifts) & mask
    return codes.reshape(rows, -1)[:, :n].to(dtype)


def _codes_at(words: torch.Tensor, bits: int, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """The packed codes at positions ``(rows[k], cols[k])`` as int64, without unpacking the rest."""
    per = codes_per_word(bits)
    cols = cols.long()
    w = words[rows.long(), cols // per].to(torch.int64)
    return (w >> ((cols % per) * bits)) & ((1 << bits) - 1)


def _flatten_input(x: torch.Tensor, in_features: int) -> tuple[torch.Tensor, tuple[int, ...]]:
    if x.shape[-1] != in_features:
        raise ValueError(f"input has {x.shape[-1]} features, the layer expects {in_features}")
    lead = tuple(x.shape[:-1])
    return x.reshape(-1, in_features), lead


def _blocked(
    n_rows: int, rows_per_block: int, block_out: Callable[[int, int], torch.Tensor]
) -> torch.Tensor:
    """Concatenate ``block_out(start, stop)`` (each ``(tokens, stop - start)``) over row blocks."""
    outs = [block_out(r, min(r + rows_per_block, n_rows)) for r in range(0, n_rows, rows_per_block)]
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)


# --------------------------------------------------------------------------------------------------
# Uniform codes


def _dequant_block(
    words: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    bits: int,
    in_features: int,
    group_size: int,
    g_idx: torch.Tensor | None,
) -> torch.Tensor:
    """Float32 ``scale * (q - zero)`` of a block of rows, bit for bit what ``UniformQuantized.dequantize``
    computes (the same two float32 operations on the same operands)."""
    q = _unpack_rows(words, bits, in_features, torch.float32)
    scales = scales.to(torch.float32)
    zeros = zeros.to(torch.float32)
    if g_idx is None and group_size <= 0:
        return scales[:, :1] * (q - zeros[:, :1])
    if g_idx is None and in_features % group_size == 0:
        rows, n_groups = q.shape[0], in_features // group_size
        qg = q.view(rows, n_groups, group_size)
        return (scales.unsqueeze(-1) * (qg - zeros.unsqueeze(-1))).view(rows, in_features)
    if g_idx is None:
        g = torch.arange(in_features, device=q.device) // group_size
    else:
        g = g_idx.to(device=q.device, dtype=torch.long)
    return scales[:, g] * (q - zeros[:, g])


def dequant_matmul(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    *,
    bits: int,
    in_features: int,
    group_size: int = 0,
    g_idx: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    block_rows: int | None = None,
) -> torch.Tensor:
    """``x @ W^T (+ bias)`` for a uniform weight ``W = scales * (codes - zeros)`` stored packed.

    The weight is dequantized in float32 one block of output rows at a time, cast to ``x``'s dtype and
    multiplied with ``F.linear``; the result equals ``F.linear(x, q.dequantize().to(x.dtype), bias)``
    up to floating-point summation order.

    Args:
        x: ``(..., in_features)`` input.
        qweight: ``(out, ceil(in / (32 // bits)))`` int32 packed codes.
        scales: ``(out, n_groups)`` scales.
        zeros: ``(out, n_groups)`` zero points.
        bits: code width.
        in_features: number of input features (the packed rows are zero-padded).
        group_size: columns per group; 0 for one group per row.
        g_idx: ``(in,)`` group of each column (act-order), or None for ``j // group_size``.
        bias: optional ``(out,)`` bias.
        block_rows: output rows per block; None picks about 512K weights a block.

    Returns:
        ``(..., out)`` in ``x``'s dtype.
    """
    x2, lead = _flatten_input(x, in_features)
    out_features = qweight.shape[0]
    rows = _block_rows(in_features, out_features, block_rows)

    def block(r0: int, r1: int) -> torch.Tensor:
        w = _dequant_block(qweight[r0:r1], scales[r0:r1], zeros[r0:r1], bits, in_features, group_size, g_idx)
        return F.linear(x2, w.to(x2.dtype))

    y = _blocked(out_features, rows, block)
    if bias is not None:
        y = y + bias.to(y.dtype)
    return y.reshape(*lead, out_features)


# --------------------------------------------------------------------------------------------------
# Codebook codes


def _check_method(method: str) -> None:
    if method not in _LUT_METHODS:
        raise ValueError(f"method must be one of {', '.join(_LUT_METHODS)}, got {method!r}")


def _resolve_method(method: str) -> str:
    # NOTE: measured on CPU (benchmarks/lut_matmul.py): with PyTorch ops the bucket-sum is no faster
    # than gather-then-matmul even at batch 1 (both are bound by unpacking and the int64 indices),
    # and gather's cost is shared by every token of a batch. "auto" therefore always gathers; "lut"
    # stays available (and exact) as the reference formulation of a LUT kernel.
    if method == "auto":
        return "gather"
    return method


def _codebook_block(
    x2: torch.Tensor, codes: torch.Tensor, table: torch.Tensor, method: str
) -> torch.Tensor:
    """``(tokens, rows)`` output of one block: ``codes`` ``(rows, in)`` int64, ``table`` ``(rows, K)``."""
    if method == "gather":
        w = torch.gather(table.to(torch.float32), 1, codes)
        return F.linear(x2, w.to(x2.dtype))
    # LUT / bucket sum: bucket[t, i, s] = sum of x[t, j] over the columns j where codes[i, j] == s.
    tokens, rows, k = x2.shape[0], codes.shape[0], table.shape[1]
    xf = x2.to(torch.float32)
    buckets = torch.zeros(tokens, rows, k, dtype=torch.float32, device=x2.device)
    buckets.scatter_add_(
        2,
        codes.unsqueeze(0).expand(tokens, rows, codes.shape[1]),
        xf.unsqueeze(1).expand(tokens, rows, xf.shape[1]),
    )
    y = (buckets * table.to(torch.float32).unsqueeze(0)).sum(dim=-1)
    return y.to(x2.dtype)


def _outlier_correction(
    y: torch.Tensor,
    x2: torch.Tensor,
    table: torch.Tensor,
    rows: torch.Tensor,
    cols: torch.Tensor,
    vals: torch.Tensor,
    codes_at: torch.Tensor,
) -> torch.Tensor:
    """``y`` plus ``x[:, c] * (v - T[r, Q[r, c]])`` for every outlier ``(r, c, v)``: the outlier
    replaces the codebook value at its position, as in ``CodebookQuantized.dequantize``."""
    rows_l = rows.to(device=y.device, dtype=torch.long)
    delta = vals.to(torch.float32) - table.to(torch.float32)[rows_l, codes_at]
    contrib = x2[:, cols.long()].to(torch.float32) * delta
    return y.index_add(1, rows_l, contrib.to(y.dtype))


def _codebook_matmul(
    x: torch.Tensor,
    get_codes: Callable[[int, int], torch.Tensor],
    codebook: torch.Tensor,
    in_features: int,
    *,
    outliers: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None,
    bias: torch.Tensor | None,
    method: str,
    block_rows: int | None,
) -> torch.Tensor:
    _check_method(method)
    x2, lead = _flatten_input(x, in_features)
    out_features = codebook.shape[0]
    how = _resolve_method(method)
    rows = _block_rows(in_features, out_features, block_rows)

    def block(r0: int, r1: int) -> torch.Tensor:
        return _codebook_block(x2, get_codes(r0, r1), codebook[r0:r1], how)

    y = _blocked(out_features, rows, block)
    if outliers is not None and outliers[2].numel():
        y = _outlier_correction(y, x2, codebook, *outliers)
    if bias is not None:
        y = y + bias.to(y.dtype)
    return y.reshape(*lead, out_features)


def lut_matmul(
    x: torch.Tensor,
    codes: torch.Tensor,
    codebook: torch.Tensor,
    *,
    outlier_rows: torch.Tensor | None = None,
    outlier_cols: torch.Tensor | None = None,
    outlier_vals: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    method: str = "auto",
    block_rows: int | None = None,
) -> torch.Tensor:
    """``x @ W^T (+ bias)`` for a per-row codebook weight ``W[i, j] = codebook[i, codes[i, j]]``.

    Equals ``x @ codebook.gather(1, codes).T`` (with outliers written into ``W``) up to float
    summation order, for any number of tokens.

    Args:
        x: ``(..., in)`` input.
        codes: ``(out, in)`` integer codes (unpacked).
        codebook: ``(out, K)`` values, ``K = 2^bits``.
        outlier_rows, outlier_cols, outlier_vals: optional sparse entries that replace the codebook
            value at their (unique) positions.
        bias: optional ``(out,)`` bias.
        method: ``"gather"`` (dequantize a block, then matmul), ``"lut"`` (bucket sums of ``x`` per
            code, then a ``K``-long dot product per row) or ``"auto"`` (the faster one; see
            :func:`_resolve_method`).
        block_rows: output rows per block; None picks about 512K weights a block.

    Returns:
        ``(..., out)`` in ``x``'s dtype.
    """
    if codes.shape[0] != codebook.shape[0]:
        raise ValueError(f"codes have {codes.shape[0]} rows but the codebook has {codebook.shape[0]}")
    in_features = int(codes.shape[1])
    outliers = None
    if outlier_vals is not None and outlier_vals.numel():
        if outlier_rows is None or outlier_cols is None:
            raise ValueError("outlier_vals needs outlier_rows and outlier_cols")
        at = codes[outlier_rows.long(), outlier_cols.long()].to(torch.int64)
        outliers = (outlier_rows, outlier_cols, outlier_vals, at)
    return _codebook_matmul(
        x,
        lambda r0, r1: codes[r0:r1].to(torch.int64),
        codebook,
        in_features,
        outliers=outliers,
        bias=bias,
        method=method,
        block_rows=block_rows,
    )


# --------------------------------------------------------------------------------------------------
# Modules

# Forward paths of the quantized layers (see their docstrings). "native" is lmforge's compiled CPU
# kernel (lmforge.common.lut_kernel), "int4" PyTorch's CPU int4 kernel (uniform 4-bit only), "dequant"
# the PyTorch dequantize-a-block-then-matmul path (for codebook layers: their ``method``).
KERNELS = ("auto", "int4", "dequant", "native")
CODEBOOK_KERNELS = ("auto", "native", "dequant")


def check_kernel(kernel: str) -> None:
    """A UserError (one line) for a kernel name that is unknown or that this build lacks.

    ``native`` compiles (or loads the cached) compiled kernel here, so a missing compiler is reported
    before any model loads.
    """
    if kernel not in KERNELS:
        raise UserError(f"--kernel must be one of {', '.join(KERNELS)}, got {kernel!r}")
    if kernel == "int4" and not int4_cpu.available():
        raise UserError(f"--kernel int4: torch {torch.__version__} has no CPU int4 matmul "
                        "(aten._weight_int4pack_mm_for_cpu); use --kernel auto or dequant")
    if kernel == "native" and not lut_kernel.available():
        raise UserError(f"--kernel native: lmforge's compiled kernel is unavailable "
                        f"({lut_kernel.unavailable_reason()}); use --kernel auto or dequant")


def set_kernel(model: nn.Module, kernel: str) -> int:
    """Set the forward path of every quantized layer in ``model`` (after :func:`check_kernel`);
    returns how many modules were set.

    Codebook layers have no int4 kernel: ``"int4"`` sets them to ``"auto"``.
    """
    check_kernel(kernel)
    n = 0
    for mod in model.modules():
        if isinstance(mod, UniformQuantLinear):
            mod.kernel = kernel
            n += 1
        elif isinstance(mod, CodebookQuantLinear):
            mod.kernel = "auto" if kernel == "int4" else kernel
            n += 1
    return n


def _make_bias(out_features: int, bias: bool, dtype: torch.dtype, device: torch.device | str | None):
    if not bias:
        return None
    return nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device), requires_grad=False)


class _QuantLinearBase(nn.Module, abc.ABC):
    """Shared bits of the two quantized linear layers (shape checks, bias, weight cache); the
    subclasses say which tensors hold the weight and how to dequantize it."""

    in_features: int
    out_features: int
    bits: int

    def __init__(self, in_features: int, out_features: int, bits: int, cache_weight: bool) -> None:
        super().__init__()
        if in_features <= 0 or out_features <= 0:
            raise ValueError(f"bad shape ({out_features}, {in_features})")
        codes_per_word(bits)  # validates bits
        self.in_features = int(in_features)
        self.out_features = int(out_features)
        self.bits = int(bits)
        self.cache_weight = bool(cache_weight)
        # The nn.Module that this one replaced ("Linear", "Conv1D"); set by swap_linear.
        self.source_type: str | None = None
        self._cache: tuple[tuple, torch.Tensor] | None = None

    def _cached_weight(self, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        # Tensor._version counts in-place writes (load_state_dict copies, edits), so a stale cache is
        # never used.
        key = (dtype, device, *(t._version for t in self._weight_tensors()), *(id(t) for t in self._weight_tensors()))
        if self._cache is None or self._cache[0] != key:
            self._cache = (key, self.dequantize_weight().to(device=device, dtype=dtype))
        return self._cache[1]

    @abc.abstractmethod
    def _weight_tensors(self) -> list[torch.Tensor]:
        """The buffers that hold the weight (what :func:`weight_bytes` counts)."""

    @abc.abstractmethod
    def dequantize_weight(self) -> torch.Tensor:
        """The dense ``(out, in)`` float32 weight these buffers stand for."""

    def clear_cache(self) -> None:
        """Drop the cached dequantized weight (only used with ``cache_weight=True``)."""
        self._cache = None

    def __getstate__(self) -> dict:
        # The compiled kernel's view holds raw pointers (ctypes): never pickled or deep-copied.
        state = self.__dict__.copy()
        state["_native"] = None
        return state

    def __setattr__(self, name: str, value) -> None:
        # A reassigned buffer or bias (module.qweight = t) drops the compiled view of the old ones.
        if self.__dict__.get("_native") is not None and name in _WEIGHT_NAMES:
            self.__dict__["_native"] = None
        super().__setattr__(name, value)

    def _apply(self, *args, **kwargs):
        # .to() / .float() / .cpu() replace the buffers without __setattr__.
        self.__dict__["_native"] = None
        return super()._apply(*args, **kwargs)

    # -- the compiled kernel (lmforge.common.lut_kernel) ------------------------------------------
    # self._native is None or (key, NativeLayer, tensors): the compiled view of ``tensors`` (the
    # weight buffers and the bias) as they were at ``key`` (_native_key: Tensor._version counts
    # in-place writes, e.g. load_state_dict; the data pointer catches ``buf.data = t``, which keeps
    # the version); a reassigned or moved buffer clears it (above).

    @abc.abstractmethod
    def _native_unsupported(self) -> str | None:
        """Why the compiled kernel cannot run this layer (shape/format/device), or None."""

    @abc.abstractmethod
    def _build_native(self) -> lut_kernel.NativeLayer | None:
        """The compiled view of the current buffers (None when the library is unavailable)."""

    def native_reason(self) -> str | None:
        """Why this layer cannot use the compiled kernel, or None when it can."""
        reason = self._native_unsupported()
        if reason is None and not lut_kernel.available():
            reason = f"lmforge's compiled kernel is unavailable: {lut_kernel.unavailable_reason()}"
        return reason

    def _native_tensors(self) -> tuple[torch.Tensor, ...]:
        return (*self._weight_tensors(), *(() if self.bias is None else (self.bias,)))

    @staticmethod
    def _native_key(tensors: tuple[torch.Tensor, ...]) -> list[tuple[int, int]]:
        return [(t._version, t.data_ptr()) for t in tensors]

    @staticmethod
    def _native_declines(x: torch.Tensor, tensors: tuple[torch.Tensor, ...]) -> bool:
        """True when ``x`` must take the PyTorch path: autograd through the input or through a weight
        tensor or the bias (the compiled kernel has no backward; it adds the bias in C), or a dtype
        other than float32/bfloat16/float16. NOTE: float64 stays on PyTorch because the kernel
        computes in float32, and F.linear on float64 computes in float64."""
        if x.dtype not in _NATIVE_DTYPES:
            return True
        return torch.is_grad_enabled() and (x.requires_grad or any(t.requires_grad for t in tensors))

    def _native_layer(self, x: torch.Tensor, kernel: str) -> lut_kernel.NativeLayer | None:
        """The compiled view to run ``x`` through, or None for the PyTorch path (``kernel`` is auto or
        native; an explicit native request that cannot run warns once)."""
        tensors = self._native_tensors()
        if self._native_declines(x, tensors):
            return None  # autograd or a float64 input: the PyTorch path
        st = self.__dict__.get("_native")
        if st is not None and self._native_key(st[2]) == st[0]:
            return st[1]
        reason = self._native_unsupported() or (None if x.is_cpu else "the input is not on the CPU")
        if reason is not None:
            if kernel == "native" and not self.__dict__.get("_native_warned", False):
                warnings.warn(f"native kernel unavailable for a {self.out_features}x{self.in_features} layer, using "
                              f"the PyTorch path: {reason}", stacklevel=4)
                self._native_warned = True
            return None
        nat = self._build_native()
        if nat is None:
            lut_kernel.warn_fallback_once()
            return None
        self.__dict__["_native"] = (self._native_key(tensors), nat, tensors)
        return nat

    def _native_gemv_fast(self, x: torch.Tensor) -> torch.Tensor | None:
        """The compiled GEMV for a few CPU tokens when the compiled view is current, else None (the
        decode hot path: no module attribute lookups beyond ``__dict__``)."""
        st = self.__dict__.get("_native")
        if (
            st is None
            or not x.is_cpu
            or x.shape[-1] != self.in_features
            or x.numel() > lut_kernel.GEMV_MAX_TOKENS * self.in_features
            or self._native_declines(x, st[2])
            or self._native_key(st[2]) != st[0]
        ):
            return None
        return st[1].run(x)

    def _native_forward(self, nat: lut_kernel.NativeLayer, x: torch.Tensor) -> torch.Tensor:
        """``x W^T + b`` through the compiled kernel: its GEMV for a few tokens, else float32 weight
        blocks dequantized in C (bit for bit the PyTorch dequantize) multiplied with ``F.linear``."""
        x2, lead = _flatten_input(x, self.in_features)
        if x2.shape[0] <= lut_kernel.GEMV_MAX_TOKENS:
            return nat.run(x)
        rows = _block_rows(self.in_features, self.out_features, getattr(self, "block_rows", None))
        buf = lut_kernel.scratch(min(rows, self.out_features) * self.in_features)
        y = _blocked(self.out_features, rows,
                     lambda r0, r1: F.linear(x2, nat.dequant(r0, r1, out=buf).to(x2.dtype)))
        y = self._sparse_correction(y, x2)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*lead, self.out_features)

    def _sparse_correction(self, y: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        return y


class UniformQuantLinear(_QuantLinearBase):
    """``y = x W^T + b`` with ``W = scales * (codes - zeros)`` per (row, group), codes packed in int32.

    Buffers: ``qweight`` ``(out, ceil(in / (32 // bits)))`` int32, ``scales`` and ``zeros``
    ``(out, n_groups)`` float32, ``g_idx`` ``(in,)`` int32 when act-order regrouped the columns;
    ``bias`` is a (frozen) parameter when present.

    Args:
        in_features, out_features: the layer's shape.
        bits: code width (1..8).
        group_size: columns per group; 0 for per-channel (one group per row).
        sym: whether the grid is symmetric (informational; zeros are stored either way).
        bias: whether the layer has a bias.
        act_order: whether a ``g_idx`` buffer is stored.
        dtype: the bias dtype.
        cache_weight: keep the dequantized weight between forwards (faster, but as much memory as
            the dense layer); off by default.
        block_rows: output rows dequantized at a time (None: automatic).
        device: where to create the buffers.
        kernel: ``"auto"``, ``"native"``, ``"int4"`` or ``"dequant"``.

            * ``"native"``: lmforge's compiled kernel (:mod:`lmforge.common.lut_kernel`): for up to
              ``GEMV_MAX_TOKENS`` tokens a GEMV straight from the packed codes in float32 (equal to the
              dequantized reference up to summation order), for more tokens float32 weight blocks
              dequantized in C (bit for bit the PyTorch dequantize) and ``F.linear``. 1..4-bit codes,
              groups that hold whole code words, no act-order, CPU; a layer it cannot run warns once
              and takes the dequantize path.
            * ``"int4"``: PyTorch's CPU int4 kernel (:mod:`lmforge.common.int4_cpu`) for every input,
              computing in bfloat16 (fast, with bfloat16-rounded activations); a layer that does not
              fit warns once and falls back.
            * ``"dequant"``: PyTorch only, dequantize a block of rows then ``F.linear``.
            * ``"auto"`` (default): with ``cache_weight`` the cached dense weight; otherwise native
              where the layer fits it and the library is available, except that bfloat16/float16
              inputs of more than ``GEMV_MAX_TOKENS`` tokens take the int4 kernel where it fits
              (its GEMM beats dequantize-then-matmul). No library (no compiler): the previous rule
              (int4 for bfloat16/float16, dequant for float32) with one warning per process.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        bits: int,
        group_size: int = 0,
        sym: bool = False,
        bias: bool = False,
        act_order: bool = False,
        dtype: torch.dtype = torch.float32,
        cache_weight: bool = False,
        block_rows: int | None = None,
        device: torch.device | str | None = None,
        kernel: str = "auto",
    ) -> None:
        super().__init__(in_features, out_features, bits, cache_weight)
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {', '.join(KERNELS)}, got {kernel!r}")
        self.kernel = kernel
        self._native: tuple[list, lut_kernel.NativeLayer, tuple] | None = None
        self._native_warned = False
        self._int4: tuple[tuple, Int4Packed] | None = None
        self._int4_reason: tuple[torch.device, str | None] | None = None
        self._int4_warned = False
        self.group_size = int(group_size) if group_size and group_size > 0 else 0
        self.sym = bool(sym)
        self.block_rows = block_rows
        n_words = math.ceil(in_features / codes_per_word(bits))
        n_groups = math.ceil(in_features / self.group_size) if self.group_size else 1
        self.register_buffer("qweight", torch.zeros(out_features, n_words, dtype=torch.int32, device=device))
        self.register_buffer("scales", torch.ones(out_features, n_groups, dtype=torch.float32, device=device))
        self.register_buffer("zeros", torch.zeros(out_features, n_groups, dtype=torch.float32, device=device))
        g_idx = torch.zeros(in_features, dtype=torch.int32, device=device) if act_order else None
        self.register_buffer("g_idx", g_idx)
        self.bias = _make_bias(out_features, bias, dtype, device)

    @property
    def n_groups(self) -> int:
        return int(self.scales.shape[1])

    @classmethod
    def from_quantized(
        cls,
        q: UniformQuantized,
        bias: torch.Tensor | None = None,
        *,
        dtype: torch.dtype | None = None,
        cache_weight: bool = False,
        block_rows: int | None = None,
        kernel: str = "auto",
    ) -> UniformQuantLinear:
        """Pack ``q`` into a new module.

        Args:
            q: the quantized weight.
            bias: optional ``(out,)`` bias (copied).
            dtype: bias dtype; defaults to ``bias``'s own dtype (float32 without bias).
            cache_weight: see the class.
            block_rows: see the class.
            kernel: see the class.
        """
        out_f, in_f = q.shape
        n_groups = math.ceil(in_f / q.group_size) if 0 < q.group_size else 1
        if q.g_idx is not None and (q.g_idx.shape != (in_f,) or int(q.g_idx.max()) >= n_groups):
            raise ValueError(f"g_idx must be ({in_f},) group numbers below {n_groups}")
        if tuple(q.scales.shape) != (out_f, n_groups) or tuple(q.zeros.shape) != (out_f, n_groups):
            raise ValueError(
                f"scales/zeros have shapes {tuple(q.scales.shape)}/{tuple(q.zeros.shape)}, "
                f"expected ({out_f}, {n_groups})"
            )
        if bias is not None and tuple(bias.shape) != (out_f,):
            raise ValueError(f"bias has shape {tuple(bias.shape)}, expected ({out_f},)")
        bias_dtype = dtype or (bias.dtype if bias is not None else torch.float32)
        device = q.codes.device
        m = cls(
            in_f,
            out_f,
            bits=q.bits,
            group_size=q.group_size,
            sym=q.sym,
            bias=bias is not None,
            act_order=q.g_idx is not None,
            dtype=bias_dtype,
            cache_weight=cache_weight,
            block_rows=block_rows,
            device=device,
            kernel=kernel,
        )
        with torch.no_grad():
            m.qweight.copy_(pack_codes(q.codes, q.bits))
            m.scales.copy_(q.scales.to(torch.float32))
            m.zeros.copy_(q.zeros.to(torch.float32))
            if q.g_idx is not None:
                m.g_idx.copy_(q.g_idx.to(torch.int32))
            if bias is not None:
                m.bias.copy_(bias.detach())
        return m

    def to_quantized(self) -> UniformQuantized:
        """The :class:`UniformQuantized` this module holds (tensors are copies)."""
        return UniformQuantized(
            codes=unpack_codes(self.qweight, self.bits, self.in_features),
            scales=self.scales.detach().clone(),
            zeros=self.zeros.detach().clone(),
            bits=self.bits,
            group_size=self.group_size,
            sym=self.sym,
            g_idx=None if self.g_idx is None else self.g_idx.detach().clone(),
        )

    def _weight_tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.qweight, self.scales, self.zeros, self.g_idx) if t is not None]

    def dequantize_weight(self) -> torch.Tensor:
        """The float32 ``(out, in)`` weight (equal to ``to_quantized().dequantize()``)."""
        return _dequant_block(
            self.qweight, self.scales, self.zeros, self.bits, self.in_features, self.group_size, self.g_idx
        )

    def int4_reason(self) -> str | None:
        """Why this layer cannot use the int4 kernel, or None when it can (cached per device)."""
        dev = self.qweight.device
        if self._int4_reason is None or self._int4_reason[0] != dev:
            reason = int4_cpu.unsupported_reason(self.out_features, self.in_features, self.bits, self.group_size,
                                                 self.g_idx is not None, dev)
            self._int4_reason = (dev, reason)
        return self._int4_reason[1]

    def _int4_packed(self) -> Int4Packed:
        # Tensor._version counts in-place writes and id() catches a reassigned buffer: never stale.
        q, s, z = self.qweight, self.scales, self.zeros
        key = (q._version, s._version, z._version, id(q), id(s), id(z))
        if self._int4 is None or self._int4[0] != key:
            codes = unpack_codes(q, self.bits, self.in_features)
            self._int4 = (key, int4_cpu.pack_int4(codes, s, z, self.group_size))
        return self._int4[1]

    def _native_unsupported(self) -> str | None:
        return lut_kernel.unsupported_reason("uniform", self.bits, self.group_size, self.g_idx is not None,
                                             self.qweight.device)

    def _build_native(self) -> lut_kernel.NativeLayer | None:
        return lut_kernel.uniform_layer(self.qweight, self.scales, self.zeros, self.in_features, self.bits,
                                        self.group_size, self.bias)

    def _use_int4(self, x: torch.Tensor, kernel: str) -> bool:
        if kernel == "auto":
            # auto leaves a module that caches its dense weight on that weight (what was asked for).
            return not self.cache_weight and x.dtype in (torch.bfloat16, torch.float16) and self.int4_reason() is None
        if kernel != "int4":
            return False
        reason = self.int4_reason()
        if reason is None:
            return True
        if not self._int4_warned:
            warnings.warn(f"int4 kernel unavailable for a {self.out_features}x{self.in_features} layer, using the "
                          f"dequantize path: {reason}", stacklevel=3)
            self._int4_warned = True
        return False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernel = getattr(self, "kernel", "auto")  # a module pickled before the kernel existed
        if kernel == "native" or (kernel == "auto" and not self.cache_weight):
            y = self._native_gemv_fast(x)
            if y is not None:
                return y
            nat = self._native_layer(x, kernel)
            if nat is not None and (
                kernel == "native"
                or x.dtype == torch.float32
                or x.numel() <= lut_kernel.GEMV_MAX_TOKENS * self.in_features
                or self.int4_reason() is not None
            ):
                return self._native_forward(nat, x)
        if self._use_int4(x, kernel):
            compute = x.dtype if x.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
            y = int4_cpu.int4_matmul(x, self._int4_packed(), compute)
            return y if self.bias is None else y + self.bias.to(y.dtype)
        if self.cache_weight:
            bias = None if self.bias is None else self.bias.to(x.dtype)
            return F.linear(x, self._cached_weight(x.dtype, x.device), bias)
        return dequant_matmul(
            x,
            self.qweight,
            self.scales,
            self.zeros,
            bits=self.bits,
            in_features=self.in_features,
            group_size=self.group_size,
            g_idx=self.g_idx,
            bias=self.bias,
            block_rows=self.block_rows,
        )

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bits={self.bits}, "
            f"group_size={self.group_size}, sym={self.sym}, act_order={self.g_idx is not None}, "
            f"bias={self.bias is not None}, kernel={self.kernel}"
        )


class CodebookQuantLinear(_QuantLinearBase):
    """``y = x W^T + b`` with ``W[i, j] = codebook[i, codes[i, j]]`` (GANQ), plus sparse outliers.

    Buffers: ``qweight`` packed codes (as in :class:`UniformQuantLinear`), ``codebook``
    ``(out, 2^bits)`` float32, and when there are outliers ``outlier_rows``/``outlier_cols`` int32 and
    ``outlier_vals`` float32, each ``(n_outliers,)``; ``bias`` is a (frozen) parameter when present.

    Args:
        in_features, out_features: the layer's shape.
        bits: code width (1..8); the codebook has ``2^bits`` entries per row.
        n_outliers: number of stored outliers (0 for none).
        bias: whether the layer has a bias.
        dtype: the bias dtype.
        method: the :func:`lut_matmul` method of the PyTorch path.
        cache_weight: keep the dequantized weight between forwards; off by default.
        block_rows: output rows per block (None: automatic).
        device: where to create the buffers.
        kernel: ``"auto"`` (default: with ``cache_weight`` the cached dense weight, otherwise the
            compiled kernel where it runs the layer, else the PyTorch path; no library (no compiler)
            warns once per process), ``"native"`` (lmforge's compiled kernel,
            :mod:`lmforge.common.lut_kernel`: a LUT GEMV straight from the packed codes for up to
            ``GEMV_MAX_TOKENS`` tokens, equal to the dequantized reference up to float summation
            order, outliers and bias included; more tokens dequantize float32 blocks in C, bit for bit
            :meth:`dequantize_weight`, then ``F.linear``; 1..4-bit codes on the CPU, a layer it cannot
            run warns once and takes the PyTorch path) or ``"dequant"`` (the PyTorch path, ``method``).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        bits: int,
        n_outliers: int = 0,
        bias: bool = False,
        dtype: torch.dtype = torch.float32,
        method: str = "auto",
        cache_weight: bool = False,
        block_rows: int | None = None,
        device: torch.device | str | None = None,
        kernel: str = "auto",
    ) -> None:
        super().__init__(in_features, out_features, bits, cache_weight)
        _check_method(method)
        if kernel not in CODEBOOK_KERNELS:
            raise ValueError(f"kernel must be one of {', '.join(CODEBOOK_KERNELS)}, got {kernel!r}")
        self.kernel = kernel
        self._native: tuple[list, lut_kernel.NativeLayer, tuple] | None = None
        self._native_warned = False
        self.method = method
        self.block_rows = block_rows
        n_words = math.ceil(in_features / codes_per_word(bits))
        self.register_buffer("qweight", torch.zeros(out_features, n_words, dtype=torch.int32, device=device))
        self.register_buffer("codebook", torch.zeros(out_features, 2**bits, dtype=torch.float32, device=device))
        for buf, dt in (("outlier_rows", torch.int32), ("outlier_cols", torch.int32), ("outlier_vals", torch.float32)):
            # No outliers: no tensors (a None buffer is not in the state dict).
            self.register_buffer(buf, torch.zeros(n_outliers, dtype=dt, device=device) if n_outliers > 0 else None)
        self.bias = _make_bias(out_features, bias, dtype, device)

    @property
    def n_outliers(self) -> int:
        return 0 if self.outlier_vals is None else int(self.outlier_vals.numel())

    @classmethod
    def from_quantized(
        cls,
        q: CodebookQuantized,
        bias: torch.Tensor | None = None,
        *,
        dtype: torch.dtype | None = None,
        method: str = "auto",
        cache_weight: bool = False,
        block_rows: int | None = None,
        kernel: str = "auto",
    ) -> CodebookQuantLinear:
        """Pack ``q`` into a new module (see :meth:`UniformQuantLinear.from_quantized`)."""
        out_f, in_f = q.shape
        if tuple(q.codebook.shape) != (out_f, 2**q.bits):
            raise ValueError(f"codebook has shape {tuple(q.codebook.shape)}, expected ({out_f}, {2**q.bits})")
        if bias is not None and tuple(bias.shape) != (out_f,):
            raise ValueError(f"bias has shape {tuple(bias.shape)}, expected ({out_f},)")
        n_out = q.n_outliers
        bias_dtype = dtype or (bias.dtype if bias is not None else torch.float32)
        m = cls(
            in_f,
            out_f,
            bits=q.bits,
            n_outliers=n_out,
            bias=bias is not None,
            dtype=bias_dtype,
            method=method,
            cache_weight=cache_weight,
            block_rows=block_rows,
            device=q.codes.device,
            kernel=kernel,
        )
        with torch.no_grad():
            m.qweight.copy_(pack_codes(q.codes, q.bits))
            m.codebook.copy_(q.codebook.to(torch.float32))
            if n_out:
                m.outlier_rows.copy_(q.outlier_rows.reshape(-1).to(torch.int32))
                m.outlier_cols.copy_(q.outlier_cols.reshape(-1).to(torch.int32))
                m.outlier_vals.copy_(q.outlier_vals.reshape(-1).to(torch.float32))
                r, c = m.outlier_rows.long(), m.outlier_cols.long()
                if bool(((r < 0) | (r >= m.out_features) | (c < 0) | (c >= m.in_features)).any()):
                    raise ValueError("outlier positions out of range")
                if torch.unique(r * m.in_features + c).numel() != r.numel():
                    raise ValueError("duplicate outlier positions (the matmul would add them twice)")
            if bias is not None:
                m.bias.copy_(bias.detach())
        return m

    def to_quantized(self) -> CodebookQuantized:
        """The :class:`CodebookQuantized` this module holds (tensors are copies)."""
        has = self.n_outliers > 0
        return CodebookQuantized(
            codes=unpack_codes(self.qweight, self.bits, self.in_features),
            codebook=self.codebook.detach().clone(),
            bits=self.bits,
            outlier_rows=self.outlier_rows.detach().clone() if has else None,
            outlier_cols=self.outlier_cols.detach().clone() if has else None,
            outlier_vals=self.outlier_vals.detach().clone() if has else None,
        )

    def _weight_tensors(self) -> list[torch.Tensor]:
        return [
            t for t in (self.qweight, self.codebook, self.outlier_rows, self.outlier_cols, self.outlier_vals)
            if t is not None
        ]

    def _outliers(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None:
        if not self.n_outliers:
            return None
        at = _codes_at(self.qweight, self.bits, self.outlier_rows, self.outlier_cols)
        return (self.outlier_rows, self.outlier_cols, self.outlier_vals, at)

    def dequantize_weight(self) -> torch.Tensor:
        """The float32 ``(out, in)`` weight (equal to ``to_quantized().dequantize()``)."""
        w = torch.gather(self.codebook.to(torch.float32), 1, _unpack_rows(self.qweight, self.bits, self.in_features))
        if self.n_outliers:
            w[self.outlier_rows.long(), self.outlier_cols.long()] = self.outlier_vals.to(torch.float32)
        return w

    def _native_unsupported(self) -> str | None:
        return lut_kernel.unsupported_reason("codebook", self.bits, device=self.qweight.device)

    def _build_native(self) -> lut_kernel.NativeLayer | None:
        outliers = None
        if self.n_outliers:
            rows, cols, vals, at = self._outliers()
            # The same delta as _outlier_correction: the outlier replaces the codebook value.
            delta = vals.to(torch.float32) - self.codebook.to(torch.float32)[rows.long(), at]
            outliers = (rows, cols, delta)
        return lut_kernel.codebook_layer(self.qweight, self.codebook, self.in_features, self.bits, self.bias, outliers)

    def _sparse_correction(self, y: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        outliers = self._outliers()
        return y if outliers is None else _outlier_correction(y, x2, self.codebook, *outliers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernel = getattr(self, "kernel", "auto")  # a module pickled before the kernel existed
        if kernel == "native" or (kernel == "auto" and not self.cache_weight):
            y = self._native_gemv_fast(x)
            if y is not None:
                return y
            nat = self._native_layer(x, kernel)
            if nat is not None:
                return self._native_forward(nat, x)
        if self.cache_weight:
            bias = None if self.bias is None else self.bias.to(x.dtype)
            return F.linear(x, self._cached_weight(x.dtype, x.device), bias)
        return _codebook_matmul(
            x,
            lambda r0, r1: _unpack_rows(self.qweight[r0:r1], self.bits, self.in_features),
            self.codebook,
            self.in_features,
            outliers=self._outliers(),
            bias=self.bias,
            method=self.method,
            block_rows=self.block_rows,
        )

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bits={self.bits}, "
            f"n_outliers={self.n_outliers}, bias={self.bias is not None}, method={self.method}, "
            f"kernel={getattr(self, 'kernel', 'auto')}"
        )


# --------------------------------------------------------------------------------------------------
# Helpers


def is_quant_linear(module: nn.Module) -> bool:
    """Whether ``module`` is one of lmforge's quantized linear layers."""
    return isinstance(module, (UniformQuantLinear, CodebookQuantLinear))


def _linear_shape(module: nn.Module) -> tuple[int, int] | None:
    """``(in, out)`` of a ``nn.Linear``, GPT-2 ``Conv1D`` (weight stored ``(in, out)``) or quant layer."""
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    if _is_conv1d(module):
        return int(module.weight.shape[0]), int(module.weight.shape[1])
    if is_quant_linear(module):
        return module.in_features, module.out_features
    return None


def weight_bytes(module: nn.Module) -> int:
    """Bytes of the tensors that hold the weight of ``module``'s linear layers (bias excluded).

    A quantized layer counts its packed codes, scales/zeros/``g_idx`` or codebook and outliers; a
    ``nn.Linear``/``Conv1D`` counts its ``weight``. Any other module sums over its linear layers (so
    ``weight_bytes(model)`` is the linear-weight footprint of a whole model).
    """
    if is_quant_linear(module):
        return sum(t.numel() * t.element_size() for t in module._weight_tensors())
    if isinstance(module, nn.Linear) or _is_conv1d(module):
        return module.weight.numel() * module.weight.element_size()
    return sum(
        weight_bytes(sub)
        for name, sub in module.named_modules()
        if name and (is_quant_linear(sub) or isinstance(sub, nn.Linear) or _is_conv1d(sub))
    )


def swap_linear(model: nn.Module, name: str, new_module: nn.Module) -> nn.Module:
    """Replace the linear layer at dotted ``name`` in ``model`` by ``new_module``; return the old one.

    Works for ``nn.Linear``, GPT-2 ``Conv1D`` (which stores its weight as ``(in, out)`` but computes the
    same ``y = x W^T + b``) and an already swapped quantized layer. ``new_module.source_type`` records
    the class of the original layer ("Linear", "Conv1D"), which exporters need. ``new_module`` is used
    as given (its device is the caller's choice).

    Raises:
        UserError: ``name`` names no module, or one that is not a linear layer.
        ValueError: ``new_module`` has a different shape.
    """
    if not name:
        raise UserError("swap_linear needs a module name, got an empty one")
    try:
        old = model.get_submodule(name)
    except AttributeError:
        raise UserError(f"model has no module named '{name}'") from None
    old_shape = _linear_shape(old)
    if old_shape is None:
        raise UserError(f"module '{name}' is a {type(old).__name__}, not a linear layer")
    new_shape = _linear_shape(new_module)
    if new_shape is not None and new_shape != old_shape:
        raise ValueError(
            f"'{name}' is ({old_shape[1]} out, {old_shape[0]} in) but the new module is "
            f"({new_shape[1]} out, {new_shape[0]} in)"
        )
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    if is_quant_linear(new_module):
        source = getattr(old, "source_type", None) if is_quant_linear(old) else type(old).__name__
        new_module.source_type = source
    setattr(parent, child, new_module)
    return old
