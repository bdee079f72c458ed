"""SparseGPT configuration; defaults from Frantar & Alistarh (2023) and its reference code."""

from __future__ import annotations

from dataclasses import dataclass

from lmforge.common.errors import UserError
from lmforge.common.quant import check_damp
from lmforge.common.sparsity import check_sparsity, parse_pattern


@dataclass
class SparseGPTConfig:
    """SparseGPT settings.

    Attributes:
        sparsity: fraction of weights pruned (unstructured); ignored when ``pattern`` is set.
        pattern: ``"N:M"`` (N pruned in every M consecutive inputs, e.g. ``"2:4"``) or None.
        damp: dampening, fraction of the mean of ``diag(H)`` (reference ``percdamp=.01``).
        block_size: columns per block; the adaptive mask is chosen per block (reference 128).
    """

    sparsity: float = 0.5
    pattern: str | None = None
    damp: float = 0.01
    block_size: int = 128

    def __post_init__(self) -> None:
        check_sparsity(self.sparsity)
        check_damp(self.damp)
        parse_pattern(self.pattern)
        if self.block_size < 1:
            raise UserError(f"block_size must be >= 1, got {self.block_size}")
