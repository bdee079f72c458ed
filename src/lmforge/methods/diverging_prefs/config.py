"""Settings of a diverging-preferences reward model (Zhang et al., ICML 2025, arXiv 2410.14632)."""

from __future__ import annotations

from dataclasses import dataclass

from lmforge.common.errors import UserError

HEADS = ("bt", "meanvar", "class")
BT_TARGETS = ("agg", "all")
MEANVAR_LOSSES = ("kl", "nll")


@dataclass
class DivergingPrefsConfig:
    """How a reward head is trained on per-annotator labels.

    Attributes:
        head: ``"bt"`` (Bradley–Terry scalar), ``"meanvar"`` (a (μ, σ) per response, the paper's
            distributional model) or ``"class"`` (a distribution over ``num_ratings`` Likert ratings
            per response, trained on per-response ratings).
        bt_target: Bradley–Terry on the aggregated (majority) label per pair (``"agg"``, the paper's
            "BT (Agg)") or on every annotator's label (``"all"``, "BT (All)": the soft target is the
            fraction of non-tie labels that prefer A, whose loss equals the sum over annotators up to
            a constant factor).
        meanvar_loss: ``"kl"`` (the paper's: KL from the annotators' 5-label histogram to the
            normal-CDF interval probabilities) or ``"nll"`` (the distributional-preference-learning
            baseline of Siththaranjan et al.: binary NLL of P(A ≻ B) = Φ(Δμ / sd)).
        cuts: the interval cut-points on r_A − r_B: tie is (−c₀, c₀), slight preference [c₀, c₁),
            strong preference [c₁, ∞) (and mirrored). (0.5, 1.5) is the paper's mapping as reported
            by secondary sources. NOTE: unverified against the PDF (no official code exists).
        rho: correlation between r_A and r_B in Var(r_A − r_B) = σ_A² + σ_B² − 2ρσ_Aσ_B. NOTE: the
            paper's model has a ρ term (secondary sources); how it is set is unverified, so it is a
            fixed constant here, 0 (independent) by default.
        min_sigma: floor added to softplus(σ) so the normal CDF never divides by zero.
        num_ratings: classes of the classification head (HelpSteer2's Likert scale: 5).
        lr: Adam learning rate.
        epochs: passes over the training pairs.
        batch_size: pairs per step.
        weight_decay: Adam weight decay.
        seed: seeds initialisation and shuffling.
    """

    head: str = "meanvar"
    bt_target: str = "agg"
    meanvar_loss: str = "kl"
    cuts: tuple[float, float] = (0.5, 1.5)
    rho: float = 0.0
    min_sigma: float = 1e-3
    num_ratings: int = 5
    lr: float = 3e-3
    epochs: int = 40
    batch_size: int = 128
    weight_decay: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.head not in HEADS:
            raise UserError(f"head must be one of {', '.join(HEADS)}, got '{self.head}'")
        if self.bt_target not in BT_TARGETS:
            raise UserError(f"bt_target must be one of {', '.join(BT_TARGETS)}, got '{self.bt_target}'")
        if self.meanvar_loss not in MEANVAR_LOSSES:
            raise UserError(f"meanvar_loss must be one of {', '.join(MEANVAR_LOSSES)}, got '{self.meanvar_loss}'")
        self.cuts = tuple(float(c) for c in self.cuts)  # type: ignore[assignment]
        if len(self.cuts) != 2 or not 0 < self.cuts[0] < self.cuts[1]:
            raise UserError(f"cuts must be two numbers 0 < c0 < c1, got {self.cuts}")
        if not -1.0 < self.rho < 1.0:
            raise UserError(f"rho must lie in (-1, 1), got {self.rho}")
        if not self.min_sigma > 0:
            raise UserError(f"min_sigma must be > 0, got {self.min_sigma}")
        if self.num_ratings < 2:
            raise UserError(f"num_ratings must be >= 2, got {self.num_ratings}")
        if not self.lr > 0:
            raise UserError(f"lr must be > 0, got {self.lr}")
        if self.epochs < 1 or self.batch_size < 1:
            raise UserError("epochs and batch_size must be >= 1")

    @property
    def out_dim(self) -> int:
        """Outputs per response: 1 (BT), 2 (μ, raw σ) or ``num_ratings`` logits."""
        return {"bt": 1, "meanvar": 2, "class": self.num_ratings}[self.head]
