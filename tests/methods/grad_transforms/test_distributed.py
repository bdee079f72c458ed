"""Worker-specific projections on two gloo workers (torch.multiprocessing spawn, file:// rendezvous).

(a) identical projectors on both workers = single-process training on the averaged gradient;
(b) worker-specific projectors: the accumulated update has rank 2r (singular values), while each
worker's optimizer state stays r-sized and the shared-projector update has rank r.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from lmforge.methods.grad_transforms.config import GradTransformConfig

RANK, STEPS, LR = 3, 12, 1e-2
# Frozen projectors (no refresh within the run): then a shared projector keeps every update in one
# rank-r column space and the rank test is sharp.
CFG = GradTransformConfig(kind="orthogonal", rank=RANK, refresh=10**6, seed=5)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 24, bias=False), nn.Tanh(), nn.Linear(24, 20, bias=False)).double()


def _shard(worker: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + worker)
    x = torch.randn(8, 10, generator=g, dtype=torch.float64)
    return x, torch.cos(x.sum(1, keepdim=True) * torch.linspace(0.1, 2, 20, dtype=torch.float64))


def _worker(rank: int, world: int, init: str, out: str) -> None:
    torch.set_num_threads(1)
    from lmforge.methods.grad_transforms.distributed import build_worker_optimizer, distributed_step
    from lmforge.methods.grad_transforms.optim import state_bytes

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    for mode in ("shared", "specific"):
        model = _model()
        opt = build_worker_optimizer(model, CFG, LR, worker_specific=mode == "specific")
        for t in range(STEPS):
            opt.zero_grad()
            x, y = _shard(rank, t)
            (model(x) - y).pow(2).mean().backward()
            distributed_step(opt)
        torch.save({"weights": [p.detach().clone() for p in model.parameters()],
                    "state_bytes": state_bytes(opt, include_projectors=False),
                    "moment_shapes": [tuple(opt.state[p]["exp_avg"].shape) for p in model.parameters()]},
                   os.path.join(out, f"{mode}-rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


def _spawn(tmp_path) -> dict[str, list[dict]]:
    init = f"file://{tmp_path / 'rendezvous'}"
    mp.spawn(_worker, args=(2, init, str(tmp_path)), nprocs=2, join=True)
    return {mode: [torch.load(tmp_path / f"{mode}-rank{r}.pt") for r in range(2)] for mode in ("shared", "specific")}


def _single_process_on_mean_gradient() -> list[torch.Tensor]:
    from lmforge.methods.grad_transforms.apply import build_optimizer

    model = _model()
    opt = build_optimizer(model, CFG, LR)
    for t in range(STEPS):
        opt.zero_grad()
        # The mean over workers of each worker's mean loss: its gradient is the averaged gradient.
        loss = sum((model(x) - y).pow(2).mean() for x, y in (_shard(0, t), _shard(1, t))) / 2
        loss.backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def _numerical_rank(m: torch.Tensor) -> int:
    s = torch.linalg.svdvals(m)
    return int((s > 1e-9 * s[0]).sum())


def test_worker_specific_projections(tmp_path):
    torch.set_num_threads(1)
    runs = _spawn(tmp_path)
    shared, specific = runs["shared"], runs["specific"]
    w0 = [p.detach() for p in _model().parameters()]

    # Replicated weights on both workers, in both modes.
    for res in (shared, specific):
        for a, b in zip(res[0]["weights"], res[1]["weights"]):
            assert torch.equal(a, b)

    # (a) identical projectors: exactly single-process training on the averaged gradient.
    single = _single_process_on_mean_gradient()
    for a, b in zip(shared[0]["weights"], single):
        assert float((a - b).abs().max()) < 1e-12

    # (b) same per-worker state, higher-rank update. Layer 0 is 24x10 (reduced on the right, state
    # 24x3), layer 1 is 20x24 (reduced on the left, state 3x24).
    assert shared[0]["moment_shapes"] == specific[0]["moment_shapes"] == [(24, RANK), (RANK, 24)]
    assert shared[0]["state_bytes"] == specific[0]["state_bytes"] == specific[1]["state_bytes"]
    for i in range(2):
        d_shared = shared[0]["weights"][i] - w0[i]
        d_specific = specific[0]["weights"][i] - w0[i]
        assert _numerical_rank(d_shared) == RANK
        assert _numerical_rank(d_specific) == 2 * RANK
