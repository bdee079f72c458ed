"""Weight-quantization primitives shared by RTN, GPTQ, AWQ and GANQ: grids, codes, packing, errors.

* Uniform grids follow the original GPTQ ``Quantizer`` (min-max per row of a group, ``maxq = 2^b-1``):
  asymmetric ``scale = (max - min) / maxq, zero = round(-min / scale)`` over a range that always
  contains 0; symmetric ``max = max|w|, scale = 2 max / maxq, zero = (maxq + 1) / 2``. Codes are
  unsigned ``q = clamp(round(w / scale) + zero, 0, maxq)`` and ``w ~ scale * (q - zero)``. The
  symmetric grid is compressed-tensors' signed int grid shifted by ``2^(b-1)`` (``q - 2^(b-1)`` in
  ``[-2^(b-1), 2^(b-1)-1]`` with zero point 0 and the same scale), so export is exact.
* :class:`UniformQuantized` (scales and zeros per group, optional act-order ``g_idx``) and
  :class:`CodebookQuantized` (a codebook of ``2^b`` values per output row, GANQ, plus optional sparse
  full-precision outliers) hold a quantized weight and dequantize it exactly.
* :func:`pack_codes` / :func:`unpack_codes` store ``b``-bit codes in int32 words, ``32 // b`` codes a
  word (8 for 4-bit, 10 for 3-bit, i.e. 3.2 stored bits a weight), little end first.
* :func:`relative_output_error` is ``||W X - W' X|| / ||W X||`` computed from ``H = X^T X`` without
  the activations.

Checked: compressed-tensors has the same grids inside its observers and packers but no tensor-level
API for GPTQ's per-group grid that changes during a sweep, nor for per-row codebooks; these are small.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = [
    "CodebookQuantized",
    "UniformQuantized",
    "dequantize_codes",
    "pack_codes",
    "quantize_codes",
    "fake_quantize_rtn",
    "quantize_rtn",
    "relative_output_error",
    "uniform_qparams",
    "unpack_codes",
]


def uniform_qparams(w: torch.Tensor, bits: int, sym: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row min-max ``(scale, zero)`` of ``w`` (shape ``(rows, cols)``), each of shape ``(rows,)``.

    A row that is all zeros gets the range [-1, 1] (as GPTQ does), so its scale is never zero.
    """
    maxq = 2**bits - 1
    w = w.float()
    zero_ = torch.zeros((), device=w.device)
    xmin = torch.minimum(w.min(dim=1).values, zero_)
    xmax = torch.maximum(w.max(dim=1).values, zero_)
    if sym:
        xmax = torch.maximum(xmin.abs(), xmax)
        xmin = torch.where(xmin < 0, -xmax, xmin)
    empty = (xmin == 0) & (xmax == 0)
    xmin = torch.where(empty, -torch.ones_like(xmin), xmin)
    xmax = torch.where(empty, torch.ones_like(xmax), xmax)
    scale = (xmax - xmin) / maxq
    if sym:
        zero = torch.full_like(scale, (maxq + 1) / 2)
    else:
        zero = torch.round(-xmin / scale)
    return scale, zero


def quantize_codes(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int) -> torch.Tensor:
    """Integer codes ``clamp(round(w / scale) + zero, 0, 2^b - 1)``; ``scale``/``zero`` broadcast."""
    return torch.clamp(torch.round(w / scale) + zero, 0, 2**bits - 1)


