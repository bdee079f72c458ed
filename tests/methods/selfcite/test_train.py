"""SelfCite SimPO training: the loss and log-probs against TRL and by hand, the tokenization and
truncation against TRL's CPOTrainer, and a tiny LoRA run that must raise the SimPO margin."""

from __future__ import annotations

import copy
import math
import os
import random
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from lmforge.common.errors import UserError
from lmforge.methods.selfcite.train import (OFFICIAL_PROMPT_TEMPLATE, SimPOSettings, average_logps, build_trainer,
                                            encode_pair, format_pairs, official_truncation, pair_average_logps,
                                            simpo_loss, train_simpo)

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

SYMBOLS = "abcdefgh"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}"
    "{% if m['role'] == 'assistant' %}{{ eos_token }}{% else %}{{ '\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


@pytest.fixture(scope="module")
def tok():
    """A byte-level BPE over a few letters (no chat template)."""
    from lmforge.models.tokenizer import train_tokenizer

    rng = random.Random(0)
    return train_tokenizer([" ".join(rng.choice(SYMBOLS) for _ in range(12)) for _ in range(100)], 300)


@pytest.fixture(scope="module")
def chat_tok(tok):
    t = copy.deepcopy(tok)
    t.chat_template = CHAT_TEMPLATE
    return t


def _llama(vocab: int, seed: int = 0, **extra) -> LlamaForCausalLM:
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256, **extra)
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).eval()


def _tiny(tok, seed: int = 0) -> LlamaForCausalLM:
    return _llama(len(tok), seed, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                  pad_token_id=tok.pad_token_id)


