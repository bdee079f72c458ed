"""Projectors of a Kronecker-factored linear gradient transformation: pure tensor math.

Torroba-Hennigen, Lang, Guo, Kim, "On the Duality between Gradient Transformations and Adapters"
(ICML 2025). A weight ``W`` (m x n, torch's ``(out, in)``) has gradient ``G``; the map
``S = Qᵀ ⊗ Pᵀ`` sends ``vec(G)`` to ``vec(Pᵀ G Q)`` and back-projects ``U`` to ``P U Qᵀ``. A
one-sided projection has ``Q = I`` (``left``, P is m x r) or ``P = I`` (``right``, Q is n x r).
The matching adapter is ``W = W0 + P Θ Qᵀ``.

Conventions checked against galore-torch 1.0 (``galore_projector.py``):

* ``proj_type="std"``: rows >= cols projects on the right (``G @ Vhᵀ[:, :r]``, state m x r),
  otherwise on the left (``U[:, :r]ᵀ @ G``, state r x n): the smaller side is reduced.
* The SVD is of the *current gradient* at each refresh; ``scale`` multiplies the back-projection.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lmforge.common.errors import UserError


@dataclass
class Projector:
    """A Kronecker projector: ``project(G) = Lᵀ G R``, ``back(U) = L U Rᵀ`` (None = identity).

    Attributes:
        left: P, m x r, or None.
        right: Q, n x r (columns span the kept input directions), or None.
    """

    left: torch.Tensor | None = None
    right: torch.Tensor | None = None

    def project(self, grad: torch.Tensor) -> torch.Tensor:
        """``Pᵀ G Q``: the gradient in the small space."""
        out = grad
        if self.left is not None:
            out = self.left.t() @ out
        if self.right is not None:
            out = out @ self.right
        return out

    def back(self, low: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        """``scale · P U Qᵀ``: a small-space tensor in the full space."""
        out = low
        if self.left is not None:
            out = self.left @ out
        if self.right is not None:
            out = out @ self.right.t()
        return out * scale if scale != 1.0 else out

    def low_shape(self, shape: tuple[int, int]) -> tuple[int, int]:
        """Shape of the projected tensor for a full ``shape``."""
        m, n = shape
        return (self.left.shape[1] if self.left is not None else m,
                self.right.shape[1] if self.right is not None else n)

    def nbytes(self) -> int:
        """Bytes of the stored factors."""
        return sum(t.numel() * t.element_size() for t in (self.left, self.right) if t is not None)


def choose_side(shape: tuple[int, int], proj_type: str) -> str:
    """``"left"``, ``"right"`` or ``"both"`` for a weight of ``shape`` under galore-torch's rule."""
    m, n = shape
    if proj_type == "std":
        return "right" if m >= n else "left"
    if proj_type == "reverse_std":
        return "left" if m >= n else "right"
    if proj_type in ("left", "right"):
        return proj_type
    if proj_type == "full":
        return "both"
    raise UserError(f"unknown proj_type '{proj_type}'")


def check_rank(rank: int, shape: tuple[int, int], side: str, kind: str, name: str) -> None:
    """UserError (one line) if ``rank`` does not fit the layer.

    SVD-based projectors (galore, kron) have at most min(m, n) singular vectors; a random projector
    reducing a dimension d needs r <= d (r > d would store *more* state than plain Adam, and an
    orthonormal d x r does not exist).
    """
    m, n = shape
    if kind in ("galore", "kron"):
        limit = min(m, n)
    else:
        limit = {"left": m, "right": n, "both": min(m, n)}[side]
    if rank > limit:
        raise UserError(f"rank {rank} exceeds layer '{name}' of shape {m}x{n} ({kind} allows at most {limit})")


def svd_projector(grad: torch.Tensor, rank: int, side: str) -> Projector:
    """GaLore: the top-``rank`` singular vectors of the current gradient.

    NOTE: galore-torch computes the SVD in float32 for any non-float32 dtype (float64 included)
    and casts back; here float64 gradients keep a float64 SVD (the exact-arithmetic tests need it)
    and only half-precision gradients are lifted to float32, as galore-torch does.
    """
    g = grad.detach()
    work = g.float() if g.dtype in (torch.float16, torch.bfloat16) else g
    U, _, Vh = torch.linalg.svd(work, full_matrices=False)
    left = U[:, :rank].to(g.dtype).contiguous() if side in ("left", "both") else None
    right = Vh[:rank, :].t().to(g.dtype).contiguous() if side in ("right", "both") else None
    return Projector(left, right)


def gaussian_matrix(d: int, rank: int, generator: torch.Generator, dtype: torch.dtype,
                    device: torch.device | str = "cpu") -> torch.Tensor:
    """A d x r Gaussian sketch with entries N(0, 1/d).

    The variance 1/d makes ``E[PᵀP] = I_r`` (columns nearly orthonormal, as in a JL sketch) and
    ``E[PPᵀ] = (r/d) I_d``, the same as a Haar-random orthonormal P, so the sketch's updates have
    the magnitude of the SVD/orthogonal projectors' at the same lr and scale.
    NOTE: Flora draws N(0, 1/r) entries (``E[PPᵀ] = I``); that is this sketch times sqrt(d/r),
    i.e. the same method with a larger effective learning rate.
    """
    x = torch.randn(d, rank, generator=generator, dtype=torch.float64)
    return (x / d**0.5).to(dtype=dtype, device=device)


def orthogonal_matrix(d: int, rank: int, generator: torch.Generator, dtype: torch.dtype,
                      device: torch.device | str = "cpu") -> torch.Tensor:
    """A Haar-random d x r matrix with orthonormal columns (QR of a Gaussian, signs fixed by diag R)."""
    x = torch.randn(d, rank, generator=generator, dtype=torch.float64)
    q, r = torch.linalg.qr(x)
    # Fixing the signs by diag(R) makes Q exactly Haar-distributed (Mezzadri 2007).
    q = q * torch.sign(torch.diagonal(r)).where(torch.diagonal(r) != 0, torch.ones(()))
    return q.to(dtype=dtype, device=device).contiguous()


def random_projector(shape: tuple[int, int], rank: int, side: str, kind: str, seed: int,
                     dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> Projector:
    """A seeded random projector (``kind`` ``"sketch"`` = Gaussian, ``"orthogonal"`` = Haar)."""
    gen = torch.Generator().manual_seed(int(seed) % (2**63))
    make = gaussian_matrix if kind == "sketch" else orthogonal_matrix
    m, n = shape
    left = make(m, rank, gen, dtype, device) if side in ("left", "both") else None
    right = make(n, rank, gen, dtype, device) if side in ("right", "both") else None
    return Projector(left, right)


def projector_seed(base: int, index: int, refresh_count: int, worker: int = 0) -> int:
    """Seed of layer ``index``'s projector at its ``refresh_count``-th refresh on ``worker``.

    Distinct per layer and per refresh (Flora resamples at each refresh) and per worker (the
    paper's worker-specific projections); the same inputs give the same projector, so the
    optimizer form and the adapter form can draw identical ones.
    """
    return ((base * 1_000_003 + index) * 1_000_033 + refresh_count) * 1_009 + worker


def make_projector(kind: str, grad: torch.Tensor, rank: int, side: str, seed: int) -> Projector:
    """The projector of ``kind`` for a gradient ``grad`` (random kinds only use its shape/dtype)."""
    if kind in ("galore", "kron"):
        return svd_projector(grad, rank, "both" if kind == "kron" else side)
    return random_projector(tuple(grad.shape), rank, side, kind, seed, grad.dtype, grad.device)
