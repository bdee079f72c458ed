"""GPTQ configuration; defaults from Frantar et al. (2023) and its reference code (``gptq.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from lmforge.common.quant import check_bits, check_damp, check_group_size
from lmforge.common.errors import UserError


@dataclass
class GPTQConfig:
    """GPTQ settings.

    Attributes:
        bits: code width (paper: 3 and 4).
        group_size: columns sharing one scale/zero; 0 for per-channel (the paper's main tables),
            128 is the common grouped setting.
        sym: symmetric grid (zero point fixed at 2^(b-1)); the reference code's default is asymmetric,
            llm-compressor's W4A16 preset symmetric.
        act_order: process columns in decreasing ``diag(H)`` ("act-order", reference ``--act-order``).
        damp: dampening added to ``diag(H)``, as a fraction of its mean (reference ``percdamp=.01``).
        block_size: columns per lazy-batch block (reference 128).
        true_sequential: within a layer, quantize q/k/v, then o, then gate/up, then down, each on
            inputs through the already-quantized earlier ones (reference ``--true-sequential``, off
            by default there too).
    """

    bits: int = 4
    group_size: int = 128
    # NOTE: the reference code quantizes asymmetrically unless --sym is given; lmforge defaults to
    # symmetric, llm-compressor's W4A16 preset, because that is what vLLM/compressed-tensors serve
    # most widely (and what the export refuses least). sym=false gives the reference grid.
    sym: bool = True
    act_order: bool = False
    damp: float = 0.01
    block_size: int = 128
    true_sequential: bool = False

    def __post_init__(self) -> None:
        check_bits(self.bits)
        check_group_size(self.group_size)
        check_damp(self.damp)
        if not isinstance(self.true_sequential, bool):
            raise UserError(f"true_sequential must be true or false, got {self.true_sequential!r}")
        if self.block_size < 1:
            raise UserError(f"block_size must be >= 1, got {self.block_size}")
