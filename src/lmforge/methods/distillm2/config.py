"""Configuration of DistiLLM-2 distillation (Ko et al., ICML 2025, arXiv 2503.07067).

Defaults are the paper's / the released code's (github.com/jongwooko/distillm-2,
``training_configs/qwen2.5-1.5b-distillm2.yaml``, ``src/distillm_trainer.py``, ``generate/generate_vllm.py``):

* alpha = 0.1 (``base_alpha_1 = base_alpha_2 = 0.1``); beta = 0.5 fixed (``gradual_beta=False``: the loss
  ``(2-b) SKL + b SRKL`` with b = 1); adaptive alpha off (``update_alpha=False``). The paper describes a
  beta rising 0.5 -> 0.75 and adaptive alpha; both are flags here, off by default like the release.
* sampling T = 0.8, top-p = 0.95 (the paper: up to 1,024 new tokens; we default to fewer for CPU use).
* lr 5e-5, cosine schedule, warm-up ratio 0.1, effective batch 128 (1 x 8 accumulation x 16 GPUs),
  LoRA r = 16, lora_alpha = 128, dropout 0.05 on all linear projections.
* 3 epochs for instruction following (the paper), student responses regenerated before each epoch.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from lmforge.common.errors import UserError

LOSSES = ("distillm2", "kl", "rkl", "gjsd", "skl")
BASELINE_DATA = ("both", "teacher", "student")


@dataclass
class DistillConfig:
    """Settings for :func:`lmforge.methods.distillm2.train.distill`.

    Attributes:
        loss: ``distillm2`` (SKL on teacher responses + SRKL on student responses), or a baseline
            applied to the responses chosen by ``baseline_data``: ``kl`` (forward KL), ``rkl`` (reverse
            KL), ``gjsd`` (TRL/GKD generalized JSD with ``gjsd_beta``), ``skl`` (skew KL with ``alpha``).
        alpha: skew alpha0 in (0, 1] (paper/code 0.1). alpha = 0 would be plain KL / RKL and is
            rejected (use ``--loss kl`` / ``rkl``).
        beta: weight of the SRKL term (released code: 0.5, fixed).
        gradual_beta: the official flag: beta rises linearly 0.5 -> 0.75 over the first half of training.
        update_alpha: the official flag: per-sequence adaptive alpha (off in epoch 1, see losses.adaptive_alpha).
        gjsd_beta: TRL ``GKDConfig.beta`` for ``--loss gjsd`` (TRL default 0.5).
        baseline_data: which responses a baseline loss uses: ``both`` (0.5 on teacher + 0.5 on student
            responses, the data DistiLLM-2 sees), ``teacher`` (offline KD), ``student`` (on-policy).
        epochs: passes over the prompts (paper: 3 for instruction following).
        lr, warmup_ratio, min_lr_ratio: AdamW learning rate, linear warm-up fraction, cosine floor.
        batch_size: prompts per optimizer step (each gives a teacher and a student response).
        weight_decay: AdamW weight decay.
        max_new_tokens, temperature, top_p: response sampling (paper: 1024, 0.8, 0.95).
        regenerate_student: regenerate student responses before every epoch (paper: yes).
        lora, lora_r, lora_alpha, lora_dropout: train PEFT LoRA adapters on all linear layers.
        gen_batch_size: rows per generation batch.
        seed: seeds sampling and data order.
        bf16: run the teacher's and the student's forwards (and the student's backward) under bf16
            autocast; the losses are computed in float32 and the weights and optimizer state stay
            float32. Faster on CPUs with native bf16.
    """

    loss: str = "distillm2"
    alpha: float = 0.1
    beta: float = 0.5
    gradual_beta: bool = False
    update_alpha: bool = False
    gjsd_beta: float = 0.5
    baseline_data: str = "both"
    epochs: int = 3
    lr: float = 5e-5
    warmup_ratio: float = 0.1
    min_lr_ratio: float = 0.0
    batch_size: int = 8
    weight_decay: float = 0.0
    max_new_tokens: int = 64
    temperature: float = 0.8
    top_p: float = 0.95
    regenerate_student: bool = True
    lora: bool = False
    lora_r: int = 16
    lora_alpha: int = 128
    lora_dropout: float = 0.05
    gen_batch_size: int = 32
    seed: int = 0
    bf16: bool = False

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise UserError(f"unknown loss '{self.loss}'; choose one of {', '.join(LOSSES)}")
        if not (isinstance(self.alpha, (int, float)) and math.isfinite(self.alpha) and 0.0 < self.alpha <= 1.0):
            raise UserError(f"alpha must be in (0, 1], got {self.alpha}")
        if not 0.0 <= self.beta <= 1.0:
            raise UserError(f"beta must be in [0, 1], got {self.beta}")
        if not 0.0 <= self.gjsd_beta <= 1.0:
            raise UserError(f"gjsd_beta must be in [0, 1], got {self.gjsd_beta}")
        if self.baseline_data not in BASELINE_DATA:
            raise UserError(f"unknown baseline_data '{self.baseline_data}'; choose one of {', '.join(BASELINE_DATA)}")
        for name in ("epochs", "batch_size", "max_new_tokens", "gen_batch_size", "lora_r"):
            if int(getattr(self, name)) < 1:
                raise UserError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise UserError(f"lr must be > 0, got {self.lr}")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise UserError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if not self.temperature > 0:
            raise UserError(f"temperature must be > 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise UserError(f"top_p must be in (0, 1], got {self.top_p}")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict of the settings."""
        return asdict(self)
