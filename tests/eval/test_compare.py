"""ACBench's analysis metrics: closed forms, scipy, and the compression ordering on agent-small."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from scipy import stats

from lmforge.eval.compare import energy, erank, kendall_tau, spearman_rho, topk_agreement


def test_erank_isotropic_is_about_d_and_rank_one_is_one():
    g = torch.Generator().manual_seed(0)
    d = 16
    iso = torch.randn(20_000, d, generator=g)
    assert erank(iso) > 0.98 * d
    v = torch.randn(d, generator=g)
    rank1 = torch.randn(500, 1, generator=g) * v[None, :] + 3.0 * v[None, :]
    assert abs(erank(rank1) - 1.0) < 1e-6
    # Two equal directions: ERank 2.
    u = torch.randn(d, generator=g)
    u = u - (u @ v) / (v @ v) * v
    two = torch.randn(20_000, 1, generator=g) * v / v.norm() + torch.randn(20_000, 1, generator=g) * u / u.norm()
    assert abs(erank(two) - 2.0) < 0.02


def test_rank_correlations_match_scipy():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(50, 10, generator=g)
    b = a + 0.7 * torch.randn(50, 10, generator=g)
    tau, rho = kendall_tau(a, b), spearman_rho(a, b)
    for i in range(50):
        assert float(tau[i]) == pytest.approx(stats.kendalltau(a[i], b[i]).statistic, abs=1e-9)
        assert float(rho[i]) == pytest.approx(stats.spearmanr(a[i], b[i]).statistic, abs=1e-9)


def test_rank_correlations_with_ties_match_scipy_average_ranks():
    # The example: position-broken ties gave 1.0 where scipy gives 0.9487.
    x, y = torch.tensor([[1.0, 1.0, 2.0, 3.0]]), torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    assert float(spearman_rho(x, y)[0]) == pytest.approx(stats.spearmanr([1, 1, 2, 3], [1, 2, 3, 4]).statistic, abs=1e-12)
    assert float(spearman_rho(x, y)[0]) == pytest.approx(0.9486832980505138, abs=1e-12)
    g = torch.Generator().manual_seed(3)
    a = torch.randint(0, 4, (200, 8), generator=g).double()  # many ties in both
    b = (a + torch.randint(-2, 3, (200, 8), generator=g)).double()
    tau, rho = kendall_tau(a, b), spearman_rho(a, b)
    checked = 0
    for i in range(200):
        want_rho = stats.spearmanr(a[i], b[i]).statistic
        want_tau = stats.kendalltau(a[i], b[i]).statistic
        if math.isnan(want_rho):
            assert math.isnan(float(rho[i])) and math.isnan(float(tau[i]))
            continue
        checked += 1
        assert float(rho[i]) == pytest.approx(want_rho, abs=1e-9)
        assert float(tau[i]) == pytest.approx(want_tau, abs=1e-9)
    assert checked > 150


def test_constant_input_has_no_correlation_and_never_reaches_the_mean_as_nan():
    const, ramp = torch.tensor([[2.0, 2.0, 2.0]]), torch.tensor([[1.0, 2.0, 3.0]])
    assert math.isnan(stats.spearmanr([2, 2, 2], [1, 2, 3]).statistic)  # the reference's answer
    assert math.isnan(float(spearman_rho(const, ramp)[0])) and math.isnan(float(kendall_tau(ramp, const)[0]))
    # topk_agreement: positions where the compressed logits tie on the top-k are left out of the mean
    orig = torch.tensor([[3.0, 2.0, 1.0, 0.0], [0.0, 1.0, 2.0, 3.0]])
    comp = torch.tensor([[3.0, 2.0, 1.0, 0.0], [5.0, 5.0, 5.0, 5.0]])
    res = topk_agreement(orig, comp, 3)
    assert res["spearman_rho"] == 1.0 and res["kendall_tau"] == 1.0  # the first position alone
    res = topk_agreement(orig[1:], comp[1:], 3)
    assert res["spearman_rho"] is None and res["kendall_tau"] is None
    json.dumps(res, allow_nan=False)


def test_identical_logits_agree_perfectly_and_energy_is_logsumexp():
    z = torch.randn(3, 7, 50, generator=torch.Generator().manual_seed(2))
    for k in (3, 10, 20):
        assert topk_agreement(z, z.clone(), k) == {"jaccard": 1.0, "kendall_tau": 1.0, "spearman_rho": 1.0}
    reversed_ = topk_agreement(z, -z, 3)
    assert reversed_["jaccard"] == 0.0 and reversed_["kendall_tau"] == -1.0
    torch.testing.assert_close(energy(z), -torch.logsumexp(z.double(), dim=-1))
    torch.testing.assert_close(energy(z, 2.0), -2.0 * torch.logsumexp(z.double() / 2.0, dim=-1))


def test_topk_jaccard_orders_rtn8_rtn4_magnitude(small, small_calib):
    from lmforge.compression import get_method, make_config

    model, _ = small
    ids = torch.cat([c for c in small_calib[:4]])
    with torch.no_grad():
        ref = model(input_ids=ids).logits
    scores = {}
    for name, method, flags in [("rtn8", "rtn", {"bits": 8}), ("rtn4", "rtn", {"bits": 4}),
                                ("mag50", "magnitude", {"sparsity": 0.5})]:
        m = copy.deepcopy(model)
        get_method(method).apply(m, small_calib, make_config(method, flags=flags), progress=False, layer_errors=False)
        with torch.no_grad():
            scores[name] = topk_agreement(ref, m(input_ids=ids).logits, 10)["jaccard"]
    assert scores["rtn8"] >= scores["rtn4"] >= scores["mag50"], scores
    assert scores["rtn8"] > 0.9


def test_worfbench_node_and_graph_f1_fixtures():
    from lmforge.eval.metrics import graph_f1, node_f1

    nodes = ["open the fridge", "take out the milk", "pour the milk into a glass", "put the milk back",
             "close the fridge"]
    chain = [["START", 1], [1, 2], [2, 3], [3, 4], [4, 5], [5, "END"]]
    assert node_f1(nodes, nodes, chain)["f1"] == 1.0
    assert graph_f1(nodes, chain, nodes, chain)["f1"] == 1.0
    # A reversed n-chain: only one node can be in order, node F1 = 1/n.
    rev = node_f1(nodes[::-1], nodes, chain)
    assert rev["f1"] == pytest.approx(1 / 5)
    # Reversed edges share nothing with the gold chain: the largest component is one node.
    rev_edges = [[1, "START"]] + [[i + 1, i] for i in range(1, 5)] + [["END", 5]]
    g = graph_f1(nodes, rev_edges, nodes, chain)
    assert g["precision"] == pytest.approx(1 / 7) and g["recall"] == pytest.approx(1 / 7)
    # A relabelled (permuted) but identical graph still scores 1.
    perm = [2, 0, 4, 1, 3]  # pred position -> gold node index
    p_nodes = [nodes[j] for j in perm]
    pos = {j + 1: i + 1 for i, j in enumerate(perm)}
    p_edges = [[a if isinstance(a, str) else pos[a], b if isinstance(b, str) else pos[b]] for a, b in chain]
    assert graph_f1(p_nodes, p_edges, nodes, chain)["f1"] == 1.0
    # Dropping the middle edge splits the chain into START-1-2 and 3-4-5-END: LCC 4 of 7.
    cut = [e for e in chain if e != [2, 3]]
    assert graph_f1(nodes, cut, nodes, chain)["f1"] == pytest.approx(4 / 7)
