"""Optimizers whose state lives in the projected space: ``ProjectedAdam`` and ``ProjectedSGD``.

Torroba-Hennigen, Lang, Guo, Kim, "On the Duality between Gradient Transformations and Adapters"
(ICML 2025): with ``g̃ = Pᵀ G Q`` and ``W ← W − η·scale·P u Qᵀ``, ``u = Opt(g̃_1..g̃_t)``, training
is identical to training the adapter ``W0 + P Θ Qᵀ`` (Θ0 = 0) with the same optimizer. Decoupled
weight decay on the *full* W has no adapter counterpart, so it breaks the equivalence (tested).

Checked against galore-torch 1.0 (``galore_torch/adamw.py``, ``galore_projector.py``):

* the projector is (re)computed when ``step % update_proj_gap == 0`` with ``step`` counted before
  this step's increment (steps 0, T, 2T, ...), from the current gradient;
* NOTE: the Adam moments are NOT reset or rotated at a refresh: the old-basis moments are used in
  the new basis, as galore-torch does (the adapter picture: merge Θ into W0, rebase, keep Θ's
  optimizer state; ``merge_and_rebase(reset_state=True)`` is the other choice);
* NOTE: its AdamW is transformers' old one: ``denom = sqrt(v) + eps`` with the bias corrections folded
  into the step size, and decoupled decay ``p -= lr·wd·p`` *after* the update.
  ``convention="galore"`` reproduces that; the default ``convention="torch"`` is
  ``torch.optim.AdamW``'s (``denom = sqrt(v)/sqrt(1-β2^t) + eps``, decay before the update), so
  that unprojected parameters train exactly as with torch's AdamW.

NOTE: random projectors (``sketch``, ``orthogonal``) are redrawn at every refresh, as Flora
resamples, from a seed derived from (config seed, layer index, refresh count, worker); galore-torch
has no random projector to compare with.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

from lmforge.common.errors import UserError
from lmforge.methods.grad_transforms.projectors import (
    Projector,
    check_rank,
    choose_side,
    make_projector,
    projector_seed,
)

CONVENTIONS = ("torch", "galore")


class _ProjectedOptimizer(torch.optim.Optimizer):
    """Shared projection logic. A param group is projected when it has a ``"kind"`` key.

    Projected groups carry ``kind, rank, refresh, scale, proj_type, seed`` and optionally
    ``names`` (for error messages) and ``worker`` (the worker-specific projector offset).
    Per-parameter state: ``step``, ``refreshes`` and the factors ``proj_left``/``proj_right``.

    ``comm`` is None in single-process training. :mod:`.distributed` sets it for the duration of
    one step to an object with ``full_grad(grad)`` (a refresh of an SVD projector needs the
    averaged full gradient), ``low_grad(g)`` (reduce a projected gradient) and
    ``apply(p, update_low, proj, group, i)`` (apply an r-space update, possibly gathered from the
    other workers); the math of the step itself is unchanged.
    """

    comm: Any = None

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group; a projected one has its shapes and rank checked here, before any step."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        if "kind" not in group:
            return
        start = getattr(self, "_n_projected", 0)
        group.setdefault("worker", 0)
        group.setdefault("proj_type", "std")
        group.setdefault("scale", 1.0)
        names = group.get("names") or [f"param{start + i}" for i in range(len(group["params"]))]
        group["names"] = list(names)
        group["indices"] = list(range(start, start + len(group["params"])))
        self._n_projected = start + len(group["params"])
        for p, name in zip(group["params"], group["names"]):
            if p.dim() != 2:
                raise UserError(f"parameter '{name}' has shape {tuple(p.shape)}; only 2-D weights can be projected")
            side = "both" if group["kind"] == "kron" else choose_side(tuple(p.shape), group["proj_type"])
            check_rank(group["rank"], tuple(p.shape), side, group["kind"], name)

    def _low_grad(self, p: torch.Tensor, group: dict[str, Any], i: int) -> tuple[torch.Tensor, Projector | None]:
        """The (projected) gradient of ``p``, refreshing its projector when due."""
        state = self.state[p]
        if "step" not in state:
            state["step"] = 0
            state["refreshes"] = 0
        if "kind" not in group:
            return p.grad, None
        if "proj_left" not in state or state["step"] % group["refresh"] == 0:
            side = "both" if group["kind"] == "kron" else choose_side(tuple(p.shape), group["proj_type"])
            seed = projector_seed(group["seed"], group["indices"][i], state["refreshes"], group["worker"])
            grad = p.grad if self.comm is None or group["kind"] not in ("galore", "kron") else self.comm.full_grad(p.grad)
            proj = make_projector(group["kind"], grad, group["rank"], side, seed)
            state["proj_left"], state["proj_right"] = proj.left, proj.right
            state["refreshes"] += 1
        proj = Projector(state["proj_left"], state["proj_right"])
        low = proj.project(p.grad)
        return (low if self.comm is None else self.comm.low_grad(low)), proj

    def _apply_low(self, p: torch.Tensor, update: torch.Tensor, proj: Projector, group: dict[str, Any],
                   i: int) -> None:
        """``p += scale · P update Qᵀ`` (``update`` already carries the step size and sign)."""
        if self.comm is None:
            p.add_(proj.back(update, group.get("scale", 1.0)))
        else:
            self.comm.apply(p, update, proj, group, i)

    @staticmethod
    def projector_of(state: dict[str, Any]) -> Projector | None:
        """The current projector stored in a parameter's state (None if unprojected)."""
        if "proj_left" not in state:
            return None
        return Projector(state["proj_left"], state["proj_right"])


