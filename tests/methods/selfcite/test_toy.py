"""SelfCite tier B toy: the data generator, the shared-prefix SFT loss, and the pipeline's plumbing."""

from __future__ import annotations

import math
import random

import pytest
import torch

from lmforge.methods.selfcite.format import parse_spans, postprocess, split_sentences
from lmforge.methods.selfcite.toy import (KEYS, SFTSettings, TIER_B_CONDITIONS, build_model, evaluate_responses,
                                          make_toy_docs, noisy_support, prompt_head, sft_batch,
                                          shared_prefix_loss, spans_of, toy_tokenizer)


@pytest.fixture(scope="module")
def tok():
    return toy_tokenizer(0, n_docs=400)


def test_splitter_gives_back_the_sentences_one_to_one():
    for d in make_toy_docs(200, 5):
        again = split_sentences(d.context)
        assert [s.content.strip() for s in again] == [s.content.strip() for s in d.sentences]
        assert d.n_sentences == 8
        assert d.prompt.count("<C") - d.prompt.count("<C{") - d.prompt.count("<C_{") == 8


def test_gold_points_at_the_fact_sentences_holding_the_statement():
    kinds = set()
    for d in make_toy_docs(300, 6):
        kinds.add(d.kind)
        assert set(d.asked) <= set(d.facts)
        assert len(d.gold) == (2 if d.kind == "pair" else 1)
        for g in d.gold:
            assert g.support, "every statement needs a citation"
            for i in g.support:
                sent = d.sentences[i].content.strip()
                key, number, obj = sent[:-1].split(" ")
                assert key in KEYS and f"{key} {number} {obj}" in g.text
            # the statement's keys (so its facts) are in no other sentence
            keys = [w for w in g.text.split() if w in KEYS]
            for j, s in enumerate(d.sentences):
                if j not in g.support:
                    assert not any(s.content.startswith(k + " ") for k in keys)
        # facts are never adjacent, so a neighbour of a fact is filler
        pos = sorted(d.facts.values())
        assert all(b - a >= 2 for a, b in zip(pos, pos[1:]))
        # the gold response parses back to the gold support
        p = postprocess(d.gold_response, d.sentences)
        assert p.malformed == 0
        assert [{i for c in st.citations for i in range(c.start, c.end + 1)} for st in p.statements] == \
            [set(g.support) for g in d.gold]
    assert kinds == {"single", "fused", "pair"}


def test_generator_is_deterministic_per_seed():
    a, b, c = make_toy_docs(30, 1), make_toy_docs(30, 1), make_toy_docs(30, 2)
    assert [d.prompt + d.gold_response for d in a] == [d.prompt + d.gold_response for d in b]
    assert [d.prompt for d in a] != [d.prompt for d in c]


@pytest.mark.parametrize("p", [0.0, 0.3, 0.7])
def test_noisy_citations_at_the_requested_rate(p):
    docs = make_toy_docs(400, 3)
    rng = random.Random(0)
    n = noisy = 0
    for d in docs:
        support, a, b = noisy_support(d, rng, p)
        n, noisy = n + a, noisy + b
        for g, ids in zip(d.gold, support):
            gold = sorted(g.support)
            assert len(ids) == len(gold)
            for i, j in zip(gold, ids):
                assert i == j or abs(i - j) == 1  # a noisy citation is a neighbour
                assert 0 <= j < d.n_sentences
            moved = sum(i != j for i, j in zip(gold, ids))
            assert moved <= len(gold)
    sd = math.sqrt(n * p * (1 - p))
    assert abs(noisy - n * p) <= 4 * sd + 1e-9
    # the counted noisy citations are exactly the moved ones
    rng1, rng2 = random.Random(9), random.Random(9)
    moved = 0
    total = 0
    for d in docs:
        support, _, b = noisy_support(d, rng1, p)
        total += b
        moved += sum(i != j for g, ids in zip(d.gold, support) for i, j in zip(sorted(g.support), ids))
    assert moved == total
    assert noisy_support(docs[0], rng2, p) == noisy_support(docs[0], random.Random(9), p)


def test_spans_of_merges_runs():
    assert spans_of([6, 2, 3]) == [(2, 3), (6, 6)]
    assert spans_of([]) == []


