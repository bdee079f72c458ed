"""GANQ core math: per-row non-uniform codebooks fitted to the layer-wise output error.

Paper: Zhao & Yuan, "GANQ: GPU-Adaptive Non-Uniform Quantization for Large Language Models",
ICML 2025, https://arxiv.org/abs/2501.12956 (no official code).

How it works. A weight ``W`` (m x n, rows = output channels) is replaced by ``W'[i, j] = T[i, Q[i, j]]``
with one codebook ``T[i]`` of ``2^N`` floats per row and ``N``-bit codes ``Q``. With ``H``
proportional to ``X^T X`` (rows of ``X`` are calibration tokens) the layer objective is

    ||(W - W') X^T||_F^2 = tr((W - W') H (W - W')^T) = ||(W - W') L||_F^2,   H = L L^T,

and it splits into independent rows. Starting from an initial codebook ``T^0`` (per-row min-max
uniform grid by default, or 1-D k-means) GANQ alternates K times and returns the last iterate:

* S-step (codes, T fixed): ``L`` is lower triangular, so ``||r L||^2 = sum_j (sum_{u >= j} r_u L[u, j])^2``
  with ``r = W_i - W'_i``; the j-th term involves only columns ``u >= j``. Going j = n-1 ... 0, each
  code is chosen to zero the j-th term as well as the codebook allows, given the later columns:

      Q[i, j] = argmin_s | W[i, j] + (1 / L[j, j]) * sum_{u > j} r[i, u] L[u, j] - T[i, s] |

  (GPTQ's error feedback run back to front, i.e. Babai's nearest plane on the lattice of ``L^T``).
  It is greedy, not exact, so the objective may rise in an S-step.
* T-step (codes fixed): with ``S_i`` the (2^N x n) one-hot matrix of row i's codes, the objective of
  row i is a quadratic in ``T_i``, minimised by ``T_i = W_i H S_i^T (S_i H S_i^T)^+``; this step never
  raises the objective.

Everything here is batched over the rows (one Python loop over columns in the S-step, none over rows)
and runs in float64 on the device of ``W``. The optional outlier split keeps the largest and smallest
values of each row exactly as sparse full-precision entries (the paper's 0.5 % variant).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from lmforge.common.errors import UserError
from lmforge.common.quant import CodebookQuantized
from lmforge.methods.ganq.config import GANQConfig

__all__ = [
    "GANQHistory",
    "ganq_quantize",
    "init_kmeans",
    "init_uniform",
    "layer_objective",
    "nearest_codes",
    "prepare_hessian",
    "s_step",
    "select_outliers",
    "t_step",
]

# Elements of the (n, rows, 2^N) one-hot and product tensors the T-step holds at once (8 MiB in float64;
# measured on SmolLM2 layers, 2^20 ran 1.9x faster than 2^24, whose tensors fall out of cache).
_T_STEP_CHUNK_ELEMS = 2**20
# How many times the dampening is multiplied by 10 when the Cholesky factorisation fails.
_MAX_DAMP_RETRIES = 8


@dataclass
class GANQHistory:
    """What :func:`ganq_quantize` did, objectives on the fitted Hessian (dampened, dead columns fixed).

    Attributes:
        init_objective: objective of the initial codebook with nearest-value codes (the first
            initialisation's, with ``init="both"``: uniform).
        s_objectives: objective after each S-step (with the previous T), first initialisation.
        t_objectives: objective after each T-step, first initialisation.
        best_iter: the last iterate from which some row's returned pair comes (0: the initial
            codebook, k: the pair after the k-th T-step); ``iters`` with ``select="last"``.
        final_objective: objective of the returned (float32) weight.
        damp_used: the relative dampening that made ``H`` factorisable (``cfg.damp`` unless raised).
        dead_columns: number of columns with ``H[j, j] == 0``.
        seconds: wall time of the whole call.
    """

    init_objective: float = float("nan")
    s_objectives: list[float] = field(default_factory=list)
    t_objectives: list[float] = field(default_factory=list)
    best_iter: int = 0
    final_objective: float = float("nan")
    damp_used: float = 0.0
    dead_columns: int = 0
    seconds: float = 0.0


# --------------------------------------------------------------------------------------------------
# Objective and Hessian


def layer_objective(W: torch.Tensor, W_hat: torch.Tensor, H: torch.Tensor) -> float:
    """``tr((W - W_hat) H (W - W_hat)^T)`` in float64, i.e. ``||(W - W_hat) X^T||_F^2`` for ``H = X^T X``."""
    D = W.double() - W_hat.double()
    return float(((D @ H.double().to(D.device)) * D).sum())


def prepare_hessian(
    H: torch.Tensor, damp: float, always: bool = False
) -> tuple[torch.Tensor, torch.Tensor, float, int]:
    """The Hessian GANQ fits, its lower Cholesky factor, the dampening used and the dead-column count.

    Dead columns (``H[j, j] == 0``: input feature j was always 0 in calibration) get ``H[j, j]`` set
    to the mean of the live diagonal. As the paper (Remark 3.1) does, ``H`` is factorised as it is and
    ``damp * mean(diag H)`` is added to the diagonal only if that fails (``always``: added first, as
    GPTQ does); if the factorisation still fails, the dampening is raised tenfold (from at least 1e-6)
    until it works.

    Args:
        H: ``(n, n)`` symmetric positive semi-definite matrix (any positive multiple of ``X^T X``).
        damp: relative dampening, >= 0.
        always: add ``damp`` even when ``H`` is positive definite.

    Returns:
        ``(H_fit, L, damp_used, n_dead)`` with ``H_fit = L L^T`` float64.

    Raises:
        UserError: if ``H`` has non-finite entries or cannot be made positive definite.
    """
    H = H.detach().double().clone()
    if not torch.isfinite(H).all():
        raise UserError("ganq: the Hessian has non-finite entries (NaN or inf in the calibration inputs?)")
    H = (H + H.T) / 2
    diag = H.diagonal()
    dead = diag == 0
    n_dead = int(dead.sum())
    live = diag[~dead]
    live_mean = live.mean() if live.numel() else torch.ones((), dtype=H.dtype, device=H.device)
    # NOTE: GPTQ sets H[j, j] = 1 and W[:, j] = 0 for a dead column. GANQ's codebook is shared by the
    # whole row, so a unit weight would pull the codebook toward the dead entries by an amount that
    # depends on H's arbitrary scale, and zeroing W would change the layer for inputs calibration never
    # saw. We keep W and give the column the mean live diagonal: it is then quantized like an average
    # column, with no effect on the calibration output error (its true H row is 0).
    idx = dead.nonzero().squeeze(1)
    H[idx, idx] = live_mean
    scale = float(H.diagonal().mean())
    eye = torch.eye(H.shape[0], dtype=H.dtype, device=H.device)
    if not always:
        L, info = torch.linalg.cholesky_ex(H)
        if int(info) == 0:
            return H, L, 0.0, n_dead
    d = float(damp)
    for _ in range(_MAX_DAMP_RETRIES + 1):
        H_fit = H + (d * scale) * eye
        L, info = torch.linalg.cholesky_ex(H_fit)
        if int(info) == 0:
            return H_fit, L, d, n_dead
        # NOTE: the paper gives no lambda; where damp is not enough we escalate it, so nearly singular
        # real Hessians still factorise (GPTQ would fail here).
        d = max(d, 1e-6) * 10
    raise UserError(
        f"ganq: the Hessian is not positive definite even with dampening {d / 10:g} x mean(diag H)"
    )


# --------------------------------------------------------------------------------------------------
# Outliers and initial codebooks


def select_outliers(W: torch.Tensor, frac: float, full_rows: int = 0) -> tuple[torch.Tensor | None, int, int]:
    """Positions of the sparse full-precision outliers of each row, and of the full-precision rows.

    ``k = round(frac * n)`` entries a row: the ``ceil(k / 2)`` largest and ``floor(k / 2)`` smallest
    values. ``full_rows`` whole rows, those of largest variance, are kept too (as the port of the
    official code ranks them; the paper does not say how it picks its 10 rows).

    Returns:
        ``(mask, k_top, k_bottom)``; ``mask`` is ``(m, n)`` bool, or None when nothing is kept.
    """
    m, n = W.shape
    k = min(int(round(frac * n)), n - 1)
    k_top, k_bot = (k + 1) // 2, k // 2
    if k <= 0 and full_rows <= 0:
        return None, 0, 0
    mask = torch.zeros(m, n, dtype=torch.bool, device=W.device)
    if k > 0:
        order = W.argsort(dim=1)
        picked = torch.cat([order[:, :k_bot], order[:, n - k_top :]], dim=1)
        mask.scatter_(1, picked, True)
    if full_rows > 0:
        # NOTE: the port also rescales the per-row outlier ratio when full rows are kept; the paper
        # does not, and neither do we: the other rows keep round(frac * n) outliers each.
        top = W.double().var(dim=1, unbiased=False).topk(min(full_rows, m)).indices
        mask[top] = True
    return mask, k_top, k_bot


def init_uniform(values: torch.Tensor, levels: int) -> torch.Tensor:
    """``levels`` evenly spaced values from each row's min to its max; ``(m, levels)`` float64."""
    v = values.double()
    lo, hi = v.min(dim=1, keepdim=True).values, v.max(dim=1, keepdim=True).values
    steps = torch.arange(levels, dtype=torch.float64, device=v.device) / (levels - 1)
    return lo + (hi - lo) * steps


