"""DistiLLM-2's performance paths give what the plain paths give: response-position logits (the head
applied only where a response token is predicted), the shared teacher-logit cache, epoch 1's student
responses sampled by the caller, and the losses' unmasked fast path."""

from __future__ import annotations

import copy

import pytest
import torch

from lmforge.methods.distillm2 import losses as L
from lmforge.methods.distillm2 import train as T
from lmforge.methods.distillm2.config import LOSSES, DistillConfig
from lmforge.methods.distillm2.data import Pair, build_pairs, sample_responses

from .conftest import prompts

torch.set_num_threads(1)


def _pairs(tok) -> list[Pair]:
    from lmforge.common.generation import encode_prompt

    p = ["a b", "c d e f", "g"]
    ch = [" c d e", " f", " a a b b c"]
    rj = [" h", " g a b c d", " e"]
    ids = lambda s: tok(s, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]  # noqa: E731
    return [Pair(p[i], ch[i], rj[i], encode_prompt(tok, p[i]), ids(ch[i]), ids(rj[i])) for i in range(3)]


def test_response_index_holds_exactly_the_response_targets(tiny) -> None:
    _, _, tok = tiny
    pairs = _pairs(tok)
    batch = T.collate_pairs(pairs, tok.pad_token_id)
    index, mask, targets = T.response_index(batch)
    rows = [p.chosen_ids for p in pairs] + [p.rejected_ids for p in pairs]
    assert index.shape[1] == max(map(len, rows))
    for r, resp in enumerate(rows):
        assert targets[r][mask[r]].tolist() == resp
        # position j predicts token j + 1: the response starts right after the prompt
        assert index[r, 0] == len(pairs[r % 3].prompt_ids) - 1


@pytest.mark.parametrize("lora", [False, True])
def test_response_logits_equal_the_full_logits_at_those_positions(tiny, lora: bool) -> None:
    teacher, student, tok = tiny
    model = student
    if lora:
        model = T.apply_lora(copy.deepcopy(student), DistillConfig(lora=True))
        torch.manual_seed(0)
        for n, p in model.named_parameters():
            if "lora_B" in n:  # a trained adapter, so the LoRA path is not the identity
                p.data.normal_(0, 0.1)
    model.eval()
    batch = T.collate_pairs(_pairs(tok), tok.pad_token_id)
    index, mask, _ = T.response_index(batch)
    with torch.no_grad():
        got = T.response_logits(model, batch["input_ids"], batch["attention_mask"], index)
        full = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    want = full.gather(1, index.unsqueeze(-1).expand(-1, -1, full.shape[-1]))
    assert got.shape == want.shape
    torch.testing.assert_close(got[mask], want[mask], rtol=1e-5, atol=1e-5)
    # the head really saw fewer positions than the sequence has (the hook took effect)
    assert got.shape[1] < full.shape[1]


