"""Tests for continuation scoring and sliding-window perplexity in lmforge.common.scoring."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lmforge.common.errors import UserError
from lmforge.common.scoring import join_texts, perplexity, score_continuations

from .conftest import CORPUS, FAMILIES

PAIRS = [
    ("the quick brown fox", " jumps over the lazy dog."),
    ("a", " model"),
    ("we measure perplexity on held out text and report", " the mean."),
    ("numbers like", " 12, 345 and 6789 appear in text too?"),
    ("", "the cat sat on the mat"),
]


def naive_logprobs(model, tokenizer, context: str, continuation: str) -> list[float]:
    """One unpadded full forward per pair."""
    ctx = tokenizer(context).input_ids
    cont = tokenizer(continuation, add_special_tokens=False).input_ids
    ids = torch.tensor([ctx + cont])
    with torch.no_grad():
        logp = F.log_softmax(model(ids).logits[0].double(), dim=-1)
    return [logp[len(ctx) - 1 + j, tok].item() for j, tok in enumerate(cont)]


@pytest.mark.parametrize("family", FAMILIES)
def test_scores_match_naive_unbatched(models, tokenizer, family):
    model = models[family]
    scores = score_continuations(model, tokenizer, PAIRS, batch_size=2)
    assert len(scores) == len(PAIRS)
    for (ctx, cont), s in zip(PAIRS, scores):
        ref = naive_logprobs(model, tokenizer, ctx, cont)
        assert s.n_tokens == len(ref) == len(tokenizer(cont, add_special_tokens=False).input_ids)
        assert s.token_logprobs == pytest.approx(ref, abs=1e-4)
        assert s.sum == pytest.approx(sum(ref), abs=1e-4)
        assert s.mean == pytest.approx(sum(ref) / len(ref), abs=1e-4)
        assert all(lp <= 0 for lp in s.token_logprobs)


def test_batch_size_does_not_change_scores(models, tokenizer):
    model = models["llama"]
    one = score_continuations(model, tokenizer, PAIRS, batch_size=1)
    many = score_continuations(model, tokenizer, PAIRS, batch_size=16)
    for a, b in zip(one, many):
        assert a.token_logprobs == pytest.approx(b.token_logprobs, abs=1e-5)
        assert a.greedy_match == b.greedy_match


def _greedy_tokens(model, ids: list[int], n: int) -> list[int]:
    out = []
    with torch.no_grad():
        for _ in range(n):
            nxt = int(model(torch.tensor([ids + out])).logits[0, -1].argmax())
            out.append(nxt)
    return out


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_greedy_match(models, tokenizer, family):
    model = models[family]
    context = "the cat sat on"
    ctx_ids = tokenizer(context).input_ids
    # Grow the greedy continuation while its text re-encodes to the same tokens (BPE round trip).
    greedy = _greedy_tokens(model, ctx_ids, 6)
    n = len(greedy)
    while n > 0 and tokenizer(tokenizer.decode(greedy[:n]), add_special_tokens=False).input_ids != greedy[:n]:
        n -= 1
    assert n >= 1, "no round-tripping greedy prefix; pick another context"
    cont = tokenizer.decode(greedy[:n])
    s_match, s_other = score_continuations(model, tokenizer, [(context, cont), (context, cont + " zebra!")])
    assert s_match.greedy_match is True
    assert s_match.n_tokens == n
    # The greedy continuation is the per-token argmax, so each of its log-probs is the row maximum.
    assert s_other.greedy_match is False


def test_empty_continuation_is_user_error(models, tokenizer):
    with pytest.raises(UserError):
        score_continuations(models["llama"], tokenizer, [("context", "")])


def _text(n_sentences: int = 8) -> str:
    return " ".join(CORPUS[i % len(CORPUS)] for i in range(n_sentences))


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_perplexity_whole_window_equals_single_forward(models, tokenizer, family):
    model = models[family]
    text = _text(3)
    ids = torch.tensor([tokenizer(text).input_ids])
    assert ids.shape[1] < 256
    with torch.no_grad():
        loss = model(ids, labels=ids).loss.item()
    res = perplexity(model, tokenizer, text, max_length=256)
    assert res.n_tokens == ids.shape[1] - 1
    assert res.nll_sum / res.n_tokens == pytest.approx(loss, rel=1e-5)
    assert res.ppl == pytest.approx(math.exp(loss), rel=1e-5)


def naive_sliding_nll(model, ids: list[int], max_length: int, stride: int) -> tuple[float, int, list[int]]:
    """Each target t is predicted from the window that first covers it, with that window's context."""
    nll, scored = 0.0, []
    prev_end = 0
    for begin in range(0, len(ids), stride):
        end = min(begin + max_length, len(ids))
        with torch.no_grad():
            logp = F.log_softmax(model(torch.tensor([ids[begin:end]])).logits[0].double(), dim=-1)
        for t in range(max(prev_end, begin + 1), end):
            nll -= logp[t - begin - 1, ids[t]].item()
            scored.append(t)
        prev_end = end
        if end == len(ids):
            break
    return nll, len(scored), scored


def test_perplexity_small_window_scores_each_token_once(models, tokenizer):
    model = models["qwen2"]
    text = _text(8)
    ids = tokenizer(text).input_ids
    assert len(ids) > 60
    res = perplexity(model, tokenizer, text, max_length=16, stride=5)
    nll, n, scored = naive_sliding_nll(model, ids, 16, 5)
    assert sorted(scored) == list(range(1, len(ids)))  # every token but the first, exactly once
    assert res.n_tokens == n == len(ids) - 1
    assert res.nll_sum == pytest.approx(nll, rel=1e-5)
    # A short window loses context, so it differs from the full-context value.
    full = perplexity(model, tokenizer, text, max_length=256)
    assert full.n_tokens == res.n_tokens
    assert abs(full.nll_sum - res.nll_sum) > 1e-3


def test_perplexity_disjoint_windows_and_defaults(models, tokenizer):
    model = models["llama"]
    text = _text(4)
    ids = tokenizer(text).input_ids
    res = perplexity(model, tokenizer, text, max_length=20, stride=20)
    n_windows = math.ceil(len(ids) / 20)
    assert res.n_tokens == len(ids) - n_windows
    # Defaults: window = max_position_embeddings (256), stride = 128.
    default = perplexity(model, tokenizer, text)
    assert default.n_tokens == len(ids) - 1
    with pytest.raises(UserError):
        perplexity(model, tokenizer, text, max_length=20, stride=21)
    with pytest.raises(UserError):
        perplexity(model, tokenizer, text, max_length=1000)


def test_perplexity_joins_texts_with_eos(models, tokenizer):
    model = models["llama"]
    texts = [CORPUS[0], CORPUS[1], CORPUS[2]]
    ids = join_texts(tokenizer, texts)
    expected = tokenizer(texts[0]).input_ids
    for t in texts[1:]:
        expected += [tokenizer.eos_token_id] + tokenizer(t, add_special_tokens=False).input_ids
    assert ids == expected
    assert ids.count(tokenizer.bos_token_id) == 1
    res = perplexity(model, tokenizer, texts, max_length=256)
    with torch.no_grad():
        t = torch.tensor([ids])
        loss = model(t, labels=t).loss.item()
    assert res.n_tokens == len(ids) - 1
    assert res.ppl == pytest.approx(math.exp(loss), rel=1e-5)
