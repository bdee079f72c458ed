"""Lion against a naive per-element loop and the lion-pytorch reference."""

from __future__ import annotations

import pytest
import torch

from lmforge.methods.unit_scaling.optim import Lion


def _naive(w0, grads, lr_at, b1, b2, wd, initial_lr, independent):
    w = w0.clone().tolist()
    m = [0.0] * len(w)
    for t, g in enumerate(grads):
        lr = lr_at(t)
        decay = wd * lr / initial_lr if independent else wd * lr
        for i in range(len(w)):
            w[i] *= 1 - decay
            c = b1 * m[i] + (1 - b1) * float(g[i])
            s = (c > 0) - (c < 0)
            w[i] -= lr * s
            m[i] = b2 * m[i] + (1 - b2) * float(g[i])
    return torch.tensor(w, dtype=torch.float64)


@pytest.mark.parametrize("independent", [True, False])
def test_lion_matches_naive_loop_under_a_schedule(independent):
    torch.manual_seed(0)
    w0 = torch.randn(17, dtype=torch.float64)
    grads = [torch.randn(17, dtype=torch.float64) for _ in range(12)]
    p = torch.nn.Parameter(w0.clone())
    opt = Lion([p], lr=0.05, betas=(0.8, 0.95), weight_decay=0.3, independent_wd=independent)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    for g in grads:
        p.grad = g.clone()
        opt.step()
        sched.step()
    expected = _naive(w0, grads, lambda t: 0.05 / (1 + t), 0.8, 0.95, 0.3, 0.05, independent)
    assert torch.allclose(p.detach(), expected, atol=1e-12)


@pytest.mark.parametrize("independent", [True, False])
def test_lion_matches_lion_pytorch(independent):
    lion_pytorch = pytest.importorskip("lion_pytorch")
    torch.manual_seed(1)
    w0 = torch.randn(5, 7)
    a, b = torch.nn.Parameter(w0.clone()), torch.nn.Parameter(w0.clone())
    ours = Lion([a], lr=0.01, betas=(0.9, 0.99), weight_decay=0.5, independent_wd=independent)
    ref = lion_pytorch.Lion([b], lr=0.01, betas=(0.9, 0.99), weight_decay=0.5, decoupled_weight_decay=independent)
    s1 = torch.optim.lr_scheduler.LambdaLR(ours, lambda s: 0.9 ** s)
    s2 = torch.optim.lr_scheduler.LambdaLR(ref, lambda s: 0.9 ** s)
    for _ in range(20):
        g = torch.randn(5, 7)
        a.grad, b.grad = g.clone(), g.clone()
        ours.step()
        ref.step()
        s1.step()
        s2.step()
    assert torch.allclose(a, b, atol=1e-6)
    assert not torch.allclose(a, w0, atol=1e-3)