def init_kmeans(values: torch.Tensor, levels: int, iters: int) -> torch.Tensor:
    """1-D k-means of each row (Lloyd's algorithm, batched), started from the row's quantiles.

    Args:
        values: ``(m, p)`` values to cluster, one problem per row.
        levels: number of centroids.
        iters: Lloyd iterations (it stops early once no centroid moves).

    Returns:
        ``(m, levels)`` float64 centroids, sorted ascending per row. An empty cluster keeps its centroid.
    """
    x = values.double().sort(dim=1).values.contiguous()
    m, p = x.shape
    pos = ((torch.arange(levels, dtype=torch.float64, device=x.device) + 0.5) / levels * p).long()
    C = x[:, pos.clamp(max=p - 1)].contiguous()
    ones = torch.ones_like(x)
    for _ in range(iters):
        # In 1-D the nearest centroid is found by the midpoints between sorted centroids.
        mids = ((C[:, 1:] + C[:, :-1]) / 2).contiguous()
        a = torch.searchsorted(mids, x)
        sums = torch.zeros_like(C).scatter_add_(1, a, x)
        cnt = torch.zeros_like(C).scatter_add_(1, a, ones)
        new = torch.where(cnt > 0, sums / cnt.clamp(min=1), C).sort(dim=1).values.contiguous()
        if torch.equal(new, C):
            break
        C = new
    return C


