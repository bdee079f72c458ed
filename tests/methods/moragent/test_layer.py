"""The MoR layer against independent computations: a hand top-k, a per-expert / per-token Python loop,
hand-computed auxiliary losses, the closed-form parameter count; role isolation and B = 0 exactness."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from lmforge.common.errors import UserError
from lmforge.methods.moragent.layer import (
    NO_ROLE,
    MoRConfig,
    MoRLinear,
    broadcast_roles,
    expert_layout,
    importance_cv2_loss,
    load_balance_loss,
    mor_aux_losses,
    mor_delta,
    role_mask,
    routed_weights,
    topk_renormalize,
)

D_IN, D_OUT, RANK = 12, 10, 3
ROUTED, TOP_K = (4, 4, 3), (3, 3, 2)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.int32)


def _layer(seed: int = 0, bias: bool = True, random_b: bool = True, **cfg) -> MoRLinear:
    torch.manual_seed(seed)
    base = nn.Linear(D_IN, D_OUT, bias=bias)
    layer = MoRLinear(base, MoRConfig(rank=RANK, **cfg))
    if random_b:
        with torch.no_grad():
            layer.mor_B.normal_(0.0, 0.3)
    return layer


def _roles() -> torch.Tensor:
    # two sequences of 7 tokens, every role and the no-role marker present
    return torch.tensor([[0, 0, 1, 2, -1, 1, 2], [2, 1, 0, 0, 1, -1, 2]])


def _x(seed: int = 1) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.randn(2, 7, D_IN)


# ------------------------------------------------------------------ routing math


def _hand_topk(row: list[float], k: int) -> list[float]:
    order = sorted(range(len(row)), key=lambda i: -row[i])[:k]
    total = sum(row[i] for i in order)
    return [row[i] / total if i in order else 0.0 for i in range(len(row))]


def test_topk_renormalize_matches_hand_topk():
    probs = torch.tensor([[0.1, 0.4, 0.2, 0.3], [0.7, 0.05, 0.15, 0.1]])
    got = topk_renormalize(probs, 3)
    for r in range(2):
        assert got[r].tolist() == pytest.approx(_hand_topk(probs[r].tolist(), 3), abs=1e-7)
    assert got[0, 0] == 0 and got[1, 1] == 0


@pytest.mark.parametrize("n,k", [(4, 3), (4, 1), (3, 2), (3, 3)])
def test_routed_weights_exactly_k_nonzero_sum_to_one(n, k):
    torch.manual_seed(n * 10 + k)
    logits = torch.randn(5, 6, n)
    w = routed_weights(logits, k)
    assert w.dtype == torch.float32
    assert ((w > 0).sum(-1) == k).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(5, 6), atol=1e-6, rtol=0)
    probs = torch.softmax(logits.double(), -1)
    for row_p, row_w in zip(probs.reshape(-1, n).tolist(), w.reshape(-1, n).tolist()):
        assert row_w == pytest.approx(_hand_topk(row_p, k), abs=1e-6)


def test_layer_routing_k_per_group_and_mask():
    layer = _layer()
    x, roles = _x(), _roles()
    with torch.no_grad():
        weights, active, routed = layer.routing(x, roles)
    for g, (n, k) in enumerate(zip(ROUTED, TOP_K)):
        assert routed[g].shape == (2, 7, n)
        assert ((routed[g] > 0).sum(-1) == k).all()
        torch.testing.assert_close(routed[g].sum(-1), torch.ones(2, 7), atol=1e-6, rtol=0)
    groups, shared = expert_layout(ROUTED)
    assert groups == [0] * 5 + [1] * 5 + [2] * 4 and [i for i, s in enumerate(shared) if s] == [4, 9, 13]
    for b in range(2):
        for t in range(7):
            g = int(roles[b, t])
            for e in range(14):
                if groups[e] != g:
                    assert weights[b, t, e] == 0 and not active[b, t, e]
            if g == NO_ROLE:
                continue
            own = [e for e in range(14) if groups[e] == g]
            routed_own = weights[b, t, own[:-1]]
            assert int((routed_own > 0).sum()) == TOP_K[g]
            assert float(routed_own.sum()) == pytest.approx(1.0, abs=1e-6)
            gate = torch.sigmoid(x[b, t] @ layer.shared_gates[g].weight[0].detach())
            assert float(weights[b, t, own[-1]]) == pytest.approx(float(gate), abs=1e-6)


def test_role_mask_and_broadcast():
    m = role_mask(torch.tensor([0, 2, -1, 1]), 3)
    assert m.tolist() == [[True, False, False], [False, False, True], [False, False, False], [False, True, False]]
    assert broadcast_roles(1, (2, 3)).tolist() == [[1, 1, 1]] * 2
    assert broadcast_roles(torch.tensor([0, 2]), (2, 3)).tolist() == [[0, 0, 0], [2, 2, 2]]
    assert broadcast_roles(_roles(), (2, 7)).tolist() == _roles().tolist()
    with pytest.raises(UserError):
        broadcast_roles(torch.tensor([0, 1, 2]), (2, 3))
    with pytest.raises(UserError):
        broadcast_roles(torch.tensor([0.0, 1.0]), (2, 3))


# ------------------------------------------------------------------ the batched sum


def test_mor_delta_equals_per_expert_loop():
    torch.manual_seed(3)
    E = 14
    x = torch.randn(2, 5, D_IN, dtype=torch.float64)
    A = torch.randn(E, D_IN, RANK, dtype=torch.float64)
    B = torch.randn(E, RANK, D_OUT, dtype=torch.float64)
    w = torch.rand(2, 5, E, dtype=torch.float64)
    active = torch.rand(2, 5, E) > 0.4
    loop = torch.zeros(2, 5, D_OUT, dtype=torch.float64)
    loop_masked = torch.zeros_like(loop)
    for e in range(E):
        term = w[..., e : e + 1] * ((x @ A[e]) @ B[e])
        loop += term
        loop_masked += torch.where(active[..., e : e + 1], term, 0.0)
    torch.testing.assert_close(mor_delta(x, A, B, w), loop, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(mor_delta(x, A, B, w, active), loop_masked, rtol=1e-12, atol=1e-12)


def test_layer_forward_equals_per_token_loop():
    layer = _layer(bias=True).requires_grad_(False)
    x, roles = _x(), _roles()
    got = layer(x, role_ids=roles)
    groups, shared = expert_layout(ROUTED)
    W, b = layer.base.weight, layer.base.bias
    for bi in range(2):
        for t in range(7):
            xt = x[bi, t]
            want = W @ xt + b
            g = int(roles[bi, t])
            if g != NO_ROLE:
                own = [e for e in range(14) if groups[e] == g]
                logits = (layer.routers[g].weight @ xt).double()
                probs = torch.softmax(logits, -1).tolist()
                wts = _hand_topk(probs, TOP_K[g]) + [float(torch.sigmoid(layer.shared_gates[g].weight[0] @ xt))]
                for wt, e in zip(wts, own):
                    want = want + wt * (xt @ layer.mor_A[e] @ layer.mor_B[e])
            torch.testing.assert_close(got[bi, t], want, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ exactness and role isolation


def test_b_zero_gives_base_exactly():
    layer = _layer(random_b=False)
    x = _x()
    assert torch.equal(layer.mor_B, torch.zeros_like(layer.mor_B))
    out = layer(x, role_ids=_roles())
    assert torch.equal(_bits(out), _bits(layer.base(x)))


def test_no_role_tokens_and_disabled_give_base_exactly():
    layer = _layer()
    x, roles = _x(), _roles()
    base = layer.base(x)
    out = layer(x, role_ids=roles)
    none = roles == NO_ROLE
    assert torch.equal(_bits(out[none]), _bits(base[none]))
    assert not torch.equal(out[~none], base[~none])
    layer.disabled = True
    assert torch.equal(_bits(layer(x, role_ids=roles)), _bits(base))
    assert torch.equal(_bits(layer(x)), _bits(base))  # no roles needed when off


def test_bfloat16_base_with_b_zero_is_exact():
    torch.manual_seed(0)
    base = nn.Linear(D_IN, D_OUT).to(torch.bfloat16)
    layer = MoRLinear(base, MoRConfig(rank=RANK))
    x = _x().to(torch.bfloat16)
    out = layer(x, role_ids=_roles())
    assert out.dtype == torch.bfloat16 and torch.equal(out, base(x))


@pytest.mark.parametrize("g", [0, 1, 2])
def test_other_roles_get_exactly_zero_gradient(g):
    layer = _layer()
    x, roles = _x(), _roles()
    out = layer(x, role_ids=roles)
    torch.manual_seed(9)
    mine = roles == g
    loss = (out[mine] * torch.randn_like(out[mine])).sum()
    routed = layer.routing(x, roles)[2]
    # the auxiliary terms of the role-g tokens (other tokens marked as no-role) touch group g only
    l1, l2 = mor_aux_losses(routed, torch.where(mine, roles, NO_ROLE), TOP_K)
    (loss + l1 + l2).backward()
    for h in range(3):
        idx = layer.expert_index(h)
        grads = [layer.mor_A.grad[idx], layer.mor_B.grad[idx], layer.routers[h].weight.grad,
                 layer.shared_gates[h].weight.grad]
        if h == g:
            assert all(gr.abs().sum() > 0 for gr in grads)
        else:
            assert all(torch.count_nonzero(gr) == 0 for gr in grads)
    assert layer.base.weight.grad is None


@pytest.mark.parametrize("g", [0, 1, 2])
def test_perturbing_other_roles_leaves_outputs_bit_identical(g):
    layer = _layer()
    x, roles = _x(), _roles()
    before = layer(x, role_ids=roles).detach()
    torch.manual_seed(11)
    with torch.no_grad():
        for h in range(3):
            if h != g:
                for _, t in layer.group_parameters(h):
                    t.add_(torch.randn_like(t) * 5.0)
    after = layer(x, role_ids=roles).detach()
    mine = roles == g
    assert torch.equal(_bits(after[mine]), _bits(before[mine]))
    others = (roles != g) & (roles != NO_ROLE)
    assert (after[others] != before[others]).any(dim=-1).all()


# ------------------------------------------------------------------ init, scaling, bad input


def test_init_kaiming_a_and_zero_b():
    layer = _layer(random_b=False)
    assert torch.count_nonzero(layer.mor_B) == 0
    # kaiming_uniform_(a=sqrt(5)) on [E, d_in, r]: fan_in = d_in * r, bound = 1 / sqrt(fan_in)
    bound = 1.0 / math.sqrt(D_IN * RANK)
    assert layer.mor_A.abs().max() <= bound and layer.mor_A.abs().max() > 0.8 * bound
    assert layer.mor_A.shape == (14, D_IN, RANK) and layer.mor_B.shape == (14, RANK, D_OUT)
    for lin in [*layer.routers, *layer.shared_gates]:
        assert lin.bias is None and lin.weight.abs().max() <= 1.0 / math.sqrt(D_IN)
    assert not layer.base.weight.requires_grad


def test_alpha_scales_the_update():
    plain = _layer(seed=4)
    scaled = _layer(seed=4, alpha=6.0)
    x, roles = _x(), _roles()
    base = plain.base(x)
    d_plain = plain(x, role_ids=roles) - base
    d_scaled = scaled(x, role_ids=roles) - base
    torch.testing.assert_close(d_scaled, d_plain * (6.0 / RANK), rtol=1e-5, atol=1e-6)


def test_param_count_closed_form():
    layer = _layer()
    n = sum(p.numel() for p in layer.parameters() if p.requires_grad)
    E = 4 + 1 + 4 + 1 + 3 + 1
    assert n == E * RANK * (D_IN + D_OUT) + (4 + 4 + 3) * D_IN + 3 * D_IN


@pytest.mark.parametrize("routed,top_k", [((4, 4, 3), (5, 3, 2)), ((4, 4, 3), (3, 3, 4)), ((4, 4, 3), (0, 3, 2))])
def test_topk_larger_than_group_is_a_one_line_user_error(routed, top_k):
    with pytest.raises(UserError) as err:
        MoRConfig(routed=routed, top_k=top_k)
    assert "\n" not in str(err.value) and "top-k" in str(err.value)
    with pytest.raises(UserError):
        topk_renormalize(torch.rand(2, 3), 4)


def test_missing_roles_and_bad_shapes_are_user_errors():
    layer = _layer()
    with pytest.raises(UserError):
        layer(_x())
    with pytest.raises(UserError):
        layer(_x(), role_ids=torch.zeros(3, 7, dtype=torch.long))
    with pytest.raises(UserError):
        MoRLinear(nn.Conv1d(2, 2, 1))  # type: ignore[arg-type]
    with pytest.raises(UserError):
        MoRConfig(rank=0)


# ------------------------------------------------------------------ auxiliary losses


def test_load_balance_loss_by_hand():
    # 4 tokens, 3 experts, k = 2
    w = torch.tensor([[0.6, 0.4, 0.0], [0.5, 0.0, 0.5], [0.0, 0.3, 0.7], [0.8, 0.2, 0.0]])
    f = [3 / 4 / 2, 3 / 4 / 2, 2 / 4 / 2]
    P = [1.9 / 4, 0.9 / 4, 1.2 / 4]
    want = 3 * sum(a * b for a, b in zip(f, P))
    assert float(load_balance_loss(w, 2)) == pytest.approx(want, rel=1e-6)
    # only the first two tokens
    mask = torch.tensor([True, True, False, False])
    f2, P2 = [2 / 2 / 2, 1 / 2 / 2, 1 / 2 / 2], [1.1 / 2, 0.4 / 2, 0.5 / 2]
    assert float(load_balance_loss(w, 2, mask)) == pytest.approx(3 * sum(a * b for a, b in zip(f2, P2)), rel=1e-6)
    # perfectly balanced -> 1; collapsed onto the same k experts -> n / k
    uniform = torch.full((6, 4), 0.25)
    assert float(load_balance_loss(uniform, 4)) == pytest.approx(1.0)
    collapsed = torch.tensor([[0.5, 0.5, 0.0, 0.0]] * 6)
    assert float(load_balance_loss(collapsed, 2)) == pytest.approx(4 / 2)


def test_importance_cv2_by_hand():
    w = torch.tensor([[0.6, 0.4, 0.0], [0.5, 0.0, 0.5], [0.0, 0.3, 0.7], [0.8, 0.2, 0.0]])
    imp = [1.9, 0.9, 1.2]
    mean = sum(imp) / 3
    var = sum((i - mean) ** 2 for i in imp) / 3
    assert float(importance_cv2_loss(w)) == pytest.approx(var / mean**2, rel=1e-6)
    assert float(importance_cv2_loss(torch.full((5, 3), 1 / 3))) == pytest.approx(0.0, abs=1e-12)


def test_mor_aux_losses_use_each_groups_own_tokens():
    torch.manual_seed(5)
    roles = torch.tensor([[0, 0, 2, 2, -1]])
    routed = [routed_weights(torch.randn(1, 5, n), k) for n, k in zip(ROUTED, TOP_K)]
    l1, l2 = mor_aux_losses(routed, roles, TOP_K)
    # group 1 has no token: the mean runs over groups 0 and 2
    m0, m2 = roles == 0, roles == 2
    want1 = (load_balance_loss(routed[0][m0], 3) + load_balance_loss(routed[2][m2], 2)) / 2
    want2 = (importance_cv2_loss(routed[0][m0]) + importance_cv2_loss(routed[2][m2])) / 2
    torch.testing.assert_close(l1, want1)
    torch.testing.assert_close(l2, want2)
    z1, z2 = mor_aux_losses(routed, torch.full((1, 5), -1), TOP_K)
    assert float(z1) == 0.0 and float(z2) == 0.0


def test_config_defaults_are_the_papers():
    c = MoRConfig()
    assert (c.rank, c.alpha, c.routed, c.top_k, c.n_experts) == (16, None, (4, 4, 3), (3, 3, 2), 14)
    assert (c.alpha1, c.alpha2, c.scaling) == (1e-3, 1e-4, 1.0)
    assert MoRConfig.from_dict(c.to_dict()) == c
    with pytest.raises(UserError):
        MoRConfig.from_dict({"rnak": 4})
