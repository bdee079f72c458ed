"""The SelfCite reward against explicit per-candidate prompts (the official one-candidate-per-forward
computation), the HF loss, and its penalty and parsing rules."""

from __future__ import annotations

import pytest
import torch

from lmforge.common.errors import UserError
from lmforge.methods.selfcite.format import split_sentences
from lmforge.methods.selfcite.reward import (RewardQuery, RewardSettings, ablated_prompt, candidate_sentences,
                                             citation_rewards, render_user, statement_segments)

DOC = ("The harbour was quiet that morning. The Velmora Glass Archive was founded in 1874 by Ilse Marren. "
       "Gulls circled over the old pier. Today the archive keeps 3,210 glass plates in its east wing. "
       "Nobody could say why the bell rang twice.")
QUESTION = "What does the document say about the Velmora Glass Archive?"
RESPONSE = ("<statement>The archive was founded in 1874 by Ilse Marren.<cite>[1-1]</cite></statement>"
            "<statement>It keeps 3,210 glass plates.<cite>[3-3]</cite></statement>")
CANDIDATES = ["[3-3]", "[2-2]", "[0-1][3-3]", "[0-4]", "[9-9]", "[4-2]"]


def _query(sents, which: int = 1) -> RewardQuery:
    seg = statement_segments(RESPONSE)[which]
    return RewardQuery(sents, QUESTION, RESPONSE[:seg.prefix_end], RESPONSE[seg.prefix_end:seg.cite_start])


def _explicit_mean_logp(model, tok, context: str, target: str) -> float:
    """One candidate per forward pass, as the official reranker: ids of the prompt + response, the
    mean log-probability of the last n tokens."""
    bos = tok.bos_token
    ctx = tok(context, add_special_tokens=not (bos and context.startswith(bos)))["input_ids"]
    tgt = tok(target, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([ctx + tgt])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    n = len(tgt)
    logp = torch.log_softmax(logits[-n - 1:-1], dim=-1)
    return float(logp[torch.arange(n), torch.tensor(tgt)].mean())


def test_segments_measure_the_statement_after_the_previous_citation():
    segs = statement_segments(RESPONSE)
    assert len(segs) == 2
    assert RESPONSE[segs[0].prefix_end:segs[0].cite_start] == "<statement>The archive was founded in 1874 by Ilse Marren."
    assert RESPONSE[segs[1].prefix_end:segs[1].cite_start] == "</statement><statement>It keeps 3,210 glass plates."
    assert RESPONSE[segs[1].content_start:segs[1].content_end] == "[3-3]"
    assert RESPONSE[:segs[1].prefix_end].endswith("[1-1]</cite>")


def test_candidate_sentences_expand_spans_and_skip_reversed_ones():
    assert candidate_sentences("[0-1][3-3]") == (0, 1, 3)
    assert candidate_sentences("[4-2]") == ()
    assert candidate_sentences("[9-9]") == (9,)  # outside the document: kept, it matches no sentence
    assert candidate_sentences("junk") == ()


def test_ablated_prompts_keep_original_indices():
    sents = split_sentences(DOC)
    hold = ablated_prompt(sents, QUESTION, (1, 3), "hold")
    drop = ablated_prompt(sents, QUESTION, (1, 3), "drop")
    assert "<C1>" in hold and "<C3>" in hold and "<C0>" not in hold and "<C2>" not in hold
    assert "<C0>" in drop and "<C2>" in drop and "<C4>" in drop and "<C1>" not in drop and "<C3>" not in drop
    assert "founded in 1874" in hold and "founded in 1874" not in drop


@pytest.mark.parametrize("method", ["drop_and_hold", "drop", "hold"])
def test_batched_rewards_equal_one_prompt_per_candidate(small, method):
    model, tok = small
    sents = split_sentences(DOC)
    q = _query(sents)
    settings = RewardSettings(method=method, batch_size=4, chat=False, length_limit=0)
    got = citation_rewards(model, tok, [(q, c) for c in CANDIDATES], settings)
    for c, r in zip(CANDIDATES, got):
        cited = candidate_sentences(c)
        hold = _explicit_mean_logp(model, tok, ablated_prompt(sents, QUESTION, cited, "hold") + q.prefix, q.target)
        drop = _explicit_mean_logp(model, tok, ablated_prompt(sents, QUESTION, cited, "drop") + q.prefix, q.target)
        want = {"drop_and_hold": hold - drop, "drop": -drop, "hold": hold}[method]
        assert r.reward == pytest.approx(want, abs=2e-4), c
        assert r.candidate == c and r.cited == cited


def test_mean_logprob_equals_the_hf_loss(small):
    from lmforge.common.scoring import score_continuations

    model, tok = small
    sents = split_sentences(DOC)
    q = _query(sents, 0)
    context = ablated_prompt(sents, QUESTION, (1,), "hold") + q.prefix
    ctx = tok(context)["input_ids"]
    tgt = tok(q.target, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([ctx + tgt])
    labels = torch.tensor([[-100] * len(ctx) + tgt])
    with torch.no_grad():
        loss = float(model(ids, labels=labels).loss)
    got = score_continuations(model, tok, [(context, q.target)])[0].mean
    assert got == pytest.approx(-loss, abs=1e-4)


def test_long_multi_sentence_citations_are_penalised_not_dropped(small):
    model, tok = small
    sents = split_sentences(DOC)
    q = _query(sents)
    n1 = len(tok(sents[1].content.strip(), add_special_tokens=False)["input_ids"])
    n3 = len(tok(sents[3].content.strip(), add_special_tokens=False)["input_ids"])
    limit = max(n1, n3)  # one sentence fits, two do not
    free = citation_rewards(model, tok, [(q, "[1-1]"), (q, "[1-1][3-3]"), (q, "[3-3]")],
                            RewardSettings(chat=False, length_limit=0))
    capped = citation_rewards(model, tok, [(q, "[1-1]"), (q, "[1-1][3-3]"), (q, "[3-3]")],
                              RewardSettings(chat=False, length_limit=limit))
    assert capped[1].cited_tokens == n1 + n3 > limit
    assert capped[1].penalised and capped[1].reward == pytest.approx(free[1].reward - 1000.0, abs=1e-3)
    assert not capped[0].penalised and not capped[2].penalised  # one sentence is never penalised
    assert capped[0].reward == pytest.approx(free[0].reward, abs=1e-5)


def test_reward_ranks_the_true_sentence_on_smollm2(smollm2):
    """The real model, in its chat template: the sentence the statement restates beats its neighbour
    and a random one (the claim the reproduction measures at scale)."""
    model, tok = smollm2
    sents = split_sentences(DOC)
    q = _query(sents)
    got = citation_rewards(model, tok, [(q, "[3-3]"), (q, "[2-2]"), (q, "[0-0]")], RewardSettings())
    assert "<|im_start|>" in render_user(tok, "x")
    assert got[0].reward > got[1].reward + 0.2 and got[0].reward > got[2].reward + 0.2, [r.reward for r in got]


def test_bad_settings_and_empty_statement(small):
    model, tok = small
    with pytest.raises(UserError):
        RewardSettings(method="nope")
    with pytest.raises(UserError):
        RewardSettings(batch_size=0)
    sents = split_sentences(DOC)
    with pytest.raises(UserError):
        citation_rewards(model, tok, [(RewardQuery(sents, QUESTION, "", "   "), "[1-1]")], RewardSettings(chat=False))