def nearest_codes(W: torch.Tensor, T: torch.Tensor) -> torch.Tensor:
    """``(m, n)`` long: the index of the codebook entry of row i nearest to ``W[i, j]`` (plain rounding)."""
    Ts, perm = T.double().sort(dim=1)
    mids = ((Ts[:, 1:] + Ts[:, :-1]) / 2).contiguous()
    pos = torch.searchsorted(mids, W.double().contiguous())
    return perm.gather(1, pos)


# --------------------------------------------------------------------------------------------------
# The two steps


def s_step(
    W: torch.Tensor,
    L: torch.Tensor,
    T: torch.Tensor,
    *,
    outlier_mask: torch.Tensor | None = None,
    block_size: int = 128,
) -> torch.Tensor:
    """Codes for fixed codebooks by back-substitution over the columns, last to first.

    ``corr[:, j]`` accumulates ``sum_{u > j} r[:, u] L[u, j]`` (``r = W - W'``); column j takes the code
    nearest to ``W[:, j] + corr[:, j] / L[j, j]`` and then feeds its residual into the earlier columns
    through row j of ``L`` (``L[j, :j]``). Within a block of ``block_size`` columns the feedback is
    applied column by column; to the columns before the block it is applied once per block by a
    matrix product (GPTQ's lazy batch update), which gives the same sums.

    Args:
        W: ``(m, n)`` weight to approximate (outlier entries zeroed or not, they are ignored).
        L: ``(n, n)`` lower Cholesky factor of the Hessian, ``H = L L^T``.
        T: ``(m, K)`` codebooks.
        outlier_mask: ``(m, n)`` bool, True where the entry is kept exactly (its residual is 0).
        block_size: columns per lazy-update block.

    Returns:
        ``(m, n)`` long codes.
    """
    W = W.double()
    L = L.double().to(W.device)
    T = T.double().to(W.device)
    m, n = W.shape
    # Column-major working copies (column j of W is the contiguous row j of WT), so that the
    # in-block feedback is a rank-1 update of a contiguous block of rows (BLAS ger), not of a strided
    # slice of columns (measured 3x slower as a whole on a 576 x 1536 layer).
    WT = W.T.contiguous()
    maskT = None if outlier_mask is None else outlier_mask.T.contiguous()
    codesT = torch.empty(n, m, dtype=torch.long, device=W.device)
    RT = torch.zeros(n, m, dtype=torch.float64, device=W.device)
    corrT = torch.zeros(n, m, dtype=torch.float64, device=W.device)
    diag = L.diagonal()
    for b1 in range(n, 0, -block_size):
        b0 = max(0, b1 - block_size)
        for j in range(b1 - 1, b0 - 1, -1):
            target = WT[j] + corrT[j] / diag[j]
            q = (target[:, None] - T).abs().argmin(dim=1)
            codesT[j] = q
            r = WT[j] - T.gather(1, q[:, None]).squeeze(1)
            if maskT is not None:
                r = r.masked_fill(maskT[j], 0.0)
            RT[j] = r
            if j > b0:
                # Column j's residual reaches column j' < j through L[j, j'] (row j of L), i.e. the
                # next column j-1 needs L[j:, j-1], column j-1 of L, not column j.
                corrT[b0:j].addr_(L[j, b0:j], r)
        if b0 > 0:
            corrT[:b0].addmm_(L[b0:b1, :b0].T, RT[b0:b1])
    return codesT.T.contiguous()


