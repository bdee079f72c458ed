"""Lion, µS parameter groups and the cosine-to-10% schedule.

Narayan et al., "µnit Scaling" (ICML 2025) trains with Lion (Chen et al., "Symbolic Discovery of
Optimization Algorithms", 2023), a cosine schedule decaying to 10% of the peak LR, fully decoupled
weight decay, and hidden-layer LRs ``η·sqrt(d_base/d)`` (embedding, norms and head keep η).

Libraries checked: ``torch`` (2.13 here) has no Lion in ``torch.optim``; ``lion-pytorch`` (PyPI)
has one, used only as a test reference. Lion's update is

    u = sign(β1·m + (1-β1)·g);   w <- w - lr·u;   m <- β2·m + (1-β2)·g

with decoupled weight decay applied to ``w`` before the update.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from lmforge.methods.unit_scaling.config import MuSConfig


class Lion(torch.optim.Optimizer):
    """Lion (Chen et al., 2023).

    Args:
        params: parameters or parameter groups.
        lr: learning rate.
        betas: (β1, β2): interpolation for the update sign, EMA of the momentum.
        weight_decay: decay coefficient λ.
        independent_wd: True = fully decoupled (µS): ``w <- w·(1 - λ·lr/initial_lr)``, i.e. λ
            follows the schedule's shape but not η's size; False = Lion paper / lion-pytorch:
            ``w <- w·(1 - lr·λ)``.
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0, independent_wd: bool = True) -> None:
        if lr <= 0:
            raise ValueError(f"invalid lr {lr}")
        if not (0.0 <= betas[0] <= 1.0 and 0.0 <= betas[1] <= 1.0):
            raise ValueError(f"invalid betas {betas}")
        super().__init__(params, {"lr": lr, "betas": betas, "weight_decay": weight_decay,
                                  "independent_wd": independent_wd})
        for g in self.param_groups:
            g.setdefault("initial_lr", g["lr"])

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """One Lion step over every parameter with a gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (b1, b2), wd = group["lr"], group["betas"], group["weight_decay"]
            decay = wd * lr / group["initial_lr"] if group["independent_wd"] else wd * lr
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "exp_avg" not in state:
                    state["exp_avg"] = torch.zeros_like(p)
                m = state["exp_avg"]
                if decay:
                    p.mul_(1.0 - decay)
                update = m.mul(b1).add_(p.grad, alpha=1.0 - b1).sign_()
                p.add_(update, alpha=-lr)
                m.mul_(b2).add_(p.grad, alpha=1.0 - b2)
        return loss


def mus_param_groups(model: nn.Module, cfg: MuSConfig, lr: float, weight_decay: float) -> list[dict[str, Any]]:
    """Parameter groups with µS's learning-rate rule.

    Hidden linears (every :class:`~lmforge.methods.unit_scaling.model.MuSLinear`) get
    ``lr·sqrt(d_base/d)`` with ``d`` the model width; embedding, norms and head keep ``lr``.
    Weight decay is λ for every group (fully decoupled, not scaled with the LR rule).

    Args:
        model: a µS model.
        cfg: its µS config (``d_base``).
        lr: peak η.
        weight_decay: λ.

    Returns:
        Two groups, ``"hidden"`` then ``"other"``, each with ``name``, ``params``, ``lr``,
        ``weight_decay``.
    """
    from lmforge.methods.unit_scaling.model import MuSLinear

    d = model.config.hidden_size
    hidden_ids: set[int] = set()
    hidden: list[nn.Parameter] = []
    for m in model.modules():
        if isinstance(m, MuSLinear):
            hidden.append(m.weight)
            hidden_ids.add(id(m.weight))
    other = [p for p in model.parameters() if id(p) not in hidden_ids]
    return [
        {"name": "hidden", "params": hidden, "lr": lr * math.sqrt(cfg.d_base / d), "weight_decay": weight_decay},
        {"name": "other", "params": other, "lr": lr, "weight_decay": weight_decay},
    ]


def cosine_lr_factor(step: int, total_steps: int, min_ratio: float = 0.1, warmup_steps: int = 0) -> float:
    """LR multiplier at ``step``: linear warmup, then cosine from 1 to ``min_ratio`` at ``total_steps``.

    Args:
        step: 0-based step index.
        total_steps: steps in the run.
        min_ratio: final multiplier (µS: 0.1).
        warmup_steps: linear warmup length.

    Returns:
        The multiplier of every group's peak LR.
    """
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    span = max(total_steps - warmup_steps, 1)
    t = min(max(step - warmup_steps, 0) / span, 1.0)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * t))


def cosine_schedule(optimizer: torch.optim.Optimizer, total_steps: int, min_ratio: float = 0.1,
                    warmup_steps: int = 0) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` applying :func:`cosine_lr_factor` to every group."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: cosine_lr_factor(s, total_steps, min_ratio, warmup_steps))