def _pairs(n: int, seed: int = 1, long_prompt: bool = False) -> list[dict[str, str]]:
    """Prompts of letters; chosen = the letters sorted, rejected = random letters (never equal)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        k = 30 if long_prompt and i == 0 else rng.randint(2, 5)
        letters = [rng.choice(SYMBOLS) for _ in range(k)]
        chosen = " ".join(sorted(letters[:5]))
        rejected = chosen
        while rejected == chosen:
            rejected = " ".join(rng.choice(SYMBOLS) for _ in range(rng.randint(2, 6)))
        out.append({"prompt": "sort: " + " ".join(letters) + "\n", "chosen": chosen, "rejected": rejected})
    return out


# ------------------------------------------------------------------------------------------------
# The loss
# ------------------------------------------------------------------------------------------------


def _trl_cpo_loss(chosen, rejected, *, beta, simpo_gamma, label_smoothing):
    from trl.experimental.cpo import CPOTrainer

    stub = SimpleNamespace(loss_type="simpo", beta=beta, simpo_gamma=simpo_gamma, label_smoothing=label_smoothing,
                           alpha=0.0, accelerator=SimpleNamespace(device=torch.device("cpu")))
    return CPOTrainer.cpo_loss(stub, chosen, rejected)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_simpo_loss_matches_trl_cpotrainer(label_smoothing):
    """TRL's CPOTrainer.cpo_loss (loss_type simpo, simpo_gamma = beta * gamma_beta_ratio) gives the
    same losses and rewards, on fixed and on random average log-probs."""
    fixed = (torch.tensor([-1.0, -0.8, -2.5, -0.31]), torch.tensor([-1.5, -0.5, -2.1, -0.3]))
    torch.manual_seed(0)
    rand = (-torch.rand(64, dtype=torch.float64) * 3, -torch.rand(64, dtype=torch.float64) * 3)
    for beta, ratio in ((10.0, 0.3), (2.5, 0.55)):
        for chosen, rejected in (fixed, rand):
            ours = simpo_loss(chosen, rejected, beta=beta, gamma_beta_ratio=ratio, label_smoothing=label_smoothing)
            theirs = _trl_cpo_loss(chosen, rejected, beta=beta, simpo_gamma=beta * ratio,
                                   label_smoothing=label_smoothing)
            for a, b in zip(ours, theirs):
                torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    # and the check is not vacuous: a different gamma is visibly different
    other = _trl_cpo_loss(*fixed, beta=10.0, simpo_gamma=2.0, label_smoothing=label_smoothing)[0]
    assert not torch.allclose(simpo_loss(*fixed, label_smoothing=label_smoothing)[0], other)


def test_simpo_loss_closed_form():
    """One pair by hand: pi_w = -1.0, pi_l = -1.5, beta 10, gamma/beta 0.3 -> z = 0.2, beta z = 2."""
    c, r = torch.tensor([-1.0], dtype=torch.float64), torch.tensor([-1.5], dtype=torch.float64)
    softplus = lambda x: math.log(1 + math.exp(x))  # noqa: E731  (-log sigmoid(x) = softplus(-x))
    loss, rc, rr = simpo_loss(c, r)
    assert loss.item() == pytest.approx(softplus(-2.0), rel=1e-12)
    assert (rc.item(), rr.item()) == pytest.approx((-10.0, -15.0))
    loss_ls = simpo_loss(c, r, label_smoothing=0.1)[0]
    assert loss_ls.item() == pytest.approx(0.9 * softplus(-2.0) + 0.1 * softplus(2.0), rel=1e-12)
    # gamma is a margin: at pi_w - pi_l = gamma / beta the loss is log 2
    assert simpo_loss(torch.tensor([-1.0]), torch.tensor([-1.3]))[0].item() == pytest.approx(math.log(2), abs=1e-6)


# ------------------------------------------------------------------------------------------------
# Average log-probs
# ------------------------------------------------------------------------------------------------


def test_average_logps_is_hf_mean_token_nll_and_a_naive_loop():
    model = _llama(64)
    torch.manual_seed(1)
    ids = torch.randint(0, 64, (1, 12))
    labels = ids.clone()
    labels[:, :5] = -100  # a prompt of 5 tokens: 7 scored tokens
    with torch.no_grad():
        out = model(input_ids=ids, labels=labels)
    assert average_logps(out.logits, labels).item() == pytest.approx(-out.loss.item(), abs=1e-6)

    # A right-padded batch of two sequences against a per-token loop over each sequence run alone.
    seqs = [(torch.randint(0, 64, (9,)), 3), (torch.randint(0, 64, (14,)), 6)]
    n = max(len(s) for s, _ in seqs)
    batch_ids = torch.zeros(2, n, dtype=torch.long)
    batch_labels = torch.full((2, n), -100)
    att = torch.zeros(2, n, dtype=torch.long)
    for i, (s, p) in enumerate(seqs):
        batch_ids[i, :len(s)] = s
        batch_labels[i, p:len(s)] = s[p:]
        att[i, :len(s)] = 1
    with torch.no_grad():
        got = average_logps(model(input_ids=batch_ids, attention_mask=att).logits, batch_labels)
        for i, (s, p) in enumerate(seqs):
            logits = model(input_ids=s[None]).logits[0]
            total = sum(torch.log_softmax(logits[t - 1], -1)[s[t]].item() for t in range(p, len(s)))
            assert got[i].item() == pytest.approx(total / (len(s) - p), abs=1e-5)
            # unbatched input gives the same number
            assert average_logps(logits, batch_labels[i, :len(s)]).item() == pytest.approx(got[i].item(), abs=1e-5)


# ------------------------------------------------------------------------------------------------
# Tokenization, truncation and TRL's per-sequence log-probs
# ------------------------------------------------------------------------------------------------


def test_official_truncation_rule():
    p, c, r = list(range(10)), [100] * 5, [200] * 8
    # fits: unchanged
    assert official_truncation(p, c, p, r, 18, 6) == (p, c, p, r)
    # too long (10 + 8 > 12): prompts keep their last 6 tokens; still too long: responses keep 12 - 6
    assert official_truncation(p, c, p, r, 12, 6) == (p[-6:], c, p[-6:], r[:6])
    # prompt truncation alone suffices: 8 + 4 = 12 <= 12
    assert official_truncation(p, c[:4], p, r[:3], 12, 8) == (p[-8:], c[:4], p[-8:], r[:3])


def test_prompt_rendering(tok, chat_tok):
    pair = {"prompt": "sort: b a\n", "chosen": " a b \n", "rejected": "b a"}
    assert format_pairs(tok, [pair]) == [{"prompt": "sort: b a\n", "chosen": "a b", "rejected": "b a"}]
    official = format_pairs(chat_tok, [pair], SimPOSettings(prompt_template=OFFICIAL_PROMPT_TEMPLATE))
    assert official == [{"prompt": "<|user|>\nsort: b a\n<|assistant|>\n", "chosen": "a b", "rejected": "b a"}]
    chat = format_pairs(chat_tok, [pair])[0]
    assert chat == {"prompt": "<|user|>\nsort: b a\n\n<|assistant|>\n", "chosen": "a b</s>", "rejected": "b a</s>"}
    # the chat row ends with EOS already: no second EOS; the plain row gets one
    (ids, labels), _ = encode_pair(chat_tok, chat)
    assert ids[-1] == chat_tok.eos_token_id and ids[-2] != chat_tok.eos_token_id
    (ids, labels), _ = encode_pair(tok, format_pairs(tok, [pair])[0])
    assert ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id
    assert tok.decode([t for t in labels if t != -100]) == "a b</s>"


@pytest.mark.parametrize("kind", ["plain", "chat"])
def test_tokens_and_average_logps_match_trl_cpotrainer(tok, chat_tok, kind, tmp_path):
    """The ids CPOTrainer trains on (TRL's tokenization + the official truncation) are encode_pair's,
    and TRL's own per-sequence average log-probs (concatenated_forward, simpo) equal ours."""
    t = tok if kind == "plain" else chat_tok
    pairs = _pairs(4, seed=3, long_prompt=True)
    st = SimPOSettings(max_length=40, max_prompt_length=24, gradient_checkpointing=False)
    trainer = build_trainer(_tiny(t), t, pairs, st, output_dir=tmp_path)
    rows = format_pairs(t, pairs, st)
    truncated = 0
    for i, row in enumerate(rows):
        (ci, cl), (ri, rl) = encode_pair(t, row, st)
        got = trainer.train_dataset[i]
        assert got["chosen_input_ids"] == ci and got["chosen_labels"] == cl
        assert got["rejected_input_ids"] == ri and got["rejected_labels"] == rl
        assert len(ci) <= 40 and len(ri) <= 40
        truncated += cl.count(-100) == 24
    assert truncated == 1  # the long prompt was cut to max_prompt_length, the others were not

    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(pairs))])
    model = trainer.model
    model.eval()
    with torch.no_grad():
        trl_c, trl_r = trainer.concatenated_forward(model, batch)[:2]
    ours_c, ours_r = pair_average_logps(model, t, pairs, st, batch_size=3)
    torch.testing.assert_close(ours_c, trl_c, rtol=0, atol=1e-5)
    torch.testing.assert_close(ours_r, trl_r, rtol=0, atol=1e-5)
    assert not torch.allclose(ours_c, ours_r)


