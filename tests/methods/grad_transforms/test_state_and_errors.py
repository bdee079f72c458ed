"""Optimizer-state size (exact, from the state tensors), target selection, projector math, and
the user errors of bad settings."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lmforge.common.errors import UserError
from lmforge.methods.grad_transforms import GradTransformConfig, build_optimizer
from lmforge.methods.grad_transforms.apply import state_bytes, target_weights
from lmforge.methods.grad_transforms.projectors import gaussian_matrix, orthogonal_matrix, svd_projector

torch.set_num_threads(1)


def _step(model: nn.Module, opt: torch.optim.Optimizer, d_in: int) -> None:
    opt.zero_grad()
    model(torch.randn(4, d_in)).pow(2).sum().backward()
    opt.step()


@pytest.mark.parametrize("kind", ["galore", "sketch", "orthogonal", "kron"])
def test_projected_state_is_rank_sized(kind):
    """Tall m x n (m >= n) keeps m x r moments, wide keeps r x n, kron keeps r x r; AdamW keeps m x n."""
    r = 8
    model = nn.Sequential(nn.Linear(32, 96, bias=False), nn.Linear(96, 48, bias=False), nn.Linear(48, 64, bias=False))
    opt = build_optimizer(model, GradTransformConfig(kind=kind, rank=r, refresh=10), lr=1e-3)
    ref = torch.optim.AdamW(model.parameters(), lr=1e-3)
    _step(model, opt, 32)
    model.zero_grad()
    model(torch.randn(4, 32)).pow(2).sum().backward()
    ref.step()
    moments = proj = 0
    for (m, n), lin in zip([(96, 32), (48, 96), (64, 48)], model):
        st = opt.state[lin.weight]
        if kind == "kron":
            want = (r, r)
        else:
            want = (m, r) if m >= n else (r, n)  # galore-torch "std": reduce the smaller side
        assert tuple(st["exp_avg"].shape) == want and tuple(st["exp_avg_sq"].shape) == want
        assert tuple(ref.state[lin.weight]["exp_avg"].shape) == (m, n)
        moments += 2 * want[0] * want[1] * 4
        if kind == "kron":
            proj += (m * r + n * r) * 4
        else:
            proj += (min(m, n) * r) * 4
    assert state_bytes(opt, include_projectors=False) == moments
    assert state_bytes(opt) == moments + proj
    assert state_bytes(ref) == sum(2 * m * n * 4 for m, n in [(96, 32), (48, 96), (64, 48)])
    if kind != "kron":  # each layer's moments are r/min(m, n) of AdamW's
        for (m, n), lin in zip([(96, 32), (48, 96), (64, 48)], model):
            got = opt.state[lin.weight]["exp_avg"].numel()
            assert got * min(m, n) == r * m * n


def test_targets_skip_embeddings_and_tied_head():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    names = set(target_weights(model, GradTransformConfig(rank=4)))
    want = {f"model.layers.0.{s}.weight" for s in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                   "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}
    assert names == want
    names_mlp = set(target_weights(model, GradTransformConfig(rank=4, target=("mlp",))))
    assert names_mlp == {n for n in want if ".mlp." in n}
    opt = build_optimizer(model, GradTransformConfig(rank=4), lr=1e-3)
    n_opt = sum(p.numel() for g in opt.param_groups for p in g["params"])
    assert n_opt == sum(p.numel() for p in model.parameters())  # everything is trained, once


def test_projector_properties():
    g = torch.Generator().manual_seed(0)
    Q = orthogonal_matrix(40, 6, g, torch.float64)
    assert torch.allclose(Q.t() @ Q, torch.eye(6, dtype=torch.float64), atol=1e-12)
    # Gaussian sketch N(0, 1/d): E[PᵀP] = I_r; the sample mean over draws is close to it.
    draws = [gaussian_matrix(40, 6, g, torch.float64) for _ in range(400)]
    acc = sum(P.t() @ P for P in draws) / len(draws)
    assert float((acc - torch.eye(6, dtype=torch.float64)).abs().max()) < 0.05
    G = torch.randn(30, 12, generator=g, dtype=torch.float64)
    p = svd_projector(G, 3, "left")
    U, S, Vh = torch.linalg.svd(G, full_matrices=False)
    # P Pᵀ G is the best rank-3 approximation of G (Eckart-Young): its error is the tail spectrum.
    err = torch.linalg.matrix_norm(G - p.back(p.project(G)))
    assert abs(float(err) - float(S[3:].pow(2).sum().sqrt())) < 1e-10


def _one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


@pytest.mark.parametrize("kind", ["galore", "orthogonal", "sketch", "kron"])
def test_rank_larger_than_layer_is_a_user_error(kind):
    model = nn.Sequential(nn.Linear(16, 64), nn.Linear(64, 8))
    with pytest.raises(UserError) as exc:
        build_optimizer(model, GradTransformConfig(kind=kind, rank=12, refresh=10), lr=1e-3)
    msg = _one_line(exc)
    assert "'1.weight'" in msg and "8x64" in msg and "rank 12" in msg


@pytest.mark.parametrize("bad", [0, -5])
def test_refresh_must_be_positive(bad):
    with pytest.raises(UserError) as exc:
        GradTransformConfig(rank=4, refresh=bad)
    assert _one_line(exc) == f"refresh interval must be a positive number of steps, got {bad}"


def test_other_bad_settings():
    for kw in ({"kind": "svd"}, {"rank": 0}, {"proj_type": "diag"}, {"scale": 0.0}):
        with pytest.raises(UserError) as exc:
            GradTransformConfig(**kw)
        _one_line(exc)


@pytest.mark.parametrize("kind", ["galore", "sketch"])
def test_state_dict_round_trip_resumes_exactly(kind):
    """A checkpoint taken between refreshes resumes to the same weights as an uninterrupted run
    (projector factors, refresh counters and moments all travel in ``state_dict``)."""
    cfg = GradTransformConfig(kind=kind, rank=3, refresh=4, seed=2)

    def make():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(10, 20), nn.Tanh(), nn.Linear(20, 6))

    def batches(t):
        g = torch.Generator().manual_seed(t)
        return torch.randn(8, 10, generator=g)

    def train(model, opt, steps):
        for t in steps:
            opt.zero_grad()
            model(batches(t)).pow(2).mean().backward()
            opt.step()

    a = make()
    oa = build_optimizer(a, cfg, lr=1e-2)
    train(a, oa, range(14))
    b = make()
    ob = build_optimizer(b, cfg, lr=1e-2)
    train(b, ob, range(6))
    sd_model, sd_opt = b.state_dict(), ob.state_dict()
    c = make()
    c.load_state_dict(sd_model)
    oc = build_optimizer(c, cfg, lr=1e-2)
    oc.load_state_dict(sd_opt)
    train(c, oc, range(6, 14))
    for p, q in zip(a.parameters(), c.parameters()):
        assert torch.equal(p, q)
