"""Settings of GANQ (Zhao & Yuan, ICML 2025), the per-row non-uniform codebook quantizer.

See :mod:`lmforge.methods.ganq.core` for the algorithm these settings drive.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lmforge.common.errors import UserError

__all__ = ["DAMP_CHOICES", "GANQConfig", "INIT_CHOICES", "SELECT_CHOICES"]

INIT_CHOICES = ("uniform", "kmeans", "both")
SELECT_CHOICES = ("last", "best")
DAMP_CHOICES = ("needed", "always")


@dataclass
class GANQConfig:
    """Settings of one GANQ layer quantization.

    Attributes:
        bits: code width N; each output row gets a codebook of ``2^N`` float values. 2..8 (codes are
            stored as uint8).
        iters: number K of alternating S-step / T-step iterations (the paper uses K = 10). 0 keeps the
            initial codebook with nearest-value codes.
        damp: relative dampening ``damp * mean(diag H)`` added to the diagonal of ``H`` (both steps then
            minimise the dampened objective); when, is ``damp_when``'s choice.
        damp_when: ``"needed"`` (the paper, Remark 3.1: lambda*I is added only if ``H`` is not positive
            definite; then ``damp``, raised tenfold until the Cholesky factorisation succeeds) or
            ``"always"`` (GPTQ's habit: ``damp`` is always added).
        init: initial codebook T^0 of each row: ``"uniform"`` (2^N evenly spaced levels between the
            row's min and max), ``"kmeans"`` (1-D k-means of the row's values, Lloyd iterations
            started from quantiles), or ``"both"``: run the K iterations from each and keep, row by
            row, the better result (rows are independent terms of the objective; twice the time).
        select: ``"last"`` returns the K-th iterate ``(T^K, Q^K)``, as the paper's Algorithm 1 does;
            ``"best"`` keeps, row by row, the pair with the lowest objective seen over the iterations
            (the initial codebook included) and over both starts with ``init="both"``.
        outlier_frac: fraction of each row kept as sparse full-precision outliers (the largest half and
            the smallest half of the values, ``round(outlier_frac * n)`` entries a row in all); 0 turns
            the outlier split off. The paper's outlier variant keeps 0.5 % a row, i.e. 0.005.
        full_rows: number of whole rows of each linear kept in full precision, the rows of largest
            variance (the paper keeps 10 for LLaMA-1/2-7B, beside 0.5 % outliers, to compare with
            SqueezeLLM); 0 keeps none.
        t_step_dtype: ``"float32"`` or ``"float64"``: dtype of the T-step's ``H S_i^T`` product, its
            cost (everything else runs in float64). float32 is 2.3x faster on a 2-core AVX2 CPU and
            changes a codebook by about 1e-7 of its largest entry (a test bounds it at 1e-6).
        kmeans_iters: Lloyd iterations of the k-means initialisation.
        block_size: columns per block of the S-step's lazy error-feedback update (speed only; the
            result does not depend on it up to rounding).
    """

    bits: int = 4
    iters: int = 10
    damp: float = 0.01
    damp_when: str = "needed"
    # NOTE: the paper does not say how T^0 is chosen (Algorithm 1 takes it as an input; arXiv v2 read,
    # the official repository could not be fetched here). The default is the simplest reading, each
    # row's min-max uniform grid (RTN's levels); a third-party port (PrunaAI/pruna) starts from a
    # piecewise-uniform (4-bit) or quantile (3-bit) grid of median/IQR-normalised rows, not built here.
    # Measured (K = 10, damp 0.01, select=best, one CPU thread), mean final relative output error
    # ||(W - W')X^T|| / ||W X^T||, init = uniform vs kmeans:
    #   correlated random layers (m=128, n=512, N=2048, 3 seeds), Gaussian W:
    #     3-bit 0.1405 vs 0.1280, 4-bit 0.0744 vs 0.0702 (kmeans better on 3/3 and 3/3)
    #   same with Student-t(3) W (heavy tails, as in LLM weights):
    #     3-bit 0.2023 vs 0.1672, 4-bit 0.1245 vs 0.0980
    #   agent-small, all 28 linears (2,590 calibration tokens): 3-bit 0.0168 vs 0.0158 (kmeans better on
    #     21/28), 4-bit 0.0069 vs 0.0073 (kmeans better on only 2/28)
    # so kmeans is usually the better start, and init=both with select=best (never worse than either,
    # twice the time) is the strengthened variant, reported beside the paper's default by
    # `lmforge reproduce ganq --full`.
    init: str = "uniform"
    select: str = "last"
    outlier_frac: float = 0.0
    full_rows: int = 0
    # NOTE: float32 is a speed choice of ours; the paper does not say which precision its GPU code uses.
    t_step_dtype: str = "float32"
    kmeans_iters: int = 20
    # Measured on SmolLM2's layers (2 threads): 32 ran the S-step 1.3-2.9x faster than 128.
    block_size: int = 32

    def __post_init__(self) -> None:
        if isinstance(self.bits, bool) or not isinstance(self.bits, int) or not 2 <= self.bits <= 8:
            raise UserError(f"ganq bits must be an integer in 2..8, got {self.bits!r}")
        if isinstance(self.iters, bool) or not isinstance(self.iters, int) or self.iters < 0:
            raise UserError(f"ganq iters must be a non-negative integer, got {self.iters!r}")
        if not isinstance(self.damp, (int, float)) or not math.isfinite(self.damp) or self.damp < 0:
            raise UserError(f"ganq damp must be a finite number >= 0, got {self.damp!r}")
        if self.init not in INIT_CHOICES:
            raise UserError(f"ganq init must be one of {', '.join(INIT_CHOICES)}, got {self.init!r}")
        if self.select not in SELECT_CHOICES:
            raise UserError(f"ganq select must be one of {', '.join(SELECT_CHOICES)}, got {self.select!r}")
        if self.damp_when not in DAMP_CHOICES:
            raise UserError(f"ganq damp_when must be one of {', '.join(DAMP_CHOICES)}, got {self.damp_when!r}")
        if self.t_step_dtype not in ("float32", "float64"):
            raise UserError(f"ganq t_step_dtype must be float32 or float64, got {self.t_step_dtype!r}")
        fr = self.full_rows
        if isinstance(fr, bool) or not isinstance(fr, int) or fr < 0:
            raise UserError(f"ganq full_rows must be a non-negative integer, got {fr!r}")
        frac = self.outlier_frac
        if not isinstance(frac, (int, float)) or not math.isfinite(frac) or not 0.0 <= frac < 0.5:
            raise UserError(f"ganq outlier_frac must be in [0, 0.5), got {frac!r}")
        kit = self.kmeans_iters
        if isinstance(kit, bool) or not isinstance(kit, int) or kit < 0:
            raise UserError(f"ganq kmeans_iters must be a non-negative integer, got {kit!r}")
        bs = self.block_size
        if isinstance(bs, bool) or not isinstance(bs, int) or bs < 1:
            raise UserError(f"ganq block_size must be a positive integer, got {bs!r}")

    @property
    def levels(self) -> int:
        """Codebook size ``2^bits``."""
        return 2**self.bits
