"""Configuration of µnit Scaling (Narayan et al., "µnit Scaling: Simple and Scalable FP8 LLM Training", ICML 2025).

Only η (``lr``), λ (``weight_decay``) and τ (``tau``) are tuned in the paper; everything else is
fixed by the method.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from lmforge.common.errors import UserError

ACTIVATIONS = ("gelu", "silu")


@dataclass
class MuSConfig:
    """µS hyperparameters.

    Attributes:
        tau: Res-Post-LN residual weight, ``x <- sqrt(1-tau) x + sqrt(tau) LN(f(x))``; the paper uses
            a fixed τ chosen by depth, 0.4 for its 4-layer transfer models (τ* falls with depth).
        d_base: base width for the hidden-layer LR rule ``lr * sqrt(d_base / d)``. The paper's base
            width is 256; ours is 64 (NOTE: our tiny CPU models are 64-256 wide, so the smallest
            swept width is the base, as 256 is the smallest in the paper's sweep).
        activation: MLP nonlinearity; the paper picks GELU (lower loss, though more FP8 underflow:
            GELU 30%, SiLU 7%, ReLU 0.04%).
        gated_mlp: False = the paper's MPT-style ``down(act(up(x)))``; True = Llama's
            ``down(act(gate(x)) * up(x))``.
        fp8: run every hidden linear with static FP8 casts (E4M3 forward, E5M2 backward).
        lr: peak learning rate η (Lion). NOTE: not a paper value; the paper tunes η per sweep and
            its value for our tiny models comes from ``lmforge reproduce unit-scaling``'s sweep.
        weight_decay: λ, fully decoupled (the update is ``w <- w - λ·(lr_t/lr) w``, not ``λ·lr_t``).
        betas: Lion's (β1, β2); the Lion paper's defaults (0.9, 0.99).
        min_lr_ratio: the cosine schedule ends at this fraction of the peak (paper: 10%).
        warmup_steps: linear warmup before the cosine (NOTE: the paper's warmup length is not in
            our notes; 0 by default).
        softmax_scale: attention logit scale exponent, logits = q·k / head_dim**softmax_scale.
            0.5 = standard softmax attention, the paper's Eq. 1. NOTE: the paper's §2.1 defines
            √softmax attention (Eq. 9, the elementwise square root of the attention probabilities)
            and reports that "neither attention variant provides a consistent scale" (Fig. 2); it
            fixes the scale with Res-Post-LN instead, and its list of µS components has no
            √softmax, so standard softmax is kept.
        fp8_grad_scale: multiply each hidden linear's incoming gradient by the static constant
            n_tokens / head multiplier (= n_tokens·d for µS) before its E5M2 cast, and divide after.
            Off by default: the paper casts gradients directly, with no scale factors. NOTE: with a
            mean-reduced loss, raw gradients are O(1/(n_tokens·d)) and mostly underflow E5M2 at our
            widths (measured ~78% at d = 64), which this option avoids; the reproduction reports both.
    """

    tau: float = 0.4
    d_base: int = 64
    activation: str = "gelu"
    gated_mlp: bool = False
    fp8: bool = False
    lr: float = 2e-3
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.99)
    min_lr_ratio: float = 0.1
    warmup_steps: int = 0
    softmax_scale: float = 0.5
    fp8_grad_scale: bool = False

    def __post_init__(self) -> None:
        if not 0.0 < float(self.tau) < 1.0:
            raise UserError(f"µS tau must lie strictly between 0 and 1 (got {self.tau}): "
                            "x <- sqrt(1-tau) x + sqrt(tau) LN(f(x)) needs both weights positive")
        if self.activation not in ACTIVATIONS:
            raise UserError(f"µS activation must be one of {', '.join(ACTIVATIONS)} (got {self.activation!r})")
        if self.d_base <= 0:
            raise UserError(f"µS d_base must be a positive width (got {self.d_base})")
        if self.lr <= 0 or self.weight_decay < 0:
            raise UserError(f"µS needs lr > 0 and weight_decay >= 0 (got lr={self.lr}, weight_decay={self.weight_decay})")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise UserError(f"µS min_lr_ratio must lie in [0, 1] (got {self.min_lr_ratio})")
        self.betas = (float(self.betas[0]), float(self.betas[1]))

    def to_dict(self) -> dict[str, Any]:
        """JSON-able fields (saved in the model folder's config.json under ``"mus"``)."""
        d = asdict(self)
        d["betas"] = list(self.betas)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MuSConfig:
        """Inverse of :meth:`to_dict`; unknown keys are a UserError."""
        known = set(cls.__dataclass_fields__)
        extra = set(d) - known
        if extra:
            raise UserError(f"unknown µS config keys: {', '.join(sorted(extra))}")
        d = dict(d)
        if "betas" in d:
            d["betas"] = tuple(d["betas"])
        return cls(**d)
