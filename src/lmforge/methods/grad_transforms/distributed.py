"""Projected gradients in data-parallel training (torch.distributed; gloo on CPU).

Torroba-Hennigen, Lang, Guo, Kim (ICML 2025) point out two things about data parallelism with a
linear gradient transformation: the workers need only exchange r-sized tensors, and, from the
adapter view, each worker may use its *own* projection (its own adapter initialisation), so that
the averaged update is a sum of K rank-r terms that can reach rank K·r at the same memory and the
same communication.

:func:`distributed_step` runs one step in one of two modes (``build_worker_optimizer`` picks it):

* **shared projector** (every worker draws the same P): each worker projects its *local*
  gradient, ``g̃_k = Pᵀ G_k Q`` (r × n for a layer reduced on the left), and the r-sized
  projections are all-reduced (mean). By linearity the mean is ``Pᵀ Ḡ Q``, so the step is exactly
  single-process training on the averaged gradient, at r/m of plain data parallelism's bytes.
  An SVD projector (``galore``/``kron``) is computed from the averaged full gradient, so a refresh
  step all-reduces that layer's full gradient once (every ``refresh`` steps, as GaLore's refresh).
* **worker-specific projectors** (``worker`` = rank in the projector seed; random kinds only):
  worker k runs its optimizer on its own projected gradient ``P_kᵀ G_k`` (state r-sized), forms
  its r-space update ``U_k``, and the U_k are all-gathered; every worker applies
  ``mean_k scale·P_k U_k Q_kᵀ``, rebuilding each ``P_k`` from its seed (nothing but U_k is sent).
  Each worker sends one r-sized tensor per layer, as in the shared mode.

Parameters that are not projected (embeddings, norms, the LM head) are all-reduced as plain data
parallelism does, in both modes. Every collective's payload is counted in :class:`CommStats`.

NOTE (the paper's protocol is not public code; this is our reading): in the worker-specific mode
each worker's optimizer sees only its own shard's projected gradient. Giving worker k the mean of
``P_kᵀ G_j`` over all j would need every worker to project with every other worker's P and to
reduce-scatter K r-sized blocks (K times the traffic), which is not "the same communication".
An earlier version all-reduced the full gradients and then the full updates (twice plain data
parallelism's traffic); the trajectory tests pin the present protocol against a single-process
loop in float64.
NOTE: collectives are issued per parameter, for the baseline (:func:`data_parallel_step`) as for
the projected modes, so the byte counts compare like with like; bucketing (as DDP does) changes
the message count, not the bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from lmforge.common.errors import UserError
from lmforge.methods.grad_transforms.apply import build_optimizer
from lmforge.methods.grad_transforms.config import GradTransformConfig
from lmforge.methods.grad_transforms.projectors import Projector, choose_side, projector_seed, random_projector


@dataclass
class CommStats:
    """Bytes this worker put into collectives, by kind (payload size, not wire bytes).

    ``full``: full-size gradients (unprojected parameters, SVD refreshes, plain data parallelism);
    ``low``: r-sized projected gradients or updates. ``calls`` counts collectives.
    """

    full: int = 0
    low: int = 0
    calls: int = 0
    per_step: list[int] = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.full + self.low

    def as_dict(self) -> dict[str, Any]:
        return {"full_bytes": self.full, "low_bytes": self.low, "total_bytes": self.total, "calls": self.calls}


def loopback_tx_bytes() -> int | None:
    """Bytes the loopback interface has transmitted (``/proc/net/dev``, Linux), for measuring what
    gloo moves between processes on one machine (headers included); None where unreadable."""
    try:
        with open("/proc/net/dev") as fh:
            for line in fh:
                if line.strip().startswith("lo:"):
                    return int(line.split(":")[1].split()[8])
    except (OSError, IndexError, ValueError):
        return None
    return None


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _all_reduce_mean(t: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
    return t.div_(dist.get_world_size(group))


class _Comm:
    """The optimizer's ``comm`` hook for one step (see ``_ProjectedOptimizer``)."""

    def __init__(self, optimizer: torch.optim.Optimizer, group: dist.ProcessGroup | None) -> None:
        self.optimizer, self.group = optimizer, group
        self.specific: bool = optimizer.worker_specific
        self.stats: CommStats = optimizer.comm_stats
        self.peers: dict[tuple[int, int], list[Projector]] = optimizer._peer_projectors

    def full_grad(self, grad: torch.Tensor) -> torch.Tensor:
        """The averaged full gradient, for an SVD projector's refresh (shared mode only)."""
        self.stats.full += _nbytes(grad)
        self.stats.calls += 1
        return _all_reduce_mean(grad.detach().clone(), self.group)

    def low_grad(self, g: torch.Tensor) -> torch.Tensor:
        """Shared mode: the mean of the workers' projected gradients; specific mode: the local one."""
        if self.specific:
            return g
        g = g.contiguous().clone()
        self.stats.low += _nbytes(g)
        self.stats.calls += 1
        return _all_reduce_mean(g, self.group)

    def _peer_projectors(self, p: torch.Tensor, group: dict[str, Any], i: int) -> list[Projector]:
        """Every worker's projector of ``p`` at its current refresh, rebuilt from the seeds (cached
        until the next refresh; the cache holds K factors, the price of rebuilding none per step)."""
        refresh = self.optimizer.state[p]["refreshes"] - 1
        key = (id(p), refresh)
        if key not in self.peers:
            for old in [k for k in self.peers if k[0] == id(p)]:
                del self.peers[old]
            side = choose_side(tuple(p.shape), group["proj_type"])
            world = dist.get_world_size(self.group)
            self.peers[key] = [
                random_projector(tuple(p.shape), group["rank"], side, group["kind"],
                                 projector_seed(group["seed"], group["indices"][i], refresh, w), p.dtype, p.device)
                for w in range(world)]
        return self.peers[key]

    def apply(self, p: torch.Tensor, update: torch.Tensor, proj: Projector, group: dict[str, Any], i: int) -> None:
        scale = group.get("scale", 1.0)
        if not self.specific:
            p.add_(proj.back(update, scale))
            return
        world = dist.get_world_size(self.group)
        update = update.contiguous()
        parts = [torch.empty_like(update) for _ in range(world)]
        dist.all_gather(parts, update, group=self.group)
        self.stats.low += _nbytes(update)
        self.stats.calls += 1
        peers = self._peer_projectors(p, group, i)
        total = torch.zeros_like(p)
        for proj_w, u_w in zip(peers, parts):
            total.add_(proj_w.back(u_w, scale))
        p.add_(total.div_(world))


