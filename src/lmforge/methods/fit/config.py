"""Settings of a Focus Instruction Tuning run (Lamb et al., ICML 2025, arXiv 2410.22944).

FIT is completion-only SFT on focus-instruction data (objective ``E[-log p(y_focus | task, I_focus,
x)]`` with ``I_focus`` drawn per example), trained with early stopping on validation cross-entropy.

# NOTE: the paper fine-tunes 7-13B instruction models with LoRA; its learning rate, batch size and
# step counts are unverified here (the official code was not available). The defaults below are
# this project's, sized for the tiny CPU Llamas of `lmforge reproduce fit`, and full fine-tuning
# (LoRA on a 0.2M-parameter model trained from scratch would only slow it down).
"""

from __future__ import annotations

from dataclasses import dataclass

from lmforge.common.errors import UserError


@dataclass
class FITConfig:
    """How to fine-tune on FIT (or SFT) prompt/completion data.

    Attributes:
        steps: optimiser steps.
        lr: peak learning rate (linear warm-up, then linear decay: transformers' default schedule).
        batch_size: examples per step.
        warmup_ratio: share of the steps spent warming up.
        weight_decay: AdamW's decoupled weight decay.
        max_length: tokens kept per example (prompt + completion).
        eval_every: steps between validation cross-entropy checks (0: no early stopping).
        patience: stop after this many checks without a better validation loss; the best weights
            are restored either way (the paper: early stopping on validation cross-entropy).
        seed: the trainer's seed (data order, dropout).
    """

    steps: int = 300
    lr: float = 3e-3
    batch_size: int = 32
    warmup_ratio: float = 0.05
    weight_decay: float = 0.0
    max_length: int = 256
    eval_every: int = 0
    patience: int = 3
    seed: int = 0

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise UserError(f"steps must be at least 1, got {self.steps}")
        if not self.lr > 0:
            raise UserError(f"the learning rate must be positive, got {self.lr}")
        if self.batch_size < 1:
            raise UserError(f"batch size must be at least 1, got {self.batch_size}")
        if not 0 <= self.warmup_ratio < 1:
            raise UserError(f"warmup ratio must be in [0, 1), got {self.warmup_ratio}")
        if self.weight_decay < 0:
            raise UserError(f"weight decay must be >= 0, got {self.weight_decay}")
        if self.max_length < 2:
            raise UserError(f"max length must be at least 2 tokens, got {self.max_length}")
        if self.eval_every < 0 or self.patience < 1:
            raise UserError("eval_every must be >= 0 and patience >= 1")
