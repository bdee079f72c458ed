"""Reference tests of GANQ's core math (lmforge.methods.ganq.core).

Small float64 problems checked against naive per-row / per-entry loops and brute force, plus one
correlated-input layer where GANQ must beat unweighted k-means and per-channel RTN.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from lmforge.common.errors import UserError
from lmforge.common.quant import quantize_rtn, relative_output_error
from lmforge.methods.ganq.config import GANQConfig
from lmforge.methods.ganq.core import (
    ganq_quantize,
    init_kmeans,
    init_uniform,
    layer_objective,
    nearest_codes,
    prepare_hessian,
    s_step,
    t_step,
)


def correlated_layer(m: int, n: int, tokens: int, seed: int, dtype=torch.float64):
    """``W`` (m, n) and ``H = X^T X / N`` for correlated inputs ``X = Z A``."""
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(n, n, generator=g, dtype=torch.float64) / n**0.5
    X = torch.randn(tokens, n, generator=g, dtype=torch.float64) @ A
    W = torch.randn(m, n, generator=g, dtype=torch.float64) * 0.05
    return W.to(dtype), (X.T @ X / tokens).to(dtype)


# --------------------------------------------------------------------------------------------------
# S-step


def naive_s_step(W: torch.Tensor, L: torch.Tensor, T: torch.Tensor, mask=None) -> list[list[int]]:
    """Q[i, j] = argmin_s |W[i, j] + (1 / L[j, j]) sum_{u > j} r[i, u] L[u, j] - T[i, s]|, j = n-1 .. 0,
    one row and one column at a time in plain Python floats."""
    m, n = W.shape
    Wl, Ll, Tl = W.tolist(), L.tolist(), T.tolist()
    codes = [[0] * n for _ in range(m)]
    for i in range(m):
        r = [0.0] * n
        for j in range(n - 1, -1, -1):
            fb = sum(r[u] * Ll[u][j] for u in range(j + 1, n))
            target = Wl[i][j] + fb / Ll[j][j]
            dist = [abs(target - t) for t in Tl[i]]
            s = dist.index(min(dist))
            codes[i][j] = s
            r[j] = 0.0 if (mask is not None and bool(mask[i, j])) else Wl[i][j] - Tl[i][s]
    return codes


def column_terms(resid: list[float], L: list[list[float]]) -> list[float]:
    """The n terms (sum_{u >= j} r_u L[u, j])^2 whose sum is ||r L||^2 for lower-triangular L."""
    n = len(resid)
    return [sum(resid[u] * L[u][j] for u in range(j, n)) ** 2 for j in range(n)]


def random_pd(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(n, n, generator=g, dtype=torch.float64)
    X = torch.randn(3 * n, n, generator=g, dtype=torch.float64) @ A
    return X.T @ X / (3 * n)


@pytest.mark.parametrize("n,block", [(4, 128), (9, 4), (9, 1)])
def test_s_step_matches_naive_back_substitution(n: int, block: int) -> None:
    g = torch.Generator().manual_seed(n)
    m, K = 5, 4  # 2-bit
    W = torch.randn(m, n, generator=g, dtype=torch.float64)
    T = torch.randn(m, K, generator=g, dtype=torch.float64)  # unsorted on purpose
    H = random_pd(n, seed=10 + n)
    _, L, _, _ = prepare_hessian(H, 0.0)
    codes = s_step(W, L, T, block_size=block)
    assert codes.tolist() == naive_s_step(W, L, T)
    # Blocking is only a re-association of the same sums.
    assert torch.equal(codes, s_step(W, L, T, block_size=2))

    # The objective is ||(W - W') L||_F^2 = sum_j (sum_{u >= j} r_u L[u, j])^2 = tr(D H D^T).
    W_hat = T.gather(1, codes)
    Ll = L.tolist()
    total = 0.0
    for i in range(m):
        resid = (W[i] - W_hat[i]).tolist()
        terms = column_terms(resid, Ll)
        total += sum(terms)
        # Greedy property: given the codes of the later columns, the chosen code minimises term j
        # (no earlier column enters term j), checked over every alternative code.
        for j in range(n):
            for s in range(K):
                alt = list(resid)
                alt[j] = float(W[i, j] - T[i, s])
                assert column_terms(alt, Ll)[j] >= terms[j] - 1e-12
    assert total == pytest.approx(layer_objective(W, W_hat, H), rel=1e-10)
    assert total == pytest.approx(float(((W - W_hat) @ L).pow(2).sum()), rel=1e-10)

    if n == 4:
        # Brute force over all 4^4 code vectors: the S-step is greedy, the optimum can only be lower.
        for i in range(m):
            best = min(
                layer_objective(W[i : i + 1], T[i, list(c)][None], H)
                for c in itertools.product(range(K), repeat=n)
            )
            assert best <= layer_objective(W[i : i + 1], W_hat[i : i + 1], H) + 1e-12


def test_s_step_with_outliers_and_diagonal_hessian() -> None:
    g = torch.Generator().manual_seed(3)
    m, n, K = 4, 7, 4
    W = torch.randn(m, n, generator=g, dtype=torch.float64)
    T = torch.randn(m, K, generator=g, dtype=torch.float64)
    mask = torch.rand(m, n, generator=g) < 0.3
    _, L, _, _ = prepare_hessian(random_pd(n, 5), 0.0)
    assert s_step(W, L, T, outlier_mask=mask, block_size=3).tolist() == naive_s_step(W, L, T, mask)
    # With a diagonal H there is no feedback: the S-step is plain nearest-value rounding.
    _, Ld, _, _ = prepare_hessian(torch.diag(torch.rand(n, generator=g, dtype=torch.float64) + 0.1), 0.0)
    assert torch.equal(s_step(W, Ld, T), nearest_codes(W, T))


# --------------------------------------------------------------------------------------------------
# T-step


def naive_t_step(W: torch.Tensor, L: torch.Tensor, codes: torch.Tensor, T_old: torch.Tensor) -> torch.Tensor:
    """Per row: least squares min_t ||(W_i - t S_i) L||^2 over the used entries (numpy lstsq)."""
    m, K = T_old.shape
    out = T_old.clone()
    Ln = L.numpy()
    for i in range(m):
        S = np.zeros((K, W.shape[1]))
        S[codes[i].numpy(), np.arange(W.shape[1])] = 1.0
        used = S.sum(axis=1) > 0
        design = (S[used] @ Ln).T  # (n, K_used): (t S L)^T = L^T S^T t^T
        t, *_ = np.linalg.lstsq(design, W[i].numpy() @ Ln, rcond=None)
        out[i, torch.from_numpy(used)] = torch.from_numpy(t)
    return out


def test_t_step_is_optimal_and_never_increases_objective() -> None:
    m, n, bits = 12, 48, 3
    W, H = correlated_layer(m, n, tokens=4 * n, seed=1)
    cfg = GANQConfig(bits=bits, damp=0.0, init="uniform", t_step_dtype="float64")
    H_fit, L, _, _ = prepare_hessian(H, cfg.damp)
    assert torch.allclose(H_fit, H, rtol=0, atol=1e-15)  # no dampening: the fitted objective is the true one
    T = init_uniform(W, cfg.levels)
    for _ in range(cfg.iters):
        codes = s_step(W, L, T)
        before = layer_objective(W, T.gather(1, codes), H)
        T_new = t_step(W, H_fit, codes, T)
        after = layer_objective(W, T_new.gather(1, codes), H)
        assert after <= before * (1 + 1e-12)
        ref = naive_t_step(W, L, codes, T)
        assert torch.allclose(T_new, ref, rtol=1e-7, atol=1e-9)
        # The driver's default float32 product: the same codebook to 1e-6 of its scale (~1e-7 measured).
        T32 = t_step(W, H_fit, codes, T, gemm_dtype=torch.float32)
        assert (T32 - ref).abs().max() <= 1e-6 * ref.abs().max()
        T = T_new

    # An entry no weight uses keeps its old value (the pseudo-inverse would set it to 0).
    codes = codes.clone()
    codes[codes == 5] = 4
    T_old = T + 0.123
    T_new = t_step(W, H_fit, codes, T_old)
    assert torch.equal(T_new[:, 5], T_old[:, 5])
    assert torch.allclose(T_new, naive_t_step(W, L, codes, T_old), rtol=1e-7, atol=1e-9)

    # The driver records the same monotonicity over all its iterations.
    _, hist = ganq_quantize(W, H, cfg, return_history=True)
    assert len(hist.t_objectives) == cfg.iters
    for s_obj, t_obj in zip(hist.s_objectives, hist.t_objectives):
        assert t_obj <= s_obj * (1 + 1e-12)


# --------------------------------------------------------------------------------------------------
# Driver


@pytest.mark.parametrize("init,outlier_frac", [("uniform", 0.0), ("kmeans", 0.0), ("kmeans", 0.02)])
def test_final_objective_not_above_initial(init: str, outlier_frac: float) -> None:
    m, n, bits = 24, 96, 3
    W, H = correlated_layer(m, n, tokens=4 * n, seed=2, dtype=torch.float32)
    cfg = GANQConfig(bits=bits, init=init, outlier_frac=outlier_frac, select="best")
    q, hist = ganq_quantize(W, H, cfg, return_history=True)
    H_fit, _, _, _ = prepare_hessian(H, cfg.damp)

    # The initial codebook's assignment, recomputed here by brute-force nearest value.
    W64 = W.double()
    k = round(outlier_frac * n)
    inl = W64.sort(dim=1).values[:, k // 2 : n - (k + 1) // 2]
    if init == "kmeans":
        T0 = init_kmeans(inl, cfg.levels, cfg.kmeans_iters)
    else:
        lo, hi = inl.min(1, keepdim=True).values, inl.max(1, keepdim=True).values
        T0 = lo + (hi - lo) * torch.linspace(0, 1, cfg.levels, dtype=torch.float64)
    W0 = T0.gather(1, (W64[:, :, None] - T0[:, None, :]).abs().argmin(-1))
    if q.n_outliers:
        W0[q.outlier_rows.long(), q.outlier_cols.long()] = W64[q.outlier_rows.long(), q.outlier_cols.long()]
    init_obj = layer_objective(W64, W0, H_fit)
    assert hist.init_objective == pytest.approx(init_obj, rel=1e-9)
    final_obj = layer_objective(W64, q.dequantize(), H_fit)
    assert final_obj <= init_obj
    # Not only thanks to keeping the best iterate: the last iterate itself is well below the start.
    assert hist.t_objectives[-1] < 0.9 * init_obj
    # The returned (float32) weight is, row by row, the best iterate found: no worse than any
    # single iterate's total.
    assert final_obj <= min([hist.init_objective, *hist.t_objectives]) * (1 + 1e-5)


def test_default_returns_the_last_iterate_of_the_papers_loop() -> None:
    """Algorithm 1 written out from the steps: T^0 uniform, K times S-step then T-step, return (T^K, Q^K),
    with H factorised undampened when it is positive definite (Remark 3.1)."""
    W, H = correlated_layer(16, 64, tokens=256, seed=3, dtype=torch.float32)
    cfg = GANQConfig(bits=3, iters=4, t_step_dtype="float64")  # the float64 steps below, bit for bit
    assert (GANQConfig().init, GANQConfig().select, GANQConfig().damp_when) == ("uniform", "last", "needed")
    q, hist = ganq_quantize(W, H, cfg, return_history=True)
    H64 = H.double()
    L = torch.linalg.cholesky(H64)  # positive definite: no lambda*I
    W64 = W.double()
    T = init_uniform(W64, 8)
    for _ in range(4):
        codes = s_step(W64, L, T, block_size=cfg.block_size)  # the driver's blocking: same sums, same order
        T = t_step(W64, H64, codes, T)
    torch.testing.assert_close(q.codebook, T.float(), rtol=0, atol=1e-6)
    assert torch.equal(q.codes.long(), codes)
    assert hist.damp_used == 0.0 and hist.best_iter == 4
    # The last iterate, not the best: its objective is the last T-step's.
    assert layer_objective(W64, q.dequantize(), H64) == pytest.approx(hist.t_objectives[-1], rel=1e-6)


def test_dampening_only_when_needed() -> None:
    W, H = correlated_layer(4, 12, tokens=6, seed=1)  # 6 tokens, 12 inputs: H singular
    H_fit, _, d, _ = prepare_hessian(H, 0.01)
    assert d >= 0.01 and torch.allclose(H_fit, H + d * float(H.diagonal().mean()) * torch.eye(12, dtype=H.dtype))
    W, H = correlated_layer(4, 12, tokens=60, seed=1)
    H_fit, _, d, _ = prepare_hessian(H, 0.01)
    assert d == 0.0 and torch.equal(H_fit, (H + H.T) / 2)
    _, _, d, _ = prepare_hessian(H, 0.01, always=True)
    assert d == 0.01


def test_full_rows_are_the_highest_variance_rows_kept_exactly() -> None:
    W, H = correlated_layer(12, 40, tokens=160, seed=6, dtype=torch.float32)
    W[5] *= 4.0
    W[9] *= 3.0
    q = ganq_quantize(W, H, GANQConfig(bits=3, iters=2, full_rows=2))
    Wq = q.dequantize()
    assert torch.equal(Wq[5], W[5]) and torch.equal(Wq[9], W[9])
    others = [i for i in range(12) if i not in (5, 9)]
    assert not torch.equal(Wq[others], W[others])
    assert q.n_outliers == 2 * 40


def test_init_both_is_rowwise_best_of_uniform_and_kmeans() -> None:
    W, H = correlated_layer(32, 128, tokens=512, seed=7, dtype=torch.float32)
    H_fit, _, _, _ = prepare_hessian(H, 0.01)

    def rows(q):
        D = W.double() - q.dequantize().double()
        return ((D @ H_fit) * D).sum(dim=1)

    r_both = rows(ganq_quantize(W, H, GANQConfig(bits=3, init="both", select="best")))
    r_uni = rows(ganq_quantize(W, H, GANQConfig(bits=3, init="uniform", select="best")))
    r_km = rows(ganq_quantize(W, H, GANQConfig(bits=3, init="kmeans", select="best")))
    assert torch.all(r_both <= torch.minimum(r_uni, r_km) * (1 + 1e-6) + 1e-12)
    # And the choice matters: each init wins some rows on this layer, or "both" is strictly better in total.
    assert r_both.sum() < min(r_uni.sum(), r_km.sum()) * (1 - 1e-6) or torch.equal(r_uni, r_km)


@pytest.mark.parametrize("outlier_frac", [0.0, 0.03])
def test_gather_reproduces_dequantized_weight(outlier_frac: float) -> None:
    m, n, bits = 10, 70, 4
    W, H = correlated_layer(m, n, tokens=3 * n, seed=4, dtype=torch.float32)
    q = ganq_quantize(W, H, GANQConfig(bits=bits, outlier_frac=outlier_frac, iters=3))
    assert q.codes.dtype == torch.uint8 and q.codes.shape == (m, n)
    assert q.codebook.dtype == torch.float32 and q.codebook.shape == (m, 2**bits)
    manual = torch.empty(m, n)
    for i in range(m):
        for j in range(n):
            manual[i, j] = q.codebook[i, int(q.codes[i, j])]
    k = round(outlier_frac * n)
    assert q.n_outliers == m * k
    if k:
        rows, cols = q.outlier_rows.long(), q.outlier_cols.long()
        manual[rows, cols] = q.outlier_vals
        assert torch.equal(q.outlier_vals, W[rows, cols])  # kept exactly
        for i in range(m):  # the ceil(k/2) largest and floor(k/2) smallest values of each row
            got = set(cols[rows == i].tolist())
            order = W[i].argsort().tolist()
            assert got == set(order[: k // 2]) | set(order[n - (k + 1) // 2 :])
    assert torch.equal(manual, q.dequantize())


@pytest.mark.parametrize("bits", [3, 4])
def test_beats_kmeans_and_rtn_on_correlated_layer(bits: int) -> None:
    m, n = 64, 256
    W, H = correlated_layer(m, n, tokens=4 * n, seed=7, dtype=torch.float32)
    ganq = relative_output_error(W, ganq_quantize(W, H, GANQConfig(bits=bits)).dequantize(), H)
    # Unweighted per-row k-means: the k-means codebook with nearest-value codes, no H at all.
    kmeans = relative_output_error(
        W, ganq_quantize(W, H, GANQConfig(bits=bits, iters=0, kmeans_iters=100)).dequantize(), H
    )
    rtn = relative_output_error(W, quantize_rtn(W, bits, 0, sym=False).dequantize(), H)
    assert ganq < 0.9 * kmeans, (ganq, kmeans)
    assert ganq < 0.9 * rtn, (ganq, rtn)


def test_dead_columns_and_shapes() -> None:
    m, n = 6, 20
    W, H = correlated_layer(m, n, tokens=4 * n, seed=5)
    H[3, :] = 0
    H[:, 3] = 0
    H_fit, L, _, n_dead = prepare_hessian(H, 0.01)
    assert n_dead == 1 and H_fit[3, 3] > 0
    q, hist = ganq_quantize(W, H, GANQConfig(bits=2), return_history=True)
    assert hist.dead_columns == 1 and torch.isfinite(q.codebook).all()
    with pytest.raises(UserError):
        ganq_quantize(W, H[:5, :5])


# --------------------------------------------------------------------------------------------------
# Config


@pytest.mark.parametrize("bits", [0, 1, 9, 16, 2.5, True, "4"])
def test_config_rejects_bad_bits(bits) -> None:
    with pytest.raises(UserError, match="bits"):
        GANQConfig(bits=bits)


@pytest.mark.parametrize(
    "kwargs",
    [{"init": "random"}, {"damp": -0.1}, {"outlier_frac": 0.5}, {"outlier_frac": -0.01}, {"iters": -1},
     {"select": "first"}, {"damp_when": "never"}, {"full_rows": -1}, {"full_rows": 1.5}, {"t_step_dtype": "bf16"}],
)
def test_config_rejects_bad_settings(kwargs) -> None:
    with pytest.raises(UserError):
        GANQConfig(**kwargs)


def test_config_defaults() -> None:
    cfg = GANQConfig()
    assert (cfg.bits, cfg.iters, cfg.damp, cfg.outlier_frac) == (4, 10, 0.01, 0.0)
    assert (cfg.init, cfg.select, cfg.damp_when, cfg.full_rows) == ("uniform", "last", "needed", 0)
    for bits in range(2, 9):
        assert GANQConfig(bits=bits).levels == 2**bits


def test_stacked_linears_sharing_h_give_each_linears_own_result() -> None:
    """apply_ganq quantizes q/k/v (gate/up) in one call on their stacked rows: the split result must be
    what each linear gets alone, outliers included."""
    from lmforge.methods.ganq.apply import _split_rows

    W, H = correlated_layer(30, 64, tokens=256, seed=8, dtype=torch.float32)
    parts = [W[:12], W[12:20], W[20:]]
    cfg = GANQConfig(bits=3, iters=3, outlier_frac=0.05, init="both")
    split = _split_rows(ganq_quantize(W, H, cfg), [12, 8, 10])
    H64 = H.double()
    for part, got in zip(parts, split):
        alone = ganq_quantize(part, H, cfg)
        # Up to float rounding (a stacked product may sum in another order): a code may rarely flip,
        # so the codes agree almost everywhere and each row's objective to 1e-4.
        assert (got.codes == alone.codes).float().mean() > 0.999
        def rows(q, W=part):
            D = W.double() - q.dequantize().double()
            return ((D @ H64) * D).sum(dim=1)
        torch.testing.assert_close(rows(got), rows(alone), rtol=1e-4, atol=0)
        assert got.n_outliers == alone.n_outliers == part.shape[0] * round(0.05 * 64)
        assert torch.equal(got.outlier_rows.sort().values, alone.outlier_rows.sort().values)
