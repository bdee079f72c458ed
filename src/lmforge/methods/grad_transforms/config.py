"""Settings of a linear gradient transformation (Torroba-Hennigen, Lang, Guo, Kim, ICML 2025).

Defaults come from galore-torch 1.0 (``GaLoreProjector(rank, update_proj_gap=200, scale=1.0,
proj_type="std")``, read from the 1.0 wheel) and from the paper (merge and re-initialise every
200 steps). GaLore's README/training script uses ``rank=128, scale=0.25`` for its 60M-1B runs;
the library default ``scale=1.0`` is kept here because it is the one that makes the projected
optimizer *equal* to the adapter (a scale other than 1 is an adapter trained with a scaled lr).
"""

from __future__ import annotations

from dataclasses import dataclass

from lmforge.common.errors import UserError

KINDS = ("galore", "sketch", "orthogonal", "kron")
# galore-torch's proj_type values; "full" is the two-sided one (our kind "kron" uses it).
PROJ_TYPES = ("std", "reverse_std", "left", "right", "full")


@dataclass
class GradTransformConfig:
    """Which linear map the gradients of the target weights go through.

    Attributes:
        kind: ``"galore"`` (top-r singular vectors of the current gradient, GaLore),
            ``"sketch"`` (Gaussian random projection, entries N(0, 1/dim), resampled at each
            refresh as Flora does), ``"orthogonal"`` (Haar-random orthonormal projection, QR of a
            Gaussian) or ``"kron"`` (two-sided ``P Θ Qᵀ`` from the gradient's SVD, galore-torch's
            ``proj_type="full"``).
        rank: r, the projected dimension (galore-torch README: 128).
        refresh: steps between projector refreshes (galore-torch ``update_proj_gap``, default 200;
            the paper merges and re-initialises its adapters every 200 steps).
        scale: factor on the back-projected update (galore-torch ``scale``, GaLore's alpha; 1.0).
        seed: base seed of the random projectors (each layer and each refresh derives its own).
        proj_type: which side a one-sided projection reduces, galore-torch's rule: ``"std"``
            projects the smaller dimension (right side when rows >= cols), ``"reverse_std"`` the
            larger, ``"left"``/``"right"`` fixed. Ignored by ``kind="kron"`` (always both sides).
        target: substrings of module names whose ``nn.Linear`` weights are projected; None means
            every ``nn.Linear`` except the LM head / anything tied to an embedding (GaLore's
            script projects the ``attn`` and ``mlp`` Linears, which is the same set on Llama).
    """

    kind: str = "galore"
    rank: int = 128
    refresh: int = 200
    scale: float = 1.0
    seed: int = 0
    proj_type: str = "std"
    target: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise UserError(f"unknown gradient transformation '{self.kind}'; known: {', '.join(KINDS)}")
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise UserError(f"rank must be a positive integer, got {self.rank}")
        if isinstance(self.refresh, bool) or not isinstance(self.refresh, int) or self.refresh <= 0:
            raise UserError(f"refresh interval must be a positive number of steps, got {self.refresh}")
        if not self.scale > 0:
            raise UserError(f"scale must be positive, got {self.scale}")
        if self.proj_type not in PROJ_TYPES:
            raise UserError(f"unknown proj_type '{self.proj_type}'; known: {', '.join(PROJ_TYPES)}")
        if self.target is not None:
            self.target = tuple(self.target)
