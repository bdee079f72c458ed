"""UDora's candidate step: token gradients (autograd and finite differences), top-k sampling, the
ASCII blocklist and the retokenisation filter."""

from __future__ import annotations

import types

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from lmforge.methods.udora.candidates import (
    ascii_blocklist,
    filter_retokenization,
    retokenization_stable,
    sample_candidates,
    token_gradients,
)
from lmforge.methods.udora.loss import gradient_loss


def _rms_norm_in_input_dtype(self, hidden_states):
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def test_sampling_rejects_impossible_settings():
    ids, grad, blocked = _sampling_case()
    with pytest.raises(ValueError):
        sample_candidates(ids, grad, 4, topk=48, not_allowed_ids=blocked)    # only 47 allowed ids
    with pytest.raises(ValueError):
        sample_candidates(ids, grad, 4, topk=4, n_replace=7)


def test_ascii_blocklist(small):
    _, tok = small
    blocked = set(ascii_blocklist(tok).tolist())
    specials = {tok.bos_token_id, tok.eos_token_id, tok.pad_token_id}
    assert specials <= blocked
    for i in range(tok.vocab_size):
        text = tok.decode([i])
        assert (i in blocked) == (i in specials or not (text.isascii() and text.isprintable())), (i, text)
    newline = tok.encode("a\nb", add_special_tokens=False)[1]
    assert tok.decode([newline]) == "\n" and newline in blocked
    assert tok.encode("x", add_special_tokens=False)[0] not in blocked


def test_retokenization_filter(small):
    _, tok = small
    stable = tok.encode("x x", add_special_tokens=False)                # x Ġ x
    unstable = [259, 260, 90]                                          # Ġt he x -> " thex" -> Ġthe x
    assert tok.convert_ids_to_tokens(unstable) == ["Ġt", "he", "x"]
    assert tok.encode(tok.decode(unstable), add_special_tokens=False) != unstable
    cands = torch.tensor([unstable, stable, stable])
    assert retokenization_stable(tok, cands).tolist() == [False, True, True]
    assert filter_retokenization(tok, cands).tolist() == [stable, stable]
    with pytest.raises(RuntimeError):
        filter_retokenization(tok, torch.tensor([unstable]))


def _tiny(dtype=torch.float32):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4)
    model = LlamaForCausalLM(cfg).to(dtype).eval()
    if dtype == torch.float64:  # transformers' RMSNorm rounds through float32; keep float64 throughout
        for m in model.modules():
            if isinstance(m, LlamaRMSNorm):
                m.forward = types.MethodType(_rms_norm_in_input_dtype, m)
    return model


def _case(model):
    E = model.get_input_embeddings().weight
    prefix = torch.tensor([3, 5, 7])
    optim = torch.tensor([11, 12, 13, 14])
    suffix = torch.tensor([20, 21, 22, 23, 24])
    # a target of 3 tokens at sequence positions 9..11 (the last three suffix tokens)
    targets = [(9, [22, 23, 24])]
    return E, prefix, optim, suffix, targets


@pytest.mark.parametrize("mellow", [False, True])
def test_token_gradients_equal_autograd_through_embeddings(mellow):
    model = _tiny()
    E, prefix, optim, suffix, targets = _case(model)
    fn = lambda logits: gradient_loss(logits, targets, use_mellowmax=mellow)  # noqa: E731
    got = token_gradients(model, E, optim, E[prefix].detach(), E[suffix].detach(), fn)
    # reference: differentiate w.r.t. the optim embeddings themselves, then project on every row of E
    emb = E[optim].detach().clone().requires_grad_(True)
    seq = torch.cat([E[prefix].detach(), emb, E[suffix].detach()]).unsqueeze(0)
    (g,) = torch.autograd.grad(fn(model(inputs_embeds=seq).logits).sum(), emb)
    want = g @ E.detach().T
    assert got.shape == (4, 64)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_token_gradients_equal_finite_differences():
    model = _tiny(torch.float64)
    E, prefix, optim, suffix, targets = _case(model)
    fn = lambda logits: gradient_loss(logits, targets)  # noqa: E731
    got = token_gradients(model, E, optim, E[prefix].detach(), E[suffix].detach(), fn)

    def loss_at(emb_optim):
        seq = torch.cat([E[prefix], emb_optim, E[suffix]]).unsqueeze(0).detach()
        with torch.no_grad():
            return float(fn(model(inputs_embeds=seq).logits))

    base = E[optim].detach()
    h = 1e-5
    for i, v in [(0, 5), (2, 40), (3, 63)]:
        # moving the one-hot of position i towards token v moves its embedding along E[v]
        up, down = base.clone(), base.clone()
        up[i] += h * E[v].detach()
        down[i] -= h * E[v].detach()
        fd = (loss_at(up) - loss_at(down)) / (2 * h)
        assert got[i, v].item() == pytest.approx(fd, rel=1e-5, abs=1e-9)


def test_token_gradients_with_a_prefix_cache():
    from transformers import DynamicCache

    model = _tiny()
    E, prefix, optim, suffix, targets = _case(model)
    full = token_gradients(model, E, optim, E[prefix].detach(), E[suffix].detach(),
                           lambda logits: gradient_loss(logits, targets))
    with torch.no_grad():
        cache = model(inputs_embeds=E[prefix].detach().unsqueeze(0), past_key_values=DynamicCache(),
                      use_cache=True).past_key_values
    shifted = [(pos - len(prefix), ids) for pos, ids in targets]  # the logits start after the prefix
    cached = token_gradients(model, E, optim, None, E[suffix].detach(),
                             lambda logits: gradient_loss(logits, shifted), past_key_values=cache)
    torch.testing.assert_close(cached, full, rtol=1e-4, atol=1e-6)
    # the cache was not grown by the call: a second call gives the same
    again = token_gradients(model, E, optim, None, E[suffix].detach(),
                            lambda logits: gradient_loss(logits, shifted), past_key_values=cache)
    torch.testing.assert_close(again, cached)


def test_token_gradients_without_targets_is_zero():
    model = _tiny()
    E, prefix, optim, suffix, _ = _case(model)
    got = token_gradients(model, E, optim, E[prefix].detach(), E[suffix].detach(),
                          lambda logits: gradient_loss(logits, []))
    assert got.shape == (4, 64) and not got.any()


def _sampling_case():
    g = torch.Generator().manual_seed(3)
    ids = torch.tensor([1, 2, 3, 4, 5, 6])
    grad = torch.randn(6, 64, generator=g)
    blocked = torch.tensor(list(range(0, 17)))  # 47 allowed ids
    return ids, grad, blocked


@pytest.mark.parametrize("n_replace", [1, 2, 4])
def test_sampled_tokens_come_from_the_topk_and_never_from_the_blocklist(n_replace):
    ids, grad, blocked = _sampling_case()
    topk = 8
    cands = sample_candidates(ids, grad, 200, topk=topk, n_replace=n_replace, not_allowed_ids=blocked,
                              generator=torch.Generator().manual_seed(0))
    masked = grad.clone()
    masked[:, blocked] = float("inf")
    allowed_top = [set((-masked[i]).topk(topk).indices.tolist()) for i in range(len(ids))]
    assert cands.shape == (200, 6)
    for row in cands:
        changed = (row != ids).nonzero().flatten().tolist()
        # a replacement may redraw the same token, so at most n_replace positions differ
        assert len(changed) <= n_replace
        for i in changed:
            assert int(row[i]) in allowed_top[i] and int(row[i]) not in set(blocked.tolist())
    # over 200 rows, some row differs in exactly n_replace positions
    assert max(int((row != ids).sum()) for row in cands) == n_replace
