"""Wanda configuration; defaults from Sun et al. (2024) and its reference code."""

from __future__ import annotations

from dataclasses import dataclass

from lmforge.common.sparsity import check_sparsity, parse_pattern


@dataclass
class WandaConfig:
    """Wanda settings.

    Attributes:
        sparsity: fraction of each output row pruned (unstructured); ignored when ``pattern`` is set.
        pattern: ``"N:M"`` (N pruned in every M consecutive inputs, e.g. ``"2:4"``) or None.
    """

    sparsity: float = 0.5
    pattern: str | None = None

    def __post_init__(self) -> None:
        check_sparsity(self.sparsity)
        parse_pattern(self.pattern)
