"""Configuration of the teacher-hacking harness (Tiapkin et al., ICML 2025, arXiv 2502.02671).

The paper's own values are quoted where they exist (forward KL, temperature 1, three data sources,
2x / 5x fewer prompts at fixed dataset size); everything else is sized for a CPU miniature: a Markov
oracle over 16 symbols instead of a Flan-T5-XL oracle, a 2-layer teacher and a 1-layer student
instead of T5-large / T5-small.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lmforge.methods.teacher_hacking.models import TinyShape

REGIMES = ("offline", "online_teacher", "online_student")
LOSSES = ("forward_kl", "reverse_kl", "jsd")


@dataclass
class TeacherHackingConfig:
    """Oracle, teacher, student and distillation settings.

    Attributes:
        n_symbols / n_topics / branching / prompt_len / max_response_len / oracle_seed: the oracle
            (:class:`~lmforge.methods.teacher_hacking.oracle.MarkovOracle`).
        teacher_shape / student_shape: tiny Llama shapes; the student is the smaller.
        teacher_data: oracle sequences the teacher is trained on (deliberately few: an imperfect teacher).
        teacher_steps / teacher_lr: the teacher's maximum-likelihood training.
        student_sft_data / student_sft_steps: the student's SFT before distillation. The paper builds
            "initial SFT checkpoints for both teacher and student" from one oracle dataset, so by default
            the student is trained on the teacher's own oracle sample (``student_sft_data = 0``) for as
            many steps as the teacher (NOTE: the paper does not give the student's SFT length);
            ``student_sft_data > 0`` draws a separate sample of that size; ``student_sft_steps = 0`` is
            a random init.
        n_prompts / gens_per_prompt: the offline set (the paper's knob: at fixed
            ``n_prompts·gens_per_prompt``, fewer prompts with more generations each). The online
            sources draw their prompts from the same pool.
        steps / batch_size / lr: distillation (Adam, constant LR; the paper: batch 32, lr 3e-4).
        loss: token-level divergence; the paper's main runs use forward KL.
        eval_prompts / eval_samples_per_prompt / eval_points / eval_linear_points: held-out prompts,
            Monte-Carlo samples per prompt for the proxy and golden metrics, and the numbers of
            log-spaced and evenly spaced evaluation steps.
        seed: RNG seed of data, sampling and initialisation.
    """

    n_symbols: int = 16
    n_topics: int = 4
    branching: int = 4
    prompt_len: int = 3
    max_response_len: int = 12
    oracle_seed: int = 0
    teacher_shape: TinyShape = field(default_factory=lambda: TinyShape(hidden=48, layers=2, heads=4, intermediate=96))
    student_shape: TinyShape = field(default_factory=lambda: TinyShape(hidden=32, layers=1, heads=2, intermediate=64))
    teacher_data: int = 500
    teacher_steps: int = 250
    teacher_lr: float = 3e-3
    student_sft_data: int = 0
    student_sft_steps: int = 250
    n_prompts: int = 500
    gens_per_prompt: int = 1
    steps: int = 700
    batch_size: int = 32  # the paper's batch size
    lr: float = 3e-3
    loss: str = "forward_kl"  # the paper's main divergence
    eval_prompts: int = 256
    eval_samples_per_prompt: int = 2
    eval_points: int = 16
    eval_linear_points: int = 14
    seed: int = 0

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got {self.loss!r}")
        if self.n_symbols < 2 or self.n_topics < 1 or not 1 <= self.branching <= self.n_symbols:
            raise ValueError("need n_symbols >= 2, n_topics >= 1 and 1 <= branching <= n_symbols")
        if self.prompt_len < 1 or self.max_response_len < 1 or self.prompt_len + self.max_response_len > 64:
            raise ValueError("need prompt_len, max_response_len >= 1 and prompt_len + max_response_len <= 64")
        if self.student_shape.hidden * self.student_shape.layers > self.teacher_shape.hidden * self.teacher_shape.layers:
            raise ValueError("the student must not be larger than the teacher")
        for name in ("teacher_data", "teacher_steps", "n_prompts", "gens_per_prompt", "steps", "batch_size",
                     "eval_prompts", "eval_samples_per_prompt"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.steps < 20:
            raise ValueError("steps must be at least 20 (the power-law detector needs evaluation points)")
        if self.eval_linear_points < 0:
            raise ValueError("eval_linear_points must be >= 0")
        if self.eval_points < 4:
            raise ValueError("eval_points must be at least 4 (the power-law fit needs points)")
        if self.student_sft_data < 0 or self.student_sft_steps < 0:
            raise ValueError("student_sft_data and student_sft_steps must be >= 0")
        if not (self.lr > 0 and self.teacher_lr > 0):
            raise ValueError("learning rates must be positive")

    @property
    def dataset_size(self) -> int:
        """Sequences in the offline set."""
        return self.n_prompts * self.gens_per_prompt
