"""The oracle's exact log-probs: they sum to one over every response of a tiny instance, and they match
the frequencies of sampled sequences and tokens (chi-square, scipy)."""

from __future__ import annotations

import collections

import numpy as np
import torch
from scipy import stats

from lmforge.methods.teacher_hacking.oracle import EOS, MarkovOracle, SequenceBatch, response_mask


def test_probabilities_sum_to_one_over_all_responses() -> None:
    orc = MarkovOracle(n_symbols=3, n_topics=2, branching=2, prompt_len=2, max_response_len=4, seed=3)
    for prompt in ([1, 2], [2, 3], [3, 1]):
        every = orc.enumerate_responses(torch.tensor(prompt))
        assert len(every) == sum(3**k for k in range(5))
        total = torch.exp(orc.log_prob(every)).sum()
        assert abs(float(total) - 1.0) < 1e-12


def test_log_prob_matches_a_naive_loop() -> None:
    orc = MarkovOracle(n_symbols=6, n_topics=3, branching=3, prompt_len=2, max_response_len=5, seed=1)
    batch = orc.sample(50, torch.Generator().manual_seed(0))
    table = orc.table.numpy()
    for i in range(len(batch)):
        prompt, resp = batch.prompts[i].tolist(), batch.responses[i].tolist()
        topic, prev, lp = (prompt[0] - 1) % 3, prompt[-1], 0.0
        for t, tok in enumerate(resp):
            if t == orc.max_response_len:  # forced EOS after the cap
                assert tok == EOS
                break
            lp += np.log(table[topic, prev, tok])
            if tok == EOS:
                break
            prev = tok
        assert abs(lp - float(orc.log_prob(batch.index(slice(i, i + 1)))[0])) < 1e-9


def test_sequence_frequencies_match_exact_probabilities() -> None:
    orc = MarkovOracle(n_symbols=3, n_topics=1, branching=2, prompt_len=1, max_response_len=3, seed=5,
                       eos_prob=(0.3, 0.5))
    n = 40_000
    prompt = torch.tensor([2])
    batch = orc.sample(n, torch.Generator().manual_seed(1), prompts=prompt.repeat(n, 1))
    counts = collections.Counter(tuple(r) for r in batch.responses.tolist())
    every = orc.enumerate_responses(prompt)
    probs = torch.exp(orc.log_prob(every)).numpy()
    keep = probs > 0
    expected = probs[keep] * n
    observed = np.array([counts.get(tuple(r), 0) for r in every.responses.tolist()])
    assert observed[~keep].sum() == 0  # no sample outside the support
    _, p_value = stats.chisquare(observed[keep], expected)
    assert p_value > 1e-3


def test_token_frequencies_match_the_transition_table() -> None:
    orc = MarkovOracle(n_symbols=8, n_topics=2, branching=3, prompt_len=2, max_response_len=10, seed=2)
    batch = orc.sample(20_000, torch.Generator().manual_seed(4))
    topics = orc.topics(batch.prompts)
    prev = torch.cat([batch.prompts[:, -1:], batch.responses[:, :-1]], dim=1)
    mask = batch.mask.clone()
    mask[:, -1] = False  # the forced EOS is not a draw from the table
    for k, row in ((0, 3), (1, 5)):
        sel = mask & (topics[:, None] == k) & (prev == row)
        nxt = batch.responses[sel]
        obs = torch.bincount(nxt, minlength=orc.vocab_size).numpy()
        p = orc.table[k, row].numpy()
        assert obs[p == 0].sum() == 0
        _, p_value = stats.chisquare(obs[p > 0], p[p > 0] * obs.sum())
        assert p_value > 1e-3


def test_mc_entropy_matches_exact_entropy() -> None:
    orc = MarkovOracle(n_symbols=3, n_topics=1, branching=3, prompt_len=1, max_response_len=4, seed=0)
    prompt = torch.tensor([1])
    every = orc.enumerate_responses(prompt)
    lp = orc.log_prob(every)
    exact = float(-(torch.exp(lp) * torch.where(torch.isfinite(lp), lp, torch.zeros_like(lp))).sum())
    n = 50_000
    mc = float(-orc.log_prob(orc.sample(n, torch.Generator().manual_seed(0), prompt.repeat(n, 1))).mean())
    assert abs(mc - exact) < 0.03


def test_response_mask_and_batch_helpers() -> None:
    resp = torch.tensor([[4, 0, 0, 0], [1, 2, 3, 0], [0, 0, 0, 0]])
    mask = response_mask(resp)
    assert mask.tolist() == [[True, True, False, False], [True, True, True, True], [True, False, False, False]]
    b = SequenceBatch(torch.ones(3, 2, dtype=torch.long), resp, mask)
    assert b.lengths().tolist() == [2, 4, 1]
    assert len(SequenceBatch.cat([b, b.index(slice(0, 1))])) == 4