def dequantize_codes(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """``scale * (q - zero)``."""
    return scale * (q.float() - zero)


@dataclass
class UniformQuantized:
    """A weight ``(out, in)`` on a uniform grid per (row, group).

    Attributes:
        codes: ``(out, in)`` uint8 codes in the weight's own column order.
        scales: ``(out, n_groups)`` float32.
        zeros: ``(out, n_groups)`` float32 zero points (integer valued).
        bits: code width.
        group_size: columns per group; 0 means one group per row (per-channel).
        sym: whether the grid is symmetric (zero = 2^(b-1)).
        g_idx: ``(in,)`` group of each column when act-order assigned groups in another order,
            else None (column ``j`` is in group ``j // group_size``).
    """

    codes: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    bits: int
    group_size: int
    sym: bool
    g_idx: torch.Tensor | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.codes.shape[0]), int(self.codes.shape[1]))

    def group_index(self) -> torch.Tensor:
        """``(in,)`` long: the group of each column."""
        if self.g_idx is not None:
            return self.g_idx.long()
        n = self.shape[1]
        if self.group_size <= 0:
            return torch.zeros(n, dtype=torch.long)
        return torch.arange(n) // self.group_size

    def dequantize(self) -> torch.Tensor:
        """The ``(out, in)`` float32 weight the codes stand for."""
        g = self.group_index().to(self.codes.device)
        return dequantize_codes(self.codes, self.scales[:, g], self.zeros[:, g])


@dataclass
class CodebookQuantized:
    """A weight ``(out, in)`` as per-row codebooks: ``W'[i, j] = codebook[i, codes[i, j]]``.

    Attributes:
        codes: ``(out, in)`` uint8 indices into the row's codebook.
        codebook: ``(out, 2^bits)`` float32.
        bits: code width.
        outlier_rows, outlier_cols, outlier_vals: optional sparse full-precision entries that replace
            the codebook value at their positions (GANQ's outlier split); empty when unused.
    """

    codes: torch.Tensor
    codebook: torch.Tensor
    bits: int
    outlier_rows: torch.Tensor | None = None
    outlier_cols: torch.Tensor | None = None
    outlier_vals: torch.Tensor | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.codes.shape[0]), int(self.codes.shape[1]))

    @property
    def n_outliers(self) -> int:
        return 0 if self.outlier_vals is None else int(self.outlier_vals.numel())

    def dequantize(self) -> torch.Tensor:
        """The ``(out, in)`` float32 weight: the gather ``codebook[i, codes[i, j]]`` plus outliers."""
        w = torch.gather(self.codebook.float(), 1, self.codes.long())
        if self.n_outliers:
            w[self.outlier_rows.long(), self.outlier_cols.long()] = self.outlier_vals.float()
        return w


QParams = Callable[[torch.Tensor, int, bool], tuple[torch.Tensor, torch.Tensor]]


