"""Selective DPO's pure functions against closed forms, brute force and the official code's rules."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lmforge.methods.selective_dpo.config import SelectiveDPOConfig
from lmforge.methods.selective_dpo.core import (checkpoint_steps, difficulty, dpo_loss, easy_to_hard, half_split,
                                                lr_factor, n_selected)


def test_dpo_loss_is_the_closed_form():
    g = torch.Generator().manual_seed(0)
    pc, pr, rc, rr = (torch.randn(64, generator=g, dtype=torch.float64) * 20 for _ in range(4))
    for beta in (0.01, 0.1, 1.0):
        losses, cr, rj = dpo_loss(pc, pr, rc, rr, beta)
        for i in range(64):
            z = beta * ((pc[i] - rc[i]) - (pr[i] - rr[i])).item()
            # -log sigmoid(z) = log(1 + e^-z), written stably by hand
            want = math.log1p(math.exp(-z)) if z > 0 else -z + math.log1p(math.exp(z))
            assert losses[i].item() == pytest.approx(want, rel=1e-9, abs=1e-12)
            assert cr[i].item() == pytest.approx(beta * (pc[i] - rc[i]).item())
            assert rj[i].item() == pytest.approx(beta * (pr[i] - rr[i]).item())


def test_dpo_loss_is_log2_when_policy_equals_reference():
    x = torch.randn(5)
    y = torch.randn(5)
    losses, _, _ = dpo_loss(x, y, x, y, 0.01)
    assert torch.allclose(losses, torch.full((5,), math.log(2.0)))


def test_half_split_is_the_official_permutation():
    for n, seed in ((10, 41), (11, 42), (1000, 43)):
        np.random.seed(seed)  # what run_half.py does before np.random.permutation
        perm = np.random.permutation(n)
        first, second = half_split(n, seed)
        assert first.tolist() == perm[: n // 2].tolist()
        assert second.tolist() == perm[n // 2:].tolist()
        assert sorted(first.tolist() + second.tolist()) == list(range(n))


def test_checkpoint_steps_follow_eval_steps_rule():
    # eval_steps = max(total // 5, 1); evaluations at eval_steps * k; the first five are kept.
    assert checkpoint_steps(100, 5) == [20, 40, 60, 80, 100]
    assert checkpoint_steps(12, 5) == [2, 4, 6, 8, 10]
    assert checkpoint_steps(5, 5) == [1, 2, 3, 4, 5]
    with pytest.raises(ValueError):
        checkpoint_steps(4, 5)


def test_difficulty_is_the_mean_over_runs_brute_force():
    rng = np.random.default_rng(0)
    arr = rng.random((15, 7))
    arr[3, 2] = np.nan  # a missing record is skipped, as pandas' mean does
    got = difficulty(arr)
    for j in range(7):
        vals = [arr[i, j] for i in range(15) if not np.isnan(arr[i, j])]
        assert got[j] == pytest.approx(sum(vals) / len(vals))
    arr[:, 4] = np.nan
    with pytest.raises(ValueError):
        difficulty(arr)


def test_easy_to_hard_is_exactly_sorted_and_keeps_tau():
    rng = np.random.default_rng(1)
    scores = rng.random(101)
    scores[10] = scores[20] = scores[30] = 0.5  # ties keep their original order
    for tau in (0.1, 0.5, 0.7, 1.0):
        order = easy_to_hard(scores, tau)
        k = int(math.floor(101 * tau + 1e-9))
        assert len(order) == k == n_selected(101, tau)
        assert all(scores[order[i]] <= scores[order[i + 1]] for i in range(k - 1))
        # exactly the k smallest: brute force by sorted (value, index) pairs
        assert order.tolist() == [i for _, i in sorted((s, i) for i, s in enumerate(scores))][:k]
    assert n_selected(10, 0.7) == 7
    assert n_selected(3, 0.01) == 1
    with pytest.raises(ValueError):
        easy_to_hard(scores, 0.0)
    with pytest.raises(ValueError):
        easy_to_hard(scores, 1.5)


def test_lr_factor_is_transformers_cosine_with_warmup():
    from transformers import get_cosine_schedule_with_warmup

    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    sched = get_cosine_schedule_with_warmup(opt, num_warmup_steps=3, num_training_steps=20)
    for step in range(20):
        assert lr_factor(step, 20, 3) == pytest.approx(sched.get_last_lr()[0], abs=1e-12)
        opt.step()
        sched.step()


@pytest.mark.parametrize("kwargs", [{"tau": 0.0}, {"tau": 1.01}, {"beta": 0.0}, {"seeds": ()}, {"seeds": (1, 1)},
                                    {"n_checkpoints": 0}, {"lr": 0.0}, {"ref_lora_r": -1}, {"batch_size": 0},
                                    {"warmup_ratio": 1.0}])
def test_config_rejects_bad_values(kwargs):
    with pytest.raises(ValueError):
        SelectiveDPOConfig(**kwargs)


def test_config_defaults_are_the_papers():
    cfg = SelectiveDPOConfig()
    assert (cfg.tau, cfg.beta, cfg.seeds, cfg.n_checkpoints, cfg.ref_lora_r, cfg.epochs) == (0.5, 0.01, (41, 42, 43), 5,
                                                                                         16, 1)