def t_step(
    W: torch.Tensor,
    H: torch.Tensor,
    codes: torch.Tensor,
    T_old: torch.Tensor,
    *,
    outlier_mask: torch.Tensor | None = None,
    gemm_dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Optimal codebooks for fixed codes: ``T_i = W_i H S_i^T (S_i H S_i^T)^+`` for every row at once.

    ``H S_i^T`` is one GEMM of ``H`` with the one-hot ``S_i^T`` of a chunk of rows; ``A_i = S_i H S_i^T``
    (K x K) and ``b_i = W_i H S_i^T`` are then sums of its rows (resp. of ``W H``'s entries) by code; ``A_i t = b_i`` is solved by Cholesky in float64 (pseudo-inverse for any row where that
    fails). Outlier entries are exact, so they are left out of ``S_i`` and zeroed in ``W_i``: the row's
    objective is then ``||(W_i - O_i - T_i S_i) L||^2`` with ``O_i`` the outliers.

    Args:
        W: ``(m, n)`` weight.
        H: ``(n, n)`` positive definite Hessian (the dampened one the S-step factorised).
        codes: ``(m, n)`` integer codes in ``[0, K)``.
        T_old: ``(m, K)`` current codebooks; an entry no (non-outlier) weight uses keeps its value.
        outlier_mask: ``(m, n)`` bool, True at the outliers.
        gemm_dtype: dtype of the ``H S_i^T`` product, the step's cost (float32 runs it 2.3x faster
            on this CPU; the K x K systems are still summed and solved in float64).

    Returns:
        ``(m, K)`` float64 codebooks.
    """
    W = W.double()
    if outlier_mask is not None:
        W = W.masked_fill(outlier_mask, 0.0)
    H = H.double().to(W.device)
    T_old = T_old.double().to(W.device)
    m, n = W.shape
    K = T_old.shape[1]
    WH = W @ H
    Hg = H.to(gemm_dtype)
    out = torch.empty(m, K, dtype=torch.float64, device=W.device)
    chunk = max(1, _T_STEP_CHUNK_ELEMS // (n * K))
    # Bucket K collects the outliers, which no codebook entry stands for; it is dropped below.
    Kx = K + (outlier_mask is not None)
    for r0 in range(0, m, chunk):
        rows = slice(r0, min(m, r0 + chunk))
        q = codes[rows].long()
        if outlier_mask is not None:
            q = q.masked_fill(outlier_mask[rows], K)
        c = q.shape[0]
        qT = q.T.contiguous()  # (n, c)
        G = torch.nn.functional.one_hot(qT, Kx)[..., :K].to(gemm_dtype)  # G[j, i] = column j of S_i
        # NOTE: forming H S_i^T as one GEMM with the one-hot costs O(m n^2 2^N) a T-step, 2^N times the
        # O(m n^2) the paper quotes (a scatter of H's entries by code pair); the GEMM is much faster
        # in practice for N <= 4 and needs no (n, n) index tensor per row.
        P = (Hg @ G.reshape(n, c * K)).reshape(n * c, K).double()  # P[(j, i), b] = (H S_i^T)[j, b]
        # A_i = S_i (H S_i^T): row a of A_i sums the rows j of H S_i^T whose code is a; b_i likewise.
        slot = (torch.arange(c, device=W.device) * Kx)[None, :] + qT
        A = torch.zeros(c * Kx, K, dtype=torch.float64, device=W.device).index_add_(0, slot.reshape(-1), P)
        A = A.reshape(c, Kx, K)[:, :K, :]
        b = torch.zeros(c, Kx, dtype=torch.float64, device=W.device).scatter_add_(1, q, WH[rows])[:, :K]
        counts = torch.zeros(c, Kx, dtype=torch.float64, device=W.device).scatter_add_(1, q, torch.ones_like(WH[rows]))
        A = (A + A.transpose(1, 2)) / 2
        used = counts[:, :K] > 0
        # NOTE: the paper's pseudo-inverse would give an unused entry the value 0, a level nobody
        # asked for. An unused entry's row and column of A are 0, so setting A[a, a] = 1 and
        # b[a] = T_old[a] decouples it and keeps its old value (it may be picked again next S-step);
        # the used block is unchanged and positive definite when H is.
        A = A + torch.diag_embed((~used).double())
        b = torch.where(used, b, T_old[rows])
        Lc, info = torch.linalg.cholesky_ex(A)
        sol = torch.cholesky_solve(b.unsqueeze(-1), Lc).squeeze(-1)
        bad = info != 0
        if bool(bad.any()):
            sol[bad] = (torch.linalg.pinv(A[bad], hermitian=True) @ b[bad].unsqueeze(-1)).squeeze(-1)
        out[rows] = sol
    return out


# --------------------------------------------------------------------------------------------------
# Driver


def _dequant(
    T: torch.Tensor, codes: torch.Tensor, W: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """``T[i, codes[i, j]]``, with the outlier entries taken from ``W``."""
    W_hat = T.gather(1, codes)
    if mask is not None:
        W_hat = torch.where(mask, W.to(W_hat.dtype), W_hat)
    return W_hat


def ganq_quantize(
    W: torch.Tensor,
    H: torch.Tensor,
    cfg: GANQConfig | None = None,
    *,
    return_history: bool = False,
) -> CodebookQuantized | tuple[CodebookQuantized, GANQHistory]:
    """Quantize one linear weight to per-row ``2^bits``-entry codebooks by GANQ.

    Args:
        W: ``(m, n)`` weight (out, in), any float dtype.
        H: ``(n, n)`` input Hessian, any positive multiple of ``X^T X`` (rows of ``X`` = tokens), e.g. a
            :class:`lmforge.common.calibration.HessianAccumulator`'s ``hessian``.
        cfg: settings; defaults when None.
        return_history: also return a :class:`GANQHistory`.

    Returns:
        The :class:`CodebookQuantized` weight (codes uint8 ``(m, n)``, codebook float32 ``(m, 2^bits)``,
        outliers as sparse ``(row, col, value)`` triples when ``cfg.outlier_frac > 0``), and the
        history when asked for.

    Raises:
        UserError: for mismatched shapes or a Hessian that cannot be factorised.
    """
    cfg = cfg or GANQConfig()
    t0 = time.perf_counter()
    if W.dim() != 2 or H.dim() != 2 or H.shape[0] != H.shape[1] or H.shape[0] != W.shape[1]:
        raise UserError(f"ganq: need W (m, n) and H (n, n), got W {tuple(W.shape)} and H {tuple(H.shape)}")
    W64 = W.detach().double()
    m, n = W64.shape
    K = cfg.levels
    H_fit, L, damp_used, n_dead = prepare_hessian(H.to(W64.device), cfg.damp, always=cfg.damp_when == "always")

    # NOTE: the paper keeps the outliers in a sparse FP16 matrix and quantizes the rest (as SqueezeLLM
    # does). We treat an outlier as exact: its residual is 0 in the S-step, it is left out of the
    # T-step and of the initial codebook's range, and W's value is stored for it (not a zero quantized
    # in the dense part). A full-precision row is a row of outliers.
    mask, k_top, k_bot = select_outliers(W64, cfg.outlier_frac, cfg.full_rows)
    W_fit = W64 if mask is None else W64.masked_fill(mask, 0.0)
    inliers = W64.sort(dim=1).values[:, k_bot : n - k_top]
    inits = ("uniform", "kmeans") if cfg.init == "both" else (cfg.init,)
    gemm_dtype = torch.float32 if cfg.t_step_dtype == "float32" else torch.float64

    def row_objectives(T_: torch.Tensor, codes_: torch.Tensor) -> torch.Tensor:
        D = W64 - _dequant(T_, codes_, W64, mask)
        return ((D @ H_fit) * D).sum(dim=1)

    hist = GANQHistory(damp_used=damp_used, dead_columns=n_dead)
    best_obj = best_codes = best_T = None
    for which in inits:
        T = init_uniform(inliers, K) if which == "uniform" else init_kmeans(inliers, K, cfg.kmeans_iters)
        codes = nearest_codes(W64, T)
        # The per-iteration objectives cost two (m, n) x (n, n) products an iteration: only on request.
        first = which == inits[0] and return_history
        candidates = [(0, codes, T)]
        if first:
            hist.init_objective = float(row_objectives(T, codes).sum())
        for k in range(1, cfg.iters + 1):
            codes = s_step(W_fit, L, T, outlier_mask=mask, block_size=cfg.block_size)
            if first:
                hist.s_objectives.append(float(row_objectives(T, codes).sum()))
            T = t_step(W_fit, H_fit, codes, T, outlier_mask=mask, gemm_dtype=gemm_dtype)
            if first:
                hist.t_objectives.append(float(row_objectives(T, codes).sum()))
            if cfg.select == "best":
                candidates.append((k, codes, T))
        if cfg.select == "last":
            # The paper's Algorithm 1 returns (T^K, Q^K); with two starts (init=both) each row takes
            # the better of the two last iterates.
            candidates = [(cfg.iters, codes, T)]
        # select=best: the S-step is greedy, so the objective is not monotone; since the objective is
        # a sum of independent per-row terms, every row keeps the best (codes, codebook) pair seen
        # over the iterations (and over both starts with init="both"), the initial one included.
        for k, codes_k, T_k in candidates:
            obj = row_objectives(T_k, codes_k)
            if best_obj is None:
                best_obj, best_codes, best_T = obj, codes_k.clone(), T_k.clone()
                hist.best_iter = k
                continue
            better = obj < best_obj
            if bool(better.any()):
                hist.best_iter = k
                best_obj = torch.where(better, obj, best_obj)
                best_codes[better] = codes_k[better]
                best_T[better] = T_k[better]
    codes, T = best_codes, best_T

    result = CodebookQuantized(codes=codes.to(torch.uint8), codebook=T.float(), bits=cfg.bits)
    if mask is not None:
        rows, cols = mask.nonzero(as_tuple=True)
        result.outlier_rows = rows.to(torch.int32)
        result.outlier_cols = cols.to(torch.int32)
        result.outlier_vals = W.detach()[rows, cols].float()
    if return_history:
        hist.final_objective = layer_objective(W64, result.dequantize(), H_fit)
    hist.seconds = time.perf_counter() - t0
    return (result, hist) if return_history else result
