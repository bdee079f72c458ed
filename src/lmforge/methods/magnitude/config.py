"""Magnitude-pruning configuration (the baseline of the Wanda and SparseGPT papers)."""

from __future__ import annotations

from dataclasses import dataclass

from lmforge.common.sparsity import check_sparsity, parse_pattern


@dataclass
class MagnitudeConfig:
    """Magnitude pruning settings.

    Attributes:
        sparsity: fraction of each layer's weights pruned (unstructured); ignored with ``pattern``.
        pattern: ``"N:M"`` or None.
    """

    sparsity: float = 0.5
    pattern: str | None = None

    def __post_init__(self) -> None:
        check_sparsity(self.sparsity)
        parse_pattern(self.pattern)
