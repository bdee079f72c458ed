"""DistiLLM-2 losses against brute-force numpy on small vocabularies, and against TRL's GKD loss.

Conventions (p teacher, q student): SKL_alpha = sum p [log p - log(alpha p + (1-alpha) q)], so
alpha = 0 gives KL(p||q); SRKL_alpha = sum q [log q - log((1-alpha) p + alpha sg(q))], so alpha = 0
gives KL(q||p). At alpha = 1 both mixtures collapse to p (SKL) / sg(q) (SRKL) and the value is 0.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lmforge.methods.distillm2 import losses as L

torch.set_num_threads(1)


def _softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


def _np_per_token(kind: str, s: np.ndarray, t: np.ndarray, a: float = 0.0) -> np.ndarray:
    """Per-token divergence by explicit loops over batch, position and vocabulary."""
    B, T, V = s.shape
    out = np.zeros((B, T))
    for b in range(B):
        for i in range(T):
            q = _softmax(s[b, i].astype(np.float64))
            p = _softmax(t[b, i].astype(np.float64))
            tot = 0.0
            for v in range(V):
                if kind == "kl":
                    tot += p[v] * (np.log(p[v]) - np.log(q[v]))
                elif kind == "rkl":
                    tot += q[v] * (np.log(q[v]) - np.log(p[v]))
                elif kind == "skl":
                    tot += p[v] * (np.log(p[v]) - np.log(a * p[v] + (1 - a) * q[v]))
                elif kind == "srkl":
                    tot += q[v] * (np.log(q[v]) - np.log((1 - a) * p[v] + a * q[v]))
                elif kind == "jsd":  # a = beta, TRL's mixture beta p + (1 - beta) q
                    m = a * p[v] + (1 - a) * q[v]
                    tot += a * p[v] * np.log(p[v] / m) + (1 - a) * q[v] * np.log(q[v] / m)
            out[b, i] = tot
    return out


def _np_reduce(per: np.ndarray, mask: np.ndarray | None, reduction: str = "token") -> float:
    m = np.ones_like(per) if mask is None else mask.astype(np.float64)
    if reduction == "token":
        return float((per * m).sum() / m.sum())
    return float(np.mean((per * m).sum(-1) / m.sum(-1)))


def _logits(seed: int, shape=(2, 3, 6), scale: float = 2.0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale,
            torch.randn(*shape, generator=g, dtype=torch.float64) * scale)


MASK = torch.tensor([[1, 1, 0], [0, 1, 1]], dtype=torch.bool)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("alpha", [0.1, 0.5, 0.9])
def test_each_loss_matches_bruteforce_numpy(seed: int, alpha: float) -> None:
    s, t = _logits(seed)
    sn, tn = s.numpy(), t.numpy()
    for mask in (None, MASK):
        mn = None if mask is None else mask.numpy()
        cases = {
            "kl": (L.forward_kl(s, t, mask), _np_per_token("kl", sn, tn)),
            "rkl": (L.reverse_kl(s, t, mask), _np_per_token("rkl", sn, tn)),
            "skl": (L.skew_kl(s, t, alpha, mask), _np_per_token("skl", sn, tn, alpha)),
            "srkl": (L.skew_reverse_kl(s, t, alpha, mask), _np_per_token("srkl", sn, tn, alpha)),
            "jsd": (L.generalized_jsd(s, t, alpha, mask), _np_per_token("jsd", sn, tn, alpha)),
        }
        for name, (got, per) in cases.items():
            assert float(got.detach()) == pytest.approx(_np_reduce(per, mn), rel=1e-9, abs=1e-12), name


def _np_masked_per_token(kind: str, s: np.ndarray, t: np.ndarray, a: float = 0.0) -> np.ndarray:
    """Reference with -inf logits: each model's softmax over the whole vocabulary (exp(-inf) = 0), the
    terms summed by loops over the entries where neither logit is -inf only (DistiLLM's inf_mask)."""
    B, T, V = s.shape
    out = np.zeros((B, T))
    for b in range(B):
        for i in range(T):
            keep = [v for v in range(V) if np.isfinite(s[b, i, v]) and np.isfinite(t[b, i, v])]
            if not keep:
                continue  # a position masked everywhere contributes 0
            sq, tp = s[b, i], t[b, i]
            q = np.exp(sq - sq[np.isfinite(sq)].max()) if np.isfinite(sq).any() else np.zeros(V)
            p = np.exp(tp - tp[np.isfinite(tp)].max()) if np.isfinite(tp).any() else np.zeros(V)
            q, p = q / q.sum(), p / p.sum()
            tot = 0.0
            for v in keep:
                m_skl, m_srkl = a * p[v] + (1 - a) * q[v], (1 - a) * p[v] + a * q[v]
                tot += {"kl": p[v] * np.log(p[v] / q[v]), "rkl": q[v] * np.log(q[v] / p[v]),
                        "skl": p[v] * np.log(p[v] / m_skl), "srkl": q[v] * np.log(q[v] / m_srkl),
                        "jsd": a * p[v] * np.log(p[v] / m_skl) + (1 - a) * q[v] * np.log(q[v] / m_skl)}[kind]
            out[b, i] = tot
    return out


def _masked_logits(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    s, t = _logits(seed, shape=(2, 3, 7))
    s[..., [1, 4]] = t[..., [1, 4]] = -math.inf  # a vocabulary both models mask
    t[0, 0, 2] = -math.inf  # the teacher alone masks an entry the student gives mass to
    s[1, 2, 5] = -math.inf  # and the student alone
    s[0, 1, 0] = t[0, 1, 6] = -math.inf  # each masks a different one at the same position
    s[1, 0, :] = t[1, 0, :] = -math.inf  # a position masked everywhere (e.g. padding)
    return s, t


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("alpha", [0.1, 0.5])
def test_losses_are_finite_and_exclude_minus_inf_logits(seed: int, alpha: float) -> None:
    s, t = _masked_logits(seed)
    sn, tn = s.numpy(), t.numpy()
    fns = {
        "kl": lambda a, b, m, **k: L.forward_kl(a, b, m, **k),
        "rkl": lambda a, b, m, **k: L.reverse_kl(a, b, m, **k),
        "skl": lambda a, b, m, **k: L.skew_kl(a, b, alpha, m, **k),
        "srkl": lambda a, b, m, **k: L.skew_reverse_kl(a, b, alpha, m, **k),
        "jsd": lambda a, b, m, **k: L.generalized_jsd(a, b, alpha, m, **k),
    }
    for name, fn in fns.items():
        per = _np_masked_per_token(name, sn, tn, alpha)
        assert np.isfinite(per).all() and per.sum() > 1e-3, name  # the reference is not vacuous
        for mask in (None, MASK):
            for reduction in ("token", "sequence"):
                mn = None if mask is None else mask.numpy()
                sg, tg = s.clone().requires_grad_(True), t.clone().requires_grad_(True)
                got = fn(sg, tg, mask, reduction=reduction)
                assert float(got.detach()) == pytest.approx(_np_reduce(per, mn, reduction), rel=1e-9, abs=1e-12), name
                got.backward()
                assert torch.isfinite(sg.grad).all() and torch.isfinite(tg.grad).all(), name
                # a left-out entry gets no gradient
                assert float(sg.grad[..., [1, 4]].abs().max()) == 0.0, name
                assert float(sg.grad[1, 0].abs().max()) == 0.0, name


def test_a_shared_vocabulary_mask_is_the_divergence_on_the_finite_sub_vocabulary() -> None:
    s, t = _logits(5, shape=(2, 3, 7))
    keep = [0, 2, 3, 5, 6]
    sm, tm = s.clone(), t.clone()
    sm[..., [1, 4]] = tm[..., [1, 4]] = -math.inf
    for fn in (L.forward_kl, L.reverse_kl, lambda a, b: L.skew_kl(a, b, 0.1),
               lambda a, b: L.skew_reverse_kl(a, b, 0.1), lambda a, b: L.generalized_jsd(a, b, 0.5)):
        assert float(fn(sm, tm)) == pytest.approx(float(fn(s[..., keep], t[..., keep])), rel=1e-12)
    loss = L.distillm2_loss(sm, tm, sm, tm, 0.1, 0.5)
    assert math.isfinite(float(loss)) and float(loss) > 0


def test_alpha_zero_reduces_to_kl_and_reverse_kl_and_alpha_one_to_zero() -> None:
    s, t = _logits(3)
    # alpha = 0: SKL_0 = KL(p||q), SRKL_0 = KL(q||p) (paper's convention, mixture weight alpha on p / sg(q)).
    assert float(L.skew_kl(s, t, 0.0)) == pytest.approx(float(L.forward_kl(s, t)), rel=1e-12)
    assert float(L.skew_reverse_kl(s, t, 0.0)) == pytest.approx(float(L.reverse_kl(s, t)), rel=1e-12)
    # and the two KLs differ here, so the reduction is not vacuous
    assert abs(float(L.forward_kl(s, t)) - float(L.reverse_kl(s, t))) > 1e-3
    # alpha = 1: the mixtures are p and sg(q), so both values are 0.
    assert float(L.skew_kl(s, t, 1.0)) == pytest.approx(0.0, abs=1e-12)
    assert float(L.skew_reverse_kl(s, t, 1.0)) == pytest.approx(0.0, abs=1e-12)
    # Near alpha = 0 the skew losses approach the KLs continuously.
    assert float(L.skew_kl(s, t, 1e-6)) == pytest.approx(float(L.forward_kl(s, t)), rel=1e-4)
    # gjsd follows TRL: beta = 0 is forward KL, beta = 1 reverse KL.
    assert float(L.generalized_jsd(s, t, 0.0)) == pytest.approx(float(L.forward_kl(s, t)), rel=1e-12)
    assert float(L.generalized_jsd(s, t, 1.0)) == pytest.approx(float(L.reverse_kl(s, t)), rel=1e-12)


def test_zero_iff_equal_distributions() -> None:
    s, t = _logits(4)
    # p = q also when the logits differ by a per-position constant (softmax is shift invariant).
    same = s + torch.randn(2, 3, 1, dtype=torch.float64)
    fns = {
        "kl": lambda a, b: L.forward_kl(a, b),
        "rkl": lambda a, b: L.reverse_kl(a, b),
        "skl": lambda a, b: L.skew_kl(a, b, 0.1),
        "srkl": lambda a, b: L.skew_reverse_kl(a, b, 0.1),
        "gjsd": lambda a, b: L.generalized_jsd(a, b, 0.5),
        "distillm2": lambda a, b: L.distillm2_loss(a, b, a, b, 0.1, 0.5),
    }
    for name, fn in fns.items():
        assert abs(float(fn(s, same))) < 1e-12, name
        assert float(fn(s, t)) > 1e-3, name
        # a single differing position is enough for a positive loss
        t1 = s.clone()
        t1[1, 2, 0] += 1.0
        assert float(fn(s, t1)) > 0, name


def test_srkl_gradient_treats_q_in_mixture_as_constant() -> None:
    alpha = 0.3
    s, t = _logits(5, shape=(1, 1, 7))
    s.requires_grad_(True)
    L.skew_reverse_kl(s, t, alpha).backward()
    auto = s.grad[0, 0].numpy()

    q = _softmax(s.detach()[0, 0].numpy())
    p = _softmax(t[0, 0].numpy())
    m = (1 - alpha) * p + alpha * q  # held constant
    c = np.log(q) - np.log(m)
    # d/dz_k sum_v q_v c_v with c fixed except log q: q_k (c_k - sum_v q_v c_v)
    analytic = q * (c - (q * c).sum())
    np.testing.assert_allclose(auto, analytic, rtol=1e-9, atol=1e-12)

    # The full gradient (q inside the mixture differentiated too) is different: the sg matters.
    def full(z: np.ndarray) -> float:
        qq = _softmax(z)
        return float((qq * (np.log(qq) - np.log((1 - alpha) * p + alpha * qq))).sum())

    z0 = s.detach()[0, 0].numpy()
    eps = 1e-6
    fd = np.array([(full(z0 + eps * e) - full(z0 - eps * e)) / (2 * eps) for e in np.eye(7)])
    assert np.abs(fd - analytic).max() > 1e-4


def test_skl_gradient_flows_through_q_in_mixture() -> None:
    # The official code does not detach anything in SKL: autograd equals the full finite-difference gradient.
    alpha = 0.3
    s, t = _logits(6, shape=(1, 1, 5))
    s.requires_grad_(True)
    L.skew_kl(s, t, alpha).backward()
    p = _softmax(t[0, 0].numpy())

    def full(z: np.ndarray) -> float:
        qq = _softmax(z)
        return float((p * (np.log(p) - np.log(alpha * p + (1 - alpha) * qq))).sum())

    z0 = s.detach()[0, 0].numpy()
    eps = 1e-6
    fd = np.array([(full(z0 + eps * e) - full(z0 - eps * e)) / (2 * eps) for e in np.eye(5)])
    np.testing.assert_allclose(s.grad[0, 0].numpy(), fd, rtol=1e-6, atol=1e-9)


def test_distillm2_gradients_split_by_data_type() -> None:
    # Student logits on teacher responses get (1-beta) * grad SKL only; on student responses beta * grad SRKL only.
    st, tt = _logits(7)
    ss, ts = _logits(13)
    st.requires_grad_(True)
    ss.requires_grad_(True)
    beta = 0.3
    L.distillm2_loss(st, tt, ss, ts, 0.1, beta, reduction="token").backward()
    g_t, g_s = st.grad.clone(), ss.grad.clone()
    st.grad = ss.grad = None
    L.skew_kl(st, tt, 0.1).backward()
    L.skew_reverse_kl(ss, ts, 0.1).backward()
    torch.testing.assert_close(g_t, (1 - beta) * st.grad)
    torch.testing.assert_close(g_s, beta * ss.grad)


def test_mask_handling() -> None:
    s, t = _logits(8)
    # Masked-out positions do not matter.
    s2, t2 = s.clone(), t.clone()
    s2[~MASK] = 100.0 * torch.randn_like(s2[~MASK])
    t2[~MASK] = -7.0
    for fn in (L.forward_kl, L.reverse_kl):
        assert float(fn(s, t, MASK)) == pytest.approx(float(fn(s2, t2, MASK)), rel=1e-12)
    assert float(L.skew_reverse_kl(s, t, 0.2, MASK)) == pytest.approx(float(L.skew_reverse_kl(s2, t2, 0.2, MASK)))
    # Bool and float masks agree; float weights act as weights.
    assert float(L.forward_kl(s, t, MASK)) == pytest.approx(float(L.forward_kl(s, t, MASK.double())))
    w = torch.tensor([[0.5, 2.0, 0.0], [0.0, 1.0, 1.0]], dtype=torch.float64)
    per = _np_per_token("kl", s.numpy(), t.numpy())
    assert float(L.forward_kl(s, t, w)) == pytest.approx((per * w.numpy()).sum() / w.numpy().sum(), rel=1e-9)
    # Token mean vs per-sequence mean: different when sequences have different numbers of tokens.
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    tok = float(L.forward_kl(s, t, mask, reduction="token"))
    seq = float(L.forward_kl(s, t, mask, reduction="sequence"))
    assert tok == pytest.approx(_np_reduce(per, mask.numpy(), "token"), rel=1e-9)
    assert seq == pytest.approx(_np_reduce(per, mask.numpy(), "sequence"), rel=1e-9)
    assert abs(tok - seq) > 1e-6
    # An all-masked batch gives 0, not nan.
    assert float(L.forward_kl(s, t, torch.zeros(2, 3, dtype=torch.bool))) == 0.0
    with pytest.raises(ValueError):
        L.forward_kl(s, t, torch.ones(3, 2))


def test_distillm2_loss_is_weighted_sum_per_sequence() -> None:
    st, tt = _logits(9)
    ss, ts = _logits(10, shape=(2, 4, 6))
    mt = MASK
    ms = torch.tensor([[1, 1, 1, 0], [0, 0, 1, 1]], dtype=torch.bool)
    skl = _np_reduce(_np_per_token("skl", st.numpy(), tt.numpy(), 0.1), mt.numpy(), "sequence")
    srkl = _np_reduce(_np_per_token("srkl", ss.numpy(), ts.numpy(), 0.1), ms.numpy(), "sequence")
    for beta in (0.0, 0.5, 0.75, 1.0):
        got = float(L.distillm2_loss(st, tt, ss, ts, 0.1, beta, mt, ms))
        assert got == pytest.approx((1 - beta) * skl + beta * srkl, rel=1e-9)
    # Two alphas (the official base_alpha_1 / base_alpha_2).
    srkl3 = _np_reduce(_np_per_token("srkl", ss.numpy(), ts.numpy(), 0.3), ms.numpy(), "sequence")
    got = float(L.distillm2_loss(st, tt, ss, ts, (0.1, 0.3), 0.5, mt, ms))
    assert got == pytest.approx(0.5 * skl + 0.5 * srkl3, rel=1e-9)
    # Per-sequence alpha tensors equal running each sequence with its own float alpha.
    a = torch.tensor([0.05, 0.2], dtype=torch.float64)
    vec = float(L.skew_kl(st, tt, a, mt, reduction="sequence"))
    each = [_np_reduce(_np_per_token("skl", st.numpy()[i:i + 1], tt.numpy()[i:i + 1], float(a[i])),
                       mt.numpy()[i:i + 1]) for i in range(2)]
    assert vec == pytest.approx(sum(each) / 2, rel=1e-9)


def test_official_loss_form_equals_paper_form_times_two() -> None:
    # Official kd_loss: (2-b) SKL + b SRKL with b = 1 + 0.5 min(1, 2 step/max); paper: (1-beta) SKL + beta SRKL.
    max_steps = 100
    assert L.beta_schedule(37, max_steps) == 0.5  # released gradual_beta=False
    for step in (0, 10, 25, 49, 50, 80, 100):
        b = 1.0 + 0.5 * min(1.0, 2 * step / max_steps)
        beta = L.beta_schedule(step, max_steps, gradual=True)
        assert beta == pytest.approx(b / 2)
    assert L.beta_schedule(0, max_steps, True) == 0.5
    assert L.beta_schedule(50, max_steps, True) == 0.75 and L.beta_schedule(90, max_steps, True) == 0.75


def test_adaptive_alpha_formula() -> None:
    # The last two samples have gaps g = 0.19 and 0.185 against m = 0.2, so (1-a0)m/g lies in
    # (0.9, 0.99) and their alpha strictly inside (0.01, a0): the formula, not a clip bound, decides.
    lp = torch.tensor([-0.1, -1.0, -2.0, -0.5, math.log(0.6), math.log(0.7)])
    lq = torch.tensor([-1.5, -1.1, -0.5, -0.6, math.log(0.41), math.log(0.515)])
    m, a0 = 0.2, 0.1
    got = L.adaptive_alpha(lp, lq, m, a0).numpy()
    g = np.exp(lp.numpy()) - np.exp(lq.numpy())
    want = np.clip(1 - (1 - a0) * m / (g + 1e-5), 0.01, a0)
    np.testing.assert_allclose(got, want, rtol=1e-4)  # float32 near the cancellation
    got_s = L.adaptive_alpha(lp, lq, m, a0, on_student_responses=True).numpy()
    want_s = np.clip(1 - (1 - a0) * m / (-g + 1e-5), 0.01, a0)
    np.testing.assert_allclose(got_s, want_s, rtol=1e-4)  # float32 near the cancellation
    assert got.min() >= 0.01 and got.max() <= a0
    interior = got[4:]
    assert ((interior > 0.011) & (interior < a0 - 0.001)).all(), interior
    np.testing.assert_allclose(interior, [1 - 0.9 * 0.2 / (0.19 + 1e-5), 1 - 0.9 * 0.2 / (0.185 + 1e-5)], rtol=1e-4)


def test_rejects_bad_inputs() -> None:
    s, t = _logits(11)
    with pytest.raises(ValueError):
        L.skew_kl(s, t, 1.5)
    with pytest.raises(ValueError):
        L.forward_kl(s, t[:, :2])
    with pytest.raises(ValueError):
        L.distillm2_loss(s, t, s, t, 0.1, 2.0)


def _trl_gkd():
    try:
        from trl.experimental.gkd import GKDTrainer
    except Exception as exc:  # pragma: no cover - depends on the installed trl
        pytest.skip(f"trl.experimental.gkd not importable: {exc}")
    return GKDTrainer


@pytest.mark.parametrize("beta", [0.0, 0.1, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_generalized_jsd_equals_trl(beta: float, temperature: float) -> None:
    gkd = _trl_gkd()
    s, t = _logits(12, shape=(3, 5, 11))
    s, t = s.float(), t.float()
    labels = torch.randint(0, 11, (3, 5), generator=torch.Generator().manual_seed(0))
    labels[0, :2] = -100
    labels[2, 4] = -100
    trl = gkd.generalized_jsd_loss(s, t, labels=labels, beta=beta, temperature=temperature)
    ours = L.generalized_jsd(s, t, beta, labels != -100, temperature=temperature)
    assert float(ours) == pytest.approx(float(trl), rel=1e-5, abs=1e-7)
