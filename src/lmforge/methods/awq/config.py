"""AWQ configuration; defaults from Lin et al. (2024) and the official llm-awq code."""

from __future__ import annotations

from dataclasses import dataclass

from lmforge.common.errors import UserError
from lmforge.common.quant import check_bits, check_group_size


@dataclass
class AWQConfig:
    """AWQ settings.

    Attributes:
        bits: code width (paper: 4, also 3).
        group_size: columns per group (paper: 128).
        sym: symmetric grid; the official code quantizes with a zero point (asymmetric).
        n_grid: points of the scale-exponent grid ``alpha in {0, 1/n, ..., (n-1)/n}`` (official 20).
        duo_scaling: AutoAWQ's variant ``s = s_X^a / s_W^(1-a)``; off in the paper (``s = s_X^a``).
        clip: search a per-group clipping range after scaling (official ``auto_clip``, on).
        clip_max_shrink: the clip search tries ``max * (1 - i/n_grid)`` down to ``1 - max_shrink``
            (official 0.5).
    """

    bits: int = 4
    group_size: int = 128
    sym: bool = False
    n_grid: int = 20
    duo_scaling: bool = False
    clip: bool = True
    clip_max_shrink: float = 0.5

    def __post_init__(self) -> None:
        check_bits(self.bits)
        check_group_size(self.group_size)
        if self.n_grid < 1:
            raise UserError(f"n_grid must be >= 1, got {self.n_grid}")
        if not 0 <= self.clip_max_shrink < 1:
            raise UserError(f"clip_max_shrink must be in [0, 1), got {self.clip_max_shrink}")