def quantize_rtn(
    w: torch.Tensor, bits: int, group_size: int = 0, sym: bool = False, qparams: QParams = uniform_qparams
) -> UniformQuantized:
    """Round-to-nearest on a min-max grid per row and group (the baseline every paper quotes).

    Args:
        w: ``(out, in)`` weight.
        bits: 2..8.
        group_size: columns per group; 0 (or >= in) for per-channel. A last group narrower than
            ``group_size`` (``in`` not a multiple) gets its own grid.
        sym: symmetric grid.
        qparams: ``(rows, bits, sym) -> (scale, zero)`` per row of a ``(rows, cols)`` block; the default
            is GPTQ's grid (:func:`uniform_qparams`), a method may plug in its own (AWQ does).
    """
    w = w.detach().float()
    out_f, in_f = w.shape
    gs = group_size if 0 < group_size < in_f else 0
    width = gs or in_f
    n_groups = math.ceil(in_f / width)
    full = (in_f // width) * width  # columns in whole groups, done in one batched call
    scales = torch.empty(out_f, n_groups, device=w.device)
    zeros = torch.empty(out_f, n_groups, device=w.device)
    codes = torch.empty(out_f, in_f, dtype=torch.uint8, device=w.device)
    if full:
        k = full // width
        rows = w[:, :full].reshape(out_f * k, width)
        s, z = qparams(rows, bits, sym)
        codes[:, :full] = quantize_codes(rows, s[:, None], z[:, None], bits).to(torch.uint8).reshape(out_f, full)
        scales[:, :k], zeros[:, :k] = s.reshape(out_f, k), z.reshape(out_f, k)
    if full < in_f:
        s, z = qparams(w[:, full:], bits, sym)
        scales[:, -1], zeros[:, -1] = s, z
        codes[:, full:] = quantize_codes(w[:, full:], s[:, None], z[:, None], bits).to(torch.uint8)
    return UniformQuantized(codes=codes, scales=scales, zeros=zeros, bits=bits, group_size=gs, sym=sym)


def fake_quantize_rtn(
    w: torch.Tensor, bits: int, group_size: int = 0, sym: bool = False, qparams: QParams = uniform_qparams
) -> torch.Tensor:
    """``quantize_rtn(w, ...).dequantize()`` without building the codes (for search loops)."""
    w = w.detach().float()
    out_f, in_f = w.shape
    width = group_size if 0 < group_size < in_f else in_f
    full = (in_f // width) * width
    out = torch.empty_like(w)
    for lo, hi, k in ((0, full, full // width), (full, in_f, 1)):
        if hi <= lo:
            continue
        rows = w[:, lo:hi].reshape(out_f * k, -1)
        s, z = qparams(rows, bits, sym)
        q = quantize_codes(rows, s[:, None], z[:, None], bits)
        out[:, lo:hi] = dequantize_codes(q, s[:, None], z[:, None]).reshape(out_f, hi - lo)
    return out


# --------------------------------------------------------------------------------------------------
# Packing


def codes_per_word(bits: int) -> int:
    """How many ``bits``-wide codes fit in one int32 word."""
    if not 1 <= bits <= 8:
        raise ValueError(f"bits must be in 1..8, got {bits}")
    return 32 // bits


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack ``(rows, n)`` integer codes in ``[0, 2^bits)`` into ``(rows, ceil(n / (32 // bits)))`` int32.

    Code ``k`` of a word sits at bit ``k * bits``. The last word of a row is zero-padded.
    """
    per = codes_per_word(bits)
    rows, n = codes.shape
    n_words = math.ceil(n / per)
    padded = torch.zeros(rows, n_words * per, dtype=torch.int64)
    padded[:, :n] = codes.to(torch.int64)
    if int(padded.max()) >= 2**bits or int(padded.min()) < 0:
        raise ValueError(f"codes do not fit in {bits} bits")
    shifts = torch.arange(per, dtype=torch.int64) * bits
    words = (padded.view(rows, n_words, per) << shifts).sum(dim=-1)
    # Values above 2^31 wrap to negative int32, which keeps every bit.
    words = torch.where(words >= 2**31, words - 2**32, words)
    return words.to(torch.int32)


def unpack_codes(words: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """Inverse of :func:`pack_codes`: ``(rows, n)`` uint8 codes."""
    per = codes_per_word(bits)
    shifts = torch.arange(per, dtype=torch.int32, device=words.device) * bits
    mask = (1 << bits) - 1
    codes = (words.unsqueeze(-1) >> shifts) & mask
    return codes.reshape(words.shape[0], -1)[:, :n].to(torch.uint8)


# --------------------------------------------------------------------------------------------------
# Errors


def relative_output_error(w: torch.Tensor, w_hat: torch.Tensor, H: torch.Tensor) -> float:
    """``||W X^T - W' X^T||_F / ||W X^T||_F`` from ``H`` proportional to ``X^T X`` (rows of X = tokens).

    ``||A X^T||_F^2 = tr(A X^T X A^T)``, so any positive multiple of ``X^T X`` (such as the GPTQ
    Hessian ``2/N X^T X``) gives the same ratio.
    """
    # float32 products (an O(m n^2) cost like the quantizer's own), float64 sums.
    Hf = H.float()
    w = w.float()
    d = w - w_hat.float()
    num = ((d @ Hf) * d).double().sum()
    den = ((w @ Hf) * w).double().sum()
    if den <= 0:
        return 0.0 if num <= 0 else float("inf")
    return float(torch.sqrt(torch.clamp(num, min=0) / den))


# --------------------------------------------------------------------------------------------------
# Argument checks shared by every quantizer's config


def check_bits(bits: int, lo: int = 2, hi: int = 8) -> None:
    """One clear line for a bit width outside ``lo..hi``."""
    from lmforge.common.errors import UserError

    if isinstance(bits, bool) or not isinstance(bits, int) or not lo <= bits <= hi:
        raise UserError(f"bits must be an integer in {lo}..{hi}, got {bits!r}")


def check_group_size(group_size: int) -> None:
    """Group size: 0 (or -1, the GPTQ spelling) for per-channel, else a positive column count."""
    from lmforge.common.errors import UserError

    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < -1:
        raise UserError(f"group_size must be a positive integer, or 0 / -1 for per-channel, got {group_size!r}")


def check_damp(damp: float) -> None:
    from lmforge.common.errors import UserError

    if not 0 <= float(damp) < 1:
        raise UserError(f"damp (fraction of the mean Hessian diagonal) must be in [0, 1), got {damp!r}")


def damped_inverse_cholesky(H: torch.Tensor, damp: float) -> torch.Tensor:
    """Upper Cholesky factor ``U`` of ``(H + damp * mean(diag H) * I)^-1`` in float64.

    GPTQ and SparseGPT read the rows of ``U`` (``U[i, i:]`` is row i of the inverse Hessian of the
    not-yet-processed columns, scaled by ``1 / U[i, i]``). If the damped matrix is still not positive
    definite (rank-deficient calibration data in float64 round-off), the dampening is raised tenfold up
    to four times before giving up with a clear error.
    """
    H = H.double().clone()
    mean_diag = float(torch.diagonal(H).mean())
    if mean_diag <= 0:
        mean_diag = 1.0
    lam = damp * mean_diag
    for _ in range(5):
        Hd = H + lam * torch.eye(H.shape[0], dtype=H.dtype, device=H.device)
        L, info = torch.linalg.cholesky_ex(Hd)
        if int(info) == 0:
            Hinv = torch.cholesky_inverse(L)
            U, info2 = torch.linalg.cholesky_ex(Hinv, upper=True)
            if int(info2) == 0:
                return U
        lam = max(lam * 10, 1e-6 * mean_diag)
    raise RuntimeError("the calibration Hessian is not positive definite even after dampening")


@dataclass
class HessianFactor:
    """What GPTQ and SparseGPT need from ``H``, computed once per Hessian (q/k/v share one).

    Attributes:
        U: upper Cholesky factor of the damped ``H^-1`` in sweep order, float32.
        dead: ``(in,)`` bool, inputs that were always 0 (their weights are set to 0).
        perm: act-order permutation of the columns (decreasing ``diag(H)``), or None.
    """

    U: torch.Tensor
    dead: torch.Tensor
    perm: torch.Tensor | None = None


def factor_hessian(H: torch.Tensor, damp: float, act_order: bool = False) -> HessianFactor:
    """Dead-column handling, optional act-order permutation and the damped inverse Cholesky factor."""
    H = H.detach().double().clone()
    dead = torch.diagonal(H) == 0
    H[dead, dead] = 1.0
    perm = None
    if act_order:
        perm = torch.argsort(torch.diagonal(H), descending=True)
        H = H[perm][:, perm]
    return HessianFactor(U=damped_inverse_cholesky(H, damp).float(), dead=dead, perm=perm)


class FactorCache:
    """Per-layer memo of :func:`factor_hessian` keyed by the Hessian tensor object: modules that share
    one accumulator (q/k/v, gate/up) share one factorization. Holds its tensors, so ids stay unique."""

    def __init__(self) -> None:
        self._items: list[tuple[torch.Tensor, float, bool, HessianFactor]] = []

    def get(self, H: torch.Tensor, damp: float, act_order: bool = False) -> HessianFactor:
        for h, d, a, f in self._items:
            if h is H and d == damp and a == act_order:
                return f
        f = factor_hessian(H, damp, act_order)
        # Only the last few Hessians are ever reused (the modules of one decoder layer).
        self._items = self._items[-3:] + [(H, damp, act_order, f)]
        return f
