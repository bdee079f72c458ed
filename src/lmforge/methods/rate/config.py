"""Settings of a RATE run (Reber, Richardson, Nief, Garbacea, Veitch, ICML 2025, arXiv 2410.11348)."""

from __future__ import annotations

from dataclasses import dataclass

from lmforge.common.errors import UserError

# The official rewrite prompt (toddnief/RATE, src/rate/dataset_templates/imdb_*.py), used for the
# rewrite and for the rewrite of the rewrite.
REWRITE_PROMPT = "{original_completion}\n\n[Adjust this review so it's {w_counterfactual_string}, but change *nothing* else."


@dataclass
class RateConfig:
    """How responses are rewritten and effects estimated.

    Attributes:
        attribute: the attribute's name (reports only).
        w1_string: how the rewrite prompt names w = 1 (e.g. ``"longer"``, ``"positive sentiment"``).
        w0_string: the same for w = 0.
        rewrite_prompt: the template with ``{original_completion}`` and ``{w_counterfactual_string}``
            (default: the official IMDB prompt).
        temperature: rewriter sampling temperature (the paper: gpt-4o at 0.7).
        max_tokens: rewriter tokens per reply (None: the client's default).
        drop_failed: leave out units whose rewrite (or rewrite of the rewrite) did not flip the
            attribute by the classifier. False (the paper's estimator: every unit counts) by default;
            failures are counted and reported either way.
        confidence: the level of the normal confidence intervals.
        paired_se: give RATE's estimates the paired standard error (sd of the per-unit differences
            over √n) instead of the official code's unpaired one (conservative: both arms hold the
            same units).
    """

    attribute: str = "attribute"
    w1_string: str = "with the attribute"
    w0_string: str = "without the attribute"
    rewrite_prompt: str = REWRITE_PROMPT
    temperature: float = 0.7
    max_tokens: int | None = None
    drop_failed: bool = False
    confidence: float = 0.95
    paired_se: bool = False

    def __post_init__(self) -> None:
        for key in ("{original_completion}", "{w_counterfactual_string}"):
            if key not in self.rewrite_prompt:
                raise UserError(f"the rewrite prompt must contain {key}")
        if not self.temperature >= 0:
            raise UserError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.confidence < 1:
            raise UserError(f"confidence must be in (0, 1), got {self.confidence}")
        if not self.w1_string.strip() or not self.w0_string.strip():
            raise UserError("the attribute's w=1 and w=0 strings must not be empty")
