"""Settings of a Focus Instruction Tuning run (Lamb et al., ICML 2025, arXiv 2410.22944).

FIT is completion-only SFT on focus-instruction data (objective ``E[-log p(y_focus | task, I_focus,
x)]`` with ``I_focus`` drawn per example), trained with early stopping on validation cross-entropy.

# NOTE: the paper fine-tunes 7-13B instruction models with LoRA; its learning rate, batch size and
# step counts are unverified here (the official code was not available). The defaults below are
# this project's, sized for the tiny CPU Llamas of `lmforge reproduce fit`, and full fine-tuning
# (LoRA on a 0.2M-parameter model trained from scratch would only slow it down). ``lora_r > 0``
# trains PEFT LoRA adapters on every linear layer instead (the paper's setting, used on SmolLM2);
# the adapters are merged into the model when training ends.
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
        lora_r: LoRA rank on every linear layer (PEFT ``target_modules="all-linear"``); 0 trains
            every weight.
        lora_alpha: LoRA's alpha (the update is scaled by alpha / r).
        lora_dropout: dropout on the LoRA branch.
        trainer: ``"trl"`` (TRL's ``SFTTrainer``) or ``"loop"`` (the same objective and schedule in
            a plain loop that applies the LM head only where a completion token is predicted; see
            :func:`lmforge.methods.fit.train.train_loop`).
        bf16: bfloat16 autocast for the forward and backward (weights and optimiser state stay fp32);
            faster on a CPU with native bf16, worse for tiny models trained from scratch.
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
    lora_r: int = 0
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    bf16: bool = False
    trainer: str = "trl"

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
        if self.lora_r < 0 or self.lora_alpha <= 0 or not 0 <= self.lora_dropout < 1:
            raise UserError("LoRA needs rank >= 0 (0: full fine-tuning), alpha > 0 and dropout in [0, 1)")
        if self.trainer not in ("trl", "loop"):
            raise UserError(f"trainer must be 'trl' or 'loop', got '{self.trainer}'")
        if self.eval_every < 0 or self.patience < 1:
            raise UserError("eval_every must be >= 0 and patience >= 1")
