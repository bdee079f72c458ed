"""Worker-specific projections in data-parallel training (torch.distributed, gloo on CPU).

Torroba-Hennigen, Lang, Guo, Kim (ICML 2025) suggest, from the adapter view, giving each worker
its *own* projection (its own adapter initialisation): every worker keeps optimizer state of the
same r-dimensional size, but the averaged update is a sum of K rank-r terms with different column
spaces, so it can reach rank K·r.

Protocol implemented by :func:`distributed_step` (one step, K workers):

1. all-reduce (mean) the full gradients, as plain data parallelism does;
2. each worker projects the mean gradient with its own projector (seed offset by its rank,
   ``group["worker"]``), runs its local Adam in the r-dim space and forms its update
   ``ΔW_k = -η·scale·P_k u_k Q_kᵀ`` (plus the shared decay/unprojected updates);
3. all-reduce (mean) the updates; every worker applies ``mean_k ΔW_k`` so the weights stay replicated.

With the same projector on every worker, step 2 is identical everywhere and the result equals
single-process training on the averaged gradient (tested).
NOTE (*verify*): the paper's notes do not pin the protocol down (which quantity is averaged,
how often). Averaging the back-projected updates every step is the reading that keeps the
weights replicated and the per-worker state r-sized; a communication-lean variant would all-gather
the r-sized ``u_k`` and rebuild ``P_k`` from the seeds instead of all-reducing ΔW (same result).
NOTE: with ``kind="galore"`` the projector is the SVD of the (shared, averaged) gradient, the same
on every worker, so worker-specific projections need a random kind ("sketch", "orthogonal").
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from lmforge.methods.grad_transforms.apply import build_optimizer
from lmforge.methods.grad_transforms.config import GradTransformConfig


def build_worker_optimizer(model: nn.Module, cfg: GradTransformConfig, lr: float, worker_specific: bool = True,
                           **kwargs: float) -> torch.optim.Optimizer:
    """:func:`build_optimizer` whose random projectors are drawn per worker (rank) when
    ``worker_specific``, else shared (every worker draws worker 0's)."""
    opt = build_optimizer(model, cfg, lr, **kwargs)
    worker = dist.get_rank() if (worker_specific and dist.is_initialized()) else 0
    for group in opt.param_groups:
        if "kind" in group:
            group["worker"] = worker
    return opt


@torch.no_grad()
def distributed_step(optimizer: torch.optim.Optimizer, group: dist.ProcessGroup | None = None) -> None:
    """One data-parallel step with (possibly worker-specific) projected updates; see the module doc."""
    world = dist.get_world_size(group)
    params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    for p in params:
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=group)
        p.grad.div_(world)
    before = [p.detach().clone() for p in params]
    optimizer.step()
    for p, b in zip(params, before):
        delta = p.detach() - b
        dist.all_reduce(delta, op=dist.ReduceOp.SUM, group=group)
        p.copy_(b + delta / world)