@pytest.mark.parametrize("loss", LOSSES)
def test_response_loss_and_gradient_equal_batch_loss_on_full_logits(tiny, loss: str) -> None:
    teacher, student, tok = tiny
    batch = T.collate_pairs(_pairs(tok), tok.pad_token_id)
    index, mask, _ = T.response_index(batch)
    cfg = DistillConfig(loss=loss, alpha=0.1)
    alpha = (torch.tensor([0.1, 0.05, 0.02]), torch.tensor([0.1, 0.08, 0.01]))

    def run(fast: bool) -> tuple[float, list[torch.Tensor]]:
        s = copy.deepcopy(student)
        with torch.no_grad():
            t_full = teacher(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        if fast:
            t = t_full.gather(1, index.unsqueeze(-1).expand(-1, -1, t_full.shape[-1]))
            val = T.response_loss(cfg, T.response_logits(s, batch["input_ids"], batch["attention_mask"], index), t,
                                  mask, beta=0.3, alpha=alpha)
        else:
            val = T.batch_loss(cfg, s(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits,
                               t_full, batch, beta=0.3, alpha=alpha)
        val.backward()
        return float(val.detach()), [p.grad.clone() for p in s.parameters()]

    v_fast, g_fast = run(True)
    v_full, g_full = run(False)
    assert v_fast > 0 and v_fast == pytest.approx(v_full, rel=1e-5)
    for a, b in zip(g_fast, g_full):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


def _history(res: T.DistillResult) -> list[float]:
    return [h["loss"] for h in res.history]


@pytest.mark.parametrize("lora", [False, True])
def test_shared_cache_and_caller_sampled_first_responses_reproduce_plain_runs(tiny, lora: bool) -> None:
    teacher, student, tok = tiny
    ps = prompts(8, seed=4)
    t_out = sample_responses(teacher, tok, ps, max_new_tokens=6, seed=1)
    cfgs = [DistillConfig(loss=k, epochs=2, batch_size=4, max_new_tokens=6, lr=1e-3, gen_batch_size=8, seed=5,
                          lora=lora) for k in ("distillm2", "kl", "gjsd")]

    def seeded(c: DistillConfig) -> DistillConfig:
        torch.manual_seed(c.seed)  # LoRA dropout draws from the global generator
        return c

    plain = [T.distill(teacher, student, tok, ps, seeded(c), teacher_responses=t_out) for c in cfgs]
    c0 = cfgs[0]
    first = sample_responses(student, tok, ps, max_new_tokens=c0.max_new_tokens, temperature=c0.temperature,
                             top_p=c0.top_p, seed=c0.seed + 1000, batch_size=c0.gen_batch_size)
    cache = T.TeacherCache()
    shared = []
    for c in cfgs:
        before = (cache.hits, cache.misses)
        shared.append(T.distill(teacher, student, tok, ps, seeded(c), teacher_responses=t_out, teacher_cache=cache,
                                first_student_responses=first))
        hits, misses = cache.hits - before[0], cache.misses - before[1]
        if c is cfgs[0]:
            # first run: every row of epoch 1 computed; epoch 2 looks up the teacher's responses
            assert (hits, misses) == (8, 24)
        else:
            # later runs: epoch 1 entirely from the cache, only epoch 2's new student responses computed
            assert (hits, misses) == (24, 8)
    for a, b in zip(plain, shared):
        assert [p.rejected_ids for p in a.pairs] == [p.rejected_ids for p in b.pairs]
        assert _history(b) == pytest.approx(_history(a), rel=1e-5)
        for (n, pa), (_, pb) in zip(a.student.named_parameters(), b.student.named_parameters()):
            torch.testing.assert_close(pb, pa, rtol=1e-4, atol=1e-6, msg=n)
    # the losses do differ from each other (the comparison above is not vacuous)
    assert _history(plain[0]) != pytest.approx(_history(plain[1]), rel=1e-3)


def test_teacher_cache_refuses_another_teacher(tiny) -> None:
    teacher, student, tok = tiny
    cache = T.TeacherCache()
    cfg = DistillConfig(epochs=1, batch_size=4, max_new_tokens=4, gen_batch_size=8)
    T.distill(teacher, student, tok, prompts(4), cfg, teacher_cache=cache)
    with pytest.raises(ValueError, match="another teacher"):
        T.distill(copy.deepcopy(teacher), student, tok, prompts(4), cfg, teacher_cache=cache)
    with pytest.raises(ValueError, match="differ in number"):
        T.distill(teacher, student, tok, prompts(4), cfg, first_student_responses=[("x", [1])])


@pytest.mark.parametrize("name", ["kl", "rkl", "skl", "srkl", "gjsd"])
def test_unmasked_fast_path_equals_the_masked_path(name: str) -> None:
    """With no -inf logit the losses skip their masking; an extra vocabulary entry at -inf in both
    models (probability 0, left out) takes the masked path and must give the same value and gradient."""
    fns = {"kl": lambda s, t, m: L.forward_kl(s, t, m), "rkl": lambda s, t, m: L.reverse_kl(s, t, m),
           "skl": lambda s, t, m: L.skew_kl(s, t, 0.1, m), "srkl": lambda s, t, m: L.skew_reverse_kl(s, t, 0.1, m),
           "gjsd": lambda s, t, m: L.generalized_jsd(s, t, 0.5, m, temperature=0.7)}
    g = torch.Generator().manual_seed(0)
    s0 = torch.randn(2, 5, 11, generator=g, dtype=torch.float64)
    t = torch.randn(2, 5, 11, generator=g, dtype=torch.float64)
    m = torch.tensor([[1, 1, 1, 0, 0], [0, 1, 1, 1, 1]], dtype=torch.bool)
    pad = torch.full((2, 5, 1), float("-inf"), dtype=torch.float64)
    s_fast = s0.clone().requires_grad_(True)
    s_mask = s0.clone().requires_grad_(True)
    fast = fns[name](s_fast, t, m)
    masked = fns[name](torch.cat([s_mask, pad], -1), torch.cat([t, pad], -1), m)
    fast.backward()
    masked.backward()
    assert float(fast.detach()) > 0
    assert float(fast.detach()) == pytest.approx(float(masked.detach()), rel=1e-12)
    torch.testing.assert_close(s_fast.grad, s_mask.grad, rtol=1e-10, atol=1e-12)


def test_adaptive_alpha_from_response_logits_equals_the_full_logit_formula(tiny) -> None:
    """update_alpha reads per-sequence mean token log-probs: the same from aligned response logits as
    from full logits with shifted targets (epoch 1 records the anchor, epoch 2 uses it)."""
    teacher, student, tok = tiny
    batch = T.collate_pairs(_pairs(tok), tok.pad_token_id)
    index, mask, targets = T.response_index(batch)
    with torch.no_grad():
        s_full = student(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        t_full = teacher(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    gather = lambda x: x.gather(1, index.unsqueeze(-1).expand(-1, -1, x.shape[-1]))  # noqa: E731
    cfg = DistillConfig(update_alpha=True, alpha=0.1)
    anchor: dict[str, list[float]] = {"skl": [], "srkl": []}
    assert T._alphas(cfg, 0, gather(s_full), gather(t_full), targets, mask, anchor) == (0.1, 0.1)
    # the naive formula on full logits: mean log-prob of each row's response tokens
    s_sh, m_sh = T.shifted(s_full, batch)
    t_sh, _ = T.shifted(t_full, batch)
    tgt = batch["input_ids"][:, 1:]
    lq, lp = T.mean_token_logprob(s_sh, tgt, m_sh), T.mean_token_logprob(t_sh, tgt, m_sh)
    b = 3
    assert anchor["skl"][0] == pytest.approx(float((lp[:b].exp() - lq[:b].exp()).mean()), rel=1e-4, abs=1e-9)
    assert anchor["srkl"][0] == pytest.approx(float((lq[b:].exp() - lp[b:].exp()).mean()), rel=1e-4, abs=1e-9)
    a1, a2 = T._alphas(cfg, 1, gather(s_full), gather(t_full), targets, mask, anchor)
    torch.testing.assert_close(a1, L.adaptive_alpha(lp[:b], lq[:b], anchor["skl"][0], 0.1))
    torch.testing.assert_close(a2, L.adaptive_alpha(lp[b:], lq[b:], anchor["srkl"][0], 0.1, on_student_responses=True))
