"""UDora's losses against naive per-token loops, and the selection loss against the interval score."""

from __future__ import annotations

import math

import pytest
import torch

from lmforge.methods.udora.intervals import match_score
from lmforge.methods.udora.loss import (
    gradient_loss,
    mellowmax,
    place_spans,
    selection_loss,
    target_ce_loss,
    target_mellowmax_loss,
)

TARGETS = [(4, [1, 2, 3]), (9, [0, 5])]


def _logits(seed=0, batch=4, seq=12, vocab=7):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, seq, vocab, generator=g, dtype=torch.float64)
    # make the targets partly predicted: row b gets its first b tokens of each target as the argmax
    for b in range(batch):
        for pos, ids in TARGETS:
            for j, t in enumerate(ids[:b]):
                logits[b, pos - 1 + j, t] += 8.0
    return logits


def _naive_probs(row):
    m = max(row)
    e = [math.exp(x - m) for x in row]
    s = sum(e)
    return [x / s for x in e]


def test_ce_loss_equals_naive_loop():
    logits = _logits()
    for weight in (1.0, 0.7):
        got = target_ce_loss(logits, TARGETS, weight)
        for b in range(logits.shape[0]):
            total = 0.0
            for k, (pos, ids) in enumerate(TARGETS):
                ce = [-math.log(_naive_probs(logits[b, pos - 1 + j].tolist())[t]) for j, t in enumerate(ids)]
                total += weight ** k * sum(ce) / len(ce)
            assert got[b].item() == pytest.approx(total, rel=1e-12)
        assert torch.equal(gradient_loss(logits, TARGETS, weight), got)


def test_mellowmax_loss_equals_naive_loop():
    logits = _logits(1)
    for alpha, weight in ((1.0, 1.0), (2.5, 0.5)):
        got = target_mellowmax_loss(logits, TARGETS, weight, alpha)
        for b in range(logits.shape[0]):
            total = 0.0
            for k, (pos, ids) in enumerate(TARGETS):
                z = [logits[b, pos - 1 + j, t].item() for j, t in enumerate(ids)]
                mm = (math.log(sum(math.exp(-alpha * x) for x in z)) - math.log(len(z))) / alpha
                total += weight ** k * mm
            assert got[b].item() == pytest.approx(total, rel=1e-12)
        assert torch.equal(gradient_loss(logits, TARGETS, weight, use_mellowmax=True, mellowmax_alpha=alpha), got)
    assert mellowmax(torch.tensor([[2.0, 2.0]])).item() == pytest.approx(2.0)


def test_selection_loss_equals_naive_loop():
    logits = _logits(2)
    for weight in (1.0, 0.6):
        got = selection_loss(logits, TARGETS, weight)
        for b in range(logits.shape[0]):
            total = 0.0
            for k, (pos, ids) in enumerate(TARGETS):
                matched, collected = 0, []
                for j, t in enumerate(ids):
                    row = logits[b, pos - 1 + j].tolist()
                    collected.append(_naive_probs(row)[t])
                    if row.index(max(row)) != t:
                        break
                    matched += 1
                total += weight ** k * (-matched - sum(collected) / len(collected)) / (len(ids) + 1)
            assert got[b].item() == pytest.approx(total, rel=1e-12)
    # row b has its first min(b, L) tokens matched: the reward part grows with b
    assert got[0] > got[1] > got[2] > got[3]


def test_selection_loss_is_minus_the_interval_score():
    logits = _logits(3, batch=2)
    for b in range(2):
        probs = torch.softmax(logits[b], dim=-1)
        expected = 0.0
        for pos, ids in TARGETS:
            score, _ = match_score(ids, probs, pos - 1)
            expected -= score
        assert selection_loss(logits[b:b + 1], TARGETS).item() == pytest.approx(expected, rel=1e-12)


def test_no_targets_and_bad_spans():
    logits = _logits()
    assert torch.equal(target_ce_loss(logits, []), torch.zeros(4, dtype=torch.float64))
    assert torch.equal(selection_loss(logits, []), torch.zeros(4))
    with pytest.raises(ValueError):
        target_ce_loss(logits, [(0, [1])])          # nothing predicts position 0
    with pytest.raises(ValueError):
        selection_loss(logits, [(12, [1, 2])])      # runs past the logits
    with pytest.raises(ValueError):
        target_ce_loss(logits[0], TARGETS)


def test_place_spans():
    surrogate = [10, 11, 100, 101, 14, 102]
    assert place_spans(7, surrogate, [(2, 4), (5, 6)]) == [(9, [100, 101]), (12, [102])]
