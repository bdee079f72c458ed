"""Round-to-nearest configuration (the baseline of GPTQ, AWQ and GANQ tables)."""

from __future__ import annotations

from dataclasses import dataclass

from lmforge.common.quant import check_bits, check_group_size


@dataclass
class RTNConfig:
    """RTN settings.

    Attributes:
        bits: code width.
        group_size: columns per group; 0 for per-channel (GANQ's and GPTQ's RTN rows are per-channel).
        sym: symmetric grid; asymmetric (min-max with a zero point) by default, as in those tables.
    """

    bits: int = 4
    group_size: int = 0
    sym: bool = False

    def __post_init__(self) -> None:
        check_bits(self.bits)
        check_group_size(self.group_size)