class ProjectedAdam(_ProjectedOptimizer):
    """Adam/AdamW with the moments of projected weights kept in the r-dimensional space.

    Args:
        params: parameters or param groups; a group with ``kind`` (and ``rank``, ``refresh``,
            ``scale``, ``proj_type``, ``seed``) is projected, others get plain AdamW.
        lr: learning rate.
        betas: Adam's (β1, β2).
        eps: Adam's epsilon (where it enters depends on ``convention``).
        weight_decay: decoupled weight decay, applied to the FULL weight W. This is what
            galore-torch does; it has no adapter counterpart (the adapter would decay Θ, not
            W0 + PΘQᵀ), so any ``weight_decay > 0`` breaks the gradient-transform ≡ adapter equality.
        convention: ``"torch"`` (torch.optim.AdamW's formula) or ``"galore"`` (galore-torch's).
        correct_bias: Adam bias correction (both conventions; galore-torch's ``correct_bias``).
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, *, convention: str = "torch",
                 correct_bias: bool = True) -> None:
        if lr < 0:
            raise UserError(f"learning rate must be >= 0, got {lr}")
        if not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise UserError(f"betas must lie in [0, 1), got {betas}")
        if convention not in CONVENTIONS:
            raise UserError(f"unknown Adam convention '{convention}'; known: {', '.join(CONVENTIONS)}")
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                    "convention": convention, "correct_bias": correct_bias}
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """One Adam step on every parameter with a gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            torch_conv = group["convention"] == "torch"
            for i, p in enumerate(group["params"]):
                if p.grad is None:
                    continue
                g, proj = self._low_grad(p, group, i)
                state = self.state[p]
                if "exp_avg" not in state:
                    state["exp_avg"] = torch.zeros_like(g)
                    state["exp_avg_sq"] = torch.zeros_like(g)
                m, v = state["exp_avg"], state["exp_avg_sq"]
                if m.shape != g.shape:
                    raise UserError(f"optimizer state of shape {tuple(m.shape)} does not fit projected gradient "
                                    f"{tuple(g.shape)}; rank changed between steps")
                state["step"] += 1
                t = state["step"]
                if torch_conv and wd != 0:
                    p.mul_(1 - lr * wd)
                m.lerp_(g, 1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                bc1 = 1 - b1**t if group["correct_bias"] else 1.0
                bc2 = 1 - b2**t if group["correct_bias"] else 1.0
                if torch_conv:
                    denom = (v.sqrt() / math.sqrt(bc2)).add_(eps)
                    step_size = lr / bc1
                else:
                    denom = v.sqrt().add_(eps)
                    step_size = lr * math.sqrt(bc2) / bc1
                if proj is None:
                    p.addcdiv_(m, denom, value=-step_size)
                else:
                    self._apply_low(p, (m / denom).mul_(-step_size), proj, group, i)
                if not torch_conv and wd != 0:
                    p.add_(p, alpha=-lr * wd)
        return loss


class ProjectedSGD(_ProjectedOptimizer):
    """SGD with (heavy-ball) momentum, the buffer kept in the projected space.

    torch.optim.SGD's convention: ``buf = g`` on the first step, then ``buf = μ·buf + g``;
    ``W ← W − lr·scale·P buf Qᵀ``. No weight decay option: L2 added to the gradient would keep the
    equivalence (it is the gradient of ``L + λ/2‖W‖²``) and decoupled decay breaks it, see ProjectedAdam.
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-2, momentum: float = 0.0) -> None:
        if lr < 0:
            raise UserError(f"learning rate must be >= 0, got {lr}")
        super().__init__(params, {"lr": lr, "momentum": momentum})

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """One SGD step on every parameter with a gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, mu = group["lr"], group["momentum"]
            for i, p in enumerate(group["params"]):
                if p.grad is None:
                    continue
                g, proj = self._low_grad(p, group, i)
                state = self.state[p]
                state["step"] += 1
                if mu != 0:
                    if "momentum_buffer" not in state:
                        state["momentum_buffer"] = g.clone()
                    else:
                        state["momentum_buffer"].mul_(mu).add_(g)
                    g = state["momentum_buffer"]
                if proj is None:
                    p.add_(g, alpha=-lr)
                else:
                    self._apply_low(p, g * -lr, proj, group, i)
        return loss


def state_bytes(optimizer: torch.optim.Optimizer, include_projectors: bool = True) -> int:
    """Bytes held in ``optimizer.state`` tensors (moments, momentum buffers, and the projector
    factors unless ``include_projectors=False``); works for any torch optimizer."""
    total = 0
    for st in optimizer.state.values():
        for key, val in st.items():
            if not include_projectors and key in ("proj_left", "proj_right"):
                continue
            if torch.is_tensor(val) and val.dim() > 0:
                total += val.numel() * val.element_size()
    return total
