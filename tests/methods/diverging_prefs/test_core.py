"""The losses and metrics of diverging preferences against closed forms, scipy and scikit-learn."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.special import expit
from scipy.stats import entropy, norm
from sklearn.metrics import roc_auc_score

from lmforge.methods.diverging_prefs import core

torch.set_num_threads(1)


def _scipy_interval_probs(dmu: float, sd: float, cuts=(0.5, 1.5)) -> np.ndarray:
    c0, c1 = cuts
    edges = [-math.inf, -c1, -c0, c0, c1, math.inf]
    return np.array([norm.cdf(edges[i + 1], dmu, sd) - norm.cdf(edges[i], dmu, sd) for i in range(5)])


@pytest.mark.parametrize("dmu,sd", [(0.0, 1.0), (1.2, 0.3), (-2.0, 2.5), (0.7, 0.05)])
def test_interval_probs_match_scipy_normal_cdf(dmu, sd):
    p = core.interval_probs(torch.tensor([dmu], dtype=torch.float64), torch.tensor([sd], dtype=torch.float64))
    np.testing.assert_allclose(p[0].numpy(), _scipy_interval_probs(dmu, sd), atol=1e-12)
    assert abs(float(p.sum()) - 1.0) < 1e-12


def test_difference_sd_with_correlation():
    sa, sb = torch.tensor([0.5, 2.0]), torch.tensor([1.5, 1.0])
    for rho in (0.0, 0.4, -0.3):
        want = np.sqrt(sa.numpy() ** 2 + sb.numpy() ** 2 - 2 * rho * sa.numpy() * sb.numpy())
        np.testing.assert_allclose(core.difference_sd(sa, sb, rho).numpy(), want, rtol=1e-6)


def test_meanvar_kl_equals_scipy_entropy_and_vanishes_at_the_truth():
    rng = np.random.default_rng(0)
    n = 6
    mu_a, mu_b = rng.normal(size=n), rng.normal(size=n)
    sa, sb = rng.uniform(0.2, 2, n), rng.uniform(0.2, 2, n)
    hist = core.label_histogram([rng.integers(-2, 3, size=4).tolist() for _ in range(n)])
    t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    loss = core.meanvar_kl_loss(t(mu_a), t(sa), t(mu_b), t(sb), t(hist), rho=0.2)
    sd = np.sqrt(sa**2 + sb**2 - 2 * 0.2 * sa * sb)
    want = np.mean([entropy(hist[i], _scipy_interval_probs(mu_a[i] - mu_b[i], sd[i])) for i in range(n)])
    assert float(loss) == pytest.approx(want, rel=1e-9)
    # The histogram the model itself predicts has zero KL.
    own = core.interval_probs(t(mu_a - mu_b), core.difference_sd(t(sa), t(sb)))
    assert float(core.meanvar_kl_loss(t(mu_a), t(sa), t(mu_b), t(sb), own)) == pytest.approx(0.0, abs=1e-10)


def test_meanvar_kl_gradients_are_exact():
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(4, dtype=torch.float64, generator=g, requires_grad=True) for _ in range(2)]
    sig = [torch.rand(4, dtype=torch.float64, generator=g).add(0.3).requires_grad_() for _ in range(2)]
    hist = torch.tensor(core.label_histogram([[2, 1, 0, -1], [0, 0, 1, 2], [-2, -2, -1, 0], [1, 1, 1, -2]]))
    assert torch.autograd.gradcheck(lambda a, sa, b, sb: core.meanvar_kl_loss(a, sa, b, sb, hist),
                                    (args[0], sig[0], args[1], sig[1]))


def test_meanvar_nll_bt_and_class_losses_closed_form():
    mu_a, mu_b = np.array([0.3, -1.0, 2.0]), np.array([0.0, 0.5, -1.0])
    sa, sb = np.array([1.0, 0.5, 0.2]), np.array([0.5, 0.5, 0.3])
    target = np.array([1.0, 0.25, 0.5])
    t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    z = (mu_a - mu_b) / np.sqrt(sa**2 + sb**2)
    want = -np.mean(target * norm.logcdf(z) + (1 - target) * norm.logsf(z))
    assert float(core.meanvar_nll_loss(t(mu_a), t(sa), t(mu_b), t(sb), t(target))) == pytest.approx(want, rel=1e-9)
    q = expit(mu_a - mu_b)
    want_bt = -np.mean(target * np.log(q) + (1 - target) * np.log(1 - q))
    assert float(core.bt_loss(t(mu_a), t(mu_b), t(target))) == pytest.approx(want_bt, rel=1e-9)
    logits = np.array([[0.1, 2.0, -1.0, 0.0, 0.5], [1.0, 1.0, 1.0, 1.0, 1.0]])
    hist = np.array([[0.0, 0.5, 0.0, 0.5, 0.0], [0.25, 0.25, 0.0, 0.0, 0.5]])
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    want_cls = np.mean([entropy(hist[i], probs[i]) for i in range(2)])
    assert float(core.class_kl_loss(t(logits), t(hist))) == pytest.approx(want_cls, rel=1e-9)


def test_nll_loss_is_finite_for_confident_models():
    # float32 with a huge margin: log(1 - Phi(z)) must not be log(0).
    loss = core.meanvar_nll_loss(torch.tensor([30.0]), torch.tensor([0.01]), torch.tensor([0.0]),
                                 torch.tensor([0.01]), torch.tensor([0.5]))
    assert torch.isfinite(loss)


def test_pair_kinds_majority_and_soft_preference():
    assert core.pair_kind([2, 1, -1, 0]) == core.DIVERGING
    assert core.pair_kind([2, 1, 0, 0]) == core.HIGH_AGREEMENT
    assert core.pair_kind([-1, -2, 0]) == core.HIGH_AGREEMENT
    assert core.pair_kind([0, 0]) == core.TIE
    assert core.is_substantially_diverging([2, -2, 0]) and not core.is_substantially_diverging([2, -1, 1])
    assert core.majority_side([1, 1, -2]) == 1 and core.majority_side([-1, 0, 0]) == -1
    assert core.majority_side([2, -1]) == 1 and core.majority_side([1, -1]) == 0
    assert core.soft_preference([1, 1, -1, 0]) == pytest.approx(2 / 3) and core.soft_preference([0]) is None
    with pytest.raises(ValueError):
        core.check_labels([3])
    np.testing.assert_allclose(core.label_histogram([[2, 2, 0, -1]]), [[0, 0.25, 0.25, 0, 0.5]])


def test_roc_auc_is_the_pairwise_win_rate_with_ties_as_halves():
    rng = np.random.default_rng(1)
    for _ in range(3):
        y = rng.random(60) < 0.4
        s = np.round(rng.normal(size=60) + y, 1)  # rounded: many ties
        pos, neg = s[y], s[~y]
        brute = np.mean([(p > n) + 0.5 * (p == n) for p in pos for n in neg])
        assert core.roc_auc(s, y) == pytest.approx(brute, abs=1e-12)
    with pytest.raises(ValueError, match="one positive and one negative"):
        core.roc_auc([0.1, 0.2], [True, True])


def test_preference_accuracy_and_diverging_auroc_by_hand():
    labels = [[1, 2], [-1, -1], [0, 0], [1, -1], [2, -2, 1], [-2, 0]]
    margins = [0.5, 0.3, 1.0, -2.0, 0.0, 0.0]
    # high-agreement pairs: 0 (A, right), 1 (B, wrong), 5 (B, zero margin: one half)
    assert core.preference_accuracy(margins, labels) == pytest.approx((1 + 0 + 0.5) / 3)
    div = np.array([0.1, 0.9, 5.0, 0.5, 0.7, 0.2])
    keep = [0, 1, 3, 4, 5]
    y = [False, False, True, True, False]
    assert core.diverging_id_auroc(div, labels) == pytest.approx(roc_auc_score(y, div[keep]))
    # substantial: only pair 4 is a positive
    assert core.diverging_id_auroc(div, labels, substantial=True) == pytest.approx(
        roc_auc_score([False, False, True, False], div[[0, 1, 4, 5]]))


def test_divergence_scores_and_fit_lambda_is_the_grid_argmax():
    rng = np.random.default_rng(2)
    n = 300
    sa, sb = rng.uniform(0.1, 2, n), rng.uniform(0.1, 2, n)
    mu_a, mu_b = rng.normal(size=n), rng.normal(size=n)
    labels = [([1, -1] if rng.random() < (sa[i] + sb[i]) / 4 else [1, 1]) for i in range(n)]
    lam = core.fit_lambda(mu_a, mu_b, sa, sb, labels)
    aucs = {g: core.diverging_id_auroc(core.meanvar_divergence(mu_a, mu_b, sa, sb, g), labels) for g in core.LAMBDA_GRID}
    assert aucs[lam] == max(aucs.values())
    np.testing.assert_allclose(core.meanvar_divergence(mu_a, mu_b, sa, sb, 2.0), 2 * (sa + sb) - np.abs(mu_a - mu_b))
    np.testing.assert_allclose(core.meanvar_divergence(mu_a, mu_b, sa, sb, math.inf), sa + sb)
    np.testing.assert_allclose(core.bt_divergence(mu_a, mu_b), -np.abs(mu_a - mu_b))
    pa = np.array([[0.5, 0, 0, 0, 0.5]]); pb = np.array([[0.1, 0.2, 0.4, 0.2, 0.1]])  # noqa: E702
    np.testing.assert_allclose(core.class_divergence(pa, pb), [0.25 + 0.01])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_log_interval_probs_match_scipy_far_into_the_tails(dtype):
    from scipy.stats import norm

    from lmforge.methods.diverging_prefs.core import log_interval_probs

    edges = [-np.inf, -1.5, -0.5, 0.5, 1.5, np.inf]
    for dm, sd in [(0.3, 1.0), (2.0, 0.42), (-6.0, 1.0), (6.0, 1.0), (0.0, 0.01), (12.0, 0.5), (-30.0, 0.3)]:
        got = log_interval_probs(torch.tensor([dm], dtype=dtype), torch.tensor([sd], dtype=dtype))[0].double().numpy()
        want = []
        for a, b in zip(edges[:-1], edges[1:]):
            za, zb = (a - dm) / sd, (b - dm) / sd
            big, small = (norm.logsf(za), norm.logsf(zb)) if za > 0 else (norm.logcdf(zb), norm.logcdf(za))
            want.append(big + np.log1p(-np.exp(small - big)))
        # relative in log space: the far tails are thousands of nats down and still finite
        np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == torch.float32 else 1e-12, atol=1e-6)


def test_log_interval_probs_gradient_is_finite_in_float32():
    """Where a float32 run once turned every weight into NaN (mean-variance KL, seed 1, epoch 10):
    the open ends put z near -far/sd (-5e4 at sd 0.2), where log_ndtr's float32 backward is inf or
    NaN for about 3% of the z values; and an interval holding all the mass makes log(1 - e^x) with
    x near 0, whose other torch.where branch has an infinite derivative. A grid of states, each
    interval weighted as the KL loss weights them."""
    from lmforge.methods.diverging_prefs.core import log_interval_probs

    dm = torch.linspace(-6.0, 6.0, 41).repeat_interleave(41)
    sd = torch.cat([torch.linspace(0.15, 0.25, 41), torch.linspace(1e-3, 3e-3, 41)]).repeat(21)[: len(dm)]
    d, s = dm.clone().requires_grad_(True), sd.clone().requires_grad_(True)
    out = log_interval_probs(d, s)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    w = torch.rand(out.shape, generator=torch.Generator().manual_seed(0))
    (w * out).sum().backward()
    assert torch.isfinite(d.grad).all() and torch.isfinite(s.grad).all()


def test_meanvar_kl_training_stays_finite_where_it_once_became_nan():
    """The run that went NaN (seed 1, epoch 10 of 25) now trains to the end with a falling loss."""
    from lmforge.methods.diverging_prefs.config import DivergingPrefsConfig
    from lmforge.methods.diverging_prefs.data import simulate_pairs
    from lmforge.methods.diverging_prefs.heads import make_model
    from lmforge.methods.diverging_prefs.train import train_reward_model

    torch.set_num_threads(1)
    train = simulate_pairs(1500, seed=11)
    cfg = DivergingPrefsConfig(head="meanvar", epochs=12, seed=1)
    model = make_model(cfg, in_dim=len(train[0].features_a))
    hist = train_reward_model(model, train, cfg)
    assert all(math.isfinite(h) for h in hist) and hist[-1] < hist[0]
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_kl_loss_pulls_a_confidently_wrong_pair_back():
    """Float32, Δμ = 2 with sd 0.42 and every annotator on the opposite strong label: the interval
    probability underflows as a CDF difference, but the loss keeps a gradient that lowers Δμ and
    widens σ; trained on a split histogram it learns a wide σ instead of collapsing."""
    from lmforge.methods.diverging_prefs.core import meanvar_kl_loss

    mu_a = torch.tensor([2.0], requires_grad=True)
    s_a = torch.tensor([0.3], requires_grad=True)
    loss = meanvar_kl_loss(mu_a, s_a, torch.zeros(1), torch.tensor([0.3]), torch.tensor([[1.0, 0, 0, 0, 0]]))
    loss.backward()
    assert torch.isfinite(loss) and mu_a.grad.item() > 1.0 and s_a.grad.item() < -1.0
    # A substantially diverging pair (25% strongly B, 75% strongly A) from a confident start.
    dm = torch.tensor([3.0], requires_grad=True)
    log_s = torch.tensor([np.log(0.3)], requires_grad=True)
    opt = torch.optim.Adam([dm, log_s], lr=0.05)
    hist = torch.tensor([[0.25, 0.0, 0.0, 0.0, 0.75]])
    for _ in range(600):
        opt.zero_grad()
        sd = log_s.exp() / np.sqrt(2)  # sigma_a = sigma_b = sd: difference sd = log_s.exp()
        meanvar_kl_loss(dm, sd, torch.zeros(1), sd, hist).backward()
        opt.step()
    assert log_s.exp().item() > 1.5  # the disagreement is learnt as spread, not as certainty


def test_tuned_bt_score_and_fit_bt_tau_is_the_grid_argmax():
    """τ = 0 is the paper's −|Δr|, τ = ∞ is +|Δr|; fit_bt_tau returns the grid point (0, dev-gap
    quantiles, ∞) whose score has the best dev AUROC, recomputed here by a loop over the grid."""
    rng = np.random.default_rng(3)
    n = 200
    ra, rb = rng.normal(size=n), rng.normal(size=n)
    gap = np.abs(ra - rb)
    np.testing.assert_array_equal(core.bt_divergence_tuned(ra, rb, 0.0), core.bt_divergence(ra, rb))
    np.testing.assert_array_equal(core.bt_divergence_tuned(ra, rb, math.inf), gap)
    np.testing.assert_allclose(core.bt_divergence_tuned(ra, rb, 0.7), -np.abs(gap - 0.7))
    # diverging pairs: those whose gap sits near the median (neither tiny nor large)
    med = np.median(gap)
    labels = [[2, -2] if abs(g - med) < 0.25 * med else [2, 2] for g in gap]
    grid = [0.0, *[float(np.quantile(gap, q)) for q in core.BT_TAU_QUANTILES], math.inf]
    aucs = [core.diverging_id_auroc(core.bt_divergence_tuned(ra, rb, t), labels) for t in grid]
    tau = core.fit_bt_tau(ra, rb, labels)
    assert tau == grid[int(np.argmax(aucs))] and tau == pytest.approx(med)
    assert max(aucs) > aucs[0] + 0.3  # the paper's score misses a middle band, the tuned one finds it
    # when small gaps diverge, the paper's score is the first best
    assert core.fit_bt_tau(ra, rb, [[2, -2] if g < med else [2, 2] for g in gap]) == 0.0