# ------------------------------------------------------------------------------------------------
# Settings, errors and an end-to-end run
# ------------------------------------------------------------------------------------------------


def test_settings_defaults_are_the_official_run():
    s = SimPOSettings()
    assert (s.beta, s.gamma_beta_ratio, s.simpo_gamma, s.label_smoothing) == (10.0, 0.3, 3.0, 0.0)
    assert (s.lr, s.epochs, s.scheduler, s.warmup_ratio, s.batch_size, s.grad_accum, s.seed) == (
        3e-7, 1.0, "cosine", 0.1, 1, 1, 42)
    assert (s.max_length, s.max_prompt_length) == (25600, 24576)
    assert (s.lora_r, s.lora_alpha, s.lora_dropout, s.lora_target_modules) == (16, 32, 0.05, "all-linear")
    for bad in ({"beta": 0.0}, {"label_smoothing": 0.5}, {"max_prompt_length": 25600}, {"warmup_ratio": 1.0},
                {"prompt_template": "<|user|>"}, {"lr": -1.0}):
        with pytest.raises(UserError, match="SimPO settings"):
            SimPOSettings(**bad)


def test_bad_pairs_raise_user_error(tok):
    model = _tiny(tok)
    with pytest.raises(UserError, match="at least one preference pair"):
        train_simpo(model, tok, [])
    with pytest.raises(UserError, match=r"pair 1 has no 'rejected' key.*call it 'reject'"):
        train_simpo(model, tok, [{"prompt": "a", "chosen": "b", "rejected": "c"},
                                 {"prompt": "a", "chosen": "b", "reject": "c"}])
    with pytest.raises(UserError, match="pair 0: 'chosen' must be a string") as err:
        train_simpo(model, tok, [{"prompt": "a", "chosen": 3, "rejected": "c"}])
    assert "\n" not in str(err.value)


