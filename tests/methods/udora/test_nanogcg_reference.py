"""lmforge's GCG baseline (``baselines.gcg_attack``: the target at the first response position)
against nanoGCG 0.3.0 as a reference implementation, on the committed agent-small (a 2M-parameter
Llama, float32, CPU). Skipped where nanogcg is not installed (``pip install --no-deps
nanogcg==0.3.0``: its metadata pins ``transformers<=4.47.1``, but the parts used here run on
transformers 5 as they are, except its prefix-cache path, see below).

What is compared, at the initial adversarial string (step 0):

1. the loss: nanoGCG's step-0 loss (``GCG.init_buffer``: the token-mean CE of the target after
   ``before ⊕ optim ⊕ after``) equals the CE that lmforge's GCG differentiates (``loss.gradient_loss``
   on ``start_surrogate``'s target, captured inside the real ``gcg_attack`` loop). NOTE: the loss
   lmforge *records* for a step (``StepRecord.loss``) is UDora's selection loss, which lmforge's GCG
   also ranks candidates by (see ``baselines.py``); nanoGCG ranks by the CE. That is a documented
   design choice, not compared here; the CE is what "GCG loss" means in both.
2. the token gradient: ``∂CE/∂one_hot(optim)`` from lmforge's loop equals nanoGCG's
   ``GCG.compute_token_gradient`` on the same ids.
3. the candidate step: the blocklist (non-printable-ASCII decodes plus BOS/EOS/PAD/UNK) is the same
   set, ``sample_candidates`` with a generator seeded ``s`` returns exactly nanoGCG's
   ``sample_ids_from_grad`` under ``torch.manual_seed(s)`` (both draw ``rand`` for the positions, then
   ``randint`` for the top-k slots; nothing of nanoGCG's stream is re-implemented here, both are
   simply run on equally seeded generators), every sampled token lies in the top-k of ``-grad`` with
   the blocklist masked, and the retokenisation filters keep the same rows.

Templating. Where the slot has no whitespace next to it, nanoGCG's own templating (the tokenizer's
chat template, or content concatenation when there is none; BOS text removed and re-added by the
tokenizer) gives exactly lmforge's ids, so (1) and (2) run nanoGCG end to end (``GCG.run``) on the
same messages; the ids nanoGCG built are recovered from its embeddings and checked equal to
lmforge's. Where there is whitespace at the slot, lmforge (as the official UDora code) strips it
(``before.rstrip()``, ``after.lstrip()``) and nanoGCG keeps it, so the ids differ by design; there the
ids are built once by lmforge's ``split_prompt`` and fed to nanoGCG's loss and gradient functions.

nanoGCG runs with ``use_prefix_cache=False``: its cached path indexes the KV cache as legacy tuples
(``prefix_cache[i]``), which transformers 5's ``DynamicCache`` does not support (TypeError). lmforge
runs with and without its prefix cache.
"""

from __future__ import annotations

import copy

import pytest
import torch

nanogcg_gcg = pytest.importorskip("nanogcg.gcg")
nanogcg_utils = pytest.importorskip("nanogcg.utils")

from lmforge.methods.udora import attack as attack_mod  # noqa: E402
from lmforge.methods.udora.attack import Case, UDoraConfig, split_prompt, start_surrogate  # noqa: E402
from lmforge.methods.udora.baselines import gcg_attack  # noqa: E402
from lmforge.methods.udora.candidates import ascii_blocklist, filter_retokenization, sample_candidates  # noqa: E402

INIT = "x x x x x x"
TARGET = "Action: SendPostcard"
# no whitespace next to the slot: both sides' templating agree
ALIGNED = "Ticket: what is the weather today? Hint:{optim_str}.\nAgent>"
# a space before and a newline after the slot: lmforge strips them, nanoGCG keeps them
SPACED = "Ticket: what is the weather today? Hint: {optim_str}\nAgent>"
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")