def build_worker_optimizer(model: nn.Module, cfg: GradTransformConfig, lr: float, worker_specific: bool = True,
                           **kwargs: float) -> torch.optim.Optimizer:
    """:func:`build_optimizer` for data-parallel training with :func:`distributed_step`.

    ``worker_specific``: each worker draws its own random projector (seed offset by its rank);
    otherwise every worker draws worker 0's. Raises UserError for worker-specific SVD projectors
    (``galore``/``kron`` derive P from the averaged gradient, so it is the same on every worker).
    """
    if worker_specific and cfg.kind in ("galore", "kron"):
        raise UserError(f"worker-specific projectors need a random kind (sketch, orthogonal), not '{cfg.kind}': "
                        "an SVD projector of the averaged gradient is the same on every worker")
    opt = build_optimizer(model, cfg, lr, **kwargs)
    worker = dist.get_rank() if (worker_specific and dist.is_initialized()) else 0
    for group in opt.param_groups:
        if "kind" in group:
            group["worker"] = worker
    opt.worker_specific = bool(worker_specific)
    opt.comm_stats = CommStats()
    opt._peer_projectors = {}
    return opt


@torch.no_grad()
def distributed_step(optimizer: torch.optim.Optimizer, group: dist.ProcessGroup | None = None) -> CommStats:
    """One data-parallel step of an optimizer from :func:`build_worker_optimizer` (module doc).

    Call after ``backward()`` on this worker's shard (the loss being the shard's mean). Returns the
    optimizer's running :class:`CommStats`.
    """
    stats: CommStats = optimizer.comm_stats
    before = stats.total
    for g in optimizer.param_groups:
        if "kind" in g:
            continue
        for p in g["params"]:
            if p.grad is not None:
                stats.full += _nbytes(p.grad)
                stats.calls += 1
                _all_reduce_mean(p.grad, group)
    optimizer.comm = _Comm(optimizer, group)
    try:
        optimizer.step()
    finally:
        optimizer.comm = None
    stats.per_step.append(stats.total - before)
    return stats


@torch.no_grad()
def data_parallel_step(optimizer: torch.optim.Optimizer, stats: CommStats,
                       group: dist.ProcessGroup | None = None) -> None:
    """Plain data parallelism, the baseline: all-reduce (mean) every gradient, then step."""
    before = stats.total
    for g in optimizer.param_groups:
        for p in g["params"]:
            if p.grad is not None:
                stats.full += _nbytes(p.grad)
                stats.calls += 1
                _all_reduce_mean(p.grad, group)
    optimizer.step()
    stats.per_step.append(stats.total - before)
