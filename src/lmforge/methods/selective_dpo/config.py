"""Selective DPO configuration; defaults quoted from the paper and its official recipes.

Gao et al., "Principled Data Selection for Alignment: The Hidden Risks of Difficult Examples"
(ICML 2025, arXiv 2502.09650); official code github.com/glorgao/SelectiveDPO (read at 52653aa):
``curriculum-lens/run_half.py`` + ``make_curricula.py`` (the difficulty), ``selective-dpo/``
(selection and training).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SelectiveDPOConfig:
    """Everything that decides a Selective DPO run.

    Attributes:
        tau: share of the data kept, the easiest first (paper: 0.5; 0.6 for Gemma-2-9B). In (0, 1].
        beta: DPO's β, for both the reference runs' held-out loss and the final DPO (paper: 0.01).
        seeds: seeds of the random half splits (official ``SEED_LIST``: 41, 42, 43).
        n_checkpoints: held-out evaluations per reference run, evenly spaced over its one epoch
            (official ``num_eval = 5``: every ``total_steps // 5`` steps).
        ref_lr: learning rate of the reference (difficulty) runs (official curriculum-lens recipe:
            6e-6 with LoRA).
        ref_lora_r: LoRA rank of the reference runs (paper: 16); 0 trains all weights.
        ref_lora_alpha: LoRA alpha (official recipe: 16).
        lr: learning rate of the final DPO run (paper: 6e-7 to 1e-6, full fine-tune).
        batch_size: pairs per optimiser step (paper: effective batch 128).
        epochs: passes over the selected data (paper: 1).
        warmup_ratio: linear warm-up share of the steps, then cosine decay to 0 (official recipes:
            ``warmup_ratio: 0.1``, ``lr_scheduler_type: cosine``).
        weight_decay: AdamW weight decay (TRL/transformers default 0).
        max_grad_norm: gradient-norm clipping (the HF Trainer default 1.0, which the official runs use).
        eval_batch_size: pairs per scoring batch.
        seed: torch seed of the final run.
    """

    tau: float = 0.5
    beta: float = 0.01
    seeds: tuple[int, ...] = (41, 42, 43)
    n_checkpoints: int = 5
    ref_lr: float = 6e-6
    ref_lora_r: int = 16
    ref_lora_alpha: int = 16
    lr: float = 1e-6
    batch_size: int = 128
    epochs: int = 1
    warmup_ratio: float = 0.1
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    eval_batch_size: int = 64
    seed: int = 42

    def __post_init__(self) -> None:
        self.seeds = tuple(int(s) for s in self.seeds)
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"tau must lie in (0, 1], got {self.tau}")
        if not self.beta > 0:
            raise ValueError(f"beta must be positive, got {self.beta}")
        if not self.seeds:
            raise ValueError("seeds must name at least one seed")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds must be distinct, got {self.seeds}")
        if self.n_checkpoints < 1:
            raise ValueError("n_checkpoints must be at least 1")
        if not (self.lr > 0 and self.ref_lr > 0):
            raise ValueError("lr and ref_lr must be positive")
        if self.ref_lora_r < 0 or self.ref_lora_alpha < 1:
            raise ValueError("ref_lora_r must be >= 0 and ref_lora_alpha >= 1")
        if self.batch_size < 1 or self.eval_batch_size < 1 or self.epochs < 1:
            raise ValueError("batch_size, eval_batch_size and epochs must be at least 1")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise ValueError("warmup_ratio must lie in [0, 1)")
        if self.weight_decay < 0:
            raise ValueError("weight_decay must be >= 0")
        if not self.max_grad_norm > 0:
            raise ValueError("max_grad_norm must be positive")
