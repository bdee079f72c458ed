"""Settings of GANQ (Zhao & Yuan, ICML 2025), the per-row non-uniform codebook quantizer.

See :mod:`lmforge.methods.ganq.core` for the algorithm these settings drive.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lmforge.common.errors import UserError

__all__ = ["GANQConfig", "INIT_CHOICES"]

INIT_CHOICES = ("both", "uniform", "kmeans")


@dataclass
class GANQConfig:
    """Settings of one GANQ layer quantization.

    Attributes:
        bits: code width N; each output row gets a codebook of ``2^N`` float values. 2..8 (codes are
            stored as uint8).
        iters: number K of alternating S-step / T-step iterations (the paper uses K = 10). 0 keeps the
            initial codebook with nearest-value codes.
        damp: relative dampening: ``damp * mean(diag H)`` is added to the diagonal of ``H`` before the
            Cholesky factorisation, and both steps minimise the dampened objective.
        init: initial codebook T^0 of each row: ``"uniform"`` (2^N evenly spaced levels between the
            row's min and max), ``"kmeans"`` (1-D k-means of the row's values, Lloyd iterations
            started from quantiles), or ``"both"``: run the K iterations from each and keep, row by
            row, the better result (rows are independent terms of the objective; twice the time).
        outlier_frac: fraction of each row kept as sparse full-precision outliers (the largest half and
            the smallest half of the values, ``round(outlier_frac * n)`` entries a row in all); 0 turns
            the outlier split off. The paper's outlier variant keeps 0.5 % a row, i.e. 0.005.
        kmeans_iters: Lloyd iterations of the k-means initialisation.
        block_size: columns per block of the S-step's lazy error-feedback update (speed only; the
            result does not depend on it up to rounding).
    """

    bits: int = 4
    iters: int = 10
    # NOTE: the paper adds lambda*I only "if H is not positive definite" and gives no value; we always
    # add damp * mean(diag H), as GPTQ does (its default 0.01), because calibration Hessians of real
    # layers are often numerically singular and the S-step divides by the Cholesky diagonal.
    damp: float = 0.01
    # NOTE: the paper does not say how T^0 is chosen. Measured (K = 10, damp 0.01, one CPU thread),
    # mean final relative output error ||(W - W')X^T|| / ||W X^T||, init = uniform vs kmeans:
    #   correlated random layers (m=128, n=512, N=2048, 3 seeds), Gaussian W:
    #     3-bit 0.1405 vs 0.1280, 4-bit 0.0744 vs 0.0702 (kmeans better on 3/3 and 3/3)
    #   same with Student-t(3) W (heavy tails, as in LLM weights):
    #     3-bit 0.2023 vs 0.1672, 4-bit 0.1245 vs 0.0980
    #   agent-small, all 28 linears (2,590 calibration tokens): 3-bit 0.0168 vs 0.0158 (kmeans better on
    #     21/28), 4-bit 0.0069 vs 0.0073 (kmeans better on only 2/28)
    # Time per layer is about the same (Lloyd on a 512 x 512 weight takes 0.06 s; 0.29 s vs 0.28 s a layer at
    # 3-bit, 0.44 s vs 0.43 s at 4-bit on agent-small). kmeans wins everywhere except 4-bit on the tiny
    # light-tailed zoo model, and by more where weights are heavy-tailed.
    # Neither wins everywhere (4-bit agent-small layer 1 down_proj: kmeans 0.0204 > GPTQ 0.0198 >
    # uniform 0.0183), and the objective is a sum of independent per-row terms, so the default runs
    # both and keeps the better per row: never worse than either, at twice the time.
    init: str = "both"
    outlier_frac: float = 0.0
    kmeans_iters: int = 20
    block_size: int = 128

    def __post_init__(self) -> None:
        if isinstance(self.bits, bool) or not isinstance(self.bits, int) or not 2 <= self.bits <= 8:
            raise UserError(f"ganq bits must be an integer in 2..8, got {self.bits!r}")
        if isinstance(self.iters, bool) or not isinstance(self.iters, int) or self.iters < 0:
            raise UserError(f"ganq iters must be a non-negative integer, got {self.iters!r}")
        if not isinstance(self.damp, (int, float)) or not math.isfinite(self.damp) or self.damp < 0:
            raise UserError(f"ganq damp must be a finite number >= 0, got {self.damp!r}")
        if self.init not in INIT_CHOICES:
            raise UserError(f"ganq init must be one of {', '.join(INIT_CHOICES)}, got {self.init!r}")
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