def test_tags_and_keys_tokenize_consistently(tok):
    for k in KEYS:
        assert len(tok.tokenize(">" + k)) == 2, k           # the key after a <C i> tag / <statement>
        assert tok.tokenize(' "' + k + '"')[1] == k          # the same token inside the question's quotes
    d = make_toy_docs(1, 0)[0]
    ids = tok(d.prompt).input_ids
    head = prompt_head(tok)
    assert ids[:len(head)] == head
    assert tok.tokenize("[3-3]") == ["[", "3", "-", "3", "]"]


def test_shared_prefix_loss_equals_the_plain_loss_on_the_response_only(tok):
    torch.manual_seed(0)
    model = build_model(tok, SFTSettings(hidden=32, layers=2, heads=2), seed=0)
    docs = make_toy_docs(4, 11)
    batch, _, _ = sft_batch(tok, docs, random.Random(0), 0.3)
    head = prompt_head(tok)
    # labels: the response and EOS only
    for row, d in zip(range(4), docs):
        n_prompt = len(tok(d.prompt).input_ids)
        lab = batch["labels"][row]
        assert (lab[:n_prompt] == -100).all()
        assert (lab[n_prompt:batch["attention_mask"][row].sum()] != -100).all()
    plain = model(**batch).loss
    shared = shared_prefix_loss(model, batch, head)
    assert torch.allclose(plain, shared, atol=1e-5)
    # a naive per-example loop over the response tokens gives the same mean
    total, count = 0.0, 0
    for row in range(4):
        n = int(batch["attention_mask"][row].sum())
        ids = batch["input_ids"][row, :n].unsqueeze(0)
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1], -1)
        lab = batch["labels"][row, 1:n]
        for t, y in enumerate(lab.tolist()):
            if y != -100:
                total -= float(logp[t, y])
                count += 1
    assert abs(total / count - float(plain)) < 1e-4
    g1 = torch.autograd.grad(plain, list(model.parameters()))
    g2 = torch.autograd.grad(shared_prefix_loss(model, batch, head), list(model.parameters()))
    assert max(float((a - b).abs().max()) for a, b in zip(g1, g2)) < 1e-5


def test_evaluate_responses_counts():
    docs = make_toy_docs(3, 4)
    gold = evaluate_responses(docs, [d.gold_response for d in docs])
    assert gold["f1"] == 1.0 and gold["malformed"] == 0 and gold["content_exact_share"] == 1.0
    assert gold["parseable_share"] == 1.0
    n_cited = sum(len(g.support) for d in docs for g in d.gold)
    n_stmt = sum(len(d.gold) for d in docs)
    assert gold["cited_per_statement"] == pytest.approx(n_cited / n_stmt)
    broken = evaluate_responses(docs, ["<statement>x<cite>[3-1]</cite></statement>", "<statement>y", ""])
    assert broken["f1"] == 0.0 and broken["malformed"] >= 2 and broken["parseable_share"] == 0.0


def test_conditions_are_stated():
    assert "0.05" in TIER_B_CONDITIONS and "unbalanced" in TIER_B_CONDITIONS
    assert parse_spans("[1-2]") == [(1, 2)]


@pytest.mark.parametrize("threads", [1, 2])
def test_short_sft_learns_and_is_deterministic(tok, threads):
    from lmforge.methods.selfcite.toy import train_sft

    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        s = SFTSettings(hidden=32, layers=2, heads=2, steps=40, batch=4, warmup=5)
        _, _, log1 = train_sft(3, s, tok=tok)
        _, _, log2 = train_sft(3, s, tok=tok)
    finally:
        torch.set_num_threads(old)
    assert log1["losses"] == log2["losses"]
    # measured: 6.4 -> 4.0 (ratio 0.63) at both thread counts
    assert sum(log1["losses"][-5:]) < 0.75 * sum(log1["losses"][:5])
    assert log1["citations"] > 0


def test_simpo_arm_trains_a_copy_and_leaves_the_sft_model_alone(tok):
    from lmforge.methods.selfcite.toy import simpo_arm, simpo_settings

    model = build_model(tok, SFTSettings(hidden=32, layers=2, heads=2), seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    docs = make_toy_docs(4, 8)
    rng = random.Random(0)
    pairs = [{"prompt": d.prompt, "chosen": d.gold_response, "rejected": d.response(noisy_support(d, rng, 1.0)[0])}
             for d in docs]
    trained, log = simpo_arm(model, tok, pairs, simpo_settings(0, epochs=1.0, batch=2))
    assert log["global_step"] == 2 and len(log["losses"]) == 2
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    after = trained.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before if k in after)
    assert set(after) == set(before)  # merged back into a plain Llama