def test_simpo_lora_run_raises_the_margin_and_keeps_the_base(tok, tmp_path):
    """32 steps (8 pairs x 4 epochs) of SimPO + LoRA on a random tiny Llama raise the mean
    pi_w - pi_l. The lr is 5e-3, not 3e-7: the official rate moves a 8B model over 2k long pairs;
    at 3e-7 a few dozen steps change nothing measurable here.

    Measured mean margin -0.0516 -> 0.4956, a gain of 0.5472 with 1 thread and with 2 threads;
    the bound 0.2 is below half of it, and a run that does not learn leaves it at ~0."""
    model = _tiny(tok)
    pairs = _pairs(8)
    st = SimPOSettings(lr=5e-3, epochs=4, gradient_checkpointing=False)
    base = {k: v.clone() for k, v in model.state_dict().items()}
    c0, r0 = pair_average_logps(model, tok, pairs, st)
    res = train_simpo(model, tok, pairs, st)
    peft_model = res["model"]
    c1, r1 = pair_average_logps(peft_model, tok, pairs, st)
    gain = float((c1 - r1).mean() - (c0 - r0).mean())
    print(f"margin before {float((c0 - r0).mean()):.4f} after {float((c1 - r1).mean()):.4f} gain {gain:.4f}")
    assert gain > 0.2

    assert res["global_step"] == 32 and len(res["losses"]) == 32
    assert len(res["reward_accuracies"]) == len(res["reward_margins"]) == 32
    assert all(math.isfinite(x) for x in res["losses"] + res["reward_margins"])
    assert "rewards/chosen" in res["log"][0] and "logps/chosen" in res["log"][0]
    # the first step's loss is SimPO's at the start: margin ~0 so about softplus(gamma) = log(1 + e^3)
    assert res["losses"][0] == pytest.approx(math.log1p(math.exp(3.0)), abs=0.5)

    # LoRA: the base weights are untouched, the adapters moved, and with them off the margin is back.
    after = peft_model.get_base_model().state_dict()
    base_after = {k.replace(".base_layer", ""): v for k, v in after.items() if "lora_" not in k}
    assert base_after.keys() == base.keys()
    assert all(torch.equal(base[k], v) for k, v in base_after.items())
    assert any(v.abs().sum() > 0 for k, v in after.items() if "lora_B" in k)
    # the base model's dropout is off (official), the LoRA dropout kept its setting
    drops = [m.p for n, m in peft_model.named_modules() if isinstance(m, torch.nn.Dropout) and "lora_dropout" in n]
    assert drops and all(p == 0.05 for p in drops)
    with peft_model.disable_adapter():
        c2, r2 = pair_average_logps(peft_model, tok, pairs, st)
    torch.testing.assert_close(c2 - r2, c0 - r0, rtol=0, atol=1e-5)


def test_merge_and_out_dir(tok, tmp_path):
    model = _tiny(tok)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    st = SimPOSettings(lr=5e-3, max_steps=3, gradient_checkpointing=False)
    res = train_simpo(model, tok, _pairs(4), st, out_dir=tmp_path / "run", merge=True)
    merged = res["model"]
    assert isinstance(merged, LlamaForCausalLM)
    state = merged.state_dict()
    assert state.keys() == before.keys()
    assert any(not torch.equal(before[k], v) for k, v in state.items())
    assert (tmp_path / "run" / "config.json").exists() and (tmp_path / "run" / "simpo_log.json").exists()
    assert not any(p.name.startswith("checkpoint") for p in (tmp_path / "run").iterdir())