# Tolerances. Both sides run the same float32 model on the same ids; they differ only in summation
# order (with lmforge's prefix cache, attention over cached keys and a separate prefix forward vs one
# causal pass; CE mean over a reshaped batch vs a per-row mean), i.e. float32 rounding. Observed on
# agent-small: without lmforge's prefix cache loss and gradient are bit-identical; with it |Δloss| <=
# 1.9e-6 on losses of ~15.5-17 (relative 1.2e-7, one float32 ulp) and max |Δgrad| <= 2.3e-6 on gradients
# whose largest entry is ~1.2-2.3. rel 1e-5 / abs 1e-5 on the loss and rtol 1e-4 / atol 1e-5 on the
# gradient leave ~5-80x headroom over that rounding, yet are far below any real discrepancy (a target
# shifted by one position, a missing space or BOS changes the loss by O(0.1-1), see the whitespace test).
LOSS_TOL = dict(rel=1e-5, abs=1e-5)
GRAD_TOL = dict(rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def agent(small):
    model, tok = small
    return model, copy.deepcopy(tok)  # nanoGCG installs a chat template on a tokenizer without one


def _tokenizer(tok, chat: bool):
    tok = copy.deepcopy(tok)
    tok.chat_template = CHAT_TEMPLATE if chat else None
    return tok


def _lmforge_step0(model, tok, case: Case, cfg: UDoraConfig, monkeypatch) -> dict:
    """Run lmforge's GCG for one step and capture the CE and gradient at the initial string (the first
    ``token_gradients`` call of the loop is made at ``buffer.best_ids`` = the initial ids)."""
    real = attack_mod.token_gradients
    seen: dict = {}

    def spy(model_, embed, optim_ids, prefix, suffix, loss_fn, past_key_values=None):
        def recording(logits):
            loss = loss_fn(logits)
            seen.setdefault("loss", float(loss.detach().reshape(())))
            return loss

        grad = real(model_, embed, optim_ids, prefix, suffix, recording, past_key_values=past_key_values)
        seen.setdefault("grad", grad.detach().clone())
        seen.setdefault("ids", [int(i) for i in optim_ids.reshape(-1)])
        return grad

    monkeypatch.setattr(attack_mod, "token_gradients", spy)
    with torch.random.fork_rng():
        gcg_attack(model, tok, case, cfg)
    monkeypatch.setattr(attack_mod, "token_gradients", real)
    assert {"loss", "grad", "ids"} <= seen.keys()
    return seen


class _Recording(nanogcg_gcg.GCG):
    """nanoGCG's GCG, keeping the step-0 loss (its ``init_buffer``) and the first token gradient."""

    def init_buffer(self):
        buffer = super().init_buffer()
        self.step0_loss = float(buffer.get_lowest_loss())
        self.step0_ids = buffer.get_best_ids().clone()
        return buffer

    def compute_token_gradient(self, optim_ids):
        grad = super().compute_token_gradient(optim_ids)
        if not hasattr(self, "step0_grad"):
            self.step0_grad = grad.detach().clone()
        return grad


def _ng_config(add_space: bool) -> "nanogcg_gcg.GCGConfig":
    return nanogcg_gcg.GCGConfig(num_steps=1, search_width=8, topk=16, optim_str_init=INIT,
                                 use_prefix_cache=False, add_space_before_target=add_space,
                                 verbosity="WARNING")


def _ids_of(embeds: torch.Tensor, weight: torch.Tensor) -> list[int]:
    """The token ids whose embedding rows ``embeds`` (1, n, d) are (exact row lookup)."""
    equal = (embeds[0].detach()[:, None, :] == weight.detach()[None, :, :]).all(dim=-1)  # (n, vocab)
    assert torch.all(equal.sum(dim=1) == 1), "each embedding must equal exactly one row"
    return equal.float().argmax(dim=1).tolist()


def _lm_config(add_space: bool, cache: bool) -> UDoraConfig:
    return UDoraConfig(num_steps=1, search_width=8, topk=16, optim_str_init=INIT, max_new_tokens=4,
                       add_space_before_target=add_space, use_prefix_cache=cache, seed=0)


@pytest.mark.parametrize("chat,add_space,cache", [
    (False, False, True),
    (False, True, False),
    (True, True, True),
    (True, False, False),
])
def test_step0_loss_and_gradient_match_nanogcg_end_to_end(agent, monkeypatch, chat, add_space, cache):
    """Same messages (slot without adjacent whitespace), same initial string, same target: nanoGCG's
    own ``GCG.run`` and lmforge's ``gcg_attack`` build the same ids and agree on the step-0 CE and its
    one-hot gradient. Measured (agent-small, float32, CPU): lmforge cache off: loss and gradient
    bit-identical; cache on: |Δloss| <= 1.9e-6 (losses 15.5-17.0), max |Δgrad| <= 2.0e-6."""
    model, base_tok = agent
    messages = [{"role": "user", "content": ALIGNED}]
    tok = _tokenizer(base_tok, chat)
    lm = _lmforge_step0(model, tok, Case(prompt=messages, targets=[TARGET]), _lm_config(add_space, cache),
                        monkeypatch)

    ng_tok = _tokenizer(base_tok, chat)
    ng = _Recording(model, ng_tok, _ng_config(add_space))
    with torch.random.fork_rng():
        ng.run(messages, TARGET)

    # the very same token ids on both sides
    parts = split_prompt(tok, Case(prompt=messages, targets=[TARGET]))
    weight = model.get_input_embeddings().weight
    assert _ids_of(ng.before_embeds, weight) == parts.before_ids
    assert _ids_of(ng.after_embeds, weight) == parts.after_ids
    assert ng.target_ids[0].tolist() == start_surrogate(tok, TARGET, add_space).ids
    assert ng.step0_ids[0].tolist() == lm["ids"]
    if chat:
        assert parts.before_ids[0] == tok.bos_token_id and parts.before_ids.count(tok.bos_token_id) == 1

    # (1) the step-0 loss
    assert lm["loss"] == pytest.approx(ng.step0_loss, **LOSS_TOL)
    assert lm["loss"] > 1.0  # a random-ish agent: the target is not already written (non-trivial check)
    # (2) the token gradient
    assert ng.step0_grad.shape == (1, len(lm["ids"]), weight.shape[0])
    torch.testing.assert_close(lm["grad"], ng.step0_grad[0], **GRAD_TOL)
    assert lm["grad"].abs().max() > 1e-3


@pytest.mark.parametrize("cache", [True, False])
def test_step0_with_whitespace_at_the_slot_on_shared_ids(agent, monkeypatch, cache):
    """Whitespace next to the slot: lmforge (like the official UDora) strips it and nanoGCG keeps it,
    so their templating gives different ids by design. The ids are then built once (lmforge's
    ``split_prompt`` + ``start_surrogate``) and fed to nanoGCG's CE (``_compute_candidates_loss_original``,
    what its ``init_buffer`` calls) and ``compute_token_gradient``. Measured: |Δloss| = 0 (15.6896),
    max |Δgrad| = 0 (cache off) / 2.3e-6 (cache on); nanoGCG's own whitespace-keeping ids give 16.0614."""
    model, base_tok = agent
    tok = _tokenizer(base_tok, False)
    case = Case(prompt=SPACED, raw=True, targets=[TARGET])
    lm = _lmforge_step0(model, tok, case, _lm_config(True, cache), monkeypatch)

    parts = split_prompt(tok, case)
    embed = model.get_input_embeddings()
    ng = nanogcg_gcg.GCG(model, _tokenizer(base_tok, False), _ng_config(True))
    # nanoGCG's own templating of the same text keeps the space and the newline: different ids
    ng_run = _Recording(model, _tokenizer(base_tok, False), _ng_config(True))
    with torch.random.fork_rng():
        ng_run.run(SPACED, TARGET)
    assert _ids_of(ng_run.before_embeds, embed.weight) != parts.before_ids
    assert _ids_of(ng_run.after_embeds, embed.weight) != parts.after_ids

    before = torch.tensor([parts.before_ids])
    after = torch.tensor([parts.after_ids])
    target = torch.tensor([start_surrogate(tok, TARGET, True).ids])
    optim = torch.tensor([lm["ids"]])
    with torch.no_grad():
        ng.before_embeds, ng.after_embeds, ng.target_embeds = embed(before), embed(after), embed(target)
    ng.target_ids, ng.prefix_cache = target, None
    with torch.no_grad():
        seq = torch.cat([ng.before_embeds, embed(optim), ng.after_embeds, ng.target_embeds], dim=1)
        ng_loss = float(ng._compute_candidates_loss_original(1, seq)[0])
    ng_grad = ng.compute_token_gradient(optim)[0]

    assert lm["loss"] == pytest.approx(ng_loss, **LOSS_TOL)
    torch.testing.assert_close(lm["grad"], ng_grad, **GRAD_TOL)
    # and the loss does depend on the whitespace (so the shared-ids step above is what makes them equal)
    assert abs(ng_run.step0_loss - ng_loss) > 1e-3


@pytest.mark.parametrize("n_replace", [1, 2])
def test_candidate_step_matches_nanogcg(agent, monkeypatch, n_replace):
    """Blocklist, top-k sampling and the retokenisation filter against nanoGCG on a real gradient."""
    model, base_tok = agent
    tok = _tokenizer(base_tok, False)
    lm = _lmforge_step0(model, tok, Case(prompt=ALIGNED, raw=True, targets=[TARGET]), _lm_config(False, True),
                        monkeypatch)
    grad, ids = lm["grad"], torch.tensor(lm["ids"])

    blocked = ascii_blocklist(tok)
    ng_blocked = nanogcg_utils.get_nonascii_toks(tok)
    assert set(blocked.tolist()) == set(ng_blocked.tolist())
    assert tok.encode("x", add_special_tokens=False)[0] not in set(blocked.tolist())

    width, topk = 64, 16
    for seed in (0, 1, 7):
        ours = sample_candidates(ids, grad, width, topk, n_replace, not_allowed_ids=blocked,
                                 generator=torch.Generator().manual_seed(seed))
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            # nanoGCG writes +inf into the gradient it is given: hand it a copy
            theirs = nanogcg_gcg.sample_ids_from_grad(ids.clone(), grad.clone(), width, topk, n_replace,
                                                      not_allowed_ids=ng_blocked)
        assert torch.equal(ours, theirs)

        masked = grad.clone()
        masked[:, blocked] = float("inf")
        top = (-masked).topk(topk, dim=1).indices
        for row in ours:
            changed = (row != ids).nonzero().flatten().tolist()
            assert len(changed) <= n_replace
            for i in changed:
                assert int(row[i]) in set(top[i].tolist())
        assert not set(ours[ours != ids].tolist()) & set(blocked.tolist())
        assert (ours != ids).any()

        kept = filter_retokenization(tok, ours)
        assert torch.equal(kept, nanogcg_gcg.filter_ids(ours, tok))
