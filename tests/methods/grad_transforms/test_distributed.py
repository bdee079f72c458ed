"""Projected data parallelism on two gloo workers (torch.multiprocessing spawn, file:// rendezvous).

(a) a shared projector: the workers all-reduce r-sized projected gradients, and the run equals
    single-process training on the averaged gradient (float64);
(b) worker-specific projectors: equal to a hand-written single-process loop of two local Adams
    whose r-space updates are back-projected with each worker's own P and averaged; the
    accumulated update has rank 2r while each worker's state stays r-sized;
(c) bytes: the counted payloads match the closed form (r-sized tensors for projected layers, full
    ones for the unprojected bias), and the loopback interface carries far fewer bytes than plain
    data parallelism's all-reduce of every gradient.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from lmforge.common.errors import UserError
from lmforge.methods.grad_transforms.config import GradTransformConfig

RANK, STEPS, LR = 3, 12, 1e-2
IN, HID, OUT = 64, 256, 128
# Frozen projectors (no refresh within the run): then a shared projector keeps every update in one
# rank-r column space and the rank test is sharp.
CFG = GradTransformConfig(kind="orthogonal", rank=RANK, refresh=10**6, seed=5)
MODES = ("dp", "shared", "specific")


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(IN, HID), nn.Tanh(), nn.Linear(HID, OUT, bias=False)).double()


def _shard(worker: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + worker)
    x = torch.randn(8, IN, generator=g, dtype=torch.float64)
    return x, torch.cos(x.sum(1, keepdim=True) * torch.linspace(0.1, 2, OUT, dtype=torch.float64))


def _loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (model(x) - y).pow(2).mean()


def _worker(rank: int, world: int, init: str, out: str) -> None:
    torch.set_num_threads(1)
    from lmforge.methods.grad_transforms.distributed import (
        CommStats,
        build_worker_optimizer,
        loopback_tx_bytes,
        data_parallel_step,
        distributed_step,
    )
    from lmforge.methods.grad_transforms.optim import state_bytes

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    for mode in MODES:
        model = _model()
        if mode == "dp":
            opt, stats = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0), CommStats()
        else:
            opt = build_worker_optimizer(model, CFG, LR, worker_specific=mode == "specific")
            stats = opt.comm_stats
        dist.barrier()
        lo0 = loopback_tx_bytes()
        for t in range(STEPS):
            opt.zero_grad()
            _loss(model, *_shard(rank, t)).backward()
            if mode == "dp":
                data_parallel_step(opt, stats)
            else:
                distributed_step(opt)
        dist.barrier()
        lo1 = loopback_tx_bytes()
        moments = [tuple(s["exp_avg"].shape) for s in opt.state.values()]
        torch.save({"weights": [p.detach().clone() for p in model.parameters()],
                    "state_bytes": state_bytes(opt, include_projectors=False), "moment_shapes": moments,
                    "stats": stats.as_dict(), "per_step": stats.per_step,
                    "lo": None if lo0 is None or lo1 is None else lo1 - lo0},
                   os.path.join(out, f"{mode}-rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, list[dict]]:
    tmp = tmp_path_factory.mktemp("dist")
    mp.spawn(_worker, args=(2, f"file://{tmp / 'rendezvous'}", str(tmp)), nprocs=2, join=True)
    return {mode: [torch.load(tmp / f"{mode}-rank{r}.pt") for r in range(2)] for mode in MODES}


def _single_process_on_mean_gradient() -> list[torch.Tensor]:
    from lmforge.methods.grad_transforms.apply import build_optimizer

    model = _model()
    opt = build_optimizer(model, CFG, LR)
    for t in range(STEPS):
        opt.zero_grad()
        # The mean over workers of each worker's mean loss: its gradient is the averaged gradient.
        (sum(_loss(model, *_shard(w, t)) for w in range(2)) / 2).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def _single_process_two_local_adams() -> list[torch.Tensor]:
    """The worker-specific protocol written out as one loop: each worker's Adam (torch's AdamW
    formula, no decay) on ITS projected gradient, updates back-projected with its own P, averaged;
    the unprojected bias takes torch.optim.Adam on the averaged gradient."""
    from lmforge.methods.grad_transforms.projectors import choose_side, projector_seed, random_projector

    model = _model()
    weights = [model[0].weight, model[2].weight]
    bias_opt = torch.optim.Adam([model[0].bias], lr=LR)
    b1, b2, eps = 0.9, 0.999, 1e-8
    projs = [[random_projector(tuple(w.shape), RANK, choose_side(tuple(w.shape), "std"), "orthogonal",
                               projector_seed(CFG.seed, i, 0, k), torch.float64) for k in range(2)]
             for i, w in enumerate(weights)]
    moments = [[None, None] for _ in weights]
    for t in range(1, STEPS + 1):
        grads = []
        for k in range(2):
            model.zero_grad()
            _loss(model, *_shard(k, t - 1)).backward()
            grads.append([w.grad.clone() for w in weights] + [model[0].bias.grad.clone()])
        with torch.no_grad():
            for i, w in enumerate(weights):
                total = torch.zeros_like(w)
                for k in range(2):
                    g = projs[i][k].project(grads[k][i])
                    if moments[i][k] is None:
                        moments[i][k] = (torch.zeros_like(g), torch.zeros_like(g))
                    m, v = moments[i][k]
                    m = b1 * m + (1 - b1) * g
                    v = b2 * v + (1 - b2) * g * g
                    moments[i][k] = (m, v)
                    u = -(LR / (1 - b1**t)) * m / (v.sqrt() / (1 - b2**t) ** 0.5 + eps)
                    total += projs[i][k].back(u)
                w += total / 2
        model[0].bias.grad = (grads[0][2] + grads[1][2]) / 2
        bias_opt.step()
    return [p.detach().clone() for p in model.parameters()]


def _numerical_rank(m: torch.Tensor) -> int:
    s = torch.linalg.svdvals(m)
    return int((s > 1e-9 * s[0]).sum())


def test_workers_stay_replicated(runs):
    for mode in MODES:
        for a, b in zip(runs[mode][0]["weights"], runs[mode][1]["weights"]):
            assert torch.equal(a, b), mode


def test_shared_projector_equals_single_process_on_the_mean_gradient(runs):
    for a, b in zip(runs["shared"][0]["weights"], _single_process_on_mean_gradient()):
        assert float((a - b).abs().max()) < 1e-12


def test_worker_specific_equals_two_local_adams_and_reaches_rank_2r(runs):
    specific, shared = runs["specific"], runs["shared"]
    for a, b in zip(specific[0]["weights"], _single_process_two_local_adams()):
        assert float((a - b).abs().max()) < 1e-12
    # Same per-worker state, higher-rank update. Layer 0 is 256x64 (reduced on the right, state
    # 256x3), layer 2 is 128x256 (reduced on the left, state 3x256); the bias is 256.
    w0 = [p.detach() for p in _model().parameters()]
    assert sorted(shared[0]["moment_shapes"]) == sorted(specific[0]["moment_shapes"]) \
        == sorted([(HID,), (HID, RANK), (RANK, HID)])
    assert shared[0]["state_bytes"] == specific[0]["state_bytes"] == specific[1]["state_bytes"]
    for i in (0, 2):
        assert _numerical_rank(shared[0]["weights"][i] - w0[i]) == RANK
        assert _numerical_rank(specific[0]["weights"][i] - w0[i]) == 2 * RANK


def test_bytes_moved_against_plain_data_parallelism(runs):
    f64 = 8
    low = (HID * RANK + RANK * HID) * f64          # the two projected layers' r-sized tensors
    full_bias = HID * f64                          # the unprojected bias, all-reduced as in DP
    dp = (IN * HID + HID + HID * OUT) * f64        # every gradient
    for mode in ("shared", "specific"):
        for r in range(2):
            st = runs[mode][r]["stats"]
            assert st["low_bytes"] == STEPS * low and st["full_bytes"] == STEPS * full_bias, mode
            assert runs[mode][r]["per_step"] == [low + full_bias] * STEPS
    assert runs["dp"][0]["stats"]["total_bytes"] == STEPS * dp
    lo = {mode: runs[mode][0]["lo"] for mode in MODES}
    if lo["dp"] is None:
        pytest.skip("no /proc/net/dev here")
    # Payload ratio is (low + bias) / dp = 1792/49408 = 0.036; headers and the barriers add a
    # fixed cost per message, so the wire ratio is bounded loosely.
    for mode in ("shared", "specific"):
        assert lo[mode] < 0.25 * lo["dp"], (mode, lo)


def test_worker_specific_svd_projector_is_refused():
    with pytest.raises(UserError, match="random kind"):
        from lmforge.methods.grad_transforms.distributed import build_worker_optimizer

        build_worker_optimizer(_model(), GradTransformConfig(kind="galore", rank=RANK), LR, worker_specific=True)
